"""explore / replay / shrink for MOQT scenarios on the deterministic transport, as `kvconform.rdma.explore` does for
the emulated fabric (issue 24 item 3), and with its types: `SeedResult`, `ExploreReport`, and its delta debugging.

A seed picks both the datagram schedule (``scheduler(seed)``: the RDMA policies) and the fault plan
(``faults(seed)``: loss, duplication, jitter). A failure replays by seed, or by its schedule with the same fault
plan (`ScriptScheduler`, FIFO filling the gaps), and `shrink` cuts that schedule to the few deliveries that still
make it fail. `explain` prints all that for a test's failure message.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Sequence

from kvconform.moqt.simnet import Faults
from kvconform.moqt.simrun import Main, SimResult, simulate
from kvconform.rdma.explore import ExploreReport, SeedResult, ddmin
from kvconform.rdma.scheduler import FifoScheduler, RandomScheduler, Scheduler, ScriptScheduler

__all__ = ["FaultsFactory", "explain", "explore", "lossy", "replay", "shrink"]

FaultsFactory = Callable[[int], Faults]
SchedulerFactory = Callable[[int], Scheduler]


def lossy(seed: int) -> Faults:
    """The exploration's default fault plan: 3 % loss, 3 % duplication, up to 3 ms of jitter (reordering), stream
    interleaving drawn from the seed."""
    return Faults(seed=seed, loss=0.03, duplicate=0.03, jitter_steps=3, interleave=True)


def _seed_result(seed: int, run: SimResult) -> SeedResult:
    return SeedResult(seed, run.ok, run.outcome, len(run.schedule), () if run.ok else run.schedule, run.value)


def explore(main: Main, seeds: Iterable[int], *, scheduler: SchedulerFactory = RandomScheduler,
            faults: FaultsFactory = lossy, max_failures: int | None = None) -> ExploreReport:
    """Run ``main`` once per seed and collect the outcomes (steps = datagrams delivered)."""
    report = ExploreReport()
    start = time.perf_counter()
    for seed in seeds:
        if report.add(_seed_result(seed, simulate(main, scheduler(seed), faults(seed))), max_failures=max_failures):
            break
    report.elapsed = time.perf_counter() - start
    return report


def replay(main: Main, seed: int, *, schedule: Sequence[str] | None = None,
           scheduler: SchedulerFactory = RandomScheduler, faults: FaultsFactory = lossy) -> SimResult:
    """One run again: by seed, or (``schedule``) by that script under the seed's fault plan."""
    sched = scheduler(seed) if schedule is None else ScriptScheduler(schedule, FifoScheduler())
    return simulate(main, sched, faults(seed))


def shrink(main: Main, failure: SeedResult, *, faults: FaultsFactory = lossy, max_runs: int = 200) -> list[str]:
    """A short schedule script that, under the failure's fault plan, fails the same way (same requirement id:
    the first word of the check's message)."""
    kind = failure.outcome.split(" ")[:2]

    def fails(script: Sequence[str]) -> bool:
        run = replay(main, failure.seed, schedule=script, faults=faults)
        return not run.ok and run.outcome.split(" ")[:2] == kind

    if not fails(failure.schedule):
        raise ValueError(f"shrink: seed {failure.seed}'s schedule does not fail again as {failure.outcome!r}")
    return ddmin(failure.schedule, fails, max_runs=max_runs)


def explain(failure: SeedResult, script: Sequence[str] | None = None) -> str:
    """The failure, how to replay it, and the shrunk script when there is one."""
    lines = [failure.explain(), f"replay: kvconform.moqt.simexplore.replay(main, seed={failure.seed})"]
    if script is not None:
        lines.append(f"shrunk to {len(script)} of {len(failure.schedule)} deliveries: "
                     f"replay(main, seed={failure.seed}, schedule={list(script)!r})")
    return "\n".join(lines)
