"""The ``kvconform`` command line: run suites, serve reference components, vectors, reports, protocol tools.

``kvconform run`` runs pytest in-process on the suites packaged in ``kvconform.conformance`` with the
kvconform plugin; its exit status is the plugin's (0 iff every gating check passed).
"""

from __future__ import annotations

import argparse
import gc
import importlib
import importlib.util
import json
import os
import shlex
import shutil
import sys
import textwrap
from collections.abc import Callable, Sequence
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

import kvconform.conformance as pkg
from kvconform.argtypes import USAGE_ERROR, OneLineParser, name_values, positive_float, sim_faults
from kvconform.capture import MODES, TOOLS
from kvconform.catalog import CatalogError, load_catalogs
from kvconform.components import COMPONENTS, SUMMARIES, component
from kvconform.targets.registry import ROLES, url_schemes
from kvconform.targets.spec import TargetError, parse_target
from kvconform.targets.testbed import TestbedError, load_testbed
from kvconform.verdicts import GATING_LEVELS, STRICT_LEVELS, TargetUnavailable

__all__ = ["discover_suites", "main", "select_suites"]

_COMMANDS = ("run", "suites", "serve", "vectors", "report")
# What a run writes into --report-dir; all of it is removed first, so an aborted run never leaves an older
# run's report looking like its own.
REPORT_FILES = ("coverage.json", "coverage-primary.json", "coverage.html", "junit.xml", "allure-results", "evidence",
                "pytest.ini", "manifest.sha256", "manifest.sig")


class UsageError(Exception):
    """A command line that cannot be carried out; printed and turned into exit status 2."""


class _VersionAction(argparse.Action):
    """``--version``: the installed version, looked up only when asked (the lookup reads package metadata)."""

    def __init__(self, option_strings: Sequence[str], dest: str = argparse.SUPPRESS,
                 default: str = argparse.SUPPRESS, help: str = "show program's version number and exit") -> None:
        super().__init__(option_strings, dest, nargs=0, default=default, help=help)

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: Any,
                 option_string: str | None = None) -> None:
        print(f"kvconform {_version()}")
        parser.exit()


def _version() -> str:

    try:
        return version("kvconform")
    except PackageNotFoundError:
        return "unknown"


def conformance_dir() -> Path:
    """The installed ``kvconform.conformance`` folder (the checkout's ``conformance/`` in editable mode)."""

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
    # The entry points register kvconform.fixtures.plugin as "kvconform" and kvconform.reports.plugin as
    # "kvconform-reports"; block those names and load the modules explicitly, so each is there exactly once with
    # or without autoloading.
    return ["-p", "no:kvconform", "-p", "kvconform.fixtures.plugin",
            "-p", "no:kvconform-reports", "-p", "kvconform.reports.plugin"]


