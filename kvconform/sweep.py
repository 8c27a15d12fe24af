"""How wide the suites sweep their geometries (DESIGN.md principle 8, docs/boundaries.md).

The default run always reaches the boundary values; ``kvconform run --sweep wide`` (``--kvconform-sweep``) adds
more. This stand-in reads the level from ``KVCONFORM_SWEEP``; the lead's module on main wires the options.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Literal, TypeVar

T = TypeVar("T")


def level() -> Literal["boundary", "wide"]:
    return "wide" if os.environ.get("KVCONFORM_SWEEP", "boundary") == "wide" else "boundary"


def pick(boundary: Sequence[T], wide: Sequence[T] = ()) -> list[T]:
    """``boundary`` always; ``wide`` too under ``--sweep wide``."""
    return [*boundary, *wide] if level() == "wide" else list(boundary)
