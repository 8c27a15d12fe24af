"""`EmuFabric`: the in-process, deterministic binding of the fabric interface (rdma-bindings.md §8 items 3-5).

Memory is ``bytearray``s. Each remote operation is split into steps that the scheduler interleaves
with each other and with actor steps (see `kvconform.rdma.scheduler` for labels):

- ``arrive``: the next work request of a send queue reaches the responder (in post order per
  connection, like an RDMAP stream / RC PSN sequence). Remote STag, bounds and access rights are
  checked here (RFC 5040 §2.2); a violation sends a Terminate (§2.5-2.6) and fails the connection.
  The source of an RDMA Write or Send is read from requester memory at this step.
- ``place@off``: one ``profile.chunk_bytes`` chunk of an RDMA Write. Placement model ``rdmap``
  (RFC 5040 §5.5 rule 3): all chunks of every arrived Write may be placed in any order; ``ib_psn_order``:
  in order, one message after the other; ``strict``: the whole Write at arrival.
- ``deliver``: a Send / Send with Invalidate / Immediate Data is delivered to a posted Recv only once
  every earlier message of the stream is placed or delivered (rule 5). Remote invalidation happens
  here, before the completion.
- ``read@off``: one chunk of an RDMA Read Response, sampling the responder's memory when it runs, so a
  16-octet read can mix old and new halves (not atomic). Reads and atomics are processed in order per
  connection and only after every earlier Write of that connection is placed.
- ``atomic``: FetchAdd / CmpSwap executes as one indivisible read-modify-write of the 64-bit word in
  the responder's memory byte order (§1.5), and its original value lands in the requester's SGE.

Requester completions are produced in post order per connection. Fabric time (`EmuFabric.now`) moves
by ``tick`` per step and jumps to the next timer when nothing else can run.
"""

from __future__ import annotations

import heapq
import json
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from typing import IO, Any

from kvconform.rdma.completion import InOrderCompletions, flushed, wr_byte_len
from kvconform.rdma.fabric import (
    POST_METHOD,
    U64,
    Access,
    ActorFailed,
    ActorGen,
    ActorHandle,
    Buffer,
    ByteOrder,
    Completion,
    Connection,
    ConnState,
    DdpEType,
    DdpUntaggedCode,
    FabricUsageError,
    Layer,
    LocalData,
    NextCompletion,
    Node,
    Op,
    Pause,
    RdmapEType,
    Region,
    RunResult,
    SendWr,
    Sge,
    Sleep,
    Status,
    Terminate,
    WaitUntil,
    Window,
    masked_add,
    masked_cmp_swap,
)
from kvconform.rdma.memory import atomic_misaligned, remote_invalidate_refusal, resolve
from kvconform.rdma.profiles import RDMAP_7306, Binding, PlacementModel, Profile
from kvconform.rdma.scheduler import FifoScheduler, RandomScheduler, Scheduler, Step

_VA_SPAN = 1 << 40  # each node's fake virtual addresses live in their own terabyte
_OP_NAME = {op: op.name.lower() for op in Op}  # enum attribute access is slow on the hot path
_LOCAL_WRITE = int(Access.LOCAL_WRITE)


class EmuBuffer:
    """Node memory: a ``bytearray`` at a fake, deterministic virtual address."""

    __slots__ = ("_byteorder", "addr", "data", "length")

    def __init__(self, addr: int, length: int, byteorder: ByteOrder) -> None:
        self.addr = addr
        self.length = length
        self.data = bytearray(length)
        self._byteorder: ByteOrder = byteorder

    @property
    def byteorder(self) -> ByteOrder:
        return self._byteorder

    def read(self, offset: int, length: int) -> bytes:
        if offset < 0 or offset + length > self.length:
            raise FabricUsageError(f"buffer read [{offset}, +{length}) outside 0..{self.length}")
        return bytes(self.data[offset : offset + length])

    def write(self, offset: int, data: bytes) -> None:
        if offset < 0 or offset + len(data) > self.length:
            raise FabricUsageError(f"buffer write [{offset}, +{len(data)}) outside 0..{self.length}")
        self.data[offset : offset + len(data)] = data

    def read_u64(self, offset: int) -> int:
        return int.from_bytes(self.read(offset, 8), self._byteorder)

    def write_u64(self, offset: int, value: int) -> None:
        self.write(offset, (value & U64).to_bytes(8, self._byteorder))


class EmuCQ:
    """A completion queue; actors waiting on it are handed matching completions as they arrive."""

    def __init__(self, fabric: EmuFabric, name: str) -> None:
        self.name = name
        self._fabric = fabric
        self._q: deque[Completion] = deque()
        self._waiters: list[_Actor] = []

    def poll(self, max_entries: int = 1) -> list[Completion]:
        out: list[Completion] = []
        while self._q and len(out) < max_entries:
            out.append(self._q.popleft())
        return out

    def __len__(self) -> int:
        return len(self._q)

    def _push(self, wc: Completion) -> None:
        for actor in self._waiters:
            cmd = actor.cmd
            assert isinstance(cmd, NextCompletion)
            if cmd.match is None or cmd.match(wc):
                self._waiters.remove(actor)
                self._fabric._wake(actor, wc)
                return
        self._q.append(wc)

    def _take(self, match: Callable[[Completion], bool] | None) -> Completion | None:
        if match is None:
            return self._q.popleft() if self._q else None
        for i, wc in enumerate(self._q):
            if match(wc):
                del self._q[i]
                return wc
        return None


