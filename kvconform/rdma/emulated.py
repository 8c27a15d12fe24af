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

from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from kvconform.rdma.completion import InOrderCompletions, flushed, wr_byte_len
from kvconform.rdma.engine import Engine, WorkRequest
from kvconform.rdma.fabric import (
    Access,
    Completion,
    ConnState,
    DdpEType,
    DdpUntaggedCode,
    FabricUsageError,
    Layer,
    Node,
    Op,
    RdmapEType,
    RunResult,
    Sge,
    Status,
    Terminate,
    masked_add,
    masked_cmp_swap,
)
from kvconform.rdma.memory import atomic_misaligned, remote_invalidate_refusal, resolve
from kvconform.rdma.profiles import RDMAP_7306, Binding, PlacementModel, Profile
from kvconform.rdma.runtime import EmuBuffer, EmuCQ, EmuNode, PostingEndpoint, Runtime, RuntimeFabric, gather
from kvconform.rdma.runtime.requests import OP_NAME as _OP_NAME
from kvconform.rdma.scheduler import FifoScheduler, RandomScheduler, Scheduler

__all__ = ["EmuBuffer", "EmuCQ", "EmuConnection", "EmuEngine", "EmuFabric", "EmuNode", "EmuWorkRequest"]


@dataclass(slots=True, eq=False)
class EmuWorkRequest(WorkRequest):
    """A send-queue WR as the emulated NIC keeps it, from post to requester completion."""

    status: Status | None = None  # set when the requester side is done
    terminate: Terminate | None = None  # what its completion carries (kvconform.rdma.completion)
    orig: int = 0  # an Immediate Data message: the octets of the Write it follows
    parent: EmuWorkRequest | None = None  # an Immediate Data message's RDMA Write

    @property
    def byte_len(self) -> int:
        """What a successful completion reports (kvconform.rdma.completion.Outcome)."""
        return wr_byte_len(self.op, self.dst, self.data)

    @classmethod
    def of(cls, wr: WorkRequest) -> EmuWorkRequest:
        """The emulated record of a request built elsewhere."""
        return cls(wr.op, wr.wr_id, wr.tag, wr.signaled, wr.fence, wr.data, wr.src, wr.dst, wr.stag, wr.to, wr.imm,
                   wr.invalidate, wr.solicited, wr.add, wr.mask, wr.compare, wr.swap, wr.compare_mask, wr.swap_mask)


class _Msg:
    """An inbound message at the responder, between arrival and placement / delivery / processing."""

    __slots__ = ("done", "enabled", "left", "target", "wr")

    def __init__(self, wr: EmuWorkRequest) -> None:
        self.wr = wr
        self.done = False
        self.enabled = False  # its deliver / first in-order step has been enabled
        self.left = 0  # chunks not yet placed (Writes)
        self.target: tuple[EmuBuffer, int] | None = None  # (buffer, offset) resolved at arrival


class EmuEngine:
    """One endpoint's NIC on the emulated fabric (implements `kvconform.rdma.engine.Engine`): its queues and
    state; the steps that move its work are the fabric's `EmuNic`. Completions go to ``emit`` as they are
    produced (a CQ: they wake actors within the step that produced them)."""

    def __init__(self, nic: EmuNic, node: EmuNode, name: str, link: int, emit: Callable[[Completion], None]) -> None:
        self.nic = nic
        self.node = node
        self.name = name
        self.link = link
        self.emit = emit
        self.peer: EmuEngine
        self._state = ConnState.CONNECTED
        self._terminate: Terminate | None = None
        self.sq: deque[EmuWorkRequest] = deque()  # posted, not yet arrived at the peer
        # posted, requester completion not yet produced: completed in post order, flushed on failure
        self.completions: InOrderCompletions[EmuWorkRequest] = InOrderCompletions(name, emit)
        self.outstanding = self.completions.pending
        self.rq: deque[tuple[int, Sge | None]] = deque()  # posted receives
        self.inbound: deque[_Msg] = deque()  # peer's messages arrived here, not yet done
        self.responses: deque[_Msg] = deque()  # peer's Reads/atomics in processing order
        self._arrive_enabled = False
        self._resp_active = False

    # ---- the Engine contract -----------------------------------------------------------------------------

    @property
    def state(self) -> ConnState:
        return self._state

    @property
    def terminate(self) -> Terminate | None:
        return self._terminate

    def post(self, wr: WorkRequest) -> None:
        rec = wr if isinstance(wr, EmuWorkRequest) else EmuWorkRequest.of(wr)
        if self._state is not ConnState.CONNECTED:
            # verbs: posting to a QP in the error state completes the work request flushed
            self.emit(flushed(rec.wr_id, rec.op, self.name))
            return
        nic = self.nic
        if nic._tracing:
            # imm: a Write with Immediate also ends in a message the peer's receive queue takes (an answer, to KBTP)
            nic._note(self.name, "post", wr=rec.tag, op=rec.op.name, wr_id=rec.wr_id,
                      **({"imm": True} if rec.imm is not None else {}))
        self.sq.append(rec)
        self.outstanding.append(rec)
        nic._advance_sq(self)

    def post_recv(self, wr_id: int, sge: Sge | None) -> None:
        if self._state is not ConnState.CONNECTED:
            self.emit(flushed(wr_id, Op.RECV, self.name))
            return
        self.rq.append((wr_id, sge))

    def take_completions(self) -> list[Completion]:
        return []  # handed to ``emit`` as they were produced

    def disconnect(self) -> None:
        """Orderly close of both endpoints; outstanding work is flushed."""
        if self._state is ConnState.CONNECTED:
            self.nic._close(self, ConnState.CLOSED, None, None, None)


