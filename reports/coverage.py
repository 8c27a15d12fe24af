"""Requirement coverage: every requirement of the protocols that ran, per role, with its tests and verdicts.

A test's verdict *for one requirement it cites* follows the blame rule (docs/conventions.md): a failed test
fails only the requirement its failing assertion named (``blamed``), the others it cites are "not-reached";
a passed test passes only the requirements an assertion of it evaluated (``reached``), the others are
"not-reached" too; any other verdict (inconclusive, not-applicable, xfail) holds for every id it cites.

The verdict of a requirement is the worst of those per-requirement verdicts (fail > inconclusive > xfail >
pass > not-applicable: a not-applicable test ran nothing, so it only shows when no test of the requirement
ran); "not-reached" when every test citing it left it unasserted, "untestable" for a requirement the catalog
marks so and no test covers, else "uncovered".
"""

from __future__ import annotations

import json
import os
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

from kvconform.catalog import Catalog, Requirement
from kvconform.results import NOT_REACHED, TestResult
from kvconform.verdicts import Verdict

__all__ = [
    "COVERAGE_FORMAT",
    "VERDICT_SEVERITY",
    "build_coverage",
    "load_coverage",
    "provisional_counts",
    "suite_counts",
    "worst_verdict",
    "write_coverage_json",
]

COVERAGE_FORMAT = "kvconform-coverage/1"
# Worst first.
VERDICT_SEVERITY: tuple[str, ...] = (
    Verdict.FAIL, Verdict.INCONCLUSIVE, Verdict.XFAIL, Verdict.PASS, Verdict.NOT_APPLICABLE,
)
UNCOVERED = "uncovered"
UNTESTABLE = "untestable"


def worst_verdict(verdicts: Iterable[str]) -> str | None:
    """The worst of ``verdicts`` by VERDICT_SEVERITY; None when there are none."""
    ranks = [VERDICT_SEVERITY.index(v) for v in verdicts if v in VERDICT_SEVERITY]
    return VERDICT_SEVERITY[min(ranks)] if ranks else None


def suite_counts(results: Iterable[TestResult]) -> dict[str, dict[str, int]]:
    """Per suite (``-`` for tests outside any suite), the number of tests of each verdict."""
    counts: dict[str, Counter[str]] = {}
    for r in results:
        counts.setdefault(r.suite or "-", Counter())[r.verdict] += 1
    return {suite: dict(sorted(c.items())) for suite, c in sorted(counts.items())}


def provisional_counts(catalog: Catalog, results: Iterable[TestResult]) -> dict[str, int]:
    """Per provisional profile, how many tests cite a requirement that depends on it."""
    counts: Counter[str] = Counter()
    for r in results:
        profiles = {p for rid in r.reqs if rid in catalog for p in catalog.get(rid).depends_on}
        counts.update(profiles)
    return dict(sorted(counts.items()))


def _relative_evidence(r: TestResult, report_dir: str | None) -> TestResult:
    if not r.evidence or not report_dir:
        return r
    # Relative to the report folder so the folder can be moved or archived whole.
    rel = os.path.relpath(os.path.abspath(r.evidence), os.path.abspath(report_dir))
    return replace(r, evidence=rel)


def _test_entry(r: TestResult, rid: str) -> dict[str, Any]:
    verdict = r.verdict_for(rid)
    return {
        "nodeid": r.nodeid,
        "suite": r.suite,
        "verdict": verdict,
        "check_verdict": r.verdict,
        "blamed": r.blamed,
        # A not-reached entry's message is about another requirement: the check's own entry shows it.
        "message": r.message.strip() if verdict != NOT_REACHED else "",
        "duration": round(r.duration, 6),
        "evidence": r.evidence,
        "seed": r.seed,
    }


def _requirement_entry(req: Requirement, tests: list[dict[str, Any]]) -> dict[str, Any]:
    verdict = worst_verdict(t["verdict"] for t in tests)
    if verdict is None:
        verdict = NOT_REACHED if tests else UNTESTABLE if not req.testable else UNCOVERED
    entry: dict[str, Any] = {
        "id": req.id,
        "section": req.section,
        "level": req.level,
        "roles": list(req.roles),
        "text": req.text,
        "testable": req.testable,
        "tests": tests,
        "verdict": verdict,
    }
    if req.why:
        entry["why"] = req.why
    if req.depends_on:
        entry["depends_on"] = list(req.depends_on)
    return entry


