"""Broken TLKV writers, readers, decode sides and prefill sides (targets: python:tests.mutants.tlkv:<Name>).

Each class breaks exactly one requirement, named in its docstring's first line; MUTANTS maps it to the
suite and the requirement whose check must fail.  Each is the reference with one step changed.
"""

from __future__ import annotations

import dataclasses
import struct
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path

import grpc
import ml_dtypes
import numpy as np
import numpy.typing as npt

from kvconform.checksum import crc32c
from kvconform.targets.tlkv import (
    ImportedBlock,
    ImportOutcome,
    ReaderSession,
    ReferenceDecode,
    ReferenceReader,
    ReferenceReaderSession,
    ReferenceWriter,
)
from kvconform.tlkv.blockhash import block_fills, block_hash, block_hashes, chain_hashes, fnv1a64, hash_input
from kvconform.tlkv.chunk import Chunk, ChunkDecodeError
from kvconform.tlkv.content import read_sequence
from kvconform.tlkv.decode import DecodeSide, PushResult, PushStream, Status, TransferError
from kvconform.tlkv.envelope import DTYPE_OF_VERSION, HEADER, RECORD_HEADER, encode_raw, with_crc
from kvconform.tlkv.geometry import Geometry
from kvconform.tlkv.grpc_client import KvTransferClient
from kvconform.tlkv.grpc_decode import DecodeServer
from kvconform.tlkv.payload import E4M3_MAX, encode_payload, v2_scales
from kvconform.tlkv.prefill import plan_push
from kvconform.tlkv.reader import Envelope, EnvelopeError, EnvelopeReader, FormatError, Header, Record, VersionError
from tests.mutants import Mutant

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
    """TLKV-V1-ZERO-PAD: v1 only: copies the values past n_tokens instead of writing zero bytes."""

    def payload(self, g: Geometry, version: int, kv: np.ndarray, fill: int) -> bytes:
        return encode_payload(g, version, kv, g.block_tokens if version == 1 else fill)


class NoZeroPadV2Writer(_RawWriter):
    """TLKV-V2-ZERO-PAD: v2 only: quantises the values past n_tokens with the slab's scale instead of zeroing them."""

    def payload(self, g: Geometry, version: int, kv: np.ndarray, fill: int) -> bytes:
        if version != 2:
            return super().payload(g, version, kv, fill)
        scales = v2_scales(kv, fill)
        with np.errstate(over="ignore", invalid="ignore"):
            q = (kv.astype(np.float32) / scales[:, :, :, None, None]).astype(ml_dtypes.float8_e4m3fn)
        out: bytes = q.view(np.uint8).tobytes() + scales.astype("<f4").tobytes()
        return out


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


