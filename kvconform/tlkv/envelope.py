"""Export envelope encoders (TLKV "Export envelope"): a checked path and a raw path.

The checked path refuses what the text forbids and produces canonical bytes (zero padding, chained
hashes, CRC).  The raw path writes exactly the fields it is given, so a negative test is a valid
envelope with one field changed.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from kvconform.checksum import crc32c
from kvconform.tlkv.blockhash import NO_HASH, block_fills, block_hashes
from kvconform.tlkv.geometry import CRC_SIZE, HEADER_SIZE, RECORD_HEADER_SIZE, Geometry
from kvconform.tlkv.payload import encode_v1_into, encode_v2_into

MAGIC = b"TLKV"
VERSION_V1 = 1
VERSION_V2 = 2
DTYPE_F16 = 1
DTYPE_E4M3 = 3
DTYPE_OF_VERSION = {VERSION_V1: DTYPE_F16, VERSION_V2: DTYPE_E4M3}

HEADER = struct.Struct("<4sHHIIIII")
RECORD_HEADER = struct.Struct("<QI")
CRC = struct.Struct("<I")


@dataclass
class Block:
    """One block's contents: its hash (0 when unregistered), its fill and its values [L][2][Hkv][B][D]."""

    block_hash: int
    n_tokens: int
    kv: npt.NDArray[np.floating]


class EncodeError(ValueError):
    """The checked encoder refused a value the text forbids; names the field and the requirement."""

    def __init__(self, field: str, seen: object, expected: str, requirement: str) -> None:
        super().__init__(f"{field}: got {seen!r}, expected {expected} ({requirement})")
        self.field, self.seen, self.expected, self.requirement = field, seen, expected, requirement


def _check_block(geometry: Geometry, i: int, block: Block) -> None:
    b = geometry.block_tokens
    if not 1 <= block.n_tokens <= b:
        raise EncodeError(f"blocks[{i}].n_tokens", block.n_tokens, f"1..{b}", "TLKV-ENV-NTOKENS")
    if not 0 <= block.block_hash < 1 << 64:
        raise EncodeError(f"blocks[{i}].block_hash", block.block_hash, "a u64", "TLKV-ENV-RECORD")
    if block.block_hash != NO_HASH and block.n_tokens != b:
        raise EncodeError(f"blocks[{i}].block_hash", hex(block.block_hash),
                          f"0 for a partial block (n_tokens {block.n_tokens} < B {b})", "TLKV-HASH-FULL-ONLY")
    if tuple(block.kv.shape) != geometry.kv_shape:
        raise EncodeError(f"blocks[{i}].kv.shape", tuple(block.kv.shape), str(geometry.kv_shape), "TLKV-V1-LAYOUT")


