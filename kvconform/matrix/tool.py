"""``kvconform matrix``: run the plugfest matrix of an implementations registry.

    kvconform matrix [--registry FILE] [--roles ROLE,...] [--out DIR] [-n N|auto] [--seed S] [--no-suites]
                     [--suite-budget S] [--cell-timeout S] [--consumer-budget S] [--results-db [URL]]
                     [--scheduler tcp://HOST:PORT]

Runs every compatible cell (KVCS publisher x relay x consumer, TLKV prefill x decode and writer x reader, KBTP
initiator x target) and every participant's role suite, and writes ``DIR/matrix.html``, ``DIR/matrix.json``,
``DIR/cells/<cell>/`` (each cell's evidence) and ``DIR/suites/<implementation>/<suite>/`` (the suites' reports).
With ``--results-db`` the matrix (its cells as checks) and every role suite's run are recorded in the results
store, each marked with DIR; ``kvconform gate --report-dir DIR`` judges a matrix as it judges a run.
With ``--scheduler`` the cells and suites run on the workers of a Dask scheduler (``kvconform worker``), each on
one offering the resources it needs (``kvconform.matrix.resources``); the folder and the result are the same.
Exit status: 0 when every cell passed, 1 when one failed or was inconclusive, 2 on a usage error.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from kvconform.argtypes import USAGE_ERROR, OneLineParser, positive_float
from kvconform.matrix.dask_executor import DaskUnavailable
from kvconform.matrix.plan import selected_suites
from kvconform.matrix.registry import RegistryError, default_registry_path, load_registry
from kvconform.matrix.runner import MatrixOptions, run_matrix
from kvconform.store import (
    ReportError,
    ResultsStore,
    StoreError,
    StoreURLError,
    open_store,
    read_matrix_dir,
    read_report_dir,
)

__all__ = ["main"]

OUT_FILES = ("matrix.json", "matrix.html", "cells", "suites")
CUT_PAGES = "matrix-*.html"


def _workers(text: str) -> int:
    if text == "auto":
        return max(1, os.cpu_count() or 1)
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:

        raise argparse.ArgumentTypeError(f"-n {text!r}: expected a positive integer or 'auto'")
    return value


def _parser() -> OneLineParser:
    p = OneLineParser(prog="kvconform matrix", description="Run every registered implementation against every "
                      "other (the plugfest matrix) and write its page.")
    p.add_argument("--registry", default=str(default_registry_path()), metavar="FILE",
                   help="implementations registry YAML (default: the one shipped, testbeds/implementations.yaml)")
    p.add_argument("--roles", default=None, metavar="ROLE,...",
                   help="only tables whose roles are all among these: protocols (kvcs, tlkv, kbtp) or suites "
                        "(e.g. tlkv-prefill,tlkv-decode)")
    p.add_argument("--out", default=os.path.join("out", "matrix"), metavar="DIR",
                   help="where matrix.html, matrix.json, cells/ and suites/ go (default out/matrix; an earlier "
                        "matrix there is removed first)")
    p.add_argument("-n", dest="workers", type=_workers, default=_workers("auto"), metavar="N|auto",
                   help="cells and suites run at once (default: the number of CPUs)")
    p.add_argument("--seed", type=int, default=None, help="derives every cell's identifiers and content")
    p.add_argument("--no-suites", action="store_true", help="run the exchanges only, not the role suites")
    p.add_argument("--suite-budget", type=positive_float, default=300.0, metavar="S",
                   help="bound of each role suite (its --suite-budget; default 300)")
    p.add_argument("--cell-timeout", type=positive_float, default=240.0, metavar="S",
                   help="bound of one cell's worker, every exchange step bounded inside (default 240)")
    p.add_argument("--consumer-budget", type=positive_float, default=30.0, metavar="S",
                   help="the budget a KVCS consumer gets to retrieve the cell's cache (default 30)")
    p.add_argument("--scheduler", default=None, metavar="tcp://HOST:PORT",
                   help="run each cell and role suite as a task of this Dask scheduler, on a worker offering the "
                        "resources it needs (kvconform worker; needs the dask extra); -n is then unused")
    p.add_argument("--results-db", nargs="?", const="", default=None, metavar="URL",
                   help="record the matrix and each role suite's run in the results store: sqlite:///PATH, "
                        "postgresql://..., a file path, or nothing for results.sqlite beside --out")
    return p


def _record(store: ResultsStore, out: Path, doc: dict[str, Any]) -> None:
    """The matrix (its cells as checks) and each role suite's report folder as one run each, marked with the
    matrix's folder."""
    recorded = []
    folders = [(out / suite["coverage"]).parent for suite in doc["suites"] if suite.get("coverage")]
    for folder in folders:  # a suite that wrote no report has nothing to record (matrix.json says why)
        try:
            recorded.append(store.record(read_report_dir(folder, matrix_dir=str(out))))
        except (ReportError, StoreError) as exc:
            print(f"kvconform matrix: results store: not recorded: {exc}", file=sys.stderr)
    try:
        matrix_id = store.record(read_matrix_dir(out))
    except (ReportError, StoreError) as exc:
        print(f"kvconform matrix: results store: the matrix not recorded: {exc}", file=sys.stderr)
        return
    print(f"kvconform matrix: recorded as run {matrix_id} in {store.url.describe()}"
          + (f", its role suites as runs {', '.join(map(str, recorded))}" if recorded else ""))


