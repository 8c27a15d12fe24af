"""``kvconform matrix`` end to end: the reference against itself, broken and unstartable implementations, the
role suites' part in a cell, the result's schema, and the page as a person sees it in a browser.

The reference-only matrix runs the shipped registry's kvconform entry as processes (cmd: templates, the way
a vendor's implementation is run); the others run the reference in-process (``reference: true``) next to
deliberately broken implementations built from ``tests/mutants/``, so that they stay quick.
"""

from __future__ import annotations

import itertools
import socket
from pathlib import Path
from typing import Any

import pytest

from tests.browser import browser_page, require_browser
from tests.spawn import covering

from .helpers import MATRIX_BOUND, blamed, cells, run_matrix, shipped, validate, write_registry

REF = {"reference": True}
KVCS_REF = {"publisher": {"versions": [22], **REF}, "relay": {"versions": [22], **REF},
            "consumer": {"versions": [22], **REF}}


@pytest.fixture(scope="module")
def reference_matrix(tmp_path_factory: pytest.TempPathFactory) -> tuple[int, dict[str, Any], Path]:
    folder = tmp_path_factory.mktemp("reference-matrix")
    registry = write_registry(folder, shipped("aiomoqt", "kvconform-image", "moqrs"))  # no docker, no .venv-moqrs
    code, doc, _ = run_matrix(registry, folder / "out", "--no-suites", "-n", "2", "--seed", "7")
    return code, doc, folder / "out"


@covering(MATRIX_BOUND)  # its run, or the shared run it reads
def test_reference_only_matrix_passes_every_cell(reference_matrix: tuple[int, dict[str, Any], Path]) -> None:
    code, doc, out = reference_matrix
    validate(doc)
    assert code == 0
    by_id = cells(doc)
    assert set(by_id) == {"kvcs--kvconform--kvconform--kvconform", "tlkv-transfer--kvconform--kvconform",
                          "tlkv-envelope--kvconform--kvconform", "kbtp--kvconform--kvconform"}
    for cell in by_id.values():
        assert cell["outcome"] == "pass", cell["exchange"]["message"]
        assert cell["exchange"]["message"] == "the exchange completed and was verified"
        folder = out / cell["dir"]
        assert (folder / "index.html").is_file() and (folder / "result.json").is_file()
        for suite, name in cell["participants"].items():
            assert (folder / f"{suite}.{name}.log").is_file()
    kvcs = by_id["kvcs--kvconform--kvconform--kvconform"]
    # The cell's own relay on a port picked for it, its own scope, every layer compared with the spec.
    assert kvcs["identifiers"]["relay"].startswith("moqt://127.0.0.1:")
    assert kvcs["identifiers"]["relay"] != "moqt://127.0.0.1:4443"
    assert len(kvcs["identifiers"]["scope_id"]) == 32
    log = (out / kvcs["dir"] / "kvcs-relay.kvconform.log").read_text("utf-8")
    assert "listening on 127.0.0.1:" in log, "the relay's own output is in its log"
    import json

    result = json.loads((out / kvcs["dir"] / "result.json").read_text("utf-8"))
    assert [layer["ok"] for layer in result["exchanged"]["layers"]] == [True] * 10
    assert result["exchanged"]["segments"]["got"] == [[0, 4]]
    transfer = json.loads((out / "cells/tlkv-transfer--kvconform--kvconform/result.json").read_text("utf-8"))
    assert transfer["exchanged"]["has_blocks"]["held"] == [True, True, True, False, False]
    assert transfer["identifiers"]["request_id"].startswith("kvconform-matrix-tlkv-transfer--")
    kbtp = json.loads((out / "cells/kbtp--kvconform--kvconform/result.json").read_text("utf-8"))
    assert [op["op"] for op in kbtp["exchanged"]["operations"]] == [
        "HELLO", "ALLOC_STORE", "ALLOC_STORE", "LOAD", "LOAD", "FREE", "FREE", "GOODBYE"]


