"""RFC 8785 JSON Canonicalization Scheme (JCS): the byte form the Compatibility ID is a hash of.

Objects sort their members by the UTF-16 code units of the names, strings use JSON's minimal escapes
(ECMAScript ``JSON.stringify``), numbers the ECMAScript shortest round-trip form, no whitespace.
"""

from __future__ import annotations

import json
import math
from typing import Any

__all__ = ["jcs_canonical"]


def _number(value: float) -> str:
    if not math.isfinite(value):
        raise ValueError(f"JCS (RFC 8785 section 3.2.2.3): {value!r} is not a JSON number")
    if value == 0:
        return "0"  # -0 serialises as 0
    if value.is_integer() and abs(value) < 1e21:
        return str(int(value))
    text = repr(value)  # Python's repr is the shortest round-trip digits, like ECMAScript's
    mantissa, sep, exponent = text.partition("e")
    if not sep:
        return text
    exp = int(exponent)
    if -7 < exp < 21:  # ECMAScript writes these without an exponent
        return format(value, "f").rstrip("0").rstrip(".")
    return f"{mantissa}e{'+' if exp > 0 else '-'}{abs(exp)}"


def _utf16_key(name: str) -> bytes:
    return name.encode("utf-16-be")


def _emit(value: Any, out: list[str]) -> None:
    if value is None or isinstance(value, bool):
        out.append(json.dumps(value))
    elif isinstance(value, int):
        out.append(str(value))
    elif isinstance(value, float):
        out.append(_number(value))
    elif isinstance(value, str):
        out.append(json.dumps(value, ensure_ascii=False))
    elif isinstance(value, list | tuple):
        out.append("[")
        for i, item in enumerate(value):
            if i:
                out.append(",")
            _emit(item, out)
        out.append("]")
    elif isinstance(value, dict):
        out.append("{")
        for i, name in enumerate(sorted(value, key=_utf16_key)):
            if not isinstance(name, str):
                raise TypeError(f"JCS: object member name {name!r} is not a string")
            if i:
                out.append(",")
            out.append(json.dumps(name, ensure_ascii=False))
            out.append(":")
            _emit(value[name], out)
        out.append("}")
    else:
        raise TypeError(f"JCS: {type(value).__name__} is not a JSON value")


def jcs_canonical(value: Any) -> bytes:
    """The RFC 8785 canonical UTF-8 serialisation of a JSON value (dict, list, str, int, float, bool, None)."""
    out: list[str] = []
    _emit(value, out)
    return "".join(out).encode("utf-8")
