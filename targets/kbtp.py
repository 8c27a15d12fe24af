"""KBTP drivers: how the suites reach a target (block pool owner) or an initiator under test.

KBTP runs over RDMA, so a driver does not open a socket: it places the implementation on a node of a
fabric the harness owns (``kvconform.rdma``; the emulated fabric in CI, a wire binding or pyverbs on a
hardware testbed) and the harness plays the peer on another node of that fabric.

- ``kbtp-target``: ``KbtpTarget.start(fabric, node, params)`` puts a target on ``node``; the harness then
  connects initiator nodes and hands each target-side connection to ``TargetEndpoint.attach``.
- ``kbtp-initiator``: ``KbtpInitiator.start(fabric, node, conn, params)`` puts an initiator on ``node``
  behind ``conn`` (the harness's target is at the other end) and returns an ``InitiatorEndpoint`` whose
  operations are fabric actors (generators) the suites spawn.

Ways to reach them: ``reference`` (kvconform.kbtp, in-process), ``python:<module>:<factory>`` (any object
implementing the role's Protocol: vendors' own adapters and the harness's mutants).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, Protocol, runtime_checkable

from kvconform.kbtp.config import TargetConfig
from kvconform.kbtp.constants import EntryFlags, Features, Status
from kvconform.kbtp.initiator import InitiatorError, ReferenceInitiator
from kvconform.kbtp.target import ReferenceTarget
from kvconform.rdma import PROFILES, ActorGen, Binding, Connection, Fabric, Node, Profile
from kvconform.rdma.fabric import wait_until
from kvconform.verdicts import DriverError, TargetUnavailable

__all__ = [
    "DriverError",
    "InitiatorEndpoint",
    "InitiatorParams",
    "KbtpInitiator",
    "KbtpTarget",
    "OpResult",
    "ReferenceInitiatorDriver",
    "ReferenceInitiatorEndpoint",
    "ReferenceTargetDriver",
    "TargetEndpoint",
    "TargetParams",
    "TargetUnavailable",
    "features_of",
    "target_config",
]


NO_FEATURES = Features(0)


def features_of(names: object) -> Features:
    """PICS feature names -> Features bits."""
    out = Features(0)
    for name in names if isinstance(names, list | tuple | set | frozenset) else ():
        out |= Features[str(name)]
    return out


@dataclass(frozen=True)
class TargetParams:
    """What a target serves, from PICS ``kbtp.target`` (testbeds/schema/pics-kbtp.schema.json)."""

    binding: str = "rdmap-7306"
    features: Features = NO_FEATURES  # undeclared: only mandatory behaviour (no optional feature)
    block_size: int = 4096
    blocks: int = 22
    shared_blocks: int | None = 6
    ring_slots: int | None = 8
    quota: int = 2
    handle_count: int = 64
    max_initiators: int = 4
    max_inline: int = 256
    ticket_timeout_ms: int = 1000
    cross_initiator_load: bool = True
    interleavings: int = 100
    # Bind/free cycles the Generation-wrap check may drive on one handle (2 Generation steps each): 32768
    # reach 0xFFFF -> next from any starting Generation; fewer make the check inconclusive when it misses it.
    generation_cycles: int = 32768
    # A race judged from outside (a black box: no race points to hold) passes only when its window opened at
    # least ``race_windows`` times, within ``race_budget_s`` seconds of attempts; else inconclusive with the count.
    race_windows: int = 3
    race_budget_s: float = 20.0
    # Per-Initiator-ID quotas a scenario asks for (the text's deferred-free example: X 1, Y 3); a target
    # that cannot honour them raises TargetUnavailable and the check is inconclusive.
    quotas: tuple[tuple[bytes, int], ...] = field(default=())
    # Initiator IDs the target is configured not to trust with direct modes (KBTP-DIRECT-TRUST); empty: none
    # declared, and the trust check is not-applicable.
    untrusted_initiators: tuple[bytes, ...] = field(default=())

    @property
    def profile(self) -> Profile:
        return PROFILES[self.binding]

    @classmethod
    def from_pics(cls, raw: dict[str, Any]) -> TargetParams:
        pool = raw.get("pool", {})
        d = cls()
        return cls(
            binding=str(raw.get("binding", d.binding)),
            features=features_of(raw["features"]) if "features" in raw else d.features,
            block_size=int(pool.get("block_size", d.block_size)),
            blocks=int(pool.get("blocks", d.blocks)),
            shared_blocks=pool.get("shared_blocks", d.shared_blocks),
            ring_slots=pool.get("ring_slots", d.ring_slots),
            quota=int(raw.get("quota", d.quota)),
            handle_count=int(raw.get("handle_count", d.handle_count)),
            max_initiators=int(raw.get("max_initiators", d.max_initiators)),
            max_inline=int(raw.get("max_inline", d.max_inline)),
            ticket_timeout_ms=int(raw.get("ticket_timeout_ms", d.ticket_timeout_ms)),
            cross_initiator_load=bool(raw.get("cross_initiator_load", d.cross_initiator_load)),
            interleavings=int(raw.get("interleavings", d.interleavings)),
            generation_cycles=int(raw.get("generation_cycles", d.generation_cycles)),
            race_windows=int(raw.get("race_windows", d.race_windows)),
            race_budget_s=float(raw.get("race_budget_s", d.race_budget_s)),
            untrusted_initiators=tuple(bytes.fromhex(str(i)) for i in raw.get("untrusted_initiators", ())),
        )

    def with_(self, **changes: Any) -> TargetParams:
        return replace(self, **changes)

    @property
    def shared_count(self) -> int:
        """Blocks of the shared ring (the whole pool unless ``pool.shared_blocks`` says otherwise)."""
        return self.blocks if self.shared_blocks is None else self.shared_blocks

    @property
    def partition_count(self) -> int:
        """Blocks left for DIRECT_ALLOC partitions (none unless DIRECT_ALLOC is declared and the binding has
        the atomics and connection-bound windows it needs)."""
        p = self.profile
        if not self.features & Features.DIRECT_ALLOC or not (p.atomics and p.mw_type2):
            return 0
        return self.blocks - self.shared_count

    @property
    def grants(self) -> Features:
        """The declared features a trusted initiator asking for all of them is granted: not DIRECT_ALLOC without
        room for a partition of the quota ("a partition of the pool whose size equals the initiator's quota"), nor
        RECORD_COMPLETION on RDMAP (KBTP-COMP-NO-RECORD-RDMAP)."""
        granted = self.features
        if self.partition_count < max(1, self.quota):
            granted &= ~Features.DIRECT_ALLOC
        if self.profile.binding is Binding.RDMAP:
            granted &= ~Features.RECORD_COMPLETION
        return Features(granted)

    @property
    def grant_optional(self) -> Features:
        """Declared features granting which is the target's choice at this geometry: DIRECT_ALLOC at a quota of 0
        (a partition of no block, so nothing a ticket could take)."""
        return Features(self.grants & Features.DIRECT_ALLOC if self.quota == 0 else 0)

    @property
    def sure_grants(self) -> Features:
        """The declared features a trusted initiator asking for them must be granted at this geometry."""
        return Features(self.grants & ~self.grant_optional)

    def capacity(self) -> tuple[int, int]:
        """Initiators the declared geometry serves at once: (on the shared ring, on DIRECT_ALLOC partitions),
        since the sum of quotas never exceeds the blocks their rings hold (KBTP-QUOTA-SUM)."""
        if self.quota == 0:
            return self.max_initiators, 0
        shared = min(self.max_initiators, self.shared_count // self.quota)
        return shared, min(self.max_initiators - shared, self.partition_count // self.quota)

    def describe_capacity(self) -> str:
        shared, partitions = self.capacity()
        return (f"quota {self.quota}, shared ring of {self.shared_count} blocks, {self.partition_count} blocks for "
                f"partitions, max_initiators {self.max_initiators}: {shared} shared + {partitions} partitioned")


@dataclass(frozen=True)
class InitiatorParams:
    """What an initiator may use, from PICS ``kbtp.initiator``."""

    binding: str = "rdmap-7306"
    features: Features = NO_FEATURES  # undeclared: only mandatory behaviour (no optional feature)
    requests_invalidate: bool = True

    @property
    def profile(self) -> Profile:
        return PROFILES[self.binding]

    @classmethod
    def from_pics(cls, raw: dict[str, Any]) -> InitiatorParams:
        d = cls()
        return cls(binding=str(raw.get("binding", d.binding)),
                   features=features_of(raw["features"]) if "features" in raw else d.features,
                   requests_invalidate=bool(raw.get("requests_invalidate", d.requests_invalidate)))


@dataclass
class OpResult:
    """What one initiator operation ended with: the completion's status and fields, and loaded data."""

    status: Status | int
    generation: int = 0
    data_length: int = 0
    block_offset: int = 0
    data: bytes | None = None
    detail: str = ""


