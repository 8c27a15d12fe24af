"""What a target can send the harness never crashes it: the KVCS parsers turn any input into a value or a
``KvcsError`` naming the field and a requirement of the catalog (COSE_Sign1, manifest JSON, Track Names,
namespaces, object payloads, a consumer's result JSON)."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import cbor2
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kvconform.catalog import load_catalogs
from kvconform.kvcs import cose
from kvconform.kvcs.consumer import ConsumeResult
from kvconform.kvcs.content import CacheSpec, example_spec
from kvconform.kvcs.cose import CoseError, ProducerKey, sign, unverified_payload, verify
from kvconform.kvcs.errors import KvcsError
from kvconform.kvcs.manifest import Manifest, manifest_problems, parse_manifest
from kvconform.kvcs.namespace import KvcsNamespace
from kvconform.kvcs.payload import decode_object, verify_object
from kvconform.kvcs.tracks import MAX_NAME, DataTrack, parse_track_name
from kvconform.moqt.structures import TrackNamespace
from kvconform.targets.kvcs.consumer import _read_result

KVCS_IDS = {r.id for r in load_catalogs().requirements("kvcs")}
KEY = ProducerKey.generate("ES256", b"producer-1")
KEYS = {b"producer-1": KEY.public_key()}
SPEC = example_spec(layers=3, blocks=2, segments=(8,))
MANIFEST = SPEC.manifest({b"k.raw.s0": 3, b"v.raw.s0": 3, b"k.raw.s1": 1})
MANIFEST_JSON = MANIFEST.to_json()
SIGNED = sign(MANIFEST_JSON, KEY)
REQ_JSON = "KVCS-MANIFEST-JSON"
REQ_COSE = "KVCS-MANIFEST-COSE-SIGN"
REQ_TRACK = "KVCS-TRACK-NAME-ABNF"


def refused(call: Callable[..., Any], *args: Any) -> KvcsError:
    """``call(*args)`` raises KvcsError (nothing else), naming a field and a requirement of kvcs.yaml."""
    with pytest.raises(KvcsError) as info:
        call(*args)
    exc = info.value
    assert exc.field, f"no field named: {exc}"
    assert exc.requirement in KVCS_IDS, f"requirement {exc.requirement!r} is not in kvcs.yaml: {exc}"
    assert len(str(exc)) < 2000, "an error message that repeats a hostile input whole"
    return exc


def only_kvcs_error(call: Callable[..., Any], *args: Any) -> Any:
    """``call(*args)``'s value, or None when it raised KvcsError naming a field and a catalogued requirement."""
    try:
        return call(*args)
    except KvcsError as exc:
        assert exc.field and exc.requirement in KVCS_IDS, f"{exc} [{exc.requirement!r}]"
        return None


def _manifest_with(**changes: Any) -> bytes:
    obj = MANIFEST.to_obj()
    obj.update(changes)
    return json.dumps(obj).encode()


def _raw_member(name: str, literal: bytes) -> bytes:
    """The manifest with top-level ``name`` written as ``literal`` (a number json.dumps cannot write)."""
    return _manifest_with(**{name: "@@"}).replace(b'"@@"', literal)


def _segment_with(**changes: Any) -> bytes:
    obj = MANIFEST.to_obj()
    obj["segments"][0].update(changes)
    return json.dumps(obj).encode()


def _sign1(protected: Any, unprotected: Any = None, payload: Any = b"{}", signature: Any = b"",
           tag: int | None = 18) -> bytes:
    body = [protected, {} if unprotected is None else unprotected, payload, signature]
    return bytes(cbor2.dumps(body if tag is None else cbor2.CBORTag(tag, body)))


def _prot(header: Any) -> bytes:
    return bytes(cbor2.dumps(header))


# ---- COSE_Sign1 ------------------------------------------------------------------------------------------------

def test_cose_error_is_a_kvcs_error() -> None:
    assert issubclass(CoseError, KvcsError)


def test_an_array_where_alg_belongs_names_alg() -> None:
    exc = refused(verify, bytes.fromhex("8444a1018101a04040"), KEYS)
    assert "alg" in exc.field and exc.requirement == REQ_COSE and "[1]" in exc.problem