class EmuConnection(PostingEndpoint):
    """One endpoint of an emulated RC connection (implements `kvconform.rdma.fabric.Connection`): the runtime's
    posting checks in front of an `EmuEngine`."""

    request_type = EmuWorkRequest

    def __init__(self, fabric: EmuFabric, node: EmuNode, name: str, link: int, cq: EmuCQ) -> None:
        super().__init__(node, name, cq)
        self.link = link
        self.engine = EmuEngine(fabric.nic, node, name, link, self._emit)
        self.rq = self.engine.rq  # one receive queue: what the endpoint posts, the engine consumes

    def _emit(self, wc: Completion) -> None:
        if self.on_deliver is not None and wc.ok and wc.op in (Op.RECV, Op.RECV_RDMA_WITH_IMM):
            self.on_deliver()  # a receive is delivered (PostingEndpoint.on_deliver)
        self.cq.push(wc)

    @property
    def state(self) -> ConnState:
        return self.engine.state

    @property
    def terminate(self) -> Terminate | None:
        return self.engine.terminate

    def __repr__(self) -> str:
        return f"EmuConnection({self.name!r}, {self.engine.state})"

    def _post(self, wr: WorkRequest) -> int:
        self.engine.post(wr)
        return wr.wr_id

    def _recv_posted(self, wr_id: int, sge: Sge | None) -> None:
        return  # the engine consumes the receive queue it shares with the endpoint

    def disconnect(self) -> None:
        """Orderly close of both endpoints; outstanding work is flushed."""
        self.engine.disconnect()


MAX_CHUNKS = 4096  # steps one message's placement (or Read Response) takes at most


def _chunks(length: int, size: int) -> Iterable[tuple[int, int]]:
    for off in range(0, length, size):
        yield off, min(size, length - off)


def _rdmap_no_buffer(tag: str, at: str) -> tuple[Terminate, Status]:
    """RDMAP: a Send with no posted Recv is a DDP untagged-buffer error, NO_BUFFER (a Terminate)."""
    return Terminate(Layer.DDP, DdpEType.UNTAGGED_BUFFER, DdpUntaggedCode.NO_BUFFER,
                     f"no Recv posted for {tag} at {at}", at), Status.REM_OP_ERR


def _ib_rnr_exhausted(tag: str, at: str) -> tuple[Terminate, Status]:
    """IB: an RNR NAK, retried until the requester's RNR retry count runs out."""
    return Terminate(Layer.LLP, 0, 0, f"RNR retries exhausted: no Recv posted for {tag} at {at}", at), \
        Status.RNR_RETRY_EXC_ERR


