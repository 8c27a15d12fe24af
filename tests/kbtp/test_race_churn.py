"""The black-box churn of a target without DIRECT_ALLOC (conformance/kbtp/blackbox.py, `Churn`; issue 23 item 1):
too few cycles is inconclusive naming the count; intact invariants pass only on a stress shown to catch the check's
race mutant served over the wire, else inconclusive saying so; served in their own process over RoCEv2 and iWARP, the
reference is never passed on the race it could not see, and the mutants whose race the churn can see fail on their
rule (tests/kbtp/race_churn_runs.py serves them; tools/race_catch_rates.py measures the rates docs/kbtp-wire.md
quotes)."""

from __future__ import annotations

import pytest

from kvconform.conformance.kbtp import blackbox
from kvconform.conformance.kbtp.blackbox import CHURN_MIN_CYCLES, Churn
from kvconform.verdicts import INCONCLUSIVE_PREFIX, CheckContext, activate_check
from tests.kbtp.race_churn_runs import WIRES, one_run, run_bound
from tests.mutants import kbtp_races
from tests.spawn import covering

SUMMARY = "black box without DIRECT_ALLOC, window not observable: ..."


def _churn(cycles: int, initiators: int = 4) -> Churn:
    c = Churn([], quota=2, slots=8, budget_s=1.0)
    c.inis = [object()] * initiators  # type: ignore[list-item]  # only counted by judge
    c.cycles = cycles
    return c


def test_too_few_cycles_are_inconclusive_naming_the_count() -> None:
    with pytest.raises(pytest.skip.Exception) as exc:
        _churn(CHURN_MIN_CYCLES * 4 - 1).judge(SUMMARY, "StagedOverwritesUnconsumedSlot")
    text = str(exc.value)
    assert text.startswith(INCONCLUSIVE_PREFIX)
    assert f"{CHURN_MIN_CYCLES * 4 - 1} cycles" in text and "fewer than the 80 a judgement needs" in text


def test_a_stress_that_never_caught_the_race_is_no_basis_for_a_pass(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(blackbox.CHURN_CATCHES, "OverwritesUnconsumedSlot", (0, 12))
    with pytest.raises(pytest.skip.Exception) as exc:
        _churn(1000).judge(SUMMARY, "OverwritesUnconsumedSlot")
    text = str(exc.value)
    assert text.startswith(INCONCLUSIVE_PREFIX)
    assert "caught OverwritesUnconsumedSlot served without DIRECT_ALLOC in 0 of 12 runs" in text
    assert "no basis for a pass" in text


def test_a_pass_names_its_cycles_and_the_measured_catch_rate(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(blackbox.CHURN_CATCHES, "ClearsBeforeEntryUpdate", (5, 6))
    context = CheckContext("node", frozenset({"KBTP-FREE-TABLE-FIRST"}))
    previous = activate_check(context)
    try:
        _churn(1000).judge(SUMMARY, "ClearsBeforeEntryUpdate")
    finally:
        activate_check(previous)
    assert context.basis == [f"{SUMMARY}; this stress caught ClearsBeforeEntryUpdate served without DIRECT_ALLOC in "
                             "5 of 6 runs"]


BUDGET_S = 6.0
CHURN_CHECKS = ("test_deferred_free_example", "test_free_updates_entry_before_ring")


@pytest.mark.slow
@covering(run_bound(BUDGET_S))
@pytest.mark.parametrize("wire", WIRES)
def test_served_reference_is_not_passed_on_a_race_it_could_not_see(wire: str) -> None:
    got = one_run(wire, None, BUDGET_S)
    for check in CHURN_CHECKS:
        verdict, _, message = got[check]
        assert verdict == "inconclusive", (check, got[check])
        assert "invariants intact" in message and "no basis for a pass" in message, (check, message)
    # DIRECT_ALLOC not declared: the Tail slot is read by nobody but the target's own allocation
    assert got["test_free_writes_block_before_sequence"][0] == "not-applicable"


# What the churn sees: a rule broken inside a window a target keeps open long enough, and shown by the answers
SEEN = {"ClearsBeforeEntryUpdate": "test_free_updates_entry_before_ring"}


@pytest.mark.slow
@covering(run_bound(BUDGET_S))
@pytest.mark.parametrize("name", sorted(SEEN))
def test_churn_catches_a_race_it_can_see_on_its_rule(name: str) -> None:
    got = one_run("roce", name, BUDGET_S)
    rule, check = kbtp_races.CHURN_TARGETS[name]
    assert got[check][:2] == ("fail", rule), got


@pytest.mark.slow
@covering(run_bound(BUDGET_S))
@pytest.mark.parametrize("name", ["OverwritesUnconsumedSlot", "FreeReturnsBeforeEntryUpdate", "SequenceBeforeBlock"])
def test_a_race_mutant_the_churn_cannot_see_is_never_passed(name: str) -> None:
    """Its window is one step of the served target's loop: served without DIRECT_ALLOC it answers as the reference
    does. Its check must not pass (nor fail on another rule): inconclusive, naming the measured catch rate."""
    got = one_run("roce", name, BUDGET_S)
    _, check = kbtp_races.CHURN_TARGETS[name]
    verdict, _, message = got[check]
    if check == "test_free_writes_block_before_sequence":
        assert verdict == "not-applicable", got[check]
        return
    assert verdict == "inconclusive" and f"caught {name}" in message, got[check]