def test_a_valid_cose_sign1_with_trailing_octets_is_refused() -> None:
    assert verify(SIGNED, KEYS) == MANIFEST_JSON
    for tail in (b"\x00", b"\xf6", SIGNED):
        exc = refused(verify, SIGNED + tail, KEYS)
        assert "after" in exc.problem and exc.offset == len(SIGNED)
        refused(unverified_payload, SIGNED + tail)


_ALG = {1: -7, 4: b"producer-1"}
MALFORMED_COSE: list[tuple[str, bytes, str]] = [
    ("empty", b"", "manifest.cose"),
    ("a lone break", b"\xff", "manifest.cose"),
    ("reserved additional information 28", b"\x1c", "manifest.cose"),
    ("truncated uint64", b"\x1b\xff\xff", "manifest.cose"),
    ("a bstr declaring 2^64-1 octets", bytes.fromhex("5bffffffffffffffff"), "manifest.cose"),
    ("an array declaring 2^32 elements", bytes.fromhex("9b0000000100000000"), "manifest.cose"),
    ("tag 17 (COSE_Mac0)", _sign1(_prot(_ALG), tag=17), "tag"),
    ("tag 18 inside tag 18", bytes(cbor2.dumps(cbor2.CBORTag(18, cbor2.CBORTag(18, [b"", {}, b"", b""])))),
     "manifest.cose"),
    ("a map, not an array", bytes(cbor2.dumps(cbor2.CBORTag(18, {1: 2}))), "manifest.cose"),
    ("3 elements", bytes(cbor2.dumps(cbor2.CBORTag(18, [b"", {}, b""]))), "manifest.cose"),
    ("5 elements", bytes(cbor2.dumps(cbor2.CBORTag(18, [b"", {}, b"", b"", b""]))), "manifest.cose"),
    ("protected header as a text string", _sign1("a1", None), "protected"),
    ("unprotected header as an array", _sign1(_prot(_ALG), [1, 2]), "unprotected"),
    ("payload as a text string", _sign1(_prot(_ALG), None, "{}"), "payload"),
    ("payload null (detached)", _sign1(_prot(_ALG), None, None), "payload"),
    ("signature as an integer", _sign1(_prot(_ALG), None, b"{}", 7), "signature"),
    ("protected header bytes that are not CBOR", _sign1(b"\xff\x00"), "protected"),
    ("protected header encoding an array", _sign1(_prot([1, -7])), "protected"),
    ("protected header with trailing octets", _sign1(_prot(_ALG) + b"\x00"), "protected"),
    ("alg 2^64-1", _sign1(_prot({1: 2**64 - 1, 4: b"producer-1"})), "alg"),
    ("alg -2^64", _sign1(_prot({1: -(2**64), 4: b"producer-1"})), "alg"),
    ("alg as a bignum tag", _sign1(_prot({1: cbor2.CBORTag(3, b"\x06"), 4: b"producer-1"})), "alg"),
    ("alg -7.0 (a float equal to -7)", _sign1(_prot({1: -7.0, 4: b"producer-1"})), "alg"),
    ("alg true", _sign1(_prot({1: True, 4: b"producer-1"})), "alg"),
    ("alg as text", _sign1(_prot({1: "ES256", 4: b"producer-1"})), "alg"),
    ("alg a map", _sign1(_prot({1: {1: 1}, 4: b"producer-1"})), "alg"),
    ("alg only in the unprotected header", _sign1(b"", {1: -7, 4: b"producer-1"}), "alg"),
    ("kid as text", _sign1(_prot({1: -7, 4: "producer-1"})), "kid"),
    ("kid as an array", _sign1(_prot({1: -7, 4: [b"producer-1"]})), "kid"),
    ("kid in both headers", _sign1(_prot(_ALG), {4: b"producer-1"}), "unprotected header label 4 (kid)"),
    ("a label that is an array (unhashable)", bytes.fromhex("d284" "40" "a1810101" "427b7d" "40"), "unprotected"),
    ("a duplicate label in the protected header", _sign1(bytes.fromhex("a20126" "0126")), "protected"),
    # Indefinite lengths are read (a message may use them): these fail on what they carry, or on a missing break.
    ("an indefinite-length array with an empty protected header", bytes.fromhex("d2" "9f" "40a0427b7d40" "ff"),
     "alg"),
    ("an indefinite-length protected bstr that is not a map", bytes.fromhex("d284" "5f4101ff" "a04040"), "protected"),
    ("an unterminated indefinite map", bytes.fromhex("d284" "40" "bf01"), "unprotected"),
    ("an indefinite array with no break", bytes.fromhex("d2" "9f" "40a04040"), "manifest.cose"),
    ("an indefinite bstr with a text chunk", bytes.fromhex("d284" "5f6101ff" "a04040"), "protected"),
    ("a break with nothing open", bytes.fromhex("d284" "40" "a0" "ff" "40"), "payload"),
    ("1000 nested arrays in the unprotected header",
     bytes.fromhex("d284" "40" "a1" "20") + b"\x81" * 1000 + b"\x00" + bytes.fromhex("4040"), "unprotected"),
    ("a shared-reference tag (28/29) cycle, kept as plain tags", bytes.fromhex("d284" "40" "a120" "d81c81d81d00"
                                                                                "427b7d" "40"), "alg"),
    ("a text string that is not UTF-8", bytes.fromhex("d284" "40" "a1" "20" "62c328" "4040"), "unprotected"),
    ("simple value 24 below 32 (not well-formed)", bytes.fromhex("d284" "40" "a1" "20" "f801" "4040"),
     "unprotected"),
    ("a negative integer as the protected header", bytes.fromhex("d284" "20" "a0" "4040"), "protected"),
]