def _run(args: argparse.Namespace, argv: Sequence[str] = ()) -> int:

    try:
        testbed = load_testbed(args.testbed)
        target = parse_target(args.target, testbed, args.pics_set)
    except (TargetError, TestbedError) as exc:
        raise UsageError(str(exc)) from exc
    if args.kbtp_harness_link:
        if target.kind != "cmd":
            raise UsageError(f"--kbtp-harness-link: the initiator {target.name} is not a cmd: process the harness "
                             "reaches over RoCEv2")
        try:  # imported only here: the wire bindings are no part of the command line's start-up
            importlib.import_module("kvconform.targets.kbtp_wire").harness_link(args.kbtp_harness_link)
        except TargetUnavailable as exc:
            raise UsageError(str(exc)) from exc
    if args.sim_faults and target.kind != "sim":
        raise UsageError(f"--sim-faults: target {target.name} is not on the deterministic transport (sim:...)")
    if target.kind == "sim" and args.n not in (None, "0", "1"):
        # Checks spread over workers by how fast each finishes: no seed fixes that.
        raise UsageError(f"--target {target.name}: a run on the deterministic transport is one process (its seed "
                         f"replays it); drop -n {args.n}")
    root = conformance_dir()
    suites = discover_suites(root)
    chosen, left_out = select_suites(args.suite, list(suites), target.roles, target.name)
    if left_out:
        print(f"kvconform: target {target.name!r} does not play {', '.join(left_out)}; not run",
              file=sys.stderr)
    # only a run with --facing merges paths (reports.facing pulls in the report writers)
    facing: Any = importlib.import_module("kvconform.reports.facing") if args.facing else None
    for url in args.facing:
        if facing.facing_suite(url) not in chosen:
            raise UsageError(f"--facing {url!r}: a facing wire is kbtp+roce:// or kbtp+iwarp:// (kbtp-target) or "
                             f"cmd:... (kbtp-initiator), for a suite this run runs ({', '.join(chosen)})")
    report_dir = _fresh_report_dir(Path(args.report_dir))
    # Opened (and migrated) before the run: a database that cannot be opened is a usage error, not a lost run.
    store = _open_store(args.results_db, report_dir) if args.results_db is not None else None
    # An ini of our own keeps the checkout's pyproject options (testpaths, addopts) out of the run.
    ini = report_dir / "pytest.ini"
    ini.write_text("[pytest]\n", "utf-8")
    pytest_args = [
        *(str(suites[s]) for s in chosen),
        *_plugin_args(),
        "--import-mode=importlib",
        "-p", "no:cacheprovider",
        # No suite uses hypothesis; its plugin would import it (0.2-0.3 s) at every run's end.
        "-p", "no:hypothesispytest",
        # The cli imported kvconform before pytest could mark the plugin's package for rewriting.
        "-W", "ignore::pytest.PytestAssertRewriteWarning",
        "--rootdir", str(root),
        "--confcutdir", str(root),
        "-c", str(ini),
        "--kvconform-target", args.target,
        "--kvconform-report-dir", str(report_dir),
        "--kvconform-junit", str(report_dir / "junit.xml"),
        # The certification report records the command the user typed, so it replays as given.
        "--kvconform-command", shlex.join(["kvconform", *argv]),
        # A failure is one block per requirement in the kvconform summary; its traceback is in its evidence.
        "--tb=no", "-rN",
        "--alluredir", str(report_dir / "allure-results"), "--clean-alluredir",
    ]
    if args.testbed:
        pytest_args += ["--kvconform-testbed", args.testbed]
    if args.strict:
        pytest_args.append("--kvconform-strict")
    pytest_args += ["--kvconform-suite-budget", str(args.suite_budget), "--kvconform-sweep", args.sweep]
    if args.kbtp_wire != "emulated":
        pytest_args += ["--kvconform-kbtp-wire", args.kbtp_wire]
    if args.impair:
        pytest_args += ["--kvconform-impair", args.impair]
    if args.kbtp_harness_link:
        pytest_args += ["--kvconform-kbtp-harness-link", args.kbtp_harness_link]
    if args.sim_faults:
        pytest_args += ["--kvconform-sim-faults", args.sim_faults]
    pytest_args += ["--kvconform-capture", args.capture, "--kvconform-capture-with", args.capture_with]
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

    try:
        code = _run_pytest(pytest_args)
        if args.facing and (report_dir / "coverage.json").is_file():
            code = facing.run_facing(load_catalogs(), report_dir, args.facing, _facing_args(args),
                                     bound_s=args.suite_budget + 600)
        for name in ("coverage.json", "coverage.html", "junit.xml", "allure-results", "evidence",
                     "manifest.sha256"):
            path = report_dir / name
            if path.exists():
                print(f"kvconform: {name}: {path}")
        if store is not None and not _record(store, report_dir):
            code = USAGE_ERROR
    finally:
        if store is not None:
            store.close()
    return code