class _Wr:
    """A send-queue work request from post to requester completion."""

    __slots__ = (
        "add",
        "compare",
        "compare_mask",
        "data",
        "dst",
        "fence",
        "imm",
        "invalidate",
        "kind",
        "mask",
        "orig",
        "parent",
        "signaled",
        "solicited",
        "src",
        "stag",
        "status",
        "swap",
        "swap_mask",
        "tag",
        "terminate",
        "to",
        "wr_id",
    )

    def __init__(self, kind: Op, wr_id: int, tag: str, signaled: bool, fence: bool) -> None:
        self.kind = kind
        self.wr_id = wr_id
        self.tag = tag
        self.signaled = signaled
        self.fence = fence
        self.status: Status | None = None  # set when the requester side is done
        self.terminate: Terminate | None = None  # what its completion carries (kvconform.rdma.completion)
        self.src: list[Sge] | bytes = b""
        self.data = b""
        self.dst: Sge | None = None
        self.stag = 0
        self.to = 0
        self.imm: bytes | None = None
        self.invalidate: int | None = None
        self.solicited = False
        self.add = self.mask = self.compare = self.swap = 0
        self.compare_mask = self.swap_mask = U64
        self.orig = 0
        self.parent: _Wr | None = None  # an Immediate Data message's RDMA Write

    # what the completion rule reads (kvconform.rdma.completion.Outcome)
    @property
    def op(self) -> Op:
        return self.kind

    @property
    def byte_len(self) -> int:
        return wr_byte_len(self.kind, self.dst, self.data)


class _Msg:
    """An inbound message at the responder, between arrival and placement / delivery / processing."""

    __slots__ = ("done", "enabled", "left", "target", "wr")

    def __init__(self, wr: _Wr) -> None:
        self.wr = wr
        self.done = False
        self.enabled = False  # its deliver / first in-order step has been enabled
        self.left = 0  # chunks not yet placed (Writes)
        self.target: tuple[EmuBuffer, int] | None = None  # (buffer, offset) resolved at arrival


class EmuConnection:
    """One endpoint of an emulated RC connection (implements `kvconform.rdma.fabric.Connection`)."""

    def __init__(self, fabric: EmuFabric, node: EmuNode, name: str, link: int, cq: EmuCQ) -> None:
        self._fabric = fabric
        self.node = node
        self.name = name
        self.link = link
        self.cq = cq
        self.profile = fabric.profile
        self.peer: EmuConnection
        self.peer_name = ""
        self._state = ConnState.CONNECTED
        self._terminate: Terminate | None = None
        self._seq = 0
        self.sq: deque[_Wr] = deque()  # posted, not yet arrived at the peer
        # posted, requester completion not yet produced: completed in post order, flushed on failure
        self.completions: InOrderCompletions[_Wr] = InOrderCompletions(name, cq._push)
        self.outstanding = self.completions.pending
        self.rq: deque[tuple[int, Sge | None]] = deque()  # posted receives
        self.inbound: deque[_Msg] = deque()  # peer's messages arrived here, not yet done
        self.responses: deque[_Msg] = deque()  # peer's Reads/atomics in processing order
        self._arrive_enabled = False
        self._resp_active = False

    @property
    def state(self) -> ConnState:
        return self._state

    @property
    def terminate(self) -> Terminate | None:
        return self._terminate

    def __repr__(self) -> str:
        return f"EmuConnection({self.name!r}, {self._state})"

    # ---- posting (non-blocking; local misuse raises, everything remote completes) -----------------

    def _new(self, kind: Op, wr_id: int, tag: str | None, signaled: bool, fence: bool) -> _Wr:
        self._seq += 1
        return _Wr(kind, wr_id, tag or f"{_OP_NAME[kind]}{self._seq}", signaled, fence)

    def _local(self, sge: Sge, need_write: bool, what: str) -> None:
        region = sge.region
        if region.node != self.node.name or self.node._stags.get(region.stag) is not region:
            raise FabricUsageError(
                f"{what}: SGE region stag {region.stag:#x} is not a valid region of {self.node.name}"
            )
        if sge.offset < 0 or sge.length < 0 or sge.offset + sge.length > region.length:
            raise FabricUsageError(
                f"{what}: SGE [{sge.offset}, +{sge.length}) outside region stag {region.stag:#x} "
                f"of {region.length} octets"
            )
        if need_write and not int(region.access) & _LOCAL_WRITE:
            raise FabricUsageError(f"{what}: region stag {region.stag:#x} lacks LOCAL_WRITE")

    def _sources(self, data: LocalData, what: str) -> list[Sge] | bytes:
        if isinstance(data, bytes | bytearray | memoryview):
            return bytes(data)
        sges = [data] if isinstance(data, Sge) else list(data)
        for sge in sges:
            self._local(sge, False, what)
        return sges

    def _imm(self, imm: bytes | None, what: str) -> bytes | None:
        if imm is not None and len(imm) != self.profile.immediate_bytes:
            raise FabricUsageError(
                f"{what}: immediate data is {len(imm)} octets; profile {self.profile.name} carries "
                f"{self.profile.immediate_bytes}"
            )
        return None if imm is None else bytes(imm)

    def post_recv(self, sge: Sge | None, wr_id: int = 0) -> int:
        if sge is not None:
            self._local(sge, True, "post_recv")
        if self._state is not ConnState.CONNECTED:
            self.cq._push(flushed(wr_id, Op.RECV, self.name))
            return wr_id
        self.rq.append((wr_id, sge))
        return wr_id

    def post_send(
        self,
        data: LocalData,
        wr_id: int = 0,
        *,
        solicited: bool = False,
        invalidate: int | None = None,
        imm: bytes | None = None,
        signaled: bool = True,
        fence: bool = False,
        tag: str | None = None,
    ) -> int:
        if invalidate is not None and not self.profile.send_with_invalidate:
            raise FabricUsageError(f"post_send: profile {self.profile.name} has no Send with Invalidate")
        if imm is not None and self.profile.binding is Binding.RDMAP:
            raise FabricUsageError("post_send: RDMAP carries immediate data only after an RDMA Write (post_write imm=)")
        wr = self._new(Op.SEND, wr_id, tag, signaled, fence)
        wr.src = self._sources(data, "post_send")
        wr.solicited = solicited
        wr.invalidate = invalidate
        wr.imm = self._imm(imm, "post_send")
        return self._post(wr)

    def post_write(
        self,
        data: LocalData,
        stag: int,
        to: int,
        wr_id: int = 0,
        *,
        imm: bytes | None = None,
        signaled: bool = True,
        fence: bool = False,
        tag: str | None = None,
    ) -> int:
        wr = self._new(Op.RDMA_WRITE, wr_id, tag, signaled, fence)
        wr.src = self._sources(data, "post_write")
        wr.stag, wr.to = stag, to
        wr.imm = self._imm(imm, "post_write")
        return self._post(wr)

    def post_read(
        self,
        dst: Sge,
        stag: int,
        to: int,
        wr_id: int = 0,
        *,
        signaled: bool = True,
        fence: bool = False,
        tag: str | None = None,
    ) -> int:
        self._local(dst, True, "post_read")
        wr = self._new(Op.RDMA_READ, wr_id, tag, signaled, fence)
        wr.dst, wr.stag, wr.to = dst, stag, to
        return self._post(wr)

    def _atomic(
        self, kind: Op, dst: Sge, stag: int, to: int, wr_id: int, tag: str | None, signaled: bool, fence: bool
    ) -> _Wr:
        if not self.profile.atomics:
            raise FabricUsageError(f"{kind.name}: profile {self.profile.name} has no atomic operations")
        self._local(dst, True, kind.name)
        if dst.length != 8:
            raise FabricUsageError(f"{kind.name}: the local SGE must be 8 octets, got {dst.length}")
        wr = self._new(kind, wr_id, tag, signaled, fence)
        wr.dst, wr.stag, wr.to = dst, stag, to
        return wr

    def post_fetch_add(
        self,
        dst: Sge,
        stag: int,
        to: int,
        add: int,
        mask: int = 0,
        wr_id: int = 0,
        *,
        signaled: bool = True,
        fence: bool = False,
        tag: str | None = None,
    ) -> int:
        if mask and not self.profile.masked_atomics:
            raise FabricUsageError(
                f"post_fetch_add: Add Mask {mask:#018x} needs masked atomics (RFC 7306); profile {self.profile.name} "
                "has only the unmasked FetchAdd"
            )
        wr = self._atomic(Op.FETCH_ADD, dst, stag, to, wr_id, tag, signaled, fence)
        wr.add, wr.mask = add & U64, mask & U64
        return self._post(wr)

    def post_cmp_swap(
        self,
        dst: Sge,
        stag: int,
        to: int,
        compare: int,
        swap: int,
        wr_id: int = 0,
        *,
        compare_mask: int = U64,
        swap_mask: int = U64,
        signaled: bool = True,
        fence: bool = False,
        tag: str | None = None,
    ) -> int:
        if (compare_mask & U64, swap_mask & U64) != (U64, U64) and not self.profile.masked_atomics:
            raise FabricUsageError(f"post_cmp_swap: masks need masked atomics; profile {self.profile.name} has none")
        wr = self._atomic(Op.COMP_SWAP, dst, stag, to, wr_id, tag, signaled, fence)
        wr.compare, wr.swap = compare & U64, swap & U64
        wr.compare_mask, wr.swap_mask = compare_mask & U64, swap_mask & U64
        return self._post(wr)

    def post_list(self, wrs: Sequence[SendWr]) -> list[int]:
        """Post ``wrs`` in order in one call (`kvconform.rdma.fabric.Connection.post_list`)."""
        return [getattr(self, POST_METHOD[wr.op])(*wr.args, **dict(wr.kwargs)) for wr in wrs]

    def _post(self, wr: _Wr) -> int:
        if self._state is not ConnState.CONNECTED:
            # verbs: posting to a QP in the error state completes the work request flushed
            self.cq._push(flushed(wr.wr_id, wr.kind, self.name))
            return wr.wr_id
        if self._fabric._tracing:
            self._fabric._note(self.name, "post", wr=wr.tag, op=wr.kind.name, wr_id=wr.wr_id)
        self.sq.append(wr)
        self.outstanding.append(wr)
        self._fabric._advance_sq(self)
        return wr.wr_id

    def disconnect(self) -> None:
        """Orderly close of both endpoints; outstanding work is flushed."""
        if self._state is ConnState.CONNECTED:
            self._fabric._close(self, ConnState.CLOSED, None, None, None)


