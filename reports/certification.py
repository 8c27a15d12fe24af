"""The certification report: the coverage document with its Identity block, the verdict headline per role and
overall, and per check the assertion that failed (field, seen, expected) and the links to its evidence.

The headline never says PASSED over requirements no check exercised. Per role it counts the requirements that
passed, failed, were inconclusive, not applicable, not reached, uncovered (no check) and untestable; overall:

- ``FAILED``: a gating requirement (mandatory; with --strict also SHOULD) failed;
- ``NOT CERTIFIABLE``: none failed, but one was inconclusive, or no gating requirement was exercised at all;
- ``PASSED``: every gating requirement a check exercised passed; how many gating requirements were not exercised
  follows at once, then what the roles' requirements came to.

The failed and inconclusive requirements are counted once each; the rest of the headline counts per role (a
requirement of two roles tested on one side only is still uncovered on the other).
"""

from __future__ import annotations

import json
import os
from collections import Counter
from collections.abc import Iterable, Mapping
from functools import cache
from importlib import resources
from pathlib import Path
from typing import Any

from kvconform.verdicts import GATING_LEVELS, STRICT_LEVELS

__all__ = ["CATEGORIES", "REPORT_FORMAT", "certify", "obligation", "report_schema", "validate_report"]

REPORT_FORMAT = "kvconform-certification/1"
# Requirement verdicts, worst first: the order of the per-role tables and of the overall roll-up.
CATEGORIES: tuple[str, ...] = ("fail", "inconclusive", "xfail", "not-reached", "pass", "not-applicable",
                               "uncovered", "untestable")
_WORDS = {"fail": "failed", "inconclusive": "inconclusive", "xfail": "known disagreement (xfail)",
          "not-reached": "not reached", "pass": "passed", "not-applicable": "not applicable (per PICS)",
          "uncovered": "uncovered (no check)", "untestable": "untestable"}


def report_schema() -> dict[str, Any]:
    """The published JSON Schema of coverage.json (``reports/schema/report.schema.json``)."""

    text = resources.files("kvconform.reports.schema").joinpath("report.schema.json").read_text("utf-8")
    schema: dict[str, Any] = json.loads(text)
    return schema


@cache
def _report_validator() -> Any:
    import jsonschema  # lazy: ~0.1 s of start-up that only validating a file needs

    return jsonschema.Draft202012Validator(report_schema())


def validate_report(doc: object) -> list[str]:
    """Every way ``doc`` breaks the report schema, as ``<JSON path>: <message>`` (empty: valid)."""
    errors = sorted(_report_validator().iter_errors(doc), key=lambda e: [str(p) for p in e.absolute_path])
    return [f"{e.json_path}: {e.message}" for e in errors]


def obligation(level: str) -> str:
    """mandatory (MUST, MUST NOT, RULE), recommended (SHOULD, SHOULD NOT) or optional (MAY)."""
    if level in GATING_LEVELS:
        return "mandatory"
    if level in STRICT_LEVELS:
        return "recommended"
    return "optional"


def _assertion(evidence: str | None, report_dir: str | None) -> dict[str, Any] | None:
    """The failed assertion a check's evidence bundle recorded (what, seen, expected), if any."""
    if not evidence or report_dir is None:
        return None
    path = Path(evidence) if os.path.isabs(evidence) else Path(report_dir) / evidence
    try:
        bundle = json.loads(path.read_text("utf-8"))
    except (OSError, ValueError):
        return None
    found = bundle.get("assertion") if isinstance(bundle, dict) else None
    return found if isinstance(found, dict) else None


def _html_view(evidence: str | None, report_dir: str | None) -> str | None:
    """The readable view the plugin wrote beside a check's evidence JSON, when it is there."""
    if not evidence or not evidence.endswith(".json") or report_dir is None:
        return None
    view = evidence[: -len(".json")] + ".html"
    return view if (Path(report_dir) / view).is_file() else None


def _count(verdicts: Iterable[str]) -> dict[str, int]:
    c = Counter(verdicts)
    return {cat: c.get(cat, 0) for cat in CATEGORIES}


def _phrase(n: int, what: str) -> str:
    return f"{n} {what} requirement{'s' if n != 1 else ''}"


def _ids(ids: list[str], shown: int = 5) -> str:
    """The first ids by name, so the headline says which requirement failed."""
    return ", ".join(ids[:shown]) + (f" and {len(ids) - shown} more" if len(ids) > shown else "")