@pytest.fixture(scope="module")
def broken_matrix(tmp_path_factory: pytest.TempPathFactory) -> tuple[int, dict[str, Any], Path, str]:
    """The reference (in-process) with a relay that corrupts payloads, a decode side that says it holds hash 0,
    a prefill side that sends wrong CRCs, and an implementation whose commands do not exist."""
    folder = tmp_path_factory.mktemp("broken-matrix")
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:  # a port of 127.0.0.1 nobody listens on
        s.bind(("127.0.0.1", 0))
        closed = s.getsockname()[1]
    doc = {"name": "broken", "implementations": {
        "kvconform": {"reference": True, "roles": {"kvcs": KVCS_REF, "tlkv": {
            "prefill": {"versions": [1, 2], **REF},
            "decode": {"versions": [1, 2], **REF,
                       "pics": {"tlkv": {"decode": {"versions": [1, 2], "geometry": {
                           "block_tokens": 16, "n_layers": 3, "n_kv_heads": 2, "head_dim": 8}}}}}}}},
        "corrupter": {"roles": {"kvcs": {"relay": {"versions": [22],
                                                   "python": "tests.matrix.broken:CorruptingRelay"}}}},
        "tailheld": {"roles": {"tlkv": {"decode": {"versions": [1], "python": "tests.mutants.tlkv:RegistersTailDecode",
                                                   "pics": {"tlkv": {"decode": {"versions": [1], "geometry": {
                                                       "block_tokens": 16, "n_layers": 3, "n_kv_heads": 2,
                                                       "head_dim": 8}}}}}}}},
        # A running relay's URL where nothing answers: the connection is refused, nothing is exchanged.
        "closed": {"roles": {"kvcs": {"relay": {"versions": [22], "url": f"moqt://127.0.0.1:{closed}"}}}},
        "badcrc": {"roles": {"tlkv": {"prefill": {"versions": [1], "python": "tests.mutants.tlkv:WrongCrcPrefill"}}}},
        # A command that runs but cannot start the implementation: the shell's 127 ("command not found").
        "shell127": {"roles": {"tlkv": {"prefill": {"versions": [1],
                                                    "cmd": "sh -c 'exit 127' {decode_addr} {sequence}"}}}},
        "ghost": {"roles": {
            "kvcs": {"publisher": {"versions": [22], "cmd": "kvconform-no-such-publisher --relay {relay} "
                                                            "--cache {cache} --token {token}"}},
            "tlkv": {"decode": {"versions": [1], "cmd": "kvconform-no-such-decode --port {port}"}}}},
    }}
    registry = write_registry(folder, doc)
    code, result, output = run_matrix(registry, folder / "out", "--no-suites", "-n", "2", "--roles",
                                      "kvcs,tlkv-prefill,tlkv-decode")
    return code, result, folder / "out", output


@covering(MATRIX_BOUND)  # its run, or the shared run it reads
def test_broken_implementations_fail_their_cells_and_are_named(
        broken_matrix: tuple[int, dict[str, Any], Path, str]) -> None:
    code, doc, _, output = broken_matrix
    validate(doc)
    assert code == 1
    by_id = cells(doc)
    corrupt = by_id["kvcs--kvconform--corrupter--kvconform"]
    assert corrupt["outcome"] == "fail", corrupt["exchange"]["message"]
    assert "did not arrive intact" in corrupt["exchange"]["message"]
    assert blamed(corrupt) == {("corrupter", "kvcs-relay")}, corrupt["blame"]
    assert by_id["kvcs--kvconform--kvconform--kvconform"]["outcome"] == "pass"
    tail = by_id["tlkv-transfer--kvconform--tailheld"]
    assert tail["outcome"] == "fail" and "hash 0" in tail["exchange"]["message"]
    assert blamed(tail) == {("tailheld", "tlkv-decode")}
    crc = by_id["tlkv-transfer--badcrc--kvconform"]
    assert crc["outcome"] == "fail", crc["exchange"]["message"]
    assert blamed(crc) == {("badcrc", "tlkv-prefill")}, crc["blame"]
    # badcrc x tailheld fails too; isolation against the reference names both, each with its own evidence.
    both = by_id["tlkv-transfer--badcrc--tailheld"]
    assert both["outcome"] == "fail"
    assert blamed(both) == {("badcrc", "tlkv-prefill"), ("tailheld", "tlkv-decode")}
    evidence = {b["implementation"]: b["evidence"] for b in both["blame"]}
    assert evidence == {"badcrc": "cells/tlkv-transfer--badcrc--kvconform/index.html",
                        "tailheld": "cells/tlkv-transfer--kvconform--tailheld/index.html"}
    assert "blames corrupter (kvcs-relay)" in output


