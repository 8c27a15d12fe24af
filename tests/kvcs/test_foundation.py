"""The KVCS foundation against the text's examples and the provisional KVSP definitions of issue 5."""

from __future__ import annotations

import hashlib
import hmac
import json
from pathlib import Path

import pytest

from kvconform.kvcs.content import CacheSpec, example_spec
from kvconform.kvcs.cose import CoseError, ProducerKey, sign, verify
from kvconform.kvcs.errors import KvcsError
from kvconform.kvcs.manifest import manifest_problems, parse_manifest
from kvconform.kvcs.namespace import KvcsNamespace
from kvconform.kvcs.payload import HEADER_LEN, ObjectHeader, decode_object, encode_object, encode_raw, verify_object
from kvconform.kvcs.tracks import MANIFEST, MANIFEST_COSE, DataTrack, parse_track_name
from kvconform.kvsp import PROVISIONAL, KvspError, jcs_canonical, load_profile
from kvconform.moqt.structures import TrackNamespace

# The text's "Encoding Examples".
EXAMPLE_NS = bytes.fromhex(
    "05066b7663732d31106d1c6481cd428737da312c089db3832a205ed5c2f238839655d7c4029e12b7f31caf9e7421f4edb4057feee6"
    "dab760ee0f20653275884ca44f8945fd4c902611c467394b73656e64c78d8522648cb75aefc11001234567"
    "89abcdef0123456789abcdef")
EXAMPLE_HEADER = bytes.fromhex(
    "4b564f31010100000000000000000001000000000000000400000004000100000000"
    "0010be45cb2605bf36bebde684841a28f0fd43c69850a3dce5fedba69928ee3a8991")


def _example_ns() -> KvcsNamespace:
    return KvcsNamespace.parse(TrackNamespace((b"kvcs-1", EXAMPLE_NS[9:25], EXAMPLE_NS[26:58], EXAMPLE_NS[59:91],
                                               EXAMPLE_NS[92:108])))


def test_the_texts_namespace_is_108_octets_byte_for_byte() -> None:
    assert _example_ns().encode() == EXAMPLE_NS and len(EXAMPLE_NS) == 108


def test_a_namespace_with_a_short_field_names_it() -> None:
    ns = _example_ns().track_namespace()
    with pytest.raises(KvcsError, match=r"field 3 \(Anchor Key\).*31 octets"):
        KvcsNamespace.parse(TrackNamespace((*ns.fields[:3], ns.fields[3][:31], ns.fields[4])))
    with pytest.raises(KvcsError, match="exactly 5"):
        KvcsNamespace.parse(TrackNamespace(ns.fields[:4]))
    with pytest.raises(KvcsError, match="field 0"):
        KvcsNamespace.parse(TrackNamespace((b"kvcs-2", *ns.fields[1:])))


def test_the_texts_payload_header_byte_for_byte() -> None:
    payload = encode_object(component=1, layer=0, block_index=1, token_start=4, token_count=4, codec=1,
                            data=bytes(range(16)))
    assert payload[:HEADER_LEN] == EXAMPLE_HEADER
    header, data = decode_object(payload)
    assert data == bytes(range(16))
    assert (header.layer, header.block_index, header.token_start, header.data_length) == (0, 1, 4, 16)
    assert verify_object(payload, 0, 1) == []


@pytest.mark.parametrize(("change", "group", "obj", "expect"), [
    ({"magic": 0x4B564F32}, 0, 1, "Magic"),
    ({"version": 2}, 0, 1, "Version"),
    ({}, 1, 1, "Layer"),
    ({}, 0, 2, "Block Index"),
    ({"data_length": 15}, 0, 1, "Data Length"),
    ({"digest": bytes(32)}, 0, 1, "Data Digest"),
])
def test_every_end_subscriber_check_rejects_its_fault(change: dict[str, object], group: int, obj: int,
                                                     expect: str) -> None:
    header, data = decode_object(encode_object(component=1, layer=0, block_index=1, token_start=4, token_count=4,
                                               codec=1, data=bytes(range(16))))
    problems = verify_object(encode_raw(header.with_(**change), data), group, obj)
    assert problems and expect in problems[0] and "KVCS-PAYLOAD-VERIFY-" in problems[0]


def test_flags_are_ignored_on_receipt_and_truncation_is_caught() -> None:
    header, data = decode_object(encode_object(component=2, layer=3, block_index=0, token_start=0, token_count=4,
                                               codec=1, data=b"x" * 40))
    assert verify_object(encode_raw(header.with_(flags=0xFFFF), data), 3, 0) == []
    assert verify_object(encode_raw(header, data)[:60], 3, 0)
    assert isinstance(header, ObjectHeader)


@pytest.mark.parametrize("name", [b"k.raw.s0", b"v.raw.s12", b"kv.zstd-3.s1", b"k." + b"a" * 32 + b".s0"])
def test_track_names_of_the_abnf_parse(name: bytes) -> None:
    track = parse_track_name(name)
    assert isinstance(track, DataTrack) and track.name == name


@pytest.mark.parametrize("name", [b"k.raw.s01", b"q.raw.s0", b"k.RAW.s0", b"k.raw", b"k..s0", b"manifest.json",
                                  b"k." + b"a" * 33 + b".s0", b"k.raw.s-1"])
def test_names_off_the_abnf_are_refused(name: bytes) -> None:
    with pytest.raises(KvcsError, match="KVCS-TRACK-NAME-ABNF"):
        parse_track_name(name)


def test_manifest_track_names_are_reserved() -> None:
    assert parse_track_name(b"manifest") == MANIFEST and parse_track_name(b"manifest.cose") == MANIFEST_COSE


