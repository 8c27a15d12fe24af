"""Broken TLKV writers, readers, decode sides and prefill sides (targets: python:tests.mutants.tlkv:<Name>).

Each class breaks exactly one requirement, named in its docstring's first line; MUTANTS maps it to the
suite and the requirement whose check must fail.  Each is the reference with one step changed.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from pathlib import Path

import ml_dtypes
import numpy as np
import numpy.typing as npt

from kvconform.checksum import crc32c
from kvconform.targets.tlkv import (
    ImportedBlock,
    ImportOutcome,
    ReferenceDecode,
    ReferenceReader,
    ReferenceReaderSession,
    ReferenceWriter,
)
from kvconform.tlkv.blockhash import block_fills, block_hash, block_hashes, chain_hashes, fnv1a64, hash_input
from kvconform.tlkv.chunk import Chunk
from kvconform.tlkv.content import read_sequence
from kvconform.tlkv.decode import DecodeSide, PushStream, Status, TransferError
from kvconform.tlkv.envelope import DTYPE_OF_VERSION, encode_raw
from kvconform.tlkv.geometry import Geometry
from kvconform.tlkv.grpc_client import KvTransferClient
from kvconform.tlkv.payload import E4M3_MAX, encode_payload, v2_scales
from kvconform.tlkv.prefill import plan_push
from kvconform.tlkv.reader import EnvelopeError, EnvelopeReader, FormatError, Header, VersionError

F16Array = npt.NDArray[np.float16]


# ---- writers ------------------------------------------------------------------------------------


class _RawWriter:
    """A writer built from the raw encoder, so each mutant changes one step of the reference recipe."""

    def hashes(self, tokens: Sequence[int], b: int) -> list[int]:
        return block_hashes(tokens, b)

    def payload(self, g: Geometry, version: int, kv: np.ndarray, fill: int) -> bytes:
        return encode_payload(g, version, kv, fill)

    def export(self, geometry: Geometry, version: int, tokens: Sequence[int], kv: F16Array) -> bytes:
        g = geometry
        fills = block_fills(len(tokens), g.block_tokens)
        records = [(h, n, self.payload(g, version, kv[i], n))
                   for i, (h, n) in enumerate(zip(self.hashes(tokens, g.block_tokens), fills, strict=True))]
        return encode_raw(version=version, dtype=DTYPE_OF_VERSION[version], block_tokens=g.block_tokens,
                          n_layers=g.n_layers, n_kv_heads=g.n_kv_heads, head_dim=g.head_dim, records=records)


class NoZeroPadWriter(_RawWriter):
    """TLKV-V1-ZERO-PAD: copies the values past n_tokens instead of writing zero bytes."""

    def payload(self, g: Geometry, version: int, kv: np.ndarray, fill: int) -> bytes:
        return encode_payload(g, version, kv, g.block_tokens)


class UnchainedHashWriter(_RawWriter):
    """TLKV-HASH-CHAIN: hashes every block with parent 0."""

    def hashes(self, tokens: Sequence[int], b: int) -> list[int]:
        full = [block_hash(0, tokens[i : i + b]) for i in range(0, len(tokens) - b + 1, b)]
        return full + [0] * (len(tokens) % b != 0)


class NoZeroReplacementWriter(_RawWriter):
    """TLKV-HASH-ZERO-IS-ONE: keeps a computed fnv1a64 of 0 instead of replacing it by 1."""

    def hashes(self, tokens: Sequence[int], b: int) -> list[int]:
        out, parent = [], 0
        for i in range(0, len(tokens) - b + 1, b):
            parent = fnv1a64(hash_input(parent, tokens[i : i + b]))
            out.append(parent)
        return out + [0] * (len(tokens) % b != 0)


class HashedTailWriter(_RawWriter):
    """TLKV-HASH-FULL-ONLY: gives the partial tail block a hash."""

    def hashes(self, tokens: Sequence[int], b: int) -> list[int]:
        full = chain_hashes(tokens, b)
        if len(tokens) % b:
            full.append(block_hash(full[-1] if full else 0, tokens[len(full) * b :]))
        return full


class ScaleOverAllPositionsWriter(_RawWriter):
    """TLKV-V2-SCALE: takes amax over every position of the slab, filled or not."""

    def payload(self, g: Geometry, version: int, kv: np.ndarray, fill: int) -> bytes:
        if version != 2:
            return super().payload(g, version, kv, fill)
        scales = v2_scales(kv, g.block_tokens)
        q = (kv.astype(np.float32) / scales[:, :, :, None, None]).astype(ml_dtypes.float8_e4m3fn).view(np.uint8)
        q[:, :, :, fill:, :] = 0
        return q.tobytes() + scales.astype("<f4").tobytes()


class TruncatingE4M3Writer(_RawWriter):
    """TLKV-V2-E4M3: converts x / scale to e4m3 by truncation toward zero instead of rounding to nearest."""

    def payload(self, g: Geometry, version: int, kv: np.ndarray, fill: int) -> bytes:
        if version != 2:
            return super().payload(g, version, kv, fill)
        scales = v2_scales(kv, fill)
        x = kv.astype(np.float32) / scales[:, :, :, None, None]
        # Clear the low 20 mantissa bits of the f32: the cast to e4m3 then never rounds up.
        bits = x.view(np.uint32) & np.uint32(0xFFF00000)
        q = np.minimum(np.abs(bits.view(np.float32)), E4M3_MAX) * np.sign(x)
        e = q.astype(ml_dtypes.float8_e4m3fn).view(np.uint8)
        e[:, :, :, fill:, :] = 0
        out: bytes = e.tobytes() + scales.astype("<f4").tobytes()
        return out


class CrcOverRecordsOnlyWriter(ReferenceWriter):
    """TLKV-ENV-CRC: computes the CRC over the block records only, not the header."""

    def export(self, geometry: Geometry, version: int, tokens: Sequence[int], kv: F16Array) -> bytes:
        data = super().export(geometry, version, tokens, kv)
        return data[:-4] + struct.pack("<I", crc32c(data[28:-4]))


class BigEndianHeaderWriter(ReferenceWriter):
    """TLKV-ENV-LE: writes the header integers big-endian."""

    def export(self, geometry: Geometry, version: int, tokens: Sequence[int], kv: F16Array) -> bytes:
        data = super().export(geometry, version, tokens, kv)
        fields = struct.unpack_from("<4sHHIIIII", data)
        body = struct.pack(">4sHHIIIII", *fields) + data[28:-4]
        return body + struct.pack("<I", crc32c(body))


# ---- readers ------------------------------------------------------------------------------------


def _reader(reader_class: type[EnvelopeReader]) -> type[ReferenceReader]:
    session = type(f"{reader_class.__name__}Session", (ReferenceReaderSession,), {"reader_class": reader_class})
    return type(f"{reader_class.__name__}Driver", (ReferenceReader,), {"session_class": session})


class _SkipsCrc(EnvelopeReader):
    def check_crc(self, buf: memoryview) -> None:
        return None


class _AcceptsZeroTokens(EnvelopeReader):
    def check_record(self, i: int, block_hash: int, n_tokens: int) -> None:
        if n_tokens != 0:
            super().check_record(i, block_hash, n_tokens)


class _AnyKnownDtype(EnvelopeReader):
    def check_dtype(self, hdr: Header) -> None:
        if hdr.dtype not in (1, 3):
            super().check_dtype(hdr)


class _VersionAsFormat(EnvelopeReader):
    def check_version(self, hdr: Header) -> None:
        try:
            super().check_version(hdr)
        except VersionError as exc:
            raise FormatError(exc.requirement, exc.field, exc.seen, exc.expected) from exc


class _IgnoresShape(EnvelopeReader):
    def check_shape(self, hdr: Header) -> None:
        return None


SkipsCrcReader = _reader(_SkipsCrc)
SkipsCrcReader.__doc__ = "TLKV-READ-CRC: never checks the CRC."
ZeroTokensReader = _reader(_AcceptsZeroTokens)
ZeroTokensReader.__doc__ = "TLKV-READ-NTOKENS: accepts n_tokens = 0."
V2Dtype1Reader = _reader(_AnyKnownDtype)
V2Dtype1Reader.__doc__ = "TLKV-READ-DTYPE: accepts version 2 with dtype 1 (any known dtype with any version)."
V2AsFormatErrorReader = _reader(_VersionAsFormat)
V2AsFormatErrorReader.__doc__ = "TLKV-READ-V1-ONLY: a v1-only reader refuses v2 as a format error, not cleanly."
IgnoresShapeReader = _reader(_IgnoresShape)
IgnoresShapeReader.__doc__ = "TLKV-READ-SHAPE: does not compare the dimensions with the pool's."


class _AllocatesAsItGoesSession(ReferenceReaderSession):
    def import_envelope(self, data: bytes) -> ImportOutcome:
        r = self.reader
        buf = memoryview(data).cast("B")
        try:
            r.check_min_length(buf)
            hdr = Header.unpack(buf)
            for check in (r.check_magic, r.check_version, r.check_dtype, r.check_shape):
                check(hdr)
            r.check_crc(buf)
            r.check_length(buf, hdr)
            off = 28
            for i in range(hdr.n_blocks):
                h, n = struct.unpack_from("<QI", buf, off)
                r.check_record(i, h, n)
                self.pool.append(ImportedBlock(h, n))  # allocated before the next record is checked
                off += 12 + r.geometry.payload_size(hdr.version)
        except EnvelopeError as exc:
            return ImportOutcome(exc.kind, exc.requirement, str(exc))
        return ImportOutcome("ok", blocks=self.pool[-hdr.n_blocks :] if hdr.n_blocks else [])


class AllocatesAsItGoesReader(ReferenceReader):
    """TLKV-READ-NOALLOC: allocates each block as soon as its record passes, before later records are checked."""

    session_class = _AllocatesAsItGoesSession


class _NoValuesSession(ReferenceReaderSession):
    def import_envelope(self, data: bytes) -> ImportOutcome:
        outcome = super().import_envelope(data)
        for b in outcome.blocks:
            if b.kv is not None:
                b.kv = np.asarray(b.kv, np.float32)
                b.kv[..., 0] = 0  # drops the first element of every row
        return outcome


class DropsValuesReader(ReferenceReader):
    """TLKV-READ-VALUES: imports the blocks but loses the first element of every head_dim row."""

    session_class = _NoValuesSession


# ---- decode sides -------------------------------------------------------------------------------


class _KeepsFailedStream(PushStream):
    def fail(self) -> None:
        if self.state == "open":
            self._txn.commit()  # keeps what the stream stored before it failed
            self.state = "failed"


class _KeepsFailedSide(DecodeSide):
    def begin_push(self) -> PushStream:
        return _KeepsFailedStream(self)


class KeepsFailedStreamDecode(ReferenceDecode):
    """TLKV-XFER-ATOMIC: keeps the blocks a failed stream stored before its bad chunk."""

    def __init__(self) -> None:
        super().__init__(side_factory=_KeepsFailedSide)


class _SkipsChunkCrcStream(PushStream):
    def receive(self, chunk: Chunk) -> None:
        super().receive(Chunk(chunk.request_id, chunk.block_index, chunk.block_hash, chunk.kv_format, chunk.payload,
                              crc32c(chunk.payload)))


class _SkipsChunkCrcSide(DecodeSide):
    def begin_push(self) -> PushStream:
        return _SkipsChunkCrcStream(self)


class SkipsChunkCrcDecode(ReferenceDecode):
    """TLKV-XFER-CRC: never checks KvChunk.crc32c."""

    def __init__(self) -> None:
        super().__init__(side_factory=_SkipsChunkCrcSide)


class _InvalidArgumentStream(PushStream):
    def receive(self, chunk: Chunk) -> None:
        try:
            super().receive(chunk)
        except TransferError as exc:
            if exc.status is Status.DATA_LOSS:
                raise TransferError(Status.INVALID_ARGUMENT, exc.requirement, exc.message) from exc
            raise


class _InvalidArgumentSide(DecodeSide):
    def begin_push(self) -> PushStream:
        return _InvalidArgumentStream(self)


class InvalidArgumentDecode(ReferenceDecode):
    """TLKV-READ-STATUS: answers INVALID_ARGUMENT where the text says DATA_LOSS."""

    def __init__(self) -> None:
        super().__init__(side_factory=_InvalidArgumentSide)


class _HoldsZeroSide(DecodeSide):
    def has_blocks(self, hashes: object) -> list[bool]:
        hs = list(hashes)  # type: ignore[call-overload]
        held = super().has_blocks(hs)
        return [True if h == 0 else k for h, k in zip(hs, held, strict=True)]


class RegistersTailDecode(ReferenceDecode):
    """TLKV-HASH-RESERVED-ZERO: registers partial tail blocks under hash 0, so HasBlocks(0) answers held."""

    def __init__(self) -> None:
        super().__init__(side_factory=_HoldsZeroSide)


class DefaultMessageLimitDecode(ReferenceDecode):
    """TLKV-XFER-MAX-PAYLOAD: keeps gRPC's default 4 MiB message limit, refusing legal chunks near 4 MiB."""

    def __init__(self) -> None:
        super().__init__(server_options={"max_receive_message": 4 * 1024 * 1024})


