"""What starting a run costs: ``kvconform run <suite> -k <nothing>`` against a bare import of its stack (issue 22).

    python bench/bench_startup.py [--quick] [--runs N] [--suites tlkv-writer,all] [--importtime-runs R]
                                  [--top T] [--json FILE]

Per suite (every installed suite, then ``all``), this times as whole processes, in turn (A B A B ...):

- A: ``kvconform run <suite> -k no_check_has_this_name --report-dir <tmp>``: the run collects every check of the
  suite, deselects them all and exits 5 (no tests ran): its start-up, with nothing run;
- B: the baseline ``python -c 'import pytest, yaml, grpc, aioquic'``;

and prints each one's median wall time and the median of the per-pair ratios A/B (pairs, so a drift of the
shared machine hits both alike), and the median ratio of their CPU times (user + system), which waiting for a busy
core does not inflate. The issue's goal: a wall-time ratio of at most 2.5 for every suite.

Then what is left, from ``python -X importtime`` of the slowest suite (``all`` when measured): the time spent
importing versus the whole run, and the modules the baseline does not import, by package and one by one (each
module's own time, medians over ``--importtime-runs``). Wall time that is not import time is pytest's
collection and the plugin's own work (catalogs, testbed, reports).

Both commands run without PYTHONDONTWRITEBYTECODE (CI unsets it too, .ci/run): with it, every run would compile
every kvconform module again and time the compiler. One warm-up pair per suite writes the bytecode caches; its
output is checked (exit status 5, "N deselected" with N > 0), so a broken suite is not timed as a fast one.

``--quick``: 3 pairs per suite and one importtime run, for a smoke test. Not a test: nothing about speed is
asserted; an unexpected exit status or output of a run makes the exit status 1.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import resource
import statistics
import subprocess
import sys
import sysconfig
import tempfile
import time
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # `kvconform` from this checkout when run as a script

from kvconform.cli import discover_suites

BASELINE_IMPORTS = "import pytest, yaml, grpc, aioquic"
NOTHING = "no_check_has_this_name"
GOAL = 2.5
DEFAULTS = {"runs": 7, "importtime_runs": 3}
QUICK = {"runs": 3, "importtime_runs": 1}
TIMEOUT = 300.0
_DESELECTED = re.compile(r"(\d+) deselected")


class BenchError(Exception):
    """A run did not do what is timed (wrong exit status, nothing collected)."""


@dataclass
class SuiteTiming:
    """One suite's pairs: wall and CPU (user + system) seconds of the run and of the baseline, and the ratios of
    the wall times pair by pair (the goal's measure) and of the CPU times (less sensitive to waiting for a core)."""

    suite: str
    collected: int
    run_s: list[float] = field(default_factory=list)
    baseline_s: list[float] = field(default_factory=list)
    ratios: list[float] = field(default_factory=list)
    cpu_ratios: list[float] = field(default_factory=list)

    def summary(self) -> dict[str, Any]:
        return {**asdict(self), "run_median_s": statistics.median(self.run_s),
                "baseline_median_s": statistics.median(self.baseline_s), "ratio": statistics.median(self.ratios),
                "ratio_min": min(self.ratios), "ratio_max": max(self.ratios),
                "cpu_ratio": statistics.median(self.cpu_ratios)}


def environment() -> dict[str, str]:
    """This environment without PYTHONDONTWRITEBYTECODE (bytecode caches on, as in CI)."""
    return {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}


def kvconform_command() -> list[str]:
    """The ``kvconform`` console script of this interpreter's environment (``python -m kvconform`` without one)."""
    script = Path(sysconfig.get_path("scripts")) / "kvconform"
    return [str(script)] if script.is_file() else [sys.executable, "-m", "kvconform"]


def run_command(suite: str, report_dir: Path) -> list[str]:
    return [*kvconform_command(), "run", suite, "-k", NOTHING, "--report-dir", str(report_dir)]


def baseline_command() -> list[str]:
    return [sys.executable, "-c", BASELINE_IMPORTS]


@dataclass(frozen=True)
class Timed:
    """One finished process: its wall seconds, its CPU seconds (user + system, from the kernel's accounting)."""

    wall: float
    cpu: float
    proc: subprocess.CompletedProcess[str]


def _timed(cmd: list[str], env: dict[str, str]) -> Timed:
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=TIMEOUT, check=False)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return Timed(wall, after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime, proc)


