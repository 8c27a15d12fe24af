"""``kvconform gate``: compare a run with a baseline and fail on what is new.

    kvconform gate --baseline <run id | latest | report dir | expectations file> --report-dir DIR
                   [--results-db [URL]] [--summary-md PATH] [--fail-on-added-removed]

Exit status: 0 nothing new; 1 a new failure of a gating check, or an unexpected pass (and, with
--fail-on-added-removed, a check added or removed); 2 a usage error (a baseline or report folder that cannot be
read, an expectations file that does not fit its schema, a database that cannot be opened).
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import sys
from collections.abc import Sequence
from pathlib import Path

from kvconform.argtypes import USAGE_ERROR, OneLineParser
from kvconform.gate.classify import (
    FLAKY_WINDOW,
    GateResult,
    compare_expectations,
    compare_runs,
    flaky_checks,
    gate_added_removed,
)
from kvconform.gate.expectations import ExpectationsError, load_expectations
from kvconform.gate.summary import console_lines, markdown
from kvconform.store import ReportError, ResultsStore, RunRecord, StoreError, StoreURLError, open_store, read_run_dir

__all__ = ["EPILOG", "GITHUB_SUMMARY_ENV", "main"]

GITHUB_SUMMARY_ENV = "GITHUB_STEP_SUMMARY"
EXPECTATION_SUFFIXES = (".yaml", ".yml")
EPILOG = f"""\
baseline (--baseline):
  RUN_ID          a run recorded in --results-db (kvconform run ... --results-db prints its id)
  latest          the newest run in --results-db of the judged run's implementation and inputs
  DIR             an earlier run's report folder (its coverage.json), or a matrix's --out folder (matrix.json)
  FILE.yaml       an expectations file: the verdicts you expect, with reasons and optional expiry
                  (format kvconform-expectations/1, kvconform/gate/expectations.schema.json)

With --results-db, a check whose verdict differs across the newest stored runs (--flaky-window, default
{FLAKY_WINDOW}) of the judged run's implementation and inputs is reported flaky and does not gate (it changed while
nothing it depends on did: its verdict says nothing about the change being judged); a flip older than the window
excuses nothing. --results-db without a URL: results.sqlite beside --report-dir.

Added and removed checks (in the judged run and not the baseline, or the other way round; an expectations entry
that matches no check is removed) are listed and do not gate, unless --fail-on-added-removed.