# ---- role protocols ------------------------------------------------------------------------------


@runtime_checkable
class TargetEndpoint(Protocol):
    """A running target: serves every connection the harness attaches. Its clock is the fabric's
    (``fabric.now``): the harness moves time by letting its actors sleep."""

    def attach(self, conn: Connection) -> None: ...


@runtime_checkable
class KbtpTarget(Protocol):
    """kbtp-target: a KBTP target the harness can place on a fabric node."""

    def start(self, fabric: Fabric, node: Node, params: TargetParams) -> TargetEndpoint: ...


@runtime_checkable
class InitiatorEndpoint(Protocol):
    """An initiator bound to one connection. Every operation is an actor (generator) returning an OpResult
    (``hello`` returns the granted Features, or None when refused); the suites spawn them on the fabric.
    ``generation``: the Generation the caller expects (0: any), which the initiator puts in the request.
    A suite may spawn several operations at once (kbtp-initiator's Request Credits check does): the initiator
    serves them however it likes (queued or pipelined) within the Request Credits HELLO_ACK granted."""

    def hello(self) -> ActorGen: ...
    def alloc_store(self, handle: int, data: bytes, *, seal: bool = True) -> ActorGen: ...
    def store(self, handle: int, data: bytes, *, seal: bool = True, generation: int = 0) -> ActorGen: ...
    def load(self, handle: int, length: int, *, allow_unsealed: bool = False, generation: int = 0) -> ActorGen: ...
    def free(self, handle: int, *, generation: int = 0) -> ActorGen: ...
    def direct_load(self, handle: int, length: int) -> ActorGen: ...
    def direct_alloc(self, handle: int, data: bytes) -> ActorGen: ...
    def goodbye(self, release: bool = False) -> ActorGen: ...

    @property
    def initiator_id(self) -> bytes: ...
    @property
    def handle_base(self) -> int: ...
    @property
    def handle_count(self) -> int: ...
    @property
    def quota(self) -> int: ...


