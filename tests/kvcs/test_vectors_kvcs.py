"""KVCS vectors: the packaged files pass, hold the texts' examples byte for byte, round-trip through the KVO1
layer, and catch broken references."""

from __future__ import annotations

import hashlib
import json
import re
import shutil
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import cbor2
import pytest

import kvconform.kvcs.vectors as kv
from kvconform.catalog import load_catalogs
from kvconform.kvcs.layers import KVO1, dissect, to_header
from kvconform.kvcs.payload import decode_object, verify_object
from kvconform.kvcs.tracks import parse_track_name
from kvconform.kvsp import PROVISIONAL, jcs_canonical
from kvconform.testvectors import load_vectors, vector_files, vectors_dir
from kvconform.vectortool import check_files, main

KINDS = {kv.KIND_NAMESPACE, kv.KIND_PAYLOAD, kv.KIND_TRACK_NAME, kv.KIND_KVSP, kv.KIND_OBJECT, kv.KIND_MANIFEST,
         kv.KIND_MOQT_MESSAGE, kv.KIND_COSE}


def _kvcs_files(root: Path | None = None) -> list[Path]:
    return [f for f in vector_files(root) if f.parent.name == "kvcs"]


def _by_name(name: str) -> list[Path]:
    return [f for f in _kvcs_files() if f.name == name]


def _failed_ids(files: list[Path]) -> set[int]:
    return {int(line.split("tcId ")[1].split(" ")[0]) for line in check_files(files).failures if "tcId " in line}


@pytest.fixture
def copy(tmp_path: Path) -> Path:
    dst = tmp_path / "vectors"
    shutil.copytree(vectors_dir(), dst, ignore=shutil.ignore_patterns("__pycache__", "*.py"))
    return dst


def test_packaged_kvcs_vectors_pass() -> None:
    files = _kvcs_files()
    assert {json.loads(f.read_text())["kind"] for f in files} == KINDS
    report = check_files(files)
    assert report.failures == [] and report.cases > 100


def test_committed_files_are_what_the_generator_writes() -> None:
    for rel, doc in kv.generate().items():
        assert json.loads((vectors_dir() / rel).read_text()) == doc, rel


def test_the_texts_examples_are_in_the_vectors_byte_for_byte() -> None:
    (ns,) = [c for c in load_vectors(kv.KIND_NAMESPACE) if "SpecExample" in c.flags]
    assert bytes.fromhex(ns["encoded"]) == kv.SPEC_NAMESPACE and len(kv.SPEC_NAMESPACE) == 108
    assert ns["fields"] == {"scope_id": "6d1c6481cd428737da312c089db3832a",
                            "compat_id": "5ed5c2f238839655d7c4029e12b7f31caf9e7421f4edb4057feee6dab760ee0f",
                            "anchor_key": "653275884ca44f8945fd4c902611c467394b73656e64c78d8522648cb75aefc1",
                            "pub_id": "0123456789abcdef0123456789abcdef"}
    (payload,) = [c for c in load_vectors(kv.KIND_PAYLOAD) if "SpecExample" in c.flags]
    raw = bytes.fromhex(payload["payload"])
    assert raw[:68] == kv.SPEC_PAYLOAD_HEADER and raw[68:] == bytes(range(16))
    assert payload["header"]["digest"] == hashlib.sha256(bytes(range(16))).hexdigest() == (
        "be45cb2605bf36bebde684841a28f0fd43c69850a3dce5fedba69928ee3a8991")
    (subscribe,) = [c for c in load_vectors(kv.KIND_MOQT_MESSAGE) if c["type"] == "SUBSCRIBE" and c["request_id"] == 0
                    and "ProfileExample" in c.flags]
    assert bytes.fromhex(subscribe["message"]) == kv.SPEC_LIVE_SUBSCRIBE and len(kv.SPEC_LIVE_SUBSCRIBE) == 131


def test_payload_vectors_round_trip_through_the_layer() -> None:
    for case in load_vectors(kv.KIND_PAYLOAD):
        raw = bytes.fromhex(case["payload"])
        pkt = dissect(raw)
        assert bytes(pkt) == raw, case.id
        if case.result == "valid":
            header, data = to_header(pkt)
            assert (header, data) == decode_object(raw), case.id
            assert kv.header_to_json(header) == case["header"], case.id


def test_object_vectors_rebuild_from_their_fields() -> None:
    cases = load_vectors(kv.KIND_OBJECT)
    assert {c["track"].split(".")[0] for c in cases} == {"k", "v", "kv"}
    for case in cases:
        raw = bytes.fromhex(case["payload"])
        header, data = to_header(dissect(raw))
        assert (header.layer, header.block_index) == (case["layer"], case["object"]), case.id
        rebuilt = KVO1(component=header.component, layer=header.layer, block_index=header.block_index,
                       token_start=header.token_start, token_count=header.token_count, codec=header.codec, data=data)
        assert bytes(rebuilt) == raw, case.id


def test_lenient_end_subscriber_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    """A reference that skips the digest check fails exactly the DigestMismatch cases."""
    real = verify_object

    def no_digest(payload: bytes, group: int, object_id: int) -> list[str]:
        return [p for p in real(payload, group, object_id) if "VERIFY-DIGEST" not in p]

    monkeypatch.setattr(kv, "verify_object", no_digest)
    expected = {c.tc_id for c in load_vectors(kv.KIND_PAYLOAD) if "DigestMismatch" in c.flags}
    assert expected and _failed_ids(_by_name("payload.json")) == expected


