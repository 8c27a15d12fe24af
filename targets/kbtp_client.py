"""The harness's own KBTP initiator, used by the kbtp-target suite to drive a target under test.

It speaks KBTP with full control of the bytes: every request can be sent exactly as the codec's raw
encoder writes it (wrong version, unknown opcode, truncated, over-long lengths, descriptors out of
range), and every completion is decoded and recorded as evidence. It also performs the direct-mode RDMA
operations (table and pool reads, FetchAdd on the Head, partition writes, BIND) step by step, so a check
can stop between any two of them (a withheld BIND, a delayed slot read).

Every wait names the requirement that says the awaited thing must happen (``req``): a completion that
never comes fails that requirement, never a default one. The defaults per operation are the R_* constants
below (the text's "It completes the request" of each operation); a check that waits for something else (a
refusal with a status, the answer to a malformed request) passes its own. While an initiator waits, it
says for what (``waiting``), so a target that crashes or spins meanwhile is blamed on the same requirement.

All operations are fabric actors: ``result = yield from client.call(...)`` inside an actor.
"""

from __future__ import annotations

import itertools
import secrets
import struct
from collections.abc import Generator
from dataclasses import dataclass, field
from typing import Any, NoReturn, cast

from kvconform import evidence
from kvconform.kbtp.constants import (
    EMPTY_BLOCK_OFFSET,
    RING_SLOT_SIZE,  # re-exported for the checks
    TABLE_ENTRY_SIZE,
    EntryFlags,
    Features,
    RequestFlags,
)
from kvconform.kbtp.messages import (
    AllocStore,
    Bind,
    Completion,
    CompletionDescriptor,
    DataDescriptor,
    DirectAlloc,
    DirectLoad,
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
    Window,
    wait_completion_for,
)
from kvconform.rdma import (
    Completion as WorkCompletion,
)
from kvconform.rdma.runtime import PostingEndpoint
from kvconform.verdicts import HarnessBug, check, current_check, not_applicable, violation

Gen = Generator[Command, Any, Any]
__all__ = ["RING_SLOT_SIZE", "Ended", "Gen", "HarnessInitiator", "Reply", "Session", "add_mask", "decode_entry",
           "decode_slot", "header_only", "pattern", "precise"]

RECV_SIZE = 4096 + 512  # largest message the harness expects: a HELLO_ACK or a COMPLETION
RECV_DEPTH = 16
WAIT_S = 30.0  # fabric seconds a harness actor waits for a completion before calling it lost
SLOT_READS = 1000  # re-reads of a ring slot before its block is called lost

# What says each awaited thing must happen (conformance/requirements/kbtp.yaml).
R_HELLO = "KBTP-HELLO-FIRST"  # the target answers HELLO with HELLO_ACK
R_ALLOC = "KBTP-QUOTA-ALLOC-BOUNDED"  # an allocation within quota waits at most for an in-progress free
R_LOAD = "KBTP-LOAD-COMPLETE"  # Block Load 3: it completes the request
R_STORE = "KBTP-STORE-DATA"  # Block Mapped Store 4: it completes the request
R_FREE = "KBTP-FREE-RETURN"  # Block Free 4: it completes the request
R_BIND = "KBTP-BIND-VERIFY"  # BIND: ... writes the table entry, and completes
R_ATOMICS = "KBTP-RDMAP-ATOMICS"  # the Head takes FetchAdd
ALL_FEATURES = Features(0xF)


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

    @property
    def completion(self) -> Completion:
        """The COMPLETION (HarnessBug when this is a HELLO_ACK: a check read the wrong reply)."""
        if not isinstance(self.message, Completion):
            raise HarnessBug(f"expected a COMPLETION here, the reply is {type(self.message).__name__}")
        return self.message

    @property
    def block_offset(self) -> int:
        return self.completion.block_offset

    @property
    def data_length(self) -> int:
        return self.completion.data_length

    @property
    def request_id(self) -> int:
        return self.message.request_id