@runtime_checkable
class KbtpInitiator(Protocol):
    """kbtp-initiator: a KBTP initiator the harness can place on a fabric node, facing ``conn``."""

    def start(self, fabric: Fabric, node: Node, conn: Connection, params: InitiatorParams) -> InitiatorEndpoint: ...


# ---- the reference implementations ------------------------------------------------------------------

# The reference starts every entry's Generation this close below the 16-bit wrap, so the suites drive it
# through the wrap within a few dozen bind/free cycles (DESIGN.md principle 8).
REFERENCE_START_GENERATION = 0xFFEC


def target_config(params: TargetParams) -> Any:
    """The reference target's TargetConfig for declared ``params``."""

    return TargetConfig(
        block_size=params.block_size, pool_blocks=params.blocks, shared_blocks=params.shared_blocks,
        shared_ring_slots=params.ring_slots, quota=params.quota, handle_count=params.handle_count,
        max_initiators=params.max_initiators, max_inline=params.max_inline,
        ticket_timeout_ms=params.ticket_timeout_ms, features=params.features,
        quotas=dict(params.quotas), untrusted_initiators=frozenset(params.untrusted_initiators))


class _ReferenceEndpoint:
    """A reference target (or a subclass of it: the harness's mutants) serving attached connections."""

    def __init__(self, target: Any) -> None:
        self.target = target

    def attach(self, conn: Connection) -> None:
        self.target.accept(conn)


class ReferenceTargetDriver:
    """kbtp-target driver of the reference target (kvconform.kbtp.target.ReferenceTarget).

    ``target_class`` is what mutants replace: a subclass with one rule broken.
    """

    target_class: Any = None
    start_generation: int | None = REFERENCE_START_GENERATION

    def start(self, fabric: Fabric, node: Node, params: TargetParams) -> TargetEndpoint:
        cls = self.target_class or ReferenceTarget
        try:
            target = cls(fabric, node, target_config(params))
        except ValueError as exc:
            raise TargetUnavailable(f"the reference target refuses {params}: {exc}") from exc
        if self.start_generation is not None:
            table = target.table
            for h in range(table.base_handle, table.base_handle + table.entries):
                table.write_state(h, EntryFlags(0), self.start_generation)
        return _ReferenceEndpoint(target)


