"""The reference KVCS consumer (the text's "Consumer Procedures"), on ``kvconform.moqt.client``.

What it does, in order, within one time budget:

1. **Discovery.** From what it knows (KVSP profile, scope key, Compatibility Descriptor, its tokens) it
   computes the Scope ID, Compatibility ID and its Block Keys, and sends SUBSCRIBE_NAMESPACE for
   ("kvcs-1", Scope ID, Compatibility ID, Anchor Key) with the Anchor Key of its longest prefix, then of
   shorter ones (each longer namespace subscription is cancelled first: PREFIX_OVERLAP, profile §12). Each
   NAMESPACE names one publication (its Publication ID).
2. **Manifest.** SUBSCRIBE "manifest.cose" (Next Object + FILL_PARAMETERS {Relative Start 1}); only if the
   publisher reports that track does not exist and producer authenticity is not required, "manifest". Each
   version is opened (COSE_Sign1 verified with the known producer keys), parsed and checked: its "compat"
   must hash to the namespace's Compatibility ID, else the publication is discarded.
3. **Data.** The consumer uses the segments whose ``block_keys_sha256`` match its own Block Keys (from
   segment 0, contiguous) and, per segment, the "k" and "v" tracks of codec raw (or one raw "kv" track).
   *Live* (a needed segment is not complete): SUBSCRIBE with LOCATION_FILTER Next Object and
   FILL_PARAMETERS {Absolute Start {0,0}, GROUP_ORDER Ascending} (the exactly-once pattern).
   *Completed*: FETCH of the layer range (Absolute Start, Group End; GROUP_ORDER Ascending) with an
   OBJECTID_FILTER 0..n-1 when only the first n blocks are needed and the peer's MAX_FILTER_RANGES is
   non-zero; otherwise the excess Objects are discarded.
4. **Verification.** Every Object: ``verify_object`` (magic, version, Layer = Group ID, Block Index =
   Object ID, lengths, Data Digest), Component, Codec, Token Start / Token Count, raw Data length, and its
   Data Digest against the manifest's ``object_digests`` (required, and signed, when producer authenticity
   is required). A failing Object is discarded and treated as missing. The same Location delivered twice
   with different payloads makes the track malformed (nothing of it is used).
5. **Completion and recovery.** A track is complete at End of Track or PUBLISH_DONE (with its data streams
   closed), or when its fill ended and the manifest marks the segment complete; an Object at or below the
   SUBSCRIBE_OK Largest Object that the ended fill did not carry, or one past an End of Group, is missing.
   A layer is *ready* (``on_ready``) once every needed Object of it in every selected track is verified.
   Missing or rejected layers are retried through another relay URL (same publication) or another
   publication; Objects of different publications are combined in one segment only when both manifests
   say ``"deterministic": true``. A publication that makes no progress for ``stall_timeout`` seconds is
   abandoned; past ``budget`` seconds the consumer gives up and reports the layers it has not got as
   "failed".

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

import asyncio
import contextlib
import hashlib
import json
import logging
import math
import re
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kvconform.kvcs import cose
from kvconform.kvcs.content import CacheSpec
from kvconform.kvcs.errors import KvcsError, show
from kvconform.kvcs.manifest import Manifest, SegmentEntry, block_keys_sha256, manifest_problems, parse_manifest
from kvconform.kvcs.namespace import KVCS_TAG, KvcsNamespace
from kvconform.kvcs.payload import HEADER_LEN, decode_object, verify_object
from kvconform.kvcs.strictjson import describe, load_json
from kvconform.kvcs.tracks import MANIFEST, MANIFEST_COSE, DataTrack, parse_track_name
from kvconform.kvsp import KvspError, KvspProfile
from kvconform.moqt import client as mc
from kvconform.moqt.data import GroupOrder, ObjectStatus
from kvconform.moqt.errors import RequestErrorCode, SessionError
from kvconform.moqt.filters import LocationFilter, RangeFilter
from kvconform.moqt.messages import FetchOk
from kvconform.moqt.parameters import FillParameters
from kvconform.moqt.session import (
    UNKNOWN_STREAM_COUNT,
    Event,
    Request,
    Role,
    SessionConfig,
)
from kvconform.moqt.structures import AuthToken, Location, ParamType, TrackNamespace

__all__ = ["MAX_RESULT_OCTETS", "REQ", "ConsumeResult", "Consumer", "ConsumerIdentity", "ConsumerOptions", "LayerReady",
           "Rejection", "convention_layer_digest", "layer_digest", "load_producer_keys"]

log = logging.getLogger(__name__)

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
CONNECT_TIMEOUT = 5.0
REQUEST_TIMEOUT = 5.0
DISCOVERY_DRAIN = 0.05  # NAMESPACE messages for existing publications follow REQUEST_OK back to back


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


# ---- MOQT handles that report every change to the attempt ------------------------------------------------


class _WatchedSubscription(mc.Subscription):
    """A Subscription that calls ``on_change`` after each of its events (objects, streams, PUBLISH_DONE)."""

    def __init__(self, client: mc.MoqtClient, request: Request, on_change: Callable[[], None]) -> None:
        super().__init__(client, request)
        self.on_change = on_change

    def _on_event(self, event: Event) -> None:
        super()._on_event(event)
        self.on_change()


class _WatchedFetch(mc.FetchResult):
    """A FetchResult that calls ``on_change`` after each of its events, so layers are used as they arrive."""

    def __init__(self, client: mc.MoqtClient, request: Request, on_change: Callable[[], None]) -> None:
        super().__init__(client, request)
        self.on_change = on_change

    def _on_event(self, event: Event) -> None:
        super()._on_event(event)
        self.on_change()


# ---- per-track retrieval state ---------------------------------------------------------------------------


@dataclass
class _Needed:
    """One selected data track of one used segment, and how many of its blocks are needed."""

    segment: int
    track: DataTrack
    blocks: int


class _TrackState:
    """What one data track delivered in one attempt."""

    def __init__(self, needed: _Needed) -> None:
        self.needed = needed
        self.handle: _WatchedSubscription | _WatchedFetch | None = None
        self.processed = 0  # objects of the handle already looked at
        self.payloads: dict[Location, bytes] = {}
        self.data: dict[Location, bytes] = {}
        self.digests: dict[Location, bytes] = {}
        self.lost: dict[Location, str] = {}
        self.group_end: dict[int, int] = {}
        self.gaps: list[tuple[Location, Location]] = []  # End of Range spans (inclusive)
        self.last_on_stream: dict[int, Location] = {}
        self.recovered: set[Location] = set()  # Data from recover_block, not from the publication
        self.malformed: str | None = None
        self.failed: str | None = None  # the request was refused or the session ended
        self.excess = 0
        self.violations: list[str] = []
        self.touched: set[int] = set()  # groups (layers) with any Object received or lost

    @property
    def name(self) -> str:
        return str(self.needed.track)

    def ended(self) -> bool:
        """No more Objects can come: fetch stream ended, or End of Track / PUBLISH_DONE with streams closed."""
        h = self.handle
        if self.failed is not None:
            return True
        if isinstance(h, _WatchedFetch):
            return h.stream_end.done()
        if isinstance(h, _WatchedSubscription):
            if h.largest is not None and not h.fills:
                return False  # the fill of everything up to Largest Object has not even started
            open_streams = "open" in h.fills.values() or "open" in h.subgroup_streams.values()
            if open_streams:
                return False
            if h.done.done() and not h.done.exception():
                count = h.done.result().stream_count
                return count == UNKNOWN_STREAM_COUNT or h.streams_seen() >= count
            if h.done.done():
                return True
            return self._groups_closed_by_end_of_track(h)
        return False

    def _groups_closed_by_end_of_track(self, h: _WatchedSubscription) -> bool:
        """End of Track seen (before PUBLISH_DONE) and every Group below it accounted for: its End of Group
        arrived, or it lies wholly below Largest Object and the fill ended. End of Track can arrive before
        the streams of earlier Groups open (it has its own stream and priority), so alone it ends nothing."""
        ends = [o.location for o in h.objects if o.status == ObjectStatus.END_OF_TRACK]
        if not ends:
            return False
        below = h.largest.group if h.largest is not None and self.fill_done() else 0
        return all(g in self.group_end or g < below for g in range(min(ends).group))

    def fill_done(self) -> bool:
        """The fill fetch stream ended (FIN or reset): below Largest Object nothing more can come."""
        h = self.handle
        return isinstance(h, _WatchedSubscription) and bool(h.fills) and "open" not in h.fills.values()

    def missing_reason(self, loc: Location) -> str | None:
        """Why a not-received Location will never come, or None while it still may."""
        if any(a <= loc <= b for a, b in self.gaps):
            return f"{self.name} {loc}: reported as an End of Range (missing)"
        end = self.group_end.get(loc.group)
        if end is not None and loc.object >= end:
            return f"{self.name} {loc}: past End of Group at object {end}"
        h = self.handle
        if self.ended():
            return f"{self.name} {loc}: never delivered (the track or fetch ended)"
        if isinstance(h, _WatchedSubscription):
            largest = h.largest
            if self.fill_done() and largest is not None and loc <= largest:
                how = "reset" if "reset" in h.fills.values() else "ended"
                return f"{self.name} {loc}: at or below Largest Object {largest}, and the fill {how} without it"
        return None


# ---- the consumer ----------------------------------------------------------------------------------------


class _Abandon(Exception):
    """The attempt's publication is unusable (bad manifest, no manifest, nothing to use)."""


