"""Parsed and validated documents, once per content: a YAML file that passed its schema is neither parsed nor
validated again, in this process or a later one, until its bytes or the schema's change.

Every ``kvconform run`` loads the requirement catalogs and a testbed, the same files run after run: parsing them
(libyaml's parser, PyYAML's constructor: about 30 ms) and validating them (jsonschema, its import included: about
0.1 s) cost more than the rest of a start-up's own work. A document that passed is kept as JSON (about 1 ms to
read back) named by the SHA-256 of (what it is, the schema files' bytes, the file's bytes), in
``$KVCONFORM_DOC_CACHE`` (default ``~/.cache/kvconform/documents``; empty: no cache). Only a document that passed
is kept, and only when JSON gives it back unchanged (no dates, no keys other than strings), so an edited file, an
edited schema and an invalid document are always parsed and validated; a folder that cannot be written only costs
the time.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

__all__ = ["CACHE_ENV", "cache_dir", "load"]

CACHE_ENV = "KVCONFORM_DOC_CACHE"


def cache_dir() -> Path | None:
    """$KVCONFORM_DOC_CACHE, else ~/.cache/kvconform/documents; None when off (empty) or without a home."""
    env = os.environ.get(CACHE_ENV)
    if env is not None:
        return Path(env) if env else None
    try:
        return Path.home() / ".cache" / "kvconform" / "documents"
    except RuntimeError:  # no home directory to be found
        return None


def _key(kind: str, schema: Iterable[bytes], raw: bytes) -> str:
    digest = hashlib.sha256(kind.encode() + b"\0")
    for part in (*schema, raw):
        digest.update(len(part).to_bytes(8, "big"))
        digest.update(part)
    return digest.hexdigest()


def load(kind: str, schema: Iterable[bytes], raw: bytes, parse: Callable[[], Any],
         validate: Callable[[Any], None]) -> Any:
    """The document of ``raw``: ``validate(parse())`` (each raises on a problem), or what an earlier one gave.

    ``kind`` names what the document is (a catalog, a testbed); ``schema`` is the bytes of every schema file
    ``validate`` may read.
    """
    folder = cache_dir()
    path = folder / f"{_key(kind, schema, raw)}.json" if folder is not None else None
    if path is not None:
        try:
            return json.loads(path.read_bytes())
        except (OSError, ValueError):
            pass  # not there (or unreadable): parse and validate
    doc = parse()
    validate(doc)
    if path is not None:
        _keep(path, doc)
    return doc


def _keep(path: Path, doc: Any) -> None:
    try:
        text = json.dumps(doc, ensure_ascii=False)
        if json.loads(text) != doc:
            return  # JSON would not give it back as it is
        path.parent.mkdir(parents=True, exist_ok=True)
        partial = path.with_name(f"{path.name}.{os.getpid()}.partial")
        partial.write_text(text, "utf-8")
        os.replace(partial, path)  # whole or not at all, for a concurrent run reading it
    except (OSError, TypeError, ValueError):
        pass  # a cache that cannot be written (or a document JSON cannot hold): the next run parses again
