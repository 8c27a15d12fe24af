"""Posting in the in-process runtime: the verbs rules every endpoint checks locally when a work request is posted,
whatever engine carries the `kvconform.rdma.engine.WorkRequest` afterwards."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections import deque
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from kvconform.rdma.completion import flushed
from kvconform.rdma.engine import WorkRequest
from kvconform.rdma.fabric import (
    POST_METHOD,
    U64,
    Access,
    ConnState,
    FabricUsageError,
    LocalData,
    Op,
    SendWr,
    Sge,
    Terminate,
)
from kvconform.rdma.profiles import Binding, Profile

if TYPE_CHECKING:
    from kvconform.rdma.runtime.cq import EmuCQ
    from kvconform.rdma.runtime.memory import EmuNode

OP_NAME = {op: op.name.lower() for op in Op}  # enum attribute access is slow on the hot path
_LOCAL_WRITE = int(Access.LOCAL_WRITE)


def gather(src: list[Sge]) -> bytes:
    """The data a Send or RDMA Write carries, its source SGEs read now."""
    return b"".join(s.read() for s in src)


class PostingEndpoint(ABC):
    """The posting half of `kvconform.rdma.fabric.Connection`: each post is checked locally (SGEs valid on this
    node, the profile offers the operation) and becomes a `WorkRequest` (of the endpoint's ``request_type``)
    handed to the endpoint's `_post`; a Send's or Write's SGEs are read where the engine reads them.

    An endpoint class adds its state, ``_post`` (where the WR goes) and ``_recv_posted`` (a Recv was queued)."""

    request_type: type[WorkRequest] = WorkRequest  # what the endpoint's engine keeps per WR

    def __init__(self, node: EmuNode, name: str, cq: EmuCQ) -> None:
        self.node = node
        self.name = name
        self.cq = cq
        self.profile: Profile = node.profile
        self.peer_name = ""
        self._seq = 0
        self.rq: deque[tuple[int, Sge | None]] = deque()  # posted receives not yet consumed
        # Called the moment a receive completes (a Send or a Write with Immediate delivered), before anything that
        # arrived after it is placed: a check that must see memory as it was at delivery reads it here, since a
        # wire hands a batch of arrivals' completions to the CQ only after the whole batch is placed.
        self.on_deliver: Callable[[], None] | None = None

    @property
    @abstractmethod
    def state(self) -> ConnState: ...

    @property
    @abstractmethod
    def terminate(self) -> Terminate | None:
        """The Terminate that ended the connection (None while it is up or after an orderly close)."""

    @abstractmethod
    def disconnect(self) -> None:
        """Orderly close; outstanding work is flushed."""

    @abstractmethod
    def _post(self, wr: WorkRequest) -> int:
        """Hand ``wr`` to the endpoint's engine (or complete it flushed); its ``wr_id``."""

    @abstractmethod
    def _recv_posted(self, wr_id: int, sge: Sge | None) -> None:
        """A Recv was queued in `rq` (an engine that keeps its own receive queue takes it here)."""

    # ---- posting (non-blocking; local misuse raises, everything remote completes) -----------------

    def _new(self, kind: Op, wr_id: int, tag: str | None, signaled: bool, fence: bool) -> WorkRequest:
        self._seq += 1
        return self.request_type(kind, wr_id, tag or f"{OP_NAME[kind]}{self._seq}", signaled, fence)

    def _local(self, sge: Sge, need_write: bool, what: str) -> None:
        region = sge.region
        if region.node != self.node.name or self.node.stags.get(region.stag) is not region:
            raise FabricUsageError(
                f"{what}: SGE region stag {region.stag:#x} is not a valid region of {self.node.name}"
            )
        if sge.offset < 0 or sge.length < 0 or sge.offset + sge.length > region.length:
            raise FabricUsageError(
                f"{what}: SGE [{sge.offset}, +{sge.length}) outside region stag {region.stag:#x} "
                f"of {region.length} octets"
            )
        if need_write and not int(region.access) & _LOCAL_WRITE:
            raise FabricUsageError(f"{what}: region stag {region.stag:#x} lacks LOCAL_WRITE")

    def _carry(self, wr: WorkRequest, data: LocalData, what: str) -> None:
        """What a Send or Write carries: inline bytes (``wr.data``), or checked source SGEs (``wr.src``)."""
        if isinstance(data, bytes | bytearray | memoryview):
            wr.data = bytes(data)
            return
        sges = [data] if isinstance(data, Sge) else list(data)
        for sge in sges:
            self._local(sge, False, what)
        wr.src = sges

    def _imm(self, imm: bytes | None, what: str) -> bytes | None:
        if imm is not None and len(imm) != self.profile.immediate_bytes:
            raise FabricUsageError(
                f"{what}: immediate data is {len(imm)} octets; profile {self.profile.name} carries "
                f"{self.profile.immediate_bytes}"
            )
        return None if imm is None else bytes(imm)

    def post_recv(self, sge: Sge | None, wr_id: int = 0) -> int:
        if sge is not None:
            self._local(sge, True, "post_recv")
        if self.state is not ConnState.CONNECTED:
            self.cq.push(flushed(wr_id, Op.RECV, self.name))
            return wr_id
        self.rq.append((wr_id, sge))
        self._recv_posted(wr_id, sge)
        return wr_id

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
    ) -> int:
        if invalidate is not None and not self.profile.send_with_invalidate:
            raise FabricUsageError(f"post_send: profile {self.profile.name} has no Send with Invalidate")
        if imm is not None and self.profile.binding is Binding.RDMAP:
            raise FabricUsageError("post_send: RDMAP carries immediate data only after an RDMA Write (post_write imm=)")
        wr = self._new(Op.SEND, wr_id, tag, signaled, fence)
        self._carry(wr, data, "post_send")
        wr.solicited = solicited
        wr.invalidate = invalidate
        wr.imm = self._imm(imm, "post_send")
        return self._post(wr)

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
    ) -> int:
        wr = self._new(Op.RDMA_WRITE, wr_id, tag, signaled, fence)
        self._carry(wr, data, "post_write")
        wr.stag, wr.to = stag, to
        wr.imm = self._imm(imm, "post_write")
        return self._post(wr)

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
    ) -> int:
        self._local(dst, True, "post_read")
        wr = self._new(Op.RDMA_READ, wr_id, tag, signaled, fence)
        wr.dst, wr.stag, wr.to = dst, stag, to
        return self._post(wr)

    def _atomic(
        self, kind: Op, dst: Sge, stag: int, to: int, wr_id: int, tag: str | None, signaled: bool, fence: bool
    ) -> WorkRequest:
        if not self.profile.atomics:
            raise FabricUsageError(f"{kind.name}: profile {self.profile.name} has no atomic operations")
        self._local(dst, True, kind.name)
        if dst.length != 8:
            raise FabricUsageError(f"{kind.name}: the local SGE must be 8 octets, got {dst.length}")
        wr = self._new(kind, wr_id, tag, signaled, fence)
        wr.dst, wr.stag, wr.to = dst, stag, to
        return wr

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
    ) -> int:
        if mask and not self.profile.masked_atomics:
            raise FabricUsageError(
                f"post_fetch_add: Add Mask {mask:#018x} needs masked atomics (RFC 7306); profile {self.profile.name} "
                "has only the unmasked FetchAdd"
            )
        wr = self._atomic(Op.FETCH_ADD, dst, stag, to, wr_id, tag, signaled, fence)
        wr.add, wr.mask = add & U64, mask & U64
        return self._post(wr)

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
    ) -> int:
        if (compare_mask & U64, swap_mask & U64) != (U64, U64) and not self.profile.masked_atomics:
            raise FabricUsageError(f"post_cmp_swap: masks need masked atomics; profile {self.profile.name} has none")
        wr = self._atomic(Op.COMP_SWAP, dst, stag, to, wr_id, tag, signaled, fence)
        wr.compare, wr.swap = compare & U64, swap & U64
        wr.compare_mask, wr.swap_mask = compare_mask & U64, swap_mask & U64
        return self._post(wr)

    def post_list(self, wrs: Sequence[SendWr]) -> list[int]:
        """Post ``wrs`` in order in one call (`kvconform.rdma.fabric.Connection.post_list`)."""
        return [getattr(self, POST_METHOD[wr.op])(*wr.args, **dict(wr.kwargs)) for wr in wrs]
