"""How the plugfest matrix scales: the local executor against Dask distributed with 1 and 2 workers (issue 25, part 6).

    python bench/bench_matrix.py [--quick] [--n N] [--rounds R] [--json FILE]

Builds a synthetic registry of ``N`` implementations per role of the TLKV transfer table (prefill side x decode
side, so N*N cells): kvconform's reference, and N-1 deliberately broken variants of it from ``tests/mutants/tlkv.py``
(a prefill side sending wrong CRCs, one reordering chunks, ...; a decode side registering the tail block, one
scrambling HAS_BLOCKS, ...), each run as its own process by the cell (``python:`` forms), the failed cells followed
by their isolation exchanges as in any matrix. Role suites are not run (``--no-suites``): they cost the same on
every executor and grow with N, not N*N.

Then runs that matrix, in turn (``--rounds`` times, interleaved so a drift of the shared machine hits all alike):

- ``local-1``, ``local-2``: ``kvconform matrix -n 1`` / ``-n 2`` (threads of this process, a process per cell);
- ``dask-1w``, ``dask-2w``: ``--scheduler`` with one worker, then two (one thread each), a real ``dask scheduler``
  and ``kvconform worker`` processes on 127.0.0.1 started here (tests/matrix/dask_cluster.py);

after one untimed warm-up run (it writes the bytecode caches), and prints per executor the median wall time, cells
per minute, the ratio to ``local-1`` and to ``local-2``, and the coordinator's own overhead per cell: the CPU time
(user + system) of this process, which runs the coordinator and not the cells (they are processes of their own,
locally or on the workers), divided by the cells. Every run's
cells must have the same outcomes (the verdicts do not depend on the executor); otherwise the exit status is 1.

Last, a projection for 20 implementations per role (8,000 KVCS publisher x relay x consumer cells) on k hosts with
two cells at once each, from the measured median cell time and coordinator overhead (a KVCS cell takes longer
than a TLKV one: read it as a lower bound). ``--quick``: N=2, one round. Not a test: nothing about speed is asserted.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # `kvconform`, `tests` from this checkout as a script

from kvconform.matrix.plan import selected_suites
from kvconform.matrix.registry import load_registry
from kvconform.matrix.runner import MatrixOptions, run_matrix
from tests.matrix.dask_cluster import Cluster, dask_cluster

ROOT = Path(__file__).resolve().parents[1]

PREFILLS = ["WrongCrcPrefill", "ReorderedPrefill", "NoHasBlocksPrefill", "EmptyTailPrefill", "ResendsHeldPrefill"]
DECODES = ["RegistersTailDecode", "ScrambledHasBlocksDecode", "SkipsChunkCrcDecode", "KeepsFailedStreamDecode",
           "InvalidArgumentDecode"]
GEOMETRY = {"block_tokens": 16, "n_layers": 3, "n_kv_heads": 2, "head_dim": 8}
PROJECT_CELLS = 20 ** 3  # KVCS publisher x relay x consumer at 20 implementations per role
PROJECT_HOSTS = (1, 4, 16)
SLOTS_PER_HOST = 2


def registry_doc(n: int) -> dict[str, Any]:
    """The reference and n-1 broken variants, per role of the TLKV transfer table."""
    def decode_pics(versions: list[int]) -> dict[str, Any]:
        return {"tlkv": {"decode": {"versions": versions, "geometry": GEOMETRY}}}

    impls: dict[str, Any] = {"kvconform": {"reference": True, "roles": {"tlkv": {
        "prefill": {"versions": [1, 2], "reference": True},
        "decode": {"versions": [1, 2], "reference": True, "pics": decode_pics([1, 2])}}}}}
    for i in range(1, n):
        prefill, decode = PREFILLS[(i - 1) % len(PREFILLS)], DECODES[(i - 1) % len(DECODES)]
        impls[f"broken-{i}"] = {"description": f"{prefill} and {decode} (tests/mutants/tlkv.py)", "roles": {"tlkv": {
            "prefill": {"versions": [1], "python": f"tests.mutants.tlkv:{prefill}"},
            "decode": {"versions": [1], "python": f"tests.mutants.tlkv:{decode}", "pics": decode_pics([1])}}}}
    return {"name": f"bench-{n}-per-role", "implementations": impls}


def _cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def run_once(registry_path: Path, out: Path, *, workers: int, scheduler: str | None, seed: int) -> dict[str, Any]:
    registry = load_registry(registry_path)
    opts = MatrixOptions(out=out, suites=selected_suites(["tlkv-prefill", "tlkv-decode"]), workers=workers,
                         seed=seed, run_suites=False, scheduler=scheduler)
    cpu, wall = _cpu(), time.monotonic()
    doc = run_matrix(registry, opts)
    wall, cpu = time.monotonic() - wall, _cpu() - cpu
    every = doc["cells"]  # isolation exchanges included: each is a cell the executor ran
    return {"wall_s": wall, "cpu_s": cpu, "cells": len(every),
            "outcomes": {c["id"]: c["outcome"] for c in every},
            "cell_s": [c["exchange"]["duration_s"] for c in every if c["exchange"]["duration_s"] is not None],
            "workers": sorted({str(c["exchange"].get("worker")) for c in every if c["exchange"].get("worker")})}


def summarize(name: str, runs: list[dict[str, Any]]) -> dict[str, Any]:
    wall = statistics.median(r["wall_s"] for r in runs)
    cells = runs[0]["cells"]
    return {"executor": name, "cells": cells, "wall_s": round(wall, 2),
            "cells_per_min": round(60.0 * cells / wall, 1),
            "coordinator_ms_per_cell": round(1000.0 * statistics.median(r["cpu_s"] / r["cells"] for r in runs), 1),
            "median_cell_s": round(statistics.median(s for r in runs for s in r["cell_s"]), 3),
            "workers_used": sorted({w for r in runs for w in r["workers"]})}


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="N=2, one round")
    p.add_argument("--n", type=int, default=3, help="implementations per role (default 3: 9 cells + isolation)")
    p.add_argument("--rounds", type=int, default=2, help="runs per executor, interleaved (default 2)")
    p.add_argument("--seed", type=int, default=20261207)
    p.add_argument("--json", type=Path, default=None, help="also write the results here")
    args = p.parse_args(argv)
    n, rounds = (2, 1) if args.quick else (max(1, args.n), max(1, args.rounds))
    os.chdir(ROOT)  # the cells import tests.mutants from the current folder (the matrix's PYTHONPATH)
    with tempfile.TemporaryDirectory(prefix="kvconform-bench-matrix-") as tmp:
        folder = Path(tmp)
        registry = folder / "registry.yaml"
        registry.write_text(yaml.safe_dump(registry_doc(n), sort_keys=False), "utf-8")
        runs: dict[str, list[dict[str, Any]]] = {}
        with dask_cluster(folder / "dask", {}) as cluster:
            cluster.add_worker("w1", "", nthreads=1)
            plans: list[tuple[str, int, Cluster | None, int]] = [
                ("local-1", 1, None, 0), ("local-2", 2, None, 0), ("dask-1w", 1, cluster, 1),
                ("dask-2w", 1, cluster, 2)]
            # warm-up, not timed: writes the bytecode caches every cell's interpreter reads after it
            run_once(registry, folder / "warm-up", workers=2, scheduler=None, seed=args.seed)
            for rnd in range(rounds):
                for name, workers, on, want in plans:
                    if on is not None and want == 2 and "w2" not in on.workers:
                        on.add_worker("w2", "", nthreads=1)
                    if on is not None and want == 1 and "w2" in on.workers:
                        on.workers.pop("w2").stop()
                        on.wait_for(lambda info: len(info["workers"]) == 1, "w2 gone", on.scheduler)
                    result = run_once(registry, folder / f"{name}-{rnd}", workers=workers,
                                      scheduler=on.address if on is not None else None, seed=args.seed)
                    print(f"round {rnd + 1}/{rounds} {name}: {result['cells']} cells in {result['wall_s']:.1f} s "
                          f"(workers {', '.join(result['workers']) or 'local'})", file=sys.stderr, flush=True)
                    runs.setdefault(name, []).append(result)
    rows = [summarize(name, r) for name, r in runs.items()]
    base1, base2 = rows[0]["cells_per_min"], rows[1]["cells_per_min"]
    print(f"\nmatrix of {n} implementations per role (TLKV prefill x decode: {n * n} cells + isolation), "
          f"{rounds} round(s), medians")
    print(f"{'executor':<9} {'cells':>5} {'wall s':>7} {'cells/min':>9} {'/local-1':>8} {'/local-2':>8} "
          f"{'coord ms/cell':>13} {'cell s':>7}")
    for row in rows:
        print(f"{row['executor']:<9} {row['cells']:>5} {row['wall_s']:>7.2f} {row['cells_per_min']:>9.1f} "
              f"{row['cells_per_min'] / base1:>8.2f} {row['cells_per_min'] / base2:>8.2f} "
              f"{row['coordinator_ms_per_cell']:>13.1f} {row['median_cell_s']:>7.3f}")
    same = len({json.dumps(r["outcomes"], sort_keys=True) for rs in runs.values() for r in rs}) == 1
    print("every run gave every cell the same outcome" if same else "OUTCOMES DIFFER between runs (see --json)")
    dask2 = next(r for r in rows if r["executor"] == "dask-2w")
    cell_s, coord_s = dask2["median_cell_s"], dask2["coordinator_ms_per_cell"] / 1000.0
    print(f"\nprojection, {PROJECT_CELLS} cells (20 implementations per role, KVCS), {SLOTS_PER_HOST} cells at once "
          f"per host, from the median cell ({cell_s:.2f} s) and coordinator overhead ({coord_s * 1000:.1f} ms/cell):")
    for k in PROJECT_HOSTS:
        hours = PROJECT_CELLS * cell_s / (k * SLOTS_PER_HOST) / 3600.0
        print(f"  {k:>2} hosts: {hours:5.2f} h of cells; the coordinator's own CPU "
              f"{PROJECT_CELLS * coord_s / 60:.1f} min")
    if args.json is not None:
        args.json.write_text(json.dumps({"n": n, "rounds": rounds, "rows": rows, "same_outcomes": same,
                                         "runs": runs}, indent=1) + "\n", "utf-8")
    return 0 if same else 1


if __name__ == "__main__":
    raise SystemExit(main())
