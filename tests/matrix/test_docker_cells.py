"""Containers of the matrix's cells are removed even when nothing else would: a cell whose worker is stopped at
its bound while its relay's container ignores SIGTERM. Needs docker and the lane's base image (``-m interop``)."""

from __future__ import annotations

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
