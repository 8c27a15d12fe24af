"""KVCS test vectors: generators and reference checkers (the KVCS text's "Encoding Examples", its layouts and
ABNF, the provisional KVSP profile of issue 5, and the byte-exact recipes of moqt-d22-profile §11.3).

Kinds:
- kvcs-namespace: five namespace fields <-> the encoded Track Namespace; invalid encodings name the field;
- kvcs-payload: a KVO1 object payload at {group, object} -> its header fields (valid) or the End Subscriber
  check that rejects it (invalid);
- kvcs-track-name: a Track Name -> what the ABNF makes of it;
- kvcs-kvsp: kvsp-provisional-1 (JCS, Compatibility ID, Scope ID, Block Keys, layer digest);
- kvcs-object: the object payloads a correct publisher sends for a cache spec (test-content convention);
- kvcs-manifest: manifest JSON for a cache spec and namespace -> usable, or the requirement it breaks;
- kvcs-moqt-message: the KVCS control messages of moqt-d22-profile §11.3 byte for byte;
- kvcs-cose: "manifest.cose" COSE_Sign1 structures (ES256, EdDSA) -> the manifest, or why they are refused.
The texts' examples are hand-written constants, quoted in their comments; everything else is computed from
fixed inputs, so `kvconform vectors generate` is reproducible byte for byte.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Sequence
from typing import Any

import cbor2
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import ec, ed25519
from cryptography.hazmat.primitives.asymmetric.utils import decode_dss_signature

from kvconform.kvcs.content import CacheSpec, example_spec
from kvconform.kvcs.cose import CoseError, ProducerKey, verify
from kvconform.kvcs.errors import KvcsError
from kvconform.kvcs.manifest import Manifest, SegmentEntry, manifest_problems, parse_manifest
from kvconform.kvcs.namespace import KvcsNamespace
from kvconform.kvcs.payload import HEADER_LEN, ObjectHeader, decode_object, encode_object, encode_raw, verify_object
from kvconform.kvcs.tracks import DataTrack, parse_track_name
from kvconform.kvsp import PROVISIONAL, KvspError, jcs_canonical
from kvconform.moqt.errors import MoqtDecodeError
from kvconform.moqt.filters import LocationFilter, RangeFilter
from kvconform.moqt.messages import (
    ControlMessage,
    Fetch,
    Subscribe,
    SubscribeNamespace,
    parse_control_message,
)
from kvconform.moqt.parameters import FillParameters, Parameters
from kvconform.moqt.structures import AuthToken, ParamType, TrackNamespace
from kvconform.moqt.vi64 import Reader
from kvconform.testvectors import Checker, VectorCase, make_document

__all__ = [
    "CHECKERS",
    "FILES",
    "KIND_COSE",
    "KIND_KVSP",
    "KIND_MANIFEST",
    "KIND_MOQT_MESSAGE",
    "KIND_NAMESPACE",
    "KIND_OBJECT",
    "KIND_PAYLOAD",
    "KIND_TRACK_NAME",
    "SPEC_LIVE_SUBSCRIBE",
    "SPEC_NAMESPACE",
    "SPEC_PAYLOAD_DATA",
    "SPEC_PAYLOAD_HEADER",
    "generate",
    "header_to_json",
]

KIND_NAMESPACE = "kvcs-namespace"
KIND_PAYLOAD = "kvcs-payload"
KIND_TRACK_NAME = "kvcs-track-name"
KIND_KVSP = "kvcs-kvsp"
KIND_OBJECT = "kvcs-object"
KIND_MANIFEST = "kvcs-manifest"
KIND_MOQT_MESSAGE = "kvcs-moqt-message"
KIND_COSE = "kvcs-cose"
FILES = {
    KIND_NAMESPACE: "kvcs/namespace.json",
    KIND_PAYLOAD: "kvcs/payload.json",
    KIND_TRACK_NAME: "kvcs/track_names.json",
    KIND_KVSP: "kvcs/kvsp_provisional.json",
    KIND_OBJECT: "kvcs/objects.json",
    KIND_MANIFEST: "kvcs/manifest.json",
    KIND_MOQT_MESSAGE: "kvcs/moqt_messages.json",
    KIND_COSE: "kvcs/manifest_cose.json",
}
SCHEMA = "kvcs.schema.json"
GENERATOR = "kvconform.kvcs.vectors"
SOURCE = "spec/seeds/000_40f4eeb704db7bd1.txt"

# KVCS "Encoding Examples", byte for byte as printed there.
SPEC_NAMESPACE = bytes.fromhex(
    "05 06 6b 76 63 73 2d 31 10 6d 1c 64 81 cd 42 87 37 da 31 2c 08 9d b3 83 2a 20 5e d5 c2 f2 38 83 96 55 d7 c4"
    " 02 9e 12 b7 f3 1c af 9e 74 21 f4 ed b4 05 7f ee e6 da b7 60 ee 0f 20 65 32 75 88 4c a4 4f 89 45 fd 4c 90 26"
    " 11 c4 67 39 4b 73 65 6e 64 c7 8d 85 22 64 8c b7 5a ef c1 10 01 23 45 67 89 ab cd ef 01 23 45 67 89 ab cd ef")
SPEC_PAYLOAD_HEADER = bytes.fromhex(
    "4b 56 4f 31 01 01 00 00 00 00 00 00 00 00 00 01 00 00 00 00 00 00 00 04 00 00 00 04 00 01 00 00 00 00 00 10"
    " be 45 cb 26 05 bf 36 be bd e6 84 84 1a 28 f0 fd 43 c6 98 50 a3 dc e5 fe db a6 99 28 ee 3a 89 91")
SPEC_PAYLOAD_DATA = bytes(range(16))  # "16 octets of Data with values 0x00 to 0x0f"
# moqt-d22-profile §11.3: the live data-track SUBSCRIBE, Request ID 0, the KVCS example namespace (131 bytes).
SPEC_LIVE_SUBSCRIBE = bytes.fromhex(
    "03 00 80 00" + SPEC_NAMESPACE.hex() + " 08 6b 2e 72 61 77 2e 73 30 02 21 05 02 05 01 21 02 00 00")
_SPEC_PARAM_BLOCKS = {  # §11.3's printed parameter blocks
    "token": "03 03 05 03 00 74 6f 6b 1e 05 02 05 01 21 02 00 00",
    "manifest": "02 21 05 02 04 01 21 01 01",
    "completed": "03 21 03 02 00 03 01 01 04 03 00 00 02",
}
_NS_FIELDS = ("scope_id", "compat_id", "anchor_key", "pub_id")
_HEADER_FIELDS = ("magic", "version", "component", "flags", "layer", "block_index", "token_start", "token_count",
                  "codec", "reserved", "data_length", "digest")


def _case(comment: str, flags: Sequence[str], result: str = "valid", **fields: Any) -> dict[str, Any]:
    return {"tcId": 0, "comment": comment, "flags": list(flags), "result": result, **fields}


def _document(kind: str, notes: dict[str, str], groups: list[dict[str, Any]], source: str = SOURCE) -> dict[str, Any]:
    return make_document(kind, notes, groups, schema=SCHEMA, generator=GENERATOR, source=source)


def header_to_json(header: ObjectHeader) -> dict[str, Any]:
    """The header fields by name; the digest in hex."""
    return {name: (getattr(header, name).hex() if name == "digest" else getattr(header, name))
            for name in _HEADER_FIELDS}


def _rejected(exc: KvcsError | KvspError, case: VectorCase) -> str | None:
    """None when a rejection is the one an invalid case expects (its requirement, and its field if named)."""
    if case.result == "valid":
        return f"the reference rejected it: {exc}"
    requirement = getattr(exc, "requirement", "")
    if requirement != case["requirement"] or ("field" in case.fields and case["field"] not in str(exc)):
        return f"rejected for another reason: {exc}; expected field {case.fields.get('field')!r} " \
               f"[{case['requirement']}]"
    return None


# ---- checkers --------------------------------------------------------------------------------------------------


def _namespace_of(encoded: bytes) -> KvcsNamespace:
    r = Reader(encoded)
    ns = TrackNamespace.decode(r)
    if not r.at_end():
        raise KvcsError("Track Namespace", f"{len(encoded) - r.pos} octets after the namespace",
                        requirement="KVCS-NS-FIVE-FIELDS", offset=r.pos)
    return KvcsNamespace.parse(ns)


def check_namespace(case: VectorCase) -> str | None:
    """Valid: the fields encode to the bytes and the bytes parse to the fields (from a cache spec when the group
    gives one). Invalid: the KVCS parse rejects the bytes naming the field and requirement."""
    encoded = bytes.fromhex(case["encoded"])
    try:
        parsed = _namespace_of(encoded)
    except KvcsError as exc:
        return _rejected(exc, case)
    if case.result == "invalid":
        return f"parsed as {parsed}, expected {case['field']} rejected [{case['requirement']}]"
    seen = {name: getattr(parsed, name).hex() for name in _NS_FIELDS}
    if "spec" in case.group:
        expected = CacheSpec.load(case["spec"]).namespace(bytes.fromhex(case["pub_id"]))
        want = {name: getattr(expected, name).hex() for name in _NS_FIELDS}
    else:
        want = dict(case["fields"])
    if seen != want:
        diff = sorted(k for k in want if seen[k] != want[k])
        return f"fields {diff}: parsed {[seen[k] for k in diff]}, expected {[want[k] for k in diff]}"
    rebuilt = KvcsNamespace(*(bytes.fromhex(want[k]) for k in _NS_FIELDS)).encode()
    if rebuilt != encoded:
        return f"encoding the fields gives {rebuilt.hex()}, expected {encoded.hex()}"
    return None


def check_payload(case: VectorCase) -> str | None:
    """Valid: no End Subscriber check fails, the header decodes to the listed fields, and (Flags and Reserved
    zero) the checked encoder rebuilds the payload. Invalid: a problem cites the expected requirement."""
    payload = bytes.fromhex(case["payload"])
    problems = verify_object(payload, case["group"], case["object"])
    if case.result == "invalid":
        if not any(f"[{case['requirement']}]" in p for p in problems):
            return f"problems {problems or 'none'}, expected one citing {case['requirement']}"
        return None
    if problems:
        return f"the reference End Subscriber rejects it: {problems}"
    header, data = decode_object(payload)
    seen = header_to_json(header)
    if seen != case["header"]:
        diff = sorted(k for k in seen if seen[k] != case["header"].get(k))
        return f"header fields {diff}: decoded {[seen[k] for k in diff]}, expected {[case['header'][k] for k in diff]}"
    if header.flags == 0 and header.reserved == 0:
        rebuilt = encode_object(component=header.component, layer=header.layer, block_index=header.block_index,
                                token_start=header.token_start, token_count=header.token_count, codec=header.codec,
                                data=data)
        if rebuilt != payload:
            return "the checked encoder of the decoded fields does not give the payload back"
    return None


def _track_json(parsed: bytes | DataTrack) -> dict[str, Any]:
    if isinstance(parsed, DataTrack):
        return {"kind": "data", "component": parsed.component, "codec": parsed.codec, "segment": parsed.segment}
    return {"kind": parsed.decode("ascii")}


def check_track_name(case: VectorCase) -> str | None:
    name = case["name"].encode("utf-8")
    try:
        parsed = parse_track_name(name)
    except KvcsError as exc:
        return _rejected(exc, case)
    if case.result == "invalid":
        return f"parsed as {_track_json(parsed)}, expected rejected [{case['requirement']}]"
    if _track_json(parsed) != case["parsed"]:
        return f"parsed: got {_track_json(parsed)}, expected {case['parsed']}"
    if isinstance(parsed, DataTrack) and parsed.name != name:
        return f"DataTrack.name gives {parsed.name!r} back, expected {name!r}"
    return None


def _kvsp_value(case: VectorCase) -> Any:
    """What kvsp-provisional-1 computes for a case of the group's type, in the vector's JSON form."""
    kind = case.group["type"]
    if kind == "JcsTest":
        return jcs_canonical(json.loads(case["json"])).decode("utf-8")
    if kind == "CompatIdTest":
        return PROVISIONAL.compatibility_id(case["compat"]).hex()
    if kind == "ScopeIdTest":
        return PROVISIONAL.scope_id(bytes.fromhex(case["scope_key"])).hex()
    if kind == "BlockKeysTest":
        keys = PROVISIONAL.block_keys(bytes.fromhex(case["scope_key"]), bytes.fromhex(case["compat_id"]),
                                      case["tokens"], case["block_tokens"])
        return [k.hex() for k in keys]
    if kind == "LayerDigestTest":
        return PROVISIONAL.layer_digest(bytes.fromhex(case["k"]), bytes.fromhex(case["v"])).hex()
    raise ValueError(f"group type {kind!r}: expected one of JcsTest, CompatIdTest, ScopeIdTest, BlockKeysTest, "
                     "LayerDigestTest")


_KVSP_OUTPUT = {"JcsTest": "canonical", "CompatIdTest": "compat_id", "ScopeIdTest": "scope_id",
                "BlockKeysTest": "block_keys", "LayerDigestTest": "digest"}


def check_kvsp(case: VectorCase) -> str | None:
    try:
        seen = _kvsp_value(case)
    except KvspError as exc:
        if case.result == "valid":
            return f"kvsp-provisional-1 rejected it: {exc}"
        return None if case["field"] in str(exc) else f"rejected for another reason: {exc} (expected {case['field']})"
    if case.result == "invalid":
        return f"kvsp-provisional-1 computed {seen!r}, expected {case['field']} rejected [{case['requirement']}]"
    output = _KVSP_OUTPUT[case.group["type"]]
    if seen != case[output]:
        return f"{output}: kvsp-provisional-1 gives {seen!r}, the vector says {case[output]!r}"
    if case.group["type"] == "JcsTest" and hashlib.sha256(seen.encode()).hexdigest() != case["sha256"]:
        return "sha256: not the SHA-256 of the canonical form"
    return None


def check_object(case: VectorCase) -> str | None:
    """The payload a correct publisher sends at {layer, object} of a track of the group's cache spec; a "kv"
    object's Data Digest is the KVSP layer digest of its block and layer (KVCS-PAYLOAD-LAYER-DIGEST)."""
    spec = CacheSpec.load(case["spec"])
    track = parse_track_name(case["track"].encode())
    if not isinstance(track, DataTrack):
        return f"track: {case['track']!r} is not a data track"
    payload = spec.object_payload(track, case["layer"], case["object"])
    if payload.hex() != case["payload"]:
        return f"payload: the reference publishes {payload[:HEADER_LEN].hex()}.. ({len(payload)} octets), the vector " \
               f"has {case['payload'][:2 * HEADER_LEN]}.. ({len(case['payload']) // 2} octets)"
    header, _ = decode_object(payload)
    if track.component == "kv":
        abs_block = spec.segment_layout()[track.segment].first_block + case["object"]
        if header.digest != spec.layer_digest(case["layer"], abs_block):
            return "kv Data Digest is not the KVSP layer digest of its block and layer [KVCS-PAYLOAD-LAYER-DIGEST]"
    return None


