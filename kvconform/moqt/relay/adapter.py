"""The relay's asyncio adapter: QUIC sockets (``kvconform.moqt.quic``), one task per session feeding its events
to the core with ``now``, timers for the core's pending waits (RENDEZVOUS_TIMEOUT, an upstream subscription
Established, TRACK_STATUS upstream, an upstream subscription's end), and the request flows that still wait here
as coroutines over the core's waits (FETCH, awaiting an upstream FETCH through ``wait_for_fetch``).
What to send and to whom, and every deadline, is the core's (``core.RelayCore``).

Mutant relays (``tests/mutants``) subclass ``Relay`` and override one small method per behaviour:
``authorize``, ``forward_object``, ``serve_fill``, ``fill_items``, ``fetch_items``, ``serve_fetch_range``,
``write_fetch_items``, ``subscription_passes``, ``track_properties``, ``upstream_subscribe_parameters``,
``upstream_fetch_parameters``, ``accept_subscribe``, ``start_fill``, and the core's ``hold_until_established`` /
``subscribe_established`` (a held SUBSCRIBE's wait and its end). The session's checked writers refuse what a
broken relay would send (descending groups on an Ascending stream, a repeated Object ID); a mutant writes
such bytes on the stream with ``peer.session.send_raw(stream_id, ...)``, encoding them with
``data.FetchStreamWriter`` (another group order) or ``craft.raw_fetch_object``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Coroutine, Sequence
from typing import Any

from kvconform.moqt import quic
from kvconform.moqt.cache import MAX_ID, ObjectCache, next_loc
from kvconform.moqt.data import EndOfRange, EndOfRangeKind, FetchObject, GroupOrder
from kvconform.moqt.errors import RequestErrorCode
from kvconform.moqt.filters import LocationFilter, RangeFilter
from kvconform.moqt.messages import Fetch
from kvconform.moqt.policy import Policy, Right
from kvconform.moqt.relay.core import RelayCore
from kvconform.moqt.relay.state import (
    DEFAULT_CACHE_BYTES,
    DEFAULT_FILL_TIMEOUT_MS,
    UPSTREAM_TIMEOUT,
    Completion,
    Peer,
    Refusal,
    Track,
    UpstreamFetch,
    int_param,
    loc_before,
    range_filters,
)
from kvconform.moqt.session import ObjectReceived, Request, RequestState, SessionClosed, SessionUsageError
from kvconform.moqt.structures import Location, ParamType

__all__ = ["Relay"]

log = logging.getLogger("kvconform.moqt.relay")

EVENT_WAIT = 30.0  # a session task's bounded wait for its next event (it re-checks liveness after)

Callback = Callable[[], None]


class Relay(RelayCore):
    """A caching relay listening on (host, port); ``await start()`` / ``close()`` or ``async with``."""

    def __init__(
        self,
        *,
        policy: Policy | None = None,
        host: str = "127.0.0.1",
        port: int = 0,
        clock: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], float] = time.time,
        fill_timeout_ms: int = DEFAULT_FILL_TIMEOUT_MS,
        upstream_timeout: float = UPSTREAM_TIMEOUT,
        idle_timeout: float = 30.0,
        cache_bytes: int | None = DEFAULT_CACHE_BYTES,
    ) -> None:
        super().__init__(policy=policy, cache=ObjectCache(clock=clock, max_bytes=cache_bytes),
                         fill_timeout_ms=fill_timeout_ms, upstream_timeout=upstream_timeout)
        self.host = host
        self.requested_port = port
        self.clock = clock  # cache clock (MAX_CACHE_DURATION), seconds: the core's ``now``
        self.wall_clock = wall_clock  # token expiry, Unix seconds: the core's ``wall_now``
        self.idle_timeout = idle_timeout
        self._server: quic.MoqtServer | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self._timers: set[asyncio.Handle] = set()
        self._closing = False

    # -- lifecycle ------------------------------------------------------------------------------------

    async def start(self) -> Relay:
        self._closing = False
        self._server = await quic.serve(self.host, self.requested_port, self._serve_peer,
                                        config_factory=self.session_config, idle_timeout=self.idle_timeout)
        return self

    async def close(self, timeout: float = 5.0) -> None:
        self._closing = True
        for handle in list(self._timers):
            handle.cancel()
        self._timers.clear()
        for task in list(self._tasks):
            task.cancel()
        if self._tasks:
            await asyncio.wait(self._tasks, timeout=timeout)
        if self._server is not None:
            await self._server.close(timeout)
            self._server = None

    async def __aenter__(self) -> Relay:
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    @property
    def port(self) -> int:
        assert self._server is not None, "relay not started"
        return self._server.port

    @property
    def url(self) -> str:
        assert self._server is not None, "relay not started"
        return self._server.url

    @property
    def alpn_refusals(self) -> list[str]:
        """One line per client refused for offering no ALPN of ours (a peer of another draft, profile §1)."""
        return list(self._server.alpn_refusals) if self._server is not None else []

    # -- time in, hooks out ---------------------------------------------------------------------------

    def _advance(self) -> None:
        """Pass the clocks' readings in before the core runs."""
        self.now = self.clock()
        self.wall_now = self.wall_clock()

    def _run(self, callback: Callback) -> None:
        """Run a core callback (a timer, a deferred call) as a session event is run."""
        if self._closing:
            return  # the relay is stopping: its tasks are cancelled, nothing more is sent
        self._advance()
        try:
            callback()
        except SessionUsageError as exc:  # the peer went away while we were writing to it
            log.debug("relay callback: %s", exc)
        except Exception:  # a relay bug must not take other sessions down
            self.counters.internal_errors += 1
            log.exception("relay callback failed")

    def new_completion(self) -> Completion[Any]:
        return asyncio.get_running_loop().create_future()

    def set_timer(self, deadline: float, callback: Callback) -> asyncio.TimerHandle:
        def fire() -> None:
            self._timers.discard(handle)
            self._run(callback)

        handle = asyncio.get_running_loop().call_later(max(0.0, deadline - self.clock()), fire)
        self._timers.add(handle)
        return handle

    def cancel_timer(self, handle: Any) -> None:
        handle.cancel()
        self._timers.discard(handle)

    def call_soon(self, callback: Callback) -> None:
        def fire() -> None:
            self._timers.discard(handle)
            self._run(callback)

        handle = asyncio.get_running_loop().call_soon(fire)
        self._timers.add(handle)

    def after_sent(self, peer: Peer, stream_ids: Sequence[int], callback: Callback, timeout: float) -> None:
        peer.conn.when_sent(stream_ids, callback, timeout)

    def run_fetch(self, peer: Peer, req: Request, msg: Fetch) -> None:
        self._spawn(self._refusing(peer, req, self.handle_fetch(peer, req, msg)), peer)

    # -- tasks ----------------------------------------------------------------------------------------

    def _spawn(self, coro: Coroutine[Any, Any, None], peer: Peer | None = None) -> asyncio.Task[None]:
        task = asyncio.get_running_loop().create_task(self._guarded(coro))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        if peer is not None:
            peer.tasks.add(task)
            task.add_done_callback(peer.tasks.discard)
        return task

    async def _guarded(self, coro: Coroutine[Any, Any, None]) -> None:
        self._advance()
        try:
            await coro
        except asyncio.CancelledError:
            raise
        except SessionUsageError as exc:  # the peer went away while we were writing to it
            log.debug("relay task: %s", exc)
        except Exception:  # a relay bug must not take other sessions down
            self.counters.internal_errors += 1
            log.exception("relay task failed")

    async def _refusing(self, peer: Peer, req: Request, coro: Coroutine[Any, Any, None]) -> None:
        try:
            await coro
        except Refusal as refusal:
            self._advance()
            self._refuse(peer, req, refusal.code, refusal.reason)

    # -- per-session loop -----------------------------------------------------------------------------

    async def _serve_peer(self, conn: quic.MoqtConnection) -> None:
        peer = self.open_peer(conn)
        try:
            event: Any = None
            while conn.closed is None:
                # A run of objects is taken without a wait (an await per event, i.e. a task and a loop turn or
                # more each, let a fast publisher's objects queue up here: the relay forwarded a fraction of what
                # it received, bench/bench_moqt_relay.py). Every other event, and the object after one, still
                # comes through a wait, so the tasks it wakes or spawns (a held SUBSCRIBE seeing SUBSCRIBE_OK
                # before the PUBLISH_DONE behind it ends the upstream) run first, as they always did.
                event = conn.next_event_nowait(ObjectReceived) if isinstance(event, ObjectReceived) else None
                if event is None:
                    try:
                        event = await conn.next_event(EVENT_WAIT)
                    except TimeoutError:
                        continue
                self._advance()
                if isinstance(event, SessionClosed):
                    self.session_closed(peer, event)
                    break
                try:
                    self.dispatch(peer, event)
                except SessionUsageError as exc:
                    log.debug("%s: %s", peer, exc)
                except Exception:
                    self.counters.internal_errors += 1
                    log.exception("%s: relay failed on %s", peer, type(event).__name__)
        finally:
            self._advance()
            self.close_peer(peer)

    # -- cache filling --------------------------------------------------------------------------------

    async def ensure_cached(self, track: Track, start: Location, end: Location, timeout_ms: int | None) -> int:
        """Make [start, end] (inclusive) known, FETCHing the unknown span upstream within ``timeout_ms``
        (``RelayCore.plan_gap_fetch``). Returns the End of Range kind for what stays unknown: TIMED_OUT when
        the budget ran out (or was 0), UNKNOWN when no source could tell (section 9.4)."""
        planned = self.plan_gap_fetch(track, start, end, timeout_ms)
        if not isinstance(planned, UpstreamFetch):
            return planned
        if not await self._await_fetch(planned, timeout_ms):
            return EndOfRangeKind.TIMED_OUT
        return EndOfRangeKind.UNKNOWN

    async def _await_fetch(self, fetch: UpstreamFetch, timeout_ms: int | None,
                           until: Callable[[], bool] | None = None) -> bool:
        """The core's ``wait_for_fetch``, awaited: True once the FETCH finished (or ``until()`` held), False
        (the FETCH cancelled) when the budget ran out."""
        result: asyncio.Future[bool] = self.wait_for_fetch(fetch, timeout_ms, until)  # type: ignore[assignment]
        ok = await result
        self._advance()
        return ok

    # -- FETCH ----------------------------------------------------------------------------------------

    async def handle_fetch(self, peer: Peer, req: Request, msg: Fetch) -> None:
        self._require(peer, Right.SUBSCRIBE, msg.track_namespace, msg.parameters)
        self._check_track_name(msg.track_namespace)
        params = msg.parameters
        track = self.track_for(msg.track_namespace, msg.track_name)
        if track.cache.malformed:
            raise Refusal(RequestErrorCode.MALFORMED_TRACK, track.cache.malformed)
        flt = req.location_filter or LocationFilter.none()
        descending = int_param(params, ParamType.GROUP_ORDER) == GroupOrder.DESCENDING
        timeout_ms = int_param(params, ParamType.FILL_TIMEOUT)
        deadline = None if timeout_ms is None else self.now + timeout_ms / 1000.0

        def budget() -> int | None:  # what is left of the request's FILL_TIMEOUT (None: by progress)
            return self.fetch_budget(deadline)

        end_of_track: bool | None = None
        live = any(u.established for u in track.upstreams) or track.cache.end_of_track is not None
        sources = self.publishers_for(msg.track_namespace)
        rng: tuple[Location, Location] | None
        if not live and sources:
            # The relay does not follow this track: ask upstream for the same range to learn it.
            start = flt.start(None)
            fetch = self.open_upstream_fetch(sources[0], track, start, Location(MAX_ID + 1, 0), flt)
            await self._await_fetch(fetch, budget(), until=lambda: fetch.ok is not None)
            if fetch.error is not None:
                raise Refusal(fetch.error.error_code, "upstream FETCH failed: "
                              + fetch.error.reason.decode("utf-8", "replace"))
            if fetch.ok is None:
                raise Refusal(RequestErrorCode.TIMEOUT, f"upstream FETCH of {track} did not complete")
            end_loc = fetch.ok.end_location
            flt_end = flt.end()
            rng = (start, end_loc if flt_end is None else min(flt_end, end_loc))
            end_of_track = bool(fetch.ok.end_of_track) and rng[1] == end_loc
            if not descending and rng[1] == end_loc and start <= end_loc:
                await self.serve_fetch_cut_through(peer, req, track, fetch, rng, end_of_track,
                                                   range_filters(params), budget)
                return
            await self._await_fetch(fetch, budget())
        else:
            if not live and len(track.cache) == 0:
                raise Refusal(RequestErrorCode.DOES_NOT_EXIST, f"no publisher and nothing cached for {track}")
            rng = flt.fetch_range(track.cache.largest)
        if rng is None:
            raise Refusal(RequestErrorCode.INVALID_RANGE,
                          f"FETCH range starts after Largest Object {track.cache.largest} (section 7.3)")
        if peer.gone or req.state is not RequestState.PENDING:
            return
        start, end = rng
        gap_kind = await self.ensure_cached(track, start, end, budget())
        items = self.fetch_items(track, start, end, descending, range_filters(params), gap_kind)
        end_location = self.fetch_end_location(track, items, end)
        if end_of_track is None:
            end_of_track = self._ends_track(track, end_location)
        if peer.gone or req.state is not RequestState.PENDING:
            return
        peer.session.fetch_ok(req.stream_id, end_location, end_of_track=end_of_track,
                              track_properties=self.track_properties(track))
        sid = peer.session.open_fetch_stream(req.stream_id)
        self.serve_fetch_range(peer, req, track, sid, items)
        track.counters.fetch_objects += sum(isinstance(i, FetchObject) for i in items)
        if peer.session.data_stream_open(sid):
            peer.session.end_data_stream(sid)
        with contextlib.suppress(SessionUsageError):
            peer.session.finish_request(req.stream_id)

    async def serve_fetch_cut_through(self, peer: Peer, req: Request, track: Track, fetch: UpstreamFetch,
                                      rng: tuple[Location, Location], end_of_track: bool,
                                      filters: Sequence[RangeFilter], budget: Callable[[], int | None]) -> None:
        """Serve an Ascending FETCH of a track the relay does not follow while its own FETCH upstream is still
        arriving, instead of storing the whole range first: FETCH_OK with the upstream End Location, then each
        object as soon as every Location before it has come from upstream (the upstream stream is ascending,
        so the objects keep their order). What stays unknown is settled at the end as in the stored path."""
        start, end = rng
        if peer.gone or req.state is not RequestState.PENDING:
            self._cancel_upstream_fetch(fetch)
            return
        session = peer.session
        session.fetch_ok(req.stream_id, end, end_of_track=end_of_track, track_properties=self.track_properties(track))
        sid = session.open_fetch_stream(req.stream_id)
        cursor, served = start, 0
        while cursor <= end and not fetch.unknown:  # an unknown range: its record is written at the end
            fetch.progress.clear()
            arrived = next_loc(fetch.prev) if fetch.prev is not None else start  # all before it has come
            upto = min(arrived, next_loc(end))
            if upto > cursor:
                with track.cache.settled(cursor, upto):
                    items = self.fetch_items(track, cursor, loc_before(upto), False, filters, EndOfRangeKind.UNKNOWN)
                if items:
                    self.serve_fetch_range(peer, req, track, sid, items)
                    served += sum(isinstance(i, FetchObject) for i in items)
                cursor = upto
            if not session.data_stream_open(sid):  # cancelled or reset downstream: stop fetching for it
                self._cancel_upstream_fetch(fetch)
                return
            if fetch.done.done() or not await self._await_fetch(fetch, budget(), until=fetch.progress.is_set):
                break
        rest: list[FetchObject | EndOfRange] = []
        if cursor <= end:
            if not fetch.done.done():  # stopped at an unknown range: the FETCH first settles what it covers
                await self._await_fetch(fetch, budget())
            gap_kind = await self.ensure_cached(track, cursor, end, budget())
            rest = self.fetch_items(track, cursor, end, False, filters, gap_kind)
        if rest or not served:
            self.serve_fetch_range(peer, req, track, sid, rest)
            served += sum(isinstance(i, FetchObject) for i in rest)
        track.counters.fetch_objects += served
        if session.data_stream_open(sid):
            session.end_data_stream(sid)
        with contextlib.suppress(SessionUsageError):
            session.finish_request(req.stream_id)
