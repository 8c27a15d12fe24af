"""The KVCS object payload: a 68-octet "KVO1" header, then Data.

``encode_object`` is the checked path (the header follows from the arguments and the digest is computed);
``encode_raw`` writes whatever a header says, for crafting malformed objects. ``verify_object`` is what an
End Subscriber must check before it uses an object (the text's "Object Payload" section).
"""

from __future__ import annotations

import hashlib
import struct
from dataclasses import dataclass, replace

from kvconform.kvcs.errors import KvcsError

__all__ = ["HEADER_LEN", "MAGIC", "REQ_VERIFY_BLOCK", "REQ_VERIFY_DIGEST", "REQ_VERIFY_LAYER", "REQ_VERIFY_LENGTH",
           "REQ_VERIFY_MAGIC", "VERSION", "ObjectHeader", "decode_object", "encode_object", "encode_raw",
           "verify_object"]

MAGIC = 0x4B564F31  # "KVO1"
VERSION = 1
HEADER_LEN = 68
REQ_LAYOUT = "KVCS-PAYLOAD-LAYOUT"
# What an End Subscriber verifies, one requirement per check.
REQ_VERIFY_MAGIC = "KVCS-PAYLOAD-VERIFY-MAGIC"
REQ_VERIFY_LAYER = "KVCS-PAYLOAD-VERIFY-LAYER"
REQ_VERIFY_BLOCK = "KVCS-PAYLOAD-VERIFY-BLOCK"
REQ_VERIFY_LENGTH = "KVCS-PAYLOAD-VERIFY-LENGTH"
REQ_VERIFY_DIGEST = "KVCS-PAYLOAD-VERIFY-DIGEST"
# Magic, Version, Component, Flags, Layer, Block Index, Token Start, Token Count, Codec, Reserved,
# Data Length, Data Digest: network byte order.
_HEADER = struct.Struct("!IBBHIIQIHHI32s")
assert _HEADER.size == HEADER_LEN
_OFFSETS = {"Magic": 0, "Version": 4, "Component": 5, "Flags": 6, "Layer": 8, "Block Index": 12,
            "Token Start": 16, "Token Count": 24, "Codec": 28, "Reserved": 30, "Data Length": 32,
            "Data Digest": 36}


@dataclass(frozen=True)
class ObjectHeader:
    """The 68-octet header, field for field."""

    component: int
    layer: int
    block_index: int
    token_start: int
    token_count: int
    codec: int
    data_length: int
    digest: bytes
    magic: int = MAGIC
    version: int = VERSION
    flags: int = 0
    reserved: int = 0

    def encode(self) -> bytes:
        try:
            return _HEADER.pack(self.magic, self.version, self.component, self.flags, self.layer, self.block_index,
                                self.token_start, self.token_count, self.codec, self.reserved, self.data_length,
                                self.digest)
        except struct.error as exc:
            raise KvcsError("KVO1 header", f"a field does not fit its width: {exc}", requirement=REQ_LAYOUT) from exc

    def with_(self, **changes: object) -> ObjectHeader:
        """A copy with some fields changed (crafting)."""
        return replace(self, **changes)  # type: ignore[arg-type]


def encode_object(*, component: int, layer: int, block_index: int, token_start: int, token_count: int, codec: int,
                  data: bytes) -> bytes:
    """A well-formed payload: Data Length and Data Digest follow from ``data``; Flags and Reserved zero."""
    if component not in (1, 2, 3):
        raise KvcsError("Component", f"{component}, expected 1 (k), 2 (v) or 3 (kv)", requirement=REQ_LAYOUT)
    if codec == 0:
        raise KvcsError("Codec", "0 is reserved in the KVSP codec registry", requirement=REQ_LAYOUT)
    header = ObjectHeader(component, layer, block_index, token_start, token_count, codec, len(data),
                          hashlib.sha256(data).digest())
    return header.encode() + data


def encode_raw(header: ObjectHeader, data: bytes) -> bytes:
    """The header exactly as given (wrong magic, length or digest included), then ``data``."""
    return header.encode() + data


def decode_object(payload: bytes) -> tuple[ObjectHeader, bytes]:
    """Split a payload into its header and Data; KvcsError when the header or the length does not hold."""
    if len(payload) < HEADER_LEN:
        raise KvcsError("KVO1 header", f"payload of {len(payload)} octets is shorter than the 68-octet header",
                        requirement=REQ_VERIFY_LENGTH, offset=len(payload))
    (magic, version, component, flags, layer, block, start, count, codec, reserved, length,
     digest) = _HEADER.unpack_from(payload)
    header = ObjectHeader(component, layer, block, start, count, codec, length, digest, magic, version, flags,
                          reserved)
    if magic != MAGIC:
        raise KvcsError("Magic", f"0x{magic:08x}, expected 0x4b564f31 ('KVO1')", requirement=REQ_VERIFY_MAGIC, offset=0)
    if version != VERSION:
        raise KvcsError("Version", f"{version}, expected 1", requirement=REQ_VERIFY_MAGIC, offset=4)
    if HEADER_LEN + length != len(payload):
        raise KvcsError("Data Length", f"{length}: header + Data Length = {HEADER_LEN + length} octets, the payload "
                        f"has {len(payload)}", requirement=REQ_VERIFY_LENGTH, offset=32)
    return header, payload[HEADER_LEN:]


def verify_object(payload: bytes, group: int, object_id: int) -> list[str]:
    """The End Subscriber's checks (magic, version, Layer = Group ID, Block Index = Object ID, lengths, Data
    Digest); an empty list when the object may be used. Flags are ignored on receipt."""
    try:
        header, data = decode_object(payload)
    except KvcsError as exc:
        return [str(exc)]
    problems = []
    if header.layer != group:
        problems.append(f"Layer (offset 8): {header.layer}, the object is in Group {group} [{REQ_VERIFY_LAYER}]")
    if header.block_index != object_id:
        problems.append(f"Block Index (offset 12): {header.block_index}, the object's ID is {object_id} "
                        f"[{REQ_VERIFY_BLOCK}]")
    if hashlib.sha256(data).digest() != header.digest:
        problems.append(f"Data Digest (offset 36): {header.digest.hex()[:16]}.. is not the SHA-256 of the "
                        f"{len(data)}-octet Data ({hashlib.sha256(data).hexdigest()[:16]}..) [{REQ_VERIFY_DIGEST}]")
    return problems


def field_offset(name: str) -> int:
    """The offset of a header field by its name in the text (for messages and crafting)."""
    return _OFFSETS[name]
