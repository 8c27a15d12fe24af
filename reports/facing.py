"""One report from two paths to one device (issue 23 item 7): a device-resident implementation reached through
verbs (the primary path: the harness on the device) and through a userspace wire binding facing the same device
(``kbtp+roce://`` to a target served on rxe, ``kbtp+iwarp://`` to one on siw; for an initiator, the harness's
target on a userspace wire the initiator on the device connects to). What verbs cannot see or craft (the wire
attacks, an initiator's one-sided operations, the impairment checks) the facing wire judges.

Per check (by node id), across the paths that ran it:

- a fail on either path is a fail (both paths' failures are named);
- else a judged verdict (pass, xfail) on either path is the check's verdict: an inconclusive on the other path
  says only that this path could not see it;
- else inconclusive on any path stays inconclusive, naming every path's reason;
- else not applicable (the primary's reason).

Every merged check's message starts with the path that judged it (``[judged on verbs:rxe0]``, ``[judged on
kbtp+roce://...]``), or with the paths it was inconclusive on (``[inconclusive on verbs:rxe0, kbtp+roce://...]``).
A facing wire that could not be reached judged nothing: the checks waiting for it stay inconclusive and say which
wire was unreachable and why; never a pass.

The merged results are rebuilt into a coverage document and certified like any run (reports/certification.py),
so the certification verdict is the two paths' verdict.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from kvconform.catalog import Catalog
from kvconform.reports.certification import certify
from kvconform.reports.coverage import build_coverage
from kvconform.reports.html import write_html
from kvconform.results import TestResult, gating_failures
from kvconform.verdicts import Verdict

__all__ = ["FACING_REASONS", "FACING_SUITES", "RunPath", "facing_keyword", "facing_nodeids", "facing_suite",
           "merge_paths", "merged_report", "path_of", "read_path", "run_facing"]

# Inconclusive reasons a facing wire can settle (docs/interop-rdma.md, "What a verbs device hides"): the device
# builds every packet itself (no wire attack can be crafted), executes the initiator's one-sided operations
# without the harness seeing them, owns the link the impairment checks would impair.
FACING_REASONS: tuple[str, ...] = ("builds every packet itself", "without the harness seeing them",
                                   "has none the harness can impair", "acts on the harness's own wire links")

_JUDGED = (Verdict.PASS, Verdict.XFAIL)


@dataclass(frozen=True)
class RunPath:
    """One path's results: its name as the report shows it (``verbs:rxe0``, ``kbtp+roce://...``), its checks,
    where its evidence lives relative to the merged report (``""``: the merged report's own folder), and why it
    could not be run (None: it ran)."""

    name: str
    results: tuple[TestResult, ...] = ()
    evidence_dir: str = ""
    unreachable: str | None = None


def path_of(doc: Mapping[str, Any], name: str, evidence_dir: str = "") -> RunPath:
    """A path from a coverage.json document (its ``tests``)."""
    return RunPath(name, tuple(TestResult.from_dict(t) for t in doc.get("tests", [])), evidence_dir)


def facing_nodeids(results: Iterable[TestResult], reasons: Sequence[str] = FACING_REASONS) -> list[str]:
    """The checks a facing wire should judge: inconclusive on the primary path for a reason verbs imposes."""
    return [r.nodeid for r in results
            if r.verdict == Verdict.INCONCLUSIVE and any(why in r.message for why in reasons)]


def _rebased(r: TestResult, evidence_dir: str) -> TestResult:
    if not r.evidence or not evidence_dir or os.path.isabs(r.evidence):
        return r
    return replace(r, evidence=os.path.join(evidence_dir, r.evidence))


def _tagged(r: TestResult, path: str, note: str = "") -> TestResult:
    return replace(r, message=f"[judged on {path}] {r.message}".rstrip() + note)


def _merge_one(entries: list[tuple[RunPath, TestResult]], waiting: list[RunPath]) -> TestResult:
    """One check's verdict from its results on the paths that ran it (``waiting``: facing paths that should
    have judged it but could not be reached)."""
    fails = [(p, r) for p, r in entries if r.verdict == Verdict.FAIL]
    if fails:
        p, first = fails[0]
        also = "".join(f"; it fails on {q.name} too: {r.message}" for q, r in fails[1:])
        return _tagged(first, p.name, also)
    judged = [(p, r) for p, r in entries if r.verdict in _JUDGED]
    if judged:
        p, r = next(((p, r) for p, r in judged if r.verdict == Verdict.PASS), judged[0])
        unseen = [q.name for q, o in entries if o.verdict == Verdict.INCONCLUSIVE]
        note = f" (inconclusive on {', '.join(unseen)})" if unseen else ""
        return _tagged(r, p.name, note)
    open_ = [(p, r) for p, r in entries if r.verdict == Verdict.INCONCLUSIVE]
    if open_ or waiting:
        base = (open_ or entries)[0][1]
        reasons = [f"on {p.name}: {r.message}" for p, r in open_]
        reasons += [f"the facing wire {p.name} could not be reached ({p.unreachable}), so it judged nothing"
                    for p in waiting]
        names = ", ".join([p.name for p, _ in open_] + [p.name for p in waiting])
        return replace(base, verdict=Verdict.INCONCLUSIVE, message=f"[inconclusive on {names}] " + "; ".join(reasons),
                       blamed=None)
    p, r = entries[0]
    return _tagged(r, p.name)


def merge_paths(primary: RunPath, facing: Sequence[RunPath]) -> list[TestResult]:
    """Every check of ``primary`` and of the ``facing`` paths, merged by node id (module docstring), in the
    primary's order, then the checks only a facing path ran."""
    order: list[str] = []
    runs: dict[str, list[tuple[RunPath, TestResult]]] = {}
    for path in (primary, *facing):
        for r in path.results:
            if r.nodeid not in runs:
                order.append(r.nodeid)
                runs[r.nodeid] = []
            runs[r.nodeid].append((path, _rebased(r, path.evidence_dir)))
    wanted = set(facing_nodeids(primary.results))
    down = [p for p in facing if p.unreachable is not None]
    out = []
    for nodeid in order:
        out.append(_merge_one(runs[nodeid], down if nodeid in wanted else []))
    return out


