"""Every MOQT mutant relay is caught, and every moqt-relay check catches a mutant.

Each mutant runs through `kvconform run moqt-relay --target python:tests.mutants.moqt:<Name>` exactly as a
vendor's relay class would, in its own process, so a mutant that crashes or hangs cannot take the
harness's own test run with it. Only the checks it names are selected (-k), which keeps each run short;
they must fail, one of them citing the requirement the mutant breaks. The PICS are the loopback
testbed's defaults (the harness starts the mutant with the matching policy).
"""

from __future__ import annotations

import ast
import inspect
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from kvconform.catalog import load_catalogs
from kvconform.verdicts import GATING_LEVELS
from tests.mutants import moqt as mutants

ROOT = Path(__file__).resolve().parents[1]
SUITES = ROOT / "conformance" / "moqt"
RUN_TIMEOUT = 300


def run_suite(suite: str, target: str, report_dir: Path, checks: tuple[str, ...],
              pics: tuple[str, ...] = ()) -> tuple[int, dict[str, Any], str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    overrides = [arg for p in pics for arg in ("--pics-set", p)]
    select = ["-k", " or ".join(checks)] if checks else []
    proc = subprocess.run(
        [sys.executable, "-m", "kvconform", "run", suite, "--target", target, "--report-dir", str(report_dir),
         "--seed", "20261129", "-q", *select, *overrides],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=RUN_TIMEOUT, stdin=subprocess.DEVNULL)
    cov = report_dir / "coverage.json"
    doc = json.loads(cov.read_text()) if cov.exists() else {}
    return proc.returncode, doc, proc.stdout[-4000:] + proc.stderr[-4000:]


@pytest.mark.slow
def test_reference_passes_in_process(tmp_path: Path) -> None:
    """`kvconform run moqt-relay` (target reference: the relay in-process with the PICS' policy) is green:
    no check fails against the correct relay, so the mutants below fail for what they break."""
    code, doc, output = run_suite("moqt-relay", "reference", tmp_path, ())
    assert code == 0 and doc["summary"]["verdicts"].get("fail", 0) == 0, output


@pytest.mark.slow
def test_reference_passes_over_a_url(tmp_path: Path) -> None:
    """`kvconform serve moqt-relay --policy testbeds/moqt-relay-policy.yaml` (the policy the loopback PICS
    describe) passes the suite as `--target moqt://127.0.0.1:PORT`."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen([sys.executable, "-m", "kvconform", "serve", "moqt-relay", "--port", "0", "--policy",
                             str(ROOT / "testbeds" / "moqt-relay-policy.yaml")],
                            cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            stdin=subprocess.DEVNULL)
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()  # "listening on 127.0.0.1:PORT", flushed once bound
        assert line.startswith("listening on "), f"serve moqt-relay printed {line!r}"
        url = "moqt://" + line.split()[-1]
        code, doc, output = run_suite("moqt-relay", url, tmp_path, ())
        assert code == 0 and doc["summary"]["verdicts"].get("fail", 0) == 0, output
        assert doc["summary"]["verdicts"].get("pass", 0) > 0
    finally:
        proc.terminate()
        proc.wait(10)


def _function(nodeid: str) -> str:
    return nodeid.split("::")[-1].split("[", 1)[0]


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(mutants.MUTANTS))
def test_mutant_is_caught(name: str, tmp_path: Path) -> None:
    m = mutants.MUTANTS[name]
    code, doc, output = run_suite(m.suite, f"python:tests.mutants.moqt:{name}", tmp_path, m.checks, m.pics)
    assert doc, f"no coverage.json from the run of {m.suite} against {name}:\n{output}"
    failing = [t for t in doc["tests"] if t["verdict"] == "fail"]
    citing = [t["nodeid"] for t in failing if m.requirement in t["reqs"]]
    assert citing, (f"{name} breaks {m.requirement}, but no check citing it failed; "
                    f"verdicts: {doc['summary']['verdicts']}\n{output}")
    failed = {_function(t["nodeid"]) for t in failing}
    missed = [c for c in m.checks if c not in failed]
    assert not missed, f"{name}: {missed} did not fail (failed: {sorted(failed)})\n{output}"
    gating = load_catalogs().get(m.requirement).level in GATING_LEVELS
    assert code == (1 if gating else 0), (f"{m.suite} against {name}: exit code {code}, expected "
                                          f"{1 if gating else 0} ({m.requirement} is "
                                          f"{'mandatory' if gating else 'SHOULD: it gates only with --strict'})")


def test_every_mutant_is_listed_with_a_real_requirement() -> None:
    catalog = load_catalogs()
    classes = {n for n, obj in vars(mutants).items()
               if inspect.isclass(obj) and not n.startswith("_") and obj.__module__ == mutants.__name__
               and n != "Mutant"}
    assert classes == set(mutants.MUTANTS), "each public class in tests/mutants/moqt.py is a mutant in MUTANTS"
    for name, m in mutants.MUTANTS.items():
        req = catalog.get(m.requirement)
        assert catalog.role_of_suite(m.suite) in req.roles, f"{name}: {m.requirement} is not a requirement of {m.suite}"
        doc = (getattr(mutants, name).__doc__ or "").strip()
        assert doc.startswith(m.requirement), f"{name}: docstring must start with the requirement it breaks"


def _check_functions() -> dict[str, set[str]]:
    """suite -> the check functions of its modules (read from the source, not imported)."""
    out: dict[str, set[str]] = {}
    for path in SUITES.glob("*/test_*.py"):
        suite = f"moqt-{path.parent.name}"
        tree = ast.parse(path.read_text())
        out.setdefault(suite, set()).update(
            n.name for n in tree.body if isinstance(n, ast.FunctionDef) and n.name.startswith("test_"))
    return out


def test_every_check_has_a_mutant_it_catches() -> None:
    named: dict[str, set[str]] = {}
    for m in mutants.MUTANTS.values():
        named.setdefault(m.suite, set()).update(m.checks)
    functions = _check_functions()
    assert functions.get("moqt-relay"), f"no moqt-relay checks found under {SUITES}"
    for suite, checks in functions.items():
        missing = sorted(checks - named.get(suite, set()) - set(mutants.UNMUTATED_CHECKS))
        assert not missing, f"{suite}: checks no mutant is shown to fail: {missing}"
        stale = sorted(named.get(suite, set()) - checks)
        assert not stale, f"{suite}: mutants name checks that do not exist: {stale}"
