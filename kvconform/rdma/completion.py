"""The one completion-and-flush rule every binding's engine keeps (`kvconform.rdma.engine`, rdma-bindings §8).

- Requester completions are produced in post order: a WR whose outcome is known waits for every earlier one.
- A successful unsignaled WR produces none; an error always does.
- A successful completion carries the WR's length (a Read's destination, 8 for an atomic, else the data sent);
  an unsuccessful one carries 0 (verbs leave ``byte_len`` undefined on error).
- When the connection fails or closes, every WR without an outcome completes ``WR_FLUSH_ERR``, then every
  posted Recv (the one being received into first) completes ``WR_FLUSH_ERR``, in post order. The culprit of
  a remote error completes with its own status and the Terminate; with no culprit (an error this end
  detected, a transport that ended) the first flushed completion carries the Terminate, so a reader of the
  CQ sees why.

The emulated fabric, the iWARP and RoCEv2 engines all complete through `InOrderCompletions`; the verbs
engine's completions are the device's own.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable, Iterator
from typing import Generic, Protocol, TypeVar

from kvconform.rdma.engine import WorkRequest
from kvconform.rdma.fabric import Completion, Op, Sge, Status, Terminate

_READ = Op.RDMA_READ
_FETCH_ADD = Op.FETCH_ADD
_COMP_SWAP = Op.COMP_SWAP
_SUCCESS = Status.SUCCESS
_FLUSH = Status.WR_FLUSH_ERR


class Outcome(Protocol):
    """A send-queue WR from post to completion, as the rule reads it (each engine keeps its own record)."""

    status: Status | None  # None until the WR's outcome is known
    terminate: Terminate | None  # the Terminate its completion carries

    @property
    def wr_id(self) -> int: ...
    @property
    def op(self) -> Op: ...
    @property
    def signaled(self) -> bool: ...
    @property
    def byte_len(self) -> int:
        """What a successful completion reports (`wr_byte_len`)."""
        ...


R = TypeVar("R", bound=Outcome)


class HoldsWorkRequest:
    """The part of an `Outcome` a wire engine's record reads off the `WorkRequest` it holds as ``wr`` (a mixin of
    the iWARP and RoCEv2 engines' records; no slots of its own, so slotted dataclasses can take it)."""

    __slots__ = ()
    wr: WorkRequest

    @property
    def wr_id(self) -> int:
        return self.wr.wr_id

    @property
    def op(self) -> Op:
        return self.wr.op

    @property
    def signaled(self) -> bool:
        return self.wr.signaled

    @property
    def byte_len(self) -> int:
        return wr_byte_len(self.wr.op, self.wr.dst, self.wr.data)


def wr_byte_len(op: Op, dst: Sge | None, data: bytes) -> int:
    """The length a successful completion of a WR reports."""
    if op is _READ and dst is not None:
        return dst.length
    if op is _FETCH_ADD or op is _COMP_SWAP:
        return 8
    return len(data)


def flushed(wr_id: int, op: Op, name: str, terminate: Terminate | None = None) -> Completion:
    """The completion of a WR flushed without being executed (posted to a connection that is not up, or
    outstanding when it failed)."""
    return Completion(wr_id, op, _FLUSH, name, terminate=terminate)


class InOrderCompletions(Generic[R]):
    """The requester WRs of one connection endpoint from post to completion, completed by the rule above.

    ``emit`` receives each completion as it is produced (a CQ, or an engine's list of completions to hand out).
    """

    __slots__ = ("emit", "name", "pending")

    def __init__(self, name: str, emit: Callable[[Completion], None]) -> None:
        self.name = name
        self.emit = emit
        self.pending: deque[R] = deque()  # posted, completion not yet produced (post order)

    def __len__(self) -> int:
        return len(self.pending)

    def __iter__(self) -> Iterator[R]:
        return iter(self.pending)

    def append(self, rec: R) -> None:
        self.pending.append(rec)

    def drain(self) -> None:
        """Complete the oldest WRs whose outcome is known, stopping at the first that is still open."""
        pending = self.pending
        emit = self.emit
        while pending:
            rec = pending[0]
            status = rec.status
            if status is None:
                return
            pending.popleft()
            if status is _SUCCESS:
                if rec.signaled:
                    emit(Completion(rec.wr_id, rec.op, status, self.name, byte_len=rec.byte_len,
                                    terminate=rec.terminate))
            else:
                emit(Completion(rec.wr_id, rec.op, status, self.name, terminate=rec.terminate))

    def flush(self, term: Terminate | None, recvs: Iterable[tuple[int, Sge | None]] = (), *,
              culprit: R | None = None, status: Status | None = None) -> None:
        """The connection ended (``term``: why; None for an orderly close): ``culprit`` (the WR the peer's
        error names) completes with ``status`` and ``term``, every other open WR and then every Recv of
        ``recvs`` (in post order) with ``WR_FLUSH_ERR``; with no culprit, the first of them carries ``term``."""
        announce = term is not None
        if culprit is not None and status is not None:
            culprit.status, culprit.terminate = status, term
            announce = False
        for rec in self.pending:
            if rec.status is None:
                rec.status = _FLUSH
                rec.terminate = term if announce else None
                announce = False
        self.drain()
        for wr_id, _ in recvs:
            self.emit(flushed(wr_id, Op.RECV, self.name, term if announce else None))
            announce = False