def check_manifest(case: VectorCase) -> str | None:
    """Valid: the manifest parses, its "compat" has the listed Compatibility ID, and nothing is inconsistent with
    the namespace and the spec's Block Keys. Invalid: parsing or the consistency check cites the requirement."""
    spec = CacheSpec.load(case["spec"])
    namespace = KvcsNamespace(*(bytes.fromhex(case["namespace"][k]) for k in _NS_FIELDS))
    text = case["manifest"].encode("utf-8")
    try:
        manifest = parse_manifest(text)
    except KvcsError as exc:
        return _rejected(exc, case)
    problems = manifest_problems(manifest, namespace, spec.profile, block_keys=spec.block_keys)
    if case.result == "invalid":
        if not any(f"[{case['requirement']}]" in p for p in problems):
            return f"problems {problems or 'none'}, expected one citing {case['requirement']}"
        return None
    if problems:
        return f"the reference finds problems: {problems}"
    compat_id = spec.profile.compatibility_id(manifest.compat).hex()
    if compat_id != case["compat_id"]:
        return f"compat_id: JCS + SHA-256 of compat gives {compat_id}, the vector says {case['compat_id']}"
    if manifest.to_json() != text:
        return "the parsed manifest does not serialise back to the same JSON"
    return None


def _message_json(msg: ControlMessage) -> dict[str, Any]:
    if isinstance(msg, SubscribeNamespace):
        ns, name = msg.track_namespace_prefix, None
    elif isinstance(msg, Subscribe):  # SUBSCRIBE and FETCH share the layout
        ns, name = msg.track_namespace, msg.track_name.decode("ascii", "replace")
    else:
        raise ValueError(f"{type(msg).__name__}: not a KVCS recipe message")
    return {"type": msg.name(), "request_id": msg.request_id, "namespace": [f.hex() for f in ns.fields],
            "track_name": name, "parameters": msg.parameters.encode().hex()}


