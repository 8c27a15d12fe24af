"""The verdict policy: how what happened in a check's setup, call and teardown becomes its verdict and blame.

One place for every lane (docs/conventions.md, "Verdict policy"), with no pytest in it: the plugin
(fixtures/policy.py) describes each phase of a check as a ``Phase`` and calls ``judge`` on the process that ran
the test, where the exception itself is still at hand; report writers read ``is_harness_error`` from here.

- An assertion of the assertion API failed (``Violation``) -> fail, blamed on the requirement it names.
- The target could not be reached or started before any exchange of the check (``TargetUnavailable`` with
  nothing received) -> inconclusive; after something was received it stopped answering -> fail.
- The target misbehaved while driven (``DriverError``: crashed, closed, hung past a bound, spoke something that
  is not the protocol) or a check's bound ran out (pytest-timeout) -> fail, blamed on the requirement the
  error names or else the check's first cited one.
- The sanity probe after a check found the target dead (``SanityFailure``) -> that check fails.
- The harness could not observe what a requirement needs (``inconclusive(...)``) -> inconclusive; a declared
  capability is missing (``Pics.require``) -> not-applicable; a plain pytest skip -> inconclusive.
- kvconform itself failed (any other exception, ``HarnessBug``) -> inconclusive, never a verdict on the target.
- A shared (module or session) fixture that failed is judged once, in the first check that set it up; every
  later check that needs it is inconclusive, so one broken setup does not blame twenty requirements.
"""

from __future__ import annotations

import traceback
from dataclasses import dataclass
from typing import Literal

from kvconform.verdicts import (
    INCONCLUSIVE_PREFIX,
    NOT_APPLICABLE_PREFIX,
    DriverError,
    HarnessBug,
    Inconclusive,
    NotApplicable,
    SanityFailure,
    TargetUnavailable,
    Verdict,
    Violation,
)

__all__ = ["CheckFailed", "Judgement", "Phase", "is_harness_error", "judge"]

_TIMEOUT_PREFIX = "Timeout (>"  # how pytest-timeout's signal method fails a test
# How an inconclusive judgement that is kvconform's own failure starts (reports file them apart: "harness error").
_HARNESS_BUG = "harness bug (please report it): "
_HARNESS_ERROR = "harness error (a bug in kvconform, not a verdict on the target): "
_SETUP_ERROR = "setup error: "


@dataclass(frozen=True)
class Judgement:
    """A phase's verdict, the message that explains it, the requirement it blames and a traceback for the
    evidence (harness errors and driver failures; an assertion's message says it all)."""

    verdict: str
    message: str
    blamed: str | None = None
    traceback: str | None = None


@dataclass(frozen=True)
class Phase:
    """What a phase of a check (setup, call, teardown) ended with, as the test runner reports it."""

    when: Literal["setup", "call", "teardown"]
    outcome: Literal["passed", "failed", "skipped"]
    xfail: str | None = None  # the reason of an expected failure (pytest's ``wasxfail``)
    skip_reason: str = ""


class CheckFailed(Exception):
    """The test runner failed the check itself (``pytest.fail``, a bound that ran out): its message says why."""


def _from_skip(reason: str) -> Judgement:
    if reason.startswith(NOT_APPLICABLE_PREFIX):
        return Judgement(Verdict.NOT_APPLICABLE, reason.removeprefix(NOT_APPLICABLE_PREFIX))
    if reason.startswith(INCONCLUSIVE_PREFIX):
        return Judgement(Verdict.INCONCLUSIVE, reason.removeprefix(INCONCLUSIVE_PREFIX))
    # A plain skip is not a declared capability, so it cannot be not-applicable.
    return Judgement(Verdict.INCONCLUSIVE, f"skipped: {reason}")


def _trace(exc: BaseException) -> str:
    return "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))


