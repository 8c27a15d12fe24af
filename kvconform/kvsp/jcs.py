"""RFC 8785 JSON Canonicalization Scheme (JCS): the byte form the Compatibility ID is a hash of.

The serialisation is the ``rfc8785`` package's. ``jcs_canonical`` first checks that the value is I-JSON, as
RFC 8785 section 3.1 requires, and names the member that is not: NaN and Infinity, types JSON has no value for,
lone surrogates, and integers that no IEEE 754 double holds exactly (they would round onto a neighbour and share
its canonical form; RFC 8785 Appendix D says to send them as strings). An integer beyond 2^53 that a double
does hold (10^21, 2^60) is that double, as every JCS implementation reads it.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from typing import Any

import rfc8785

from kvconform.kvsp.errors import KvspError

__all__ = ["MAX_DEPTH", "exact_double", "jcs_canonical"]

MAX_DEPTH = 64  # nested arrays and objects; a descriptor needs a few, and the check recurses
_SAFE = 2**53  # every integer of magnitude <= 2^53 is a double exactly
_SURROGATE = re.compile("[\ud800-\udfff]")


def exact_double(n: int) -> bool:
    """Whether the integer ``n`` is exactly an IEEE 754 double (so every JSON reader sees this number)."""
    if -_SAFE <= n <= _SAFE:
        return True
    try:
        return int(float(n)) == n
    except OverflowError:  # beyond the largest double
        return False


def _show(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else f"{text[:57]}..."


def _member(path: str, name: str) -> str:
    return f"{path}.{name}" if name.isidentifier() and len(name) <= 40 else f"{path}[{_show(name)}]"


def _string(value: str, path: str) -> str:
    if _SURROGATE.search(value):
        raise KvspError(f"{path}: {_show(value)} holds a lone surrogate, which UTF-8 cannot encode "
                        "(RFC 8785 section 3.2.2.2)", field=path)
    return str(value)


def _prepare(value: Any, path: str, depth: int) -> Any:
    """``value`` as plain JSON types rfc8785 serialises the way RFC 8785 says, or KvspError naming ``path``."""
    if value is None or isinstance(value, bool):
        return value
    if isinstance(value, int):
        if not exact_double(value):
            digits = len(str(abs(value))) if value.bit_length() < 4000 else "over 1200"
            raise KvspError(f"{path}: an integer of {digits} digits that no IEEE 754 double holds exactly (it would "
                            "share the canonical form of a neighbour; RFC 8785 Appendix D: send it as a string)",
                            field=path)
        return int(value) if -_SAFE < value < _SAFE else float(value)  # rfc8785 writes |n| >= 2^53 as doubles only
    if isinstance(value, float):
        if not math.isfinite(value):
            raise KvspError(f"{path}: {value!r} is not a JSON number (RFC 8785 section 3.2.2.3 has no NaN or "
                            "Infinity)", field=path)
        return float(value)
    if isinstance(value, str):
        return _string(value, path)
    if isinstance(value, list | tuple | Mapping) and depth >= MAX_DEPTH:
        raise KvspError(f"{path}: nested deeper than {MAX_DEPTH} arrays and objects", field=path)
    if isinstance(value, list | tuple):
        return [_prepare(item, f"{path}[{i}]", depth + 1) for i, item in enumerate(value)]
    if isinstance(value, Mapping):
        out: dict[str, Any] = {}
        for name, item in value.items():
            if not isinstance(name, str):
                raise KvspError(f"{path}: member name {_show(name)} is a {type(name).__name__}, expected a string",
                                field=path)
            key = _string(name, path)
            out[key] = _prepare(item, _member(path, key), depth + 1)
        return out
    raise KvspError(f"{path}: a {type(value).__name__} ({_show(value)}), expected a JSON value (object, array, "
                    "string, number, true, false, null)", field=path)


def jcs_canonical(value: Any, *, name: str = "value") -> bytes:
    """The RFC 8785 canonical UTF-8 serialisation of a JSON value (dict, list, str, int, float, bool, None);
    KvspError naming the member (``name`` is the value's own) when it is not I-JSON."""
    prepared = _prepare(value, name, 0)
    try:
        return bytes(rfc8785.dumps(prepared))
    except rfc8785.CanonicalizationError as exc:  # _prepare refuses all it refuses; kept as a KvspError all the same
        raise KvspError(f"{name}: {exc}", field=name) from exc