Exit status: 0 nothing new; 1 a new failure (of a check that gates: MUST, MUST NOT, RULE; SHOULD too when the
run was --strict) or an unexpected pass, and with --fail-on-added-removed a check added or removed;
2 a usage error."""


class GateUsageError(Exception):
    """A command line gate cannot carry out (exit 2)."""


def _parser() -> OneLineParser:
    p = OneLineParser(prog="kvconform gate", description="Judge a run against a baseline: new failures, fixed, "
                      "still failing, unexpected passes, flaky, added and removed checks.",
                      epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--baseline", required=True, metavar="BASELINE",
                   help="a stored run id, 'latest', a report folder or an expectations file (below)")
    p.add_argument("--report-dir", required=True, metavar="DIR",
                   help="the report folder of the run to judge (or a kvconform matrix --out folder)")
    p.add_argument("--results-db", nargs="?", const="", default=None, metavar="URL",
                   help="the results store: sqlite:///PATH, postgresql://..., a file path, or nothing for "
                        "results.sqlite beside --report-dir")
    p.add_argument("--summary-md", default=None, metavar="PATH",
                   help="write the Markdown summary there (a pull-request comment); it is also appended to "
                        f"${GITHUB_SUMMARY_ENV} when that is set")
    p.add_argument("--flaky-window", type=int, default=FLAKY_WINDOW, metavar="N",
                   help="how many of the newest stored runs a flip is looked for in (default %(default)s)")
    p.add_argument("--fail-on-added-removed", action="store_true",
                   help="exit 1 on a check added or removed too (the set of checks changed: a new version of "
                        "kvconform, a -k filter, a PICS change); by default they are listed and do not gate")
    return p


def _judged_name(run: RunRecord, report_dir: str) -> str:
    version = f" {run.implementation_version}" if run.implementation_version else ""
    return f"{run.implementation}{version} ({', '.join(run.suites)}; seed {run.seed}; {report_dir})"


def _stored(store: ResultsStore | None, judged: RunRecord, baseline: str) -> tuple[RunRecord, str]:
    if store is None:
        raise GateUsageError(f"--baseline {baseline}: a stored run needs --results-db")
    judged_id = store.id_of(judged.coverage_sha256)
    if baseline == "latest":
        ids = [i for i in store.run_ids(judged.identity_key) if i != judged_id]
        if not ids:
            raise GateUsageError(f"--baseline latest: {store.url.describe()} holds no other run of "
                                 f"{judged.implementation} with the same inputs")
        run_id = ids[-1]
    else:
        run_id = int(baseline)
    run = store.run(run_id)
    if run is None:
        raise GateUsageError(f"--baseline {baseline}: no run {run_id} in {store.url.describe()}")
    return run, f"run #{run_id} ({run.implementation}, seed {run.seed}, recorded {run.recorded})"


def judge(baseline: str, report_dir: str, store: ResultsStore | None, today: dt.date,
          flaky_window: int = FLAKY_WINDOW) -> GateResult:
    """Compare the run in ``report_dir`` with ``baseline``; flaky checks from ``store`` when given."""
    try:
        judged = read_run_dir(report_dir)
    except ReportError as exc:
        raise GateUsageError(f"--report-dir: {exc}") from None
    flaky = {}
    if store is not None:
        own = store.id_of(judged.coverage_sha256)
        flaky = flaky_checks(store.history(judged.identity_key, exclude=[own] if own is not None else []),
                             flaky_window)
    name = _judged_name(judged, report_dir)
    path = Path(baseline)
    if baseline == "latest" or baseline.isdigit():
        run, label = _stored(store, judged, baseline)
        return compare_runs(judged, run, label, name, flaky)
    if path.is_dir():
        try:
            run = read_run_dir(path)
        except ReportError as exc:
            raise GateUsageError(f"--baseline: {exc}") from None
        return compare_runs(judged, run, f"report folder {baseline}", name, flaky)
    if path.suffix in EXPECTATION_SUFFIXES:
        try:
            expectations = load_expectations(path)
        except ExpectationsError as exc:
            raise GateUsageError(f"--baseline: {exc}") from None
        return compare_expectations(judged, expectations, name, today, flaky)
    raise GateUsageError(f"--baseline {baseline!r}: expected a stored run id, 'latest', a report folder or an "
                         f"expectations file ({'/'.join(EXPECTATION_SUFFIXES)}); "
                         + ("no such file or folder" if not path.exists() else "not one of those"))


def _write_summary(text: str, path: str | None) -> None:
    targets = [path] if path else []
    step = os.environ.get(GITHUB_SUMMARY_ENV)
    if step:
        targets.append(step)
    for target in targets:
        try:
            Path(target).parent.mkdir(parents=True, exist_ok=True)
            # the step summary is shared with the job's other steps: appended to, never replaced
            with open(target, "a" if target == step else "w", encoding="utf-8") as f:
                f.write(text)
        except OSError as exc:
            raise GateUsageError(f"summary {target}: cannot write: {exc.strerror or exc}") from None


def main(argv: Sequence[str] | None = None) -> int:
    args_list = list(sys.argv[1:] if argv is None else argv)
    try:
        args = _parser().parse_args(args_list)
    except SystemExit as exc:
        return exc.code if isinstance(exc.code, int) else USAGE_ERROR
    store = None
    try:
        if args.results_db is not None:
            store = open_store(args.results_db, beside=args.report_dir)
        if args.flaky_window < 2:
            raise GateUsageError(f"--flaky-window {args.flaky_window}: a flip needs at least 2 runs")
        result = judge(args.baseline, args.report_dir, store, dt.date.today(), args.flaky_window)
        if args.fail_on_added_removed:
            result = gate_added_removed(result)
        _write_summary(markdown(result), args.summary_md)
    except (GateUsageError, StoreURLError, StoreError) as exc:
        print(f"kvconform gate: error: {exc}", file=sys.stderr)
        return USAGE_ERROR
    finally:
        if store is not None:
            store.close()
    for line in console_lines(result):
        print(line)
    return result.exit_code
