"""A scapy layer for crafting and dissecting the KVCS object payload (KVCS "Object Payload").

`KVO1` is the 68-octet header in network byte order followed by the Data.  Computed fields are filled in
`post_build` only when left None: Data Length (`len(data)`) and Data Digest (SHA-256 of `data`).  Everything
else is written as given, so a poisoned object is a valid one with one field changed: `craft(payload,
data=other)` keeps the old digest (a mismatch), `craft(payload, data=other, digest=None, data_length=None)`
makes a matching one.  Dissection never raises: a payload shorter than the header is kept whole as `Raw`.
`to_header` turns a dissected layer into the codec's `ObjectHeader`, which the tests hold equal to
`payload.decode_object`.
"""

from __future__ import annotations

import hashlib
import struct
from typing import Any, ClassVar

from scapy.fields import (
    ByteEnumField,
    ByteField,
    IntField,
    LongField,
    ShortField,
    StrField,
    StrFixedLenField,
    XIntField,
    XShortField,
)
from scapy.packet import Packet, Raw

from kvconform.kvcs.payload import HEADER_LEN, MAGIC, VERSION, ObjectHeader, field_offset
from kvconform.kvcs.tracks import COMPONENT_NAMES

__all__ = ["KVO1", "craft", "dissect", "to_header"]

_LENGTH_AT = field_offset("Data Length")
_DIGEST_AT = field_offset("Data Digest")


class KVO1(Packet):  # type: ignore[misc]
    """The KVO1 object payload: header fields, then `data`; `data_length`/`digest` None -> computed."""

    name = "KVCS KVO1"
    fields_desc: ClassVar[list[Any]] = [
        XIntField("magic", MAGIC),
        ByteField("version", VERSION),
        ByteEnumField("component", 1, dict(COMPONENT_NAMES)),
        XShortField("flags", 0),
        IntField("layer", 0),
        IntField("block_index", 0),
        LongField("token_start", 0),
        IntField("token_count", 0),
        ShortField("codec", 1),
        XShortField("reserved", 0),
        IntField("data_length", None),
        StrFixedLenField("digest", None, 32),
        StrField("data", b""),
    ]

    def is_short(self) -> bool:
        return bool(getattr(self, "_short", False))

    def do_dissect(self, s: bytes) -> bytes:
        if len(s) >= HEADER_LEN:
            return bytes(super().do_dissect(s))
        # Shorter than the header: no field is dissected, every octet is kept as the Raw payload.
        self._short = True
        self.raw_packet_cache = None
        self.explicit = 1
        return s

    def guess_payload_class(self, payload: bytes) -> type[Packet]:
        raw: type[Packet] = Raw  # only a too-short payload has one: `data` takes every octet after the header
        return raw

    def self_build(self) -> bytes:
        return b"" if self.is_short() else bytes(super().self_build())

    def post_build(self, pkt: bytes, pay: bytes) -> bytes:
        if self.is_short():
            return pkt + pay
        data = bytes(self.data or b"")
        if self.data_length is None:
            pkt = pkt[:_LENGTH_AT] + struct.pack("!I", len(data)) + pkt[_LENGTH_AT + 4:]
        if self.digest is None:
            pkt = pkt[:_DIGEST_AT] + hashlib.sha256(data).digest() + pkt[_DIGEST_AT + 32:]
        return pkt + pay


def dissect(payload: bytes) -> KVO1:
    """The layer of one object payload; never raises on lengths or values that do not fit."""
    pkt = KVO1(bytes(payload))
    if not payload:  # scapy does not dissect empty bytes at all
        pkt._short = True
        pkt.raw_packet_cache = None
        pkt.explicit = 1
    return pkt


def to_header(pkt: KVO1) -> tuple[ObjectHeader, bytes]:
    """The codec's (header, Data) of a dissected payload (no validation: compare with `decode_object`).

    Data is what follows the header, whatever Data Length says. ValueError for a payload shorter than the header.
    """
    if pkt.is_short():
        raise ValueError(f"KVO1 header: {len(bytes(pkt))} octets, shorter than the {HEADER_LEN}-octet header")
    built = bytes(pkt)  # the computed fields as written
    length, digest = struct.unpack_from("!I32s", built, _LENGTH_AT)
    header = ObjectHeader(component=pkt.component, layer=pkt.layer, block_index=pkt.block_index,
                          token_start=pkt.token_start, token_count=pkt.token_count, codec=pkt.codec,
                          data_length=length, digest=digest, magic=pkt.magic, version=pkt.version, flags=pkt.flags,
                          reserved=pkt.reserved)
    return header, built[HEADER_LEN:]


def craft(payload: bytes, /, **overrides: Any) -> bytes:
    """`payload` with header fields or `data` overridden by name, rebuilt.

    Every other field keeps its dissected value, so Data Length and Data Digest follow a new `data` only when
    given as None. KeyError for a name that is not a field; ValueError for a payload shorter than the header.
    """
    pkt = dissect(payload)
    if pkt.is_short():
        raise ValueError(f"KVO1 header: {len(payload)} octets, shorter than the {HEADER_LEN}-octet header")
    names = {f.name for f in pkt.fields_desc}
    for key, value in overrides.items():
        if key not in names:
            raise KeyError(f"override {key!r}: expected one of {sorted(names)}")
        setattr(pkt, key, value)
    pkt.clear_cache()
    return bytes(pkt)