@dataclass(frozen=True)
class Ended:
    """Instead of a reply, the connection ended (the target terminated it, or an RDMA error broke it)."""

    reason: str


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
        """Handle ``i`` of the range; a check that needs more handles than the target's Handle Count (which PICS
        kbtp.target.handle_count declares and HELLO_ACK advertises) does not apply to it."""
        if not 0 <= i < self.ack.handle_count:
            not_applicable(f"the check uses handle {i} of the initiator's range, and the target's Handle Count is "
                           f"{self.ack.handle_count}")
        return self.ack.handle_base + i

    def holds(self, octets: int, *, allocates: bool) -> None:
        """A store the check means to succeed needs a block, and an allocation a quota, that can hold it: at a
        declared geometry that has neither (PICS kbtp.target.pool.block_size, kbtp.target.quota, as HELLO_ACK
        advertises them; their agreement with PICS is test_session's) the check does not apply, since a refusal
        there is the geometry's, not the target's fault."""
        if allocates and self.ack.allocation_quota == 0:
            not_applicable("the check allocates, and the target's Allocation Quota is 0 (HELLO_ACK; PICS "
                           "kbtp.target.quota): it lets this initiator allocate nothing")
        if octets > self.ack.block_size:
            not_applicable(f"the check stores {octets} octets, and the target's Block Size is {self.ack.block_size} "
                           "(HELLO_ACK; PICS kbtp.target.pool.block_size)")


