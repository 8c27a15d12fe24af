"""Run a matrix: the role suites and the cells in parallel, isolation of failed cells, the result document.

Every cell runs in a worker process of its own (``python -m kvconform.matrix.cell``) bounded by
``cell_timeout_s``; ``n`` cells and suites run at once. A cell's outcome is the worst of its exchange's and
of its participants' role suites' (fail > inconclusive > pass; suites not run count for nothing), so a cell
passes only when the exchange was verified and every participant's suite passed.

**Who broke a failed exchange** is judged by isolation, not guessed: for each participant that is not the
registry's reference, the same exchange runs with the reference in every other role (a cell of the matrix
when there is one, else an extra isolation cell, shown in the blame only). A participant whose isolation
exchange fails is named, with that exchange's evidence; when every isolation passes, the participants
disagree only with each other and all of them are named ("an interoperability failure"). Without a
reference for a role, the exchange's own evidence names the suspects (who exited, hung, refused).
A participant whose role suite fails is named with the requirements it broke.

**Where cells run**: ``n`` at once on this machine (the default), or, with ``MatrixOptions.scheduler``, each cell
and role suite as a task of a Dask distributed cluster on a worker offering the resources it needs
(``kvconform.matrix.dask_executor``, ``kvconform.matrix.resources``); the same folders and result either way. A
task that could not run to a result there (no worker offers a resource, its worker was lost) is inconclusive.
"""

from __future__ import annotations

import datetime
import hashlib
import json
import os
import secrets
import shlex
import socket
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from functools import partial
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

from kvconform.matrix.dask_executor import DaskExecutor, NotRun
from kvconform.matrix.participants import remove_containers
from kvconform.matrix.plan import KINDS, CellPlan, Plan, combination, make_plan
from kvconform.matrix.registry import Registry, RoleEntry
from kvconform.matrix.resources import role_resources, unite
from kvconform.matrix.suites import GRACE_S, SuiteRun, run_suite
from kvconform.reports.matrix import write_matrix
from kvconform.targets.process import run_process

__all__ = ["MATRIX_FORMAT", "OUTCOMES", "MatrixOptions", "run_matrix", "worst"]

MATRIX_FORMAT = "kvconform-matrix/1"
OUTCOMES = ("fail", "inconclusive", "pass")  # worst first


def worst(outcomes: Iterable[str]) -> str:
    """The worst of pass / fail / inconclusive ("pass" when there are none)."""
    present = set(outcomes)
    return next((o for o in OUTCOMES if o in present), "pass")


@dataclass
class MatrixOptions:
    """What ``kvconform matrix`` was asked to do."""

    out: Path
    suites: set[str]
    workers: int = 2
    seed: int = field(default_factory=lambda: secrets.randbits(32))
    run_suites: bool = True
    suite_budget_s: float = 300.0
    check_timeout_s: float = 300.0  # kvconform run's own default: a tighter bound would call a slow target hung
    cell_timeout_s: float = 240.0
    consumer_budget_s: float = 30.0
    command_line: list[str] = field(default_factory=list)
    progress: Callable[[str], None] | None = None
    scheduler: str | None = None  # tcp://HOST:PORT of a Dask scheduler: cells and suites run on its workers


def _env() -> dict[str, str]:
    """The environment of every process the matrix starts: this interpreter's scripts first on PATH (so a
    registry's ``kvconform ...`` is this installation's), the current folder importable (``tests.mutants``)."""
    env = dict(os.environ)
    bin_dir = str(Path(sys.executable).parent)
    env["PATH"] = bin_dir + os.pathsep + env.get("PATH", "")
    env["PYTHONPATH"] = os.pathsep.join([os.getcwd(), *([env["PYTHONPATH"]] if env.get("PYTHONPATH") else [])])
    env.pop("PYTHONDONTWRITEBYTECODE", None)  # every spawned interpreter would recompile the package
    return env


def _cell_seed(seed: int, cid: str) -> int:
    return int(hashlib.sha256(f"{seed}:{cid}".encode()).hexdigest()[:12], 16)


