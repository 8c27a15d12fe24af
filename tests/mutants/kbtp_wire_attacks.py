"""Wire mutants of issue 23's attacks (conformance/kbtp/target/test_wire_attacks.py): targets whose RNIC (the wire
binding's engine, on the target's side only) breaks one rule of rdma-bindings.md. Like tests/mutants/kbtp_wire.py,
each is the reference target over loopback sockets in its binding's wire format, run by `kvconform run` in a
process of its own; the RoCEv2 ones need the InfiniBand PICS (MUTANTS in tests/mutants/kbtp.py)."""

from __future__ import annotations

import dataclasses

from kvconform.rdma.fabric import Access, DdpEType, Layer, RdmapEType, Terminate
from kvconform.rdma.iwarp import ddp, mpa
from kvconform.rdma.iwarp.engine import IwarpEngine
from kvconform.rdma.iwarp.rdmap import AtomicOp, AtomicRequest, AtomicResponse, ReadRequest
from kvconform.rdma.iwarp.rdmap import Opcode as RdmapOpcode
from kvconform.rdma.roce.engine import RoceEngine, psn_diff
from kvconform.rdma.roce.headers import SEND_OPS, Opcode, Packet
from tests.mutants.kbtp_wire import _WireDriver

U64 = (1 << 64) - 1
BASE_BOUNDS = 0x01


# ---- RoCEv2 ---------------------------------------------------------------------------------------------


class _AtomicLowBitsIgnored(RoceEngine):
    def _atomic(self, pkt: Packet) -> None:
        a = pkt.atomic
        if a is not None and a.va % 8:  # the low three bits of the VA dropped: the aligned word below is hit
            pkt = dataclasses.replace(pkt, atomic=dataclasses.replace(a, va=a.va & ~7))
        super()._atomic(pkt)


class _PsnGapTaken(RoceEngine):
    def _responder(self, pkt: Packet) -> None:
        if psn_diff(pkt.bth.psn, self._epsn) > 0:
            self._epsn = pkt.bth.psn  # a packet ahead of the expected PSN is executed as if none were missing
        super()._responder(pkt)


class _DuplicateAtomicExecuted(RoceEngine):
    def _duplicate(self, pkt: Packet) -> None:
        if pkt.opcode in (Opcode.FETCH_ADD, Opcode.CMP_SWAP):
            epsn, msn = self._epsn, self._msn
            self._atomic(pkt)  # executed again instead of answered from the saved result
            self._epsn, self._msn = epsn, msn
            return
        super()._duplicate(pkt)


class _DuplicateSendDelivered(RoceEngine):
    def _duplicate(self, pkt: Packet) -> None:
        if pkt.opcode in SEND_OPS and pkt.opcode is not Opcode.SEND_MIDDLE:
            epsn, msn = self._epsn, self._msn
            self._epsn = pkt.bth.psn
            self._data(pkt)  # delivered again instead of re-acknowledged
            self._epsn, self._msn = epsn, msn
            return
        super()._duplicate(pkt)


class WireAtomicLowBitsIgnored(_WireDriver):
    """KBTP-WIRE-ATOMIC-ALIGN: the target's RNIC drops the low three bits of an atomic's VA, so a misaligned
    FetchAdd is executed on the aligned word below it instead of NAKed."""

    roce_class = _AtomicLowBitsIgnored


class WirePsnGapExecuted(_WireDriver):
    """KBTP-WIRE-IB-PSN-GAP: the target's RNIC executes a request packet ahead of the expected PSN instead of
    answering a NAK PSN sequence error."""

    roce_class = _PsnGapTaken


class WireDuplicateAtomicExecuted(_WireDriver):
    """KBTP-WIRE-IB-DUPLICATE: the target's RNIC executes a duplicate atomic again instead of answering it from
    its saved result (a KBTP ring FetchAdd applied twice loses a ticket)."""

    roce_class = _DuplicateAtomicExecuted


