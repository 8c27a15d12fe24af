"""The results store: migrations from empty and again, URLs, and a real run's report folder recorded and read back
on each backend (PostgreSQL on a throwaway cluster where Debian's server is installed)."""

from __future__ import annotations

import dataclasses
import json
import shutil
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from kvconform.store import ResultsStore, RunRecord, StoreURLError, open_store, parse_store_url, read_report_dir
from kvconform.store.backend import connect
from kvconform.store.migrations import MIGRATIONS, SchemaTooNew, migrate, schema_version
from kvconform.store.record import MOQT_DRAFT, ReportError
from tests.mutants.runner import SEED
from tests.report_runs import ReportRun


def test_migrations_apply_from_empty_and_are_idempotent(store_url: str) -> None:
    url = parse_store_url(store_url)
    db = connect(url)
    try:
        assert schema_version(db) == 0
        assert migrate(db) == list(range(1, len(MIGRATIONS) + 1))
        assert migrate(db) == []
        assert schema_version(db) == len(MIGRATIONS)
        assert db.execute("SELECT COUNT(*) FROM runs") == [(0,)]
    finally:
        db.close()
    with open_store(store_url) as store:  # opening migrates: nothing left to do
        assert schema_version(store.db) == len(MIGRATIONS)


def test_two_processes_opening_a_new_database_at_once_migrate_it_once(store_url: str) -> None:
    start = threading.Barrier(2, timeout=30)
    versions: list[list[int]] = []

    def open_and_migrate() -> None:
        db = connect(parse_store_url(store_url))
        try:
            start.wait()
            versions.append(migrate(db))
        finally:
            db.close()

    with ThreadPoolExecutor(2) as pool:
        for future in [pool.submit(open_and_migrate) for _ in range(2)]:
            future.result(timeout=60)
    # each step applied by exactly one of them, the other seeing it done under the lock
    assert sorted(v for applied in versions for v in applied) == list(range(1, len(MIGRATIONS) + 1))


def test_a_database_from_a_newer_kvconform_is_refused(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'r.sqlite'}"
    with open_store(url) as store:
        store.db.execute("INSERT INTO schema_version (version, applied) VALUES (?, ?)", (len(MIGRATIONS) + 1, "x"))
    with pytest.raises(SchemaTooNew, match=f"schema version {len(MIGRATIONS) + 1}.*upgrade kvconform"):
        open_store(url)


def _stored(store: ResultsStore, run: RunRecord) -> RunRecord:
    run_id = store.record(run)
    back = store.run(run_id)
    assert back is not None
    assert back.run_id == run_id and back.recorded
    return back


def test_a_real_run_round_trips(store: ResultsStore, reference: ReportRun) -> None:
    run = read_report_dir(reference.report_dir)
    back = _stored(store, run)
    assert dataclasses.replace(back, run_id=None, recorded=None) == run
    assert store.record(run) == back.run_id  # the same report folder is recorded once
    assert store.run_ids(run.identity_key) == [back.run_id]
    assert store.history(run.identity_key) == {c.nodeid: [(back.run_id, c.verdict)] for c in run.checks}


def test_a_run_records_identity_inputs_and_every_check(reference: ReportRun) -> None:
    run = read_report_dir(reference.report_dir)
    identity = reference.doc["identity"]
    assert (run.implementation, run.implementation_version) == ("kvconform reference implementations", "0.1.0")
    assert run.harness_version == identity["harness"]["version"]
    assert run.harness_commit == identity["harness"]["commit"]
    assert run.testbed_sha256 == identity["testbed"]["sha256"] and run.testbed_sha256
    assert run.catalogs == {"tlkv.yaml": identity["specs"][0]["catalog"]["sha256"]}
    assert run.pics["tlkv.reader.versions"] == [1, 2]
    assert run.seed == int(SEED) and run.suites == ("tlkv-reader",)
    assert (run.binding, run.draft, run.image_digest) == (None, None, None)  # a TLKV run: neither applies
    assert len(run.checks) == len(reference.doc["tests"]) > 0
    for check, test in zip(run.checks, sorted(reference.doc["tests"], key=lambda t: t["nodeid"]), strict=True):
        assert (check.nodeid, check.verdict, check.message, check.evidence) == (
            test["nodeid"], test["verdict"], test["message"], test["evidence"])
        assert check.evidence is None or (reference.report_dir / check.evidence).is_file()


def _edited(source: Path, dest: Path, edit: dict[str, object]) -> Path:
    shutil.copytree(source, dest)
    doc = json.loads((dest / "coverage.json").read_text())
    for path, value in edit.items():
        *parents, last = path.split(".")
        node = doc
        for part in parents:
            node = node[part]
        node[last] = value
    (dest / "coverage.json").write_text(json.dumps(doc))
    return dest


def test_binding_draft_and_image_digest_come_from_the_run(reference: ReportRun, tmp_path: Path,
                                                          store: ResultsStore) -> None:
    kbtp = read_report_dir(_edited(reference.report_dir, tmp_path / "kbtp", {
        "identity.run.suites": ["kbtp-target"],
        "identity.pics.values": [{"path": "kbtp.target.binding", "value": "ib-rc", "defaulted": False,
                                  "overridden": False}],
        "meta.command_line": ["kvconform", "--kvconform-kbtp-wire", "roce"]}))
    assert (kbtp.binding, kbtp.draft) == ("ib-rc over roce", None)
    kvcs = read_report_dir(_edited(reference.report_dir, tmp_path / "kvcs", {
        "identity.run.suites": ["kvcs-relay"],
        "meta.target": {"value": "docker:vendor/relay@sha256:" + "ab" * 32}}))
    assert (kvcs.binding, kvcs.draft, kvcs.image_digest) == (None, MOQT_DRAFT, "sha256:" + "ab" * 32)
    assert kvcs.identity_key != read_report_dir(reference.report_dir).identity_key
    for run in (kbtp, kvcs):  # and the store keeps them, on each backend
        assert dataclasses.replace(_stored(store, run), run_id=None, recorded=None) == run


def test_a_folder_without_a_report_is_named(tmp_path: Path) -> None:
    with pytest.raises(ReportError, match=r"coverage\.json: cannot read"):
        read_report_dir(tmp_path)
    (tmp_path / "coverage.json").write_text("{}")
    with pytest.raises(ReportError, match="field 'identity' is missing"):
        read_report_dir(tmp_path)


def test_store_urls(tmp_path: Path) -> None:
    assert parse_store_url("sqlite:///out/r.sqlite").path == Path("out/r.sqlite")
    assert parse_store_url("sqlite:////abs/r.sqlite").path == Path("/abs/r.sqlite")
    assert parse_store_url("plain/file.db").path == Path("plain/file.db")
    beside = parse_store_url("", beside=tmp_path / "reports")
    assert beside.path == tmp_path.resolve() / "results.sqlite"
    pg = parse_store_url("postgresql://ci:secret@db.example:5432/kv")
    assert pg.backend == "postgresql" and pg.describe() == "postgresql://ci@db.example:5432/kv"
    with pytest.raises(StoreURLError, match="unknown scheme 'mysql'"):
        parse_store_url("mysql://x/y")
    with pytest.raises(StoreURLError, match="three slashes"):
        parse_store_url("sqlite://r.sqlite")
