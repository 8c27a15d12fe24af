"""Deterministic step scheduling for the emulated fabric (rdma-bindings.md §8 items 3 and 5).

Every run of `EmuFabric` is a sequence of *steps*; at each point the fabric hands the scheduler the
list of enabled steps (oldest first) and runs the one it picks. Step labels are unique among the steps
enabled at one time, so the list of labels of a run (its *schedule*) replays it exactly:

- actor steps are labelled by the actor's name, plus ``:<name>`` when the actor paused or waits under
  a name (``pause("read-slot")`` -> ``X:read-slot``);
- NIC steps are labelled ``<connection endpoint>/<work request tag>:<phase>`` with phases ``arrive``,
  ``place@<offset>`` (one per RDMA Write chunk), ``deliver`` (Send / Immediate Data), ``read@<offset>``
  (one per RDMA Read Response chunk, sampling the source when it runs) and ``atomic``.

Policies: `FifoScheduler` (oldest enabled step), `RandomScheduler` (uniform, seeded), `PctScheduler`
(random priorities with a few priority-change points, which finds deep-ordering bugs with fewer runs),
and `ScriptScheduler` (an explicit list of label patterns; see its docstring).
"""

from __future__ import annotations

import random
import re
from collections.abc import Callable, Sequence
from fnmatch import translate
from typing import Protocol


class Step:
    """One schedulable unit: a label, the actor or NIC it belongs to, and the code that performs it."""

    __slots__ = ("fn", "label", "link", "who")

    def __init__(self, label: str, who: str, fn: Callable[[], None], link: int = -1) -> None:
        self.label = label
        self.who = who  # actor name, or the connection endpoint whose NIC performs the step
        self.fn = fn
        self.link = link  # connection the step belongs to (removed when the connection fails); -1: none

    def __repr__(self) -> str:
        return f"Step({self.label!r})"


class ScheduleError(Exception):
    """A schedule script cannot be followed: the step it names is not enabled and nothing else may run."""


class Scheduler(Protocol):
    """Picks the index of the next step among the enabled ones (oldest first)."""

    seed: int | None

    def choose(self, enabled: Sequence[Step]) -> int: ...
    def describe(self) -> dict[str, object]: ...


class FifoScheduler:
    """Always the oldest enabled step: the most 'natural' order, and the fallback of scripts."""

    seed: int | None = None

    def choose(self, enabled: Sequence[Step]) -> int:
        return 0

    def describe(self) -> dict[str, object]:
        return {"policy": "fifo"}


class RandomScheduler:
    """Uniform choice among enabled steps from ``random.Random(seed)``."""

    def __init__(self, seed: int) -> None:
        self.seed: int | None = seed
        self._random = random.Random(seed).random  # random() * n is much faster than randrange(n)

    def choose(self, enabled: Sequence[Step]) -> int:
        n = len(enabled)
        return 0 if n == 1 else int(self._random() * n)

    def describe(self) -> dict[str, object]:
        return {"policy": "random", "seed": self.seed}


class PctScheduler:
    """PCT-style: each actor/NIC ("who") gets a random priority; the highest enabled runs.

    At ``depth - 1`` random step numbers (below ``horizon``) the running "who" drops to the lowest
    priority, which is how PCT reaches orderings that need a few specific preemptions.
    """

    def __init__(self, seed: int, depth: int = 3, horizon: int = 200) -> None:
        self.seed: int | None = seed
        self._rng = random.Random(seed)
        self._prio: dict[str, float] = {}
        self._changes = {self._rng.randrange(horizon) for _ in range(max(0, depth - 1))}
        self._n = 0
        self._low = 0.0
        self.depth = depth
        self.horizon = horizon

    def choose(self, enabled: Sequence[Step]) -> int:
        prio = self._prio
        best = 0
        best_p = -1.0
        for i, step in enumerate(enabled):
            p = prio.get(step.who)
            if p is None:
                p = prio[step.who] = 1.0 + self._rng.random()
            if p > best_p:
                best, best_p = i, p
        if self._n in self._changes:
            self._low -= 1.0
            prio[enabled[best].who] = self._low
        self._n += 1
        return best

    def describe(self) -> dict[str, object]:
        return {"policy": "pct", "seed": self.seed, "depth": self.depth, "horizon": self.horizon}


class ScriptScheduler:
    """Follows an explicit schedule script: a list of label patterns (``fnmatch`` globs, exact labels).

    At each point, if the script's next entry matches an enabled step, that step runs and the script
    advances. Otherwise the fallback policy (FIFO unless given) picks among the enabled steps that match
    no remaining entry, so steps the script orders later are held back until their turn. When every
    enabled step is held back, the script cannot be followed and `ScheduleError` names the entry and the
    enabled labels. After the script is used up the fallback runs freely.

    A recorded schedule (the labels of a run) is a script that replays the run exactly; a short
    hand-written script forces just the interleaving a regression test is about.
    """

    def __init__(self, script: Sequence[str], fallback: Scheduler | None = None) -> None:
        self.script = list(script)
        self.fallback: Scheduler = fallback or FifoScheduler()
        self.seed = self.fallback.seed
        self._pos = 0
        self._pats: list[Callable[[str], object]] = [self._compile(p) for p in self.script]

    @staticmethod
    def _compile(pattern: str) -> Callable[[str], object]:
        if any(c in pattern for c in "*?["):
            return re.compile(translate(pattern)).match
        return pattern.__eq__

    @property
    def remaining(self) -> list[str]:
        return self.script[self._pos :]

    def choose(self, enabled: Sequence[Step]) -> int:
        if self._pos >= len(self._pats):
            return self.fallback.choose(enabled)
        match = self._pats[self._pos]
        for i, step in enumerate(enabled):
            if match(step.label):
                self._pos += 1
                return i
        later = self._pats[self._pos :]
        free = [i for i, step in enumerate(enabled) if not any(p(step.label) for p in later)]
        if not free:
            raise ScheduleError(
                f"schedule script entry {self._pos} {self.script[self._pos]!r} is not enabled and every enabled "
                f"step is held for a later entry; enabled: {[s.label for s in enabled]}"
            )
        return free[self.fallback.choose([enabled[i] for i in free])]

    def describe(self) -> dict[str, object]:
        return {"policy": "script", "script": self.script, "fallback": self.fallback.describe()}
