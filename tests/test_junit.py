"""The JUnit file of a run (reports/junit.py): a testsuite per suite, verdicts as CI reads them, the schema."""

from __future__ import annotations

import xml.etree.ElementTree as ET
from pathlib import Path

import lxml.etree
import pytest

from kvconform.reports.junit import SCHEMA, junit_document, outcome_of, write_junit
from kvconform.results import TestResult
from tests.test_plugin import MIXED, _run, _suite

pytest_plugins = ["pytester"]

# MIXED (pass, not-applicable, inconclusive, xfail, a failing SHOULD) plus a MUST failure, a harness error, a
# writer suite, and a target's bytes in a message that XML cannot carry as they are.
FAILS = """\
import pytest
from kvconform.verdicts import check_equal

@pytest.mark.req("DEMO-MUST", "DEMO-MAY")
def test_must_fails():
    print("to stdout")
    check_equal("field \\x01", b"\\x00\\x01", b"\\x02", req="DEMO-MUST")

@pytest.mark.req("DEMO-MUST")
def test_harness_error():
    raise RuntimeError("kvconform broke")
"""

WRITER = """\
import pytest
from kvconform.verdicts import check

@pytest.mark.req("DEMO-RULE")
def test_rule():
    check(True, "rule", req="DEMO-RULE")
"""


def _schema(strict_junit10: bool = False) -> lxml.etree.XMLSchema:
    text = SCHEMA.read_text()
    if strict_junit10:  # junit-10 as it stands: no <properties> in a <testcase>
        text = text.replace('<xs:element ref="properties" minOccurs="0"/>', "")
    return lxml.etree.XMLSchema(lxml.etree.fromstring(text.encode()))


def _cases(root: ET.Element) -> dict[str, ET.Element]:
    return {c.get("name", ""): c for c in root.iter("testcase")}


def _props(case: ET.Element) -> list[tuple[str, str]]:
    return [(p.get("name", ""), p.get("value", "")) for p in case.iterfind("properties/property")]


def _junit_run(pytester: pytest.Pytester, *args: str) -> tuple[pytest.RunResult, ET.Element, Path]:
    _suite(pytester, MIXED)
    _suite(pytester, FAILS, name="test_fails.py")
    _suite(pytester, WRITER, role="writer", name="test_writer.py")
    junit = pytester.path / "ci" / "junit.xml"
    result = _run(pytester, "--kvconform-junit", str(junit), *args)
    return result, ET.parse(junit).getroot(), junit


def test_one_testsuite_per_suite_with_verdicts_as_ci_reads_them(pytester: pytest.Pytester) -> None:
    result, root, _ = _junit_run(pytester)
    assert result.ret == 1, result.stdout.str()
    suites = {s.get("name"): s for s in root.iter("testsuite")}
    assert set(suites) == {"demo-reader", "demo-writer"}
    reader = suites["demo-reader"]
    assert (reader.get("tests"), reader.get("failures"), reader.get("errors"), reader.get("skipped")) == (
        "7", "2", "2", "2")
    assert (root.get("tests"), root.get("failures"), root.get("errors")) == ("8", "2", "2")
    cases = _cases(root)
    assert [c.tag for c in cases["test_inconclusive"] if c.tag != "properties" and c.tag != "system-out"] == ["error"]
    assert cases["test_inconclusive"].find("error").get("type") == "kvconform.inconclusive"  # type: ignore[union-attr]
    assert cases["test_na"].find("skipped").get("type") == "kvconform.not-applicable"  # type: ignore[union-attr]
    assert cases["test_xfail"].find("skipped") is not None
    assert cases["test_pass"].find("failure") is None and cases["test_pass"].find("error") is None
    harness = cases["test_harness_error"].find("error")
    assert harness is not None and harness.get("type") == "kvconform.harness-error"
    failure = cases["test_must_fails"].find("failure")
    assert failure is not None and failure.get("message", "").startswith("[MUST] DEMO-MUST: ")
    # The whole message; a character XML cannot carry is written as \xNN.
    assert "field \\x01: seen 00 01, expected 02" in (failure.text or "")
    should = cases["test_should_fails"].find("failure")
    assert should is not None and "(does not gate)" in should.get("message", "")
    assert cases["test_rule"].get("classname") == "demo-writer.test_writer"
    assert "to stdout" in (cases["test_must_fails"].findtext("system-out") or "")