@dataclass
class _AttemptResult:
    relay: str
    pub: bytes
    manifest: Manifest | None
    plan: tuple[tuple[int, int], ...]  # (segment, blocks used)
    layers: dict[int, LayerReady] = field(default_factory=dict)
    reasons: dict[int, str] = field(default_factory=dict)
    outcome: str = "ok"
    mode: str | None = None
    retryable: set[int] = field(default_factory=set)  # layers lost as missing (not as rejected)


class Consumer:
    """The reference consumer. ``await Consumer(identity, options).run()`` -> ``ConsumeResult``.

    ``on_ready`` is called (and ``ready[layer]`` set) as each layer is verified, with the publication it
    came from. When the consumer has to move to another, non-deterministic publication, layers reported for
    the earlier one must not be combined with the new one's: the result names the publication (and, per
    layer, the source) finally used.

    Subclasses (the harness's mutants) override one method per behaviour: ``discovery_anchors``,
    ``data_subscribe_parameters``, ``manifest_subscribe_parameters``, ``fetch_parameters``,
    ``open_manifest``, ``manifest_problems``, ``object_problems``, ``listed_digest_problem``,
    ``recover_block``, ``duplicate_problem``, ``may_combine``, ``remaining``, ``wait_for_change``,
    ``retrieval_mode``, ``select_tracks``. A layer reported ready is retracted (dropped from the result) when its
    track later turns out malformed.
    """

    def __init__(self, identity: ConsumerIdentity, options: ConsumerOptions,
                 on_ready: Callable[[LayerReady], None] | None = None) -> None:
        if not options.relays:
            raise ValueError("ConsumerOptions.relays: at least one relay URL")
        self.identity = identity
        self.options = options
        self.on_ready = on_ready
        self.ready: dict[int, asyncio.Event] = {}
        self.keys = identity.block_keys()
        if not self.keys:
            raise KvspError("tokens: no complete block, so no Anchor Key to look for")
        self.rejected: list[Rejection] = []
        self.attempts: list[_AttemptResult] = []
        self._deadline = 0.0
        self._emitted_pub: bytes | None = None

    # ---- overridable behaviour -------------------------------------------------------------------------

    def remaining(self) -> float:
        """Seconds left of the budget (never negative)."""
        return max(0.0, self._deadline - time.monotonic())

    def discovery_anchors(self) -> list[bytes]:
        """Anchor Keys to look for, longest prefix first (each shorter one is an earlier key of the chain).
        ``blocks`` limits what is retrieved, not what is looked for: a publication of the whole prompt
        serves its first blocks too. A consumer that distrusts relays looks for its exact prefix only: a
        sequence of shorter prefixes would tell the relay where its prompt diverges from published ones."""
        if self.options.distrust_relays:
            return self.keys[-1:]
        return list(reversed(self.keys))[:self.options.max_prefixes]

    def manifest_subscribe_parameters(self) -> dict[str, Any]:
        """Next Object + FILL_PARAMETERS {Relative Start 1}: the current version on the fill, later ones live."""
        fill = FillParameters.of((ParamType.LOCATION_FILTER, LocationFilter.relative_start(1)),
                                 (ParamType.GROUP_ORDER, GroupOrder.ASCENDING))
        return {"location_filter": LocationFilter.next_object(), "fill": fill}

    def data_subscribe_parameters(self) -> dict[str, Any]:
        """Next Object + FILL_PARAMETERS {Absolute Start {0,0}, GROUP_ORDER Ascending}: every Object once."""
        fill = FillParameters.of((ParamType.LOCATION_FILTER, LocationFilter.absolute_start(0, 0)),
                                 (ParamType.GROUP_ORDER, GroupOrder.ASCENDING))
        return {"location_filter": LocationFilter.next_object(), "fill": fill}

    def fetch_parameters(self, first: int, last: int, blocks: int, segment_blocks: int,
                         peer_max_filter_ranges: int) -> dict[str, Any]:
        """Absolute Start, Group End {first,0} EndGroupDelta last-first, Ascending; OBJECTID_FILTER 0..n-1
        when fewer than all blocks are needed and the peer accepts Range Filters."""
        out: dict[str, Any] = {"location_filter": LocationFilter.absolute_start_group_end(first, 0, last - first),
                               "group_order": GroupOrder.ASCENDING}
        if blocks < segment_blocks and peer_max_filter_ranges > 0:
            out["range_filters"] = (RangeFilter.first_objects(blocks),)
        return out

    def open_manifest(self, track: bytes, payload: bytes) -> bytes:
        """The manifest JSON of one version: "manifest.cose" is verified with the known producer keys (or,
        when none are known, read without verification); "manifest" is the JSON itself."""
        if track == MANIFEST:
            return payload
        if self.options.producer_keys:
            return cose.verify(payload, dict(self.options.producer_keys))
        return _cose_payload_unverified(payload)

    def manifest_problems(self, manifest: Manifest, namespace: KvcsNamespace) -> list[str]:
        """Why a manifest version makes the publication unusable (its Compatibility ID first)."""
        return manifest_problems(manifest, namespace, self.identity.profile)

    def object_problems(self, needed: _Needed, segment: SegmentEntry, loc: Location, payload: bytes) -> list[str]:
        """The End Subscriber checks, then the header fields this consumer can predict."""
        problems = verify_object(payload, loc.group, loc.object)
        if problems:
            return problems
        header, data = decode_object(payload)
        track = needed.track
        bt = self.identity.block_tokens
        if header.component != track.component_value:
            problems.append(f"Component (offset 5): {header.component}, the track {track} carries "
                            f"{track.component_value} [{REQ['fields']}]")
        try:
            codec = self.identity.profile.codec_value(track.codec)
        except KvspError:
            codec = -1
        if header.codec != codec:
            problems.append(f"Codec (offset 28): {header.codec}, the track {track} names codec {codec} "
                            f"[{REQ['fields']}]")
        if header.token_count != bt:
            problems.append(f"Token Count (offset 24): {header.token_count}, the block size is {bt} [{REQ['fields']}]")
        start = (segment.first_block + loc.object) * bt
        if header.token_start != start:
            problems.append(f"Token Start (offset 16): {header.token_start}, block {segment.first_block + loc.object}"
                            f" starts at token {start} [{REQ['fields']}]")
        if track.codec == "raw":
            want = self.identity.section_octets() * (2 if track.component == "kv" else 1)
            if len(data) != want:
                problems.append(f"Data Length (offset 32): {len(data)} octets, raw {track.component} Data of one "
                                f"block is {want} [{REQ['fields']}]")
        return problems

    def listed_digest_problem(self, track: str, segment: SegmentEntry, loc: Location, digest: bytes,
                              authenticated: bool) -> str | None:
        """None when the Data Digest is the one the manifest lists (or none is listed and authenticity is not
        required); "pending" when authenticity is required and no signed digest is listed yet."""
        listed = segment.digest_of(track, loc.group, loc.object)
        if listed is None:
            if self.options.authenticity:
                return "pending"
            return None
        if listed != digest:
            signed = "signed " if authenticated else ""
            return (f"{track} {loc}: Data Digest {digest.hex()[:16]}.. is not the one the {signed}manifest lists "
                    f"({listed.hex()[:16]}..) [{REQ['digests']}]")
        if self.options.authenticity and not authenticated:
            return "pending"
        return None

    def recover_block(self, track: DataTrack, segment: SegmentEntry, loc: Location) -> bytes | None:
        """Data for an Object that will not arrive, from elsewhere (KVSP over HTTP, recomputation), or None.
        The reference has no such source. Recovered Data is the consumer's own: it is not held against the
        publication's digests (a recomputation need not be bit-identical)."""
        return None

    def duplicate_problem(self, track: str, loc: Location, first: bytes, again: bytes) -> str | None:
        """A Location delivered twice: with a different payload the track is malformed (nothing of it is
        used); an identical repeat is used once."""
        if first == again:
            return None
        return f"{track} {loc}: delivered twice with different payloads: the track is malformed [{REQ['malformed']}]"

    def select_tracks(self, tracks: Sequence[DataTrack]) -> list[DataTrack]:
        """The tracks of one segment to use: its raw "k" and "v" pair, else its raw "kv" track, never a mix
        (none when the segment offers neither)."""
        data = [t for t in tracks if t.codec == "raw"]
        pair = [t for t in data if t.component in ("k", "v")]
        if {t.component for t in pair} == {"k", "v"}:
            return sorted(pair)
        return [t for t in data if t.component == "kv"][:1]

    def retrieval_mode(self, complete: Sequence[bool]) -> str:
        """"fetch" (Retrieval of Completed Caches) when every needed segment (``complete``: one per needed track,
        in plan order) is complete, else "live" (Retrieval during Production); ``options.mode`` overrides."""
        if self.options.mode in ("live", "fetch"):
            return self.options.mode
        return "fetch" if all(complete) else "live"

    async def wait_for_change(self, changed: asyncio.Event, bound: float) -> bool:
        """Wait at most ``bound`` seconds for the next event of an attempt (an object, a stream, PUBLISH_DONE);
        False when none came (no progress: the stall bound)."""
        try:
            await asyncio.wait_for(changed.wait(), bound)
        except TimeoutError:
            return False
        return True

    def may_combine(self, a: Manifest | None, b: Manifest | None) -> bool:
        """Objects of two publications may share a segment only if both manifests say deterministic."""
        return a is not None and b is not None and a.deterministic and b.deterministic

    # ---- the procedure -----------------------------------------------------------------------------------

    def wanted_layers(self, layers: int) -> list[int]:
        first, last = self.options.layers if self.options.layers is not None else (0, layers - 1)
        return [layer for layer in range(max(0, first), min(last, layers - 1) + 1)]

    async def run(self) -> ConsumeResult:
        started = time.monotonic()
        self._deadline = started + self.options.budget
        wanted: list[int] | None = None
        gave_up = False
        try:
            # A second round retries layers that were missing (not rejected): a relay that timed out
            # filling a range upstream has usually cached more of it by then.
            for _ in range(2):
                done = False
                for relay in self.options.relays:
                    if self.remaining() <= 0:
                        break
                    done = await self._use_relay(relay)
                    wanted = self._wanted_so_far() or wanted
                    if done:
                        break
                if done or not any(a.retryable for a in self.attempts) or self.remaining() <= 0:
                    break
                for a in self.attempts:
                    a.retryable = set()
        except Exception as exc:  # a bug or a network error: report what was got, never a good poisoned layer
            log.warning("consumer: %r", exc)
            self.attempts.append(_AttemptResult("", b"", None, (), outcome=f"error: {exc!r}"))
        if self.remaining() <= 0:
            gave_up = True
        return self._result(wanted, time.monotonic() - started, gave_up)

    def _wanted_so_far(self) -> list[int] | None:
        for a in self.attempts:
            if a.manifest is not None:
                return self.wanted_layers(a.manifest.layers)
        return None

    async def _use_relay(self, relay: str) -> bool:
        """Discover and try publications through one relay; True once a complete combination exists."""
        config = SessionConfig(role=Role.CLIENT, implementation="kvconform-consumer/0.1")
        try:
            client = await mc.connect(relay, config=config, timeout=min(CONNECT_TIMEOUT, max(0.1, self.remaining())))
        except (OSError, TimeoutError, mc.SessionEnded, ValueError) as exc:
            self.attempts.append(_AttemptResult(relay, b"", None, (), outcome=f"cannot connect: {exc}"))
            return False
        try:
            found = await self._discover(client, relay)
            if found is None:
                return False
            anchor, nsub = found
            tried: set[bytes] = set()
            while self.remaining() > 0:
                pubs = [p for p in _announced(nsub) if p not in tried]
                if not pubs:
                    break
                for pub in pubs:
                    tried.add(pub)
                    if self._complete_with(pub):
                        continue
                    await self._attempt(client, relay, KvcsNamespace(self.identity.scope_id, self.identity.compat_id,
                                                                     anchor, pub))
                    if self._selection()[2]:
                        return True
                    if self.remaining() <= 0:
                        break
            return self._selection()[2]
        finally:
            with contextlib.suppress(Exception):
                await client.close(SessionError.NO_ERROR, "consumer done", timeout=0.2)

    async def _discover(self, client: mc.MoqtClient,
                        relay: str) -> tuple[bytes, mc.NamespaceSubscription] | None:
        """SUBSCRIBE_NAMESPACE for the longest prefix, then shorter ones; the first with publications."""
        for anchor in self.discovery_anchors():
            if self.remaining() <= 0:
                return None
            prefix = TrackNamespace((KVCS_TAG, self.identity.scope_id, self.identity.compat_id, anchor))
            try:
                nsub = await client.subscribe_namespace(prefix, auth=self.options.auth(),
                                                        timeout=min(REQUEST_TIMEOUT, max(0.1, self.remaining())))
            except mc.RequestRejected as exc:
                self.attempts.append(_AttemptResult(relay, b"", None, (),
                                                    outcome=f"SUBSCRIBE_NAMESPACE refused: {exc}"))
                continue
            notices: list[tuple[str, TrackNamespace]] = []
            with contextlib.suppress(TimeoutError, mc.SessionEnded):
                notices.append(await nsub.next(timeout=min(self.options.discovery_window, max(0.01, self.remaining()))))
                while True:  # the rest of the publications known now follow back to back
                    notices.append(await nsub.next(timeout=DISCOVERY_DRAIN))
            for notice in notices:
                nsub.queue.put_nowait(notice)  # read again by _announced
            if notices:
                return anchor, nsub
            nsub.cancel()  # before the shorter prefix (PREFIX_OVERLAP, profile §12)
        return None

    def _complete_with(self, pub: bytes) -> bool:
        """This publication already gave every wanted layer (through another relay)."""
        wanted = self._wanted_so_far()
        if wanted is None:
            return False
        got = {layer for a in self.attempts if a.pub == pub for layer in a.layers}
        return set(wanted) <= got

    # ---- one attempt: one publication through one relay -----------------------------------------------------

    async def _attempt(self, client: mc.MoqtClient, relay: str, ns: KvcsNamespace) -> None:
        result = _AttemptResult(relay, ns.pub_id, None, ())
        self.attempts.append(result)
        attempt = _Attempt(self, client, relay, ns, result)
        try:
            await attempt.run()
        except _Abandon as exc:
            result.outcome = f"abandoned: {exc}"
        except (mc.SessionEnded, mc.RequestRejected, TimeoutError) as exc:
            result.outcome = f"failed: {type(exc).__name__}: {exc}"
        finally:
            attempt.close()
        log.info("consumer: publication %s via %s: %s, %d layers", ns.pub_id.hex(), relay, result.outcome,
                 len(result.layers))

    def _emit(self, ready: LayerReady) -> None:
        if self._emitted_pub is None:
            self._emitted_pub = ready.publication
        self.ready.setdefault(ready.layer, asyncio.Event()).set()
        if self.on_ready is not None:
            self.on_ready(ready)

    # ---- combining attempts ---------------------------------------------------------------------------------

    def _selection(self) -> tuple[_AttemptResult | None, dict[int, LayerReady], bool]:
        """The best publication (most verified layers; same publication through several relays counts as
        one), completed from other publications only where ``may_combine`` allows it."""
        by_pub: dict[tuple[bytes, tuple[tuple[int, int], ...]], dict[int, LayerReady]] = {}
        first: dict[tuple[bytes, tuple[tuple[int, int], ...]], _AttemptResult] = {}
        for a in self.attempts:
            if a.manifest is None or not a.plan:
                continue
            key = (a.pub, a.plan)
            first.setdefault(key, a)
            merged = by_pub.setdefault(key, {})
            for layer, ready in a.layers.items():
                merged.setdefault(layer, ready)
        if not by_pub:
            return None, {}, False
        best_key = max(by_pub, key=lambda k: len(by_pub[k]))  # ties: the first tried (dicts keep order)
        best = first[best_key]
        layers = dict(by_pub[best_key])
        for key, got in by_pub.items():
            if key == best_key or key[1] != best_key[1] or not self.may_combine(best.manifest, first[key].manifest):
                continue
            for layer, ready in got.items():
                layers.setdefault(layer, ready)
        assert best.manifest is not None
        complete = set(self.wanted_layers(best.manifest.layers)) <= set(layers)
        return best, layers, complete

    def _result(self, wanted: list[int] | None, elapsed: float, gave_up: bool) -> ConsumeResult:
        best, layers, _ = self._selection()
        if wanted is None:
            wanted = self.wanted_layers(int(self.identity.compat["layers"]))
        out: dict[int, bytes | None] = {}
        reasons: dict[int, str] = {}
        for layer in wanted:
            ready = layers.get(layer)
            out[layer] = ready.digest if ready is not None else None
            if ready is None:
                why = [a.reasons[layer] for a in self.attempts if layer in a.reasons]
                reasons[layer] = why[-1] if why else ("budget exhausted" if gave_up else "no usable publication")
        pubs = [{"publication": a.pub.hex(), "relay": a.relay, "outcome": a.outcome} for a in self.attempts]
        return ConsumeResult(best.pub if best is not None else None, out, list(self.rejected), pubs,
                             {layer: r.publication for layer, r in layers.items() if layer in out}, reasons,
                             list(best.plan) if best is not None else [], elapsed, gave_up,
                             best.mode if best is not None else None)


