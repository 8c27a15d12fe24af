"""Completion queues of the in-process runtime: actors waiting on one are handed matching completions."""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from typing import Any, Protocol

from kvconform.rdma.fabric import Completion, NextCompletion
from kvconform.rdma.runtime.actor import Actor


class Waker(Protocol):
    """What resumes an actor whose completion arrived (the runtime)."""

    def wake(self, act: Actor, value: Any) -> None: ...


class EmuCQ:
    """A completion queue (implements `kvconform.rdma.fabric.CompletionQueue`); engines `push` into it."""

    def __init__(self, runtime: Waker, name: str) -> None:
        self.name = name
        self._runtime = runtime
        self._q: deque[Completion] = deque()
        self.waiters: list[Actor] = []

    def poll(self, max_entries: int = 1) -> list[Completion]:
        out: list[Completion] = []
        while self._q and len(out) < max_entries:
            out.append(self._q.popleft())
        return out

    def __len__(self) -> int:
        return len(self._q)

    def push(self, wc: Completion) -> None:
        """A completion arrives: the first actor waiting for one it matches resumes with it, else it is queued."""
        for actor in self.waiters:
            cmd = actor.cmd
            assert isinstance(cmd, NextCompletion)
            if cmd.match is None or cmd.match(wc):
                self.waiters.remove(actor)
                self._runtime.wake(actor, wc)
                return
        self._q.append(wc)

    def take(self, match: Callable[[Completion], bool] | None) -> Completion | None:
        """The oldest queued completion ``match`` accepts (any, without one), removed; None if there is none."""
        if match is None:
            return self._q.popleft() if self._q else None
        for i, wc in enumerate(self._q):
            if match(wc):
                del self._q[i]
                return wc
        return None
