"""Every TLKV mutant is caught: its suite fails, and the failing check cites the requirement it breaks.

Each mutant runs through `kvconform run` exactly as a vendor's target would (python: target), in its own
process, so a mutant that crashes or hangs cannot take the harness's own test run with it.
"""

from __future__ import annotations

import inspect
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from kvconform.catalog import load_catalogs
from tests.mutants import tlkv as mutants

ROOT = Path(__file__).resolve().parents[1]
TESTBED = ROOT / "tests" / "mutants" / "testbed.yaml"
RUN_TIMEOUT = 300


def run_suite(suite: str, target: str, report_dir: Path) -> tuple[int, dict[str, Any], str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run(
        [sys.executable, "-m", "kvconform", "run", suite, "--target", target, "--testbed", str(TESTBED),
         "--report-dir", str(report_dir), "--seed", "20261129", "-q"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=RUN_TIMEOUT, stdin=subprocess.DEVNULL)
    cov = report_dir / "coverage.json"
    doc = json.loads(cov.read_text()) if cov.exists() else {}
    return proc.returncode, doc, proc.stdout[-4000:] + proc.stderr[-4000:]


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(mutants.MUTANTS))
def test_mutant_is_caught(name: str, tmp_path: Path) -> None:
    suite, requirement = mutants.MUTANTS[name]
    code, doc, output = run_suite(suite, f"python:tests.mutants.tlkv:{name}", tmp_path)
    assert doc, f"no coverage.json from the run of {suite} against {name}:\n{output}"
    failing = [t["nodeid"] for t in doc["tests"] if requirement in t["reqs"] and t["verdict"] == "fail"]
    assert failing, (f"{name} breaks {requirement}, but no check citing it failed in {suite}; "
                     f"verdicts: {doc['summary']['verdicts']}\n{output}")
    assert code == 1, f"{suite} against {name}: exit code {code}, expected 1 (a gating check failed)\n{output}"


def test_every_mutant_is_listed_with_a_real_requirement() -> None:
    catalog = load_catalogs()
    classes = {n for n, obj in vars(mutants).items()
               if inspect.isclass(obj) and not n.startswith("_") and obj.__module__ == mutants.__name__}
    assert classes == set(mutants.MUTANTS), "each public class in tests/mutants/tlkv.py is a mutant in MUTANTS"
    for name, (suite, requirement) in mutants.MUTANTS.items():
        req = catalog.get(requirement)
        assert catalog.role_of_suite(suite) in req.roles, f"{name}: {requirement} is not a requirement of {suite}"
        doc = (getattr(mutants, name).__doc__ or "").strip()
        assert doc.startswith(requirement), f"{name}: docstring must start with the requirement it breaks"
    assert len({s for s, _ in mutants.MUTANTS.values()}) == 4, "mutants cover the four TLKV roles"