def _checked_run(suite: str, report_dir: Path, env: dict[str, str]) -> tuple[Timed, int]:
    """One run, and how many checks it collected (all deselected)."""
    timed = _timed(run_command(suite, report_dir), env)
    proc = timed.proc
    found = _DESELECTED.search(proc.stdout)
    if proc.returncode != 5 or found is None or int(found.group(1)) == 0:
        tail = "\n".join((proc.stdout + proc.stderr).splitlines()[-15:])
        raise BenchError(f"kvconform run {suite} -k {NOTHING}: exit status {proc.returncode}, expected 5 with "
                         f"every collected check deselected; its output ends:\n{tail}")
    return timed, int(found.group(1))


def time_suite(suite: str, runs: int, env: dict[str, str]) -> SuiteTiming:
    """``runs`` pairs (run, baseline) after one warm-up pair."""
    with tempfile.TemporaryDirectory(prefix="bench-startup-") as tmp:
        report_dir = Path(tmp) / "reports"
        _, collected = _checked_run(suite, report_dir, env)
        _timed(baseline_command(), env)
        timing = SuiteTiming(suite, collected)
        for _ in range(runs):
            a, _ = _checked_run(suite, report_dir, env)
            b = _timed(baseline_command(), env)
            if b.proc.returncode != 0:
                raise BenchError(f"the baseline {BASELINE_IMPORTS!r} failed: {b.proc.stderr.strip()[-500:]}")
            timing.run_s.append(a.wall)
            timing.baseline_s.append(b.wall)
            timing.ratios.append(a.wall / b.wall)
            timing.cpu_ratios.append(a.cpu / b.cpu)
    return timing


def parse_importtime(stderr: str) -> dict[str, int]:
    """``-X importtime`` lines -> module -> its own import time in microseconds."""
    out: dict[str, int] = {}
    for line in stderr.splitlines():
        if not line.startswith("import time:") or "self [us]" in line:
            continue
        own, _cumulative, name = line[len("import time:"):].split("|", 2)
        out[name.strip()] = int(own)
    return out


def importtime(cmd: list[str], env: dict[str, str]) -> tuple[float, dict[str, int]]:
    """Wall seconds of ``cmd`` under ``-X importtime`` and each module's own import time (µs).

    pytest captures file descriptor 2 while it collects, which would swallow what the suites' modules print:
    PYTEST_ADDOPTS=--capture=no keeps it.
    """
    env = {**env, "PYTEST_ADDOPTS": "--capture=no", "PYTHONPROFILEIMPORTTIME": "1"}
    timed = _timed(cmd, env)
    return timed.wall, parse_importtime(timed.proc.stderr)


def breakdown(suite: str, repeats: int, env: dict[str, str]) -> dict[str, Any]:
    """What is left of ``suite``'s start-up: import time against wall time, and the modules beyond the baseline's."""
    with tempfile.TemporaryDirectory(prefix="bench-startup-") as tmp:
        samples = [importtime(run_command(suite, Path(tmp) / "reports"), env) for _ in range(repeats)]
    _, base = importtime(baseline_command(), env)
    modules: dict[str, list[int]] = defaultdict(list)
    for _, times in samples:
        for name, own in times.items():
            modules[name].append(own)
    own_us = {name: statistics.median(values) for name, values in modules.items()}
    beyond = {name: us for name, us in own_us.items() if name not in base}
    packages: dict[str, float] = defaultdict(float)
    for name, us in beyond.items():
        packages[name.split(".", 1)[0]] += us
    return {
        "suite": suite,
        "wall_s": statistics.median(s for s, _ in samples),
        "import_s": sum(own_us.values()) / 1e6,
        "beyond_baseline_import_s": sum(beyond.values()) / 1e6,
        "modules_beyond_baseline": len(beyond),
        "packages": dict(sorted(((k, v / 1e6) for k, v in packages.items()), key=lambda kv: -kv[1])),
        "modules": dict(sorted(((k, v / 1e6) for k, v in beyond.items()), key=lambda kv: -kv[1])),
    }