def _facing_args(args: argparse.Namespace) -> list[str]:
    """The options a facing run shares with the run it completes (its target, PICS, seed and checks are its own)."""
    out = ["--timeout", str(args.timeout), "--suite-budget", str(args.suite_budget), "-q"]
    if args.testbed:
        out += ["--testbed", args.testbed]
    if args.strict:
        out.append("--strict")
    return out


def _open_store(url: str, report_dir: Path) -> Any:
    """The results store ``--results-db`` names (kvconform.store, loaded only when asked for)."""
    store = importlib.import_module("kvconform.store")
    try:
        return store.open_store(url, beside=str(report_dir))
    except (store.StoreURLError, store.StoreError) as exc:
        raise UsageError(str(exc)) from None


def _record(store: Any, report_dir: Path) -> bool:
    """Record the run the report folder holds (a run that wrote no report, a usage error in pytest, has nothing);
    False when the store could not take it (printed: the report stays where it is)."""
    if not (report_dir / "coverage.json").is_file():
        print(f"kvconform: results store: {report_dir} holds no coverage.json; nothing recorded", file=sys.stderr)
        return True
    module = importlib.import_module("kvconform.store")
    try:
        run_id = store.record(module.read_report_dir(report_dir))
    except (module.StoreError, module.ReportError) as exc:
        print(f"kvconform: error: results store: not recorded ({exc}); the report is in {report_dir}",
              file=sys.stderr)
        return False
    print(f"kvconform: recorded as run {run_id} in {store.url.describe()}")
    return True


def _run_pytest(pytest_args: list[str]) -> int:
    """pytest.main, with the garbage collector kept off the start-up's objects.

    A run's start-up builds a few hundred thousand long-lived objects (modules, suites, items) and nothing to
    collect; the collector would walk them all several times over (about 0.3 s: full collections while
    importing, and pytest's own after the checks). So it is off until the checks start, and what exists then is
    frozen out of every later collection (gc.freeze); the checks' garbage is collected as usual.
    """
    import pytest  # lazy: `kvconform serve` and the other commands need no pytest

    enabled = gc.isenabled()

    class StartupFrozen:
        @pytest.hookimpl(tryfirst=True)  # before xdist's controller loop, which ends the hook's call
        def pytest_runtestloop(self) -> None:
            gc.freeze()
            if enabled:
                gc.enable()

    gc.disable()
    try:
        return int(pytest.main(pytest_args, plugins=[StartupFrozen()]))
    finally:
        # An in-process run (the harness's tests) leaves its caller's collector and heap as they were.
        gc.unfreeze()
        if enabled:
            gc.enable()
        else:
            gc.disable()


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


def serve_help() -> str:
    """``kvconform serve --help``: the components, what each is, and how to get its own options."""
    lines = ["usage: kvconform serve <component> [options]", "",
             "Run a reference implementation as a network service on 127.0.0.1 (a target for kvconform run, or a",
             "peer for your own tests). It prints 'listening on HOST:PORT' once it accepts connections and stops",
             "on SIGINT or SIGTERM.", "", "components:"]
    width = max(len(name) for name in COMPONENTS)
    lines += [f"  {name.ljust(width)}  {SUMMARIES.get(name, '')}".rstrip() for name in sorted(COMPONENTS)]
    lines += ["", "kvconform serve <component> --help lists the component's options."]
    return "\n".join(lines)


def _serve(argv: list[str]) -> int:
    if argv and argv[0] in ("-h", "--help"):
        print(serve_help())
        return 0
    if not argv or argv[0] not in COMPONENTS:
        known = ", ".join(sorted(COMPONENTS))
        if argv:
            print(f"kvconform serve: unknown component {argv[0]!r}; components: {known}", file=sys.stderr)
        else:
            print(f"usage: kvconform serve <component> [args...]; components: {known} "
                  "(kvconform serve --help says more)", file=sys.stderr)
        return USAGE_ERROR
    return int(component(argv[0])(argv[1:], None))


# --------------------------------------------------------------------------------------------- suites