def _fresh(out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    # the cut pages too (matrix-draft-22.html, ...): a draft or binding gone from the registry leaves no page
    for name in [*OUT_FILES, *(p.name for p in out.glob(CUT_PAGES))]:
        path = out / name
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path)
        elif path.exists() or path.is_symlink():
            path.unlink()


def main(argv: Sequence[str] | None = None) -> int:
    args_list = list(sys.argv[1:] if argv is None else argv)
    try:
        args = _parser().parse_args(args_list)
    except SystemExit as exc:
        return exc.code if isinstance(exc.code, int) else USAGE_ERROR
    try:
        registry = load_registry(args.registry)
        tokens = None if args.roles is None else [t.strip() for t in args.roles.split(",") if t.strip()]
        suites = selected_suites(tokens)
    except (RegistryError, ValueError) as exc:
        print(f"kvconform matrix: error: {exc}", file=sys.stderr)
        return USAGE_ERROR
    out = Path(args.out)
    try:
        _fresh(out)
    except OSError as exc:
        print(f"kvconform matrix: error: --out {out}: {exc.strerror or exc}", file=sys.stderr)
        return USAGE_ERROR

    store = None
    if args.results_db is not None:
        try:
            store = open_store(args.results_db, beside=str(out))
        except (StoreURLError, StoreError) as exc:
            print(f"kvconform matrix: error: {exc}", file=sys.stderr)
            return USAGE_ERROR

    def progress(text: str) -> None:
        print(text, file=sys.stderr, flush=True)

    opts = MatrixOptions(out=out.resolve(), suites=suites, workers=args.workers, run_suites=not args.no_suites,
                         suite_budget_s=args.suite_budget, cell_timeout_s=args.cell_timeout,
                         consumer_budget_s=args.consumer_budget, command_line=["kvconform", "matrix", *args_list],
                         progress=progress, scheduler=args.scheduler)
    if args.seed is not None:
        opts.seed = args.seed
    try:
        try:
            doc = run_matrix(registry, opts)
        except DaskUnavailable as exc:
            print(f"kvconform matrix: error: {exc}", file=sys.stderr)
            return USAGE_ERROR
        if store is not None:
            _record(store, out.resolve(), doc)
    finally:
        if store is not None:
            store.close()
    summary = doc["summary"]
    print(f"kvconform matrix: {summary['cells']} cells: "
          + ", ".join(f"{n} {o}" for o, n in summary["outcomes"].items()))
    for cell in doc["cells"]:
        if cell["isolation"] or cell["outcome"] == "pass":
            continue
        blamed = ", ".join(sorted({f"{b['implementation']} ({b['role']})" for b in cell["blame"]}))
        print(f"  {cell['outcome']:<12} {cell['id']}: {cell['reason'][:300]}"
              + (f" [blames {blamed}]" if blamed else ""))
    print(f"kvconform matrix: {out / 'matrix.html'}")
    print(f"kvconform matrix: {out / 'matrix.json'}")
    return 0 if summary["outcomes"]["fail"] == 0 and summary["outcomes"]["inconclusive"] == 0 else 1