class WrongFillWriter(_RawWriter):
    """TLKV-ENV-NTOKENS: writes n_tokens = B for every block, the partial tail too."""

    def export(self, geometry: Geometry, version: int, tokens: Sequence[int], kv: F16Array) -> bytes:
        data = bytearray(super().export(geometry, version, tokens, kv))
        p = geometry.payload_size(version)
        for i in range(-(-len(tokens) // geometry.block_tokens)):
            struct.pack_into("<I", data, 28 + i * (12 + p) + 8, geometry.block_tokens)
        return with_crc(bytes(data))


class SwappedAxesWriter(_RawWriter):
    """TLKV-V1-LAYOUT: lays a payload out [L][Hkv][2][B][D] instead of [L][2][Hkv][B][D]."""

    def payload(self, g: Geometry, version: int, kv: np.ndarray, fill: int) -> bytes:
        swapped = np.ascontiguousarray(kv.transpose(0, 2, 1, 3, 4)).reshape(kv.shape)
        return encode_payload(g, version, swapped, fill)


class PaddedWriter(ReferenceWriter):
    """TLKV-ENV-SIZE: appends four zero bytes before the CRC (which it computes over them)."""

    def export(self, geometry: Geometry, version: int, tokens: Sequence[int], kv: F16Array) -> bytes:
        data = super().export(geometry, version, tokens, kv)
        return with_crc(data[:-4] + bytes(4) + data[-4:])


class CrcOverRecordsOnlyWriter(ReferenceWriter):
    """TLKV-ENV-CRC: computes the CRC over the block records only, not the header."""

    def export(self, geometry: Geometry, version: int, tokens: Sequence[int], kv: F16Array) -> bytes:
        data = super().export(geometry, version, tokens, kv)
        return data[:-4] + struct.pack("<I", crc32c(data[28:-4]))


class BigEndianHeaderWriter(ReferenceWriter):
    """TLKV-ENV-LE: writes the header integers big-endian."""

    def export(self, geometry: Geometry, version: int, tokens: Sequence[int], kv: F16Array) -> bytes:
        data = super().export(geometry, version, tokens, kv)
        fields = HEADER.unpack_from(data)
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
            if hdr.version != 2:
                raise
            raise FormatError(exc.requirement, exc.field, exc.seen, exc.expected) from exc


class _NoLength(EnvelopeReader):
    def check_length(self, buf: memoryview, hdr: Header) -> None:
        return None


class _NoMagic(EnvelopeReader):
    def check_magic(self, hdr: Header) -> None:
        return None


class _UnknownVersionsRead(EnvelopeReader):
    def check_version(self, hdr: Header) -> None:
        if hdr.version in (1, 2):
            super().check_version(hdr)


class _HashOnPartial(EnvelopeReader):
    def check_record(self, i: int, block_hash: int, n_tokens: int) -> None:
        super().check_record(i, 0, n_tokens)


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
NoLengthReader = _reader(_NoLength)
NoLengthReader.__doc__ = "TLKV-READ-LENGTH: never compares the length with 28 + n * (12 + P) + 4."
NoMagicReader = _reader(_NoMagic)
NoMagicReader.__doc__ = "TLKV-READ-MAGIC: never checks the magic."
UnknownVersionReader = _reader(_UnknownVersionsRead)
UnknownVersionReader.__doc__ = "TLKV-READ-VERSION: lets an unknown version through, to fail later as a format error."
HashOnPartialReader = _reader(_HashOnPartial)
HashOnPartialReader.__doc__ = "TLKV-READ-HASH-FULL: accepts a non-zero block_hash on a partial block."
IgnoresShapeReader = _reader(_IgnoresShape)
IgnoresShapeReader.__doc__ = "TLKV-READ-SHAPE: does not compare the dimensions with the pool's."


class _Narrow(EnvelopeReader):
    """Reads some fields in an integer narrower than the text's: the CRC is checked over the bytes as received,
    every other rule over the fields as this reader holds them (`narrow` rewrites them in a copy)."""

    def narrow(self, buf: bytearray) -> None:
        raise NotImplementedError

    def read(self, data: bytes | bytearray | memoryview) -> Envelope:
        raw = memoryview(data).cast("B")
        self.check_min_length(raw)
        super().check_crc(raw)
        buf = bytearray(raw)
        self.narrow(buf)
        return super().read(bytes(buf))

    def check_crc(self, buf: memoryview) -> None:
        return None  # checked in read(), over the bytes as received

    def record_offsets(self, buf: bytearray) -> list[int]:
        version = struct.unpack_from("<H", buf, 4)[0]
        if version not in (1, 2):
            return []
        step = 12 + self.geometry.payload_size(version)
        return list(range(28, len(buf) - 4 - 11, step))


class _U16Dims(_Narrow):
    def narrow(self, buf: bytearray) -> None:
        for off in (12, 16, 20, 24):
            struct.pack_into("<I", buf, off, struct.unpack_from("<I", buf, off)[0] & 0xFFFF)


class _U16Fill(_Narrow):
    def narrow(self, buf: bytearray) -> None:
        for off in self.record_offsets(buf):
            struct.pack_into("<I", buf, off + 8, struct.unpack_from("<I", buf, off + 8)[0] & 0xFFFF)


class _U32HashTest(EnvelopeReader):
    def check_record(self, i: int, block_hash: int, n_tokens: int) -> None:
        super().check_record(i, block_hash & 0xFFFFFFFF, n_tokens)  # `(uint32_t)block_hash != 0`


class _U8Version(_Narrow):
    def narrow(self, buf: bytearray) -> None:
        buf[5] = 0


class _Length32(EnvelopeReader):
    def check_length(self, buf: memoryview, hdr: Header) -> None:
        b, layers, hkv, d = hdr.block_tokens, hdr.n_layers, hdr.n_kv_heads, hdr.head_dim
        p = layers * 2 * hkv * b * d * 2 if hdr.version == 1 else layers * 2 * hkv * (b * d + 4)
        expected = (28 + hdr.n_blocks * (12 + p) + 4) & 0xFFFFFFFF  # a uint32_t length
        if len(buf) != expected:
            raise FormatError("TLKV-READ-LENGTH", "length", len(buf), str(expected))

    def read_records(self, buf: memoryview, hdr: Header) -> list[Record]:
        p = self.geometry.payload_size(hdr.version)
        fits = (len(buf) - 32) // (12 + p)  # it walks the records until the bytes end
        return super().read_records(buf, dataclasses.replace(hdr, n_blocks=min(hdr.n_blocks, fits)))


class _ProductShape(EnvelopeReader):
    def check_shape(self, hdr: Header) -> None:
        g = self.geometry
        product = hdr.n_layers * hdr.n_kv_heads * hdr.block_tokens * hdr.head_dim
        if product != g.n_layers * g.n_kv_heads * g.block_tokens * g.head_dim:
            super().check_shape(hdr)


class _ZeroCrcAbsent(EnvelopeReader):
    def check_crc(self, buf: memoryview) -> None:
        if struct.unpack_from("<I", buf, len(buf) - 4)[0] != 0:
            super().check_crc(buf)


class _FirstRecordOnly(EnvelopeReader):
    def check_record(self, i: int, block_hash: int, n_tokens: int) -> None:
        if i == 0:
            super().check_record(i, block_hash, n_tokens)


U16DimsReader = _reader(_U16Dims)
U16DimsReader.__doc__ = ("TLKV-READ-SHAPE: holds the four u32 dimensions in 16 bits, so block_tokens B + 2^16 "
                         "matches a pool of B.")
U16FillReader = _reader(_U16Fill)
U16FillReader.__doc__ = "TLKV-READ-NTOKENS: holds n_tokens in 16 bits, so B + 2^16 reads as a full block."
U32HashReader = _reader(_U32HashTest)
U32HashReader.__doc__ = ("TLKV-READ-HASH-FULL: tests block_hash != 0 on its low 32 bits, so a partial block whose "
                         "hash is 2^32 passes as unhashed.")
U8VersionReader = _reader(_U8Version)
U8VersionReader.__doc__ = "TLKV-READ-VERSION: reads the u16 version's low byte only, so version 257 reads as 1."
Length32Reader = _reader(_Length32)
Length32Reader.__doc__ = ("TLKV-READ-LENGTH: computes 28 + n * (12 + P) + 4 in 32 bits, so an n_blocks whose "
                          "product wraps to the one-block length passes.")
ProductShapeReader = _reader(_ProductShape)
ProductShapeReader.__doc__ = ("TLKV-READ-SHAPE: compares the product of the dimensions with the pool's, not each "
                              "dimension (n_layers and n_kv_heads swapped pass).")
ZeroCrcAbsentReader = _reader(_ZeroCrcAbsent)
ZeroCrcAbsentReader.__doc__ = "TLKV-READ-CRC: takes a stored crc32c of 0 for \"no CRC\" and skips the check."
FirstRecordOnlyReader = _reader(_FirstRecordOnly)
FirstRecordOnlyReader.__doc__ = "TLKV-READ-NTOKENS: checks n_tokens (and block_hash) of the first record only."


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
                h, n = RECORD_HEADER.unpack_from(buf, off)
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


class V1OnlyReader(ReferenceReader):
    """TLKV-READ-V2-BOTH: reads version 1 only, whatever it is asked (and the PICS) say."""

    def open(self, geometry: Geometry, versions: frozenset[int]) -> ReaderSession:
        return super().open(geometry, frozenset({1}))


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


class _StreamHook(PushStream):
    """A reference stream whose chunks pass through `adjust` first."""

    def adjust(self, chunk: Chunk) -> Chunk | None:
        return chunk

    def receive(self, chunk: Chunk) -> None:
        adjusted = self.adjust(chunk)
        if adjusted is not None:
            super().receive(adjusted)


def _decode(stream: type[PushStream], doc: str, **side_overrides: object) -> type[ReferenceDecode]:
    side = type(f"{stream.__name__}Side", (DecodeSide,), {"begin_push": lambda self: stream(self),
                                                           **side_overrides})

    def __init__(self: ReferenceDecode) -> None:
        ReferenceDecode.__init__(self, side_factory=side)

    return type(f"{stream.__name__}Decode", (ReferenceDecode,), {"__init__": __init__, "__doc__": doc})


def _envelope_version(payload: bytes) -> int:
    return int(struct.unpack_from("<H", payload, 4)[0]) if len(payload) >= 6 else 0


class _AnyFormat(_StreamHook):
    def adjust(self, chunk: Chunk) -> Chunk | None:
        if chunk.kv_format not in (1, 2) and chunk.payload:
            return dataclasses.replace(chunk, kv_format=_envelope_version(chunk.payload))
        return chunk


class _TrustsEnvelope(_StreamHook):
    def adjust(self, chunk: Chunk) -> Chunk | None:
        if chunk.kv_format in (1, 2) and chunk.payload:
            return dataclasses.replace(chunk, kv_format=_envelope_version(chunk.payload))
        return chunk


class _FirstBlockOnly(_StreamHook):
    def adjust(self, chunk: Chunk) -> Chunk | None:
        if len(chunk.payload) >= 32 and struct.unpack_from("<I", chunk.payload, 8)[0] > 1:
            g = self._side.geometry
            h, n = RECORD_HEADER.unpack_from(chunk.payload, 28)
            first = chunk.payload[40 : 40 + g.payload_size(_envelope_version(chunk.payload))]
            hdr = Header.unpack(chunk.payload)
            payload = encode_raw(version=hdr.version, dtype=hdr.dtype, block_tokens=g.block_tokens,
                                 n_layers=g.n_layers, n_kv_heads=g.n_kv_heads, head_dim=g.head_dim,
                                 records=[(h, n, first)])
            return Chunk.for_payload(chunk.request_id, chunk.block_index, chunk.block_hash, chunk.kv_format, payload)
        return chunk


class _SkipsEmptyUnheld(_StreamHook):
    def adjust(self, chunk: Chunk) -> Chunk | None:
        if not chunk.payload and not self._txn.holds(chunk.block_hash):
            return None  # silently ignores a block it cannot serve
        return chunk


class _NoReuse(_StreamHook):
    def adjust(self, chunk: Chunk) -> Chunk | None:
        if not chunk.payload:
            raise TransferError(Status.NOT_FOUND, "TLKV-XFER-EMPTY-HELD", "empty payloads are not supported")
        return chunk


class _ReusesTail(_StreamHook):
    def adjust(self, chunk: Chunk) -> Chunk | None:
        if not chunk.payload and chunk.block_hash == 0:
            self.blocks_reused += 1
            return None  # "the tail it holds": a partial block deduplicated
        return chunk


class _HashFromRecord(_StreamHook):
    def adjust(self, chunk: Chunk) -> Chunk | None:
        if len(chunk.payload) >= 40:
            return dataclasses.replace(chunk, block_hash=int(struct.unpack_from("<Q", chunk.payload, 28)[0]))
        return chunk


class _Miscounts(PushStream):
    def finish(self) -> PushResult:
        r = super().finish()
        return PushResult(r.blocks_stored + r.blocks_reused, r.blocks_reused, r.payload_bytes)


AnyFormatDecode = _decode(_AnyFormat, "TLKV-XFER-FORMAT: reads a chunk whose kv_format it does not know "
                                      "(UNSPECIFIED, 3, 255) by the envelope's own version.")
TrustsEnvelopeDecode = _decode(_TrustsEnvelope, "TLKV-XFER-FORMAT: ignores a kv_format that differs from the "
                                                "payload's envelope version.")
FirstBlockOnlyDecode = _decode(_FirstBlockOnly, "TLKV-XFER-ONE-BLOCK: takes a chunk with n_blocks > 1, keeping "
                                                "its first block.")
SkipsEmptyUnheldDecode = _decode(_SkipsEmptyUnheld, "TLKV-XFER-EMPTY-HELD: silently skips an empty payload for "
                                                    "a block it does not hold, and answers OK.")
NoReuseDecode = _decode(_NoReuse, "TLKV-XFER-EMPTY-HELD: refuses every empty payload, even for blocks it holds.")
ReusesTailDecode = _decode(_ReusesTail, "TLKV-HASH-FULL-ONLY: answers an empty payload with block_hash 0 as a "
                                       "reuse of a partial tail, deduplicating a partial block.")
LaxChunkHashDecode = _decode(_HashFromRecord, "TLKV-XFER-CHUNK-HASH: stores a chunk whose block_hash differs "
                                              "from its envelope record's.")
NoSizeLimitDecode = _decode(PushStream, "TLKV-XFER-MAX-PAYLOAD: takes a chunk over 4 MiB that passes every other rule "
                                       "(at a pool geometry whose one-block envelope is larger).",
                            max_payload=1 << 40)
MiscountingDecode = _decode(_Miscounts, "TLKV-XFER-RESPONSE: counts reused blocks in blocks_stored too.")


class _VersionAsDataLoss(_StreamHook):
    def adjust(self, chunk: Chunk) -> Chunk | None:
        if len(chunk.payload) >= 6 and _envelope_version(chunk.payload) not in self._side.versions:
            raise TransferError(Status.DATA_LOSS, "TLKV-READ-VERSION", "the envelope is of an unknown version")
        return chunk


class _V2SkipsEnvelopeCrc(_StreamHook):
    def adjust(self, chunk: Chunk) -> Chunk | None:
        if chunk.kv_format == 2 and len(chunk.payload) >= 32 and chunk.crc32c == crc32c(chunk.payload):
            # Its v2 path never checks the envelope's own CRC: as if the envelope's CRC were always right.
            return Chunk.for_payload(chunk.request_id, chunk.block_index, chunk.block_hash, 2, with_crc(chunk.payload))
        return chunk


class _RegistersUnhashedFull(_StreamHook):
    def adjust(self, chunk: Chunk) -> Chunk | None:
        g = self._side.geometry
        if len(chunk.payload) >= 40 and RECORD_HEADER.unpack_from(chunk.payload, 28) == (0, g.block_tokens):
            self._side.zero_registered = True  # type: ignore[attr-defined]
        return chunk


def _holds_zero_when_registered(self: DecodeSide, hashes: Iterable[int]) -> list[bool]:
    hs = list(hashes)
    held = DecodeSide.has_blocks(self, hs)
    return [k or (h == 0 and getattr(self, "zero_registered", False)) for h, k in zip(hs, held, strict=True)]


def _all_ones_is_empty_slot(self: DecodeSide, hashes: Iterable[int]) -> list[bool]:
    hs = list(hashes)
    return [k and h != (1 << 64) - 1 for h, k in zip(hs, DecodeSide.has_blocks(self, hs), strict=True)]


class _EmptyFormatUnchecked(_StreamHook):
    def adjust(self, chunk: Chunk) -> Chunk | None:
        if not chunk.payload and chunk.kv_format not in self._side.versions:
            return dataclasses.replace(chunk, kv_format=min(self._side.versions))  # no payload: nothing to read
        return chunk


class _EmptyCrcUnchecked(_StreamHook):
    def adjust(self, chunk: Chunk) -> Chunk | None:
        return dataclasses.replace(chunk, crc32c=0) if not chunk.payload else chunk  # no payload: nothing to check


EmptyFormatUncheckedDecode = _decode(_EmptyFormatUnchecked, "TLKV-XFER-FORMAT: checks kv_format only on chunks "
                                                            "with a payload.")
EmptyCrcUncheckedDecode = _decode(_EmptyCrcUnchecked, "TLKV-XFER-CRC: checks KvChunk.crc32c only on chunks with a "
                                                      "payload.")
VersionAsDataLossDecode = _decode(_VersionAsDataLoss, "TLKV-READ-STATUS: answers DATA_LOSS, not "
                                                      "FAILED_PRECONDITION, for an envelope of a version it does not "
                                                      "read (looked at before the chunk's kv_format).")
V2SkipsEnvelopeCrcDecode = _decode(_V2SkipsEnvelopeCrc, "TLKV-READ-CRC: its v2 path never checks the envelope's "
                                                        "CRC (the v1 path does).")
RegistersUnhashedFullDecode = _decode(_RegistersUnhashedFull, "TLKV-HASH-RESERVED-ZERO: registers a full block "
                                                              "whose record carries block_hash 0 under 0.",
                                      has_blocks=_holds_zero_when_registered)
AllOnesEmptySlotDecode = _decode(_StreamHook, "TLKV-XFER-DEDUP: a hash table using 0xFFFFFFFFFFFFFFFF as its empty "
                                              "slot: a block of that hash is stored but never found held.",
                                 has_blocks=_all_ones_is_empty_slot)


class _ScrambledHasBlocks(DecodeSide):
    def has_blocks(self, hashes: Iterable[int]) -> list[bool]:
        return sorted(super().has_blocks(hashes), reverse=True)


class ScrambledHasBlocksDecode(ReferenceDecode):
    """TLKV-XFER-HAS-ORDER: answers the held flags sorted, not in the order of the request."""

    def __init__(self) -> None:
        super().__init__(side_factory=_ScrambledHasBlocks)


class _ReadsV2Anyway(DecodeSide):
    def __init__(self, geometry: Geometry, versions: frozenset[int]) -> None:
        super().__init__(geometry, frozenset({1, 2}))


class V2AnywayDecode(ReferenceDecode):
    """TLKV-READ-V1-ONLY: declared v1-only (tlkv.decode.versions=[1]), yet takes v2 chunks."""

    def __init__(self) -> None:
        super().__init__(side_factory=_ReadsV2Anyway)


class _GarbageEndsStream(DecodeServer):
    def _run_stream(self, stream: PushStream, requests: Iterator[bytes],
                    context: grpc.ServicerContext) -> PushResult | None:
        def parseable() -> Iterator[bytes]:
            for data in requests:
                try:
                    Chunk.decode(data)
                except ChunkDecodeError:
                    return  # as grpc's own deserialiser does: the stream just ends
                yield data

        return super()._run_stream(stream, parseable(), context)


class GarbageEndsStreamDecode(ReferenceDecode):
    """TLKV-XFER-PROTO: treats an unparseable chunk as the end of the stream, committing what came before."""

    def __init__(self) -> None:
        super().__init__(server_class=_GarbageEndsStream)


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


class ReorderedPrefill(_Prefill):
    """TLKV-XFER-CHUNK-FIELDS: sends the chunks last block first."""

    def plan(self, chunks: list[Chunk]) -> list[Chunk]:
        return chunks[::-1]


class UnspecifiedFormatPrefill(_Prefill):
    """TLKV-XFER-FORMAT: leaves kv_format KV_FORMAT_UNSPECIFIED."""

    def plan(self, chunks: list[Chunk]) -> list[Chunk]:
        return [Chunk(c.request_id, c.block_index, c.block_hash, 0, c.payload, c.crc32c) for c in chunks]


MUTANTS: dict[str, Mutant] = {
    "NoZeroPadWriter": Mutant("tlkv-writer", "TLKV-V1-ZERO-PAD", ("test_v1_zero_padding", "test_vector_payloads")),
    "NoZeroPadV2Writer": Mutant("tlkv-writer", "TLKV-V2-ZERO-PAD", ("test_v2_zero_padding",)),
    "UnchainedHashWriter": Mutant("tlkv-writer", "TLKV-HASH-CHAIN", ("test_block_hashes", "test_vector_records")),
    "HashedTailWriter": Mutant("tlkv-writer", "TLKV-HASH-FULL-ONLY", ("test_block_hashes",)),
    "NoZeroReplacementWriter": Mutant("tlkv-writer", "TLKV-HASH-ZERO-IS-ONE", ("test_reserved_zero_hash",)),
    "WrongFillWriter": Mutant("tlkv-writer", "TLKV-ENV-NTOKENS", ("test_fills",)),
    # It swaps the axes of v2 payloads too, whose layout is "the same order": a real second breakage.
    "SwappedAxesWriter": Mutant("tlkv-writer", "TLKV-V1-LAYOUT", ("test_v1_values",), collateral=("TLKV-V2-LAYOUT",)),
    "PaddedWriter": Mutant("tlkv-writer", "TLKV-ENV-SIZE", ("test_size", "test_vector_layout")),
    "ScaleOverAllPositionsWriter": Mutant("tlkv-writer", "TLKV-V2-SCALE", ("test_v2_scales",)),
    "TruncatingE4M3Writer": Mutant("tlkv-writer", "TLKV-V2-E4M3", ("test_v2_elements",)),
    "CrcOverRecordsOnlyWriter": Mutant("tlkv-writer", "TLKV-ENV-CRC", ("test_crc", "test_vector_crc")),
    "BigEndianHeaderWriter": Mutant("tlkv-writer", "TLKV-ENV-LE", ("test_header_fields", "test_vector_layout")),
    "SkipsCrcReader": Mutant("tlkv-reader", "TLKV-READ-CRC", ("test_rule", "test_differential_fuzz", "test_vector")),
    "NoLengthReader": Mutant("tlkv-reader", "TLKV-READ-LENGTH", ("test_rule",)),
    "NoMagicReader": Mutant("tlkv-reader", "TLKV-READ-MAGIC", ("test_rule",)),
    "UnknownVersionReader": Mutant("tlkv-reader", "TLKV-READ-VERSION", ("test_rule",)),
    "ZeroTokensReader": Mutant("tlkv-reader", "TLKV-READ-NTOKENS", ("test_rule",)),
    "HashOnPartialReader": Mutant("tlkv-reader", "TLKV-READ-HASH-FULL", ("test_rule",)),
    "V2Dtype1Reader": Mutant("tlkv-reader", "TLKV-READ-DTYPE", ("test_rule",)),
    "V2AsFormatErrorReader": Mutant("tlkv-reader", "TLKV-READ-V1-ONLY", ("test_v1_only_reader_refuses_v2_cleanly",)),
    "V1OnlyReader": Mutant("tlkv-reader", "TLKV-READ-V2-BOTH", ("test_v2_reader_reads_both",)),
    "IgnoresShapeReader": Mutant("tlkv-reader", "TLKV-READ-SHAPE", ("test_rule",)),
    # Holding the dimensions in 16 bits it computes P from them too, so the length rule fails with it (the
    # differential fuzz blames TLKV-READ-LENGTH, the reference's first failing rule for such an envelope).
    "U16DimsReader": Mutant("tlkv-reader", "TLKV-READ-SHAPE", ("test_rule",), collateral=("TLKV-READ-LENGTH",)),
    "U16FillReader": Mutant("tlkv-reader", "TLKV-READ-NTOKENS", ("test_rule",)),
    "U32HashReader": Mutant("tlkv-reader", "TLKV-READ-HASH-FULL", ("test_rule",)),
    "U8VersionReader": Mutant("tlkv-reader", "TLKV-READ-VERSION", ("test_rule",)),
    "Length32Reader": Mutant("tlkv-reader", "TLKV-READ-LENGTH", ("test_rule",)),
    "ProductShapeReader": Mutant("tlkv-reader", "TLKV-READ-SHAPE", ("test_rule",)),
    "ZeroCrcAbsentReader": Mutant("tlkv-reader", "TLKV-READ-CRC", ("test_rule",)),
    # The same skipped loop leaves every later record's block_hash unchecked too: a real second breakage.
    "FirstRecordOnlyReader": Mutant("tlkv-reader", "TLKV-READ-NTOKENS", ("test_rule",),
                                    collateral=("TLKV-READ-HASH-FULL",)),
    "AllocatesAsItGoesReader": Mutant("tlkv-reader", "TLKV-READ-NOALLOC", ("test_rule_allocates_nothing",
                                                                             "test_differential_fuzz")),
    "DropsValuesReader": Mutant("tlkv-reader", "TLKV-READ-VALUES", ("test_values_round_trip",)),
    "KeepsFailedStreamDecode": Mutant("tlkv-decode", "TLKV-XFER-ATOMIC", ("test_reader_rule_in_chunk",
                                                                          "test_concurrent_streams_keep_exactly_what_succeeded")),
    "SkipsChunkCrcDecode": Mutant("tlkv-decode", "TLKV-XFER-CRC", ("test_chunk_crc_mismatch",)),
    # It answers INVALID_ARGUMENT for every DATA_LOSS, the chunk CRC's (TLKV-XFER-CRC names DATA_LOSS) too.
    "InvalidArgumentDecode": Mutant("tlkv-decode", "TLKV-READ-STATUS", ("test_reader_rule_in_chunk",),
                                    collateral=("TLKV-XFER-CRC",)),
    "RegistersTailDecode": Mutant("tlkv-decode", "TLKV-HASH-RESERVED-ZERO", ("test_stored_blocks_are_held",)),
    "DefaultMessageLimitDecode": Mutant("tlkv-decode", "TLKV-XFER-MAX-PAYLOAD",
                                        ("test_payload_of_exactly_4mib_reaches_the_reader",)),
    "AnyFormatDecode": Mutant("tlkv-decode", "TLKV-XFER-FORMAT", ("test_unread_kv_format",)),
    "TrustsEnvelopeDecode": Mutant("tlkv-decode", "TLKV-XFER-FORMAT", ("test_kv_format_not_envelope_version",)),
    "FirstBlockOnlyDecode": Mutant("tlkv-decode", "TLKV-XFER-ONE-BLOCK", ("test_two_block_envelope",)),
    "SkipsEmptyUnheldDecode": Mutant("tlkv-decode", "TLKV-XFER-EMPTY-HELD", ("test_empty_payload_for_unheld_block",)),
    "NoReuseDecode": Mutant("tlkv-decode", "TLKV-XFER-EMPTY-HELD", ("test_empty_payload_reuses_held_block",)),
    "ReusesTailDecode": Mutant("tlkv-decode", "TLKV-HASH-FULL-ONLY", ("test_partial_tail_is_never_deduplicated",)),
    "LaxChunkHashDecode": Mutant("tlkv-decode", "TLKV-XFER-CHUNK-HASH", ("test_chunk_hash_differs_from_record",)),
    # Declared at a pool geometry whose one-block v1 envelope is 44 bytes over 4 MiB: only there is a valid
    # envelope too big for a chunk, which a decode side without the size rule takes.
    "NoSizeLimitDecode": Mutant("tlkv-decode", "TLKV-XFER-MAX-PAYLOAD", ("test_payload_over_4mib",),
                                pics=("tlkv.decode.geometry={block_tokens: 16, n_layers: 32, n_kv_heads: 8, "
                                      "head_dim: 256}", "tlkv.decode.versions=[1]")),
    "MiscountingDecode": Mutant("tlkv-decode", "TLKV-XFER-RESPONSE", ("test_response_counts",)),
    "ScrambledHasBlocksDecode": Mutant("tlkv-decode", "TLKV-XFER-HAS-ORDER", ("test_has_blocks_order",)),
    "V2AnywayDecode": Mutant("tlkv-decode", "TLKV-READ-V1-ONLY", ("test_v1_only_refuses_v2",),
                             pics=("tlkv.decode.versions=[1]",)),
    "GarbageEndsStreamDecode": Mutant("tlkv-decode", "TLKV-XFER-PROTO", ("test_unparseable_chunk",)),
    "EmptyFormatUncheckedDecode": Mutant("tlkv-decode", "TLKV-XFER-FORMAT", ("test_rule_on_empty_payload",)),
    "EmptyCrcUncheckedDecode": Mutant("tlkv-decode", "TLKV-XFER-CRC", ("test_rule_on_empty_payload",)),
    "VersionAsDataLossDecode": Mutant("tlkv-decode", "TLKV-READ-STATUS", ("test_reader_rule_in_chunk",)),
    "V2SkipsEnvelopeCrcDecode": Mutant("tlkv-decode", "TLKV-READ-CRC", ("test_reader_rule_in_chunk",)),
    "RegistersUnhashedFullDecode": Mutant("tlkv-decode", "TLKV-HASH-RESERVED-ZERO", ("test_boundary_hashes",)),
    "AllOnesEmptySlotDecode": Mutant("tlkv-decode", "TLKV-XFER-DEDUP", ("test_boundary_hashes",)),
    "ResendsHeldPrefill": Mutant("tlkv-prefill", "TLKV-XFER-EMPTY-HELD", ("test_empty_payload_exactly_for_held",
                                                                         "test_bytes_moved")),
    # Not asking, it cannot know which blocks are held and sends their payloads: a real second breakage.
    "NoHasBlocksPrefill": Mutant("tlkv-prefill", "TLKV-XFER-HASBLOCKS-FIRST", ("test_has_blocks_first",),
                                 collateral=("TLKV-XFER-EMPTY-HELD",)),
    "EmptyTailPrefill": Mutant("tlkv-prefill", "TLKV-XFER-PAYLOAD-MISSING", ("test_empty_payload_exactly_for_held",)),
    "WrongCrcPrefill": Mutant("tlkv-prefill", "TLKV-XFER-CRC", ("test_payloads",)),
    "UnspecifiedFormatPrefill": Mutant("tlkv-prefill", "TLKV-XFER-FORMAT", ("test_payloads",)),
    "ReorderedPrefill": Mutant("tlkv-prefill", "TLKV-XFER-CHUNK-FIELDS", ("test_one_chunk_per_block_in_order",)),
}

# Checks no mutant is required to fail, and why.
UNMUTATED_CHECKS: dict[str, str] = {}
