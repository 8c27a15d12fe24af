"""The lanes that run only when selected (``-m interop``: .ci/interop; ``-m rdma_vm``: .ci/rdma): their tests are
deselected otherwise, so README's plain ``pytest`` neither starts containers or VMs nor runs them twice in CI.

And the grids the default run samples: a legal-PICS grid whose every point is a whole suite run keeps a bounded
sample in README's test command (CI's budget is 30 minutes) and runs whole with ``KVCONFORM_GRIDS_FULL=1``
(``tox -e grids``); the points left out are skipped, by name, never dropped silently."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

__all__ = ["GRIDS_FULL", "deselect_lane", "grid_point", "lane_selected"]

GRIDS_FULL = os.environ.get("KVCONFORM_GRIDS_FULL") == "1"


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


def grid_point(*values: object, id: str, sampled: bool) -> object:
    """A grid point as a ``pytest.param``: outside the default run's sample (``sampled`` false) it is skipped
    unless KVCONFORM_GRIDS_FULL=1 (tox -e grids)."""
    marks = () if sampled or GRIDS_FULL else (pytest.mark.skip(
        reason="outside the default run's sample of the grid: KVCONFORM_GRIDS_FULL=1 (tox -e grids) runs it"),)
    return pytest.param(*values, id=id, marks=marks)
