"""Objects named ``module:attr``: ``python:`` targets and the classes a served component runs instead of the
reference (``--relay-class``, ``--publisher-class``, ``--target-class``: a mutant or a vendor's model)."""

from __future__ import annotations

import importlib
import importlib.util
import os
import sys
from pathlib import Path
from types import ModuleType
from typing import Any, TypeVar

from kvconform.verdicts import TargetUnavailable

__all__ = ["import_python_target", "load_python_target", "load_subclass"]

T = TypeVar("T")


def import_python_target(value: str) -> Any:
    """`module:attr.path` -> the object it names; DriverError naming the target when it does not import."""
    module_name, _, attr = value.partition(":")
    try:
        obj: Any = importlib.import_module(module_name)
        for part in attr.split("."):
            obj = getattr(obj, part)
    except (ImportError, AttributeError) as exc:
        hint = " (kvconform imports it from sys.path: is its folder on PYTHONPATH?)" \
            if isinstance(exc, ModuleNotFoundError) else ""
        raise TargetUnavailable(f"python target {value}: cannot import it: {exc}{hint}") from exc
    return obj


def load_python_target(value: str) -> Any:
    """`module:factory` -> the object the factory returns (a class is instantiated with no arguments)."""
    obj = import_python_target(value)
    return obj() if callable(obj) else obj


def load_subclass(spec: str, base: type[T], option: str) -> type[T]:
    """``module:Class`` or ``path/to/file.py:Class`` naming a subclass of ``base`` (how a ``serve`` component
    starts a mutant or a vendor's class: ``--relay-class``, ``--publisher-class``). A dotted module not
    importable as installed is looked up from the current directory too, so ``tests.mutants...`` works from
    a checkout whichever way kvconform was started. ValueError naming ``option`` otherwise."""
    module_name, sep, attr = spec.rpartition(":")
    if not sep or not module_name or not attr:
        raise ValueError(f"{option} {spec!r}: expected module:Class")
    module: ModuleType
    if module_name.endswith(".py"):
        path = Path(module_name).resolve()
        loader_spec = importlib.util.spec_from_file_location(f"_class_from_{path.stem}", path)
        if loader_spec is None or loader_spec.loader is None:
            raise ValueError(f"{option} {spec!r}: cannot load {path}")
        module = importlib.util.module_from_spec(loader_spec)
        sys.modules[loader_spec.name] = module
        loader_spec.loader.exec_module(module)
    else:
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError:
            if os.getcwd() in sys.path:
                raise
            sys.path.append(os.getcwd())
            module = importlib.import_module(module_name)
    cls = getattr(module, attr, None)
    if not (isinstance(cls, type) and issubclass(cls, base)):
        raise ValueError(f"{option} {spec!r}: {attr} is not a subclass of {base.__module__}.{base.__qualname__}")
    return cls
