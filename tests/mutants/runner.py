"""What every lane's mutant tests share: running a suite through `kvconform run` and the three lane tests.

Each run goes through `kvconform run` exactly as a vendor's target would (python: target), in its own
process, so a mutant that crashes or hangs cannot take the harness's own test run with it. The blame rule
(docs/conventions.md): each of a mutant's named check functions must fail with a failing assertion that
names the requirement the mutant breaks (the check's `blamed`), not merely cite it; no failing check of the
run may blame any other requirement unless the mutant declares it `collateral`; the exit code follows the
requirement's level (a SHOULD failure gates only under --strict). Every check function of a lane must be
failed by some mutant, except those in the lane's UNMUTATED_CHECKS (with the reason).
"""

from __future__ import annotations

import ast
import inspect
import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from kvconform.catalog import load_catalogs
from kvconform.verdicts import GATING_LEVELS
from tests.mutants import Mutant
from tests.spawn import covering, kvconform

ROOT = Path(__file__).resolve().parents[2]
TESTBED = ROOT / "tests" / "mutants" / "testbed.yaml"
SEED = "20261129"
RUN_BOUND = 300.0  # seconds a suite run may take (the default of run_suite)


@dataclass(frozen=True)
class Run:
    code: int
    coverage: dict[str, Any]  # the run's coverage.json; empty when it wrote none
    output: str  # the tail of its stdout and stderr, for failure messages


def run_suite(suite: str, target: str, report_dir: Path, *, pics: tuple[str, ...] = (),
              checks: tuple[str, ...] = (), testbed: Path | None = TESTBED, timeout: float = RUN_BOUND,
              extra: tuple[str, ...] = (), env: Mapping[str, str] | None = None) -> Run:
    """`kvconform run suite --target target`; `checks` limits it (-k) to those check functions; ``extra``: more
    `kvconform run` options (``--kbtp-wire roce``). The run is killed past ``timeout``; the test that makes it
    needs a pytest-timeout covering that (tests/spawn.py). ``env``: the run's environment (default spawn_env())."""
    select = ["-k", " or ".join(checks)] if checks else []
    overrides = [arg for p in pics for arg in ("--pics-set", p)]
    bed = ["--testbed", str(testbed)] if testbed else []
    proc = kvconform(["run", suite, "--target", target, *bed, "--report-dir", str(report_dir), "--seed", SEED, "-q",
                      *extra, *select, *overrides], timeout=timeout, env=env)
    cov = report_dir / "coverage.json"
    coverage = json.loads(cov.read_text()) if cov.exists() else {}
    return Run(proc.returncode, coverage, proc.stdout[-4000:] + proc.stderr[-4000:])


def _function(nodeid: str) -> str:
    return nodeid.split("::")[-1].split("[", 1)[0]


def _blames(tests: list[dict[str, Any]]) -> dict[str, list[str]]:
    """blamed requirement -> the failing checks (function names) that blame it."""
    out: dict[str, list[str]] = {}
    for t in tests:
        out.setdefault(str(t.get("blamed")), []).append(t["nodeid"].split("::")[-1])
    return out