def test_properties_per_testcase_and_evidence_relative_to_the_file(pytester: pytest.Pytester) -> None:
    _, root, junit = _junit_run(pytester, "--kvconform-seed", "3")
    props = _props(_cases(root)["test_must_fails"])
    assert ("kvconform.verdict", "fail") in props
    assert [v for k, v in props if k == "kvconform.requirement"] == ["DEMO-MUST", "DEMO-MAY"]
    assert ("kvconform.blamed", "DEMO-MUST") in props and ("kvconform.level", "MUST") in props
    assert ("kvconform.gating", "true") in props
    evidence = dict(props)["kvconform.evidence"]
    assert not Path(evidence).is_absolute() and evidence.startswith("../out/evidence/")
    assert (junit.parent / evidence).is_file()
    inconclusive = dict(_props(_cases(root)["test_inconclusive"]))
    assert inconclusive["kvconform.verdict"] == "inconclusive" and "kvconform.blamed" not in inconclusive
    suite_props = dict((p.get("name"), p.get("value")) for p in root.iterfind("testsuite/properties/property"))
    assert suite_props["kvconform.seed"] == "3" and suite_props["kvconform.target"] == "reference"


def test_the_file_validates_against_the_committed_schema_and_junit10(pytester: pytest.Pytester) -> None:
    _, _, junit = _junit_run(pytester)
    doc = lxml.etree.parse(str(junit))
    schema = _schema()
    assert schema.validate(doc), schema.error_log
    # Without the testcase properties (our one addition) it is junit-10 as CI systems read it.
    for case in doc.iter("testcase"):
        for props in case.findall("properties"):
            case.remove(props)
    strict = _schema(strict_junit10=True)
    assert strict.validate(doc), strict.error_log


def test_the_schema_rejects_what_junit10_does_not_allow(tmp_path: Path) -> None:
    schema = _schema()
    ok = b'<testsuites><testsuite name="s" tests="1" failures="0" errors="0"><testcase name="t"/></testsuite>' \
         b'</testsuites>'
    assert schema.validate(lxml.etree.fromstring(ok))
    for bad in (b'<testsuites skipped="1"/>',  # junit-10 has no skipped on <testsuites>
                b'<testsuites><testsuite name="s" tests="1"/></testsuites>',  # failures and errors are required
                b'<testsuites><testsuite name="s" tests="1" failures="0" errors="0"><testcase name="t" file="x"/>'
                b'</testsuite></testsuites>'):
        assert not schema.validate(lxml.etree.fromstring(bad)), bad


def test_collection_errors_are_error_testcases(pytester: pytest.Pytester) -> None:
    _suite(pytester, """\
        import pytest
        @pytest.mark.req("DEMO-NOPE")
        def test_x():
            pass
    """)
    junit = pytester.path / "junit.xml"
    result = _run(pytester, "--kvconform-junit", str(junit))
    assert result.ret != 0
    root = ET.parse(junit).getroot()
    (suite,) = root.iter("testsuite")
    assert suite.get("name") == "collection" and suite.get("errors") == "1"
    error = next(root.iter("error"))
    assert error.get("type") == "kvconform.collection-error" and "DEMO-NOPE" in (error.text or "")
    assert _schema().validate(lxml.etree.parse(str(junit)))


def test_junit_and_junitxml_on_one_file_is_a_usage_error(pytester: pytest.Pytester) -> None:
    _suite(pytester, MIXED)
    result = _run(pytester, "--kvconform-junit", "j.xml", "--junitxml", "j.xml")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*--kvconform-junit j.xml and --junitxml j.xml name the same file*"])


def test_an_unknown_verdict_is_never_written_as_a_pass(tmp_path: Path) -> None:
    r = TestResult(nodeid="a.py::t", suite="s-r", reqs=("X",), level="MUST", verdict="weird")
    assert outcome_of(r) == ("error", "kvconform.weird")
    write_junit(tmp_path / "j.xml", [r], {}, strict=False)
    root = junit_document([r], {}, tmp_path, strict=False)
    assert root.get("errors") == "1"
