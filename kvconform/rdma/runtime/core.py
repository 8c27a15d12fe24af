"""The runtime every in-process fabric holds: nodes and CQs, actors and their waits, steps and the trace.

An actor is a generator yielding the commands of `kvconform.rdma.fabric` (a completion, a predicate, a sleep,
a pause). The runtime parks it on what it waits for and enables its next step when that is there; the fabric
that holds the runtime decides when enabled steps run (the emulated fabric through its scheduler, the wire
fabrics in real time between their I/O) and what time it is (`Runtime.now`, which the fabric sets).
"""

from __future__ import annotations

import heapq
from collections.abc import Callable
from typing import Any

from kvconform.rdma.fabric import (
    ActorFailed,
    ActorGen,
    ActorHandle,
    FabricUsageError,
    NextCompletion,
    Pause,
    Sleep,
    Terminate,
    WaitUntil,
)
from kvconform.rdma.profiles import Profile
from kvconform.rdma.runtime.actor import Actor
from kvconform.rdma.runtime.cq import EmuCQ
from kvconform.rdma.runtime.memory import EmuNode
from kvconform.rdma.scheduler import Step


class Runtime:
    """Nodes, CQs, actors, timers, enabled steps and the trace of one fabric (see the module docstring)."""

    def __init__(self, profile: Profile, *, seed: int | None = None, tracing: bool = False) -> None:
        self.profile = profile
        self.seed = seed  # what an actor's failure names, to replay it
        self.now = 0.0  # fabric time, kept by the fabric that holds the runtime
        self.steps = 0
        self.enabled: list[Step] = []
        self.nodes: dict[str, EmuNode] = {}
        self.cqs: list[EmuCQ] = []
        self.actors: list[Actor] = []
        self.until: list[Actor] = []  # actors waiting on a predicate
        self.timers: list[list[Any]] = []  # heap of [deadline, seq, actor, live, cancel]
        self._timer_seq = 0
        self.failure: ActorFailed | None = None
        self.schedule: list[str] = []  # the label of every step run
        self.tracing = tracing
        self.trace: list[dict[str, Any]] = []
        self.pending_notes: list[dict[str, Any]] = []  # the effects of the step being run
        self.events: list[tuple[str, Terminate | None]] = []  # (endpoint, Terminate) per connection failure

    # ---- nodes, CQs, trace ---------------------------------------------------------------------------

    def add_node(self, node: EmuNode) -> EmuNode:
        if node.name in self.nodes:
            raise FabricUsageError(f"node {node.name!r} exists")
        self.nodes[node.name] = node
        return node

    def new_cq(self, name: str) -> EmuCQ:
        cq = EmuCQ(self, name)
        self.cqs.append(cq)
        return cq

    def note(self, who: str, what: str, **args: Any) -> None:
        """Record an effect of the running step (only when tracing)."""
        if self.tracing:
            self.pending_notes.append({"who": who, "do": what, **args})

    def add(self, label: str, who: str, fn: Callable[[], None], link: int = -1) -> None:
        """Enable a step."""
        self.enabled.append(Step(label, who, fn, link))

    def drop_link(self, link: int) -> None:
        """The connection ``link`` failed: the steps of its NICs go."""
        self.enabled[:] = [s for s in self.enabled if s.link != link]

    # ---- actors --------------------------------------------------------------------------------------

    def spawn(self, name: str, actor: ActorGen, *, daemon: bool = False) -> ActorHandle:
        """Start an actor; its first step is enabled now. ``daemon`` actors may stay blocked at the end."""
        if any(a.handle.name == name for a in self.actors):
            raise FabricUsageError(f"actor {name!r} exists")
        act = Actor(ActorHandle(name, daemon), actor)
        self.actors.append(act)
        self._enable_actor(act, None)
        return act.handle

    def blocked(self) -> tuple[str, ...]:
        """Non-daemon actors not done."""
        return tuple(a.handle.name for a in self.actors if not a.handle.done and not a.handle.daemon)

    def _enable_actor(self, act: Actor, value: Any) -> None:
        self.add(act.label, act.handle.name, lambda: self._resume(act, value))

    def wake(self, act: Actor, value: Any) -> None:
        """What ``act`` waits for is there: its next step is enabled, resuming with ``value``."""
        if act.timer is not None:
            act.timer[3] = False  # cancel the timeout
            act.timer = None
        act.handle.waiting = ""
        self._enable_actor(act, value)

    def _resume(self, act: Actor, value: Any) -> None:
        try:
            cmd = act.gen.send(value)
        except StopIteration as stop:
            act.handle.done = True
            act.handle.result = stop.value
            self.note(act.handle.name, "exit")
            return
        except Exception as exc:  # an actor's failure ends the run with the seed that shows it
            self._actor_error(act, exc)
            return
        self._park(act, cmd)

    def _park(self, act: Actor, cmd: Any) -> None:
        act.cmd = cmd
        name = act.handle.name
        if isinstance(cmd, Pause):
            act.label = f"{name}:{cmd.name}" if cmd.name else name
            self._enable_actor(act, None)
        elif isinstance(cmd, NextCompletion):
            act.label = f"{name}:{cmd.name}" if cmd.name else name
            cq = cmd.cq
            if not isinstance(cq, EmuCQ):
                self._actor_error(
                    act, FabricUsageError(f"actor {name}: {cq!r} is not a completion queue of this fabric")
                )
                return
            wc = cq.take(cmd.match)
            if wc is not None:
                self._enable_actor(act, wc)
            else:
                act.handle.waiting = f"completion on {cq.name}"
                cq.waiters.append(act)
                if cmd.timeout is not None:
                    self._timer(act, cmd.timeout, lambda: cq.waiters.remove(act))
        elif isinstance(cmd, WaitUntil):
            act.label = f"{name}:{cmd.name}" if cmd.name else name
            if cmd.predicate():
                self._enable_actor(act, True)
            else:
                act.handle.waiting = f"until {cmd.name or cmd.predicate!r}"
                self.until.append(act)
                if cmd.timeout is not None:
                    self._timer(act, cmd.timeout, lambda: self.until.remove(act))
        elif isinstance(cmd, Sleep):
            act.label = f"{name}:sleep"
            act.handle.waiting = f"sleep {cmd.seconds}"
            self._timer(act, cmd.seconds, None)
        else:
            self._actor_error(
                act, TypeError(f"actor {name} yielded {cmd!r}; use the helpers of kvconform.rdma.fabric (yield from)")
            )

    def _actor_error(self, act: Actor, exc: BaseException) -> None:
        act.handle.done = True
        act.handle.error = exc
        self.failure = ActorFailed(act.handle.name, self.steps, self.seed, exc)
        self.failure.__cause__ = exc

    # ---- timers and predicates -----------------------------------------------------------------------

    def _timer(self, act: Actor, seconds: float, cancel: Callable[[], None] | None) -> None:
        self._timer_seq += 1
        entry: list[Any] = [self.now + seconds, self._timer_seq, act, True, cancel]
        act.timer = entry
        heapq.heappush(self.timers, entry)

    def fire_timers(self) -> None:
        """Resume the actors whose timer is due at `now`."""
        while self.timers and self.timers[0][0] <= self.now:
            _, _, act, live, cancel = heapq.heappop(self.timers)
            if not live:
                continue
            act.timer = None
            if cancel is not None:
                cancel()
            act.handle.waiting = ""
            # a timed-out wait resumes with None (completion) / False (predicate); a Sleep with None
            self._enable_actor(act, False if isinstance(act.cmd, WaitUntil) else None)

    def check_until(self) -> None:
        """Resume the actors whose predicate now holds."""
        for act in list(self.until):
            try:
                ready = act.cmd.predicate()
            except Exception as exc:  # a broken predicate is the waiting actor's failure
                self.until.remove(act)
                self._actor_error(act, exc)
                return
            if ready:
                self.until.remove(act)
                self.wake(act, True)

    def timed_waiter_names(self) -> list[str]:
        """Non-daemon actors waiting on a timer."""
        return [entry[2].handle.name for entry in self.timers
                if entry[3] and not entry[2].handle.daemon and not entry[2].handle.done]
