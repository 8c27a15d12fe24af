"""One ``tl.kv.v1`` KvChunk as a plain dataclass (TLKV "Transfer (tl.kv.v1)").

The core works on :class:`Chunk`; only the gRPC adapters and tests touch the generated protobuf class.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from google.protobuf.message import DecodeError

from kvconform.checksum import crc32c
from kvconform.tlkv.proto import tl_kv_v1_pb2 as pb

MAX_CHUNK_PAYLOAD = 4 * 1024 * 1024  # "at most 4 MiB" per KvChunk.payload


class KvFormat(enum.IntEnum):
    """tl.kv.v1 ``KvFormat`` (TLKV "Transfer (tl.kv.v1)"); the value equals the envelope version it names."""

    UNSPECIFIED = 0
    V1 = 1
    V2 = 2


def format_name(value: int) -> str:
    """``KV_FORMAT_V1`` for 1, ``KV_FORMAT_<n>`` for a value the enum does not name (proto3 keeps them)."""
    try:
        return f"KV_FORMAT_{KvFormat(value).name}"
    except ValueError:
        return f"KV_FORMAT_<{value}>"


class ChunkDecodeError(ValueError):
    """The bytes of a KvChunk are not a parseable tl.kv.v1 protobuf message."""


@dataclass(frozen=True)
class Chunk:
    """A KvChunk (TLKV "Transfer (tl.kv.v1)"): one block of a PushKv stream.

    ``kv_format`` is an int, not a :class:`KvFormat`, so a chunk can carry a value the enum lacks.
    """

    request_id: str
    block_index: int
    block_hash: int
    kv_format: int
    payload: bytes
    crc32c: int

    @classmethod
    def for_payload(cls, request_id: str, block_index: int, block_hash: int, kv_format: int,
                    payload: bytes) -> Chunk:
        """A chunk whose crc32c is the CRC-32C of ``payload`` (0 for an empty payload)."""
        return cls(request_id, block_index, block_hash, int(kv_format), bytes(payload), crc32c(payload))

    def to_pb(self) -> pb.KvChunk:
        return pb.KvChunk(
            request_id=self.request_id,
            block_index=self.block_index,
            block_hash=self.block_hash,
            kv_format=self.kv_format,  # type: ignore[arg-type]  # open enum: any int is legal on the wire
            payload=self.payload,
            crc32c=self.crc32c,
        )

    @classmethod
    def from_pb(cls, msg: pb.KvChunk) -> Chunk:
        return cls(
            request_id=msg.request_id,
            block_index=msg.block_index,
            block_hash=msg.block_hash,
            kv_format=int(msg.kv_format),
            payload=bytes(msg.payload),
            crc32c=msg.crc32c,
        )

    def encode(self) -> bytes:
        """The chunk's protobuf wire bytes."""
        return bytes(self.to_pb().SerializeToString())

    @classmethod
    def decode(cls, data: bytes) -> Chunk:
        """Parse protobuf wire bytes; raises :class:`ChunkDecodeError` for anything unparseable."""
        try:
            msg = pb.KvChunk.FromString(data)
        except DecodeError as exc:
            raise ChunkDecodeError(f"KvChunk: {len(data)} bytes do not parse as tl.kv.v1.KvChunk: {exc}") from exc
        return cls.from_pb(msg)

    def describe(self) -> str:
        """One line for logs and evidence: everything but the payload bytes."""
        return (f"KvChunk(request_id={self.request_id!r}, block_index={self.block_index}, "
                f"block_hash=0x{self.block_hash:016X}, kv_format={format_name(self.kv_format)}, "
                f"payload={len(self.payload)} bytes, crc32c=0x{self.crc32c:08X})")
