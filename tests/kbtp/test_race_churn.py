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
        _churn(CHURN_MIN_CYCLES * 4 - 1).judge(SUMMARY, "KBTP-FREE-NO-OVERWRITE")
    text = str(exc.value)
    assert text.startswith(INCONCLUSIVE_PREFIX)
    assert f"{CHURN_MIN_CYCLES * 4 - 1} cycles" in text and "fewer than the 80 a judgement needs" in text


def test_a_stress_that_never_caught_the_race_is_no_basis_for_a_pass(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(blackbox.CHURN_CATCHES, "KBTP-FREE-NO-OVERWRITE", {"OverwritesUnconsumedSlot": (0, 12)})
    with pytest.raises(pytest.skip.Exception) as exc:
        _churn(1000).judge(SUMMARY, "KBTP-FREE-NO-OVERWRITE")
    text = str(exc.value)
    assert text.startswith(INCONCLUSIVE_PREFIX)
    assert "breaking KBTP-FREE-NO-OVERWRITE: OverwritesUnconsumedSlot in 0 of 12 runs" in text
    assert "no basis for a pass" in text
    with pytest.raises(pytest.skip.Exception) as exc:  # a rule nothing was measured for
        _churn(1000).judge(SUMMARY, "KBTP-EX-DEFER")
    assert "breaking KBTP-EX-DEFER: none" in str(exc.value)


def test_a_pass_names_every_measured_rate_and_what_it_misses(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(blackbox.CHURN_CATCHES, "KBTP-FREE-TABLE-FIRST",
                        {"ClearsBeforeEntryUpdate": (5, 6), "FreeReturnsBeforeEntryUpdate": (0, 6)})
    context = CheckContext("node", frozenset({"KBTP-FREE-TABLE-FIRST"}))
    previous = activate_check(context)
    try:
        _churn(1000).judge(SUMMARY, "KBTP-FREE-TABLE-FIRST")
    finally:
        activate_check(previous)
    assert context.basis == [
        f"{SUMMARY}; this stress caught targets served without DIRECT_ALLOC breaking KBTP-FREE-TABLE-FIRST: "
        "ClearsBeforeEntryUpdate in 5 of 6 runs, FreeReturnsBeforeEntryUpdate in 0 of 6 runs (docs/kbtp-wire.md); "
        "not caught: FreeReturnsBeforeEntryUpdate, whose window is one step of the target's own loop (it answers as a "
        "correct target does)"]


BUDGET_S = 6.0
CHURN_CHECKS = {"test_deferred_free_example": "KBTP-FREE-NO-OVERWRITE",
                "test_free_updates_entry_before_ring": "KBTP-FREE-TABLE-FIRST"}


def _judged_as_correct(got: dict[str, tuple[str, str | None, str]], target: str) -> None:
    """Each churn check passed with its basis or stayed inconclusive, as `CHURN_CATCHES` has it; never a failure."""
    for check, rule in CHURN_CHECKS.items():
        verdict, _, message = got[check]
        caught = any(c for c, _ in blackbox.CHURN_CATCHES[rule].values())
        assert verdict == ("pass" if caught else "inconclusive"), (target, check, got[check])
        assert "invariants intact" in message and "this stress caught targets served without DIRECT_ALLOC" in message
    # DIRECT_ALLOC not declared: the Tail slot is read by nobody but the target's own allocation
    assert got["test_free_writes_block_before_sequence"][0] == "not-applicable"


@pytest.mark.slow
@covering(run_bound(BUDGET_S))
@pytest.mark.parametrize("wire", WIRES)
def test_served_reference_is_judged_on_what_the_churn_can_see(wire: str) -> None:
    _judged_as_correct(one_run(wire, None, BUDGET_S), f"the reference over {wire}")


@pytest.mark.slow
@covering(run_bound(BUDGET_S))
def test_a_correct_target_with_a_wide_window_is_judged_as_correct() -> None:
    """StagedAllocation takes its ticket before it fetches the data: the window opens and its frees are deferred."""
    _judged_as_correct(one_run("iwarp", "StagedAllocation", BUDGET_S), "StagedAllocation over iwarp")


# Races the churn sees: a rule broken inside a window a target keeps open long enough, shown by the answers
SEEN = {"ClearsBeforeEntryUpdate": "roce", "StagedOverwritesUnconsumedSlot": "iwarp"}


@pytest.mark.slow
@covering(run_bound(BUDGET_S))
@pytest.mark.parametrize("name", sorted(SEEN))
def test_churn_catches_a_race_it_can_see_on_its_rule(name: str) -> None:
    got = one_run(SEEN[name], name, BUDGET_S)
    rule, check = kbtp_races.CHURN_TARGETS[name]
    assert got[check][:2] == ("fail", rule), got


@pytest.mark.slow
@covering(run_bound(BUDGET_S))
@pytest.mark.parametrize("name", ["OverwritesUnconsumedSlot", "FreeReturnsBeforeEntryUpdate"])
def test_a_race_mutant_the_churn_cannot_see_is_named_so(name: str) -> None:
    """Its window is one step of the served target's loop: served without DIRECT_ALLOC it answers as the reference
    does, and its check says, in its basis or its inconclusive reason, that the churn does not catch it."""
    got = one_run("roce", name, BUDGET_S)
    _, check = kbtp_races.CHURN_TARGETS[name]
    verdict, _, message = got[check]
    assert verdict in ("pass", "inconclusive") and f"{name} in 0 of" in message, got[check]


@pytest.mark.slow
@covering(run_bound(BUDGET_S))
def test_an_unlucky_run_with_too_few_cycles_is_inconclusive() -> None:
    """A budget that ends before the churn reached its cycles (a loaded machine, a slow target): never a pass."""
    got = one_run("roce", None, 0.01)
    for check in CHURN_CHECKS:
        verdict, _, message = got[check]
        assert verdict == "inconclusive" and "a judgement needs" in message, got[check]


@pytest.mark.slow
@covering(run_bound(BUDGET_S))
def test_a_ring_that_never_takes_a_free_back_stalls_in_the_warm_up() -> None:
    """SlotsNeverConsumed (tests/mutants/kbtp.py): the first wrap stalls with nothing overlapping, so the stall is
    blamed on the bound the text gives (KBTP-QUOTA-ALLOC-BOUNDED), not on the deferred free."""
    got = one_run("roce", "SlotsNeverConsumed", BUDGET_S)
    assert got["test_deferred_free_example"][:2] == ("fail", "KBTP-QUOTA-ALLOC-BOUNDED"), got
