"""The deterministic transport (issue 24 item 3): the virtual-clock loop, the in-memory network scheduled by the RDMA
schedulers, seeded replay of the reference relay with a publisher and subscribers, and a bounded exploration of
its exactly-once fill and cut-through FETCH (CI explores 60 seeds; more: ``tox -e moqt-explore``)."""

from __future__ import annotations

import asyncio
import dataclasses
import os
import subprocess
import sys
from collections.abc import Callable, Sequence

import pytest

from kvconform.moqt import simexplore
from kvconform.moqt.data import EndOfRange, FetchObject
from kvconform.moqt.filters import RangeFilter
from kvconform.moqt.relay import Downstream, FetchWait, Relay, UpstreamFetch
from kvconform.moqt.simclock import VirtualClockLoop, VirtualDeadlock, run_virtual
from kvconform.moqt.simnet import Faults
from kvconform.moqt.simrun import Main, simulate
from kvconform.moqt.simscenarios import relay_authorization, relay_cache_expiry, relay_fill_and_fetch
from kvconform.moqt.structures import Location
from kvconform.rdma.scheduler import FifoScheduler, PctScheduler, RandomScheduler
from tests.mutants import moqt as mutants

# CI explores this many seeds; `tox -e moqt-explore` sets KVCONFORM_MOQT_EXPLORE_SEEDS higher.
SEEDS = int(os.environ.get("KVCONFORM_MOQT_EXPLORE_SEEDS", "60"))


# ---------------------------------------------------------------------------------------------------
# The virtual clock


def test_the_virtual_clock_jumps_to_the_next_timer_and_never_reads_the_machine_clock() -> None:
    async def main(loop: VirtualClockLoop) -> tuple[float, float, bool]:
        await asyncio.sleep(3600 * 0.9)  # an hour's bound, no wall time
        slept = loop.time()
        try:
            await asyncio.wait_for(asyncio.Event().wait(), 5.0)
            timed_out = False
        except TimeoutError:
            timed_out = True
        return slept, loop.time(), timed_out

    slept, after, timed_out = run_virtual(main)
    assert slept == pytest.approx(3240.0) and after == pytest.approx(3245.0) and timed_out


def test_a_wait_without_any_timer_is_a_deadlock_not_a_hang() -> None:
    async def main(loop: VirtualClockLoop) -> None:
        await asyncio.Event().wait()

    with pytest.raises(VirtualDeadlock, match="no task can run and no timer is set"):
        run_virtual(main)


# ---------------------------------------------------------------------------------------------------
# Seeded runs of the reference relay


def test_the_reference_relay_scenario_passes_over_the_in_memory_link() -> None:
    run = simulate(relay_fill_and_fetch(), FifoScheduler())
    assert run.ok, run.outcome
    assert run.value == {"fills": ("fin", "fin"), "sub1": (6, 6), "sub2": (7, 5), "fetch": 12}
    assert run.stats["dropped"] == 0 and run.stats["reordered"] == 0
    assert {who for _, who, _, _, _ in run.transcript} >= {"pub", "sub1", "sub2", "sub3", "relay[pub]"}


def test_same_seed_same_transcript_and_different_seeds_different_schedules() -> None:
    def once(seed: int) -> tuple[str, tuple[str, ...], str]:
        run = simulate(relay_fill_and_fetch(), RandomScheduler(seed),
                       Faults(seed=seed, loss=0.05, duplicate=0.05, jitter_steps=3))
        assert run.ok, run.outcome
        return run.transcript_digest(), run.schedule, run.transcript_text()

    first, again = once(4242), once(4242)
    assert first[1] == again[1], "same seed, different datagram schedule"
    assert first[2] == again[2], "same seed, different transcript"
    assert first[0] == again[0]
    others = {once(seed)[1] for seed in (1, 2, 3)}
    assert len(others | {first[1]}) == 4, "different seeds gave the same schedule"


def test_a_recorded_schedule_replays_the_run_under_the_seed_fault_plan() -> None:
    main = relay_fill_and_fetch()
    by_seed = simexplore.replay(main, 7)
    by_script = simexplore.replay(main, 7, schedule=by_seed.schedule)
    assert by_seed.ok and by_script.ok
    assert by_script.schedule == by_seed.schedule
    assert by_script.transcript_digest() == by_seed.transcript_digest()


# ---------------------------------------------------------------------------------------------------
# Exploration: the exactly-once fill and cut-through FETCH under seeded interleavings with loss and reordering


def test_exploration_the_reference_relay_fills_exactly_once_and_fetches_whole_under_every_seed() -> None:
    report = simexplore.explore(relay_fill_and_fetch(), range(SEEDS), max_failures=1)
    if report.failures:
        failure = report.failures[0]
        script = simexplore.shrink(relay_fill_and_fetch(), failure)
        pytest.fail(simexplore.explain(failure, script))
    assert report.runs == SEEDS
    print(report.summary())


