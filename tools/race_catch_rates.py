"""How often the black-box churn (conformance/kbtp/blackbox.py, `Churn`) catches the race mutants of
tests/mutants/kbtp.py served in their own process WITHOUT DIRECT_ALLOC, over RoCEv2 and iWARP on loopback, and what
it says of the reference served the same way (issue 23 item 1; docs/kbtp-wire.md, "A target without DIRECT_ALLOC").

    python tools/race_catch_rates.py --runs 3 --budget 10 [--wire roce] [--target OverwritesUnconsumedSlot]

Prints one line per run (wire, target, check, verdict, blamed requirement, message head) and a table at the end:
runs failing on the mutant's rule / runs. The served geometry is the tightest one the PICS can declare: the whole
pool one shared ring with F == N and every block in circulation (quota x max_initiators = F).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.mutants import kbtp as kbtp_mutants  # noqa: E402 - after the path
from tests.mutants.runner import run_suite  # noqa: E402
from tests.served import served  # noqa: E402

WIRES = ("roce", "iwarp")
CHECKS = ("test_deferred_free_example", "test_free_updates_entry_before_ring")
MUTANTS = ("OverwritesUnconsumedSlot", "FreeReturnsBeforeEntryUpdate", "SequenceBeforeBlock")
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
        cls = getattr(kbtp_mutants, target).target_class
        args += ["--target-class", f"{cls.__module__}:{cls.__name__}"]
    return args


def one_run(wire: str, target: str | None, budget: float, checks: tuple[str, ...] = CHECKS) -> dict[str, tuple]:
    """check -> (verdict, blamed, message) of one run against a freshly served target."""
    with served(*serve_args(wire, target)) as address, tempfile.TemporaryDirectory() as tmp:
        run = run_suite("kbtp-target", f"kbtp+{wire}://{address}", Path(tmp), pics=pics(wire, budget), checks=checks,
                        timeout=120 + 4 * budget)
    out = {}
    for t in run.coverage.get("tests", []):
        out[t["nodeid"].split("::")[-1]] = (t["verdict"], t.get("blamed"), str(t.get("message", "")))
    if not out:
        out["(run)"] = ("error", None, run.output[-600:])
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--budget", type=float, default=10.0, help="kbtp.target.race_budget_s per check")
    ap.add_argument("--wire", action="append", choices=WIRES)
    ap.add_argument("--target", action="append", help="'reference' or a mutant name (default: all)")
    a = ap.parse_args()
    caught: Counter[tuple[str, str]] = Counter()
    runs: Counter[tuple[str, str]] = Counter()
    for wire in a.wire or WIRES:
        for name in a.target or ("reference", *MUTANTS):
            target = None if name == "reference" else name
            rule = None if target is None else kbtp_mutants.MUTANTS[target].requirement
            for i in range(a.runs):
                got = one_run(wire, target, a.budget)
                runs[(wire, name)] += 1
                hit = any(v == "fail" and b == rule for v, b, _ in got.values())
                caught[(wire, name)] += int(hit)
                for check, (v, b, msg) in sorted(got.items()):
                    print(f"{wire} {name} run {i}: {check}: {v} {b or ''} {msg[:300]!r}", flush=True)
    print("\nwire   target                         failed on its rule / runs")
    for (wire, name), n in sorted(runs.items()):
        print(f"{wire:6} {name:30} {caught[(wire, name)]} / {n}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