def suite_table(root: Path | None = None) -> list[dict[str, Any]]:
    """Per installed suite: its protocol, the role it tests, the catalog's requirement counts for that role and
    the target forms it accepts (targets/registry.py)."""

    catalog = load_catalogs()
    rows = []
    for suite in discover_suites(root):
        proto = suite.split("-", 1)[0]
        role = catalog.role_of_suite(suite)
        reqs = [r for r in catalog.requirements(proto) if role in r.roles] if role else []
        known = ROLES.get(suite)
        forms = known.describe().partition(": ")[2].split(", ") if known else ["reference"]
        if known is not None and known.cmd and known.optional:
            forms = [f + " (may add " + " ".join("{" + p + "}" for p in known.optional) + ")"
                     if f.startswith("cmd:") else f for f in forms]
        rows.append({
            "suite": suite, "protocol": proto, "role": role,
            "requirements": len(reqs),
            "gating": sum(1 for r in reqs if r.level in GATING_LEVELS),
            "strict": sum(1 for r in reqs if r.level in STRICT_LEVELS),
            "may": sum(1 for r in reqs if r.level == "MAY"),
            "untestable": sum(1 for r in reqs if not r.testable),
            "targets": [*forms, "a target name of the testbed"],
        })
    return rows


def _suites(args: argparse.Namespace) -> int:

    try:
        rows = suite_table()
    except CatalogError as exc:
        raise UsageError(str(exc)) from exc
    if args.json:
        print(json.dumps(rows, indent=1))
        return 0
    for row in rows:
        print(f"{row['suite']}  (protocol {row['protocol']}, role {row['role'] or '?'})")
        print(f"    requirements: {row['requirements']} ({row['gating']} MUST/MUST NOT/RULE, {row['strict']} "
              f"SHOULD/SHOULD NOT, {row['may']} MAY; {row['untestable']} untestable)")
        print("    --target " + " | ".join(row["targets"]))
    print("\nkvconform run <suite> --target <target>; 'all' or a protocol name runs several suites.")
    return 0


DEFAULT_SUITE_BUDGET = 900.0  # the plugin's own default (fixtures/plugin.py), without importing pytest here


def _capture_arguments(run: argparse.ArgumentParser) -> None:

    run.add_argument("--capture", choices=MODES, default="failed",
                     help="per-check capture beside the evidence: a pcap of the harness's sockets (tl.kv.v1 TCP, "
                          "QUIC UDP) and, for QUIC, the qlog and the TLS key log that decrypts it; kept for the "
                          "checks that did not pass (failed, the default), for all, or not taken (none)")
    run.add_argument("--capture-with", choices=TOOLS, default="auto",
                     help="tcpdump on loopback, or the harness from its own sockets (a TCP relay, its QUIC "
                          "datagrams); auto: tcpdump when it can capture here (default)")


def target_forms() -> str:
    """The ``--target`` forms (``kvconform run --help``), the URL schemes those of the role table."""
    schemes = textwrap.wrap(f"a running endpoint; SCHEME is one of {', '.join(url_schemes())} (each suite's are "
                            "listed below)", 76)
    return "\n".join([
        "targets (--target):",
        "  reference                  the reference implementation, in-process (the default)",
        "  SCHEME://host:port         " + f"\n{'':29}".join(schemes),
        "  cmd:<template>             a command line the harness spawns, starts and stops; the {placeholders} it",
        "                             carries say which role it plays (quote it for your shell)",
        "  python:<module>:<factory>  an object implementing the role's driver Protocol, or a factory of one",
        "  docker:IMAGE[:TAG]         an image following the container contract (docs/docker-contract.md)",
        "  <name>                     a target the testbed (--testbed) names, with its PICS, roles and parameters",
        ""])


