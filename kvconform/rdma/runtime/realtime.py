"""The real-time loop: a `Runtime`'s steps run against the wall clock, between the I/O of the fabric that holds it.

The wire and verbs fabrics each compose one (the emulated fabric runs its steps through its scheduler, in fabric
time, instead). The loop owns the clock (`Runtime.now` is set from it), the actor steps, the actors' timers and
predicates, and when a run ends; the fabric owns its I/O (`RealTimeIo`): sockets, engines' timers, a device's
completion queues. An actor's step runs when what it waits for is there; between steps the loop polls the I/O,
bounded by the next timer, an engine's deadline or the run's wall-clock bound.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Protocol

from kvconform.rdma.fabric import RunResult
from kvconform.rdma.runtime.core import Runtime

SETTLE_S = 0.01  # once every actor is done, the I/O counts as quiet after this long without traffic


class RealTimeIo(Protocol):
    """What the loop asks of the I/O of the fabric that holds it."""

    def poll_io(self, timeout: float) -> int:
        """Handle what is ready within ``timeout`` seconds; the number of ready channels."""

    def engine_timers(self) -> None:
        """Run the engines' work that is due (retransmissions, held packets)."""

    def engine_deadline(self) -> float | None:
        """The earliest time (loop clock) an engine has work due, None when none waits on a timer."""

    def live(self) -> bool:
        """Something could still wake a blocked actor (a listener, an open connection, a completion to come)."""

    def settled(self) -> bool:
        """Nothing left to send and no engine waiting on a timer: the I/O is quiet."""


class RealTimeLoop:
    """Runs ``runtime``'s steps in real time between ``io``'s polls (see the module docstring)."""

    def __init__(self, runtime: Runtime, io: RealTimeIo) -> None:
        self.runtime = runtime
        self.io = io
        self.serving = False  # serve_forever: a run does not end when the actors are done
        self._t0 = time.monotonic()

    def clock(self) -> float:
        """Seconds since the loop began: the fabric's time."""
        return time.monotonic() - self._t0

    # ---- running -----------------------------------------------------------------------------------------

    def run_for(self, seconds: float, max_steps: int) -> RunResult:
        """Run until every non-daemon actor is done, ``max_steps`` or ``seconds`` of wall clock (``deadline``)."""
        reason = self.run(None, self.clock() + seconds, max_steps)
        blocked = self.runtime.blocked()
        if reason == "timeout":
            return RunResult(self.runtime.steps, "deadline", blocked)
        return RunResult(self.runtime.steps, "max_steps" if reason == "max_steps" else "quiescent", blocked)

    def serve_forever(self, stop: Callable[[], bool] | None = None) -> None:
        """Serve (listeners, connections) until ``stop()``: the end of the actors does not end it."""
        self.serving = True
        self.run(stop, None, 1 << 62)

    def run(self, stop: Callable[[], bool] | None, deadline: float | None, max_steps: int) -> str:
        """Run steps until ``stop()`` ("predicate"), ``deadline`` ("timeout"), ``max_steps`` or quiescence."""
        rt = self.runtime
        limit = rt.steps + max_steps
        enabled = rt.enabled
        timers = rt.timers  # the runtime's lists are only ever mutated in place
        clock = self.clock
        io = self.io
        poll_io, engine_timers = io.poll_io, io.engine_timers  # bound once: this is the wire's hot loop
        while True:
            rt.now = now = clock()
            if stop is not None and stop():
                return "predicate"
            if deadline is not None and now >= deadline:
                return "timeout"
            poll_io(0.0)
            engine_timers()
            if rt.until:
                rt.check_until()
            if timers and timers[0][0] <= rt.now:
                rt.fire_timers()
            if rt.failure is not None:
                raise rt.failure
            if not enabled:
                # Like the emulated fabric, a run ends when nothing can happen any more: the I/O is quiet and no
                # non-daemon actor waits on a timer (an actor blocked without one, a target's session actor
                # waiting for the next request, does not keep it going; a bounded wait does)
                serving = self.serving
                settling = not serving and not rt.timed_waiter_names()
                if not serving and rt.blocked() and not timers and not io.live():
                    return "quiescent"  # blocked actors with nothing that could wake them
                wait = 0.25 if rt.until else 1.0  # predicates are re-checked at least this often
                if settling:
                    wait = SETTLE_S
                for t in (timers[0][0] if timers else None, io.engine_deadline(), deadline):
                    if t is not None:
                        wait = min(wait, max(0.0, t - clock()))
                events = poll_io(wait)
                if settling and not events and not enabled and io.settled():
                    return "quiescent"  # every actor done and the I/O quiet: nothing more will happen
                continue
            if rt.steps >= limit:
                return "max_steps"
            step = enabled.pop(0)
            rt.steps += 1
            rt.schedule.append(step.label)
            if rt.tracing:
                rt.pending_notes = []
                step.fn()
                self.record(step.label, step.who)
            else:
                step.fn()
            if rt.failure is not None:
                raise rt.failure

    def await_event(self, predicate: Callable[[], bool], timeout: float) -> bool:
        """Pump I/O only (no actor steps: this may run inside one) until ``predicate()`` or ``timeout`` seconds;
        whether it held."""
        io = self.io
        end = time.monotonic() + timeout
        while not predicate():
            left = end - time.monotonic()
            if left <= 0:
                return False
            due = io.engine_deadline()
            io.poll_io(min(left, 0.05) if due is None else max(0.0, min(left, 0.05, due - self.clock())))
            io.engine_timers()
        return True

    # ---- the trace ---------------------------------------------------------------------------------------

    def record(self, label: str, who: str) -> None:
        """The effects noted since the step began become its trace record (when there are any)."""
        rt = self.runtime
        if rt.pending_notes:
            rt.trace.append({"step": rt.steps, "t": round(rt.now, 6), "label": label, "who": who,
                             "effects": rt.pending_notes})
        rt.pending_notes = []
