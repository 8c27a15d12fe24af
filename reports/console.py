"""What a run prints about its failures: one block per failed requirement, never a wall of tracebacks.

``kvconform run`` runs pytest with ``--tb=no`` (a check's traceback is in its evidence bundle), so these
blocks are what a person reads in a CI log: per failed requirement its id and level and whether it gates,
then each check that failed it with its whole message and its evidence path. Checks that end inconclusive and
gate (the exit status counts them) and harness errors get a block each, the same way.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from kvconform.fixtures.policy import is_harness_error
from kvconform.reports.coverage import TestResult
from kvconform.verdicts import Verdict, gates

__all__ = ["failure_blocks"]

_INDENT = "      "


def _check_lines(r: TestResult) -> list[str]:
    lines = [f"  check: {r.nodeid}"]
    if r.evidence:
        lines.append(f"    evidence: {r.evidence}")
    if r.seed is not None:
        lines.append(f"    seed: {r.seed}")
    message = (r.message or "(no message)").splitlines() or [""]
    lines.append("    message:")
    lines += [_INDENT + line for line in message]
    return lines


def _gate_text(level: str | None, strict: bool) -> str:
    if gates(level, strict=strict):
        return "gates"
    if level in ("SHOULD", "SHOULD NOT"):
        return "does not gate without --strict"
    return "does not gate"


def failure_blocks(results: Sequence[TestResult], strict: bool, report_dir: Path | None = None) -> list[str]:
    """The console lines of a run's failures (empty when nothing failed, gated inconclusive or broke)."""
    failed: dict[tuple[bool, str], list[TestResult]] = {}
    others: list[tuple[int, str, TestResult]] = []
    for r in results:
        gating = gates(r.level, strict=strict)
        if r.verdict == Verdict.FAIL:
            failed.setdefault((not gating, r.blamed or (r.reqs[0] if r.reqs else "?")), []).append(r)
        elif is_harness_error(r.verdict, r.message):
            others.append((0 if gating else 2, "HARNESS ERROR (a bug in kvconform, not a verdict on the target)", r))
        elif r.verdict == Verdict.INCONCLUSIVE and gating:
            others.append((1, "INCONCLUSIVE", r))
    lines: list[str] = []
    for (_, rid), checks in sorted(failed.items()):
        level = checks[0].level or "-"
        noun = "check" if len(checks) == 1 else "checks"
        lines.append(f"FAILED {rid} [{level}] ({_gate_text(checks[0].level, strict)}; {len(checks)} {noun})")
        for r in checks:
            lines += _check_lines(r)
    for _, title, r in sorted(others, key=lambda o: o[0]):
        lines.append(f"{title} [{r.level or '-'}] ({_gate_text(r.level, strict)}) citing {' '.join(r.reqs)}")
        lines += _check_lines(r)
    if lines and report_dir is not None:
        lines.append(f"(tracebacks and transcripts: the evidence bundles under {report_dir / 'evidence'})")
    return lines
