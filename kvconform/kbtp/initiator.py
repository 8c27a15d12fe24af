"""The reference KBTP initiator (KBTP "Session Establishment", "Operations", "Completion", "Direct Modes",
"Security Considerations").

Every operation is a generator to ``yield from`` inside a fabric actor; one request is outstanding at a
time, so a completion always answers the request just sent (its Request ID is checked).  Buffers the
target may touch are exposed through single-use memory windows bound to this connection; with INVALIDATE
(the default) the target's Send with Invalidate revokes them, otherwise the initiator revokes them itself
once the completion arrived.

Direct modes follow the text step by step, one method per step so a broken initiator is one override:
- DIRECT_LOAD: ``read_entry`` -> check VALID and SEALED -> ``read_block`` -> ``read_entry`` again -> the
  data counts only if both entries show the same Generation with VALID and SEALED;
- DIRECT_ALLOC: ``take_ticket`` (FetchAdd on Head, masked or the unmasked IB variant) -> ``await_slot``
  (re-read until Sequence == ticket and Block Offset not all ones, then once more to confirm both) ->
  ``write_block`` (RDMA Write through the Partition STag) -> ``bind``.

Every wait is bounded by ``timeout_s`` seconds of fabric time (logical, never a wall clock).
"""

from __future__ import annotations

import secrets
from collections.abc import Generator
from dataclasses import dataclass
from typing import Any

from kvconform.kbtp.constants import (
    COMPLETION_RECORD_SIZE,
    DIRECT_ALLOC_SIZE,
    DIRECT_LOAD_SIZE,
    HEADER_SIZE,
    HELLO_ACK_FIXED_SIZE,
    RING_SLOT_SIZE,
    TABLE_ENTRY_SIZE,
    Features,
    GoodbyeFlags,
    RequestFlags,
    Status,
)
from kvconform.kbtp.messages import (
    AllocStore,
    Bind,
    Completion,
    CompletionDescriptor,
    CompletionRecord,
    DataDescriptor,
    Free,
    Goodbye,
    Hello,
    HelloAck,
    Load,
    Message,
    Store,
    TableEntry,
    decode,
)
from kvconform.kbtp.ring import RingLayout, RingSlot
from kvconform.rdma.fabric import (
    Access,
    Command,
    Connection,
    ConnState,
    Fabric,
    Node,
    Op,
    Region,
    Sge,
    Window,
    wait_completion_for,
    wait_until,
)

Gen = Generator[Command, Any, Any]
ALL_REQUESTED = Features.DIRECT_LOAD | Features.DIRECT_ALLOC | Features.RECORD_COMPLETION | Features.ADDR_LE
_RECV_SIZE = HEADER_SIZE + HELLO_ACK_FIXED_SIZE + DIRECT_LOAD_SIZE + DIRECT_ALLOC_SIZE
_SCRATCH = 64  # FetchAdd result (8) and entry / slot reads (16 each)


class InitiatorError(Exception):
    """The fabric or the target did something the initiator cannot continue from (names what and why)."""


@dataclass(frozen=True)
class OpResult:
    """The answer to one request: the COMPLETION (or the completion record), and a load's data."""

    status: int
    generation: int
    data_length: int
    block_offset: int
    request_id: int
    completion: Completion | None = None
    record: CompletionRecord | None = None
    data: bytes | None = None
    invalidated_stag: int | None = None  # the STag the target invalidated with Send with Invalidate
    window_stag: int | None = None  # the single-use STag this request exposed

    @property
    def ok(self) -> bool:
        return self.status == Status.OK


@dataclass(frozen=True)
class DirectLoadResult:
    """A DIRECT_LOAD: OK with the data, or why the data cannot be used (the status a LOAD would give)."""

    status: Status
    first: TableEntry | None
    second: TableEntry | None
    data: bytes | None

    @property
    def ok(self) -> bool:
        return self.status is Status.OK


@dataclass(frozen=True)
class DirectAllocResult:
    """A DIRECT_ALLOC: the ticket taken, the block it got, the BIND's answer (None when not bound)."""

    ticket: int
    slot_offset: int
    block_offset: int | None
    bind: OpResult | None
    polls: int


