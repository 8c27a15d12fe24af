"""What a run leaves in allure-results (reports/allure_results.py): verdicts, environment, executor, categories,
links."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from kvconform.reports.allure_results import CATEGORIES, NODEID_LABEL, category_of, properties_text
from tests.test_junit import FAILS
from tests.test_plugin import MIXED, _run, _suite

pytest_plugins = ["pytester"]


def _results(alluredir: Path) -> dict[str, dict[str, Any]]:
    out = {}
    for path in alluredir.glob("*-result.json"):
        doc = json.loads(path.read_text())
        out[doc["name"]] = doc
    return out


def _unescape(text: str) -> str:
    def one(m: re.Match[str]) -> str:
        esc = m.group(1)
        if len(esc) == 5:
            return chr(int(esc[1:], 16))
        return {"n": "\n", "t": "\t", "r": "\r"}.get(esc, esc)

    return re.sub(r"\\(u[0-9a-fA-F]{4}|.)", one, text)


def _properties(path: Path) -> dict[str, str]:
    """java.util.Properties as Allure reads them, for the escapes properties_text writes."""
    out = {}
    for line in path.read_text("latin-1").splitlines():
        key, value = re.split(r"(?<!\\)=", line, maxsplit=1)
        out[_unescape(key)] = _unescape(value)
    return out


@pytest.fixture
def allure_run(pytester: pytest.Pytester) -> tuple[pytest.RunResult, Path]:
    _suite(pytester, MIXED)
    _suite(pytester, FAILS, name="test_fails.py")
    result = _run(pytester, "--alluredir", "allure", "--kvconform-seed", "9", subprocess=True)
    return result, pytester.path / "allure"


def test_each_result_carries_its_verdict_inconclusive_as_broken(allure_run: tuple[pytest.RunResult, Path]) -> None:
    result, alluredir = allure_run
    assert result.ret == 1, result.stdout.str()
    docs = _results(alluredir)
    status = {name: doc["status"] for name, doc in docs.items()}
    assert status == {"test_pass": "passed", "test_na": "skipped", "test_inconclusive": "broken",
                      "test_xfail": "skipped", "test_should_fails": "failed", "test_must_fails": "failed",
                      "test_harness_error": "broken"}
    message = {name: doc["statusDetails"]["message"] for name, doc in docs.items() if doc.get("statusDetails")}
    assert message["test_inconclusive"] == "inconclusive: no observation"
    assert message["test_must_fails"].startswith("fail [MUST] DEMO-MUST: DEMO-MUST: field")
    assert message["test_should_fails"].startswith("fail [SHOULD] DEMO-SHOULD (does not gate): should-level")
    assert message["test_harness_error"].startswith("harness error: harness error (a bug in kvconform")
    assert "RuntimeError" in docs["test_harness_error"]["statusDetails"]["trace"]  # allure's own trace is kept
    assert all(any(lab["name"] == NODEID_LABEL for lab in doc["labels"]) for doc in docs.values())


def test_categories_file_by_level_inconclusive_and_harness_error(allure_run: tuple[pytest.RunResult, Path]) -> None:
    _, alluredir = allure_run
    assert json.loads((alluredir / "categories.json").read_text()) == CATEGORIES
    docs = _results(alluredir)

    def category(name: str) -> str | None:
        doc = docs[name]
        return category_of(doc["statusDetails"]["message"], doc["status"])

    assert category("test_must_fails") == "Failed MUST, MUST NOT and RULE requirements (always gate)"
    assert category("test_should_fails") == "Failed SHOULD and SHOULD NOT requirements (gate with --strict)"
    assert category("test_inconclusive") == CATEGORIES[3]["name"]
    assert category("test_harness_error") == "Harness errors (a bug in kvconform, not a verdict on the target)"
    assert category_of("fail [MAY] DEMO-MAY: x\ny", "failed") == "Failed MAY requirements (never gate)"
    assert category_of("fail [MUST NOT] X: y", "failed") == CATEGORIES[0]["name"]
    # Each test falls in one category at most (Allure files a result under every one it matches).
    for doc in docs.values():
        msg = (doc.get("statusDetails") or {}).get("message", "")
        assert sum(1 for c in CATEGORIES if doc["status"] in c["matchedStatuses"]
                   and re.fullmatch(c["messageRegex"], msg)) <= 1


def test_environment_and_executor_files(allure_run: tuple[pytest.RunResult, Path]) -> None:
    _, alluredir = allure_run
    env = _properties(alluredir / "environment.properties")
    assert env["target"] == "reference" and env["seed"] == "9" and env["strict"] == "False"
    assert env["testbed"].endswith("loopback.yaml") and env["suites"] == "demo-reader"
    assert "version.python" in env and "version.kvconform" in env
    assert "--alluredir allure" in env["command"]
    executor = json.loads((alluredir / "executor.json").read_text())
    assert executor["name"].startswith("kvconform ") and executor["type"] == "kvconform"
    assert "--alluredir allure" in executor["buildName"]
    assert executor["reportUrl"] == (alluredir.parent / "out").resolve().as_uri()


def test_results_link_to_their_requirements(allure_run: tuple[pytest.RunResult, Path]) -> None:
    _, alluredir = allure_run
    links = _results(alluredir)["test_must_fails"]["links"]
    assert [(lk["type"], lk["name"]) for lk in links] == [("tms", "DEMO-MUST [MUST]"), ("tms", "DEMO-MAY [MAY]")]
    url = links[0]["url"]
    assert url.startswith("file://") and url.endswith("/catalog/demo.yaml#DEMO-MUST")


def test_a_tms_link_pattern_turns_the_links_into_the_users(pytester: pytest.Pytester) -> None:
    _suite(pytester, MIXED)
    result = _run(pytester, "--alluredir", "allure", "--allure-link-pattern", "tms:https://tracker.example/req/{}",
                  subprocess=True)
    assert result.ret == 0, result.stdout.str()
    links = _results(pytester.path / "allure")["test_pass"]["links"]
    assert links == [{"type": "tms", "url": "https://tracker.example/req/DEMO-MUST", "name": "DEMO-MUST [MUST]"}]


def test_an_unrelated_session_gets_no_kvconform_files(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_plain="def test_ok():\n    pass\n")
    result = pytester.runpytest_subprocess("--alluredir", "allure", timeout=120)
    assert result.ret == 0
    names = {p.name for p in (pytester.path / "allure").iterdir()}
    assert not names & {"environment.properties", "executor.json", "categories.json"}
    assert _results(pytester.path / "allure")["test_ok"]["status"] == "passed"


def test_properties_escapes() -> None:
    text = properties_text([("a key:x=y", "line1\nline2 \\ é"), ("k", " lead")])
    assert text == "a\\ key\\:x\\=y=line1\\nline2 \\\\ \\u00e9\nk=\\ lead\n"
    assert text.isascii()


def test_verdicts_reach_allure_and_junit_under_xdist(pytester: pytest.Pytester) -> None:
    # Workers write allure's files and the evidence; the controller, which alone has every verdict, rewrites.
    _suite(pytester, MIXED)
    _suite(pytester, FAILS, name="test_fails.py")
    result = _run(pytester, "--alluredir", "allure", "--kvconform-junit", "j.xml", "-n", "2", subprocess=True)
    assert result.ret == 1, result.stdout.str()
    status = {name: doc["status"] for name, doc in _results(pytester.path / "allure").items()}
    assert status["test_inconclusive"] == status["test_harness_error"] == "broken"
    assert status["test_must_fails"] == "failed" and status["test_na"] == "skipped"
    assert (pytester.path / "allure" / "categories.json").is_file()
    junit = (pytester.path / "j.xml").read_text()
    assert 'name="demo-reader"' in junit and 'errors="2"' in junit and 'type="kvconform.inconclusive"' in junit