def _error(exc: BaseException, *, exchanged: bool, primary: str | None, budget_cut: bool) -> Judgement:
    """The judgement of an exception raised by a check or by a fixture it set up."""
    if isinstance(exc, Violation):
        return Judgement(Verdict.FAIL, str(exc), exc.requirement)
    if isinstance(exc, SanityFailure):
        return Judgement(Verdict.FAIL, str(exc), exc.requirement or primary, _trace(exc))
    if isinstance(exc, TargetUnavailable):
        if exchanged:
            return Judgement(Verdict.FAIL, f"the target stopped answering during the check: {exc}",
                             exc.requirement or primary, _trace(exc))
        return Judgement(Verdict.INCONCLUSIVE, f"could not reach or start the target: {exc}", None, _trace(exc))
    if isinstance(exc, DriverError):
        return Judgement(Verdict.FAIL, f"the target misbehaved: {exc}", exc.requirement or primary, _trace(exc))
    if isinstance(exc, HarnessBug):
        return Judgement(Verdict.INCONCLUSIVE, f"{_HARNESS_BUG}{exc}", None, _trace(exc))
    if isinstance(exc, CheckFailed):
        text = str(exc)
        if text.startswith(_TIMEOUT_PREFIX):
            if budget_cut:
                return Judgement(Verdict.INCONCLUSIVE, f"cut short by the suite budget ({text})", None, _trace(exc))
            return Judgement(Verdict.FAIL, f"no end within the check's bound: the target hung ({text})", primary,
                             _trace(exc))
        return Judgement(Verdict.FAIL, text, primary)
    if isinstance(exc, AssertionError):
        return Judgement(Verdict.FAIL, f"{exc} [unattributed assertion: blamed on the check's first requirement]",
                         primary, _trace(exc))
    return Judgement(Verdict.INCONCLUSIVE, f"{_HARNESS_ERROR}{type(exc).__name__}: {exc}", None, _trace(exc))


def judge(phase: Phase, exc: BaseException | None, prior: Judgement | None, *, exchanged: bool,
          primary: str | None, shared_failure: str | None, budget_cut: bool) -> Judgement | None:
    """The judgement after one phase, given the one so far (None: nothing decided yet).

    ``exc``: what the phase raised; ``exchanged``: the check received something from the target; ``primary``: the
    check's first cited id; ``shared_failure``: the nodeid of an earlier check whose setup raised this same
    exception; ``budget_cut``: the check's bound was shortened to what was left of its suite's budget."""
    when = phase.when
    if when == "call" and phase.xfail is not None:
        if phase.outcome == "skipped":
            return Judgement(Verdict.XFAIL, f"xfail: {phase.xfail}")
        if phase.outcome == "failed":
            return Judgement(Verdict.FAIL, f"XPASS(strict): {phase.xfail}", primary)
        return Judgement(Verdict.PASS, "")
    if phase.outcome == "skipped" and phase.xfail is not None:
        return Judgement(Verdict.XFAIL, f"xfail: {phase.xfail}")
    if isinstance(exc, Inconclusive):
        return Judgement(Verdict.INCONCLUSIVE, str(exc))
    if isinstance(exc, NotApplicable):
        return Judgement(Verdict.NOT_APPLICABLE, str(exc))
    if phase.outcome == "skipped":
        return _from_skip(phase.skip_reason)
    if exc is None or phase.outcome == "passed":
        return Judgement(Verdict.PASS, "") if when == "call" and phase.outcome == "passed" else prior
    if when == "teardown":
        if isinstance(exc, SanityFailure) and not exchanged and (prior is None or prior.verdict != Verdict.FAIL):
            # The target died, but not of this check: it exchanged nothing with it (e.g. not applicable).
            return Judgement(Verdict.INCONCLUSIVE, f"{exc} (this check exchanged nothing with it)", None, _trace(exc))
        if isinstance(exc, SanityFailure | Violation) and (prior is None or prior.verdict != Verdict.FAIL):
            return _error(exc, exchanged=True, primary=primary, budget_cut=budget_cut)
        if prior is not None and prior.verdict in (Verdict.FAIL, Verdict.INCONCLUSIVE):
            return prior
        return Judgement(Verdict.INCONCLUSIVE, f"teardown error: {type(exc).__name__}: {exc}", None, _trace(exc))
    if when == "setup" and shared_failure is not None:
        return Judgement(Verdict.INCONCLUSIVE, f"a shared setup this check needs failed in {shared_failure}: "
                                               f"{type(exc).__name__}: {exc}")
    judged = _error(exc, exchanged=exchanged, primary=primary, budget_cut=budget_cut)
    if when == "setup" and judged.verdict == Verdict.INCONCLUSIVE and not judged.message.startswith("could not"):
        return Judgement(judged.verdict, f"{_SETUP_ERROR}{judged.message}", None, judged.traceback)
    return judged


def is_harness_error(verdict: str, message: str) -> bool:
    """Whether a judgement is kvconform's own failure (a bug of the harness), not something about the target."""
    text = message.removeprefix(_SETUP_ERROR)
    return verdict == Verdict.INCONCLUSIVE and text.startswith((_HARNESS_BUG, _HARNESS_ERROR))
