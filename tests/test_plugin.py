"""The kvconform pytest plugin on synthetic suites: verdicts, exit status, evidence, seeds, xdist."""

from __future__ import annotations

import hashlib
import json
import re
import textwrap
from pathlib import Path
from typing import Any

import pytest

from kvconform.fixtures.plugin import suite_of_path

pytest_plugins = ["pytester"]

CATALOG = """\
protocol: demo
title: Demo protocol
source: nowhere.txt
roles: [reader, writer]
suites: {demo-reader: reader, demo-writer: writer}
requirements:
  - {id: DEMO-MUST, section: S, level: MUST, roles: [reader], text: must}
  - {id: DEMO-SHOULD, section: S, level: SHOULD, roles: [reader], text: should}
  - {id: DEMO-MAY, section: S, level: MAY, roles: [reader, writer], text: may}
  - {id: DEMO-RULE, section: S, level: RULE, roles: [writer], text: rule}
  - {id: DEMO-HIDDEN, section: S, level: MUST, roles: [writer], text: hidden, testable: false, why: internal}
"""

MIXED = """\
import pytest
from kvconform.verdicts import inconclusive

@pytest.mark.req("DEMO-MUST")
def test_pass():
    pass

@pytest.mark.req("DEMO-MUST")
def test_na(pics):
    pics.require("demo.not_declared")

@pytest.mark.req("DEMO-MAY")
def test_inconclusive():
    inconclusive("no observation")

@pytest.mark.req("DEMO-MUST")
@pytest.mark.xfail(reason="known bug")
def test_xfail():
    assert False

@pytest.mark.req("DEMO-SHOULD")
def test_should_fails():
    assert 1 == 2, "should-level mismatch"
"""


def _suite(pytester: pytest.Pytester, body: str, role: str = "reader", name: str = "test_demo.py") -> Path:
    (pytester.path / "catalog").mkdir(exist_ok=True)
    (pytester.path / "catalog" / "demo.yaml").write_text(CATALOG)
    folder = pytester.path / "conformance" / "demo" / role
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / name
    path.write_text(textwrap.dedent(body))
    return path


def _run(pytester: pytest.Pytester, *args: str, subprocess: bool = False) -> pytest.RunResult:
    base = ["-p", "no:cacheprovider", "--import-mode=importlib", "--kvconform-catalog-dir", "catalog",
            "--kvconform-report-dir", "out", *args]
    if subprocess:
        return pytester.runpytest_subprocess(*base, timeout=120)
    return pytester.runpytest(*base)


def _coverage(pytester: pytest.Pytester) -> dict[str, Any]:
    doc: dict[str, Any] = json.loads((pytester.path / "out" / "coverage.json").read_text())
    return doc


def _verdicts(doc: dict[str, Any]) -> dict[str, str]:
    return {t["nodeid"].split("::")[-1]: t["verdict"] for t in doc["tests"]}


def test_suite_of_path() -> None:
    assert suite_of_path("/x/conformance/tlkv/reader/test_a.py") == "tlkv-reader"
    assert suite_of_path("/x/conformance/tlkv/decode/sub/test_a.py") == "tlkv-decode"
    assert suite_of_path("/x/tests/test_a.py") is None
    assert suite_of_path("/x/conformance/test_a.py") is None


def test_verdicts_from_outcomes_and_should_does_not_gate(pytester: pytest.Pytester) -> None:
    _suite(pytester, MIXED)
    result = _run(pytester, "--kvconform-seed", "7")
    assert result.ret == 0, result.stdout.str()
    doc = _coverage(pytester)
    assert _verdicts(doc) == {
        "test_pass": "pass",
        "test_na": "not-applicable",
        "test_inconclusive": "inconclusive",
        "test_xfail": "xfail",
        "test_should_fails": "fail",
    }
    result.stdout.fnmatch_lines(["*demo-reader: 1 fail, 1 inconclusive, 1 not-applicable, 1 pass, 1 xfail*"])
    reader = doc["protocols"]["demo"]["roles"]["reader"]
    by_id = {r["id"]: r for r in reader["requirements"]}
    assert by_id["DEMO-MUST"]["verdict"] == "xfail"  # worst of pass, not-applicable, xfail
    assert by_id["DEMO-SHOULD"]["verdict"] == "fail"
    assert by_id["DEMO-SHOULD"]["tests"][0]["message"].startswith("should-level mismatch")
    writer = doc["protocols"]["demo"]["roles"]["writer"]
    assert writer["ran"] is False
    assert writer["uncovered"] == ["DEMO-MAY", "DEMO-RULE"]
    assert {r["id"]: r["verdict"] for r in writer["requirements"]}["DEMO-HIDDEN"] == "untestable"
    assert doc["meta"]["seed"] == 7 and doc["meta"]["exit_code"] == 0
    na = next(t for t in doc["tests"] if t["nodeid"].endswith("test_na"))
    assert "demo.not_declared" in na["message"]