def _request(cell: CellPlan, registry: Registry, folder: Path, seed: int, budget: float,
             run_id: str) -> dict[str, Any]:
    ref = {s: registry.implementations[e.implementation].reference for s, e in cell.participants.items()}
    return {"id": cell.id, "kind": cell.kind, "dir": str(folder), "seed": _cell_seed(seed, cell.id), "run": run_id,
            "registry_dir": str(registry.path.parent), "budget_s": budget, "versions": list(cell.versions),
            "participants": {s: {**e.as_dict(), "reference": ref[s]} for s, e in cell.participants.items()}}


def _remove_left(run_id: str, cell: str | None = None) -> list[str]:
    """The run's (cell's) containers still there, removed (best effort: names, or why not)."""

    try:
        return remove_containers(run_id, cell)
    except Exception as exc:  # they keep the owner label: reap_orphans of a later run removes them
        return [f"not removed: {exc!r}"]


def _run_cell(cell: CellPlan, registry: Registry, opts: MatrixOptions, env: dict[str, str],
              run_id: str) -> dict[str, Any]:
    folder = opts.out / "cells" / cell.id
    folder.mkdir(parents=True, exist_ok=True)
    for stale in folder.iterdir():
        if stale.is_file():
            stale.unlink()
    request = _request(cell, registry, folder, opts.seed, opts.consumer_budget_s, run_id)
    (folder / "request.json").write_text(json.dumps(request, indent=1, default=str) + "\n", "utf-8")
    argv = [sys.executable, "-m", "kvconform.matrix.cell", str(folder / "request.json")]
    started, wall = time.monotonic(), time.time()
    proc = run_process(argv, opts.cell_timeout_s, env=env, what="cell worker")
    window = [round(wall, 3), round(time.time(), 3)]  # when the worker ran: cells may reuse a port, never at once
    # A worker stopped at its bound never ran its own clean-up: the containers it started may still run.
    left = (_remove_left(run_id, cell.id) if any(e.run.in_docker for e in cell.participants.values()) else [])
    (folder / "worker.log").write_text(f"$ {shlex.join(argv)}\nexit {proc.returncode}\n---- stdout\n"
                                       f"{proc.stdout.decode('utf-8', 'replace')}\n---- stderr\n"
                                       f"{proc.stderr.decode('utf-8', 'replace')}\n", "utf-8")
    result_file = folder / "result.json"
    if result_file.is_file() and not proc.timed_out:
        doc: dict[str, Any] = json.loads(result_file.read_text("utf-8"))
    else:
        # Every step inside is bounded below --cell-timeout by default: a worker stopped at it means bounds that
        # do not fit (e.g. a registry's ready timeout_s above it) or a starved machine; a verdict on nobody.
        why = (f"the cell's worker was stopped after {opts.cell_timeout_s:g} s (--cell-timeout) before it had a "
               "result; not a verdict on any participant" if proc.timed_out
               else f"harness error: the cell's worker exited {proc.returncode} without a result")
        doc = {"id": cell.id, "kind": cell.kind, "outcome": "inconclusive", "suspects": [], "unavailable": None,
               "message": f"{why}: {proc.stderr_text[-1500:]}", "steps": [], "exchanged": {},
               "identifiers": {}, "logs": {}, "transcript": None, "traceback": None,
               "duration_s": round(time.monotonic() - started, 3)}
    doc["worker_log"] = "worker.log"
    doc["window"] = window
    if left:
        doc.setdefault("steps", []).append({"t": doc.get("duration_s"), "what": "containers the worker left were "
                                            "removed by the runner", "containers": left})
    return doc


def _not_run(cell: CellPlan, folder: Path, message: str) -> dict[str, Any]:
    """The result of a cell whose worker never produced one (a verdict on nobody)."""
    folder.mkdir(parents=True, exist_ok=True)
    return {"id": cell.id, "kind": cell.kind, "outcome": "inconclusive", "suspects": [], "unavailable": None,
            "message": message, "steps": [], "exchanged": {}, "identifiers": {}, "logs": {}, "transcript": None,
            "traceback": None, "duration_s": None}


def _cell_at(cell: CellPlan, registry: Registry, opts: MatrixOptions, run_id: str, out: Path) -> dict[str, Any]:
    """A cell run into ``out`` (a Dask worker's folder), in this process's environment."""
    return _run_cell(cell, registry, replace(opts, out=out), _env(), run_id)