class ReferenceInitiatorEndpoint:
    """The reference initiator behind the InitiatorEndpoint protocol.

    The reference initiator leaves its Allocation Quota to its caller; this driver is that caller, so it
    keeps the usage (bound handles + tickets in flight) and refuses locally, with NO_SPACE, an
    allocation that would exceed the quota (KBTP-QUOTA-INITIATOR) instead of sending it.

    Operations may be spawned by several actors at once; the reference initiator keeps one request
    outstanding, so each operation waits (bounded) until the previous one has finished: it never has more
    requests outstanding than any Request Credits a target grants (KBTP-INIT-REQUEST-CREDITS).
    """

    def __init__(self, ini: Any) -> None:
        self.ini = ini
        self.bound: set[int] = set()
        self.in_flight = 0
        self.busy = False

    def serial(self, op: ActorGen) -> ActorGen:
        """Run ``op`` once no other operation of this endpoint is running."""

        while self.busy:  # re-checked on waking: several waiters may wake when one operation ends
            idle = yield from wait_until(lambda: not self.busy, name="initiator-idle", timeout=self.ini.timeout_s)
            if not idle:
                raise InitiatorError(f"the previous operation did not finish within {self.ini.timeout_s} s of fabric "
                                     "time")
        self.busy = True
        try:
            return (yield from op)
        finally:
            self.busy = False

    @property
    def initiator_id(self) -> bytes:
        return bytes(self.ini.initiator_id)

    @property
    def handle_base(self) -> int:
        return int(self.ini.ack.handle_base) if self.ini.ack else 0

    @property
    def handle_count(self) -> int:
        return int(self.ini.ack.handle_count) if self.ini.ack else 0

    @property
    def quota(self) -> int:
        return int(self.ini.ack.allocation_quota) if self.ini.ack else 0

    def _room(self) -> bool:
        return len(self.bound) + self.in_flight < self.quota

    @staticmethod
    def _result(r: Any) -> OpResult:
        return OpResult(r.status, r.generation, r.data_length, r.block_offset, r.data)

    def hello(self) -> ActorGen:
        return self.serial(self._hello())

    def alloc_store(self, handle: int, data: bytes, *, seal: bool = True) -> ActorGen:
        return self.serial(self._alloc_store(handle, data, seal=seal))

    def store(self, handle: int, data: bytes, *, seal: bool = True, generation: int = 0) -> ActorGen:
        return self.serial(self._store(handle, data, seal=seal, generation=generation))

    def load(self, handle: int, length: int, *, allow_unsealed: bool = False, generation: int = 0) -> ActorGen:
        return self.serial(self._load(handle, length, allow_unsealed=allow_unsealed, generation=generation))

    def free(self, handle: int, *, generation: int = 0) -> ActorGen:
        return self.serial(self._free(handle, generation=generation))

    def direct_load(self, handle: int, length: int) -> ActorGen:
        return self.serial(self._direct_load(handle, length))

    def direct_alloc(self, handle: int, data: bytes) -> ActorGen:
        return self.serial(self._direct_alloc(handle, data))

    def goodbye(self, release: bool = False) -> ActorGen:
        return self.serial(self._goodbye(release))

    def _hello(self) -> ActorGen:
        ack = yield from self.ini.hello()
        return Features(ack.features) if ack.status == Status.OK else None

    def _alloc_store(self, handle: int, data: bytes, *, seal: bool = True) -> ActorGen:
        if not self._room():
            return OpResult(Status.NO_SPACE, detail="refused locally: the Allocation Quota is used up")
        self.in_flight += 1
        try:
            r = yield from self.ini.alloc_store(handle, data, seal=seal)
        finally:
            self.in_flight -= 1
        if r.ok:
            self.bound.add(handle)
        return self._result(r)

    def _store(self, handle: int, data: bytes, *, seal: bool = True, generation: int = 0) -> ActorGen:
        r = yield from self.ini.store(handle, data, generation, seal=seal)
        return self._result(r)

    def _load(self, handle: int, length: int, *, allow_unsealed: bool = False, generation: int = 0) -> ActorGen:
        r = yield from self.ini.load(handle, generation, length=length, allow_unsealed=allow_unsealed)
        return self._result(r)

    def _free(self, handle: int, *, generation: int = 0) -> ActorGen:
        r = yield from self.ini.free(handle, generation)
        if r.ok:
            self.bound.discard(handle)
        return self._result(r)

    def _direct_load(self, handle: int, length: int) -> ActorGen:
        r = yield from self.ini.direct_load(handle)
        gen = r.second.generation if r.second is not None else 0
        return OpResult(r.status, gen, len(r.data or b""), 0, r.data)

    def _direct_alloc(self, handle: int, data: bytes) -> ActorGen:
        if not self._room():
            return OpResult(Status.NO_SPACE, detail="refused locally: the Allocation Quota is used up")
        self.in_flight += 1
        try:
            r = yield from self.ini.direct_alloc(handle, data)
        finally:
            self.in_flight -= 1
        if r.bind is None:
            return OpResult(Status.NO_SPACE, detail=f"ticket {r.ticket}: no block after {r.polls} slot reads")
        if r.bind.ok:
            self.bound.add(handle)
        return self._result(r.bind)

    def _goodbye(self, release: bool = False) -> ActorGen:
        yield from self.ini.goodbye(release)
        if release:
            self.bound.clear()
        return None


class ReferenceInitiatorDriver:
    """kbtp-initiator driver of the reference initiator (kvconform.kbtp.initiator.ReferenceInitiator).

    ``initiator_class`` is what mutants replace: a subclass with one rule broken.
    """

    initiator_class: Any = None

    def start(self, fabric: Fabric, node: Node, conn: Connection, params: InitiatorParams) -> InitiatorEndpoint:
        cls = self.initiator_class or ReferenceInitiator
        ini = cls(fabric, node, conn, requested=params.features, invalidate=params.requests_invalidate)
        endpoint: InitiatorEndpoint = ReferenceInitiatorEndpoint(ini)
        return endpoint
