"""The matrix on a Dask distributed cluster: ``kvconform matrix --scheduler tcp://HOST:PORT``.

Each cell (and each role suite) is one task, restricted to the workers that offer the resources it needs
(``kvconform.matrix.resources``). On its worker the task runs what the local executor runs — the cell's own
process, ``python -m kvconform.matrix.cell`` — in a temporary folder, and returns the folder's files, which the
coordinator writes where the local executor would have (``<out>/cells/<cell>/``, ``<out>/suites/...``). So the
report, the page and the results store never know where a cell ran; ``exchange.worker`` says it.

What is never a hang or a silent retry (the verdict policy: what the harness could not observe is inconclusive):

- the workers' resources are read before anything is submitted: a task no worker can run ends at once,
  ``NotRun`` naming the missing resources (and again if the workers able to run it leave while it waits);
- a task marks itself started on the scheduler (its metadata, ``kvconform/<run>/<key>``); when the worker it
  started on leaves the cluster, the task ends ``NotRun`` naming that worker, and a second attempt Dask would
  make elsewhere returns at once without running anything;
- every wait is bounded: the connection, the wait for a first worker, and each started task (its own bound plus a
  grace period; the cell's own process is bounded below it on the worker).

Workers need kvconform (with the ``dask`` extra) installed and the registry's files at the same path as the
coordinator (``kvconform worker``; README, "Plugfest matrix").
"""

from __future__ import annotations

import contextlib
import shutil
import tempfile
import threading
import time
from collections.abc import Callable, Mapping
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from kvconform.matrix.resources import missing

__all__ = ["DaskExecutor", "DaskUnavailable", "NotRun"]

T = TypeVar("T")
META = "kvconform"  # the scheduler's metadata key under which tasks mark themselves started
POLL_S = 0.25
GRACE_S = 60.0  # past a started task's own bound: its worker's start-up and shipping the files back


class DaskUnavailable(RuntimeError):
    """The scheduler cannot be used (no ``distributed``, not reachable); the message says which and why."""


class NotRun(RuntimeError):
    """The task did not run to a result: no worker offers what it needs, its worker was lost, or its bound passed."""

    def __init__(self, message: str, *, resources: list[str] | None = None, worker: str | None = None) -> None:
        super().__init__(message)
        self.resources = resources or []
        self.worker = worker


@dataclass
class _Task:
    key: str
    rel: str
    need: dict[str, float]
    bound_s: float
    result: Future[Any]
    dask: Any = None  # distributed.Future
    started: float | None = None  # coordinator's monotonic time the task was first seen started
    worker: str | None = None


@dataclass
class Shipped:
    """What a task returns from its worker: the value, the files under its folder, who ran it."""

    value: Any
    files: dict[str, bytes] = field(default_factory=dict)
    worker: str = ""
    lost: str | None = None  # set when this was a second attempt after its first worker was lost


