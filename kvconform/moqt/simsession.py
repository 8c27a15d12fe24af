"""A long-lived run on the deterministic transport: one virtual loop and network across many scenarios (issue 24).

`simulate` (kvconform.moqt.simrun) runs one scenario on a fresh loop. A conformance suite is many scenarios
against one relay that lives for the whole session, driven from synchronous code (pytest fixtures and checks):
`SimSession` keeps one `VirtualClockLoop` with its `SimNetwork` and the transcript (`Sim`) for all of them, and
``run(coro)`` runs one scenario to its end on it (``loop.run_until_complete`` where a socket run would take a
fresh ``asyncio.run``), so what it waits for costs virtual time, not wall time, and the relay started by an
earlier ``run`` serves it.

Like ``asyncio.run``, a ``run`` leaves nothing of its own behind: the tasks it started that are still pending
when it ends are cancelled (unless it started a server: ``keep``). "Its own" is known from the context a task was
created in (a context variable each ``run`` sets); the tasks a relay starts for its sessions are not those of the
scenario whose datagrams set them off, because the network delivers a datagram in the receiving endpoint's context
(the run that started the relay), as a socket's reader callback does.

Every ``run`` is bounded on its own (`VirtualClockLoop.rebound`): a horizon of virtual time and a number of loop
turns, whatever earlier runs spent. Tasks hash by their creation number (`_NumberedTask`), and aioquic's streams by
their id (`kvconform.moqt.simnet`): sets of them iterate alike in every process.
"""

from __future__ import annotations

import asyncio
import contextvars
import hashlib
import weakref
from collections.abc import Coroutine
from typing import Any, TypeVar

from kvconform.moqt import quic
from kvconform.moqt.simclock import DEFAULT_HORIZON_S, VirtualClockLoop
from kvconform.moqt.simnet import Faults, SimNetwork
from kvconform.moqt.simrun import Sim, TranscriptEntry
from kvconform.rdma.scheduler import Scheduler

__all__ = ["SimSession", "transcript_line"]

T = TypeVar("T")

# The run a task was created in (None: not inside a run of a SimSession, e.g. a loop callback's own context).
_RUN: contextvars.ContextVar[int | None] = contextvars.ContextVar("kvconform_sim_run", default=None)
CANCEL_BOUND_S = 5.0  # virtual seconds the cancelled leftovers of a run get to end


def transcript_line(entry: TranscriptEntry) -> str:
    """One transcript entry as a line of ``transcript.txt`` (the format of `SimResult.transcript_text`)."""
    t, who, direction, what, digest = entry
    return f"{t:12.6f} {who:<20} {direction:<8} {what} {digest}"


class _NumberedTask(asyncio.Task):  # type: ignore[type-arg]
    """A task that hashes by its creation number, not its address: a set of tasks (the relay's, asyncio.wait's)
    iterates in the same order in every process, so what their cancellation or completion sets off does too
    (addresses move with ASLR and with every allocation the process made before)."""

    def __init__(self, number: int, *args: Any, **kwargs: Any) -> None:
        self.number = number  # before Task.__init__: it adds the task to asyncio's WeakSet, which hashes it
        super().__init__(*args, **kwargs)

    def __hash__(self) -> int:
        return self.number


class SimSession:
    """One virtual-clock loop, its in-memory network and the transcript, for scenarios run one after another."""

    def __init__(self, scheduler: Scheduler, faults: Faults, horizon: float = DEFAULT_HORIZON_S,
                 turn_cost: float = 0.0) -> None:
        self.loop = VirtualClockLoop(horizon=horizon, turn_cost=turn_cost)
        self.net = SimNetwork(self.loop, scheduler, faults)
        self.loop.network = self.net
        self.sim = Sim(self.loop, self.net)
        self.horizon = horizon
        self.runs = 0
        self.turns = 0  # loop turns over every run
        self._started: dict[int, weakref.WeakSet[asyncio.Task[Any]]] = {}
        self._tasks_made = 0
        self.loop.set_task_factory(self._task_factory)

    def _task_factory(self, loop: asyncio.AbstractEventLoop, coro: Any,
                      context: contextvars.Context | None = None) -> asyncio.Task[Any]:
        self._tasks_made += 1
        task: asyncio.Task[Any] = _NumberedTask(self._tasks_made, coro, loop=loop, context=context)
        run = (context.get(_RUN) if context is not None else _RUN.get())
        if run is not None and run in self._started:
            self._started[run].add(task)
        return task

    @property
    def transcript(self) -> list[TranscriptEntry]:
        return self.sim.transcript

    def run(self, coro: Coroutine[Any, Any, T], *, keep: bool = False) -> T:
        """Run ``coro`` to its end on the loop, then cancel the tasks it started that are still pending (with
        ``keep``, not: a run that starts a server leaves its tasks running for the runs after it)."""
        if self.loop.is_closed():
            coro.close()
            raise RuntimeError("SimSession.run: the session is closed")
        self.runs += 1
        run = self.runs
        self._started[run] = weakref.WeakSet()
        self.loop.rebound(self.horizon)
        try:
            with quic.tapping(self.sim.tap):
                context = contextvars.copy_context()  # with the tap: what the run connects reports to it
                context.run(_RUN.set, run)
                task = self.loop.create_task(coro, context=context)
                try:
                    return self.loop.run_until_complete(task)
                finally:
                    if not keep or not task.done():
                        self._cancel(run)
        finally:
            self.turns += self.loop.turns
            del self._started[run]

    def _cancel(self, run: int) -> None:
        """Cancel what run ``run`` left pending (``asyncio.run`` does as much before it closes its loop)."""
        left = [t for t in self._started[run] if not t.done()]
        for task in left:
            task.cancel()
        if left:
            self.turns += self.loop.turns
            self.loop.rebound(self.horizon)  # a run that ended in VirtualDeadlock spent its bounds
            self.loop.run_until_complete(asyncio.wait(left, timeout=CANCEL_BOUND_S))

    def digest(self, start: int = 0, end: int | None = None) -> str:
        """SHA-256 over the transcript's lines ``[start:end]`` as ``transcript.txt`` holds them."""
        h = hashlib.sha256()
        for entry in self.sim.transcript[start:end]:
            h.update(transcript_line(entry).encode() + b"\n")
        return h.hexdigest()

    def transcript_text(self) -> str:
        """The whole transcript, one line per entry (``transcript.txt``)."""
        return "".join(transcript_line(entry) + "\n" for entry in self.sim.transcript)

    def stats(self) -> dict[str, int]:
        s = self.net.stats
        return {"sent": s.sent, "delivered": s.delivered, "dropped": s.dropped, "duplicated": s.duplicated,
                "reordered": s.reordered, "runs": self.runs, "turns": self.turns}

    def close(self) -> None:
        """Cancel every task left on the loop and close it."""
        if self.loop.is_closed():
            return
        try:
            pending = [t for t in asyncio.all_tasks(self.loop) if not t.done()]
            for task in pending:
                task.cancel()
            if pending:
                self.loop.rebound(self.horizon)
                self.loop.run_until_complete(asyncio.wait(pending, timeout=CANCEL_BOUND_S))
            self.loop.run_until_complete(self.loop.shutdown_asyncgens())
        finally:
            self.loop.close()
