"""The reference KVCS Original Publisher (KVCS "Object Model Mapping", "Manifest Track", "Publisher Behavior").

Public API::

    pub = KvcsPublisher(spec, pub_id=None, kv_track=False, deterministic=False,
                        cache_duration_ms=DEFAULT_CACHE_DURATION_MS, manifest_every=8, signing_key=None,
                        layer_interval=0.0, fetch_limit=None)
    pub.namespace        # KvcsNamespace; the Publication ID is random unless ``pub_id`` is given
    pub.manifest_track   # b"manifest", or b"manifest.cose" when the spec has ``signing`` (or a key is given)
    pub.tracks()         # every DataTrack it serves, segment by segment
    await pub.publish(client, token, on_progress=None)
        # client: a connected kvconform.moqt.client.MoqtClient. Registers every track, PUBLISH_NAMESPACE of
        # the five-field namespace with ``token`` (AUTHORIZATION_TOKEN USE_VALUE, Token Type 0), then the
        # whole publication; returns once everything is published. The client keeps serving the tracks
        # (SUBSCRIBE with fill, FETCH, TRACK_STATUS) until it is closed.
    await pub.run(url, token, stop, on_published=None)   # connect, publish, serve until ``stop`` is set
    serve_publisher(relay_url, spec, token, stop, publisher=None, out=None) -> int   # the sync entry point

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
fetches per subscriber") it serves at most N FETCHes of its session at once: a FETCH counts from its arrival
until its data stream's data and FIN have been sent (or it was refused or reset), and one arriving while N
are in progress is refused with REQUEST_ERROR EXCESSIVE_LOAD (profile section 10.2) and a Retry Interval.

Each behaviour is one overridable method (``auth_tokens``, ``announced_namespace``, ``track_properties``,
``priority``, ``manifest_priority``, ``layer_order``, ``object_payload``, ``publish_layer``, ``end_track``,
``manifest_due``, ``build_manifest``, ``manifest_payload``, ``publish_manifest``, ``fetch_refused``, and the
async hook ``segment_added`` before a segment's first layer): the mutant publishers in
tests/mutants/kvcs/publisher.py override one each.
"""

from __future__ import annotations

import asyncio
import contextlib
import sys
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TextIO

from kvconform.kvcs.cose import ProducerKey, sign
from kvconform.kvcs.namespace import KvcsNamespace, new_publication_id
from kvconform.kvcs.tracks import MANIFEST, MANIFEST_COSE, DataTrack
from kvconform.loading import load_subclass
from kvconform.moqt.client import RequestRejected, SessionEnded, connect
from kvconform.moqt.data import ObjectStatus
from kvconform.moqt.errors import RequestErrorCode
from kvconform.moqt.messages import Fetch
from kvconform.moqt.session import Role, SessionConfig
from kvconform.moqt.structures import AuthToken, KeyValuePair, PropertyType, TrackNamespace

if TYPE_CHECKING:
    from kvconform.kvcs.content import CacheSpec, SegmentLayout
    from kvconform.kvcs.manifest import Manifest
    from kvconform.moqt.client import LocalTrack, MoqtClient
    from kvconform.moqt.session import RequestReceived

__all__ = ["DEFAULT_CACHE_DURATION_MS", "MANIFEST_EVERY", "MANIFEST_PRIORITY", "KvcsPublisher", "Progress",
           "load_publisher_class", "serve_publisher"]

DEFAULT_CACHE_DURATION_MS = 3_600_000  # one hour: the retention the harness's scopes allow
MANIFEST_PRIORITY = 0  # "The manifest track uses Publisher Priority 0."
MANIFEST_EVERY = 8  # "a new manifest version at least every eight completed layers"
CONNECT_TIMEOUT = 10.0
STOP_POLL = 0.2  # seconds: how often serve_publisher looks at its stop event
# A fetch whose data cannot leave (a subscriber that grants no flow-control credit) stops counting against
# ``fetch_limit`` after this long, so one stalled fetch never blocks a session for good.
FETCH_SLOT_TIMEOUT = 120.0
FETCH_RETRY_MS = 100  # the Retry Interval of an EXCESSIVE_LOAD refusal (sent as ms + 1, profile section 5)


@dataclass(frozen=True)
class Progress:
    """What ``publish`` just did: ``kind`` "manifest" (``version``), "layer" (``segment``, ``layer``),
    "segment" (``segment`` complete) or "done"."""

    kind: str
    segment: int = 0
    layer: int = 0
    version: int = 0


ProgressHook = Callable[[Progress], None]