@pytest.mark.parametrize(("comment", "data", "field"), MALFORMED_COSE, ids=[c for c, _, _ in MALFORMED_COSE])
def test_malformed_cose_sign1_is_a_kvcs_error_naming_the_field(comment: str, data: bytes, field: str) -> None:
    exc = refused(verify, data, KEYS)
    assert isinstance(exc, CoseError) and exc.requirement == REQ_COSE
    assert field in exc.field, f"{comment}: {exc}"


@pytest.mark.parametrize(("comment", "data", "field"), MALFORMED_COSE, ids=[c for c, _, _ in MALFORMED_COSE])
def test_the_unverified_reading_refuses_the_same_structures(comment: str, data: bytes, field: str) -> None:
    if field in ("alg", "kid"):
        assert unverified_payload(data) == b"{}"  # no key is checked without producer keys
    else:
        refused(unverified_payload, data)


def test_a_signature_of_the_wrong_length_does_not_verify() -> None:
    for alg in ("ES256", "EdDSA"):
        key = ProducerKey.generate(alg, b"p")
        good = cbor2.loads(sign(b"{}", key)).value
        for signature in (b"", good[3][:-1], good[3] + b"\x00", bytes(64)):
            data = bytes(cbor2.dumps(cbor2.CBORTag(18, [good[0], {}, good[2], signature])))
            assert "does not verify" in refused(verify, data, {b"p": key.public_key()}).problem


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=200))
def test_cose_garbage_is_refused_or_read(data: bytes) -> None:
    only_kvcs_error(verify, data, KEYS)
    only_kvcs_error(unverified_payload, data)


def _mutate(data: bytes, edits: list[tuple[int, int, int]]) -> bytes:
    """Apply (kind, position, value) edits: 0 overwrite, 1 insert, 2 delete the octet at position."""
    out = bytearray(data)
    for kind, pos, value in edits:
        if not out:
            out.append(value)
            continue
        i = pos % len(out)
        if kind == 0:
            out[i] = value
        elif kind == 1:
            out.insert(i, value)
        else:
            del out[i]
    return bytes(out)


_EDITS = st.lists(st.tuples(st.integers(0, 2), st.integers(0, 2**16), st.integers(0, 255)), min_size=1, max_size=4)


@settings(max_examples=300, deadline=None)
@given(_EDITS)
def test_mutated_cose_sign1_is_refused_or_read(edits: list[tuple[int, int, int]]) -> None:
    data = _mutate(SIGNED, edits)
    payload = only_kvcs_error(verify, data, KEYS)
    assert payload is None or payload == MANIFEST_JSON, "a mutation outside the headers must not change the manifest"
    only_kvcs_error(unverified_payload, data)


# ---- manifest JSON ---------------------------------------------------------------------------------------------

def test_a_4301_digit_number_is_a_kvcs_error() -> None:
    assert refused(parse_manifest, b"1" * 4301).field == "manifest"
    exc = refused(parse_manifest, _raw_member("layers", b"9" * 4301))
    assert exc.field == "manifest layers" and "digits" in exc.problem


