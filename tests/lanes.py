"""The lanes that run only when selected (``-m interop``: .ci/interop; ``-m rdma_vm``: .ci/rdma): their tests are
deselected otherwise, so README's plain ``pytest`` neither starts containers or VMs nor runs them twice in CI."""

from __future__ import annotations

from pathlib import Path

import pytest

__all__ = ["deselect_lane", "lane_selected"]


def lane_selected(config: pytest.Config, marker: str = "interop") -> bool:
    return marker in (config.getoption("markexpr", "") or "")


def deselect_lane(config: pytest.Config, items: list[pytest.Item], folder: Path, marker: str = "interop") -> None:
    """Deselect the ``marker`` tests under ``folder`` unless ``-m`` names the marker."""
    if lane_selected(config, marker):
        return
    lane = [item for item in items if item.get_closest_marker(marker) and folder in item.path.parents]
    if lane:
        config.hook.pytest_deselected(items=lane)
        items[:] = [item for item in items if item not in lane]