@covering(MATRIX_BOUND)  # its run, or the shared run it reads
def test_every_cell_has_its_own_ports_and_identifiers(broken_matrix: tuple[int, dict[str, Any], Path, str]) -> None:
    """Cells ran two at a time: none shares a scope, a token or a request id, and no two running at once share a
    relay or a decode side's address."""
    doc = broken_matrix[1]
    for kind, keys in (("kvcs", ("relay", "scope_id", "anchor_key", "token")),
                       ("tlkv-transfer", ("decode_addr", "request_id"))):
        # ("closed" is a running endpoint's URL: its cells share it by definition)
        ran = [c for c in doc["cells"] if c["kind"] == kind and keys[0] in c["identifiers"]
               and "closed" not in c["participants"].values()]
        assert len(ran) >= 4, [c["id"] for c in doc["cells"] if c["kind"] == kind]
        for key in keys:
            if key in ("relay", "decode_addr"):
                # A port the OS gave one cell may come back to a later one; two cells running at once never share it.
                for a, b in itertools.combinations(ran, 2):
                    if a["identifiers"][key] == b["identifiers"][key]:
                        (a0, a1), (b0, b1) = a["exchange"]["window"], b["exchange"]["window"]
                        assert a1 <= b0 or b1 <= a0, f"{a['id']} and {b['id']} shared the {key} at once"
                continue
            seen = [c["identifiers"][key] for c in ran]
            assert len(set(seen)) == len(seen), f"{kind} cells share a {key}: {seen}"
        if kind == "kvcs":
            assert all(c["identifiers"]["relay"].startswith("moqt://127.0.0.1:") for c in ran)


@covering(MATRIX_BOUND)  # its run, or the shared run it reads
def test_an_implementation_that_cannot_be_started_is_inconclusive_never_pass(
        broken_matrix: tuple[int, dict[str, Any], Path, str]) -> None:
    _, doc, _, _ = broken_matrix
    ghost = [c for c in doc["cells"] if "ghost" in c["participants"].values() and "closed" not in c["id"]]
    assert {c["id"] for c in ghost} == {"kvcs--ghost--kvconform--kvconform", "kvcs--ghost--corrupter--kvconform",
                                        "tlkv-transfer--kvconform--ghost", "tlkv-transfer--badcrc--ghost",
                                        "tlkv-transfer--shell127--ghost"}
    for cell in ghost:
        assert cell["outcome"] == "inconclusive", (cell["id"], cell["exchange"])
        assert cell["exchange"]["unavailable"]["implementation"] == "ghost"
        assert "No such file or directory" in cell["exchange"]["message"]
        assert not blamed(cell), "a participant that never ran is not blamed"
    shell = [c for c in doc["cells"] if "shell127" in c["participants"].values() and "ghost" not in c["id"]]
    assert {c["id"] for c in shell} == {"tlkv-transfer--shell127--kvconform", "tlkv-transfer--shell127--tailheld"}
    for cell in shell:
        assert cell["outcome"] == "inconclusive", (cell["id"], cell["exchange"])
        assert cell["exchange"]["unavailable"] == {"role": "tlkv-prefill", "implementation": "shell127"}
        assert "exited 127 (not startable)" in cell["exchange"]["message"]
    # A relay that refuses the connection: inconclusive, never a failure of the publisher or the consumer.
    refused = [c for c in doc["cells"] if "closed" in c["participants"].values()]
    assert {c["id"] for c in refused} == {"kvcs--kvconform--closed--kvconform", "kvcs--ghost--closed--kvconform"}
    for cell in refused:
        assert cell["outcome"] == "inconclusive", (cell["id"], cell["exchange"])
        assert not blamed(cell), cell["blame"]
    closed = next(c for c in refused if c["id"] == "kvcs--kvconform--closed--kvconform")
    assert closed["exchange"]["unavailable"] == {"role": "kvcs-relay", "implementation": "closed"}, closed["exchange"]