def merged_report(catalog: Catalog, primary_doc: Mapping[str, Any], primary: RunPath, facing: Sequence[RunPath], *,
                  strict: bool = False, suites: Iterable[str] | None = None,
                  report_dir: str | Path | None = None) -> dict[str, Any]:
    """The certification report (coverage.json) of the merged paths: ``primary_doc``'s meta and identity, the
    merged checks (only those of ``suites`` when given: one role's certification), its verdict recomputed."""
    results = merge_paths(primary, facing)
    if suites is not None:
        keep = set(suites)
        results = [r for r in results if r.suite in keep]
    exit_code = 1 if gating_failures(results, strict) else 0
    meta = {**primary_doc.get("meta", {}), "exit_code": exit_code,
            "facing": {"primary": primary.name,
                       "paths": [{"name": p.name, "evidence_dir": p.evidence_dir, "unreachable": p.unreachable,
                                  "checks": len(p.results)} for p in facing]}}
    rdir = None if report_dir is None else str(report_dir)
    # the evidence paths are already relative to the merged report (RunPath.evidence_dir): not rebased again
    doc = build_coverage(catalog, results, meta)
    out: dict[str, Any] = certify(doc, primary_doc.get("identity"), strict=strict, exit_code=exit_code,
                                  report_dir=rdir)
    return out


def facing_keyword(nodeids: Iterable[str]) -> str:
    """A ``-k`` expression selecting the checks of ``nodeids`` (by function name: every parameter of each)."""
    names = sorted({n.split("::")[-1].split("[")[0] for n in nodeids})
    return " or ".join(names)


