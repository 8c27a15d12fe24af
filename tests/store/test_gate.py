"""``kvconform gate`` on real runs: the reference and the mutant reader that skips the CRC (the session's shared
report runs, tests/report_runs.py), and a target whose CRC checks flip between runs of one identity
(tests/store/flipping.py); the example CI action's command run as the action runs it."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from kvconform.cli import main
from kvconform.gate.expectations import ExpectationsError, load_expectations
from kvconform.gate.tool import GITHUB_SUMMARY_ENV
from kvconform.yamlload import safe_load
from tests.mutants.runner import SEED, TESTBED
from tests.report_runs import BROKEN_REQUIREMENT, BROKEN_TARGET, ReportRun
from tests.spawn import covering, kvconform, spawn_env
from tests.store.flipping import SKIP_CRC_ENV, TARGET

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples" / "ci"
FLIP_BOUND = 120.0  # seconds one run of two checks may take
ACTION_BOUND = 60.0
GITLAB_BOUND = 120.0  # the job's run of two checks, and its gate


def gate(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = main(["gate", *args])
    out, err = capsys.readouterr()
    return code, out, err


def expectations(path: Path, *entries: str) -> Path:
    path.write_text("format: kvconform-expectations/1\nexpectations:\n" + "".join(entries))
    return path


# the mutant fails TLKV-READ-CRC, and the allocation checks of those envelopes cannot be judged after it
ALLOCATIONS = ('  - check: "tlkv/reader/test_rules.py::test_rule_allocates_nothing[crc-*]"\n'
               "    verdict: inconclusive\n    reason: follows the CRC\n")
CRC_FAILS = f"  - requirement: {BROKEN_REQUIREMENT}\n    verdict: fail\n    reason: no CRC check yet\n"


def test_a_run_against_itself_or_its_baseline_passes(reference: ReportRun, broken: ReportRun,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = gate(capsys, "--baseline", str(reference.report_dir), "--report-dir", str(reference.report_dir))
    assert code == 0 and "PASSED: nothing new" in out
    code, out, _ = gate(capsys, "--baseline", str(broken.report_dir), "--report-dir", str(broken.report_dir))
    assert code == 0 and "0 new failures" in out and re.search(r"[1-9]\d* still failing", out)


def test_a_new_failure_fails_the_gate(reference: ReportRun, broken: ReportRun, tmp_path: Path,
                                      capsys: pytest.CaptureFixture[str]) -> None:
    summary = tmp_path / "gate.md"
    code, out, _ = gate(capsys, "--baseline", str(reference.report_dir), "--report-dir", str(broken.report_dir),
                        "--summary-md", str(summary))
    assert code == 1, out
    failed = {t["nodeid"] for t in broken.doc["tests"] if t["verdict"] in ("fail", "inconclusive")}
    assert failed and all(f"GATES new failures: {nodeid}:" in out for nodeid in failed)
    text = summary.read_text()
    assert text.startswith("## kvconform gate: FAILED: ") and f"| New failures | {len(failed)} |" in text
    # the other way round, the same checks are fixed: nothing gates
    code, out, _ = gate(capsys, "--baseline", str(broken.report_dir), "--report-dir", str(reference.report_dir))
    assert code == 0 and f"{len(failed)} fixed" in out


def test_an_expectations_file_excuses_known_failures_and_fails_an_unexpected_pass(
        reference: ReportRun, broken: ReportRun, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    known = expectations(tmp_path / "known.yaml", CRC_FAILS, ALLOCATIONS)
    code, out, _ = gate(capsys, "--baseline", str(known), "--report-dir", str(broken.report_dir))
    assert code == 0, out
    code, out, _ = gate(capsys, "--baseline", str(known), "--report-dir", str(reference.report_dir))
    assert code == 1 and f"GATES unexpected passes: requirement {BROKEN_REQUIREMENT}: pass" in out
    assert "no CRC check yet" in out


def test_an_expired_expectation_excuses_nothing(broken: ReportRun, tmp_path: Path,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    expired = expectations(tmp_path / "expired.yaml", CRC_FAILS + "    expires: 2001-01-01\n", ALLOCATIONS)
    code, out, _ = gate(capsys, "--baseline", str(expired), "--report-dir", str(broken.report_dir))
    assert code == 1 and "expired on 2001-01-01" in out


@pytest.mark.parametrize(("entry", "error"), [
    ("  - requirement: TLKV-READ-CRC\n    verdict: fial\n    reason: r\n", r"expectations\[0\]\.verdict: 'fial'"),
    ("  - requirement: TLKV-READ-CRC\n    verdict: fail\n", r"expectations\[0\]: 'reason' is a required property"),
    ("  - check: a\n    requirement: TLKV-READ-CRC\n    verdict: fail\n    reason: r\n",
     r"expectations\[0\]: has both check and requirement"),
    ("  - verdict: fail\n    reason: r\n", r"expectations\[0\]: names neither a check nor a requirement"),
    ("  - check: a\n    verdict: fail\n    reason: r\n    because: x\n", r"expectations\[0\]: unknown field because"),
    ("  - check: a\n    verdict: fail\n    reason: r\n    expires: someday\n",
     r"expectations\[0\]\.expires: 'someday' is not a 'date'"),
])
def test_an_expectations_file_is_schema_checked(tmp_path: Path, entry: str, error: str,
                                                capsys: pytest.CaptureFixture[str], reference: ReportRun) -> None:
    path = expectations(tmp_path / "bad.yaml", entry)
    with pytest.raises(ExpectationsError, match=error):
        load_expectations(path)
    code, _, err = gate(capsys, "--baseline", str(path), "--report-dir", str(reference.report_dir))
    assert code == 2 and str(path) in err


def test_usage_errors_exit_2(tmp_path: Path, reference: ReportRun, capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = gate(capsys, "--baseline", str(tmp_path / "nothing"), "--report-dir", str(reference.report_dir))
    assert code == 2 and "no such file or folder" in err
    code, _, err = gate(capsys, "--baseline", "3", "--report-dir", str(reference.report_dir))
    assert code == 2 and "a stored run needs --results-db" in err
    code, _, err = gate(capsys, "--baseline", str(reference.report_dir), "--report-dir", str(tmp_path))
    assert code == 2 and "coverage.json: cannot read" in err
    code, _, err = gate(capsys, "--baseline", str(reference.report_dir), "--report-dir", str(reference.report_dir),
                        "--flaky-window", "1")
    assert code == 2 and "--flaky-window 1: a flip needs at least 2 runs" in err


def test_added_and_removed_checks_fail_the_gate_only_with_the_option(reference: ReportRun, tmp_path: Path,
                                                                     capsys: pytest.CaptureFixture[str]) -> None:
    fewer = tmp_path / "fewer"
    shutil.copytree(reference.report_dir, fewer)
    doc = json.loads((fewer / "coverage.json").read_text())
    dropped = doc["tests"].pop(0)["nodeid"]
    (fewer / "coverage.json").write_text(json.dumps(doc))
    for baseline, judged, category in ((fewer, reference.report_dir, "added"), (reference.report_dir, fewer,
                                                                                  "removed")):
        args = ("--baseline", str(baseline), "--report-dir", str(judged))
        code, out, _ = gate(capsys, *args)
        assert code == 0 and "PASSED: nothing new" in out and f"1 {category} checks" in out, out
        code, out, _ = gate(capsys, *args, "--fail-on-added-removed", "--summary-md", str(tmp_path / "s.md"))
        assert code == 1 and f"FAILED: 1 {category} check " in out, out
        assert f"  GATES {category} checks: {dropped}: " in out
        assert (tmp_path / "s.md").read_text().startswith(f"## kvconform gate: FAILED: 1 {category} check\n")


def _flip_run(report_dir: Path, db: str, skip_crc: bool) -> None:
    env = {**spawn_env(), SKIP_CRC_ENV: "1" if skip_crc else ""}
    proc = kvconform(["run", "tlkv-reader", "--target", TARGET, "--testbed", str(TESTBED), "--report-dir",
                      str(report_dir), "--seed", SEED, "-q", "-k", "crc-field-v1", "--results-db", db],
                     timeout=FLIP_BOUND, env=env)
    assert "kvconform: recorded as run" in proc.stdout, proc.stdout[-2000:] + proc.stderr[-2000:]


@covering(FLIP_BOUND, FLIP_BOUND, FLIP_BOUND)
def test_a_check_that_flips_across_stored_runs_is_flaky_and_a_regression_is_not(
        store_url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """On each backend: `kvconform run --results-db` records the runs, `kvconform gate --results-db` reads them."""
    db = store_url
    for name, skip_crc in (("one", False), ("two", True), ("three", False)):
        _flip_run(tmp_path / name, db, skip_crc)
    crc = "tlkv/reader/test_rules.py::test_rule[crc-field-v1]"
    # judged: run three; before it, one passed and two failed: flaky, and it does not gate
    code, out, _ = gate(capsys, "--baseline", "latest", "--report-dir", str(tmp_path / "three"), "--results-db", db,
                        "--summary-md", str(tmp_path / "s.md"))
    assert code == 0, out
    assert f"flaky: {crc}: pass" in out and "stored runs: #1 pass, #2 fail" in out
    assert "| Flaky | 2 |" in (tmp_path / "s.md").read_text()
    # judged: run two; the other runs of its identity always passed: a new failure, not a flake
    code, out, _ = gate(capsys, "--baseline", "1", "--report-dir", str(tmp_path / "two"), "--results-db", db)
    assert code == 1 and f"GATES new failures: {crc}: fail" in out and "0 flaky" in out


def _bash(script: str, env: dict[str, str], cwd: Path, bound: float) -> subprocess.CompletedProcess[str]:
    """``script`` as a CI runner runs it: bash, stopping at the first command that fails."""
    return subprocess.run(["bash", "-eo", "pipefail", "-c", script], env=env, capture_output=True, text=True,
                          timeout=bound, stdin=subprocess.DEVNULL, cwd=cwd)


def _action_step() -> tuple[str, dict[str, str], dict[str, str]]:
    """The gate step's script and environment, and the action's inputs with their defaults."""
    action = safe_load((EXAMPLES / "action.yml").read_text())
    step = next(s for s in action["runs"]["steps"] if s.get("id") == "gate")
    inputs = {name: str(spec.get("default", "")) for name, spec in action["inputs"].items()}
    return str(step["run"]), {k: str(v) for k, v in step["env"].items()}, inputs


def _expand(value: str, inputs: dict[str, str]) -> str:
    return re.sub(r"\$\{\{\s*inputs\.([\w-]+)\s*\}\}", lambda m: inputs[m.group(1)], value)


@covering(ACTION_BOUND, ACTION_BOUND, ACTION_BOUND, ACTION_BOUND)
def test_the_example_action_runs_its_gate_command(reference: ReportRun, broken: ReportRun, tmp_path: Path) -> None:
    script, env, defaults = _action_step()
    inputs = {**defaults, "baseline": str(EXAMPLES / "kvconform-expectations.yaml"),
              "report-dir": str(broken.report_dir), "summary-md": str(tmp_path / "gate.md")}
    step_summary = tmp_path / "step-summary.md"
    step_summary.write_text("earlier step\n")
    run_env = {**os.environ, **{k: _expand(v, inputs) for k, v in env.items()}, GITHUB_SUMMARY_ENV: str(step_summary),
               "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    assert run_env["KVCONFORM_FAIL_ON_ADDED_REMOVED"] == "false"  # the input's default
    proc = _bash(script, run_env, tmp_path, ACTION_BOUND)
    # the example file excuses TLKV-READ-CRC until mid-2027 and the mutant fails only that requirement
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "PASSED: nothing new" in proc.stdout
    assert (tmp_path / "gate.md").read_text().startswith("## kvconform gate: PASSED")
    assert step_summary.read_text().startswith("earlier step\n## kvconform gate: PASSED")
    proc = _bash(script, {**run_env, "KVCONFORM_REPORT_DIR": str(reference.report_dir)}, tmp_path, ACTION_BOUND)
    assert proc.returncode == 1 and "unexpected passes" in proc.stdout
    # an entry for a check the run no longer has: listed; failing the job only with fail-on-added-removed: true
    stale = tmp_path / "stale.yaml"
    stale.write_text((EXAMPLES / "kvconform-expectations.yaml").read_text()
                     + '  - check: "tlkv/reader/test_gone.py::test_gone"\n    verdict: fail\n    reason: gone\n')
    proc = _bash(script, {**run_env, "KVCONFORM_BASELINE": str(stale)}, tmp_path, ACTION_BOUND)
    assert proc.returncode == 0 and "1 removed checks" in proc.stdout, proc.stdout + proc.stderr
    proc = _bash(script, {**run_env, "KVCONFORM_BASELINE": str(stale), "KVCONFORM_FAIL_ON_ADDED_REMOVED": "true"},
                 tmp_path, ACTION_BOUND)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "FAILED: 1 removed check" in proc.stdout
    assert "GATES removed checks: tlkv/reader/test_gone.py::test_gone: — (baseline fail)" in proc.stdout


def test_the_example_expectations_fit() -> None:
    assert load_expectations(EXAMPLES / "kvconform-expectations.yaml").entries


INSTALL = "pip install kvconform"  # the one line of the GitLab job a test does not run: kvconform is installed


def _gitlab_job() -> tuple[list[str], dict[str, str]]:
    """The GitLab job's script lines (but the install) and its variables."""
    job = safe_load((EXAMPLES / "gitlab-ci.yml").read_text())["kvconform-gate"]
    lines = [str(line) for line in job["script"]]
    assert lines[0] == INSTALL and not any("pip" in line for line in lines[1:]), lines
    return lines[1:], {k: str(v) for k, v in job["variables"].items()}


