"""The semantic RDMA fabric interface every binding implements (rdma-bindings.md §8 item 1).

KBTP endpoints see only this module: nodes with registered memory (STags, access rights, zero-based or
VA Tagged Offsets), memory windows bound to one connection, reliable connections with Send / Send with
Invalidate / Recv, RDMA Write (with Immediate), RDMA Read, FetchAdd (masked per RFC 7306 when the
profile allows) and CmpSwap, and completions. The emulated fabric (``kvconform.rdma.emulated``) is the
first binding; userspace iWARP / RoCEv2 and pyverbs bindings implement the same Protocols later.

Actor model
-----------
Endpoint logic runs as *actors*: generator coroutines spawned on the fabric. Posting work is a plain,
non-blocking call on a `Connection`; waiting is ``yield from`` one of the helpers below
(`wait_completion`, `pause`, `wait_until`, `sleep`), which yield a `Command` to the fabric. Between
two yields an actor runs alone, so its local memory reads and writes are atomic; every yield is a
point where the scheduler may run other actors or NIC steps (arrival, chunk placement, atomic
execution, ...). That makes every interleaving a sequence of named steps that a seed or a schedule
script picks, and replays. A sans-I/O state machine fits in with a three-line loop
(``while True: wc = yield from wait_completion(cq); machine.on_completion(wc)``). Annotate actors as
``def target() -> ActorGen``. A target-CPU read-modify-write that must race the NIC's atomics (verbs
ATOMIC_HCA) puts a ``pause()`` between its read and its write; without one it is atomic (ATOMIC_GLOB).
Step labels (``<actor>[:<pause name>]``, ``<endpoint>/<wr tag>:<phase>``) are what schedule scripts
name; see `kvconform.rdma.scheduler`, and `kvconform.rdma.explore` for running many seeds.

Remote errors never raise into actors: a bad STag, an invalidated STag, an access outside the bounds
or without the access right ends in an error `Completion` (with the RFC 5040 `Terminate` that the
Data Sink sent) and the connection moves to ``ERROR``; the remaining work requests are flushed with
``WR_FLUSH_ERR`` (RFC 5040 §2.5-2.6 of rdma-bindings). Only local misuse (an operation the profile
does not offer, an SGE outside its region) raises `FabricUsageError` at post time.

Example (the emulated binding; a target serving one request by RDMA Write + Send with Invalidate)::

    import struct
    from kvconform.rdma import RDMAP_7306, Access, EmuFabric, Op, wait_completion

    fab = EmuFabric(RDMAP_7306, seed=7, trace=True)
    tgt, ini = fab.node("T"), fab.node("I")
    t_conn, i_conn = fab.connect(tgt, ini)

    pool = tgt.register(tgt.alloc(4096), Access.LOCAL_WRITE | Access.REMOTE_READ)
    t_rx = tgt.register(tgt.alloc(64), Access.LOCAL_WRITE)
    dst = ini.register(ini.alloc(64), Access.LOCAL_WRITE | Access.MW_BIND)
    win = ini.bind_window(dst, 0, 64, Access.REMOTE_WRITE, i_conn)  # one connection, invalidatable
    i_rx = ini.register(ini.alloc(64), Access.LOCAL_WRITE)
    # Recvs go up before any Send can arrive: a Send with no Recv posted terminates the stream
    t_conn.post_recv(t_rx.sge(0, 64), wr_id=1)
    i_conn.post_recv(i_rx.sge(0, 64), wr_id=9)

    def target():
        wc = yield from wait_completion(t_conn.cq, lambda c: c.op is Op.RECV)
        stag, to = struct.unpack_from(">IQ", t_rx.read(0, 12))
        t_conn.post_write(pool.sge(0, 16), stag, to)          # placed in chunks, any order (RFC 5040 rule 3)
        t_conn.post_send(b"done", invalidate=stag)              # delivered after the Write is placed (rule 5)

    def initiator():
        i_conn.post_send(struct.pack(">IQ", win.stag, win.to(0)))
        wc = yield from wait_completion(i_conn.cq, lambda c: c.op is Op.RECV)
        assert wc.ok and wc.invalidated_stag == win.stag
        return dst.read(0, 16)

    fab.spawn("target", target())
    ini_task = fab.spawn("initiator", initiator())
    fab.run()                       # to quiescence; raises ActorFailed if an actor raised
    assert ini_task.result == pool.read(0, 16)
    fab.write_trace("trace.jsonl")  # one JSON object per step; same seed -> same file

Addresses: an SGE is (region, byte offset within the region, length). A remote address is
(STag, Tagged Offset); ``region.to(off)`` / ``window.to(off)`` turn a byte offset into the Tagged
Offset that region advertises (``off`` when zero-based, ``VA + off`` otherwise).
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Generator, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol, TypeAlias, runtime_checkable

from kvconform.rdma.profiles import Profile

U64 = (1 << 64) - 1
ByteOrder: TypeAlias = Literal["little", "big"]


class FabricUsageError(Exception):
    """Local misuse of the interface (unsupported operation, SGE outside its region, unknown local STag)."""


class ActorFailed(Exception):
    """An actor raised; carries the actor's name, the step number and the seed so the run replays."""

    def __init__(self, actor: str, step: int, seed: int | None, cause: BaseException) -> None:
        super().__init__(f"actor {actor!r} raised at step {step} (seed {seed}): {cause!r}")
        self.actor = actor
        self.step = step
        self.seed = seed
        self.cause = cause


