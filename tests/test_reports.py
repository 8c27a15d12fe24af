"""Coverage JSON and HTML report writers."""

from __future__ import annotations

from pathlib import Path

import pytest

from kvconform.catalog import Catalog, load_catalogs
from kvconform.reports.coverage import build_coverage, load_coverage, worst_verdict, write_coverage_json
from kvconform.reports.html import render_html, write_html
from kvconform.results import TestResult

CATALOGS = {
    "demo.yaml": """\
protocol: demo
title: Demo
source: demo.txt
roles: [reader, writer]
suites: {demo-reader: reader, demo-writer: writer}
provisional: {demo-prov-1: a stand-in profile}
requirements:
  - {id: DEMO-A, section: S1, level: MUST, roles: [reader, writer], text: "a <b>"}
  - {id: DEMO-B, section: S2, level: SHOULD, roles: [reader], text: b, depends_on: [demo-prov-1]}
  - {id: DEMO-C, section: S2, level: RULE, roles: [writer], text: c, testable: false, why: internal state}
""",
    "other.yaml": """\
protocol: other
title: Other
source: other.txt
roles: [peer]
suites: {other-peer: peer}
requirements:
  - {id: OTHER-A, section: S, level: MUST, roles: [peer], text: o}
""",
}


@pytest.fixture
def catalog(tmp_path: Path) -> Catalog:
    folder = tmp_path / "catalog"
    folder.mkdir()
    for name, text in CATALOGS.items():
        (folder / name).write_text(text)
    return load_catalogs(folder)


def _result(nodeid: str, verdict: str, reqs: tuple[str, ...] = ("DEMO-A",), suite: str = "demo-reader",
            message: str = "", evidence: str | None = None) -> TestResult:
    return TestResult(nodeid, suite, reqs, "MUST", verdict, message, 0.5, evidence, 1)


def test_worst_verdict_order() -> None:
    assert worst_verdict(["pass", "not-applicable"]) == "pass"
    assert worst_verdict(["not-applicable"]) == "not-applicable"
    assert worst_verdict(["pass", "xfail", "inconclusive"]) == "inconclusive"
    assert worst_verdict(["inconclusive", "fail", "pass"]) == "fail"
    assert worst_verdict([]) is None


def test_coverage_per_role(catalog: Catalog, tmp_path: Path) -> None:
    report_dir = tmp_path / "out"
    results = [
        _result("t::a1", "pass", evidence=str(report_dir / "evidence" / "a1.json")),
        _result("t::a2", "fail", message="AssertionError: wrong CRC\nmore"),
        _result("t::b", "not-applicable", ("DEMO-B",)),
    ]
    doc = build_coverage(catalog, results, {"seed": 3, "exit_code": 1}, report_dir=str(report_dir))
    assert list(doc["protocols"]) == ["demo"]  # "other" did not run
    reader = doc["protocols"]["demo"]["roles"]["reader"]
    by_id = {r["id"]: r for r in reader["requirements"]}
    assert by_id["DEMO-A"]["verdict"] == "fail"
    assert by_id["DEMO-A"]["tests"][0]["evidence"] == "evidence/a1.json"
    assert by_id["DEMO-A"]["tests"][1]["message"] == "AssertionError: wrong CRC\nmore"  # whole, not cut
    assert by_id["DEMO-B"]["verdict"] == "not-applicable"
    assert reader["uncovered"] == [] and reader["ran"] is True
    writer = doc["protocols"]["demo"]["roles"]["writer"]
    assert {r["id"]: r["verdict"] for r in writer["requirements"]} == {"DEMO-A": "uncovered",
                                                                        "DEMO-C": "untestable"}
    assert writer["uncovered"] == ["DEMO-A"] and writer["ran"] is False
    assert doc["summary"]["verdicts"] == {"fail": 1, "not-applicable": 1, "pass": 1}
    assert build_coverage(catalog, results, {}, all_protocols=True)["protocols"].keys() == {"demo", "other"}

    path = write_coverage_json(report_dir / "coverage.json", doc)
    assert load_coverage(path) == doc
    (tmp_path / "junk.json").write_text("{}")
    with pytest.raises(ValueError, match="format"):
        load_coverage(tmp_path / "junk.json")


