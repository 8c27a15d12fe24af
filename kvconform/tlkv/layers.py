"""Scapy layers for crafting and dissecting TLKV export envelopes (TLKV "Export envelope").

Computed fields (dtype, n_blocks, crc32c) are filled in `post_build` only when left None, so a malformed
envelope is "a valid one with one field given explicitly".  Dissection never raises on a count, length
or version that does not fit: what cannot be parsed as whole records is kept in `trailing`.
The hot paths (reference endpoints, suites) use `kvconform.tlkv.envelope`/`reader`; these layers are for
crafting malformations and for showing bytes to a human.
"""

from __future__ import annotations

import re
import struct
from collections.abc import Sequence
from typing import Any, ClassVar

from scapy.fields import (
    LEIntField,
    LEShortField,
    PacketListField,
    StrField,
    StrFixedLenField,
    XLEIntField,
    XLELongField,
)
from scapy.packet import Packet

from kvconform.checksum import crc32c
from kvconform.tlkv.envelope import DTYPE_OF_VERSION, MAGIC, Block, encode_envelope
from kvconform.tlkv.geometry import CRC_SIZE, MIN_ENVELOPE_SIZE, RECORD_HEADER_SIZE, Geometry

__all__ = ["HEADER_FIELDS", "TLKVEnvelope", "TLKVRecord", "craft", "dissect", "record_payload_size"]

HEADER_FIELDS = ("magic", "version", "dtype", "n_blocks", "block_tokens", "n_layers", "n_kv_heads", "head_dim")
_HEADER_SIZES = (4, 2, 2, 4, 4, 4, 4, 4)
_RECORD_OVERRIDE = re.compile(r"^records\[(\d+)\]\.(block_hash|n_tokens|data|payload)$")


class TLKVRecord(Packet):  # type: ignore[misc]
    """One block record (TLKV "Export envelope"): u64 block_hash, u32 n_tokens, P payload bytes (`data`)."""

    name = "TLKV record"
    fields_desc: ClassVar[list[Any]] = [
        XLELongField("block_hash", 0),
        LEIntField("n_tokens", 1),
        # "payload" would shadow scapy's Packet.payload (the next layer), hence "data".
        StrField("data", b""),  # the envelope hands each record exactly its 12 + P bytes
    ]

    def extract_padding(self, s: bytes) -> tuple[bytes, bytes]:
        return b"", s


def record_payload_size(pkt: Packet) -> int | None:
    """P for the header of `pkt`, or None when its version or dimensions give no P."""
    try:
        geometry = Geometry(pkt.block_tokens, pkt.n_layers, pkt.n_kv_heads, pkt.head_dim)
        return geometry.payload_size(pkt.version)
    except (TypeError, ValueError):
        return None


class _RecordsField(PacketListField):  # type: ignore[misc]
    """n_blocks records of 12 + P bytes, P from the header; stops (without raising) where they do not fit."""

    def getfield(self, pkt: Packet, s: bytes) -> tuple[bytes, list[TLKVRecord]]:
        p = record_payload_size(pkt)
        body = len(s) - CRC_SIZE
        records: list[TLKVRecord] = []
        if p is None:
            return s, records
        size = RECORD_HEADER_SIZE + p
        off = 0
        while len(records) < (pkt.n_blocks or 0) and off + size <= body:
            records.append(TLKVRecord(s[off : off + size], _parent=pkt))
            off += size
        return s[off:], records


class _TrailingField(StrField):  # type: ignore[misc]
    """Bytes between the last whole record and the CRC: empty in a well-formed envelope."""

    def getfield(self, pkt: Packet, s: bytes) -> tuple[bytes, bytes]:
        return s[-CRC_SIZE:], s[:-CRC_SIZE]


