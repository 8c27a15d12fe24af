"""A KBTP initiator written from the text alone (spec/seeds/003_a48f4321884951de.txt), for the harness's own tests.

It shares no code with the reference initiator (kvconform.kbtp.initiator) nor with the codec
(kvconform.kbtp.messages, kvconform.kbtp.ring): every message, table entry, ring slot and completion record is
the text's field list written again with ``struct``. Of the harness it imports only the interface the suites drive
(``OpResult`` of targets/kbtp.py, and the Features and Status enums its results are expressed in) and the semantic
RDMA interface (kvconform.rdma) it runs on, like any other ``python:`` initiator.

What it implements: HELLO / HELLO_ACK, LOAD, STORE, ALLOC_STORE, FREE, GOODBYE (with and without RELEASE),
INVALIDATE, DIRECT_LOAD, DIRECT_ALLOC (masked FetchAdd of RFC 7306, or the unmasked InfiniBand form with the slot
computed as 16 * (ticket mod N)), ADDR_LE, and RECORD_COMPLETION (completion records by RDMA Write with Immediate).
Where the text leaves a choice open it chooses differently from the reference, so a suite that reads the
reference's choices as rules fails it:
- requests are pipelined: up to the Request Credits HELLO_ACK granted (and no more than its own Completion
  Credits) are outstanding at once, each answer matched by Request ID; Request IDs start at a random value;
- every message goes as a Send with Solicited Event (the RDMAP binding allows either);
- each STag it exposes is a memory region registered for that one request over exactly the octets its
  descriptor names (fast-registered, so Send with Invalidate revokes it; deregistered by the initiator when the
  completion did not), in buffers of its own; a LOAD's destination is zero-based, a store's source VA-based;
- data goes inline only when it takes at most half of Max Inline; otherwise the target RDMA-reads it;
- it posts 6 receive buffers (Completion Credits 6);
- with RECORD_COMPLETION granted, it asks for completion records on the requests whose completion need not
  revoke an STag (FREE, inline stores; and every request when it does not request INVALIDATE): a record is an
  RDMA Write, which cannot invalidate the Data Descriptor's STag;
- a direct allocation waits for its RDMA Write into the partition to complete before it sends BIND, and checks
  the slot's Block Offset lies inside its Partition before writing;
- GOODBYE waits for every outstanding request first, then for the target to end the connection (bounded), and
  ends it itself when the target did not.

What it does not implement: reconnecting with the same Initiator ID to find its bindings again (one session per
endpoint; GOODBYE without RELEASE leaves them to the target's retention), the registries' Private Use values, and
retrying a direct load whose two entry reads disagree (it reports STALE_GENERATION, as a LOAD would). A direct
allocation whose slot never fills within 400 reads returns NO_SPACE and leaves its ticket to the target's Ticket
Timeout. It requests exactly the features PICS kbtp.initiator.features declares; run the suite with PICS that
declare only these.
"""

from __future__ import annotations

import secrets
import struct
from collections.abc import Generator
from dataclasses import dataclass
from typing import Any

# The interface's types only (what the suites compare results with); every protocol value below is this module's.
from kvconform.kbtp.constants import Features, Status
from kvconform.rdma import Access, Command, Connection, ConnState, Fabric, Node, Op, Region, wait_completion_for
from kvconform.rdma import wait_until as _wait_until
from kvconform.targets.kbtp import InitiatorParams, OpResult, ReferenceInitiatorDriver

Steps = Generator[Command, Any, Any]

# ---- the text's registries ------------------------------------------------------------------------------------
VERSION = 1
HELLO, HELLO_ACK, LOAD, STORE, ALLOC_STORE, FREE, BIND, COMPLETION, GOODBYE = (
    0x01, 0x02, 0x10, 0x11, 0x12, 0x13, 0x14, 0x20, 0x30)
