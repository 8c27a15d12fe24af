"""Every KBTP mutant is caught, and every KBTP check catches a mutant; the reference passes the suites
with every feature enabled and with each feature disabled.

Each run goes through `kvconform run` exactly as a vendor's target would (python: target), in its own
process. A mutant's run is limited (-k) to the checks it names, which must fail citing the requirement it
breaks; the exit code follows that requirement's level (a SHOULD failure gates only under --strict).
"""

from __future__ import annotations

import ast
import inspect
import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from kvconform.catalog import load_catalogs
from kvconform.verdicts import GATING_LEVELS
from tests.mutants import kbtp as mutants

ROOT = Path(__file__).resolve().parents[1]
TESTBED = ROOT / "tests" / "mutants" / "testbed.yaml"
SUITES = ROOT / "conformance" / "kbtp"
RUN_TIMEOUT = 600
SEED = "20261129"


def run_suite(suite: str, target: str, report_dir: Path, pics: tuple[str, ...] = (),
              select: str | None = None) -> tuple[int, dict[str, Any], str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    overrides = [arg for p in pics for arg in ("--pics-set", p)]
    chosen = ["-k", select] if select else []
    proc = subprocess.run(
        [sys.executable, "-m", "kvconform", "run", suite, "--target", target, "--testbed", str(TESTBED),
         "--report-dir", str(report_dir), "--seed", SEED, "-q", *chosen, *overrides],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=RUN_TIMEOUT, stdin=subprocess.DEVNULL)
    cov = report_dir / "coverage.json"
    doc = json.loads(cov.read_text()) if cov.exists() else {}
    return proc.returncode, doc, proc.stdout[-4000:] + proc.stderr[-4000:]


def _function(nodeid: str) -> str:
    return nodeid.split("::")[-1].split("[", 1)[0]


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(mutants.MUTANTS))
def test_mutant_is_caught(name: str, tmp_path: Path) -> None:
    m = mutants.MUTANTS[name]
    code, doc, output = run_suite(m.suite, f"python:tests.mutants.kbtp:{name}", tmp_path, m.pics,
                                  " or ".join(m.checks))
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


FEATURES = ["DIRECT_LOAD", "DIRECT_ALLOC", "ADDR_LE"]
REFERENCE_RUNS = {
    "target-all": ("kbtp-target", ()),
    "target-ib-all": ("kbtp-target", ("kbtp.target.binding=ib-rc", "kbtp.target.features=[DIRECT_LOAD, DIRECT_ALLOC, "
                                      "RECORD_COMPLETION, ADDR_LE]")),
    **{f"target-without-{f}": ("kbtp-target", (f"kbtp.target.features=[{', '.join(x for x in FEATURES if x != f)}]",))
       for f in FEATURES},
    "target-none": ("kbtp-target", ("kbtp.target.features=[]",)),
    "initiator-all": ("kbtp-initiator", ()),
    "initiator-ib-all": ("kbtp-initiator", ("kbtp.initiator.binding=ib-rc", "kbtp.initiator.features=[DIRECT_LOAD, "
                                            "DIRECT_ALLOC, RECORD_COMPLETION, ADDR_LE]")),
    **{f"initiator-without-{f}": ("kbtp-initiator",
                                  (f"kbtp.initiator.features=[{', '.join(x for x in FEATURES if x != f)}]",))
       for f in FEATURES},
}


@pytest.mark.slow
@pytest.mark.parametrize("variant", sorted(REFERENCE_RUNS))
def test_reference_passes(variant: str, tmp_path: Path) -> None:
    suite, pics = REFERENCE_RUNS[variant]
    code, doc, output = run_suite(suite, "reference", tmp_path, (*pics, "kbtp.target.interleavings=30"))
    assert doc, output
    bad = [(t["nodeid"], t.get("message", "")) for t in doc["tests"] if t["verdict"] in ("fail", "inconclusive")]
    assert code == 0 and not bad, f"{suite} ({variant}) against the reference: exit {code}, {bad}\n{output}"


def test_every_mutant_is_listed_with_a_real_requirement() -> None:
    catalog = load_catalogs()
    classes = {n for n, obj in vars(mutants).items()
               if inspect.isclass(obj) and not n.startswith("_") and obj.__module__ == mutants.__name__
               and n != "Mutant"}
    assert classes == set(mutants.MUTANTS), "each public class in tests/mutants/kbtp.py is a mutant in MUTANTS"
    for name, m in mutants.MUTANTS.items():
        req = catalog.get(m.requirement)
        assert catalog.role_of_suite(m.suite) in req.roles, f"{name}: {m.requirement} is not a requirement of {m.suite}"
        doc = (getattr(mutants, name).__doc__ or "").strip()
        assert doc.startswith(m.requirement), f"{name}: docstring must start with the requirement it breaks"


def _check_functions() -> dict[str, set[str]]:
    """suite -> the check functions of its modules (read from the source, not imported)."""
    out: dict[str, set[str]] = {}
    for path in SUITES.glob("*/test_*.py"):
        suite = f"kbtp-{path.parent.name}"
        tree = ast.parse(path.read_text())
        out.setdefault(suite, set()).update(
            n.name for n in tree.body if isinstance(n, ast.FunctionDef) and n.name.startswith("test_"))
    return out


def test_every_check_has_a_mutant_it_catches() -> None:
    named: dict[str, set[str]] = {}
    for m in mutants.MUTANTS.values():
        named.setdefault(m.suite, set()).update(m.checks)
    for suite, checks in _check_functions().items():
        missing = sorted(checks - named.get(suite, set()) - set(mutants.UNMUTATED_CHECKS))
        assert not missing, f"{suite}: checks no mutant is shown to fail: {missing}"
        stale = sorted(named.get(suite, set()) - checks)
        assert not stale, f"{suite}: mutants name checks that do not exist: {stale}"


def test_every_testable_kbtp_requirement_is_cited() -> None:
    """The KBTP counterpart of tests/test_requirements_cited.py (which reads the TLKV suites)."""
    catalog = load_catalogs()
    ids = {r.id for r in catalog.requirements("kbtp")}
    cited: set[str] = set()
    for path in SUITES.glob("*/test_*.py"):
        for call in re.findall(r"pytest\.mark\.req\(([^)]*)\)", path.read_text()):
            cited.update(re.findall(r'"(KBTP-[A-Z0-9-]+)"', call))
        cited.update(re.findall(r'Case\("[^"]+", \(([^)]*)\)', path.read_text()) and
                     {i for c in re.findall(r'Case\("[^"]+", \(([^)]*)\)', path.read_text())
                      for i in re.findall(r'"(KBTP-[A-Z0-9-]+)"', c)})
    assert cited <= ids, f"checks cite ids the catalog lacks: {sorted(cited - ids)}"
    testable = {r.id for r in catalog.requirements("kbtp") if r.testable}
    assert not testable - cited, f"testable requirements no check cites: {sorted(testable - cited)}"
