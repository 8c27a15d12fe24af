"""The test-content convention: a cache spec names a cache whose every byte the harness can compute.

A cache spec is a JSON file::

    {"profile": "kvsp-provisional-1", "scope_key": "<hex>", "compat": {<Compatibility Descriptor>},
     "tokens": [<ints>], "content_seed": "<hex>", "segments": [<token counts appended after segment 0>],
     "signing": {"alg": "ES256" | "EdDSA", "kid": "<text>", "private_pem": "<PEM>"}}    (signing optional)

``tokens`` holds the whole context: segment 0 is its first ``len(tokens) - sum(segments)`` tokens, segment
i its next ``segments[i-1]``. Every segment covers complete blocks; an incomplete tail of the last segment
is not published. The Data of layer l, component c (1 = k, 2 = v) and absolute block b is the first
B*Hkv*D*2 octets of SHAKE-128(content_seed || be_u32(l) || u8(c) || be_u32(b)); a "kv" object's Data is the
k section then the v section (codec "raw").
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kvconform.kvcs.errors import KvcsError
from kvconform.kvcs.manifest import Manifest, SegmentEntry, block_keys_sha256
from kvconform.kvcs.namespace import KvcsNamespace
from kvconform.kvcs.payload import encode_object
from kvconform.kvcs.strictjson import load_json
from kvconform.kvcs.tracks import DataTrack
from kvconform.kvsp import KvspError, KvspProfile, load_profile

__all__ = ["REQ_CONTENT", "CacheSpec", "SegmentLayout", "example_spec"]

REQ_CONTENT = "KVCS-KVSP-CACHE-SPEC"
MAX_SPEC_OCTETS = 64 * 2**20  # a spec lists every token of the context
ELEMENT_OCTETS = {"f16": 2}


@dataclass(frozen=True)
class SegmentLayout:
    """Where a segment sits in the context: its number, first absolute block and number of blocks."""

    segment: int
    first_block: int
    blocks: int


def _hex_field(obj: Mapping[str, Any], name: str) -> bytes:
    value = obj.get(name)
    try:
        raw = bytes.fromhex(value) if isinstance(value, str) else None
    except ValueError:
        raw = None
    if not raw:
        raise KvcsError(f"cache spec {name}", f"{value!r}: expected non-empty hex", requirement=REQ_CONTENT)
    return raw


@dataclass(frozen=True)
class CacheSpec:
    """A validated cache spec and everything derived from it."""

    profile_name: str
    scope_key: bytes
    compat: dict[str, Any]
    tokens: tuple[int, ...]
    content_seed: bytes
    segments: tuple[int, ...] = ()
    signing: dict[str, str] | None = None
    source: str = field(default="", compare=False)

    # ---- loading ---------------------------------------------------------------------------------

    @classmethod
    def load(cls, spec: str | os.PathLike[str] | Mapping[str, Any]) -> CacheSpec:
        """From a JSON file or a mapping; KvcsError naming the field that is off."""
        source = ""
        if not isinstance(spec, Mapping):
            source = str(spec)
            try:
                data = Path(spec).read_bytes()
            except OSError as exc:
                raise KvcsError(f"cache spec {spec}", f"cannot be read: {exc}", requirement=REQ_CONTENT) from exc
            obj = load_json(data, what=f"cache spec {spec}", requirement=REQ_CONTENT, max_octets=MAX_SPEC_OCTETS)
            if not isinstance(obj, dict):
                raise KvcsError(f"cache spec {spec}", "not a JSON object", requirement=REQ_CONTENT)
        else:
            obj = dict(spec)
        profile = obj.get("profile")
        if not isinstance(profile, str):
            raise KvcsError("cache spec profile", f"{profile!r}: expected a KVSP profile name", requirement=REQ_CONTENT)
        compat = obj.get("compat")
        if not isinstance(compat, dict):
            raise KvcsError("cache spec compat", f"{compat!r}: expected the Compatibility Descriptor object",
                            requirement=REQ_CONTENT)
        tokens = obj.get("tokens")
        if not isinstance(tokens, list) or not all(isinstance(t, int) and not isinstance(t, bool) and 0 <= t < 2**32
                                                   for t in tokens):
            raise KvcsError("cache spec tokens", "expected a list of integers 0..2^32-1", requirement=REQ_CONTENT)
        segments = obj.get("segments", [])
        if not isinstance(segments, list) or not all(type(s) is int and s > 0 for s in segments):
            raise KvcsError("cache spec segments", f"{segments!r}: expected positive token counts",
                            requirement=REQ_CONTENT)
        signing = obj.get("signing")
        keys = ("alg", "kid", "private_pem")
        if signing is not None and not (isinstance(signing, dict)
                                        and all(isinstance(signing.get(k), str) for k in keys)):
            raise KvcsError("cache spec signing", "expected {alg, kid, private_pem} strings", requirement=REQ_CONTENT)
        spec_obj = cls(profile, _hex_field(obj, "scope_key"), compat, tuple(tokens), _hex_field(obj, "content_seed"),
                       tuple(segments), signing, source)
        spec_obj.validate()
        return spec_obj

    def validate(self) -> None:
        try:
            load_profile(self.profile_name)
        except KvspError as exc:
            raise KvcsError("cache spec profile", str(exc), requirement=REQ_CONTENT) from exc
        for name in ("layers", "kv_heads", "head_dim", "block_tokens"):
            value = self.compat.get(name)
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise KvcsError(f"cache spec compat.{name}", f"{value!r}: expected a positive integer",
                                requirement=REQ_CONTENT)
        if self.compat.get("dtype") not in ELEMENT_OCTETS:
            raise KvcsError("cache spec compat.dtype", f"{self.compat.get('dtype')!r}: the convention defines f16",
                            requirement=REQ_CONTENT)
        try:
            self.compat_id  # noqa: B018 -- the descriptor must canonicalise (no NaN, no non-JSON value)
        except KvspError as exc:
            raise KvcsError("cache spec compat", str(exc), requirement=REQ_CONTENT) from exc
        layout = self.segment_layout()
        if not layout or layout[0].blocks == 0:
            raise KvcsError("cache spec tokens", "segment 0 has no complete block (no Anchor Key)",
                            requirement=REQ_CONTENT)

    def to_obj(self) -> dict[str, Any]:
        out: dict[str, Any] = {"profile": self.profile_name, "scope_key": self.scope_key.hex(), "compat": self.compat,
                               "tokens": list(self.tokens), "content_seed": self.content_seed.hex()}
        if self.segments:
            out["segments"] = list(self.segments)
        if self.signing is not None:
            out["signing"] = dict(self.signing)
        return out

    def write_json(self, path: str | os.PathLike[str]) -> Path:
        out = Path(path)
        out.write_text(json.dumps(self.to_obj(), indent=1), "utf-8")
        return out

    # ---- KVSP-derived identities -----------------------------------------------------------------------

    @property
    def profile(self) -> KvspProfile:
        return load_profile(self.profile_name)

    @property
    def layers(self) -> int:
        return int(self.compat["layers"])

    @property
    def kv_heads(self) -> int:
        return int(self.compat["kv_heads"])

    @property
    def head_dim(self) -> int:
        return int(self.compat["head_dim"])

    @property
    def block_tokens(self) -> int:
        return int(self.compat["block_tokens"])

    @property
    def section_octets(self) -> int:
        """Octets of one K (or V) section of one block and layer."""
        return self.block_tokens * self.kv_heads * self.head_dim * ELEMENT_OCTETS[str(self.compat["dtype"])]

    @functools.cached_property
    def compat_id(self) -> bytes:
        return self.profile.compatibility_id(self.compat)

    @functools.cached_property
    def scope_id(self) -> bytes:
        return self.profile.scope_id(self.scope_key)

    @functools.cached_property
    def block_keys(self) -> tuple[bytes, ...]:
        """The Block Key of every published block, in order (the chain runs across segments)."""
        total = sum(s.blocks for s in self.segment_layout())
        keys = self.profile.block_keys(self.scope_key, self.compat_id, self.tokens, self.block_tokens)
        return tuple(keys[:total])

    @property
    def anchor_key(self) -> bytes:
        """The Block Key of the last complete block of segment 0."""
        return self.block_keys[self.segment_layout()[0].blocks - 1]

    def namespace(self, pub_id: bytes) -> KvcsNamespace:
        return KvcsNamespace(self.scope_id, self.compat_id, self.anchor_key, pub_id)

    def segment_layout(self) -> list[SegmentLayout]:
        counts = [len(self.tokens) - sum(self.segments), *self.segments]
        if counts[0] < 0:
            raise KvcsError("cache spec segments", f"sum {sum(self.segments)} exceeds the {len(self.tokens)} tokens",
                            requirement=REQ_CONTENT)
        b = self.block_tokens
        out: list[SegmentLayout] = []
        first = 0
        for i, count in enumerate(counts):
            if i < len(counts) - 1 and count % b:
                raise KvcsError("cache spec segments", f"segment {i} has {count} tokens, not whole blocks of {b} "
                                "(only the last segment may end in an incomplete block)", requirement=REQ_CONTENT)
            out.append(SegmentLayout(i, first, count // b))
            first += count // b
        return out

    # ---- content -------------------------------------------------------------------------------------

    def data(self, layer: int, component: int, abs_block: int) -> bytes:
        """The K (component 1) or V (2) section of one block and layer."""
        if component not in (1, 2):
            raise ValueError(f"component {component}: the convention defines 1 (k) and 2 (v)")
        xof = hashlib.shake_128(self.content_seed + layer.to_bytes(4, "big") + bytes([component])
                                + abs_block.to_bytes(4, "big"))
        return xof.digest(self.section_octets)

    def object_data(self, track: DataTrack, layer: int, object_id: int) -> bytes:
        """The Data of one object of a data track (raw codec): the section, or k then v for "kv"."""
        abs_block = self.segment_layout()[track.segment].first_block + object_id
        if track.component == "kv":
            return self.data(layer, 1, abs_block) + self.data(layer, 2, abs_block)
        return self.data(layer, track.component_value, abs_block)

    def object_payload(self, track: DataTrack, layer: int, object_id: int) -> bytes:
        """The whole KVO1 payload a correct publisher sends at {layer, object_id} of ``track``."""
        seg = self.segment_layout()[track.segment]
        if not (0 <= layer < self.layers and 0 <= object_id < seg.blocks):
            raise KvcsError(f"{track} {{{layer},{object_id}}}", f"outside {self.layers} layers x {seg.blocks} blocks",
                            requirement=REQ_CONTENT)
        if track.codec != "raw":
            raise KvcsError(f"{track} codec", f"{track.codec!r}: the test-content convention defines only 'raw'",
                            requirement=REQ_CONTENT)
        return encode_object(component=track.component_value, layer=layer, block_index=object_id,
                             token_start=(seg.first_block + object_id) * self.block_tokens,
                             token_count=self.block_tokens, codec=self.profile.codec_value(track.codec),
                             data=self.object_data(track, layer, object_id))

    def layer_digest(self, layer: int, abs_block: int) -> bytes:
        """The KVSP layer digest of one block and layer."""
        return self.profile.layer_digest(self.data(layer, 1, abs_block), self.data(layer, 2, abs_block))

    def data_tracks(self, segment: int, kv: bool = False) -> list[DataTrack]:
        """The k and v tracks of a segment (and the kv track with ``kv``), codec raw."""
        comps = ["k", "v", "kv"] if kv else ["k", "v"]
        return [DataTrack(c, "raw", segment) for c in comps]

    def manifest(self, completed: Mapping[bytes, int], *, kv: bool = False, deterministic: bool = False,
                 segments_added: int | None = None, with_digests: bool = True) -> Manifest:
        """The manifest a correct publisher publishes once ``completed`` (data track name -> number of
        Groups completed, from Group 0) is done, for the first ``segments_added`` segments (default all).
        A segment is complete when all its tracks completed every layer."""
        layout = self.segment_layout()
        added = len(layout) if segments_added is None else segments_added
        entries = []
        for seg in layout[:added]:
            tracks = self.data_tracks(seg.segment, kv)
            digests: dict[str, list[list[bytes]]] = {}
            for t in tracks:
                done = min(completed.get(t.name, 0), self.layers)
                digests[str(t)] = [[hashlib.sha256(self.object_data(t, g, o)).digest() for o in range(seg.blocks)]
                                   for g in range(done)]
            complete = all(len(d) == self.layers for d in digests.values())
            keys = self.block_keys[seg.first_block:seg.first_block + seg.blocks]
            entries.append(SegmentEntry(seg.segment, seg.first_block, seg.blocks, block_keys_sha256(keys),
                                        tuple(str(t) for t in tracks), complete, digests if with_digests else None))
        return Manifest(dict(self.compat), self.layers, self.block_tokens, deterministic, tuple(entries))


def example_spec(*, layers: int = 4, blocks: int = 6, block_tokens: int = 4, kv_heads: int = 2, head_dim: int = 8,
                 segments: Sequence[int] = (), seed: int = 1, tail_tokens: int = 0,
                 signing: Mapping[str, str] | None = None, model: str = "kvconform-test") -> CacheSpec:
    """A small cache (for fast tests): ``blocks`` blocks of segment 0, then ``segments`` appended, then
    ``tail_tokens`` tokens of an incomplete block at the end."""
    n0 = blocks * block_tokens
    total = n0 + sum(segments) + tail_tokens
    tokens = [(seed * 7919 + i * 104729) % 50257 for i in range(total)]
    compat = {"model": model, "layers": layers, "kv_heads": kv_heads, "head_dim": head_dim,
              "block_tokens": block_tokens, "dtype": "f16"}
    tail = [*segments[:-1], segments[-1] + tail_tokens] if segments else []
    obj: dict[str, Any] = {"profile": "kvsp-provisional-1",
                           "scope_key": hashlib.sha256(b"scope key %d" % seed).hexdigest(), "compat": compat,
                           "tokens": tokens, "content_seed": hashlib.sha256(b"content %d" % seed).hexdigest()[:32],
                           "segments": tail}
    if signing is not None:
        obj["signing"] = dict(signing)
    return CacheSpec.load(obj)
