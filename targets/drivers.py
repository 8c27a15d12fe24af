"""What every lane's drivers share: the two ways driving a target can go wrong, and ``python:`` targets.

A `DriverError` while a target is driven is a finding about the target; a `TargetUnavailable` (it could
not be started or reached at all) is a setup problem, so the check is inconclusive, never a verdict.
"""

from __future__ import annotations

import importlib
from typing import Any

__all__ = ["DriverError", "TargetUnavailable", "import_python_target", "load_python_target", "python_driver"]


class DriverError(RuntimeError):
    """The target misbehaved while driven (it crashed, hung or answered nonsense): a finding."""


class TargetUnavailable(DriverError):
    """The target could not be started or reached at all: a setup problem, never a verdict on it."""


def import_python_target(value: str) -> Any:
    """`module:attr.path` -> the object it names; DriverError naming the target when it does not import."""
    module_name, _, attr = value.partition(":")
    try:
        obj: Any = importlib.import_module(module_name)
        for part in attr.split("."):
            obj = getattr(obj, part)
    except (ImportError, AttributeError) as exc:
        raise DriverError(f"python target {value}: cannot import it: {exc}") from exc
    return obj


def load_python_target(value: str) -> Any:
    """`module:factory` -> the object the factory returns (a class is instantiated with no arguments)."""
    obj = import_python_target(value)
    return obj() if callable(obj) else obj


def python_driver(value: str, suite: str, role: type) -> Any:
    """A ``python:`` target that must implement ``role`` (a runtime-checkable Protocol) to play ``suite``."""
    obj = load_python_target(value)
    if not isinstance(obj, role):
        raise DriverError(f"python target {value}: does not implement {role.__name__} (suite {suite})")
    return obj