class _Attempt:
    """Retrieval of one publication through one relay session (manifest, data tracks, verification)."""

    def __init__(self, consumer: Consumer, client: mc.MoqtClient, relay: str, ns: KvcsNamespace,
                 result: _AttemptResult) -> None:
        self.c = consumer
        self.client = client
        self.relay = relay
        self.ns = ns
        self.result = result
        self.changed = asyncio.Event()
        self.manifest: Manifest | None = None
        self.manifest_group = -1
        self.manifest_track = MANIFEST_COSE
        self.authenticated = False
        self.manifest_sub: _WatchedSubscription | None = None
        self.manifest_processed = 0
        self.broken: str | None = None  # a later manifest version made the publication unusable
        self.tracks: list[_TrackState] = []
        self.wanted: list[int] = []
        self.layer_state: dict[int, str] = {}  # "ready" | "lost"

    def _touch(self) -> None:
        self.changed.set()

    def _reject(self, track: str, group: int, obj: int, reason: str) -> None:
        self.c.rejected.append(Rejection(track, group, obj, reason, self.ns.pub_id.hex(), self.relay))

    def close(self) -> None:
        for h in [self.manifest_sub, *(t.handle for t in self.tracks)]:
            if h is not None and self.client.session.closed is None:
                with contextlib.suppress(Exception):
                    h.cancel()

    async def _wait_change(self, bound: float) -> bool:
        """Wait for any event of this attempt (bounded); False on timeout."""
        self.changed.clear()
        return await self.c.wait_for_change(self.changed, max(0.01, bound))

    # ---- manifest ---------------------------------------------------------------------------------------

    async def _subscribe(self, name: bytes, params: Mapping[str, Any]) -> _WatchedSubscription:
        built = mc.build_parameters(auth=self.c.options.auth(), **params)
        sub = _WatchedSubscription(self.client, self.client.session.subscribe(self.ns.track_namespace(), name, built),
                                   self._touch)
        await sub.wait_ok(min(REQUEST_TIMEOUT, max(0.1, self.c.remaining())))
        return sub

    async def _open_manifest_track(self) -> None:
        params = self.c.manifest_subscribe_parameters()
        try:
            self.manifest_sub = await self._subscribe(MANIFEST_COSE, params)
            return
        except mc.RequestRejected as exc:
            if exc.code != RequestErrorCode.DOES_NOT_EXIST:
                raise _Abandon(f"SUBSCRIBE manifest.cose refused: {exc}") from exc
        if self.c.options.authenticity:
            raise _Abandon(f"no manifest.cose and producer authenticity is required [{REQ['cose']}]")
        self.manifest_track = MANIFEST
        try:
            self.manifest_sub = await self._subscribe(MANIFEST, params)
        except mc.RequestRejected as exc:
            raise _Abandon(f"neither manifest.cose nor manifest: {exc}") from exc

    def _take_manifests(self) -> None:
        """Open, parse and check every new manifest version (Object 0 of each new Group)."""
        sub = self.manifest_sub
        if sub is None:
            return
        new = sub.objects[self.manifest_processed:]
        self.manifest_processed = len(sub.objects)
        name = self.manifest_track.decode()
        for obj in new:
            if obj.end_of_range is not None or obj.status != ObjectStatus.NORMAL or not obj.payload:
                continue
            if obj.location.group <= self.manifest_group:
                continue
            try:
                raw = self.c.open_manifest(self.manifest_track, obj.payload)
                manifest = parse_manifest(raw)
            except (cose.CoseError, KvcsError) as exc:
                self._reject(name, obj.location.group, obj.location.object, f"{exc}")
                self.broken = f"manifest version {obj.location.group}: {exc}"
                continue
            problems = self.c.manifest_problems(manifest, self.ns)
            if problems:
                self._reject(name, obj.location.group, obj.location.object, "; ".join(problems))
                self.broken = f"manifest version {obj.location.group}: {problems[0]}"
                continue
            self.manifest = manifest
            self.manifest_group = obj.location.group
            self.authenticated = self.manifest_track == MANIFEST_COSE and bool(self.c.options.producer_keys)

    # ---- planning ---------------------------------------------------------------------------------------

    def _plan(self, manifest: Manifest) -> list[_Needed]:
        """The segments whose Block Keys are the consumer's, contiguous from segment 0, and their tracks."""
        keys = self.c.keys
        limit = len(keys) if self.c.options.blocks is None else min(len(keys), self.c.options.blocks)
        out: list[_Needed] = []
        for seg in sorted(manifest.segments, key=lambda s: s.segment):
            if seg.first_block >= limit:
                break
            own = keys[seg.first_block:seg.first_block + seg.blocks]
            # A segment longer than the prompt cannot be confirmed (its block_keys_sha256 covers more).
            if len(own) < seg.blocks or block_keys_sha256(own) != seg.block_keys_sha256:
                break
            n = min(seg.blocks, limit - seg.first_block)
            tracks = [parse_track_name(t.encode()) for t in seg.tracks]
            chosen = self.c.select_tracks([t for t in tracks if isinstance(t, DataTrack)])
            if not chosen:
                break
            out += [_Needed(seg.segment, t, n) for t in chosen]
        return out

    def _segment(self, number: int) -> SegmentEntry:
        assert self.manifest is not None
        seg = self.manifest.segment(number)
        assert seg is not None
        return seg

    # ---- data ---------------------------------------------------------------------------------------------

    async def _open_data(self, mode: str) -> None:
        peer_ranges = 0
        if self.client.session.peer_setup is not None:
            peer_ranges = self.client.session.peer_setup.max_filter_ranges or 0
        first, last = self.wanted[0], self.wanted[-1]
        for ts in self.tracks:
            name = ts.needed.track.name
            try:
                if mode == "live":
                    ts.handle = await self._subscribe(name, self.c.data_subscribe_parameters())
                else:
                    seg = self._segment(ts.needed.segment)
                    params = self.c.fetch_parameters(first, last, ts.needed.blocks, seg.blocks, peer_ranges)
                    built = mc.build_parameters(auth=self.c.options.auth(), **params)
                    ts.handle = _WatchedFetch(self.client, self.client.session.fetch(self.ns.track_namespace(), name,
                                                                                     built), self._touch)
            except mc.RequestRejected as exc:
                ts.failed = f"{ts.name}: {exc}"

    def _take_objects(self, ts: _TrackState) -> None:
        h = ts.handle
        if h is None:
            return
        if isinstance(h, _WatchedFetch) and h.answer.done() and not h.answer.cancelled():
            exc = h.answer.exception()
            if exc is not None or not isinstance(h.answer.result(), FetchOk):
                ts.failed = f"{ts.name}: FETCH refused ({exc or h.answer.result()})"
        new = h.objects[ts.processed:]
        ts.processed = len(h.objects)
        seg = self._segment(ts.needed.segment)
        for obj in new:
            loc = obj.location
            prev = ts.last_on_stream.get(obj.stream_id, Location(0, 0))
            ts.last_on_stream[obj.stream_id] = loc
            if obj.end_of_range is not None:
                ts.gaps.append((prev, loc))  # everything after the previous record, up to this one
                continue
            if obj.status == ObjectStatus.END_OF_GROUP:
                ts.group_end[loc.group] = loc.object
                continue
            if obj.status != ObjectStatus.NORMAL:
                continue
            if loc.group not in self.wanted or loc.object >= ts.needed.blocks:
                ts.excess += 1  # outside what is needed: discarded
                continue
            seen = ts.payloads.get(loc)
            if seen is not None:
                malformed = self.c.duplicate_problem(ts.name, loc, seen, obj.payload)
                if malformed is not None:
                    ts.malformed = malformed
                    self._reject(ts.name, loc.group, loc.object, malformed)
                else:
                    ts.violations.append(f"{ts.name} {loc} delivered twice (used once)")
                continue
            ts.payloads[loc] = obj.payload
            ts.touched.add(loc.group)
            problems = self.c.object_problems(ts.needed, seg, loc, obj.payload)
            if problems:
                reason = "; ".join(problems)
                ts.lost[loc] = reason
                self._reject(ts.name, loc.group, loc.object, reason)
                continue
            ts.data[loc] = obj.payload[HEADER_LEN:]
            ts.digests[loc] = obj.payload[36:HEADER_LEN]

    def _evaluate(self) -> bool:
        """Update every wanted layer; emit the newly ready ones. True when none is pending any more."""
        assert self.manifest is not None
        malformed = next((ts.malformed for ts in self.tracks if ts.malformed is not None), None)
        if malformed is not None:
            # Nothing of a malformed track is used, not even layers already reported ready (retracted).
            for layer in self.wanted:
                if self.layer_state.get(layer) != "lost":
                    self.layer_state[layer] = "lost"
                    self.result.layers.pop(layer, None)
                    self.result.reasons[layer] = malformed
            return True
        pending = False
        # A track that can still deliver everything it has not: a layer none of whose Objects came yet
        # is pending on it without looking at each Location (per wake this was layers x blocks).
        all_quiet = all(ts.failed is None and not ts.gaps and not ts.lost and not ts.ended() and not ts.fill_done()
                        for ts in self.tracks)
        for layer in self.wanted:
            if layer in self.layer_state:
                continue
            if all_quiet and not any(layer in ts.touched or layer in ts.group_end for ts in self.tracks):
                pending = True
                continue
            state, reason = self._layer(layer)
            if state == "pending":
                pending = True
            elif state == "lost":
                self.layer_state[layer] = "lost"
                self.result.reasons[layer] = reason
                if not any(Location(layer, o) in ts.lost for ts in self.tracks for o in range(ts.needed.blocks)):
                    self.result.retryable.add(layer)
            else:
                self.layer_state[layer] = "ready"
                ready = self._assemble(layer)
                self.result.layers[layer] = ready
                self.c._emit(ready)
        return not pending

    def _layer(self, layer: int) -> tuple[str, str]:
        pending = False
        for ts in self.tracks:
            if ts.malformed is not None:
                return "lost", ts.malformed
            seg = self._segment(ts.needed.segment)
            for o in range(ts.needed.blocks):
                loc = Location(layer, o)
                if loc in ts.lost:
                    return "lost", ts.lost[loc]
                if loc not in ts.data:
                    why = ts.missing_reason(loc)
                    if why is None and ts.failed is not None:
                        why = ts.failed
                    if why is None:
                        pending = True
                        continue
                    data = self.c.recover_block(ts.needed.track, seg, loc)
                    if data is None:
                        return "lost", why
                    ts.data[loc] = data
                    ts.recovered.add(loc)
                if loc in ts.recovered:
                    continue
                problem = self.c.listed_digest_problem(ts.name, seg, loc, ts.digests[loc], self.authenticated)
                if problem == "pending":
                    if seg.complete and seg.digest_of(ts.name, loc.group, loc.object) is None:
                        reason = (f"{ts.name} {loc}: the complete segment's manifest lists no signed Data Digest for "
                                  f"it [{REQ['digests']}]")
                        ts.lost[loc] = reason
                        self._reject(ts.name, loc.group, loc.object, reason)
                        return "lost", reason
                    pending = True
                elif problem is not None:
                    ts.lost[loc] = problem
                    self._reject(ts.name, loc.group, loc.object, problem)
                    return "lost", problem
        return ("pending", "") if pending else ("ready", "")

    def _assemble(self, layer: int) -> LayerReady:
        blocks: list[bytes] = []
        by_segment: dict[int, list[_TrackState]] = {}
        for ts in self.tracks:
            by_segment.setdefault(ts.needed.segment, []).append(ts)
        for _, states in sorted(by_segment.items()):
            for o in range(states[0].needed.blocks):
                loc = Location(layer, o)
                blocks.append(b"".join(ts.data[loc] for ts in sorted(states, key=lambda s: s.needed.track.component)))
        return LayerReady(layer, self.ns.pub_id, self.relay, layer_digest(blocks), tuple(blocks))

    # ---- the attempt loop ----------------------------------------------------------------------------------

    async def run(self) -> None:
        await self._open_manifest_track()
        stall = self.c.options.stall_timeout
        while self.manifest is None:
            self._take_manifests()
            if self.broken is not None:
                raise _Abandon(self.broken)
            if self.manifest is not None:
                break
            if self.c.remaining() <= 0 or not await self._wait_change(min(stall, self.c.remaining())):
                raise _Abandon("no manifest version arrived")
        manifest = self.manifest
        self.result.manifest = manifest
        self.wanted = self.c.wanted_layers(manifest.layers)
        needed = self._plan(manifest)
        if not needed or not self.wanted:
            raise _Abandon("the manifest lists no segment this consumer can use")
        self.tracks = [_TrackState(n) for n in needed]
        self.result.plan = tuple(sorted({(n.segment, n.blocks) for n in needed}))
        have = {layer for a in self.c.attempts if a is not self.result and a.pub == self.ns.pub_id
                and a.plan == self.result.plan for layer in a.layers}
        self.wanted = [layer for layer in self.wanted if layer not in have]  # a retry asks only for the rest
        if not self.wanted:
            self.result.outcome = "complete"
            return
        mode = self.c.retrieval_mode([self._segment(n.segment).complete for n in needed])
        self.result.mode = mode
        await self._open_data(mode)
        while True:
            self._take_manifests()
            if self.broken is not None:
                for layer in self.wanted:
                    self.result.layers.pop(layer, None)  # a publication that turned bad gives nothing
                raise _Abandon(self.broken)
            for ts in self.tracks:
                self._take_objects(ts)
            if self._evaluate():
                lost = [layer for layer, s in self.layer_state.items() if s == "lost"]
                self.result.outcome = "complete" if not lost else f"{len(lost)} layers missing or rejected"
                return
            if self.c.remaining() <= 0:
                self.result.outcome = "budget exhausted"
                self._mark_pending("budget exhausted while waiting for it")
                return
            if not await self._wait_change(min(stall, self.c.remaining())):
                self.result.outcome = f"stalled ({stall} s without progress)"
                self._mark_pending(f"nothing arrived for {stall} s (stalled)")
                return

    def _mark_pending(self, reason: str) -> None:
        for layer in self.wanted:
            if layer not in self.layer_state:
                self.layer_state[layer] = "lost"
                self.result.reasons[layer] = reason  # not retried: waiting again would spend the budget twice


