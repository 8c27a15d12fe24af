"""The race engine: one scenario under many seeded interleavings of the emulated fabric (§8 items 3 and 5).

A *scenario* is a function that builds nodes, connections and actors on a fresh `EmuFabric` and
returns a *check*: a function called after the run that returns the observed outcome (anything with a
stable ``repr``) or raises ``AssertionError`` when an invariant is broken. The engine knows nothing of
the protocol on top; the KBTP suites bring the scenarios and invariants.

    def scenario(fab: EmuFabric) -> Callable[[], object]:
        ...build, spawn actors...
        return lambda: (check_invariants(), outcome)[1]

    report = explore(scenario, range(2000))
    assert not report.failures, report.failures[0].explain()
    print(report.outcomes)                                  # outcome repr -> number of seeds
    fab = replay(scenario, seed=report.failures[0].seed, trace=True)   # or schedule=...
    fab.write_trace("failing.jsonl")

A run fails when the check raises, an actor raises (`ActorFailed`), a non-daemon actor is still
blocked when nothing can run (deadlock), or the step budget runs out. A failure keeps its seed and
its schedule (the step labels), so it replays either by seed or, after the code under test changed,
by the schedule script (`ScriptScheduler`). `shrink` cuts a failing schedule to a short script that
still fails, by delta debugging over its entries (FIFO fills the gaps).
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

from kvconform.rdma.emulated import EmuFabric
from kvconform.rdma.fabric import ActorFailed
from kvconform.rdma.profiles import RDMAP_7306, Profile
from kvconform.rdma.scheduler import FifoScheduler, RandomScheduler, ScheduleError, Scheduler, ScriptScheduler

Check = Callable[[], object]
Scenario = Callable[[EmuFabric], Check | None]
SchedulerFactory = Callable[[int], Scheduler]


@dataclass(frozen=True, slots=True)
class SeedResult:
    """The outcome of one interleaving; failures carry the schedule that replays them."""

    seed: int
    ok: bool
    outcome: str  # repr of the check's value, or the failure kind and message
    steps: int
    schedule: tuple[str, ...] = ()  # kept for failures
    value: object = field(default=None, compare=False)  # what the check returned

    def explain(self) -> str:
        tail = ", ".join(self.schedule[-12:])
        return f"seed {self.seed} failed after {self.steps} steps: {self.outcome}; last steps: {tail}"


@dataclass(slots=True)
class ExploreReport:
    """Everything `explore` saw: per-outcome counts, the failures, and the speed."""

    runs: int = 0
    steps: int = 0
    elapsed: float = 0.0
    outcomes: Counter[str] = field(default_factory=Counter)  # outcome repr (or "FAIL <kind>") -> seeds
    values: dict[str, object] = field(default_factory=dict)  # outcome repr -> the check's value
    failures: list[SeedResult] = field(default_factory=list)
    results: list[SeedResult] = field(default_factory=list)  # every run, when keep_results=True

    @property
    def interleavings_per_second(self) -> float:
        return self.runs / self.elapsed if self.elapsed > 0 else float("inf")

    def add(self, res: SeedResult, *, keep: bool = False, max_failures: int | None = None) -> bool:
        """Count one seed's run (kept in ``results`` with ``keep``); True when it is a failure that brings the
        failures to ``max_failures`` (time to stop)."""
        self.runs += 1
        self.steps += res.steps
        key = res.outcome if res.ok else "FAIL " + res.outcome.split(":")[0]
        self.outcomes[key] += 1
        if res.ok:
            self.values.setdefault(key, res.value)
        if keep:
            self.results.append(res)
        if res.ok:
            return False
        self.failures.append(res)
        return max_failures is not None and len(self.failures) >= max_failures

    def summary(self) -> str:
        return (
            f"{self.runs} interleavings, {len(self.failures)} failing, {len(self.outcomes)} distinct outcomes, "
            f"{self.steps} steps in {self.elapsed:.3f}s ({self.interleavings_per_second:.0f}/s)"
        )


def run_once(
    scenario: Scenario,
    scheduler: Scheduler,
    *,
    profile: Profile = RDMAP_7306,
    max_steps: int = 100_000,
    trace: bool = False,
) -> tuple[EmuFabric, SeedResult]:
    """Build the scenario on a fresh fabric with ``scheduler``, run it to quiescence and check it."""
    fab = EmuFabric(profile, scheduler=scheduler, trace=trace, max_steps=max_steps)
    seed = scheduler.seed if scheduler.seed is not None else -1
    ok = False
    value: object = None
    try:
        check = scenario(fab)
        result = fab.run()
        if result.reason == "max_steps":
            outcome = f"max_steps: no quiescence within {max_steps} steps"
        elif result.blocked:
            outcome = f"deadlock: {_blocked(fab, result.blocked)}"
        else:
            value = check() if check is not None else None
            outcome, ok = repr(value), True
    except ActorFailed as exc:
        outcome = f"actor {exc.actor} raised {exc.cause!r}"
    except ScheduleError as exc:
        outcome = f"schedule: {exc}"
    except AssertionError as exc:
        outcome = f"check: {exc}"
    return fab, SeedResult(seed, ok, outcome, fab.steps, () if ok else tuple(fab.schedule), value)


def _blocked(fab: EmuFabric, names: Sequence[str]) -> str:
    waits = {a.handle.name: a.handle.waiting for a in fab.runtime.actors}
    return ", ".join(f"{n} waits for {waits.get(n) or '?'}" for n in names)


def explore(
    scenario: Scenario,
    seeds: Iterable[int],
    *,
    profile: Profile = RDMAP_7306,
    scheduler: SchedulerFactory = RandomScheduler,
    max_steps: int = 100_000,
    max_failures: int | None = None,
    keep_results: bool = False,
) -> ExploreReport:
    """Run ``scenario`` once per seed (``scheduler(seed)`` picks the interleaving) and collect outcomes.

    Stops early after ``max_failures`` failures when given. Each seed is independent and replayable.
    """
    report = ExploreReport()
    start = time.perf_counter()
    for seed in seeds:
        _, res = run_once(scenario, scheduler(seed), profile=profile, max_steps=max_steps)
        res = SeedResult(seed, res.ok, res.outcome, res.steps, res.schedule, res.value)
        if report.add(res, keep=keep_results, max_failures=max_failures):
            break
    report.elapsed = time.perf_counter() - start
    return report


def replay(
    scenario: Scenario,
    *,
    seed: int | None = None,
    schedule: Sequence[str] | None = None,
    profile: Profile = RDMAP_7306,
    scheduler: SchedulerFactory = RandomScheduler,
    trace: bool = True,
    max_steps: int = 100_000,
) -> tuple[EmuFabric, SeedResult]:
    """Re-run one interleaving, by seed (same scheduler factory as `explore`) or by schedule script."""
    if (seed is None) == (schedule is None):
        raise ValueError("replay: give exactly one of seed= or schedule=")
    sched: Scheduler = scheduler(seed) if seed is not None else ScriptScheduler(schedule or ())
    return run_once(scenario, sched, profile=profile, max_steps=max_steps, trace=trace)


def shrink(
    scenario: Scenario,
    schedule: Sequence[str],
    *,
    profile: Profile = RDMAP_7306,
    max_runs: int = 2_000,
    still_fails: Callable[[SeedResult], bool] | None = None,
) -> list[str]:
    """A short schedule script that still fails: ddmin over the entries, FIFO filling the gaps.

    ``still_fails`` decides whether a candidate reproduces the failure (default: the same failure kind
    as the original, ignoring schedule errors).
    """
    budget = 10 * len(schedule) + 1_000  # a candidate that spins under FIFO must not run for long
    _, first = run_once(scenario, ScriptScheduler(schedule, FifoScheduler()), profile=profile, max_steps=budget)
    if first.ok:
        raise ValueError("shrink: the schedule does not fail")
    kind = first.outcome.split(":")[0]

    def fails(script: Sequence[str]) -> bool:
        _, res = run_once(scenario, ScriptScheduler(script, FifoScheduler()), profile=profile, max_steps=budget)
        if still_fails is not None:
            return still_fails(res)
        return not res.ok and not res.outcome.startswith("schedule") and res.outcome.split(":")[0] == kind

    return ddmin(schedule, fails, max_runs=max_runs)


def ddmin(schedule: Sequence[str], fails: Callable[[Sequence[str]], bool], *, max_runs: int = 2_000) -> list[str]:
    """Delta debugging over a schedule's entries: the shortest sub-list found for which ``fails`` still holds.

    The search `shrink` runs, without the fabric: any seeded runtime whose schedules replay by `ScriptScheduler`
    (the MOQT deterministic transport, `kvconform.moqt.simexplore`) shrinks its failures with it."""
    current = list(schedule)
    runs = 0
    n = 2
    while len(current) >= 2 and runs < max_runs:
        size = -(-len(current) // n)
        reduced = False
        for i in range(0, len(current), size):
            candidate = current[:i] + current[i + size :]
            runs += 1
            if fails(candidate):
                current, n, reduced = candidate, max(n - 1, 2), True
                break
            if runs >= max_runs:
                break
        if not reduced:
            if size == 1:
                break
            n = min(len(current), n * 2)
    return current
