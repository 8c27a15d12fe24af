"""MOQT variable-length integers (profile §2) and the byte cursor every decoder reads with.

Not the RFC 9000 varint: the count of leading 1-bits of the first byte is the number of extra bytes
(0..8), so one byte holds 0..127 and nine bytes hold a full 64-bit value.  Non-minimal encodings are
legal on receive; the checked encoder emits the minimal form, ``encode_vi64(v, size=n)`` a chosen one.
"""

from __future__ import annotations

from kvconform.moqt.errors import MoqtDecodeError, MoqtEncodeError, NeedMoreData, SessionError

__all__ = ["MAX_VI64", "Reader", "decode_vi64", "encode_vi64", "vi64_size"]

MAX_VI64 = (1 << 64) - 1
# Largest value for each encoded size 1..9 (index = size).
_MAX_FOR_SIZE = [0] + [(1 << (7 * n)) - 1 for n in range(1, 9)] + [MAX_VI64]


def vi64_size(value: int) -> int:
    """Bytes of the minimal encoding of ``value``."""
    if value < 0 or value > MAX_VI64:
        raise MoqtEncodeError(f"vi64 value {value} outside 0..2^64-1 (profile §2)")
    for size in range(1, 10):
        if value <= _MAX_FOR_SIZE[size]:
            return size
    raise AssertionError("unreachable")  # pragma: no cover


def encode_vi64(value: int, size: int | None = None) -> bytes:
    """Encode ``value``; minimal unless ``size`` (1..9) asks for a longer, still legal, encoding."""
    minimal = vi64_size(value)
    n = minimal if size is None else size
    if not minimal <= n <= 9:
        raise MoqtEncodeError(f"vi64 value {value} does not fit in {n} bytes (needs >= {minimal}, max 9)")
    if n == 9:
        return b"\xff" + value.to_bytes(8, "big")
    extra = n - 1
    prefix = (0xFF << (8 - extra)) & 0xFF  # `extra` leading ones, then a zero bit
    raw = value.to_bytes(n, "big")
    return bytes([prefix | raw[0]]) + raw[1:]


def decode_vi64(
    buf: bytes | bytearray | memoryview, offset: int = 0, field: str = "vi64", limit: int | None = None
) -> tuple[int, int]:
    """(value, offset after it); NeedMoreData naming ``field`` when ``buf`` (or ``limit``) ends inside it."""
    stop = len(buf) if limit is None else limit
    if offset >= stop:
        raise NeedMoreData(field, offset)
    first = buf[offset]
    extra = 8 if first == 0xFF else 8 - (~first & 0xFF).bit_length()
    end = offset + 1 + extra
    if end > stop:
        raise NeedMoreData(field, offset, f"vi64 needs {extra + 1} bytes, {stop - offset} available")
    if extra == 8:
        return int.from_bytes(buf[offset + 1 : end], "big"), end
    value = first & (0xFF >> (extra + 1))
    for b in buf[offset + 1 : end]:
        value = (value << 8) | b
    return value, end


class Reader:
    """A cursor over ``buf[start:end]`` whose errors name the field and its absolute offset.

    ``final`` says the bytes up to ``end`` are all there will ever be (a framed message body, a stream
    after FIN): running past ``end`` is then a MoqtDecodeError with ``code`` instead of NeedMoreData.
    """

    def __init__(
        self,
        buf: bytes | bytearray | memoryview,
        start: int = 0,
        end: int | None = None,
        *,
        final: bool = True,
        code: SessionError = SessionError.PROTOCOL_VIOLATION,
        context: str = "",
    ) -> None:
        self.buf = buf
        self.pos = start
        self.end = len(buf) if end is None else end
        self.final = final
        self.code = code
        self.context = context  # prefix for field names, e.g. "SUBSCRIBE."

    def name(self, field: str) -> str:
        return self.context + field

    def remaining(self) -> int:
        return self.end - self.pos

    def at_end(self) -> bool:
        return self.pos >= self.end

    def error(
        self, field: str, message: str, offset: int | None = None, code: SessionError | None = None
    ) -> MoqtDecodeError:
        """A decode error for ``field`` at ``offset`` (default: the cursor)."""
        return MoqtDecodeError(self.name(field), self.pos if offset is None else offset, message, code or self.code)

    def _short(self, field: str, need: int) -> MoqtDecodeError:
        have = self.end - self.pos
        if self.final:
            return self.error(field, f"needs {need} byte(s), only {have} left before the end at {self.end}")
        return NeedMoreData(self.name(field), self.pos, f"needs {need} byte(s), {have} available")

    def vi64(self, field: str) -> int:
        try:
            value, new = decode_vi64(self.buf, self.pos, field, self.end)
        except NeedMoreData:
            first = self.buf[self.pos] if self.pos < self.end else 0
            need = 9 if first == 0xFF else 9 - (~first & 0xFF).bit_length()
            raise self._short(field, need) from None
        self.pos = new
        return value

    def u8(self, field: str) -> int:
        if self.pos + 1 > self.end:
            raise self._short(field, 1)
        value = self.buf[self.pos]
        self.pos += 1
        return value

    def u16(self, field: str) -> int:
        if self.pos + 2 > self.end:
            raise self._short(field, 2)
        value = int.from_bytes(self.buf[self.pos : self.pos + 2], "big")
        self.pos += 2
        return value

    def take(self, n: int, field: str) -> bytes:
        if self.pos + n > self.end:
            raise self._short(field, n)
        value = _copy(self.buf, self.pos, self.pos + n)
        self.pos += n
        return value

    def rest(self) -> bytes:
        value = _copy(self.buf, self.pos, self.end)
        self.pos = self.end
        return value

    def sub(self, length: int, field: str) -> Reader:
        """A final Reader over the next ``length`` bytes (a length-prefixed value); skips them here."""
        if self.pos + length > self.end:
            raise self._short(field, length)
        inner = Reader(self.buf, self.pos, self.pos + length, final=True, code=self.code, context=self.context)
        self.pos += length
        return inner


def _copy(buf: bytes | bytearray | memoryview, start: int, end: int) -> bytes:
    """``bytes(buf[start:end])`` with one copy, not two (a bytearray slice is itself a copy); the view
    is released at once, so the caller may resize a bytearray afterwards."""
    if isinstance(buf, bytes):
        return buf[start:end]
    with memoryview(buf) as view, view[start:end] as part:
        return bytes(part)
