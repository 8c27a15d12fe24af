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
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.kbtp.race_churn_runs import MUTANTS, WIRES, one_run  # noqa: E402 - after the path
from tests.mutants import kbtp_races  # noqa: E402


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
            rule = None if target is None else kbtp_races.CHURN_TARGETS[target][0]
            for i in range(a.runs):
                got = one_run(wire, target, a.budget)
                runs[(wire, name)] += 1
                hit = rule is not None and any(v == "fail" and b == rule for v, b, _ in got.values())
                caught[(wire, name)] += int(hit)
                for check, (v, b, msg) in sorted(got.items()):
                    print(f"{wire} {name} run {i}: {check}: {v} {b or ''} {msg[:300]!r}", flush=True)
    print("\nwire   target                         failed on its rule / runs")
    for (wire, name), n in sorted(runs.items()):
        print(f"{wire:6} {name:30} {caught[(wire, name)]} / {n}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
