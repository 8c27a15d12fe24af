"""The harness's own KBTP initiator, used by the kbtp-target suite to drive a target under test.

It speaks KBTP with full control of the bytes: every request can be sent exactly as the codec's raw
encoder writes it (wrong version, unknown opcode, truncated, over-long lengths, descriptors out of
range), and every completion is decoded and recorded as evidence. It also performs the direct-mode RDMA
operations (table and pool reads, FetchAdd on the Head, partition writes, BIND) step by step, so a check
can stop between any two of them (a withheld BIND, a delayed slot read).

All operations are fabric actors: ``result = yield from client.call(...)`` inside an actor.
"""

from __future__ import annotations

import itertools
import secrets
import struct
from collections.abc import Generator
from dataclasses import dataclass, field
from typing import Any

from kvconform.fixtures import evidence
from kvconform.kbtp.constants import (
    EMPTY_BLOCK_OFFSET,
    RING_SLOT_SIZE,
    TABLE_ENTRY_SIZE,
    EntryFlags,
    Features,
    RequestFlags,
    Status,
)
from kvconform.kbtp.messages import (
    AllocStore,
    Bind,
    Completion,
    DataDescriptor,
    Free,
    Goodbye,
    Hello,
    HelloAck,
    KbtpDecodeError,
    Load,
    Store,
    decode,
)
from kvconform.rdma import (
    Access,
    Command,
    Connection,
    ConnState,
    Fabric,
    Node,
    Op,
    Region,
    wait_completion_for,
)
from kvconform.rdma import (
    Completion as WorkCompletion,
)

Gen = Generator[Command, Any, Any]

RECV_SIZE = 4096 + 512  # largest message the harness expects: a HELLO_ACK or a COMPLETION
RECV_DEPTH = 16
WAIT_S = 30.0  # fabric seconds a harness actor waits for a completion before calling it lost
ADD_MASK_BITS = (63, 31)

R_LOST = "KBTP-COMP-SEND"
ALL_FEATURES = Features(0xF)


class HarnessError(AssertionError):
    """What the target did broke a requirement; the message names the field and the requirement id."""


@dataclass
class Reply:
    """A COMPLETION (or HELLO_ACK) the harness received, with the work completion that carried it."""

    message: Completion | HelloAck
    raw: bytes
    invalidated_stag: int | None = None

    @property
    def status(self) -> int:
        return self.message.status

    @property
    def generation(self) -> int:
        return self.message.generation


@dataclass
class Session:
    """What HELLO_ACK granted this client."""

    ack: HelloAck
    features: Features
    addr_le: bool

    @property
    def handle_base(self) -> int:
        return self.ack.handle_base

    @property
    def handle_count(self) -> int:
        return self.ack.handle_count

    def handle(self, i: int) -> int:
        return self.ack.handle_base + i


def add_mask(slots: int) -> int:
    """Add Mask = bit 63 | bit 31 | bit (n+3) for N = 2^n slots (KBTP Free-Block Ring)."""
    n = slots.bit_length() - 1
    return (1 << 63) | (1 << 31) | (1 << (n + 3))


