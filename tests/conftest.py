"""Harness-wide test setup.

pytester's in-process runs (``pytester.runpytest``) remove, when they end, every module they imported. The
kvconform plugin imports its lanes (numpy, grpc, aioquic, ...) only in a session that uses it, so the first
inner run would import them and the next one import them again, which C extensions such as numpy refuse
("cannot load module more than once per process"). Importing the lanes once here keeps them in every run.
"""

from __future__ import annotations

import importlib
import importlib.machinery
import importlib.util
import sys
from pathlib import Path

import pytest

from kvconform.fixtures.plugin import PROTOCOL_FIXTURE_MODULES
from tests.report_runs import ReportRun, broken_run, reference_run

for _name in PROTOCOL_FIXTURE_MODULES:
    importlib.import_module(_name)

# The scripts beside the package (bench/, tools/) are imported by their tests as the namespace packages bench and
# tools, as mypy sees them; only those two folders, since the checkout's root is not on sys.path (the folders the
# packaging maps into kvconform must keep their one name).
for _folder in ("bench", "tools"):
    _spec = importlib.machinery.ModuleSpec(_folder, None, is_package=True)
    _spec.submodule_search_locations = [str(Path(__file__).resolve().parent.parent / _folder)]
    sys.modules.setdefault(_folder, importlib.util.module_from_spec(_spec))


# The two report runs the report tests read (schema, browser): made once per worker, never written to.
@pytest.fixture(scope="session")
def reference(tmp_path_factory: pytest.TempPathFactory) -> ReportRun:
    return reference_run(tmp_path_factory.mktemp("reference"))


@pytest.fixture(scope="session")
def broken(tmp_path_factory: pytest.TempPathFactory) -> ReportRun:
    return broken_run(tmp_path_factory.mktemp("broken"))

