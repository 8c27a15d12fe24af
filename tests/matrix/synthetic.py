"""A small plugfest matrix document written as data (the shape of matrix.json): KVCS cells on drafts 21 and 22, KBTP
cells on two bindings, an isolation exchange and two role suites; for the tests of what reads a matrix."""

from __future__ import annotations

from typing import Any

__all__ = ["matrix"]


def _cell(cid: str, kind: str, versions: list[Any], outcome: str, isolation: bool = False) -> dict[str, Any]:
    roles = {"kvcs": ("kvcs-publisher", "kvcs-consumer"), "kbtp": ("kbtp-initiator", "kbtp-target")}[kind]
    return {"id": cid, "kind": kind, "table": None if isolation else kind, "isolation": isolation,
            "participants": {roles[0]: cid.split("--")[1], roles[1]: cid.split("--")[2]}, "versions": versions,
            "outcome": outcome, "reason": f"{cid} {outcome}",
            "exchange": {"outcome": outcome, "message": "", "unavailable": None, "duration_s": 1.0},
            "suites": {}, "blame": [], "identifiers": {}, "evidence": f"cells/{cid}/index.html", "dir": f"cells/{cid}"}


def _table(kind: str, cells: list[dict[str, Any]]) -> dict[str, Any]:
    roles = [r for r in cells[0]["participants"]]
    return {"id": kind, "kind": kind, "protocol": kind, "title": kind.upper(),
            "rows": {"role": roles[0], "implementations": sorted({c["participants"][roles[0]] for c in cells})},
            "columns": {"role": roles[1], "implementations": sorted({c["participants"][roles[1]] for c in cells})},
            "fixed": {}, "cells": [{"row": c["participants"][roles[0]], "column": c["participants"][roles[1]],
                                    "cell": c["id"]} for c in cells], "not_cells": []}


def matrix() -> dict[str, Any]:
    kvcs = [_cell("kvcs--a--a", "kvcs", [22], "pass"), _cell("kvcs--a--b", "kvcs", [21, 22], "fail"),
            _cell("kvcs--b--b", "kvcs", [21], "pass")]
    kbtp = [_cell("kbtp--r--r", "kbtp", ["rdmap-7306"], "pass"), _cell("kbtp--r--n", "kbtp", ["ib-rc"], "inconclusive")]
    isolation = [_cell("kvcs--b--ref", "kvcs", [21], "pass", isolation=True)]
    cells = kvcs + kbtp + isolation
    suites = [{"implementation": "a", "suite": "kvcs-publisher", "outcome": "pass", "message": "ok"},
              {"implementation": "r", "suite": "kbtp-target", "outcome": "pass", "message": "ok"}]
    return {"format": "kvconform-matrix/1",
            "meta": {"registry": {"name": "r", "path": "r.yaml", "sha256": "0" * 64}, "command_line": ["kvconform"],
                     "started": "s", "finished": "f", "seed": 1, "suites_run": True,
                     "harness": {"kvconform": "0.1.0", "python": "3.11"}, "host": "h"},
            "summary": {"cells": 5, "outcomes": {"fail": 1, "inconclusive": 1, "pass": 3}, "isolation_cells": 1,
                        "suites": 2, "suite_outcomes": {"pass": 2}},
            "implementations": [], "no_matrix_role": [], "skipped_tables": {},
            "tables": [_table("kvcs", kvcs), _table("kbtp", kbtp)], "cells": cells, "suites": suites}
