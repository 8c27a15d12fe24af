"""The kvconform plugin leaves a pytest session that does not use it alone, and works in a vendor's project.

The entry point is loaded into every pytest session of an environment with kvconform installed. A session
that uses none of it must import no lane (numpy, grpc, aioquic, ...), see no option of its own overwritten,
and keep its exit status and output. How long such a session takes with and without the plugin is measured by
``bench/bench_plugin_overhead.py`` (a ratio on a shared machine belongs in a benchmark, not in a gate); here the
cause of the cost, the modules imported, is asserted.
"""

from __future__ import annotations

import importlib
import json
import re
import sys
import textwrap
from pathlib import Path

import pytest

from kvconform.catalog import CATALOG_DIR_ENV as CATALOG_ENV_OF_CATALOG
from kvconform.fixtures import plugin
from kvconform.fixtures.plugin import CATALOG_DIR_ENV, LANE_OPTIONS, MARKERS, OPTIONS, PROTOCOL_FIXTURE_MODULES

pytest_plugins = ["pytester"]

# Writes the modules the session imported, at its very end, so what collection or reporting imported counts.
RECORDER = """\
import json, sys
import pytest

@pytest.hookimpl(trylast=True)
def pytest_unconfigure(config):
    with open("modules.json", "w") as f:
        json.dump(sorted(sys.modules), f)
"""

PLAIN = """\
import pytest

def add(a, b):
    return a + b

def test_adds():
    assert add(1, 2) == 3

@pytest.mark.parametrize("n", [1, 2])
def test_param(n):
    assert n > 0

def test_fails():
    assert add(1, 1) == 3
"""

# Where a lane's (or the library's) cost would come from.
HEAVY = ("numpy", "grpc", "aioquic", "scapy", "yaml", "jsonschema", "cryptography", "ml_dtypes", "cbor2")
# The entry points and the light modules they import (pytest and the standard library below them).
PLUGIN_ITSELF = {"kvconform", "kvconform.fixtures", "kvconform.fixtures.plugin", "kvconform.fixtures.collect",
                 "kvconform.fixtures.hooks", "kvconform.fixtures.state", "kvconform.fixtures.controller",
                 "kvconform.results", "kvconform.verdicts", "kvconform.reports", "kvconform.reports.plugin"}


def _normalised(text: str) -> list[str]:
    """Output lines without what differs between any two runs (timings, the list of loaded plugins)."""
    out = []
    for line in text.splitlines():
        if line.startswith(("plugins:", "rootdir:", "platform ")):
            continue
        out.append(re.sub(r" in [0-9.]+s", " in Ns", line))
    return out


def _modules(pytester: pytest.Pytester, *args: str) -> tuple[pytest.RunResult, set[str]]:
    result = pytester.runpytest_subprocess(*args, timeout=120)
    return result, set(json.loads((pytester.path / "modules.json").read_text()))


def test_an_unrelated_session_imports_no_lane_and_is_unchanged(pytester: pytest.Pytester) -> None:
    pytester.makeconftest(RECORDER)
    pytester.makepyfile(test_plain=PLAIN)
    without, base = _modules(pytester, "-p", "no:kvconform", "-p", "no:kvconform-reports")
    loaded, mods = _modules(pytester)
    assert "kvconform.fixtures.plugin" in mods, "the entry point was not loaded: the comparison shows nothing"
    assert "kvconform.fixtures.plugin" not in base
    extra = mods - base
    ours = {m for m in extra if m.split(".")[0] == "kvconform"}
    assert ours == PLUGIN_ITSELF, f"an unrelated session imported kvconform modules {sorted(ours - PLUGIN_ITSELF)}"
    heavy = sorted(m for m in extra if m.split(".")[0] in HEAVY)
    assert not heavy, f"an unrelated session imported {heavy[:10]}"
    third_party = sorted(m for m in extra if m.split(".")[0] not in sys.stdlib_module_names and m not in ours)
    assert not third_party, f"the plugin imported {third_party[:10]}"
    assert loaded.ret == without.ret == pytest.ExitCode.TESTS_FAILED
    assert _normalised(loaded.stdout.str()) == _normalised(without.stdout.str())
    assert "kvconform" not in "\n".join(_normalised(loaded.stdout.str()))
    loaded.assert_outcomes(passed=3, failed=1)


def test_a_collect_only_session_is_unchanged_too(pytester: pytest.Pytester) -> None:
    pytester.makeconftest(RECORDER)
    pytester.makepyfile(test_plain=PLAIN)
    without, base = _modules(pytester, "--co", "-q", "-p", "no:kvconform", "-p", "no:kvconform-reports")
    loaded, mods = _modules(pytester, "--co", "-q")
    assert {m for m in mods - base if m.startswith("kvconform")} == PLUGIN_ITSELF
    assert loaded.ret == without.ret == pytest.ExitCode.OK
    assert _normalised(loaded.stdout.str()) == _normalised(without.stdout.str())


