"""``kvconform matrix --scheduler``: the matrix on a real Dask cluster on 127.0.0.1 (a ``dask scheduler``, a
``kvconform worker`` and a plain ``dask worker --preload kvconform.matrix.worker``, with different resources,
tests/matrix/dask_cluster.py).

- The shipped registry's matrix through the cluster gives every cell the verdict the local executor gives it.
  In README's run the subset that needs no docker, to keep CI's cost at seconds; the interop lane (``-m interop``,
  dockerd and the images) compares the whole registry, its docker cells placed on the worker offering docker.
  ``--no-suites`` on both runs, so what is compared is every cell's exchange (the role suites run in .ci/interop's
  shipped-matrix test).
- A cell needing a resource no worker offers is inconclusive at once, naming it; one needing a resource only one
  worker offers runs there.
- A worker killed while it runs a cell makes that cell inconclusive, naming the worker; the rest completes.
- Role suites run on the workers too; their reports come back and ``--results-db`` records them.

About 40-55 s in all on a loaded 2-core machine (one cluster per xdist worker that runs a test of this module).

Without the ``dask`` extra these skip (``.ci/run`` installs it, so CI runs them).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import suppress
from pathlib import Path
from typing import Any

import pytest

from kvconform.store import open_store
from tests.spawn import ROOT, covering, spawn_env

from .dask_cluster import Cluster, dask_cluster
from .helpers import cells, containers_of_run, run_matrix, shipped, validate, write_registry

pytest.importorskip("distributed", reason="the dask extra (pip install -e '.[dask]'; .ci/run installs it)")

RUN_BOUND = 120.0  # one `kvconform matrix` of a few cells here
DOCKER_RUN_BOUND = 400.0  # the same with containers (images prepared by .ci/interop)
DECODE_PICS = {"tlkv": {"decode": {"versions": [1, 2], "geometry": {
    "block_tokens": 16, "n_layers": 3, "n_kv_heads": 2, "head_dim": 8}}}}
WORKERS = {"w1": "docker=1", "w2": "nic.mlx5_pair=1"}
PLAIN = {"w2"}  # started as `dask worker ... --preload kvconform.matrix.worker`, w1 as `kvconform worker`


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    with dask_cluster(tmp_path_factory.mktemp("dask"), WORKERS, PLAIN) as running:
        yield running


def outcomes(doc: dict[str, Any]) -> dict[str, tuple[str, str]]:
    return {cid: (c["outcome"], c["exchange"]["outcome"]) for cid, c in cells(doc).items()}


@covering(RUN_BOUND, RUN_BOUND)
def test_shipped_registry_on_two_workers_matches_the_local_run(cluster: Cluster, tmp_path: Path) -> None:
    registry = write_registry(tmp_path, shipped("aiomoqt", "kvconform-image", "moqrs"))  # the docker-free subset
    local_code, local, _ = run_matrix(registry, tmp_path / "local", "--no-suites", "-n", "2", "--seed", "7",
                                      timeout=RUN_BOUND)
    code, doc, output = run_matrix(registry, tmp_path / "dask", "--no-suites", "--seed", "7", "--scheduler",
                                   cluster.address, timeout=RUN_BOUND)
    validate(doc)
    assert local["meta"]["executor"] == {"kind": "local"}
    assert doc["meta"]["executor"] == {"kind": "dask", "scheduler": cluster.address,
                                       "workers": {"w1": {"docker": 1.0}, "w2": {"nic.mlx5_pair": 1.0}}}
    assert len(local["cells"]) == 4, sorted(cells(local))
    for name, resources in WORKERS.items():  # each worker's preload ran, whichever way it was started
        assert f"kvconform worker {name}: offers {resources}" in cluster.workers[name].log.read_text("utf-8")
    assert outcomes(doc) == outcomes(local), output[-3000:]
    assert code == local_code == 0, output[-3000:]
    for cell in doc["cells"]:
        assert cell["exchange"]["worker"] in WORKERS, cell["exchange"]
        folder = tmp_path / "dask" / cell["dir"]  # the evidence came back to the coordinator's folder
        assert {"index.html", "result.json", "transcript.json", "worker.log"} <= {p.name for p in folder.iterdir()}
        for suite, name in cell["participants"].items():
            assert (folder / f"{suite}.{name}.log").is_file()


@pytest.mark.interop
@covering(DOCKER_RUN_BOUND, DOCKER_RUN_BOUND)
def test_the_whole_shipped_registry_with_its_docker_cells_matches_the_local_run(
        cluster: Cluster, tmp_path: Path) -> None:
    """The interop lane's half of the comparison above (it has dockerd and the images): the whole shipped
    registry, aiomoqt's relay and the reference image included. Their cells need ``docker=1``, which only w1
    offers, so they run there; every cell's verdict is the local executor's."""
    registry = write_registry(tmp_path, shipped())
    local_code, local, _ = run_matrix(registry, tmp_path / "local", "--no-suites", "-n", "2", "--seed", "7",
                                      timeout=DOCKER_RUN_BOUND)
    code, doc, output = run_matrix(registry, tmp_path / "dask", "--no-suites", "--seed", "7", "--scheduler",
                                   cluster.address, timeout=DOCKER_RUN_BOUND)
    validate(doc)
    in_docker = [c for c in doc["cells"] if c["exchange"].get("resources", {}).get("docker")]
    assert len(in_docker) == 2, [(c["id"], c["exchange"].get("resources")) for c in doc["cells"]]
    assert all(c["exchange"]["worker"] == "w1" for c in in_docker), [c["exchange"] for c in in_docker]
    assert all(c["outcome"] != "inconclusive" for c in doc["cells"]), [(c["id"], c["reason"]) for c in doc["cells"]]
    assert outcomes(doc) == outcomes(local), output[-3000:]
    assert code == local_code, output[-3000:]
    assert doc["meta"]["containers_left"] == [] and containers_of_run(doc["meta"]["run_id"]) == []


@covering(RUN_BOUND)
def test_a_cell_is_placed_by_its_resources_and_a_missing_one_is_named(cluster: Cluster, tmp_path: Path) -> None:
    decode = {"versions": [1, 2], "reference": True, "pics": DECODE_PICS}
    registry = write_registry(tmp_path, {"name": "resources", "implementations": {
        "kvconform": {"reference": True, "roles": {"tlkv": {"prefill": {"versions": [1, 2], "reference": True},
                                                            "decode": decode}}},
        "on-mlx5": {"roles": {"tlkv": {"decode": {**decode, "resources": {"nic.mlx5_pair": 1}}}}},
        "on-cx7": {"roles": {"tlkv": {"decode": {**decode, "resources": {"nic.cx7_pair": 1}}}}},
    }})
    code, doc, output = run_matrix(registry, tmp_path / "out", "--no-suites", "--roles", "tlkv-prefill,tlkv-decode",
                                   "--scheduler", cluster.address, timeout=RUN_BOUND)
    validate(doc)
    by_id = cells(doc)
    placed = by_id["tlkv-transfer--kvconform--on-mlx5"]
    assert placed["outcome"] == "pass", placed["reason"]
    assert placed["exchange"]["worker"] == "w2" and placed["exchange"]["resources"] == {"nic.mlx5_pair": 1.0}
    stranded = by_id["tlkv-transfer--kvconform--on-cx7"]
    assert stranded["outcome"] == "inconclusive" and stranded["blame"] == []
    assert stranded["exchange"]["missing_resources"] == ["nic.cx7_pair=1"]
    assert stranded["exchange"]["worker"] is None
    assert "no worker of the scheduler" in stranded["reason"] and "offers nic.cx7_pair=1" in stranded["reason"]
    assert by_id["tlkv-transfer--kvconform--kvconform"]["outcome"] == "pass"
    assert code == 1, output[-3000:]


@covering(RUN_BOUND)
def test_a_worker_killed_mid_cell_makes_that_cell_inconclusive_and_the_rest_completes(
        cluster: Cluster, tmp_path: Path) -> None:
    """w3 alone offers ``hang``, which only the sleeping prefill side's cell needs; it is killed (its whole
    session, SIGKILL) once that prefill side has started. The cell's own process runs in a session of its own,
    as every process the matrix starts, so it outlives w3: the test then ends the sleep (its pid in the mark),
    and that process ends at once, into w3's TMPDIR."""
    mark = tmp_path / "started"
    w3 = cluster.add_worker("w3", "hang=1", nthreads=1)
    registry = write_registry(tmp_path, {"name": "lost", "implementations": {
        "kvconform": {"reference": True, "roles": {"tlkv": {
            "prefill": {"versions": [1, 2], "reference": True},
            "decode": {"versions": [1, 2], "reference": True, "pics": DECODE_PICS}}}},
        "sleeper": {"roles": {"tlkv": {"prefill": {
            "versions": [1], "resources": {"hang": 1},
            "cmd": f"sh -c 'echo $$ > {mark}.tmp && mv {mark}.tmp {mark}; exec sleep 15' {{decode_addr}} "
                   "{sequence}"}}}},
    }})
    out = tmp_path / "out"
    matrix = subprocess.Popen(
        [sys.executable, "-m", "kvconform", "matrix", "--registry", str(registry), "--out", str(out), "--no-suites",
         "--roles", "tlkv-prefill,tlkv-decode", "--scheduler", cluster.address],
        cwd=ROOT, env=spawn_env(), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        start_new_session=True)
    try:
        deadline = time.monotonic() + 60
        while not mark.exists():
            assert matrix.poll() is None, matrix.communicate()[0].decode()[-3000:]
            assert time.monotonic() < deadline, "the sleeper's cell never started on w3"
            time.sleep(0.1)  # polling interval of a bounded wait
        w3.kill()
        with suppress(ProcessLookupError):  # the sleeping prefill side, orphaned with its cell's process
            os.kill(int(mark.read_text().strip()), signal.SIGKILL)
        output = matrix.communicate(timeout=RUN_BOUND)[0].decode("utf-8", "replace")
    finally:
        if matrix.poll() is None:
            os.killpg(matrix.pid, signal.SIGKILL)
            matrix.wait(timeout=15)
    doc = json.loads((out / "matrix.json").read_text("utf-8"))
    validate(doc)
    by_id = cells(doc)
    lost = by_id["tlkv-transfer--sleeper--kvconform"]
    assert lost["outcome"] == "inconclusive" and lost["blame"] == [], lost
    assert "w3" in lost["reason"] and "was lost while it ran" in lost["reason"], lost["reason"]
    assert lost["exchange"]["worker"] == "w3"
    # w3 runs one cell at a time: a cell it ran before the sleeper's had come back already
    others = [c for cid, c in by_id.items() if cid != lost["id"]]
    assert others and all(c["outcome"] == "pass" and c["exchange"]["worker"] for c in others), others
    assert matrix.returncode == 1, output[-3000:]


