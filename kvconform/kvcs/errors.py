"""The one error KVCS decoding and validation raise: it names the field, the offset and the requirement."""

from __future__ import annotations

import reprlib
from typing import Any

__all__ = ["KvcsError", "show"]

_SHORT = reprlib.Repr()  # attributes, not keywords: Python 3.11
_SHORT.maxlevel, _SHORT.maxlist, _SHORT.maxtuple, _SHORT.maxdict, _SHORT.maxset = 2, 4, 4, 4, 4
_SHORT.maxstring = _SHORT.maxother = 48


def show(value: Any) -> str:
    """A short repr of a value seen, for an error message (a target's value can be megabytes long)."""
    if isinstance(value, int) and not isinstance(value, bool) and value.bit_length() > 160:
        return f"an integer of about {int(value.bit_length() * 0.30103)} digits"  # repr() fails past 4300
    return _SHORT.repr(value)


class KvcsError(ValueError):
    """A KVCS structure (namespace, track name, object payload, manifest, cache spec) breaks the text."""

    def __init__(self, field: str, problem: str, *, requirement: str = "", offset: int | None = None) -> None:
        self.field = field
        self.problem = problem
        self.requirement = requirement
        self.offset = offset
        where = f" at offset {offset}" if offset is not None else ""
        cite = f" [{requirement}]" if requirement else ""
        super().__init__(f"{field}{where}: {problem}{cite}")
