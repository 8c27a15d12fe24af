"""KVCS parsers a publisher or relay reaches: the KVO1 object payload, manifests (JSON and COSE_Sign1),
track names and the five-field namespace (KVCS "Object Payload", "Manifest", "Track Names", "Track
Namespace")."""

from __future__ import annotations

import functools
from collections.abc import Iterator
from typing import Any

from kvconform.fuzz.target import FuzzTarget, IntField, OracleError
from kvconform.kvcs import cose
from kvconform.kvcs.consumer import _cose_payload_unverified
from kvconform.kvcs.content import CacheSpec
from kvconform.kvcs.errors import KvcsError
from kvconform.kvcs.layers import dissect, to_header
from kvconform.kvcs.manifest import manifest_problems, parse_manifest
from kvconform.kvcs.namespace import KvcsNamespace
from kvconform.kvcs.payload import decode_object, verify_object
from kvconform.kvcs.tracks import DataTrack, parse_track_name
from kvconform.moqt.errors import MoqtDecodeError
from kvconform.moqt.structures import TrackNamespace
from kvconform.moqt.vi64 import Reader
from kvconform.testvectors import load_vectors

__all__ = ["TARGETS"]

_NS_FIELDS = ("scope_id", "compat_id", "anchor_key", "pub_id")
# The 68-octet KVO1 header: Magic, Version, Component, Flags, Layer, Block Index, Token Start, Token Count,
# Codec, Reserved, Data Length.
_KVO1_FIELDS = (IntField(0, 4), IntField(4, 1), IntField(5, 1), IntField(6, 2), IntField(8, 4), IntField(12, 4),
                IntField(16, 8), IntField(24, 4), IntField(28, 2), IntField(30, 2), IntField(32, 4))
_JSON_TOKENS = (b"{", b"}", b"[", b"]", b'"', b":", b",", b"true", b"false", b"null", b"NaN", b"Infinity",
                b"-Infinity", b"1e400", b"-0", b"\\u0000", b"\\ud800", b'"segments":', b'"compat":', b'"layers":',
                b'"kvcs":1', b'"tracks":["k.raw.s0"]', b'"object_digests":{', b"9" * 40)


def payload(data: bytes) -> object:
    """decode_object and verify_object; the scapy layer dissects anything and agrees with the codec."""
    pkt = dissect(data)  # documented never to raise
    header, body = decode_object(data)
    if not pkt.is_short() and to_header(pkt) != (header, body):
        raise OracleError(f"the KVO1 layer reads {to_header(pkt)!r}, decode_object {header!r}")
    return verify_object(data, header.layer, header.block_index)


def payload_seeds() -> Iterator[bytes]:
    for kind in ("kvcs-payload", "kvcs-object"):
        for case in load_vectors(kind):
            yield bytes.fromhex(case["payload"])


@functools.cache
def _manifest_context() -> tuple[CacheSpec, KvcsNamespace]:
    case = load_vectors("kvcs-manifest")[0]
    return CacheSpec.load(case["spec"]), KvcsNamespace(*(bytes.fromhex(case["namespace"][k]) for k in _NS_FIELDS))


def manifest(data: bytes) -> object:
    """parse_manifest, then manifest_problems against the vectors' namespace, profile and Block Keys."""
    spec, namespace = _manifest_context()
    return manifest_problems(parse_manifest(data), namespace, spec.profile, block_keys=spec.block_keys)


def manifest_seeds() -> Iterator[bytes]:
    for case in load_vectors("kvcs-manifest"):
        yield case["manifest"].encode("utf-8")


@functools.cache
def _producer_keys() -> dict[bytes, Any]:
    group = load_vectors("kvcs-cose")[0].group
    return {bytes.fromhex(kid): cose.load_public_key(pem) for kid, pem in group["keys"].items()}


def cose_verify(data: bytes) -> bytes:
    """cose.verify with the vectors' producer keys (what a consumer with known keys runs)."""
    return cose.verify(data, _producer_keys())


