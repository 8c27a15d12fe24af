"""The black-box race count (conformance/kbtp/blackbox.py): a window that did not open often enough is never a pass,
and a pass says how often it opened."""

from __future__ import annotations

import pytest

from kvconform.conformance.kbtp.blackbox import Windows
from kvconform.verdicts import INCONCLUSIVE_PREFIX, CheckContext, activate_check


def _windows(needed: int, budget_s: float = 60.0) -> Windows:
    return Windows("a window", needed, budget_s)


def test_too_few_openings_are_inconclusive_naming_the_count() -> None:
    w = _windows(3)
    for opened in (True, False, True):
        w.attempt(opened)
    with pytest.raises(pytest.skip.Exception) as exc:
        w.judge()
    assert str(exc.value).startswith(INCONCLUSIVE_PREFIX)
    assert "black box: window opened 2 of 3 attempts (a window)" in str(exc.value)


def test_enough_openings_pass_and_say_how() -> None:
    context = CheckContext("node", frozenset({"KBTP-FREE-DEFER"}))
    previous = activate_check(context)
    try:
        w = _windows(2)
        for opened in (False, True, True):
            w.attempt(opened)
        assert not w.more()
        w.judge()
    finally:
        activate_check(previous)
    assert context.basis == ["black box: window opened 2 of 3 attempts (a window)"]


def test_attempts_stop_at_the_cap_or_the_budget() -> None:
    w = _windows(1)
    while w.more():
        w.attempt(False)
    assert w.attempts == 50  # MAX_ATTEMPTS_PER_WINDOW per opening asked for
    assert not _windows(1, budget_s=0.0).more()
