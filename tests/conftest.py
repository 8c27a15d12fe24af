"""Harness-wide test setup.

pytester's in-process runs (``pytester.runpytest``) remove, when they end, every module they imported. The
kvconform plugin imports its lanes (numpy, grpc, aioquic, ...) only in a session that uses it, so the first
inner run would import them and the next one import them again, which C extensions such as numpy refuse
("cannot load module more than once per process"). Importing the lanes once here keeps them in every run.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.machinery
import importlib.util
import json
import math
import os
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from kvconform.fixtures.plugin import PROTOCOL_FIXTURE_MODULES
from tests import cpu_slots, forkserver, spawn
from tests.mutants.runner import RUN_BOUND
from tests.report_runs import (
    MAIN_JOB_BOUND,
    MAIN_REPORT_ENV,
    ReportRun,
    broken_run,
    main_job_run,
    reference_run,
    shared_run,
)

for _name in PROTOCOL_FIXTURE_MODULES:
    importlib.import_module(_name)

# bench/ and tools/ are folders of scripts beside the package, which tests import (bench.bench_kbtp, tools.mutation):
# each is a namespace package of its own folder, as pytest makes tests/ one, without putting the checkout on
# sys.path (which would give the package's folders a second name).
for _name in ("bench", "tools"):
    if _name not in sys.modules:
        _spec = importlib.machinery.ModuleSpec(_name, None, is_package=True)
        _spec.submodule_search_locations = [str(Path(__file__).resolve().parent.parent / _name)]
        sys.modules[_name] = importlib.util.module_from_spec(_spec)


# The report runs the tests read, never written to, each made once per session (tests/report_runs.py): the two the
# report tests read (schema, browser) and the main job. Whichever test sets one up makes its run (or waits for
# another worker's), so every test using them is given the time for it (pytest_collection_modifyitems).
SPAWNING_FIXTURES = {"reference": RUN_BOUND, "broken": RUN_BOUND, "main_job": MAIN_JOB_BOUND}


@pytest.fixture(scope="session")
def reference(tmp_path_factory: pytest.TempPathFactory) -> ReportRun:
    return shared_run(tmp_path_factory, "reference", reference_run)


@pytest.fixture(scope="session")
def broken(tmp_path_factory: pytest.TempPathFactory) -> ReportRun:
    return shared_run(tmp_path_factory, "broken", broken_run)


@pytest.fixture(scope="session")
def main_job(tmp_path_factory: pytest.TempPathFactory) -> ReportRun:
    return main_job_run(tmp_path_factory)


WORKERS_PER_CORE_ENV = "KVCONFORM_TEST_WORKERS_PER_CORE"
# Each module's longest test (tools/test_durations.py writes the file from a run's JUnit file).
DURATIONS = Path(__file__).with_name("durations.json")
MAIN_JOB_SECONDS = 180.0  # what setting up `main_job` costs when the session runs it (no $KVCONFORM_MAIN_REPORT_DIR)


def _longest(items: list[pytest.Item]) -> dict[Path, float]:
    """Each module's longest test, in seconds: as recorded, and at least the main job for one that runs it."""
    recorded = json.loads(DURATIONS.read_text()) if DURATIONS.is_file() else {}
    root = DURATIONS.parent.parent
    longest: dict[Path, float] = {}
    for item in items:
        module = item.path
        seconds = float(recorded.get(module.relative_to(root).as_posix(), {}).get("longest", 0.0))
        if "main_job" in getattr(item, "fixturenames", ()) and not os.environ.get(MAIN_REPORT_ENV):
            seconds = max(seconds, MAIN_JOB_SECONDS)
        longest[module] = max(longest.get(module, 0.0), seconds)
    return longest


@pytest.hookimpl(trylast=True)  # after pytest has grouped the items by their fixtures
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        bounds = [SPAWNING_FIXTURES[f] for f in getattr(item, "fixturenames", ()) if f in SPAWNING_FIXTURES]
        own = spawn.timeout_of(item)
        if bounds and own < math.inf:
            item.add_marker(pytest.mark.timeout(math.ceil(own + sum(bounds))), append=False)
    # Heavy first: the modules whose longest test is longest start first (each module's tests stay together and in
    # order, so module fixtures are set up as often as before), so no long test starts near the end of a run; with
    # `--maxschedchunk 1` (pyproject) xdist hands each worker the next test as it frees, longest first.
    # A test that sets up the main job itself goes first in its module: the other workers' readers wait for it.
    longest = _longest(items)
    first: dict[Path, int] = {}
    for index, item in enumerate(items):
        first.setdefault(item.path, index)
    order = {id(item): index for index, item in enumerate(items)}
    runs_main_job = not os.environ.get(MAIN_REPORT_ENV)
    items.sort(key=lambda item: (-longest[item.path], first[item.path],
                                 not (runs_main_job and "main_job" in getattr(item, "fixturenames", ())),
                                 order[id(item)]))


def _cores() -> int:
    return len(os.sched_getaffinity(0))


def pytest_xdist_auto_num_workers(config: pytest.Config) -> int:
    # Two workers per core: the idle-bound tests fill the time the others leave idle; CPU slots keep the busy ones
    # to one per core (tests/cpu_slots.py). KVCONFORM_TEST_WORKERS_PER_CORE=1 runs one worker per core, no slots.
    return _cores() * int(os.environ.get(WORKERS_PER_CORE_ENV, "2"))


_slots: cpu_slots.Slots | None = None


def pytest_configure(config: pytest.Config) -> None:
    global _slots
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    if workers > _cores():
        folder = Path(tempfile.gettempdir()) / f"kvconform-cpu-slots-{os.environ['PYTEST_XDIST_TESTRUNUID']}"
        folder.mkdir(exist_ok=True)
        _slots = cpu_slots.Slots(folder, _cores())


@pytest.hookimpl(hookwrapper=True, tryfirst=True)  # outermost: the slot is taken before the test's timeout starts
def pytest_runtest_protocol(item: pytest.Item) -> Iterator[None]:
    busy = _slots is not None and item.get_closest_marker("idle_bound") is None
    with _slots.held() if busy and _slots is not None else contextlib.nullcontext():
        # Each `kvconform` run a test makes (tests/spawn.py) is checked against the test's pytest-timeout.
        spawn.BUDGET.begin(item.nodeid, spawn.timeout_of(item))
        try:
            yield
        finally:
            spawn.BUDGET.end()


def pytest_sessionfinish() -> None:
    forkserver.stop()  # this process's fork server, if a test started it


def pytest_unconfigure() -> None:
    if _slots is not None:
        _slots.close()
