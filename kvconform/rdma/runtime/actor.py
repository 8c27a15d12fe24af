"""An actor of the in-process runtime: a generator of `kvconform.rdma.fabric` commands and what it is parked on."""

from __future__ import annotations

from typing import Any

from kvconform.rdma.fabric import ActorGen, ActorHandle


class Actor:
    """One spawned actor: its generator, the command it is parked on and the step label it runs under."""

    __slots__ = ("cmd", "gen", "handle", "label", "timer")

    def __init__(self, handle: ActorHandle, gen: ActorGen) -> None:
        self.handle = handle
        self.gen = gen
        self.cmd: Any = None
        self.label = handle.name
        self.timer: list[Any] | None = None
