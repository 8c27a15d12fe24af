"""The two real runs the report tests look at: the reference, and a target that breaks a mandatory rule.

Both go through `kvconform run` in their own process, as a user's would (tests/mutants/runner.py). The
reference plays tlkv-reader from the loopback testbed (whose entry declares the implementation); the broken
target is the mutant reader that never checks the CRC (TLKV-READ-CRC), an ad-hoc python: target whose PICS all
come from the mutant testbed's defaults. Set $KVCONFORM_CHECK_REPORT_DIRS (os.pathsep-separated) to hold the
browser and schema tests to other report folders too, e.g. CI's `kvconform run all` report.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests.mutants.runner import run_suite

BROKEN_TARGET = "python:tests.mutants.tlkv:SkipsCrcReader"
BROKEN_REQUIREMENT = "TLKV-READ-CRC"
REPORT_DIRS_ENV = "KVCONFORM_CHECK_REPORT_DIRS"


@dataclass(frozen=True)
class ReportRun:
    """A finished run's report folder, its exit code and its coverage.json."""

    report_dir: Path
    code: int
    doc: dict[str, Any]
    output: str

    def evidence(self, nodeid_part: str) -> dict[str, Any]:
        """The evidence bundle of the (first) check whose nodeid contains ``nodeid_part``."""
        test = next(t for t in self.doc["tests"] if nodeid_part in t["nodeid"])
        bundle: dict[str, Any] = json.loads((self.report_dir / test["evidence"]).read_text())
        return bundle


def reference_run(report_dir: Path) -> ReportRun:
    """`kvconform run tlkv-reader` against the reference of the loopback testbed."""
    run = run_suite("tlkv-reader", "reference", report_dir, testbed=None)
    assert run.coverage, f"the reference run wrote no coverage.json:\n{run.output}"
    return ReportRun(report_dir, run.code, run.coverage, run.output)


def broken_run(report_dir: Path) -> ReportRun:
    """`kvconform run tlkv-reader` against the mutant that skips the CRC check."""
    run = run_suite("tlkv-reader", BROKEN_TARGET, report_dir)
    assert run.coverage, f"the broken-target run wrote no coverage.json:\n{run.output}"
    return ReportRun(report_dir, run.code, run.coverage, run.output)


def given_report_dirs() -> list[Path]:
    """The report folders named by $KVCONFORM_CHECK_REPORT_DIRS (none when unset)."""
    raw = os.environ.get(REPORT_DIRS_ENV, "")
    return [Path(p) for p in raw.split(os.pathsep) if p]


def load_given(report_dir: Path) -> ReportRun:
    """A report folder another run wrote (its exit code as the report records it)."""
    doc: dict[str, Any] = json.loads((report_dir / "coverage.json").read_text())
    return ReportRun(report_dir, int(doc["meta"]["exit_code"]), doc, "")
