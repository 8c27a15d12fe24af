"""The matrix cut by MOQT draft and by RDMA binding (reports/matrix_cuts.py), on a matrix document written as data:
which cells each page holds, the counts it shows, the links between the pages, and stale pages removed."""

from __future__ import annotations

import re
from pathlib import Path

from kvconform.matrix.tool import _fresh
from kvconform.reports.matrix import write_matrix
from kvconform.reports.matrix_cuts import cut_document, cut_file, matrix_cuts
from tests.browser import browser_page, require_browser
from tests.matrix.synthetic import matrix


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