def run_epilog(root: Path | None = None) -> str:
    """``kvconform run --help``'s text after the options: the target forms and every suite with the forms it takes."""
    try:
        suites = list(discover_suites(root))
    except OSError:
        suites = []
    lines = [target_forms(), "suites (and the target forms each takes; `kvconform suites` adds requirement counts):"]
    for suite in suites:
        role = ROLES.get(suite)
        line = role.describe() if role else f"{suite}: reference"
        if role is not None and role.cmd and role.optional:
            line += " (the template may add " + " ".join("{" + p + "}" for p in role.optional) + ")"
        lines.append(f"  {line}")
    if not suites:
        lines.append("  (none installed)")
    protocols = sorted({s.split("-", 1)[0] for s in suites})
    lines += ["", f"SUITE is 'all', a protocol ({', '.join(protocols)}) for its suites, or one suite.",
              "Exit status: 0 iff every gating check passed (MUST, MUST NOT, RULE; SHOULD too with --strict),",
              "1 otherwise, 2 for a usage error.",
              "Reports: coverage.json, coverage.html, junit.xml, allure-results/ and evidence/ in --report-dir;",
              "with --results-db the run is also recorded for kvconform gate (kvconform gate --help)."]
    return "\n".join(lines)


def _parser(help_text: bool = True) -> argparse.ArgumentParser:
    """The parser; without ``help_text`` the run subcommand's epilog (suites, registry) is not built."""
    p = OneLineParser(
        prog="kvconform",
        description="Conformance harness for KV-cache transport protocols.",
        epilog="also: kvconform serve --help, kvconform vectors {list,check,generate} ..., "
               "kvconform matrix --registry FILE (the plugfest matrix), "
               "kvconform worker tcp://HOST:PORT --resources R (a host of kvconform matrix --scheduler), "
               "kvconform gate --baseline B --report-dir DIR (fail CI on what is new), "
               "kvconform history --results-db URL --out DIR (pages of the stored runs), "
               "kvconform <protocol> ... (protocol tools, e.g. kvconform tlkv export)",
    )
    p.add_argument("--version", action=_VersionAction)
    sub = p.add_subparsers(dest="command", metavar="command", parser_class=OneLineParser)
    run = sub.add_parser("run", help="run a conformance suite against a target",
                         description="Run conformance suites against an implementation and report, per requirement,\n"
                                     "what passed, failed, was not applicable or inconclusive.",
                         epilog=run_epilog() if help_text else None,
                         formatter_class=argparse.RawDescriptionHelpFormatter)
    run.add_argument("suite", metavar="SUITE", help="'all', a protocol (e.g. tlkv) or a suite <proto>-<role> "
                                                   "(listed below)")
    run.add_argument("--target", default="reference", metavar="TARGET",
                     help="the implementation under test (default: reference); the forms are listed below")
    run.add_argument("--testbed", default=None, metavar="FILE",
                     help="testbed YAML: named targets with their PICS (declared capabilities, validated against "
                          "testbeds/schema/), and the defaults URL, cmd: and python: targets take (default: the "
                          "packaged testbeds/loopback.yaml)")
    run.add_argument("--report-dir", default=os.path.join("out", "reports"), metavar="DIR",
                     help="where the reports go (default out/reports); an earlier run's reports there are removed "
                          "first")
    run.add_argument("--strict", action="store_true", help="SHOULD-level checks gate the exit status")
    run.add_argument("-n", default=None, metavar="N|auto", help="pytest-xdist workers")
    run.add_argument("--seed", type=int, default=None, metavar="S",
                     help="session seed: every random choice of every check derives from it (default: random; "
                          "printed and recorded in the reports, so --seed S replays a run)")
    run.add_argument("-k", default=None, metavar="EXPR", help="run only the checks whose names match (pytest -k)")
    run.add_argument("--pics-set", action="append", default=[], metavar="KEY=VALUE",
                     help="declare one PICS value for this run at a dotted KEY, with a YAML VALUE, e.g. "
                          "'tlkv.decode.versions=[1, 2]' (checked against the testbed schema; repeatable)")
    run.add_argument("--timeout", type=positive_float, default=300.0, metavar="SECONDS",
                     help="bound on each check, fixtures included: a check that runs into it fails, the target "
                          "hung (default 300); must be > 0")
    run.add_argument("--suite-budget", type=positive_float, default=DEFAULT_SUITE_BUDGET, metavar="SECONDS",
                     help="bound on each suite's checks per worker: the checks left when it is spent end "
                          f"inconclusive (default {DEFAULT_SUITE_BUDGET:g})")
    run.add_argument("--sweep", choices=("boundary", "wide"), default="boundary",
                     help="geometries each suite sweeps: boundary (default: the values where wrong implementations "
                          "differ) or wide (more besides, within --suite-budget); docs/boundaries.md lists them")
    run.add_argument("--kbtp-wire", choices=("emulated", "iwarp", "roce"), default="emulated",
                     help="in-process KBTP targets and initiators (reference, python:) over the emulated fabric "
                          "(default) or that wire format on loopback sockets; kbtp+iwarp:// and kbtp+roce:// "
                          "targets always use their own")
    run.add_argument("--kbtp-harness-link", default=None, metavar="ether=LOCAL,PEER&address=IP",
                     help="with a cmd: KBTP initiator on a RoCEv2 segment of its own (a VM's rxe reached through "
                          "a qemu socket netdev): the link the harness's target sends and receives its frames on, "
                          "the query of kbtp+roce:// (docs/interop-rdma.md)")
    run.add_argument("--impair", type=name_values, default=None, metavar="SPEC",
                     help="impair the harness's KBTP wire links in both directions, seeded and replayable: "
                          "loss=0.01,reorder=0.01,dup=0.01,delay=5ms,seed=S (also split=P, hold=, rto=); RoCEv2 "
                          "datagrams are lost, reordered, duplicated, delayed; an iWARP TCP stream is delayed, "
                          "stalled (what TCP makes of loss) and re-segmented (docs/kbtp-wire.md)")
    run.add_argument("--sim-faults", type=sim_faults, default=None, metavar="SPEC",
                     help="with a sim: target, faults its simulated network adds to the seeded schedule: "
                          "loss=0.01,dup=0.01,jitter=3,delay=1,interleave=1 (jitter: up to K ms more per datagram, "
                          "so datagrams reorder; interleave: streams of one priority leave in a seeded order)")
    run.add_argument("--facing", action="append", default=[], metavar="URL",
                     help="a userspace wire facing the same device (repeatable): the checks the run through verbs "
                          "left inconclusive because the device hides them (wire attacks, an initiator's one-sided "
                          "operations) run again over it, and one report certifies both paths, each check naming "
                          "the path that judged it; kbtp+roce:// or kbtp+iwarp:// (a target served on the device) "
                          "for kbtp-target, cmd:... (an initiator on the device) for kbtp-initiator")
    _capture_arguments(run)
    run.add_argument("--results-db", nargs="?", const="", default=None, metavar="URL",
                     help="record the run in the results store (kvconform gate reads it): sqlite:///PATH, "
                          "postgresql://..., a file path, or nothing for results.sqlite beside --report-dir")
    run.add_argument("-q", "--quiet", action="count", default=0)
    run.add_argument("-v", "--verbose", action="count", default=0)
    suites = sub.add_parser("suites", help="list the suites, the role each tests, its requirements and the targets "
                                           "it takes")
    suites.add_argument("--json", action="store_true", help="print them as JSON")
    sub.add_parser("serve", help="run a reference component as a network service", add_help=False)
    sub.add_parser("vectors", help="list, check or generate test vectors", add_help=False)
    report = sub.add_parser("report", help="report writers")
    rsub = report.add_subparsers(dest="report_kind", metavar="kind", required=True)
    html = rsub.add_parser("html", help="regenerate coverage.html from coverage.json")
    html.add_argument("--from", dest="source", required=True, metavar="COVERAGE_JSON")
    html.add_argument("--out", required=True, metavar="HTML")
    html.add_argument("--all-protocols", action="store_true")
    sign = rsub.add_parser("sign", help="sign a report folder's SHA-256 manifest (Ed25519 or ECDSA P-256 key)")
    sign.add_argument("--report-dir", required=True, metavar="DIR")
    sign.add_argument("--key", required=True, metavar="KEY.pem", help="unencrypted PEM private key")
    verify = rsub.add_parser("verify", help="check a report folder against its manifest and signature")
    verify.add_argument("--report-dir", required=True, metavar="DIR")
    verify.add_argument("--pub", default=None, metavar="PUB.pem",
                        help="the signer's PEM public key (without it, a signature is checked against the key it "
                             "carries: integrity, not who signed)")
    facing = rsub.add_parser("facing", help="one certification from a run through verbs and the runs of the wires "
                                            "facing the same device (each check says which path judged it)")
    facing.add_argument("--primary", required=True, metavar="DIR", help="the report folder of the run through verbs")
    facing.add_argument("--primary-name", default=None, metavar="NAME",
                        help="how the report names that path (default: its target, e.g. verbs:rxe0)")
    facing.add_argument("--facing", action="append", default=[], metavar="NAME=DIR", required=True,
                        help="a facing wire's name (its URL) and its run's report folder (repeatable); a folder "
                             "without a coverage.json is a wire that could not be reached")
    facing.add_argument("--suite", action="append", default=None, metavar="SUITE",
                        help="certify only these suites' checks (one role), e.g. kbtp-target")
    facing.add_argument("--out", required=True, metavar="DIR", help="where the merged coverage.json and .html go")
    keygen = rsub.add_parser("keygen", help="write a new signing key and its public key (KEY.pem.pub.pem)")
    keygen.add_argument("--key", required=True, metavar="KEY.pem")
    keygen.add_argument("--algorithm", choices=("ed25519", "p256"), default="ed25519")
    return p


