"""Fixtures of the rdma lane (issue 13): the testbed VM's image, and the VM booted for a module's runs.

The lane runs only when selected with ``-m rdma_vm`` (``.ci/rdma``, ``tox -e rdma``); otherwise its tests are
deselected, so the README's plain ``pytest`` never boots a VM. Selected on a machine without qemu or without a
built image, every test is skipped with the one line that says why (`kvconform.testbeds.rdma_vm.vm.skip_reason`).
"""

from __future__ import annotations

import signal
from pathlib import Path
from typing import Any

import pytest

from kvconform.testbeds.rdma_vm.build import Artefacts, find_cached
from kvconform.testbeds.rdma_vm.vm import skip_reason
from tests.lanes import deselect_lane

from .lane import facing_runs, in_vm_runs


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    deselect_lane(config, items, Path(__file__).parent, marker="rdma_vm")


def _interrupted(signum: int, frame: object) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


@pytest.fixture(scope="session", autouse=True)
def _stopped_on_sigterm() -> None:
    """CI stops a lane that runs beside others with SIGTERM when a step fails: as KeyboardInterrupt it unwinds
    through the VM's context, which stops qemu (its own session, out of reach of the lane's process group)."""
    signal.signal(signal.SIGTERM, _interrupted)


@pytest.fixture(scope="session")
def vm_image() -> Artefacts:
    """The newest complete VM image in the cache (.ci/rdma builds it first); skips with the reason."""
    why = skip_reason()
    if why:
        pytest.skip(why)
    art = find_cached()
    assert art is not None
    return art


@pytest.fixture(scope="session")
def in_vm(vm_image: Artefacts, tmp_path_factory: pytest.TempPathFactory) -> dict[tuple[str, str], Any]:
    """The in-VM runs (tests/rdma_vm/lane.py in_vm_runs), made once: the primary path of each certification."""
    return in_vm_runs(vm_image, tmp_path_factory.mktemp("in-vm"))


@pytest.fixture(scope="session")
def facing(vm_image: Artefacts, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The host's userspace wires facing rxe1 and siw1 (tests/rdma_vm/lane.py facing_runs), made once."""
    return facing_runs(vm_image, tmp_path_factory.mktemp("facing"))