class EmuNic:
    """The NIC steps of every emulated connection (see the module docstring): arrival, placement, delivery,
    Read and atomic processing, failure. Each step is enabled in the fabric's runtime for its scheduler."""

    def __init__(self, runtime: Runtime, profile: Profile, *, trace: bool) -> None:
        self.runtime = runtime
        self.profile = profile
        self._tracing = trace
        self._note = runtime.note
        self._add = runtime.add
        # what a Send that finds no Recv gets: the binding's rule, chosen once
        self._no_recv = _rdmap_no_buffer if profile.binding is Binding.RDMAP else _ib_rnr_exhausted

    # ---- send queue: arrival in post order ---------------------------------------------------------------

    def _advance_sq(self, conn: EmuEngine) -> None:
        if conn._arrive_enabled or not conn.sq:
            return
        wr = conn.sq[0]
        if wr.fence:
            for w in conn.outstanding:
                if w is wr:
                    break
                if w.status is None and w.op in (Op.RDMA_READ, Op.FETCH_ADD, Op.COMP_SWAP):
                    return  # fenced until earlier Reads/atomics complete (verbs IBV_SEND_FENCE)
        conn._arrive_enabled = True
        self._add(f"{conn.name}/{wr.tag}:arrive", conn.name, lambda: self._arrive(conn), conn.link)

    def _arrive(self, conn: EmuEngine) -> None:
        conn._arrive_enabled = False
        wr = conn.sq.popleft()
        peer = conn.peer
        if wr.src is not None and (wr.op is Op.SEND or wr.op is Op.RDMA_WRITE):
            wr.data = gather(wr.src)  # the source is read as the request reaches the responder
        msg = _Msg(wr)
        if wr.op is Op.RDMA_WRITE:
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
                imm = EmuWorkRequest(Op.RECV_RDMA_WITH_IMM, wr.wr_id, wr.tag + "+imm", signaled=False)
                imm.imm, imm.data, imm.parent = wr.imm, b"", wr
                imm.orig = len(wr.data)
                peer.inbound.append(_Msg(imm))
            else:
                wr.status = Status.SUCCESS  # a Write completes at the requester once the stream carried it
        elif wr.op is Op.SEND:
            if self._tracing:
                self._note(peer.name, "send-arrive", wr=wr.tag, len=len(wr.data))
            peer.inbound.append(msg)
        else:  # Read Request / Atomic Request: checked at arrival, processed in order after earlier Writes
            if wr.op is Op.RDMA_READ:
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
                self._note(peer.name, f"{_OP_NAME[wr.op]}-arrive", wr=wr.tag, stag=wr.stag, to=wr.to)
            peer.inbound.append(msg)
        self._advance_inbound(peer)
        self._complete_in_order(conn)
        self._advance_sq(conn)

    def _remote(
        self, at: EmuEngine, stag: int, to: int, length: int, right: Access, *, tagged: bool
    ) -> tuple[EmuBuffer, int] | Terminate:
        """Resolve (STag, TO, length) at ``at``'s node, or the Terminate its RNIC sends (§2.2, §2.6)."""
        got = resolve(at.node.stags, at.name, stag, to, length, right, tagged=tagged)
        if isinstance(got, Terminate):
            return got
        buf, off = got
        assert isinstance(buf, EmuBuffer)
        return buf, off

    # ---- responder: placement, delivery, Read/atomic processing -------------------------------------------

    def _start_write(self, at: EmuEngine, src: EmuEngine, msg: _Msg) -> None:
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
            chunks = list(_chunks(len(data), self._chunk(len(data))))
            msg.left = len(chunks)
            for off, n in chunks:
                self._add(f"{src.name}/{msg.wr.tag}:place@{off}", at.name, self._placer(at, msg, off, n), at.link)
        else:  # ib_psn_order: chunks in order, started when the message reaches the head (see _advance_inbound)
            msg.left = -(-len(data) // self._chunk(len(data)))

    def _chunk(self, length: int) -> int:
        """The placement / read-sampling granularity of a message of ``length`` octets: the profile's, but a message
        takes at most MAX_CHUNKS steps (a 2 MiB KV block in 8-octet chunks would take 2^18 steps per transfer, more
        than a whole run's step budget; up to 32 KiB at 8 octets nothing changes)."""
        return max(self.profile.chunk_bytes, -(-length // MAX_CHUNKS))

    def _placer(self, at: EmuEngine, msg: _Msg, off: int, n: int) -> Callable[[], None]:
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
                    self._placer(at, msg, nxt, min(self._chunk(len(msg.wr.data)), len(msg.wr.data) - nxt)),
                    at.link,
                )

        return place

    def _advance_inbound(self, at: EmuEngine) -> None:
        """Enable what the stream order allows: deliveries after earlier placement (rule 5), Reads in order."""
        inbound = at.inbound
        ordered = self.profile.placement_model is PlacementModel.IB_PSN_ORDER
        while inbound:
            msg = inbound[0]
            if msg.done:
                inbound.popleft()
                continue
            kind = msg.wr.op
            if kind is Op.RDMA_WRITE:
                # rdmap: its chunks are already enabled and later messages wait only if they are Send-type
                if ordered and not msg.enabled:
                    msg.enabled = True
                    self._add(
                        f"{at.peer.name}/{msg.wr.tag}:place@0",
                        at.name,
                        self._placer(at, msg, 0, min(self._chunk(len(msg.wr.data)), len(msg.wr.data))),
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

    def _deliverer(self, at: EmuEngine, msg: _Msg) -> Callable[[], None]:
        return lambda: self._deliver(at, msg)

    def _deliver(self, at: EmuEngine, msg: _Msg) -> None:
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
            term, status = self._no_recv(wr.tag, at.name)
            self._fail(src, culprit, term, status)
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
            at.emit(Completion(wr_id, Op.RECV, Status.LOC_LEN_ERR, at.name, terminate=term))
            self._fail(src, culprit, term, Status.REM_INV_REQ_ERR)
            return
        if sge is not None and wr.data:
            sge.region.write(sge.offset, wr.data)
        if invalidated is not None:
            del at.node.stags[invalidated]
        msg.done = True
        if self._tracing:
            self._note(at.name, "deliver", wr=wr.tag, len=len(wr.data), invalidated=invalidated)
        if wr.op is Op.RECV_RDMA_WITH_IMM:
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
        at.emit(wc)
        culprit.status = Status.SUCCESS
        self._complete_in_order(src)
        self._advance_inbound(at)

    def _remote_invalidate(self, at: EmuEngine, stag: int) -> Terminate | None:
        return remote_invalidate_refusal(at.node.stags, at.name, stag)

    def _advance_responses(self, at: EmuEngine) -> None:
        if at._resp_active or not at.responses:
            return
        at._resp_active = True
        msg = at.responses[0]
        wr = msg.wr
        req = at.peer
        if wr.op is Op.RDMA_READ:
            assert wr.dst is not None
            if self.profile.placement_model is PlacementModel.STRICT or wr.dst.length == 0:
                self._add(f"{req.name}/{wr.tag}:read@0", at.name, self._reader(at, msg, 0, wr.dst.length), at.link)
            else:
                self._add(
                    f"{req.name}/{wr.tag}:read@0",
                    at.name,
                    self._reader(at, msg, 0, min(self._chunk(wr.dst.length), wr.dst.length)),
                    at.link,
                )
        else:
            self._add(f"{req.name}/{wr.tag}:atomic", at.name, lambda: self._atomic(at, msg), at.link)

    def _reader(self, at: EmuEngine, msg: _Msg, off: int, n: int) -> Callable[[], None]:
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
                    self._reader(at, msg, nxt, min(self._chunk(wr.dst.length), wr.dst.length - nxt)),
                    at.link,
                )
                return
            self._response_done(at, wr)

        return read

    def _atomic(self, at: EmuEngine, msg: _Msg) -> None:
        wr = msg.wr
        assert msg.target is not None and wr.dst is not None
        buf, off = msg.target
        orig = int.from_bytes(buf.data[off : off + 8], buf.byteorder)
        if wr.op is Op.FETCH_ADD:
            new = masked_add(orig, wr.add, wr.mask)
        else:
            new = masked_cmp_swap(orig, wr.compare, wr.swap, wr.compare_mask, wr.swap_mask)
        buf.data[off : off + 8] = new.to_bytes(8, buf.byteorder)
        # the original value travels big-endian and is stored in the requester's host order (§1.5)
        dst = wr.dst
        dst.region.write(dst.offset, orig.to_bytes(8, dst.region.buffer.byteorder))
        if self._tracing:
            self._note(at.name, _OP_NAME[wr.op], wr=wr.tag, addr=buf.addr + off, orig=orig, new=new)
        self._response_done(at, wr)

    def _response_done(self, at: EmuEngine, wr: EmuWorkRequest) -> None:
        at.responses.popleft()
        at._resp_active = False
        wr.status = Status.SUCCESS
        req = at.peer
        self._complete_in_order(req)
        self._advance_sq(req)  # a fenced request may now go
        self._advance_responses(at)

    # ---- requester completions and failures --------------------------------------------------------------

    def _complete_in_order(self, conn: EmuEngine) -> None:
        conn.completions.drain()

    def _fail(self, requester: EmuEngine, culprit: EmuWorkRequest, term: Terminate, status: Status) -> None:
        """The Data Sink / responder sent a Terminate: the culprit fails, everything else is flushed."""
        self._close(requester, ConnState.ERROR, term, culprit, status)

    def _close(
        self,
        conn: EmuEngine,
        state: ConnState,
        term: Terminate | None,
        culprit: EmuWorkRequest | None,
        status: Status | None,
    ) -> None:
        link = conn.link
        self.runtime.drop_link(link)
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
            self.runtime.events.append((end.name, term))
            end.completions.flush(term, list(end.rq), culprit=culprit if end is conn else None,
                                  status=status if end is conn else None)
            end.rq.clear()



class EmuFabric(RuntimeFabric):
    """The emulated fabric: nodes, connections, actors and the step loop (implements ``Fabric``).

    ``seed`` selects `RandomScheduler(seed)` unless ``scheduler`` is given (``FifoScheduler`` when both
    are None). ``trace=True`` keeps a full step trace for `write_trace`; the schedule (labels) is
    always kept in `schedule`. Nodes, CQs and actors are the fabric's `Runtime`, the NIC steps its `EmuNic`.
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
        if scheduler is None:
            scheduler = FifoScheduler() if seed is None else RandomScheduler(seed)
        super().__init__(profile, scheduler, trace=trace, max_steps=max_steps)
        self.tick = tick
        self._links: list[tuple[EmuConnection, EmuConnection]] = []
        self._tracing = trace
        self.nic = EmuNic(self.runtime, profile, trace=trace)

    # ---- construction ------------------------------------------------------------------------------------

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
            if node.has_connection(ep_name):
                raise FabricUsageError(f"connect: endpoint {ep_name!r} exists; pass name=")
            cq = cq or self.runtime.new_cq(f"{ep_name}.cq")
            conn = EmuConnection(self, node, ep_name, link, cq)
            node.add_connection(conn)
            ends.append(conn)
        ends[0].engine.peer, ends[1].engine.peer = ends[1].engine, ends[0].engine
        ends[0].peer_name, ends[1].peer_name = ends[1].name, ends[0].name
        self._links.append((ends[0], ends[1]))
        return ends[0], ends[1]

    # ---- the step loop -----------------------------------------------------------------------------------

    def run(self, *, max_steps: int | None = None) -> RunResult:
        """Run steps until nothing can run (quiescent) or ``max_steps``; raise `ActorFailed` if an actor raised.

        Timers keep the run going only while a non-daemon actor is unfinished, so a daemon's periodic
        sleep (a reclaim timer) does not keep an otherwise finished run alive.
        """
        reason = self._loop(None, None, self.max_steps if max_steps is None else max_steps)
        return RunResult(self.steps, "max_steps" if reason == "max_steps" else "quiescent", self.runtime.blocked())

    def _loop(self, stop: Callable[[], bool] | None, deadline: float | None, max_steps: int) -> str:
        rt = self.runtime
        limit = rt.steps + max_steps
        enabled = rt.enabled
        choose = self.scheduler.choose
        schedule = rt.schedule
        tick = self.tick
        until = rt.until  # both lists are only ever mutated in place
        timers = rt.timers
        while True:
            if stop is not None and stop():
                return "predicate"
            if deadline is not None and rt.now >= deadline:
                return "timeout"
            if until:
                rt.check_until()
            if timers and timers[0][0] <= rt.now:
                rt.fire_timers()
            if not enabled:
                # daemon timers advance time only for a bounded wait or an unfinished non-daemon actor
                if not timers or (deadline is None and not rt.blocked()):
                    return "quiescent"
                rt.now = max(rt.now, timers[0][0])
                if deadline is not None and rt.now > deadline:
                    rt.now = deadline
                    return "timeout"
                rt.fire_timers()
                continue
            if rt.steps >= limit:
                return "max_steps"
            step = enabled.pop(choose(enabled))
            rt.steps += 1
            rt.now += tick
            schedule.append(step.label)
            if self._tracing:
                rt.pending_notes = []
                step.fn()
                rt.trace.append(
                    {
                        "step": rt.steps,
                        "t": round(rt.now, 9),
                        "label": step.label,
                        "who": step.who,
                        "effects": rt.pending_notes,
                    }
                )
            else:
                step.fn()
            if rt.failure is not None:
                raise rt.failure


if TYPE_CHECKING:  # the contract it implements, checked by mypy
    _CONTRACT: type[Engine] = EmuEngine
