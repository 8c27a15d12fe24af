"""How wide a run sweeps its geometries (DESIGN.md principle 8: boundary values are in every default run).

A suite's parametrizations and scenario generators list the values where wrong implementations differ from
right ones (`boundary`: always run) and further ones (`wide`: added by ``kvconform run --sweep wide``, bounded by
``--suite-budget`` like every other check). ``docs/boundaries.md`` lists, per suite, which boundaries each
level reaches. The level is process-wide because parametrization happens at collection, before any fixture:
the plugin sets it from ``--kvconform-sweep`` in ``pytest_configure`` (on every xdist worker too).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Literal, TypeVar, get_args

Level = Literal["boundary", "wide"]
LEVELS: tuple[Level, ...] = get_args(Level)
DEFAULT: Level = "boundary"

T = TypeVar("T")

_level: Level = DEFAULT


def level() -> Level:
    """The sweep level of this run."""
    return _level


def set_level(value: str) -> None:
    """Set the level (the plugin does, from ``--kvconform-sweep``); anything but a known level is refused."""
    global _level
    if value not in LEVELS:
        raise ValueError(f"--sweep {value!r}: expected one of {', '.join(LEVELS)}")
    _level = value  # type: ignore[assignment]  # checked against LEVELS just above


def pick(boundary: Sequence[T], wide: Iterable[T] = ()) -> list[T]:
    """The values a parametrization uses: the boundary ones always, then the wide ones under ``--sweep wide``
    (duplicates dropped, first occurrence kept, so a sweep never runs a case twice)."""
    values = list(boundary)
    if _level == "wide":
        for v in wide:
            if v not in values:
                values.append(v)
    return values
