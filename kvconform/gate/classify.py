"""What ``kvconform gate`` finds when it compares the run it judges with a baseline (an earlier run, or an
expectations file): new failures, fixed, still failing, unexpected passes, flaky, added and removed checks.

A check *fails* when its verdict is fail or inconclusive (the harness could not vouch for it). A new failure gates
(exit 1) when the check's level gates the judged run (MUST, MUST NOT, RULE; SHOULD too under --strict); an
unexpected pass (an expectation said it fails, it passed) always gates, so the expectations file is kept true.
A check whose verdict differed across the newest stored runs (a window, ten by default) of the same identity and
inputs is *flaky*: listed, never gating, whatever it did this time; the judged run itself is not part of that
history, so a check that always passed before and fails now is a new failure, not a flake.
Added and removed checks (the judged run has a check the baseline had not, or lacks one it had; an expectations
entry matching no check is removed) are listed and do not gate, unless the gate is asked to
(``gate_added_removed``: ``kvconform gate --fail-on-added-removed``), as h2spec fails on a change in the number of
cases.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace

from kvconform.gate.expectations import Expectation, Expectations
from kvconform.store.record import CheckRecord, RunRecord
from kvconform.verdicts import gates

__all__ = ["FAILING", "FLAKY_WINDOW", "Finding", "GateResult", "compare_expectations", "compare_runs", "flaky_checks",
           "gate_added_removed"]

FAILING = frozenset({"fail", "inconclusive"})
CATEGORIES = ("new_failures", "unexpected_passes", "flaky", "fixed", "still_failing", "added", "removed")
GATING_CATEGORIES = ("new_failures", "unexpected_passes", "added", "removed")  # where a finding may gate


@dataclass(frozen=True)
class Finding:
    """One check in one category: its verdict now, what the baseline said, and why it is where it is."""

    check: str
    verdict: str | None  # in the judged run (None: removed)
    expected: str | None  # the baseline's verdict, or the expectation's (None: added)
    message: str = ""
    evidence: str | None = None
    gating: bool = False
    note: str = ""


@dataclass
class GateResult:
    """Every finding, by category, and the exit status they make."""

    baseline: str  # what the judged run was compared with, for people
    judged: str
    new_failures: list[Finding] = field(default_factory=list)
    unexpected_passes: list[Finding] = field(default_factory=list)
    flaky: list[Finding] = field(default_factory=list)
    fixed: list[Finding] = field(default_factory=list)
    still_failing: list[Finding] = field(default_factory=list)
    added: list[Finding] = field(default_factory=list)
    removed: list[Finding] = field(default_factory=list)

    def category(self, name: str) -> list[Finding]:
        found: list[Finding] = getattr(self, name)
        return found

    def gating_in(self, name: str) -> list[Finding]:
        """The findings of one category that make the gate fail."""
        return [f for f in self.category(name) if f.gating] if name in GATING_CATEGORIES else []

    @property
    def gating(self) -> list[Finding]:
        """What makes the gate fail."""
        return [f for name in GATING_CATEGORIES for f in self.gating_in(name)]

    @property
    def exit_code(self) -> int:
        """0: nothing new; 1: a gating new failure, an unexpected pass, or (gate_added_removed) a check added or
        removed."""
        return 1 if self.gating else 0


FLAKY_WINDOW = 10  # the stored runs a flip is looked for in (kvconform gate --flaky-window)


def flaky_checks(history: Mapping[str, Sequence[tuple[int, str]]],
                 window: int = FLAKY_WINDOW) -> dict[str, list[tuple[int, str]]]:
    """The checks whose verdict differs across the newest ``window`` of the given runs
    (store.ResultsStore.history). Bounded so that one flip long ago does not excuse a check for ever: a check that
    flipped once and has failed in every run since becomes a failure that gates again once the flip leaves the
    window."""
    newest = set(sorted({run_id for runs in history.values() for run_id, _ in runs})[-window:])
    recent = {check: [(i, v) for i, v in runs if i in newest] for check, runs in history.items()}
    return {check: runs for check, runs in recent.items() if len({v for _, v in runs}) > 1}


def gate_added_removed(result: GateResult) -> GateResult:
    """The same findings, with every added and removed check gating (kvconform gate --fail-on-added-removed)."""
    return replace(result, added=[replace(f, gating=True) for f in result.added],
                   removed=[replace(f, gating=True) for f in result.removed])


def _flaky_note(runs: Sequence[tuple[int, str]]) -> str:
    return "stored runs: " + ", ".join(f"#{run_id} {verdict}" for run_id, verdict in runs[-6:])


def _finding(check: CheckRecord, expected: str | None, gating: bool = False, note: str = "",
             verdict: str | None = None) -> Finding:
    return Finding(check=check.nodeid, verdict=verdict or check.verdict, expected=expected, message=check.message,
                   evidence=check.evidence, gating=gating, note=note)


def compare_runs(judged: RunRecord, baseline: RunRecord, baseline_name: str, judged_name: str,
                 flaky: Mapping[str, Sequence[tuple[int, str]]] = {}) -> GateResult:
    """The judged run against an earlier one, check by check."""
    result = GateResult(baseline=baseline_name, judged=judged_name)
    before = {c.nodeid: c for c in baseline.checks}
    for check in judged.checks:
        old = before.get(check.nodeid)
        was = old.verdict if old is not None else None
        if check.nodeid in flaky:
            result.flaky.append(_finding(check, was, note=_flaky_note(flaky[check.nodeid])))
            continue
        if old is None:
            result.added.append(_finding(check, None))
        failing = check.verdict in FAILING
        if failing and (was is None or was not in FAILING):
            result.new_failures.append(_finding(check, was, gating=gates(check.level, strict=judged.strict),
                                                note="a check the baseline did not have" if old is None else ""))
        elif failing:
            result.still_failing.append(_finding(check, was))
        elif was in FAILING:
            result.fixed.append(_finding(check, was))
    now = {c.nodeid for c in judged.checks}
    result.removed = [Finding(check=c.nodeid, verdict=None, expected=c.verdict) for c in baseline.checks
                      if c.nodeid not in now]
    return result


def _note(entry: Expectation, today: dt.date) -> str:
    if entry.expired(today):
        return f"expectation for {entry.subject} expired on {entry.expires}: {entry.reason}"
    return f"expected ({entry.subject}): {entry.reason}"


def compare_expectations(judged: RunRecord, expectations: Expectations, judged_name: str, today: dt.date,
                         flaky: Mapping[str, Sequence[tuple[int, str]]] = {}) -> GateResult:
    """The judged run against an expectations file: what no live entry expects to fail is expected to pass."""
    result = GateResult(baseline=f"expectations {expectations.path}", judged=judged_name)
    used: set[int] = set()
    failing_reqs: set[int] = set()  # requirement entries some check failed
    for check in judged.checks:
        test = check.result()
        entry = expectations.check_entry(test)
        by_requirement = expectations.requirement_entries(test)
        used.update(e.index for e in ([entry] if entry else []) + [e for e, _ in by_requirement])
        failing_reqs.update(e.index for e, verdict in by_requirement if verdict in FAILING)
        if check.nodeid in flaky:
            result.flaky.append(_finding(check, entry.verdict if entry else None,
                                         note=_flaky_note(flaky[check.nodeid])))
            continue
        failing = check.verdict in FAILING
        if entry is not None:
            expected = None if entry.expired(today) else entry.verdict
            note = _note(entry, today)
        else:
            # a failing check is excused by a live requirement entry expecting the requirement it fails to fail
            excuse = next((e for e, v in by_requirement
                           if v in FAILING and e.verdict in FAILING and not e.expired(today)), None)
            expired = next((e for e, v in by_requirement if v in FAILING and e.expired(today)), None)
            expected = excuse.verdict if excuse is not None else None
            note = _note(excuse, today) if excuse else (_note(expired, today) if expired else "")
        expected_failing = expected in FAILING
        if failing and not expected_failing:
            result.new_failures.append(_finding(check, expected, gating=gates(check.level, strict=judged.strict),
                                                note=note))
        elif failing:
            result.still_failing.append(_finding(check, expected, note=note))
        elif entry is not None and expected_failing:
            result.unexpected_passes.append(_finding(check, expected, gating=True, note=note))
    for e in expectations.entries:
        # a requirement expected to fail that no check failed: the file is out of date
        live_failure = e.verdict in FAILING and not e.expired(today)
        if e.requirement is not None and live_failure and e.index in used and e.index not in failing_reqs:
            result.unexpected_passes.append(Finding(
                check=e.subject, verdict="pass", expected=e.verdict, gating=True,
                note=f"no check failed {e.requirement}; expected: {e.reason}"))
    result.removed = [Finding(check=e.subject, verdict=None, expected=e.verdict,
                              note=f"entry {e.index + 1} of the expectations file matches no check of the run")
                      for e in expectations.entries if e.index not in used]
    return result