class EmuNode:
    """A host of the emulated fabric (implements `kvconform.rdma.fabric.Node`)."""

    def __init__(self, fabric: EmuFabric, name: str, index: int, byteorder: ByteOrder) -> None:
        self._fabric = fabric
        self.name = name
        self.index = index
        self.profile = fabric.profile
        self.byteorder: ByteOrder = byteorder
        self._next_va = (index + 1) * _VA_SPAN
        self._next_index = 1
        self._stags: dict[int, Region | Window] = {}
        self._connections: dict[str, EmuConnection] = {}

    def __repr__(self) -> str:
        return f"EmuNode({self.name!r})"

    def alloc(self, length: int, *, align: int = 64) -> EmuBuffer:
        va = -(-self._next_va // align) * align
        self._next_va = va + length
        return EmuBuffer(va, length, self.byteorder)

    def _stag(self) -> int:
        index = self._next_index
        self._next_index += 1
        key = (index * 0x9D + self.index * 0x1F + 0x5A) & 0xFF  # the consumer key byte (§2.2)
        return ((index & 0xFFFFFF) << 8) | key

    def register(
        self,
        buffer: Buffer,
        access: Access,
        *,
        zero_based: bool = False,
        offset: int = 0,
        length: int | None = None,
        remote_invalidate: bool = False,
    ) -> Region:
        if not isinstance(buffer, EmuBuffer):
            raise FabricUsageError(f"register: {buffer!r} is not memory of this emulated fabric")
        length = buffer.length - offset if length is None else length
        if offset < 0 or length < 0 or offset + length > buffer.length:
            raise FabricUsageError(f"register: [{offset}, +{length}) outside the buffer of {buffer.length} octets")
        if access & (Access.REMOTE_WRITE | Access.REMOTE_ATOMIC) and not access & Access.LOCAL_WRITE:
            raise FabricUsageError("register: REMOTE_WRITE / REMOTE_ATOMIC need LOCAL_WRITE (verbs rule)")
        region = Region(self._stag(), buffer, offset, length, Access(access), zero_based, remote_invalidate, self.name)
        self._stags[region.stag] = region
        self._fabric._note(
            self.name, "register", stag=region.stag, len=length, access=int(access), zero_based=zero_based
        )
        return region

    def deregister(self, region: Region) -> None:
        if self._stags.get(region.stag) is not region:
            raise FabricUsageError(f"deregister: stag {region.stag:#x} is not a registered region of {self.name}")
        del self._stags[region.stag]
        self._fabric._note(self.name, "deregister", stag=region.stag)

    def _check_window(self, region: Region, offset: int, length: int, access: Access) -> None:
        """What binding a window over ``region`` asks of its arguments, whatever binds it."""
        if self._stags.get(region.stag) is not region:
            raise FabricUsageError(f"bind_window: stag {region.stag:#x} is not a registered region of {self.name}")
        if not region.access & Access.MW_BIND:
            raise FabricUsageError(f"bind_window: region stag {region.stag:#x} lacks MW_BIND")
        if access & ~(Access.REMOTE_READ | Access.REMOTE_WRITE | Access.REMOTE_ATOMIC):
            raise FabricUsageError(f"bind_window: a window grants remote rights only, got {access!r}")
        if offset < 0 or length < 0 or offset + length > region.length:
            raise FabricUsageError(f"bind_window: [{offset}, +{length}) outside region of {region.length} octets")

    def bind_window(
        self, region: Region, offset: int, length: int, access: Access, conn: Connection, *, zero_based: bool = False
    ) -> Window:
        if not self.profile.mw_type2:
            raise FabricUsageError(f"bind_window: profile {self.profile.name} has no type-2 memory windows")
        self._check_window(region, offset, length, access)
        if not isinstance(conn, EmuConnection) or conn.node is not self:
            raise FabricUsageError(f"bind_window: {conn!r} is not a connection of {self.name}")
        window = Window(self._stag(), region, offset, length, Access(access), zero_based, conn.name)
        self._stags[window.stag] = window
        self._fabric._note(self.name, "bind_window", stag=window.stag, len=length, access=int(access), conn=conn.name)
        return window

    def invalidate(self, stag: int) -> None:
        """Local invalidate / unbind: later remote accesses with ``stag`` fail with 'invalid STag'."""
        if stag not in self._stags:
            raise FabricUsageError(f"invalidate: stag {stag:#x} is not valid on {self.name}")
        del self._stags[stag]
        self._fabric._note(self.name, "invalidate", stag=stag)

    def is_valid(self, stag: int) -> bool:
        return stag in self._stags

    def create_cq(self, name: str | None = None) -> EmuCQ:
        return EmuCQ(self._fabric, name or f"{self.name}.cq{len(self._fabric._cqs)}")

    def connection(self, name: str) -> EmuConnection:
        return self._connections[name]


class _Actor:
    __slots__ = ("cmd", "gen", "handle", "label", "timer")

    def __init__(self, handle: ActorHandle, gen: ActorGen) -> None:
        self.handle = handle
        self.gen = gen
        self.cmd: Any = None
        self.label = handle.name
        self.timer: list[Any] | None = None


def _chunks(length: int, size: int) -> Iterable[tuple[int, int]]:
    for off in range(0, length, size):
        yield off, min(size, length - off)


class EmuFabric:
    """The emulated fabric: nodes, connections, actors and the step loop (implements ``Fabric``).

    ``seed`` selects `RandomScheduler(seed)` unless ``scheduler`` is given (``FifoScheduler`` when both
    are None). ``trace=True`` keeps a full step trace for `write_trace`; the schedule (labels) is
    always kept in `schedule`.
    """

    def __init__(
        self,
        profile: Profile = RDMAP_7306,
        *,
        seed: int | None = None,
        scheduler: Scheduler | None = None,
        trace: bool = False,
        tick: float = 1e-6,
        max_steps: int = 1_000_000,
    ) -> None:
        self.profile = profile
        if scheduler is None:
            scheduler = FifoScheduler() if seed is None else RandomScheduler(seed)
        self.scheduler = scheduler
        self.seed = scheduler.seed
        self.tick = tick
        self.max_steps = max_steps
        self.steps = 0
        self._now = 0.0
        self._enabled: list[Step] = []
        self._nodes: dict[str, EmuNode] = {}
        self._cqs: list[EmuCQ] = []
        self._links: list[tuple[EmuConnection, EmuConnection]] = []
        self._actors: list[_Actor] = []
        self._until: list[_Actor] = []
        self._timers: list[list[Any]] = []  # heap of [deadline, seq, actor, live]
        self._timer_seq = 0
        self._failure: ActorFailed | None = None
        self.schedule: list[str] = []
        self._tracing = trace
        self.trace: list[dict[str, Any]] = []
        self._pending_notes: list[dict[str, Any]] = []
        self.events: list[tuple[str, Terminate | None]] = []  # (endpoint, Terminate) per connection failure

    # ---- construction ------------------------------------------------------------------------------------

    @property
    def now(self) -> float:
        return self._now

    def node(self, name: str, *, byteorder: ByteOrder = "little") -> EmuNode:
        if name in self._nodes:
            raise FabricUsageError(f"node {name!r} exists")
        node = self._nodes[name] = EmuNode(self, name, len(self._nodes), byteorder)
        return node

    def connect(
        self, a: Node, b: Node, *, name: str | None = None, cq_a: EmuCQ | None = None, cq_b: EmuCQ | None = None
    ) -> tuple[EmuConnection, EmuConnection]:
        """A reliable connection; endpoint names are ``<name>.<node>`` (default name ``<a>-<b>``)."""
        if not isinstance(a, EmuNode) or not isinstance(b, EmuNode):
            raise FabricUsageError("connect: both ends must be nodes of this fabric")
        base = name or f"{a.name}-{b.name}"
        link = len(self._links)
        ends = []
        for node, cq in ((a, cq_a), (b, cq_b)):
            ep_name = f"{base}.{node.name}"
            if ep_name in node._connections:
                raise FabricUsageError(f"connect: endpoint {ep_name!r} exists; pass name=")
            cq = cq or self._new_cq(f"{ep_name}.cq")
            conn = EmuConnection(self, node, ep_name, link, cq)
            node._connections[ep_name] = conn
            ends.append(conn)
        ends[0].peer, ends[1].peer = ends[1], ends[0]
        ends[0].peer_name, ends[1].peer_name = ends[1].name, ends[0].name
        self._links.append((ends[0], ends[1]))
        return ends[0], ends[1]

    def _new_cq(self, name: str) -> EmuCQ:
        cq = EmuCQ(self, name)
        self._cqs.append(cq)
        return cq

    def spawn(self, name: str, actor: ActorGen, *, daemon: bool = False) -> ActorHandle:
        """Start an actor; its first step is enabled now. ``daemon`` actors may stay blocked at the end."""
        if any(a.handle.name == name for a in self._actors):
            raise FabricUsageError(f"actor {name!r} exists")
        act = _Actor(ActorHandle(name, daemon), actor)
        self._actors.append(act)
        self._enable_actor(act, None)
        return act.handle

    # ---- the step loop -----------------------------------------------------------------------------------

    def run(self, *, max_steps: int | None = None) -> RunResult:
        """Run steps until nothing can run (quiescent) or ``max_steps``; raise `ActorFailed` if an actor raised.

        Timers keep the run going only while a non-daemon actor is unfinished, so a daemon's periodic
        sleep (a reclaim timer) does not keep an otherwise finished run alive.
        """
        reason = self._loop(None, None, self.max_steps if max_steps is None else max_steps)
        return RunResult(self.steps, "max_steps" if reason == "max_steps" else "quiescent", self._blocked())

    def run_until(
        self, predicate: Callable[[], bool], *, timeout: float | None = None, max_steps: int | None = None
    ) -> bool:
        """Run steps until ``predicate()`` holds (True), or quiescence, ``timeout`` seconds of fabric time or
        ``max_steps`` (False). The way a test drives the fabric without actors (rdma-bindings §8 item 1).
        With a ``timeout``, daemon timers keep firing until it expires."""
        deadline = None if timeout is None else self._now + timeout
        limit = self.max_steps if max_steps is None else max_steps
        return self._loop(predicate, deadline, limit) == "predicate"

    def _blocked(self) -> tuple[str, ...]:
        return tuple(a.handle.name for a in self._actors if not a.handle.done and not a.handle.daemon)

    def _loop(self, stop: Callable[[], bool] | None, deadline: float | None, max_steps: int) -> str:
        limit = self.steps + max_steps
        enabled = self._enabled
        choose = self.scheduler.choose
        schedule = self.schedule
        tick = self.tick
        until = self._until  # both lists are only ever mutated in place
        timers = self._timers
        while True:
            if stop is not None and stop():
                return "predicate"
            if deadline is not None and self._now >= deadline:
                return "timeout"
            if until:
                self._check_until()
            if timers and timers[0][0] <= self._now:
                self._fire_timers()
            if not enabled:
                # daemon timers advance time only for a bounded wait or an unfinished non-daemon actor
                if not self._timers or (deadline is None and not self._blocked()):
                    return "quiescent"
                self._now = max(self._now, self._timers[0][0])
                if deadline is not None and self._now > deadline:
                    self._now = deadline
                    return "timeout"
                self._fire_timers()
                continue
            if self.steps >= limit:
                return "max_steps"
            step = enabled.pop(choose(enabled))
            self.steps += 1
            self._now += tick
            schedule.append(step.label)
            if self._tracing:
                self._pending_notes = []
                step.fn()
                self.trace.append(
                    {
                        "step": self.steps,
                        "t": round(self._now, 9),
                        "label": step.label,
                        "who": step.who,
                        "effects": self._pending_notes,
                    }
                )
            else:
                step.fn()
            if self._failure is not None:
                raise self._failure

    def _note(self, who: str, what: str, **args: Any) -> None:
        if self._tracing:
            self._pending_notes.append({"who": who, "do": what, **args})

    def trace_header(self) -> dict[str, Any]:
        return {
            "trace": "kvconform.rdma.emulated",
            "profile": self.profile.name,
            "scheduler": self.scheduler.describe(),
            "seed": self.seed,
        }

    def write_trace(self, out: str | IO[str]) -> None:
        """The JSONL step trace: a header line, then one object per step (label, who, effects).

        Without ``trace=True`` the steps carry only their labels (the schedule) and the header says so.
        """
        header = self.trace_header() | {"effects": self._tracing}
        lines = [json.dumps(header, sort_keys=True)]
        if self._tracing:
            lines += [json.dumps(rec, sort_keys=True, default=_json_default) for rec in self.trace]
        else:
            lines += [json.dumps({"label": label, "step": n}) for n, label in enumerate(self.schedule, 1)]
        text = "\n".join(lines) + "\n"
        if isinstance(out, str):
            with open(out, "w", encoding="utf-8") as fh:
                fh.write(text)
        else:
            out.write(text)

    def _add(self, label: str, who: str, fn: Callable[[], None], link: int = -1) -> None:
        self._enabled.append(Step(label, who, fn, link))

    # ---- actors ------------------------------------------------------------------------------------------

    def _enable_actor(self, act: _Actor, value: Any) -> None:
        self._add(act.label, act.handle.name, lambda: self._resume(act, value))

    def _wake(self, act: _Actor, value: Any) -> None:
        if act.timer is not None:
            act.timer[3] = False  # cancel the timeout
            act.timer = None
        act.handle.waiting = ""
        self._enable_actor(act, value)

    def _resume(self, act: _Actor, value: Any) -> None:
        try:
            cmd = act.gen.send(value)
        except StopIteration as stop:
            act.handle.done = True
            act.handle.result = stop.value
            self._note(act.handle.name, "exit")
            return
        except Exception as exc:  # an actor's failure ends the run with the seed that shows it
            self._actor_error(act, exc)
            return
        self._park(act, cmd)

    def _park(self, act: _Actor, cmd: Any) -> None:
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
            wc = cq._take(cmd.match)
            if wc is not None:
                self._enable_actor(act, wc)
            else:
                act.handle.waiting = f"completion on {cq.name}"
                cq._waiters.append(act)
                if cmd.timeout is not None:
                    self._timer(act, cmd.timeout, lambda: cq._waiters.remove(act))
        elif isinstance(cmd, WaitUntil):
            act.label = f"{name}:{cmd.name}" if cmd.name else name
            if cmd.predicate():
                self._enable_actor(act, True)
            else:
                act.handle.waiting = f"until {cmd.name or cmd.predicate!r}"
                self._until.append(act)
                if cmd.timeout is not None:
                    self._timer(act, cmd.timeout, lambda: self._until.remove(act))
        elif isinstance(cmd, Sleep):
            act.label = f"{name}:sleep"
            act.handle.waiting = f"sleep {cmd.seconds}"
            self._timer(act, cmd.seconds, None)
        else:
            self._actor_error(
                act, TypeError(f"actor {name} yielded {cmd!r}; use the helpers of kvconform.rdma.fabric (yield from)")
            )

    def _actor_error(self, act: _Actor, exc: BaseException) -> None:
        act.handle.done = True
        act.handle.error = exc
        self._failure = ActorFailed(act.handle.name, self.steps, self.seed, exc)
        self._failure.__cause__ = exc

    def _timer(self, act: _Actor, seconds: float, cancel: Callable[[], None] | None) -> None:
        self._timer_seq += 1
        entry: list[Any] = [self._now + seconds, self._timer_seq, act, True, cancel]
        act.timer = entry
        heapq.heappush(self._timers, entry)

    def _fire_timers(self) -> None:
        while self._timers and self._timers[0][0] <= self._now:
            _, _, act, live, cancel = heapq.heappop(self._timers)
            if not live:
                continue
            act.timer = None
            if cancel is not None:
                cancel()
            act.handle.waiting = ""
            # a timed-out wait resumes with None (completion) / False (predicate); a Sleep with None
            self._enable_actor(act, False if isinstance(act.cmd, WaitUntil) else None)

    def _check_until(self) -> None:
        for act in list(self._until):
            try:
                ready = act.cmd.predicate()
            except Exception as exc:  # a broken predicate is the waiting actor's failure
                self._until.remove(act)
                self._actor_error(act, exc)
                return
            if ready:
                self._until.remove(act)
                self._wake(act, True)

    # ---- send queue: arrival in post order ---------------------------------------------------------------

    def _advance_sq(self, conn: EmuConnection) -> None:
        if conn._arrive_enabled or not conn.sq:
            return
        wr = conn.sq[0]
        if wr.fence:
            for w in conn.outstanding:
                if w is wr:
                    break
                if w.status is None and w.kind in (Op.RDMA_READ, Op.FETCH_ADD, Op.COMP_SWAP):
                    return  # fenced until earlier Reads/atomics complete (verbs IBV_SEND_FENCE)
        conn._arrive_enabled = True
        self._add(f"{conn.name}/{wr.tag}:arrive", conn.name, lambda: self._arrive(conn), conn.link)

    def _arrive(self, conn: EmuConnection) -> None:
        conn._arrive_enabled = False
        wr = conn.sq.popleft()
        peer = conn.peer
        if wr.kind is Op.SEND or wr.kind is Op.RDMA_WRITE:
            wr.data = self._gather(wr.src)
        msg = _Msg(wr)
        if wr.kind is Op.RDMA_WRITE:
            checked = self._remote(peer, wr.stag, wr.to, len(wr.data), Access.REMOTE_WRITE, tagged=True)
            if isinstance(checked, Terminate):
                self._fail(conn, wr, checked, Status.REM_ACCESS_ERR)
                return
            msg.target = checked
            if self._tracing:
                self._note(peer.name, "write-arrive", wr=wr.tag, stag=wr.stag, to=wr.to, len=len(wr.data))
            peer.inbound.append(msg)
            self._start_write(peer, conn, msg)
            if wr.imm is not None:  # Write with Immediate = Write + Immediate Data message (RFC 7306)
                imm = _Wr(Op.RECV_RDMA_WITH_IMM, wr.wr_id, wr.tag + "+imm", False, False)
                imm.imm, imm.data, imm.parent = wr.imm, b"", wr
                imm.orig = len(wr.data)
                peer.inbound.append(_Msg(imm))
            else:
                wr.status = Status.SUCCESS  # a Write completes at the requester once the stream carried it
        elif wr.kind is Op.SEND:
            if self._tracing:
                self._note(peer.name, "send-arrive", wr=wr.tag, len=len(wr.data))
            peer.inbound.append(msg)
        else:  # Read Request / Atomic Request: checked at arrival, processed in order after earlier Writes
            if wr.kind is Op.RDMA_READ:
                assert wr.dst is not None
                checked = self._remote(peer, wr.stag, wr.to, wr.dst.length, Access.REMOTE_READ, tagged=False)
            else:
                checked = self._remote(peer, wr.stag, wr.to, 8, Access.REMOTE_ATOMIC, tagged=False)
                if not isinstance(checked, Terminate):
                    checked = atomic_misaligned(wr.to, peer.name) or checked
            if isinstance(checked, Terminate):
                status = (
                    Status.REM_INV_REQ_ERR if checked.etype == RdmapEType.REMOTE_OPERATION else Status.REM_ACCESS_ERR
                )
                self._fail(conn, wr, checked, status)
                return
            msg.target = checked
            if self._tracing:
                self._note(peer.name, f"{_OP_NAME[wr.kind]}-arrive", wr=wr.tag, stag=wr.stag, to=wr.to)
            peer.inbound.append(msg)
        self._advance_inbound(peer)
        self._complete_in_order(conn)
        self._advance_sq(conn)

    def _gather(self, src: list[Sge] | bytes) -> bytes:
        if isinstance(src, bytes):
            return src
        return b"".join(s.read() for s in src)

    def _remote(
        self, at: EmuConnection, stag: int, to: int, length: int, right: Access, *, tagged: bool
    ) -> tuple[EmuBuffer, int] | Terminate:
        """Resolve (STag, TO, length) at ``at``'s node, or the Terminate its RNIC sends (§2.2, §2.6)."""
        got = resolve(at.node._stags, at.name, stag, to, length, right, tagged=tagged)
        if isinstance(got, Terminate):
            return got
        buf, off = got
        assert isinstance(buf, EmuBuffer)
        return buf, off

    # ---- responder: placement, delivery, Read/atomic processing -------------------------------------------

    def _start_write(self, at: EmuConnection, src: EmuConnection, msg: _Msg) -> None:
        model = self.profile.placement_model
        assert msg.target is not None
        buf, base = msg.target
        data = msg.wr.data
        if model is PlacementModel.STRICT or not data:
            buf.data[base : base + len(data)] = data
            if self._tracing:
                self._note(at.name, "place", wr=msg.wr.tag, addr=buf.addr + base, len=len(data))
            msg.done = True
            return
        if model is PlacementModel.RDMAP:
            chunks = list(_chunks(len(data), self.profile.chunk_bytes))
            msg.left = len(chunks)
            for off, n in chunks:
                self._add(f"{src.name}/{msg.wr.tag}:place@{off}", at.name, self._placer(at, msg, off, n), at.link)
        else:  # ib_psn_order: chunks in order, started when the message reaches the head (see _advance_inbound)
            msg.left = -(-len(data) // self.profile.chunk_bytes)

    def _placer(self, at: EmuConnection, msg: _Msg, off: int, n: int) -> Callable[[], None]:
        def place() -> None:
            assert msg.target is not None
            buf, base = msg.target
            buf.data[base + off : base + off + n] = msg.wr.data[off : off + n]
            if self._tracing:
                self._note(at.name, "place", wr=msg.wr.tag, addr=buf.addr + base + off, len=n)
            msg.left -= 1
            if msg.left == 0:
                msg.done = True
                self._advance_inbound(at)
            elif self.profile.placement_model is PlacementModel.IB_PSN_ORDER:
                nxt = off + n
                self._add(
                    f"{at.peer.name}/{msg.wr.tag}:place@{nxt}",
                    at.name,
                    self._placer(at, msg, nxt, min(self.profile.chunk_bytes, len(msg.wr.data) - nxt)),
                    at.link,
                )

        return place

    def _advance_inbound(self, at: EmuConnection) -> None:
        """Enable what the stream order allows: deliveries after earlier placement (rule 5), Reads in order."""
        inbound = at.inbound
        ordered = self.profile.placement_model is PlacementModel.IB_PSN_ORDER
        while inbound:
            msg = inbound[0]
            if msg.done:
                inbound.popleft()
                continue
            kind = msg.wr.kind
            if kind is Op.RDMA_WRITE:
                # rdmap: its chunks are already enabled and later messages wait only if they are Send-type
                if ordered and not msg.enabled:
                    msg.enabled = True
                    self._add(
                        f"{at.peer.name}/{msg.wr.tag}:place@0",
                        at.name,
                        self._placer(at, msg, 0, min(self.profile.chunk_bytes, len(msg.wr.data))),
                        at.link,
                    )
                if ordered:
                    return
                # Reads/atomics and Sends behind an unplaced Write wait; nothing else to enable here
                return
            if kind is Op.SEND or kind is Op.RECV_RDMA_WITH_IMM:
                if not msg.enabled:
                    msg.enabled = True
                    self._add(f"{at.peer.name}/{msg.wr.tag}:deliver", at.name, self._deliverer(at, msg), at.link)
                return
            # Read / atomic request: hand it to the in-order response engine
            msg.done = True
            inbound.popleft()
            at.responses.append(msg)
            self._advance_responses(at)

    def _deliverer(self, at: EmuConnection, msg: _Msg) -> Callable[[], None]:
        return lambda: self._deliver(at, msg)

    def _deliver(self, at: EmuConnection, msg: _Msg) -> None:
        """Deliver a Send-type message; the requester's Send (or Write with Immediate) completes with it."""
        wr = msg.wr
        src = at.peer
        culprit = wr.parent or wr
        invalidated: int | None = None
        if wr.invalidate is not None:
            term = self._remote_invalidate(at, wr.invalidate)
            if term is not None:
                self._fail(src, culprit, term, Status.REM_OP_ERR)
                return
            invalidated = wr.invalidate
        if not at.rq:
            if self.profile.binding is Binding.RDMAP:
                term = Terminate(
                    Layer.DDP,
                    DdpEType.UNTAGGED_BUFFER,
                    DdpUntaggedCode.NO_BUFFER,
                    f"no Recv posted for {wr.tag} at {at.name}",
                    at.name,
                )
                self._fail(src, culprit, term, Status.REM_OP_ERR)
            else:
                term = Terminate(
                    Layer.LLP, 0, 0, f"RNR retries exhausted: no Recv posted for {wr.tag} at {at.name}", at.name
                )
                self._fail(src, culprit, term, Status.RNR_RETRY_EXC_ERR)
            return
        wr_id, sge = at.rq.popleft()
        room = 0 if sge is None else sge.length
        if len(wr.data) > room:
            term = Terminate(
                Layer.DDP,
                DdpEType.UNTAGGED_BUFFER,
                DdpUntaggedCode.MESSAGE_TOO_LONG,
                f"{wr.tag}: {len(wr.data)} octets for a Recv of {room} at {at.name}",
                at.name,
            )
            at.cq._push(Completion(wr_id, Op.RECV, Status.LOC_LEN_ERR, at.name, terminate=term))
            self._fail(src, culprit, term, Status.REM_INV_REQ_ERR)
            return
        if sge is not None and wr.data:
            sge.region.write(sge.offset, wr.data)
        if invalidated is not None:
            del at.node._stags[invalidated]
        msg.done = True
        if self._tracing:
            self._note(at.name, "deliver", wr=wr.tag, len=len(wr.data), invalidated=invalidated)
        if wr.kind is Op.RECV_RDMA_WITH_IMM:
            wc = Completion(wr_id, Op.RECV_RDMA_WITH_IMM, Status.SUCCESS, at.name, byte_len=wr.orig, imm=wr.imm)
        else:
            wc = Completion(
                wr_id,
                Op.RECV,
                Status.SUCCESS,
                at.name,
                byte_len=len(wr.data),
                imm=wr.imm,
                invalidated_stag=invalidated,
                solicited=wr.solicited,
            )
        at.cq._push(wc)
        culprit.status = Status.SUCCESS
        self._complete_in_order(src)
        self._advance_inbound(at)

    def _remote_invalidate(self, at: EmuConnection, stag: int) -> Terminate | None:
        return remote_invalidate_refusal(at.node._stags, at.name, stag)

    def _advance_responses(self, at: EmuConnection) -> None:
        if at._resp_active or not at.responses:
            return
        at._resp_active = True
        msg = at.responses[0]
        wr = msg.wr
        req = at.peer
        if wr.kind is Op.RDMA_READ:
            assert wr.dst is not None
            if self.profile.placement_model is PlacementModel.STRICT or wr.dst.length == 0:
                self._add(f"{req.name}/{wr.tag}:read@0", at.name, self._reader(at, msg, 0, wr.dst.length), at.link)
            else:
                self._add(
                    f"{req.name}/{wr.tag}:read@0",
                    at.name,
                    self._reader(at, msg, 0, min(self.profile.chunk_bytes, wr.dst.length)),
                    at.link,
                )
        else:
            self._add(f"{req.name}/{wr.tag}:atomic", at.name, lambda: self._atomic(at, msg), at.link)

    def _reader(self, at: EmuConnection, msg: _Msg, off: int, n: int) -> Callable[[], None]:
        def read() -> None:
            wr = msg.wr
            assert msg.target is not None and wr.dst is not None
            buf, base = msg.target
            chunk = bytes(buf.data[base + off : base + off + n])
            wr.dst.region.write(wr.dst.offset + off, chunk)
            if self._tracing:
                self._note(at.name, "read-sample", wr=wr.tag, addr=buf.addr + base + off, len=n, data=chunk.hex())
            nxt = off + n
            if nxt < wr.dst.length:
                self._add(
                    f"{at.peer.name}/{wr.tag}:read@{nxt}",
                    at.name,
                    self._reader(at, msg, nxt, min(self.profile.chunk_bytes, wr.dst.length - nxt)),
                    at.link,
                )
                return
            self._response_done(at, wr)

        return read

    def _atomic(self, at: EmuConnection, msg: _Msg) -> None:
        wr = msg.wr
        assert msg.target is not None and wr.dst is not None
        buf, off = msg.target
        orig = int.from_bytes(buf.data[off : off + 8], buf.byteorder)
        if wr.kind is Op.FETCH_ADD:
            new = masked_add(orig, wr.add, wr.mask)
        else:
            new = masked_cmp_swap(orig, wr.compare, wr.swap, wr.compare_mask, wr.swap_mask)
        buf.data[off : off + 8] = new.to_bytes(8, buf.byteorder)
        # the original value travels big-endian and is stored in the requester's host order (§1.5)
        dst = wr.dst
        dst.region.write(dst.offset, orig.to_bytes(8, dst.region.buffer.byteorder))
        if self._tracing:
            self._note(at.name, _OP_NAME[wr.kind], wr=wr.tag, addr=buf.addr + off, orig=orig, new=new)
        self._response_done(at, wr)

    def _response_done(self, at: EmuConnection, wr: _Wr) -> None:
        at.responses.popleft()
        at._resp_active = False
        wr.status = Status.SUCCESS
        req = at.peer
        self._complete_in_order(req)
        self._advance_sq(req)  # a fenced request may now go
        self._advance_responses(at)

    # ---- requester completions and failures --------------------------------------------------------------

    def _complete_in_order(self, conn: EmuConnection) -> None:
        conn.completions.drain()

    def _fail(self, requester: EmuConnection, culprit: _Wr, term: Terminate, status: Status) -> None:
        """The Data Sink / responder sent a Terminate: the culprit fails, everything else is flushed."""
        self._close(requester, ConnState.ERROR, term, culprit, status)

    def _close(
        self, conn: EmuConnection, state: ConnState, term: Terminate | None, culprit: _Wr | None, status: Status | None
    ) -> None:
        link = conn.link
        self._enabled[:] = [s for s in self._enabled if s.link != link]
        self._note(
            conn.name,
            "terminate" if term else "disconnect",
            reason=term.reason if term else "",
            key=list(term.key()) if term else None,
        )
        for end in (conn, conn.peer):
            end._state = state
            end._terminate = term
            end._arrive_enabled = False
            end._resp_active = False
            end.sq.clear()
            end.inbound.clear()
            end.responses.clear()
            self.events.append((end.name, term))
            end.completions.flush(term, list(end.rq), culprit=culprit if end is conn else None,
                                  status=status if end is conn else None)
            end.rq.clear()


def _json_default(value: object) -> object:
    if isinstance(value, bytes):
        return value.hex()
    return str(value)
