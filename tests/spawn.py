"""How the tests run `kvconform ...` in a process of its own, and how each such test is bounded.

`kvconform(argv, timeout=...)` runs `python -m kvconform ARGV` from the checkout, as a user would, through the fork
server (tests/forkserver.py; a fresh interpreter with KVCONFORM_TEST_FORKSERVER=0) and returns a
`subprocess.CompletedProcess`. Every run has a bound of its own; the test that makes it must have a pytest-timeout
at least the sum of its runs' bounds plus `MARGIN`, or a loaded machine stops the test on the wrong bound (the
test's 120 s instead of the run's 300-600 s). `covering(*bounds)` is that mark; each run checks its test's timeout
covers what the test has spawned so far (tests/conftest.py tells this module which test runs, and its timeout),
and fails with the mark to add when it does not.
"""

from __future__ import annotations

import math
import os
import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest

from tests import forkserver

ROOT = Path(__file__).resolve().parents[1]
MARGIN = 60.0  # a test's own work around its runs (targets, reading reports), in seconds


def spawn_env() -> dict[str, str]:
    """The environment for a spawned `kvconform`: without PYTHONDONTWRITEBYTECODE, since bytecode caches
    halve each run's start-up (the mutant tests spawn over a hundred), and with the checkout on PYTHONPATH for the
    `python:tests.mutants...` targets."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    return {**env, "PYTHONPATH": str(ROOT)}


def covering(*bounds: float) -> pytest.MarkDecorator:
    """The pytest-timeout of a test whose runs have these bounds (one per `kvconform` run it makes)."""
    return pytest.mark.timeout(math.ceil(sum(bounds) + MARGIN))


class _Budget:
    """The running test (nodeid), its pytest-timeout (inf: none) and the bounds of the runs it has made."""

    def __init__(self) -> None:
        self.nodeid: str | None = None
        self.timeout = math.inf
        self.spent: list[float] = []

    def begin(self, nodeid: str, timeout: float) -> None:
        self.nodeid, self.timeout, self.spent = nodeid, timeout, []

    def end(self) -> None:
        self.begin("", math.inf)
        self.nodeid = None

    def charge(self, bound: float) -> None:
        self.spent.append(bound)
        needed = sum(self.spent) + MARGIN
        if self.nodeid is not None and needed > self.timeout:
            raise AssertionError(
                f"{self.nodeid}: its pytest-timeout ({self.timeout:g} s) does not cover the kvconform runs it makes "
                f"(bounds {self.spent} s + {MARGIN:g} s): mark it "
                f"@tests.spawn.covering({', '.join(f'{b:g}' for b in self.spent)})")


BUDGET = _Budget()


def timeout_of(item: pytest.Item) -> float:
    """An item's pytest-timeout in seconds (its mark, else --timeout, else the ini's; inf when 0 or unset)."""
    mark = item.get_closest_marker("timeout")
    if mark is not None:
        value = mark.args[0] if mark.args else mark.kwargs.get("timeout")
    else:
        value = item.config.getoption("timeout", None) or item.config.getini("timeout")
    seconds = float(value or 0)
    return seconds if seconds > 0 else math.inf


def kvconform(argv: Sequence[str], *, timeout: float, cwd: str | os.PathLike[str] = ROOT,
              env: Mapping[str, str] | None = None, text: bool = True) -> subprocess.CompletedProcess[Any]:
    """`python -m kvconform ARGV` with stdin from /dev/null and its output captured, killed (with its process
    group) past ``timeout`` (subprocess.TimeoutExpired); ``env`` defaults to `spawn_env()`."""
    BUDGET.charge(timeout)
    return forkserver.run(argv, cwd=cwd, env=spawn_env() if env is None else env, timeout=timeout, text=text)