class WireDuplicateSendDelivered(_WireDriver):
    """KBTP-WIRE-IB-DUPLICATE: the target's RNIC delivers a duplicate SEND again instead of re-acknowledging it,
    so a KBTP request is executed twice."""

    roce_class = _DuplicateSendDelivered


# ---- iWARP ----------------------------------------------------------------------------------------------


class _AtomicBoundsAnswered(IwarpEngine):
    def _atomic_request(self, seg: ddp.Segment) -> None:
        try:
            req = AtomicRequest.decode(seg.payload)
        except ValueError:
            req = None
        if req is not None:
            got = self.memory.resolve(req.stag, req.to, 8, Access.REMOTE_ATOMIC, tagged=False)
            if isinstance(got, Terminate) and got.etype == RdmapEType.REMOTE_PROTECTION and got.code == BASE_BOUNDS:
                self._untagged(RdmapOpcode.ATOMIC_RESPONSE, AtomicResponse(req.request_id, 0).encode())
                return  # a bounds violation answered as if executed, not terminated
        super()._atomic_request(seg)


class _WriteStartChecked(IwarpEngine):
    def _write(self, seg: ddp.Segment) -> None:
        got = self.memory.resolve(seg.stag, seg.to, len(seg.payload), Access.REMOTE_WRITE, tagged=True)
        if (isinstance(got, Terminate) and got.layer is Layer.DDP and got.etype == DdpEType.TAGGED_BUFFER
                and got.code == BASE_BOUNDS):
            fits = len(seg.payload)
            while fits and isinstance(self.memory.resolve(seg.stag, seg.to, fits, Access.REMOTE_WRITE, tagged=True),
                                      Terminate):
                fits -= 1
            if fits:  # only the start is checked: what fits is placed, the rest dropped, no Terminate
                super()._write(dataclasses.replace(seg, payload=seg.payload[:fits]))
                return
        super()._write(seg)


class _ReadPastBoundsAnswered(IwarpEngine):
    def _read_request(self, seg: ddp.Segment) -> None:
        try:
            req = ReadRequest.decode(seg.payload)
        except ValueError:
            req = None
        if req is not None and req.size:
            got = self.memory.resolve(req.source_stag, req.source_to, req.size, Access.REMOTE_READ, tagged=False)
            if isinstance(got, Terminate) and got.etype == RdmapEType.REMOTE_PROTECTION and got.code == BASE_BOUNDS:
                for s in ddp.segments(tagged=True, opcode=RdmapOpcode.READ_RESPONSE, data=bytes(req.size),
                                      max_payload=self.max_ulpdu - ddp.TAGGED_LEN, stag=req.sink_stag,
                                      to=req.sink_to):
                    self._emit(s)
                return  # answered with zeros, not terminated
        super()._read_request(seg)


class _BadKeyAccepted(IwarpEngine):
    def _start_frame(self) -> bool:
        inbox = self.setup.inbox
        if self.setup.phase == "wait_request" and len(inbox) >= 16 and bytes(inbox[:16]) != mpa.REQ_KEY:
            inbox[:16] = mpa.REQ_KEY  # any Key is taken for "MPA ID Req Frame"
        return super()._start_frame()


class _MsnIgnored(IwarpEngine):
    def _fpdu(self, ulpdu: bytes) -> None:
        try:
            seg = ddp.parse(ulpdu)
        except ddp.DdpError:
            seg = None
        if seg is not None and not seg.tagged and seg.qn == ddp.QN_SEND and self.inbound is None:
            self.msn_in[ddp.QN_SEND] = seg.msn  # whatever MSN comes is taken for the next one
        super()._fpdu(ulpdu)


