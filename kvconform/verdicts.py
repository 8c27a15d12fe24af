"""Verdicts of conformance checks and the helpers a check uses to end with one.

pass, fail, inconclusive, not-applicable and xfail (docs/conventions.md, "Checks"). A check ends with
not-applicable only through ``Pics.require`` and with inconclusive when the harness could not observe the
outcome; both are pytest skips whose reason carries a prefix the kvconform plugin turns into the verdict.
pytest is imported lazily so the library stays importable without it.
"""

from __future__ import annotations

from collections.abc import Collection
from enum import StrEnum
from typing import Literal, NoReturn

__all__ = [
    "GATING_LEVELS",
    "INCONCLUSIVE_PREFIX",
    "LEVELS",
    "NOT_APPLICABLE_PREFIX",
    "STRICT_LEVELS",
    "Inconclusive",
    "Level",
    "NotApplicable",
    "Verdict",
    "expect_one_of",
    "gates",
    "inconclusive",
    "level_rank",
    "not_applicable",
    "strongest_level",
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


def _skip(reason: str) -> NoReturn:
    import pytest  # lazy: the library must import without pytest

    pytest.skip(reason)


def inconclusive(reason: str) -> NoReturn:
    """End the running check with verdict inconclusive."""
    try:
        import pytest  # noqa: F401
    except ImportError:
        raise Inconclusive(reason) from None
    _skip(INCONCLUSIVE_PREFIX + reason)


def not_applicable(reason: str) -> NoReturn:
    """End the running check with verdict not-applicable (only from ``Pics.require``)."""
    try:
        import pytest  # noqa: F401
    except ImportError:
        raise NotApplicable(reason) from None
    _skip(NOT_APPLICABLE_PREFIX + reason)


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


def expect_one_of(observed: object, acceptable: Collection[object], *, what: str, requirement: str) -> None:
    """Assert that ``observed`` is one of the outcomes the spec allows for ``requirement``."""
    if observed in acceptable:
        return
    try:
        shown = sorted(acceptable, key=repr)
    except TypeError:
        shown = list(acceptable)
    raise AssertionError(
        f"{requirement}: {what}: observed {observed!r}, expected one of {shown!r}"
    )
