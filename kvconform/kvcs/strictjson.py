"""Reading JSON a target sent (a manifest, a consumer's result): I-JSON (RFC 7493) or a KvcsError naming where.

Python's ``json`` accepts more than JSON and fails in ways a harness must not: NaN and Infinity, duplicate
member names (the last one wins), lone surrogates, UTF-16 and UTF-32 input, integers of more than 4300 digits
(ValueError), and nesting deeper than the interpreter's recursion limit (RecursionError). ``load_json`` bounds
the size and the nesting before it parses, and refuses the rest with the JSON path of the offending value.
"""

from __future__ import annotations

import json
import re
from typing import Any

import numpy as np

from kvconform.kvcs.errors import KvcsError, show
from kvconform.kvsp.jcs import exact_double

__all__ = ["MAX_DEPTH", "describe", "load_json", "member_path", "nesting_depth"]

MAX_DEPTH = 32  # arrays and objects; a manifest needs 6 (segments, object_digests, Group arrays)
_MAX_DIGITS = 309  # an integer literal longer than this is beyond the largest double
# A JSON string (an unterminated one runs to the end: each octet is matched once), or a bracket.
_STRING = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"?', re.DOTALL)
_NOT_BRACKET = re.compile(r"[^\[\]{}]+")
_SURROGATE = re.compile("[\ud800-\udfff]")
_DEPTH_STEP = bytes.maketrans(b"[{]}", b"\x01\x01\xff\xff")
_CHUNK = 1 << 20


class _Refused:
    """What a parse hook returns in place of a value JSON readers disagree on; the walk reports its path."""

    def __init__(self, problem: str) -> None:
        self.problem = problem


def describe(value: Any) -> str:
    """A value and its JSON type, for "seen ..., expected ..." messages."""
    kinds = ((bool, "a boolean"), (int, "an integer"), (float, "a number with a fraction or exponent"),
             (str, "a string"), (list, "an array"), (dict, "an object"))
    if value is None or isinstance(value, bool):
        return json.dumps(value)  # null, true, false as JSON writes them
    kind = next((k for t, k in kinds if isinstance(value, t)), type(value).__name__)
    return f"{show(value)} ({kind})"


def _int(text: str) -> int | _Refused:
    digits = len(text.lstrip("-"))
    if digits > _MAX_DIGITS:
        return _Refused(f"an integer of {digits} digits, beyond the largest IEEE 754 double (RFC 7493 section 2.2)")
    value = int(text)
    if not exact_double(value):
        return _Refused(f"{text[:40]}: no IEEE 754 double holds this integer exactly, so JSON readers disagree on "
                        "its value (RFC 7493 section 2.2)")
    return value


def _float(text: str) -> float | _Refused:
    value = float(text)
    if value in (float("inf"), float("-inf")):
        return _Refused(f"{text[:40]}: beyond the largest IEEE 754 double (RFC 7493 section 2.2)")
    return value


def _constant(name: str) -> _Refused:
    return _Refused(f"{name}: not a JSON number (JSON has no NaN or Infinity, RFC 8259 section 6)")


def _object(pairs: list[tuple[str, Any]]) -> dict[str, Any] | _Refused:
    seen: set[str] = set()
    for name, _ in pairs:
        if name in seen:
            return _Refused(f"member {show(name)} appears more than once (I-JSON: names MUST be unique, RFC 7493 "
                            "section 2.3)")
        seen.add(name)
    return dict(pairs)


def member_path(path: str, name: str, root: str) -> str:
    """The path of member ``name`` of the value at ``path``: "manifest layers", "manifest segments[0].blocks"."""
    shown = name if name.isprintable() and len(name) <= 40 and not _SURROGATE.search(name) else show(name)
    return f"{root} {shown}" if path == root else f"{path}.{shown}"


def _walk(value: Any, path: str, root: str, requirement: str) -> None:
    """KvcsError at the first refused value or string with a lone surrogate (depth is bounded already)."""
    if isinstance(value, _Refused):
        raise KvcsError(path, value.problem, requirement=requirement)
    if isinstance(value, str):
        if _SURROGATE.search(value):
            raise KvcsError(path, f"{show(value)} holds a lone surrogate (I-JSON: strings MUST be valid Unicode, "
                            "RFC 7493 section 2.1)", requirement=requirement)
    elif isinstance(value, list):
        for i, item in enumerate(value):
            _walk(item, f"{path}[{i}]", root, requirement)
    elif isinstance(value, dict):
        for name, item in value.items():
            if _SURROGATE.search(name):
                raise KvcsError(path, f"member name {show(name)} holds a lone surrogate (RFC 7493 section 2.1)",
                                requirement=requirement)
            _walk(item, member_path(path, name, root), root, requirement)


def nesting_depth(text: str) -> int:
    """How deep arrays and objects nest in ``text`` (an upper bound when it is not JSON), without parsing it."""
    brackets = _NOT_BRACKET.sub("", _STRING.sub("", text)).encode("ascii")
    if not brackets:
        return 0
    steps = np.frombuffer(brackets.translate(_DEPTH_STEP), dtype=np.int8)
    depth = deepest = 0
    for start in range(0, len(steps), _CHUNK):  # in chunks: a running sum of every bracket of 64 MiB is 512 MiB
        running = np.cumsum(steps[start:start + _CHUNK], dtype=np.int64) + depth
        deepest, depth = max(deepest, int(running.max())), int(running[-1])
    return deepest


def load_json(data: bytes, *, what: str, requirement: str, max_octets: int, max_depth: int = MAX_DEPTH) -> Any:
    """The JSON value of ``data`` (UTF-8, at most ``max_octets``, nested at most ``max_depth``); KvcsError naming
    ``what`` or the path inside it (``what`` member[i].member) otherwise."""
    if len(data) > max_octets:
        raise KvcsError(what, f"{len(data)} octets, more than the {max_octets} the harness reads",
                        requirement=requirement)
    try:
        text = bytes(data).decode("utf-8")
    except UnicodeDecodeError as exc:
        raise KvcsError(what, f"not UTF-8 at octet {exc.start} (RFC 8259 section 8.1)", requirement=requirement,
                        offset=exc.start) from None
    depth = nesting_depth(text)
    if depth > max_depth:
        raise KvcsError(what, f"arrays and objects nested {depth} deep, more than the {max_depth} the harness reads",
                        requirement=requirement)
    try:
        value = json.loads(text, parse_int=_int, parse_float=_float, parse_constant=_constant,
                           object_pairs_hook=_object)
    except json.JSONDecodeError as exc:
        raise KvcsError(what, f"not JSON: {exc.msg} (line {exc.lineno} column {exc.colno})",
                        requirement=requirement) from None
    _walk(value, what, what, requirement)
    return value
