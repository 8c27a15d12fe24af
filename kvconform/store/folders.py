"""Which run a folder holds: a suite run's report folder (coverage.json) or a plugfest matrix's (matrix.json)."""

from __future__ import annotations

import os
from pathlib import Path

from kvconform.store.matrix_record import MATRIX, read_matrix_dir
from kvconform.store.record import COVERAGE, RunRecord, read_report_dir

__all__ = ["read_run_dir"]


def read_run_dir(folder: str | os.PathLike[str]) -> RunRecord:
    """The run in ``folder``; a folder with neither file is read as a report folder (whose error names it)."""
    root = Path(folder)
    if not (root / COVERAGE).is_file() and (root / MATRIX).is_file():
        return read_matrix_dir(root)
    return read_report_dir(root)
