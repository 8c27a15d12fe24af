"""How wide a suite sweeps its geometries and value classes (issue 11, DESIGN.md principle 8).

The default run ("boundary") reaches the boundary values where wrong implementations differ from right ones;
`kvconform run --sweep wide` (pytest `--kvconform-sweep wide`) adds more values, with a larger budget.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Literal, TypeVar

T = TypeVar("T")
Level = Literal["boundary", "wide"]


def level() -> Level:
    """The sweep level of this run: "boundary" unless "wide" was asked for."""
    return "wide" if os.environ.get("KVCONFORM_SWEEP", "boundary") == "wide" else "boundary"


def pick(boundary: Sequence[T], wide: Sequence[T] = ()) -> list[T]:
    """The boundary values always, and the `wide` ones too under --sweep wide."""
    return [*boundary, *wide] if level() == "wide" else list(boundary)
