"""``--results-db`` URLs: ``sqlite:///path``, ``postgresql://...`` (``postgres://`` too), a bare path (a SQLite
file), or nothing: the default file beside the reports."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

__all__ = ["DEFAULT_FILE", "StoreURL", "StoreURLError", "parse_store_url"]

DEFAULT_FILE = "results.sqlite"  # beside the report folder: out/reports -> out/results.sqlite
_POSTGRES_SCHEMES = ("postgresql", "postgres")


class StoreURLError(ValueError):
    """A ``--results-db`` value that names no database kvconform can open; the message says what was expected."""


@dataclass(frozen=True)
class StoreURL:
    """Which backend and where: ``path`` for SQLite, ``dsn`` (the URL as given) for PostgreSQL."""

    backend: str  # "sqlite" | "postgresql"
    path: Path | None = None
    dsn: str | None = None

    def describe(self) -> str:
        """The URL for messages, without a password."""
        if self.backend == "sqlite":
            return f"sqlite:///{self.path}"
        parts = urlsplit(self.dsn or "")
        netloc = parts.netloc.rpartition("@")[2]
        user = parts.username
        return f"{parts.scheme}://{user + '@' if user else ''}{netloc}{parts.path}"


def parse_store_url(text: str | None, beside: str | os.PathLike[str] | None = None) -> StoreURL:
    """The database ``text`` names; empty or None: ``results.sqlite`` in the folder holding ``beside`` (the report
    folder), so successive runs into sibling report folders share one history."""
    if not text:
        if beside is None:
            raise StoreURLError("--results-db: no URL given and no report folder to put the default database beside")
        return StoreURL("sqlite", path=Path(beside).resolve().parent / DEFAULT_FILE)
    scheme, sep, rest = text.partition("://")
    if not sep:
        return StoreURL("sqlite", path=Path(text))
    if scheme == "sqlite":
        # sqlite:///relative/or/absolute like SQLAlchemy: three slashes then the path; four for an absolute one
        if not rest.startswith("/") or rest == "/":
            raise StoreURLError(f"--results-db {text!r}: expected sqlite:///PATH (three slashes, then the file)")
        return StoreURL("sqlite", path=Path(rest[1:]))
    if scheme in _POSTGRES_SCHEMES:
        return StoreURL("postgresql", dsn=text)
    raise StoreURLError(f"--results-db {text!r}: unknown scheme {scheme!r}; expected sqlite:///PATH, "
                        "postgresql://... or a file path")