def encode_envelope_into(out: bytearray | memoryview | npt.NDArray[np.uint8], geometry: Geometry, version: int,
                         blocks: Sequence[Block]) -> int:
    """Write the canonical envelope of `blocks` (checked path) into the caller's writable buffer.

    `out` (a bytearray, a uint8 numpy array or a writable memoryview) must hold at least
    geometry.envelope_size(len(blocks), version) bytes; returns the number of bytes written.  This is
    the C API's split: tl_kv_export_bytes, then tl_kv_export into the caller's buffer.
    """
    if version not in DTYPE_OF_VERSION:
        raise EncodeError("version", version, "1 or 2", "TLKV-ENV-VERSION")
    for i, block in enumerate(blocks):
        _check_block(geometry, i, block)
    p = geometry.payload_size(version)
    total = geometry.envelope_size(len(blocks), version)
    if isinstance(out, np.ndarray) and not out.flags.c_contiguous:
        raise ValueError("out: the array is not contiguous")
    dst = out.reshape(-1) if isinstance(out, np.ndarray) else np.frombuffer(out, np.uint8)
    if dst.dtype != np.uint8 or len(dst) < total:
        raise ValueError(f"out: got {len(dst)} bytes of {dst.dtype}, expected at least {total} uint8")
    if not dst.flags.writeable:
        raise ValueError("out: the buffer is read-only")
    dst = dst[:total]
    buf = memoryview(dst)  # type: ignore[arg-type]
    HEADER.pack_into(buf, 0, MAGIC, version, DTYPE_OF_VERSION[version], len(blocks), geometry.block_tokens,
                     geometry.n_layers, geometry.n_kv_heads, geometry.head_dim)
    encode_into = encode_v1_into if version == VERSION_V1 else encode_v2_into
    off = HEADER_SIZE
    crc = 0
    for block in blocks:
        RECORD_HEADER.pack_into(buf, off, block.block_hash, block.n_tokens)
        encode_into(dst[off + RECORD_HEADER_SIZE : off + RECORD_HEADER_SIZE + p], geometry, block.kv, block.n_tokens)
        # CRC each record right after writing it, while its bytes are still in cache.
        crc = crc32c(buf[0 if off == HEADER_SIZE else off : off + RECORD_HEADER_SIZE + p], crc)
        off += RECORD_HEADER_SIZE + p
    if not blocks:
        crc = crc32c(buf[:off])
    CRC.pack_into(buf, off, crc)
    return total


def encode_envelope(geometry: Geometry, version: int, blocks: Sequence[Block]) -> bytes:
    """The canonical envelope of `blocks` (checked path)."""
    if version not in DTYPE_OF_VERSION:
        raise EncodeError("version", version, "1 or 2", "TLKV-ENV-VERSION")
    out = bytearray(geometry.envelope_size(len(blocks), version))
    encode_envelope_into(out, geometry, version, blocks)
    return bytes(out)


def sequence_blocks(geometry: Geometry, tokens: Sequence[int], kv: npt.NDArray[np.floating]) -> list[Block]:
    """The blocks of a token sequence: chained hashes, fills, values kv[i] ([n][L][2][Hkv][B][D])."""
    hashes = block_hashes(tokens, geometry.block_tokens)
    fills = block_fills(len(tokens), geometry.block_tokens)
    if kv.shape[0] < len(hashes):
        raise EncodeError("kv.shape[0]", kv.shape[0], f">= {len(hashes)} blocks", "TLKV-HASH-BLOCKS")
    return [Block(h, n, kv[i]) for i, (h, n) in enumerate(zip(hashes, fills, strict=True))]


def encode_sequence(geometry: Geometry, version: int, tokens: Sequence[int],
                    kv: npt.NDArray[np.floating]) -> bytes:
    """The envelope of a whole token sequence (every block, the partial tail with hash 0)."""
    return encode_envelope(geometry, version, sequence_blocks(geometry, tokens, kv))


def encode_raw(
    *,
    magic: bytes = MAGIC,
    version: int,
    dtype: int,
    n_blocks: int | None = None,
    block_tokens: int,
    n_layers: int,
    n_kv_heads: int,
    head_dim: int,
    records: Sequence[tuple[int, int, bytes]],
    crc: int | None = None,
) -> bytes:
    """Exactly the given fields (raw path): n_blocks defaults to len(records), crc to the true CRC."""
    parts = [HEADER.pack(magic, version, dtype,
                         len(records) if n_blocks is None else n_blocks,
                         block_tokens, n_layers, n_kv_heads, head_dim)]
    for block_hash, n_tokens, payload in records:
        parts.append(RECORD_HEADER.pack(block_hash, n_tokens))
        parts.append(bytes(payload))
    body = b"".join(parts)
    return body + CRC.pack(crc32c(body) if crc is None else crc)


def with_crc(body_and_old_crc: bytes) -> bytes:
    """Recompute the trailing CRC after a deliberate change, so only the intended field is wrong."""
    body = body_and_old_crc[:-CRC_SIZE]
    return body + CRC.pack(crc32c(body))
