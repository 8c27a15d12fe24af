"""What the reference KVCS consumer is given and what it reports (the text's "Consumer Procedures"): the
identity of the cache it wants, its options, the layers it assembled and the Objects it rejected, and the
requirement ids its messages cite. Plain data, no I/O (issue 24 item 1: the consumer's core and its adapter
both use it).

**Layer digest** (what the result reports for each ready layer; the ``kvcs-consumer`` suite computes
the same from the test-content convention): SHA-256 over the concatenation, for each used segment in
ascending segment number, for each needed block of that segment in ascending Object ID, of the block's
K section followed by its V section — that is, for a "k"/"v" pair, the "k" Object's Data then the "v"
Object's Data at that Location, and for a raw "kv" track, that Object's Data (which is K then V). Block
order, not track order, so that a "k"/"v" pair and a "kv" track of the same content give the same digest.

Result JSON (``ConsumeResult.to_json``)::

    {"publication": "<hex Publication ID>" | null,
     "layers": {"0": {"digest": "<hex>" | "failed", "publication": "<hex>", "reason": "..."}, ...},
     "rejected": [{"track", "group", "object", "reason", "publication", "relay"}],
     "publications": [{"publication", "relay", "outcome"}], "segments": [[segment, blocks], ...],
     "elapsed": seconds, "gave_up": bool, "mode": "live" | "fetch" | null}
"""


from __future__ import annotations

import hashlib
import json
import math
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from kvconform.kvcs.content import CacheSpec
from kvconform.kvcs.errors import KvcsError, show
from kvconform.kvcs.strictjson import describe, load_json
from kvconform.kvsp import KvspProfile
from kvconform.moqt.structures import AuthToken

__all__ = ["MAX_RESULT_OCTETS", "REQ", "ConsumeResult", "ConsumerIdentity", "ConsumerOptions", "LayerReady",
           "Rejection", "convention_layer_digest", "layer_digest"]

# Requirement ids (conformance/requirements/kvcs.yaml) the consumer's messages cite.
REQ = {
    "verify": "KVCS-PAYLOAD-DISCARD",
    "fields": "KVCS-VERIFY-EVERY",
    "compat": "KVCS-MANIFEST-COMPAT-CHECK",
    "cose": "KVCS-SEC-COSE-VERIFY",
    "digests": "KVCS-SEC-COSE-VERIFY",
    "mix": "KVCS-VERIFY-NO-MIX",
    "malformed": "MOQT-DATA-MALFORMED-DUPLICATE",
}


def layer_digest(blocks: Iterable[bytes]) -> bytes:
    """SHA-256 over the per-block K‖V Data, in block order (see the module docstring)."""
    h = hashlib.sha256()
    for data in blocks:
        h.update(data)
    return h.digest()


def convention_layer_digest(spec: CacheSpec, layer: int, segments: Sequence[tuple[int, int]]) -> bytes:
    """The layer digest of the test-content convention for ``segments`` = [(segment, blocks used)]."""
    layout = spec.segment_layout()
    return layer_digest(spec.data(layer, 1, layout[s].first_block + o) + spec.data(layer, 2, layout[s].first_block + o)
                        for s, n in segments for o in range(n))


# ---- inputs and results -------------------------------------------------------------------------------


@dataclass(frozen=True)
class ConsumerIdentity:
    """What the consumer knows about the cache it wants: never the content, only how to name it."""

    profile: KvspProfile
    scope_key: bytes
    compat: Mapping[str, Any]
    tokens: tuple[int, ...]

    @classmethod
    def from_spec(cls, spec: CacheSpec) -> ConsumerIdentity:
        """The identity part of a cache spec (its content seed is the harness's, not the consumer's)."""
        return cls(spec.profile, spec.scope_key, dict(spec.compat), tuple(spec.tokens))

    @property
    def compat_id(self) -> bytes:
        return self.profile.compatibility_id(self.compat)

    @property
    def scope_id(self) -> bytes:
        return self.profile.scope_id(self.scope_key)

    @property
    def block_tokens(self) -> int:
        return int(self.compat["block_tokens"])

    def block_keys(self) -> list[bytes]:
        return self.profile.block_keys(self.scope_key, self.compat_id, self.tokens, self.block_tokens)

    def section_octets(self) -> int:
        """Octets of one raw K (or V) section: block_tokens x kv_heads x head_dim x 2 (f16)."""
        return self.block_tokens * int(self.compat["kv_heads"]) * int(self.compat["head_dim"]) * 2


