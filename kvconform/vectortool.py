"""``kvconform vectors {list,check,generate}``: every vector file checked against its schema, linted, and each case
checked against the reference (the protocols' checkers); the files regenerated from the protocols' generators."""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from types import ModuleType
from typing import Any

import jsonschema

from kvconform.kbtp import vectors as kbtp_vectors
from kvconform.kvcs import vectors as kvcs_vectors
from kvconform.testvectors import (
    SCHEMA_DIR,
    Checker,
    VectorError,
    dump_document,
    iter_cases,
    load_document,
    vector_files,
    vectors_dir,
)
from kvconform.tlkv import vectors as tlkv_vectors

__all__ = ["PROVIDERS", "CheckReport", "check_files", "main", "write_generated"]

# Each exposes CHECKERS: dict[kind, Checker] and generate() -> dict[relative path, document].
PROVIDERS: tuple[ModuleType, ...] = (tlkv_vectors, kbtp_vectors, kvcs_vectors)


def _checkers() -> dict[str, Checker]:
    registry: dict[str, Checker] = {}
    for provider in PROVIDERS:
        registry.update(provider.CHECKERS)
    return registry


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
            doc = load_document(path)
        except VectorError as exc:
            report.failures.append(str(exc))
            continue
        schema_path = _schema_for(path, str(doc.get("schema", "")))
        if not schema_path.is_file():
            report.failures.append(f"{path}: schema: got {doc.get('schema')!r}, no such file ({schema_path})")
            continue
        schema = json.loads(schema_path.read_text(encoding="utf-8"))
        errors = sorted(jsonschema.Draft202012Validator(schema).iter_errors(doc), key=lambda e: list(e.path))
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


def write_generated(out: Path) -> list[Path]:
    """Regenerate every provider's vector files under `out` (relative paths like tlkv/envelope.json)."""
    written: list[Path] = []
    for provider in PROVIDERS:
        documents: dict[str, dict[str, Any]] = provider.generate()
        for relative, doc in sorted(documents.items()):
            path = out / relative
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(dump_document(doc), encoding="utf-8")
            written.append(path)
    return written


def _cmd_list(args: argparse.Namespace) -> int:
    root = Path(args.dir) if args.dir else vectors_dir()
    for path in vector_files(root):
        doc = load_document(path)
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