def check_moqt_message(case: VectorCase) -> str | None:
    wire = bytes.fromhex(case["message"])
    try:
        msg, used = parse_control_message(wire)
    except MoqtDecodeError as exc:
        return f"the reference MOQT decoder rejects it: {exc}"
    if used != len(wire):
        return f"message: {len(wire) - used} octets after the message"
    seen = _message_json(msg)
    want = {k: case[k] for k in seen}
    if seen != want:
        diff = sorted(k for k in seen if seen[k] != want[k])
        return f"decoded {diff}: got {[seen[k] for k in diff]}, expected {[want[k] for k in diff]}"
    if msg.encode() != wire:
        return "the checked encoder of the decoded message does not give the bytes back"
    return None


def check_cose(case: VectorCase) -> str | None:
    """Valid: the reference verifies the signature with the producer key ``kid`` names and returns the manifest.
    Invalid: it refuses, citing the requirement."""
    keys = {bytes.fromhex(kid): pem for kid, pem in case["keys"].items()}
    try:
        payload = verify(bytes.fromhex(case["cose"]), keys)
    except CoseError as exc:
        if case.result == "valid":
            return f"the reference refuses it: {exc}"
        return None if f"[{case['requirement']}]" in str(exc) else f"refused for another reason: {exc}"
    if case.result == "invalid":
        return f"the reference accepts it, expected refused [{case['requirement']}]"
    if payload.decode("utf-8", "replace") != case["manifest"]:
        return "the verified payload is not the listed manifest"
    return None


CHECKERS: dict[str, Checker] = {
    KIND_NAMESPACE: check_namespace,
    KIND_PAYLOAD: check_payload,
    KIND_TRACK_NAME: check_track_name,
    KIND_KVSP: check_kvsp,
    KIND_OBJECT: check_object,
    KIND_MANIFEST: check_manifest,
    KIND_MOQT_MESSAGE: check_moqt_message,
    KIND_COSE: check_cose,
}


# ---- generators ------------------------------------------------------------------------------------------------

# Small geometries (fast to check) at the boundaries: a second segment, an incomplete tail, several layers.
def _spec_small() -> CacheSpec:
    return example_spec(layers=3, blocks=3, block_tokens=4, kv_heads=2, head_dim=4, segments=(8,), tail_tokens=3,
                        seed=5)


def _spec_one_block() -> CacheSpec:
    return example_spec(layers=2, blocks=1, block_tokens=2, kv_heads=1, head_dim=2, seed=6)


def _spec_fields() -> dict[str, bytes]:
    return {"scope_id": SPEC_NAMESPACE[9:25], "compat_id": SPEC_NAMESPACE[26:58],
            "anchor_key": SPEC_NAMESPACE[59:91], "pub_id": SPEC_NAMESPACE[92:108]}


def _ns_hex(fields: dict[str, bytes]) -> dict[str, str]:
    return {k: fields[k].hex() for k in _NS_FIELDS}


def _encode_fields(*fields: bytes) -> bytes:
    return TrackNamespace(fields).encode()


def _namespace_document() -> dict[str, Any]:
    ex = _spec_fields()
    parts = (b"kvcs-1", ex["scope_id"], ex["compat_id"], ex["anchor_key"], ex["pub_id"])
    req = "KVCS-NS-FIVE-FIELDS"

    def invalid(comment: str, flags: Sequence[str], encoded: bytes, field: str) -> dict[str, Any]:
        return _case(comment, flags, "invalid", encoded=encoded.hex(), field=field, requirement=req)

    texts = [
        _case("KVCS \"Encoding Examples\": Scope ID 6d1c6481..., Compatibility ID 5ed5c2f2...ee0f, Anchor Key "
              "65327588...efc1, Publication ID 0123456789abcdef0123456789abcdef: the 108 octets printed",
              ["SpecExample"], encoded=SPEC_NAMESPACE.hex(), fields=_ns_hex(ex)),
        _case("the example's content fields with an all-ones Publication ID", ["SpecInput"],
              encoded=_encode_fields(*parts[:4], b"\xff" * 16).hex(), fields={**_ns_hex(ex), "pub_id": "ff" * 16}),
        _case("all-zero identifiers (field lengths only)", ["Boundary"],
              encoded=_encode_fields(b"kvcs-1", bytes(16), bytes(32), bytes(32), bytes(16)).hex(),
              fields={"scope_id": "00" * 16, "compat_id": "00" * 32, "anchor_key": "00" * 32, "pub_id": "00" * 16}),
        invalid("the content prefix alone (4 fields): what a consumer subscribes to, not a publication",
                ["FieldCount"], _encode_fields(*parts[:4]), "Track Namespace"),
        invalid("a sixth field after the Publication ID", ["FieldCount"], _encode_fields(*parts, b"x"),
                "Track Namespace"),
        invalid("field 0 \"kvcs-2\"", ["WrongTag"], _encode_fields(b"kvcs-2", *parts[1:]), "field 0"),
        invalid("field 0 upper-case \"kvcs-1\" (names compare bytewise)", ["WrongTag"],
                _encode_fields(b"kvcs-1".upper(), *parts[1:]), "field 0"),
        invalid("Scope ID written as its 32 hex characters", ["HexEncoded"],
                _encode_fields(b"kvcs-1", ex["scope_id"].hex().encode(), *parts[2:]), "field 1 (Scope ID)"),
        invalid("Compatibility ID of 31 octets", ["FieldLength"],
                _encode_fields(b"kvcs-1", ex["scope_id"], ex["compat_id"][:31], *parts[3:]),
                "field 2 (Compatibility ID)"),
        invalid("Anchor Key of 33 octets", ["FieldLength"],
                _encode_fields(*parts[:3], ex["anchor_key"] + b"\x00", ex["pub_id"]), "field 3 (Anchor Key)"),
        invalid("Publication ID of 15 octets", ["FieldLength"], _encode_fields(*parts[:4], ex["pub_id"][:15]),
                "field 4 (Publication ID)"),
    ]
    generated = []
    for comment, spec, pub in (
        ("3 blocks of 4 tokens then a segment of 2 blocks: the Anchor Key is Block Key 2", _spec_small(),
         bytes(range(16))),
        ("one block of 2 tokens: the Anchor Key is Block Key 0", _spec_one_block(), bytes(range(16, 32))),
    ):
        generated.append({"type": "NamespaceFromSpecTest", "spec": spec.to_obj(), "tests": [
            _case(comment, ["ProvisionalKvsp"], encoded=spec.namespace(pub).encode().hex(), pub_id=pub.hex())]})
    notes = {
        "SpecExample": "A value printed in the KVCS text itself; hand-written here, not computed.",
        "SpecInput": "The text's example with one field changed; expected bytes from the reference.",
        "Boundary": "Field values at the ends of their ranges.",
        "FieldCount": "Not exactly five fields (KVCS-NS-FIVE-FIELDS).",
        "WrongTag": "Field 0 is not ASCII \"kvcs-1\" (KVCS-NS-FIVE-FIELDS).",
        "HexEncoded": "An identifier in hex instead of raw octets (KVCS-NS-RAW-OCTETS); caught by its length.",
        "FieldLength": "A field of the wrong length (KVCS-NS-FIVE-FIELDS).",
        "ProvisionalKvsp": "Fields 1-3 computed from a cache spec with kvsp-provisional-1 (issue 5; "
                           "KVCS-NS-CONTENT-FIELDS, KVCS-NS-ANCHOR-KEY): valid only under that provisional profile.",
    }
    return _document(KIND_NAMESPACE, notes, [{"type": "NamespaceTest", "tests": texts}, *generated])