def cose_seeds() -> Iterator[bytes]:
    for case in load_vectors("kvcs-cose"):
        yield bytes.fromhex(case["cose"])


def track_name(data: bytes) -> object:
    """parse_track_name; a data track's name parses back to the same track."""
    parsed = parse_track_name(data)
    if isinstance(parsed, DataTrack) and parse_track_name(parsed.name) != parsed:
        raise OracleError(f"{data!r} parses as {parsed!r}, whose name {parsed.name!r} parses differently")
    return parsed


def track_name_seeds() -> Iterator[bytes]:
    for case in load_vectors("kvcs-track-name"):
        yield case["name"].encode("utf-8") if isinstance(case["name"], str) else bytes(case["name"])


def namespace(data: bytes) -> KvcsNamespace:
    """A MOQT Track Namespace read as a KVCS one; the parsed namespace re-encodes and parses to itself."""
    ns = KvcsNamespace.parse(TrackNamespace.decode(Reader(data)))
    if KvcsNamespace.parse(TrackNamespace.decode(Reader(ns.encode()))) != ns:
        raise OracleError(f"namespace {data.hex()} parses as {ns}, which re-encodes as {ns.encode().hex()}")
    return ns


def namespace_seeds() -> Iterator[bytes]:
    for case in load_vectors("kvcs-namespace"):
        if "encoded" in case.fields:
            yield bytes.fromhex(case["encoded"])


TARGETS = [
    FuzzTarget(name="kvcs-payload", protocol="kvcs",
               description="KVO1 decode_object / verify_object, and the scapy layer's dissection beside them",
               parse=payload, accepts=(KvcsError,), seeds=payload_seeds, dictionary=(b"KVO1",),
               int_fields=_KVO1_FIELDS),
    FuzzTarget(name="kvcs-manifest", protocol="kvcs",
               description="parse_manifest, then manifest_problems (namespace, provisional KVSP profile, Block Keys)",
               parse=manifest, accepts=(KvcsError,), seeds=manifest_seeds, dictionary=_JSON_TOKENS, max_len=16384),
    FuzzTarget(name="kvcs-cose", protocol="kvcs", description="cose.verify (COSE_Sign1, ES256 / EdDSA producer keys)",
               parse=cose_verify, accepts=(cose.CoseError,), seeds=cose_seeds,
               dictionary=(b"\xd2", b"\x84", b"\xa1", b"\xa2", b"\x01\x26", b"\x01\x27", b"\x04", b"\x40", b"\x58",
                           b"\x59", b"\xf9\x7e\x00", b"\x9f", b"\xff", b"\xbf", b"\xc0", b"\xd8\x12")),
    FuzzTarget(name="kvcs-cose-unverified", protocol="kvcs",
               description="the consumer's COSE_Sign1 payload extraction when no producer key is known",
               parse=_cose_payload_unverified, accepts=(cose.CoseError,), seeds=cose_seeds,
               dictionary=(b"\xd2", b"\x84", b"\x40", b"\x58", b"\x9f", b"\xff", b"\xc0")),
    FuzzTarget(name="kvcs-track-name", protocol="kvcs", description="parse_track_name; data tracks re-parsed",
               parse=track_name, accepts=(KvcsError,), seeds=track_name_seeds,
               dictionary=(b"manifest", b".cose", b"kv.", b"k.", b"v.", b".s", b".s0", b"raw", b"9" * 32),
               max_len=8192),  # manifests list track names of any length
    FuzzTarget(name="kvcs-namespace", protocol="kvcs",
               description="TrackNamespace.decode then KvcsNamespace.parse; re-encoded",
               parse=namespace, accepts=(MoqtDecodeError, KvcsError), seeds=namespace_seeds,
               dictionary=(b"\x05", b"\x06kvcs-1", b"\x10", b"\x20"), varints=True),
]