# ---- prefill sides ------------------------------------------------------------------------------


class _Prefill:
    """The reference prefill recipe with hooks."""

    def ask(self, client: KvTransferClient, hashes: list[int]) -> list[bool]:
        return client.has_blocks(hashes)

    def plan(self, chunks: list[Chunk]) -> list[Chunk]:
        return chunks

    def prefill(self, decode_addr: str, sequence_file: Path, timeout: float) -> None:
        seq = read_sequence(sequence_file)
        with KvTransferClient(decode_addr, timeout) as client:
            held = self.ask(client, chain_hashes(seq.tokens, seq.geometry.block_tokens))
            chunks = plan_push(seq.tokens, seq.kv, seq.geometry, seq.version, held, seq.request_id)
            client.push(self.plan(chunks))


class ResendsHeldPrefill(_Prefill):
    """TLKV-XFER-EMPTY-HELD: sends the payload of blocks the decode side already holds."""

    def ask(self, client: KvTransferClient, hashes: list[int]) -> list[bool]:
        client.has_blocks(hashes)
        return [False] * len(hashes)


class NoHasBlocksPrefill(_Prefill):
    """TLKV-XFER-HASBLOCKS-FIRST: pushes without asking HasBlocks."""

    def ask(self, client: KvTransferClient, hashes: list[int]) -> list[bool]:
        return [False] * len(hashes)


