"""The sans-I/O core of the reference KVCS Original Publisher (KVCS "Object Model Mapping", "Manifest Track",
"Publisher Behavior"; issue 24 item 1).

The core decides what is published, in which order, and when a FETCH is refused. It does no I/O and reads no
clock: it emits *commands* (``PublishObject``, ``EndTrack``) to its ``sink`` (by default its ``outbox`` list; the
asyncio adapter, ``kvconform.kvcs.publisher.KvcsPublisher``, applies each to its MOQT client at once, so the order
of objects and progress reports is the core's), and the publication is a generator of *steps* the adapter waits
on: ``SegmentAdded`` (the hook a subclass may hold a segment in) and ``Pause`` (the per-layer computation time of
live production). The fetch limit's only timer is a deadline the core computes from the ``now`` it is given.

What it publishes, in this order, for each segment of ``spec.segment_layout()`` (segment 0, then every
appended-token segment): a manifest version listing the new segment (for segment 0 that is the first
object of the publication); then layer by layer, for each data track (k, v and with ``kv_track`` kv), the
block objects of Group g = layer in Subgroup 0 in ascending Object ID with Publisher Priority
floor(128 * g / L), and End of Group after the last; a new manifest version after every ``manifest_every``
completed layers; End of Track at {L, 0} on every track of the segment (moqt-d22-profile section 13 #11);
a manifest version marking the segment complete. Manifest versions are Object 0 of Groups 0, 1, 2, ...
with Publisher Priority 0. Every track carries the Track Property MAX_CACHE_DURATION and no delivery
timeout.

With ``fetch_limit`` N (KVCS "Security Considerations": "publishers SHOULD limit the number of concurrent
fetches per subscriber") at most N FETCHes of the session are in progress at once: ``admit_fetch`` counts one
from its arrival until ``release_fetch`` (its data and FIN were sent, or it was refused or reset) or its
deadline (``FETCH_SLOT_TIMEOUT`` after arrival) passes; one arriving while N are in progress is refused.

Each behaviour is one overridable method (``auth_tokens``, ``announced_namespace``, ``track_properties``,
``priority``, ``manifest_priority``, ``layer_order``, ``object_payload``, ``publish_layer``, ``end_track``,
``manifest_due``, ``build_manifest``, ``manifest_payload``, ``publish_manifest``, ``fetch_refused``): the mutant
publishers in tests/mutants/kvcs/publisher.py override one each.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from kvconform.kvcs.cose import ProducerKey, sign
from kvconform.kvcs.namespace import KvcsNamespace, new_publication_id
from kvconform.kvcs.tracks import MANIFEST, MANIFEST_COSE, DataTrack
from kvconform.moqt.data import ObjectStatus
from kvconform.moqt.structures import AuthToken, KeyValuePair, PropertyType, TrackNamespace

if TYPE_CHECKING:
    from kvconform.kvcs.content import CacheSpec, SegmentLayout
    from kvconform.kvcs.manifest import Manifest

__all__ = ["DEFAULT_CACHE_DURATION_MS", "FETCH_SLOT_TIMEOUT", "MANIFEST_EVERY", "MANIFEST_PRIORITY", "Command",
           "EndTrack", "Pause", "Progress", "ProgressHook", "PublishObject", "PublisherCore", "SegmentAdded", "Step",
           "TrackOut"]

DEFAULT_CACHE_DURATION_MS = 3_600_000  # one hour: the retention the harness's scopes allow
MANIFEST_PRIORITY = 0  # "The manifest track uses Publisher Priority 0."
MANIFEST_EVERY = 8  # "a new manifest version at least every eight completed layers"
# A fetch whose data cannot leave (a subscriber that grants no flow-control credit) stops counting against
# ``fetch_limit`` after this long, so one stalled fetch never blocks a session for good.
FETCH_SLOT_TIMEOUT = 120.0


@dataclass(frozen=True)
class Progress:
    """What the publication just did: ``kind`` "manifest" (``version``), "layer" (``segment``, ``layer``),
    "segment" (``segment`` complete) or "done"."""

    kind: str
    segment: int = 0
    layer: int = 0
    version: int = 0


ProgressHook = Callable[[Progress], None]


# ---- commands (what the adapter does to its MOQT tracks) and steps (what it waits on) ---------------------


@dataclass(frozen=True)
class PublishObject:
    """Store and forward one object of ``track`` (a status object when ``status`` is not Normal)."""

    track: bytes
    group: int
    object_id: int
    payload: bytes = b""
    subgroup: int = 0
    priority: int | None = None
    status: int = ObjectStatus.NORMAL
    end_subgroup: bool = False


@dataclass(frozen=True)
class EndTrack:
    """End of Track on ``track`` (profile section 13 #11); the track stays served while the session lives."""

    track: bytes


Command = PublishObject | EndTrack


@dataclass(frozen=True)
class SegmentAdded:
    """The manifest version listing ``segment`` is out: the adapter awaits its ``segment_added`` hook."""

    segment: SegmentLayout


@dataclass(frozen=True)
class Pause:
    """A layer is published: resume ``seconds`` later (live production computes one layer at a time)."""

    seconds: float


Step = SegmentAdded | Pause


@dataclass(eq=False)
class TrackOut:
    """One track as the core publishes to it: each call is a command to ``emit``."""

    name: bytes
    emit: Callable[[Command], None]

    def publish_object(self, group: int, object_id: int, payload: bytes = b"", *, subgroup: int = 0,
                       priority: int | None = None, status: int = ObjectStatus.NORMAL,
                       end_subgroup: bool = False) -> None:
        self.emit(PublishObject(self.name, group, object_id, payload, subgroup, priority, status, end_subgroup))

    def end_track(self) -> None:
        self.emit(EndTrack(self.name))


class PublisherCore:
    """One publication of the cache ``spec`` describes (see the module docstring); no I/O, no clock."""

    def __init__(self, spec: CacheSpec, *, pub_id: bytes | None = None, kv_track: bool = False,
                 deterministic: bool = False, cache_duration_ms: int = DEFAULT_CACHE_DURATION_MS,
                 manifest_every: int = MANIFEST_EVERY, signing_key: ProducerKey | None = None,
                 layer_interval: float = 0.0, fetch_limit: int | None = None) -> None:
        if manifest_every < 1:
            raise ValueError(f"manifest_every: {manifest_every}, expected >= 1")
        if fetch_limit is not None and fetch_limit < 1:
            raise ValueError(f"fetch_limit: {fetch_limit}, expected >= 1 (or None: no limit)")
        self.spec = spec
        self.namespace: KvcsNamespace = spec.namespace(pub_id if pub_id is not None else new_publication_id())
        self.kv_track = kv_track
        self.deterministic = deterministic
        self.cache_duration_ms = cache_duration_ms
        self.manifest_every = manifest_every
        self.layer_interval = layer_interval  # seconds of simulated computation per layer (live production)
        signing = spec.signing
        if signing_key is None and signing is not None:
            signing_key = ProducerKey.from_pem(signing["alg"], signing["kid"].encode("utf-8"), signing["private_pem"])
        self.signing_key = signing_key
        self.manifest_track = MANIFEST_COSE if signing_key is not None else MANIFEST
        self.layout: list[SegmentLayout] = list(spec.segment_layout())
        self.completed: dict[bytes, int] = {}  # data track name -> completed layers
        self.added: list[int] = []  # segments listed in the manifest so far
        self.manifest_versions = 0
        self.fetch_limit = fetch_limit
        self._fetch_deadlines: dict[object, float] = {}  # FETCHes in progress -> when they stop counting
        self.outbox: list[Command] = []  # commands not yet taken, when no sink is set
        self.sink: Callable[[Command], None] | None = None
        self.outputs: dict[bytes, TrackOut] = {name: TrackOut(name, self._emit)
                                               for name in (self.manifest_track, *(t.name for t in self.tracks()))}
        self._progress: ProgressHook | None = None

    def _emit(self, command: Command) -> None:
        if self.sink is not None:
            self.sink(command)
        else:
            self.outbox.append(command)

    # -- what is published (one method per behaviour) ---------------------------------------------------

    def tracks(self, segment: int | None = None) -> list[DataTrack]:
        """The data tracks of one segment (k, v, and kv with ``kv_track``), or of all segments."""
        segments = [s.segment for s in self.layout] if segment is None else [segment]
        return [t for s in segments for t in self.spec.data_tracks(s, kv=self.kv_track)]

    def auth_tokens(self, token: bytes | None) -> tuple[AuthToken, ...]:
        """The authorization PUBLISH_NAMESPACE carries: the scope token as USE_VALUE, Token Type 0."""
        return () if token is None else (AuthToken.use_value(token),)

    def announced_namespace(self) -> TrackNamespace:
        """The full five-field namespace (KVCS "Publisher Behavior": announce the full namespace)."""
        return self.namespace.track_namespace()

    def track_properties(self, name: bytes) -> tuple[KeyValuePair, ...]:
        """MAX_CACHE_DURATION (the scope's retention); never a delivery timeout (KVCS "Publisher Behavior")."""
        return (KeyValuePair(PropertyType.MAX_CACHE_DURATION, self.cache_duration_ms),)

    def priority(self, layer: int) -> int:
        """Publisher Priority of Group ``layer``: floor(128 * g / L), earlier layers first."""
        return 128 * layer // self.spec.layers

    def manifest_priority(self) -> int:
        """Publisher Priority of every manifest version: 0."""
        return MANIFEST_PRIORITY

    def layer_order(self) -> Sequence[int]:
        """The order layers are produced and published in: 0 .. L-1 (Group IDs increase with time)."""
        return range(self.spec.layers)

    def object_payload(self, track: DataTrack, layer: int, object_id: int) -> bytes:
        """The KVO1 payload of block ``object_id`` of ``layer`` (the test-content convention)."""
        return self.spec.object_payload(track, layer, object_id)

    def publish_layer(self, local: TrackOut, track: DataTrack, layer: int, blocks: int) -> None:
        """Group ``layer``: Objects 0..blocks-1 in Subgroup 0, ascending, then End of Group (one stream)."""
        prio = self.priority(layer)
        for oid in range(blocks):
            local.publish_object(layer, oid, self.object_payload(track, layer, oid), subgroup=0, priority=prio)
        local.publish_object(layer, blocks, subgroup=0, priority=prio, status=ObjectStatus.END_OF_GROUP)

    def end_track(self, local: TrackOut) -> None:
        """End of Track at {L, 0} on its own subgroup stream (profile section 13 #11)."""
        local.end_track()

    def manifest_due(self, layers_since_version: int) -> bool:
        """A new version after every ``manifest_every`` completed layers (KVCS "Manifest Track")."""
        return layers_since_version >= self.manifest_every

    def build_manifest(self) -> Manifest:
        """The manifest as of now: the segments added so far, their completed groups and digests."""
        return self.spec.manifest(self.completed, kv=self.kv_track, deterministic=self.deterministic,
                                  segments_added=len(self.added))

    def manifest_payload(self, manifest: Manifest) -> bytes:
        """The JSON, or with a producer key a COSE_Sign1 over it (``kid`` in the protected header)."""
        body = manifest.to_json()
        return body if self.signing_key is None else sign(body, self.signing_key)

    def publish_manifest(self) -> None:
        """A new manifest version: Object 0 of the next Group, Publisher Priority 0, its stream FINed."""
        local = self.outputs[self.manifest_track]
        version = self.manifest_versions
        local.publish_object(version, 0, self.manifest_payload(self.build_manifest()), subgroup=0,
                             priority=self.manifest_priority(), end_subgroup=True)
        self.manifest_versions += 1
        self._report(Progress("manifest", version=version))

    def fetch_refused(self, active: int) -> bool:
        """Whether a FETCH arriving while ``active`` others are in progress is refused: at the declared limit."""
        return self.fetch_limit is not None and active >= self.fetch_limit

    # -- the fetch limit ----------------------------------------------------------------------------------

    @property
    def fetches_active(self) -> int:
        """FETCHes of the session in progress (see ``admit_fetch``)."""
        return len(self._fetch_deadlines)

    def admit_fetch(self, key: object, now: float) -> float | None:
        """A FETCH (``key``: its request stream) arrived at ``now``: None when it is refused (``fetch_refused``),
        else the deadline past which it stops counting; it counts until ``release_fetch`` or that deadline."""
        if self.fetch_refused(self.fetches_active):
            return None
        deadline = now + FETCH_SLOT_TIMEOUT
        self._fetch_deadlines[key] = deadline
        return deadline

    def release_fetch(self, key: object) -> None:
        """The FETCH's data and FIN were sent (or it ended otherwise): it no longer counts (idempotent)."""
        self._fetch_deadlines.pop(key, None)

    def next_deadline(self) -> float | None:
        """The earliest timer the core wants (a FETCH that stops counting then), or None."""
        return min(self._fetch_deadlines.values(), default=None)

    def on_timer(self, now: float) -> None:
        """Release every FETCH whose deadline is at or before ``now``."""
        for key, deadline in list(self._fetch_deadlines.items()):
            if deadline <= now:
                del self._fetch_deadlines[key]

    # -- the publication -----------------------------------------------------------------------------------

    def publication(self) -> Iterator[Step]:
        """Every segment in turn (see the module docstring); the commands go out as the steps are taken."""
        for seg in self.layout:
            yield from self.segment_steps(seg)
        self._report(Progress("done"))

    def segment_steps(self, seg: SegmentLayout) -> Iterator[Step]:
        """One segment: manifest listing it, its layers with the manifest cadence, End of Track, manifest."""
        self.added.append(seg.segment)
        tracks = self.tracks(seg.segment)
        for track in tracks:
            self.completed[track.name] = 0
        self.publish_manifest()  # before the segment's first data object
        yield SegmentAdded(seg)
        since = 0
        for done, layer in enumerate(self.layer_order(), start=1):
            for track in tracks:
                self.publish_layer(self.outputs[track.name], track, layer, seg.blocks)
                self.completed[track.name] = done
            since += 1
            self._report(Progress("layer", segment=seg.segment, layer=layer))
            if self.manifest_due(since) and done < self.spec.layers:
                self.publish_manifest()
                since = 0
            # read after the report: a hook may lengthen this layer's computation (a scenario's pause)
            yield Pause(self.layer_interval)
        for track in tracks:
            self.end_track(self.outputs[track.name])
        self.publish_manifest()  # the segment is complete
        self._report(Progress("segment", segment=seg.segment))

    def _report(self, progress: Progress) -> None:
        if self._progress is not None:
            self._progress(progress)

    def describe(self) -> str:
        """One line naming the publication (what ``serve_publisher`` prints once it is published)."""
        objects = sum(s.blocks for s in self.layout) * self.spec.layers * len(self.tracks(0))
        return (f"published {self.namespace} tracks {self.manifest_track.decode()},"
                f"{','.join(str(t) for t in self.tracks())} layers {self.spec.layers} segments "
                f"{len(self.layout)} objects {objects} manifest versions {self.manifest_versions}")