class Access(enum.IntFlag):
    """Access rights of a region or window (verbs ``IBV_ACCESS_*`` values, rdma-bindings §6.1)."""

    NONE = 0
    LOCAL_WRITE = 1
    REMOTE_WRITE = 2
    REMOTE_READ = 4
    REMOTE_ATOMIC = 8
    MW_BIND = 16


class Op(enum.IntEnum):
    """Completion opcode (verbs ``ibv_wc_opcode`` values, rdma-bindings §6.2)."""

    SEND = 0
    RDMA_WRITE = 1
    RDMA_READ = 2
    COMP_SWAP = 3
    FETCH_ADD = 4
    BIND_MW = 5
    LOCAL_INV = 6
    RECV = 128
    RECV_RDMA_WITH_IMM = 129


class Status(enum.IntEnum):
    """The shared status map: RDMAP Terminates, IB NAKs and emulated errors as ``ibv_wc_status`` values."""

    SUCCESS = 0
    LOC_LEN_ERR = 1
    LOC_QP_OP_ERR = 2
    LOC_PROT_ERR = 4
    WR_FLUSH_ERR = 5
    MW_BIND_ERR = 6
    BAD_RESP_ERR = 7
    LOC_ACCESS_ERR = 8
    REM_INV_REQ_ERR = 9
    REM_ACCESS_ERR = 10
    REM_OP_ERR = 11
    RETRY_EXC_ERR = 12
    RNR_RETRY_EXC_ERR = 13
    FATAL_ERR = 19
    GENERAL_ERR = 21


class Layer(enum.IntEnum):
    """Terminate header Layer (rdma-bindings §2.5)."""

    RDMAP = 0
    DDP = 1
    LLP = 2


class RdmapEType(enum.IntEnum):
    """EType for Layer RDMAP (§2.6)."""

    LOCAL_CATASTROPHIC = 0
    REMOTE_PROTECTION = 1
    REMOTE_OPERATION = 2


class DdpEType(enum.IntEnum):
    """EType for Layer DDP (§2.6)."""

    LOCAL_CATASTROPHIC = 0
    TAGGED_BUFFER = 1
    UNTAGGED_BUFFER = 2


