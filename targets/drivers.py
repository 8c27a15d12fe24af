"""``python:`` targets of every lane: an object implementing the role's driver Protocol (kvconform.loading loads it;
how driving a target can go wrong is kvconform.verdicts: DriverError, TargetUnavailable, SanityFailure)."""

from __future__ import annotations

from typing import Any

from kvconform.loading import load_python_target
from kvconform.verdicts import DriverError

__all__ = ["python_driver"]


def python_driver(value: str, suite: str, role: type) -> Any:
    """A ``python:`` target that must implement ``role`` (a runtime-checkable Protocol) to play ``suite``."""
    obj = load_python_target(value)
    if not isinstance(obj, role):
        raise DriverError(f"python target {value}: does not implement {role.__name__} (suite {suite})")
    return obj
