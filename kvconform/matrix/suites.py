"""The role suites of the matrix: ``kvconform run <suite>`` once per implementation and role, reused by its cells.

Each run gets a testbed file of its own naming the implementation as a target with exactly the PICS the
registry declares for the role, and reports to ``<out>/suites/<implementation>/<suite>/`` (coverage.json,
coverage.html, junit.xml, evidence). A relay the harness starts (``cmd:``) is started for the suite (its
``suite:`` form when the registry gives one: e.g. with the authorization policy its PICS describe) and the
suite reaches it at its ``moqt://127.0.0.1:PORT``. An ``image:`` role is the run's ``docker`` target (the container
contract, its containers labelled with the matrix run); an ``image:`` relay is started by the suite itself, with
the policy its PICS describe. The suite's outcome, for the cells:

- ``pass``: every gating (MUST / RULE) check passed or was not applicable;
- ``fail``: a gating check failed (the requirements it blamed are listed);
- ``inconclusive``: no gating failure but a gating check could not judge, or the suite did not run to its
  report (the implementation could not be started, the run was stopped at its bound, a usage error).
"""

from __future__ import annotations

import json
import os
import shlex
import sys
import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import yaml

from kvconform.matrix.participants import remove_containers, start_relay, target_spec, write_certificates
from kvconform.matrix.registry import Registry, RoleEntry
from kvconform.targets.process import run_process
from kvconform.targets.registry import ROLES
from kvconform.verdicts import TargetUnavailable, Verdict, gates

__all__ = ["SuiteRun", "run_suite"]

GRACE_S = 120.0  # past the suite budget: interpreter start, the last check's own bound, the report


@dataclass
class SuiteRun:
    """How one implementation's role suite went."""

    implementation: str
    suite: str
    outcome: str  # pass | fail | inconclusive
    message: str
    counts: dict[str, int] = field(default_factory=dict)
    exit_code: int | None = None
    report: str | None = None  # coverage.html, relative to the matrix's folder
    coverage: str | None = None  # coverage.json, relative
    log: str | None = None  # the run's console output, relative
    target: str = ""
    duration_s: float = 0.0
    failed: list[dict[str, str]] = field(default_factory=list)  # gating failures: check, requirement, message

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def _testbed_target(entry: RoleEntry, form_kind: str, value: str,
                    params: dict[str, Any] | None = None) -> dict[str, Any]:
    target: dict[str, Any] = {"driver": form_kind, "description": f"{entry.label}, from the implementations registry",
                              "roles": [entry.suite], "pics": entry.pics}
    if form_kind != "reference":
        target[form_kind] = value
    if params:
        target["params"] = params
    return target


def _judge(run: SuiteRun, coverage: Path) -> None:
    doc = json.loads(coverage.read_text("utf-8"))
    tests = doc.get("tests", [])
    run.counts = dict(sorted(Counter(t["verdict"] for t in tests).items()))
    gating = [t for t in tests if gates(t.get("level"), strict=False)]
    failed = [t for t in gating if t["verdict"] == Verdict.FAIL]
    unjudged = [t for t in gating if t["verdict"] == Verdict.INCONCLUSIVE]
    run.failed = [{"check": t["nodeid"].rsplit("::", 1)[-1],
                   "requirement": t.get("blamed") or (t.get("reqs") or [""])[0],
                   "message": (t.get("message") or "")[:600]} for t in failed]
    summary = ", ".join(f"{n} {v}" for v, n in run.counts.items()) or "no checks"
    if failed:
        reqs = sorted({f["requirement"] for f in run.failed})
        run.outcome = "fail"
        more = " ..." if len(reqs) > 8 else ""
        run.message = f"{len(failed)} gating checks fail ({', '.join(reqs[:8])}{more}); {summary}"
    elif unjudged:
        run.outcome = "inconclusive"
        run.message = f"{len(unjudged)} gating checks inconclusive; {summary}"
    elif not tests:
        run.outcome = "inconclusive"
        run.message = "the suite ran no check"
    else:
        run.outcome = "pass"
        run.message = summary