def _headline(pairs: list[tuple[str, str, str]], strict: bool, exit_code: int | None) -> dict[str, Any]:
    """``pairs``: (requirement id, verdict, obligation) per requirement of every role tested."""
    gating = {"mandatory", "recommended"} if strict else {"mandatory"}
    label = "mandatory or SHOULD" if strict else "mandatory"
    failed = sorted({i for i, v, o in pairs if v == "fail" and o in gating})
    inconclusive = sorted({i for i, v, o in pairs if v == "inconclusive" and o in gating} - set(failed))
    exercised = any(v in ("fail", "inconclusive", "pass", "xfail") for _, v, o in pairs if o in gating)
    if failed:
        status = "FAILED"
        text = f"FAILED: {_phrase(len(failed), label)} failed ({_ids(failed)})"
        if inconclusive:
            text += f", {len(inconclusive)} inconclusive"
    elif inconclusive:
        status = "NOT CERTIFIABLE"
        text = f"NOT CERTIFIABLE: {_phrase(len(inconclusive), label)} inconclusive"
    elif exit_code not in (None, 0):
        status = "FAILED"
        text = (f"FAILED: the run's exit status is {exit_code} although no {label} requirement failed "
                "(a check outside the catalogs failed, or the run was interrupted)")
    elif not exercised:
        status = "NOT CERTIFIABLE"
        text = f"NOT CERTIFIABLE: no {label} requirement was exercised"
    else:
        status = "PASSED"
        text = f"PASSED: every {label} requirement exercised passed"
        unexercised = {i for i, v, o in pairs if v in ("not-reached", "uncovered", "untestable") and o in gating}
        if unexercised:  # said right after PASSED: what the pass does not vouch for
            text += (f", but {_phrase(len(unexercised), label)} {'were' if len(unexercised) != 1 else 'was'} not "
                     "exercised (no check, not reached or untestable)")
    other_failed = sorted({i for i, v, o in pairs if v == "fail" and o not in gating})
    if other_failed:
        text += (f"; {len(other_failed)} non-gating requirement{'s' if len(other_failed) != 1 else ''} failed"
                 + ("" if strict else " (SHOULD gates with --strict; MAY never)"))
    # A requirement of two roles is counted in each: tested on one side, it is still uncovered on the other.
    totals = _count(v for _, v, _ in pairs)
    rest = [f"{totals[cat]} {_WORDS[cat]}" for cat in CATEGORIES if totals[cat] and cat not in ("fail", "inconclusive")]
    other_inconclusive = sum(1 for _, v, o in pairs if v == "inconclusive" and o not in gating)
    if other_inconclusive:
        rest.insert(0, f"{other_inconclusive} non-gating inconclusive")
    if rest:
        text += "; per role: " + ", ".join(rest)
    by_obligation = {o: _count(v for _, v, ob in pairs if ob == o) for o in ("mandatory", "recommended", "optional")}
    return {"status": status, "text": text, "strict": strict, "exit_code": exit_code, "counts": totals,
            "by_obligation": by_obligation, "failed": failed, "inconclusive": inconclusive,
            "requirements": len({i for i, _, _ in pairs}), "role_requirements": len(pairs)}


def certify(doc: Mapping[str, Any], identity: Mapping[str, Any] | None, *, strict: bool,
            exit_code: int | None, report_dir: str | None = None) -> dict[str, Any]:
    """The certification report (coverage.json) from a coverage document (``build_coverage``)."""
    out: dict[str, Any] = {**doc, "report_format": REPORT_FORMAT, "identity": dict(identity or {})}
    pairs: list[tuple[str, str, str]] = []
    roles_summary: list[dict[str, Any]] = []
    protocols: dict[str, Any] = {}
    for proto, pdoc in doc.get("protocols", {}).items():
        roles: dict[str, Any] = {}
        for role, rdoc in pdoc.get("roles", {}).items():
            reqs: list[dict[str, Any]] = []
            for req in rdoc.get("requirements", []):
                tests = []
                for t in req.get("tests", []):
                    entry = {**t, "evidence_html": _html_view(t.get("evidence"), report_dir)}
                    if t.get("verdict") == "fail":
                        entry["assertion"] = _assertion(t.get("evidence"), report_dir)
                    tests.append(entry)
                reqs.append({**req, "obligation": obligation(req["level"]), "tests": tests})
            tested = bool(rdoc.get("ran")) or any(r["tests"] for r in reqs)
            summary = _count(r["verdict"] for r in reqs)
            if tested:
                pairs += [(r["id"], r["verdict"], r["obligation"]) for r in reqs]
            roles[role] = {**rdoc, "requirements": reqs, "tested": tested, "summary": summary}
            roles_summary.append({"protocol": proto, "role": role, "suites": list(rdoc.get("suites", [])),
                                  "tested": tested, "ran": bool(rdoc.get("ran")), "counts": summary})
        protocols[proto] = {**pdoc, "roles": roles}
    out["protocols"] = protocols
    out["roles_summary"] = roles_summary
    out["verdict"] = _headline(pairs, strict, exit_code)
    return out