class RdmapCode(enum.IntEnum):
    """RDMAP error codes (§2.6)."""

    INVALID_STAG = 0x00
    BASE_BOUNDS = 0x01
    ACCESS_RIGHTS = 0x02
    STAG_NOT_ASSOCIATED = 0x03
    TO_WRAP = 0x04
    BAD_VERSION = 0x05
    UNEXPECTED_OPCODE = 0x06
    CATASTROPHIC_STREAM = 0x07
    CATASTROPHIC_GLOBAL = 0x08
    STAG_CANNOT_BE_INVALIDATED = 0x09
    UNSPECIFIED = 0xFF


class DdpTaggedCode(enum.IntEnum):
    """DDP tagged-buffer error codes (§2.6)."""

    INVALID_STAG = 0
    BASE_BOUNDS = 1
    STAG_NOT_ASSOCIATED = 2
    TO_WRAP = 3
    BAD_VERSION = 4


class DdpUntaggedCode(enum.IntEnum):
    """DDP untagged-buffer error codes (§2.6)."""

    INVALID_QN = 1
    NO_BUFFER = 2  # "invalid MSN, no buffer": a Send with no posted Recv
    INVALID_MSN_RANGE = 3
    INVALID_MO = 4
    MESSAGE_TOO_LONG = 5
    BAD_VERSION = 6


@dataclass(frozen=True, slots=True)
class Terminate:
    """An RDMAP Terminate (rdma-bindings §2.5): who detected what, and why (human-readable ``reason``)."""

    layer: Layer
    etype: int
    code: int
    reason: str
    sender: str = ""  # the connection endpoint that detected the error and sent the Terminate
    # the Terminate message's octets as they arrived (header and the copies it carries), for the checks that
    # judge its layout (a nibble-swapped octet 0 reads as another Layer and EType); empty for one not read off
    # a wire. Not part of equality: two Terminates of one error compare equal whatever their encoding
    wire: bytes = field(default=b"", compare=False)

    def key(self) -> tuple[int, int, int]:
        """(Layer, EType, Code) as on the wire, for comparisons against expected outcomes."""
        return (int(self.layer), int(self.etype), int(self.code))


class ConnState(enum.StrEnum):
    """RC connection state as the ULP sees it."""

    CONNECTED = "connected"
    ERROR = "error"  # a Terminate was sent or received; outstanding work was flushed
    CLOSED = "closed"  # orderly disconnect


@runtime_checkable
class Buffer(Protocol):
    """Local memory of a node: what the node's CPU reads and writes directly (one step, no yield)."""

    @property
    def addr(self) -> int: ...
    @property
    def length(self) -> int: ...
    @property
    def byteorder(self) -> ByteOrder: ...
    def read(self, offset: int, length: int) -> bytes: ...
    def write(self, offset: int, data: bytes) -> None: ...
    def read_u64(self, offset: int) -> int: ...  # in the node's memory byte order (atomics' order, §1.5)
    def write_u64(self, offset: int, value: int) -> None: ...


@dataclass(frozen=True, slots=True)
class Region:
    """A registered memory region: STag (rkey) / lkey, access rights and Tagged Offset base (§2.2)."""

    stag: int
    buffer: Buffer
    offset: int  # byte offset of the region within the buffer
    length: int
    access: Access
    zero_based: bool
    remote_invalidate: bool  # fast-registered MR: may be invalidated by Send with Invalidate (§2.4)
    node: str

    @property
    def lkey(self) -> int:
        return self.stag

    @property
    def to_base(self) -> int:
        """Tagged Offset of the region's first octet."""
        return 0 if self.zero_based else self.buffer.addr + self.offset

    def to(self, offset: int = 0) -> int:
        """Tagged Offset of byte ``offset`` of the region."""
        return self.to_base + offset

    def sge(self, offset: int = 0, length: int | None = None) -> Sge:
        """A scatter/gather element over part of this region (local access)."""
        return Sge(self, offset, self.length - offset if length is None else length)

    def read(self, offset: int, length: int) -> bytes:
        """CPU read of region bytes (offset relative to the region)."""
        return self.buffer.read(self.offset + offset, length)

    def write(self, offset: int, data: bytes) -> None:
        """CPU write of region bytes (offset relative to the region)."""
        self.buffer.write(self.offset + offset, data)

    def read_u64(self, offset: int) -> int:
        return self.buffer.read_u64(self.offset + offset)

    def write_u64(self, offset: int, value: int) -> None:
        self.buffer.write_u64(self.offset + offset, value)


