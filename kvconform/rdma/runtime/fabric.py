"""`RuntimeFabric`: what every in-process fabric (emulated, wire, verbs) offers through the `Runtime` it holds.

A fabric holds one `Runtime` (nodes, CQs, actors, steps, trace) and decides how its steps run (`_loop`): the
emulated fabric through its scheduler, the wire and verbs fabrics in real time between their I/O
(`kvconform.rdma.runtime.realtime`).
"""

from __future__ import annotations

import json
from abc import ABC, abstractmethod
from collections.abc import Callable
from typing import IO, Any

from kvconform.rdma.fabric import ActorGen, ActorHandle, ByteOrder, Node, RunResult, Terminate
from kvconform.rdma.profiles import Profile
from kvconform.rdma.runtime.core import Runtime
from kvconform.rdma.runtime.cq import EmuCQ
from kvconform.rdma.runtime.memory import EmuNode
from kvconform.rdma.runtime.requests import PostingEndpoint
from kvconform.rdma.scheduler import Scheduler


class RuntimeFabric(ABC):
    """The part of `kvconform.rdma.fabric.Fabric` every in-process fabric shares (see the module docstring)."""

    TRACE_NAME = "kvconform.rdma.emulated"  # the trace header's format name (one format for every fabric)

    def __init__(self, profile: Profile, scheduler: Scheduler, *, trace: bool, max_steps: int,
                 runtime: Runtime | None = None) -> None:
        """``runtime``: one to share with the fabric that holds this one (a verbs fabric's connection layer)."""
        self.profile = profile
        self.scheduler = scheduler
        self.seed = scheduler.seed
        self.max_steps = max_steps
        self.runtime = runtime if runtime is not None else Runtime(profile, seed=self.seed, tracing=trace)

    # ---- what the runtime keeps ---------------------------------------------------------------------------

    @property
    def steps(self) -> int:
        return self.runtime.steps

    @property
    def schedule(self) -> list[str]:
        """The label of every step run: replays an emulated run exactly."""
        return self.runtime.schedule

    @property
    def trace(self) -> list[dict[str, Any]]:
        return self.runtime.trace

    @property
    def events(self) -> list[tuple[str, Terminate | None]]:
        """(endpoint, Terminate) per connection failure (None: an orderly close)."""
        return self.runtime.events

    @property
    def now(self) -> float:
        return self.runtime.now

    # ---- construction -------------------------------------------------------------------------------------

    def node(self, name: str, *, byteorder: ByteOrder = "little") -> EmuNode:
        return self.runtime.add_node(EmuNode(self.runtime, name, len(self.runtime.nodes), byteorder))

    @abstractmethod
    def connect(
        self, a: Node, b: Node, *, name: str | None = None, cq_a: EmuCQ | None = None, cq_b: EmuCQ | None = None
    ) -> tuple[PostingEndpoint, PostingEndpoint]:
        """A reliable connection between two nodes of this fabric; endpoint names are ``<name>.<node>``."""

    def spawn(self, name: str, actor: ActorGen, *, daemon: bool = False) -> ActorHandle:
        """Start an actor; its first step is enabled now. ``daemon`` actors may stay blocked at the end."""
        return self.runtime.spawn(name, actor, daemon=daemon)

    # ---- running ------------------------------------------------------------------------------------------

    @abstractmethod
    def run(self, *, max_steps: int | None = None) -> RunResult:
        """Run until nothing more can happen, ``max_steps``, or the fabric's own bound."""

    @abstractmethod
    def _loop(self, stop: Callable[[], bool] | None, deadline: float | None, max_steps: int) -> str:
        """Run steps until ``stop()`` ("predicate"), ``deadline`` ("timeout"), ``max_steps`` or quiescence."""

    def run_until(
        self, predicate: Callable[[], bool], *, timeout: float | None = None, max_steps: int | None = None
    ) -> bool:
        """Run steps until ``predicate()`` holds (True), or quiescence, ``timeout`` seconds of fabric time or
        ``max_steps`` (False). The way a test drives the fabric without actors (rdma-bindings §8 item 1).
        With a ``timeout``, daemon timers keep firing until it expires."""
        deadline = None if timeout is None else self.runtime.now + timeout
        limit = self.max_steps if max_steps is None else max_steps
        return self._loop(predicate, deadline, limit) == "predicate"

    # ---- the trace ----------------------------------------------------------------------------------------

    def trace_header(self) -> dict[str, Any]:
        return {
            "trace": self.TRACE_NAME,
            "profile": self.profile.name,
            "scheduler": self.scheduler.describe(),
            "seed": self.seed,
        }

    def write_trace(self, out: str | IO[str]) -> None:
        """The JSONL step trace: a header line, then one object per step (label, who, effects).

        Without ``trace=True`` the steps carry only their labels (the schedule) and the header says so.
        """
        rt = self.runtime
        header = self.trace_header() | {"effects": rt.tracing}
        lines = [json.dumps(header, sort_keys=True)]
        if rt.tracing:
            lines += [json.dumps(rec, sort_keys=True, default=_json_default) for rec in rt.trace]
        else:
            lines += [json.dumps({"label": label, "step": n}) for n, label in enumerate(rt.schedule, 1)]
        text = "\n".join(lines) + "\n"
        if isinstance(out, str):
            with open(out, "w", encoding="utf-8") as fh:
                fh.write(text)
        else:
            out.write(text)


def _json_default(value: object) -> object:
    if isinstance(value, bytes):
        return value.hex()
    return str(value)
