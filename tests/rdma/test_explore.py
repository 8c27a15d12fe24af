"""The race engine: many seeded interleavings, failures kept with seed and schedule, replay and shrink."""

from __future__ import annotations

import time

from kvconform.rdma import (
    IB_RC_MASKED,
    PctScheduler,
    ScriptScheduler,
    explore,
    replay,
    run_once,
    shrink,
)
from tests.rdma.scenarios import lost_update, tickets


def test_thousand_interleavings_quickly() -> None:
    start = time.perf_counter()
    report = explore(tickets, range(1000))
    elapsed = time.perf_counter() - start
    assert report.runs == 1000 and not report.failures, report.failures[:1]
    # the interleavings differ: A gets different tickets under different seeds
    assert len(report.outcomes) > 5, report.outcomes
    # generous bound for a shared 2-core CI machine; the measured rate is in report.summary()
    assert elapsed < 60, report.summary()
    print(report.summary())


def test_explore_finds_the_lost_update_and_replays_it() -> None:
    report = explore(lost_update, range(200))
    assert report.failures and report.outcomes["2"] > 0, report.outcomes
    fail = report.failures[0]
    assert "increment was lost" in fail.outcome and fail.schedule
    by_seed_fab, by_seed = replay(lost_update, seed=fail.seed)
    assert by_seed.outcome == fail.outcome and tuple(by_seed_fab.schedule) == fail.schedule
    by_script_fab, by_script = replay(lost_update, schedule=fail.schedule)
    assert by_script.outcome == fail.outcome and tuple(by_script_fab.schedule) == fail.schedule


def test_max_failures_stops_early() -> None:
    report = explore(lost_update, range(10_000), max_failures=3)
    assert len(report.failures) == 3 and report.runs < 10_000


def test_shrink_keeps_a_failing_shorter_script() -> None:
    fail = explore(lost_update, range(200), max_failures=1).failures[0]
    script = shrink(lost_update, fail.schedule)
    assert len(script) < len(fail.schedule)
    _, res = run_once(lost_update, ScriptScheduler(script))
    assert not res.ok and "increment was lost" in res.outcome


def test_other_policies_and_profiles_plug_in() -> None:
    pct = explore(tickets, range(200), scheduler=PctScheduler)
    assert not pct.failures and len(pct.outcomes) > 1
    masked_ib = explore(tickets, range(50), profile=IB_RC_MASKED)
    assert not masked_ib.failures
