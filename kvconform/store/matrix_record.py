"""A plugfest matrix as one run of the store: its cells are the checks (a cell's outcome its verdict, its reason
the message, its evidence page the evidence), read from the folder's matrix.json (reports/matrix.schema.json), so
``kvconform gate`` judges a matrix against an earlier one as it judges a suite run. Its identity is the registry
(name and SHA-256) and the drafts and bindings its cells speak; each role suite's run is recorded on its own."""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from kvconform.store.record import CheckRecord, ReportError, RunRecord

__all__ = ["MATRIX", "read_matrix_dir"]

MATRIX = "matrix.json"
_CELL_LEVEL = "MUST"  # every cell gates the matrix's exit status (kvconform matrix: 0 only when all passed)


def _versions(cells: list[Mapping[str, Any]], kind: str) -> str | None:
    found = sorted({str(v) for c in cells if c["kind"] == kind for v in c["versions"]})
    return ",".join(found) if found else None


def _check(cell: Mapping[str, Any]) -> CheckRecord:
    return CheckRecord(nodeid=f"cell:{cell['id']}", suite=str(cell["kind"]), reqs=(), level=_CELL_LEVEL,
                       verdict=str(cell["outcome"]), message=str(cell["reason"]), evidence=cell.get("evidence"),
                       blamed=None, duration=float(cell["exchange"].get("duration_s") or 0.0))


def read_matrix_dir(out: str | os.PathLike[str]) -> RunRecord:
    """The matrix a ``kvconform matrix --out`` folder holds."""
    root = Path(out)
    path = root / MATRIX
    try:
        raw = path.read_bytes()
        doc = json.loads(raw)
        meta, registry = doc["meta"], doc["meta"]["registry"]
        cells = [c for c in doc["cells"] if not c["isolation"]]
        outcomes = doc["summary"]["outcomes"]
        return RunRecord(
            report_dir=str(root.resolve()), coverage_sha256=hashlib.sha256(raw).hexdigest(),
            implementation=f"plugfest matrix {registry['name']}", implementation_version=None,
            implementation_vendor=None, implementation_build=None, image_digest=None,
            target_name=str(registry["name"]), target_kind="matrix", target_value=str(registry["path"]),
            harness_version=str(meta["harness"]["kvconform"]), harness_commit="unknown",
            testbed_name=str(registry["name"]), testbed_sha256=str(registry["sha256"]), catalogs={}, pics={},
            seed=int(meta["seed"]), binding=_versions(cells, "kbtp"), draft=_versions(cells, "kvcs"),
            suites=tuple(sorted({str(t["kind"]) for t in doc["tables"]})), strict=False,
            exit_code=0 if outcomes.get("fail", 0) == 0 and outcomes.get("inconclusive", 0) == 0 else 1,
            started=str(meta["started"]), finished=str(meta["finished"]),
            checks=tuple(sorted((_check(c) for c in cells), key=lambda c: c.nodeid)), matrix_dir=str(root.resolve()))
    except OSError as exc:
        raise ReportError(f"{path}: cannot read the matrix: {exc.strerror or exc}") from None
    except (ValueError, KeyError, TypeError) as exc:
        raise ReportError(f"{path}: not a kvconform matrix.json ({type(exc).__name__}: {exc})") from None