@dataclass(frozen=True, slots=True)
class Window:
    """A type-2 memory window: a connection-specific STag over part of a region (§2.4, DIRECT_ALLOC)."""

    stag: int
    region: Region
    offset: int  # byte offset of the window within the region
    length: int
    access: Access
    zero_based: bool
    connection: str  # name of the connection endpoint it is bound to

    def to(self, offset: int = 0) -> int:
        """Tagged Offset of byte ``offset`` of the window."""
        base = 0 if self.zero_based else self.region.buffer.addr + self.region.offset + self.offset
        return base + offset


@dataclass(frozen=True, slots=True)
class Sge:
    """Scatter/gather element: ``length`` octets at ``offset`` within a local ``region``."""

    region: Region
    offset: int
    length: int

    def read(self) -> bytes:
        return self.region.read(self.offset, self.length)


@dataclass(frozen=True, slots=True)
class Completion:
    """A work completion (verbs ``ibv_wc`` plus the Terminate behind an error, §8 item 1)."""

    wr_id: int
    op: Op
    status: Status
    conn: str  # name of the local connection endpoint (``node.connection(name)`` finds it)
    byte_len: int = 0
    imm: bytes | None = None  # Immediate Data (4 octets IB, 8 octets RDMAP)
    invalidated_stag: int | None = None  # Send with Invalidate: the local STag it invalidated
    solicited: bool = False
    terminate: Terminate | None = None  # for errors: the Terminate sent or received

    @property
    def ok(self) -> bool:
        return self.status is Status.SUCCESS


class CompletionQueue(Protocol):
    """Completions of one or more connections, in the order the fabric produced them."""

    @property
    def name(self) -> str: ...

    def poll(self, max_entries: int = 1) -> list[Completion]: ...
    def __len__(self) -> int: ...


LocalData: TypeAlias = bytes | Sge | Sequence[Sge]


@dataclass(frozen=True, slots=True)
class SendWr:
    """One work request of a list posted in one call (`Connection.post_list`; verbs chains ``ibv_send_wr`` the
    same way): the operation and the arguments its ``post_*`` method takes. Build one with `send`, `write`,
    `read`, `fetch_add` or `cmp_swap`."""

    op: Op
    args: tuple[Any, ...]
    kwargs: tuple[tuple[str, Any], ...] = ()

    @classmethod
    def send(cls, data: LocalData, wr_id: int = 0, **kw: Any) -> SendWr:
        return cls(Op.SEND, (data, wr_id), tuple(kw.items()))

    @classmethod
    def write(cls, data: LocalData, stag: int, to: int, wr_id: int = 0, **kw: Any) -> SendWr:
        return cls(Op.RDMA_WRITE, (data, stag, to, wr_id), tuple(kw.items()))

    @classmethod
    def read(cls, dst: Sge, stag: int, to: int, wr_id: int = 0, **kw: Any) -> SendWr:
        return cls(Op.RDMA_READ, (dst, stag, to, wr_id), tuple(kw.items()))

    @classmethod
    def fetch_add(cls, dst: Sge, stag: int, to: int, add: int, mask: int = 0, wr_id: int = 0, **kw: Any) -> SendWr:
        return cls(Op.FETCH_ADD, (dst, stag, to, add, mask, wr_id), tuple(kw.items()))

    @classmethod
    def cmp_swap(cls, dst: Sge, stag: int, to: int, compare: int, swap: int, wr_id: int = 0, **kw: Any) -> SendWr:
        return cls(Op.COMP_SWAP, (dst, stag, to, compare, swap, wr_id), tuple(kw.items()))


