"""The pure-Python engine's mutator: seeded, structure-aware changes to corpus inputs.

Generic byte mutations (bit flips, byte sets, inserts, deletes, repeats, splices, truncations) plus what
the target says about its structure: dictionary tokens, integer boundaries at its fixed-layout integer
fields, and boundary vi64 encodings (minimal or not) in place of the vi64 fields of MOQT-like input.
Every choice comes from the ``random.Random`` it is given, so a seed replays the same inputs.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence

from kvconform.fuzz.target import FuzzTarget
from kvconform.moqt.vi64 import MAX_VI64, decode_vi64, encode_vi64

__all__ = ["Mutator", "boundaries"]

_INTERESTING8 = (0x00, 0x01, 0x7F, 0x80, 0xFE, 0xFF)
_REPEATS = (1, 2, 3, 8, 64, 512, 4096)  # large counts build deep nesting and long runs
_VI64_VALUES = (0, 1, 2, 63, 64, 127, 128, 255, 256, 2**14 - 1, 2**14, 0xFFFF, 0x10000, 2**21 - 1, 2**31, 2**32 - 1,
                2**32, 2**56 - 1, 2**62, 2**63 - 1, 2**63, MAX_VI64 - 1, MAX_VI64)

Op = Callable[[bytearray, Sequence[bytes]], None]


def boundaries(size: int, length: int) -> list[int]:
    """Integer values where wrong implementations differ, for a field of ``size`` octets in an input of
    ``length`` octets: 0, 1, the extremes of the unsigned and signed ranges, and lengths near the input's."""
    top = (1 << (8 * size)) - 1
    values = [0, 1, 2, top, top - 1, top >> 1, (top >> 1) + 1, length, length - 1, length + 1, 16, 255, 256]
    return [v & top for v in values]


class Mutator:
    """Mutations of corpus inputs for one target, every choice from ``rng``."""

    def __init__(self, target: FuzzTarget, rng: random.Random, max_len: int) -> None:
        self.target = target
        self.rng = rng
        self.max_len = max_len
        ops: list[Op] = [self._flip_bit, self._set_byte, self._arith, self._insert_random, self._delete,
                         self._repeat, self._splice, self._overwrite_from_other, self._truncate, self._int_anywhere]
        if target.dictionary:
            ops += [self._insert_token, self._overwrite_token] * 2
        if target.int_fields:
            ops += [self._int_field] * 3
        if target.varints:
            ops += [self._vi64] * 4
        self._ops = ops

    def mutate(self, data: bytes, pool: Sequence[bytes]) -> bytes:
        """``data`` after one to eight stacked mutations, cut to ``max_len``."""
        buf = bytearray(data)
        rng = self.rng
        n = 1
        while n < 8 and rng.random() < 0.5:
            n += 1
        for _ in range(n):
            rng.choice(self._ops)(buf, pool)
        del buf[self.max_len :]
        return bytes(buf)

    # ---- generic -----------------------------------------------------------------------------

    def _pos(self, buf: bytearray, *, end: bool = False) -> int:
        return self.rng.randrange(len(buf) + (1 if end else 0)) if buf or end else 0

    def _flip_bit(self, buf: bytearray, pool: Sequence[bytes]) -> None:
        if buf:
            buf[self._pos(buf)] ^= 1 << self.rng.randrange(8)

    def _set_byte(self, buf: bytearray, pool: Sequence[bytes]) -> None:
        if buf:
            buf[self._pos(buf)] = self.rng.choice(_INTERESTING8) if self.rng.random() < 0.5 else self.rng.randrange(256)

    def _arith(self, buf: bytearray, pool: Sequence[bytes]) -> None:
        if buf:
            i = self._pos(buf)
            buf[i] = (buf[i] + self.rng.choice((-16, -2, -1, 1, 2, 16))) & 0xFF

    def _insert_random(self, buf: bytearray, pool: Sequence[bytes]) -> None:
        i = self._pos(buf, end=True)
        buf[i:i] = bytes(self.rng.randrange(256) for _ in range(self.rng.randint(1, 8)))

    def _delete(self, buf: bytearray, pool: Sequence[bytes]) -> None:
        if buf:
            i = self._pos(buf)
            del buf[i : i + self.rng.randint(1, 16)]

    def _repeat(self, buf: bytearray, pool: Sequence[bytes]) -> None:
        if not buf:
            return
        i = self._pos(buf)
        chunk = bytes(buf[i : i + self.rng.randint(1, 8)])
        times = min(self.rng.choice(_REPEATS), max(1, (self.max_len - len(buf)) // len(chunk)))
        buf[i:i] = chunk * times

    def _splice(self, buf: bytearray, pool: Sequence[bytes]) -> None:
        other = self.rng.choice(pool) if pool else b""
        i, j = self._pos(buf, end=True), self.rng.randrange(len(other) + 1)
        buf[i:] = other[j:]

    def _overwrite_from_other(self, buf: bytearray, pool: Sequence[bytes]) -> None:
        other = self.rng.choice(pool) if pool else b""
        if other and buf:
            j = self.rng.randrange(len(other))
            chunk = other[j : j + self.rng.randint(1, 32)]
            i = self._pos(buf)
            buf[i : i + len(chunk)] = chunk

    def _truncate(self, buf: bytearray, pool: Sequence[bytes]) -> None:
        del buf[self._pos(buf, end=True) :]

    def _write_int(self, buf: bytearray, offset: int, size: int, byteorder: str, length: int) -> None:
        value = self.rng.choice(boundaries(size, length))
        buf[offset : offset + size] = value.to_bytes(size, "big" if byteorder == "big" else "little")

    def _int_anywhere(self, buf: bytearray, pool: Sequence[bytes]) -> None:
        size = self.rng.choice((1, 2, 4, 8))
        if len(buf) >= size:
            self._write_int(buf, self.rng.randrange(len(buf) - size + 1), size, self.rng.choice(("big", "little")),
                            len(buf))

    # ---- structure-aware -------------------------------------------------------------------------

    def _insert_token(self, buf: bytearray, pool: Sequence[bytes]) -> None:
        i = self._pos(buf, end=True)
        buf[i:i] = self.rng.choice(self.target.dictionary)

    def _overwrite_token(self, buf: bytearray, pool: Sequence[bytes]) -> None:
        token = self.rng.choice(self.target.dictionary)
        i = self._pos(buf, end=True)
        buf[i : i + len(token)] = token

    def _int_field(self, buf: bytearray, pool: Sequence[bytes]) -> None:
        f = self.rng.choice(self.target.int_fields)
        if f.offset + f.size <= len(buf):
            self._write_int(buf, f.offset, f.size, f.byteorder, len(buf))

    def _vi64(self, buf: bytearray, pool: Sequence[bytes]) -> None:
        """Replace one vi64 (read in sequence from a random start) with a boundary value, maybe non-minimal."""
        if not buf:
            return
        fields: list[tuple[int, int]] = []
        off = self._pos(buf)
        while off < len(buf) and len(fields) < 16:
            try:
                _, end = decode_vi64(buf, off)
            except ValueError:
                break
            fields.append((off, end))
            off = end
        if not fields:
            return
        start, end = self.rng.choice(fields)
        value = self.rng.choice((*_VI64_VALUES, len(buf) - end, len(buf) - end + 1, self.rng.randrange(300)))
        value = min(max(value, 0), MAX_VI64)
        minimal = len(encode_vi64(value))
        size = minimal if self.rng.random() < 0.7 else self.rng.randint(minimal, 9)
        buf[start:end] = encode_vi64(value, size=size)