def _header(payload: bytes) -> dict[str, Any]:
    return header_to_json(decode_object(payload)[0])


def _payload_document() -> dict[str, Any]:
    spec_payload = SPEC_PAYLOAD_HEADER + SPEC_PAYLOAD_DATA
    base, data = decode_object(spec_payload)

    def valid(comment: str, flags: Sequence[str], payload: bytes, group: int, obj: int) -> dict[str, Any]:
        return _case(comment, flags, payload=payload.hex(), group=group, object=obj, header=_header(payload))

    def invalid(comment: str, flags: Sequence[str], payload: bytes, requirement: str, group: int = 0,
                obj: int = 1) -> dict[str, Any]:
        return _case(comment, flags, "invalid", payload=payload.hex(), group=group, object=obj,
                     requirement=requirement)

    def raw(**changes: Any) -> bytes:
        return encode_raw(base.with_(**changes), data)

    tests = [
        valid("KVCS \"Encoding Examples\": \"The payload header of a \\\"k\\\" Object at Group 0, Object 1 (Token "
              "Start 4, Token Count 4, codec \\\"raw\\\")\" with \"16 octets of Data with values 0x00 to 0x0f\": the "
              "68 header octets printed, then the Data", ["SpecExample"], spec_payload, 0, 1),
        valid("the example as a \"v\" Object", ["SpecInput"],
              encode_object(component=2, layer=0, block_index=1, token_start=4, token_count=4, codec=1, data=data),
              0, 1),
        valid("a \"kv\" Object: K section then V section", ["SpecInput"],
              encode_object(component=3, layer=0, block_index=1, token_start=4, token_count=4, codec=1,
                            data=data + data[::-1]), 0, 1),
        valid("empty Data: Data Length 0, the SHA-256 of no octets", ["Boundary"],
              encode_object(component=1, layer=7, block_index=0, token_start=0, token_count=4, codec=1, data=b""),
              7, 0),
        valid("largest Layer, Block Index and Token Start", ["Boundary"],
              encode_object(component=2, layer=2**32 - 1, block_index=2**32 - 1, token_start=2**64 - 1,
                            token_count=2**32 - 1, codec=0xFFFF, data=b"\xff"), 2**32 - 1, 2**32 - 1),
        valid("Flags 0xffff: ignored on receipt", ["FlagsIgnored"], raw(flags=0xFFFF), 0, 1),
        valid("Reserved 0x0001: the text gives Reserved no rule and lists no check of it", ["ReservedNonzero"],
              raw(reserved=1), 0, 1),
        invalid("Magic \"KVO2\"", ["BadMagic"], raw(magic=0x4B564F32), "KVCS-PAYLOAD-VERIFY-MAGIC"),
        invalid("Magic in little-endian order", ["BadMagic"], raw(magic=0x314F564B), "KVCS-PAYLOAD-VERIFY-MAGIC"),
        invalid("Version 2", ["BadVersion"], raw(version=2), "KVCS-PAYLOAD-VERIFY-MAGIC"),
        invalid("Version 0", ["BadVersion"], raw(version=0), "KVCS-PAYLOAD-VERIFY-MAGIC"),
        invalid("Layer 0 delivered in Group 1", ["WrongLayer"], spec_payload, "KVCS-PAYLOAD-VERIFY-LAYER", group=1),
        invalid("Layer 1 in Group 0", ["WrongLayer"], raw(layer=1), "KVCS-PAYLOAD-VERIFY-LAYER"),
        invalid("Block Index 1 delivered as Object 0", ["WrongBlock"], spec_payload, "KVCS-PAYLOAD-VERIFY-BLOCK",
                obj=0),
        invalid("Block Index 2 at Object 1", ["WrongBlock"], raw(block_index=2), "KVCS-PAYLOAD-VERIFY-BLOCK"),
        invalid("the header alone (Data Length 16, no Data)", ["Truncated"], SPEC_PAYLOAD_HEADER,
                "KVCS-PAYLOAD-VERIFY-LENGTH"),
        invalid("67 octets: shorter than the header", ["Truncated"], SPEC_PAYLOAD_HEADER[:67],
                "KVCS-PAYLOAD-VERIFY-LENGTH"),
        invalid("no octets at all", ["Truncated"], b"", "KVCS-PAYLOAD-VERIFY-LENGTH"),
        invalid("the last Data octet cut", ["Truncated"], spec_payload[:-1], "KVCS-PAYLOAD-VERIFY-LENGTH"),
        invalid("one octet after the Data", ["Trailing"], spec_payload + b"\x00", "KVCS-PAYLOAD-VERIFY-LENGTH"),
        invalid("Data Length 15 for 16 octets of Data", ["Trailing"], raw(data_length=15),
                "KVCS-PAYLOAD-VERIFY-LENGTH"),
        invalid("one Data bit flipped, digest kept", ["DigestMismatch"],
                spec_payload[:-1] + bytes([spec_payload[-1] ^ 1]), "KVCS-PAYLOAD-VERIFY-DIGEST"),
        invalid("all-zero Data Digest", ["DigestMismatch"], raw(digest=bytes(32)), "KVCS-PAYLOAD-VERIFY-DIGEST"),
        invalid("Data Digest of the Data in reverse order", ["DigestMismatch"],
                raw(digest=hashlib.sha256(data[::-1]).digest()), "KVCS-PAYLOAD-VERIFY-DIGEST"),
    ]
    notes = {
        "SpecExample": "A value printed in the KVCS text itself; hand-written here, not computed.",
        "SpecInput": "The text's example with the component or Data changed; expected bytes from the reference.",
        "Boundary": "Field values at the ends of their ranges.",
        "FlagsIgnored": "Flags are \"set to zero and ignored on receipt\" (KVCS-PAYLOAD-FLAGS-IGNORED): still valid.",
        "ReservedNonzero": "The 16-bit Reserved field after Codec has no rule in the text and is not among the End "
                           "Subscriber checks (KVCS-PAYLOAD-LAYOUT): valid for a receiver.",
        "BadMagic": "Magic is not 0x4B564F31 (KVCS-PAYLOAD-VERIFY-MAGIC).",
        "BadVersion": "Version is not 1 (KVCS-PAYLOAD-VERIFY-MAGIC: \"Magic and Version are as specified\").",
        "WrongLayer": "Layer differs from the Group ID it arrived in (KVCS-PAYLOAD-VERIFY-LAYER).",
        "WrongBlock": "Block Index differs from the Object ID (KVCS-PAYLOAD-VERIFY-BLOCK).",
        "Truncated": "Header and Data Length ask for more octets than the payload has (KVCS-PAYLOAD-VERIFY-LENGTH).",
        "Trailing": "The payload has octets beyond header and Data Length (KVCS-PAYLOAD-VERIFY-LENGTH).",
        "DigestMismatch": "Data Digest is not the SHA-256 of Data (KVCS-PAYLOAD-VERIFY-DIGEST).",
    }
    return _document(KIND_PAYLOAD, notes, [{"type": "PayloadTest", "tests": tests}])