class KvcsPublisher:
    """One publication of the cache ``spec`` describes (see the module docstring)."""

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
        self.local: dict[bytes, LocalTrack] = {}
        self.completed: dict[bytes, int] = {}  # data track name -> completed layers
        self.added: list[int] = []  # segments listed in the manifest so far
        self.manifest_versions = 0
        self.fetch_limit = fetch_limit
        self.fetches_active = 0  # FETCHes of the session in progress (see fetch_refused)
        self._progress: ProgressHook | None = None

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

    def publish_layer(self, local: LocalTrack, track: DataTrack, layer: int, blocks: int) -> None:
        """Group ``layer``: Objects 0..blocks-1 in Subgroup 0, ascending, then End of Group (one stream)."""
        prio = self.priority(layer)
        for oid in range(blocks):
            local.publish_object(layer, oid, self.object_payload(track, layer, oid), subgroup=0, priority=prio)
        local.publish_object(layer, blocks, subgroup=0, priority=prio, status=ObjectStatus.END_OF_GROUP)

    def end_track(self, local: LocalTrack) -> None:
        """End of Track at {L, 0} on its own subgroup stream (profile section 13 #11); the track stays
        served (fills and FETCH) while the session lives."""
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
        local = self.local[self.manifest_track]
        version = self.manifest_versions
        local.publish_object(version, 0, self.manifest_payload(self.build_manifest()), subgroup=0,
                             priority=self.manifest_priority(), end_subgroup=True)
        self.manifest_versions += 1
        self._report(Progress("manifest", version=version))

    def fetch_refused(self, active: int) -> bool:
        """Whether a FETCH arriving while ``active`` others are in progress is refused: at the declared limit."""
        return self.fetch_limit is not None and active >= self.fetch_limit

    def _limit_fetches(self, client: MoqtClient, event: RequestReceived) -> bool:
        """The session's request hook: counts FETCHes in progress and refuses one over the limit (True: handled
        here); everything else, and an admitted FETCH, the client serves as usual."""
        if self.fetch_limit is None or not isinstance(event.message, Fetch):
            return False
        sid = event.stream_id
        if self.fetch_refused(self.fetches_active):
            client.session.reject(sid, RequestErrorCode.EXCESSIVE_LOAD,
                                  f"{self.fetches_active} fetches in progress, the limit is {self.fetch_limit}",
                                  retry_interval=FETCH_RETRY_MS + 1)
            return True
        self.fetches_active += 1
        released = False

        def release() -> None:
            nonlocal released
            if not released:
                released = True
                self.fetches_active -= 1

        def watch() -> None:  # the client served it just after this hook returned: its data stream exists now
            client.connection.when_sent(client.session.data_streams_of(sid), release, FETCH_SLOT_TIMEOUT)

        asyncio.get_running_loop().call_soon(watch)
        return False

    # -- driving it ---------------------------------------------------------------------------------------

    def register(self, client: MoqtClient) -> None:
        """Create every track before announcing, so a relay's SUBSCRIBE that races the REQUEST_OK finds it."""
        ns = self.announced_namespace()
        self.local[self.manifest_track] = client.track(ns, self.manifest_track,
                                                       properties=self.track_properties(self.manifest_track),
                                                       publisher_priority=self.manifest_priority())
        for track in self.tracks():
            self.local[track.name] = client.track(ns, track.name, properties=self.track_properties(track.name),
                                                  publisher_priority=self.priority(0))

    async def publish(self, client: MoqtClient, token: bytes | None, *, on_progress: ProgressHook | None = None,
                      timeout: float | None = None) -> None:
        """Announce, then publish the whole cache (see the module docstring); RequestRejected when the
        relay refuses the PUBLISH_NAMESPACE."""
        self._progress = on_progress
        if self.fetch_limit is not None:
            client.on_request = self._limit_fetches
        self.register(client)
        await client.publish_namespace(self.announced_namespace(), auth=self.auth_tokens(token), timeout=timeout)
        for seg in self.layout:
            await self.publish_segment(seg)
        self._report(Progress("done"))

    async def publish_segment(self, seg: SegmentLayout) -> None:
        """One segment: manifest listing it, its layers with the manifest cadence, End of Track, manifest."""
        self.added.append(seg.segment)
        tracks = self.tracks(seg.segment)
        for track in tracks:
            self.completed[track.name] = 0
        self.publish_manifest()  # before the segment's first data object
        await self.segment_added(seg)
        since = 0
        for done, layer in enumerate(self.layer_order(), start=1):
            for track in tracks:
                self.publish_layer(self.local[track.name], track, layer, seg.blocks)
                self.completed[track.name] = done
            since += 1
            self._report(Progress("layer", segment=seg.segment, layer=layer))
            if self.manifest_due(since) and done < self.spec.layers:
                self.publish_manifest()
                since = 0
            # let the transport send this layer (live production: a layer as soon as it is computed)
            await asyncio.sleep(self.layer_interval)
        for track in tracks:
            self.end_track(self.local[track.name])
        self.publish_manifest()  # the segment is complete
        self._report(Progress("segment", segment=seg.segment))

    async def segment_added(self, seg: SegmentLayout) -> None:
        """Called once the manifest version listing a new segment is published, before its first layer: a
        subclass may wait here (e.g. until its tracks have subscribers). The reference does nothing."""

    def _report(self, progress: Progress) -> None:
        if self._progress is not None:
            self._progress(progress)

    async def run(self, url: str, token: bytes | None, stop: asyncio.Event, *,
                  on_published: Callable[[KvcsPublisher], None] | None = None,
                  on_progress: ProgressHook | None = None, timeout: float = CONNECT_TIMEOUT) -> None:
        """Connect to the relay at ``url``, publish, call ``on_published``, serve until ``stop`` or the
        session ends."""

        config = SessionConfig(role=Role.CLIENT, implementation="kvconform-kvcs-publisher/0.1")
        client = await connect(url, config=config, timeout=timeout)
        try:
            await self.publish(client, token, on_progress=on_progress, timeout=timeout)
            if on_published is not None:
                on_published(self)
            closed = asyncio.ensure_future(client.closed.wait())
            stopped = asyncio.ensure_future(stop.wait())
            try:
                await asyncio.wait([closed, stopped], return_when=asyncio.FIRST_COMPLETED)
            finally:
                closed.cancel()
                stopped.cancel()
        finally:
            with contextlib.suppress(Exception):
                await client.close(timeout=1.0)

    def describe(self) -> str:
        """One line naming the publication (what ``serve_publisher`` prints once it is published)."""
        objects = sum(s.blocks for s in self.layout) * self.spec.layers * len(self.tracks(0))
        return (f"published {self.namespace} tracks {self.manifest_track.decode()},"
                f"{','.join(str(t) for t in self.tracks())} layers {self.spec.layers} segments "
                f"{len(self.layout)} objects {objects} manifest versions {self.manifest_versions}")