class ReferenceInitiator:
    """One initiator on one connection.  Construct, then ``yield from ini.hello()`` inside an actor."""

    def __init__(self, fabric: Fabric, node: Node, conn: Connection, *, initiator_id: bytes | None = None,
                 requested: Features = ALL_REQUESTED, completion_credits: int = 4, invalidate: bool = True,
                 masked_atomics: bool | None = None, timeout_s: float = 30.0, max_polls: int = 256) -> None:
        self.fabric = fabric
        self.node = node
        self.conn = conn
        # At least 128 bits of entropy, kept secret (KBTP "Session Establishment").
        self.initiator_id = initiator_id if initiator_id is not None else secrets.token_bytes(16)
        self.requested = requested
        self.credits = completion_credits
        self.invalidate = invalidate
        self.masked = conn.profile.masked_atomics if masked_atomics is None else masked_atomics
        self.timeout_s = timeout_s
        self.max_polls = max_polls
        self.ack: HelloAck | None = None
        self.addr_le = False
        self._next_request = 0
        self.recv = node.register(node.alloc(completion_credits * _RECV_SIZE), Access.LOCAL_WRITE)
        self.scratch = node.register(node.alloc(_SCRATCH), Access.LOCAL_WRITE)
        self._records: Region | None = None  # registered on the first RECORD request (exposes nothing before)
        self.data: Region | None = None
        self._posted = False

    # ---- plumbing --------------------------------------------------------------------------------

    @property
    def features(self) -> Features:
        return Features(self.ack.features) if self.ack is not None else Features(0)

    def handle(self, i: int) -> int:
        """The i-th handle of the range HELLO_ACK assigned."""
        assert self.ack is not None, "no session: call hello() first"
        return self.ack.handle_base + i

    def _post_recvs(self) -> None:
        if not self._posted:
            for i in range(self.credits):
                self.conn.post_recv(self.recv.sge(i * _RECV_SIZE, _RECV_SIZE), wr_id=i)
            self._posted = True

    def request_id(self) -> int:
        self._next_request += 1
        return self._next_request

    def send_raw(self, raw: bytes) -> None:
        """Send exactly these octets as one Send (for crafted messages)."""
        self._post_recvs()
        self.conn.post_send(raw, signaled=False)

    def send(self, msg: Message) -> None:
        self.send_raw(msg.encode(addr_le=self.addr_le))

    def next_answer(self) -> Generator[Command, Any, tuple[Message | None, bytes, int | None, CompletionRecord | None]]:
        """The next message (or completion record) from the target: (message, raw, invalidated STag, record)."""
        wc = yield from wait_completion_for(self.conn.cq, self.timeout_s,
                                            lambda c: c.op in (Op.RECV, Op.RECV_RDMA_WITH_IMM) or not c.ok)
        if wc is None:
            raise InitiatorError(f"no answer from the target within {self.timeout_s} s of fabric time")
        if not wc.ok:
            raise InitiatorError(f"connection {self.conn.name} failed: {wc.status.name} "
                                 f"({wc.terminate.reason if wc.terminate else 'flushed'})")
        slot = wc.wr_id
        if wc.op is Op.RECV_RDMA_WITH_IMM:
            self.conn.post_recv(self.recv.sge(slot * _RECV_SIZE, _RECV_SIZE), wr_id=slot)
            record = CompletionRecord.unpack(self.records.read(0, COMPLETION_RECORD_SIZE))
            return None, b"", None, record
        raw = self.recv.read(slot * _RECV_SIZE, wc.byte_len)
        self.conn.post_recv(self.recv.sge(slot * _RECV_SIZE, _RECV_SIZE), wr_id=slot)
        return decode(raw), raw, wc.invalidated_stag, None

    @property
    def records(self) -> Region:
        """The completion record slot, remotely writable: registered only once a request names it, since the
        initiator exposes only the buffers its descriptors name (KBTP "Security Considerations")."""
        if self._records is None:
            self._records = self.node.register(self.node.alloc(COMPLETION_RECORD_SIZE),
                                               Access.LOCAL_WRITE | Access.REMOTE_WRITE)
        return self._records

    def _data_region(self, need: int = 0) -> Region:
        """The data buffer: a block, or ``need`` octets when a caller's buffer is larger (a LOAD into 1024 octets
        of blocks of 256 is legal: the Data Length it returns fits)."""
        if self.data is None or self.data.length < need:
            size = max(self.ack.block_size if self.ack is not None else 4096, need)
            self.data = self.node.register(self.node.alloc(max(size, 1)), Access.LOCAL_WRITE | Access.MW_BIND)
        return self.data

    def window(self, length: int, access: Access) -> Window:
        """A single-use STag over the first ``length`` octets of the data buffer, bound to this connection."""
        return self.node.bind_window(self._data_region(length), 0, length, access, self.conn)

    def revoke(self, stag: int | None, invalidated: int | None) -> None:
        """After the completion: the window is gone, by the target's Send with Invalidate or by us."""
        if stag is not None and invalidated != stag and self.node.is_valid(stag):
            self.node.invalidate(stag)

    # ---- session ---------------------------------------------------------------------------------

    def hello(self, requested: Features | None = None) -> Generator[Command, Any, HelloAck]:
        """HELLO, then HELLO_ACK: learns block size, quota, handle range and the direct-mode descriptors."""
        self._post_recvs()
        req = self.requested if requested is None else requested
        self.send_raw(Hello(requested_features=int(req), completion_credits=self.credits,
                            initiator_id=self.initiator_id).encode())
        msg, _, _, _ = yield from self.next_answer()
        if not isinstance(msg, HelloAck):
            raise InitiatorError(f"expected HELLO_ACK, got {type(msg).__name__}")
        if msg.status == Status.OK:
            self.ack = msg
            self.addr_le = bool(msg.features & Features.ADDR_LE)
            self._data_region()
        return msg

    def goodbye(self, release: bool = False) -> Gen:
        """GOODBYE (with RELEASE: the target frees every handle); waits until the connection is closed."""
        self.send(Goodbye(flags=GoodbyeFlags.RELEASE if release else GoodbyeFlags(0)))
        yield from wait_until(lambda: self.conn.state is not ConnState.CONNECTED, name="goodbye",
                              timeout=self.timeout_s)

    # ---- requests --------------------------------------------------------------------------------

    def _flags(self, invalidate: bool | None, record: bool, extra: RequestFlags | None = None) -> RequestFlags:
        flags = extra if extra is not None else RequestFlags(0)
        if self.invalidate if invalidate is None else invalidate:
            flags |= RequestFlags.INVALIDATE
        if record:
            flags |= RequestFlags.RECORD
        return flags

    def _completion_descriptor(self, record: bool) -> CompletionDescriptor | None:
        return CompletionDescriptor(self.records.stag, self.records.to(0)) if record else None

    def _finish(self, request_id: int, stag: int | None) -> Generator[Command, Any, OpResult]:
        msg, _, invalidated, record = yield from self.next_answer()
        self.revoke(stag, invalidated)
        if record is not None:
            if record.request_id != request_id:
                raise InitiatorError(f"completion record Request ID {record.request_id}, expected {request_id} "
                                     "(KBTP-HDR-REQID-ECHO)")
            return OpResult(int(record.status), record.generation, record.data_length, record.block_offset,
                            request_id, record=record, window_stag=stag)
        if not isinstance(msg, Completion):
            raise InitiatorError(f"expected COMPLETION, got {type(msg).__name__}")
        if msg.request_id != request_id:
            raise InitiatorError(f"COMPLETION Request ID (offset 4) {msg.request_id}, expected {request_id} "
                                 "(KBTP-HDR-REQID-ECHO)")
        return OpResult(int(msg.status), msg.generation, msg.data_length, msg.block_offset, request_id,
                        completion=msg, invalidated_stag=invalidated, window_stag=stag)

    def request(self, msg: Load | Store | AllocStore | Free | Bind) -> Generator[Command, Any, OpResult]:
        """Send a request built by the caller (any field values) and wait for its answer."""
        self.send_raw(msg.encode_raw(addr_le=self.addr_le))
        return (yield from self._finish(msg.request_id, None))

    def load(self, handle: int, generation: int = 0, *, length: int | None = None, allow_unsealed: bool = False,
             invalidate: bool | None = None, record: bool = False) -> Generator[Command, Any, OpResult]:
        """LOAD into a fresh single-use window; the data is determinate once the COMPLETION is delivered."""
        size = self._data_region().length if length is None else length
        win = self.window(size, Access.REMOTE_WRITE)
        rid = self.request_id()
        extra = RequestFlags.ALLOW_UNSEALED if allow_unsealed else RequestFlags(0)
        flags = self._flags(invalidate, record, extra)
        self.send(Load(request_id=rid, handle=handle, generation=generation, flags=flags,
                       data=DataDescriptor(win.stag, win.to(0), size), completion=self._completion_descriptor(record)))
        result = yield from self._finish(rid, win.stag)
        if result.ok:
            data = self._data_region().read(0, min(result.data_length, size))
            result = OpResult(**{**result.__dict__, "data": data})
        return result

    def _store(self, cls: type[Store] | type[AllocStore], handle: int, data: bytes, generation: int, seal: bool,
               inline: bool | None, invalidate: bool | None, record: bool) -> Generator[Command, Any, OpResult]:
        max_inline = self.ack.max_inline if self.ack is not None else 0
        use_inline = len(data) <= max_inline if inline is None else inline
        rid = self.request_id()
        extra = RequestFlags.SEAL if seal else RequestFlags(0)
        cd = self._completion_descriptor(record)
        if use_inline:
            flags = self._flags(False, record, extra | RequestFlags.INLINE)  # no STag to invalidate
            self.send(cls(request_id=rid, handle=handle, generation=generation, flags=flags,
                          data=DataDescriptor(0, 0, len(data)), completion=cd, inline=bytes(data)))
            return (yield from self._finish(rid, None))
        self._data_region(len(data)).write(0, data)
        win = self.window(max(len(data), 1), Access.REMOTE_READ)
        self.send(cls(request_id=rid, handle=handle, generation=generation,
                      flags=self._flags(invalidate, record, extra),
                      data=DataDescriptor(win.stag, win.to(0), len(data)), completion=cd))
        return (yield from self._finish(rid, win.stag))

    def store(self, handle: int, data: bytes, generation: int = 0, *, seal: bool = False, inline: bool | None = None,
              invalidate: bool | None = None, record: bool = False) -> Generator[Command, Any, OpResult]:
        """Block Mapped Store (inline when it fits Max Inline, unless ``inline`` says otherwise)."""
        return (yield from self._store(Store, handle, data, generation, seal, inline, invalidate, record))

    def alloc_store(self, handle: int, data: bytes, generation: int = 0, *, seal: bool = False,
                    inline: bool | None = None, invalidate: bool | None = None,
                    record: bool = False) -> Generator[Command, Any, OpResult]:
        """Block Unmapped Store: the target allocates, writes, binds."""
        return (yield from self._store(AllocStore, handle, data, generation, seal, inline, invalidate, record))

    def free(self, handle: int, generation: int = 0, *, record: bool = False) -> Generator[Command, Any, OpResult]:
        rid = self.request_id()
        self.send(Free(request_id=rid, handle=handle, generation=generation, flags=self._flags(False, record),
                       completion=self._completion_descriptor(record)))
        return (yield from self._finish(rid, None))

    def bind(self, handle: int, ticket: int, data_length: int, block_offset: int,
             generation: int = 0) -> Generator[Command, Any, OpResult]:
        rid = self.request_id()
        self.send(Bind(request_id=rid, handle=handle, generation=generation, ticket=ticket, data_length=data_length,
                       block_offset=block_offset))
        return (yield from self._finish(rid, None))

    # ---- one-sided reads and atomics ---------------------------------------------------------------

    def _rdma(self, post: Any) -> Gen:
        wr = post()
        wc = yield from wait_completion_for(self.conn.cq, self.timeout_s,
                                            lambda c: c.wr_id == wr and c.op is not Op.RECV)
        if wc is None:
            raise InitiatorError(f"RDMA operation {wr} not completed within {self.timeout_s} s of fabric time")
        if not wc.ok:
            raise InitiatorError(f"RDMA operation {wr} failed: {wc.status.name} "
                                 f"({wc.terminate.reason if wc.terminate else 'flushed'})")

    def _read(self, dst: Sge, stag: int, to: int) -> Gen:
        wr = 1 << 40 | self.request_id()
        yield from self._rdma(lambda: self.conn.post_read(dst, stag, to, wr_id=wr))

    # ---- DIRECT_LOAD ----------------------------------------------------------------------------------

    def read_entry(self, handle: int) -> Generator[Command, Any, TableEntry]:
        """RDMA Read of the handle's 16-octet table entry through the Table STag."""
        ack = self.ack
        assert ack is not None and ack.direct_load is not None, "DIRECT_LOAD not granted"
        dl = ack.direct_load
        to = dl.table.tagged_offset + TABLE_ENTRY_SIZE * (handle - dl.table_base_handle)
        yield from self._read(self.scratch.sge(8, TABLE_ENTRY_SIZE), dl.table.stag, to)
        return TableEntry.unpack(self.scratch.read(8, TABLE_ENTRY_SIZE), 0, self.addr_le)

    def read_block(self, block_offset: int, length: int) -> Generator[Command, Any, bytes]:
        """RDMA Read of Data Length octets of the block through the read-only Pool STag."""
        ack = self.ack
        assert ack is not None and ack.direct_load is not None
        region = self._data_region()
        if length:
            yield from self._read(region.sge(0, length), ack.direct_load.pool.stag, block_offset)
        return region.read(0, length)

    @staticmethod
    def usable(first: TableEntry, second: TableEntry) -> bool:
        """Both reads show VALID and SEALED with the same Generation (KBTP "Direct Modes")."""
        both = 0x0003
        return (first.flags & both == both and second.flags & both == both
                and first.generation == second.generation)

    def direct_load(self, handle: int, generation: int = 0, *,
                    allow_unsealed: bool = False) -> Generator[Command, Any, DirectLoadResult]:
        """Entry, block, entry; each read issued only after the previous one completed."""
        first = yield from self.read_entry(handle)
        if not first.flags & 0x0001:
            return DirectLoadResult(Status.NOT_VALID, first, None, None)
        if generation and first.generation != generation:
            return DirectLoadResult(Status.STALE_GENERATION, first, None, None)
        if not first.flags & 0x0002 and not allow_unsealed:
            return DirectLoadResult(Status.NOT_SEALED, first, None, None)
        if first.data_length > self._data_region().length:
            return DirectLoadResult(Status.TOO_LARGE, first, None, None)
        data = yield from self.read_block(first.block_offset, first.data_length)
        second = yield from self.read_entry(handle)
        if not self.usable(first, second):
            return DirectLoadResult(Status.STALE_GENERATION, first, second, None)
        return DirectLoadResult(Status.OK, first, second, data)

    # ---- DIRECT_ALLOC ---------------------------------------------------------------------------------

    def ring_layout(self) -> RingLayout:
        ack = self.ack
        assert ack is not None and ack.direct_alloc is not None, "DIRECT_ALLOC not granted"
        n = ack.direct_alloc.ring.count.bit_length() - 1
        return RingLayout(n, self.masked)

    def take_ticket(self) -> Generator[Command, Any, tuple[int, int]]:
        """FetchAdd on Head: (ticket, slot offset); the unmasked variant computes 16 * (ticket mod N)."""
        ack = self.ack
        assert ack is not None and ack.direct_alloc is not None
        layout = self.ring_layout()
        head = ack.direct_alloc.head
        dst = self.scratch.sge(0, 8)
        wr = 1 << 40 | self.request_id()
        yield from self._rdma(lambda: self.conn.post_fetch_add(dst, head.stag, head.tagged_offset, layout.add_data,
                                                               layout.add_mask, wr_id=wr))
        orig = self.scratch.read_u64(0)
        ticket, offset = layout.split(orig)
        return ticket, offset

    def read_slot(self, slot_offset: int) -> Generator[Command, Any, RingSlot]:
        ack = self.ack
        assert ack is not None and ack.direct_alloc is not None
        ring = ack.direct_alloc.ring
        yield from self._read(self.scratch.sge(32, RING_SLOT_SIZE), ring.stag, ring.tagged_offset + slot_offset)
        return RingSlot.unpack(self.scratch.read(32, RING_SLOT_SIZE), 0, self.addr_le)

    def await_slot(self, ticket: int, slot_offset: int) -> Generator[Command, Any, tuple[int | None, int]]:
        """Re-read until Sequence == ticket and Block Offset is not all ones, then confirm with one more read
        (a 16-octet read is not atomic).  (block offset or None after ``max_polls``, reads issued)."""
        polls = 0
        while polls < self.max_polls:
            slot = yield from self.read_slot(slot_offset)
            polls += 1
            if slot.sequence != ticket or slot.consumed:
                continue
            again = yield from self.read_slot(slot_offset)
            polls += 1
            if again.sequence == slot.sequence and again.block_offset == slot.block_offset:
                return slot.block_offset, polls
        return None, polls

    def write_block(self, block_offset: int, data: bytes) -> Gen:
        """RDMA Write of the data through the Partition STag; BIND (a Send) follows it on the same stream."""
        ack = self.ack
        assert ack is not None and ack.direct_alloc is not None
        region = self._data_region()
        region.write(0, data)
        if data:
            self.conn.post_write(region.sge(0, len(data)), ack.direct_alloc.partition.stag, block_offset,
                                 signaled=False)
        yield from ()

    def direct_alloc(self, handle: int, data: bytes, *,
                     bind: bool = True) -> Generator[Command, Any, DirectAllocResult]:
        """FetchAdd, slot re-read and confirm, write, BIND (KBTP "Direct Modes")."""
        ticket, offset = yield from self.take_ticket()
        block, polls = yield from self.await_slot(ticket, offset)
        if block is None:
            return DirectAllocResult(ticket, offset, None, None, polls)
        yield from self.write_block(block, data)
        result = (yield from self.bind(handle, ticket, len(data), block)) if bind else None
        return DirectAllocResult(ticket, offset, block, result, polls)