@covering(RUN_BOUND)
def test_role_suites_run_on_the_workers_and_their_reports_reach_the_store(cluster: Cluster, tmp_path: Path) -> None:
    """The envelope table (writer x reader, about 8 s per role suite): the suites' report folders come back to
    ``--out`` and ``--results-db`` records them as for a local run."""
    registry = write_registry(tmp_path, shipped("aiomoqt", "kvconform-image", "moqrs"))
    db = tmp_path / "results.sqlite"
    code, doc, output = run_matrix(registry, tmp_path / "out", "--roles", "tlkv-writer,tlkv-reader", "--scheduler",
                                   cluster.address, "--results-db", f"sqlite:///{db}", timeout=RUN_BOUND)
    validate(doc)
    assert code == 0, output[-3000:]
    assert {(s["suite"], s["outcome"]) for s in doc["suites"]} == {("tlkv-writer", "pass"), ("tlkv-reader", "pass")}
    for suite in doc["suites"]:
        assert (tmp_path / "out" / suite["report"]).is_file() and (tmp_path / "out" / suite["coverage"]).is_file()
    (cell,) = doc["cells"]
    assert cell["outcome"] == "pass" and set(cell["suites"]) == {"tlkv-writer", "tlkv-reader"}, cell["reason"]
    assert "recorded as run" in output and "its role suites as runs" in output, output[-3000:]
    with open_store(f"sqlite:///{db}") as store:  # the coordinator's store holds what the workers ran
        runs = [store.run(i) for i in store.run_ids()]
    matrix_runs = [r for r in runs if r is not None and r.target_kind == "matrix"]
    suite_runs = {r.suites: r for r in runs if r is not None and r.target_kind != "matrix"}
    assert [{c.nodeid: c.verdict for c in r.checks} for r in matrix_runs] == [{f"cell:{cell['id']}": "pass"}]
    assert set(suite_runs) == {("tlkv-writer",), ("tlkv-reader",)}
    for suite in doc["suites"]:
        stored = suite_runs[(suite["suite"],)]
        assert stored.matrix_dir and Path(stored.matrix_dir).resolve() == (tmp_path / "out").resolve()
        report_dir = (tmp_path / "out" / suite["coverage"]).parent.resolve()
        assert Path(stored.report_dir) == report_dir and stored.checks
        assert all((report_dir / c.evidence).is_file() for c in stored.checks if c.evidence)
