"""The verdict policy (fixtures/policy.py, docs/conventions.md "Verdict policy") on synthetic checks: every rule
of the policy, and the blame rule, seen through the coverage report a user reads."""

from __future__ import annotations

from typing import Any

import pytest

from tests.test_plugin import _coverage, _run, _suite

pytest_plugins = ["pytester"]


def _by_name(doc: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {t["nodeid"].split("::")[-1]: t for t in doc["tests"]}


def _req(doc: dict[str, Any], rid: str) -> dict[str, Any]:
    for role in doc["protocols"]["demo"]["roles"].values():
        for r in role["requirements"]:
            if r["id"] == rid:
                return dict(r)
    raise KeyError(rid)


def test_a_failed_assertion_blames_only_the_requirement_it_names(pytester: pytest.Pytester) -> None:
    _suite(pytester, """\
        import pytest
        from kvconform.verdicts import check, check_equal
        @pytest.mark.req("DEMO-MUST", "DEMO-SHOULD")
        def test_two_things():
            check(True, "first field", req="DEMO-MUST")
            check_equal("second field at offset 4", 7, 8, req="DEMO-SHOULD")
    """)
    result = _run(pytester)
    assert result.ret == 0, result.stdout.str()  # the failing assertion is SHOULD-level: it does not gate
    test = _by_name(_coverage(pytester))["test_two_things"]
    assert (test["verdict"], test["blamed"], test["level"]) == ("fail", "DEMO-SHOULD", "SHOULD")
    assert test["message"] == "DEMO-SHOULD: second field at offset 4: seen 7, expected 8"
    must, should = _req(_coverage(pytester), "DEMO-MUST"), _req(_coverage(pytester), "DEMO-SHOULD")
    assert should["verdict"] == "fail" and must["verdict"] == "not-reached"
    assert must["tests"][0]["check_verdict"] == "fail" and must["tests"][0]["message"] == ""


def test_a_passing_check_passes_only_what_it_asserted(pytester: pytest.Pytester) -> None:
    _suite(pytester, """\
        import pytest
        from kvconform.verdicts import check
        @pytest.mark.req("DEMO-MUST", "DEMO-SHOULD")
        def test_cites_two_asserts_one():
            check(True, "the one field looked at", req="DEMO-MUST")
    """)
    assert _run(pytester).ret == 0
    doc = _coverage(pytester)
    assert _req(doc, "DEMO-MUST")["verdict"] == "pass"
    assert _req(doc, "DEMO-SHOULD")["verdict"] == "not-reached"
    assert doc["protocols"]["demo"]["roles"]["reader"]["not_reached"] == ["DEMO-SHOULD"]


@pytest.mark.parametrize(("body", "verdict", "blamed", "text"), [
    # Nothing was exchanged: the target could not be reached, no verdict on it.
    ("raise TargetUnavailable('connection refused')", "inconclusive", None, "could not reach or start"),
    # Something came back first: it stopped answering during the check.
    ("record('received', 'Hello', {}); raise TargetUnavailable('connection reset')", "fail", "DEMO-MUST",
     "stopped answering"),
    ("raise DriverError('answered garbage')", "fail", "DEMO-MUST", "misbehaved: answered garbage"),
    ("raise DriverError('no COMPLETION', requirement='DEMO-SHOULD')", "fail", "DEMO-SHOULD", "no COMPLETION"),
    ("raise KeyError('oops')", "inconclusive", None, "harness error"),
    ("check(True, 'x', req='DEMO-MAY')", "inconclusive", None, "does not cite"),
    ("pytest.fail('stuck after 5 s', pytrace=False)", "fail", "DEMO-MUST", "stuck after 5 s"),
    ("assert 1 == 2, 'bare'", "fail", "DEMO-MUST", "unattributed assertion"),
])
def test_how_each_way_a_check_can_end_is_judged(pytester: pytest.Pytester, body: str, verdict: str,
                                                blamed: str | None, text: str) -> None:
    _suite(pytester, f"""\
        import pytest
        from kvconform.evidence import record
        from kvconform.verdicts import DriverError, TargetUnavailable
        from kvconform.verdicts import check
        @pytest.mark.req("DEMO-MUST", "DEMO-SHOULD")
        def test_ends():
            {body}
    """)
    _run(pytester)
    test = _by_name(_coverage(pytester))["test_ends"]
    assert (test["verdict"], test["blamed"]) == (verdict, blamed), test["message"]
    assert text in test["message"]


def test_a_hang_past_the_bound_fails_and_a_spent_suite_budget_is_inconclusive(pytester: pytest.Pytester) -> None:
    _suite(pytester, """\
        import threading
        import pytest
        @pytest.mark.req("DEMO-MUST")
        def test_hangs():
            threading.Event().wait(30)
        @pytest.mark.req("DEMO-MUST")
        def test_after():
            pass
    """)
    _run(pytester, "--timeout", "1", "-p", "no:randomly", "--kvconform-suite-budget", "60")
    tests = _by_name(_coverage(pytester))
    assert tests["test_hangs"]["verdict"] == "fail" and tests["test_hangs"]["blamed"] == "DEMO-MUST"
    assert "the target hung" in tests["test_hangs"]["message"]
    assert tests["test_after"]["verdict"] == "pass"
    # A budget shorter than the check's own bound cuts it: that is the budget, not a hang of the target.
    _run(pytester, "--timeout", "30", "-p", "no:randomly", "--kvconform-suite-budget", "1")
    tests = _by_name(_coverage(pytester))
    assert tests["test_hangs"]["verdict"] == "inconclusive" and "suite budget" in tests["test_hangs"]["message"]
    assert tests["test_after"]["verdict"] == "inconclusive" and "budget" in tests["test_after"]["message"]


def test_a_shared_setup_that_fails_is_judged_once(pytester: pytest.Pytester) -> None:
    _suite(pytester, """\
        import pytest
        from kvconform.evidence import record
        from kvconform.verdicts import DriverError
        @pytest.fixture(scope="module")
        def publication():
            record("received", "garbage", {})
            raise DriverError("the publisher sent a manifest nested 994 deep", requirement="DEMO-SHOULD")
        @pytest.mark.req("DEMO-MUST")
        def test_one(publication):
            pass
        @pytest.mark.req("DEMO-MUST")
        def test_two(publication):
            pass
    """)
    _run(pytester, "-p", "no:randomly")
    tests = _by_name(_coverage(pytester))
    assert (tests["test_one"]["verdict"], tests["test_one"]["blamed"]) == ("fail", "DEMO-SHOULD")
    assert tests["test_two"]["verdict"] == "inconclusive"
    assert "failed in" in tests["test_two"]["message"] and "test_one" in tests["test_two"]["message"]


def test_the_check_during_which_the_target_died_fails_and_the_next_is_inconclusive(
        pytester: pytest.Pytester) -> None:
    _suite(pytester, """\
        import pytest
        from kvconform.evidence import record
        from kvconform.fixtures.sanity import Sanity
        from kvconform.verdicts import check
        ALIVE = [True]
        @pytest.fixture(scope="session")
        def probe():
            return Sanity("the demo target", lambda: None if ALIVE[0] else "connection refused")
        @pytest.fixture(autouse=True)
        def sanity(probe, request):
            yield from probe.guard(request.node.nodeid)
        @pytest.mark.req("DEMO-MUST")
        def test_1_fine():
            check(True, "x", req="DEMO-MUST")
        @pytest.mark.req("DEMO-SHOULD", "DEMO-MUST")
        def test_2_kills_it():
            record("received", "an answer", {})
            ALIVE[0] = False
            check(True, "its answer looked fine", req="DEMO-SHOULD")
        @pytest.mark.req("DEMO-MUST")
        def test_3_after():
            check(True, "x", req="DEMO-MUST")
    """)
    assert _run(pytester, "-p", "no:randomly").ret == 1
    tests = _by_name(_coverage(pytester))
    assert tests["test_1_fine"]["verdict"] == "pass"
    assert (tests["test_2_kills_it"]["verdict"], tests["test_2_kills_it"]["blamed"]) == ("fail", "DEMO-SHOULD")
    assert "no longer answers" in tests["test_2_kills_it"]["message"]
    assert tests["test_3_after"]["verdict"] == "inconclusive"
    assert "since" in tests["test_3_after"]["message"] and "test_2_kills_it" in tests["test_3_after"]["message"]


def test_the_report_carries_the_whole_message(pytester: pytest.Pytester) -> None:
    _suite(pytester, """\
        import pytest
        from kvconform.verdicts import check_no_problems
        @pytest.mark.req("DEMO-MUST")
        def test_many():
            check_no_problems([f"object {i}: payload differs" for i in range(5)], what="delivery", req="DEMO-MUST")
    """)
    _run(pytester)
    (test,) = _coverage(pytester)["tests"]
    assert test["message"].splitlines() == ["DEMO-MUST: delivery: 5 problem(s)",
                                            *[f"  - object {i}: payload differs" for i in range(5)]]
    page = (pytester.path / "out" / "coverage.html").read_text()
    assert "object 4: payload differs" in page
