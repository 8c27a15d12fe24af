"""The lanes that run only when selected (``-m interop``, .ci/interop): their tests are deselected otherwise, so
README's plain ``pytest`` neither starts containers nor runs them twice in CI."""

from __future__ import annotations

from pathlib import Path

import pytest

__all__ = ["deselect_lane", "lane_selected"]


def lane_selected(config: pytest.Config) -> bool:
    return "interop" in (config.getoption("markexpr", "") or "")


def deselect_lane(config: pytest.Config, items: list[pytest.Item], folder: Path) -> None:
    """Deselect the ``interop`` tests under ``folder`` unless ``-m`` names interop."""
    if lane_selected(config):
        return
    lane = [item for item in items if item.get_closest_marker("interop") and folder in item.path.parents]
    if lane:
        config.hook.pytest_deselected(items=lane)
        items[:] = [item for item in items if item not in lane]
