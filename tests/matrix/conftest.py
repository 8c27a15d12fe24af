"""The matrix tests: the shipped registry's matrix (aiomoqt's relay in docker) runs only when selected with
``-m interop`` (``.ci/interop``, its matrix block); everything else here runs in the README's ``pytest``."""

from __future__ import annotations

from pathlib import Path

import pytest


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if "interop" in (config.getoption("markexpr", "") or ""):
        return
    here = Path(__file__).parent
    lane = [item for item in items if item.get_closest_marker("interop") and here in item.path.parents]
    if lane:
        config.hook.pytest_deselected(items=lane)
        items[:] = [item for item in items if item not in lane]
