"""An asyncio event loop on virtual time that jumps to the next timer whenever every task is idle (issue 24 item 3).

`VirtualClockLoop.time()` is a number the loop owns, not the machine's clock. When nothing is ready to run, the loop
does not wait: it moves its clock to the earliest scheduled timer at once (trio's MockClock with autojump_threshold
0), so aioquic's loss detection and idle timers, `asyncio.wait_for` bounds and the relay's `loop.time()` deadlines
all run on virtual time, and a run does not depend on how fast the machine is. Nothing in the loop reads a real
clock; a loop with no timer and nothing ready is a deadlock and raises `VirtualDeadlock` instead of hanging. With
``turn_cost`` each loop turn also moves the clock that much (as a real turn takes CPU time), so a task that spins
on ``asyncio.sleep(0)`` until an answer comes lets the answer's timers come due instead of livelocking.

The loop has no real I/O: `getaddrinfo` answers numeric addresses itself (no executor thread, whose timing no
virtual clock controls), and datagram endpoints are made by the in-memory network attached as ``loop.network``
(`kvconform.moqt.simnet`), if one is.
"""

from __future__ import annotations

import asyncio
import heapq
import selectors
import socket
from collections.abc import Callable, Coroutine
from typing import Any, Protocol, TypeVar

__all__ = ["DatagramNetwork", "VirtualClockLoop", "VirtualDeadlock", "run_virtual"]

T = TypeVar("T")

# A run may not pass this much virtual time: a scenario that keeps re-arming timers forever ends instead of looping.
DEFAULT_HORIZON_S = 3600.0
# The least the clock moves when it jumps: a timer due at the current instant, with no other work, runs one tick later.
TICK = 1e-6


class VirtualDeadlock(RuntimeError):
    """Nothing is ready and no timer is scheduled (or the horizon passed): the run can never make progress."""


class DatagramNetwork(Protocol):
    """What the loop needs of an in-memory network (`kvconform.moqt.simnet.SimNetwork` is one)."""

    def create_endpoint(
        self, protocol: asyncio.DatagramProtocol, local_addr: tuple[str, int] | None,
        remote_addr: tuple[str, int] | None,
    ) -> asyncio.DatagramTransport: ...


class _AutojumpSelector(selectors.SelectSelector):
    """Polls the loop's own self-pipe without blocking; where asyncio would block, moves the virtual clock instead."""

    def __init__(self, loop: VirtualClockLoop) -> None:
        super().__init__()
        self._vloop = loop

    def select(self, timeout: float | None = None) -> list[tuple[selectors.SelectorKey, int]]:
        events = super().select(0)
        if events or (timeout is not None and timeout <= 0):
            return events
        # _run_once has moved the clock to the next timer already, so a positive timeout is asyncio's rounding
        self._vloop._jump(None if timeout is None else self._vloop.time())
        return []


