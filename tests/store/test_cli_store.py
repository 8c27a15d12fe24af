"""``--results-db`` on ``kvconform run`` and ``kvconform matrix``: a database that cannot be opened is a usage error
before anything runs; the matrix records itself (its cells) and each role suite's report folder, and gate judges
a matrix."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from kvconform.cli import main
from kvconform.matrix.tool import _record
from kvconform.reports.matrix import write_matrix
from kvconform.store import open_store, read_report_dir, read_run_dir
from tests.matrix.synthetic import matrix
from tests.report_runs import ReportRun


@pytest.mark.parametrize("command", [["run", "tlkv-reader"], ["matrix", "--roles", "tlkv-reader"]])
def test_an_unusable_results_db_is_a_usage_error_before_the_run(command: list[str], tmp_path: Path,
                                                                capsys: pytest.CaptureFixture[str]) -> None:
    out = "--report-dir" if command[0] == "run" else "--out"
    code = main([*command, out, str(tmp_path / "out"), "--results-db", "mysql://db/kv"])
    assert code == 2 and "unknown scheme 'mysql'" in capsys.readouterr().err
    assert not (tmp_path / "out" / "coverage.json").exists() and not (tmp_path / "out" / "matrix.json").exists()


def test_the_matrix_records_itself_and_each_suite_report(reference: ReportRun, tmp_path: Path,
                                                         capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "matrix"
    shutil.copytree(reference.report_dir, out / "suites" / "ref" / "tlkv-reader" / "report")
    suite = {"implementation": "ref", "suite": "tlkv-reader", "outcome": "pass", "message": "ok"}
    doc = {**matrix(), "suites": [
        {**suite, "coverage": os.path.join("suites", "ref", "tlkv-reader", "report", "coverage.json")},
        {**suite, "suite": "tlkv-writer", "coverage": None}]}
    write_matrix(doc, {}, out)
    with open_store(None, beside=str(out)) as store:
        _record(store, out, doc)
        suite_run, matrix_run = (store.run(i) for i in store.run_ids())
    assert "recorded as run 2 in " in capsys.readouterr().out
    assert suite_run is not None and suite_run.matrix_dir == str(out)
    assert suite_run.checks == read_report_dir(reference.report_dir).checks
    assert matrix_run is not None and matrix_run.target_kind == "matrix"
    assert (matrix_run.draft, matrix_run.binding) == ("21,22", "ib-rc,rdmap-7306")
    assert {c.nodeid: c.verdict for c in matrix_run.checks} == {
        f"cell:{c['id']}": c["outcome"] for c in doc["cells"] if not c["isolation"]}
    assert (tmp_path / "results.sqlite").is_file()  # the default: beside --out


def test_gate_judges_a_matrix_against_an_earlier_one(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    before, after = matrix(), matrix()
    cell = next(c for c in after["cells"] if c["id"] == "kvcs--a--a")
    cell["outcome"] = "fail"
    write_matrix(before, {}, tmp_path / "before")
    write_matrix(after, {}, tmp_path / "after")
    assert read_run_dir(tmp_path / "after").identity_key == read_run_dir(tmp_path / "before").identity_key
    code = main(["gate", "--baseline", str(tmp_path / "before"), "--report-dir", str(tmp_path / "after")])
    out = capsys.readouterr().out
    assert code == 1 and "GATES new failures: cell:kvcs--a--a: fail (baseline pass)" in out