def build_coverage(
    catalog: Catalog,
    results: Iterable[TestResult],
    meta: Mapping[str, Any],
    *,
    all_protocols: bool = False,
    report_dir: str | None = None,
) -> dict[str, Any]:
    """The coverage document (written as coverage.json) for ``results`` against ``catalog``."""
    results = [_relative_evidence(r, report_dir) for r in results]
    ran_suites = {r.suite for r in results if r.suite}
    protocols = {s.split("-", 1)[0] for s in ran_suites}
    protocols |= {catalog.get(i).protocol for r in results for i in (*r.reqs, r.blamed) if i and i in catalog}
    if all_protocols:
        protocols |= set(catalog.protocols)

    by_req: dict[str, list[TestResult]] = {}
    for r in results:
        # A failure blames the requirement the target broke, which a driver may name outside the check's own
        # citations (e.g. a relay that answers SETUP with garbage during an authorization check): it is listed there.
        extra = (r.blamed,) if r.verdict == Verdict.FAIL and r.blamed and r.blamed not in r.reqs else ()
        for rid in (*r.reqs, *extra):
            by_req.setdefault(rid, []).append(r)

    doc_protocols: dict[str, Any] = {}
    for proto in sorted(protocols):
        pc = catalog.protocols.get(proto)
        if pc is None:
            continue
        roles: dict[str, Any] = {}
        for role in pc.roles:
            suites = sorted(s for s, r in pc.suites.items() if r == role)
            reqs_out: list[dict[str, Any]] = []
            for req in catalog.requirements(proto):
                if role not in req.roles:
                    continue
                # A test belongs to this role when its suite tests it, or when its suite tests none of
                # the requirement's roles (then it is shown under each of them rather than lost).
                tests = [
                    _test_entry(r, req.id)
                    for r in by_req.get(req.id, [])
                    if catalog.role_of_suite(r.suite or "") == role
                    or catalog.role_of_suite(r.suite or "") not in req.roles
                ]
                reqs_out.append(_requirement_entry(req, tests))
            counts = Counter(e["verdict"] for e in reqs_out)
            roles[role] = {
                "suites": suites,
                "ran": any(s in ran_suites for s in suites),
                "requirements": reqs_out,
                "counts": dict(sorted(counts.items())),
                "uncovered": [e["id"] for e in reqs_out if e["verdict"] == UNCOVERED],
                "not_reached": [e["id"] for e in reqs_out if e["verdict"] == NOT_REACHED],
            }
        doc_protocols[proto] = {"title": pc.title, "source": pc.source, "catalog": pc.file, "roles": roles}

    unknown = sorted({i for r in results for i in r.reqs if i not in catalog})
    return {
        "format": COVERAGE_FORMAT,
        "meta": dict(meta),
        "summary": {
            "tests": len(results),
            "verdicts": dict(sorted(Counter(r.verdict for r in results).items())),
            "suites": suite_counts(results),
            # Checks whose verdict rests on a provisional profile (e.g. kvsp-provisional-1), not the spec alone.
            "provisional": provisional_counts(catalog, results),
        },
        "protocols": doc_protocols,
        "unknown_requirements": unknown,
        "tests": [r.as_dict() for r in results],
    }


def write_coverage_json(path: str | Path, doc: Mapping[str, Any]) -> Path:
    """Write the coverage document, creating the folder."""
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(doc, indent=1, default=str) + "\n", "utf-8")
    return out


def load_coverage(path: str | Path) -> dict[str, Any]:
    """Read a coverage.json written by ``write_coverage_json``; ValueError when it is not one."""
    doc = json.loads(Path(path).read_text("utf-8"))
    if not isinstance(doc, dict) or doc.get("format") != COVERAGE_FORMAT:
        seen = doc.get("format") if isinstance(doc, dict) else type(doc).__name__
        raise ValueError(f"{path}: format: got {seen!r}, expected {COVERAGE_FORMAT!r}")
    return doc