class VirtualClockLoop(asyncio.SelectorEventLoop):
    """A selector loop whose `time()` is virtual and autojumps to the next timer when idle (see module doc)."""

    def __init__(self, start: float = 0.0, horizon: float = DEFAULT_HORIZON_S, max_turns: int = 2_000_000,
                 turn_cost: float = 0.0) -> None:
        self._virtual_now = start
        self._horizon = start + horizon
        # Virtual seconds every loop turn takes, as a real turn takes CPU time: a task that spins (``while not
        # done: await asyncio.sleep(0)``) lets time pass and the timers it waits for come due. 0: time moves
        # only when the loop is idle.
        self.turn_cost = turn_cost
        self.network: DatagramNetwork | None = None
        self.jumps = 0
        self.turns = 0
        self._max_turns = max_turns
        super().__init__(_AutojumpSelector(self))

    def time(self) -> float:
        return self._virtual_now

    def rebound(self, horizon: float = DEFAULT_HORIZON_S) -> None:
        """Count the horizon and the turns again from now: a loop that runs many scenarios one after another
        (`kvconform.moqt.simsession`) bounds each of them, not their sum."""
        self._horizon = self._virtual_now + horizon
        self.turns = 0

    def wall_time(self) -> float:
        """A virtual Unix time for code that reads the wall clock (token expiry): a fixed epoch plus `time()`."""
        return VIRTUAL_EPOCH + self._virtual_now

    def _run_once(self) -> None:
        """Before asyncio's own turn: when nothing is ready, set the clock to the earliest live timer (at least one
        `TICK` on). asyncio would run a timer up to one clock resolution early; aioquic then finds its pacer not
        yet due at `time()`, re-arms the same instant and, on a clock that does not move by itself, spins there."""
        self.turns += 1
        if self.turns > self._max_turns:
            raise VirtualDeadlock(f"virtual loop: {self._max_turns} turns without finishing, at "
                                  f"t={self._virtual_now:.6f}s (a livelock)")
        self._virtual_now += self.turn_cost
        scheduled: list[asyncio.TimerHandle] = self._scheduled  # type: ignore[attr-defined]
        if not self._ready and not self._stopping:  # type: ignore[attr-defined]
            while scheduled and scheduled[0].cancelled():
                handle = heapq.heappop(scheduled)
                handle._scheduled = False  # type: ignore[attr-defined]  # as asyncio's own _run_once does
                self._timer_cancelled_count -= 1  # type: ignore[attr-defined]
            if scheduled:
                # A timer due now with nothing else to do moves the clock by one tick: a real clock never stands
                # still, and aioquic's pacer re-arms "now + a few ns" until time has passed (it would spin here).
                self._jump(max(scheduled[0].when(), self._virtual_now + TICK))
        super()._run_once()  # type: ignore[misc]

    def _jump(self, when: float | None) -> None:
        if when is None:
            raise VirtualDeadlock(f"virtual loop at t={self._virtual_now:.6f}s: no task can run and no timer is set")
        if when > self._horizon:
            raise VirtualDeadlock(f"virtual loop: next timer at t={when:.3f}s is past the horizon "
                                  f"({self._horizon:.0f}s)")
        self._virtual_now = max(self._virtual_now, when)
        self.jumps += 1

    async def getaddrinfo(self, host: bytes | str | None, port: bytes | str | int | None, *, family: int = 0,
                          type: int = 0, proto: int = 0, flags: int = 0) -> list[Any]:
        """Numeric hosts only, answered inline (a resolver thread would run outside virtual time)."""
        return socket.getaddrinfo(host, port, family, type, proto, flags | socket.AI_NUMERICHOST)

    async def create_datagram_endpoint(  # type: ignore[override]
        self, protocol_factory: Callable[[], asyncio.DatagramProtocol], local_addr: Any = None,
        remote_addr: Any = None, **kwargs: Any,
    ) -> tuple[asyncio.DatagramTransport, asyncio.DatagramProtocol]:
        if self.network is None:
            raise RuntimeError("VirtualClockLoop has no network attached: it makes no real sockets")
        protocol = protocol_factory()
        local = None if local_addr is None else (str(local_addr[0]), int(local_addr[1]))
        remote = None if remote_addr is None else (str(remote_addr[0]), int(remote_addr[1]))
        transport = self.network.create_endpoint(protocol, local, remote)
        return transport, protocol


# 2026-01-01T00:00:00Z: the virtual wall clock's zero (tokens minted in a scenario expire relative to it).
VIRTUAL_EPOCH = 1_767_225_600.0


def run_virtual(main: Callable[[VirtualClockLoop], Coroutine[Any, Any, T]], *, start: float = 0.0,
                horizon: float = DEFAULT_HORIZON_S) -> T:
    """Run ``main(loop)`` to completion on a fresh `VirtualClockLoop`, then cancel what is left and close the loop."""
    loop = VirtualClockLoop(start, horizon)
    try:
        return loop.run_until_complete(main(loop))
    finally:
        try:
            pending = [t for t in asyncio.all_tasks(loop) if not t.done()]
            for task in pending:
                task.cancel()
            if pending:
                loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
            loop.run_until_complete(loop.shutdown_asyncgens())
        finally:
            loop.close()
