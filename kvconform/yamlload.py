"""YAML parsing for every file kvconform reads (catalogs, testbeds, policies, registries, outcomes, --pics-set).

PyYAML's pure-Python parser takes 0.4-0.8 s for the requirement catalogs alone, libyaml's (``CSafeLoader``)
about a tenth of that, with the same safe constructor and so the same documents. A PyYAML built without
libyaml falls back to the pure-Python ``SafeLoader``.
"""

from __future__ import annotations

from typing import Any

import yaml

__all__ = ["LOADER", "YAMLError", "safe_load"]

LOADER: Any = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
YAMLError = yaml.YAMLError


def safe_load(stream: str | bytes) -> Any:
    """``yaml.safe_load`` with libyaml's parser when PyYAML has it."""
    return yaml.load(stream, Loader=LOADER)  # a safe loader: SafeLoader or its C twin