def _suite_at(entry: RoleEntry, registry: Registry, opts: MatrixOptions, run_id: str, out: Path) -> SuiteRun:
    """A role suite run into ``out`` (a Dask worker's folder), in this process's environment."""
    return run_suite(entry, registry, out, out / "suites" / entry.implementation / entry.suite,
                     budget_s=opts.suite_budget_s, check_timeout_s=opts.check_timeout_s, env=_env(), run_id=run_id)


def _isolation_needs(cell: CellPlan, registry: Registry) -> dict[str, tuple[str, dict[str, str]] | None]:
    """Per non-reference participant: (its isolation cell's kind, who plays what there), or None without one."""
    needs: dict[str, tuple[str, dict[str, str]] | None] = {}
    for suite, entry in cell.participants.items():
        if registry.implementations[entry.implementation].reference:
            continue
        who: dict[str, str] | None = {}
        for other in cell.participants:
            if other == suite:
                continue
            ref = registry.reference(other)
            if ref is None:
                who = None
                break
            assert who is not None
            who[other] = ref.implementation
        needs[suite] = None if who is None else (cell.kind, {**who, suite: entry.implementation})
    return needs


def _blame_exchange(cell: CellPlan, result: dict[str, Any], registry: Registry,
                    results: dict[str, dict[str, Any]], isolation: dict[str, str]) -> list[dict[str, Any]]:
    """Who broke a failed exchange (see the module docstring)."""
    blame: list[dict[str, Any]] = []
    cleared: list[str] = []
    needs = _isolation_needs(cell, registry)
    judged = False
    for suite, need in needs.items():
        entry = cell.participants[suite]
        if need is None:
            continue
        iso_id = isolation.get(f"{suite}@{cell.id}")
        iso = results.get(iso_id or "")
        if iso is None:
            continue
        judged = True
        link = f"cells/{iso_id}/index.html"
        if iso["outcome"] == "fail":
            why = ("fails this exchange with the reference in every other role" if iso_id != cell.id
                   else "fails this exchange, in which every other role is the reference")
            blame.append({"implementation": entry.implementation, "role": suite, "why": why,
                          "evidence": link, "message": iso["message"]})
        elif iso["outcome"] == "pass":
            cleared.append(suite)
        else:
            blame.append({"implementation": entry.implementation, "role": suite, "why": "undetermined: its "
                          "isolation exchange with the reference was inconclusive", "evidence": link,
                          "message": iso["message"], "undetermined": True})
    if judged and not [b for b in blame if not b.get("undetermined")] and cleared and len(cleared) == len(needs):
        names = [cell.participants[s] for s in cleared]
        for entry in names:
            blame.append({"implementation": entry.implementation, "role": entry.suite,
                          "why": "passes with the reference alone: this combination fails (an interoperability "
                                 "failure between " + ", ".join(e.implementation for e in names) + ")",
                          "evidence": f"cells/{cell.id}/index.html", "message": result["message"]})
    if not blame:  # no isolation decided it: the exchange's own evidence names the suspects
        suspects = [s for s in (result.get("suspects") or list(cell.participants)) if s not in cleared]
        for suite in suspects or list(cell.participants):
            entry = cell.participants[suite]
            blame.append({"implementation": entry.implementation, "role": suite,
                          "why": "the exchange's evidence points at it (no isolation against a reference decided)"
                          if needs or not all(registry.implementations[e.implementation].reference
                                              for e in cell.participants.values())
                          else "the reference implementations fail together: a kvconform bug (please report it)",
                          "evidence": f"cells/{cell.id}/index.html", "message": result["message"]})
    return blame


