"""Fixtures of the store's tests: a store on each backend (PostgreSQL only where Debian's server is installed)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from kvconform.store import ResultsStore, open_store
from tests.store.postgres import find_bin, throwaway_cluster


@pytest.fixture(scope="session")
def postgres_server() -> Iterator[str]:
    """The URL of a throwaway PostgreSQL cluster, one per test session (worker)."""
    bin_dir = find_bin()
    if bin_dir is None:
        pytest.skip("no PostgreSQL server: Debian's postgresql (initdb, pg_ctl under /usr/lib/postgresql/*/bin) is "
                    "not installed (.ci/run installs it)")
    pytest.importorskip("psycopg", reason="psycopg is not installed (the test extra has it)")
    with throwaway_cluster(bin_dir) as url:
        yield url


@pytest.fixture
def postgres_url(postgres_server: str) -> Iterator[str]:
    """A fresh, empty database on the throwaway cluster for one test."""
    import psycopg  # optional: only the PostgreSQL tests need it, and they skip without it

    name = f"t{uuid.uuid4().hex[:16]}"
    with psycopg.connect(postgres_server, autocommit=True) as conn:
        conn.execute(f"CREATE DATABASE {name}")
    yield postgres_server.replace("/postgres?", f"/{name}?")
    with psycopg.connect(postgres_server, autocommit=True) as conn:
        conn.execute(f"DROP DATABASE {name} WITH (FORCE)")


@pytest.fixture(params=["sqlite", "postgresql"])
def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """The URL of an empty store on each backend."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'results.sqlite'}"
    url: str = request.getfixturevalue("postgres_url")
    return url


@pytest.fixture
def store(store_url: str) -> Iterator[ResultsStore]:
    with open_store(store_url) as opened:
        yield opened