class _MasksIgnored(IwarpEngine):
    def _atomic_request(self, seg: ddp.Segment) -> None:
        try:
            req = AtomicRequest.decode(seg.payload)
        except ValueError:
            req = None
        if req is not None:  # executed as the unmasked IB atomics: a plain add, a full compare and swap
            plain = dataclasses.replace(req, add_swap_mask=0 if req.op is AtomicOp.FETCH_ADD else U64,
                                        compare_mask=U64)
            seg = dataclasses.replace(seg, payload=plain.encode() + seg.payload[AtomicRequest.LENGTH:])
        super()._atomic_request(seg)


def _le_bitfields(header: bytes) -> bytes:
    """A Terminate header as Linux siw's little-endian bitfields write it (docs/interop-rdma.md #4): Layer in the
    low nibble of octet 0 and EType in the high one, HdrCt M, D, R in the low three bits of octet 2."""
    hdrct = int.from_bytes(header[2:4], "big")
    flags = (0x01 if hdrct & 0x8000 else 0) | (0x02 if hdrct & 0x4000 else 0) | (0x04 if hdrct & 0x2000 else 0)
    return bytes([((header[0] & 0x0F) << 4) | (header[0] >> 4), header[1], flags, 0]) + header[4:]


class _TerminateBitfieldsLe(IwarpEngine):
    def _untagged(self, opcode: RdmapOpcode, payload: bytes, inval: int = 0) -> None:
        if opcode is RdmapOpcode.TERMINATE:  # the error is detected and its Code right; the header is siw's
            payload = _le_bitfields(payload)
        super()._untagged(opcode, payload, inval)


class WireAtomicBoundsAnswered(_WireDriver):
    """KBTP-WIRE-ATOMIC-BOUNDS: the target's RNIC answers an atomic past the buffer its STag names with an Atomic
    Response instead of a Terminate (base or bounds violation)."""

    iwarp_class = _AtomicBoundsAnswered


class WireWriteStartChecked(_WireDriver):
    """KBTP-WIRE-WRITE-BOUNDS: the target's RNIC checks only where an RDMA Write starts: one that runs past the
    partition's end is placed as far as it fits, without a Terminate."""

    iwarp_class = _WriteStartChecked


class WireReadPastBoundsAnswered(_WireDriver):
    """KBTP-WIRE-READ-BOUNDS: the target's RNIC answers an RDMA Read Request past the buffer its STag names with
    zeros instead of a Terminate (base or bounds violation)."""

    iwarp_class = _ReadPastBoundsAnswered


class WireAcceptsBadMpaKey(_WireDriver):
    """KBTP-WIRE-MPA-START: the target accepts an MPA Request whatever its Key."""

    iwarp_class = _BadKeyAccepted


class WireIgnoresMsn(_WireDriver):
    """KBTP-WIRE-DDP-UNTAGGED: the target's RNIC delivers an untagged Send whatever its MSN, instead of
    terminating the stream (invalid MSN range)."""

    iwarp_class = _MsnIgnored


class WireTerminateBitfieldsLe(_WireDriver):
    """KBTP-WIRE-TERMINATE-HEADER: the target's RNIC writes its Terminate header with little-endian bitfields, as
    Linux siw does: Layer and EType swapped in octet 0, M|D|R in the low bits of octet 2. It detects every error
    and names it with the right Code, so only the header rule fails (the attacks accept the swap as the error)."""

    iwarp_class = _TerminateBitfieldsLe


class WireUnmaskedAtomics(_WireDriver):
    """KBTP-WIRE-RDMAP-MASKED: the target's RNIC executes RFC 7306 Atomic Requests without their masks (a plain
    64-bit add, a full compare and swap)."""

    iwarp_class = _MasksIgnored


__all__ = [
    "WireAcceptsBadMpaKey",
    "WireAtomicBoundsAnswered",
    "WireAtomicLowBitsIgnored",
    "WireDuplicateAtomicExecuted",
    "WireDuplicateSendDelivered",
    "WireIgnoresMsn",
    "WirePsnGapExecuted",
    "WireReadPastBoundsAnswered",
    "WireTerminateBitfieldsLe",
    "WireUnmaskedAtomics",
    "WireWriteStartChecked",
]
