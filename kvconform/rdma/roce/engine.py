"""`RoceEngine`: one InfiniBand RC QP over RoCEv2, sans I/O (rdma-bindings §4, §5.4).

One UDP payload in (`receive`), UDP payloads out (`take_output`); time only through `poll_timers`. The
requester segments at the path MTU (§4.7), numbers packets (§4.6), sets AckReq on each message's last
packet, and runs go-back-N on ACK timeout or a PSN sequence error NAK (bounded by ``retry_count``,
then RETRY_EXC_ERR) and waits the advertised timer on an RNR NAK (bounded by ``rnr_retry``, then
RNR_RETRY_EXC_ERR; unlike IB, 7 is a count here, not "infinite", so a test can never hang). The
responder keeps the expected PSN: duplicates are re-ACKed, a duplicate READ is re-executed and a
duplicate atomic is answered from the atomic result cache; a gap gets one PSN sequence error NAK.

Masked atomics are a harness convention, not IB (§4.4 "IB has no masked atomics"): with
``masked_atomics`` FetchAdd carries its Add Mask in the otherwise unused Compare Data, and a masked
CmpSwap appends 16 octets of payload (Swap Mask ‖ Compare Mask). Both ends must agree out of band.
"""

from __future__ import annotations

from collections import OrderedDict, deque
from dataclasses import dataclass
from typing import TYPE_CHECKING

