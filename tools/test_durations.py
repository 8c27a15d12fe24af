"""The test command's durations, from the JUnit file a run wrote (`pytest --junitxml FILE`; `.ci/run` writes
out/tests-junit.xml): the slowest tests, and the per-module durations the test session schedules by.

    python tools/test_durations.py slowest out/tests-junit.xml [-n 10]   # the N slowest tests, slowest first
    python tools/test_durations.py update out/tests-junit.xml            # rewrite tests/durations.json

tests/durations.json holds, for each test module, the longest of its tests and their sum (seconds, setup and
teardown included, as JUnit counts them); tests/conftest.py starts the modules whose longest test is longest first,
so no long test starts near the end of a run. Regenerate it from a whole run of the test command after tests move
or change much (a module it does not list runs after those it does, in collection order).
"""

from __future__ import annotations

import argparse
import json
import sys
import xml.etree.ElementTree as ET
from collections.abc import Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DURATIONS = ROOT / "tests" / "durations.json"


def read_junit(path: Path) -> list[tuple[str, float]]:
    """(nodeid, seconds) of every test case the JUnit file records (skipped ones included)."""
    out = []
    for case in ET.parse(path).getroot().iter("testcase"):
        classname, name = case.get("classname", ""), case.get("name", "")
        parts = classname.split(".")
        # pytest writes classname "tests.kvcs.test_x" (or "...test_x.Class"): the module is the longest prefix
        # that is a file
        for cut in range(len(parts), 0, -1):
            module = Path(*parts[:cut]).with_suffix(".py")
            if (ROOT / module).is_file():
                nodeid = "::".join([module.as_posix(), *parts[cut:], name])
                break
        else:
            nodeid = f"{classname}::{name}"
        out.append((nodeid, float(case.get("time", "0"))))
    return out


def by_module(cases: Sequence[tuple[str, float]]) -> dict[str, dict[str, float]]:
    modules: dict[str, dict[str, float]] = {}
    for nodeid, seconds in cases:
        entry = modules.setdefault(nodeid.split("::", 1)[0], {"longest": 0.0, "total": 0.0})
        entry["longest"] = round(max(entry["longest"], seconds), 1)
        entry["total"] = round(entry["total"] + seconds, 1)
    return dict(sorted(modules.items()))


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("command", choices=("slowest", "update"))
    parser.add_argument("junit", type=Path)
    parser.add_argument("-n", type=int, default=10, help="how many tests `slowest` prints (default 10)")
    args = parser.parse_args(argv)
    if not args.junit.is_file():
        print(f"{args.junit}: no such file", file=sys.stderr)
        return 2
    cases = read_junit(args.junit)
    if args.command == "slowest":
        print(f"the {args.n} slowest of {len(cases)} tests (setup and teardown included):")
        for nodeid, seconds in sorted(cases, key=lambda c: -c[1])[: args.n]:
            print(f"{seconds:8.1f} s  {nodeid}")
        return 0
    modules = {m: d for m, d in by_module(cases).items() if m.startswith("tests/")}  # what the test command collects
    DURATIONS.write_text(json.dumps(modules, indent=1) + "\n")
    print(f"{DURATIONS.relative_to(ROOT)}: {len(modules)} modules, {len(cases)} tests")
    return 0


if __name__ == "__main__":
    sys.exit(main())