def read_path(name: str, directory: str | Path, merged_dir: str | Path) -> RunPath:
    """The path whose report is in ``directory`` (its coverage.json), evidence relative to ``merged_dir``;
    unreachable, with the reason, when the run there left no report."""
    cov = Path(directory) / "coverage.json"
    rel = os.path.relpath(os.path.abspath(directory), os.path.abspath(merged_dir))
    try:
        doc = json.loads(cov.read_text("utf-8"))
    except (OSError, ValueError) as exc:
        return RunPath(name, (), rel, f"its run left no report ({cov}: {getattr(exc, 'strerror', None) or exc})")
    return path_of(doc, name, "" if rel == "." else rel)


# ---- kvconform run --facing URL: both paths in one run ----------------------------------------------------------

# The suite a facing URL serves, by its form: a wire to a target served on the device, or (cmd:) an initiator
# on the device launched against the harness's target on a userspace wire
FACING_SUITES = {"kbtp+roce": "kbtp-target", "kbtp+iwarp": "kbtp-target", "cmd": "kbtp-initiator"}
FACING_DIR = "facing-{n}"  # a facing run's report folder, inside the merged one
PRIMARY_COVERAGE = "coverage-primary.json"  # the run through verbs as it ended, before the merge


def facing_suite(url: str) -> str | None:
    """The suite a ``--facing`` URL can judge checks of (None: not a facing form)."""
    return FACING_SUITES.get(url.split(":", 1)[0])


def run_facing(catalog: Catalog, report_dir: Path, urls: Sequence[str], run_args: Sequence[str], *,
               bound_s: float) -> int:
    """After the primary run wrote ``report_dir``: for each facing URL, `kvconform run` of its suite's checks the
    primary left inconclusive for a reason of verbs (``FACING_REASONS``), with the primary's PICS and seed
    (``run_args``: the rest of the options, e.g. --testbed), each bounded by ``bound_s``; then the merged report
    replaces coverage.json and coverage.html (the primary's is kept as coverage-primary.json). Returns the merged
    run's exit status."""
    primary_doc = json.loads((report_dir / "coverage.json").read_text("utf-8"))
    (report_dir / PRIMARY_COVERAGE).write_text(json.dumps(primary_doc, indent=1, default=str) + "\n", "utf-8")
    meta = primary_doc.get("meta", {})
    target = meta.get("target", {})
    primary = path_of(primary_doc, str(target.get("name") or target.get("value") or "the primary path"))
    pics = meta.get("pics", {}).get("kbtp")
    paths: list[RunPath] = []
    for n, url in enumerate(urls, 1):
        sub = report_dir / FACING_DIR.format(n=n)
        shutil.rmtree(sub, ignore_errors=True)
        suite = facing_suite(url)
        wanted = facing_nodeids(r for r in primary.results if r.suite == suite)
        if not wanted:
            paths.append(RunPath(url, (), FACING_DIR.format(n=n)))  # nothing for it to judge
            continue
        argv = [sys.executable, "-m", "kvconform", "run", str(suite), "--target", url, "--report-dir", str(sub),
                "-k", facing_keyword(wanted), "--seed", str(meta.get("seed", 0)), *run_args]
        if isinstance(pics, dict):
            argv += ["--pics-set", f"kbtp={json.dumps(pics)}"]
        print(f"kvconform: facing {url}: {len(wanted)} checks verbs could not judge", flush=True)
        try:
            done = subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=bound_s)
            why = f"exit status {done.returncode}: {(done.stderr or done.stdout).strip()[-300:]}"
        except subprocess.TimeoutExpired:
            why = f"it did not end within {bound_s:g} s"
        path = read_path(url, sub, report_dir)
        paths.append(replace(path, unreachable=f"{path.unreachable}; {why}") if path.unreachable else path)
    doc = merged_report(catalog, primary_doc, primary, paths, strict=bool(meta.get("strict")), report_dir=report_dir)
    (report_dir / "coverage.json").write_text(json.dumps(doc, indent=1, default=str) + "\n", "utf-8")
    write_html(doc, report_dir / "coverage.html", report_dir)
    print(f"kvconform: {doc['verdict']['text']}")
    return int(doc["meta"]["exit_code"])