from kvconform.rdma.completion import HoldsWorkRequest, InOrderCompletions, flushed
from kvconform.rdma.engine import LocalMemory, Source, WireEngine, WorkRequest
from kvconform.rdma.fabric import (
    U64,
    Access,
    Buffer,
    Completion,
    ConnState,
    DdpEType,
    DdpUntaggedCode,
    FabricUsageError,
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
from kvconform.rdma.roce.headers import (
    BTH_LEN,
    CREDIT_INVALID,
    OPCODES,
    PSN_MASK,
    READ_RESPONSES,
    REQUESTS,
    RNR_TIMER_MS,
    SEND_OPS,
    Aeth,
    AethType,
    Bth,
    HeaderError,
    NakCode,
    Opcode,
    Packet,
    aeth_bytes,
    atomic_eth_bytes,
    packet_head,
    reth_bytes,
    u32_bytes,
    u64_bytes,
)
from kvconform.rdma.roce.icrc import ICRC_LEN, UDP_LEN, prefix_crc, seal, unseal
from kvconform.rdma.roce.qp import QpInfo

_HALF = 1 << 23
_ATOMICS = (Op.FETCH_ADD, Op.COMP_SWAP)
_READ_LIKE = (Op.RDMA_READ, *_ATOMICS)  # the requests whose responses carry data, max_rd_atomic of them (§4.6)
_PADS = (b"", bytes(1), bytes(2), bytes(3))

# requester side: the status and the RDMAP-style Terminate a NAK code turns into (§4.5, rdma/engine.py)
_NAK_STATUS: dict[int, tuple[Status, RdmapEType, str]] = {
    NakCode.INVALID_REQUEST: (Status.REM_INV_REQ_ERR, RdmapEType.REMOTE_OPERATION, "invalid request"),
    NakCode.REMOTE_ACCESS_ERROR: (Status.REM_ACCESS_ERR, RdmapEType.REMOTE_PROTECTION, "remote access error"),
    NakCode.REMOTE_OPERATIONAL_ERROR: (Status.REM_OP_ERR, RdmapEType.REMOTE_OPERATION, "remote operational error"),
}


def psn_diff(a: int, b: int) -> int:
    """``a - b`` in 24-bit PSN space, within the half window of §4.6 (negative: ``a`` is older)."""
    return ((a - b + _HALF) & PSN_MASK) - _HALF


def _npkts(length: int, pmtu: int) -> int:
    return max(1, -(-length // pmtu))


@dataclass(eq=False, slots=True)
class _Req(HoldsWorkRequest):
    """A posted send-queue WR: its PSN range once sent, and its outcome."""

    wr: WorkRequest
    psn: int = -1  # first PSN; -1 until sent
    npsn: int = 0
    rcvd: int = 0  # READ: response packets received in order
    status: Status | None = None
    terminate: Terminate | None = None


    @property
    def sent(self) -> bool:
        return self.psn >= 0

    @property
    def last(self) -> int:
        return (self.psn + self.npsn - 1) & PSN_MASK


@dataclass(slots=True)
class _Inbound:
    """The message the responder is in the middle of (after its First packet)."""

    kind: str  # "send" or "write"
    total: int = 0  # write: DMA Length
    done: int = 0  # octets placed so far
    target: tuple[Buffer, int] | None = None  # write: the resolved buffer
    recv: tuple[int, Sge | None] | None = None  # send: the Recv it consumed


class RoceEngine:
    """An RC endpoint over RoCEv2 implementing `kvconform.rdma.engine.Engine` (see the module docstring)."""

    def __init__(
        self,
        name: str,
        memory: LocalMemory,
        *,
        local: QpInfo,
        remote: QpInfo,
        pmtu: int = 1024,
        retry_count: int = 7,
        rnr_retry: int = 7,
        ack_timeout_s: float = 0.134,  # 4.096 µs · 2^15 (§4.6)
        min_rnr_timer: int = 14,  # 1.28 ms (§4.5)
        p_key: int = 0xFFFF,
        masked_atomics: bool = False,
        ack_every: int = 16,
        ack_delay_s: float = 0.0,
        atomic_cache: int = 16,
        max_rd_atomic: int = 16,
    ) -> None:
        if pmtu not in (256, 512, 1024, 2048, 4096):
            raise ValueError(f"pmtu {pmtu}: one of 256, 512, 1024, 2048, 4096 is expected (§4.7)")
        self._name = name
        self.memory = memory
        self.local, self.remote = local, remote
        self.pmtu = pmtu
        self.retry_count, self.rnr_retry = retry_count, rnr_retry
        self.ack_timeout_s = ack_timeout_s
        self.min_rnr_timer = min_rnr_timer
        self.p_key = p_key
        self.masked_atomics = masked_atomics
        self.ack_every = ack_every
        # how long a positive ACK may wait for a later one to replace it (see _ack); bounded well inside the ACK
        # timeout, which both ends configure alike here (a requester retransmits after it)
        self.ack_delay_s = min(ack_delay_s, ack_timeout_s / 8)
        self._ack_due: float | None = None  # when the held ACK must go out (ack_delay_s)
        self.max_rd_atomic = max_rd_atomic
        self._state = ConnState.CONNECTED
        self._term: Terminate | None = None
        self._now = 0.0
        self._out: list[bytes] = []
        self._held_ack: tuple[int, int] | None = None  # a coalesced ACK not yet emitted: (PSN, MSN), see _ack
        self._prefix: dict[int, int] = {}  # ICRC state before the BTH, per UDP length (the addresses are fixed)
        self._rx_prefix: dict[tuple[str, int, int, int], int] = {}  # the same for arrivals: per source and length
        self._wcs: list[Completion] = []
        self.dropped_icrc = self.dropped_pkey = self.dropped_qpn = self.dropped_malformed = 0
        # requester
        # posted and not yet completed, in post order; completed and flushed by kvconform.rdma.completion
        self.completions: InOrderCompletions[_Req] = InOrderCompletions(name, self._wcs.append)
        self._wrs = self.completions.pending
        self._next_psn = local.psn
        self._acked_psn = (local.psn - 1) & PSN_MASK  # the newest PSN an ACK (or a NAK's implied ACK) covered
        self._retries = retry_count
        self._rnr_left = rnr_retry
        self._ack_deadline: float | None = None
        self._rnr_at: float | None = None
        self._rnr_psn = 0
        self._unsent = 0  # WRs posted while connected and not sent yet (flushed ones stay counted: no _pump then)
        self._rearm = False  # post() has no clock: the ACK timer is re-armed at the next call that has one
        # responder
        self._epsn = remote.psn
        self._msn = 0
        self._nak_sent = False
        self._unacked = 0
        self._recvs: deque[tuple[int, Sge | None]] = deque()
        self._in: _Inbound | None = None
        self._atomic_results: OrderedDict[int, int] = OrderedDict()
        self._atomic_cache = atomic_cache

    # ---- Engine protocol ----------------------------------------------------------------------------------

    @property
    def name(self) -> str:
        return self._name

    @property
    def state(self) -> ConnState:
        return self._state

    @property
    def terminate(self) -> Terminate | None:
        return self._term

    @property
    def established(self) -> bool:
        return True  # the QP was connected out of band (§5.1)

    def start(self, now: float) -> None:
        self._now = now
        self._pump()

    def post(self, wr: WorkRequest) -> None:
        if wr.op in (Op.SEND, Op.RDMA_WRITE) and wr.imm is not None and len(wr.imm) != 4:
            raise FabricUsageError(f"{wr.tag or wr.wr_id}: IB Immediate Data is 4 octets, not {len(wr.imm)}")
        if wr.op in _ATOMICS and not self.masked_atomics and (
                wr.mask or (wr.compare_mask & U64, wr.swap_mask & U64) != (U64, U64)):
            raise FabricUsageError(f"{wr.tag or wr.wr_id}: masked atomics need masked_atomics (§4.4)")
        req = _Req(wr)
        if self._state is not ConnState.CONNECTED:
            req.status = Status.WR_FLUSH_ERR
        else:
            self._unsent += 1
        self._wrs.append(req)
        self._pump()
        self._rearm = self._rearm or self._ack_deadline is not None
        self._complete()

    def post_recv(self, wr_id: int, sge: Sge | None) -> None:
        if self._state is not ConnState.CONNECTED:
            self._wcs.append(flushed(wr_id, Op.RECV, self._name))
            return
        self._recvs.append((wr_id, sge))

    def _clock(self, now: float) -> None:
        self._now = now
        if self._rearm:
            self._rearm = False
            if self._ack_deadline is not None:
                self._ack_deadline = now + self.ack_timeout_s

    def receive(self, data: bytes, now: float, source: Source | None = None) -> None:
        """One UDP payload; ``source`` is where the datagram came from when known: the ICRC covers the source
        port, which a kernel RoCE device picks per QP (rxe: from the QPN), not the port it was told of, and the
        IPv4 Identification."""
        self._clock(now)
        if self._state is not ConnState.CONNECTED:
            return
        src = source or Source(self.remote.ip, self.remote.port)
        key = (src.address, src.port, src.ip_ident, len(data))
        prefix = self._rx_prefix.get(key)
        if prefix is None:
            if len(self._rx_prefix) >= 256:
                self._rx_prefix.clear()  # (a kernel device numbers its packets' IPv4 Identification: keys vary)
            prefix = self._rx_prefix[key] = prefix_crc(src.address, src.port, self.local.ip, self.local.port,
                                                       UDP_LEN + len(data), src.ip_ident)
        body = unseal(prefix, data)
        if body is None:
            self.dropped_icrc += 1
            return
        try:
            bth = Bth.decode(body)
            if bth.dest_qp != self.local.qpn:
                self.dropped_qpn += 1
                return
            if bth.p_key != self.p_key:
                self.dropped_pkey += 1
                return
            if bth.tver != 0:
                raise HeaderError(f"BTH.TVer {bth.tver}: 0 expected (§4.2)")
            pkt = Packet.decode(body, bth)
        except HeaderError:
            self.dropped_malformed += 1
            return
        if pkt.opcode in REQUESTS:
            self._responder(pkt)
        else:
            self._requester(pkt)
        self._pump()
        self._complete()

    def poll_timers(self, now: float) -> None:
        self._clock(now)
        if self._state is not ConnState.CONNECTED:
            return
        if self._ack_due is not None and now >= self._ack_due:
            self._release_ack()
        if self._rnr_at is not None and now >= self._rnr_at:
            self._rnr_at = None
            self._retransmit(self._rnr_psn)
        if self._ack_deadline is not None and now >= self._ack_deadline:
            oldest = self._oldest()
            if oldest is None:
                self._ack_deadline = None
            elif self._retries <= 0:
                self._fail(oldest, Status.RETRY_EXC_ERR, Terminate(
                    Layer.LLP, 0, 0, f"retry count {self.retry_count} exceeded: no ACK for PSN {oldest.psn:#x} "
                    f"from QP {self.remote.qpn:#x}", self._name))
            else:
                self._retries -= 1
                self._retransmit(self._resume(oldest))
        self._pump()
        self._complete()

    def next_deadline(self) -> float | None:
        if self._state is not ConnState.CONNECTED:
            return None
        if self._rearm:
            return self._now  # due at once: the fabric's poll_timers brings the real time
        ack, rnr = self._ack_deadline, self._rnr_at  # asked on every turn of the fabric's loop: no list
        due = rnr if ack is None else ack if rnr is None else min(ack, rnr)
        held = self._ack_due
        return due if held is None else held if due is None else min(due, held)

    def take_output(self) -> list[bytes]:
        if self._held_ack is not None and not self.ack_delay_s:
            self._release_ack()
        out, self._out = self._out, []
        return out

    def take_completions(self) -> list[Completion]:
        wcs = self._wcs[:]
        self._wcs.clear()  # (the completion rule appends to this very list)
        return wcs

    def disconnect(self) -> None:
        if self._state is ConnState.CONNECTED:
            self._close(ConnState.CLOSED)

    def transport_closed(self) -> None:
        if self._state is not ConnState.CONNECTED:
            return
        if any(r.status is None for r in self._wrs):
            self._term = Terminate(Layer.LLP, 0, 0, f"side channel closed with work outstanding at {self._name}",
                                   self._name)
            self._close(ConnState.ERROR)
        else:
            self._close(ConnState.CLOSED)

    # ---- output ------------------------------------------------------------------------------------------

    def _emit(self, op: int, psn: int, *, ack_req: bool = False, se: bool = False, payload: bytes = b"",
              ext: bytes = b"", implicit_ack: bool = False) -> None:
        """One packet: BTH ‖ ``ext`` (its extension headers, encoded in §4.3 order) ‖ payload ‖ pad ‖ ICRC, built
        without per-packet header objects. A held ACK (`_ack`) goes out before a response, or is dropped when the
        response is an implicit ACK of a newer PSN (``implicit_ack``); a request of this QP's own may pass a
        delayed one."""
        if self._held_ack is not None and not (self.ack_delay_s and op in REQUESTS):
            if implicit_ack:
                self._held_ack = self._ack_due = None
            else:
                self._release_ack()
        pad = -len(payload) & 3
        size = 8 + BTH_LEN + len(ext) + len(payload) + pad + ICRC_LEN  # the UDP length: the ICRC covers it
        prefix = self._prefix.get(size)
        if prefix is None:
            prefix = self._prefix[size] = prefix_crc(self.local.ip, self.local.port, self.remote.ip,
                                                     self.remote.port, size)
        head = packet_head(op, self.remote.qpn, psn, pad, ack_req=ack_req, se=se, p_key=self.p_key)
        self._out.append(seal(prefix, head, ext, payload, _PADS[pad]))

    def _ack(self, psn: int) -> None:
        """A positive ACK of everything up to ``psn``, held so that a later ACK can replace it: one ACK for a run of
        requests. IB RC allows it (rdma-bindings §4.6: "An ACK carries the PSN of the newest packet it acknowledges
        and covers everything up to that PSN (coalesced)"; §5.4 step 5: "coalescing allowed").

        With ``ack_delay_s`` 0 it goes out when the engine's output is taken (the fabric takes it after each batch
        of arrivals: requests that arrived together get one ACK). Otherwise it waits up to ``ack_delay_s``: the
        requests of the next operation replace it, and a READ response or Atomic ACK, itself an implicit ACK of
        everything before it (§4.6: "READ responses and Atomic ACKs are themselves implicit ACKs"), makes it
        unneeded. Either way it precedes any other response (responses stay in PSN order); only this QP's own
        requests, a separate stream, may pass it."""
        if self._held_ack is None and self.ack_delay_s > 0:
            self._ack_due = self._now + self.ack_delay_s
        self._held_ack = (psn, self._msn)

    def _release_ack(self) -> None:
        held = self._held_ack
        assert held is not None
        self._held_ack = self._ack_due = None
        self._emit(Opcode.ACKNOWLEDGE, held[0], ext=aeth_bytes(CREDIT_INVALID, held[1]))

    # ---- requester ---------------------------------------------------------------------------------------

    def _npsn(self, wr: WorkRequest) -> int:
        if wr.op is Op.RDMA_READ:
            assert wr.dst is not None
            return _npkts(wr.dst.length, self.pmtu)
        if wr.op in _ATOMICS:
            return 1
        return _npkts(len(wr.data), self.pmtu)

    def _pump(self) -> None:
        """Send the WRs not yet sent, in order, as fences, the RNR wait and the state allow."""
        if not self._unsent or self._state is not ConnState.CONNECTED or self._rnr_at is not None:
            return  # (called after every arrival: most of the time everything posted is sent)
        for req in self._wrs:
            if req.sent or req.status is not None:
                continue
            wr = req.wr
            if wr.fence and any(r.status is None and r.sent and r.wr.op in _READ_LIKE
                                for r in self._wrs):
                return  # verbs IBV_SEND_FENCE: wait for earlier Reads / atomics
            if wr.op in _READ_LIKE and sum(
                    r.status is None and r.sent and r.wr.op in _READ_LIKE
                    for r in self._wrs) >= self.max_rd_atomic:
                return  # max_rd_atomic outstanding already (§4.6)
            req.psn, req.npsn = self._next_psn, self._npsn(wr)
            self._unsent -= 1
            self._next_psn = (self._next_psn + req.npsn) & PSN_MASK
            self._send_req(req, req.psn)
            if self._ack_deadline is None:
                self._ack_deadline = self._now + self.ack_timeout_s

    def _send_req(self, req: _Req, start: int) -> None:
        """The packets of ``req`` from PSN ``start`` on (a READ resumes at the first missing response)."""
        wr = req.wr
        skip = psn_diff(start, req.psn)
        if wr.op is Op.RDMA_READ:
            assert wr.dst is not None
            off = min(skip * self.pmtu, wr.dst.length)
            self._emit(Opcode.READ_REQUEST, start, ack_req=True, ext=reth_bytes(wr.to + off, wr.stag,
                                                                                 wr.dst.length - off))
            return
        if wr.op is Op.FETCH_ADD:
            mask = wr.mask if self.masked_atomics else 0
            self._emit(Opcode.FETCH_ADD, start, ack_req=True, ext=atomic_eth_bytes(wr.to, wr.stag, wr.add & U64, mask))
            return
        if wr.op is Op.COMP_SWAP:
            masks = (wr.swap_mask & U64, wr.compare_mask & U64)
            extra = b"" if masks == (U64, U64) else masks[0].to_bytes(8, "big") + masks[1].to_bytes(8, "big")
            self._emit(Opcode.CMP_SWAP, start, ack_req=True, payload=extra,
                       ext=atomic_eth_bytes(wr.to, wr.stag, wr.swap & U64, wr.compare & U64))
            return
        data, n, pmtu = wr.data, req.npsn, self.pmtu
        write = wr.op is not Op.SEND
        base = Opcode.WRITE_FIRST if write else Opcode.SEND_FIRST
        for i in range(skip, n):
            chunk = data[i * pmtu:(i + 1) * pmtu] if n > 1 else data
            first, last = i == 0, i == n - 1
            # First, Middle, Last, Only sit at +0, +1, +2, +4 of SEND_FIRST and WRITE_FIRST; "with Immediate" at +1
            op = base + (4 if first and last else 0 if first else 2 if last else 1)
            ext = reth_bytes(wr.to, wr.stag, len(data)) if first and write else b""  # RETH, then ImmDt (§4.3)
            if last and wr.imm is not None:
                op, ext = op + 1, ext + wr.imm
            elif last and wr.invalidate is not None and not write:
                op, ext = (Opcode.SEND_ONLY_INV if first else Opcode.SEND_LAST_INV), u32_bytes(wr.invalidate)
            self._emit(op, req.psn + i, ack_req=last, se=last and wr.solicited, payload=chunk, ext=ext)

    def _resume(self, req: _Req) -> int:
        return (req.psn + req.rcvd) & PSN_MASK

    def _oldest(self) -> _Req | None:
        return next((r for r in self._wrs if r.sent and r.status is None), None)

    def _retransmit(self, psn: int) -> None:
        """Go-back-N: resend every unfinished request from ``psn`` on (§4.6)."""
        for req in self._wrs:
            if not req.sent or req.status is not None or psn_diff(req.last, psn) < 0:
                continue
            start = self._resume(req)
            self._send_req(req, psn if psn_diff(psn, start) > 0 else start)
        self._ack_deadline = self._now + self.ack_timeout_s if self._oldest() else None

    def _acked(self, psn: int) -> None:
        """Everything up to ``psn`` is acknowledged: Sends and Writes there succeed (coalesced ACK, §4.6). An ACK
        that covers packets not acknowledged before is progress, even inside one long message: the retry count
        counts retries without progress, so a 2 MiB Write that a lossy receiver takes a hundred packets at a time
        is not failed RETRY_EXC_ERR after seven rounds."""
        progress = psn_diff(psn, self._acked_psn) > 0 and psn_diff(self._next_psn, psn) > 0
        if progress:
            self._acked_psn = psn
        for req in self._wrs:
            if not req.sent or psn_diff(req.last, psn) > 0:
                break
            if req.status is None and req.wr.op in (Op.SEND, Op.RDMA_WRITE):
                req.status = Status.SUCCESS
                progress = True
        if progress:
            self._progress()

    def _progress(self) -> None:
        self._retries, self._rnr_left = self.retry_count, self.rnr_retry
        self._ack_deadline = self._now + self.ack_timeout_s if self._oldest() else None

    def _requester(self, pkt: Packet) -> None:
        op, psn = pkt.opcode, pkt.bth.psn
        aeth = pkt.aeth
        if op is Opcode.ACKNOWLEDGE:
            assert aeth is not None
            kind = aeth.kind
            if kind is AethType.ACK:
                self._acked(psn)
            elif kind is AethType.RNR_NAK:
                self._rnr(psn, aeth.value)
            elif kind is AethType.NAK and aeth.value == NakCode.PSN_SEQUENCE_ERROR:
                if self._rnr_at is None:
                    self._acked((psn - 1) & PSN_MASK)
                    self._seq_nak(psn)
            elif kind is AethType.NAK:
                self._nak(psn, aeth.value)
            return
        if op is Opcode.ATOMIC_ACKNOWLEDGE:
            req = next((r for r in self._wrs if r.sent and r.psn == psn and r.wr.op in _ATOMICS), None)
            if req is None or req.status is not None or self._response_ahead(req):
                return  # a duplicate answer, or one ahead of a missing response
            self._acked((psn - 1) & PSN_MASK)
            assert req.wr.dst is not None and pkt.atomic_ack is not None
            dst = req.wr.dst
            dst.region.write(dst.offset, pkt.atomic_ack.to_bytes(8, dst.region.buffer.byteorder))  # host order §1.5
            req.status = Status.SUCCESS
            self._progress()
            return
        if op in READ_RESPONSES:
            self._read_response(pkt)

    def _response_ahead(self, req: _Req) -> bool:
        """Whether an earlier READ or atomic still waits for its response: responses come in PSN order (§4.6),
        so one for ``req`` then means the earlier one's was lost. It is dropped, and go-back-N asks for both
        again: taken now, a later request's data would be sampled before the earlier one's re-executed READ
        (a lossy link would reorder what the responder's memory showed)."""
        for r in self._wrs:
            if r is req:
                return False
            if r.sent and r.status is None and r.wr.op in _READ_LIKE:
                return True
        return False

    def _read_response(self, pkt: Packet) -> None:
        psn = pkt.bth.psn
        req, ahead = None, False  # the READ the response belongs to; whether `_response_ahead` holds for it
        for r in self._wrs:  # (one pass: this runs per response packet)
            if r.status is None and r.sent and r.wr.op in _READ_LIKE:
                if r.wr.op is Op.RDMA_READ and 0 <= psn_diff(psn, r.psn) < r.npsn:
                    req = r
                    break
                ahead = True
        if req is None or psn_diff(psn, req.psn) != req.rcvd or ahead:
            return  # a duplicate, or a gap the ACK timer recovers
        assert req.wr.dst is not None
        dst, info = req.wr.dst, OPCODES[pkt.opcode]
        if req.rcvd == 0 and not info.first:
            return  # a resumed READ's responses start with First again, at the resume PSN
        off = req.rcvd * self.pmtu
        last = req.rcvd == req.npsn - 1
        want = dst.length - off if last else self.pmtu
        if len(pkt.payload) != want or last != info.last:
            return  # malformed response: dropped, retried on timeout
        if req.rcvd == 0:
            self._acked((req.psn - 1) & PSN_MASK)
        dst.region.write(dst.offset + off, pkt.payload)
        req.rcvd += 1
        if last:
            req.status = Status.SUCCESS
        self._progress()

    def _rnr(self, psn: int, timer: int) -> None:
        # traced: a check judges from it that the peer had no receive posted (a black box's Completion Credits)
        self.memory.note("rnr-nak", psn=psn, timer=timer)
        self._acked((psn - 1) & PSN_MASK)
        req = self._containing(psn)
        if req is None:
            return
        if self._rnr_left <= 0:
            self._fail(req, Status.RNR_RETRY_EXC_ERR, Terminate(
                Layer.LLP, 0, 0, f"RNR retries exhausted ({self.rnr_retry}): no Recv posted at QP "
                f"{self.remote.qpn:#x} for PSN {psn:#x}", self._name))
            return
        self._rnr_left -= 1
        self._rnr_at = self._now + RNR_TIMER_MS[timer] / 1000
        self._rnr_psn = psn
        self._ack_deadline = None

    def _seq_nak(self, psn: int) -> None:
        if self._retries <= 0:
            req = self._oldest()
            if req is not None:
                self._fail(req, Status.RETRY_EXC_ERR, Terminate(
                    Layer.LLP, 0, 0, f"retry count {self.retry_count} exceeded after PSN sequence error NAKs "
                    f"(PSN {psn:#x})", self._name))
            return
        self._retries -= 1
        self._retransmit(psn)

    def _nak(self, psn: int, code: int) -> None:
        self._acked((psn - 1) & PSN_MASK)
        req = self._containing(psn) or self._oldest()
        if req is None:
            return
        status, etype, what = _NAK_STATUS.get(code, (Status.REM_OP_ERR, RdmapEType.REMOTE_OPERATION,
                                                     f"NAK code {code}"))
        syndrome = 0x60 | code
        term = Terminate(Layer.RDMAP, etype, RdmapCode.UNSPECIFIED,
                         f"NAK {what} (AETH syndrome {syndrome:#04x}) for {req.wr.op.name} {req.wr.tag or req.wr.wr_id}"
                         f" at PSN {psn:#x} from QP {self.remote.qpn:#x}", f"{self.remote.ip}:{self.remote.qpn:#x}")
        self._fail(req, status, term)

    def _containing(self, psn: int) -> _Req | None:
        return next((r for r in self._wrs if r.sent and r.status is None and 0 <= psn_diff(psn, r.psn) < r.npsn),
                    None)

    def _fail(self, req: _Req, status: Status, term: Terminate) -> None:
        self._term = term
        self.memory.note("terminate", reason=term.reason, key=list(term.key()))
        self._close(ConnState.ERROR, culprit=req, status=status)

    def _complete(self) -> None:
        """Requester completions in post order (kvconform.rdma.completion)."""
        self.completions.drain()

    def _close(self, state: ConnState, *, culprit: _Req | None = None, status: Status | None = None) -> None:
        """Move to ``state`` and flush every unfinished WR and Recv (kvconform.rdma.completion)."""
        if self._held_ack is not None:
            self._release_ack()  # what was received is acknowledged as it would have been without the delay
        self._state = state
        self._ack_deadline = self._rnr_at = None
        recvs = list(self._recvs)
        if self._in is not None and self._in.recv is not None:
            recvs.insert(0, self._in.recv)
        self._in = None
        self._recvs.clear()
        self.completions.flush(self._term if state is ConnState.ERROR else None, recvs, culprit=culprit,
                               status=status)

    # ---- responder ---------------------------------------------------------------------------------------

    def _responder(self, pkt: Packet) -> None:
        psn, op = pkt.bth.psn, pkt.opcode
        d = psn_diff(psn, self._epsn)
        if d > 0:
            if not self._nak_sent:
                self._nak_sent = True
                self._emit(Opcode.ACKNOWLEDGE, self._epsn,
                           ext=aeth_bytes(Aeth.nak(self._msn, NakCode.PSN_SEQUENCE_ERROR).syndrome, self._msn))
            return
        if d < 0:
            self._duplicate(pkt)
            return
        self._nak_sent = False
        if op is Opcode.READ_REQUEST:
            self._read_request(pkt)
        elif op in (Opcode.FETCH_ADD, Opcode.CMP_SWAP):
            self._atomic(pkt)
        else:
            self._data(pkt)

    def _duplicate(self, pkt: Packet) -> None:
        op, psn = pkt.opcode, pkt.bth.psn
        if op is Opcode.READ_REQUEST:
            self._read_request(pkt, duplicate=True)  # re-executed from the duplicate's PSN (§4.6)
        elif op in (Opcode.FETCH_ADD, Opcode.CMP_SWAP):
            orig = self._atomic_results.get(psn)
            if orig is not None:  # answered from the cache, never executed twice
                self._emit(Opcode.ATOMIC_ACKNOWLEDGE, psn, ext=aeth_bytes(CREDIT_INVALID, self._msn) + u64_bytes(orig))
        elif pkt.bth.ack_req:
            self._ack((self._epsn - 1) & PSN_MASK)

    def _advance(self, psn: int, n: int = 1, *, message_done: bool, ack: bool) -> None:
        self._epsn = (psn + n) & PSN_MASK
        if message_done:
            self._msn = (self._msn + 1) & PSN_MASK
        self._unacked += 1
        if ack or self._unacked >= self.ack_every:
            self._unacked = 0
            self._ack(psn)

    def _error(self, psn: int, code: NakCode, term: Terminate) -> None:
        """A request the responder refuses: NAK it, move to ERROR and flush (rdma/engine.py)."""
        self._emit(Opcode.ACKNOWLEDGE, psn, ext=aeth_bytes(Aeth.nak(self._msn, code).syndrome, self._msn))
        self._term = term
        self.memory.note("terminate", reason=term.reason, key=list(term.key()))
        self._close(ConnState.ERROR)

    def _invalid(self, pkt: Packet, why: str) -> None:
        self._error(pkt.bth.psn, NakCode.INVALID_REQUEST, Terminate(
            Layer.RDMAP, RdmapEType.REMOTE_OPERATION, RdmapCode.UNSPECIFIED,
            f"invalid request: {pkt.opcode.name} PSN {pkt.bth.psn:#x}: {why} at {self._name}", self._name))

    def _access(self, pkt: Packet, term: Terminate) -> None:
        code = NakCode.INVALID_REQUEST if term.etype == RdmapEType.REMOTE_OPERATION and term.layer is Layer.RDMAP \
            else NakCode.REMOTE_ACCESS_ERROR
        self._error(pkt.bth.psn, code, term)

    def _read_request(self, pkt: Packet, *, duplicate: bool = False) -> None:
        reth, psn = pkt.reth, pkt.bth.psn
        assert reth is not None
        if pkt.payload:
            self._invalid(pkt, f"{len(pkt.payload)} octets of payload, none expected (§4.3)")
            return
        if not duplicate:
            self.memory.note("rdma_read-arrive", stag=reth.rkey, to=reth.va, len=reth.length)
        got = self.memory.resolve(reth.rkey, reth.va, reth.length, Access.REMOTE_READ, tagged=False)
        if isinstance(got, Terminate):
            self._access(pkt, got)
            return
        buf, off = got
        data = buf.read(off, reth.length)
        self.memory.note("read-sample", stag=reth.rkey, to=reth.va, len=reth.length, addr=buf.addr + off)
        n = _npkts(reth.length, self.pmtu)
        if not duplicate:
            self._epsn = (psn + n) & PSN_MASK
            self._msn = (self._msn + 1) & PSN_MASK
            self._unacked = 0
        aeth = aeth_bytes(CREDIT_INVALID, self._msn)
        if n == 1:
            self._emit(Opcode.READ_RESPONSE_ONLY, psn, payload=data, ext=aeth, implicit_ack=not duplicate)
            return
        pmtu = self.pmtu
        for i in range(n):
            chunk = data[i * pmtu:(i + 1) * pmtu]
            if i == 0:
                self._emit(Opcode.READ_RESPONSE_FIRST, psn, payload=chunk, ext=aeth, implicit_ack=not duplicate)
            elif i == n - 1:
                self._emit(Opcode.READ_RESPONSE_LAST, psn + i, payload=chunk, ext=aeth)
            else:
                self._emit(Opcode.READ_RESPONSE_MIDDLE, psn + i, payload=chunk)

    def _atomic(self, pkt: Packet) -> None:
        a, psn = pkt.atomic, pkt.bth.psn
        assert a is not None
        masks = (U64, U64)
        if pkt.payload:
            if pkt.opcode is not Opcode.CMP_SWAP or not self.masked_atomics or len(pkt.payload) != 16:
                self._invalid(pkt, f"{len(pkt.payload)} octets of payload after the AtomicETH (§4.3)")
                return
            masks = (int.from_bytes(pkt.payload[:8], "big"), int.from_bytes(pkt.payload[8:], "big"))
        self.memory.note(("fetch_add" if pkt.opcode is Opcode.FETCH_ADD else "comp_swap") + "-arrive", stag=a.rkey,
                         to=a.va)
        got = self.memory.resolve(a.rkey, a.va, 8, Access.REMOTE_ATOMIC, tagged=False)
        if not isinstance(got, Terminate):
            got = self.memory.atomic_misaligned(a.va) or got
        if isinstance(got, Terminate):
            self._access(pkt, got)
            return
        buf, off = got
        orig = buf.read_u64(off)  # the responder's memory byte order (§1.5)
        if pkt.opcode is Opcode.FETCH_ADD:
            new = masked_add(orig, a.swap_add, a.compare if self.masked_atomics else 0)
            kind = "fetch_add"
        else:
            new = masked_cmp_swap(orig, a.compare, a.swap_add, masks[1], masks[0])
            kind = "comp_swap"
        buf.write_u64(off, new)
        self.memory.note(kind, addr=buf.addr + off, orig=orig, new=new)
        self._atomic_results[psn] = orig
        while len(self._atomic_results) > self._atomic_cache:
            self._atomic_results.popitem(last=False)
        self._epsn = (psn + 1) & PSN_MASK
        self._msn = (self._msn + 1) & PSN_MASK
        self._unacked = 0
        self._emit(Opcode.ATOMIC_ACKNOWLEDGE, psn, ext=aeth_bytes(CREDIT_INVALID, self._msn) + u64_bytes(orig),
                   implicit_ack=True)

    def _data(self, pkt: Packet) -> None:
        """SEND and RDMA WRITE packets at the expected PSN."""
        op, psn = pkt.opcode, pkt.bth.psn
        info = OPCODES[op]
        send = op in SEND_OPS
        kind = "send" if send else "write"
        cur = self._in
        if info.first and cur is not None:
            self._invalid(pkt, f"a new message while a {cur.kind} is unfinished")
            return
        if not info.first and (cur is None or cur.kind != kind):
            self._invalid(pkt, "a Middle/Last packet with no message of its kind started")
            return
        n = len(pkt.payload)
        if not info.last and n != self.pmtu:
            self._invalid(pkt, f"{n} payload octets in a First/Middle packet, the PMTU {self.pmtu} expected (§4.7)")
            return
        if info.last and n > self.pmtu:
            self._invalid(pkt, f"{n} payload octets, more than the PMTU {self.pmtu} (§4.7)")
            return
        needs_recv = (send and info.first) or (pkt.imm is not None and not send)
        if needs_recv and not self._recvs:
            self._nak_sent = True  # the packets behind it are not PSN sequence errors: the requester waits
            self._emit(Opcode.ACKNOWLEDGE, psn, ext=aeth_bytes(Aeth.rnr_nak(self._msn, self.min_rnr_timer).syndrome,
                                                               self._msn))
            return
        if info.first:
            cur = _Inbound(kind)
            if send:
                cur.recv = self._recvs.popleft()
                self.memory.note("send-arrive", len=n)
            else:
                reth = pkt.reth
                assert reth is not None
                got = self.memory.resolve(reth.rkey, reth.va, reth.length, Access.REMOTE_WRITE, tagged=True)
                if isinstance(got, Terminate):
                    self._access(pkt, got)
                    return
                cur.target, cur.total = got, reth.length
                self.memory.note("write-arrive", stag=reth.rkey, to=reth.va, len=reth.length,
                                 addr=got[0].addr + got[1])
            self._in = cur
        assert cur is not None
        if send:
            assert cur.recv is not None
            wr_id, sge = cur.recv
            room = 0 if sge is None else sge.length
            if cur.done + n > room:
                self._in = None
                term = Terminate(Layer.DDP, DdpEType.UNTAGGED_BUFFER, DdpUntaggedCode.MESSAGE_TOO_LONG,
                                 f"Send of at least {cur.done + n} octets for a Recv of {room} at {self._name}",
                                 self._name)
                self._wcs.append(Completion(wr_id, Op.RECV, Status.LOC_LEN_ERR, self._name, terminate=term))
                self._error(psn, NakCode.INVALID_REQUEST, term)
                return
            if sge is not None and n:
                sge.region.write(sge.offset + cur.done, pkt.payload)
        else:
            assert cur.target is not None
            if cur.done + n > cur.total or (info.last and cur.done + n != cur.total):
                self._invalid(pkt, f"{cur.done + n} octets written, DMA Length {cur.total} (§4.4)")
                return
            buf, base = cur.target
            if n:
                buf.write(base + cur.done, pkt.payload)
        cur.done += n
        if not info.last:
            self._advance(psn, message_done=False, ack=pkt.bth.ack_req)
            return
        self._in = None
        if send or pkt.imm is not None:
            invalidated: int | None = None
            if pkt.ieth is not None:
                refusal = self.memory.remote_invalidate(pkt.ieth)
                if refusal is not None:
                    if cur.recv is not None:
                        self._recvs.appendleft(cur.recv)  # flushed with the others
                    self._error(psn, NakCode.REMOTE_OPERATIONAL_ERROR, refusal)
                    return
                invalidated = pkt.ieth
            if send:
                assert cur.recv is not None
                wr_id = cur.recv[0]
                wc = Completion(wr_id, Op.RECV, Status.SUCCESS, self._name, byte_len=cur.done, imm=pkt.imm,
                                invalidated_stag=invalidated, solicited=pkt.bth.se)
            else:
                wr_id, _sge = self._recvs.popleft()  # Write with Immediate consumes a Recv, not its buffer
                wc = Completion(wr_id, Op.RECV_RDMA_WITH_IMM, Status.SUCCESS, self._name, byte_len=cur.total,
                                imm=pkt.imm, solicited=pkt.bth.se)
            self.memory.note("deliver", len=wc.byte_len, invalidated=invalidated,
                             imm=None if pkt.imm is None else pkt.imm.hex())
            self._wcs.append(wc)
        self._advance(psn, message_done=True, ack=pkt.bth.ack_req)


if TYPE_CHECKING:  # the contract it implements, checked by mypy
    _CONTRACT: type[WireEngine] = RoceEngine
