"""The ``kvconform`` command line: run suites, serve reference components, vectors, reports, protocol tools.

``kvconform run`` runs pytest in-process on the suites packaged in ``kvconform.conformance`` with the
kvconform plugin; its exit status is the plugin's (0 iff every gating check passed).
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import os
import shutil
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from kvconform.argtypes import USAGE_ERROR, OneLineParser, positive_float

__all__ = ["discover_suites", "main", "select_suites"]

_COMMANDS = ("run", "serve", "vectors", "report")
# What a run writes into --report-dir; all of it is removed first, so an aborted run never leaves an older
# run's report looking like its own.
REPORT_FILES = ("coverage.json", "coverage.html", "junit.xml", "allure-results", "evidence", "pytest.ini")


class UsageError(Exception):
    """A command line that cannot be carried out; printed and turned into exit status 2."""


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("kvconform")
    except PackageNotFoundError:
        return "unknown"


def conformance_dir() -> Path:
    """The installed ``kvconform.conformance`` folder (the checkout's ``conformance/`` in editable mode)."""
    import kvconform.conformance as pkg

    return Path(next(iter(pkg.__path__)))


def discover_suites(root: Path | None = None) -> dict[str, Path]:
    """Suite name ``<proto>-<role>`` -> folder ``<root>/<proto>/<role>`` holding ``test_*.py``."""
    root = root or conformance_dir()
    suites: dict[str, Path] = {}
    for proto in sorted(p for p in root.iterdir() if p.is_dir() and p.name != "requirements"):
        for role in sorted(r for r in proto.iterdir() if r.is_dir()):
            if any(role.rglob("test_*.py")):
                suites[f"{proto.name}-{role.name}"] = role
    return suites


def select_suites(name: str, available: Sequence[str], roles: set[str] | None,
                  target_name: str) -> tuple[list[str], list[str]]:
    """The suites ``name`` selects that the target plays, and those left out because it does not."""
    if name == "all":
        wanted = list(available)
    elif name in available:
        if roles is not None and name not in roles:
            raise UsageError(f"target {target_name!r} does not play suite {name!r}; "
                             f"it plays: {', '.join(sorted(roles)) or 'none'}")
        return [name], []
    else:
        wanted = [s for s in available if s.split("-", 1)[0] == name]
        if not wanted:
            raise UsageError(f"unknown suite {name!r}: expected 'all', a protocol or one of: "
                             f"{', '.join(available) or '(no suites installed)'}")
    chosen = [s for s in wanted if roles is None or s in roles]
    left_out = [s for s in wanted if s not in chosen]
    if not chosen:
        raise UsageError(f"target {target_name!r} plays none of the suites {', '.join(wanted)}; "
                         f"it plays: {', '.join(sorted(roles or ())) or 'none'}")
    return chosen, left_out


# ----------------------------------------------------------------------------------------------- run


def _plugin_args() -> list[str]:
    # The entry point registers kvconform.fixtures.plugin as "kvconform"; block that name and load the
    # module explicitly, so the plugin is there exactly once with or without autoloading.
    return ["-p", "no:kvconform", "-p", "kvconform.fixtures.plugin"]


def _run(args: argparse.Namespace) -> int:
    from kvconform.targets.spec import TargetError, parse_target
    from kvconform.targets.testbed import TestbedError, load_testbed

    try:
        testbed = load_testbed(args.testbed)
        target = parse_target(args.target, testbed, args.pics_set)
    except (TargetError, TestbedError) as exc:
        raise UsageError(str(exc)) from exc
    root = conformance_dir()
    suites = discover_suites(root)
    chosen, left_out = select_suites(args.suite, list(suites), target.roles, target.name)
    if left_out:
        print(f"kvconform: target {target.name!r} does not play {', '.join(left_out)}; not run",
              file=sys.stderr)
    report_dir = _fresh_report_dir(Path(args.report_dir))
    # An ini of our own keeps the checkout's pyproject options (testpaths, addopts) out of the run.
    ini = report_dir / "pytest.ini"
    ini.write_text("[pytest]\n", "utf-8")
    pytest_args = [
        *(str(suites[s]) for s in chosen),
        *_plugin_args(),
        "--import-mode=importlib",
        "-p", "no:cacheprovider",
        # The cli imported kvconform before pytest could mark the plugin's package for rewriting.
        "-W", "ignore::pytest.PytestAssertRewriteWarning",
        "--rootdir", str(root),
        "--confcutdir", str(root),
        "-c", str(ini),
        "--kvconform-target", args.target,
        "--kvconform-report-dir", str(report_dir),
        "--junitxml", str(report_dir / "junit.xml"),
        "--alluredir", str(report_dir / "allure-results"), "--clean-alluredir",
    ]
    if args.testbed:
        pytest_args += ["--kvconform-testbed", args.testbed]
    if args.strict:
        pytest_args.append("--kvconform-strict")
    pytest_args += ["--kvconform-suite-budget", str(args.suite_budget)]
    if args.seed is not None:
        pytest_args += ["--kvconform-seed", str(args.seed)]
    if args.n is not None:
        pytest_args += ["-n", args.n]
    if args.k:
        pytest_args += ["-k", args.k]
    for override in args.pics_set:
        pytest_args += ["--kvconform-pics-set", override]
    # A hung target must not hang the run: each check gets a bound (pytest-timeout), and ends as a failure.
    pytest_args += ["--timeout", str(args.timeout)]
    pytest_args += ["-q"] * args.quiet + ["-v"] * args.verbose

    import pytest

    code = int(pytest.main(pytest_args))
    for name in ("coverage.json", "coverage.html", "junit.xml", "allure-results", "evidence"):
        path = report_dir / name
        if path.exists():
            print(f"kvconform: {name}: {path}")
    return code


def _fresh_report_dir(report_dir: Path) -> Path:
    """Create ``report_dir`` (writable, or a UsageError naming it) and remove an earlier run's report from it."""
    try:
        report_dir.mkdir(parents=True, exist_ok=True)
        probe = report_dir / ".kvconform-write-test"
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as exc:
        raise UsageError(f"--report-dir {report_dir}: cannot write there: {exc.strerror or exc}") from None
    for name in REPORT_FILES:
        path = report_dir / name
        try:
            if path.is_dir() and not path.is_symlink():
                shutil.rmtree(path)
            elif path.exists() or path.is_symlink():
                path.unlink()
        except OSError as exc:
            raise UsageError(f"--report-dir {report_dir}: cannot remove the earlier {name}: "
                             f"{exc.strerror or exc}") from None
    return report_dir


# --------------------------------------------------------------------------------------------- report


def _report_html(args: argparse.Namespace) -> int:
    from kvconform.reports.coverage import load_coverage
    from kvconform.reports.html import write_html

    try:
        doc = load_coverage(args.source)
    except (OSError, ValueError) as exc:
        raise UsageError(f"--from {args.source}: {exc}") from exc
    if args.all_protocols:
        from kvconform.catalog import load_catalogs
        from kvconform.reports.coverage import TestResult, build_coverage

        results = [TestResult.from_dict(t) for t in doc.get("tests", [])]
        doc = build_coverage(load_catalogs(), results, doc.get("meta", {}), all_protocols=True,
                             report_dir=doc.get("meta", {}).get("report_dir"))
    out = write_html(doc, args.out, Path(args.source).parent)
    print(f"kvconform: coverage.html: {out}")
    return 0


# ------------------------------------------------------------------------------------------- dispatch


def _dispatch(module: str, attr: str, argv: list[str], what: str) -> int:
    try:
        found = importlib.util.find_spec(module) is not None
    except ModuleNotFoundError:
        found = False
    if not found:
        print(f"kvconform: {what}: module {module} is not installed", file=sys.stderr)
        return USAGE_ERROR
    mod = importlib.import_module(module)
    func: Callable[[list[str]], int] = getattr(mod, attr)
    return int(func(argv))


def _serve(argv: list[str]) -> int:
    try:
        found = importlib.util.find_spec("kvconform.components") is not None
    except ModuleNotFoundError:
        found = False
    components: dict[str, Callable[[list[str]], int]] = {}
    if found:
        components = importlib.import_module("kvconform.components").COMPONENTS
    if not argv or argv[0] in ("-h", "--help") or argv[0] not in components:
        known = ", ".join(sorted(components)) or "none installed"
        if argv and argv[0] not in ("-h", "--help"):
            print(f"kvconform serve: unknown component {argv[0]!r}; components: {known}", file=sys.stderr)
        else:
            print(f"usage: kvconform serve <component> [args...]; components: {known}", file=sys.stderr)
        return USAGE_ERROR
    return int(components[argv[0]](argv[1:]))


DEFAULT_SUITE_BUDGET = 900.0  # the plugin's own default (fixtures/plugin.py), without importing pytest here


def _parser() -> argparse.ArgumentParser:
    p = OneLineParser(
        prog="kvconform",
        description="Conformance harness for KV-cache transport protocols.",
        epilog="also: kvconform serve <component> ..., kvconform vectors {list,check,generate} ..., "
               "kvconform matrix --registry FILE (the plugfest matrix), "
               "kvconform <protocol> ... (protocol tools, e.g. kvconform tlkv export)",
    )
    p.add_argument("--version", action="version", version=f"kvconform {_version()}")
    sub = p.add_subparsers(dest="command", metavar="command", parser_class=OneLineParser)
    run = sub.add_parser("run", help="run a conformance suite against a target")
    run.add_argument("suite", help="'all', a protocol (e.g. tlkv) or a suite <proto>-<role>")
    run.add_argument("--target", default="reference")
    run.add_argument("--testbed", default=None, metavar="FILE")
    run.add_argument("--report-dir", default=os.path.join("out", "reports"), metavar="DIR")
    run.add_argument("--strict", action="store_true", help="SHOULD-level checks gate the exit status")
    run.add_argument("-n", default=None, metavar="N|auto", help="pytest-xdist workers")
    run.add_argument("--seed", type=int, default=None)
    run.add_argument("-k", default=None, metavar="EXPR")
    run.add_argument("--pics-set", action="append", default=[], metavar="KEY=VALUE")
    run.add_argument("--timeout", type=positive_float, default=300.0, metavar="SECONDS",
                     help="bound on each check, fixtures included (default 300); must be > 0")
    run.add_argument("--suite-budget", type=positive_float, default=DEFAULT_SUITE_BUDGET, metavar="SECONDS",
                     help="bound on each suite's checks per worker: the checks left when it is spent end "
                          f"inconclusive (default {DEFAULT_SUITE_BUDGET:g})")
    run.add_argument("-q", "--quiet", action="count", default=0)
    run.add_argument("-v", "--verbose", action="count", default=0)
    sub.add_parser("serve", help="run a reference component as a network service", add_help=False)
    sub.add_parser("vectors", help="list, check or generate test vectors", add_help=False)
    report = sub.add_parser("report", help="report writers")
    rsub = report.add_subparsers(dest="report_kind", metavar="kind", required=True)
    html = rsub.add_parser("html", help="regenerate coverage.html from coverage.json")
    html.add_argument("--from", dest="source", required=True, metavar="COVERAGE_JSON")
    html.add_argument("--out", required=True, metavar="HTML")
    html.add_argument("--all-protocols", action="store_true")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``kvconform`` console script."""
    args_list = list(sys.argv[1:] if argv is None else argv)
    try:
        if args_list and args_list[0] == "serve":
            return _serve(args_list[1:])
        if args_list and args_list[0] == "vectors":
            return _dispatch("kvconform.testvectors", "main", args_list[1:], "vectors")
        if args_list and args_list[0] == "fuzz":
            return _dispatch("kvconform.fuzz.tool", "main", args_list[1:], "fuzz")
        if args_list and args_list[0] == "matrix":  # issue 14, the plugfest matrix
            return _dispatch("kvconform.matrix.tool", "main", args_list[1:], "matrix")
        if args_list and not args_list[0].startswith("-") and args_list[0] not in _COMMANDS:
            proto = args_list[0]
            if proto.isidentifier():
                return _dispatch(f"kvconform.{proto}.tool", "main", args_list[1:], proto)
        parser = _parser()
        try:
            args: Any = parser.parse_args(args_list)
        except SystemExit as exc:  # --help, or a usage error argparse has printed (one line)
            return exc.code if isinstance(exc.code, int) else USAGE_ERROR
        if args.command == "run":
            return _run(args)
        if args.command == "report":
            return _report_html(args)
        parser.print_help()
        return USAGE_ERROR
    except UsageError as exc:
        print(f"kvconform: error: {exc}", file=sys.stderr)
        return USAGE_ERROR


if __name__ == "__main__":
    sys.exit(main())
