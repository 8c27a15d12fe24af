"""A real Dask cluster on 127.0.0.1 for the distributed matrix's tests: ``dask scheduler`` and ``kvconform worker``
processes (or a plain ``dask worker ... --preload kvconform.matrix.worker``, the other way docs/matrix.md gives of
starting a host), started and stopped by the tests, every wait bounded (the scheduler file, then the scheduler's own
list of workers, polled until a deadline; never a sleep standing for "it is up by now").

Each process runs in a session of its own, so stopping it (or killing it, as a lost host) takes everything it
started with it; its output goes to a log file beside the test's folder, printed when it does not come up.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Collection, Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.spawn import ROOT, spawn_env

START_BOUND_S = 60.0  # a scheduler or worker up, on a loaded 2-core machine
STOP_BOUND_S = 15.0
POLL_S = 0.1
DASK = Path(sys.executable).parent / "dask"  # the dask extra's command


@dataclass
class Proc:
    name: str
    popen: subprocess.Popen[bytes]
    log: Path

    def tail(self) -> str:
        return self.log.read_text("utf-8", "replace")[-3000:] if self.log.is_file() else ""

    def kill(self) -> None:
        """SIGKILL to its whole session (a host lost at once), reaped within the bound."""
        with suppress(ProcessLookupError):
            os.killpg(self.popen.pid, signal.SIGKILL)
        self.popen.wait(timeout=STOP_BOUND_S)

    def stop(self) -> None:
        if self.popen.poll() is not None:
            return
        try:
            os.killpg(self.popen.pid, signal.SIGTERM)
            self.popen.wait(timeout=STOP_BOUND_S)
        except subprocess.TimeoutExpired:
            self.kill()
        except ProcessLookupError:
            pass


@dataclass
class Cluster:
    address: str
    folder: Path
    scheduler: Proc
    workers: dict[str, Proc] = field(default_factory=dict)

    def add_worker(self, name: str, resources: str, *, nthreads: int = 2, plain: bool = False) -> Proc:
        """``kvconform worker`` offering ``resources`` (``plain``: ``dask worker`` with kvconform's preload); returns
        once the scheduler lists it (bounded)."""
        log = self.folder / f"worker-{name}.log"
        options = ["--host", "127.0.0.1", "--no-dashboard", "--no-nanny",
                   "--local-directory", str(self.folder / f"scratch-{name}")]
        offered = ["--resources", resources] if resources else []
        if plain:
            argv = [str(DASK), "worker", self.address, "--name", name, "--nthreads", str(nthreads), *offered,
                    "--preload", "kvconform.matrix.worker", *options]
        else:
            argv = [sys.executable, "-m", "kvconform", "worker", self.address, "--name", name, "--nthreads",
                    str(nthreads), *offered, "--", *options]
        proc = _start(name, argv, log, {"TMPDIR": str(self._tmp(name))})
        self.workers[name] = proc
        self.wait_for(lambda info: name in {w.get("name") for w in info["workers"].values()}, f"worker {name}", proc)
        return proc

    def _tmp(self, name: str) -> Path:
        folder = self.folder / f"tmp-{name}"
        folder.mkdir(exist_ok=True)
        return folder

    def identity(self) -> dict[str, Any]:
        """The scheduler's identity (its workers, their names and resources), asked with a bounded timeout."""
        from distributed import Client  # optional: the dask extra (the tests skip without it)

        with Client(self.address, timeout=10, set_as_default=False) as client:  # type: ignore[no-untyped-call]
            info: dict[str, Any] = client.scheduler_info(n_workers=-1)
            return info

    def wait_for(self, ready: Any, what: str, proc: Proc) -> None:
        deadline = time.monotonic() + START_BOUND_S
        while time.monotonic() < deadline:
            if proc.popen.poll() is not None:
                raise AssertionError(f"{what} exited {proc.popen.returncode}:\n{proc.tail()}")
            if ready(self.identity()):
                return
            time.sleep(POLL_S)  # polling interval of a bounded wait, not a synchronisation
        raise AssertionError(f"{what} not listed by the scheduler within {START_BOUND_S:g} s:\n{proc.tail()}")

    def stop(self) -> None:
        for proc in self.workers.values():
            proc.stop()
        self.scheduler.stop()


def _start(name: str, argv: list[str], log: Path, env: dict[str, str] | None = None) -> Proc:
    with log.open("wb") as out:
        popen = subprocess.Popen(argv, cwd=ROOT, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                 env={**spawn_env(), **(env or {})}, start_new_session=True)
    return Proc(name, popen, log)


@contextmanager
def dask_cluster(folder: Path, workers: dict[str, str], plain: Collection[str] = ()) -> Iterator[Cluster]:
    """A ``dask scheduler`` on 127.0.0.1 (a port it picks, read from its scheduler file) and one ``kvconform
    worker`` per ``workers`` entry (name -> resources), a plain ``dask worker`` with the preload for the names in
    ``plain``, all stopped on exit."""
    folder.mkdir(parents=True, exist_ok=True)
    info = folder / "scheduler.json"
    scheduler = _start("scheduler", [str(DASK), "scheduler", "--host", "127.0.0.1", "--port", "0",
                                     "--dashboard-address", "127.0.0.1:0", "--no-show", "--scheduler-file", str(info)],
                       folder / "scheduler.log")
    cluster: Cluster | None = None
    try:
        deadline = time.monotonic() + START_BOUND_S
        address = None
        while address is None:
            if scheduler.popen.poll() is not None or time.monotonic() > deadline:
                raise AssertionError(f"dask scheduler did not write {info} within {START_BOUND_S:g} s:\n"
                                     f"{scheduler.tail()}")
            try:
                address = json.loads(info.read_text("utf-8"))["address"]
            except (OSError, ValueError, KeyError):
                time.sleep(POLL_S)  # polling interval of a bounded wait
        cluster = Cluster(address, folder, scheduler)
        cluster.wait_for(lambda i: True, "dask scheduler", scheduler)
        for name, resources in workers.items():
            cluster.add_worker(name, resources, plain=name in plain)
        yield cluster
    finally:
        if cluster is not None:
            cluster.stop()
        else:
            scheduler.stop()