@dataclass(frozen=True)
class Lane:
    """One protocol's mutants (`tests.mutants.<proto>`) and how its suites are run against them."""

    module: ModuleType
    select_checks: bool  # run only the checks a mutant names (-k): its suites are too slow to run whole
    testbed: Path | None = TESTBED  # None: the loopback testbed's defaults
    timeout: float = RUN_BOUND
    idle_bound: bool = False  # its runs mostly wait (aioquic timers): they need no CPU slot (tests/cpu_slots.py)

    @property
    def proto(self) -> str:
        return self.module.__name__.rsplit(".", 1)[-1]

    @property
    def mutants(self) -> Mapping[str, Mutant]:
        mutants: Mapping[str, Mutant] = self.module.MUTANTS
        return mutants

    def run(self, suite: str, target: str, report_dir: Path, pics: tuple[str, ...] = (),
            checks: tuple[str, ...] = ()) -> Run:
        return run_suite(suite, target, report_dir, pics=pics, checks=checks, testbed=self.testbed,
                         timeout=self.timeout)

    def assert_caught(self, name: str, report_dir: Path, *, transport: str = "") -> None:
        """``transport``: ``sim:`` runs the mutant on the deterministic transport (targets/moqt_sim.py)."""
        m = self.mutants[name]
        run = self.run(m.suite, f"{transport}python:{self.module.__name__}:{name}", report_dir, m.pics,
                       m.checks if self.select_checks else ())
        doc, output = run.coverage, run.output
        assert doc, f"no coverage.json from the run of {m.suite} against {name}:\n{output}"
        failing = [t for t in doc["tests"] if t["verdict"] == "fail"]
        blaming = [t for t in failing if t.get("blamed") == m.requirement]
        assert blaming, (f"{name} breaks {m.requirement}, but no failing assertion names it; failures blame: "
                         f"{_blames(failing)}; verdicts: {doc['summary']['verdicts']}\n{output}")
        failed = {_function(t["nodeid"]) for t in blaming}
        missed = [c for c in m.checks if c not in failed]
        assert not missed, (f"{name}: {missed} did not fail on an assertion naming {m.requirement} (failures "
                            f"blame: {_blames(failing)})\n{output}")
        allowed = {m.requirement, *m.collateral}
        stray = [t for t in failing if t.get("blamed") not in allowed]
        assert not stray, (f"{name} breaks {m.requirement}, but failures also blame other requirements "
                           f"(fix the checks, or declare a real second breakage as collateral): {_blames(stray)}")
        gating = load_catalogs().get(m.requirement).level in GATING_LEVELS
        expected = 1 if gating else 0
        assert run.code == expected, (f"{m.suite} against {name}: exit code {run.code}, expected {expected} "
                                      f"({m.requirement} is "
                                      f"{'mandatory' if gating else 'SHOULD: it gates only with --strict'})")

    def assert_mutants_listed(self) -> None:
        catalog = load_catalogs()
        # A lane's mutants live in its module, in the role modules of its package (tests/mutants/kvcs/), or in a
        # sibling module it imports them from (tests/mutants/kbtp_wire.py).
        classes = {n for n, obj in vars(self.module).items()
                   if inspect.isclass(obj) and not n.startswith("_")
                   and ((obj.__module__ + ".").startswith(self.module.__name__ + ".")
                        or obj.__module__.startswith(self.module.__name__ + "_"))}
        assert classes == set(self.mutants), (f"each public class in tests/mutants/{self.proto}.py is a mutant "
                                              "in MUTANTS")
        for name, m in self.mutants.items():
            req = catalog.get(m.requirement)
            assert catalog.role_of_suite(m.suite) in req.roles, (f"{name}: {m.requirement} is not a requirement "
                                                                 f"of {m.suite}")
            for other in m.collateral:
                assert other in catalog and other != m.requirement, f"{name}: collateral {other!r} is not another id"
            doc = (getattr(self.module, name).__doc__ or "").strip()
            assert doc.startswith(m.requirement), f"{name}: docstring must start with the requirement it breaks"

    def check_functions(self) -> dict[str, set[str]]:
        """suite -> the check functions of its modules (read from the source, not imported)."""
        out: dict[str, set[str]] = {}
        for path in (ROOT / "conformance" / self.proto).glob("*/test_*.py"):
            tree = ast.parse(path.read_text())
            out.setdefault(f"{self.proto}-{path.parent.name}", set()).update(
                n.name for n in tree.body if isinstance(n, ast.FunctionDef) and n.name.startswith("test_"))
        return out

    def assert_every_check_caught(self) -> None:
        named: dict[str, set[str]] = {}
        for m in self.mutants.values():
            named.setdefault(m.suite, set()).update(m.checks)
        functions = self.check_functions()
        assert functions, f"no checks found under conformance/{self.proto}"
        unmutated: Mapping[str, str] = self.module.UNMUTATED_CHECKS
        # A suite only mutants name (its checks not found) shows up as stale below.
        for suite in sorted(functions.keys() | named.keys()):
            checks = functions.get(suite, set())
            missing = sorted(checks - named.get(suite, set()) - set(unmutated))
            assert not missing, f"{suite}: checks no mutant is shown to fail: {missing}"
            stale = sorted(named.get(suite, set()) - checks)
            assert not stale, f"{suite}: mutants name checks that do not exist: {stale}"

    def tests(self) -> tuple[Callable[[str, Path], None], Callable[[], None], Callable[[], None]]:
        """test_mutant_is_caught, test_every_mutant_is_listed_with_a_real_requirement and
        test_every_check_has_a_mutant_it_catches for the lane's test module to bind under those names."""

        @pytest.mark.slow
        @covering(self.timeout)
        @pytest.mark.parametrize("name", sorted(self.mutants))
        def test_mutant_is_caught(name: str, tmp_path: Path) -> None:
            self.assert_caught(name, tmp_path)

        if self.idle_bound:
            test_mutant_is_caught = pytest.mark.idle_bound(test_mutant_is_caught)

        def test_every_mutant_is_listed_with_a_real_requirement() -> None:
            self.assert_mutants_listed()

        def test_every_check_has_a_mutant_it_catches() -> None:
            self.assert_every_check_caught()

        return (test_mutant_is_caught, test_every_mutant_is_listed_with_a_real_requirement,
                test_every_check_has_a_mutant_it_catches)