def _track_name_document() -> dict[str, Any]:
    req = "KVCS-TRACK-NAME-ABNF"

    def valid(name: str, comment: str, flags: Sequence[str]) -> dict[str, Any]:
        return _case(comment, flags, name=name, parsed=_track_json(parse_track_name(name.encode())))

    def invalid(name: str, comment: str, flags: Sequence[str]) -> dict[str, Any]:
        return _case(comment, flags, "invalid", name=name, requirement=req)

    tests = [
        valid("manifest", "the JSON manifest track", ["Reserved"]),
        valid("manifest.cose", "the signed manifest track", ["Reserved"]),
        valid("k.raw.s0", "KVCS \"Track Names\": \"k.raw.s0\" carries the uncompressed key tensors of segment 0",
              ["SpecExample"]),
        valid("v.raw.s0", "the value tensors of segment 0", ["SpecExample"]),
        valid("k.raw.s1", "KVCS \"Summary of the Profile\": segment 1 (appended tokens)", ["SpecExample"]),
        valid("kv.zstd-3.s12", "a jointly encoded track with a compressing codec name", ["Codec"]),
        valid("v.0.s7", "a codec name of one digit", ["Codec", "Boundary"]),
        valid("k." + "a" * 32 + ".s0", "a codec name of 32 characters", ["Codec", "Boundary"]),
        valid("k.raw.s18446744073709551616", "a segment number above 2^64 (the ABNF sets no bound)", ["Boundary"]),
        invalid("k." + "a" * 33 + ".s0", "a codec name of 33 characters", ["Codec", "Boundary"]),
        invalid("k.raw.s00", "segment 00: a leading zero", ["LeadingZero"]),
        invalid("k.raw.s01", "segment 01: a leading zero", ["LeadingZero"]),
        invalid("k.raw.s", "no segment number", ["Shape"]),
        invalid("k..s0", "an empty codec name", ["Codec"]),
        invalid("k.RAW.s0", "an upper-case codec name", ["Codec"]),
        invalid("k.raw_1.s0", "an underscore in the codec name", ["Codec"]),
        invalid("K.raw.s0", "an upper-case component", ["Component"]),
        invalid("vk.raw.s0", "component \"vk\"", ["Component"]),
        invalid("kvv.raw.s0", "component \"kvv\"", ["Component"]),
        invalid("q.raw.s0", "an unregistered component", ["Component"]),
        invalid("k.raw.0", "segment without its \"s\"", ["Shape"]),
        invalid("k.raw.s-1", "a negative segment", ["Shape"]),
        invalid("k.raw.s0 ", "a trailing space", ["Shape"]),
        invalid("k.raw.s0.", "a trailing dot", ["Shape"]),
        invalid("k.raw", "no segment part", ["Shape"]),
        invalid("manifest.json", "not one of the two manifest names", ["Reserved"]),
        invalid("Manifest", "\"manifest\" is case-sensitive", ["Reserved"]),
        invalid("manifest.cose.s0", "a manifest name with a segment", ["Reserved"]),
        invalid("", "the empty name", ["Shape"]),
        invalid("k.raw.s\u0663", "an Arabic-Indic digit as segment (DIGIT is ASCII 0-9)", ["Shape"]),
    ]
    notes = {
        "SpecExample": "A Track Name printed in the KVCS text itself.",
        "Reserved": "\"manifest\" and \"manifest.cose\" are reserved Track Names (KVCS-IANA-RESERVED-NAMES).",
        "Codec": "codec-name = 1*32( %x61-7A / DIGIT / \"-\" ) (KVCS-TRACK-NAME-ABNF).",
        "Boundary": "Lengths and values at the ends of what the ABNF allows.",
        "LeadingZero": "segment = \"0\" / ( %x31-39 *DIGIT ): no leading zeros (KVCS-TRACK-NAME-ABNF).",
        "Component": "component = \"k\" / \"v\" / \"kv\" (KVCS-TRACK-NAME-ABNF).",
        "Shape": "Not of the form component \".\" codec-name \".\" \"s\" segment (KVCS-TRACK-NAME-ABNF).",
    }
    return _document(KIND_TRACK_NAME, notes, [{"type": "TrackNameTest", "tests": tests}])


# RFC 8785 section 3.2.2 ("Sample JSON Data") and its canonical form, the JCS example the RFC prints.
_RFC8785_INPUT = ('{\n  "numbers": [333333333.33333329, 1E30, 4.50, 2e-3, 0.000000000000000000000000001],\n'
                  '  "string": "\\u20ac$\\u000F\\u000aA\'\\u0042\\u0022\\u005c\\\\\\"\\/",\n'
                  '  "literals": [null, true, false]\n}')
_RFC8785_OUTPUT = ('{"literals":[null,true,false],"numbers":[333333333.3333333,1e+30,4.5,0.002,1e-27],'
                   '"string":"\u20ac$\\u000f\\nA\'B\\"\\\\\\\\\\"/"}')
# Numbers where ECMAScript's Number::toString changes notation (RFC 8785 section 3.2.2.3; the canonical forms of
# its Appendix B where the value is there): below 1e-6, from 1e21, -0, 2^53; written by hand from the RFC.
_RFC8785_NUMBERS_INPUT = ("[1.5e-06, 2e-06, 1e-6, 1e-7, 9.999999999999997e-7, 1e21, 1E+21, 1e20, 9.999999999999999e20, "
                          "-0, -0.0, 2.9514790517935283e20, 5e-324, 1.7976931348623157e308, 9007199254740992, "
                          "333333333.33333329, -0.0000033333333333333333, 4.50, 1e23, 9.999999999999997e22]")
_RFC8785_NUMBERS_OUTPUT = ("[0.0000015,0.000002,0.000001,1e-7,9.999999999999997e-7,1e+21,1e+21,100000000000000000000,"
                           "999999999999999900000,0,0,295147905179352830000,5e-324,1.7976931348623157e+308,"
                           "9007199254740992,333333333.3333333,-0.0000033333333333333333,4.5,1e+23,"
                           "9.999999999999997e+22]")