INLINE, SEAL, RECORD, INVALIDATE, ALLOW_UNSEALED = 0x0001, 0x0002, 0x0004, 0x0008, 0x0010
RELEASE = 0x0001
DIRECT_LOAD, DIRECT_ALLOC, RECORD_COMPLETION, ADDR_LE = 0x0001, 0x0002, 0x0004, 0x0008
IMPLEMENTED = DIRECT_LOAD | DIRECT_ALLOC | RECORD_COMPLETION | ADDR_LE
VALID, SEALED = 0x0001, 0x0002
OK, NOT_VALID, STALE_GENERATION, NO_SPACE, NOT_SEALED, TOO_LARGE, INTERNAL = 0, 3, 2, 5, 7, 8, 10
ALL_ONES = (1 << 64) - 1
TICKETS = 1 << 32

HEADER_LEN = 24
ACK_FIXED = struct.Struct(">HHIIIQII")  # Features, Request Credits, Block Size, Max Inline, Quota, Handle Base/Count,
#                                         Ticket Timeout
DIRECT_DESC = struct.Struct(">IQI")  # STag, Tagged Offset, Count (HELLO_ACK's direct-mode descriptors)
COMPLETION_BODY = struct.Struct(">IIQ")  # Data Length, Reserved, Block Offset
RECORD_LAYOUT = struct.Struct(">QHHIQ")  # Request ID, Status, Generation, Data Length, Block Offset
RECORD_LEN = 24

CREDITS = 6  # receive buffers posted for COMPLETION messages (and completion records with Immediate)
RECV_LEN = 256  # a HELLO_ACK with both direct-mode descriptor sets is 152 octets
WAIT_S = 20.0  # fabric seconds any one wait may take
GOODBYE_WAIT_S = 5.0
MAX_SLOT_READS = 400


class InitiatorFailure(Exception):
    """The connection or the target did something this initiator cannot go on from."""


# ---- encoding (the text's "Messages") ---------------------------------------------------------------------------


def header(opcode: int, flags: int, rid: int, handle: int, generation: int, le: bool) -> bytes:
    """The 24-octet common header; under ADDR_LE the Block Handle is little-endian, the rest network order."""
    return (struct.pack(">BBHQ", VERSION, opcode, flags, rid) + handle.to_bytes(8, "little" if le else "big")
            + struct.pack(">HH", generation, 0))


def data_descriptor(stag: int, to: int, length: int, le: bool) -> bytes:
    return struct.pack("<IQI" if le else ">IQI", stag, to, length)


def completion_descriptor(stag: int, to: int, le: bool) -> bytes:
    return struct.pack("<IQ" if le else ">IQ", stag, to) + bytes(4)  # 32 reserved bits


def block_offset_of(raw: bytes, le: bool) -> int:
    """The 64-bit Block Offset of a table entry or ring slot (octets 8-15)."""
    return int.from_bytes(raw[8:16], "little" if le else "big")


@dataclass(frozen=True)
class Desc:
    stag: int
    to: int
    count: int


@dataclass(frozen=True)
class Ack:
    """A HELLO_ACK with Status OK (the Target Descriptor)."""

    features: int
    request_credits: int
    block_size: int
    max_inline: int
    quota: int
    handle_base: int
    handle_count: int
    ticket_timeout_ms: int
    table: Desc | None = None
    table_base: int = 0
    pool: Desc | None = None
    partition: Desc | None = None
    ring: Desc | None = None
    head: Desc | None = None


def parse_ack(raw: bytes) -> Ack:
    fields = ACK_FIXED.unpack_from(raw, HEADER_LEN)
    features = fields[0]
    at = HEADER_LEN + ACK_FIXED.size
    extra: dict[str, Any] = {}

    def desc() -> Desc:
        nonlocal at
        d = Desc(*DIRECT_DESC.unpack_from(raw, at))
        at += DIRECT_DESC.size
        return d

    if features & DIRECT_LOAD:
        extra["table"] = desc()
        extra["table_base"] = struct.unpack_from(">Q", raw, at)[0]
        at += 16  # Table Base Handle and 8 reserved octets
        extra["pool"] = desc()
    if features & DIRECT_ALLOC:
        extra["partition"], extra["ring"], extra["head"] = desc(), desc(), desc()
    if len(raw) < at:
        raise struct.error(f"HELLO_ACK of {len(raw)} octets, its Features {features:#06x} need {at}")
    return Ack(*fields, **extra)