@dataclass
class HarnessInitiator:
    """One harness initiator node connected to the target under test."""

    fabric: Fabric
    node: Node
    conn: Connection
    name: str
    initiator_id: bytes = field(default_factory=lambda: secrets.token_bytes(16))
    session: Session | None = None
    _recv: Region | None = None
    _free_slots: list[int] = field(default_factory=list)
    _ids: itertools.count[int] = field(default_factory=lambda: itertools.count(1))
    replies: list[Reply] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._recv = self.node.register(self.node.alloc(RECV_SIZE * RECV_DEPTH), Access.LOCAL_WRITE)
        for i in range(RECV_DEPTH):
            self.conn.post_recv(self._recv.sge(i * RECV_SIZE, RECV_SIZE), wr_id=i)

    # ---- memory the target reads and writes --------------------------------------------------------

    def buffer(self, length: int, access: Access = Access.LOCAL_WRITE | Access.REMOTE_WRITE | Access.REMOTE_READ,
               data: bytes = b"") -> Region:
        """A registered buffer of ``length`` octets holding ``data``."""
        region = self.node.register(self.node.alloc(max(length, 1)), access | Access.LOCAL_WRITE)
        if data:
            region.write(0, data)
        return region

    def descriptor(self, region: Region, length: int | None = None, offset: int = 0) -> DataDescriptor:
        return DataDescriptor(region.stag, region.to(offset), region.length - offset if length is None else length)

    def next_id(self) -> int:
        return next(self._ids)

    @property
    def addr_le(self) -> bool:
        return self.session.addr_le if self.session else False

    # ---- messages ---------------------------------------------------------------------------------

    def send(self, raw: bytes, *, tag: str | None = None) -> None:
        evidence.record("sent", "kbtp", {"initiator": self.name, "octets": len(raw)}, raw=raw)
        self.conn.post_send(raw, tag=tag)

    def receive(self, timeout: float = WAIT_S, lost: str = R_LOST) -> Gen:
        """The next message from the target; HarnessError (citing ``lost``) when none arrives or the
        connection broke."""
        wc: WorkCompletion | None = yield from wait_completion_for(
            self.conn.cq, timeout, lambda c: c.op in (Op.RECV, Op.RECV_RDMA_WITH_IMM))
        if wc is None:
            raise HarnessError(f"{self.name}: no message from the target within {timeout} s of fabric time "
                               f"(connection {self.conn.state}) ({lost})")
        if not wc.ok:
            raise HarnessError(f"{self.name}: receive failed with {wc.status.name} "
                               f"(terminate {wc.terminate}) ({lost})")
        assert self._recv is not None
        raw = self._recv.read(wc.wr_id * RECV_SIZE, wc.byte_len)
        self.conn.post_recv(self._recv.sge(wc.wr_id * RECV_SIZE, RECV_SIZE), wr_id=wc.wr_id)
        try:
            msg = decode(raw)
        except KbtpDecodeError as exc:
            raise HarnessError(f"{self.name}: the target sent a message the codec refuses: {exc}") from exc
        if not isinstance(msg, Completion | HelloAck):
            raise HarnessError(f"{self.name}: the target sent {type(msg).__name__}, expected COMPLETION "
                               "(KBTP-OPCODES)")
        evidence.record("received", "kbtp", {"initiator": self.name, "message": msg.__class__.__name__,
                                         "status": int(msg.status), "request_id": msg.request_id}, raw=raw)
        reply = Reply(msg, raw, wc.invalidated_stag)
        self.replies.append(reply)
        return reply

    def receive_any(self, timeout: float = WAIT_S) -> Gen:
        """The next completion: a Reply (a message) or the work completion of an RDMA Write with Immediate
        (a completion record arrived); the receive buffer is re-posted either way."""
        wc: WorkCompletion | None = yield from wait_completion_for(
            self.conn.cq, timeout, lambda c: c.op in (Op.RECV, Op.RECV_RDMA_WITH_IMM) or not c.ok)
        if wc is None or not wc.ok:
            raise HarnessError(f"{self.name}: no completion within {timeout} s ({wc.status.name if wc else 'timeout'}) "
                               f"({R_LOST})")
        if wc.op is Op.RECV_RDMA_WITH_IMM:
            assert self._recv is not None
            self.conn.post_recv(self._recv.sge(wc.wr_id * RECV_SIZE, RECV_SIZE), wr_id=wc.wr_id)
            evidence.record("received", "kbtp-record", {"initiator": self.name, "imm": wc.imm})
            return wc
        assert self._recv is not None
        raw = self._recv.read(wc.wr_id * RECV_SIZE, wc.byte_len)
        self.conn.post_recv(self._recv.sge(wc.wr_id * RECV_SIZE, RECV_SIZE), wr_id=wc.wr_id)
        msg = decode(raw)
        reply = Reply(msg, raw, wc.invalidated_stag)  # type: ignore[arg-type]
        self.replies.append(reply)
        return reply

    def call(self, raw: bytes, timeout: float = WAIT_S, lost: str = R_LOST) -> Gen:
        """Send one request and return its completion (a Reply)."""
        self.send(raw)
        reply = yield from self.receive(timeout, lost)
        return reply

    def hello(self, requested: Features = ALL_FEATURES, credits: int = RECV_DEPTH) -> Gen:
        """HELLO / HELLO_ACK; returns the Session (HarnessError when the target refuses)."""
        raw = Hello(requested_features=requested, completion_credits=credits,
                    initiator_id=self.initiator_id).encode()
        reply = yield from self.call(raw)
        ack = reply.message
        if not isinstance(ack, HelloAck):
            raise HarnessError(f"{self.name}: HELLO answered by {type(ack).__name__}, expected HELLO_ACK "
                               "(KBTP-HELLO-FIRST)")
        if ack.status == Status.OK:
            feats = Features(ack.features)
            self.session = Session(ack, feats, bool(feats & Features.ADDR_LE))
        return ack

    # ---- operations (encoded with the session's byte order) --------------------------------------------

    def enc(self, msg: Any) -> bytes:
        return bytes(msg.encode_raw(addr_le=self.addr_le))

    def alloc_store(self, handle: int, data: bytes, *, flags: int = RequestFlags.SEAL, generation: int = 0,
                    source: Region | None = None) -> Gen:
        """ALLOC_STORE of ``data``: inline when it fits Max Inline and no source is given, else by RDMA Read."""
        rid = self.next_id()
        max_inline = self.session.ack.max_inline if self.session else 0
        if source is None and len(data) <= max_inline:
            msg: Any = AllocStore.with_inline(data, flags=flags, request_id=rid, handle=handle, generation=generation)
        else:
            src = source or self.buffer(len(data), data=data)
            msg = AllocStore(request_id=rid, handle=handle, generation=generation, flags=flags,
                             data=self.descriptor(src, len(data)))
        # An allocation that never completes waits for more than an in-progress free.
        reply = yield from self.call(self.enc(msg), lost="KBTP-QUOTA-ALLOC-BOUNDED")
        return reply

    def store(self, handle: int, data: bytes, *, flags: int = RequestFlags.SEAL, generation: int = 0) -> Gen:
        rid = self.next_id()
        max_inline = self.session.ack.max_inline if self.session else 0
        if len(data) <= max_inline:
            msg: Any = Store.with_inline(data, flags=flags, request_id=rid, handle=handle, generation=generation)
        else:
            src = self.buffer(len(data), data=data)
            msg = Store(request_id=rid, handle=handle, generation=generation, flags=flags,
                        data=self.descriptor(src, len(data)))
        reply = yield from self.call(self.enc(msg))
        return reply

    def load(self, handle: int, length: int, *, flags: int = 0, generation: int = 0,
             dest: Region | None = None) -> Gen:
        """LOAD into a fresh buffer of ``length``; returns (Reply, bytes in the buffer)."""
        dst = dest or self.buffer(length)
        msg = Load(request_id=self.next_id(), handle=handle, generation=generation, flags=flags,
                   data=self.descriptor(dst, length))
        reply = yield from self.call(self.enc(msg))
        got = dst.read(0, min(length, reply.message.data_length) if isinstance(reply.message, Completion) else 0)
        return reply, got

    def free(self, handle: int, *, generation: int = 0) -> Gen:
        reply = yield from self.call(self.enc(Free(request_id=self.next_id(), handle=handle, generation=generation)))
        return reply

    def bind(self, handle: int, ticket: int, data_length: int, block_offset: int) -> Gen:
        msg = Bind(request_id=self.next_id(), handle=handle, ticket=ticket, data_length=data_length,
                   block_offset=block_offset)
        reply = yield from self.call(self.enc(msg))
        return reply

    def goodbye(self, release: bool = False) -> None:
        self.send(self.enc(Goodbye(flags=1 if release else 0)))

    # ---- one-sided RDMA operations (direct modes) ----------------------------------------------------

    def rdma_read(self, stag: int, to: int, length: int, *, tag: str | None = None) -> Gen:
        """RDMA Read of ``length`` octets; returns (work completion, bytes)."""
        dst = self.buffer(length, Access.LOCAL_WRITE)
        self.conn.post_read(dst.sge(0, length), stag, to, tag=tag)
        wc = yield from self._wait_op(Op.RDMA_READ)
        return wc, dst.read(0, length) if wc.ok else b""

    def rdma_write(self, stag: int, to: int, data: bytes, *, tag: str | None = None) -> Gen:
        src = self.buffer(len(data), Access.LOCAL_WRITE, data)
        self.conn.post_write(src.sge(0, len(data)), stag, to, tag=tag)
        wc = yield from self._wait_op(Op.RDMA_WRITE)
        return wc

    def fetch_add(self, stag: int, to: int, add: int, mask: int, *, tag: str | None = None) -> Gen:
        """FetchAdd; returns (work completion, the original value in host order)."""
        dst = self.buffer(8, Access.LOCAL_WRITE)
        self.conn.post_fetch_add(dst.sge(0, 8), stag, to, add, mask, tag=tag)
        wc = yield from self._wait_op(Op.FETCH_ADD)
        return wc, dst.read_u64(0) if wc.ok else None

    def _wait_op(self, op: Op) -> Gen:
        wc = yield from wait_completion_for(self.conn.cq, WAIT_S, lambda c: c.op is op or not c.ok)
        if wc is None:
            raise HarnessError(f"{self.name}: {op.name} did not complete within {WAIT_S} s of fabric time")
        return wc

    def read_entry(self, handle: int) -> Gen:
        """Direct read of a table entry; returns (flags, generation, data length, block offset) or None."""
        s = self._direct_session()
        dl = s.ack.direct_load
        assert dl is not None
        to = dl.table.tagged_offset + TABLE_ENTRY_SIZE * (handle - dl.table_base_handle)
        wc, raw = yield from self.rdma_read(dl.table.stag, to, TABLE_ENTRY_SIZE, tag=f"entry-{handle:#x}")
        if not wc.ok:
            return None
        flags, gen, length = struct.unpack_from(">HHI", raw)
        (offset,) = struct.unpack_from("<Q" if s.addr_le else ">Q", raw, 8)
        return EntryFlags(flags), gen, length, offset

    def read_slot(self, ring_stag: int, ring_to: int, slot_offset: int) -> Gen:
        """Direct read of a ring slot; returns (sequence, block offset) or None on an RDMA error."""
        s = self._direct_session()
        wc, raw = yield from self.rdma_read(ring_stag, ring_to + slot_offset, RING_SLOT_SIZE, tag=f"slot-{slot_offset}")
        if not wc.ok:
            return None
        (seq,) = struct.unpack_from(">I", raw)
        (offset,) = struct.unpack_from("<Q" if s.addr_le else ">Q", raw, 8)
        return seq, offset

    def take_ticket(self) -> Gen:
        """FetchAdd on this initiator's DIRECT_ALLOC Head; returns (ticket, slot offset)."""
        s = self._direct_session()
        da = s.ack.direct_alloc
        assert da is not None
        masked = self.conn.profile.masked_atomics
        # Masked (RFC 7306): Ticket and Slot Offset advance together; unmasked (IB): Ticket only, and the
        # slot is 16 * (ticket mod N) (KBTP "InfiniBand and RoCEv2").
        add, mask = (0x0000_0001_0000_0010, add_mask(da.ring.count)) if masked else (0x0000_0001_0000_0000, 0)
        wc, old = yield from self.fetch_add(da.head.stag, da.head.tagged_offset, add, mask, tag="head")
        if not wc.ok:
            raise HarnessError(f"{self.name}: FetchAdd on the Head failed: {wc.status.name} {wc.terminate} "
                               "(KBTP-RDMAP-ATOMICS)")
        ticket = old >> 32
        if masked:
            return ticket, old & ((da.ring.count * RING_SLOT_SIZE) - 1)
        return ticket, RING_SLOT_SIZE * (ticket % da.ring.count)

    def await_slot(self, ticket: int, slot_offset: int, max_reads: int = 1000) -> Gen:
        """Re-read the ticket's slot until Sequence == ticket and Block Offset is not all ones, then confirm."""
        s = self._direct_session()
        da = s.ack.direct_alloc
        assert da is not None
        for _ in range(max_reads):
            got = yield from self.read_slot(da.ring.stag, da.ring.tagged_offset, slot_offset)
            if got is None:
                return None
            seq, offset = got
            if seq == ticket & 0xFFFF_FFFF and offset != EMPTY_BLOCK_OFFSET:
                again = yield from self.read_slot(da.ring.stag, da.ring.tagged_offset, slot_offset)
                if again == got:
                    return offset
        raise HarnessError(f"{self.name}: slot {slot_offset} never showed ticket {ticket} within {max_reads} "
                           "reads (KBTP-QUOTA-ALLOC-BOUNDED)")

    def write_block(self, block_offset: int, data: bytes) -> Gen:
        """RDMA Write into the partition at ``block_offset`` (a Tagged Offset within the Pool STag)."""
        s = self._direct_session()
        da = s.ack.direct_alloc
        assert da is not None
        wc = yield from self.rdma_write(da.partition.stag, block_offset, data, tag="block")
        return wc

    def _direct_session(self) -> Session:
        if self.session is None:
            raise HarnessError(f"{self.name}: no session (HELLO not done)")
        return self.session

    @property
    def broken(self) -> bool:
        return self.conn.state is not ConnState.CONNECTED


def header_only(opcode: int, *, version: int = 1, flags: int = 0, request_id: int = 0, handle: int = 0,
                generation: int = 0, status: int = 0) -> bytes:
    """A bare 24-octet common header (for unknown opcodes and truncations)."""
    return struct.pack(">BBHQQHH", version, opcode, flags, request_id, handle, generation, status)