def _cell_entry(cell: CellPlan, result: dict[str, Any], registry: Registry, suites: dict[tuple[str, str], SuiteRun],
                results: dict[str, dict[str, Any]], isolation: dict[str, str], ran_suites: bool) -> dict[str, Any]:
    exchange = result["outcome"]
    blame: list[dict[str, Any]] = []
    if exchange == "fail":
        blame = _blame_exchange(cell, result, registry, results, isolation)
    part_suites: dict[str, dict[str, Any]] = {}
    for suite, entry in cell.participants.items():
        run = suites.get((entry.implementation, suite))
        if run is None:
            part_suites[suite] = {"outcome": "not-run", "message": "suites not run (--no-suites)" if not ran_suites
                                  else "not run"}
            continue
        part_suites[suite] = {"outcome": run.outcome, "message": run.message, "report": run.report}
        if run.outcome == "fail":
            blame.append({"implementation": entry.implementation, "role": suite,
                          "why": f"its {suite} suite fails", "evidence": run.report or run.log,
                          "message": run.message})
    outcome = worst([exchange, *(s["outcome"] for s in part_suites.values() if s["outcome"] != "not-run")])
    unavailable = result.get("unavailable")
    reasons = [] if exchange == "pass" else [f"exchange {exchange}: {result['message']}"]
    reasons += [f"{cell.participants[s].implementation}'s {s} suite {v['outcome']}: {v['message']}"
                for s, v in part_suites.items() if v["outcome"] in ("fail", "inconclusive")]
    return {
        "id": cell.id, "kind": cell.kind, "table": cell.table, "isolation": cell.table is None,
        "participants": {s: e.implementation for s, e in cell.participants.items()},
        "versions": list(cell.versions),
        "outcome": outcome,
        "reason": "; ".join(reasons) if reasons else "the exchange completed and was verified"
                  + ("" if not ran_suites else "; every participant's role suite passed"),
        "exchange": {"outcome": exchange, "message": result["message"],
                     "unavailable": ({"role": unavailable,
                                      "implementation": cell.participants[unavailable].implementation}
                                     if unavailable in cell.participants else None),
                     "duration_s": result.get("duration_s"), "window": result.get("window"),
                     **({"worker": result.get("worker"), "resources": result.get("resources", {}),
                         "missing_resources": result.get("missing_resources", [])}
                        if "resources" in result else {})},
        "suites": part_suites,
        "blame": blame,
        "identifiers": result.get("identifiers", {}),
        "evidence": f"cells/{cell.id}/index.html",
        "dir": f"cells/{cell.id}",
        "result": result,
    }


def run_matrix(registry: Registry, opts: MatrixOptions) -> dict[str, Any]:
    """Run everything the plan holds; the result document (matrix.json's content)."""

    started = datetime.datetime.now(datetime.UTC)
    plan: Plan = make_plan(registry, opts.suites)
    say = opts.progress or (lambda text: None)
    env = _env()
    run_id = secrets.token_hex(8)  # labels every container of this run (participants.RUN_LABEL)
    opts.out.mkdir(parents=True, exist_ok=True)
    suite_entries: dict[tuple[str, str], RoleEntry] = {}
    if opts.run_suites:
        for cell in plan.cells.values():
            for suite, entry in cell.participants.items():
                suite_entries[(entry.implementation, suite)] = entry
    results: dict[str, dict[str, Any]] = {}
    suites: dict[tuple[str, str], SuiteRun] = {}
    say(f"matrix: {len(plan.cells)} cells in {len(plan.tables)} tables, {len(suite_entries)} role suites, "
        f"{opts.workers} at once; seed {opts.seed}")

    def suite_task(key: tuple[str, str]) -> SuiteRun:
        entry = suite_entries[key]
        run = run_suite(entry, registry, opts.out, opts.out / "suites" / entry.implementation / entry.suite,
                        budget_s=opts.suite_budget_s, check_timeout_s=opts.check_timeout_s, env=env,
                        run_id=run_id)
        say(f"suite {entry.suite} of {entry.implementation}: {run.outcome}: {run.message[:200]}")
        return run

    def cell_task(cell: CellPlan) -> dict[str, Any]:
        result = _run_cell(cell, registry, opts, env, run_id)
        say(f"cell {cell.id}: {result['outcome']}: {result['message'][:200]}")
        return result

    executor = (DaskExecutor(opts.scheduler, run_id, opts.out, progress=say) if opts.scheduler is not None
                else None)
    pool = ThreadPoolExecutor(max_workers=max(1, opts.workers)) if executor is None else None
    submit_suite: Callable[[tuple[str, str]], Future[SuiteRun]]
    submit_cell: Callable[[CellPlan], Future[dict[str, Any]]]
    if pool is not None:
        local = pool
        submit_suite = lambda key: local.submit(suite_task, key)  # noqa: E731
        submit_cell = lambda cell: local.submit(cell_task, cell)  # noqa: E731
    else:
        assert executor is not None
        submit_suite, submit_cell = _on_dask(executor, registry, opts, run_id, suite_entries)
    try:
        extra, isolation = _run_all(plan, registry, opts, suite_entries, submit_suite, submit_cell, results, suites)
    finally:
        if pool is not None:
            pool.shutdown()
        if executor is not None:
            executor.close()
        left = _remove_left(run_id)
    if left:
        say(f"matrix: removed containers left running: {', '.join(left)}")
    every = {**plan.cells, **extra}
    cells = [_cell_entry(every[cid], results[cid], registry, suites, results, isolation, opts.run_suites)
             for cid in [*plan.cells, *extra]]
    doc = _document(registry, plan, cells, suites, opts, started)
    doc["meta"]["run_id"] = run_id
    doc["meta"]["containers_left"] = left
    doc["meta"]["executor"] = ({"kind": "local"} if executor is None else
                               {"kind": "dask", "scheduler": executor.address, "workers": executor.offers()})
    write_matrix(doc, {c["id"]: c["result"] for c in cells}, opts.out)
    return doc


