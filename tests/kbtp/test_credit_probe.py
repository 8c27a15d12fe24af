"""targets/kbtp_credits.py on stand-ins: how many Sends the probe releases behind a HELLO, how their delivery is
shown on each wire, and what counts as a refusal (the end-to-end runs: tests/kbtp/test_served_mutants.py)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pytest

from kvconform.kbtp.messages import Completion, decode
from kvconform.rdma.fabric import Layer, Terminate
from kvconform.targets.kbtp_credits import EVIDENCE_WR, PROBE_CAP, CreditProbe


@dataclass
class _Wc:
    wr_id: int
    ok: bool = True


@dataclass
class _Cq:
    q: list[_Wc] = field(default_factory=list)

    def take(self, match: Any) -> _Wc | None:
        for wc in self.q:
            if match(wc):
                self.q.remove(wc)
                return wc
        return None


@dataclass
class _Engine:
    terminate: Terminate | None = None


@dataclass
class _Conn:
    name: str = "t"
    posts: list[tuple[str, int, bool, bytes]] = field(default_factory=list)
    cq: _Cq = field(default_factory=_Cq)
    engine: _Engine = field(default_factory=_Engine)

    def post_send(self, data: bytes, wr_id: int = 0, *, signaled: bool = True) -> None:
        self.posts.append(("send", wr_id, signaled, data))

    def post_read(self, dst: Any, stag: int, to: int, wr_id: int = 0, *, signaled: bool = True, tag: str = "") -> None:
        assert dst == (0, 0), "a zero-length Read"
        self.posts.append(("read", wr_id, signaled, b""))


class _Recv:
    def sge(self, offset: int, length: int) -> tuple[int, int]:
        return (offset, length)


@dataclass
class _Session:
    conn: _Conn = field(default_factory=_Conn)
    recv: _Recv = field(default_factory=_Recv)


@pytest.mark.parametrize("binding", ["roce", "iwarp"])
def test_as_many_sends_as_claimed_behind_the_hello_ack(binding: str) -> None:
    s = _Session()
    probe = CreditProbe(binding)
    probe.fire(s, 4)
    sends = [p for p in s.conn.posts if p[0] == "send"]
    assert len(sends) == 3 and probe.sent == 4  # the HELLO_ACK (the target's own) is the fourth
    filler = decode(sends[0][3])
    assert isinstance(filler, Completion) and filler.request_id == 0
    if binding == "roce":  # the last Send's acknowledgement shows every one was placed (RC acks in order)
        assert [p[1:3] for p in s.conn.posts] == [(0, False), (0, False), (EVIDENCE_WR, True)]
    else:  # iWARP acknowledges nothing: a zero-length Read behind them, answered in stream order
        assert s.conn.posts[-1][:3] == ("read", EVIDENCE_WR, True) and len(s.conn.posts) == 4
    probe.fire(_Session(), 8)
    assert probe.claimed == 4, "one probe: the initiator's first HELLO"


def test_a_claim_beyond_the_cap_is_probed_only_that_far() -> None:
    s = _Session()
    probe = CreditProbe("roce")
    probe.fire(s, 0xFFFF)
    assert probe.sent == PROBE_CAP == len(s.conn.posts) + 1 and probe.claimed == 0xFFFF


def _rec(**effect: Any) -> dict[str, Any]:
    return {"step": 1, "effects": [{"who": "t", **effect}]}


def test_refused_on_an_rnr_nak_or_a_no_buffer_terminate_delivered_only_when_shown() -> None:
    for trace in ([_rec(do="rnr-nak", psn=5, timer=1)], [_rec(do="terminate", key=[1, 2, 2], reason="no buffer")]):
        s = _Session()
        probe = CreditProbe("roce")
        probe.fire(s, 4)
        assert probe.judge(trace, "t") and probe.overrun and not probe.delivered
    s = _Session()
    probe = CreditProbe("iwarp")
    probe.fire(s, 4)
    other = [_rec(do="terminate", key=[0, 1, 0], reason="an access error"), _rec(do="rnr-nak", psn=1)]
    other[1]["effects"][0]["who"] = "another connection"
    assert not probe.judge(other, "t"), "neither a refusal of this connection's Sends nor their delivery"
    s.conn.cq.q.append(_Wc(EVIDENCE_WR))
    assert probe.judge(other, "t") and probe.delivered and not probe.overrun
    # the connection's end, should the trace have missed its Terminate's arrival
    s2 = _Session()
    probe = CreditProbe("iwarp")
    probe.fire(s2, 4)
    s2.conn.engine.terminate = Terminate(Layer.DDP, 2, 2, "no buffer", "peer")
    assert probe.judge([], "t") and probe.overrun


def test_a_peer_refusing_the_zero_length_read_itself_has_placed_the_sends_before_it() -> None:
    s = _Session()
    probe = CreditProbe("iwarp")
    probe.fire(s, 4)
    s.conn.engine.terminate = Terminate(Layer.DDP, 1, 0, "invalid STag", "peer")  # DDP tagged: about the Read
    assert probe.judge([], "t") and probe.delivered and not probe.overrun
    s.conn.engine.terminate = Terminate(Layer.DDP, 1, 0, "invalid STag", "t")  # the harness's own: no evidence
    probe.delivered = False
    assert not probe.judge([], "t")


def test_nothing_to_judge_before_a_session_began() -> None:
    assert not CreditProbe("roce").judge([], "t")
