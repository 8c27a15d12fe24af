"""The KVCS manifest: the JSON object that describes a publication (Object 0 of each manifest Group).

``parse_manifest`` checks the shape and names the field that is off; ``manifest_problems`` checks what a
consumer must check against the namespace (Compatibility ID) and what a correct publisher keeps consistent.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from kvconform.kvcs.errors import KvcsError
from kvconform.kvcs.namespace import KvcsNamespace
from kvconform.kvcs.strictjson import describe, load_json
from kvconform.kvcs.tracks import DataTrack, parse_track_name
from kvconform.kvsp import KvspError, KvspProfile

__all__ = ["MAX_MANIFEST_OCTETS", "REQ_MANIFEST", "REQ_MANIFEST_COMPAT", "Manifest", "SegmentEntry",
           "block_keys_sha256", "manifest_problems", "parse_manifest"]

REQ_MANIFEST = "KVCS-MANIFEST-JSON"
REQ_MANIFEST_COMPAT = "KVCS-MANIFEST-COMPAT-CONSISTENT"
REQ_OBJECT_DIGESTS = "KVCS-MANIFEST-OBJECT-DIGESTS"
REQ_SEGMENTS = "KVCS-MANIFEST-SEGMENTS"
REQ_BLOCK_KEYS = "KVCS-MANIFEST-BLOCK-KEYS-SHA256"
# A bound before parsing: about a million object digests (67 octets each), far beyond the caches suites build.
MAX_MANIFEST_OCTETS = 64 * 2**20
_HEX = re.compile("[0-9a-fA-F]*")


def block_keys_sha256(keys: Sequence[bytes]) -> bytes:
    """SHA-256 of the concatenated raw Block Keys of a segment."""
    return hashlib.sha256(b"".join(keys)).digest()


@dataclass(frozen=True)
class SegmentEntry:
    """One element of "segments"."""

    segment: int
    first_block: int
    blocks: int
    block_keys_sha256: bytes
    tracks: tuple[str, ...]
    complete: bool
    # data track name -> per completed Group, the Data Digests of its Objects in Object order
    object_digests: dict[str, list[list[bytes]]] | None = None

    def to_obj(self) -> dict[str, Any]:
        out: dict[str, Any] = {"segment": self.segment, "first_block": self.first_block, "blocks": self.blocks,
                               "block_keys_sha256": self.block_keys_sha256.hex(), "tracks": list(self.tracks),
                               "complete": self.complete}
        if self.object_digests is not None:
            out["object_digests"] = {t: [[d.hex() for d in group] for group in groups]
                                     for t, groups in self.object_digests.items()}
        return out

    def digest_of(self, track: str, group: int, object_id: int) -> bytes | None:
        """The listed Data Digest of one object, or None when the manifest does not list it."""
        groups = (self.object_digests or {}).get(track)
        if groups is None or group >= len(groups) or object_id >= len(groups[group]):
            return None
        return groups[group][object_id]


@dataclass(frozen=True)
class Manifest:
    """One manifest version."""

    compat: dict[str, Any]
    layers: int
    block_tokens: int
    deterministic: bool
    segments: tuple[SegmentEntry, ...]
    kvcs: int = 1
    extra: dict[str, Any] = field(default_factory=dict)  # members this version of the text does not define

    def to_obj(self) -> dict[str, Any]:
        return {**self.extra, "kvcs": self.kvcs, "compat": self.compat, "layers": self.layers,
                "block_tokens": self.block_tokens, "deterministic": self.deterministic,
                "segments": [s.to_obj() for s in self.segments]}

    def to_json(self) -> bytes:
        return json.dumps(self.to_obj(), separators=(",", ":"), sort_keys=False).encode("utf-8")

    def segment(self, number: int) -> SegmentEntry | None:
        return next((s for s in self.segments if s.segment == number), None)


def _get(obj: Mapping[str, Any], name: str, where: str) -> Any:
    if name not in obj:
        raise KvcsError(f"manifest {where}{name}", "missing", requirement=REQ_MANIFEST)
    return obj[name]


def _wrong(field: str, value: Any, expected: str) -> KvcsError:
    return KvcsError(field, f"{describe(value)}, expected {expected}", requirement=REQ_MANIFEST)


def _integer(obj: Mapping[str, Any], name: str, where: str, minimum: int) -> int:
    """A JSON integer >= ``minimum`` (bool is an int in Python, and 3.0 is not an integer here)."""
    value = _get(obj, name, where)
    if type(value) is not int or value < minimum:
        raise _wrong(f"manifest {where}{name}", value, "a positive integer" if minimum else "an integer >= 0")
    return value


def _typed(obj: Mapping[str, Any], name: str, kind: type, where: str, expected: str) -> Any:
    value = _get(obj, name, where)
    if not isinstance(value, kind):
        raise _wrong(f"manifest {where}{name}", value, expected)
    return value


def _hex(value: Any, length: int, where: str) -> bytes:
    """Exactly ``2 * length`` hex digits (bytes.fromhex would also take spaces)."""
    if not (isinstance(value, str) and len(value) == 2 * length and _HEX.fullmatch(value)):
        raise _wrong(f"manifest {where}", value, f"{length} octets as {2 * length} hex digits")
    return bytes.fromhex(value)


def _segment(obj: Any, i: int) -> SegmentEntry:
    where = f"segments[{i}]."
    if not isinstance(obj, dict):
        raise _wrong(f"manifest segments[{i}]", obj, "a segment entry (an object)")
    tracks = _typed(obj, "tracks", list, where, "an array of Track Names")
    for j, t in enumerate(tracks):
        if not isinstance(t, str):
            raise _wrong(f"manifest {where}tracks[{j}]", t, "a Track Name (a string)")
    digests: dict[str, list[list[bytes]]] | None = None
    if "object_digests" in obj:
        raw = _typed(obj, "object_digests", dict, where, "an object: data track -> per Group, its digests")
        digests = {}
        for track, groups in raw.items():
            at = f"{where}object_digests.{track}"
            if not isinstance(groups, list) or not all(isinstance(g, list) for g in groups):
                raise _wrong(f"manifest {at}", groups, "an array (per Group) of arrays")
            digests[track] = [[_hex(d, 32, f"{at}[{g}][{o}]") for o, d in enumerate(group)]
                              for g, group in enumerate(groups)]
    return SegmentEntry(_integer(obj, "segment", where, 0), _integer(obj, "first_block", where, 0),
                        _integer(obj, "blocks", where, 0),  # an appended segment shorter than a block has none
                        _hex(_get(obj, "block_keys_sha256", where), 32, where + "block_keys_sha256"),
                        tuple(tracks), _typed(obj, "complete", bool, where, "true or false"), digests)


def parse_manifest(data: bytes, *, max_octets: int = MAX_MANIFEST_OCTETS) -> Manifest:
    """A manifest from its JSON bytes (a target's: any octets); KvcsError naming the field that is missing, of
    the wrong type or out of range, or that is not I-JSON (``strictjson``)."""
    obj = load_json(data, what="manifest", requirement=REQ_MANIFEST, max_octets=max_octets)
    if not isinstance(obj, dict):
        raise _wrong("manifest", obj, "a JSON object")
    kvcs = _get(obj, "kvcs", "")
    if type(kvcs) is not int or kvcs != 1:
        raise _wrong("manifest kvcs", kvcs, "1")
    compat = _typed(obj, "compat", dict, "", "the Compatibility Descriptor (an object)")
    layers = _integer(obj, "layers", "", 1)
    block_tokens = _integer(obj, "block_tokens", "", 1)
    deterministic = _typed(obj, "deterministic", bool, "", "true or false")
    segments = tuple(_segment(s, i) for i, s in enumerate(_typed(obj, "segments", list, "", "an array")))
    known = {"kvcs", "compat", "layers", "block_tokens", "deterministic", "segments"}
    return Manifest(compat, layers, block_tokens, deterministic, segments, 1,
                    {k: v for k, v in obj.items() if k not in known})


def manifest_problems(manifest: Manifest, namespace: KvcsNamespace, profile: KvspProfile, *,
                      block_keys: Sequence[bytes] | None = None) -> list[str]:
    """What makes a manifest unusable or inconsistent: its "compat" must hash to the namespace's
    Compatibility ID, "layers"/"block_tokens" must agree with it, segments must be contiguous and name their
    own data tracks, object_digests must have one array per completed Group and one digest per block; with
    ``block_keys`` (the consumer's), each segment's block_keys_sha256 must match them."""
    problems: list[str] = []
    try:
        compat_id = profile.compatibility_id(manifest.compat)
    except KvspError as exc:
        return [f"manifest compat: {exc} [{REQ_MANIFEST_COMPAT}]"]
    if compat_id != namespace.compat_id:
        problems.append(f"manifest compat: its Compatibility ID ({profile.name}) is {compat_id.hex()[:16]}.., the "
                        f"namespace's is {namespace.compat_id.hex()[:16]}.. [{REQ_MANIFEST_COMPAT}]")
    for name in ("layers", "block_tokens"):
        if manifest.compat.get(name) != getattr(manifest, name):
            problems.append(f"manifest {name}: {getattr(manifest, name)}, the descriptor says "
                            f"{manifest.compat.get(name)!r} [{REQ_MANIFEST}]")
    next_block = 0
    for i, seg in enumerate(manifest.segments):
        where = f"manifest segments[{i}]"
        if seg.segment != i:
            problems.append(f"{where}.segment: {seg.segment}, expected {i} (segments in order) [{REQ_SEGMENTS}]")
        if seg.first_block != next_block:
            problems.append(f"{where}.first_block: {seg.first_block}, the previous segments end at block "
                            f"{next_block} [{REQ_MANIFEST}]")
        next_block = seg.first_block + seg.blocks
        for t in seg.tracks:
            try:
                parsed = parse_track_name(t.encode())
            except KvcsError as exc:
                problems.append(f"{where}.tracks: {exc}")
                continue
            if not isinstance(parsed, DataTrack) or parsed.segment != seg.segment:
                problems.append(f"{where}.tracks: {t!r} is not a data track of segment {seg.segment} [{REQ_SEGMENTS}]")
        for track, groups in (seg.object_digests or {}).items():
            if track not in seg.tracks:
                problems.append(f"{where}.object_digests: {track!r} is not one of the segment's tracks "
                                f"[{REQ_OBJECT_DIGESTS}]")
            if len(groups) > manifest.layers or (seg.complete and len(groups) != manifest.layers):
                problems.append(f"{where}.object_digests.{track}: {len(groups)} Groups listed, the segment has "
                                f"{manifest.layers} layers{' and is complete' if seg.complete else ''} "
                                f"[{REQ_OBJECT_DIGESTS}]")
            for g, group in enumerate(groups):
                if len(group) != seg.blocks:
                    problems.append(f"{where}.object_digests.{track}[{g}]: {len(group)} digests for {seg.blocks} "
                                    f"blocks [{REQ_OBJECT_DIGESTS}]")
        if block_keys is not None:
            keys = list(block_keys[seg.first_block:seg.first_block + seg.blocks])
            if len(keys) == seg.blocks and block_keys_sha256(keys) != seg.block_keys_sha256:
                problems.append(f"{where}.block_keys_sha256: does not match the Block Keys of blocks "
                                f"{seg.first_block}..{next_block - 1} [{REQ_BLOCK_KEYS}]")
    return problems
