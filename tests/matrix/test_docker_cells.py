"""Containers of the matrix's cells are removed even when nothing else would: a cell whose worker is stopped at
its bound while its relay's container ignores SIGTERM. Needs docker and the lane's base image (``-m interop``)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from .helpers import blamed, cells, containers_of_run, run_matrix, validate, write_registry

pytestmark = pytest.mark.interop
BASE_IMAGE = "kvconform/trixie-base:latest"  # built by .ci/interop (debootstrap)
REF = {"reference": True}
CELL = "kvcs--kvconform--stubborn--kvconform"


@pytest.mark.timeout(300)
def test_a_cell_stopped_at_its_bound_leaves_no_container(tmp_path: Path) -> None:
    from kvconform.targets import docker as dk

    problem = dk.docker_problem()
    assert problem is None, f"the interop lane has docker: {problem}"
    # A relay that ignores SIGTERM and never says it is ready: the cell's worker is stopped at --cell-timeout,
    # before its own clean-up; its `docker run` is killed and the container would run on.
    stubborn = {"versions": [22], "cmd": "sh -c 'trap \"\" TERM; while :; do sleep 1; done' {port} {certs}",
                "docker": {"image": BASE_IMAGE}, "ready": {"log": "^never printed$", "timeout_s": 120}}
    doc = {"name": "stubborn", "implementations": {
        "kvconform": {"reference": True, "roles": {"kvcs": {"publisher": {"versions": [22], **REF},
                                                            "consumer": {"versions": [22], **REF}}}},
        "stubborn": {"roles": {"kvcs": {"relay": stubborn}}}}}
    code, result, output = run_matrix(write_registry(tmp_path, doc), tmp_path / "out", "--no-suites",
                                      "--cell-timeout", "20", "-n", "1", timeout=240)
    validate(result)
    cell = cells(result)[CELL]
    assert cell["outcome"] == "inconclusive", cell["exchange"]
    assert "stopped after 20 s" in cell["exchange"]["message"], cell["exchange"]["message"]
    assert not blamed(cell), "a cell nobody could judge blames nobody"
    folder = tmp_path / "out" / cell["dir"]
    assert not (folder / "result.json").is_file(), "the worker was stopped before it wrote its result"
    assert containers_of_run(result["meta"]["run_id"]) == [], "the run's containers are gone"
    assert result["meta"]["containers_left"] == [], "the runner removed the cell's container right after the cell"
    assert "containers the worker left were removed by the runner" in (folder / "index.html").read_text("utf-8")
    assert code == 1, output[-2000:]


DECLINING_CELL = "tlkv-transfer--kvconform--aiomoqt-as-decode"


@pytest.mark.timeout(300)
def test_an_image_that_declares_a_role_unsupported_is_inconclusive_never_pass(tmp_path: Path) -> None:
    """A registry ``image:`` played by the container contract: aiomoqt's image asked for tlkv-decode answers exit 127
    with ``kvconform-unsupported role=tlkv-decode`` (its entrypoint). The cell and the image's suite are inconclusive
    (nothing of tlkv-decode was tested), nobody is blamed, the container carried the run's and cell's labels and
    is gone."""
    from kvconform.matrix.participants import CELL_LABEL, RUN_LABEL
    from kvconform.targets import docker as dk

    problem = dk.docker_problem()
    assert problem is None, f"the interop lane has docker: {problem}"
    pics = {"tlkv": {"decode": {"versions": [1, 2], "geometry": {"block_tokens": 16, "n_layers": 4, "n_kv_heads": 2,
                                                                 "head_dim": 16}}}}
    doc = {"name": "declining", "implementations": {
        "kvconform": {"reference": True, "roles": {"tlkv": {"prefill": {"versions": [1, 2], **REF}}}},
        "aiomoqt-as-decode": {"roles": {"tlkv": {"decode": {
            "versions": [1, 2], "image": "kvconform/aiomoqt:0.13.3", "pics": pics}}}}}}
    code, result, output = run_matrix(write_registry(tmp_path, doc), tmp_path / "out", "-n", "2", timeout=240)
    validate(result)
    cell = cells(result)[DECLINING_CELL]
    assert cell["outcome"] == "inconclusive", (cell["exchange"], cell["suites"])
    exchange = cell["exchange"]
    assert exchange["outcome"] == "inconclusive", exchange
    assert exchange["unavailable"] == {"role": "tlkv-decode", "implementation": "aiomoqt-as-decode"}, exchange
    assert "the image declares it does not play tlkv-decode" in exchange["message"], exchange["message"]
    assert cell["suites"]["tlkv-decode"]["outcome"] == "inconclusive", cell["suites"]
    assert not blamed(cell), cell["blame"]
    transcript = json.loads((tmp_path / "out" / cell["dir"] / "transcript.json").read_text("utf-8"))
    runs = [e["fields"] for e in transcript["events"] if e["kind"] == "docker-run"]
    assert len(runs) == 1 and runs[0]["command"][0] == "tlkv-decode", runs
    assert runs[0]["labels"][RUN_LABEL] == result["meta"]["run_id"] and runs[0]["labels"][CELL_LABEL] == cell["id"]
    assert containers_of_run(result["meta"]["run_id"]) == [] and result["meta"]["containers_left"] == []
    assert code == 1, output[-2000:]
