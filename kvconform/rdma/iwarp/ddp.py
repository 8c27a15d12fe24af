"""DDP segment headers (RFC 5041 §4; rdma-bindings.md §3.1) with the RDMAP control field in octet 1 (§2.1)."""

from __future__ import annotations

import struct
from dataclasses import dataclass

TAGGED_LEN, UNTAGGED_LEN = 14, 18
DDP_VERSION, RDMAP_VERSION = 1, 1
QN_SEND, QN_READ, QN_TERMINATE, QN_ATOMIC_RESPONSE = 0, 1, 2, 3


class DdpError(ValueError):
    """A segment that does not parse; ``layer`` / ``etype`` / ``code`` are the Terminate it calls for."""

    def __init__(self, message: str, *, layer: int, etype: int, code: int) -> None:
        super().__init__(message)
        self.layer, self.etype, self.code = layer, etype, code


@dataclass(frozen=True)
class Segment:
    """One DDP segment: tagged (``stag``, ``to``) or untagged (``qn``, ``msn``, ``mo``; ``stag`` is the
    RDMAP Invalidate STag field)."""

    tagged: bool
    last: bool
    opcode: int
    payload: bytes
    stag: int = 0
    to: int = 0
    qn: int = 0
    msn: int = 0
    mo: int = 0

    def header(self) -> bytes:
        ctrl = (RDMAP_VERSION << 6) | (self.opcode & 0x0F)
        if self.tagged:
            return struct.pack(">BBIQ", 0x80 | (0x40 if self.last else 0) | DDP_VERSION, ctrl, self.stag, self.to)
        return struct.pack(">BBIIII", (0x40 if self.last else 0) | DDP_VERSION, ctrl, self.stag, self.qn, self.msn,
                           self.mo)

    def encode(self) -> bytes:
        return self.header() + self.payload


def parse(ulpdu: bytes) -> Segment:
    """A ULPDU -> its segment; DdpError with the Terminate (Layer/EType/Code) of what is wrong."""
    if len(ulpdu) < 2:
        raise DdpError(f"ULPDU of {len(ulpdu)} octets: no DDP header", layer=1, etype=0, code=0)
    b0, ctrl = ulpdu[0], ulpdu[1]
    tagged, last = bool(b0 & 0x80), bool(b0 & 0x40)
    if b0 & 0x03 != DDP_VERSION:
        raise DdpError(f"DDP version {b0 & 0x03}: expected {DDP_VERSION}", layer=1, etype=1 if tagged else 2,
                       code=4 if tagged else 6)
    if ctrl >> 6 != RDMAP_VERSION:
        raise DdpError(f"RDMAP version {ctrl >> 6}: expected {RDMAP_VERSION}", layer=0, etype=2, code=0x05)
    opcode = ctrl & 0x0F
    if tagged:
        if len(ulpdu) < TAGGED_LEN:
            raise DdpError(f"tagged segment of {len(ulpdu)} octets", layer=1, etype=0, code=0)
        stag, to = struct.unpack_from(">IQ", ulpdu, 2)
        return Segment(True, last, opcode, bytes(ulpdu[TAGGED_LEN:]), stag=stag, to=to)
    if len(ulpdu) < UNTAGGED_LEN:
        raise DdpError(f"untagged segment of {len(ulpdu)} octets", layer=1, etype=0, code=0)
    inval, qn, msn, mo = struct.unpack_from(">IIII", ulpdu, 2)
    return Segment(False, last, opcode, bytes(ulpdu[UNTAGGED_LEN:]), stag=inval, qn=qn, msn=msn, mo=mo)


def segments(*, tagged: bool, opcode: int, data: bytes, max_payload: int,
             stag: int = 0, to: int = 0, qn: int = 0, msn: int = 0) -> list[Segment]:
    """A message cut into segments of at most ``max_payload`` octets (one, possibly empty, at least)."""
    out = []
    off = 0
    while True:
        piece = data[off:off + max_payload]
        last = off + len(piece) >= len(data)
        if tagged:
            out.append(Segment(True, last, opcode, piece, stag=stag, to=to + off))
        else:
            out.append(Segment(False, last, opcode, piece, stag=stag, qn=qn, msn=msn, mo=off))
        off += len(piece)
        if last:
            return out
