"""Verdicts of conformance checks, and the one assertion API every check uses (docs/conventions.md, "Verdicts").

pass, fail, inconclusive, not-applicable and xfail. A check asserts with ``check``, ``check_equal``,
``check_one_of``, ``check_no_problems`` or ``violation``; each names the requirement it enforces, and a failed
one raises ``Violation`` carrying that id, so the report blames exactly the requirement whose assertion failed
(the other ids the check cites are "not reached"), never every id the check cites. While a check runs, the
plugin activates a ``CheckContext`` holding the ids its ``@pytest.mark.req`` cites: an assertion naming an id
the check does not cite is a bug of the harness (``HarnessBug``), and every id an assertion evaluated is
recorded as reached, so a passing check only passes the requirements it actually asserted.

A check ends with not-applicable only through ``Pics.require`` (a declared capability) and with inconclusive
when the harness could not observe the outcome; both are pytest skips whose reason carries a prefix the
kvconform plugin turns into the verdict. pytest is imported lazily so the library stays importable without it.
"""

from __future__ import annotations

import threading
from collections.abc import Collection, Iterable
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Literal, NoReturn

__all__ = [
    "GATING_LEVELS",
    "INCONCLUSIVE_PREFIX",
    "LEVELS",
    "NOT_APPLICABLE_PREFIX",
    "STRICT_LEVELS",
    "CheckContext",
    "DriverError",
    "Findings",
    "HarnessBug",
    "Inconclusive",
    "Level",
    "NotApplicable",
    "SanityFailure",
    "TargetUnavailable",
    "Verdict",
    "Violation",
    "activate_check",
    "check",
    "check_equal",
    "check_no_problems",
    "check_one_of",
    "current_check",
    "fmt",
    "gates",
    "inconclusive",
    "level_rank",
    "not_applicable",
    "pass_basis",
    "strongest_level",
    "violation",
]

Level = Literal["MUST", "MUST NOT", "SHOULD", "SHOULD NOT", "MAY", "RULE"]
LEVELS: tuple[str, ...] = ("MUST", "MUST NOT", "RULE", "SHOULD", "SHOULD NOT", "MAY")
GATING_LEVELS: frozenset[str] = frozenset({"MUST", "MUST NOT", "RULE"})
STRICT_LEVELS: frozenset[str] = frozenset({"SHOULD", "SHOULD NOT"})

NOT_APPLICABLE_PREFIX = "not-applicable: "
INCONCLUSIVE_PREFIX = "inconclusive: "


class Verdict(StrEnum):
    """The outcome of one check, as reported per test and per requirement."""

    PASS = "pass"
    FAIL = "fail"
    INCONCLUSIVE = "inconclusive"
    NOT_APPLICABLE = "not-applicable"
    XFAIL = "xfail"


class Inconclusive(Exception):
    """The harness could not observe the outcome; raised where pytest is not running the code."""


class NotApplicable(Exception):
    """The capability under test is not declared; raised where pytest is not running the code."""


class HarnessBug(Exception):
    """kvconform itself is wrong (e.g. an assertion names an id its check does not cite): never a verdict on the
    target; the check ends inconclusive and the message says to report it."""


# ---- how driving a target can go wrong ----------------------------------------------------------------------
# A DriverError while a target is driven is a finding about the target (the check fails); a TargetUnavailable
# before anything was exchanged (it could not be started or reached at all) is a setup problem, so the check is
# inconclusive, never a verdict; after an exchange it means the target stopped answering, a failure. A
# SanityFailure is the probe after a check finding the target dead. kvconform.policy turns each into a verdict.


class DriverError(RuntimeError):
    """The target misbehaved while driven (it crashed, hung or answered nonsense): a finding, blamed on
    ``requirement`` when the driver knows which rule the misbehaviour breaks, else on the check's first one."""

    def __init__(self, message: str, *, requirement: str | None = None) -> None:
        super().__init__(message)
        self.requirement = requirement


class TargetUnavailable(DriverError):
    """The target could not be started or reached: inconclusive before any exchange, a failure after one."""


class SanityFailure(DriverError):
    """The sanity probe after a check found the target no longer serving: that check fails."""


_MISSING: object = object()
_SHOWN = 48  # octets of a bytes value shown in a message (the evidence keeps them all)


