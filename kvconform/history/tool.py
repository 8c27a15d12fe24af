"""``kvconform history``: the results store as pages.

    kvconform history --results-db URL [--out DIR]

Exit status: 0 the pages were written; 2 a usage error (a database that cannot be opened, a folder that cannot
be written or that holds another store's run pages).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from kvconform.argtypes import USAGE_ERROR, OneLineParser
from kvconform.history.pages import HistoryError, write_history
from kvconform.history.timeline import load_history
from kvconform.store import StoreError, StoreURLError, open_store

__all__ = ["EPILOG", "main"]

DEFAULT_OUT = "out/history"
EPILOG = """\
pages (in --out):
  index.html            every implementation (one identity: the same implementation and inputs) with its newest
                        run, and the flaky checks (a verdict that differs across its stored runs, as kvconform gate
                        reports them)
  latest.html           the newest run stored; latest-<key>.html the newest of one implementation
  identity-<key>.html   one implementation's runs and its requirement x run table, each verdict change outlined
  runs/<RUN_ID>.html    one run: identity, inputs, every check; written once and never rewritten by a later
                        kvconform history (delete it to re-render)

Exit status: 0 the pages were written; 2 a usage error."""


def _parser() -> OneLineParser:
    p = OneLineParser(prog="kvconform history", description="Pages of the runs in a results store: a stable latest "
                      "page, an immutable page per run, each implementation's verdict changes, the flaky checks.",
                      epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--results-db", required=True, metavar="URL",
                   help="the results store: sqlite:///PATH, postgresql://... or a file path")
    p.add_argument("--out", default=DEFAULT_OUT, metavar="DIR",
                   help=f"where the pages go (default {DEFAULT_OUT}); the run pages already there are kept")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    try:
        args = _parser().parse_args(list(sys.argv[1:] if argv is None else argv))
    except SystemExit as exc:
        return exc.code if isinstance(exc.code, int) else USAGE_ERROR
    out = Path(args.out)
    try:
        with open_store(args.results_db) as store:
            history = load_history(store)
            where = store.url.describe()
        written = write_history(history, out)
    except (StoreURLError, StoreError, HistoryError) as exc:
        print(f"kvconform history: error: {exc}", file=sys.stderr)
        return USAGE_ERROR
    print(f"kvconform history: {len(history.runs)} runs of {len(history.timelines)} implementations in {where}; "
          f"{len(written.runs_written)} run pages written, {len(written.runs_kept)} kept")
    print(f"kvconform history: {written.index}")
    return 0
