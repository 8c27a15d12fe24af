"""Test vectors as schema-checked data (Wycheproof-shaped): loading, checking, regenerating.

`kvconform vectors {list,check,generate}` is `main`; the suites iterate cases with `load_vectors(kind)`.
A vector file is `{kind, schema, generator, numberOfTests, notes, testGroups: [{params..., tests: [...]}]}`;
each case has `tcId`, `comment`, `flags`, `result` (valid | invalid | acceptable) and kind-specific fields.
Checkers (case -> None or "expected ..., saw ...") and generators live with their protocol
(`kvconform.<proto>.vectors`, listed in `PROVIDERS`).
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import sys
from collections import Counter
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

__all__ = [
    "PROVIDERS",
    "VECTORS_DIR_ENV",
    "Checker",
    "VectorCase",
    "VectorError",
    "check_files",
    "dump_document",
    "iter_cases",
    "load_vectors",
    "main",
    "make_document",
    "vector_files",
    "vectors_dir",
    "write_generated",
]

# Overrides the packaged vectors folder (the harness's own tests use a temporary copy).
VECTORS_DIR_ENV = "KVCONFORM_VECTORS_DIR"
# Modules exposing CHECKERS: dict[kind, Checker] and generate() -> dict[relative path, document].
PROVIDERS = ("kvconform.tlkv.vectors", "kvconform.kbtp.vectors", "kvconform.kvcs.vectors")
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


def _load_document(path: Path) -> dict[str, Any]:
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
        doc = _load_document(path)
        if doc.get("kind") == kind:
            cases.extend(iter_cases(doc, str(path)))
    if not cases:
        raise VectorError(f"kind {kind!r}: no vector file under {directory or vectors_dir()}")
    return cases


def _checkers() -> dict[str, Checker]:
    registry: dict[str, Checker] = {}
    for name in PROVIDERS:
        registry.update(importlib.import_module(name).CHECKERS)
    return registry


def _validator(schema: dict[str, Any]) -> Any:
    import jsonschema  # lazy: jsonschema costs 0.05-0.1 s of start-up; suites that read vectors never validate them

    return jsonschema.Draft202012Validator(schema)


def _schema_for(path: Path, name: str) -> Path:
    """The schema named by a file: beside it (<dir>/../schema/NAME) first, else the packaged one."""
    local = path.parent.parent / SCHEMA_DIR / name
    return local if local.is_file() else Path(str(resources.files("kvconform.vectors"))) / SCHEMA_DIR / name


def _lint(doc: Mapping[str, Any]) -> list[str]:
    """What the schema cannot say: unique tcIds, numberOfTests, every flag explained in notes."""
    problems: list[str] = []
    seen: Counter[int] = Counter()
    total = 0
    notes = doc.get("notes", {})
    for group in doc.get("testGroups", []):
        for test in group.get("tests", []):
            total += 1
            seen[test["tcId"]] += 1
            problems.extend(f"tcId {test['tcId']}: flag {flag!r} has no entry in notes"
                            for flag in test.get("flags", []) if flag not in notes)
    problems.extend(f"tcId {tc}: used {n} times, expected unique" for tc, n in seen.items() if n > 1)
    if doc.get("numberOfTests") != total:
        problems.append(f"numberOfTests: got {doc.get('numberOfTests')}, expected {total} (the tests listed)")
    return problems


@dataclass
class CheckReport:
    """Outcome of `check_files`: one line per failure, and counts."""

    failures: list[str] = field(default_factory=list)
    files: int = 0
    cases: int = 0
    failed_cases: int = 0

    @property
    def ok(self) -> bool:
        return not self.failures


def check_files(files: Sequence[Path]) -> CheckReport:
    """Validate each file against its schema, lint it, then check every case against the reference."""
    report = CheckReport()
    checkers = _checkers()
    for path in files:
        report.files += 1
        try:
            doc = _load_document(path)
        except VectorError as exc:
            report.failures.append(str(exc))
            continue
        schema_path = _schema_for(path, str(doc.get("schema", "")))
        if not schema_path.is_file():
            report.failures.append(f"{path}: schema: got {doc.get('schema')!r}, no such file ({schema_path})")
            continue
        schema = json.loads(schema_path.read_text(encoding="utf-8"))
        errors = sorted(_validator(schema).iter_errors(doc), key=lambda e: list(e.path))
        if errors:
            report.failures.extend(f"{path}: schema {schema_path.name}: at /{'/'.join(map(str, e.path))}: "
                                   f"{e.message}" for e in errors)
            continue
        lint = _lint(doc)
        if lint:
            report.failures.extend(f"{path}: {problem}" for problem in lint)
            continue
        checker = checkers.get(doc["kind"])
        if checker is None:
            report.failures.append(f"{path}: kind: got {doc['kind']!r}, expected one of {sorted(checkers)}")
            continue
        for case in iter_cases(doc, str(path)):
            report.cases += 1
            try:
                problem = checker(case)
            except Exception as exc:  # a checker crash is a failing case, not a crashed run
                problem = f"checker raised {type(exc).__name__}: {exc}"
            if problem is not None:
                report.failed_cases += 1
                report.failures.append(f"{path}: tcId {case.tc_id} ({case.comment}): result {case.result}: {problem}")
    return report


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


def write_generated(out: Path) -> list[Path]:
    """Regenerate every provider's vector files under `out` (relative paths like tlkv/envelope.json)."""
    written: list[Path] = []
    for name in PROVIDERS:
        documents: dict[str, dict[str, Any]] = importlib.import_module(name).generate()
        for relative, doc in sorted(documents.items()):
            path = out / relative
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(dump_document(doc), encoding="utf-8")
            written.append(path)
    return written


