"""Running a TLKV suite through `kvconform run`, as a user does, and reading what it concluded.

The verdict tests of tests/tlkv/ drive the harness against their own targets with this, so what they assert is
what a vendor or a CI gate would see: the exit code and coverage.json (each check's verdict and blamed id).
"""

from __future__ import annotations

import json
import sys
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests.mutants.runner import SEED, TESTBED
from tests.spawn import kvconform

PY = sys.executable
SCRIPTS = Path(__file__).parent / "scripts"
SMALL = "{block_tokens: 4, n_layers: 2, n_kv_heads: 2, head_dim: 3}"  # a pool geometry that runs in seconds


@dataclass(frozen=True)
class Result:
    """How a `kvconform run` ended: exit code, coverage.json, output tail, and how long it took."""

    code: int
    coverage: dict[str, Any]
    output: str
    elapsed: float

    @property
    def tests(self) -> list[dict[str, Any]]:
        tests: list[dict[str, Any]] = self.coverage.get("tests", [])
        return tests

    @property
    def verdicts(self) -> Counter[str]:
        return Counter(t["verdict"] for t in self.tests)

    def with_verdict(self, verdict: str) -> list[str]:
        """Check names (nodeid's last part) with this verdict."""
        return [t["nodeid"].split("::")[-1] for t in self.tests if t["verdict"] == verdict]

    def blamed(self) -> set[str]:
        """The requirements the failing checks blame."""
        return {str(t.get("blamed")) for t in self.tests if t["verdict"] == "fail"}

    def verdict_of(self, name: str) -> str:
        found = [t["verdict"] for t in self.tests if t["nodeid"].split("::")[-1] == name]
        assert len(found) == 1, f"{name}: {len(found)} results in {[t['nodeid'] for t in self.tests]}"
        return str(found[0])

    def describe(self) -> str:
        lines = [f"exit {self.code} after {self.elapsed:.1f} s; verdicts {dict(self.verdicts)}"]
        lines += [f"  {t['verdict']} {t.get('blamed')} {t['nodeid'].split('::')[-1]}: {(t.get('message') or '')[:200]}"
                  for t in self.tests if t["verdict"] not in ("pass", "not-applicable")][:40]
        return "\n".join(lines) + "\n" + self.output[-3000:]


RUN_BOUND = 600.0  # seconds a suite run may take (the default of kvconform_run)


def kvconform_run(suite: str, target: str, report_dir: Path, *args: str, pics: tuple[str, ...] = (),
                  testbed: Path | None = TESTBED, timeout: float = RUN_BOUND) -> Result:
    """`kvconform run suite --target target ARGS`, each `pics` as a --pics-set, with the mutant testbed's
    defaults (small geometries) unless `testbed` says otherwise; killed past ``timeout``, which the calling test's
    pytest-timeout must cover (tests/spawn.py)."""
    overrides = [arg for p in pics for arg in ("--pics-set", p)]
    bed = ["--testbed", str(testbed)] if testbed else []
    started = time.monotonic()
    proc = kvconform(["run", suite, "--target", target, *bed, "--report-dir", str(report_dir), "--seed", SEED, "-q",
                      *overrides, *args], timeout=timeout)
    elapsed = time.monotonic() - started
    cov = report_dir / "coverage.json"
    coverage = json.loads(cov.read_text()) if cov.exists() else {}
    return Result(proc.returncode, coverage, proc.stdout[-6000:] + proc.stderr[-6000:], elapsed)