# the Connection method each SendWr operation posts through
POST_METHOD = {Op.SEND: "post_send", Op.RDMA_WRITE: "post_write", Op.RDMA_READ: "post_read",
               Op.FETCH_ADD: "post_fetch_add", Op.COMP_SWAP: "post_cmp_swap"}


class Connection(Protocol):
    """One endpoint of a reliable connection (RC QP / RDMAP stream). All posts are non-blocking.

    ``tag`` names the work request in step labels and schedule scripts (default: ``<op><seq>``).
    Post methods return the ``wr_id``.
    """

    # read-only members, so a binding's concrete classes (EmuNode, EmuCQ, ...) satisfy the Protocol
    @property
    def name(self) -> str: ...
    @property
    def node(self) -> Node: ...
    @property
    def peer_name(self) -> str: ...
    @property
    def cq(self) -> CompletionQueue: ...
    @property
    def profile(self) -> Profile: ...
    @property
    def state(self) -> ConnState: ...
    @property
    def terminate(self) -> Terminate | None: ...

    def post_recv(self, sge: Sge | None, wr_id: int = 0) -> int: ...
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
    ) -> int: ...
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
    ) -> int: ...
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
    ) -> int: ...
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
    ) -> int: ...
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
    ) -> int: ...
    def post_list(self, wrs: Sequence[SendWr]) -> list[int]:
        """Post ``wrs`` in order in one call; their ``wr_id`` s. A wire binding hands them to its engine together
        and sends what they produce at once (one batch of datagrams or one stream write), which is what keeps a
        stream of probes or requests dense on the wire. A WR the fabric refuses (`FabricUsageError`) raises after
        the ones before it were posted."""
        ...
    def disconnect(self) -> None: ...


class Node(Protocol):
    """A host with memory and an RNIC: allocation, registration, windows, invalidation."""

    @property
    def name(self) -> str: ...
    @property
    def profile(self) -> Profile: ...

    def alloc(self, length: int, *, align: int = 64) -> Buffer: ...
    def register(
        self,
        buffer: Buffer,
        access: Access,
        *,
        zero_based: bool = False,
        offset: int = 0,
        length: int | None = None,
        remote_invalidate: bool = False,
    ) -> Region: ...
    def deregister(self, region: Region) -> None: ...
    def bind_window(
        self, region: Region, offset: int, length: int, access: Access, conn: Connection, *, zero_based: bool = False
    ) -> Window: ...
    def invalidate(self, stag: int) -> None: ...
    def is_valid(self, stag: int) -> bool: ...
    def create_cq(self, name: str | None = None) -> CompletionQueue: ...
    def connection(self, name: str) -> Connection: ...


# ---- atomic semantics (RFC 7306, rdma-bindings §1.4); pure functions every binding shares -------------


def masked_add(orig: int, add: int, mask: int = 0) -> int:
    """FetchAdd with Add Mask: a set mask bit is a field's most significant bit; its carry is discarded.

    ``mask = 0`` is the plain 64-bit add of InfiniBand and unmasked RFC 7306 FetchAdd.
    """
    mask = (mask & U64) | (1 << 63)
    new = 0
    start = 0
    while mask:
        top = (mask & -mask).bit_length()  # one past the field's most significant bit
        field_mask = ((1 << top) - 1) ^ ((1 << start) - 1)
        new |= ((orig & field_mask) + (add & field_mask)) & field_mask
        start = top
        mask &= mask - 1
    return new


def masked_cmp_swap(orig: int, compare: int, swap: int, compare_mask: int = U64, swap_mask: int = U64) -> int:
    """Masked CmpSwap (Mellanox MskCmpSwap formula, §1.4): the new value of the word."""
    if (orig ^ compare) & compare_mask:
        return orig
    return ((orig & ~swap_mask) | (swap & swap_mask)) & U64