def test_exploration_under_pct_schedules() -> None:
    report = simexplore.explore(relay_fill_and_fetch(), range(SEEDS // 5),
                                scheduler=lambda seed: PctScheduler(seed, depth=3, horizon=150), max_failures=1)
    assert not report.failures, simexplore.explain(report.failures[0])


class LateFillEndRelay(Relay):
    """Mutant: the fill ends at the Largest Object the relay has when the fill is served, not at the LARGEST_OBJECT
    its SUBSCRIBE_OK announced, so an object that arrives in between goes both live and in the fill (a double
    delivery at the fill/live boundary that only some interleavings show)."""

    def fill_items(self, ds: Downstream, start: Location, end: Location, descending: bool,
                   filters: Sequence[RangeFilter], gap_kind: int) -> list[FetchObject | EndOfRange]:
        now = ds.track.cache.largest
        return super().fill_items(ds, start, now if now is not None and now > end else end, descending, filters,
                                  gap_kind)


def test_exploration_catches_a_relay_that_double_delivers_at_the_fill_live_boundary() -> None:
    main = relay_fill_and_fetch(LateFillEndRelay)
    report = simexplore.explore(main, range(SEEDS), max_failures=1)
    assert report.failures, f"the mutant passed {report.runs} seeds: {report.summary()}"
    failure = report.failures[0]
    assert failure.outcome.startswith("check: MOQT-FILL-EXACTLY-ONCE"), failure.outcome
    script = simexplore.shrink(main, failure, max_runs=40)
    assert len(script) < len(failure.schedule)
    again = simexplore.replay(main, failure.seed, schedule=script)
    assert not again.ok and again.outcome.startswith("check: MOQT-FILL-EXACTLY-ONCE"), again.outcome
    print(simexplore.explain(failure, script))


_DIGEST_PROGRAM = """
from kvconform.moqt.simrun import Main, simulate
from kvconform.moqt.simexplore import lossy
from kvconform.moqt.simscenarios import relay_authorization, relay_cache_expiry, relay_fill_and_fetch
from kvconform.rdma.scheduler import RandomScheduler
run = simulate(relay_fill_and_fetch(), RandomScheduler(4242), lossy(4242))
print(run.ok, run.transcript_digest(), len(run.schedule))
"""


def test_a_seed_gives_the_same_transcript_in_another_process_with_another_hash_seed() -> None:
    """Nothing of the run depends on the process: string hashing, the TLS keys and the certificate's key differ."""
    outputs = []
    for hash_seed in ("1", "2"):
        env = {**os.environ, "PYTHONHASHSEED": hash_seed}
        done = subprocess.run([sys.executable, "-c", _DIGEST_PROGRAM], env=env, capture_output=True, text=True,
                              timeout=120, check=True)
        outputs.append(done.stdout.strip())
    assert outputs[0] == outputs[1] and outputs[0].startswith("True "), outputs


class StoreAndForwardRelay(Relay):
    """Mutant: waits for an upstream FETCH to finish before serving any of it (no cut-through)."""

    def _wait_for_fetch(self, fetch: UpstreamFetch, timeout_ms: int | None, until: Callable[[], bool] | None,
                        then: Callable[[bool], None] | None) -> FetchWait:
        return super()._wait_for_fetch(fetch, timeout_ms, None, then)


def test_exploration_catches_a_relay_that_stores_a_whole_fetch_before_serving_it() -> None:
    report = simexplore.explore(relay_fill_and_fetch(StoreAndForwardRelay), range(3), max_failures=1)
    assert report.failures, report.summary()
    outcome = report.failures[0].outcome
    assert outcome.startswith("check: cut-through FETCH: the relay forwarded") and "stores the whole range first" in \
        outcome, outcome


@pytest.mark.parametrize("scenario", [relay_authorization, relay_cache_expiry])
def test_exploration_authorization_and_cache_expiry_hold_under_every_seed(scenario: Callable[..., Main]
                                                                          ) -> None:
    """Nothing out of a token's scope and no expired object is served, whatever the loss, duplication and order."""
    report = simexplore.explore(scenario(), range(SEEDS // 2), max_failures=1)
    if report.failures:
        failure = report.failures[0]
        pytest.fail(simexplore.explain(failure, simexplore.shrink(scenario(), failure, max_runs=40)))
    assert report.runs == SEEDS // 2


@pytest.mark.parametrize(("scenario", "mutant", "requirement"), [
    (relay_authorization, mutants.OpenRelay, "MOQT-AUTH-"),
    (relay_authorization, mutants.OpenFetchRelay, "MOQT-AUTH-FETCH"),
    (relay_authorization, mutants.OpenSubscribeNamespaceRelay, "MOQT-AUTH-SUBSCRIBE-NAMESPACE"),
    (relay_cache_expiry, mutants.CacheForeverRelay, "MOQT-RELAY-MAX-CACHE-DURATION"),
])
def test_the_scenarios_catch_the_relay_mutants(scenario: Callable[..., Main], mutant: type[Relay],
                                               requirement: str) -> None:
    run = simulate(scenario(mutant), FifoScheduler())
    assert not run.ok and run.outcome.startswith(f"check: {requirement}"), run.outcome


def test_stream_interleaving_is_drawn_from_the_seed_and_replays() -> None:
    """With ``interleave`` the streams of one send priority leave in a seeded order (aioquic would round-robin);
    the run still replays from its seed, and without it nothing is reordered at the stream level."""
    plan = simexplore.lossy(7)
    first, again = (simulate(relay_fill_and_fetch(), RandomScheduler(7), plan) for _ in range(2))
    assert first.ok and first.stats["interleaved"] > 0, (first.outcome, first.stats)
    assert first.transcript_digest() == again.transcript_digest()
    plain = simulate(relay_fill_and_fetch(), RandomScheduler(7), dataclasses.replace(plan, interleave=False))
    assert plain.ok and plain.stats["interleaved"] == 0, (plain.outcome, plain.stats)
