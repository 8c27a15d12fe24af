"""A strict reader for the CBOR (RFC 8949) of a received COSE_Sign1: bounded, definite, plain values.

A target's octets decide every length and nesting here, so the reader never trusts them: a declared length
must fit in the octets that remain (no allocation on a claim), nesting is bounded (no recursion on a claim),
indefinite lengths are read (RFC 9052 section 9 wants definite lengths only in the structures that are signed,
which the verifier rebuilds itself; a message may use either), each chunk and element costing at least one octet
of the input, map keys are integers, text
or byte strings and appear once, and tags stay ``Tagged`` values: no tag is interpreted (cbor2 would resolve
shared references, bignums and dates, each a way to build cycles or huge values). Errors are the caller's
``KvcsError`` subclass, naming the field and the offset.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Any

from kvconform.kvcs.errors import KvcsError, show

__all__ = ["INDEFINITE", "MAJOR_TYPES", "MAX_DEPTH", "CborReader", "Simple", "Tagged", "describe"]

MAX_DEPTH = 16  # arrays, maps and tags; a COSE_Sign1 header needs 2 or 3
MAJOR_TYPES = ("an unsigned integer", "a negative integer", "a byte string", "a text string", "an array", "a map",
          "a tag", "a simple value or float")
_FLOATS = {25: ">e", 26: ">f", 27: ">d"}
INDEFINITE = -1  # the argument head() gives an indefinite-length string, array or map
_BREAK = 0xFF


@dataclass(frozen=True)
class Tagged:
    """A tagged data item (RFC 8949 section 3.4), not interpreted."""

    tag: int
    value: Any


@dataclass(frozen=True)
class Simple:
    """A simple value other than false, true and null (RFC 8949 section 3.3); 23 is undefined."""

    value: int


def describe(value: Any) -> str:
    """A decoded value and its CBOR type, short (a hostile value can be long)."""
    kinds = ((bool, "a boolean"), (int, "an integer"), (float, "a float"), (bytes, "a byte string"),
             (str, "a text string"), (list, "an array"), (dict, "a map"), (Tagged, "a tag"), (Simple, "a simple value"))
    kind = "null" if value is None else next((k for t, k in kinds if isinstance(value, t)), type(value).__name__)
    return f"{show(value)} ({kind})"


class CborReader:
    """Reads data items from ``data`` one after the other; ``pos`` is the offset of the next one."""

    def __init__(self, data: bytes, *, error: type[KvcsError], requirement: str, max_depth: int = MAX_DEPTH) -> None:
        self.data = bytes(data)
        self.pos = 0
        self.error = error
        self.requirement = requirement
        self.max_depth = max_depth

    def _fail(self, field: str, problem: str, offset: int) -> KvcsError:
        return self.error(field, problem, requirement=self.requirement, offset=offset)

    def remaining(self) -> int:
        return len(self.data) - self.pos

    def at_end(self) -> bool:
        return self.pos == len(self.data)

    def head(self, field: str) -> tuple[int, int, int]:
        """(major type, additional information, argument) of the next item's head; definite lengths only."""
        start = self.pos
        if start >= len(self.data):
            raise self._fail(field, f"not CBOR: the data ends at octet {start} where a data item belongs", start)
        initial = self.data[start]
        major, info = initial >> 5, initial & 0x1F
        self.pos += 1
        if info < 24:
            return major, info, info
        if info <= 27:
            size = 1 << (info - 24)
            if self.remaining() < size:
                raise self._fail(field, f"not CBOR: {MAJOR_TYPES[major]} whose {size}-octet argument is cut off at "
                                 f"octet {len(self.data)}", start)
            argument = int.from_bytes(self.data[self.pos:self.pos + size], "big")
            self.pos += size
            if major == 7 and info == 24 and argument < 32:
                raise self._fail(field, f"not CBOR: simple value {argument} in two octets is not well-formed "
                                 "(RFC 8949 section 3.3)", start)
            return major, info, argument
        if info == 31 and major == 7:
            raise self._fail(field, "not CBOR: a break code (0xff) with no indefinite-length item open (RFC 8949 "
                             "section 3.2.1)", start)
        if info == 31 and major in (2, 3, 4, 5):
            return major, info, INDEFINITE
        if info == 31:
            raise self._fail(field, f"not CBOR: {MAJOR_TYPES[major]} cannot have an indefinite length (RFC 8949 "
                             "section 3.2)", start)
        raise self._fail(field, f"not CBOR: additional information {info} is reserved (RFC 8949 section 3)", start)

    def _at_break(self, field: str, start: int) -> bool:
        """Whether the next octet ends the indefinite-length item opened at ``start`` (consumed if so)."""
        if self.pos >= len(self.data):
            raise self._fail(field, f"not CBOR: the indefinite-length item opened at octet {start} has no break "
                             "code (0xff)", start)
        if self.data[self.pos] == _BREAK:
            self.pos += 1
            return True
        return False

    def _chunks(self, field: str, major: int, start: int) -> bytes:
        """An indefinite-length byte or text string: definite chunks of the same major type up to the break."""
        parts: list[bytes] = []
        while not self._at_break(field, start):
            at = self.pos
            chunk_major, _, size = self.head(field)
            if chunk_major != major or size == INDEFINITE:
                raise self._fail(field, f"not CBOR: a chunk of an indefinite-length {MAJOR_TYPES[major]} must be a "
                                 f"definite {MAJOR_TYPES[major]} (RFC 8949 section 3.2.3)", at)
            if size > self.remaining():
                raise self._fail(field, f"a chunk of {size} octets, only {self.remaining()} remain", at)
            parts.append(self.data[self.pos:self.pos + size])
            self.pos += size
        return b"".join(parts)

    def item(self, field: str, depth: int = 0) -> Any:
        """The next data item as plain Python values (int, bytes, str, list, dict, float, bool, None, Tagged,
        Simple)."""
        start = self.pos
        major, info, argument = self.head(field)
        if major == 0:
            return argument
        if major == 1:
            return -1 - argument
        if major in (2, 3) and argument == INDEFINITE:
            joined = self._chunks(field, major, start)
            if major == 2:
                return joined
            try:
                return joined.decode("utf-8")
            except UnicodeDecodeError:
                raise self._fail(field, "a text string that is not UTF-8 (RFC 8949 section 3.1)", start) from None
        if major in (2, 3):
            if argument > self.remaining():
                raise self._fail(field, f"{MAJOR_TYPES[major]} of {argument} octets, only {self.remaining()} "
                                 "remain", start)
            raw = self.data[self.pos:self.pos + argument]
            self.pos += argument
            if major == 2:
                return raw
            try:
                return raw.decode("utf-8")
            except UnicodeDecodeError:
                raise self._fail(field, "a text string that is not UTF-8 (RFC 8949 section 3.1)", start) from None
        if major in (4, 5, 6) and depth >= self.max_depth:
            raise self._fail(field, f"arrays, maps and tags nested deeper than {self.max_depth}", start)
        if major == 4 and argument == INDEFINITE:
            items: list[Any] = []
            while not self._at_break(field, start):
                items.append(self.item(f"{field}[{len(items)}]", depth + 1))
            return items
        if major == 4:
            if argument > self.remaining():  # each element takes at least one octet
                raise self._fail(field, f"an array of {argument} elements, only {self.remaining()} octets remain",
                                 start)
            return [self.item(f"{field}[{i}]", depth + 1) for i in range(argument)]
        if major == 5:
            if argument != INDEFINITE and argument > self.remaining() // 2:
                raise self._fail(field, f"a map of {argument} pairs, only {self.remaining()} octets remain", start)
            out: dict[int | str | bytes, Any] = {}
            pairs = 0
            while (pairs < argument) if argument != INDEFINITE else not self._at_break(field, start):
                pairs += 1
                key_at = self.pos
                key = self.item(f"{field} key", depth + 1)
                if type(key) not in (int, str, bytes):
                    raise self._fail(field, f"map key {describe(key)}: the harness reads integer, text and byte "
                                     "string keys", key_at)
                if key in out:
                    raise self._fail(field, f"map key {describe(key)} appears twice (RFC 8949 section 5.6)", key_at)
                out[key] = self.item(f"{field}[{key!r}]", depth + 1)
            return out
        if major == 6:
            return Tagged(argument, self.item(f"{field} (in tag {argument})", depth + 1))
        if info in _FLOATS:
            size = 1 << (info - 24)
            value: float = struct.unpack(_FLOATS[info], argument.to_bytes(size, "big"))[0]
            return value
        return {20: False, 21: True, 22: None}.get(argument, Simple(argument))

    def whole(self, field: str) -> Any:
        """The one data item that is all of ``data``: KvcsError when octets follow it."""
        value = self.item(field)
        if not self.at_end():
            raise self._fail(field, f"{self.remaining()} octet(s) after the data item, expected none", self.pos)
        return value
