"""`VerbsEngine`: one RC QP of a verbs device behind the wire fabric's engine contract.

The device does the wire (rxe's RoCEv2, siw's MPA/DDP/RDMAP, a NIC's firmware); the engine posts work requests
and turns the device's work completions into the fabric's. Nothing passes through ``receive`` or
``take_output``. Differences from the userspace engines, and why:

- Every work request is signaled at the device, and a successful completion of one the caller posted
  unsignaled is dropped here: only so does the engine know when a staging buffer (a Send of plain bytes) is
  free, and when the send queue is empty, which the fabric's quiet-wire test needs (``next_deadline``).
- Work request ids at the device are the engine's own; the caller's ``wr_id`` comes back in the completion.
- Read and atomic results are placed by the device into the caller's SGE (host byte order for atomics, as
  verbs define it) before the completion.
- An error completion is all the device says: the `Terminate` attached to it is built from the status, as
  the userspace IB engine builds one from a NAK syndrome, so reasons read alike.
"""

from __future__ import annotations

import contextlib
import mmap
import sys
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from kvconform.rdma.engine import Source, WireEngine, WorkRequest
from kvconform.rdma.fabric import Completion, ConnState, Layer, Op, RdmapCode, RdmapEType, Sge, Status, Terminate
from kvconform.rdma.verbs.memory import address_of

POLL_S = 0.0005  # how often the fabric polls a CQ that has work in flight (no completion channel fd in pyverbs)
# A QP in ERROR flushes what it holds at once; what the device has not returned this long after the connection
# ended it never will (a lost flush): completed here as flushed, and said on stderr, so a run cannot wait for it
FLUSH_BOUND_S = 5.0
STAGING_SLOT = 4096
STAGING_SLOTS = 32
_POLL_BATCH = 32

# ibv_wc_opcode -> Op (rdma-bindings §6.2); the values are the same, BIND_MW and LOCAL_INV are internal
_WC_OP = {int(op): op for op in Op}
_STATUS = {int(s): s for s in Status}
# Send with Invalidate at the receiver: libibverbs' IBV_WC_WITH_INV is bit 3, but rxe (Linux 6.1) sets bit 2, the
# kernel's IB_WC_WITH_INVALIDATE; bit 2 is IBV_WC_IP_CSUM_OK otherwise, which an RC receive never carries
# (docs/interop-rdma.md). siw reports neither: there the fabric cannot see a remote invalidation.
WC_WITH_INV = 0x8 | 0x4
WC_WITH_IMM = 0x2


@dataclass(slots=True)
class _Out:
    """A work request at the device: the caller's request, or an internal one (a window bind)."""

    wr: WorkRequest | None
    staging: int = -1  # staging slot of a Send of plain bytes, -1 none
    temp: Any = None  # a one-off MR (and its mmap) for a payload larger than a slot


def imm_to_wire(imm: bytes) -> int:
    """Immediate Data as ``ibv_send_wr.imm_data`` wants it: a __be32 held in a host integer."""
    return int.from_bytes(imm, sys.byteorder)


def imm_from_wire(value: int) -> bytes:
    return (value & 0xFFFFFFFF).to_bytes(4, sys.byteorder)


def terminate_for(status: Status, conn: str, vendor_err: int = 0) -> Terminate:
    """The Terminate a device's error completion stands for (the status is all a verbs consumer sees)."""
    etype, code = {
        Status.REM_ACCESS_ERR: (RdmapEType.REMOTE_PROTECTION, RdmapCode.INVALID_STAG),
        Status.REM_INV_REQ_ERR: (RdmapEType.REMOTE_OPERATION, RdmapCode.UNEXPECTED_OPCODE),
        Status.REM_OP_ERR: (RdmapEType.REMOTE_OPERATION, RdmapCode.UNSPECIFIED),
    }.get(status, (RdmapEType.LOCAL_CATASTROPHIC, RdmapCode.UNSPECIFIED))
    why = f"the device completed a work request with {status.name}"
    if vendor_err:
        why += f" (vendor_err {vendor_err:#x})"
    return Terminate(Layer.RDMAP, etype, code, why, sender=conn)