def fmt(value: object) -> str:
    """A value as a failure message shows it: integers also in hex, bytes as hex octets."""
    if isinstance(value, bool) or value is None:
        return repr(value)
    if isinstance(value, int):
        return f"{value} ({value:#x})" if abs(value) > 9 else str(value)
    if isinstance(value, bytes | bytearray | memoryview):
        data = bytes(value)
        more = f" ... ({len(data)} octets)" if len(data) > _SHOWN else ""
        return (data[:_SHOWN].hex(" ") or "(empty)") + more
    return repr(value)


class Violation(AssertionError):
    """The target broke ``requirement``: what was checked, the value seen and the value expected."""

    def __init__(self, requirement: str, what: str, *, seen: object = _MISSING, expected: object = _MISSING,
                 detail: str = "") -> None:
        self.requirement = requirement
        self.what = what
        self.seen = None if seen is _MISSING else seen
        self.expected = None if expected is _MISSING else expected
        parts = [f"{requirement}: {what}"]
        if seen is not _MISSING:
            parts.append(f"seen {fmt(seen)}")
        if expected is not _MISSING:
            parts.append(f"expected {expected if isinstance(expected, str) else fmt(expected)}")
        text = ": ".join(parts[:2]) + (", " + ", ".join(parts[2:]) if len(parts) > 2 else "")
        if detail:
            text += "\n" + detail
        super().__init__(text)


# ---- the running check -------------------------------------------------------------------------------------


@dataclass
class CheckContext:
    """The check being run: the ids it cites and the ids an assertion has evaluated so far."""

    nodeid: str
    cited: frozenset[str]
    reached: set[str] = field(default_factory=set)
    # Ids the check may blame without claiming to pass them (``@pytest.mark.blames``): a diagnosis names one when
    # the state it read points there; an assertion of one that holds reaches nothing (no pass is claimed for it)
    may_blame: frozenset[str] = frozenset()
    # What a pass rests on when it is not the plain one (a black-box race: how often the window opened); the
    # reports show it as the message of a passed check
    basis: list[str] = field(default_factory=list)

    def note(self, requirement: str) -> None:
        if requirement in self.cited:
            self.reached.add(requirement)
            return
        if requirement in self.may_blame:
            return  # blame-only: a failure blames it, a pass does not reach it
        raise HarnessBug(f"{self.nodeid} asserts {requirement}, which its @pytest.mark.req does not cite "
                         f"(it cites {', '.join(sorted(self.cited))}"
                         + (f"; it may blame {', '.join(sorted(self.may_blame))}" if self.may_blame else "") + ")")

    def allows(self, requirement: str) -> bool:
        """An assertion may name ``requirement`` (cited, or blame-only)."""
        return requirement in self.cited or requirement in self.may_blame


_context: CheckContext | None = None
_context_lock = threading.Lock()


def activate_check(context: CheckContext | None) -> CheckContext | None:
    """Make ``context`` the running check's (the plugin does, around each test); returns the previous one."""
    global _context
    with _context_lock:
        previous, _context = _context, context
    return previous


def current_check() -> CheckContext | None:
    """The running check, or None outside one (library code, the harness's own unit tests)."""
    with _context_lock:
        return _context


def _reach(requirement: str) -> None:
    context = current_check()
    if context is not None:
        context.note(requirement)


def pass_basis(text: str) -> None:
    """Say what a pass of the running check rests on (e.g. "black box: window opened 3 of 3 attempts"); the
    reports show it beside the verdict. Outside a check (the harness's own unit tests) it goes nowhere."""
    context = current_check()
    if context is not None:
        context.basis.append(text)


# ---- assertions ---------------------------------------------------------------------------------------------


def violation(what: str, *, req: str, seen: object = _MISSING, expected: object = _MISSING,
              detail: str = "") -> NoReturn:
    """Fail the running check: the target broke ``req``."""
    _reach(req)
    raise Violation(req, what, seen=seen, expected=expected, detail=detail)


def check(condition: object, what: str, *, req: str, seen: object = _MISSING, expected: object = _MISSING,
          detail: str = "") -> None:
    """``condition`` must hold for ``req``; ``what`` says what was checked (the field and its place)."""
    _reach(req)
    if not condition:
        raise Violation(req, what, seen=seen, expected=expected, detail=detail)


