"""The certification headline never says PASSED over requirements that were not exercised, and counts per role
what passed, failed, was inconclusive, not applicable, not reached, uncovered and untestable."""

from __future__ import annotations

from pathlib import Path

import pytest

from kvconform.catalog import Catalog, load_catalogs
from kvconform.reports.certification import CATEGORIES, certify, obligation
from kvconform.reports.coverage import build_coverage
from kvconform.reports.html import render_html
from kvconform.results import TestResult

CATALOG = """\
protocol: demo
title: Demo
source: demo.txt
roles: [reader, writer]
suites: {demo-reader: reader, demo-writer: writer}
requirements:
  - {id: DEMO-M1, section: S, level: MUST, roles: [reader], text: m1}
  - {id: DEMO-M2, section: S, level: RULE, roles: [reader], text: m2}
  - {id: DEMO-BOTH, section: S, level: MUST NOT, roles: [reader, writer], text: both}
  - {id: DEMO-S, section: S, level: SHOULD, roles: [reader], text: s}
  - {id: DEMO-MAY, section: S, level: MAY, roles: [reader], text: may}
  - {id: DEMO-NONE, section: S, level: MUST, roles: [reader], text: no check}
  - {id: DEMO-HIDDEN, section: S, level: MUST, roles: [reader], text: h, testable: false, why: internal}
  - {id: DEMO-W, section: S, level: MUST, roles: [writer], text: w}
"""


@pytest.fixture
def catalog(tmp_path: Path) -> Catalog:
    (tmp_path / "demo.yaml").write_text(CATALOG)
    return load_catalogs(tmp_path)


def _r(name: str, verdict: str, reqs: tuple[str, ...], *, suite: str = "demo-reader", blamed: str | None = None,
       reached: tuple[str, ...] | None = None) -> TestResult:
    return TestResult(f"conformance/demo/x/test_x.py::{name}", suite, reqs, "MUST", verdict, f"{name}: message",
                      0.1, None, 1, blamed, reached if reached is not None else reqs)


def _headline(catalog: Catalog, results: list[TestResult], *, strict: bool = False,
              exit_code: int = 0) -> dict[str, object]:
    doc = certify(build_coverage(catalog, results, {"exit_code": exit_code}), None, strict=strict,
                  exit_code=exit_code)
    headline: dict[str, object] = doc["verdict"]
    return headline


def test_obligation_follows_the_level() -> None:
    assert [obligation(level) for level in ("MUST", "MUST NOT", "RULE", "SHOULD", "SHOULD NOT", "MAY")] == [
        "mandatory", "mandatory", "mandatory", "recommended", "recommended", "optional"]


def test_passed_counts_what_was_not_exercised(catalog: Catalog) -> None:
    results = [_r("a", "pass", ("DEMO-M1", "DEMO-BOTH")), _r("b", "not-applicable", ("DEMO-M2",)),
               _r("c", "pass", ("DEMO-S",)), _r("d", "pass", ("DEMO-MAY",), reached=())]
    h = _headline(catalog, results)
    assert h["status"] == "PASSED"
    assert h["text"] == ("PASSED: every mandatory requirement exercised passed, but 2 mandatory requirements were "
                         "not exercised (no check, not reached or untestable); per role: 1 not reached, 3 passed, "
                         "1 not applicable (per PICS), 1 uncovered (no check), 1 untestable")
    assert h["counts"] == {"fail": 0, "inconclusive": 0, "xfail": 0, "not-reached": 1, "pass": 3,
                           "not-applicable": 1, "uncovered": 1, "untestable": 1}
    assert h["requirements"] == 7, "the writer role did not run: its requirement DEMO-W is not counted"


def test_a_requirement_of_two_roles_tested_on_one_side_is_uncovered_on_the_other(catalog: Catalog) -> None:
    results = [_r("a", "pass", ("DEMO-BOTH",)), _r("w", "pass", ("DEMO-W",), suite="demo-writer")]
    doc = certify(build_coverage(catalog, results, {"exit_code": 0}), None, strict=False, exit_code=0)
    writer = next(r for r in doc["roles_summary"] if r["role"] == "writer")
    assert writer["tested"] and writer["counts"]["pass"] == 1 and writer["counts"]["uncovered"] == 1
    assert doc["verdict"]["role_requirements"] == 9 and doc["verdict"]["requirements"] == 8


