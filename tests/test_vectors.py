"""`kvconform vectors`: the packaged vectors pass, corruptions fail by file and tcId, generation is stable."""

from __future__ import annotations

import json
import shutil
import zlib
from pathlib import Path

import pytest

import kvconform.tlkv.vectors as tv
from kvconform import testvectors
from kvconform.testvectors import VectorError, load_vectors, vector_files, vectors_dir
from kvconform.tlkv import reader
from kvconform.vectortool import check_files, main

KINDS = ["tlkv-fnv1a64", "tlkv-crc32c", "tlkv-block-hash", "tlkv-envelope", "tlkv-envelope-read"]
SPEC_ENVELOPE_HEX = ("544c4b56010001000100000002000000010000000100000002000000"
                     "66937b02c1b01aa902000000003c004000420044003800bc000000341c540b4f")


@pytest.fixture
def copy(tmp_path: Path) -> Path:
    dst = tmp_path / "vectors"
    shutil.copytree(vectors_dir(), dst, ignore=shutil.ignore_patterns("__pycache__", "*.py"))
    return dst


def test_packaged_vectors_pass(capsys: pytest.CaptureFixture[str]) -> None:
    files = vector_files()
    assert set(KINDS) <= {json.loads(f.read_text())["kind"] for f in files}  # other lanes add their kinds
    report = check_files(files)
    assert report.failures == [] and report.cases > 100
    assert main(["check"]) == 0
    assert "0 cases failed" in capsys.readouterr().out


def test_files_are_small() -> None:
    for f in vector_files():
        assert f.stat().st_size < 300_000, f


def test_spec_examples_are_in_the_vectors() -> None:
    writer = {c["envelope"] for c in load_vectors("tlkv-envelope") if "SpecExample" in c.flags}
    assert writer == {SPEC_ENVELOPE_HEX}
    hashes = [c["hashes"] for c in load_vectors("tlkv-block-hash") if "SpecExample" in c.flags]
    assert hashes == [["0xA91AB0C1027B9366", "0x03DF829571605C60", "0x0000000000000000"]]
    assert any(c["crc"] == "0xE3069283" for c in load_vectors("tlkv-crc32c"))
    assert any(c["hash"] == "0xAF63DC4C8601EC8C" for c in load_vectors("tlkv-fnv1a64"))


def test_load_vectors_exposes_group_params_and_fields() -> None:
    cases = load_vectors("tlkv-envelope-read")
    case = next(c for c in cases if c.result == "invalid" and c["requirement"] == "TLKV-READ-CRC")
    assert case.tcId == case.tc_id and case.file.endswith("envelope_read.json")
    assert set(case.group) == {"type", "geometry", "versions"} and case["error"] == "format"
    assert case.id == f"envelope_read.json#{case.tc_id}"
    reqs = {c["requirement"] for c in cases if c.result == "invalid"}
    assert {"TLKV-READ-LENGTH", "TLKV-READ-MAGIC", "TLKV-READ-CRC", "TLKV-READ-VERSION", "TLKV-READ-DTYPE",
            "TLKV-READ-SHAPE", "TLKV-READ-NTOKENS", "TLKV-READ-HASH-FULL"} <= reqs
    with pytest.raises(VectorError, match="no-such-kind"):
        load_vectors("no-such-kind")


def test_vectors_dir_env_override(copy: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (copy / "tlkv" / "crc32c.json").unlink()
    monkeypatch.setenv(testvectors.VECTORS_DIR_ENV, str(copy))
    with pytest.raises(VectorError, match="tlkv-crc32c"):
        load_vectors("tlkv-crc32c")


def _edit(path: Path, edit: object) -> None:
    doc = json.loads(path.read_text())
    edit(doc)  # type: ignore[operator]
    path.write_text(json.dumps(doc, indent=2))


def test_corrupted_case_fails_naming_file_and_tcid(copy: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = copy / "tlkv" / "block_hash.json"

    def corrupt(doc: dict) -> None:  # type: ignore[type-arg]
        doc["testGroups"][0]["tests"][0]["hashes"][1] = "0x03DF829571605C61"

    _edit(path, corrupt)
    assert main(["check", str(path)]) == 1
    out = capsys.readouterr().out
    assert f"{path}: tcId 1 " in out and "0x03DF829571605C61" in out and "1 cases failed" in out


def test_wrong_reader_expectation_fails(copy: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = copy / "tlkv" / "envelope_read.json"
    tc = 0

    def corrupt(doc: dict) -> None:  # type: ignore[type-arg]
        nonlocal tc
        test = next(t for g in doc["testGroups"] for t in g["tests"] if t.get("requirement") == "TLKV-READ-MAGIC")
        test["requirement"], tc = "TLKV-READ-CRC", test["tcId"]

    _edit(path, corrupt)
    assert main(["check", "--dir", str(copy)]) == 1
    out = capsys.readouterr().out
    assert f"envelope_read.json: tcId {tc} " in out and "TLKV-READ-MAGIC" in out and "TLKV-READ-CRC" in out


def test_schema_violation_fails(copy: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = copy / "tlkv" / "envelope.json"
    _edit(path, lambda doc: doc["testGroups"][0]["tests"][0].update(result="maybe"))
    assert main(["check", str(path)]) == 1
    out = capsys.readouterr().out
    assert "envelope.json: schema tlkv.schema.json: at /testGroups/0/tests/0/result" in out


@pytest.mark.parametrize("edit", ["duplicate", "flag", "count"])
def test_lint_failures(copy: Path, edit: str, capsys: pytest.CaptureFixture[str]) -> None:
    path = copy / "tlkv" / "fnv1a64.json"

    def corrupt(doc: dict) -> None:  # type: ignore[type-arg]
        tests = doc["testGroups"][0]["tests"]
        if edit == "duplicate":
            tests[1]["tcId"] = tests[0]["tcId"]
        elif edit == "flag":
            tests[0]["flags"].append("Unexplained")
        else:
            doc["numberOfTests"] += 1

    _edit(path, corrupt)
    assert main(["check", str(path)]) == 1
    assert {"duplicate": "used 2 times", "flag": "'Unexplained' has no entry in notes",
            "count": "numberOfTests"}[edit] in capsys.readouterr().out


def test_mutant_reference_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    """A check must catch a mutant: a CRC-32 (zlib) reference and a reader that reads every version."""
    monkeypatch.setattr(tv, "crc32c", lambda data: zlib.crc32(bytes(data)))
    lenient = reader.read_envelope
    monkeypatch.setattr(tv, "read_envelope", lambda data, *, geometry, versions: lenient(
        data, geometry=geometry, versions=[1, 2]))
    report = check_files([f for f in vector_files() if f.name in ("crc32c.json", "envelope_read.json")])
    failed = "\n".join(report.failures)
    assert "crc32c.json: tcId 1 " in failed
    assert "v2 refused by a v1-only reader" in failed


def test_generate_reproduces_committed_files(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["generate", "--out", str(tmp_path)]) == 0
    generated = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*.json"))
    committed = sorted(p.relative_to(vectors_dir()) for p in vector_files())
    assert generated == committed
    for rel in generated:
        assert (tmp_path / rel).read_bytes() == (vectors_dir() / rel).read_bytes(), rel
    capsys.readouterr()
    assert main(["check", "--dir", str(tmp_path)]) == 0


def test_list(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["list"]) == 0
    lines = capsys.readouterr().out.splitlines()
    read = next(line for line in lines if line.startswith("tlkv/envelope_read.json"))
    n = len(load_vectors("tlkv-envelope-read"))
    assert "kind=tlkv-envelope-read" in read and f"tests={n}" in read and "invalid=" in read
