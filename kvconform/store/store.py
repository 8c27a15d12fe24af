"""The results store: record a run, read one back, and the history ``kvconform gate`` asks for (how a check came
out across the stored runs of the same identity and inputs)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import fields
from datetime import UTC, datetime
from typing import Any

from kvconform.store.backend import Backend, BackendError, connect
from kvconform.store.migrations import migrate
from kvconform.store.record import CheckRecord, RunRecord
from kvconform.store.url import StoreURL, parse_store_url

__all__ = ["ResultsStore", "StoreError", "open_store"]

StoreError = BackendError  # what a caller catches: the database could not be opened, migrated or written

_JSON_FIELDS = ("catalogs", "pics", "suites")
_RUN_COLUMNS = (*(f.name for f in fields(RunRecord) if f.name not in ("checks", "run_id", "recorded")),
                "identity_key")
_CHECK_COLUMNS = tuple(f.name for f in fields(CheckRecord))


def _encode(name: str, value: Any) -> Any:
    if name == "reached" and value is None:
        return None
    if name in _JSON_FIELDS or name in ("reqs", "reached"):
        return json.dumps(list(value) if isinstance(value, tuple) else value, sort_keys=True)
    if name == "strict":
        return int(value)
    return value


class ResultsStore:
    """Recorded runs in one database (SQLite or PostgreSQL), migrated to the current schema when opened."""

    def __init__(self, db: Backend, url: StoreURL) -> None:
        self.db = db
        self.url = url

    def close(self) -> None:
        self.db.close()

    def __enter__(self) -> ResultsStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def record(self, run: RunRecord) -> int:
        """Store a run and its checks; its id. A report folder recorded before (the same coverage.json) is not
        stored twice: its first id is returned."""
        with self.db.transaction(exclusive=True):
            found = self.db.execute("SELECT id FROM runs WHERE coverage_sha256 = ?", (run.coverage_sha256,))
            if found:
                return int(found[0][0])
            values = [_encode(c, getattr(run, c)) for c in _RUN_COLUMNS]
            rows = self.db.execute(
                f"INSERT INTO runs (recorded, {', '.join(_RUN_COLUMNS)}) "
                f"VALUES (?, {', '.join('?' for _ in _RUN_COLUMNS)}) RETURNING id",
                (datetime.now(UTC).isoformat(timespec="seconds"), *values))
            run_id = int(rows[0][0])
            for check in run.checks:
                self.db.execute(
                    f"INSERT INTO checks (run_id, {', '.join(_CHECK_COLUMNS)}) "
                    f"VALUES (?, {', '.join('?' for _ in _CHECK_COLUMNS)})",
                    (run_id, *(_encode(c, getattr(check, c)) for c in _CHECK_COLUMNS)))
        return run_id

    def run(self, run_id: int) -> RunRecord | None:
        """The stored run, checks and all; None when there is no such id."""
        rows = self.db.execute(f"SELECT id, recorded, {', '.join(_RUN_COLUMNS)} FROM runs WHERE id = ?",
                               (run_id,))
        if not rows:
            return None
        row = dict(zip(("run_id", "recorded", *_RUN_COLUMNS), rows[0], strict=True))
        row.pop("identity_key")
        for name in _JSON_FIELDS:
            row[name] = json.loads(row[name])
        row["suites"] = tuple(row["suites"])
        row["strict"] = bool(row["strict"])
        checks = self.db.execute(f"SELECT {', '.join(_CHECK_COLUMNS)} FROM checks WHERE run_id = ? ORDER BY nodeid",
                                 (run_id,))
        records = []
        for check in checks:
            values = dict(zip(_CHECK_COLUMNS, check, strict=True))
            values["reqs"] = tuple(json.loads(values["reqs"]))
            values["reached"] = None if values["reached"] is None else tuple(json.loads(values["reached"]))
            records.append(CheckRecord(**values))
        return RunRecord(**row, checks=tuple(records))

    def run_ids(self, identity_key: str | None = None) -> list[int]:
        """Stored run ids, oldest first; only those of one identity key when given."""
        if identity_key is None:
            rows = self.db.execute("SELECT id FROM runs ORDER BY id")
        else:
            rows = self.db.execute("SELECT id FROM runs WHERE identity_key = ? ORDER BY id", (identity_key,))
        return [int(r[0]) for r in rows]

    def id_of(self, coverage_sha256: str) -> int | None:
        """The id of the run recorded from this coverage.json, if it was."""
        rows = self.db.execute("SELECT id FROM runs WHERE coverage_sha256 = ?", (coverage_sha256,))
        return int(rows[0][0]) if rows else None

    def history(self, identity_key: str, exclude: Sequence[int] = ()) -> dict[str, list[tuple[int, str]]]:
        """Check id -> [(run id, verdict), ...] over the stored runs of one identity key, oldest first."""
        rows = self.db.execute(
            "SELECT c.nodeid, r.id, c.verdict FROM checks c JOIN runs r ON r.id = c.run_id "
            "WHERE r.identity_key = ? ORDER BY r.id", (identity_key,))
        out: dict[str, list[tuple[int, str]]] = {}
        for nodeid, run_id, verdict in rows:
            if int(run_id) not in exclude:
                out.setdefault(str(nodeid), []).append((int(run_id), str(verdict)))
        return out


def open_store(url: str | StoreURL | None, beside: str | None = None) -> ResultsStore:
    """Open (creating and migrating as needed) the store a ``--results-db`` value names; StoreURLError for a value
    that names no database, StoreError for one that cannot be opened."""
    parsed = url if isinstance(url, StoreURL) else parse_store_url(url, beside)
    db = connect(parsed)
    try:
        migrate(db)
    except BaseException:
        db.close()
        raise
    return ResultsStore(db, parsed)