def pattern(i: int, octets: int) -> bytes:
    """``octets`` of data unique to ``i`` among 2^16 (a quota of hundreds of blocks is legal: one octet of ``i``
    would repeat, and ``bytes([i])`` fails at 256)."""
    return ((i % 0x10000).to_bytes(2, "big") * (octets // 2 + 1))[:octets]


def precise(named: str, fallback: str) -> str:
    """``named`` (the requirement the codec names for a field it refuses) when the running check cites it, so the
    failure blames the rule the field breaks; else ``fallback`` (what the check was waiting for)."""
    context = current_check()
    return named if context is not None and named in context.cited else fallback


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
    replies: list[Reply] = field(default_factory=list)
    waiting: tuple[str, str] | None = None  # (requirement, what) while it waits for the target
    # A client of the harness's own target (the kbtp-initiator suite's second party): what goes wrong on it
    # is a bug of the harness, never a verdict.
    harness_side: bool = False
    # A long drive (the Generation wrap) records a summary, not every message: per-message evidence would
    # grow the transcript by tens of thousands of events.
    quiet: bool = False
    _recv: Region = field(init=False)
    _ids: itertools.count[int] = field(default_factory=lambda: itertools.count(1))

    def __post_init__(self) -> None:
        self._recv = self.node.register(self.node.alloc(RECV_SIZE * RECV_DEPTH), Access.LOCAL_WRITE)
        for i in range(RECV_DEPTH):
            self.conn.post_recv(self._recv.sge(i * RECV_SIZE, RECV_SIZE), wr_id=i)

    def _check(self, condition: object, what: str, *, req: str, **kw: Any) -> None:
        if self.harness_side:
            if not condition:
                raise HarnessBug(f"the harness's own target failed: {what} ({req})")
            return
        check(condition, what, req=req, **kw)

    def _violation(self, what: str, *, req: str, **kw: Any) -> NoReturn:
        if self.harness_side:
            raise HarnessBug(f"the harness's own target failed: {what} ({req})")
        violation(what, req=req, **kw)

    # ---- memory the target reads and writes --------------------------------------------------------

    def buffer(self, length: int, access: Access = Access.LOCAL_WRITE | Access.REMOTE_WRITE | Access.REMOTE_READ,
               data: bytes = b"") -> Region:
        """A registered buffer of ``length`` octets holding ``data``."""
        region = self.node.register(self.node.alloc(max(length, 1)), access | Access.LOCAL_WRITE)
        if data:
            region.write(0, data)
        return region

    def at_delivery(self, region: Region, length: int) -> list[bytes] | None:
        """What ``region``'s first ``length`` octets hold at each receive this client's connection delivers from
        now on, in delivery order: read by the harness's engine as it delivers the Send, before anything that
        arrived after it is placed (a wire places a whole batch of arrivals before the CQ sees the first). None
        when the fabric cannot show that moment (its endpoint has no delivery hook)."""
        if not isinstance(self.conn, PostingEndpoint):
            return None
        seen: list[bytes] = []
        self.conn.on_deliver = lambda: seen.append(region.read(0, length))
        return seen

    def descriptor(self, region: Region | Window, length: int | None = None, offset: int = 0) -> DataDescriptor:
        return DataDescriptor(region.stag, region.to(offset), region.length - offset if length is None else length)

    def next_id(self) -> int:
        return next(self._ids)

    @property
    def addr_le(self) -> bool:
        return self.session.addr_le if self.session else False

    @property
    def ack(self) -> HelloAck:
        """The HELLO_ACK of this client's session (HarnessBug before one was granted)."""
        return self._session().ack

    def handle(self, i: int) -> int:
        """Handle ``i`` of this client's range."""
        return self._session().handle(i)

    def holds(self, octets: int, *, allocates: bool = True) -> None:
        """Not applicable where this session's quota or Block Size cannot take a store of ``octets`` the check
        means to succeed (``Session.holds``); ``refused=True`` on a request says the check means it refused."""
        if self.session:
            self.session.holds(octets, allocates=allocates)

    # ---- messages ---------------------------------------------------------------------------------

    def send(self, raw: bytes, *, tag: str | None = None, signaled: bool = True) -> None:
        """Post ``raw`` as a Send; ``signaled=False`` for a long pipeline whose send completions nobody reaps
        (an error still completes)."""
        if not self.quiet:
            evidence.record("sent", "kbtp", {"initiator": self.name, "octets": len(raw)}, raw=raw)
        self.conn.post_send(raw, tag=tag, signaled=signaled)

    def _next_receive(self, req: str, what: str, timeout: float, records: bool) -> Gen:
        """The next receive completion (a message, or with ``records`` an RDMA Write with Immediate), or an
        error completion; a violation of ``req`` when nothing comes within ``timeout``."""
        self.waiting = (req, what)
        try:
            wc: WorkCompletion | None = yield from wait_completion_for(
                self.conn.cq, timeout,
                lambda c: c.op is Op.RECV or (records and c.op is Op.RECV_RDMA_WITH_IMM) or not c.ok)
        finally:
            self.waiting = None
        self._check(wc is not None, f"{self.name}: {what}: nothing arrived within {timeout} s of fabric time "
              f"(connection {self.conn.state.name})", req=req)
        return cast(WorkCompletion, wc)

    def _message(self, wc: WorkCompletion, req: str, what: str) -> Reply:
        raw = self._recv.read(wc.wr_id * RECV_SIZE, wc.byte_len)
        self.conn.post_recv(self._recv.sge(wc.wr_id * RECV_SIZE, RECV_SIZE), wr_id=wc.wr_id)
        try:
            msg = decode(raw)
        except KbtpDecodeError as exc:
            evidence.record("received", "kbtp", {"initiator": self.name, "undecodable": str(exc)}, raw=raw)
            self._violation(f"{self.name}: {what}: the target sent a message that does not decode: {exc}",
                            req=precise(exc.requirement, req))
        if not isinstance(msg, Completion | HelloAck):
            self._violation(f"{self.name}: {what}: the target sent {type(msg).__name__}", req=req,
                      expected="COMPLETION or HELLO_ACK")
        if not self.quiet:
            evidence.record("received", "kbtp", {"initiator": self.name, "message": msg.__class__.__name__,
                                                 "status": int(msg.status), "request_id": msg.request_id}, raw=raw)
        reply = Reply(msg, raw, wc.invalidated_stag)
        self.replies.append(reply)
        return reply

    def receive(self, *, req: str, what: str, timeout: float = WAIT_S, allow_end: bool = False) -> Gen:
        """The next message from the target (a Reply). The connection failing instead is a violation of
        ``req`` too, unless ``allow_end`` (the text lets the target end it here): then an ``Ended``."""
        wc = yield from self._next_receive(req, what, timeout, records=False)
        if not wc.ok:
            ended = Ended(f"{wc.status.name} (terminate {wc.terminate})")
            evidence.record("note", "kbtp-connection-ended", {"initiator": self.name, "while": what,
                                                              "reason": ended.reason})
            if allow_end:
                return ended
            self._violation(f"{self.name}: {what}: the connection failed instead: {ended.reason}", req=req)
        return self._message(wc, req, what)

    def receive_any(self, *, req: str, what: str, timeout: float = WAIT_S) -> Gen:
        """The next completion: a Reply (a message) or the work completion of an RDMA Write with Immediate
        (a completion record arrived); the receive buffer is re-posted either way."""
        wc = yield from self._next_receive(req, what, timeout, records=True)
        self._check(wc.ok, f"{self.name}: {what}: the connection failed instead: {wc.status.name} "
              f"(terminate {wc.terminate})", req=req)
        if wc.op is Op.RECV_RDMA_WITH_IMM:
            self.conn.post_recv(self._recv.sge(wc.wr_id * RECV_SIZE, RECV_SIZE), wr_id=wc.wr_id)
            evidence.record("received", "kbtp-record", {"initiator": self.name, "imm": wc.imm})
            return wc
        return self._message(wc, req, what)

    def call(self, raw: bytes, *, req: str, what: str, timeout: float = WAIT_S, allow_end: bool = False) -> Gen:
        """Send one request and return its completion (a Reply; an ``Ended`` only with ``allow_end``)."""
        self.send(raw)
        reply = yield from self.receive(req=req, what=what, timeout=timeout, allow_end=allow_end)
        return reply

    def hello(self, requested: Features = ALL_FEATURES, credits: int = RECV_DEPTH, *, req: str = R_HELLO,
              allow_end: bool = False) -> Gen:
        """HELLO / HELLO_ACK; returns the HelloAck (any Status: a refusal is the caller's to judge), or an
        ``Ended`` with ``allow_end``."""
        raw = Hello(requested_features=requested, completion_credits=credits,
                    initiator_id=self.initiator_id).encode()
        reply = yield from self.call(raw, req=req, what="HELLO_ACK for HELLO", allow_end=allow_end)
        if isinstance(reply, Ended):
            return reply
        ack = reply.message
        if not isinstance(ack, HelloAck):
            self._violation(f"{self.name}: HELLO answered by {type(ack).__name__}", req=req, expected="HELLO_ACK")
        if ack.status == 0:
            feats = Features(ack.features)
            self.session = Session(ack, feats, bool(feats & Features.ADDR_LE))
        return ack

    # ---- operations (encoded with the session's byte order) --------------------------------------------

    def enc(self, msg: Any) -> bytes:
        return bytes(msg.encode_raw(addr_le=self.addr_le))

    def alloc_store_msg(self, handle: int, data: bytes, *, request_id: int, flags: int = RequestFlags.SEAL,
                        generation: int = 0, source: Region | None = None,
                        completion: CompletionDescriptor | None = None, refused: bool = False) -> AllocStore:
        """An ALLOC_STORE of ``data``: inline when it fits the session's Max Inline and no source is given, else by
        RDMA Read (from ``source``, or a fresh buffer holding ``data``); RECORD set when ``completion`` is given.
        Not applicable where the session's quota or Block Size cannot take it, unless the check means it
        ``refused`` (``Session.holds``)."""
        if not refused:
            self.holds(len(data), allocates=True)
        max_inline = self.session.ack.max_inline if self.session else 0
        if source is None and len(data) <= max_inline:
            return AllocStore.with_inline(data, flags=flags, request_id=request_id, handle=handle,
                                          generation=generation, completion=completion)
        src = source or self.buffer(len(data), data=data)
        return AllocStore(request_id=request_id, handle=handle, generation=generation, completion=completion,
                          flags=flags | (RequestFlags.RECORD if completion is not None else 0),
                          data=self.descriptor(src, len(data)))

    def alloc_store(self, handle: int, data: bytes, *, flags: int = RequestFlags.SEAL, generation: int = 0,
                    source: Region | None = None, req: str = R_ALLOC, allow_end: bool = False,
                    refused: bool = False) -> Gen:
        """ALLOC_STORE of ``data``: inline when it fits Max Inline and no source is given, else by RDMA Read."""
        rid = self.next_id()
        msg = self.alloc_store_msg(handle, data, request_id=rid, flags=flags, generation=generation, source=source,
                                   refused=refused)
        reply = yield from self.call(self.enc(msg), req=req, allow_end=allow_end,
                                     what=f"COMPLETION of ALLOC_STORE {rid} (handle {handle:#x}, {len(data)} octets)")
        return reply

    def store(self, handle: int, data: bytes, *, flags: int = RequestFlags.SEAL, generation: int = 0,
              req: str = R_STORE, refused: bool = False) -> Gen:
        if not refused:
            self.holds(len(data), allocates=False)
        rid = self.next_id()
        max_inline = self.session.ack.max_inline if self.session else 0
        if len(data) <= max_inline:
            msg: Any = Store.with_inline(data, flags=flags, request_id=rid, handle=handle, generation=generation)
        else:
            src = self.buffer(len(data), data=data)
            msg = Store(request_id=rid, handle=handle, generation=generation, flags=flags,
                        data=self.descriptor(src, len(data)))
        reply = yield from self.call(self.enc(msg), req=req,
                                     what=f"COMPLETION of STORE {rid} (handle {handle:#x})")
        return reply

    def load(self, handle: int, length: int, *, flags: int = 0, generation: int = 0,
             dest: Region | Window | None = None, req: str = R_LOAD) -> Gen:
        """LOAD into a fresh buffer of ``length`` (or ``dest``); returns (Reply, the Data Length octets there)."""
        dst = dest or self.buffer(length)
        rid = self.next_id()
        msg = Load(request_id=rid, handle=handle, generation=generation, flags=flags,
                   data=self.descriptor(dst, length))
        reply = yield from self.call(self.enc(msg), req=req, what=f"COMPLETION of LOAD {rid} (handle {handle:#x})")
        n = min(length, reply.message.data_length) if isinstance(reply.message, Completion) else 0
        got = dst.region.read(dst.offset, n) if isinstance(dst, Window) else dst.read(0, n)
        return reply, got

    def free(self, handle: int, *, generation: int = 0, req: str = R_FREE) -> Gen:
        rid = self.next_id()
        reply = yield from self.call(self.enc(Free(request_id=rid, handle=handle, generation=generation)), req=req,
                                     what=f"COMPLETION of FREE {rid} (handle {handle:#x})")
        return reply

    def bind(self, handle: int, ticket: int, data_length: int, block_offset: int, *, req: str = R_BIND,
             allow_end: bool = False) -> Gen:
        """BIND of a block written through the partition: not applicable for a Data Length over a block (a refusal
        for it is the geometry's; test_bind_refusals crafts that BIND itself)."""
        self.holds(data_length, allocates=False)
        rid = self.next_id()
        msg = Bind(request_id=rid, handle=handle, ticket=ticket, data_length=data_length, block_offset=block_offset)
        reply = yield from self.call(self.enc(msg), req=req, allow_end=allow_end,
                                     what=f"COMPLETION of BIND {rid} (handle {handle:#x}, ticket {ticket})")
        return reply

    def goodbye(self, release: bool = False) -> None:
        self.send(self.enc(Goodbye(flags=1 if release else 0)))

    # ---- one-sided RDMA operations (direct modes) ----------------------------------------------------

    def rdma_read(self, stag: int, to: int, length: int, *, req: str, tag: str | None = None) -> Gen:
        """RDMA Read of ``length`` octets; returns (work completion, bytes). ``req``: what says the target's
        memory answers it (an RDMA error completes it; only a read that never completes violates ``req``)."""
        dst = self.buffer(length, Access.LOCAL_WRITE)
        self.conn.post_read(dst.sge(0, length), stag, to, tag=tag)
        wc = yield from self._wait_op(Op.RDMA_READ, req)
        return wc, dst.read(0, length) if wc.ok else b""

    def rdma_write(self, stag: int, to: int, data: bytes, *, req: str, tag: str | None = None) -> Gen:
        """RDMA Write; its work completion, which says whether the target accepted it. Where a successful Write
        completion only means the data left (iWARP has no acknowledgements: a refusal arrives later as a
        Terminate), a zero-length RDMA Read follows it: RDMAP processes requests in order, so the Read's answer
        comes after the target has placed or refused the Write, and a refusal fails the Read."""
        src = self.buffer(len(data), Access.LOCAL_WRITE, data)
        self.conn.post_write(src.sge(0, len(data)), stag, to, tag=tag)
        wc = yield from self._wait_op(Op.RDMA_WRITE, req)
        if wc.ok and not getattr(self.fabric, "writes_acknowledged", True):
            probe = self.buffer(1, Access.LOCAL_WRITE)
            self.conn.post_read(probe.sge(0, 0), 0, 0, tag=f"{tag or 'write'}-probe")
            after = yield from self._wait_op(Op.RDMA_READ, req)
            if not after.ok:
                return after
        return wc

    def fetch_add(self, stag: int, to: int, add: int, mask: int, *, req: str = R_ATOMICS,
                  tag: str | None = None) -> Gen:
        """FetchAdd; returns (work completion, the original value in host order)."""
        dst = self.buffer(8, Access.LOCAL_WRITE)
        self.conn.post_fetch_add(dst.sge(0, 8), stag, to, add, mask, tag=tag)
        wc = yield from self._wait_op(Op.FETCH_ADD, req)
        return wc, dst.read_u64(0) if wc.ok else None

    def _wait_op(self, op: Op, req: str) -> Gen:
        what = f"completion of the {op.name}"
        self.waiting = (req, what)
        try:
            wc = yield from wait_completion_for(self.conn.cq, WAIT_S, lambda c: c.op is op or not c.ok)
        finally:
            self.waiting = None
        if wc is None:  # (a completed one, even with an error, observes nothing of ``req``: not reached)
            self._violation(f"{self.name}: {what}: none within {WAIT_S} s of fabric time", req=req)
        return wc

    def read_entry(self, handle: int, *, req: str) -> Gen:
        """Direct read of a table entry; (flags, generation, data length, block offset), or None when the
        RDMA Read failed."""
        s = self._session()
        dl = self._direct_load()
        to = dl.table.tagged_offset + TABLE_ENTRY_SIZE * (handle - dl.table_base_handle)
        wc, raw = yield from self.rdma_read(dl.table.stag, to, TABLE_ENTRY_SIZE, req=req, tag=f"entry-{handle:#x}")
        if not wc.ok:
            return None
        return decode_entry(raw, s.addr_le)

    def read_slot(self, ring_stag: int, ring_to: int, slot_offset: int, *, req: str) -> Gen:
        """Direct read of a ring slot; (sequence, block offset), or None on an RDMA error."""
        s = self._session()
        wc, raw = yield from self.rdma_read(ring_stag, ring_to + slot_offset, RING_SLOT_SIZE, req=req,
                                            tag=f"slot-{slot_offset}")
        if not wc.ok:
            return None
        return decode_slot(raw, s.addr_le)

    def take_ticket(self, *, req: str = R_ATOMICS) -> Gen:
        """FetchAdd on this initiator's DIRECT_ALLOC Head; returns (ticket, slot offset)."""
        da = self._direct_alloc()
        masked = self.conn.profile.masked_atomics
        # Masked (RFC 7306): Ticket and Slot Offset advance together; unmasked (IB): Ticket only, and the
        # slot is 16 * (ticket mod N) (KBTP "InfiniBand and RoCEv2").
        add, mask = (0x0000_0001_0000_0010, add_mask(da.ring.count)) if masked else (0x0000_0001_0000_0000, 0)
        wc, old = yield from self.fetch_add(da.head.stag, da.head.tagged_offset, add, mask, req=req, tag="head")
        self._check(wc.ok, f"{self.name}: FetchAdd on the Head failed: {wc.status.name} {wc.terminate}", req=req)
        ticket = old >> 32
        if masked:
            return ticket, old & ((da.ring.count * RING_SLOT_SIZE) - 1)
        return ticket, RING_SLOT_SIZE * (ticket % da.ring.count)

    def await_slot(self, ticket: int, slot_offset: int, *, req: str, max_reads: int = SLOT_READS) -> Gen:
        """Re-read the ticket's slot until Sequence == ticket and Block Offset is not all ones, then confirm;
        the block. A slot that never fills (or cannot be read) violates ``req``."""
        da = self._direct_alloc()
        what = f"slot {slot_offset} to show ticket {ticket} with a block"
        for _ in range(max_reads):
            got = yield from self.read_slot(da.ring.stag, da.ring.tagged_offset, slot_offset, req=req)
            self._check(got is not None, f"{self.name}: {what}: the RDMA Read of the slot failed", req=req)
            seq, offset = got
            if seq == ticket & 0xFFFF_FFFF and offset != EMPTY_BLOCK_OFFSET:
                again = yield from self.read_slot(da.ring.stag, da.ring.tagged_offset, slot_offset, req=req)
                if again == got:
                    return offset
        self._violation(f"{self.name}: {what}: still not there after {max_reads} reads", req=req)

    def write_block(self, block_offset: int, data: bytes, *, req: str) -> Gen:
        """RDMA Write into the partition at ``block_offset`` (a Tagged Offset within the Pool STag); not applicable
        when ``data`` is longer than a block (it would run into the next, or out of the partition)."""
        self.holds(len(data), allocates=False)
        da = self._direct_alloc()
        wc = yield from self.rdma_write(da.partition.stag, block_offset, data, req=req, tag="block")
        return wc

    def _session(self) -> Session:
        if self.session is None:
            raise HarnessBug(f"{self.name}: no session (HELLO not done, or refused)")
        return self.session

    @property
    def dl(self) -> DirectLoad:
        """The DIRECT_LOAD descriptors of this session (HarnessBug when not granted)."""
        return self._direct_load()

    @property
    def da(self) -> DirectAlloc:
        """The DIRECT_ALLOC descriptors of this session (HarnessBug when not granted)."""
        return self._direct_alloc()

    def _direct_load(self) -> DirectLoad:
        dl = self._session().ack.direct_load
        if dl is None:
            raise HarnessBug(f"{self.name}: DIRECT_LOAD was not granted; the check should have asked")
        return dl

    def _direct_alloc(self) -> DirectAlloc:
        da = self._session().ack.direct_alloc
        if da is None:
            raise HarnessBug(f"{self.name}: DIRECT_ALLOC was not granted; the check should have asked")
        return da

    @property
    def broken(self) -> bool:
        return self.conn.state is not ConnState.CONNECTED


def decode_entry(raw: bytes, addr_le: bool) -> tuple[EntryFlags, int, int, int]:
    """A table entry as read: (Flags, Generation, Data Length, Block Offset); Block Offset per ADDR_LE."""
    flags, gen, length = struct.unpack_from(">HHI", raw)
    (offset,) = struct.unpack_from("<Q" if addr_le else ">Q", raw, 8)
    return EntryFlags(flags), gen, length, offset


def decode_slot(raw: bytes, addr_le: bool) -> tuple[int, int]:
    """A ring slot as read: (Sequence, Block Offset); Block Offset per ADDR_LE."""
    (seq,) = struct.unpack_from(">I", raw)
    (offset,) = struct.unpack_from("<Q" if addr_le else ">Q", raw, 8)
    return seq, offset


def header_only(opcode: int, *, version: int = 1, flags: int = 0, request_id: int = 0, handle: int = 0,
                generation: int = 0, status: int = 0) -> bytes:
    """A bare 24-octet common header (for unknown opcodes and truncations)."""
    return struct.pack(">BBHQQHH", version, opcode, flags, request_id, handle, generation, status)