def test_html_page(catalog: Catalog, tmp_path: Path) -> None:
    report_dir = tmp_path / "out"
    results = [_result("t::a1", "fail", message="bad <frame>", evidence=str(report_dir / "evidence/a1.json"))]
    meta = {"exit_code": 1, "seed": 99, "target": {"name": "acme", "kind": "url"}}
    doc = build_coverage(catalog, results, meta, report_dir=str(report_dir))
    page = render_html(doc)
    assert "FAILED: 1 mandatory requirement failed" in page and "acme" in page and "99" in page
    assert 'class="v fail"' in page and "bad &lt;frame&gt;" in page and "a &lt;b&gt;" in page
    assert 'href="evidence/a1.json"' in page
    assert "<script" not in page
    assert "Uncovered (1):</b> DEMO-A" in page  # writer role
    elsewhere = write_html(doc, tmp_path / "pages" / "page.html", report_dir)
    assert 'href="../out/evidence/a1.json"' in elsewhere.read_text()


def test_html_puts_problems_first_and_folds_passing_instances(catalog: Catalog) -> None:
    results = [_result(f"conformance/demo/reader/test_x.py::test_a[{i}]", "pass", evidence=f"evidence/{i}.json")
               for i in range(5)]
    results.append(_result("conformance/demo/reader/test_x.py::test_a[bad]", "fail",
                           message="AssertionError: field x: got 1, expected 2 (DEMO-A)\nmore detail"))
    doc = build_coverage(catalog, results, {"exit_code": 1})
    page = render_html(doc)
    problems = page.index("Failed requirements (1)")
    assert problems < page.index("role reader"), "failures are listed before the per-role tables"
    assert "field x: got 1, expected 2 (DEMO-A)" in page
    assert "5 passing</summary>" in page, "the passing instances of a parametrised check fold into one line"
    assert "pass</span> ×5" in page and "fail</span> <span" in page
    assert "<details><summary><b>role writer" in page, "a role whose suite did not run is folded"


def test_provisional_dependencies_are_carried_and_counted(catalog: Catalog) -> None:
    results = [_result("t::a", "pass"), _result("t::b1", "pass", ("DEMO-B",)),
               _result("t::b2", "fail", ("DEMO-A", "DEMO-B"))]
    doc = build_coverage(catalog, results, {"exit_code": 1})
    reader = {r["id"]: r for r in doc["protocols"]["demo"]["roles"]["reader"]["requirements"]}
    assert reader["DEMO-B"]["depends_on"] == ["demo-prov-1"]
    assert "depends_on" not in reader["DEMO-A"]
    assert doc["summary"]["provisional"] == {"demo-prov-1": 2}, "t::b1 and t::b2 cite DEMO-B; t::a does not"
    page = render_html(doc)
    assert page.count("depends on demo-prov-1") == 2, "a marker on DEMO-B's row and on the failed check citing it"
    problems = page[page.index("Failed requirements"):page.index("role reader")]
    assert "depends on demo-prov-1" in problems
    assert "2 on demo-prov-1" in page
    plain = build_coverage(catalog, results[:1], {"exit_code": 0})
    assert plain["summary"]["provisional"] == {} and "provisional profiles" not in render_html(plain)


def test_a_failure_blamed_outside_the_checks_citations_is_listed_under_that_requirement(catalog: Catalog) -> None:
    failed = _result("t::auth", "fail", ("DEMO-A",), message="DEMO-B: SETUP answered with garbage")
    results = [TestResult.from_dict({**failed.as_dict(), "blamed": "DEMO-B", "reached": []})]
    doc = build_coverage(catalog, results, {})
    by_id = {r["id"]: r for role in doc["protocols"]["demo"]["roles"].values() for r in role["requirements"]}
    assert by_id["DEMO-B"]["verdict"] == "fail" and by_id["DEMO-A"]["verdict"] != "fail"