def _kvsp_document() -> dict[str, Any]:
    compat = {"model": "kvconform-test", "layers": 32, "kv_heads": 8, "head_dim": 128, "block_tokens": 16,
              "dtype": "f16"}
    compat_id = PROVISIONAL.compatibility_id(compat)

    def jcs(comment: str, flags: Sequence[str], text: str) -> dict[str, Any]:
        canonical = jcs_canonical(json.loads(text)).decode("utf-8")
        return _case(comment, flags, json=text, canonical=canonical,
                     sha256=hashlib.sha256(canonical.encode()).hexdigest())

    jcs_tests = [
        _case("RFC 8785 section 3.2.2 sample data and its canonical form as the RFC prints it", ["Rfc8785"],
              json=_RFC8785_INPUT, canonical=_RFC8785_OUTPUT,
              sha256=hashlib.sha256(_RFC8785_OUTPUT.encode()).hexdigest()),
        jcs("members sorted by UTF-16 code units: \"\\u20ac\" (U+20AC) sorts before \"\\ud83d\\ude00\" (U+1F600, "
            "surrogates D83D..) although its code point is smaller only in UTF-16", ["Utf16Order"],
            '{"\\ud83d\\ude00": 1, "\\u20ac": 2, "a": 3, "B": 4}'),
        jcs("a descriptor written with whitespace, other member order and 16.0 for block_tokens", ["Descriptor"],
            '{ "dtype" : "f16", "block_tokens": 16.0, "head_dim": 128, "kv_heads": 8, "layers": 32,\n'
            '  "model": "kvconform-test" }'),
        jcs("nested objects and arrays sort members at every level, arrays keep their order", ["Descriptor"],
            '{"z": [3, 1, {"b": 1, "a": 2}], "a": {"y": null, "x": [true]}}'),
    ]
    number_tests = [
        _case("numbers around ECMAScript's notation changes (1e-6, 1e21), -0 and 2^53, canonical forms as RFC 8785 "
              "gives them: 1.5e-06 is 0.0000015, not 0.000002", ["Rfc8785", "Rfc8785Numbers"],
              json=_RFC8785_NUMBERS_INPUT, canonical=_RFC8785_NUMBERS_OUTPUT,
              sha256=hashlib.sha256(_RFC8785_NUMBERS_OUTPUT.encode()).hexdigest()),
    ]
    compat_tests = [
        _case("a 32-layer descriptor (B = 16, Hkv = 8, D = 128)", ["ProvisionalKvsp"], compat=compat,
              compat_id=compat_id.hex()),
        _case("the same descriptor, members in another order: same Compatibility ID", ["ProvisionalKvsp"],
              compat=dict(reversed(list(compat.items()))), compat_id=compat_id.hex()),
        _case("an extra member (\"rope_theta\": 10000.5) changes the ID", ["ProvisionalKvsp"],
              compat={**compat, "rope_theta": 10000.5},
              compat_id=PROVISIONAL.compatibility_id({**compat, "rope_theta": 10000.5}).hex()),
        _case("a model name with non-ASCII characters", ["ProvisionalKvsp", "Utf16Order"],
              compat={**compat, "model": "m\u00fcnchen-\u20ac"},
              compat_id=PROVISIONAL.compatibility_id({**compat, "model": "m\u00fcnchen-\u20ac"}).hex()),
        _case("no \"dtype\"", ["ProvisionalKvsp", "MissingMember"], "invalid",
              compat={k: v for k, v in compat.items() if k != "dtype"}, field="dtype",
              requirement="KVCS-KVSP-COMPAT-DESCRIPTOR"),
        _case("no \"model\"", ["ProvisionalKvsp", "MissingMember"], "invalid",
              compat={k: v for k, v in compat.items() if k != "model"}, field="model",
              requirement="KVCS-KVSP-COMPAT-DESCRIPTOR"),
    ]
    scope_tests = [
        _case(f"scope key {key.hex() or '(empty)'}", ["ProvisionalKvsp"], scope_key=key.hex(),
              scope_id=PROVISIONAL.scope_id(key).hex())
        for key in (bytes(range(32)), b"\x01", bytes(100))
    ]
    scope_key = bytes(range(32))

    def keys(comment: str, flags: Sequence[str], tokens: list[int], block_tokens: int) -> dict[str, Any]:
        got = PROVISIONAL.block_keys(scope_key, compat_id, tokens, block_tokens)
        return _case(comment, flags, scope_key=scope_key.hex(), compat_id=compat_id.hex(), tokens=tokens,
                     block_tokens=block_tokens, block_keys=[k.hex() for k in got])

    tokens = [(i * 104729 + 17) % 50257 for i in range(12)]
    key_tests = [
        keys("three complete blocks of 4", ["ProvisionalKvsp"], tokens, 4),
        keys("the same tokens with one more that does not complete a block: the same three keys",
             ["ProvisionalKvsp", "IncompleteBlock"], [*tokens, 7], 4),
        keys("block 0 changed: every later key changes (the chain)", ["ProvisionalKvsp", "Chain"],
             [tokens[0] + 1, *tokens[1:]], 4),
        keys("fewer tokens than a block: no key", ["ProvisionalKvsp", "IncompleteBlock"], tokens[:3], 4),
        keys("tokens 0, 2^32-1, 1 and 0x01020304: le_u32 at both ends and in byte order",
             ["ProvisionalKvsp", "Boundary"], [0, 2**32 - 1, 1, 0x01020304], 2),
        keys("a block of one token", ["ProvisionalKvsp", "Boundary"], tokens[:3], 1),
    ]
    k = hashlib.shake_128(b"k").digest(64)
    v = hashlib.shake_128(b"v").digest(64)
    digest_tests = [
        _case("64 octets of k and v", ["ProvisionalKvsp"], k=k.hex(), v=v.hex(),
              digest=PROVISIONAL.layer_digest(k, v).hex()),
        _case("k and v swapped: another digest", ["ProvisionalKvsp"], k=v.hex(), v=k.hex(),
              digest=PROVISIONAL.layer_digest(v, k).hex()),
    ]
    notes = {
        "Rfc8785": "RFC 8785's own example, hand-written here from the RFC (numbers, escapes, member order).",
        "Utf16Order": "JCS sorts member names by UTF-16 code units and writes non-ASCII characters unescaped.",
        "Descriptor": "Canonicalisation of descriptor-shaped JSON (whitespace, order, 16.0 -> 16).",
        "Rfc8785Numbers": "Number serialisation at the edges of ECMAScript's notations (RFC 8785 section 3.2.2.3, "
                          "Appendix B), where a hand-written JCS went wrong before (1.5e-06 written as 0.000002, "
                          "two descriptors with one Compatibility ID).",
        "ProvisionalKvsp": "kvsp-provisional-1 as issue 5 defines it (KVCS-KVSP-COMPAT-ID, KVCS-KVSP-SCOPE-ID, "
                           "KVCS-KVSP-BLOCK-KEY, KVCS-KVSP-LAYER-DIGEST): valid only under that provisional "
                           "profile, which stands in for the KVSP text.",
        "MissingMember": "A descriptor without a member the profile requires (KVCS-KVSP-COMPAT-DESCRIPTOR).",
        "IncompleteBlock": "Only complete blocks have keys (KVCS-KVSP-COMPLETE-BLOCKS).",
        "Chain": "Key i covers Key i-1: a change in a block changes every later key (KVCS-KVSP-BLOCK-KEY).",
        "Boundary": "Values at the ends of their ranges.",
    }
    groups = [{"type": "JcsTest", "tests": jcs_tests}, {"type": "CompatIdTest", "tests": compat_tests},
              {"type": "ScopeIdTest", "tests": scope_tests}, {"type": "BlockKeysTest", "tests": key_tests},
              {"type": "LayerDigestTest", "tests": digest_tests},
              {"type": "JcsTest", "tests": number_tests}]  # last: the earlier cases keep their tcIds
    return _document(KIND_KVSP, notes, groups, source="issue-5 (provisional KVSP profile); RFC 8785")


def _object_document() -> dict[str, Any]:
    spec = _spec_small()
    tests = []
    for track, layer, obj, comment in (
        ("k.raw.s0", 0, 0, "layer 0, block 0"),
        ("v.raw.s0", 0, 0, "the value tensor of the same block"),
        ("kv.raw.s0", 0, 0, "jointly: the k section then the v section; its digest is the layer digest"),
        ("k.raw.s0", 2, 2, "the last layer and block of segment 0 (the Anchor Key's block)"),
        ("v.raw.s0", 1, 1, "a middle layer and block"),
        ("kv.raw.s0", 2, 1, "kv of layer 2, block 1"),
        ("k.raw.s1", 0, 0, "segment 1, Object 0 = absolute block 3: Token Start 12"),
        ("v.raw.s1", 2, 1, "segment 1's last block (absolute block 4); the 3 tail tokens have no Object"),
        ("kv.raw.s1", 1, 1, "kv of segment 1"),
    ):
        payload = spec.object_payload(parse_track_name(track.encode()), layer, obj)  # type: ignore[arg-type]
        tests.append(_case(comment, ["ProvisionalKvsp", "TestContent"], track=track, layer=layer, object=obj,
                           payload=payload.hex()))
    notes = {
        "ProvisionalKvsp": "Codec values and the layer digest of kvsp-provisional-1 (issue 5).",
        "TestContent": "Data from the test-content convention of issue 5 (SHAKE-128 of content_seed, layer, "
                       "component, absolute block; KVCS-KVSP-TEST-CONTENT): what a publisher under test sends.",
    }
    return _document(KIND_OBJECT, notes, [{"type": "ObjectTest", "spec": spec.to_obj(), "tests": tests}],
                     source=f"{SOURCE}; issue-5 (test-content convention)")


def _manifest_text(manifest: Manifest) -> str:
    return manifest.to_json().decode("utf-8")


def _replace_segment(manifest: Manifest, index: int, **changes: Any) -> Manifest:
    segments = list(manifest.segments)
    old = segments[index]
    segments[index] = SegmentEntry(**{**{f: getattr(old, f) for f in ("segment", "first_block", "blocks",
                                                                      "block_keys_sha256", "tracks", "complete",
                                                                      "object_digests")}, **changes})
    return Manifest(manifest.compat, manifest.layers, manifest.block_tokens, manifest.deterministic,
                    tuple(segments), manifest.kvcs, manifest.extra)


