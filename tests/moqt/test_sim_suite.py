"""The relay suites on the deterministic transport replay from their seed (issue 24 item 3, targets/moqt_sim.py).

`kvconform run moqt-relay --target sim:reference --seed S` runs the relay and every scenario on one virtual-clock
loop and in-memory network; a run is a function of S: two runs in separate processes, with different string hash
seeds, give the same verdicts and byte-identical transcripts (transcript.txt, whose SHA-256 coverage.json records).
Another seed gives the same verdicts over another schedule. Mutant relays on the simulated network still fail on the
requirement they break.

The default run replays a few checks of each suite, chosen for what the transport must get right: a publisher racing
a SUBSCRIBE through the relay, cache expiry on the loop's clock, tokens on its virtual wall clock.
`tox -e moqt-replay` (KVCONFORM_SIM_REPLAY_FULL=1) replays both suites whole.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from kvconform.moqt.simclock import VirtualDeadlock
from kvconform.moqt.simnet import Faults
from kvconform.moqt.simsession import SimSession
from kvconform.rdma.scheduler import FifoScheduler
from tests.mutants import moqt
from tests.mutants.runner import Lane
from tests.spawn import covering, kvconform, spawn_env

FULL = os.environ.get("KVCONFORM_SIM_REPLAY_FULL") == "1"
SEED = 4242
RUN_BOUND = 240.0 if FULL else 90.0  # seconds one run may take (a sim run mostly computes: no idle time)
# The default run's checks (-k); the full replay takes every check of the suite.
SUBSET = {
    "moqt-relay": ("test_objects_published_while_the_subscribe_is_in_flight or "
                   "test_expired_objects_are_not_served_from_cache or "
                   "test_unauthorized_subscribe_is_refused_and_nothing_delivered"),
    "kvcs-relay": ("test_layers_are_served_from_cache_only_within_max_cache_duration or "
                   "test_consumers_joining_a_live_publication_get_every_object_once"),
}
LANE = Lane(moqt, select_checks=True, testbed=None)
# Mutants whose bug the virtual clocks must still show: a cache that never expires (the loop's clock) and an
# expired token accepted (the virtual wall clock). tests/test_mutants_moqt.py runs every mutant on sockets.
MUTANTS = ("CacheForeverRelay", "ExpiryBlindRelay")
# A string hash seed other than this process's (which spawned runs share through the fork server): a run with it
# gets an interpreter of its own (tests/forkserver.py), whose str and bytes hashes differ from the others'.
OTHER_HASH_SEED = "2" if os.environ.get("PYTHONHASHSEED") == "1" else "1"


def test_a_session_runs_one_scenario_after_another_on_virtual_time_and_cancels_what_each_leaves() -> None:
    """What `kvconform.fixtures.moqt.run` relies on: like asyncio.run, a run leaves no task of its own behind
    (unless it started a server: keep); a run that can never finish raises instead of hanging, and the session goes
    on; waits cost virtual time."""
    sim = SimSession(FifoScheduler(), Faults())

    async def leave_a_task() -> asyncio.Task[None]:
        return asyncio.ensure_future(asyncio.sleep(3600))

    async def wait_forever() -> None:
        await asyncio.Event().wait()

    async def sleep_five() -> float:
        start = asyncio.get_running_loop().time()
        await asyncio.sleep(5)
        return asyncio.get_running_loop().time() - start

    try:
        left = sim.run(leave_a_task())
        assert left.cancelled()
        with pytest.raises(VirtualDeadlock, match="no task can run"):
            sim.run(wait_forever())
        assert sim.run(sleep_five()) == pytest.approx(5.0)
        kept = sim.run(leave_a_task(), keep=True)
        assert not kept.done() and sim.runs == 4
    finally:
        sim.close()
    assert kept.cancelled() and sim.loop.is_closed()


@dataclass(frozen=True)
class SimRun:
    verdicts: dict[str, tuple[str, str | None]]  # nodeid -> (verdict, blamed requirement)
    transcript: bytes
    meta: dict[str, Any]  # coverage.json meta.transcript


def run_sim(suite: str, report_dir: Path, *, seed: int = SEED, hash_seed: str | None = None,
            checks: str | None = None, faults: str | None = None) -> SimRun:
    """`kvconform run SUITE --target sim:reference --seed SEED` in a process of its own (with PYTHONHASHSEED
    ``hash_seed``, else the fork server's); ``checks`` for -k (default: the subset, or all when FULL), ``faults``
    for --sim-faults."""
    select = ["-k", checks] if checks else [] if FULL else ["-k", SUBSET[suite]]
    env = spawn_env() if hash_seed is None else {**spawn_env(), "PYTHONHASHSEED": hash_seed}
    extra = ["--sim-faults", faults] if faults else []
    proc = kvconform(["run", suite, "--target", "sim:reference", "--seed", str(seed), "--report-dir", str(report_dir),
                      "-q", *select, *extra], timeout=RUN_BOUND, env=env)
    coverage_file = report_dir / "coverage.json"
    assert coverage_file.is_file(), proc.stdout[-3000:] + proc.stderr[-3000:]
    coverage = json.loads(coverage_file.read_text())
    meta = coverage["meta"]["transcript"]
    transcript = (report_dir / meta["file"]).read_bytes()
    assert hashlib.sha256(transcript).hexdigest() == meta["sha256"], "coverage.json's digest is not the file's"
    assert meta["lines"] == transcript.count(b"\n") > 0
    verdicts = {t["nodeid"]: (t["verdict"], t.get("blamed")) for t in coverage["tests"]}
    return SimRun(verdicts, transcript, meta)


def first_difference(a: bytes, b: bytes) -> str:
    for i, (x, y) in enumerate(zip(a.splitlines(), b.splitlines(), strict=False)):
        if x != y:
            return f"line {i + 1}: {x.decode()!r} != {y.decode()!r}"
    return f"one transcript is a prefix of the other ({len(a.splitlines())} vs {len(b.splitlines())} lines)"


@pytest.mark.slow
@covering(RUN_BOUND, RUN_BOUND)
@pytest.mark.parametrize("suite", sorted(SUBSET))
def test_two_runs_with_one_seed_give_the_same_verdicts_and_transcript(suite: str, tmp_path: Path) -> None:
    first = run_sim(suite, tmp_path / "first")
    again = run_sim(suite, tmp_path / "again", hash_seed=OTHER_HASH_SEED)
    assert first.verdicts == again.verdicts
    assert first.transcript == again.transcript, first_difference(first.transcript, again.transcript)
    assert first.meta == again.meta
    # The reference passes (a check may be not applicable under the testbed's default PICS, never fail).
    assert {v for v, _ in first.verdicts.values()} <= {"pass", "not-applicable"}, first.verdicts
    assert "pass" in {v for v, _ in first.verdicts.values()}
    # Both sides of the relay's sessions are in it: the harness's endpoints and the relay's.
    speakers = {line.split()[1].split("[")[0] for line in first.transcript.decode().splitlines()}
    assert suite in speakers and len(speakers) > 2, sorted(speakers)[:10]
    assert first.meta["network"]["dropped"] == 0 and first.meta["scheduler"] == f"random (seed {SEED})"


@pytest.mark.slow
@covering(RUN_BOUND, RUN_BOUND)
def test_another_seed_gives_the_same_verdicts_over_another_transcript(tmp_path: Path) -> None:
    first = run_sim("moqt-relay", tmp_path / "first")
    other = run_sim("moqt-relay", tmp_path / "other", seed=SEED + 1)
    assert {n: v for n, (v, _) in first.verdicts.items()} == {n: v for n, (v, _) in other.verdicts.items()}
    assert first.meta["sha256"] != other.meta["sha256"], "the seed changed neither the schedule nor the checks' data"


@pytest.mark.slow
@covering(LANE.timeout)
@pytest.mark.parametrize("name", MUTANTS)
def test_a_mutant_relay_on_the_simulated_network_fails_on_its_requirement(name: str, tmp_path: Path) -> None:
    LANE.assert_caught(name, tmp_path, transport="sim:")


# Checks that once failed a correct relay because objects, stream ends or PUBLISH_DONE arrived in another order under
# load (387e0d5: subgroup streams in any order; 29c37b7 and b135d46: PUBLISH_DONE placed against its streams by packet
# order). With reordering (jitter), duplication and seeded stream interleaving they must pass under every schedule.
REORDERED = " or ".join(("test_cached_objects_are_byte_identical",
                         "test_a_subscriber_after_the_end_gets_the_track_then_publish_done",
                         "test_forwarded_objects_are_unchanged_and_in_order",
                         "test_objects_published_while_the_subscribe_is_in_flight"))
REORDER_FAULTS = "jitter=3,dup=0.02,interleave=1"
REORDER_SEEDS = range(1, 41) if FULL else range(1, 3)


@pytest.mark.slow
@covering(RUN_BOUND, RUN_BOUND)
@pytest.mark.parametrize("seed", REORDER_SEEDS)
def test_the_checks_that_reordering_once_failed_pass_under_every_schedule(seed: int, tmp_path: Path) -> None:
    run = run_sim("moqt-relay", tmp_path, seed=seed, checks=REORDERED, faults=REORDER_FAULTS)
    assert run.meta["network"]["reordered"] > 0 and run.meta["faults"]["interleave"], run.meta
    bad = {n: v for n, v in run.verdicts.items() if v[0] != "pass"}
    assert not bad and len(run.verdicts) >= 4, (bad, run.meta["faults"])