def _announced(nsub: mc.NamespaceSubscription) -> list[bytes]:
    """Publication IDs announced so far (queued NAMESPACE notices, in order; withdrawn ones skipped)."""
    out: list[bytes] = []
    while not nsub.queue.empty():
        kind, suffix = nsub.queue.get_nowait()
        if len(suffix.fields) != 1 or len(suffix.fields[0]) != 16:
            continue  # not a KVCS publication under this prefix
        pub = suffix.fields[0]
        if kind == "namespace" and pub not in out:
            out.append(pub)
        elif kind == "done" and pub in out:
            out.remove(pub)
    return out


def _cose_payload_unverified(data: bytes) -> bytes:
    """The payload of a COSE_Sign1 when no producer key is known (authenticity not required)."""
    return cose.unverified_payload(data)


def load_producer_keys(items: Iterable[str]) -> dict[bytes, str]:
    """``kid=PATH`` (a PEM file) or ``kid=PEM`` items -> kid -> public PEM (empty items are skipped: a
    driver's ``{producer_key}`` placeholder is empty when a scenario has no producer key)."""

    out: dict[bytes, str] = {}
    for item in items:
        if not item:
            continue
        kid, sep, value = item.partition("=")
        if not sep or not kid:
            raise ValueError(f"--producer-key {item!r}: expected kid=PEM-file")
        text = value if "-----BEGIN" in value else Path(value).read_text("utf-8")
        cose.load_public_key(text)  # refuse a key that does not load, up front
        out[kid.encode()] = text
    return out
