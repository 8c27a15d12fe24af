"""The real runs the report tests look at: the reference, a target that breaks a mandatory rule, and the main job.

They go through `kvconform run` in their own process, as a user's would (tests/mutants/runner.py). The
reference plays tlkv-reader from the loopback testbed (whose entry declares the implementation); the broken
target is the mutant reader that never checks the CRC (TLKV-READ-CRC), an ad-hoc python: target whose PICS all
come from the mutant testbed's defaults. Set $KVCONFORM_CHECK_REPORT_DIRS (os.pathsep-separated) to hold the
browser and schema tests to other report folders too, e.g. CI's `kvconform run all` report.

The main job, README's first command (`kvconform run all` against the reference, every suite), is what the tests
that judge the reference as a whole read (tests/test_reference_passes.py and the reference runs of the lanes): CI
runs it first and names its report folder in $KVCONFORM_MAIN_REPORT_DIR; without it the test session runs it
once, whichever xdist worker needs it first, and the others read that run's report.
"""

from __future__ import annotations

import fcntl
import json
import os
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.mutants.runner import SEED, Run, run_suite
from tests.spawn import kvconform

BROKEN_TARGET = "python:tests.mutants.tlkv:SkipsCrcReader"
BROKEN_REQUIREMENT = "TLKV-READ-CRC"
REPORT_DIRS_ENV = "KVCONFORM_CHECK_REPORT_DIRS"
MAIN_REPORT_ENV = "KVCONFORM_MAIN_REPORT_DIR"
MAIN_JOB = ("run", "all", "-n", "auto")  # README's first command (and .ci/run's main job), with a --report-dir
MAIN_JOB_BOUND = 900.0  # seconds; about 90 on two idle cores


@dataclass(frozen=True)
class ReportRun:
    """A finished run's report folder, its exit code and its coverage.json."""

    report_dir: Path
    code: int
    doc: dict[str, Any]
    output: str

    def part(self, *suites: str) -> Run:
        """What a run of only these suites would have reported (tests/mutants/runner.Run): their checks, their
        verdict counts, and each requirement's entries for their checks; the exit code is the whole run's."""
        tests = [t for t in self.doc["tests"] if t["suite"] in suites]
        nodeids = {t["nodeid"] for t in tests}
        protocols = {proto: {**entry, "roles": {role: {**r, "requirements": [
            {**req, "tests": [t for t in req["tests"] if t["nodeid"] in nodeids]} for req in r["requirements"]]}
            for role, r in entry["roles"].items()}}
            for proto, entry in self.doc["protocols"].items() if any(s.split("-")[0] == proto for s in suites)}
        summary = {"verdicts": dict(Counter(t["verdict"] for t in tests)),
                   "suites": {s: v for s, v in self.doc["summary"]["suites"].items() if s in suites}}
        return Run(self.code, {**self.doc, "tests": tests, "summary": summary, "protocols": protocols}, self.output)

    def evidence(self, nodeid_part: str) -> dict[str, Any]:
        """The evidence bundle of the (first) check whose nodeid contains ``nodeid_part``."""
        test = next(t for t in self.doc["tests"] if nodeid_part in t["nodeid"])
        bundle: dict[str, Any] = json.loads((self.report_dir / test["evidence"]).read_text())
        return bundle


def reference_run(report_dir: Path) -> Run:
    """`kvconform run tlkv-reader` against the reference of the loopback testbed."""
    return run_suite("tlkv-reader", "reference", report_dir, testbed=None)


def broken_run(report_dir: Path) -> Run:
    """`kvconform run tlkv-reader` against the mutant that skips the CRC check."""
    return run_suite("tlkv-reader", BROKEN_TARGET, report_dir)


def given_report_dirs() -> list[Path]:
    """The report folders named by $KVCONFORM_CHECK_REPORT_DIRS (none when unset)."""
    raw = os.environ.get(REPORT_DIRS_ENV, "")
    return [Path(p) for p in raw.split(os.pathsep) if p]


def load_given(report_dir: Path) -> ReportRun:
    """A report folder another run wrote (its exit code as the report records it)."""
    doc: dict[str, Any] = json.loads((report_dir / "coverage.json").read_text())
    return ReportRun(report_dir, int(doc["meta"]["exit_code"]), doc, "")


def session_root(factory: pytest.TempPathFactory) -> Path:
    """The test session's temporary folder, shared by its xdist workers."""
    root = factory.getbasetemp()
    return root.parent if os.environ.get("PYTEST_XDIST_WORKER") else root


def shared_run(factory: pytest.TempPathFactory, name: str, make: Callable[[Path], Run]) -> ReportRun:
    """The report of ``make(report_dir)``, made once per test session: by the first xdist worker that needs it,
    while the others wait for it here (bounded by their test's timeout, which covers the run: tests/conftest.py)."""
    root = session_root(factory)
    report_dir, done = root / name, root / f"{name}.json"
    with open(root / f"{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not done.exists():
            run = make(report_dir)
            done.write_text(json.dumps({"code": run.code, "output": run.output}))
        ended = json.loads(done.read_text())
    cov = report_dir / "coverage.json"
    assert cov.exists(), f"the run of {name} wrote no coverage.json (exit {ended['code']}):\n{ended['output']}"
    return ReportRun(report_dir, int(ended["code"]), json.loads(cov.read_text()), str(ended["output"]))


def _main_job(report_dir: Path) -> Run:
    proc = kvconform([*MAIN_JOB, "--report-dir", str(report_dir), "--seed", SEED, "-q"], timeout=MAIN_JOB_BOUND)
    return Run(proc.returncode, {}, proc.stdout[-4000:] + proc.stderr[-4000:])


def main_job_run(factory: pytest.TempPathFactory) -> ReportRun:
    """The main job's report: $KVCONFORM_MAIN_REPORT_DIR's, or this session's one run of it."""
    given = os.environ.get(MAIN_REPORT_ENV)
    return load_given(Path(given)) if given else shared_run(factory, "main-job", _main_job)