def _files(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def run_on_worker(run_id: str, key: str, rel: str, call: Callable[[Path], Any]) -> Shipped:
    """The task's body, on a worker: mark it started, run ``call(out)`` in a fresh folder, ship back ``out/rel``."""
    from distributed import get_client, get_worker  # optional: the dask extra, present on every worker

    worker = get_worker()
    client: Any = get_client()  # partly untyped API
    name = str(worker.name)
    first = client.get_metadata([META, run_id, key], default=None)
    if first is not None:  # Dask retried it after its first worker was lost: that cell is already judged
        return Shipped(None, worker=name, lost=str(first.get("worker")))
    client.set_metadata([META, run_id, key], {"worker": name, "address": worker.address})
    with tempfile.TemporaryDirectory(prefix="kvconform-task-") as tmp:
        value = call(Path(tmp))
        files = _files(Path(tmp) / rel) if (Path(tmp) / rel).is_dir() else {}
    return Shipped(value, files, name)


class DaskExecutor:
    """Tasks on the cluster of ``address``; ``submit`` returns a ``concurrent.futures.Future`` of the value,
    which raises ``NotRun`` when the task could not run to a result."""

    def __init__(self, address: str, run_id: str, out: Path, *, connect_timeout_s: float = 30.0,
                 workers_timeout_s: float = 30.0, progress: Callable[[str], None] | None = None) -> None:
        try:
            import distributed  # optional: the dask extra (pip install 'kvconform[dask]')
        except ImportError as exc:
            raise DaskUnavailable(f"--scheduler needs the dask extra (pip install 'kvconform[dask]'): {exc}") from None
        self._distributed = distributed
        self.address = address
        self.run_id = run_id
        self.out = out
        self._say = progress or (lambda text: None)
        try:
            self.client: Any = distributed.Client(address, timeout=connect_timeout_s,  # type: ignore[no-untyped-call]
                                                  set_as_default=False)
        except (OSError, TimeoutError) as exc:
            raise DaskUnavailable(f"--scheduler {address}: cannot connect within {connect_timeout_s:g} s: "
                                  f"{exc}") from None
        try:
            self.client.wait_for_workers(1, timeout=workers_timeout_s)
        except (TimeoutError, OSError):
            self._say(f"matrix: the scheduler {address} has no worker after {workers_timeout_s:g} s")
        self.workers = self._workers()
        self._say(f"matrix: scheduler {address}, workers: " + ("; ".join(
            f"{n}: {', '.join(f'{r}={a:g}' for r, a in offer.items()) or 'no resources'}"
            for n, offer in self.workers.items()) or "none"))
        self._tasks: dict[str, _Task] = {}
        self._ran: dict[str, str] = {}  # task key -> the worker that ran it (or was running it when lost)
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._monitor = threading.Thread(target=self._watch, name="kvconform-dask-monitor", daemon=True)
        self._monitor.start()

    def _workers(self) -> dict[str, dict[str, float]]:
        """Live workers: name -> the resources it offers (and the address -> name map in ``self._names``)."""
        info = self.client.scheduler_info(n_workers=-1)["workers"]
        self._names = {addr: str(w.get("name", addr)) for addr, w in info.items()}
        return {str(w.get("name", addr)): {str(r): float(a) for r, a in (w.get("resources") or {}).items()}
                for addr, w in info.items()}

    def offers(self) -> dict[str, dict[str, float]]:
        """What each worker offered when the matrix started (for matrix.json)."""
        return self.workers

    def _cannot(self, need: Mapping[str, float], workers: Mapping[str, Mapping[str, float]]) -> NotRun | None:
        if not workers:
            return NotRun(f"the scheduler {self.address} has no worker to run it")
        absent = missing(need, workers)
        if not absent:
            return None
        offered = "; ".join(f"{n}: {', '.join(f'{r}={a:g}' for r, a in o.items()) or 'none'}"
                            for n, o in workers.items())
        return NotRun(f"no worker of the scheduler {self.address} offers {', '.join(absent)} (the resources it "
                      f"needs; workers offer {offered})", resources=absent)

    def submit(self, key: str, call: Callable[[Path], T], rel: str, need: dict[str, float],
               bound_s: float) -> Future[T]:
        """Run ``call(folder)`` on a worker offering ``need``; the files it leaves under ``folder/rel`` are written
        to ``out/rel``. ``bound_s``: how long it may run once started (a grace period is added)."""
        result: Future[T] = Future()
        why = self._cannot(need, self.workers)
        if why is not None:
            result.set_exception(why)
            return result
        task = _Task(key, rel, need, bound_s + GRACE_S, result)
        task.dask = self.client.submit(run_on_worker, self.run_id, key, rel, call, key=f"kvconform-{self.run_id}-{key}",
                                       resources=need or None, pure=False, retries=0)
        with self._lock:
            self._tasks[key] = task
        return result

    def where(self, key: str) -> str | None:
        """The worker that ran the task of ``key`` (or was running it when it was lost); None when none did."""
        return self._ran.get(key)

    def _finish(self, task: _Task, exc: BaseException | None = None, shipped: Shipped | None = None) -> None:
        with self._lock:
            self._tasks.pop(task.key, None)
        if task.result.done():
            return
        worker = shipped.worker if shipped is not None and shipped.lost is None else (
            exc.worker if isinstance(exc, NotRun) and exc.worker else task.worker)
        if worker:
            self._ran[task.key] = worker
        if exc is not None:
            task.result.set_exception(exc)
            if task.dask is not None and not task.dask.done():
                task.dask.cancel()
            return
        assert shipped is not None
        if shipped.lost is not None:
            task.result.set_exception(NotRun(f"its worker {shipped.lost} was lost while it ran: not a verdict on "
                                             "any participant", worker=shipped.lost))
            return
        folder = self.out / task.rel
        if folder.is_dir():
            shutil.rmtree(folder)
        for name, data in shipped.files.items():
            path = folder / name
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(data)
        task.result.set_result(shipped.value)

    def _watch(self) -> None:
        """The monitor: collect finished tasks, end those whose worker left, whose bound passed, or that no live
        worker can run any more."""
        while not self._stop.is_set():
            with self._lock:
                tasks = list(self._tasks.values())
            if self._stop.wait(POLL_S) or not tasks:
                continue
            try:
                self._check(tasks)
            except Exception as exc:  # the scheduler went away mid-check
                for task in tasks:
                    self._finish(task, NotRun(f"lost the scheduler {self.address}: {exc!r}"))

    def _check(self, tasks: list[_Task]) -> None:
        workers = None
        started = self.client.get_metadata([META, self.run_id], default={}) or {}
        now = time.monotonic()
        for task in tasks:
            status = task.dask.status
            if status == "finished":
                try:
                    self._finish(task, shipped=task.dask.result(timeout=30))
                except Exception as exc:  # the result could not be fetched (its worker left since)
                    self._finish(task, NotRun(f"its result could not be fetched from its worker: {exc!r}"))
                continue
            if status in ("error", "cancelled", "lost"):
                error = task.dask.exception(timeout=30) if status == "error" else None
                worker = (started.get(task.key) or {}).get("worker")
                if error is not None and not isinstance(error, self._distributed.KilledWorker):
                    self._finish(task, NotRun(f"harness error on worker {worker}: {type(error).__name__}: {error}"))
                else:
                    self._finish(task, NotRun(f"its worker {worker} was lost while it ran (Dask: {status}"
                                              f"{f': {error}' if error else ''}): not a verdict on any participant",
                                              worker=worker))
                continue
            if workers is None:
                workers = self._workers()
            mark = started.get(task.key)
            if mark is not None:
                if task.started is None:
                    task.started, task.worker = now, str(mark.get("worker"))
                if mark.get("address") not in self._names:
                    self._finish(task, NotRun(f"its worker {mark.get('worker')} ({mark.get('address')}) was lost "
                                              "while it ran: not a verdict on any participant",
                                              worker=str(mark.get("worker"))))
                elif now - task.started > task.bound_s:
                    self._finish(task, NotRun(f"it ran past its bound ({task.bound_s:g} s) on worker "
                                              f"{mark.get('worker')}: stopped waiting for it"))
                continue
            why = self._cannot(task.need, workers)
            if why is not None:  # the workers able to run it left before it started
                self._finish(task, why)

    def close(self) -> None:
        self._stop.set()
        self._monitor.join(timeout=10)
        with self._lock:
            tasks = list(self._tasks.values())
        for task in tasks:
            self._finish(task, NotRun("the matrix ended before it ran"))
        with contextlib.suppress(Exception):  # best effort: a run's marks are a few bytes on the scheduler
            self.client.set_metadata([META, self.run_id], {})
        self.client.close(timeout=10)
