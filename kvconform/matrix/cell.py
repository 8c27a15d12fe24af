"""One cell of the matrix, run in a worker process of its own: ``python -m kvconform.matrix.cell REQUEST.json``.

The request (written by the runner) names the cell, its participants (registry role entries), its seed and
its folder. The worker runs the cell's end-to-end exchange (``kvconform.matrix.kvcs``, ``.tlkv``, ``.kbtp``)
with the harness's own drivers and writes, into the cell's folder, ``result.json`` (the exchange's outcome,
its steps, what was exchanged, the fresh identifiers and ports it used), one log per participant and
``transcript.json`` (the evidence the drivers recorded). A worker of its own per cell keeps the drivers'
evidence per cell, gives every cell its own event loops and lets a cell that hangs be stopped whole.

What the outcome says (the verdict policy, applied to a whole exchange):

- ``pass``: the exchange completed and what arrived was verified against what was sent;
- ``fail``: a participant broke it (crashed, exited, hung past a bound, refused, delivered or reported the
  wrong content); ``suspects`` names the roles the evidence points at, for the runner to judge by isolation;
- ``inconclusive``: a participant could not be started or reached before anything was exchanged
  (``unavailable`` names it; an ``image:`` one that declares it does not play its role, exit 127 with
  ``kvconform-unsupported``, is one), or the harness itself failed ("harness error", traceback kept).
"""

from __future__ import annotations

import importlib
import json
import sys
import time
import traceback
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from kvconform import evidence
from kvconform.matrix.context import Broken, CellContext, Participant, Unavailable, Unobservable
from kvconform.matrix.participants import declared_unsupported, remove_containers
from kvconform.verdicts import INCONCLUSIVE_PREFIX, Inconclusive

__all__ = ["main", "run_cell"]

RESULT_FILE = "result.json"
TRANSCRIPT_FILE = "transcript.json"


EXCHANGES: dict[str, str] = {
    "kvcs": "kvconform.matrix.kvcs:run",
    "tlkv-transfer": "kvconform.matrix.tlkv:run_transfer",
    "tlkv-envelope": "kvconform.matrix.tlkv:run_envelope",
    "kbtp": "kvconform.matrix.kbtp:run",
}


def _exchange(kind: str) -> Callable[[CellContext], None]:

    module, _, attr = EXCHANGES[kind].partition(":")
    func: Callable[[CellContext], None] = getattr(importlib.import_module(module), attr)
    return func


def _process_logs(ctx: CellContext, transcript: evidence.Transcript) -> None:
    """The drivers' process records (prefill, decode, writer, reader, initiator) into the participants' logs."""
    kinds = {"prefill side process": "tlkv-prefill", "decode side process": "tlkv-decode",
             "writer process": "tlkv-writer", "reader process": "tlkv-reader", "initiator process": "kbtp-initiator"}
    for event in transcript.as_list():
        suite = kinds.get(event["kind"])
        if suite in ctx.participants:
            ctx.log_process(suite, event["kind"], event["fields"])


def _inconclusive_reason(exc: BaseException) -> str | None:
    """The reason when ``exc`` is ``kvconform.verdicts.inconclusive``'s (pytest's skip where pytest is imported,
    else ``Inconclusive``): a driver ending what it does inconclusive, e.g. under the container contract an image
    that declares it does not play its role."""
    if isinstance(exc, Inconclusive):
        return str(exc)
    skip = getattr(sys.modules.get("pytest"), "skip", None)
    if skip is not None and isinstance(exc, skip.Exception):
        return str(getattr(exc, "msg", exc)).removeprefix(INCONCLUSIVE_PREFIX)
    return None


def run_cell(request: dict[str, Any]) -> dict[str, Any]:
    """Run one cell as the request describes; the result document (also written to the cell's folder)."""
    folder = Path(request["dir"])
    folder.mkdir(parents=True, exist_ok=True)
    participants = {suite: Participant.from_request(suite, data) for suite, data in request["participants"].items()}
    ctx = CellContext(request["id"], folder, int(request["seed"]), participants, Path(request["registry_dir"]),
                      float(request.get("budget_s", 30.0)), str(request.get("run", "")))
    transcript = evidence.Transcript()
    evidence.activate(transcript)
    outcome, message, suspects, unavailable, trace = "pass", "", [], None, None
    try:
        _exchange(request["kind"])(ctx)
        message = "the exchange completed and was verified"
    except Unavailable as exc:
        outcome, message, unavailable = "inconclusive", f"{exc.suite} could not be started or reached: {exc}", exc.suite
    except Unobservable as exc:
        outcome, message = "inconclusive", f"the exchange cannot be verified: {exc}"
    except Broken as exc:
        outcome, message, suspects = "fail", str(exc), exc.suspects
    except BaseException as exc:
        reason = _inconclusive_reason(exc)
        if reason is not None:
            # an image: participant that said it does not play its role (nothing of it was tested), or a
            # driver that could not observe what it needed
            declared = declared_unsupported(participants)
            unavailable = declared[0] if declared is not None else None
            outcome = "inconclusive"
            message = (f"{unavailable} could not be started or reached: {declared[1]}" if declared is not None
                       else f"a driver ended the exchange inconclusive: {reason}")
        elif isinstance(exc, Exception):  # kvconform's own failure is never a verdict on a participant
            outcome, message = "inconclusive", f"harness error: {type(exc).__name__}: {exc}"
            trace = traceback.format_exc()
        else:
            raise
    finally:
        evidence.activate(None)
        with_docker = [p for p in participants.values() if p.run.in_docker]
        if with_docker:
            try:
                left = remove_containers(ctx.run, ctx.id)
            except Exception as exc:  # cleanup is best effort; docker_template labelled them for reaping
                left = [f"cleanup failed: {exc!r}"]
            if left:
                ctx.step("containers left running were removed", containers=left)
    _process_logs(ctx, transcript)
    logs: dict[str, str] = {}
    for suite, p in participants.items():
        name = f"{suite}.{p.implementation}.log"
        sections = ctx.logs.get(suite) or [f"==== {p.run.describe()}\n(in-process: no output of its own; its "
                                            "actions are the cell's steps)\n" if p.run.kind in ("reference", "python")
                                            else "==== no output was collected\n"]
        (folder / name).write_text("".join(sections), "utf-8")
        logs[suite] = name
    evidence.write_evidence(folder / TRANSCRIPT_FILE, {"cell": ctx.id, "events": transcript.as_list()})
    doc = {"id": ctx.id, "kind": request["kind"], "outcome": outcome, "message": message, "suspects": suspects,
           "unavailable": unavailable, "steps": ctx.steps, "exchanged": ctx.exchanged,
           "identifiers": ctx.identifiers, "logs": logs, "transcript": TRANSCRIPT_FILE,
           "duration_s": round(time.monotonic() - ctx.started, 3), "traceback": trace}
    (folder / RESULT_FILE).write_text(json.dumps(doc, indent=1, default=str) + "\n", "utf-8")
    return doc


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m kvconform.matrix.cell REQUEST.json``: run the cell; exit 0 once its result is written."""
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) != 1:
        print("usage: python -m kvconform.matrix.cell REQUEST.json", file=sys.stderr)
        return 2
    request = json.loads(Path(args[0]).read_text("utf-8"))
    doc = run_cell(request)
    print(f"cell {doc['id']}: {doc['outcome']}: {doc['message'][:500]}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
