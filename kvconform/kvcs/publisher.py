"""The reference KVCS Original Publisher: the asyncio adapter over its sans-I/O core (issue 24 item 1).

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

What is published and when a FETCH is refused is the core's (``kvconform.kvcs.publisher_core.PublisherCore``,
its module docstring says what and in which order). This adapter only moves it: it applies each command the
core emits to the client's ``LocalTrack`` at once (``close_track`` for End of Track), waits on the core's steps
with the loop's clock (``asyncio.sleep``: virtual time on a ``VirtualClockLoop``), awaits the ``segment_added``
hook, and arms the fetch limit's deadlines. A FETCH refused over the limit gets REQUEST_ERROR EXCESSIVE_LOAD
(profile section 10.2) and a Retry Interval.

The behaviours are the core's overridable methods, plus two of the adapter: ``close_track`` (how a track's End of
Track reaches the MOQT session) and the async hook ``segment_added`` before a segment's first layer: the mutant
publishers in tests/mutants/kvcs/publisher.py override one each.
"""

from __future__ import annotations

import asyncio
import contextlib
import sys
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TextIO

from kvconform.kvcs.publisher_core import (
    DEFAULT_CACHE_DURATION_MS,
    FETCH_SLOT_TIMEOUT,
    MANIFEST_EVERY,
    MANIFEST_PRIORITY,
    Command,
    EndTrack,
    Pause,
    Progress,
    ProgressHook,
    PublisherCore,
    SegmentAdded,
)
from kvconform.loading import load_subclass
from kvconform.moqt.client import RequestRejected, SessionEnded, connect
from kvconform.moqt.errors import RequestErrorCode
from kvconform.moqt.messages import Fetch
from kvconform.moqt.session import Role, SessionConfig

if TYPE_CHECKING:
    from kvconform.kvcs.content import CacheSpec, SegmentLayout
    from kvconform.moqt.client import LocalTrack, MoqtClient
    from kvconform.moqt.session import RequestReceived

__all__ = ["DEFAULT_CACHE_DURATION_MS", "FETCH_SLOT_TIMEOUT", "MANIFEST_EVERY", "MANIFEST_PRIORITY", "KvcsPublisher",
           "Progress", "load_publisher_class", "serve_publisher"]

CONNECT_TIMEOUT = 10.0
STOP_POLL = 0.2  # seconds: how often serve_publisher looks at its stop event
FETCH_RETRY_MS = 100  # the Retry Interval of an EXCESSIVE_LOAD refusal (sent as ms + 1, profile section 5)


class KvcsPublisher(PublisherCore):
    """One publication of the cache ``spec`` describes, over a ``MoqtClient`` (see the module docstring)."""

    def __init__(self, spec: CacheSpec, **options: Any) -> None:
        super().__init__(spec, **options)
        self.local: dict[bytes, LocalTrack] = {}

    # -- applying the core's commands ------------------------------------------------------------------

    def apply(self, command: Command) -> None:
        """Carry one command of the core out on the client's track (the core's sink, set by ``register``)."""
        local = self.local[command.track]
        if isinstance(command, EndTrack):
            self.close_track(local)
            return
        local.publish_object(command.group, command.object_id, command.payload, subgroup=command.subgroup,
                             priority=command.priority, status=command.status, end_subgroup=command.end_subgroup)

    def close_track(self, local: LocalTrack) -> None:
        """End of Track at {L, 0} on its own subgroup stream, PUBLISH_DONE once sent; the track stays served
        (fills and FETCH) while the session lives."""
        local.end_track()

    def _limit_fetches(self, client: MoqtClient, event: RequestReceived) -> bool:
        """The session's request hook: the core admits or refuses each FETCH (True: refused here); everything
        else, and an admitted FETCH, the client serves as usual."""
        if self.fetch_limit is None or not isinstance(event.message, Fetch):
            return False
        sid = event.stream_id
        loop = asyncio.get_running_loop()
        active = self.fetches_active
        deadline = self.admit_fetch(sid, loop.time())
        if deadline is None:
            client.session.reject(sid, RequestErrorCode.EXCESSIVE_LOAD,
                                  f"{active} fetches in progress, the limit is {self.fetch_limit}",
                                  retry_interval=FETCH_RETRY_MS + 1)
            return True
        loop.call_at(deadline, lambda: self.on_timer(loop.time()))

        def watch() -> None:  # the client served it just after this hook returned: its data stream exists now
            client.connection.when_sent(client.session.data_streams_of(sid), lambda: self.release_fetch(sid),
                                        max(0.0, deadline - loop.time()))

        loop.call_soon(watch)
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
        self.sink = self.apply

    async def publish(self, client: MoqtClient, token: bytes | None, *, on_progress: ProgressHook | None = None,
                      timeout: float | None = None) -> None:
        """Announce, then publish the whole cache (see the module docstring); RequestRejected when the
        relay refuses the PUBLISH_NAMESPACE."""
        self._progress = on_progress
        if self.fetch_limit is not None:
            client.on_request = self._limit_fetches
        self.register(client)
        await client.publish_namespace(self.announced_namespace(), auth=self.auth_tokens(token), timeout=timeout)
        for step in self.publication():
            if isinstance(step, SegmentAdded):
                await self.segment_added(step.segment)
            elif isinstance(step, Pause):
                # let the transport send this layer (live production: a layer as soon as it is computed)
                await asyncio.sleep(step.seconds)

    async def segment_added(self, seg: SegmentLayout) -> None:
        """Called once the manifest version listing a new segment is published, before its first layer: a
        subclass may wait here (e.g. until its tracks have subscribers). The reference does nothing."""

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