@pytest.mark.parametrize("depth", [40, 994, 100_000])
def test_deep_nesting_is_refused_before_parsing(depth: int) -> None:
    for opener, closer in ((b"[", b"]"), (b'{"a":', b"}")):
        exc = refused(parse_manifest, opener * depth + closer * depth)
        assert exc.field == "manifest" and "nested" in exc.problem
    # brackets inside strings are not nesting
    assert refused(parse_manifest, json.dumps({"x": "[" * depth}).encode()).field == "manifest kvcs"


@pytest.mark.parametrize("constant", ["NaN", "Infinity", "-Infinity", "1e400", "-1e400"])
def test_nan_and_infinity_in_compat_name_the_field(constant: str) -> None:
    data = _manifest_with().replace(b'"kv_heads": 2', f'"kv_heads": {constant}'.encode())
    exc = refused(parse_manifest, data)
    assert exc.field == "manifest compat.kv_heads" and exc.requirement == REQ_JSON


def test_duplicate_members_are_refused() -> None:
    text = _manifest_with().decode()
    assert refused(parse_manifest, ('{"layers": 3, ' + text[1:]).encode()).problem.count("layers") >= 1
    exc = refused(parse_manifest, text.replace('"segment": 0,', '"segment": 0, "segment": 0,', 1).encode())
    assert exc.field == "manifest segments[0]" and "segment" in exc.problem


@pytest.mark.parametrize("top", [b"[]", b'"manifest"', b"1", b"null", b"true", b""])
def test_a_top_level_that_is_not_an_object(top: bytes) -> None:
    assert refused(parse_manifest, top).field == "manifest"


def test_lone_surrogates_are_refused_where_they_are() -> None:
    exc = refused(parse_manifest, _manifest_with().replace(b'"k.raw.s0"', b'"k.raw.s0\\ud800"', 1))
    assert exc.field.startswith("manifest segments[0]") and "surrogate" in exc.problem
    exc = refused(parse_manifest, _manifest_with().replace(b'"model"', b'"\\udfffmodel"'))
    assert exc.field.startswith("manifest compat") and "surrogate" in exc.problem


def test_encodings_other_than_utf8_are_refused() -> None:
    assert refused(parse_manifest, MANIFEST_JSON.decode().encode("utf-16")).field == "manifest"
    assert refused(parse_manifest, b"\xef\xbb\xbf" + MANIFEST_JSON).field == "manifest"
    assert refused(parse_manifest, MANIFEST_JSON.replace(b'"f16"', b'"f\xff16"')).field == "manifest"


def test_an_oversized_manifest_is_refused_before_parsing() -> None:
    assert parse_manifest(MANIFEST_JSON, max_octets=len(MANIFEST_JSON)) == MANIFEST
    exc = refused(lambda: parse_manifest(MANIFEST_JSON + b" ", max_octets=len(MANIFEST_JSON)))
    assert "octets" in exc.problem


