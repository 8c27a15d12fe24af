"""Serving a KBTP target without DIRECT_ALLOC at the tightest geometry its PICS can declare, and running the churn
checks of conformance/kbtp/target/test_races.py against it (tests/kbtp/test_race_churn.py, tools/race_catch_rates.py).
The whole pool is one shared ring with F == N and every block in circulation (quota x max_initiators = F)."""

from __future__ import annotations

import tempfile
from pathlib import Path

from tests.mutants import kbtp as kbtp_mutants
from tests.mutants import kbtp_races
from tests.mutants.runner import run_suite
from tests.served import served

WIRES = ("roce", "iwarp")
CHECKS = ("test_deferred_free_example", "test_free_updates_entry_before_ring", "test_free_writes_block_before_sequence")
MUTANTS = tuple(kbtp_races.CHURN_TARGETS)
FEATURES = "DIRECT_LOAD,ADDR_LE"  # not DIRECT_ALLOC: the harness cannot allocate, only the target does
POOL = (4096, 8, 8, 8)  # F == N == 8, the whole pool shared
QUOTA, MAX_INITIATORS = 2, 4  # 4 x 2 = 8: every block in circulation


def profile(wire: str) -> str:
    return "rdmap-7306" if wire == "iwarp" else "ib-rc"


def pics(wire: str, budget: float) -> tuple[str, ...]:
    bs, blocks, shared, slots = POOL
    return (f"kbtp.target.binding={profile(wire)}", "kbtp.target.features=[DIRECT_LOAD, ADDR_LE]",
            f"kbtp.target.pool={{block_size: {bs}, blocks: {blocks}, shared_blocks: {shared}, ring_slots: {slots}}}",
            f"kbtp.target.quota={QUOTA}", f"kbtp.target.max_initiators={MAX_INITIATORS}",
            f"kbtp.target.race_budget_s={budget:g}")


def serve_args(wire: str, target: str | None) -> list[str]:
    args = ["kbtp-target", "--binding", wire, "--port", "0", "--udp-port", "0", "--profile", profile(wire),
            f"--features={FEATURES}", "--pool", ",".join(map(str, POOL)), "--quota", str(QUOTA),
            "--max-initiators", str(MAX_INITIATORS)]
    if target is not None:
        cls = (getattr(kbtp_mutants, target, None) or getattr(kbtp_races, target)).target_class
        args += ["--target-class", f"{cls.__module__}:{cls.__name__}"]
    return args


def run_bound(budget: float, checks: int = len(CHECKS)) -> float:
    """What one run may take: start-up and each check's budget, twice over on a loaded machine."""
    return 90 + 2 * checks * budget


def one_run(wire: str, target: str | None, budget: float,
            checks: tuple[str, ...] = CHECKS) -> dict[str, tuple[str, str | None, str]]:
    """check -> (verdict, blamed, message) of one run against a freshly served target."""
    with served(*serve_args(wire, target)) as address, tempfile.TemporaryDirectory() as tmp:
        run = run_suite("kbtp-target", f"kbtp+{wire}://{address}", Path(tmp), pics=pics(wire, budget), checks=checks,
                        timeout=run_bound(budget, len(checks)))
    out: dict[str, tuple[str, str | None, str]] = {}
    for t in run.coverage.get("tests", []):
        out[t["nodeid"].split("::")[-1]] = (t["verdict"], t.get("blamed"), str(t.get("message", "")))
    if not out:
        out["(run)"] = ("error", None, run.output[-600:])
    return out