@dataclass(frozen=True)
class ConsumerOptions:
    """How to retrieve: relays in preference order, what to retrieve, limits, credentials."""

    relays: tuple[str, ...]
    layers: tuple[int, int] | None = None  # inclusive range; None = every layer
    blocks: int | None = None  # only the first n blocks of the context; None = every block the keys cover
    budget: float = 30.0  # seconds: give up (layers "failed") past this
    stall_timeout: float = 5.0  # seconds without progress before a publication is abandoned
    discovery_window: float = 0.5  # seconds to wait for a NAMESPACE after SUBSCRIBE_NAMESPACE's REQUEST_OK
    max_prefixes: int = 64  # how many Anchor Keys (longest first) discovery tries
    token: bytes | None = None  # AUTHORIZATION_TOKEN (USE_VALUE, type 0) on every request
    producer_keys: Mapping[bytes, str] = field(default_factory=dict)  # kid -> public PEM
    require_authenticity: bool | None = None  # default: True iff producer keys are known
    mode: str = "auto"  # "auto" (live unless every needed segment is complete), "live" or "fetch"
    # Relays are not trusted (Security and Privacy Considerations): producer authenticity is required (the Data
    # Digest alone is not relied on) and only the exact prefix is looked for (no shorter-prefix probing).
    distrust_relays: bool = False

    @property
    def authenticity(self) -> bool:
        if self.require_authenticity is not None:
            return self.require_authenticity
        return bool(self.producer_keys) or self.distrust_relays

    def auth(self) -> tuple[AuthToken, ...]:
        return () if self.token is None else (AuthToken.use_value(self.token),)


@dataclass(frozen=True)
class Rejection:
    """An Object (or a manifest, object -1) the consumer discarded, and why."""

    track: str
    group: int
    object: int
    reason: str
    publication: str = ""
    relay: str = ""

    def to_obj(self) -> dict[str, Any]:
        return {"track": self.track, "group": self.group, "object": self.object, "reason": self.reason,
                "publication": self.publication, "relay": self.relay}


@dataclass(frozen=True)
class LayerReady:
    """A layer whose every needed Object is verified: ``data`` = per block, K section then V section."""

    layer: int
    publication: bytes
    relay: str
    digest: bytes
    data: tuple[bytes, ...]