def _manifest_document() -> dict[str, Any]:
    spec = _spec_small()
    ns = spec.namespace(bytes(range(16)))
    names = [t.name for t in spec.data_tracks(0)] + [t.name for t in spec.data_tracks(1)]
    done = spec.manifest({n: spec.layers for n in names})
    compat_id = spec.compat_id.hex()

    def valid(comment: str, flags: Sequence[str], manifest: Manifest) -> dict[str, Any]:
        return _case(comment, flags, manifest=_manifest_text(manifest), compat_id=compat_id)

    def invalid(comment: str, flags: Sequence[str], text: str | Manifest, requirement: str,
                field: str | None = None) -> dict[str, Any]:
        body = _manifest_text(text) if isinstance(text, Manifest) else text
        extra = {} if field is None else {"field": field}
        return _case(comment, flags, "invalid", manifest=body, requirement=requirement, **extra)

    obj = json.loads(_manifest_text(done))
    tests = [
        valid("segment 0 added, no layer completed yet", ["Progress"], spec.manifest({}, segments_added=1)),
        valid("2 of 3 layers of segment 0 completed", ["Progress"],
              spec.manifest({n: 2 for n in names[:2]}, segments_added=1)),
        valid("segment 0 complete, segment 1 added with 1 layer", ["Progress", "Segments"],
              spec.manifest({**{n: spec.layers for n in names[:2]}, **{n: 1 for n in names[2:]}})),
        valid("both segments complete", ["Segments"], done),
        valid("without object_digests (a SHOULD)", ["NoDigests"],
              spec.manifest({n: spec.layers for n in names}, with_digests=False)),
        valid("deterministic: true", ["Deterministic"], spec.manifest({n: spec.layers for n in names},
                                                                       deterministic=True)),
        invalid("compat of another model: its Compatibility ID is not the namespace's", ["CompatMismatch"],
                Manifest({**spec.compat, "model": "other"}, done.layers, done.block_tokens, False, done.segments),
                "KVCS-MANIFEST-COMPAT-CONSISTENT"),
        invalid("compat without dtype: no Compatibility ID can be computed", ["CompatMismatch"],
                Manifest({k: v for k, v in spec.compat.items() if k != "dtype"}, done.layers, done.block_tokens,
                         False, done.segments), "KVCS-MANIFEST-COMPAT-CONSISTENT"),
        invalid("block_keys_sha256 of segment 1 over the wrong keys", ["BlockKeys"],
                _replace_segment(done, 1, block_keys_sha256=hashlib.sha256(b"").digest()),
                "KVCS-MANIFEST-BLOCK-KEYS-SHA256"),
        invalid("object_digests of k.raw.s0 lists 2 Groups of a complete 3-layer segment", ["ObjectDigests"],
                _replace_segment(done, 0, object_digests={**(done.segments[0].object_digests or {}),
                                                          "k.raw.s0": (done.segments[0].object_digests
                                                                       or {})["k.raw.s0"][:2]}),
                "KVCS-MANIFEST-OBJECT-DIGESTS"),
        invalid("object_digests with one digest too few in a Group", ["ObjectDigests"],
                _replace_segment(done, 0, object_digests={**(done.segments[0].object_digests or {}),
                                                          "v.raw.s0": [g[:-1] for g in (done.segments[0].object_digests
                                                                                        or {})["v.raw.s0"]]}),
                "KVCS-MANIFEST-OBJECT-DIGESTS"),
        invalid("segment 0 listing segment 1's track", ["Segments"],
                _replace_segment(done, 0, tracks=("k.raw.s0", "v.raw.s1")), "KVCS-MANIFEST-SEGMENTS"),
        invalid("\"layers\": 4 beside a 3-layer descriptor", ["Shape"], json.dumps({**obj, "layers": 4}),
                "KVCS-MANIFEST-JSON", "layers"),
        invalid("\"kvcs\": 2", ["Shape"], json.dumps({**obj, "kvcs": 2}), "KVCS-MANIFEST-JSON", "kvcs"),
        invalid("no \"segments\"", ["Shape"], json.dumps({k: v for k, v in obj.items() if k != "segments"}),
                "KVCS-MANIFEST-JSON", "segments"),
        invalid("\"deterministic\": \"no\"", ["Shape"], json.dumps({**obj, "deterministic": "no"}),
                "KVCS-MANIFEST-JSON", "deterministic"),
        invalid("block_keys_sha256 of 31 octets", ["Shape"],
                json.dumps({**obj, "segments": [{**obj["segments"][0], "block_keys_sha256": "00" * 31},
                                                obj["segments"][1]]}), "KVCS-MANIFEST-JSON", "block_keys_sha256"),
        invalid("not JSON", ["Shape"], _manifest_text(done)[:-1], "KVCS-MANIFEST-JSON", "manifest"),
    ]
    notes = {
        "Progress": "Versions during production: completed Groups listed in object_digests "
                    "(KVCS-MANIFEST-OBJECT-DIGESTS), a segment complete only when every track has every layer.",
        "Segments": "Contiguous segments naming their own data tracks (KVCS-MANIFEST-SEGMENTS).",
        "NoDigests": "object_digests is a SHOULD: a manifest without it is still valid.",
        "Deterministic": "\"deterministic\" is a JSON boolean (KVCS-MANIFEST-DETERMINISTIC).",
        "CompatMismatch": "\"compat\" does not hash to the namespace's Compatibility ID "
                          "(KVCS-MANIFEST-COMPAT-CONSISTENT, KVCS-MANIFEST-COMPAT-CHECK).",
        "BlockKeys": "block_keys_sha256 is not the SHA-256 of the segment's Block Keys "
                     "(KVCS-MANIFEST-BLOCK-KEYS-SHA256).",
        "ObjectDigests": "object_digests without one array per completed Group or one digest per block.",
        "Shape": "A member missing or of the wrong JSON type (KVCS-MANIFEST-JSON).",
    }
    group = {"type": "ManifestTest", "spec": spec.to_obj(), "namespace": _ns_hex(
        {k: getattr(ns, k) for k in _NS_FIELDS}), "tests": tests}
    return _document(KIND_MANIFEST, notes, [group], source=f"{SOURCE}; issue-5 (provisional KVSP profile)")


def _message_case(comment: str, flags: Sequence[str], msg: ControlMessage, wire: bytes | None = None) -> dict[str, Any]:
    wire = msg.encode() if wire is None else wire
    return _case(comment, flags, message=wire.hex(), **_message_json(msg))


def _moqt_message_document() -> dict[str, Any]:
    ns = TrackNamespace((b"kvcs-1", *_spec_fields().values()))
    fill_00 = FillParameters.of((ParamType.LOCATION_FILTER, LocationFilter.absolute_start(0, 0)))
    live = Parameters.of((ParamType.LOCATION_FILTER, LocationFilter.next_object()),
                         (ParamType.FILL_PARAMETERS, fill_00))
    manifest = Parameters.of((ParamType.LOCATION_FILTER, LocationFilter.next_object()),
                             (ParamType.FILL_PARAMETERS, FillParameters.of(
                                 (ParamType.LOCATION_FILTER, LocationFilter.relative_start(1)))))
    completed = Parameters.of((ParamType.LOCATION_FILTER, LocationFilter.absolute_start_group_end(2, 0, 3)),
                              (ParamType.GROUP_ORDER, 1), (ParamType.OBJECTID_FILTER, RangeFilter.first_objects(3)))
    for name, params in (("token", live.with_param(ParamType.AUTHORIZATION_TOKEN, AuthToken.use_value(b"tok"))),
                         ("manifest", manifest), ("completed", completed)):
        printed = bytes.fromhex(_SPEC_PARAM_BLOCKS[name])
        if params.encode() != printed:  # the generator must agree with the profile's printed blocks
            raise AssertionError(f"§11.3 {name} block: the reference encodes {params.encode().hex()}, "
                                 f"the profile prints {printed.hex()}")
    tests = [
        _message_case("moqt-d22-profile §11.3: the live data-track SUBSCRIBE, Request ID 0, the KVCS example "
                      "namespace, \"k.raw.s0\", Next Object + FILL_PARAMETERS {Absolute Start {0,0}} (131 bytes "
                      "printed)", ["ProfileExample"], Subscribe(0, ns, b"k.raw.s0", live), SPEC_LIVE_SUBSCRIBE),
        _message_case("§11.3: the same SUBSCRIBE with a scope token (USE_VALUE \"tok\"): the printed parameter "
                      "block", ["ProfileBlock", "Token"],
                      Subscribe(0, ns, b"k.raw.s0", live.with_param(ParamType.AUTHORIZATION_TOKEN,
                                                                    AuthToken.use_value(b"tok")))),
        _message_case("§11.3: the manifest SUBSCRIBE, Next Object + fill {Relative Start 1}: the printed block",
                      ["ProfileBlock"], Subscribe(2, ns, b"manifest.cose", manifest)),
        _message_case("§11.3: FETCH of layers 2..5, first 3 blocks (a=2, b=5, n=3): the printed block",
                      ["ProfileBlock"], Fetch(4, ns, b"v.raw.s0", completed)),
        _message_case("§11.3 discovery: SUBSCRIBE_NAMESPACE of the 4-field content prefix, Request ID 4, no "
                      "parameters (printed as 50 00 5d 04 04 06 6b 76 ... ef c1 00)", ["ProfileExample"],
                      SubscribeNamespace(4, TrackNamespace(ns.fields[:4]))),
    ]
    wire = bytes.fromhex(tests[-1]["message"])
    if wire[:7] != bytes.fromhex("50005d0404066b") or wire[-3:] != bytes.fromhex("efc100"):
        raise AssertionError(f"§11.3 SUBSCRIBE_NAMESPACE: the reference encodes {wire.hex()}")
    notes = {
        "ProfileExample": "Bytes printed in spec/moqt-d22-profile.md §11.3 (in full or as head ... tail).",
        "ProfileBlock": "The parameter block printed in §11.3; the message around it from the reference encoder.",
        "Token": "With an AUTHORIZATION_TOKEN: LOCATION_FILTER's delta becomes 0x1E.",
    }
    return _document(KIND_MOQT_MESSAGE, notes, [{"type": "MoqtMessageTest", "tests": tests}],
                     source="spec/moqt-d22-profile.md §11.3; " + SOURCE)