def run_suite(entry: RoleEntry, registry: Registry, out: Path, folder: Path, *, budget_s: float,
              check_timeout_s: float, env: dict[str, str], run_id: str) -> SuiteRun:
    """Run ``entry``'s role suite (bounded by ``budget_s`` + a grace period); never raises for the outcome."""
    folder.mkdir(parents=True, exist_ok=True)
    report = folder / "report"
    rel = os.path.relpath
    run = SuiteRun(entry.implementation, entry.suite, "inconclusive", "", target=entry.suite_run.describe())
    started = time.monotonic()
    relay = None
    tmp = folder / "tmp"
    tmp.mkdir(exist_ok=True)
    label = f"suite-{entry.implementation}-{entry.suite}"
    try:
        form = entry.suite_run
        try:
            spec = target_spec(entry.implementation, entry.suite, form, entry.pics, mounts=[tmp], cell=label,
                               registry_dir=registry.path.parent, run=run_id)
            if spec.kind == "cmd" and ROLES[entry.suite].cmd is None:
                # a relay: kvconform run has no cmd: driver for it, so it is started here and its suite given its
                # URL; {certs} under tmp: the folder a container of the suite mounts
                relay = start_relay(spec, form.ready, write_certificates(tmp / "certs"), env=env)
                kind, value = "url", relay.url
            else:
                # an image: relay too: the suite's own ContainerRelay starts it with the policy its PICS describe
                kind, value = spec.kind, spec.value
        except TargetUnavailable as exc:
            run.message = f"{entry.label} could not be started for its suite: {exc}"
            return run
        testbed = folder / "testbed.yaml"
        testbed.write_text(yaml.safe_dump({"name": f"matrix-{entry.implementation}-{entry.suite}", "targets": {
            entry.implementation: _testbed_target(entry, kind, value, spec.params if kind == "docker" else None)}},
            sort_keys=False), "utf-8")
        run.target = f"{entry.implementation} ({kind}: {value})" if kind != "reference" else entry.implementation
        argv = [sys.executable, "-m", "kvconform", "run", entry.suite, "--testbed", str(testbed), "--target",
                entry.implementation, "--report-dir", str(report), "--suite-budget", f"{budget_s:g}",
                "--timeout", f"{check_timeout_s:g}", "-q"]
        result = run_process(argv, budget_s + GRACE_S, env={**env, "TMPDIR": str(tmp)}, what="suite run")
        log = folder / "run.log"
        stopped = " (stopped at its bound)" if result.timed_out else ""
        log.write_text(f"$ {shlex.join(argv)}\nexit {result.returncode}{stopped}"
                       f"\n---- stdout\n{result.stdout.decode('utf-8', 'replace')}\n---- stderr\n"
                       f"{result.stderr.decode('utf-8', 'replace')}\n", "utf-8")
        run.log = rel(log, out)
        run.exit_code = result.returncode
        coverage = report / "coverage.json"
        if coverage.is_file():
            run.coverage = rel(coverage, out)
            if (report / "coverage.html").is_file():
                run.report = rel(report / "coverage.html", out)
            _judge(run, coverage)
            if result.timed_out:
                run.outcome, run.message = "inconclusive", f"stopped after {budget_s + GRACE_S:g} s; {run.message}"
        else:
            tail = result.stderr.decode("utf-8", "replace").strip()[-800:]
            why = f"stopped after {budget_s + GRACE_S:g} s" if result.timed_out else f"exit {result.returncode}"
            run.message = f"the suite wrote no report ({why}): {tail}"
        return run
    finally:
        if entry.suite_run.in_docker:
            try:
                remove_containers(run_id, label)
            except Exception as exc:  # best effort: the containers carry the owner label for reaping
                run.message += f" (leftover containers not removed: {exc!r})"
        if relay is not None:
            ended = relay.stop()
            if ended is not None:
                (folder / "relay.log").write_text(
                    f"argv {relay.argv}\nexit {ended.returncode}\n---- stdout\n{ended.stdout_text}\n---- stderr\n"
                    f"{ended.stderr_text}\n", "utf-8")
        run.duration_s = round(time.monotonic() - started, 3)
