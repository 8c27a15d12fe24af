"""The docker driver against the real daemon: readiness failures, bounds, cleanup of killed runs."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
from typing import Any

import pytest

from kvconform.targets import docker as dk
from kvconform.verdicts import DriverError, TargetUnavailable

pytestmark = pytest.mark.interop

IMAGE = "kvconform/aiomoqt:0.13.3"


def test_container_that_exits_is_not_ready_and_is_removed(docker_images: list[str]) -> None:
    spec = dk.ContainerSpec(IMAGE, ["sh", "-c", "echo starting; exit 3"],
                            ready=dk.Readiness(log_pattern="never printed", timeout_s=10))
    container = dk.DockerContainer(spec)
    with pytest.raises(TargetUnavailable, match="never printed") as info:
        container.start()
    assert "starting" in str(info.value)  # the container's output is in the message
    client = dk.docker_client()
    try:
        leftovers = client.containers.list(all=True, filters={"label": f"{dk.OWNER_LABEL}={os.getpid()}"})
        assert leftovers == [], f"containers not removed: {[c.name for c in leftovers]}"
    finally:
        client.close()


def test_one_shot_container_is_bounded(docker_images: list[str]) -> None:
    with pytest.raises(DriverError, match="still running after 2"):
        dk.run_to_completion(dk.ContainerSpec(IMAGE, ["sleep", "60"]), timeout_s=2)
    result = dk.run_to_completion(dk.ContainerSpec(IMAGE, ["sh", "-c", "echo out; echo err >&2; exit 4"]),
                                  timeout_s=30)
    assert (result.exit_code, result.stdout.strip(), result.stderr.strip()) == (4, "out", "err")


def _ours() -> list[str]:
    client = dk.docker_client()
    try:
        return [str(c.name) for c in client.containers.list(all=True,
                                                             filters={"label": f"{dk.OWNER_LABEL}={os.getpid()}"})]
    finally:
        client.close()


def _interrupted_after_create(monkeypatch: pytest.MonkeyPatch) -> None:
    """Ctrl-C lands after the daemon created (and started) the container, before the client saw its answer."""
    from docker.models.containers import ContainerCollection  # the SDK is optional: imported where docker is in use

    real = ContainerCollection.run

    def run(self: ContainerCollection, *args: Any, **kwargs: Any) -> Any:
        real(self, *args, **kwargs)
        raise KeyboardInterrupt

    monkeypatch.setattr(ContainerCollection, "run", run)


def test_a_ctrl_c_between_create_and_its_answer_leaves_no_container(docker_images: list[str],
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    _interrupted_after_create(monkeypatch)
    with pytest.raises(KeyboardInterrupt):
        dk.DockerContainer(dk.ContainerSpec(IMAGE, ["sleep", "60"], stop_timeout_s=1)).start()
    assert _ours() == [], "the server container outlived the interrupt"
    with pytest.raises(KeyboardInterrupt):
        dk.run_to_completion(dk.ContainerSpec(IMAGE, ["sleep", "60"]), timeout_s=30)
    assert _ours() == [], "the one-shot container outlived the interrupt"


def test_containers_of_killed_runs_are_reaped(docker_images: list[str]) -> None:
    from docker.errors import NotFound  # the SDK is optional: imported only where docker is in use

    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True,
                          text=True, timeout=30, check=True)
    dead_pid = dead.stdout.strip()
    client = dk.docker_client()
    try:
        # Each container gets a name of its own from _run_kwargs (a failed start can still be found by it).
        kwargs = dk._run_kwargs(dk.ContainerSpec(IMAGE, ["sleep", "60"]))
        orphan = client.containers.run(IMAGE, **{**kwargs, "labels": {dk.HARNESS_LABEL: "1",
                                                                      dk.OWNER_LABEL: dead_pid}})
        ours = client.containers.run(IMAGE, **dk._run_kwargs(dk.ContainerSpec(IMAGE, ["sleep", "60"])))
        try:
            removed = dk.reap_orphans(client)
            assert orphan.name in removed and ours.name not in removed
            names = {c.name for c in client.containers.list(all=True)}
            assert orphan.name not in names and ours.name in names
        finally:
            for c in (orphan, ours):
                with contextlib.suppress(NotFound):  # the orphan is already gone when the reaper worked
                    c.remove(force=True)
    finally:
        client.close()