BAD_FIELDS: list[tuple[str, bytes, str]] = [
    ("kvcs true", _manifest_with(kvcs=True), "manifest kvcs"),
    ("kvcs 1.0", _manifest_with(kvcs=1.0), "manifest kvcs"),
    ("kvcs 2", _manifest_with(kvcs=2), "manifest kvcs"),
    ("layers true", _manifest_with(layers=True), "manifest layers"),
    ("layers 0", _manifest_with(layers=0), "manifest layers"),
    ("layers -1", _manifest_with(layers=-1), "manifest layers"),
    ("layers 3.5", _manifest_with(layers=3.5), "manifest layers"),
    ("layers \"3\"", _manifest_with(layers="3"), "manifest layers"),
    ("block_tokens 0", _manifest_with(block_tokens=0), "manifest block_tokens"),
    ("block_tokens false", _manifest_with(block_tokens=False), "manifest block_tokens"),
    ("deterministic 0", _manifest_with(deterministic=0), "manifest deterministic"),
    ("compat an array", _manifest_with(compat=[1]), "manifest compat"),
    ("segments an object", _manifest_with(segments={}), "manifest segments"),
    ("a segment that is a number", _manifest_with(segments=[1]), "manifest segments[0]"),
    ("segment -1", _segment_with(segment=-1), "manifest segments[0].segment"),
    ("segment true", _segment_with(segment=True), "manifest segments[0].segment"),
    ("first_block -1", _segment_with(first_block=-1), "manifest segments[0].first_block"),
    ("blocks -1", _segment_with(blocks=-1), "manifest segments[0].blocks"),
    ("blocks true", _segment_with(blocks=True), "manifest segments[0].blocks"),
    ("complete 1", _segment_with(complete=1), "manifest segments[0].complete"),
    ("block_keys_sha256 with spaces", _segment_with(block_keys_sha256=" ".join(["ab"] * 32)),
     "manifest segments[0].block_keys_sha256"),
    ("block_keys_sha256 of 31 octets", _segment_with(block_keys_sha256="ab" * 31),
     "manifest segments[0].block_keys_sha256"),
    ("block_keys_sha256 with Arabic-Indic digits", _segment_with(block_keys_sha256="\u0663" * 64),
     "manifest segments[0].block_keys_sha256"),
    ("tracks a string", _segment_with(tracks="k.raw.s0"), "manifest segments[0].tracks"),
    ("a track that is a number", _segment_with(tracks=[1]), "manifest segments[0].tracks[0]"),
    ("object_digests an array", _segment_with(object_digests=[]), "manifest segments[0].object_digests"),
    ("object_digests of a track not an array", _segment_with(object_digests={"k.raw.s0": "ab"}),
     "manifest segments[0].object_digests.k.raw.s0"),
    ("a digest of the wrong length", _segment_with(object_digests={"k.raw.s0": [["ab"]]}),
     "manifest segments[0].object_digests.k.raw.s0[0][0]"),
    ("an integer beyond 2^53 that no double holds", _manifest_with(layers=2**53 + 1), "manifest layers"),
    ("an integer too large for a double", _raw_member("layers", b"1" + b"0" * 400), "manifest layers"),
    ("a float too large for a double", _raw_member("layers", b"1e400"), "manifest layers"),
    ("layers NaN", _raw_member("layers", b"NaN"), "manifest layers"),
]


@pytest.mark.parametrize(("comment", "data", "field"), BAD_FIELDS, ids=[c for c, _, _ in BAD_FIELDS])
def test_each_field_is_checked_strictly_and_named(comment: str, data: bytes, field: str) -> None:
    exc = refused(parse_manifest, data)
    assert exc.field == field and exc.requirement == REQ_JSON, f"{comment}: {exc}"


def test_a_segment_without_blocks_is_still_a_manifest() -> None:
    """The reference publisher lists an appended segment shorter than a block with "blocks": 0."""
    assert parse_manifest(_segment_with(blocks=0)).segments[0].blocks == 0


def _manifest_values() -> st.SearchStrategy[Any]:
    scalars = st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.floats() | st.text(max_size=8)
    return st.recursive(scalars, lambda inner: st.lists(inner, max_size=3)
                        | st.dictionaries(st.text(max_size=6), inner, max_size=3), max_leaves=8)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.sampled_from(["kvcs", "compat", "layers", "block_tokens", "deterministic", "segments", "segment",
                        "first_block", "blocks", "block_keys_sha256", "tracks", "complete", "object_digests"]),
       _manifest_values())
def test_a_manifest_with_any_member_replaced_parses_or_names_the_field(member: str, value: Any) -> None:
    obj = MANIFEST.to_obj()
    target = obj if member in obj else obj["segments"][0]
    target[member] = value
    manifest = only_kvcs_error(parse_manifest, json.dumps(obj).encode())
    if manifest is not None:
        assert isinstance(manifest, Manifest)
        assert all(isinstance(p, str) for p in manifest_problems(manifest, SPEC.namespace(bytes(16)), SPEC.profile,
                                                                  block_keys=SPEC.block_keys))


@settings(max_examples=300, deadline=None)
@given(_EDITS)
def test_a_mutated_manifest_parses_or_names_the_field(edits: list[tuple[int, int, int]]) -> None:
    manifest = only_kvcs_error(parse_manifest, _mutate(MANIFEST_JSON, edits))
    if manifest is not None:
        manifest_problems(manifest, SPEC.namespace(bytes(16)), SPEC.profile, block_keys=SPEC.block_keys)


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=200) | st.text(alphabet='[]{}",:0123456789.eE+-\\ntrufalsNI ', max_size=200).map(
    str.encode))
def test_manifest_garbage_is_refused_or_read(data: bytes) -> None:
    only_kvcs_error(parse_manifest, data)