def serve_publisher(relay_url: str, spec: CacheSpec, token: bytes | None, stop: threading.Event, *,
                    publisher: KvcsPublisher | None = None, out: TextIO | None = None,
                    on_published: Callable[[KvcsPublisher], None] | None = None, **options: Any) -> int:
    """Publish ``spec`` to the relay at ``relay_url`` and serve it until ``stop`` is set (the CLI's and
    the drivers' entry point). Prints one ``published ...`` line (flushed) when everything is published.
    ``publisher``: a ready (sub)class instance; else ``KvcsPublisher(spec, **options)``. Exit status 0,
    1 when the relay cannot be reached or refuses the publication."""

    stream = out if out is not None else sys.stdout
    pub = publisher if publisher is not None else KvcsPublisher(spec, **options)

    def published(p: KvcsPublisher) -> None:
        print(p.describe(), file=stream, flush=True)
        if on_published is not None:
            on_published(p)

    async def main() -> int:
        done = asyncio.Event()
        watcher = asyncio.ensure_future(_watch(stop, done))
        try:
            await pub.run(relay_url, token, done, on_published=published)
        except (OSError, TimeoutError, ConnectionError, RequestRejected, SessionEnded) as exc:
            print(f"kvconform serve kvcs-publisher: {type(exc).__name__}: {exc}", file=sys.stderr, flush=True)
            return 1
        finally:
            watcher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await watcher
        return 0

    return asyncio.run(main())


async def _watch(stop: threading.Event, done: asyncio.Event) -> None:
    """Set ``done`` once the thread-side ``stop`` is set (a worker thread waits in short slices, so
    nothing outlives the loop by more than one slice)."""
    loop = asyncio.get_running_loop()
    while not await loop.run_in_executor(None, stop.wait, STOP_POLL):
        pass
    done.set()


def load_publisher_class(spec: str) -> type[KvcsPublisher]:
    """``module:Class`` naming a ``KvcsPublisher`` subclass (how mutant publishers are started)."""

    return load_subclass(spec, KvcsPublisher, "--publisher-class")
