"""Test vectors as schema-checked data (Wycheproof-shaped): loading, checking, regenerating.

The suites iterate cases with `load_vectors(kind)`; `kvconform vectors {list,check,generate}` is
`kvconform.vectortool`.
A vector file is `{kind, schema, generator, numberOfTests, notes, testGroups: [{params..., tests: [...]}]}`;
each case has `tcId`, `comment`, `flags`, `result` (valid | invalid | acceptable) and kind-specific fields.
Checkers (case -> None or "expected ..., saw ...") and generators live with their protocol
(`kvconform.<proto>.vectors`, listed in `kvconform.vectortool.PROVIDERS`).
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

__all__ = [
    "SCHEMA_DIR",
    "VECTORS_DIR_ENV",
    "Checker",
    "VectorCase",
    "VectorError",
    "dump_document",
    "iter_cases",
    "load_document",
    "load_vectors",
    "make_document",
    "vector_files",
    "vectors_dir",
]

# Overrides the packaged vectors folder (the harness's own tests use a temporary copy).
VECTORS_DIR_ENV = "KVCONFORM_VECTORS_DIR"
SCHEMA_DIR = "schema"
_CASE_KEYS = ("tcId", "comment", "flags", "result")

Checker = Callable[["VectorCase"], str | None]


class VectorError(ValueError):
    """A vector file cannot be loaded: names the file and what is wrong."""


@dataclass(frozen=True)
class VectorCase:
    """One test case with its group's parameters (`group`) and its own fields (`fields`)."""

    file: str
    kind: str
    tc_id: int
    comment: str
    flags: tuple[str, ...]
    result: str
    group: Mapping[str, Any] = field(default_factory=dict)
    fields: Mapping[str, Any] = field(default_factory=dict)

    @property
    def tcId(self) -> int:  # the Wycheproof spelling
        return self.tc_id

    @property
    def id(self) -> str:
        """A short stable id for pytest parametrization: "<file name>#<tcId>"."""
        return f"{Path(self.file).name}#{self.tc_id}"

    def __getitem__(self, key: str) -> Any:
        """A case field, else a group parameter."""
        if key in self.fields:
            return self.fields[key]
        return self.group[key]


def vectors_dir() -> Path:
    """The vectors folder: $KVCONFORM_VECTORS_DIR, else the packaged `kvconform.vectors`."""
    override = os.environ.get(VECTORS_DIR_ENV)
    if override:
        return Path(override)
    return Path(str(resources.files("kvconform.vectors")))


def vector_files(directory: Path | None = None) -> list[Path]:
    """Every vector file under `directory` (schemas excluded), sorted."""
    root = directory or vectors_dir()
    return sorted(p for p in root.rglob("*.json") if SCHEMA_DIR not in p.relative_to(root).parts[:-1])


def load_document(path: Path) -> dict[str, Any]:
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as exc:
        raise VectorError(f"{path}: cannot load: {exc}") from exc
    if not isinstance(doc, dict):
        raise VectorError(f"{path}: top level: got {type(doc).__name__}, expected an object")
    return doc


def iter_cases(doc: Mapping[str, Any], file: str) -> Iterator[VectorCase]:
    """The cases of one loaded document, each with its group's parameters."""
    for group in doc.get("testGroups", []):
        params = {k: v for k, v in group.items() if k != "tests"}
        for test in group.get("tests", []):
            yield VectorCase(
                file=file, kind=str(doc.get("kind")), tc_id=int(test["tcId"]), comment=str(test["comment"]),
                flags=tuple(test.get("flags", ())), result=str(test["result"]), group=params,
                fields={k: v for k, v in test.items() if k not in _CASE_KEYS},
            )


def load_vectors(kind: str, directory: Path | None = None) -> list[VectorCase]:
    """Every case of `kind` in the vectors folder, in file then tcId order."""
    cases: list[VectorCase] = []
    for path in vector_files(directory):
        doc = load_document(path)
        if doc.get("kind") == kind:
            cases.extend(iter_cases(doc, str(path)))
    if not cases:
        raise VectorError(f"kind {kind!r}: no vector file under {directory or vectors_dir()}")
    return cases


def dump_document(doc: Mapping[str, Any]) -> str:
    """The canonical text of a vector file (stable: regenerating gives identical bytes)."""
    return json.dumps(doc, indent=2, ensure_ascii=False) + "\n"


def make_document(kind: str, notes: Mapping[str, str], groups: list[dict[str, Any]], *, schema: str,
                  generator: str, source: str) -> dict[str, Any]:
    """A Wycheproof-shaped file: tcIds numbered 1.. in order, notes kept for the flags used (each must have one)."""
    tc = 0
    used: set[str] = set()
    for group in groups:
        for test in group["tests"]:
            tc += 1
            test["tcId"] = tc
            used.update(test["flags"])
    missing = used - notes.keys()
    if missing:
        raise AssertionError(f"{kind}: flags without a note: {sorted(missing)}")
    return {"kind": kind, "schema": schema, "generator": generator, "source": source, "numberOfTests": tc,
            "notes": {k: notes[k] for k in sorted(used)}, "testGroups": groups}