def test_manifest_problems_never_raise_on_a_parsed_manifest() -> None:
    """A compat the KVSP profile cannot canonicalise is a problem of the manifest, not a crash."""
    for compat in ({"model": 1}, {**MANIFEST.compat, "x": [[[]]]}, {**MANIFEST.compat, "x": 2**60},
                   {**MANIFEST.compat, "x": -0.0}):
        manifest = parse_manifest(_manifest_with(compat=compat))
        assert isinstance(manifest_problems(manifest, SPEC.namespace(bytes(16)), SPEC.profile), list)


# ---- Track Names -----------------------------------------------------------------------------------------------

HOSTILE_TRACKS = [b"k.raw.s" + b"1" * 4301, b"k.raw.s" + b"1" * 4090, b"k.raw.s01", b"k.raw.s+1", b"k.raw.s 1",
                  b"k.raw.s1 ", b"k.raw.s-1", b"k.raw.s1\n",
                  "k.raw.s\u0663".encode(), "k.raw.s\uff11".encode(), b"k.raw.s1_0", b"k.raw.s0x1", b"k.raw.s",
                  b"k.\xff.s0", b"k." + b"a" * 33 + b".s0", b"manifest\x00", b"\x00" * 100]


@pytest.mark.parametrize("name", HOSTILE_TRACKS, ids=[repr(n[:24]) for n in HOSTILE_TRACKS])
def test_hostile_track_names_are_kvcs_errors(name: bytes) -> None:
    exc = refused(parse_track_name, name)
    assert exc.field == "Track Name" and exc.requirement == REQ_TRACK


def test_segment_numbers_are_bounded_by_moqts_name_length_only() -> None:
    """The ABNF sets no bound; a Full Track Name has at most 4096 octets, so int() never sees 4300 digits."""
    longest = b"k.raw.s" + b"9" * (MAX_NAME - 7)
    track = parse_track_name(longest)
    assert isinstance(track, DataTrack) and track.name == longest and track.segment == 10 ** (MAX_NAME - 7) - 1
    assert "4096" in refused(parse_track_name, longest + b"9").problem
    assert "4096" in refused(parse_track_name, b"k.raw.s" + b"1" * 4301).problem
    for segment in (-1, 10**5000, True, 1.0):
        refused(DataTrack, "k", "raw", segment)
    for component, codec in (("x", "raw"), (["k"], "raw"), ("k", "RAW"), ("k", "\u00e9")):
        refused(DataTrack, component, codec, 0)


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=40) | st.from_regex(rb"\A(k|v|kv|x)\.[a-z0-9-]{0,34}\.s[0-9+ -]{0,30}\Z"))
def test_track_names_round_trip_or_are_refused(name: bytes) -> None:
    parsed = only_kvcs_error(parse_track_name, name)
    if isinstance(parsed, DataTrack):
        assert parsed.name == name
    elif parsed is not None:
        assert parsed in (b"manifest", b"manifest.cose")


# ---- namespaces, payloads --------------------------------------------------------------------------------------

@settings(max_examples=200, deadline=None)
@given(st.lists(st.binary(max_size=40), max_size=7))
def test_namespace_fields_parse_or_name_the_field(fields: list[bytes]) -> None:
    only_kvcs_error(KvcsNamespace.parse, TrackNamespace(tuple(fields)))


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=200), st.integers(0, 2**64 - 1), st.integers(0, 2**64 - 1))
def test_object_payloads_decode_or_name_the_check(payload: bytes, group: int, obj: int) -> None:
    only_kvcs_error(decode_object, payload)
    assert all(isinstance(p, str) for p in verify_object(payload, group, obj))


# ---- a consumer's result JSON ---------------------------------------------------------------------------------

