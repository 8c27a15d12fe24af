"""``--results-db`` on ``kvconform run`` and ``kvconform matrix``: a database that cannot be opened is a usage error
before anything runs; the matrix records each role suite's report folder."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from kvconform.cli import main
from kvconform.matrix.tool import _record
from kvconform.store import open_store, read_report_dir
from tests.report_runs import ReportRun


@pytest.mark.parametrize("command", [["run", "tlkv-reader"], ["matrix", "--roles", "tlkv-reader"]])
def test_an_unusable_results_db_is_a_usage_error_before_the_run(command: list[str], tmp_path: Path,
                                                                capsys: pytest.CaptureFixture[str]) -> None:
    out = "--report-dir" if command[0] == "run" else "--out"
    code = main([*command, out, str(tmp_path / "out"), "--results-db", "mysql://db/kv"])
    assert code == 2 and "unknown scheme 'mysql'" in capsys.readouterr().err
    assert not (tmp_path / "out" / "coverage.json").exists() and not (tmp_path / "out" / "matrix.json").exists()


def test_the_matrix_records_each_suite_report(reference: ReportRun, tmp_path: Path,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "matrix"
    shutil.copytree(reference.report_dir, out / "suites" / "ref" / "tlkv-reader" / "report")
    doc = {"suites": [{"coverage": os.path.join("suites", "ref", "tlkv-reader", "report", "coverage.json")},
                      {"coverage": None}]}
    with open_store(None, beside=str(out)) as store:
        _record(store, out, doc)
        stored = store.run(store.run_ids()[0])
    assert "recorded 1 suite runs" in capsys.readouterr().out
    assert stored is not None and stored.matrix_dir == str(out)
    assert stored.checks == read_report_dir(reference.report_dir).checks
    assert (tmp_path / "results.sqlite").is_file()  # the default: beside --out
