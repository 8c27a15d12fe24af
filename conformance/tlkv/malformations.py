"""Envelopes that break exactly one TLKV rule: a valid envelope with one field changed (STYLE.md, scapy).

The reader suite feeds them to a reader, the decode suite wraps them in a KvChunk; acceptable outcomes
per role come from outcomes.yaml.  Every malformation keeps the CRC right unless the CRC is the point.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from kvconform.checksum import crc32c
from kvconform.tlkv.envelope import HEADER, Block, encode_envelope, with_crc
from kvconform.tlkv.geometry import Geometry
from kvconform.tlkv.layers import craft

Build = Callable[[Geometry, int, list[Block]], bytes]


@dataclass(frozen=True)
class Malformation:
    """One rule broken on purpose; `error` is its class (format | shape | version)."""

    id: str
    requirements: tuple[str, ...]
    error: str
    build: Build
    n_blocks: int = 1
    min_block_tokens: int = 1
    chunkable: bool = True  # a meaningful KvChunk payload (an empty payload means "use the held copy")
    chunk_rule: str | None = None  # the rule it breaks first in a KvChunk, when that is a transfer rule

    @property
    def decode_rule(self) -> str:
        """The rule a decode side that accepts it in a chunk has not applied."""
        return self.chunk_rule or self.requirements[0]


def full_block(rng: np.random.Generator, geometry: Geometry, fill: int | None = None) -> Block:
    """A block with fresh contents; full blocks get a fresh non-zero hash, partial ones hash 0."""
    from kvconform.tlkv.content import make_kv

    fill = geometry.block_tokens if fill is None else fill
    block_hash = int(rng.integers(1, 1 << 63)) if fill == geometry.block_tokens else 0
    return Block(block_hash, fill, make_kv(rng, geometry, 1, garbage_tail=True)[0])


def _other(geometry: Geometry, dim: str) -> Geometry:
    d = geometry.as_dict()
    d[dim] += 1
    return Geometry.from_dict(d)


def _shape(dim: str) -> Build:
    def build(g: Geometry, v: int, blocks: list[Block]) -> bytes:
        other = _other(g, dim)
        rng = np.random.default_rng(blocks[0].block_hash & 0xFFFF)
        kv = full_block(rng, other).kv
        return encode_envelope(other, v, [Block(blocks[0].block_hash, other.block_tokens, kv)])
    return build


def _insert_before_crc(g: Geometry, v: int, blocks: list[Block]) -> bytes:
    data = encode_envelope(g, v, blocks)
    return with_crc(data[:-4] + b"\x00" + data[-4:])


def _truncate_payload(g: Geometry, v: int, blocks: list[Block]) -> bytes:
    data = encode_envelope(g, v, blocks)
    return with_crc(data[: len(data) - 4 - min(16, g.payload_size(v) - 1)] + data[-4:])


def _flip_payload_bit(g: Geometry, v: int, blocks: list[Block]) -> bytes:
    data = bytearray(encode_envelope(g, v, blocks))
    data[28 + 12 + 1] ^= 0x10  # the CRC is left as it was: it no longer matches
    return bytes(data)


def _last_record_bad(g: Geometry, v: int, blocks: list[Block]) -> bytes:
    return craft(g, v, blocks, **{f"records[{len(blocks) - 1}].n_tokens": 0})


def _envelope_of(g: Geometry, v: int, blocks: list[Block]) -> bytes:
    return encode_envelope(g, v, blocks)


MALFORMATIONS: list[Malformation] = [
    Malformation("length-0", ("TLKV-READ-LENGTH",), "format", lambda g, v, b: b"", chunkable=False),
    Malformation("length-31", ("TLKV-READ-LENGTH",), "format", lambda g, v, b: _envelope_of(g, v, b)[:31]),
    Malformation("length-header-only", ("TLKV-READ-LENGTH",), "format",
                 lambda g, v, b: _envelope_of(g, v, b)[:28]),
    Malformation("length-extra-byte", ("TLKV-READ-LENGTH",), "format", _insert_before_crc),
    Malformation("length-truncated-payload", ("TLKV-READ-LENGTH",), "format", _truncate_payload),
    # In a KvChunk, n_blocks 2 breaks "a whole envelope with n_blocks = 1" before the length rule it also breaks.
    Malformation("n-blocks-plus-one", ("TLKV-READ-LENGTH",), "format",
                 lambda g, v, b: craft(g, v, b, n_blocks=len(b) + 1), chunk_rule="TLKV-XFER-ONE-BLOCK"),
    Malformation("magic", ("TLKV-READ-MAGIC",), "format", lambda g, v, b: craft(g, v, b, magic=b"TLKW")),
    Malformation("magic-lowercase", ("TLKV-READ-MAGIC",), "format", lambda g, v, b: craft(g, v, b, magic=b"tlkv")),
    Malformation("crc-field", ("TLKV-READ-CRC",), "format",
                 lambda g, v, b: craft(g, v, b, crc32c=crc32c(_envelope_of(g, v, b)[:-4]) ^ 1)),
    Malformation("crc-payload-bit", ("TLKV-READ-CRC",), "format", _flip_payload_bit),
    Malformation("version-7", ("TLKV-READ-VERSION",), "version", lambda g, v, b: craft(g, v, b, version=7)),
    Malformation("version-0", ("TLKV-READ-VERSION",), "version", lambda g, v, b: craft(g, v, b, version=0)),
    Malformation("dtype-not-version", ("TLKV-READ-DTYPE",), "format",
                 lambda g, v, b: craft(g, v, b, dtype={1: 3, 2: 1}[v])),
    Malformation("dtype-2", ("TLKV-READ-DTYPE",), "format", lambda g, v, b: craft(g, v, b, dtype=2)),
    Malformation("shape-block-tokens", ("TLKV-READ-SHAPE",), "shape", _shape("block_tokens")),
    Malformation("shape-n-layers", ("TLKV-READ-SHAPE",), "shape", _shape("n_layers")),
    Malformation("shape-n-kv-heads", ("TLKV-READ-SHAPE",), "shape", _shape("n_kv_heads")),
    Malformation("shape-head-dim", ("TLKV-READ-SHAPE",), "shape", _shape("head_dim")),
    Malformation("n-tokens-0", ("TLKV-READ-NTOKENS",), "format",
                 lambda g, v, b: craft(g, v, b, **{"records[0].n_tokens": 0, "records[0].block_hash": 0})),
    Malformation("n-tokens-b-plus-1", ("TLKV-READ-NTOKENS",), "format",
                 lambda g, v, b: craft(g, v, b, **{"records[0].n_tokens": g.block_tokens + 1,
                                                   "records[0].block_hash": 0})),
    Malformation("hash-on-partial", ("TLKV-READ-HASH-FULL",), "format",
                 lambda g, v, b: craft(g, v, b, **{"records[0].n_tokens": g.block_tokens - 1}), min_block_tokens=2),
    Malformation("last-of-three-bad", ("TLKV-READ-NTOKENS", "TLKV-READ-NOALLOC"), "format", _last_record_bad,
                 n_blocks=3, chunkable=False),
]


@cache
def _outcomes() -> dict[str, Any]:
    data: dict[str, Any] = yaml.safe_load((Path(__file__).parent / "outcomes.yaml").read_text())
    return data


def statuses(name: str) -> list[str]:
    """The named set of gRPC statuses (outcomes.yaml `statuses`) a decode side may answer."""
    named: dict[str, list[str]] = _outcomes()["statuses"]
    return list(named[name])


def _resolve(entry: str | list[str]) -> list[str]:
    return statuses(entry) if isinstance(entry, str) else list(entry)


def acceptable(role: str, m: Malformation) -> list[str]:
    """Acceptable outcomes of `m` for `role` ("reader": error classes, "decode": gRPC status names)."""
    table = _outcomes()
    override = table.get("overrides", {}).get(role, {}).get(m.id)
    if override is not None:
        return _resolve(override)
    entry: str | list[str] = table[role][m.error]
    return _resolve(entry) if role == "decode" else list(entry)


def vector_classes(vector_id: str, error: str) -> list[str]:
    """Acceptable error classes of an invalid reader vector: its own, or the outcomes.yaml override."""
    override = _outcomes().get("overrides", {}).get("reader-vectors", {}).get(vector_id)
    return list(override) if override is not None else [error]


def applicable(m: Malformation, geometry: Geometry) -> bool:
    return geometry.block_tokens >= m.min_block_tokens


def record_hash(data: bytes, default: int) -> int:
    """The first record's block_hash when the envelope is long enough to have one."""
    return int(struct.unpack_from("<Q", data, 28)[0]) if len(data) >= 36 else default


def header_of(data: bytes) -> dict[str, Any]:
    """A few header fields for evidence, read leniently."""
    if len(data) < 28:
        return {"len": len(data)}
    magic, version, dtype, n, b, layers, hkv, d = HEADER.unpack_from(data)
    return {"len": len(data), "magic": magic.hex(), "version": version, "dtype": dtype, "n_blocks": n,
            "geometry": [b, layers, hkv, d]}