def test_options_of_another_plugin_keep_their_values(pytester: pytest.Pytester) -> None:
    # A vendor plugin with options named like ours once were (pytest-embedded has --target): their values and
    # defaults are theirs, and ours still work beside them.
    pytester.makeconftest("""\
        def pytest_addoption(parser):
            parser.addoption("--target", dest="target", default="esp32")
            parser.addoption("--seed", dest="seed", default="vendor-seed")
            parser.addoption("--testbed", dest="testbed", default="bench-3")
            parser.addoption("--report-dir", dest="report_dir", default="vendor-out")
    """)
    pytester.makepyfile(test_options="""\
        def test_defaults(request):
            c = request.config
            assert (c.getoption("target"), c.getoption("seed")) == ("esp32", "vendor-seed")
            assert (c.getoption("testbed"), c.getoption("report_dir")) == ("bench-3", "vendor-out")
            assert c.getoption("kvconform_target") == "python:x:y"
            assert c.getoption("kvconform_seed") == 5
    """)
    result = pytester.runpytest("--kvconform-target", "python:x:y", "--kvconform-seed", "5")
    result.assert_outcomes(passed=1)
    pytester.makepyfile(test_options="""\
        def test_given(request):
            assert request.config.getoption("target") == "esp32-s3"
            assert request.config.getoption("kvconform_target") == "reference"
    """)
    pytester.runpytest("--target", "esp32-s3").assert_outcomes(passed=1)


def test_every_option_and_its_dest_carry_the_prefix() -> None:
    for opt in (*OPTIONS, *LANE_OPTIONS):
        assert opt.flag.startswith("--kvconform-"), opt.flag
        assert opt.dest == opt.flag[2:].replace("-", "_"), (opt.flag, opt.dest)
    assert CATALOG_DIR_ENV == CATALOG_ENV_OF_CATALOG


@pytest.mark.parametrize("name", PROTOCOL_FIXTURE_MODULES)
def test_lane_modules_register_no_options(name: str) -> None:
    # A lane loads after the command line was parsed: an option it registered would never have a value.
    assert not hasattr(importlib.import_module(name), "pytest_addoption"), (
        f"{name} registers options; register them in fixtures/plugin.py LANE_OPTIONS")


VENDOR_CHECK = """\
    import pytest
    from kvconform.verdicts import check_equal

    pytestmark = [pytest.mark.suite("kbtp-target")]

    @pytest.mark.req("KBTP-POOL-GEOMETRY")
    def test_interleavings_option_reaches_the_lane(kbtp_target, pics):
        check_equal("interleavings", kbtp_target.interleavings, 3, req="KBTP-POOL-GEOMETRY")
"""


def test_lanes_load_for_a_vendor_module_with_strict_markers(pytester: pytest.Pytester) -> None:
    # Outside conformance/, with no kvconform option but a lane option: the req/suite markers are registered
    # (--strict-markers), the module's markers load the lanes, and the lane's option reaches its fixture.
    from kvconform.catalog import load_catalogs

    catalog = load_catalogs()
    rid = next(r.id for r in catalog.requirements("kbtp") if "target" in r.roles and r.testable)
    pytester.makepyfile(test_vendor=textwrap.dedent(VENDOR_CHECK).replace("KBTP-POOL-GEOMETRY", rid))
    result = pytester.runpytest("--strict-markers", "--kvconform-kbtp-interleavings", "3", "-p", "no:cacheprovider")
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(["kbtp-target: 1 pass"])


def test_a_req_marker_alone_makes_it_a_kvconform_session(pytester: pytest.Pytester) -> None:
    from kvconform.catalog import load_catalogs

    rid = next(r.id for r in load_catalogs().requirements("tlkv") if "writer" in r.roles and r.testable)
    pytester.makepyfile(test_vendor=f"""\
        import pytest
        from kvconform.targets.tlkv import Writer

        @pytest.mark.suite("tlkv-writer")
        @pytest.mark.req("{rid}")
        def test_writer_fixture(tlkv_writer):
            assert isinstance(tlkv_writer, Writer)
    """)
    result = pytester.runpytest("--strict-markers", "-p", "no:cacheprovider")
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(["kvconform: seed *, target reference, strict False", "tlkv-writer: 1 pass"])


def test_an_unknown_suite_marker_is_a_collection_error(pytester: pytest.Pytester) -> None:
    from kvconform.catalog import load_catalogs

    rid = next(r.id for r in load_catalogs().requirements("tlkv") if "writer" in r.roles)
    pytester.makepyfile(test_vendor=f"""\
        import pytest

        @pytest.mark.suite("tlkv-writr")
        @pytest.mark.req("{rid}")
        def test_x():
            pass
    """)
    result = pytester.runpytest("-p", "no:cacheprovider")
    assert result.ret == pytest.ExitCode.INTERRUPTED
    result.stdout.fnmatch_lines(["*test_x: @pytest.mark.suite('tlkv-writr',): expected one suite name*"])


def test_markers_are_listed(pytester: pytest.Pytester) -> None:
    result = pytester.runpytest("--markers")
    for name in MARKERS:
        result.stdout.fnmatch_lines([f"@pytest.mark.{name}(*"])


def test_plugin_module_imports_only_pytest_and_the_standard_library() -> None:
    # The module's own imports, read from its source (the harness session has imported everything anyway).
    source = Path(plugin.__file__).read_text()
    top = re.findall(r"^(?:import|from) ([\w.]+)", source, flags=re.MULTILINE)
    outside = sorted({m for m in top if m.split(".")[0] not in sys.stdlib_module_names} - {"pytest"}
                     - PLUGIN_ITSELF)
    assert outside == [], f"fixtures/plugin.py imports {outside} at module level"