# ---- actor commands: what an actor yields; use the helpers below rather than these classes -------------


@dataclass(slots=True)
class NextCompletion:
    """Resume with the first completion of ``cq`` matching ``match`` (others stay queued), or None on timeout."""

    cq: CompletionQueue
    match: Callable[[Completion], bool] | None = None
    timeout: float | None = None
    name: str | None = None


@dataclass(slots=True)
class Pause:
    """A pure preemption point; ``name`` appears in the step label (``actor.name``) for schedule scripts."""

    name: str | None = None


@dataclass(slots=True)
class WaitUntil:
    """Resume once ``predicate()`` is true (re-checked after every step), or with False on timeout."""

    predicate: Callable[[], bool]
    name: str | None = None
    timeout: float | None = None


@dataclass(slots=True)
class Sleep:
    """Resume after ``seconds`` of fabric time (virtual in the emulation)."""

    seconds: float


Command: TypeAlias = NextCompletion | Pause | WaitUntil | Sleep
ActorGen: TypeAlias = Generator[Command, Any, Any]


def wait_completion(
    cq: CompletionQueue, match: Callable[[Completion], bool] | None = None, name: str | None = None
) -> Generator[Command, Any, Completion]:
    """Wait for (and take) the next completion on ``cq`` that ``match`` accepts; ``name`` labels the step."""
    wc = yield NextCompletion(cq, match, None, name)
    assert isinstance(wc, Completion)
    return wc


def wait_completion_for(
    cq: CompletionQueue, timeout: float, match: Callable[[Completion], bool] | None = None, name: str | None = None
) -> Generator[Command, Any, Completion | None]:
    """Like `wait_completion`, bounded by ``timeout`` seconds of fabric time; None when it expires."""
    wc = yield NextCompletion(cq, match, timeout, name)
    return wc if isinstance(wc, Completion) else None


def pause(name: str | None = None) -> Generator[Command, Any, None]:
    """Let the scheduler run something else here (a named race point)."""
    yield Pause(name)


def wait_until(
    predicate: Callable[[], bool], name: str | None = None, timeout: float | None = None
) -> Generator[Command, Any, bool]:
    """Wait until ``predicate()`` holds; returns False if ``timeout`` expired first."""
    ok = yield WaitUntil(predicate, name, timeout)
    return bool(ok)


def sleep(seconds: float) -> Generator[Command, Any, None]:
    """Wait ``seconds`` of fabric time."""
    yield Sleep(seconds)


@dataclass(slots=True)
class ActorHandle:
    """A spawned actor: its name, and once finished its return value or the exception it raised."""

    name: str
    daemon: bool = False
    done: bool = False
    result: Any = None
    error: BaseException | None = None
    waiting: str = field(default="")  # what it waits for, for deadlock reports


class Fabric(Protocol):
    """A set of nodes and connections plus the driver that runs actors."""

    @property
    def profile(self) -> Profile: ...

    @property
    def now(self) -> float: ...
    def node(self, name: str, *, byteorder: ByteOrder = "little") -> Node: ...
    def connect(self, a: Node, b: Node, *, name: str | None = None) -> tuple[Connection, Connection]: ...
    def spawn(self, name: str, actor: ActorGen, *, daemon: bool = False) -> ActorHandle: ...
    def run(self, *, max_steps: int | None = None) -> RunResult: ...
    def run_until(
        self, predicate: Callable[[], bool], *, timeout: float | None = None, max_steps: int | None = None
    ) -> bool: ...


@dataclass(frozen=True, slots=True)
class RunResult:
    """How a run ended: ``quiescent`` (nothing left to do), ``max_steps``, or (a real-time fabric) its wall-clock
    ``deadline``; actors still blocked."""

    steps: int
    reason: Literal["quiescent", "max_steps", "deadline"]
    blocked: tuple[str, ...]  # non-daemon actors that never finished (a deadlock when reason is quiescent)
