"""``kvconform worker``: a host of the distributed matrix, a Dask worker declaring what the host offers.

    kvconform worker tcp://HOST:PORT [--resources "docker=2,nic.mlx5_pair=1"] [--name NAME] [--nthreads N]
                     [-- DASK-WORKER-OPTION ...]

Runs ``dask worker SCHEDULER --resources ... --preload kvconform.matrix.worker`` in this interpreter (the same
kvconform installation runs the cells). The resources are those of ``kvconform.matrix.resources`` (``docker``,
``rdma-vm``, ``nic.<kind>`` and whatever a registry's ``resources:`` names); the amount is how many cells using
one may run here at once. A plain ``dask worker ... --resources ... --preload kvconform.matrix.worker`` is the
same. The preload (``dask_setup``) checks, as the worker starts, that kvconform's cell runner imports and that a
declared ``docker`` has a docker client on PATH, and says what the worker offers.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import shutil
import sys
from collections.abc import Sequence
from typing import Any

from kvconform.argtypes import USAGE_ERROR, OneLineParser
from kvconform.matrix.resources import DOCKER, parse_resources

__all__ = ["dask_setup", "main", "worker_argv"]


def _parser() -> OneLineParser:
    p = OneLineParser(prog="kvconform worker", description="Serve the cells of `kvconform matrix --scheduler` on "
                      "this host: a Dask worker offering the resources given.")
    p.add_argument("scheduler", metavar="tcp://HOST:PORT", help="the Dask scheduler's address")
    p.add_argument("--resources", default="", metavar="NAME=N,...",
                   help="what this host offers, e.g. docker=2,nic.mlx5_pair=1 (default: nothing; cells that need "
                        "nothing still run here)")
    p.add_argument("--name", default=None, help="the worker's name (shown per cell in matrix.json)")
    p.add_argument("--nthreads", type=int, default=None, help="cells at once (default: Dask's, the CPUs)")
    p.add_argument("extra", nargs=argparse.REMAINDER, help="after --: more dask worker options")
    return p


def worker_argv(scheduler: str, resources: dict[str, float], name: str | None = None, nthreads: int | None = None,
                extra: Sequence[str] = ()) -> list[str]:
    """The ``dask worker`` command line (run by this interpreter) of a kvconform worker."""
    argv = [sys.executable, "-m", "distributed.cli.dask_worker", scheduler, "--preload", __name__]
    if resources:
        argv += ["--resources", " ".join(f"{r}={a:g}" for r, a in resources.items())]
    if name:
        argv += ["--name", name]
    if nthreads:
        argv += ["--nthreads", str(nthreads)]
    return argv + list(extra)


def main(argv: Sequence[str] | None = None) -> int:
    try:
        args = _parser().parse_args(list(sys.argv[1:] if argv is None else argv))
        resources = parse_resources(args.resources)
    except SystemExit as exc:
        return exc.code if isinstance(exc.code, int) else USAGE_ERROR
    except ValueError as exc:
        print(f"kvconform worker: error: --resources: {exc}", file=sys.stderr)
        return USAGE_ERROR
    if importlib.util.find_spec("distributed") is None:
        print("kvconform worker: error: needs the dask extra (pip install 'kvconform[dask]')", file=sys.stderr)
        return USAGE_ERROR
    extra = [a for a in args.extra if a != "--"]
    command = worker_argv(args.scheduler, resources, args.name, args.nthreads, extra)
    sys.stdout.flush()
    os.execv(command[0], command)  # the worker replaces this process: its signals, its exit status


def dask_setup(worker: Any) -> None:
    """The ``--preload`` hook: refuse to start where a cell could not run, say what the worker offers."""
    if importlib.util.find_spec("kvconform.matrix.cell") is None:
        raise RuntimeError("kvconform.matrix.cell is not importable in this worker's interpreter")
    state = getattr(worker, "state", worker)  # WorkerState holds them since distributed 2022.8
    offered = dict(getattr(state, "total_resources", None) or getattr(worker, "total_resources", None) or {})
    if DOCKER in offered and shutil.which("docker") is None:
        print(f"kvconform worker {worker.name}: offers {DOCKER} but no docker client is on PATH", file=sys.stderr)
    print(f"kvconform worker {worker.name}: offers "
          + (", ".join(f"{r}={a:g}" for r, a in offered.items()) or "no resources"), file=sys.stderr, flush=True)