def test_failed_names_the_mandatory_requirements_that_failed(catalog: Catalog) -> None:
    results = [_r("a", "fail", ("DEMO-M1", "DEMO-M2"), blamed="DEMO-M1"), _r("b", "fail", ("DEMO-BOTH",)),
               _r("c", "inconclusive", ("DEMO-M2",)), _r("d", "pass", ("DEMO-S",))]
    h = _headline(catalog, results, exit_code=1)
    assert h["status"] == "FAILED" and h["failed"] == ["DEMO-BOTH", "DEMO-M1"] and h["inconclusive"] == ["DEMO-M2"]
    assert str(h["text"]).startswith("FAILED: 2 mandatory requirements failed (DEMO-BOTH, DEMO-M1), 1 inconclusive; "
                                     "per role: ")


def test_inconclusive_is_not_certifiable(catalog: Catalog) -> None:
    h = _headline(catalog, [_r("a", "pass", ("DEMO-M1",)), _r("b", "inconclusive", ("DEMO-M2", "DEMO-BOTH"))],
                  exit_code=1)
    assert h["status"] == "NOT CERTIFIABLE"
    assert str(h["text"]).startswith("NOT CERTIFIABLE: 2 mandatory requirements inconclusive")


def test_a_should_failure_gates_only_with_strict(catalog: Catalog) -> None:
    results = [_r("a", "pass", ("DEMO-M1",)), _r("s", "fail", ("DEMO-S",))]
    lenient = _headline(catalog, results)
    assert lenient["status"] == "PASSED"
    assert "; 1 non-gating requirement failed (SHOULD gates with --strict; MAY never)" in str(lenient["text"])
    strict = _headline(catalog, results, strict=True, exit_code=1)
    assert strict["status"] == "FAILED" and str(strict["text"]).startswith(
        "FAILED: 1 mandatory or SHOULD requirement failed")


def test_nothing_exercised_is_not_certifiable(catalog: Catalog) -> None:
    h = _headline(catalog, [_r("a", "not-applicable", ("DEMO-M1", "DEMO-M2", "DEMO-BOTH"))])
    assert h["status"] == "NOT CERTIFIABLE"
    assert str(h["text"]).startswith("NOT CERTIFIABLE: no mandatory requirement was exercised")


def test_a_failing_exit_status_is_never_passed(catalog: Catalog) -> None:
    h = _headline(catalog, [_r("a", "pass", ("DEMO-M1",))], exit_code=1)
    assert h["status"] == "FAILED" and "exit status is 1" in str(h["text"])


def test_page_lists_failures_first_and_every_category_per_role(catalog: Catalog) -> None:
    results = [_r("a", "pass", ("DEMO-M1",)), _r("b", "fail", ("DEMO-M2",)), _r("c", "inconclusive", ("DEMO-S",))]
    doc = certify(build_coverage(catalog, results, {"exit_code": 1}), None, strict=False, exit_code=1)
    page = render_html(doc)
    assert "<div id='headline' class='headline FAILED'>FAILED: 1 mandatory requirement failed" in page
    first = page.index("data-requirement=")
    assert page[first:].startswith("data-requirement='DEMO-M2' data-verdict='fail'"), "the failure comes first"
    assert page.index("id='fail'") < page.index("id='inconclusive'") < page.index("id='requirements'")
    roles = page[page.index("<table id='roles'>"):]
    for heading in ("passed", "failed", "inconclusive", "not applicable", "not reached", "uncovered", "untestable"):
        assert f"<th>{heading}</th>" in roles
    assert "not tested in this run (2 requirements)" in roles, "the writer role shows no counts that read as verdicts"
    # In the per-role table too, failing first.
    table = page[page.index("role reader"):]
    order = [table.index(f"data-requirement='{rid}'") for rid in ("DEMO-M2", "DEMO-S", "DEMO-M1", "DEMO-NONE")]
    assert order == sorted(order)
    assert set(CATEGORIES) >= {"fail", "inconclusive", "pass", "not-applicable", "not-reached", "uncovered",
                               "untestable"}
