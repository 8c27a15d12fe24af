"""KBTP vectors: the packaged files pass, hold the text's examples, and catch broken references."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings

import kvconform.kbtp.vectors as kv
from kvconform.catalog import load_catalogs
from kvconform.kbtp.messages import Message, decode
from kvconform.kbtp.ring import FreeOutcome, RingModel, RingSlot
from kvconform.kbtp.vectors import SPEC_ALLOC_STORE, SPEC_COMPLETION
from kvconform.testvectors import load_vectors, vector_files, vectors_dir
from kvconform.vectortool import check_files, main
from tests.kbtp.strategies import messages

KINDS = {kv.KIND_MESSAGE, kv.KIND_FETCH_ADD, kv.KIND_RING_COUNTER, kv.KIND_RING_INIT, kv.KIND_RING_SCENARIO}


def _kbtp_files(root: Path | None = None) -> list[Path]:
    return [f for f in vector_files(root) if f.parent.name == "kbtp"]


@pytest.fixture
def copy(tmp_path: Path) -> Path:
    dst = tmp_path / "vectors"
    shutil.copytree(vectors_dir(), dst, ignore=shutil.ignore_patterns("__pycache__", "*.py"))
    return dst


def test_packaged_kbtp_vectors_pass() -> None:
    files = _kbtp_files()
    assert {json.loads(f.read_text())["kind"] for f in files} == KINDS
    report = check_files(files)
    assert report.failures == [] and report.cases > 100


def test_committed_files_are_what_the_generator_writes() -> None:
    for rel, doc in kv.generate().items():
        assert json.loads((vectors_dir() / rel).read_text()) == doc, rel


def test_spec_messages_are_in_the_vectors() -> None:
    spec = {c["message"] for c in load_vectors(kv.KIND_MESSAGE) if "SpecExample" in c.flags}
    assert spec == {SPEC_ALLOC_STORE.hex(), SPEC_COMPLETION.hex()}


def test_spec_ring_counter_is_in_the_vectors() -> None:
    (case,) = [c for c in load_vectors(kv.KIND_RING_COUNTER) if "SpecExample" in c.flags]
    assert (case["n"], case["add_data"], case["add_mask"], case["start"]) == (
        2, "0x0000000100000010", "0x8000000080000020", "0x0000000000000000")
    assert [(s["ticket"], s["offset"], s["counter"]) for s in case["steps"]] == [
        (0, 0, "0x0000000100000010"), (1, 16, "0x0000000200000020"), (2, 32, "0x0000000300000030"),
        (3, 48, "0x0000000400000000"), (4, 0, "0x0000000500000010")]


def test_spec_deferred_free_scenario_is_the_texts() -> None:
    """The recorded steps say what the text says, written out by hand here."""
    (case,) = [c for c in load_vectors(kv.KIND_RING_SCENARIO) if "SpecExample" in c.flags]
    block = "0x{:016X}".format
    assert case["blocks"] == [block(b) for b in (100, 101, 102, 103)] and case["n"] == 2
    assert [(s["op"], s["expect"]) for s in case["steps"]] == [
        ("take", {"ticket": 0, "offset": 0}),  # X, delayed before reading slot 0
        ("allocate", {"ticket": 1, "block": block(101)}),
        ("allocate", {"ticket": 2, "block": block(102)}),
        ("allocate", {"ticket": 3, "block": block(103)}),
        ("free", {"ticket": 4, "offset": 0, "deferred": True}),  # Y frees 101 onto unconsumed slot 0
        ("slot", {"sequence": 0, "block": block(100)}),
        ("consume", {"block": block(100)}),  # X obtains block 100
        ("slot", {"sequence": 4, "block": block(101)}),  # the deferred free's write
        ("allocate", {"ticket": 4, "block": block(101)}),
    ]


@settings(max_examples=200, deadline=None)
@given(messages)
def test_json_form_round_trips(msg: Message) -> None:
    doc = json.loads(json.dumps(kv.message_to_json(msg)))
    assert kv.message_from_json(doc) == msg


def _failures(files: list[Path]) -> str:
    return "\n".join(check_files(files).failures)


def _by_name(name: str) -> list[Path]:
    return [f for f in _kbtp_files() if f.name == name]


def test_plain_add_reference_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(kv, "masked_fetch_add", lambda orig, add, mask: (orig + add) % (1 << 64))
    failed = _failures(_by_name("fetch_add.json"))
    assert "fetch_add.json: tcId 4 " in failed  # the example's fourth step
    import kvconform.kbtp.ring as ring
    monkeypatch.setattr(ring, "masked_fetch_add", lambda orig, add, mask: (orig + add) % (1 << 64))
    assert "ring_counter.json: tcId 1 " in _failures(_by_name("ring_counter.json"))


def test_overwriting_free_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    def overwrite(self: RingModel, block_offset: int) -> FreeOutcome:
        ticket, offset, self.tail = self.layout.fetch_add(self.tail)
        self.slots[offset // 16] = RingSlot(ticket, block_offset)
        return FreeOutcome(ticket, offset, deferred=False)

    monkeypatch.setattr(RingModel, "free", overwrite)
    failed = _failures(_by_name("ring_scenario.json"))
    assert "ring_scenario.json: tcId 1 " in failed and "step 4 (free)" in failed


def test_decoder_ignoring_addr_le_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    def network_order_only(buf: bytes, *, addr_le: bool = False) -> Any:
        return decode(buf)

    monkeypatch.setattr(kv, "decode", network_order_only)
    report = check_files(_by_name("messages.json"))
    failed = {int(line.split("tcId ")[1].split(" ")[0]) for line in report.failures}
    cases = [c for c in load_vectors(kv.KIND_MESSAGE) if c["addr_le"]]
    # every ADDR_LE case but the COMPLETION's, which the target sends in network order either way
    assert failed == {c.tc_id for c in cases if c.fields.get("decoded", {}).get("type") != "COMPLETION"}


def test_corrupted_expectation_fails_naming_file_and_tcid(copy: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = copy / "kbtp" / "messages.json"
    doc = json.loads(path.read_text())
    test = next(t for t in doc["testGroups"][0]["tests"] if t.get("requirement") == "KBTP-ACK-HEAD-ALIGN")
    test["requirement"] = "KBTP-ACK-DALLOC-DESC"
    path.write_text(json.dumps(doc, indent=2))
    assert main(["check", str(path)]) == 1
    out = capsys.readouterr().out
    assert f"messages.json: tcId {test['tcId']} " in out and "KBTP-ACK-HEAD-ALIGN" in out


def test_schema_rejects_a_bad_requirement_id(copy: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = copy / "kbtp" / "ring_scenario.json"
    doc = json.loads(path.read_text())
    next(t for t in doc["testGroups"][0]["tests"] if t["result"] == "invalid")["requirement"] = "TLKV-ENV-CRC"
    path.write_text(json.dumps(doc, indent=2))
    assert main(["check", str(path)]) == 1
    assert "schema kbtp.schema.json" in capsys.readouterr().out


def test_every_cited_requirement_is_in_the_catalog() -> None:
    """The ids the codec, the ring, the vectors and these tests name exist in conformance/requirements/kbtp.yaml."""
    root = Path(__file__).resolve().parents[2]
    sources = [root / "kvconform" / "kbtp" / f"{name}.py" for name in ("messages", "ring", "layers", "vectors")]
    sources += [*Path(__file__).parent.glob("test_*.py"), *_kbtp_files()]
    catalog = load_catalogs()
    cited = {m for path in sources for m in re.findall(r"KBTP-[A-Z0-9]+(?:-[A-Z0-9]+)*", path.read_text())}
    assert len(cited) > 20
    assert sorted(i for i in cited if i not in catalog) == []
