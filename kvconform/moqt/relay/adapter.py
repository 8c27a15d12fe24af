"""The relay's asyncio adapter: QUIC sockets (``kvconform.moqt.quic``), one task per session feeding its events
to the core with ``now``, and timers and deferred calls for the core's pending waits (RENDEZVOUS_TIMEOUT, an
upstream subscription Established, TRACK_STATUS upstream, an upstream subscription's end, an upstream FETCH that
a fill or a FETCH waits for). What to send and to whom, and every deadline, is the core's (``core.RelayCore``);
no request flow runs here as a coroutine.

Mutant relays (``tests/mutants``) subclass ``Relay`` and override one small core method per behaviour:
``authorize``, ``forward_object``, ``serve_fill``, ``fill_items``, ``fetch_items``, ``serve_fetch_range``,
``write_fetch_items``, ``subscription_passes``, ``track_properties``, ``upstream_subscribe_parameters``,
``upstream_fetch_parameters``, ``accept_subscribe``, ``start_fill``, ``handle_fetch``, ``cuts_through`` /
``fetch_served`` (a FETCH job's cut-through and its end), and ``hold_until_established`` /
``subscribe_established`` (a held SUBSCRIBE's wait and its end). The session's checked writers refuse what a
broken relay would send (descending groups on an Ascending stream, a repeated Object ID); a mutant writes
such bytes on the stream with ``peer.session.send_raw(stream_id, ...)``, encoding them with
``data.FetchStreamWriter`` (another group order) or ``craft.raw_fetch_object``.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Coroutine, Sequence
from typing import Any

from kvconform.moqt import quic
from kvconform.moqt.cache import ObjectCache
from kvconform.moqt.policy import Policy
from kvconform.moqt.relay.core import RelayCore
from kvconform.moqt.relay.state import (
    DEFAULT_CACHE_BYTES,
    DEFAULT_FILL_TIMEOUT_MS,
    UPSTREAM_TIMEOUT,
    Completion,
    Peer,
)
from kvconform.moqt.session import ObjectReceived, SessionClosed, SessionUsageError

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