def test_should_failure_gates_under_strict(pytester: pytest.Pytester) -> None:
    _suite(pytester, MIXED)
    result = _run(pytester, "--kvconform-strict")
    assert result.ret == 1
    result.stdout.fnmatch_lines(["FAILED DEMO-SHOULD [[]SHOULD[]] (gates; 1 check)",
                                 "  check: *test_should_fails"])
    assert _coverage(pytester)["meta"]["strict"] is True


def test_must_failure_exits_1(pytester: pytest.Pytester) -> None:
    _suite(pytester, """\
        import pytest
        @pytest.mark.req("DEMO-MUST")
        def test_bad():
            assert 0
        @pytest.mark.req("DEMO-MAY")
        def test_may():
            assert 0
    """)
    result = _run(pytester)
    assert result.ret == 1
    assert _coverage(pytester)["meta"]["exit_code"] == 1


def test_may_failure_alone_exits_0(pytester: pytest.Pytester) -> None:
    _suite(pytester, """\
        import pytest
        @pytest.mark.req("DEMO-MAY")
        def test_may():
            assert 0
    """)
    assert _run(pytester, "--kvconform-strict").ret == 0


def test_setup_error_is_inconclusive_and_gates(pytester: pytest.Pytester) -> None:
    _suite(pytester, """\
        import pytest
        @pytest.fixture
        def broken():
            raise RuntimeError("driver crashed")
        @pytest.mark.req("DEMO-MUST")
        def test_uses_broken(broken):
            pass
    """)
    result = _run(pytester)
    assert result.ret == 1
    (test,) = _coverage(pytester)["tests"]
    assert test["verdict"] == "inconclusive"
    assert "setup error" in test["message"] and "driver crashed" in test["message"]


def test_teardown_error_after_pass_is_inconclusive(pytester: pytest.Pytester) -> None:
    _suite(pytester, """\
        import pytest
        @pytest.fixture
        def leaky():
            yield
            raise RuntimeError("close failed")
        @pytest.mark.req("DEMO-MUST")
        def test_ok(leaky):
            pass
    """)
    result = _run(pytester)
    assert result.ret == 1
    (test,) = _coverage(pytester)["tests"]
    assert test["verdict"] == "inconclusive" and "teardown error" in test["message"]


def test_class_and_module_markers(pytester: pytest.Pytester) -> None:
    _suite(pytester, """\
        import pytest
        pytestmark = pytest.mark.req("DEMO-MAY")
        @pytest.mark.req("DEMO-MUST")
        class TestX:
            @pytest.mark.req("DEMO-SHOULD")
            def test_a(self):
                pass
    """)
    assert _run(pytester).ret == 0
    (test,) = _coverage(pytester)["tests"]
    assert sorted(test["reqs"]) == ["DEMO-MAY", "DEMO-MUST", "DEMO-SHOULD"]
    assert test["level"] == "MUST"


def test_unknown_requirement_is_a_collection_error(pytester: pytest.Pytester) -> None:
    _suite(pytester, """\
        import pytest
        @pytest.mark.req("DEMO-NOPE")
        def test_x():
            pass
    """)
    result = _run(pytester)
    assert result.ret == pytest.ExitCode.INTERRUPTED
    result.stdout.fnmatch_lines(["*test_demo.py::test_x*DEMO-NOPE*no such requirement in*demo.yaml*"])


def test_unmarked_failure_keeps_pytest_semantics(pytester: pytest.Pytester) -> None:
    _suite(pytester, """\
        import pytest
        @pytest.mark.req("DEMO-MUST")
        def test_marked():
            pass
        def test_harness_own():
            assert 0
    """)
    assert _run(pytester).ret == 1