def test_jcs_sorts_by_utf16_and_writes_ecmascript_numbers() -> None:
    assert jcs_canonical({"b": 1, "a": [True, None, "é\n"], "\u20ac": 1e21, "\U0001f600": 0.5}) == (
        '{"a":[true,null,"é\\n"],"b":1,"\u20ac":1e+21,"\U0001f600":0.5}'.encode())  # U+20AC < U+D83D
    assert jcs_canonical([1.0, -0.0, 1e-7, 123456789012.5]) == b"[1,0,1e-7,123456789012.5]"


def test_provisional_identities_follow_their_definitions() -> None:
    compat = {"model": "m", "layers": 2, "kv_heads": 1, "head_dim": 2, "block_tokens": 2, "dtype": "f16"}
    compat_id = PROVISIONAL.compatibility_id(compat)
    assert compat_id == hashlib.sha256(
        b'{"block_tokens":2,"dtype":"f16","head_dim":2,"kv_heads":1,"layers":2,"model":"m"}').digest()
    key = b"k" * 32
    assert PROVISIONAL.scope_id(key) == hmac.new(key, b"kvsp-provisional-1 scope", hashlib.sha256).digest()[:16]
    keys = PROVISIONAL.block_keys(key, compat_id, [1, 2, 3, 4, 5], 2)
    first = hmac.new(key, compat_id + bytes(32) + b"\x01\0\0\0\x02\0\0\0", hashlib.sha256).digest()
    second = hmac.new(key, compat_id + first + b"\x03\0\0\0\x04\0\0\0", hashlib.sha256).digest()
    assert keys == [first, second]  # the incomplete third block has no key
    with pytest.raises(KvspError, match="head_dim"):
        PROVISIONAL.compatibility_id({k: v for k, v in compat.items() if k != "head_dim"})
    with pytest.raises(KvspError, match=r"kvconform\.kvsp"):
        load_profile("kvsp-1")


def test_content_is_shake128_of_seed_layer_component_block() -> None:
    spec = example_spec(segments=[8], tail_tokens=3)
    assert [(s.first_block, s.blocks) for s in spec.segment_layout()] == [(0, 6), (6, 2)]
    expected = hashlib.shake_128(spec.content_seed + (2).to_bytes(4, "big") + b"\x02" + (7).to_bytes(4, "big"))
    assert spec.data(2, 2, 7) == expected.digest(4 * 2 * 8 * 2)
    kv = DataTrack("kv", "raw", 1)
    payload = spec.object_payload(kv, 2, 1)
    header, data = decode_object(payload)
    assert data == spec.data(2, 1, 7) + spec.data(2, 2, 7) and header.token_start == 28 and header.component == 3
    assert hashlib.sha256(data).digest() == spec.layer_digest(2, 7)  # the kv digest is the KVSP layer digest
    assert spec.anchor_key == spec.block_keys[5] and len(spec.block_keys) == 8


def test_cache_spec_errors_name_the_field(tmp_path: Path) -> None:
    good = example_spec().to_obj()
    for field, value, match in [("content_seed", "zz", "content_seed"), ("segments", [5], "segment 0 has 19"),
                                ("tokens", [-1], "tokens"), ("profile", "nope", "profile")]:
        with pytest.raises(KvcsError, match=match):
            CacheSpec.load({**good, field: value})
    path = example_spec().write_json(tmp_path / "spec.json")
    assert CacheSpec.load(path).tokens == example_spec().tokens
    with pytest.raises(KvcsError, match="dtype"):
        CacheSpec.load({**good, "compat": {**good["compat"], "dtype": "bf16"}})


def test_manifest_round_trips_and_its_consistency_is_checked() -> None:
    spec = example_spec(segments=[8])
    ns = spec.namespace(bytes(16))
    manifest = spec.manifest({b"k.raw.s0": 4, b"v.raw.s0": 4, b"k.raw.s1": 1})
    assert manifest.segments[0].complete and not manifest.segments[1].complete
    parsed = parse_manifest(manifest.to_json())
    assert parsed == manifest
    assert manifest_problems(parsed, ns, spec.profile, block_keys=spec.block_keys) == []
    other = example_spec(model="other").namespace(bytes(16))
    assert any("KVCS-MANIFEST-COMPAT-CONSISTENT" in p for p in manifest_problems(parsed, other, spec.profile))
    broken = json.loads(manifest.to_json())
    broken["segments"][1]["first_block"] = 5
    broken["segments"][0]["object_digests"]["k.raw.s0"].pop()
    problems = manifest_problems(parse_manifest(json.dumps(broken).encode()), ns, spec.profile)
    assert any("first_block" in p for p in problems) and any("3 Groups listed" in p for p in problems)
    with pytest.raises(KvcsError, match=r"segments\[0\].blocks"):
        del broken["segments"][0]["blocks"]
        parse_manifest(json.dumps(broken).encode())


@pytest.mark.parametrize("alg", ["ES256", "EdDSA"])
def test_cose_sign1_verifies_and_refuses_tampering(alg: str) -> None:
    key = ProducerKey.generate(alg, b"producer-1")
    signed = sign(b'{"kvcs":1}', key)
    assert verify(signed, {b"producer-1": key.public_pem()}) == b'{"kvcs":1}'
    again = ProducerKey.from_pem(alg, b"producer-1", key.private_pem())
    assert verify(sign(b"x", again), {b"producer-1": key.public_key()}) == b"x"
    with pytest.raises(CoseError, match="does not verify"):
        verify(signed.replace(b'{"kvcs":1}', b'{"kvcs":2}'), {b"producer-1": key.public_pem()})
    with pytest.raises(CoseError, match="not a known producer key"):
        verify(signed, {b"other": key.public_pem()})
    with pytest.raises(CoseError, match="not CBOR"):
        verify(b"\xff\xff", {})
