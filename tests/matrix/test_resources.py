"""What a cell needs of a Dask worker (``kvconform.matrix.resources``): derived from the run forms, plus a
registry's ``resources:``; what no worker offers; ``kvconform worker --resources``' syntax."""

from __future__ import annotations

from pathlib import Path

import pytest

from kvconform.matrix.registry import RegistryError, RoleEntry, RunForm, load_registry
from kvconform.matrix.resources import form_resources, missing, parse_resources, role_resources, unite
from kvconform.matrix.worker import worker_argv

from .helpers import write_registry


@pytest.mark.parametrize(("form", "need"), [
    (RunForm("reference", "reference"), {}),
    (RunForm("cmd", "my-relay --port {port}"), {}),
    (RunForm("cmd", "my-relay --port {port}", docker={"image": "vendor/relay:1"}), {"docker": 1.0}),
    (RunForm("image", "vendor/relay:1", contract={}), {"docker": 1.0}),
    (RunForm("url", "kbtp+verbs://10.0.4.17:18515?device=rxe0"), {"rdma-vm": 1.0}),
    (RunForm("url", "kbtp+verbs://10.0.4.17:18515?device=siw0&local=10.0.4.1"), {"rdma-vm": 1.0}),
    (RunForm("url", "kbtp+verbs://10.0.4.17:18515?device=mlx5_0"), {"nic.mlx5": 1.0}),
    (RunForm("url", "kbtp+iwarp://127.0.0.1:7471"), {}),
])
def test_what_a_run_form_needs(form: RunForm, need: dict[str, float]) -> None:
    assert form_resources(form) == need


def test_a_role_adds_what_its_registry_entry_names_and_a_cell_holds_each_once() -> None:
    form = RunForm("image", "vendor/decode:1", contract={})
    entry = RoleEntry("v", "tlkv", "decode", (1,), form, RunForm("reference", "reference"), {},
                      resources={"nic.mlx5_pair": 1.0})
    assert role_resources(entry) == {"docker": 1.0, "nic.mlx5_pair": 1.0}
    assert role_resources(entry, suite=True) == {"nic.mlx5_pair": 1.0}  # its suite runs in-process
    assert unite([{"docker": 1.0}, {"docker": 1.0, "rdma-vm": 1.0}]) == {"docker": 1.0, "rdma-vm": 1.0}


def test_missing_names_what_no_single_worker_offers() -> None:
    workers = {"w1": {"docker": 1.0}, "w2": {"nic.mlx5_pair": 1.0}}
    assert missing({}, {}) == []
    assert missing({"docker": 1.0}, workers) == []
    assert missing({"nic.cx7_pair": 1.0, "docker": 1.0}, workers) == ["nic.cx7_pair=1"]
    assert missing({"docker": 2.0}, workers) == ["docker=2"]
    # each offered somewhere, never together: both named
    assert missing({"docker": 1.0, "nic.mlx5_pair": 1.0}, workers) == ["docker=1", "nic.mlx5_pair=1"]


def test_worker_resources_syntax() -> None:
    assert parse_resources("docker=2,nic.mlx5_pair=1") == {"docker": 2.0, "nic.mlx5_pair": 1.0}
    assert parse_resources("docker=1 rdma-vm=1") == {"docker": 1.0, "rdma-vm": 1.0}
    assert parse_resources("") == {}
    for bad in ("docker", "docker=0", "=1", "docker=x"):
        with pytest.raises(ValueError, match="NAME=AMOUNT"):
            parse_resources(bad)
    argv = worker_argv("tcp://10.0.0.1:8786", {"docker": 2.0}, "lab-a", 4)
    assert argv[1:] == ["-m", "distributed.cli.dask_worker", "tcp://10.0.0.1:8786", "--preload",
                        "kvconform.matrix.worker", "--resources", "docker=2", "--name", "lab-a", "--nthreads", "4"]


def test_the_registry_carries_a_roles_resources_and_refuses_a_bad_one(tmp_path: Path) -> None:
    decode = {"versions": [1], "reference": True, "resources": {"nic.mlx5_pair": 1}}
    doc = {"name": "r", "implementations": {"v": {"roles": {"tlkv": {"decode": decode}}}}}
    registry = load_registry(write_registry(tmp_path, doc))
    entry = registry.implementations["v"].roles["tlkv-decode"]
    assert entry.resources == {"nic.mlx5_pair": 1.0} and entry.as_dict()["resources"] == {"nic.mlx5_pair": 1.0}
    decode["resources"] = {"nic.mlx5_pair": 0}
    with pytest.raises(RegistryError, match=r"resources"):
        load_registry(write_registry(tmp_path, doc))
