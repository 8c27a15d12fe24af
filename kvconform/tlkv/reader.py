"""The envelope reader: every TLKV reader rule, checked before anything is allocated (TLKV "Reader rules").

Error classes follow the text: format errors (TL_EFORMAT / DATA_LOSS), dimension mismatches
(TL_ESHAPE / DATA_LOSS) and versions this reader does not read (FAILED_PRECONDITION over gRPC).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from kvconform.checksum import crc32c
from kvconform.tlkv.envelope import CRC, DTYPE_OF_VERSION, HEADER, MAGIC, RECORD_HEADER, VERSION_V1
from kvconform.tlkv.geometry import CRC_SIZE, HEADER_SIZE, MIN_ENVELOPE_SIZE, RECORD_HEADER_SIZE, Geometry
from kvconform.tlkv.payload import decode_v1, decode_v2

ALL_VERSIONS = frozenset({1, 2})
DIMS = ("block_tokens", "n_layers", "n_kv_heads", "head_dim")


class EnvelopeError(ValueError):
    """A reader rule failed: names the rule's requirement id, the field, the value seen and expected."""

    kind = "format"

    def __init__(self, requirement: str, field: str, seen: object, expected: str) -> None:
        super().__init__(f"{field}: got {seen!r}, expected {expected} ({requirement})")
        self.requirement, self.field, self.seen, self.expected = requirement, field, seen, expected


class FormatError(EnvelopeError):
    """TL_EFORMAT: length, magic, CRC, dtype, n_tokens and block_hash rules."""

    kind = "format"


class ShapeError(EnvelopeError):
    """TL_ESHAPE: block_tokens, n_layers, n_kv_heads or head_dim differ from the receiving pool's."""

    kind = "shape"


class VersionError(EnvelopeError):
    """A version this reader does not read (FAILED_PRECONDITION over gRPC)."""

    kind = "version"


@dataclass(frozen=True)
class Header:
    """The 28-byte envelope header, as found (unvalidated)."""

    magic: bytes
    version: int
    dtype: int
    n_blocks: int
    block_tokens: int
    n_layers: int
    n_kv_heads: int
    head_dim: int

    @classmethod
    def unpack(cls, data: bytes | memoryview) -> Header:
        return cls(*HEADER.unpack_from(data, 0))


@dataclass
class Record:
    """One block record: its hash, fill and a view of its payload bytes."""

    block_hash: int
    n_tokens: int
    payload: memoryview


@dataclass
class Envelope:
    """A validated envelope; payloads are views into the bytes that were read."""

    version: int
    dtype: int
    geometry: Geometry
    records: list[Record] = field(default_factory=list)

    def kv(self, i: int) -> npt.NDArray[np.floating]:
        """Values of block i: f16 for v1, f32 (e4m3 * scale) for v2."""
        payload = self.records[i].payload
        return decode_v1(payload, self.geometry) if self.version == VERSION_V1 else decode_v2(payload, self.geometry)


class EnvelopeReader:
    """A reader for a pool of one geometry that reads some versions; one method per reader rule.

    The rules run in an order that lets each failure be classified: a version this reader does not
    read is reported as such before the length rule, whose P depends on the version.
    """

    def __init__(self, geometry: Geometry, versions: Iterable[int] = ALL_VERSIONS) -> None:
        self.geometry = geometry
        self.versions = frozenset(versions)

    def read(self, data: bytes | bytearray | memoryview) -> Envelope:
        buf = memoryview(data).cast("B")
        self.check_min_length(buf)
        hdr = Header.unpack(buf)
        self.check_magic(hdr)
        self.check_crc(buf)
        self.check_version(hdr)
        self.check_dtype(hdr)
        self.check_length(buf, hdr)
        self.check_shape(hdr)
        return Envelope(hdr.version, hdr.dtype, self.geometry, self.read_records(buf, hdr))

    def check_min_length(self, buf: memoryview) -> None:
        if len(buf) < MIN_ENVELOPE_SIZE:
            raise FormatError("TLKV-READ-LENGTH", "length", len(buf), f">= {MIN_ENVELOPE_SIZE}")

    def check_magic(self, hdr: Header) -> None:
        if hdr.magic != MAGIC:
            raise FormatError("TLKV-READ-MAGIC", "magic", bytes(hdr.magic), repr(MAGIC))

    def check_crc(self, buf: memoryview) -> None:
        n = len(buf)
        (stored,) = CRC.unpack_from(buf, n - CRC_SIZE)
        computed = crc32c(buf[: n - CRC_SIZE])
        if stored != computed:
            raise FormatError("TLKV-READ-CRC", "crc32c", f"0x{stored:08X}", f"0x{computed:08X}")

    def check_version(self, hdr: Header) -> None:
        if hdr.version not in self.versions:
            raise VersionError("TLKV-READ-VERSION", "version", hdr.version, f"one of {sorted(self.versions)}")

    def check_dtype(self, hdr: Header) -> None:
        expected = DTYPE_OF_VERSION.get(hdr.version)
        if hdr.dtype != expected:
            raise FormatError("TLKV-READ-DTYPE", "dtype", hdr.dtype, f"{expected} for version {hdr.version}")

    def check_length(self, buf: memoryview, hdr: Header) -> None:
        # The header's own values, zeros included (a zero dimension is the shape rule's to report).
        b, layers, hkv, d = hdr.block_tokens, hdr.n_layers, hdr.n_kv_heads, hdr.head_dim
        p = layers * 2 * hkv * b * d * 2 if hdr.version == 1 else layers * 2 * hkv * (b * d + 4)
        expected = HEADER_SIZE + hdr.n_blocks * (RECORD_HEADER_SIZE + p) + CRC_SIZE
        if len(buf) != expected:
            raise FormatError("TLKV-READ-LENGTH", "length", len(buf),
                              f"28 + {hdr.n_blocks} * (12 + {p}) + 4 = {expected}")

    def check_shape(self, hdr: Header) -> None:
        for d in DIMS:
            if getattr(hdr, d) != getattr(self.geometry, d):
                raise ShapeError("TLKV-READ-SHAPE", d, getattr(hdr, d), f"{getattr(self.geometry, d)} (the pool's)")

    def check_record(self, i: int, block_hash: int, n_tokens: int) -> None:
        b = self.geometry.block_tokens
        if not 1 <= n_tokens <= b:
            raise FormatError("TLKV-READ-NTOKENS", f"records[{i}].n_tokens", n_tokens, f"1..{b}")
        if block_hash != 0 and n_tokens != b:
            raise FormatError("TLKV-READ-HASH-FULL", f"records[{i}].n_tokens", n_tokens,
                              f"{b} because block_hash is 0x{block_hash:016X} (non-zero)")

    def read_records(self, buf: memoryview, hdr: Header) -> list[Record]:
        p = self.geometry.payload_size(hdr.version)
        records: list[Record] = []
        off = HEADER_SIZE
        for i in range(hdr.n_blocks):
            block_hash, n_tokens = RECORD_HEADER.unpack_from(buf, off)
            self.check_record(i, block_hash, n_tokens)
            off += RECORD_HEADER_SIZE
            records.append(Record(block_hash, n_tokens, buf[off : off + p]))
            off += p
        return records


def read_envelope(data: bytes | bytearray | memoryview, *, geometry: Geometry,
                  versions: Iterable[int] = ALL_VERSIONS) -> Envelope:
    """Validate `data` against every reader rule for a pool of `geometry` reading `versions`."""
    return EnvelopeReader(geometry, versions).read(data)
