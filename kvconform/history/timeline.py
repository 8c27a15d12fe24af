"""The stored runs as history: grouped by identity (the store's identity key: the same implementation and
inputs), each group's requirement × run table and its flaky checks.

A requirement's verdict in a run is the one the certification report gives it (reports.coverage): the worst of
its checks' verdicts for it by the blame rule, "not-reached" when every check citing it left it unasserted. A
check that cites no requirement (a matrix cell) is a row of its own, under its check id. A cell *changed* when its
verdict differs from the same row's in the run before it (a row absent from a run shows as "—"). Flaky is the
gate's definition (gate.classify.flaky_checks): a check whose verdict differs across the stored runs of one
identity.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property

from kvconform.gate.classify import flaky_checks
from kvconform.reports.coverage import worst_verdict
from kvconform.results import NOT_REACHED
from kvconform.store import ResultsStore, RunRecord

__all__ = ["History", "Timeline", "load_history", "requirement_verdicts"]

SLUG = 12  # hex digits of the identity key in a page name: stable, and unique in any store a person keeps


def requirement_verdicts(run: RunRecord) -> dict[str, str]:
    """Requirement id (or check id, for a check citing none) -> the run's verdict for it."""
    found: dict[str, list[str]] = {}
    for check in run.checks:
        if not check.reqs:
            found.setdefault(check.nodeid, []).append(check.verdict)
            continue
        result = check.result()
        for rid in check.reqs:
            found.setdefault(rid, []).append(result.verdict_for(rid))
    return {row: worst_verdict(v for v in verdicts if v != NOT_REACHED) or NOT_REACHED
            for row, verdicts in sorted(found.items())}


@dataclass(frozen=True)
class Timeline:
    """One identity's stored runs, oldest first, with its requirement × run table and its flaky checks."""

    key: str
    runs: tuple[RunRecord, ...]
    rows: dict[str, tuple[str | None, ...]]  # row -> verdict per run (None: not in that run); changed rows first
    flaky: dict[str, list[tuple[int, str]]]  # check id -> [(run id, verdict), ...]

    @property
    def slug(self) -> str:
        return self.key[:SLUG]

    @property
    def latest(self) -> RunRecord:
        return self.runs[-1]

    @cached_property
    def _before(self) -> dict[int | None, int | None]:
        return {run.run_id: (self.runs[i - 1].run_id if i else None) for i, run in enumerate(self.runs)}

    def previous(self, run_id: int) -> int | None:
        """The id of the run of this identity before ``run_id``."""
        return self._before[run_id]

    @staticmethod
    def changed(verdicts: Sequence[str | None], at: int) -> bool:
        """Whether the verdict in run ``at`` differs from the one in the run before it."""
        return at > 0 and verdicts[at] != verdicts[at - 1]

    def changed_rows(self) -> list[str]:
        return [row for row, verdicts in self.rows.items()
                if any(self.changed(verdicts, i) for i in range(len(verdicts)))]


@dataclass(frozen=True)
class History:
    """Every stored run, by identity; identities ordered by their newest run, newest first."""

    timelines: tuple[Timeline, ...]

    @cached_property
    def runs(self) -> list[RunRecord]:
        """Every run, oldest first."""
        return sorted((r for t in self.timelines for r in t.runs), key=lambda r: r.run_id or 0)

    @cached_property
    def _by_key(self) -> dict[str, Timeline]:
        return {t.key: t for t in self.timelines}

    def timeline_of(self, run: RunRecord) -> Timeline:
        return self._by_key[run.identity_key]


def _timeline(store: ResultsStore, key: str, runs: list[RunRecord]) -> Timeline:
    per_run = [requirement_verdicts(r) for r in runs]
    names = sorted({row for verdicts in per_run for row in verdicts})
    rows = {row: tuple(v.get(row) for v in per_run) for row in names}
    moving = [row for row in names if len(set(rows[row])) > 1]
    ordered = {row: rows[row] for row in [*moving, *(n for n in names if n not in moving)]}
    return Timeline(key=key, runs=tuple(runs), rows=ordered, flaky=flaky_checks(store.history(key)))


def load_history(store: ResultsStore) -> History:
    """The store's runs as history."""
    groups: dict[str, list[RunRecord]] = {}
    for run_id in store.run_ids():
        run = store.run(run_id)
        if run is not None:
            groups.setdefault(run.identity_key, []).append(run)
    timelines = [_timeline(store, key, runs) for key, runs in groups.items()]
    timelines.sort(key=lambda t: -(t.latest.run_id or 0))
    return History(tuple(timelines))