@covering(MATRIX_BOUND)  # its run, or the shared run it reads
def test_a_failing_role_suite_fails_the_cell_and_names_it(tmp_path: Path) -> None:
    """The exchange passes (one store and load) but the target's kbtp-target suite fails: so does its cell."""
    kbtp: dict[str, Any] = shipped()["implementations"]["kvconform"]["roles"]["kbtp"]  # the reference's PICS
    mutant = {k: v for k, v in kbtp["target"].items() if k != "reference"}
    mutant["python"] = "tests.mutants.kbtp:GenerationWrapsToZero"
    doc = {"name": "suites", "implementations": {
        "kvconform": {"reference": True, "roles": {"kbtp": kbtp}},
        "zerogen": {"roles": {"kbtp": {"target": mutant}}},
    }}
    code, result, _ = run_matrix(write_registry(tmp_path, doc), tmp_path / "out", "-n", "2", "--roles", "kbtp")
    validate(result)
    by_id = cells(result)
    ok, bad = by_id["kbtp--kvconform--kvconform"], by_id["kbtp--kvconform--zerogen"]
    assert ok["outcome"] == "pass" and ok["suites"]["kbtp-target"]["outcome"] == "pass"
    assert bad["exchange"]["outcome"] == "pass", "one store and load do not drive the Generation through its wrap"
    assert bad["suites"]["kbtp-target"]["outcome"] == "fail"
    assert bad["outcome"] == "fail"
    assert blamed(bad) == {("zerogen", "kbtp-target")}
    assert "KBTP-GEN-NONZERO" in bad["suites"]["kbtp-target"]["message"]
    suite = next(s for s in result["suites"] if s["implementation"] == "zerogen")
    assert (tmp_path / "out" / suite["report"]).is_file()
    assert code == 1


@covering(MATRIX_BOUND)  # the shared run it reads
def test_the_matrix_page_in_a_browser(broken_matrix: tuple[int, dict[str, Any], Path, str]) -> None:
    """What a person sees: the tables' rows and columns, a failing cell's colour, its link opening its evidence."""
    require_browser()
    out = broken_matrix[2]
    with browser_page() as page:
        page.goto((out / "matrix.html").as_uri())
        assert page.locator("h1").inner_text() == "kvconform plugfest matrix"
        titles = page.locator("section.table h2").all_inner_texts()
        assert "KVCS: publisher -> relay -> consumer, relay corrupter" in titles
        assert "TLKV tl.kv.v1 transfer: prefill side -> decode side" in titles
        table = page.locator("section.table", has=page.locator("h2", has_text="relay corrupter"))
        assert table.locator("th.row").all_inner_texts() == ["kvconform", "ghost"]
        assert table.locator("th.col").all_inner_texts() == ["kvconform"]
        transfer = page.locator("section.table", has=page.locator("h2", has_text="tl.kv.v1 transfer"))
        assert transfer.locator("th.row").all_inner_texts() == ["kvconform", "badcrc", "shell127"]
        assert transfer.locator("th.col").all_inner_texts() == ["kvconform", "tailheld", "ghost"]

        def colour(cell_id: str) -> str:
            return str(page.locator(f'td[data-cell="{cell_id}"]').evaluate("e => getComputedStyle(e).backgroundColor"))

        failing = page.locator('td[data-cell="kvcs--kvconform--corrupter--kvconform"]')
        assert failing.locator("a.verdict").inner_text() == "FAIL"
        assert "blames corrupter (relay)" in failing.inner_text()
        assert colour("kvcs--kvconform--corrupter--kvconform") == "rgb(243, 166, 166)"
        assert colour("kvcs--kvconform--kvconform--kvconform") == "rgb(185, 228, 185)"
        assert colour("kvcs--ghost--kvconform--kvconform") == "rgb(246, 217, 142)"
        assert page.locator('td[data-cell="kvcs--ghost--kvconform--kvconform"]').inner_text().startswith("INCONCLUSIVE")
        failing.locator("a.verdict").click()
        page.wait_for_load_state()
        assert page.url.endswith("/cells/kvcs--kvconform--corrupter--kvconform/index.html")
        assert "kvcs--kvconform--corrupter--kvconform" in page.locator("h1").inner_text()
        assert "FAIL" in page.locator("h1").inner_text()
        assert "corrupter" in page.locator("ul.blamed").inner_text()
        assert "did not arrive intact" in page.locator("#message").inner_text()
        logs = page.locator("pre.log").all_inner_texts()
        assert len(logs) == 3 and any("in-process" in text for text in logs)
        assert '"rejected_count"' in page.locator("#exchanged").inner_text()
        page.locator("a", has_text="matrix").first.click()
        page.wait_for_load_state()
        assert page.url.endswith("/matrix.html")