def test_track_name_parser_accepting_leading_zeros_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    real = parse_track_name

    def lenient(name: bytes) -> Any:
        return real(re.sub(rb"\.s0+(\d)", rb".s\1", name))

    monkeypatch.setattr(kv, "parse_track_name", lenient)
    expected = {c.tc_id for c in load_vectors(kv.KIND_TRACK_NAME) if "LeadingZero" in c.flags}
    assert expected and _failed_ids(_by_name("track_names.json")) == expected


class _BigEndianTokens:
    """kvsp-provisional-1 with big-endian tokens in the Block Key (the profile says le_u32)."""

    name = PROVISIONAL.name

    def __getattr__(self, attr: str) -> Any:
        return getattr(PROVISIONAL, attr)

    def block_keys(self, scope_key: bytes, compat_id: bytes, tokens: Sequence[int], block_tokens: int) -> list[bytes]:
        swapped = [int.from_bytes(t.to_bytes(4, "little"), "big") for t in tokens]
        return PROVISIONAL.block_keys(scope_key, compat_id, swapped, block_tokens)


def test_wrong_kvsp_profile_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(kv, "PROVISIONAL", _BigEndianTokens())
    cases = [c for c in load_vectors(kv.KIND_KVSP) if c.group["type"] == "BlockKeysTest" and c["block_keys"]]
    assert _failed_ids(_by_name("kvsp_provisional.json")) == {c.tc_id for c in cases}


def test_unsorted_jcs_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    def unsorted(obj: Mapping[str, Any]) -> bytes:
        return json.dumps(obj, separators=(",", ":"), ensure_ascii=False).encode()

    monkeypatch.setattr(kv, "jcs_canonical", unsorted)
    failed = _failed_ids(_by_name("kvsp_provisional.json"))
    rfc = next(c for c in load_vectors(kv.KIND_KVSP) if "Rfc8785" in c.flags)
    assert rfc.tc_id in failed


def test_jcs_that_writes_six_decimals_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    """The hand-written JCS this replaced wrote 1.5e-06 as 0.000002 (format(value, "f")); the RFC 8785 sample
    alone did not show it."""
    def six_decimals(obj: Any) -> bytes:
        return jcs_canonical(json.loads(json.dumps(obj), parse_float=lambda s: round(float(s), 6) or 0.0))

    monkeypatch.setattr(kv, "jcs_canonical", six_decimals)
    failed = _failed_ids(_by_name("kvsp_provisional.json"))
    numbers = next(c for c in load_vectors(kv.KIND_KVSP) if "Rfc8785Numbers" in c.flags)
    assert numbers.tc_id in failed


def test_verifier_that_skips_the_signature_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    def unchecked(data: bytes, public_keys: Mapping[bytes, Any]) -> bytes:
        payload: bytes = cbor2.loads(data).value[2]  # the COSE_Sign1 payload, signature never checked
        return payload

    monkeypatch.setattr(kv, "verify", unchecked)
    failed = _failed_ids(_by_name("manifest_cose.json"))
    expected = {c.tc_id for c in load_vectors(kv.KIND_COSE) if {"BadSignature", "WrongKey", "UnknownKid",
                                                                 "WrongAlg"} & set(c.flags)}
    assert expected and expected <= failed


def test_corrupted_expectation_fails_naming_file_and_tcid(copy: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = copy / "kvcs" / "payload.json"
    doc = json.loads(path.read_text())
    test = next(t for t in doc["testGroups"][0]["tests"] if t.get("requirement") == "KVCS-PAYLOAD-VERIFY-LAYER")
    test["requirement"] = "KVCS-PAYLOAD-VERIFY-BLOCK"
    path.write_text(json.dumps(doc, indent=2))
    assert main(["check", str(path)]) == 1
    out = capsys.readouterr().out
    assert f"payload.json: tcId {test['tcId']} " in out and "KVCS-PAYLOAD-VERIFY-BLOCK" in out


@pytest.mark.parametrize(("name", "edit"), [
    ("payload.json", lambda t: t.update(requirement="KBTP-HDR-LAYOUT")),
    ("namespace.json", lambda t: t.update(extra=1)),
    ("track_names.json", lambda t: t.pop("name")),
])
def test_schema_rejects_malformed_cases(copy: Path, capsys: pytest.CaptureFixture[str], name: str, edit: Any) -> None:
    path = copy / "kvcs" / name
    doc = json.loads(path.read_text())
    edit(next(t for t in doc["testGroups"][0]["tests"] if t["result"] == "invalid"))
    path.write_text(json.dumps(doc, indent=2))
    assert main(["check", str(path)]) == 1
    assert "schema kvcs.schema.json" in capsys.readouterr().out


def test_every_cited_requirement_is_in_the_catalog() -> None:
    """The ids the KVCS vectors, the layer and these tests name exist in conformance/requirements/kvcs.yaml."""
    root = Path(__file__).resolve().parents[2]
    sources = [root / "kvconform" / "kvcs" / f"{name}.py" for name in ("vectors", "layers", "payload")]
    sources += [Path(__file__), Path(__file__).with_name("test_layers.py"), *_kvcs_files()]
    catalog = load_catalogs()
    # An id is not followed by "-" (payload.py's message prefix "KVCS-PAYLOAD-VERIFY-" is not one).
    cited = {m for path in sources for m in re.findall(r"KVCS-[A-Z0-9]+(?:-[A-Z0-9]+)*(?![-A-Z0-9])",
                                                         path.read_text())}
    assert len(cited) > 20
    assert sorted(i for i in cited if i not in catalog) == []