def _producer(alg: str, kid: bytes) -> ProducerKey:
    """A fixed producer key (derived from its kid), so the vectors regenerate byte for byte."""
    seed = hashlib.sha256(b"kvconform vectors producer key " + kid).digest()
    if alg == "EdDSA":
        return ProducerKey(alg, kid, ed25519.Ed25519PrivateKey.from_private_bytes(seed))
    return ProducerKey(alg, kid, ec.derive_private_key(int.from_bytes(seed, "big") % (2**255), ec.SECP256R1()))


def _cose_sign1(payload: bytes, key: ProducerKey, *, alg: int | None = None, kid_unprotected: bool = False,
                der: bool = False) -> bytes:
    """COSE_Sign1 (RFC 9052 section 4.2), written here independently of the reference's ``sign``; ES256 with
    RFC 6979 deterministic ECDSA so the bytes are reproducible."""
    alg = {"ES256": -7, "EdDSA": -8}[key.alg] if alg is None else alg
    protected = cbor2.dumps({1: alg} if kid_unprotected else {1: alg, 4: key.kid})
    tbs = cbor2.dumps(["Signature1", protected, b"", payload])
    if isinstance(key.key, ec.EllipticCurvePrivateKey):
        signature = key.key.sign(tbs, ec.ECDSA(hashes.SHA256(), deterministic_signing=True))
        if not der:  # COSE carries r || s, 32 octets each
            r, s = decode_dss_signature(signature)
            signature = r.to_bytes(32, "big") + s.to_bytes(32, "big")
    else:
        signature = key.key.sign(tbs)
    unprotected = {4: key.kid} if kid_unprotected else {}
    return bytes(cbor2.dumps(cbor2.CBORTag(18, [protected, unprotected, payload, signature])))


def _cose_document() -> dict[str, Any]:
    spec = _spec_small()
    names = [t.name for t in spec.data_tracks(0)] + [t.name for t in spec.data_tracks(1)]
    manifest = spec.manifest({n: spec.layers for n in names}).to_json()
    ed, p256, other = _producer("EdDSA", b"producer-ed"), _producer("ES256", b"producer-p256"), \
        _producer("EdDSA", b"producer-other")
    keys = {k.kid.hex(): k.public_pem() for k in (ed, p256)}
    req = "KVCS-MANIFEST-COSE-SIGN"

    def valid(comment: str, flags: Sequence[str], cose: bytes) -> dict[str, Any]:
        return _case(comment, flags, cose=cose.hex(), manifest=manifest.decode())

    def invalid(comment: str, flags: Sequence[str], cose: bytes) -> dict[str, Any]:
        return _case(comment, flags, "invalid", cose=cose.hex(), requirement=req)

    good_ed = _cose_sign1(manifest, ed)
    obj = cbor2.loads(good_ed).value
    tests = [
        valid("EdDSA (Ed25519, alg -8), kid in the protected header", ["EdDSA"], good_ed),
        valid("ES256 (P-256, alg -7), signature r || s", ["ES256"], _cose_sign1(manifest, p256)),
        valid("kid in the unprotected header", ["EdDSA", "KidUnprotected"], _cose_sign1(manifest, ed,
                                                                                      kid_unprotected=True)),
        invalid("one bit of the EdDSA signature flipped", ["BadSignature"],
                cbor2.dumps(cbor2.CBORTag(18, [*obj[:3], bytes([obj[3][0] ^ 1]) + obj[3][1:]]))),
        invalid("the manifest changed after signing (\"deterministic\" set to true)", ["BadSignature"],
                cbor2.dumps(cbor2.CBORTag(18, [*obj[:2], manifest.replace(b'"deterministic":false',
                                                                          b'"deterministic":true'), obj[3]]))),
        invalid("signed by a key the scope does not list, under a known kid", ["WrongKey"],
                _cose_sign1(manifest, ProducerKey("EdDSA", ed.kid, other.key))),
        invalid("a kid no producer key has", ["UnknownKid"], _cose_sign1(manifest, other)),
        invalid("alg -35 (ES384): neither ES256 nor EdDSA", ["WrongAlg"], _cose_sign1(manifest, p256, alg=-35)),
        invalid("ES256 signature in DER instead of r || s", ["ES256", "BadSignature"],
                _cose_sign1(manifest, p256, der=True)),
        invalid("CBOR tag 98 (COSE_Sign) instead of 18", ["Structure"], cbor2.dumps(cbor2.CBORTag(98, obj))),
        invalid("three elements, no signature", ["Structure"], cbor2.dumps(cbor2.CBORTag(18, obj[:3]))),
        invalid("not CBOR: the manifest JSON itself", ["Structure"], manifest),
    ]
    notes = {
        "EdDSA": "Ed25519, COSE alg -8 (KVCS-MANIFEST-COSE-SIGN).",
        "ES256": "ECDSA P-256 with SHA-256, COSE alg -7, the signature as r || s (RFC 9053 section 2.1).",
        "KidUnprotected": "RFC 9052 lets kid sit in either header bucket.",
        "BadSignature": "The signature does not verify over the protected header and payload (KVCS-SEC-COSE-VERIFY).",
        "WrongKey": "A producer that is not the one the kid names (KVCS-SEC-COSE-VERIFY).",
        "UnknownKid": "The kid names no producer key of the scope.",
        "WrongAlg": "KVCS allows ES256 and EdDSA only (KVCS-MANIFEST-COSE-SIGN).",
        "Structure": "Not a COSE_Sign1 (RFC 9052 section 4.2: tag 18, [protected, unprotected, payload, signature]).",
    }
    group = {"type": "CoseTest", "keys": keys, "tests": tests}
    return _document(KIND_COSE, notes, [group], source=f"{SOURCE}; RFC 9052")


_GENERATORS: dict[str, Callable[[], dict[str, Any]]] = {
    KIND_NAMESPACE: _namespace_document,
    KIND_PAYLOAD: _payload_document,
    KIND_TRACK_NAME: _track_name_document,
    KIND_KVSP: _kvsp_document,
    KIND_OBJECT: _object_document,
    KIND_MANIFEST: _manifest_document,
    KIND_MOQT_MESSAGE: _moqt_message_document,
    KIND_COSE: _cose_document,
}


def generate() -> dict[str, dict[str, Any]]:
    """Every KVCS vector file, keyed by its path relative to the vectors folder."""
    return {FILES[kind]: make() for kind, make in _GENERATORS.items()}

