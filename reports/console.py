"""What a run prints about its failures: one block per failed requirement, never a wall of tracebacks.

``kvconform run`` runs pytest with ``--tb=no`` (a check's traceback is in its evidence bundle), so these
blocks are what a person reads in a CI log:

- per failed requirement: its id, level and whether it gates, then each check that failed it with its whole
  message and its evidence path (the first FULL_MESSAGES checks; the others by name and evidence);
- per cause of gating inconclusive checks (the exit status counts them): the first check with its whole
  message, then the checks that ended inconclusive for the same reason (the same message, or a shared setup
  that failed in that first check) by name, so one unreachable target is one block, not two hundred;
- harness errors (a bug in kvconform, whatever their level) the same way.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from kvconform.policy import is_harness_error
from kvconform.results import TestResult
from kvconform.verdicts import Verdict, gates, strongest_level

__all__ = ["FULL_MESSAGES", "LISTED", "failure_blocks"]

FULL_MESSAGES = 5  # checks of one block shown with their whole message
LISTED = 20  # further checks of one block listed by name; the rest are counted (coverage.json has them all)
_INDENT = "      "
_SHARED = re.compile(r"a shared setup this check needs failed in (\S+): ")


@dataclass
class _Block:
    title: str
    checks: list[TestResult] = field(default_factory=list)


def _check_lines(r: TestResult, whole: bool) -> list[str]:
    lines = [f"  check: {r.nodeid}"]
    if r.evidence:
        lines.append(f"    evidence: {r.evidence}")
    if whole:
        if r.seed is not None:
            lines.append(f"    seed: {r.seed}")
        lines.append("    message:")
        lines += [_INDENT + line for line in (r.message or "(no message)").splitlines() or [""]]
    return lines


def _gate_text(level: str | None, strict: bool) -> str:
    if gates(level, strict=strict):
        return "gates"
    if level in ("SHOULD", "SHOULD NOT"):
        return "does not gate without --strict"
    return "does not gate"


def _block_lines(block: _Block, whole: int) -> list[str]:
    lines = [block.title]
    for i, r in enumerate(block.checks[:whole + LISTED]):
        lines += _check_lines(r, whole=i < whole)
    hidden = len(block.checks) - whole - LISTED
    if hidden > 0:
        lines.append(f"  ... and {hidden} more checks (coverage.json lists them all)")
    return lines


def _same_cause(results: Sequence[TestResult], title: str, strict: bool) -> list[_Block]:
    """Checks grouped by cause: the same message, or a shared setup that failed in a check of the group (that
    check then leads the group: its message is the cause)."""
    by_id = {r.nodeid: r for r in results}

    def cause(r: TestResult) -> str:
        shared = _SHARED.match(r.message or "")
        if shared is None:
            return r.message
        lead = by_id.get(shared.group(1))
        return lead.message if lead is not None and not _SHARED.match(lead.message) else f"shared:{shared.group(1)}"

    groups: dict[str, list[TestResult]] = {}
    for r in results:
        groups.setdefault(cause(r), []).append(r)
    blocks = []
    for members in groups.values():
        checks = sorted(members, key=lambda m: _SHARED.match(m.message or "") is not None)  # the lead first
        level = strongest_level([c.level for c in checks if c.level])
        noun = "check" if len(checks) == 1 else "checks, one cause"
        blocks.append(_Block(f"{title} [{level or '-'}] ({_gate_text(level, strict)}; {len(checks)} {noun})", checks))
    return blocks


def failure_blocks(results: Sequence[TestResult], strict: bool, report_dir: Path | None = None) -> list[str]:
    """The console lines of a run's failures (empty when nothing failed, gated inconclusive or broke)."""
    failed: dict[tuple[bool, str], list[TestResult]] = {}
    harness: list[TestResult] = []
    inconclusive: list[TestResult] = []
    for r in results:
        if r.verdict == Verdict.FAIL:
            key = (not gates(r.level, strict=strict), r.blamed or (r.reqs[0] if r.reqs else "?"))
            failed.setdefault(key, []).append(r)
        elif is_harness_error(r.verdict, r.message):
            harness.append(r)
        elif r.verdict == Verdict.INCONCLUSIVE and gates(r.level, strict=strict):
            inconclusive.append(r)
    blocks = []
    for (_, rid), checks in sorted(failed.items()):
        noun = "check" if len(checks) == 1 else "checks"
        blocks.append(_Block(f"FAILED {rid} [{checks[0].level or '-'}] ({_gate_text(checks[0].level, strict)}; "
                             f"{len(checks)} {noun})", checks))
    lines = [line for b in blocks for line in _block_lines(b, FULL_MESSAGES)]
    for b in _same_cause(inconclusive, "INCONCLUSIVE", strict):
        lines += _block_lines(b, 1)
    for b in _same_cause(harness, "HARNESS ERROR (a bug in kvconform, not a verdict on the target)", strict):
        lines += _block_lines(b, 1)
    if lines and report_dir is not None:
        lines.append(f"(tracebacks and transcripts: the evidence bundles under {report_dir / 'evidence'})")
    return lines
