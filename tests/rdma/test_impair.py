"""The impairment stage of the wire links (kvconform.rdma.wire.impair): its specification, its seeded decisions
(the same seed replays them), its timers, and what it means per binding."""

from __future__ import annotations

import pytest

from kvconform.rdma.wire.impair import Impairer, Impairment, ImpairmentError


def test_specification_round_trips() -> None:
    spec = Impairment.parse("loss=1%,reorder=0.01,dup=0.02,delay=5ms,split=0.5,seed=7")
    assert (spec.loss, spec.reorder, spec.dup, spec.delay, spec.split, spec.seed) == (0.01, 0.01, 0.02, 0.005, 0.5, 7)
    assert Impairment.parse(spec.spec()) == spec
    assert not Impairment.parse("seed=3").active


@pytest.mark.parametrize("bad", ["loss=2", "delay=fast", "jitter=1ms", "loss", "delay=20s", "seed=x"])
def test_bad_specifications_are_refused(bad: str) -> None:
    with pytest.raises(ImpairmentError):
        Impairment.parse(bad)


def _datagrams(spec: str, n: int = 2000) -> tuple[list[tuple[float, bytes]], Impairer]:
    stage = Impairer(Impairment.parse(spec), "roce")
    got: list[tuple[float, bytes]] = []
    now = 0.0

    def deliver(p: bytes) -> None:
        got.append((now, p))

    for i in range(n):
        now = i * 0.001
        stage.poll(now)
        stage.datagram("c>", i.to_bytes(4, "big"), deliver, now)
    while (due := stage.next_deadline()) is not None:
        stage.poll(due)
    return got, stage


def test_decisions_replay_with_the_seed_and_differ_without() -> None:
    a, sa = _datagrams("loss=0.05,reorder=0.05,dup=0.05,seed=11")
    b, sb = _datagrams("loss=0.05,reorder=0.05,dup=0.05,seed=11")
    c, _ = _datagrams("loss=0.05,reorder=0.05,dup=0.05,seed=12")
    assert sa.log == sb.log and [p for _, p in a] == [p for _, p in b]
    assert sa.log != _datagrams("loss=0.05,reorder=0.05,dup=0.05,seed=12")[1].log and a != c
    counts = sa.counts
    assert 60 < counts["loss"] < 140 and counts["pass"] > 1500, counts  # 5 % of 2000, roughly


def test_loss_duplication_and_reordering_are_what_they_say() -> None:
    got, stage = _datagrams("loss=0.1,dup=0.1,reorder=0.1,seed=5")
    payloads = [p for _, p in got]
    lost = {n for link, n, what in stage.log if what == "loss"}
    assert len(payloads) == 2000 - len(lost) + sum("dup" in what for _, _, what in stage.log)
    assert all((n - 1).to_bytes(4, "big") not in payloads for n in lost)
    order = [int.from_bytes(p, "big") for p in payloads]
    assert order != sorted(order)  # reordered ...
    assert sorted(set(order)) == sorted(set(range(2000)) - {n - 1 for n in lost})  # ... and nothing else lost


def test_delay_keeps_order_and_uses_timers() -> None:
    stage = Impairer(Impairment.parse("delay=5ms"), "roce")
    got: list[bytes] = []
    stage.datagram("c>", b"1", got.append, 0.0)
    stage.datagram("c>", b"2", got.append, 0.001)
    assert got == [] and stage.next_deadline() == pytest.approx(0.005)
    stage.poll(0.0055)
    assert got == [b"1"]
    stage.poll(0.0065)
    assert got == [b"1", b"2"] and stage.next_deadline() is None


def test_a_stream_is_stalled_and_cut_in_order_never_lost() -> None:
    """iWARP: TCP recovers loss below MPA, so a lost segment stalls the stream for the RTO; a cut chunk arrives as
    two pieces; the bytes arrive complete and in order."""
    stage = Impairer(Impairment.parse("loss=0.2,reorder=0.2,dup=0.2,split=0.5,rto=50ms,hold=2ms,seed=3"), "iwarp")
    got: list[bytes] = []
    chunks = [bytes([i]) * (1 + i % 7) for i in range(200)]
    for i, c in enumerate(chunks):
        stage.poll(i * 0.001)
        stage.stream("c>", c, got.append, i * 0.001)
    while (due := stage.next_deadline()) is not None:
        stage.poll(due)
    assert b"".join(got) == b"".join(chunks)
    assert len(got) > len(chunks)  # some were cut
    whats = {what.split("+")[0] for _, _, what in stage.log}
    assert {"loss:stall", "reorder:stall"} <= whats and any("dup:absorbed" in w for _, _, w in stage.log)


def test_the_end_of_a_connection_waits_for_what_is_held() -> None:
    stage = Impairer(Impairment.parse("delay=5ms"), "iwarp")
    events: list[str] = []
    stage.stream("c<", b"terminate", lambda d: events.append("data"), 0.0)
    stage.after(["c<"], lambda: events.append("end"), 0.001)
    stage.poll(1.0)
    assert events == ["data", "end"]
    stage.after(["c<"], lambda: events.append("end again"), 1.0)  # nothing held: at once
    assert events[-1] == "end again"