# The commands that are whole tools of their own, each loaded only when named: command -> its module.
_SUBTOOLS: dict[str, str] = {
    "vectors": "kvconform.vectortool",
    "fuzz": "kvconform.fuzz.tool",
    "matrix": "kvconform.matrix.tool",  # the plugfest matrix
    "gate": "kvconform.gate.tool",  # judge a run against a baseline
    "history": "kvconform.history.tool",  # the results store as pages
    "worker": "kvconform.matrix.worker",  # a Dask worker of the distributed matrix
}


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``kvconform`` console script."""
    args_list = list(sys.argv[1:] if argv is None else argv)
    try:
        if args_list and args_list[0] == "serve":
            return _serve(args_list[1:])
        if args_list and args_list[0] in _SUBTOOLS:
            return _dispatch(_SUBTOOLS[args_list[0]], "main", args_list[1:], args_list[0])
        if args_list and not args_list[0].startswith("-") and args_list[0] not in _COMMANDS:
            proto = args_list[0]
            if proto.isidentifier():
                return _dispatch(f"kvconform.{proto}.tool", "main", args_list[1:], proto)
        # Building run's help lists the suites and imports the registry: only for --help (runs are spawned often).
        parser = _parser(help_text=any(a in ("-h", "--help") for a in args_list))
        try:
            args: Any = parser.parse_args(args_list)
        except SystemExit as exc:  # --help, or a usage error argparse has printed (one line)
            return exc.code if isinstance(exc.code, int) else USAGE_ERROR
        if args.command == "run":
            return _run(args, args_list)
        if args.command == "report":  # its writers (and signing's cryptography) load only when asked for
            report: Callable[[argparse.Namespace], int] = importlib.import_module("kvconform.reports.tool").main
            return report(args)
        if args.command == "suites":
            return _suites(args)
        parser.print_help()
        return USAGE_ERROR
    except UsageError as exc:
        print(f"kvconform: error: {exc}", file=sys.stderr)
        return USAGE_ERROR


if __name__ == "__main__":
    sys.exit(main())