class TLKVEnvelope(Packet):  # type: ignore[misc]
    """The TLKV export envelope (TLKV "Export envelope"): 28-byte header, n records, CRC-32C.

    dtype None -> the version's dtype; n_blocks None -> len(records); crc32c None -> CRC-32C of every
    byte before it.  `trailing` holds bytes that do not form whole records (dissection) or that a
    malformation appends before the CRC (crafting).
    """

    name = "TLKV envelope"
    fields_desc: ClassVar[list[Any]] = [
        StrFixedLenField("magic", MAGIC, 4),
        LEShortField("version", 1),
        LEShortField("dtype", None),
        LEIntField("n_blocks", None),
        LEIntField("block_tokens", 1),
        LEIntField("n_layers", 1),
        LEIntField("n_kv_heads", 1),
        LEIntField("head_dim", 1),
        _RecordsField("records", [], TLKVRecord),
        _TrailingField("trailing", b""),
        XLEIntField("crc32c", None),
    ]

    def do_dissect(self, s: bytes) -> bytes:
        if len(s) >= MIN_ENVELOPE_SIZE:
            return bytes(super().do_dissect(s))
        # Too short for a header and a CRC: keep the header fields that fit, the rest as raw bytes.
        off = 0
        for name, size in zip(HEADER_FIELDS, _HEADER_SIZES, strict=True):
            if off + size > len(s):
                break
            self.fields[name] = self.get_field(name).getfield(self, s[off:])[1]
            off += size
        self.fields["records"] = []
        self.fields["trailing"] = s[off:]
        self.raw_packet_cache = None
        self.explicit = 1
        return b""

    def post_build(self, pkt: bytes, pay: bytes) -> bytes:
        if self.dtype is None:
            if self.version not in DTYPE_OF_VERSION:
                raise ValueError(f"dtype: got None with version {self.version}, expected an explicit dtype "
                                 f"(only versions {sorted(DTYPE_OF_VERSION)} have one) (TLKV-ENV-DTYPE)")
            pkt = pkt[:6] + struct.pack("<H", DTYPE_OF_VERSION[self.version]) + pkt[8:]
        if self.n_blocks is None:
            pkt = pkt[:8] + struct.pack("<I", len(self.records)) + pkt[12:]
        if self.crc32c is None:
            pkt = pkt[:-CRC_SIZE] + struct.pack("<I", crc32c(pkt[:-CRC_SIZE]))
        return pkt + pay


def dissect(data: bytes) -> TLKVEnvelope:
    """The envelope layer of `data`; never raises on counts, lengths or versions that do not fit."""
    return TLKVEnvelope(bytes(data))


def craft(geometry: Geometry, version: int, blocks: Sequence[Block], /, **overrides: Any) -> bytes:
    """The canonical envelope of `blocks` (checked encoder) with `overrides` applied, rebuilt.

    Keys are header fields, `trailing`, `crc32c`, or `records[i].block_hash|n_tokens|data` (`payload`
    is an alias of `data`; pass those with `**{"records[0].n_tokens": 0}`).  The CRC is recomputed
    unless `crc32c` is given; every other dissected field keeps its value (dtype does not follow an
    overridden version, n_blocks does not follow overridden records), so exactly the overridden fields
    change.
    """
    env = dissect(encode_envelope(geometry, version, blocks))
    env.crc32c = None
    for key, value in overrides.items():
        match = _RECORD_OVERRIDE.match(key)
        if match:
            index, name = int(match.group(1)), match.group(2)
            if index >= len(env.records):
                raise KeyError(f"override {key!r}: the envelope has {len(env.records)} records")
            setattr(env.records[index], "data" if name == "payload" else name, value)
        elif key in (*HEADER_FIELDS, "records", "trailing", "crc32c"):
            setattr(env, key, value)
        else:
            raise KeyError(f"override {key!r}: expected one of {[*HEADER_FIELDS, 'records', 'trailing', 'crc32c']}"
                           " or records[i].block_hash|n_tokens|data")
    env.clear_cache()
    return bytes(env)

