"""A reference target and N reference initiators on one emulated fabric, in one call (for tests and suites).

    from kvconform.kbtp.harness import build

    h = build(2, config=TargetConfig(pool_blocks=8), seed=7)        # seeded random interleavings
    x, y = h.initiators

    def scenario():
        yield from x.hello()
        done = yield from x.alloc_store(x.handle(0), b"KVBLOCK!", seal=True)
        return done

    result = h.run(x=scenario())["x"]                               # runs to quiescence, bounded
    h.target.counters.count(Opcode.ALLOC_STORE, Status.OK)            # observe the target

``target_cls`` / ``initiator_cls`` take a subclass (a mutant overriding one method).  ``scheduler``
(e.g. `ScriptScheduler`) replaces the seeded policy; ``trace=True`` keeps the JSONL step trace.
Initiator IDs come from ``random.Random(seed)`` so a run replays; production initiators use
``secrets`` (the reference initiator's default).
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from kvconform.kbtp.config import TargetConfig
from kvconform.kbtp.constants import Features
from kvconform.kbtp.initiator import ALL_REQUESTED, ReferenceInitiator
from kvconform.kbtp.target import ReferenceTarget
from kvconform.rdma.emulated import EmuFabric
from kvconform.rdma.fabric import ActorGen, Node
from kvconform.rdma.profiles import RDMAP_7306, Profile
from kvconform.rdma.scheduler import Scheduler


class HarnessError(Exception):
    """A run that did not finish: actors still blocked at quiescence, or the step budget used up."""


@dataclass
class Harness:
    """The fabric, the target, and the initiators (``initiators[i]`` on node ``I<i>``)."""

    fabric: EmuFabric
    target: ReferenceTarget
    initiators: list[ReferenceInitiator]
    initiator_cls: type[ReferenceInitiator] = ReferenceInitiator
    nodes: dict[str, Node] = field(default_factory=dict)
    _links: int = 0

    def connect(self, node_name: str, *, initiator_id: bytes | None = None,
                requested: Features = ALL_REQUESTED, **kwargs: Any) -> ReferenceInitiator:
        """A new connection from node ``node_name`` (created if new), accepted by the target.

        Pass the Initiator ID of an earlier initiator to reconnect as it.
        """
        node = self.nodes.get(node_name)
        if node is None:
            node = self.nodes[node_name] = self.fabric.node(node_name)
        t_conn, i_conn = self.fabric.connect(self.target.node, node, name=f"c{self._links}")
        self._links += 1
        self.target.accept(t_conn)
        return self.initiator_cls(self.fabric, node, i_conn, initiator_id=initiator_id,
                                  requested=requested, **kwargs)

    def run(self, **actors: ActorGen) -> dict[str, Any]:
        """Spawn the actors, run the fabric to quiescence; their results by name (see `run_actors`)."""
        return self.run_actors(actors)

    def run_actors(self, actors: dict[str, ActorGen], max_steps: int = 200_000) -> dict[str, Any]:
        """Spawn the actors, run the fabric to quiescence; their results by name.  Bounded by ``max_steps``."""
        handles = {name: self.fabric.spawn(name, gen) for name, gen in actors.items()}
        result = self.fabric.run(max_steps=max_steps)
        if result.reason != "quiescent":
            raise HarnessError(f"run stopped after {result.steps} steps ({result.reason}); blocked: {result.blocked}")
        stuck = [n for n, hd in handles.items() if not hd.done]
        if stuck:
            waits = {n: handles[n].waiting for n in stuck}
            raise HarnessError(f"actors blocked at quiescence (deadlock): {waits}")
        return {name: hd.result for name, hd in handles.items()}


def initiator_ids(n: int, seed: int | None) -> list[bytes]:
    rng = random.Random(seed if seed is not None else 0x4B425450)
    return [rng.randbytes(16) for _ in range(n)]


def build(n_initiators: int = 1, *, config: TargetConfig | None = None, profile: Profile = RDMAP_7306,
          seed: int | None = None, scheduler: Scheduler | None = None, trace: bool = False,
          target_cls: type[ReferenceTarget] = ReferenceTarget,
          initiator_cls: type[ReferenceInitiator] = ReferenceInitiator,
          requested: Features | Sequence[Features] = ALL_REQUESTED, fabric: EmuFabric | None = None,
          **initiator_kwargs: Any) -> Harness:
    """Target ``T`` plus initiators ``I0..I<n-1>``, each connected and accepted, none said HELLO yet.
    ``fabric``: one to build on instead of a new emulated fabric (a `WireFabric`: the same over sockets)."""
    if fabric is None:
        fabric = EmuFabric(profile, seed=seed, scheduler=scheduler, trace=trace)
    target = target_cls(fabric, fabric.node("T"), config)
    h = Harness(fabric, target, [], initiator_cls)
    reqs = [requested] * n_initiators if isinstance(requested, Features) else list(requested)
    for i, iid in enumerate(initiator_ids(n_initiators, seed)):
        h.initiators.append(h.connect(f"I{i}", initiator_id=iid, requested=reqs[i], **initiator_kwargs))
    return h
