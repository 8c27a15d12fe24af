"""The command line explains itself (run --help, suites, serve --help) and a failed run prints one block per
failed requirement instead of tracebacks."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kvconform import cli
from kvconform.catalog import load_catalogs
from kvconform.components import COMPONENTS, SUMMARIES
from kvconform.reports.console import FULL_MESSAGES, LISTED, failure_blocks
from kvconform.results import TestResult
from kvconform.targets.registry import ROLES
from tests.test_plugin import _run, _suite

pytest_plugins = ["pytester"]


def test_run_help_explains_the_options_and_lists_every_suite_with_its_target_forms(
        capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["run", "--help"]) == 0
    out = capsys.readouterr().out
    for option in ("--target", "--testbed", "--seed", "--pics-set", "--timeout", "--suite-budget", "--report-dir"):
        assert f"  {option} " in out, option
    assert "replays a run" in out and "'tlkv.decode.versions=[1, 2]'" in out
    for form in ("reference", "grpc://host:port", "cmd:<template>", "python:<module>:<factory>", "<name>"):
        assert form in out, form
    suites = cli.discover_suites()
    assert suites, "no suite installed: the help would list nothing"
    for suite in suites:
        assert f"  {ROLES[suite].describe()}" in out, suite
    assert "{pool} {versions}" in out  # a cmd: role's optional placeholders


def test_suites_lists_roles_requirement_counts_and_target_forms(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["suites", "--json"]) == 0
    rows = {row["suite"]: row for row in json.loads(capsys.readouterr().out)}
    assert set(rows) == set(cli.discover_suites())
    catalog = load_catalogs()
    writer = rows["tlkv-writer"]
    reqs = [r for r in catalog.requirements("tlkv") if "writer" in r.roles]
    assert writer["role"] == "writer" and writer["requirements"] == len(reqs) > 0
    assert writer["gating"] + writer["strict"] + writer["may"] == len(reqs)
    assert "cmd:<template with {sequence} {out}>" in writer["targets"]
    assert "moqt://host:port" in rows["moqt-relay"]["targets"]
    assert cli.main(["suites"]) == 0
    text = capsys.readouterr().out
    assert f"    requirements: {len(reqs)} (" in text and "tlkv-writer  (protocol tlkv, role writer)" in text


def test_serve_help_lists_components_and_each_has_its_own_help(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["serve", "--help"]) == 0
    out = capsys.readouterr().out
    assert set(SUMMARIES) == set(COMPONENTS)
    for name in COMPONENTS:
        assert f"  {name}" in out and SUMMARIES[name] in out
    for name in COMPONENTS:
        assert cli.main(["serve", name, "--help"]) == 0
        assert SUMMARIES[name] in capsys.readouterr().out
    assert cli.main(["serve"]) == 2
    assert "kvconform serve --help" in capsys.readouterr().err


def test_a_failed_run_prints_a_block_per_requirement_and_no_traceback(tmp_path: Path,
                                                                      capsys: pytest.CaptureFixture[str]) -> None:
    code = cli.main(["run", "tlkv-writer", "--target", "python:tests.mutants.tlkv:UnchainedHashWriter",
                     "--report-dir", str(tmp_path / "rep"), "--seed", "1"])
    out = capsys.readouterr().out
    assert code == 1
    failed = [t for t in json.loads((tmp_path / "rep" / "coverage.json").read_text())["tests"]
              if t["verdict"] == "fail"]
    assert failed and {t["blamed"] for t in failed} == {"TLKV-HASH-CHAIN"}
    assert out.count("FAILED TLKV-HASH-CHAIN [RULE] (gates; ") == 1
    assert "Traceback" not in out and "= FAILURES =" not in out and "short test summary" not in out
    assert "\nE   " not in out and "def test_" not in out
    shown = [t for t in failed if f"  check: {t['nodeid']}" in out]
    assert len(shown) == len(failed)  # fewer than FULL_MESSAGES + LISTED
    with_message = [t for t in failed if all(f"      {line}" in out for line in t["message"].splitlines())]
    assert len(with_message) >= min(FULL_MESSAGES, len(failed))
    evidence = [line.split("evidence: ", 1)[1] for line in out.splitlines() if line.startswith("    evidence: ")]
    assert evidence and all(Path(p).is_file() for p in evidence)
    # Every check's traceback is kept in its evidence, not lost with the console's.
    assert all(json.loads(Path(p).read_text()).get("verdict") for p in evidence)
    assert len(out.splitlines()) < 40 + 8 * len(failed)


def test_plain_pytest_keeps_its_tracebacks(pytester: pytest.Pytester) -> None:
    _suite(pytester, """\
        import pytest
        @pytest.mark.req("DEMO-MUST")
        def test_fails():
            assert 1 == 2, "the mismatch"
    """)
    result = _run(pytester)
    assert result.ret == 1
    result.stdout.fnmatch_lines(["*= FAILURES =*", "*def test_fails():*",
                                 "FAILED DEMO-MUST [[]MUST[]] (gates; 1 check)", "*short test summary info*"])


def _result(name: str, verdict: str, message: str, level: str = "MUST", blamed: str | None = None) -> TestResult:
    return TestResult(nodeid=f"t.py::{name}", suite="demo-reader", reqs=("DEMO-MUST", "DEMO-MAY"), level=level,
                      verdict=verdict, message=message, evidence=f"ev/{name}.json", blamed=blamed)


def test_blocks_group_one_cause_cap_long_lists_and_name_what_does_not_gate() -> None:
    results = [_result("lead", "inconclusive", "could not reach or start the target: refused")]
    results += [_result(f"s{i}", "inconclusive", "a shared setup this check needs failed in t.py::lead: "
                                                  "TargetUnavailable: refused") for i in range(40)]
    results += [_result(f"f{i}", "fail", f"DEMO-MUST: field: seen {i}\nsecond line", blamed="DEMO-MUST")
                for i in range(30)]
    results += [_result("should", "fail", "DEMO-SHOULD: x", level="SHOULD", blamed="DEMO-SHOULD"),
                _result("bug", "inconclusive", "harness error (a bug in kvconform, not a verdict on the target): "
                                               "KeyError: 'x'", level="MAY"),
                _result("na", "not-applicable", "not declared"), _result("ok", "pass", "")]
    lines = failure_blocks(results, strict=False, report_dir=Path("rep"))
    text = "\n".join(lines)
    titles = [line for line in lines if not line.startswith(" ")]
    assert titles == ["FAILED DEMO-MUST [MUST] (gates; 30 checks)",
                      "FAILED DEMO-SHOULD [SHOULD] (does not gate without --strict; 1 check)",
                      "INCONCLUSIVE [MUST] (gates; 41 checks, one cause)",
                      "HARNESS ERROR (a bug in kvconform, not a verdict on the target) [MAY] (does not gate; 1 check)",
                      "(tracebacks and transcripts: the evidence bundles under rep/evidence)"]
    assert text.count("      second line") == FULL_MESSAGES
    assert f"  ... and {30 - FULL_MESSAGES - LISTED} more checks" in text
    assert text.index("check: t.py::lead") < text.index("check: t.py::s0")  # the cause first, in full
    assert "      could not reach or start the target: refused" in text
    assert "t.py::na" not in text and "t.py::ok" not in text
    assert failure_blocks([_result("ok", "pass", "")], strict=False) == []
