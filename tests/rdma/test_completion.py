"""The one completion-and-flush rule every engine uses (kvconform.rdma.completion)."""

from __future__ import annotations

from dataclasses import dataclass

from kvconform.rdma.completion import InOrderCompletions
from kvconform.rdma.fabric import Completion, Layer, Op, Status, Terminate


@dataclass(eq=False)
class _Rec:
    wr_id: int
    op: Op = Op.SEND
    signaled: bool = True
    byte_len: int = 16
    status: Status | None = None
    terminate: Terminate | None = None


def _rule() -> tuple[InOrderCompletions[_Rec], list[Completion]]:
    out: list[Completion] = []
    return InOrderCompletions("ep", out.append), out


TERM = Terminate(Layer.LLP, 0, 0, "why", "peer")


def test_completions_come_in_post_order_and_a_successful_unsignaled_wr_gives_none() -> None:
    rule, out = _rule()
    first, second, third = _Rec(1), _Rec(2, signaled=False), _Rec(3, op=Op.RDMA_READ, byte_len=64)
    for rec in (first, second, third):
        rule.append(rec)
    third.status = Status.SUCCESS
    rule.drain()
    assert out == []  # the third waits for the first
    first.status = second.status = Status.SUCCESS
    rule.drain()
    assert [(wc.wr_id, wc.byte_len) for wc in out] == [(1, 16), (3, 64)] and len(rule) == 0


def test_a_failure_completes_the_culprit_with_the_terminate_and_flushes_the_rest_then_the_recvs() -> None:
    rule, out = _rule()
    done, culprit, later = _Rec(1, signaled=False), _Rec(2), _Rec(3)
    for rec in (done, culprit, later):
        rule.append(rec)
    done.status = Status.SUCCESS
    rule.flush(TERM, [(7, None), (8, None)], culprit=culprit, status=Status.REM_ACCESS_ERR)
    assert [(wc.wr_id, wc.op, wc.status, wc.terminate, wc.byte_len) for wc in out] == [
        (2, Op.SEND, Status.REM_ACCESS_ERR, TERM, 0),
        (3, Op.SEND, Status.WR_FLUSH_ERR, None, 0),
        (7, Op.RECV, Status.WR_FLUSH_ERR, None, 0),
        (8, Op.RECV, Status.WR_FLUSH_ERR, None, 0),
    ]


def test_without_a_culprit_the_first_flushed_completion_says_why() -> None:
    rule, out = _rule()
    rule.flush(TERM, [(7, None), (8, None)])
    assert [(wc.wr_id, wc.terminate) for wc in out] == [(7, TERM), (8, None)]
    rule, out = _rule()
    rule.append(_Rec(1))
    rule.flush(None, [(7, None)])  # an orderly close names no Terminate
    assert [(wc.wr_id, wc.status, wc.terminate) for wc in out] == [
        (1, Status.WR_FLUSH_ERR, None), (7, Status.WR_FLUSH_ERR, None)]
