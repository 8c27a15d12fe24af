"""What starting ``kvconform run`` imports: no heavy module a start-up does not need (issue 22, "A fast start").

How long a start-up takes is measured by ``bench/bench_startup.py`` (a ratio on a shared machine belongs in a
benchmark, not in a gate); here the cause of the cost, the modules imported, is asserted, so a module made lazy
cannot silently come back: each run collects its whole suite, deselects every check (``-k``) and records
``sys.modules`` at its very end (the JUnit file and the reports included).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from kvconform.doccache import CACHE_ENV

RECORDER = """\
import json, os, sys
import pytest

@pytest.hookimpl(trylast=True)
def pytest_unconfigure(config):
    with open(os.environ["KVCONFORM_TEST_MODULES"], "w") as f:
        json.dump(sorted(sys.modules), f)
"""

# Never on a start-up: e4m3 casts (ml_dtypes) and hypothesis run in no suite's collection, and a catalog or testbed
# that passed its schema once is not validated again (kvconform.doccache), so jsonschema stays unloaded.
NEVER = ("ml_dtypes", "hypothesis", "_hypothesis_pytestplugin", "jsonschema", "referencing")
# Per suite, what its start-up does not need: scapy (crafting) outside the suites that import the layers, aioquic
# and cryptography outside the QUIC suites (the capture imports aioquic only with a QUIC connection, a run writes
# its manifest without the signature's cryptography), numpy for the KBTP suites (a session loads only the lanes of
# the protocols it runs).
ALSO_NOT = {
    "tlkv-writer": ("scapy", "aioquic", "cryptography"),
    "kbtp-initiator": ("scapy", "aioquic", "cryptography", "numpy"),
    "moqt-relay": (),
}


def _run(suite: str, tmp_path: Path, env: dict[str, str]) -> set[str]:
    out = tmp_path / f"{suite}.json"
    proc = subprocess.run(
        [sys.executable, "-m", "kvconform", "run", suite, "-k", "no_check_has_this_name", "--report-dir",
         str(tmp_path / suite)], env={**env, "KVCONFORM_TEST_MODULES": str(out)}, capture_output=True, text=True,
        timeout=300, stdin=subprocess.DEVNULL)
    assert proc.returncode == 5 and " deselected" in proc.stdout, proc.stdout[-3000:] + proc.stderr[-3000:]
    return set(json.loads(out.read_text()))


def _loaded(modules: set[str], names: tuple[str, ...]) -> list[str]:
    return sorted(m for m in modules if m.split(".")[0] in names or any(m.startswith(n + ".") for n in names))


@pytest.fixture(scope="module")
def spawn_env(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    plugins = tmp_path_factory.mktemp("recorder")
    (plugins / "startup_recorder.py").write_text(RECORDER)
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONDONTWRITEBYTECODE", "PYTEST_ADDOPTS")}
    return {**env, "PYTHONPATH": str(plugins), "PYTEST_ADDOPTS": "-p startup_recorder",
            CACHE_ENV: str(tmp_path_factory.mktemp("doccache"))}


@pytest.fixture(scope="module")
def warm(spawn_env: dict[str, str], tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    # The first run parses and validates the catalogs and the testbed (the recorder sees jsonschema: the check
    # below has teeth); later runs read them back.
    first = _run("tlkv-writer", tmp_path_factory.mktemp("first"), spawn_env)
    assert "jsonschema" in first
    return spawn_env


@pytest.mark.parametrize("suite", sorted(ALSO_NOT))
def test_a_start_up_imports_no_heavy_module_it_does_not_need(suite: str, warm: dict[str, str],
                                                            tmp_path: Path) -> None:
    modules = _run(suite, tmp_path, warm)
    assert any(m.startswith(f"kvconform.conformance.{suite.replace('-', '.')}.") for m in modules), (
        f"{suite}: none of its modules was collected")
    loaded = _loaded(modules, (*NEVER, *ALSO_NOT[suite]))
    assert not loaded, f"kvconform run {suite} imported {loaded[:10]} on its start-up"