@covering(GITLAB_BOUND, GITLAB_BOUND)
def test_the_example_gitlab_job_runs_its_script(tmp_path: Path) -> None:
    """The job's script in a vendor's repository (tmp_path, with the example expectations file in ci/): a real
    run of the mutant reader that skips the CRC, two checks of it (-k), then the gate. The example file excuses
    TLKV-READ-CRC, and its allocation entry matches no check of this run: a removed check, which fails the job only
    with KVCONFORM_FAIL_ON_ADDED_REMOVED=true."""
    (tmp_path / "ci").mkdir()
    shutil.copy(EXAMPLES / "kvconform-expectations.yaml", tmp_path / "ci")
    lines, variables = _gitlab_job()
    # the job splits KVCONFORM_RUN_OPTIONS into words: a -k without spaces (test_rule's, not test_rule_allocates_...)
    env = {**spawn_env(), **variables, "KVCONFORM_TARGET": BROKEN_TARGET, "KVCONFORM_SUITE": "tlkv-reader",
           "KVCONFORM_RUN_OPTIONS": f"--testbed {TESTBED} --seed {SEED} -q -k rule[crc-field-v1",
           "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    proc = _bash("\n".join(lines), env, tmp_path, GITLAB_BOUND)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    report = json.loads((tmp_path / variables["KVCONFORM_REPORT_DIR"] / "coverage.json").read_text())
    assert {(t["nodeid"], t["verdict"]) for t in report["tests"]} == {
        ("tlkv/reader/test_rules.py::test_rule[crc-field-v1]", "fail")}
    assert "PASSED: nothing new" in proc.stdout and "1 still failing" in proc.stdout
    summary = (tmp_path / "out" / "kvconform-gate.md").read_text()
    assert summary.startswith("## kvconform gate: PASSED: nothing new\n")
    assert "| Still failing | 1 |" in summary and "| Removed checks | 1 |" in summary
    assert "test_rule_allocates_nothing[crc-*]" in summary  # the entry that matched nothing, named
    # the job with the opt-in: its gate line again, on the same run
    proc = _bash(lines[-1], {**env, "KVCONFORM_FAIL_ON_ADDED_REMOVED": "true"}, tmp_path, GITLAB_BOUND)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "GATES removed checks: tlkv/reader/test_rules.py::test_rule_allocates_nothing[crc-*]" in proc.stdout
    summary = (tmp_path / "out" / "kvconform-gate.md").read_text()
    assert summary.startswith("## kvconform gate: FAILED: 1 removed check\n")


def test_gate_help_names_the_baselines_and_exit_codes(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["gate", "--help"]) == 0
    out = capsys.readouterr().out
    assert "FILE.yaml" in out and "latest" in out and "RUN_ID" in out
    assert "Exit status: 0 nothing new; 1 a new failure" in out and "2 a usage error" in out
    assert "--fail-on-added-removed" in out and "with --fail-on-added-removed a check added or removed" in out
    assert "is reported flaky and does not gate" in out
    assert main(["--help"]) == 0 and "kvconform gate --baseline" in " ".join(capsys.readouterr().out.split())
