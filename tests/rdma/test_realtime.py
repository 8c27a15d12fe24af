"""The runtime's real-time loop on its own (`kvconform.rdma.runtime.realtime`), with a fake I/O: what the wire and
verbs fabrics rely on when they compose it. Fast (tens of milliseconds of wall clock)."""

from __future__ import annotations

from collections.abc import Generator
from typing import Any

from kvconform.rdma import RDMAP_7306
from kvconform.rdma.fabric import sleep, wait_until
from kvconform.rdma.runtime import RealTimeLoop, Runtime


class FakeIo:
    """I/O that is ready ``arrivals`` times, then quiet unless ``busy`` (an engine with work still due)."""

    def __init__(self, arrivals: int = 0, busy: bool = False) -> None:
        self.arrivals = arrivals
        self.busy = busy
        self.waits: list[float] = []
        self.arrived = 0

    def poll_io(self, timeout: float) -> int:
        self.waits.append(timeout)
        if self.arrivals:
            self.arrivals -= 1
            self.arrived += 1
            return 1
        return 0

    def engine_timers(self) -> None:
        pass

    def engine_deadline(self) -> float | None:
        return None

    def live(self) -> bool:
        return self.busy

    def settled(self) -> bool:
        return self.arrivals == 0 and not self.busy


def _loop(io: FakeIo) -> RealTimeLoop:
    return RealTimeLoop(Runtime(RDMAP_7306), io)


def test_a_run_ends_when_the_actors_are_done_and_the_io_is_quiet() -> None:
    io = FakeIo(arrivals=3)
    loop = _loop(io)

    def actor() -> Generator[Any, Any, str]:
        yield from sleep(0.01)
        return "done"

    handle = loop.runtime.spawn("a", actor())
    result = loop.run_for(5.0, 1000)
    assert (result.reason, result.blocked, handle.result) == ("quiescent", (), "done")
    assert io.arrived == 3  # the loop kept polling until the I/O was quiet
    assert max(io.waits) <= 1.0  # every wait bounded


def test_a_blocked_actor_with_nothing_live_ends_the_run_and_is_named() -> None:
    loop = _loop(FakeIo())

    def stuck() -> Generator[Any, Any, None]:
        yield from wait_until(lambda: False, name="never")

    loop.runtime.spawn("stuck", stuck())
    result = loop.run_for(5.0, 1000)
    assert (result.reason, result.blocked) == ("quiescent", ("stuck",))


def test_an_io_not_quiet_keeps_a_blocked_run_going_until_its_wall_clock_bound() -> None:
    loop = _loop(FakeIo(busy=True))

    def stuck() -> Generator[Any, Any, None]:
        yield from wait_until(lambda: False, name="never")

    loop.runtime.spawn("stuck", stuck())
    result = loop.run_for(0.05, 1000)
    assert (result.reason, result.blocked) == ("deadline", ("stuck",))
    assert loop.clock() >= 0.05


def test_await_event_pumps_io_only_and_is_bounded() -> None:
    io = FakeIo(arrivals=2)
    loop = _loop(io)
    ran: list[str] = []

    def actor() -> Generator[Any, Any, None]:
        ran.append("step")
        yield from sleep(0.0)

    loop.runtime.spawn("a", actor())
    assert loop.await_event(lambda: io.arrived == 2, 1.0)
    assert not loop.await_event(lambda: False, 0.02)
    assert ran == []  # no actor step ran: await_event may itself run inside one
