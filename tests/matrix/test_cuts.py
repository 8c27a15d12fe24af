"""The matrix cut by MOQT draft and by RDMA binding (reports/matrix_cuts.py), on a matrix document written as data:
which cells each page holds, the counts it shows, the links between the pages, and stale pages removed."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from kvconform.matrix.tool import _fresh
from kvconform.reports.matrix import write_matrix
from kvconform.reports.matrix_cuts import cut_document, cut_file, matrix_cuts
from tests.browser import browser_page, require_browser


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


def _shown(page: Path) -> set[str]:
    return set(re.findall(r'data-cell="([^"]+)"', page.read_text()))


def test_each_draft_and_binding_has_its_cells() -> None:
    cuts = matrix_cuts(matrix())
    assert cuts == {"draft": {"21": ["kvcs--a--b", "kvcs--b--b"], "22": ["kvcs--a--a", "kvcs--a--b"]},
                    "binding": {"ib-rc": ["kbtp--r--n"], "rdmap-7306": ["kbtp--r--r"]}}
    doc = cut_document(matrix(), "draft", "22", cuts["draft"]["22"])
    assert [t["id"] for t in doc["tables"]] == ["kvcs"]
    assert doc["summary"]["cells"] == 2 and doc["summary"]["outcomes"] == {"fail": 1, "inconclusive": 0, "pass": 1}
    assert {"row": "b", "column": "b", "why": "not a MOQT draft 22 cell"} in doc["tables"][0]["not_cells"]
    assert [s["implementation"] for s in doc["suites"]] == ["a"]


def test_the_pages_are_written_beside_the_matrix_and_link_each_other(tmp_path: Path) -> None:
    write_matrix(matrix(), {}, tmp_path)
    pages = sorted(p.name for p in tmp_path.glob("matrix-*.html"))
    assert pages == ["matrix-binding-ib-rc.html", "matrix-binding-rdmap-7306.html", "matrix-draft-21.html",
                     "matrix-draft-22.html"]
    assert _shown(tmp_path / "matrix-draft-21.html") == {"kvcs--a--b", "kvcs--b--b"}
    assert _shown(tmp_path / "matrix-binding-ib-rc.html") == {"kbtp--r--n"}
    assert _shown(tmp_path / "matrix.html") == {"kvcs--a--a", "kvcs--a--b", "kvcs--b--b", "kbtp--r--r", "kbtp--r--n"}
    for page in ["matrix.html", *pages]:
        text = (tmp_path / page).read_text()
        assert all(f'href="{other}"' in text for other in ["matrix.html", *pages])
        assert f'href="{page}" class="here"' in text
    assert "<h1>kvconform plugfest matrix: RDMA binding ib-rc</h1>" in (tmp_path / cut_file("binding", "ib-rc")
                                                                          ).read_text()
    (tmp_path / "matrix-draft-20.html").write_text("an earlier run's")
    _fresh(tmp_path)
    assert not list(tmp_path.glob("matrix*"))


def test_a_cut_in_a_browser(tmp_path: Path) -> None:
    """From the whole matrix to a draft's page and on to a binding's, as a person clicks."""
    require_browser()
    write_matrix(matrix(), {}, tmp_path)
    with browser_page() as page:
        page.goto((tmp_path / "matrix.html").as_uri())
        page.locator("nav.cuts a", has_text="22").click()
        page.wait_for_load_state()
        assert page.url.endswith("/matrix-draft-22.html")
        assert page.locator("h1").inner_text() == "kvconform plugfest matrix: MOQT draft 22"
        assert page.locator("section.table h2").all_inner_texts() == ["KVCS"]
        assert page.locator('td[data-cell="kvcs--b--b"]').count() == 0
        assert page.locator('td.not-a-cell[title="not a MOQT draft 22 cell"]').count() == 1  # row b, column b
        page.locator("nav.cuts a", has_text="ib-rc").click()
        page.wait_for_load_state()
        assert page.locator('td[data-cell="kbtp--r--n"] a.verdict').inner_text() == "INCONCLUSIVE"
