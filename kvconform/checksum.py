"""CRC-32C (Castagnoli), hardware-accelerated through the `crc32c` package (SSE4.2 / ARMv8 CRC)."""

from __future__ import annotations

import crc32c as _crc32c

Buffer = bytes | bytearray | memoryview

CRC32C_CHECK = 0xE3069283  # crc32c(b"123456789"), the catalogue check value


def crc32c(data: Buffer, value: int = 0) -> int:
    """CRC-32C of `data`; pass a previous result as `value` to continue it over more bytes."""
    return int(_crc32c.crc32c(data, value))
