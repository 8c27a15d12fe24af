"""Broken KVCS publishers, relays and consumers, one module per role; the lane's MUTANTS and
UNMUTATED_CHECKS are theirs merged, and each mutant class is importable from here
(``python:tests.mutants.kvcs:<Class>``)."""

from __future__ import annotations

import importlib
import importlib.util
from typing import Any

from tests.mutants import Mutant

ROLE_MODULES = ("publisher", "relay", "consumer")

MUTANTS: dict[str, Mutant] = {}
UNMUTATED_CHECKS: dict[str, str] = {}

for _role in ROLE_MODULES:
    if importlib.util.find_spec(f"{__name__}.{_role}") is None:
        continue  # a role whose suite is not written yet; an import error in an existing one propagates
    _module: Any = importlib.import_module(f"{__name__}.{_role}")
    MUTANTS.update(_module.MUTANTS)
    UNMUTATED_CHECKS.update(_module.UNMUTATED_CHECKS)
    globals().update({name: getattr(_module, name) for name in _module.MUTANTS})
