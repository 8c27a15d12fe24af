"""Determinism: a seed replays to the same JSONL trace; a schedule script forces or replays an interleaving."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from kvconform.rdma import (
    Access,
    ActorFailed,
    ActorGen,
    EmuFabric,
    FifoScheduler,
    PctScheduler,
    RandomScheduler,
    Scheduler,
    ScriptScheduler,
    pause,
    replay,
    run_once,
    sleep,
    wait_completion,
    wait_completion_for,
    wait_until,
)
from tests.rdma.scenarios import lost_update, tickets

ROOT = Path(__file__).resolve().parents[2]


def jsonl(fab: EmuFabric) -> str:
    out = io.StringIO()
    fab.write_trace(out)
    return out.getvalue()


def traced(seed: int) -> str:
    fab, res = replay(tickets, seed=seed)
    assert res.ok, res.outcome
    return jsonl(fab)


def test_same_seed_same_trace() -> None:
    first = traced(11)
    assert first == traced(11)
    lines = first.splitlines()
    header = json.loads(lines[0])
    assert header["seed"] == 11 and header["scheduler"]["policy"] == "random"
    steps = [json.loads(line) for line in lines[1:]]
    assert [s["step"] for s in steps] == list(range(1, len(steps) + 1))
    assert any(e["do"] == "fetch_add" for s in steps for e in s["effects"])
    assert len({traced(seed) for seed in range(12, 20)}) > 1


def test_recorded_schedule_replays_exactly() -> None:
    fab, res = replay(tickets, seed=5)
    again, res2 = replay(tickets, schedule=fab.schedule)
    assert res2.outcome == res.outcome
    assert again.schedule == fab.schedule
    assert again.trace == fab.trace  # identical steps and effects; only the header names the policy


def test_script_forces_the_lost_update() -> None:
    """A three-entry script holds T's write-back until the NIC's FetchAdd has executed."""
    script = ["T", "T-I.I/fetch_add1:atomic", "T:rmw"]
    fab, res = run_once(lost_update, ScriptScheduler(script), trace=True)
    assert not res.ok and "increment was lost" in res.outcome
    assert fab.schedule.index("T-I.I/fetch_add1:atomic") < fab.schedule.index("T:rmw")
    _, fine = run_once(lost_update, ScriptScheduler(["T", "T:rmw"]))
    assert fine.ok and fine.outcome == "2"


def test_script_that_cannot_be_followed_reports_why() -> None:
    _, res = run_once(lost_update, ScriptScheduler(["T-I.I/fetch_add1:atomic", "I"]))
    assert not res.ok and res.outcome.startswith("schedule:") and "'I'" in res.outcome


def test_actor_exception_carries_seed_and_step() -> None:
    fab = EmuFabric(seed=99)

    def bad() -> ActorGen:
        yield from pause()
        raise RuntimeError("boom")

    fab.spawn("bad", bad())
    with pytest.raises(ActorFailed) as info:
        fab.run()
    assert (info.value.actor, info.value.seed, info.value.step) == ("bad", 99, 2)
    assert isinstance(info.value.cause, RuntimeError)


def test_timeouts_and_sleep_use_fabric_time() -> None:
    fab = EmuFabric(scheduler=FifoScheduler())
    node = fab.node("N")
    cq = node.create_cq()
    seen: list[object] = []

    def waiter() -> ActorGen:
        wc = yield from wait_completion_for(cq, 0.25)
        seen.append((wc, fab.now >= 0.25))
        yield from sleep(1.0)
        seen.append(fab.now >= 1.25)
        ok = yield from wait_until(lambda: False, "never", timeout=0.5)
        seen.append(ok)
        flag = [False]

        def setter() -> ActorGen:
            yield from pause()
            flag[0] = True

        fab.spawn("setter", setter())
        seen.append((yield from wait_until(lambda: flag[0], "flag")))

    fab.spawn("waiter", waiter())
    result = fab.run()
    assert result.blocked == ()
    assert seen == [(None, True), True, False, True]


def test_deadlock_is_reported_with_what_the_actor_waits_for() -> None:
    def scenario(fab: EmuFabric) -> None:
        cq = fab.node("N").create_cq("lonely")

        def stuck() -> ActorGen:
            yield from wait_completion(cq)

        fab.spawn("stuck", stuck())

    _, res = run_once(scenario, RandomScheduler(1))
    assert not res.ok and res.outcome.startswith("deadlock") and "completion on lonely" in res.outcome


def test_trace_is_identical_across_processes() -> None:
    """No hash-order or address dependence: two interpreters with different hash seeds write the same trace."""
    code = (
        "import sys; from kvconform.rdma import replay; from tests.rdma.scenarios import tickets; "
        "fab, _ = replay(tickets, seed=21); fab.write_trace(sys.stdout)"
    )
    outs = []
    for hashseed in ("1", "2"):
        env = {**os.environ, "PYTHONHASHSEED": hashseed}
        proc = subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=60, check=True, cwd=ROOT
        )
        outs.append(proc.stdout)
    assert outs[0] == outs[1] and outs[0].count("\n") > 40


@pytest.mark.parametrize("policy", [RandomScheduler, PctScheduler])
def test_every_seeded_policy_replays(policy: Callable[[int], Scheduler]) -> None:
    runs = [run_once(tickets, policy(seed))[0].schedule for seed in (3, 3, 4)]
    assert runs[0] == runs[1]
    assert runs[0] and runs[2]
    header = EmuFabric(scheduler=policy(3)).trace_header()
    assert header["seed"] == 3 and header["scheduler"]["seed"] == 3


def test_run_until_drives_the_fabric_without_actors() -> None:
    fab = EmuFabric(seed=4)
    a, b = fab.node("A"), fab.node("B")
    ca, cb = fab.connect(a, b)
    rx = b.register(b.alloc(8), Access.LOCAL_WRITE)
    cb.post_recv(rx.sge(0, 8))
    ca.post_send(b"ping")
    assert fab.run_until(lambda: len(cb.cq) > 0, timeout=1.0)
    assert rx.read(0, 4) == b"ping"
    assert not fab.run_until(lambda: len(cb.cq) > 1, timeout=1.0)  # nothing more comes: quiescent


def test_daemon_timer_does_not_keep_a_finished_run_alive() -> None:
    fab = EmuFabric(seed=1)
    ticks: list[float] = []

    def reclaimer() -> ActorGen:
        while True:
            yield from sleep(0.1)
            ticks.append(fab.now)

    def worker() -> ActorGen:
        yield from sleep(0.35)

    fab.spawn("reclaimer", reclaimer(), daemon=True)
    fab.spawn("worker", worker())
    result = fab.run(max_steps=1_000)
    assert result.reason == "quiescent" and result.blocked == ()
    assert len(ticks) == 3  # the daemon ran while the worker waited, then the run ended
    assert not fab.run_until(lambda: False) and len(ticks) == 3
    assert fab.run_until(lambda: len(ticks) == 5, timeout=1.0) and 0.5 <= fab.now < 0.6
    assert not fab.run_until(lambda: False, timeout=0.25) and len(ticks) == 7
