"""The gate's categories on runs written as data: added and removed checks (gating only when asked), a failure
that does not gate, flaky from the store's history, check entries before requirement entries, an expectation
matching nothing."""

from __future__ import annotations

import dataclasses
import datetime as dt
from pathlib import Path

from kvconform.gate.classify import Finding, compare_expectations, compare_runs, flaky_checks, gate_added_removed
from kvconform.gate.expectations import load_expectations
from kvconform.gate.summary import console_lines, markdown
from kvconform.store import ResultsStore, open_store
from tests.store.synthetic import check, run

TODAY = dt.date(2026, 12, 7)


def names(findings: list[Finding]) -> list[str]:
    return [f.check for f in findings]


def test_every_category_against_a_run() -> None:
    before = run(check("a", "pass"), check("b", "fail"), check("c", "fail"), check("gone", "pass"),
                 check("should", "pass", level="SHOULD"))
    now = run(check("a", "fail"), check("b", "fail"), check("c", "pass"), check("new", "inconclusive"),
              check("new-ok", "pass"), check("should", "fail", level="SHOULD"))
    result = compare_runs(now, before, "before", "now")
    assert names(result.new_failures) == ["a", "new", "should"]
    assert [f.gating for f in result.new_failures] == [True, True, False]  # SHOULD gates only a --strict run
    assert (names(result.still_failing), names(result.fixed)) == (["b"], ["c"])
    assert (names(result.added), names(result.removed)) == (["new", "new-ok"], ["gone"])
    assert result.exit_code == 1
    strict = compare_runs(dataclasses.replace(now, strict=True), before, "before", "now")
    assert strict.new_failures[-1].gating
    text = markdown(result)
    assert "| New failures | 3 |" in text and "a \\| fail" in text  # a | in a message does not break the table


def test_added_and_removed_checks_gate_only_when_asked(tmp_path: Path) -> None:
    before = run(check("a", "pass"), check("gone", "pass"))
    now = run(check("a", "pass"), check("new", "pass"))
    result = compare_runs(now, before, "before", "now")
    assert (names(result.added), names(result.removed)) == (["new"], ["gone"])
    assert result.exit_code == 0 and markdown(result).startswith("## kvconform gate: PASSED: nothing new")
    assert not any("added checks:" in line or "removed checks:" in line for line in console_lines(result))
    strict = gate_added_removed(result)
    assert strict.exit_code == 1 and result.exit_code == 0  # a copy: the result itself is left as it was
    assert markdown(strict).startswith("## kvconform gate: FAILED: 1 added check, 1 removed check\n")
    lines = console_lines(strict)
    assert "  GATES added checks: new: pass (baseline —)" in lines
    assert "  GATES removed checks: gone: — (baseline pass)" in lines
    # nothing added or removed: the option changes nothing
    assert gate_added_removed(compare_runs(before, before, "before", "before")).exit_code == 0
    # an expectations entry that matches no check of the run is a removed check
    stale = load_expectations(_file(tmp_path, "  - check: never-run\n    verdict: fail\n    reason: stale\n"))
    judged = compare_expectations(now, stale, "now", TODAY)
    assert names(judged.removed) == ["never-run"] and judged.exit_code == 0
    assert gate_added_removed(judged).exit_code == 1


def test_a_flaky_check_is_listed_and_does_not_gate() -> None:
    flaky = flaky_checks({"a": [(1, "pass"), (2, "fail")], "b": [(1, "pass"), (2, "pass")]})
    assert list(flaky) == ["a"]
    result = compare_runs(run(check("a", "fail"), check("b", "pass")), run(check("a", "pass"), check("b", "pass")),
                          "before", "now", flaky)
    assert names(result.flaky) == ["a"] and not result.new_failures and result.exit_code == 0
    assert "#1 pass, #2 fail" in result.flaky[0].note


def test_a_flip_older_than_the_window_excuses_nothing() -> None:
    """A check that flipped once long ago and has failed since is not flaky for ever: once the flip leaves the
    window, its failure gates again."""
    history = {"a": [(1, "pass"), (2, "fail"), (3, "pass"), *((i, "fail") for i in range(4, 14))]}
    assert list(flaky_checks(history, window=11)) == ["a"]
    assert flaky_checks(history, window=10) == {}  # runs 4..13, all fail
    result = compare_runs(run(check("a", "fail")), run(check("a", "pass")), "before", "now",
                          flaky_checks(history))
    assert names(result.new_failures) == ["a"] and result.exit_code == 1


def test_history_is_per_identity_and_leaves_out_the_judged_run(tmp_path: Path) -> None:
    with open_store(f"sqlite:///{tmp_path / 'r.sqlite'}") as store:
        assert isinstance(store, ResultsStore)
        one = store.record(run(check("a", "pass"), sha="a" * 64))
        two = store.record(run(check("a", "fail"), sha="b" * 64))
        other = dataclasses.replace(run(check("a", "fail"), sha="c" * 64), implementation_version="2")
        store.record(other)
        key = run().identity_key
        assert store.run_ids(key) == [one, two] and other.identity_key != key
        assert flaky_checks(store.history(key)) == {"a": [(one, "pass"), (two, "fail")]}
        assert flaky_checks(store.history(key, exclude=[two])) == {}


def _file(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "expect.yaml"
    path.write_text("format: kvconform-expectations/1\nexpectations:\n" + text)
    return path


def test_expectations_check_entries_first_blame_and_stale_entries(tmp_path: Path) -> None:
    expectations = load_expectations(_file(tmp_path, """\
  - requirement: X-ONE
    verdict: fail
    reason: known
  - check: "t::c[*]"
    verdict: pass
    reason: must pass whatever X-ONE does
  - check: never-run
    verdict: fail
    reason: stale
"""))
    judged = run(check("t::a", "fail", blamed="X-ONE"), check("t::b", "fail", reqs=("X-ONE", "X-TWO"),
                                                                  blamed="X-TWO"),
                 check("t::c[1]", "fail", blamed="X-ONE"), check("t::d", "pass"))
    result = compare_expectations(judged, expectations, "now", TODAY)
    # a: excused by its requirement; b: failed another requirement (blame rule), not excused; c[1]: its check
    # entry says pass, which wins over the requirement's; d: passing beside a failing requirement is no surprise
    assert names(result.still_failing) == ["t::a"]
    assert names(result.new_failures) == ["t::b", "t::c[1]"]
    assert not result.unexpected_passes
    assert names(result.removed) == ["never-run"]
    passing = compare_expectations(run(check("t::a", "pass")), expectations, "now", TODAY)
    assert names(passing.unexpected_passes) == ["requirement X-ONE"] and passing.exit_code == 1