def test_evidence_pics_seed_and_junit(pytester: pytest.Pytester) -> None:
    _suite(pytester, """\
        import threading
        import pytest
        from kvconform.evidence import note, record

        @pytest.mark.req("DEMO-MUST")
        def test_talks(pics, seed, rng, transcript, target):
            record("sent", "Hello", {"n": 1}, raw=bytes(range(256)) * 2)
            t = threading.Thread(target=record, args=("received", "HelloAck", {"ok": True}))
            t.start(); t.join(timeout=10)
            note("done")
            assert len(transcript.events) == 3
            assert pics.require("tlkv.writer.versions", 2) == [1, 2]
            assert target.overrides == ["tlkv.writer.versions=[1, 2]"]
            print("SEED", seed, int(rng.integers(1 << 30)))
    """)
    result = _run(pytester, "--kvconform-seed", "11", "--kvconform-pics-set", "tlkv.writer.versions=[1, 2]", "-s",
                  "--junitxml", "out/junit.xml")
    assert result.ret == 0, result.stdout.str()
    (test,) = _coverage(pytester)["tests"]
    evidence = json.loads((pytester.path / "out" / test["evidence"]).read_text())
    assert evidence["verdict"] == "pass" and evidence["seed"] == test["seed"]
    # The PICS as a summary: the values of the check's own role (demo.reader: none), and where they came from.
    assert evidence["pics"]["values"] == {} and "--pics-set tlkv.writer.versions=[1, 2]" in evidence["pics"]["source"]
    assert [e["kind"] for e in evidence["events"]] == ["Hello", "HelloAck", "note"]
    assert evidence["transcript"][0].endswith("→ Hello: n=1 [512 bytes, sha256 " + evidence["events"][0]["raw"][
        "sha256"][:16] + "…]")
    raw = evidence["events"][0]["raw"]
    assert raw["len"] == 512 and len(raw["head_hex"]) == 512 and len(raw["sha256"]) == 64
    assert raw["hex"] == (bytes(range(256)) * 2).hex(), "the whole bytes, not the first 256"
    assert "python" in evidence["versions"]
    junit = (pytester.path / "out" / "junit.xml").read_text()
    assert 'name="kvconform.verdict" value="pass"' in junit
    assert 'name="kvconform.evidence"' in junit
    # The same session seed gives the same per-test seed and random stream.
    first = re.findall(r"SEED \d+ \d+", result.stdout.str())
    assert len(first) == 1
    again = _run(pytester, "--kvconform-seed", "11", "--kvconform-pics-set", "tlkv.writer.versions=[1, 2]", "-s")
    assert re.findall(r"SEED \d+ \d+", again.stdout.str()) == first
    other = _run(pytester, "--kvconform-seed", "12", "--kvconform-pics-set", "tlkv.writer.versions=[1, 2]", "-s")
    assert re.findall(r"SEED \d+ \d+", other.stdout.str()) != first


def test_bad_target_is_a_usage_error(pytester: pytest.Pytester) -> None:
    _suite(pytester, """\
        import pytest
        @pytest.mark.req("DEMO-MUST")
        def test_x():
            pass
    """)
    result = _run(pytester, "--kvconform-target", "no-such-target")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*no-such-target*targets: reference*"])


def test_xdist_gives_the_same_verdicts_as_serial(pytester: pytest.Pytester) -> None:
    _suite(pytester, MIXED)
    _suite(pytester, """\
        import pytest
        from kvconform.verdicts import check
        @pytest.mark.req("DEMO-RULE")
        def test_rule(seed):
            check(seed >= 0, "the seed", req="DEMO-RULE")
    """, role="writer", name="test_writer.py")
    serial = _run(pytester, subprocess=True)
    assert serial.ret == 0, serial.stdout.str()
    doc_serial = _coverage(pytester)
    parallel = _run(pytester, "-n", "2", subprocess=True)
    assert parallel.ret == 0, parallel.stdout.str()
    doc_parallel = _coverage(pytester)

    def key(doc: dict[str, Any]) -> list[tuple[str, str, str | None, int]]:
        return sorted((t["nodeid"], t["verdict"], t["suite"], len(t["reqs"])) for t in doc["tests"])

    assert key(doc_serial) == key(doc_parallel)
    assert len(doc_parallel["tests"]) == 6  # every test once: no phase double counted
    roles = doc_parallel["protocols"]["demo"]["roles"]
    assert roles["writer"]["ran"] is True
    assert {r["id"]: r["verdict"] for r in roles["writer"]["requirements"]}["DEMO-RULE"] == "pass"
    # Workers derive per-test seeds from the controller's (random) session seed.
    session_seed = doc_parallel["meta"]["seed"]
    for t in doc_parallel["tests"]:
        nodeid = t["nodeid"]
        digest = hashlib.sha256(f"{session_seed}:{nodeid}".encode()).digest()
        assert t["seed"] == int.from_bytes(digest[:8], "big")


def test_allure_files_each_check_under_its_suite_and_requirements(pytester: pytest.Pytester) -> None:
    _suite(pytester, MIXED)
    result = _run(pytester, "--alluredir", "allure", subprocess=True)
    assert result.ret == 0, result.stdout.str()
    labels = {}
    for path in (pytester.path / "allure").glob("*-result.json"):
        doc = json.loads(path.read_text())
        labels[doc["name"]] = {(lab["name"], lab["value"]) for lab in doc["labels"]}
    assert {("epic", "demo"), ("feature", "demo-reader"), ("story", "DEMO-MUST"),
            ("severity", "critical")} <= labels["test_pass"]
    assert ("severity", "normal") in labels["test_should_fails"]