class EmptyTailPrefill(_Prefill):
    """TLKV-XFER-PAYLOAD-MISSING: sends the partial tail with an empty payload."""

    def plan(self, chunks: list[Chunk]) -> list[Chunk]:
        return [Chunk.for_payload(c.request_id, c.block_index, c.block_hash, c.kv_format, b"")
                if c.block_hash == 0 else c for c in chunks]


class WrongCrcPrefill(_Prefill):
    """TLKV-XFER-CRC: puts the envelope's own trailing CRC in KvChunk.crc32c instead of the payload's CRC."""

    def plan(self, chunks: list[Chunk]) -> list[Chunk]:
        return [Chunk(c.request_id, c.block_index, c.block_hash, c.kv_format, c.payload,
                      struct.unpack("<I", c.payload[-4:])[0] if c.payload else 0) for c in chunks]


class UnspecifiedFormatPrefill(_Prefill):
    """TLKV-XFER-FORMAT: leaves kv_format KV_FORMAT_UNSPECIFIED."""

    def plan(self, chunks: list[Chunk]) -> list[Chunk]:
        return [Chunk(c.request_id, c.block_index, c.block_hash, 0, c.payload, c.crc32c) for c in chunks]


MUTANTS: dict[str, tuple[str, str]] = {
    "NoZeroPadWriter": ("tlkv-writer", "TLKV-V1-ZERO-PAD"),
    "UnchainedHashWriter": ("tlkv-writer", "TLKV-HASH-CHAIN"),
    "HashedTailWriter": ("tlkv-writer", "TLKV-HASH-FULL-ONLY"),
    "NoZeroReplacementWriter": ("tlkv-writer", "TLKV-HASH-ZERO-IS-ONE"),
    "ScaleOverAllPositionsWriter": ("tlkv-writer", "TLKV-V2-SCALE"),
    "TruncatingE4M3Writer": ("tlkv-writer", "TLKV-V2-E4M3"),
    "CrcOverRecordsOnlyWriter": ("tlkv-writer", "TLKV-ENV-CRC"),
    "BigEndianHeaderWriter": ("tlkv-writer", "TLKV-ENV-LE"),
    "SkipsCrcReader": ("tlkv-reader", "TLKV-READ-CRC"),
    "ZeroTokensReader": ("tlkv-reader", "TLKV-READ-NTOKENS"),
    "V2Dtype1Reader": ("tlkv-reader", "TLKV-READ-DTYPE"),
    "V2AsFormatErrorReader": ("tlkv-reader", "TLKV-READ-V1-ONLY"),
    "IgnoresShapeReader": ("tlkv-reader", "TLKV-READ-SHAPE"),
    "AllocatesAsItGoesReader": ("tlkv-reader", "TLKV-READ-NOALLOC"),
    "DropsValuesReader": ("tlkv-reader", "TLKV-READ-VALUES"),
    "KeepsFailedStreamDecode": ("tlkv-decode", "TLKV-XFER-ATOMIC"),
    "SkipsChunkCrcDecode": ("tlkv-decode", "TLKV-XFER-CRC"),
    "InvalidArgumentDecode": ("tlkv-decode", "TLKV-READ-STATUS"),
    "RegistersTailDecode": ("tlkv-decode", "TLKV-HASH-RESERVED-ZERO"),
    "DefaultMessageLimitDecode": ("tlkv-decode", "TLKV-XFER-MAX-PAYLOAD"),
    "ResendsHeldPrefill": ("tlkv-prefill", "TLKV-XFER-EMPTY-HELD"),
    "NoHasBlocksPrefill": ("tlkv-prefill", "TLKV-XFER-HASBLOCKS-FIRST"),
    "EmptyTailPrefill": ("tlkv-prefill", "TLKV-XFER-PAYLOAD-MISSING"),
    "WrongCrcPrefill": ("tlkv-prefill", "TLKV-XFER-CRC"),
    "UnspecifiedFormatPrefill": ("tlkv-prefill", "TLKV-XFER-FORMAT"),
}