@dataclass
class Answer:
    """A request's COMPLETION (or completion record)."""

    status: int
    generation: int
    data_length: int
    block_offset: int
    invalidated: int | None = None


@dataclass
class Pending:
    """An outstanding request: its record slot when it asked for one."""

    rid: int
    record: Region | None = None


class IndependentInitiator:
    """kbtp-initiator driver (``python:tests.kbtp.independent_initiator:IndependentInitiator``)."""

    def start(self, fabric: Fabric, node: Node, conn: Connection, params: InitiatorParams) -> Endpoint:
        return Endpoint(fabric, node, conn, params)


class ServedIndependentInitiator(ReferenceInitiatorDriver):
    """The same initiator in a process of its own (``kvconform serve kbtp-initiator --driver-class
    tests.kbtp.independent_initiator:ServedIndependentInitiator``, which takes a subclass of the reference's driver):
    only ``start`` is used, and it is this module's, so the harness judges it as a black box over a wire."""

    def start(self, fabric: Fabric, node: Node, conn: Connection, params: InitiatorParams) -> Endpoint:  # type: ignore[override]
        return Endpoint(fabric, node, conn, params)


class Endpoint:
    """One initiator on one connection (the InitiatorEndpoint protocol of targets/kbtp.py)."""

    def __init__(self, fabric: Fabric, node: Node, conn: Connection, params: InitiatorParams) -> None:
        self.fabric, self.node, self.conn, self.params = fabric, node, conn, params
        self.iid = secrets.token_bytes(16)  # 128 bits of entropy, sent only in HELLO
        self.requested = int(params.features) & IMPLEMENTED
        self.ack: Ack | None = None
        self.le = False
        self.rid = secrets.randbits(62) + 1
        self.wr = 1 << 48
        self.answers: dict[int, Answer] = {}
        self.pending: dict[int, Pending] = {}
        self.ack_raw: bytes | None = None
        self.pumping = False
        self.failed: str | None = None
        self.outstanding = 0
        self.bound: set[int] = set()
        self.allocating = 0
        self.free_buffers: dict[int, list[Any]] = {}
        self.recv = node.register(node.alloc(CREDITS * RECV_LEN), Access.LOCAL_WRITE)
        self.scratch = node.register(node.alloc(64), Access.LOCAL_WRITE)  # never exposed: atomics and slot reads
        self.local: Region | None = None  # direct loads and allocations' data (never exposed)
        for i in range(CREDITS):  # before HELLO claims them
            conn.post_recv(self.recv.sge(i * RECV_LEN, RECV_LEN), wr_id=i)

    # ---- the interface's properties ---------------------------------------------------------------------------

    @property
    def initiator_id(self) -> bytes:
        return self.iid

    @property
    def handle_base(self) -> int:
        return self.ack.handle_base if self.ack else 0

    @property
    def handle_count(self) -> int:
        return self.ack.handle_count if self.ack else 0

    @property
    def quota(self) -> int:
        return self.ack.quota if self.ack else 0

    # ---- plumbing ---------------------------------------------------------------------------------------------

    def _next_rid(self) -> int:
        self.rid = self.rid % ((1 << 64) - 1) + 1  # never 0
        return self.rid

    def _next_wr(self) -> int:
        self.wr += 1
        return self.wr

    def _wait(self, predicate: Any, what: str) -> Steps:
        ok = yield from _wait_until(lambda: predicate() or self.failed is not None, name=what, timeout=WAIT_S)
        if self.failed is not None:
            raise InitiatorFailure(self.failed)
        if not ok:
            raise InitiatorFailure(f"{what}: not within {WAIT_S:g} s of fabric time")

    def _window(self) -> int:
        """Requests this initiator lets be outstanding: its Request Credits, and no more than the receive buffers
        it posted for their answers."""
        credits = self.ack.request_credits if self.ack else 1
        return max(1, min(credits, CREDITS))

    def _pump(self) -> Steps:
        """Take one message (or completion record) off the receive queue and file it; one actor at a time."""
        wc = yield from wait_completion_for(self.conn.cq, WAIT_S,
                                            lambda c: c.op in (Op.RECV, Op.RECV_RDMA_WITH_IMM))
        if wc is None:
            return False
        if not wc.ok:
            why = wc.terminate.reason if wc.terminate is not None else wc.status.name
            self.failed = f"connection {self.conn.name} ended: {why}"
            return True
        slot = wc.wr_id
        raw = self.recv.read(slot * RECV_LEN, wc.byte_len) if wc.op is Op.RECV else b""
        if self.conn.state is ConnState.CONNECTED:
            self.conn.post_recv(self.recv.sge(slot * RECV_LEN, RECV_LEN), wr_id=slot)
        if wc.op is Op.RECV_RDMA_WITH_IMM:
            self._file_record()
            return True
        if len(raw) < HEADER_LEN or raw[0] != VERSION:
            self.failed = f"an answer that is not KBTP version 1: {raw[:24].hex()}"
            return True
        opcode, rid, generation, status = raw[1], *struct.unpack_from(">Q", raw, 4), *struct.unpack_from(">HH", raw, 20)
        if opcode == HELLO_ACK:
            self.ack_raw = raw
        elif opcode == COMPLETION and len(raw) >= HEADER_LEN + COMPLETION_BODY.size:
            length, _reserved, block = COMPLETION_BODY.unpack_from(raw, HEADER_LEN)
            if rid in self.pending:  # anything else answers nothing this initiator asked
                self.answers[rid] = Answer(status, generation, length, block, wc.invalidated_stag)
        else:
            self.failed = f"an answer with Opcode {opcode:#04x} and {len(raw)} octets"
        return True

    def _file_record(self) -> None:
        """A completion record arrived (RDMA Write with Immediate): the outstanding request whose slot now holds
        its own Request ID."""
        for p in self.pending.values():
            if p.record is not None and p.rid not in self.answers:
                rid, status, generation, length, block = RECORD_LAYOUT.unpack(p.record.read(0, RECORD_LEN))
                if rid == p.rid:
                    self.answers[rid] = Answer(status, generation, length, block)
                    return
        self.failed = "a completion record arrived for no outstanding request"

    def _await(self, ready: Any, what: str) -> Steps:
        """Until ``ready()``: pump the receive queue, or wait while another operation pumps it."""
        while not ready():
            if self.failed is not None:
                raise InitiatorFailure(self.failed)
            if self.pumping:
                yield from self._wait(lambda: ready() or not self.pumping, what)
                continue
            self.pumping = True
            try:
                got = yield from self._pump()
            finally:
                self.pumping = False
            if not got:
                raise InitiatorFailure(f"{what}: nothing from the target within {WAIT_S:g} s of fabric time")

    def _rdma(self, post: Any, what: str) -> Steps:
        """A one-sided operation posted signaled, waited for."""
        wr = self._next_wr()
        post(wr)
        wc = yield from wait_completion_for(self.conn.cq, WAIT_S, lambda c: c.wr_id == wr and c.op not in (
            Op.RECV, Op.RECV_RDMA_WITH_IMM))
        if wc is None:
            raise InitiatorFailure(f"{what}: no completion within {WAIT_S:g} s of fabric time")
        if not wc.ok:
            raise InitiatorFailure(f"{what} failed: {wc.status.name}")

    def _buffer(self, length: int) -> Any:
        free = self.free_buffers.get(length)
        return free.pop() if free else self.node.alloc(max(length, 1))

    def _expose(self, length: int, access: Access, *, zero_based: bool) -> tuple[Region, Any]:
        """A memory region over exactly ``length`` octets of a buffer of its own: one request's STag."""
        buf = self._buffer(length)
        region = self.node.register(buf, Access.LOCAL_WRITE | access, zero_based=zero_based, length=length,
                                    remote_invalidate=True)
        return region, buf

    def _revoke(self, region: Region | None, buf: Any = None, length: int = 0) -> None:
        if region is not None and self.node.is_valid(region.stag):
            self.node.deregister(region)
        if buf is not None:
            self.free_buffers.setdefault(length, []).append(buf)

    # ---- requests ---------------------------------------------------------------------------------------------

    def _request(self, opcode: int, flags: int, handle: int, generation: int, body: bytes = b"", *,
                 record: bool = False, tail: bytes = b"", expose: tuple[int, Access, bytes | None] | None = None
                 ) -> Steps:
        """Send one request within the credits and wait for its answer: (Answer, what a LOAD's buffer then holds).

        ``expose`` (length, access, data to place or None for a LOAD's destination): a memory region registered for
        this request alone, only once it holds its credit (no STag is remotely valid before a descriptor naming it
        is sent), named by the Data Descriptor, revoked when the request completed."""
        while self.outstanding >= self._window():  # re-checked on waking: several waiters may wake at once
            yield from self._wait(lambda: self.outstanding < self._window(), "a Request Credit")
        rid = self._next_rid()
        p = Pending(rid)
        self.pending[rid] = p
        self.outstanding += 1
        region, buf, length = None, None, 0
        try:
            if expose is not None:
                length, access, data = expose
                region, buf = self._expose(length, access, zero_based=data is None)
                if data is not None:
                    region.write(0, data)
                body = data_descriptor(region.stag, region.to(0), length, self.le) + body
            if record:
                p.record = self.node.register(self.node.alloc(RECORD_LEN), Access.LOCAL_WRITE | Access.REMOTE_WRITE,
                                              length=RECORD_LEN)
                flags |= RECORD
                body += completion_descriptor(p.record.stag, p.record.to(0), self.le)
            self.conn.post_send(header(opcode, flags, rid, handle, generation, self.le) + body + tail, signaled=False,
                                solicited=True)
            yield from self._await(lambda: rid in self.answers, f"the answer to Request ID {rid:#x}")
            a = self.answers.pop(rid)
            loaded = None
            if region is not None and expose is not None and expose[2] is None and a.status == OK:
                loaded = region.read(0, min(a.data_length, length))
            return a, loaded
        finally:
            self.outstanding -= 1
            del self.pending[rid]
            self._revoke(p.record)
            self._revoke(region, buf, length)

    def _records(self, names_stag: bool) -> bool:
        """Whether a request asks for a completion record (see the module docstring)."""
        if not self.ack or not self.ack.features & RECORD_COMPLETION:
            return False
        return not names_stag or not self.params.requests_invalidate

    def _invalidate_flag(self) -> int:
        return INVALIDATE if self.params.requests_invalidate else 0

    @staticmethod
    def _result(a: Answer, data: bytes | None = None) -> OpResult:
        return OpResult(_status(a.status), a.generation, a.data_length, a.block_offset, data)

    def _session(self) -> Ack:
        if self.ack is None:
            raise InitiatorFailure("no session: HELLO first")
        return self.ack

    def hello(self) -> Steps:
        self.conn.post_send(header(HELLO, 0, 0, 0, 0, False) + struct.pack(">HH", self.requested, CREDITS) + self.iid,
                            signaled=False, solicited=True)
        try:
            yield from self._await(lambda: self.ack_raw is not None, "HELLO_ACK")
        except InitiatorFailure:
            if self.conn.state is not ConnState.CONNECTED:
                return None  # refused by ending the connection
            raise
        raw = self.ack_raw
        assert raw is not None
        if struct.unpack_from(">H", raw, 22)[0] != OK:
            return None
        self.ack = parse_ack(raw)
        self.le = bool(self.ack.features & ADDR_LE)
        self.local = self.node.register(self.node.alloc(self.ack.block_size), Access.LOCAL_WRITE)
        return Features(self.ack.features & 0x000F)

    def _store(self, opcode: int, handle: int, data: bytes, seal: bool, generation: int) -> Steps:
        ack = self._session()
        flags = SEAL if seal else 0
        if 2 * len(data) <= ack.max_inline or not data:
            a, _ = yield from self._request(opcode, flags | INLINE, handle, generation,
                                            data_descriptor(0, 0, len(data), self.le), record=self._records(False),
                                            tail=data)
            return a
        a, _ = yield from self._request(opcode, flags | self._invalidate_flag(), handle, generation,
                                        record=self._records(True), expose=(len(data), Access.REMOTE_READ, data))
        return a

    def alloc_store(self, handle: int, data: bytes, *, seal: bool = True) -> Steps:
        if len(self.bound) + self.allocating >= self.quota:
            return OpResult(Status.NO_SPACE, detail="not sent: the Allocation Quota is in use")
        self.allocating += 1
        try:
            a = yield from self._store(ALLOC_STORE, handle, data, seal, 0)
        finally:
            self.allocating -= 1
        if a.status == OK:
            self.bound.add(handle)
        return self._result(a)

    def store(self, handle: int, data: bytes, *, seal: bool = True, generation: int = 0) -> Steps:
        a = yield from self._store(STORE, handle, data, seal, generation)
        return self._result(a)

    def load(self, handle: int, length: int, *, allow_unsealed: bool = False, generation: int = 0) -> Steps:
        self._session()
        flags = (ALLOW_UNSEALED if allow_unsealed else 0)
        record = self._records(True)
        if not record:
            flags |= self._invalidate_flag()
        a, data = yield from self._request(LOAD, flags, handle, generation, record=record,
                                           expose=(length, Access.REMOTE_WRITE, None))
        return self._result(a, data)

    def free(self, handle: int, *, generation: int = 0) -> Steps:
        self._session()
        a, _ = yield from self._request(FREE, 0, handle, generation, record=self._records(False))
        if a.status == OK:
            self.bound.discard(handle)
        return self._result(a)

    def goodbye(self, release: bool = False) -> Steps:
        yield from self._wait(lambda: self.outstanding == 0, "the outstanding requests before GOODBYE")
        self.conn.post_send(header(GOODBYE, RELEASE if release else 0, 0, 0, 0, self.le), signaled=False,
                            solicited=True)
        closed = yield from _wait_until(lambda: self.conn.state is not ConnState.CONNECTED, name="goodbye",
                                        timeout=GOODBYE_WAIT_S)
        if not closed:
            self.conn.disconnect()
        if release:
            self.bound.clear()
        return None

    # ---- DIRECT_LOAD ------------------------------------------------------------------------------------------

    def _read(self, dst: Any, stag: int, to: int, what: str) -> Steps:
        yield from self._rdma(lambda wr: self.conn.post_read(dst, stag, to, wr_id=wr), what)

    def _entry(self, ack: Ack, handle: int) -> Steps:
        """(Flags, Generation, Data Length, Block Offset) of the handle's table entry, by RDMA Read."""
        assert ack.table is not None
        to = ack.table.to + 16 * (handle - ack.table_base)
        yield from self._read(self.scratch.sge(16, 16), ack.table.stag, to, f"RDMA Read of the entry of {handle:#x}")
        raw = self.scratch.read(16, 16)
        flags, generation, length = struct.unpack_from(">HHI", raw)
        return flags, generation, length, block_offset_of(raw, self.le)

    def direct_load(self, handle: int, length: int) -> Steps:
        ack = self._session()
        if not ack.features & DIRECT_LOAD or ack.pool is None or ack.table is None or self.local is None:
            return OpResult(Status.INTERNAL, detail="DIRECT_LOAD was not granted")
        if not 0 <= handle - ack.table_base < ack.table.count:
            return OpResult(Status.INVALID_HANDLE, detail="the handle has no entry in the exposed table")
        flags, generation, data_length, block = yield from self._entry(ack, handle)
        if not flags & VALID:
            return OpResult(Status.NOT_VALID, generation, detail="first entry read: not VALID")
        if not flags & SEALED:
            return OpResult(Status.NOT_SEALED, generation, detail="first entry read: not SEALED")
        if data_length > min(length, ack.block_size):
            return OpResult(Status.TOO_LARGE, generation, data_length, block)
        if data_length:
            yield from self._read(self.local.sge(0, data_length), ack.pool.stag, block, "RDMA Read of the block")
        data = self.local.read(0, data_length)
        again = yield from self._entry(ack, handle)
        if again[0] & (VALID | SEALED) != VALID | SEALED or again[1] != generation:
            return OpResult(Status.STALE_GENERATION, again[1], detail=f"entry Generation {generation} then {again[1]}, "
                            f"flags {again[0]:#x}")
        return OpResult(Status.OK, generation, data_length, block, data)

    # ---- DIRECT_ALLOC -----------------------------------------------------------------------------------------

    def direct_alloc(self, handle: int, data: bytes) -> Steps:
        ack = self._session()
        if not ack.features & DIRECT_ALLOC or None in (ack.partition, ack.ring, ack.head) or self.local is None:
            return OpResult(Status.INTERNAL, detail="DIRECT_ALLOC was not granted")
        assert ack.partition is not None and ack.ring is not None and ack.head is not None
        if len(self.bound) + self.allocating >= self.quota:
            return OpResult(Status.NO_SPACE, detail="not taken: the Allocation Quota is in use")
        if len(data) > ack.block_size:
            return OpResult(Status.TOO_LARGE, detail="larger than a block")
        self.allocating += 1
        try:
            return (yield from self._direct_alloc(ack, handle, data))
        finally:
            self.allocating -= 1

    def _direct_alloc(self, ack: Ack, handle: int, data: bytes) -> Steps:
        assert ack.partition is not None and ack.ring is not None and ack.head is not None and self.local is not None
        n = ack.ring.count.bit_length() - 1
        masked = self.conn.profile.masked_atomics
        add = 0x0000_0001_0000_0010 if masked else 0x0000_0001_0000_0000
        mask = (1 << 63) | (1 << 31) | (1 << (n + 3)) if masked else 0
        head = ack.head
        yield from self._rdma(lambda wr: self.conn.post_fetch_add(self.scratch.sge(0, 8), head.stag, head.to, add, mask,
                                                                  wr_id=wr), "FetchAdd on the Head")
        counter = self.scratch.read_u64(0)
        ticket = counter >> 32
        offset = counter & ((1 << (n + 4)) - 1) if masked else 16 * (ticket % ack.ring.count)
        block = None
        for _ in range(MAX_SLOT_READS):
            seq, got = yield from self._slot(ack, offset)
            if seq != ticket or got == ALL_ONES:
                continue
            seq2, got2 = yield from self._slot(ack, offset)  # a 16-octet read is not atomic: confirm both
            if (seq2, got2) == (seq, got):
                block = got
                break
        if block is None:
            return OpResult(Status.NO_SPACE, detail=f"ticket {ticket:#x}: its slot never held a block")
        part = ack.partition
        if not part.to <= block <= part.to + (part.count - 1) * ack.block_size:
            return OpResult(Status.INTERNAL, detail=f"ticket {ticket:#x}: Block Offset {block:#x} outside the "
                            f"Partition [{part.to:#x}, {part.count} blocks)")
        if data:
            self.local.write(0, data)
            yield from self._rdma(lambda wr: self.conn.post_write(self.local.sge(0, len(data)), part.stag, block,  # type: ignore[union-attr]
                                                                  wr_id=wr), "RDMA Write into the partition")
        a, _ = yield from self._request(BIND, 0, handle, 0, struct.pack(">IIQ", ticket, len(data), block))
        if a.status == OK:
            self.bound.add(handle)
        return self._result(a)

    def _slot(self, ack: Ack, offset: int) -> Steps:
        """(Sequence, Block Offset) of the ring slot at ``offset``."""
        assert ack.ring is not None
        yield from self._read(self.scratch.sge(32, 16), ack.ring.stag, ack.ring.to + offset, "RDMA Read of a slot")
        raw = self.scratch.read(32, 16)
        return struct.unpack_from(">I", raw)[0], block_offset_of(raw, self.le)


def _status(code: int) -> Status | int:
    try:
        return Status(code)
    except ValueError:
        return code