def parse(argv: Sequence[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help=f"fewer repetitions: {QUICK}")
    ap.add_argument("--runs", type=int, help=f"timed pairs per suite, after one warm-up pair (default "
                                             f"{DEFAULTS['runs']})")
    ap.add_argument("--suites", default=None, help="comma list of suites (default: every installed suite and all)")
    ap.add_argument("--importtime-runs", type=int, help=f"-X importtime runs of the slowest suite, medians per "
                                                        f"module (default {DEFAULTS['importtime_runs']})")
    ap.add_argument("--top", type=int, default=15, help="modules and packages listed in the breakdown (default 15)")
    ap.add_argument("--json", default=None, metavar="FILE", help="also write the figures there")
    args = ap.parse_args(argv)
    for key, value in (QUICK if args.quick else DEFAULTS).items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse(argv)
    suites = args.suites.split(",") if args.suites else [*discover_suites(), "all"]
    env = environment()
    failures: list[str] = []
    timings: list[SuiteTiming] = []
    print(f"kvconform run SUITE -k {NOTHING} against python -c {BASELINE_IMPORTS!r}: {args.runs} pairs per suite, "
          f"medians; wall seconds, ratio of wall times pair by pair (min, max) and of CPU times (cpu)")
    print(f"{'suite':<16}{'checks':>7}{'run s':>8}{'base s':>8}{'ratio':>7}{'min':>7}{'max':>7}{'cpu':>7}")
    for suite in suites:
        try:
            timing = time_suite(suite, args.runs, env)
        except (BenchError, subprocess.TimeoutExpired) as exc:
            failures.append(str(exc))
            print(f"{suite:<16} FAILED: {str(exc).splitlines()[0]}")
            continue
        timings.append(timing)
        s = timing.summary()
        flag = "" if s["ratio"] <= GOAL else f"  > {GOAL}"
        print(f"{suite:<16}{timing.collected:>7}{s['run_median_s']:>8.3f}{s['baseline_median_s']:>8.3f}"
              f"{s['ratio']:>7.2f}{s['ratio_min']:>7.2f}{s['ratio_max']:>7.2f}{s['cpu_ratio']:>7.2f}{flag}")
    left: dict[str, Any] | None = None
    if timings and args.importtime_runs > 0:
        slowest = "all" if any(t.suite == "all" for t in timings) else max(
            timings, key=lambda t: statistics.median(t.ratios)).suite
        left = breakdown(slowest, args.importtime_runs, env)
        print(f"\nwhat is left, kvconform run {slowest} -k {NOTHING} under -X importtime ({args.importtime_runs} "
              f"run(s), medians): {left['wall_s']:.3f} s wall, {left['import_s']:.3f} s importing, of which "
              f"{left['beyond_baseline_import_s']:.3f} s in {left['modules_beyond_baseline']} modules the baseline "
              f"does not import (importtime's own overhead included)")
        print("  by package (own import time of its modules, s):")
        for name, secs in list(left["packages"].items())[:args.top]:
            print(f"    {secs:8.3f}  {name}")
        print("  by module (own import time, s):")
        for name, secs in list(left["modules"].items())[:args.top]:
            print(f"    {secs:8.3f}  {name}")
    worst = max((statistics.median(t.ratios) for t in timings), default=None)
    if worst is not None:
        print(f"\nworst ratio {worst:.2f} (goal <= {GOAL})")
    for failure in failures:
        print(f"FAILED: {failure}", file=sys.stderr)
    if args.json:
        doc = {"argv": list(sys.argv[1:] if argv is None else argv), "baseline": BASELINE_IMPORTS, "goal": GOAL,
               "python": sys.version.split()[0], "suites": [t.summary() for t in timings], "worst_ratio": worst,
               "breakdown": left, "failures": failures}
        Path(args.json).write_text(json.dumps(doc, indent=1))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