@dataclass
class ConsumeResult:
    """What the consumer assembled; ``layers[l]`` is the layer digest or None ("failed")."""

    publication: bytes | None
    layers: dict[int, bytes | None]
    rejected: list[Rejection] = field(default_factory=list)
    publications: list[dict[str, str]] = field(default_factory=list)
    sources: dict[int, bytes] = field(default_factory=dict)  # layer -> publication it came from
    reasons: dict[int, str] = field(default_factory=dict)  # layer -> why it failed
    segments: list[tuple[int, int]] = field(default_factory=list)
    elapsed: float = 0.0
    gave_up: bool = False
    mode: str | None = None

    def to_obj(self) -> dict[str, Any]:
        layers: dict[str, Any] = {}
        for layer, digest in sorted(self.layers.items()):
            entry: dict[str, Any] = {"digest": digest.hex() if digest is not None else "failed"}
            if layer in self.sources:
                entry["publication"] = self.sources[layer].hex()
            if layer in self.reasons:
                entry["reason"] = self.reasons[layer]
            layers[str(layer)] = entry
        return {"publication": self.publication.hex() if self.publication is not None else None, "layers": layers,
                "rejected": [r.to_obj() for r in self.rejected], "publications": self.publications,
                "segments": [list(s) for s in self.segments], "elapsed": round(self.elapsed, 3),
                "gave_up": self.gave_up, "mode": self.mode}

    def to_json(self) -> str:
        return json.dumps(self.to_obj(), indent=1)

    @classmethod
    def from_json(cls, data: bytes) -> ConsumeResult:
        """Read a result file (any consumer's, so any octets); KvcsError naming the field that is off."""
        return cls.from_obj(load_json(data, what="consumer result", requirement="", max_octets=MAX_RESULT_OCTETS))

    @classmethod
    def from_obj(cls, obj: Any) -> ConsumeResult:
        """Read a result JSON (ours or another consumer's); KvcsError naming the field that is off."""
        if not isinstance(obj, Mapping):
            raise _result_error("", obj, "an object")
        pub = obj.get("publication")
        layers_obj = obj.get("layers")
        if not isinstance(layers_obj, Mapping):
            raise _result_error("layers", layers_obj, "an object layer -> entry")
        layers: dict[int, bytes | None] = {}
        sources: dict[int, bytes] = {}
        for key, entry in layers_obj.items():
            if not (isinstance(key, str) and _LAYER_KEY.fullmatch(key)):  # int() would take "+3", " 3", "٣"
                raise KvcsError("consumer result layers", f"key {show(key)}, expected a layer number (ASCII digits, "
                                "no sign, space or leading zero)")
            layer = int(key)
            value = entry.get("digest") if isinstance(entry, Mapping) else entry
            layers[layer] = None if value == "failed" else _result_hex(value, f"layers[{layer}]",
                                                                        'a hex digest or "failed"')
            if isinstance(entry, Mapping) and "publication" in entry:
                sources[layer] = _result_hex(entry["publication"], f"layers[{layer}].publication",
                                             "a hex Publication ID")
        rejected = [Rejection(_result_typed(r, "track", str, "", f"rejected[{i}]"),
                              _result_typed(r, "group", int, -1, f"rejected[{i}]"),
                              _result_typed(r, "object", int, -1, f"rejected[{i}]"),
                              _result_typed(r, "reason", str, "", f"rejected[{i}]"),
                              _result_typed(r, "publication", str, "", f"rejected[{i}]"),
                              _result_typed(r, "relay", str, "", f"rejected[{i}]"))
                    for i, r in enumerate(_result_list(obj, "rejected", Mapping, "objects"))]
        segments = []
        for i, seg in enumerate(_result_list(obj, "segments", list, "[first block, blocks] pairs")):
            if len(seg) != 2 or any(type(n) is not int for n in seg):
                raise _result_error(f"segments[{i}]", seg, "[first block, blocks]")
            segments.append((seg[0], seg[1]))
        elapsed = obj.get("elapsed", 0.0)
        if type(elapsed) not in (int, float) or not math.isfinite(elapsed):
            raise _result_error("elapsed", elapsed, "seconds (a number)")
        mode = obj.get("mode")
        if mode is not None and not isinstance(mode, str):
            raise _result_error("mode", mode, "a string or null")
        return cls(None if pub is None else _result_hex(pub, "publication", "a hex Publication ID or null"), layers,
                   rejected, [dict(p) for p in _result_list(obj, "publications", Mapping, "objects")], sources, {},
                   segments, float(elapsed), _result_typed(obj, "gave_up", bool, False, ""), mode)


MAX_RESULT_OCTETS = 16 * 2**20  # a result holds a digest per layer and a line per rejection
_LAYER_KEY = re.compile("0|[1-9][0-9]{0,9}")
_HEX_TEXT = re.compile("(?:[0-9a-fA-F]{2})*")


def _result_error(field: str, value: Any, expected: str) -> KvcsError:
    return KvcsError(f"consumer result {field}".rstrip(), f"{describe(value)}, expected {expected}")


def _result_hex(value: Any, field: str, expected: str) -> bytes:
    if not (isinstance(value, str) and _HEX_TEXT.fullmatch(value)):
        raise _result_error(field, value, expected)
    return bytes.fromhex(value)


def _result_typed(obj: Mapping[str, Any], name: str, kind: type, default: Any, where: str) -> Any:
    """``obj[name]`` when of ``kind`` (an int is never a bool here), ``default`` when absent."""
    value = obj.get(name, default)
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        raise _result_error(f"{where}.{name}" if where else name, value, kind.__name__)
    return value


def _result_list(obj: Mapping[str, Any], name: str, kind: type, expected: str) -> list[Any]:
    """``obj[name]``: an array whose elements are all of ``kind`` (empty when absent)."""
    value = obj.get(name, [])
    if not isinstance(value, list):
        raise _result_error(name, value, f"an array of {expected}")
    for i, item in enumerate(value):
        if not isinstance(item, kind):
            raise _result_error(f"{name}[{i}]", item, expected)
    return value

