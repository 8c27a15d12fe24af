"""How wide the suites sweep their geometries (issue 11, DESIGN.md principle 8): the boundary values always,
more under ``kvconform run --sweep wide`` (``--kvconform-sweep``; the environment variable KVCONFORM_SWEEP
stands in until the option lands)."""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Literal, TypeVar

T = TypeVar("T")


def level() -> Literal["boundary", "wide"]:
    """The sweep level of this run."""
    return "wide" if os.environ.get("KVCONFORM_SWEEP", "boundary") == "wide" else "boundary"


def pick(boundary: Sequence[T], wide: Sequence[T] = ()) -> list[T]:
    """``boundary`` always, followed by ``wide`` under ``--sweep wide``."""
    return [*boundary, *wide] if level() == "wide" else list(boundary)