def _on_dask(executor: DaskExecutor, registry: Registry, opts: MatrixOptions, run_id: str,
             suite_entries: dict[tuple[str, str], RoleEntry]
             ) -> tuple[Callable[[tuple[str, str]], Future[SuiteRun]], Callable[[CellPlan], Future[dict[str, Any]]]]:
    """Submitting a suite and a cell as tasks of ``executor``; what did not run to a result is inconclusive."""
    say = opts.progress or (lambda text: None)
    bare = replace(opts, progress=None)  # what is shipped to the workers (the progress callback stays here)

    def submit_suite(key: tuple[str, str]) -> Future[SuiteRun]:
        entry = suite_entries[key]
        rel = f"suites/{entry.implementation}/{entry.suite}"
        remote = executor.submit(f"suite-{entry.implementation}-{entry.suite}",
                                 partial(_suite_at, entry, registry, bare, run_id), rel,
                                 role_resources(entry, suite=True), opts.suite_budget_s + GRACE_S)
        done: Future[SuiteRun] = Future()

        def finished(f: Future[SuiteRun]) -> None:
            try:
                run = f.result()
            except NotRun as exc:
                run = SuiteRun(entry.implementation, entry.suite, "inconclusive", f"the suite did not run: {exc}",
                               target=entry.suite_run.describe())
            say(f"suite {entry.suite} of {entry.implementation}: {run.outcome}: {run.message[:200]}")
            done.set_result(run)

        remote.add_done_callback(finished)
        return done

    def submit_cell(cell: CellPlan) -> Future[dict[str, Any]]:
        need = unite(role_resources(e) for e in cell.participants.values())
        key = f"cell-{cell.id}"
        remote = executor.submit(key, partial(_cell_at, cell, registry, bare, run_id), f"cells/{cell.id}", need,
                                 opts.cell_timeout_s)
        done: Future[dict[str, Any]] = Future()

        def finished(f: Future[dict[str, Any]]) -> None:
            try:
                result, absent = f.result(), []
            except NotRun as exc:
                result = _not_run(cell, opts.out / "cells" / cell.id, f"the cell did not run: {exc}; not a verdict "
                                  "on any participant")
                absent = exc.resources
            result.update(worker=executor.where(key), resources=need, missing_resources=absent)
            say(f"cell {cell.id}: {result['outcome']}: {result['message'][:200]}")
            done.set_result(result)

        remote.add_done_callback(finished)
        return done

    return submit_suite, submit_cell


