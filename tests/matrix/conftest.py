"""The matrix tests: the shipped registry's matrix (aiomoqt's relay in docker) runs only when selected with
``-m interop`` (``.ci/interop``, its matrix block); everything else here runs in the README's ``pytest``."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.lanes import deselect_lane


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    deselect_lane(config, items, Path(__file__).parent)
