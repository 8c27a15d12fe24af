"""`IwarpEngine`: one RDMAP stream endpoint over MPA/TCP, sans-I/O (the `WireEngine` contract of rdma/engine.py).

Requester: WRs become RDMAP messages in post order (a fenced WR waits for earlier Reads and atomics; at most
``ord`` of those outstanding). iWARP has no acknowledgements (TCP is the reliable layer, rdma-bindings §3.5),
so a Send or RDMA Write completes once it is handed to TCP, as Linux siw and iWARP NICs complete them: a
peer's refusal arrives later as a Terminate, which fails the connection and flushes what is outstanding.
Reads and atomics complete when their responses are placed.

Responder: every tagged segment's STag, Tagged Offset and length are checked before anything is placed
(`LocalMemory.resolve`), untagged messages go by queue and MSN into posted receives, Read Requests and RFC 7306
Atomic Requests are answered in arrival order, and a violation sends the Terminate of §2.6 and ends the stream.
A zero-length Read Request is answered without validating its Data Source STag (RFC 6581's Read RTR).

MPA: the initiator sends a revision 2 Request (CRC on, markers off, peer-to-peer with a zero-length Read RTR,
its IRD/ORD); a revision 1 Request is answered in revision 1. A bad Key, Revision or private data refuses the
connection: nothing is sent or placed, the engine goes to ERROR with a reason naming the field.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from kvconform.rdma.completion import HoldsWorkRequest, InOrderCompletions, flushed
from kvconform.rdma.engine import LocalMemory, Source, WireEngine, WorkRequest
from kvconform.rdma.fabric import (
    U64,
    Access,
    Completion,
    ConnState,
    DdpEType,
    DdpUntaggedCode,
    Layer,
    Op,
    RdmapCode,
    RdmapEType,
    Sge,
    Status,
    Terminate,
    masked_add,
    masked_cmp_swap,
)
from kvconform.rdma.iwarp import ddp, mpa
from kvconform.rdma.iwarp.rdmap import (
    IMMEDIATE_BYTES,
    INVALIDATE_OPCODES,
    SEND_OPCODES,
    SOLICITED_OPCODES,
    AtomicOp,
    AtomicRequest,
    AtomicResponse,
    Opcode,
    ReadRequest,
    decode_terminate,
    encode_terminate,
)

DEFAULT_MULPDU = 1460 - 2 - 4  # one FPDU per TCP segment of a 1500-octet MTU (rdma-bindings §3.5)
_QN_OF = {Opcode.READ_REQUEST: ddp.QN_READ, Opcode.ATOMIC_REQUEST: ddp.QN_READ, Opcode.TERMINATE: ddp.QN_TERMINATE,
          Opcode.ATOMIC_RESPONSE: ddp.QN_ATOMIC_RESPONSE, Opcode.IMMEDIATE: ddp.QN_SEND,
          Opcode.IMMEDIATE_SE: ddp.QN_SEND, **{op: ddp.QN_SEND for op in SEND_OPCODES}}


@dataclass
class _Out(HoldsWorkRequest):
    """A requester WR from post to completion."""

    wr: WorkRequest
    status: Status | None = None
    terminate: Terminate | None = None
    request_id: int = 0  # atomics: the Request Identifier echoed by the response
    placed: int = 0  # Reads: octets of the response placed



@dataclass
class _Inbound:
    """An untagged message (QN 0) being received into a posted buffer."""

    wr_id: int
    sge: Sge | None
    opcode: int
    received: int = 0
    invalidate: int = 0


@dataclass
class _Setup:
    phase: str = "start"  # start, wait_request, wait_reply, wait_rtr, open
    inbox: bytearray = field(default_factory=bytearray)
    rtr: str = ""  # the agreed RTR: read0 / write0
    rtr_response_due: bool = False  # initiator: the zero-length Read Response of its RTR is still to come


def remote_status(term: Terminate) -> Status:
    """The requester's completion status for a Terminate (the emulated fabric's mapping)."""
    if term.layer is Layer.DDP:
        if term.etype == DdpEType.TAGGED_BUFFER:
            return Status.REM_ACCESS_ERR
        return Status.REM_OP_ERR if term.code == DdpUntaggedCode.NO_BUFFER else Status.REM_INV_REQ_ERR
    if term.layer is Layer.RDMAP:
        if term.etype == RdmapEType.REMOTE_PROTECTION:
            return Status.REM_ACCESS_ERR
        if term.code == RdmapCode.STAG_CANNOT_BE_INVALIDATED:
            return Status.REM_OP_ERR
        return Status.REM_INV_REQ_ERR
    return Status.REM_OP_ERR


class IwarpEngine:
    """One endpoint of an RDMAP stream (see the module docstring)."""

    def __init__(self, name: str, memory: LocalMemory, *, initiator: bool, revision: int = 2, ird: int = 16,
                 ord: int = 16, max_ulpdu: int = DEFAULT_MULPDU, crc: bool = True, peer: str = "peer",
                 rtr_delay_s: float = 0.0) -> None:
        if revision not in (1, 2):
            raise ValueError(f"MPA revision {revision}: 1 or 2")
        self._name = name
        self.memory = memory
        self.initiator = initiator
        self.revision = revision
        self.ird, self.ord = ird, ord
        self.crc = crc
        self.peer = peer
        # the RTR this long after the MPA Reply: Linux siw (6.1) drops the data that arrives while it moves its QP
        # to RTS, and a stream whose first FPDUs it dropped hangs (docs/interop-rdma.md #10); 0 sends it at once
        self.rtr_delay_s = rtr_delay_s
        self._rtr_at: float | None = None
        self._now = 0.0
        self.max_ulpdu = max(ddp.UNTAGGED_LEN + 1, min(max_ulpdu, 0xFFFF))
        self._state = ConnState.CONNECTED
        self._terminate: Terminate | None = None
        self.failed = ""  # why setup or the stream failed (a reason naming the field)
        self.setup = _Setup()
        self.reasm = mpa.Reassembler(crc=crc)
        self._out: list[bytes] = []
        self._wcs: list[Completion] = []
        self.sq: deque[_Out] = deque()  # posted, not yet sent
        # posted, not completed: completed in post order, flushed on error (kvconform.rdma.completion)
        self.completions: InOrderCompletions[_Out] = InOrderCompletions(name, self._wcs.append)
        self.pending: deque[_Out] = deque()  # Reads and atomics sent, awaiting their responses, in order
        self.rq: deque[tuple[int, Sge | None]] = deque()
        self.msn_out = [1, 1, 1, 1]
        self.msn_in = [1, 1, 1, 1]
        self.inbound: _Inbound | None = None
        self.write_start: tuple[int, int] | None = None  # (STag, TO) of the RDMA Write being received
        self.write_octets = 0
        self.last_write_octets = 0  # an Immediate Data message's byte_len: the Write it follows
        self.next_request_id = 1
        self.held = False  # FPDUs behind the RTR wait in the reassembler until receive() is called again

    # ---- the Engine contract ---------------------------------------------------------------------------

    @property
    def name(self) -> str:
        return self._name

    @property
    def state(self) -> ConnState:
        return self._state

    @property
    def terminate(self) -> Terminate | None:
        return self._terminate

    @property
    def established(self) -> bool:
        return self.setup.phase == "open"

    def start(self, now: float) -> None:
        if self.initiator:
            private = mpa.Enhanced(self.ird, self.ord, p2p=True, read0=True).encode() if self.revision == 2 else b""
            self._out.append(mpa.encode_start(mpa.StartFrame(True, self.revision, crc=self.crc, private=private)))
            self.setup.phase = "wait_reply"
        else:
            self.setup.phase = "wait_request"

    def post(self, wr: WorkRequest) -> None:
        out = _Out(wr)
        if self._state is not ConnState.CONNECTED:
            self._wcs.append(flushed(wr.wr_id, wr.op, self._name))
            return
        if wr.op is Op.SEND and wr.imm is not None:
            raise ValueError("RDMAP has no Send with Immediate (Immediate Data follows an RDMA Write, RFC 7306)")
        self.sq.append(out)
        self.completions.append(out)
        self._pump()

    def post_recv(self, wr_id: int, sge: Sge | None) -> None:
        if self._state is not ConnState.CONNECTED:
            self._wcs.append(flushed(wr_id, Op.RECV, self._name))
            return
        self.rq.append((wr_id, sge))

    def receive(self, data: bytes, now: float, source: Source | None = None) -> None:
        self._now = now
        if self._state is not ConnState.CONNECTED:
            return  # after a Terminate the stream is closed: nothing more is processed
        if self.setup.phase in ("wait_request", "wait_reply"):
            self.setup.inbox += data
            if not self._start_frame():
                return
            data, self.setup.inbox = bytes(self.setup.inbox), bytearray()
        self.reasm.feed(data)
        self.held = False
        while self._state is ConnState.CONNECTED and not self.held:
            try:
                ulpdu = self.reasm.next()
            except mpa.MpaError as exc:
                self._fail_local(Terminate(Layer.LLP, 0, exc.code, f"{exc} at {self._name}", self._name))
                return
            if ulpdu is None:
                return
            self._fpdu(ulpdu)

    def poll_timers(self, now: float) -> None:
        """TCP retransmits, RDMAP has no timers: only a delayed RTR waits on the clock."""
        self._now = now
        if self._rtr_at is not None and now >= self._rtr_at and self._state is ConnState.CONNECTED:
            self._rtr_at = None
            self._send_rtr()
            self.setup.phase = "open"
            self._pump()

    def next_deadline(self) -> float | None:
        return self._rtr_at

    def take_output(self) -> list[bytes]:
        out, self._out = self._out, []
        return out

    def take_completions(self) -> list[Completion]:
        wcs = self._wcs[:]
        self._wcs.clear()  # (the completion rule appends to this very list)
        return wcs

    def disconnect(self) -> None:
        if self._state is ConnState.CONNECTED:
            self._close(ConnState.CLOSED, None)

    def transport_closed(self) -> None:
        if self._state is ConnState.CONNECTED:
            busy = bool(self.completions) or self.setup.phase != "open"
            if self.setup.phase != "open":
                self.failed = self.failed or "the TCP connection ended during MPA connection setup"
            self._close(ConnState.ERROR if busy else ConnState.CLOSED, None)

    # ---- MPA connection setup --------------------------------------------------------------------------

    def _start_frame(self) -> bool:
        """Handle the start frame in the inbox; True once it is consumed (what follows is FPDUs)."""
        request = self.setup.phase == "wait_request"
        try:
            got = mpa.parse_start(bytes(self.setup.inbox), request=request)
        except mpa.MpaError as exc:
            return self._refuse(f"MPA {'Request' if request else 'Reply'}: {exc}", reply=request and exc.field == "Rev")
        if got is None:
            return False
        frame, used = got
        del self.setup.inbox[:used]
        crc = self.crc or frame.crc  # CRC in both directions if either side asks (§3.3)
        self.reasm.crc = self.crc = crc
        try:
            enhanced = mpa.Enhanced.decode(frame.private) if frame.revision == 2 else None
        except mpa.MpaError as exc:
            return self._refuse(f"MPA {'Request' if request else 'Reply'}: {exc}", reply=request)
        if request:
            return self._answer_request(frame, enhanced)
        if frame.reject:
            return self._refuse("MPA Reply: the responder rejected the connection (R flag)")
        if frame.revision > self.revision:
            return self._refuse(f"MPA Reply: Rev {frame.revision} above the requested {self.revision}")
        if frame.markers:
            return self._refuse("MPA Reply: the responder asks for markers, which this endpoint never sends")
        self.revision = frame.revision
        if enhanced is not None and enhanced.p2p:
            if not (enhanced.read0 or enhanced.write0):
                return self._refuse("MPA Reply: no RTR type this endpoint offers (Read or Write)")
            self.setup.rtr = "read0" if enhanced.read0 else "write0"
            if self.rtr_delay_s > 0:
                self._rtr_at = self._now + self.rtr_delay_s
                self.setup.phase = "rtr_delay"
                return True
            self._send_rtr()
        self.setup.phase = "open"
        self._pump()
        return True

    def _send_rtr(self) -> None:
        """The initiator's RTR in peer-to-peer mode (RFC 6581): the zero-length Read or Write agreed."""
        if self.setup.rtr == "read0":
            self.setup.rtr_response_due = True
            self._untagged(Opcode.READ_REQUEST, ReadRequest(0, 0, 0, 0, 0).encode())
        else:
            self._emit(ddp.Segment(True, True, Opcode.WRITE, b""))

    def _answer_request(self, frame: mpa.StartFrame, enhanced: mpa.Enhanced | None) -> bool:
        if frame.markers:
            self._out.append(mpa.encode_start(mpa.StartFrame(False, frame.revision, crc=self.crc, reject=True)))
            return self._refuse("MPA Request: the initiator asks for markers (M), which this endpoint never sends")
        self.revision = min(self.revision, frame.revision)
        private = b""
        if self.revision == 2 and enhanced is not None:
            read0, write0 = enhanced.p2p and enhanced.read0, enhanced.p2p and enhanced.write0 and not enhanced.read0
            if enhanced.p2p and not (read0 or write0):
                self._out.append(mpa.encode_start(mpa.StartFrame(False, 2, crc=self.crc, reject=True)))
                return self._refuse("MPA Request: peer-to-peer with no RTR type this endpoint accepts (Read, Write)")
            self.setup.rtr = "read0" if read0 else "write0" if write0 else ""
            private = mpa.Enhanced(self.ird, self.ord, p2p=enhanced.p2p, read0=read0, write0=write0).encode()
        self._out.append(mpa.encode_start(mpa.StartFrame(False, self.revision, crc=self.crc, private=private)))
        self.setup.phase = "wait_rtr" if self.setup.rtr else "open"
        return True

    def _refuse(self, reason: str, *, reply: bool = False) -> bool:
        if reply:
            self._out.append(mpa.encode_start(mpa.StartFrame(False, 2, crc=self.crc, reject=True)))
        self.failed = reason
        self._close(ConnState.ERROR, Terminate(Layer.LLP, 0, 4, f"{reason} at {self._name}", self._name))
        return False

    # ---- inbound FPDUs ---------------------------------------------------------------------------------

    def _fpdu(self, ulpdu: bytes) -> None:
        try:
            seg = ddp.parse(ulpdu)
        except ddp.DdpError as exc:
            self._fail_local(Terminate(Layer(exc.layer), exc.etype, exc.code, f"{exc} at {self._name}", self._name),
                             ulpdu[:ddp.UNTAGGED_LEN])
            return
        if self.setup.phase == "wait_rtr" and self._rtr(seg):
            # established: hold what follows until the application has seen the connection and posted its
            # receives (the initiator may send right behind its RTR); receive(b"") goes on
            self.held = self.setup.phase == "open"
            return
        if seg.tagged:
            if seg.opcode == Opcode.WRITE:
                self._write(seg)
            elif seg.opcode == Opcode.READ_RESPONSE:
                self._read_response(seg)
            else:
                self._unexpected(seg, "a tagged segment")
            return
        try:
            opcode = Opcode(seg.opcode)
        except ValueError:
            self._unexpected(seg, "an untagged segment")
            return
        qn = _QN_OF.get(opcode)
        if qn is None:
            self._unexpected(seg, "an untagged segment")
            return
        if seg.qn != qn:
            self._fail_local(self._ddp_untagged(DdpUntaggedCode.INVALID_QN, f"QN {seg.qn} for {opcode.name} "
                                                f"(expected {qn})"), seg.header())
            return
        if seg.msn != self.msn_in[qn]:
            self._fail_local(self._ddp_untagged(DdpUntaggedCode.INVALID_MSN_RANGE, f"MSN {seg.msn} on QN {qn} "
                                                f"(expected {self.msn_in[qn]})"), seg.header())
            return
        if opcode in SEND_OPCODES or opcode in (Opcode.IMMEDIATE, Opcode.IMMEDIATE_SE):
            self._send_segment(seg, opcode)
            return
        if not seg.last:  # the other queues' messages are one segment (their headers are short)
            self._fail_local(self._ddp_untagged(DdpUntaggedCode.INVALID_MO, f"{opcode.name} in several segments"),
                             seg.header())
            return
        self.msn_in[qn] += 1
        if opcode is Opcode.READ_REQUEST:
            self._read_request(seg)
        elif opcode is Opcode.ATOMIC_REQUEST:
            self._atomic_request(seg)
        elif opcode is Opcode.ATOMIC_RESPONSE:
            self._atomic_response(seg)
        else:
            self._terminated(seg)

    def _rtr(self, seg: ddp.Segment) -> bool:
        """The initiator's first FPDU in peer-to-peer mode must be the agreed zero-length RTR (RFC 6581)."""
        if self.setup.rtr == "write0" and seg.tagged and seg.opcode == Opcode.WRITE and not seg.payload:
            self.setup.phase = "open"
            self._pump()
            return True
        if (self.setup.rtr == "read0" and not seg.tagged and seg.opcode == Opcode.READ_REQUEST
                and seg.qn == ddp.QN_READ and seg.msn == self.msn_in[ddp.QN_READ]):
            try:
                req = ReadRequest.decode(seg.payload)
            except ValueError:
                req = None
            if req is not None and req.size == 0:
                self.msn_in[ddp.QN_READ] += 1
                self._emit(ddp.Segment(True, True, Opcode.READ_RESPONSE, b"", stag=req.sink_stag, to=req.sink_to))
                self.setup.phase = "open"
                self._pump()
                return True
        self._fail_local(Terminate(Layer.LLP, 0, 7, f"no matching RTR: the first FPDU is not the agreed "
                                   f"{self.setup.rtr} RTR at {self._name}", self._name), seg.header())
        return True

    def _unexpected(self, seg: ddp.Segment, what: str) -> None:
        self._fail_local(Terminate(Layer.RDMAP, RdmapEType.REMOTE_OPERATION, RdmapCode.UNEXPECTED_OPCODE,
                                   f"opcode {seg.opcode:#x} in {what} at {self._name}", self._name), seg.header())

    def _ddp_untagged(self, code: DdpUntaggedCode, why: str) -> Terminate:
        return Terminate(Layer.DDP, DdpEType.UNTAGGED_BUFFER, code, f"{why} at {self._name}", self._name)

    def _write(self, seg: ddp.Segment) -> None:
        got = self.memory.resolve(seg.stag, seg.to, len(seg.payload), Access.REMOTE_WRITE, tagged=True)
        if isinstance(got, Terminate):
            self._fail_local(got, seg.header())
            return
        buf, off = got
        if seg.payload:
            buf.write(off, seg.payload)
        if self.write_start is None:
            self.write_start = (seg.stag, seg.to)
        self.write_octets += len(seg.payload)
        if seg.last:
            stag, to = self.write_start
            self.memory.note("write-arrive", stag=stag, to=to, len=self.write_octets)
            self.last_write_octets, self.write_octets, self.write_start = self.write_octets, 0, None

    def _read_response(self, seg: ddp.Segment) -> None:
        if self.setup.rtr_response_due and not seg.payload and seg.last and seg.stag == 0:
            self.setup.rtr_response_due = False  # the answer to this endpoint's own Read RTR
            return
        head = self.pending[0] if self.pending else None
        if head is None or head.wr.op is not Op.RDMA_READ:
            self._unexpected(seg, "a Read Response no Read Request of this stream asked for")
            return
        dst = head.wr.dst
        assert dst is not None
        sink_to = dst.region.to(dst.offset)
        off = seg.to - sink_to
        if seg.stag != dst.region.stag or off < 0 or off + len(seg.payload) > dst.length:
            code = 0 if seg.stag != dst.region.stag else 1
            self._fail_local(Terminate(Layer.DDP, DdpEType.TAGGED_BUFFER, code,
                                       f"Read Response to STag {seg.stag:#x} TO {seg.to:#x} (+{len(seg.payload)}) "
                                       f"outside the requested sink at {self._name}", self._name), seg.header())
            return
        dst.region.write(dst.offset + off, seg.payload)
        head.placed += len(seg.payload)
        if seg.last:
            self.pending.popleft()
            self._done(head)

    def _send_segment(self, seg: ddp.Segment, opcode: Opcode) -> None:
        msg = self.inbound
        if msg is None:
            self.memory.note("send-arrive", len=len(seg.payload), opcode=opcode.name)
            if not self.rq:
                self._fail_local(self._ddp_untagged(DdpUntaggedCode.NO_BUFFER, f"{opcode.name} with no receive "
                                                    "buffer posted"), seg.header())
                return
            wr_id, sge = self.rq.popleft()
            msg = self.inbound = _Inbound(wr_id, sge, int(opcode), invalidate=seg.stag)
        if seg.mo != msg.received:
            self._fail_local(self._ddp_untagged(DdpUntaggedCode.INVALID_MO, f"MO {seg.mo} (expected "
                                                f"{msg.received})"), seg.header())
            return
        room = 0 if msg.sge is None else msg.sge.length
        if seg.mo + len(seg.payload) > room:
            self.inbound = None
            self._wcs.append(Completion(msg.wr_id, Op.RECV, Status.LOC_LEN_ERR, self._name))
            self._fail_local(self._ddp_untagged(DdpUntaggedCode.MESSAGE_TOO_LONG, f"{opcode.name} longer than the "
                                                f"{room}-octet receive buffer"), seg.header())
            return
        if seg.payload and msg.sge is not None:
            msg.sge.region.write(msg.sge.offset + seg.mo, seg.payload)
        msg.received += len(seg.payload)
        if not seg.last:
            return
        self.inbound = None
        self.msn_in[ddp.QN_SEND] += 1
        if opcode in (Opcode.IMMEDIATE, Opcode.IMMEDIATE_SE):
            if msg.received != IMMEDIATE_BYTES:
                self._fail_local(self._ddp_untagged(DdpUntaggedCode.MESSAGE_TOO_LONG, f"Immediate Data of "
                                                    f"{msg.received} octets (8)"), seg.header())
                return
            assert msg.sge is not None
            imm = msg.sge.region.read(msg.sge.offset, IMMEDIATE_BYTES)
            self.memory.note("deliver", len=0, imm=imm.hex())
            self._wcs.append(Completion(msg.wr_id, Op.RECV_RDMA_WITH_IMM, Status.SUCCESS, self._name,
                                        byte_len=self.last_write_octets, imm=imm,
                                        solicited=opcode in SOLICITED_OPCODES))
            return
        invalidated = None
        if opcode in INVALIDATE_OPCODES:
            refusal = self.memory.remote_invalidate(msg.invalidate)
            if refusal is not None:
                self.rq.appendleft((msg.wr_id, msg.sge))  # not consumed: flushed with the rest
                self._fail_local(refusal, seg.header())
                return
            invalidated = msg.invalidate
        self.memory.note("deliver", len=msg.received, invalidated=invalidated)
        self._wcs.append(Completion(msg.wr_id, Op.RECV, Status.SUCCESS, self._name, byte_len=msg.received,
                                    invalidated_stag=invalidated, solicited=opcode in SOLICITED_OPCODES))

    def _read_request(self, seg: ddp.Segment) -> None:
        try:
            req = ReadRequest.decode(seg.payload)
        except ValueError as exc:
            self._fail_local(self._ddp_untagged(DdpUntaggedCode.MESSAGE_TOO_LONG, str(exc)), seg.header())
            return
        self.memory.note("rdma_read-arrive", stag=req.source_stag, to=req.source_to, len=req.size)
        data = b""
        if req.size:
            got = self.memory.resolve(req.source_stag, req.source_to, req.size, Access.REMOTE_READ, tagged=False)
            if isinstance(got, Terminate):
                self._fail_local(got, seg.header(), seg.payload[:ReadRequest.LENGTH])
                return
            buf, off = got
            data = buf.read(off, req.size)
            self.memory.note("read-sample", addr=buf.addr + off, len=req.size)
        for s in ddp.segments(tagged=True, opcode=Opcode.READ_RESPONSE, data=data,
                              max_payload=self.max_ulpdu - ddp.TAGGED_LEN, stag=req.sink_stag, to=req.sink_to):
            self._emit(s)

    def _atomic_request(self, seg: ddp.Segment) -> None:
        try:
            req = AtomicRequest.decode(seg.payload)
        except ValueError as exc:
            self._fail_local(Terminate(Layer.RDMAP, RdmapEType.REMOTE_OPERATION, RdmapCode.UNSPECIFIED,
                                       f"{exc} at {self._name}", self._name), seg.header())
            return
        kind = "fetch_add" if req.op is AtomicOp.FETCH_ADD else "comp_swap"
        self.memory.note(f"{kind}-arrive", stag=req.stag, to=req.to)
        got = self.memory.resolve(req.stag, req.to, 8, Access.REMOTE_ATOMIC, tagged=False)
        if not isinstance(got, Terminate):
            got = self.memory.atomic_misaligned(req.to) or got
        if isinstance(got, Terminate):
            self._fail_local(got, seg.header())
            return
        buf, off = got
        orig = buf.read_u64(off)
        if req.op is AtomicOp.FETCH_ADD:
            new = masked_add(orig, req.add_swap, req.add_swap_mask)
        elif req.op is AtomicOp.CMP_SWAP:
            new = masked_cmp_swap(orig, req.compare, req.add_swap, req.compare_mask, req.add_swap_mask)
        else:  # masked Swap
            new = ((orig & ~req.add_swap_mask) | (req.add_swap & req.add_swap_mask)) & U64
        buf.write_u64(off, new)
        self.memory.note(kind, addr=buf.addr + off, orig=orig, new=new)
        self._untagged(Opcode.ATOMIC_RESPONSE, AtomicResponse(req.request_id, orig).encode())

    def _atomic_response(self, seg: ddp.Segment) -> None:
        try:
            resp = AtomicResponse.decode(seg.payload)
        except ValueError:
            resp = None
        head = self.pending[0] if self.pending else None
        if resp is None or head is None or head.wr.op not in (Op.FETCH_ADD, Op.COMP_SWAP) \
                or head.request_id != resp.request_id:
            self._unexpected(seg, "an Atomic Response no Atomic Request of this stream asked for")
            return
        self.pending.popleft()
        dst = head.wr.dst
        assert dst is not None
        dst.region.write(dst.offset, resp.original.to_bytes(8, dst.region.buffer.byteorder))
        self._done(head)

    def _terminated(self, seg: ddp.Segment) -> None:
        try:
            msg = decode_terminate(seg.payload, self.peer)
        except ValueError as exc:
            term = Terminate(Layer.RDMAP, RdmapEType.REMOTE_OPERATION, RdmapCode.UNSPECIFIED,
                             f"a malformed Terminate from {self.peer}: {exc}", self.peer)
            about_read = False
        else:
            term, about_read = msg.terminate, msg.about_read_queue
        self.memory.note("terminate", reason=term.reason, key=list(term.key()))
        # A Read or Atomic Request it terminated is the oldest one awaiting its response (processed in order);
        # a Write or Send it terminated has completed already (iWARP has no acknowledgements)
        self._close(ConnState.ERROR, term, culprit_first=about_read)

    # ---- outbound ---------------------------------------------------------------------------------------

    def _emit(self, seg: ddp.Segment) -> None:
        self._out.append(mpa.encode_fpdu(seg.encode(), crc=self.crc))

    def _untagged(self, opcode: Opcode, payload: bytes, inval: int = 0) -> None:
        qn = _QN_OF[opcode]
        msn = self.msn_out[qn]
        self.msn_out[qn] += 1
        for s in ddp.segments(tagged=False, opcode=opcode, data=payload, max_payload=self.max_ulpdu - ddp.UNTAGGED_LEN,
                              stag=inval, qn=qn, msn=msn):
            self._emit(s)

    def _pump(self) -> None:
        """Send posted WRs in order, holding a fenced one (and any past ORD) behind outstanding Reads/atomics."""
        if self.setup.phase != "open" or self._state is not ConnState.CONNECTED:
            return
        while self.sq:
            out = self.sq[0]
            wr = out.wr
            one_sided = wr.op in (Op.RDMA_READ, Op.FETCH_ADD, Op.COMP_SWAP)
            if (wr.fence and self.pending) or (one_sided and len(self.pending) >= self.ord):
                return
            self.sq.popleft()
            self._transmit(out)

    def _transmit(self, out: _Out) -> None:
        wr = out.wr
        if wr.op is Op.SEND:
            inval = wr.invalidate is not None
            opcode = (Opcode.SEND_SE_INVALIDATE if inval else Opcode.SEND_SE) if wr.solicited else \
                (Opcode.SEND_INVALIDATE if inval else Opcode.SEND)
            self._untagged(opcode, wr.data, wr.invalidate or 0)
            self._done(out)
        elif wr.op is Op.RDMA_WRITE:
            for s in ddp.segments(tagged=True, opcode=Opcode.WRITE, data=wr.data,
                                  max_payload=self.max_ulpdu - ddp.TAGGED_LEN, stag=wr.stag, to=wr.to):
                self._emit(s)
            if wr.imm is not None:  # RDMA Write with Immediate = the Write, then an Immediate Data message
                self._untagged(Opcode.IMMEDIATE, wr.imm)
            self._done(out)
        elif wr.op is Op.RDMA_READ:
            dst = wr.dst
            assert dst is not None
            self.pending.append(out)
            self._untagged(Opcode.READ_REQUEST, ReadRequest(dst.region.stag, dst.region.to(dst.offset), dst.length,
                                                            wr.stag, wr.to).encode())
        else:
            out.request_id = self.next_request_id
            self.next_request_id = (self.next_request_id + 1) & 0xFFFFFFFF or 1
            if wr.op is Op.FETCH_ADD:
                req = AtomicRequest(AtomicOp.FETCH_ADD, out.request_id, wr.stag, wr.to, wr.add, wr.mask)
            else:
                req = AtomicRequest(AtomicOp.CMP_SWAP, out.request_id, wr.stag, wr.to, wr.swap, wr.swap_mask,
                                    wr.compare, wr.compare_mask)
            self.pending.append(out)
            self._untagged(Opcode.ATOMIC_REQUEST, req.encode())

    def _done(self, out: _Out) -> None:
        """``out`` succeeded: the completions it frees go out in post order, and what waited for it may go."""
        out.status = Status.SUCCESS
        self._drain()
        self._pump()

    def _drain(self) -> None:
        """Completions of the oldest WRs that have a status (kvconform.rdma.completion)."""
        self.completions.drain()

    # ---- errors -----------------------------------------------------------------------------------------

    def _fail_local(self, term: Terminate, ddp_header: bytes = b"", rdmap_header: bytes = b"") -> None:
        """This endpoint detected ``term``: send the Terminate (QN 2), then the stream ends (§2.5)."""
        self.failed = self.failed or term.reason
        self.memory.note("terminate", reason=term.reason, key=list(term.key()))
        self._untagged(Opcode.TERMINATE, encode_terminate(term, ddp_header, rdmap_header))
        self._close(ConnState.ERROR, term)

    def _close(self, state: ConnState, term: Terminate | None, *, culprit_first: bool = False) -> None:
        self._state = state
        self._terminate = term
        self.sq.clear()
        culprit = self.pending[0] if culprit_first and self.pending else None
        if culprit is not None and culprit.status is not None:
            culprit = None
        self.pending.clear()
        # the Recv being received into was posted before the ones still queued
        recvs = ([] if self.inbound is None else [(self.inbound.wr_id, self.inbound.sge)]) + list(self.rq)
        self.rq.clear()
        self.inbound = None
        self.completions.flush(term, recvs, culprit=culprit,
                               status=None if culprit is None or term is None else remote_status(term))


if TYPE_CHECKING:  # the contract it implements, checked by mypy
    _CONTRACT: type[WireEngine] = IwarpEngine
