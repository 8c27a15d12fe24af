"""CI's real matrix (``.ci/interop``, the matrix block): ``kvconform matrix`` of the shipped registry, the
reference, the reference image's decode side and aiomoqt's relay, both images run by the container contract
(registry ``image:``), with every role suite; then its page in a browser.

What must hold: every cell between kvconform's own implementations passes, the prefill side's transfer into the
reference image's container too (the contract image passes its tlkv-decode suite); the cache crosses aiomoqt's
relay intact (the exchange passes); aiomoqt's kvcs-relay suite fails the known disagreements and nothing else
(``tests/interop/disagreements.py``, docs/interop-aiomoqt.md; one of them may be inconclusive in a run, never
passed), so its cells fail and name aiomoqt's relay,
nobody else; moq-rs's relay (a host process of .venv-moqrs) refuses the binary fields of KVCS namespaces, so its
cell's exchange fails on 'invalid string' and its kvcs-relay suite on MOQT-CTRL-NAMESPACE-BYTES only, blaming
moq-rs's relay (docs/interop-moqrs.md #1); every container carried the run's and its cell's labels and none is
left. Without docker the image cells are inconclusive and this test fails: CI has docker.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from kvconform.matrix.participants import CELL_LABEL, RUN_LABEL
from kvconform.targets.docker import ROLE_LABEL
from tests.browser import browser_page, require_browser
from tests.interop.disagreements import KVCS_RELAY_FAILS_ON_MOQRS, KVCS_RELAY_SUITE_FAILS_ON_AIOMOQT

from .helpers import SHIPPED, blamed, cells, containers_of_run, run_matrix, validate

pytestmark = pytest.mark.interop
AIOMOQT_CELL = "kvcs--kvconform--aiomoqt--kvconform"
MOQRS_CELL = "kvcs--kvconform--moqrs--kvconform"
IMAGE_CELL = "tlkv-transfer--kvconform--kvconform-image"


def container_labels(out: Path, cell: dict[str, Any]) -> list[dict[str, str]]:
    """The labels of every container the cell's exchange started (its transcript's docker-run events)."""
    transcript = json.loads((out / cell["dir"] / "transcript.json").read_text("utf-8"))
    return [e["fields"]["labels"] for e in transcript["events"] if e["kind"] == "docker-run"]


@pytest.mark.timeout(1500)
def test_shipped_registry_matrix(request: pytest.FixtureRequest, tmp_path: Path) -> None:
    base = request.config.getoption("kvconform_report_dir", None)
    out = (Path(base) / "matrix").resolve() if base else tmp_path / "matrix"
    code, doc, output = run_matrix(SHIPPED, out, "-n", "2", timeout=1400)
    validate(doc)
    by_id = cells(doc)
    ours = [c for c in by_id.values() if set(c["participants"].values()) == {"kvconform"}]
    assert len(ours) == 4, sorted(by_id)
    for cell in ours:
        assert cell["outcome"] == "pass", (cell["id"], cell["exchange"], cell["suites"], cell["blame"])
    through = by_id[AIOMOQT_CELL]
    assert through["exchange"]["outcome"] == "pass", through["exchange"]["message"]
    suite = next(s for s in doc["suites"] if s["implementation"] == "aiomoqt")
    failing = {f["check"].split("[", 1)[0] for f in suite["failed"]}
    known = set(KVCS_RELAY_SUITE_FAILS_ON_AIOMOQT)
    assert failing <= known, f"aiomoqt's kvcs-relay suite failed {sorted(failing - known)}, not known disagreements"
    # A known disagreement may be unjudgeable in one run (a check that places stream ends by packet order is
    # inconclusive when a packet of the relay's was lost on the busy loopback), never passed.
    verdicts = {t["nodeid"].split("::")[-1].split("[", 1)[0]: t["verdict"]
                for t in json.loads((out / suite["coverage"]).read_text("utf-8"))["tests"]}
    unjudged = {name: verdicts.get(name) for name in known - failing}
    assert all(v == "inconclusive" for v in unjudged.values()), f"known disagreements not failed: {unjudged}"
    assert len(failing) >= len(known) - 1, f"aiomoqt's kvcs-relay suite failed {sorted(failing)} of {sorted(known)}"
    assert through["outcome"] == "fail" and blamed(through) == {("aiomoqt", "kvcs-relay")}, through["blame"]
    moqrs = by_id[MOQRS_CELL]
    assert moqrs["exchange"]["outcome"] == "fail" and "'invalid string'" in moqrs["exchange"]["message"], moqrs
    moqrs_suite = next(s for s in doc["suites"] if s["implementation"] == "moqrs")
    assert {f["requirement"] for f in moqrs_suite["failed"]} == {KVCS_RELAY_FAILS_ON_MOQRS}, moqrs_suite
    assert moqrs["outcome"] == "fail" and blamed(moqrs) == {("moqrs", "kvcs-relay")}, moqrs["blame"]
    image = by_id[IMAGE_CELL]
    assert image["outcome"] == "pass", (image["exchange"], image["suites"], image["blame"])
    assert image["suites"]["tlkv-decode"]["outcome"] == "pass", image["suites"]
    assert set(by_id) == {*(c["id"] for c in ours), AIOMOQT_CELL, MOQRS_CELL, IMAGE_CELL}, sorted(by_id)
    run_id = doc["meta"]["run_id"]
    for cell, role in ((through, "kvcs-relay"), (image, "tlkv-decode")):
        labels = container_labels(out, cell)
        assert labels and all(lab == {RUN_LABEL: run_id, CELL_LABEL: cell["id"], ROLE_LABEL: role} for lab in labels), (
            cell["id"], labels)
    assert code == 1, output[-2000:]
    assert doc["meta"]["containers_left"] == [], "every cell and suite removed its own containers"
    assert containers_of_run(doc["meta"]["run_id"]) == []

    require_browser()
    with browser_page() as page:
        page.goto((out / "matrix.html").as_uri())
        table = page.locator("section.table", has=page.locator("h2", has_text="relay aiomoqt"))
        assert table.locator("th.row").all_inner_texts() == ["kvconform"]
        assert table.locator("th.col").all_inner_texts() == ["kvconform"]
        transfer = page.locator("section.table#tlkv-transfer")
        assert transfer.locator("th.col").all_inner_texts() == ["kvconform", "kvconform-image"]
        td = page.locator(f'td[data-cell="{AIOMOQT_CELL}"]')
        assert td.evaluate("e => getComputedStyle(e).backgroundColor") == "rgb(243, 166, 166)"
        assert "exchange ✓" in td.inner_text() and "relay ✗" in td.inner_text()
        td.locator("a.verdict").click()
        page.wait_for_load_state()
        assert page.url.endswith(f"/cells/{AIOMOQT_CELL}/index.html")
        assert "its kvcs-relay suite fails" in page.locator("ul.blamed").inner_text()
        assert any("moq-interop-relay" in text or "MOQT" in text for text in page.locator("pre.log").all_inner_texts())
        page.locator("a", has_text="report").first.click()
        page.wait_for_load_state()
        assert page.url.endswith("/coverage.html")