def _cmd_list(args: argparse.Namespace) -> int:
    root = Path(args.dir) if args.dir else vectors_dir()
    for path in vector_files(root):
        doc = _load_document(path)
        cases = list(iter_cases(doc, str(path)))
        results = Counter(c.result for c in cases)
        counts = " ".join(f"{r}={results[r]}" for r in ("valid", "invalid", "acceptable") if results[r])
        print(f"{path.relative_to(root)}  kind={doc.get('kind')}  groups={len(doc.get('testGroups', []))}  "
              f"tests={len(cases)}  {counts}")
    return 0


def _cmd_check(args: argparse.Namespace) -> int:
    files = [Path(f) for f in args.files] or vector_files(Path(args.dir) if args.dir else None)
    if not files:
        print("no vector files to check", file=sys.stderr)
        return 1
    report = check_files(files)
    for line in report.failures:
        print(line)
    print(f"{report.files} files, {report.cases} cases checked: {report.failed_cases} cases failed, "
          f"{len(report.failures)} problems")
    return 0 if report.ok else 1


def _cmd_generate(args: argparse.Namespace) -> int:
    out = Path(args.out) if args.out else vectors_dir()
    for path in write_generated(out):
        print(path)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """`kvconform vectors {list,check,generate}`; argv excludes the word "vectors"."""
    parser = argparse.ArgumentParser(prog="kvconform vectors", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    p_list = sub.add_parser("list", help="each file: kind, groups, tests, counts per result")
    p_list.add_argument("--dir", help="vectors folder (default: the packaged one or $KVCONFORM_VECTORS_DIR)")
    p_check = sub.add_parser("check", help="schema, lint and reference check of every case; exit 1 on failure")
    p_check.add_argument("files", nargs="*", help="vector files (default: every file of the vectors folder)")
    p_check.add_argument("--dir", help="vectors folder when no files are given")
    p_gen = sub.add_parser("generate", help="regenerate the vector files deterministically")
    p_gen.add_argument("--out", help="output folder (default: the vectors folder)")
    args = parser.parse_args(list(sys.argv[1:] if argv is None else argv))
    command: Callable[[argparse.Namespace], int] = {
        "list": _cmd_list, "check": _cmd_check, "generate": _cmd_generate}[args.command]
    try:
        return command(args)
    except VectorError as exc:
        print(exc, file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