def _run_all(plan: Plan, registry: Registry, opts: MatrixOptions, suite_entries: dict[tuple[str, str], RoleEntry],
             submit_suite: Callable[[tuple[str, str]], Future[SuiteRun]],
             submit_cell: Callable[[CellPlan], Future[dict[str, Any]]],
             results: dict[str, dict[str, Any]], suites: dict[tuple[str, str], SuiteRun]
             ) -> tuple[dict[str, CellPlan], dict[str, str]]:
    """The suites, the cells and the isolation cells of failed ones, as ``submit_*`` runs them; into ``results``
    and ``suites``; (the isolation cells, failed cell's role -> its isolation cell)."""
    say = opts.progress or (lambda text: None)
    suite_futures: dict[tuple[str, str], Future[SuiteRun]] = {k: submit_suite(k) for k in suite_entries}
    cell_futures = {cid: submit_cell(cell) for cid, cell in plan.cells.items()}
    for cid, future in cell_futures.items():
        results[cid] = future.result()
    # Isolation: each failed cell's non-reference participants, with the reference in every other role.
    isolation: dict[str, str] = {}
    extra: dict[str, CellPlan] = {}
    for cid, result in list(results.items()):
        if result["outcome"] != "fail":
            continue
        cell = plan.cells[cid]
        kind = next(k for k in KINDS if k.name == cell.kind)
        for suite, need in _isolation_needs(cell, registry).items():
            if need is None:
                continue
            iso, _ = combination(registry, kind, need[1], None)
            if iso is None:
                continue
            isolation[f"{suite}@{cid}"] = iso.id
            if iso.id not in results and iso.id not in extra:
                extra[iso.id] = iso
    if extra:
        say(f"matrix: {len(extra)} isolation exchanges for failed cells")
    iso_futures = {cid: submit_cell(cell) for cid, cell in extra.items()}
    for cid, future in iso_futures.items():
        results[cid] = future.result()
    for key, sfuture in suite_futures.items():
        suites[key] = sfuture.result()
    return extra, isolation


def _version() -> str:

    try:
        return version("kvconform")
    except PackageNotFoundError:
        return "unknown"


def _document(registry: Registry, plan: Plan, cells: list[dict[str, Any]], suites: dict[tuple[str, str], SuiteRun],
              opts: MatrixOptions, started: datetime.datetime) -> dict[str, Any]:

    shown = [c for c in cells if not c["isolation"]]
    counts = Counter(c["outcome"] for c in shown)
    tables = []
    for t in plan.tables:
        tables.append({
            "id": t.id, "kind": t.kind.name, "protocol": t.kind.protocol, "title": t.title,
            "rows": {"role": t.kind.rows, "implementations": t.rows},
            "columns": {"role": t.kind.columns, "implementations": t.columns},
            "fixed": t.fixed,
            "cells": [{"row": r, "column": c, "cell": cid} for (r, c), cid in t.cells.items()],
            "not_cells": [{"row": r, "column": c, "why": why} for (r, c), why in t.not_cells.items()],
        })
    impls = [{**impl.as_dict(), "role_entries": {s: e.as_dict() for s, e in impl.roles.items()}}
             for impl in registry.implementations.values()]
    no_role = [{"implementation": impl.name, "roles": sorted(impl.info_roles),
                "notes": {r: str(v.get("notes", "")) for r, v in impl.info_roles.items()}}
               for impl in registry.implementations.values() if impl.info_roles]
    return {
        "format": MATRIX_FORMAT,
        "meta": {
            "registry": {"name": registry.name, "path": str(registry.path), "sha256": registry.sha256,
                         "description": registry.description},
            "command_line": opts.command_line,
            "started": started.isoformat(timespec="seconds"),
            "finished": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
            "seed": opts.seed, "workers": opts.workers, "suites_run": opts.run_suites,
            "suite_budget_s": opts.suite_budget_s, "cell_timeout_s": opts.cell_timeout_s,
            "harness": {"kvconform": _version(), "python": sys.version.split()[0]},
            "host": socket.gethostname(),
        },
        "summary": {"cells": len(shown), "outcomes": {o: counts.get(o, 0) for o in OUTCOMES},
                    "isolation_cells": len(cells) - len(shown), "suites": len(suites),
                    "suite_outcomes": dict(Counter(s.outcome for s in suites.values()))},
        "implementations": impls,
        "no_matrix_role": no_role,
        "skipped_tables": plan.skipped_kinds,
        "tables": tables,
        "cells": [{k: v for k, v in c.items() if k != "result"} for c in cells],
        "suites": [s.as_dict() for s in suites.values()],
    }