class VerbsEngine:
    """One endpoint of an RC connection on a verbs device (see the module docstring)."""

    def __init__(self, name: str, *, qp: Any, cq: Any, pd: Any, lkey_of: Callable[[Sge], tuple[int, int]],
                 on_remote_invalidate: Callable[[int], None], on_disconnect: Callable[[], None] | None = None,
                 note: Callable[..., None] | None = None, depth: int = 64) -> None:
        import pyverbs.enums as e  # optional: pyverbs ships with rdma-core, on RDMA hosts only
        from pyverbs.mr import MR

        self._e = e
        self._name = name
        self.qp = qp
        self.cq = cq
        self.pd = pd
        self._lkey_of = lkey_of  # Sge -> (address, lkey)
        self._on_remote_invalidate = on_remote_invalidate
        self._on_disconnect = on_disconnect  # rdma_cm: the peer learns of an orderly close by DISCONNECTED
        self._note = note or (lambda what, **args: None)  # the fabric's trace, as the userspace engines feed it
        self._now = 0.0
        self._state = ConnState.CONNECTED
        self._ended_at: float | None = None  # when the engine first saw the connection ended
        self._term: Terminate | None = None
        self._established = False
        self._next_id = 1
        self._sq: dict[int, _Out] = {}
        self._depth = depth  # the QP's send queue
        self._posted = 0  # work requests at the device
        self._backlog: deque[tuple[Any, int]] = deque()  # (SendWR, device wr_id) waiting for room
        self._rq: dict[int, int] = {}  # device wr_id -> caller wr_id
        self._held: list[WorkRequest] = []  # sends posted before the QP is ready to send
        self._done: deque[Completion] = deque()
        self._staging_mem = mmap.mmap(-1, STAGING_SLOT * STAGING_SLOTS)

        self._staging_addr = address_of(self._staging_mem)
        self._staging = MR(pd, len(self._staging_mem), e.IBV_ACCESS_LOCAL_WRITE, address=self._staging_addr)
        self._free_slots = list(range(STAGING_SLOTS))

    # ---- the Engine contract ---------------------------------------------------------------------------

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
        return self._established

    def start(self, now: float) -> None:
        """Nothing to send: the QP was connected out of band (RoCE) or by rdma_cm (iWARP) before."""

    def ready(self) -> None:
        """The QP is in RTS: post the sends that were held."""
        self._established = True
        held, self._held = self._held, []
        for wr in held:
            self.post(wr)

    def post(self, wr: WorkRequest) -> None:
        if not self._established and self._state is ConnState.CONNECTED:
            self._held.append(wr)
            return
        if self._state is not ConnState.CONNECTED:
            self._done.append(Completion(wr.wr_id, wr.op, Status.WR_FLUSH_ERR, self._name))
            return
        from pyverbs.wr import SGE, SendWR  # optional: pyverbs ships with rdma-core, on RDMA hosts only

        e = self._e
        out = _Out(wr)
        sges: list[Any] = []
        if wr.op in (Op.SEND, Op.RDMA_WRITE):
            if wr.src is not None:
                for s in wr.src:
                    if s.length:
                        addr, lkey = self._lkey_of(s)
                        sges.append(SGE(addr, s.length, lkey))
            elif wr.data:
                sges.append(self._stage(out, wr.data))
        elif wr.dst is not None:
            addr, lkey = self._lkey_of(wr.dst)
            sges.append(SGE(addr, wr.dst.length, lkey))
        flags = e.IBV_SEND_SIGNALED
        if wr.fence:
            flags |= e.IBV_SEND_FENCE
        if wr.solicited:
            flags |= e.IBV_SEND_SOLICITED
        opcode, imm = self._opcode(wr)
        wr_id = self._new_id()
        sges = sges or [self._empty_sge()]  # pyverbs wants an SGE even for zero octets
        swr = SendWR(wr_id=wr_id, opcode=opcode, num_sge=len(sges), sg=sges, send_flags=flags)
        if imm is not None:
            swr.imm_data = imm
        if wr.op in (Op.RDMA_WRITE, Op.RDMA_READ):
            swr.set_wr_rdma(wr.stag, wr.to)
        elif wr.invalidate is not None:
            # libsiw (rdma-core 44) sends the STag of wr.rdma.rkey, not invalidate_rkey (docs/interop-rdma.md)
            swr.set_wr_rdma(wr.invalidate, 0)
        elif wr.op is Op.FETCH_ADD:
            swr.set_wr_atomic(wr.stag, wr.to, wr.add, 0)  # the add goes in compare_add (rdma-bindings §6.4)
        elif wr.op is Op.COMP_SWAP:
            swr.set_wr_atomic(wr.stag, wr.to, wr.compare, wr.swap)
        self._sq[wr_id] = out
        self._post_send(swr, wr_id)

    def _opcode(self, wr: WorkRequest) -> tuple[int, int | None]:
        e = self._e
        if wr.op is Op.SEND:
            if wr.invalidate is not None:
                return e.IBV_WR_SEND_WITH_INV, wr.invalidate  # invalidate_rkey: host order, shares imm_data
            if wr.imm is not None:
                return e.IBV_WR_SEND_WITH_IMM, imm_to_wire(wr.imm)
            return e.IBV_WR_SEND, None
        if wr.op is Op.RDMA_WRITE:
            if wr.imm is not None:
                return e.IBV_WR_RDMA_WRITE_WITH_IMM, imm_to_wire(wr.imm)
            return e.IBV_WR_RDMA_WRITE, None
        if wr.op is Op.RDMA_READ:
            return e.IBV_WR_RDMA_READ, None
        if wr.op is Op.FETCH_ADD:
            return e.IBV_WR_ATOMIC_FETCH_AND_ADD, None
        return e.IBV_WR_ATOMIC_CMP_AND_SWP, None

    def bind_window(self, mw: Any, mr: Any, addr: int, length: int, access: int) -> int:
        """Bind type-2 window ``mw`` over [addr, +length) of ``mr`` on this QP; returns the new rkey (valid once
        the bind executes, which is before any later work request of this QP)."""
        from pyverbs.mr import MWBindInfo  # optional: pyverbs ships with rdma-core, on RDMA hosts only
        from pyverbs.wr import SendWR

        swr = SendWR(wr_id=self._new_id(), opcode=self._e.IBV_WR_BIND_MW, send_flags=self._e.IBV_SEND_SIGNALED)
        swr.set_bind_wr(mw, MWBindInfo(mr, addr, length, access))
        self._sq[swr.wr_id] = _Out(None)
        self._post_send(swr, swr.wr_id)
        return int(swr.rkey)

    def _post_send(self, swr: Any, wr_id: int) -> None:
        """To the device, or to the backlog while its send queue is full (the fabric interface takes any number
        of posts; a device's queue holds ``depth``)."""
        from pyverbs.pyverbs_error import PyverbsError  # optional: pyverbs ships with rdma-core, on RDMA hosts only

        if self._posted >= self._depth or self._backlog:
            self._backlog.append((swr, wr_id))
            return
        try:
            self.qp.post_send(swr)
            self._posted += 1
        except PyverbsError as exc:  # a QP gone to error: the request completes in error
            out = self._sq.pop(wr_id)
            self._release(out)
            if out.wr is not None:
                self._done.append(Completion(out.wr.wr_id, out.wr.op, Status.LOC_QP_OP_ERR, self._name,
                                             terminate=Terminate(Layer.RDMAP, RdmapEType.LOCAL_CATASTROPHIC,
                                                                 RdmapCode.UNSPECIFIED, f"post_send: {exc}",
                                                                 sender=self._name)))

    def post_recv(self, wr_id: int, sge: Sge | None) -> None:
        """Posted at once, also before the QP is ready to send (a QP takes receives from INIT on): an iWARP peer
        may send right behind its RTR, and iWARP has no RNR retry, so a KBTP target's receives must be there
        before it accepts the connection."""
        if self._state is not ConnState.CONNECTED:
            self._done.append(Completion(wr_id, Op.RECV, Status.WR_FLUSH_ERR, self._name))
            return
        from pyverbs.wr import SGE, RecvWR  # optional: pyverbs ships with rdma-core, on RDMA hosts only

        sges = []
        if sge is not None and sge.length:
            addr, lkey = self._lkey_of(sge)
            sges.append(SGE(addr, sge.length, lkey))
        dev_id = self._new_id()
        self._rq[dev_id] = wr_id
        sges = sges or [self._empty_sge()]
        self.qp.post_recv(RecvWR(wr_id=dev_id, num_sge=len(sges), sg=sges))

    def receive(self, data: bytes, now: float, source: Source | None = None) -> None:
        """The device does the wire."""

    def poll_timers(self, now: float) -> None:
        self._now = now
        self.poll()

    def next_deadline(self) -> float | None:
        """While work is at the device the fabric keeps polling (and the wire is not quiet)."""
        return self._now + POLL_S if self._sq else None

    @property
    def drained(self) -> bool:
        """Ended, and every work request and receive came back from the device."""
        return self._state is not ConnState.CONNECTED and not self._sq and not self._rq

    def take_output(self) -> list[bytes]:
        return []

    def take_completions(self) -> list[Completion]:
        out = list(self._done)
        self._done.clear()
        return out

    def disconnect(self) -> None:
        """Orderly close: the QP goes to ERROR at the device, which flushes what is outstanding."""
        if self._on_disconnect is not None:
            self._on_disconnect()
        self._to_error()
        if self._state is ConnState.CONNECTED:
            self._state = ConnState.CLOSED

    def transport_closed(self) -> None:
        """The peer went away (the side channel or the rdma_cm connection ended)."""
        if self._state is ConnState.CONNECTED:
            self._state = ConnState.CLOSED if not self._sq else ConnState.ERROR
            if self._state is ConnState.ERROR:
                self._term = Terminate(Layer.LLP, 0, 0, f"the connection ended with work outstanding at {self._name}",
                                       sender=self._name)
        self._to_error()

    # ---- completions ---------------------------------------------------------------------------------

    def poll(self) -> int:
        """Take what the device completed; the number of device completions seen."""
        n, wcs = self.cq.poll(_POLL_BATCH)
        for wc in wcs[:n] if n else []:
            self._complete(wc)
        if self._state is ConnState.CONNECTED:
            return int(n)
        now = time.monotonic()  # the fabric's clock reaches an engine only while it has sends at the device
        if self._ended_at is None:
            self._ended_at = now
        if self._backlog and not self._posted:
            self._flush_backlog()
            return int(n) + 1
        if (self._sq or self._rq) and not n and now - self._ended_at > FLUSH_BOUND_S:
            self._give_up_flush()
            return 1
        return int(n)

    def outstanding(self) -> str:
        """What is at the device, for a run that did not end: '' when nothing."""
        if not self._sq and not self._rq:
            return ""
        ops = [out.wr.op.name if out.wr is not None else "BIND_MW" for out in self._sq.values()]
        return f"{self._name} ({self._state.name}): sends {ops}, {len(self._rq)} receives at the device"

    def _give_up_flush(self) -> None:
        lost = self.outstanding()
        print(f"verbs: {lost} still not returned {FLUSH_BOUND_S:.0f} s after the connection ended: completed here "
              "as flushed (the device lost its flush)", file=sys.stderr, flush=True)
        for dev_id in list(self._sq):
            self._flushed(dev_id)
        for wr_id in list(self._rq.values()):
            self._done.append(Completion(wr_id, Op.RECV, Status.WR_FLUSH_ERR, self._name))
        self._rq.clear()
        self._posted = 0

    def _complete(self, wc: Any) -> None:
        status = _STATUS.get(int(wc.status), Status.GENERAL_ERR)
        dev_id = int(wc.wr_id)
        if status is not Status.SUCCESS and self._state is ConnState.CONNECTED:
            self._state = ConnState.ERROR
            if status is not Status.WR_FLUSH_ERR:
                self._term = terminate_for(status, self._name, int(wc.vendor_err))
        if dev_id in self._rq:
            wr_id = self._rq.pop(dev_id)
            op = _WC_OP.get(int(wc.opcode), Op.RECV) if status is Status.SUCCESS else Op.RECV
            flags = int(wc.wc_flags)
            invalidated = imm = None
            if status is Status.SUCCESS and flags & WC_WITH_INV and op is Op.RECV:
                invalidated = int(wc.imm_data)  # invalidated_rkey: host order
                self._on_remote_invalidate(invalidated)
            elif status is Status.SUCCESS and flags & WC_WITH_IMM:
                imm = imm_from_wire(int(wc.imm_data))
            if status is Status.SUCCESS and op is Op.RECV:
                # the arrival is seen when it is polled, and delivered at once: both no earlier than they happened
                self._note("send-arrive", len=int(wc.byte_len))
                self._note("deliver", len=int(wc.byte_len), invalidated=invalidated, wc_flags=flags)
            self._done.append(Completion(wr_id, op, status, self._name, byte_len=int(wc.byte_len), imm=imm,
                                         invalidated_stag=invalidated,
                                         terminate=self._term if status is not Status.SUCCESS else None))
            return
        out = self._sq.pop(dev_id, None)
        if out is None:
            return
        self._posted -= 1
        self._release(out)
        while self._backlog and self._posted < self._depth and self._state is ConnState.CONNECTED:
            self._post_send(*self._backlog.popleft())
        wr = out.wr
        if wr is None or (status is Status.SUCCESS and not wr.signaled):
            return
        self._done.append(Completion(wr.wr_id, wr.op, status, self._name, byte_len=int(wc.byte_len),
                                     terminate=self._term if status is not Status.SUCCESS else None))

    # ---- internals -------------------------------------------------------------------------------------

    def _new_id(self) -> int:
        self._next_id += 1
        return self._next_id

    def _empty_sge(self) -> Any:
        from pyverbs.wr import SGE  # optional: pyverbs ships with rdma-core, on RDMA hosts only

        return SGE(self._staging_addr, 0, self._staging.lkey)

    def _stage(self, out: _Out, data: bytes) -> Any:
        from pyverbs.mr import MR  # optional: pyverbs ships with rdma-core, on RDMA hosts only
        from pyverbs.wr import SGE

        if len(data) <= STAGING_SLOT and self._free_slots:
            slot = self._free_slots.pop()
            off = slot * STAGING_SLOT
            self._staging_mem[off:off + len(data)] = data
            out.staging = slot
            return SGE(self._staging_addr + off, len(data), self._staging.lkey)
        mem = mmap.mmap(-1, len(data))
        mem[:] = data

        addr = address_of(mem)
        mr = MR(self.pd, len(data), self._e.IBV_ACCESS_LOCAL_WRITE, address=addr)
        out.temp = (mr, mem)
        return SGE(addr, len(data), mr.lkey)

    def _release(self, out: _Out) -> None:
        if out.staging >= 0:
            self._free_slots.append(out.staging)
            out.staging = -1
        if out.temp is not None:
            mr, _mem = out.temp
            mr.close()
            out.temp = None

    def _flush_backlog(self) -> None:
        """Sends that never reached the device are flushed here once the device has flushed what it held (they
        were posted after it: completions stay in post order)."""
        while self._backlog:
            _swr, wr_id = self._backlog.popleft()
            self._flushed(wr_id)

    def _flushed(self, dev_id: int) -> None:
        """A send the device will not complete: its caller's request completes as flushed."""
        out = self._sq.pop(dev_id)
        self._release(out)
        if out.wr is not None:
            self._done.append(Completion(out.wr.wr_id, out.wr.op, Status.WR_FLUSH_ERR, self._name))

    def _to_error(self) -> None:
        from pyverbs.pyverbs_error import PyverbsError  # optional: pyverbs ships with rdma-core, on RDMA hosts only
        from pyverbs.qp import QPAttr


        try:
            attr = QPAttr()
            attr.qp_state = self._e.IBV_QPS_ERR
            self.qp.modify(attr, self._e.IBV_QP_STATE)
        except PyverbsError:
            pass  # already in error, or destroyed

    def close(self) -> None:
        """Release the device objects: QP (in ERROR first, so nothing is in flight), CQ, staging region."""
        self._to_error()
        for obj in (self.qp, self.cq, self._staging):
            with contextlib.suppress(Exception):
                obj.close()


if TYPE_CHECKING:  # the contract it implements, checked by mypy
    _CONTRACT: type[WireEngine] = VerbsEngine