BAD_RESULTS: list[tuple[str, Any, str]] = [
    ("not an object", [], "consumer result"),
    ("layers an array", {"layers": []}, "consumer result layers"),
    ("a layer key with Arabic-Indic digits", {"layers": {"\u0663": "failed"}}, "consumer result layers"),
    ("a layer key with a plus", {"layers": {"+3": "failed"}}, "consumer result layers"),
    ("a layer key with spaces", {"layers": {" 3": "failed"}}, "consumer result layers"),
    ("a layer key with a leading zero", {"layers": {"03": "failed"}}, "consumer result layers"),
    ("a 4301-digit layer key", {"layers": {"1" * 4301: "failed"}}, "consumer result layers"),
    ("a digest that is not hex", {"layers": {"0": "zz"}}, "consumer result layers[0]"),
    ("a digest that is a number", {"layers": {"0": 7}}, "consumer result layers[0]"),
    ("a source publication that is not hex", {"layers": {"0": {"digest": "ab", "publication": "z"}}},
     "consumer result layers[0].publication"),
    ("publication a number", {"publication": 1, "layers": {}}, "consumer result publication"),
    ("a rejection group that is an array", {"layers": {}, "rejected": [{"group": [1]}]},
     "consumer result rejected[0].group"),
    ("a rejection group true", {"layers": {}, "rejected": [{"group": True}]}, "consumer result rejected[0].group"),
    ("rejected an object", {"layers": {}, "rejected": {}}, "consumer result rejected"),
    ("a segment of one number", {"layers": {}, "segments": [[1]]}, "consumer result segments[0]"),
    ("a segment that is a number", {"layers": {}, "segments": [1]}, "consumer result segments[0]"),
    ("elapsed a string", {"layers": {}, "elapsed": "1"}, "consumer result elapsed"),
    ("gave_up a string", {"layers": {}, "gave_up": "no"}, "consumer result gave_up"),
    ("publications a string", {"layers": {}, "publications": "x"}, "consumer result publications"),
    ("mode a number", {"layers": {}, "mode": 1}, "consumer result mode"),
]


@pytest.mark.parametrize(("comment", "obj", "field"), BAD_RESULTS, ids=[c for c, _, _ in BAD_RESULTS])
def test_a_consumer_result_names_the_field(comment: str, obj: Any, field: str) -> None:
    with pytest.raises(KvcsError) as info:
        ConsumeResult.from_obj(obj)
    assert info.value.field == field, f"{comment}: {info.value}"


@pytest.mark.parametrize("text", [b"[" * 100_000, b'{"layers": {"0": NaN}}', b"\xff", b'{"layers": 1e400}',
                                  b'{"layers": {}, "elapsed": ' + b"1" * 4301 + b"}"])
def test_a_hostile_result_file_is_a_read_error_not_a_crash(tmp_path: Path, text: bytes) -> None:
    out = tmp_path / "result.json"
    out.write_bytes(text)
    parsed, error = _read_result(out)
    assert parsed is None and error is not None and "cannot be read" in error


def test_a_result_file_round_trips(tmp_path: Path) -> None:
    out = tmp_path / "result.json"
    result = ConsumeResult(bytes(16), {0: bytes(32), 1: None}, segments=[(0, 2)], elapsed=0.5)
    out.write_text(result.to_json())
    parsed, error = _read_result(out)
    assert error is None and parsed is not None and parsed.layers == result.layers


# ---- the harness's own cache spec (a vendor may hand one in) ---------------------------------------------------

def test_cache_spec_fields_are_typed_strictly(tmp_path: Path) -> None:
    good = SPEC.to_obj()
    for field, value in [("segments", [True]), ("segments", [8.0])]:
        with pytest.raises(KvcsError, match="segments"):
            CacheSpec.load({**good, field: value})
    with pytest.raises(KvcsError, match=r"compat"):
        CacheSpec.load({**good, "compat": {**good["compat"], "rope_theta": float("nan")}})
    path = tmp_path / "spec.json"
    path.write_bytes(b"[" * 100_000)
    with pytest.raises(KvcsError, match="nested"):
        CacheSpec.load(path)


def test_cose_module_exports_the_unverified_reader() -> None:
    assert cose.unverified_payload(SIGNED) == MANIFEST_JSON


def test_a_valid_cose_sign1_with_indefinite_lengths_verifies() -> None:
    """RFC 9052 section 9 asks definite lengths only of the structures that are signed (the verifier rebuilds
    Sig_structure itself): the message may use indefinite ones, and a correct publisher must not fail for it."""
    key = ProducerKey.generate("EdDSA", b"producer-1")
    protected, unprotected, payload, signature = cbor2.loads(sign(b'{"kvcs": 1}', key)).value

    def chunked(data: bytes) -> bytes:  # a byte string as two chunks
        half = len(data) // 2
        return b"\x5f" + cbor2.dumps(data[:half]) + cbor2.dumps(data[half:]) + b"\xff"

    body = (b"\xd2\x9f" + chunked(protected) + b"\xbf" + b"\xff" + chunked(payload) + cbor2.dumps(signature)
            + b"\xff")
    assert unprotected == {}
    assert verify(body, {b"producer-1": key.public_pem()}) == b'{"kvcs": 1}'
