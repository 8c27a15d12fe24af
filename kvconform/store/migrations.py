"""The store's schema as ordered migrations: step N is the SQL that takes a database from version N-1 to N, and
``schema_version`` records each step applied. A step is never edited once released; a change is a new step.

Values kept as JSON (PICS, catalogs, suites, requirement ids) are TEXT, so one schema fits both dialects; the
words the dialects spell differently are ``{serial_key}`` and ``{bigint}`` (backend.Backend.ddl).
"""

from __future__ import annotations

from datetime import UTC, datetime

from kvconform.store.backend import Backend, BackendError

__all__ = ["MIGRATIONS", "SchemaTooNew", "migrate", "schema_version"]

MIGRATIONS: tuple[tuple[str, ...], ...] = (
    # 1: runs and their checks
    (
        """CREATE TABLE runs (
            id {serial_key},
            recorded TEXT NOT NULL,
            report_dir TEXT NOT NULL,
            coverage_sha256 TEXT NOT NULL UNIQUE,
            implementation TEXT NOT NULL,
            implementation_version TEXT,
            implementation_vendor TEXT,
            implementation_build TEXT,
            image_digest TEXT,
            target_name TEXT NOT NULL,
            target_kind TEXT NOT NULL,
            target_value TEXT NOT NULL,
            harness_version TEXT NOT NULL,
            harness_commit TEXT NOT NULL,
            testbed_name TEXT,
            testbed_sha256 TEXT,
            catalogs TEXT NOT NULL,
            pics TEXT NOT NULL,
            seed {bigint} NOT NULL,
            binding TEXT,
            draft TEXT,
            suites TEXT NOT NULL,
            strict INTEGER NOT NULL,
            exit_code INTEGER,
            started TEXT NOT NULL,
            finished TEXT NOT NULL,
            identity_key TEXT NOT NULL
        )""",
        """CREATE TABLE checks (
            run_id {bigint} NOT NULL REFERENCES runs (id) ON DELETE CASCADE,
            nodeid TEXT NOT NULL,
            suite TEXT,
            reqs TEXT NOT NULL,
            level TEXT,
            verdict TEXT NOT NULL,
            message TEXT NOT NULL,
            evidence TEXT,
            blamed TEXT,
            reached TEXT,
            duration DOUBLE PRECISION NOT NULL,
            PRIMARY KEY (run_id, nodeid)
        )""",
    ),
    # 2: the look-ups gate and history make: a run's siblings (same identity and inputs), a check across runs
    (
        "CREATE INDEX runs_identity ON runs (identity_key, id)",
        "CREATE INDEX checks_nodeid ON checks (nodeid, run_id)",
    ),
    # 3: the runs one `kvconform matrix` recorded share its folder
    (
        "ALTER TABLE runs ADD COLUMN matrix_dir TEXT",
    ),
)


class SchemaTooNew(BackendError):
    """The database was migrated by a newer kvconform than this one."""


def _ensure_version_table(db: Backend) -> None:
    db.execute("CREATE TABLE IF NOT EXISTS schema_version (version INTEGER PRIMARY KEY, applied TEXT NOT NULL)")


def schema_version(db: Backend) -> int:
    """The highest migration applied (0: an empty database)."""
    _ensure_version_table(db)
    rows = db.execute("SELECT MAX(version) FROM schema_version")
    return int(rows[0][0] or 0)


def migrate(db: Backend) -> list[int]:
    """Apply every migration the database lacks, each in its own transaction; the versions applied (none when it
    was current: migrating twice is harmless). The version table is made under the same lock, so two processes
    opening a new database at once do not both create it."""
    applied: list[int] = []
    for version, steps in enumerate(MIGRATIONS, 1):
        with db.transaction(exclusive=True):
            # read under the lock: another process may have applied this step meanwhile
            current = schema_version(db)
            if current > len(MIGRATIONS):
                raise SchemaTooNew(f"the results database has schema version {current}; this kvconform knows "
                                   f"up to {len(MIGRATIONS)}: upgrade kvconform")
            if current >= version:
                continue
            for sql in steps:
                db.execute(sql.format(**db.ddl))
            db.execute("INSERT INTO schema_version (version, applied) VALUES (?, ?)",
                       (version, datetime.now(UTC).isoformat(timespec="seconds")))
            applied.append(version)
    return applied
