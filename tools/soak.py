"""The soak: the main job under several seeds and the test command several times in a row, counting false failures.

The reference implementations are correct, so every gating check that does not pass in a main-job run, and every
test of the harness that fails, is a false verdict (a flake, a load-dependent bound, a seed the suites cannot
take). Long: not part of CI (``tox -e soak``).

    python tools/soak.py                          # 10 seeds of `kvconform run all`, the test command 3 times
    python tools/soak.py --seeds 3 --tests 0      # a quick look at the main job alone
    python tools/soak.py --out out/soak           # where each run's report and JUnit file go

It prints one line per run as it ends (verdict counts, wall time) and a summary; exit status 1 when any run had a
false verdict. The seeds are drawn from ``--seed`` (default: the time), and printed, so a run replays.
"""

from __future__ import annotations

import argparse
import json
import random
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# The main job and the test command of README.md; the bound of each is the CI's.
MAIN_JOB = [sys.executable, "-m", "kvconform", "run", "all", "-n", "auto", "-q"]
TEST_COMMAND = [sys.executable, "-m", "pytest", "-n", "auto", "-q", "-p", "no:randomly"]
MAIN_BOUND_S = 1800
TESTS_BOUND_S = 3600


def _gating_problems(report_dir: Path) -> tuple[Counter[str], list[str]]:
    """Verdict counts of a main-job report, and the checks whose verdict is not an acceptable one."""
    doc = json.loads((report_dir / "coverage.json").read_text("utf-8"))
    counts: Counter[str] = Counter(t["verdict"] for t in doc["tests"])
    bad = [f"{t['nodeid']}: {t['verdict']}: {t.get('message', '')[:300]}" for t in doc["tests"]
           if t["verdict"] in ("fail", "inconclusive")]
    return counts, bad


def soak_main(seed: int, out: Path) -> list[str]:
    report = out / f"main-{seed}"
    started = time.monotonic()
    proc = subprocess.run([*MAIN_JOB, "--seed", str(seed), "--report-dir", str(report)], cwd=ROOT,
                          capture_output=True, text=True, timeout=MAIN_BOUND_S, check=False)
    took = time.monotonic() - started
    if not (report / "coverage.json").is_file():
        return [f"main job seed {seed}: exit {proc.returncode}, no report: {proc.stderr[-2000:]}"]
    counts, bad = _gating_problems(report)
    print(f"main job seed {seed}: exit {proc.returncode}, {dict(sorted(counts.items()))}, {took:.0f} s", flush=True)
    problems = [f"main job seed {seed}: {line}" for line in bad]
    if proc.returncode != 0 and not problems:
        problems.append(f"main job seed {seed}: exit {proc.returncode}: {proc.stdout[-2000:]}")
    return problems


def soak_tests(n: int, out: Path) -> list[str]:
    junit = out / f"tests-{n}.xml"
    started = time.monotonic()
    proc = subprocess.run([*TEST_COMMAND, f"--junitxml={junit}"], cwd=ROOT, capture_output=True, text=True,
                          timeout=TESTS_BOUND_S, check=False)
    took = time.monotonic() - started
    failed: list[str] = []
    if junit.is_file():
        for case in ET.parse(junit).getroot().iter("testcase"):
            if case.find("failure") is not None or case.find("error") is not None:
                failed.append(f"{case.get('classname')}::{case.get('name')}")
    print(f"test command run {n}: exit {proc.returncode}, {len(failed)} failed, {took:.0f} s", flush=True)
    problems = [f"test command run {n}: {name}" for name in failed]
    if proc.returncode != 0 and not problems:
        problems.append(f"test command run {n}: exit {proc.returncode}: {proc.stdout[-2000:]}")
    return problems


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=10, help="main-job runs, each with its own seed (default 10)")
    parser.add_argument("--tests", type=int, default=3, help="runs of the test command (default 3)")
    parser.add_argument("--seed", type=int, default=None, help="draws the main job's seeds (default: the time)")
    parser.add_argument("--out", type=Path, default=ROOT / "out" / "soak", help="reports and JUnit files")
    args = parser.parse_args(argv)
    draw = random.Random(args.seed if args.seed is not None else time.time_ns())
    seeds = [draw.randrange(2**32) for _ in range(args.seeds)]
    print(f"soak: main job seeds {seeds}; test command x{args.tests}", flush=True)
    args.out.mkdir(parents=True, exist_ok=True)
    problems: list[str] = []
    for seed in seeds:
        problems += soak_main(seed, args.out)
    for n in range(1, args.tests + 1):
        problems += soak_tests(n, args.out)
    print(f"soak: {len(problems)} false verdict(s)")
    for line in problems:
        print(f"  {line}")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