def check_equal(what: str, seen: object, expected: object, *, req: str) -> None:
    """``what`` (a field) must be ``expected``."""
    _reach(req)
    if seen != expected:
        raise Violation(req, what, seen=seen, expected=expected)


def check_one_of(observed: object, acceptable: Collection[object], *, what: str, req: str) -> None:
    """``observed`` must be one of the outcomes the text allows for ``req`` (acceptable outcomes are data)."""
    _reach(req)
    if observed in acceptable:
        return
    try:
        shown = sorted(acceptable, key=repr)
    except TypeError:
        shown = list(acceptable)
    raise Violation(req, what, seen=observed, expected="one of " + ", ".join(map(fmt, shown)))


_MAX_LISTED = 12  # problems a message lists (the rest are counted)


def check_no_problems(problems: Iterable[str], *, what: str, req: str) -> None:
    """Every entry of ``problems`` is a way the target broke ``req``; none may exist."""
    _reach(req)
    found = list(problems)
    if found:
        raise Violation(req, f"{what}: {len(found)} problem(s)", detail=_listing(found))


def _listing(problems: list[str]) -> str:
    shown = "\n".join(f"  - {p}" for p in problems[:_MAX_LISTED])
    more = f"\n  ... and {len(problems) - _MAX_LISTED} more" if len(problems) > _MAX_LISTED else ""
    return shown + more


@dataclass
class Findings:
    """Problems a scenario collects against several requirements, judged at the end: the check fails blaming
    the requirement of the first problem found (the root cause comes first), listing every problem seen."""

    what: str
    problems: list[tuple[str, str]] = field(default_factory=list)
    asserted: list[str] = field(default_factory=list)

    def add(self, req: str, problem: str) -> None:
        """Record a way the target broke ``req``."""
        self.problems.append((req, problem))

    def expect(self, condition: object, req: str, problem: str) -> None:
        """Record ``problem`` against ``req`` unless ``condition`` holds; either way ``req`` was asserted."""
        if req not in self.asserted:
            self.asserted.append(req)
        if not condition:
            self.add(req, problem)

    def judge(self) -> None:
        """Fail on the first problem's requirement, or mark every asserted requirement reached."""
        for req in self.asserted:
            _reach(req)
        if not self.problems:
            return
        req = self.problems[0][0]
        _reach(req)
        raise Violation(req, f"{self.what}: {len(self.problems)} problem(s)",
                        detail=_listing([f"[{r}] {p}" for r, p in self.problems]))


# ---- ending a check without a pass or fail ------------------------------------------------------------------


def _skip(reason: str) -> NoReturn:
    import pytest  # lazy: the library must import without pytest

    pytest.skip(reason)


def inconclusive(reason: str) -> NoReturn:
    """End the running check with verdict inconclusive: the harness could not observe what it needs."""
    try:
        import pytest  # noqa: F401  # optional: the library imports without pytest
    except ImportError:
        raise Inconclusive(reason) from None
    _skip(INCONCLUSIVE_PREFIX + reason)


def not_applicable(reason: str) -> NoReturn:
    """End the running check with verdict not-applicable (only from a declared capability)."""
    try:
        import pytest  # noqa: F401  # optional: the library imports without pytest
    except ImportError:
        raise NotApplicable(reason) from None
    _skip(NOT_APPLICABLE_PREFIX + reason)


# ---- levels -------------------------------------------------------------------------------------------------


def level_rank(level: str) -> int:
    """0 for gating levels, 1 for SHOULD/SHOULD NOT, 2 for MAY and anything else."""
    if level in GATING_LEVELS:
        return 0
    if level in STRICT_LEVELS:
        return 1
    return 2


def strongest_level(levels: Collection[str]) -> str | None:
    """The level that gates most among ``levels`` (first one wins ties); None when empty."""
    best: str | None = None
    for level in levels:
        if best is None or level_rank(level) < level_rank(best):
            best = level
    return best


def gates(level: str | None, *, strict: bool) -> bool:
    """Whether a check at ``level`` decides the exit status (MAY never does)."""
    if level is None:
        return False
    return level in GATING_LEVELS or (strict and level in STRICT_LEVELS)
