"""MPA: start frames (RFC 5044 §7.1, RFC 6581 enhanced connection establishment) and FPDU framing with
CRC-32C, markers off (rdma-bindings.md §3.2-§3.4)."""

from __future__ import annotations

import struct
from dataclasses import dataclass

from kvconform.checksum import crc32c

REQ_KEY = b"MPA ID Req Frame"
REP_KEY = b"MPA ID Rep Frame"
FLAG_M, FLAG_C, FLAG_R, FLAG_E = 0x80, 0x40, 0x20, 0x10
MAX_PRIVATE = 512
# RFC 6581 IRD / ORD words (the first 4 octets of private data in revision 2)
P2P, SEND0_RTR = 0x8000, 0x4000  # in the IRD word
WRITE0_RTR, READ0_RTR = 0x8000, 0x4000  # in the ORD word
IRD_ORD_MASK = 0x3FFF


class MpaError(ValueError):
    """Broken MPA input; ``field`` names what is wrong, ``code`` is the LLP Terminate code (§2.6)."""

    def __init__(self, message: str, *, field: str, code: int = 4) -> None:
        super().__init__(message)
        self.field = field
        self.code = code


@dataclass(frozen=True)
class StartFrame:
    """An MPA Request or Reply."""

    request: bool
    revision: int = 2
    markers: bool = False
    crc: bool = True
    reject: bool = False
    private: bytes = b""

    @property
    def enhanced(self) -> bool:
        return self.revision == 2


@dataclass(frozen=True)
class Enhanced:
    """RFC 6581 IRD/ORD private data: resources and the RTR types this side accepts or sends."""

    ird: int = 16
    ord: int = 16
    p2p: bool = True
    send0: bool = False
    write0: bool = False
    read0: bool = True

    def encode(self) -> bytes:
        ird = (self.ird & IRD_ORD_MASK) | (P2P if self.p2p else 0) | (SEND0_RTR if self.send0 else 0)
        ord_ = (self.ord & IRD_ORD_MASK) | (WRITE0_RTR if self.write0 else 0) | (READ0_RTR if self.read0 else 0)
        return struct.pack(">HH", ird, ord_)

    @classmethod
    def decode(cls, private: bytes) -> Enhanced:
        if len(private) < 4:
            raise MpaError(f"revision 2 private data: {len(private)} octets, the IRD/ORD words need 4",
                           field="private data")
        ird, ord_ = struct.unpack_from(">HH", private)
        return cls(ird & IRD_ORD_MASK, ord_ & IRD_ORD_MASK, bool(ird & P2P), bool(ird & SEND0_RTR),
                   bool(ord_ & WRITE0_RTR), bool(ord_ & READ0_RTR))


def encode_start(frame: StartFrame) -> bytes:
    flags = (FLAG_M if frame.markers else 0) | (FLAG_C if frame.crc else 0) | (FLAG_R if frame.reject else 0)
    flags |= FLAG_E if frame.enhanced else 0
    if len(frame.private) > MAX_PRIVATE:
        raise MpaError(f"private data of {len(frame.private)} octets (at most {MAX_PRIVATE})", field="PD_Length")
    key = REQ_KEY if frame.request else REP_KEY
    return key + struct.pack(">BBH", flags, frame.revision, len(frame.private)) + frame.private


def parse_start(buf: bytes, *, request: bool) -> tuple[StartFrame, int] | None:
    """The start frame at the head of ``buf`` and its length; None while incomplete; MpaError naming the field."""
    if len(buf) < 20:
        want = REQ_KEY if request else REP_KEY
        if not want.startswith(bytes(buf[:16])):
            raise MpaError(f"Key {bytes(buf[:16])!r}: expected {want!r}", field="Key")
        return None
    key, (flags, rev, pd_len) = bytes(buf[:16]), struct.unpack_from(">BBH", buf, 16)
    want = REQ_KEY if request else REP_KEY
    if key != want:
        raise MpaError(f"Key {key!r}: expected {want!r}", field="Key")
    if rev not in (1, 2):
        raise MpaError(f"Rev {rev}: this endpoint speaks revisions 1 and 2", field="Rev")
    if flags & 0x0F:
        raise MpaError(f"flags {flags:#04x}: the reserved bits are not zero", field="Res")
    if request and flags & FLAG_R:
        raise MpaError("the R (reject) flag is set in a Request", field="R")
    if pd_len > MAX_PRIVATE:
        raise MpaError(f"PD_Length {pd_len} (at most {MAX_PRIVATE})", field="PD_Length")
    if len(buf) < 20 + pd_len:
        return None
    frame = StartFrame(request, rev, bool(flags & FLAG_M), bool(flags & FLAG_C), bool(flags & FLAG_R),
                       bytes(buf[20:20 + pd_len]))
    return frame, 20 + pd_len


def fpdu_crc(framed: bytes) -> bytes:
    """The CRC field: CRC-32C of ULPDU_Length through PAD, little-endian on the wire (§3.3)."""
    return crc32c(framed).to_bytes(4, "little")


def encode_fpdu(ulpdu: bytes, *, crc: bool = True) -> bytes:
    """ULPDU_Length | ULPDU | PAD | CRC (markers off)."""
    if len(ulpdu) > 0xFFFF:
        raise MpaError(f"ULPDU of {len(ulpdu)} octets (at most 65535)", field="ULPDU_Length")
    pad = -(2 + len(ulpdu)) % 4
    framed = struct.pack(">H", len(ulpdu)) + ulpdu + bytes(pad)
    return framed + (fpdu_crc(framed) if crc else bytes(4))


class Reassembler:
    """Whole FPDUs out of arbitrary pieces of the TCP stream (``feed``, then ``next`` until None)."""

    def __init__(self, *, crc: bool = True) -> None:
        self.crc = crc
        self.buf = bytearray()

    def feed(self, data: bytes) -> None:
        self.buf += data

    def next(self) -> bytes | None:
        """The next ULPDU, None while incomplete; MpaError (code 2) on a CRC mismatch."""
        if len(self.buf) < 2:
            return None
        length = int.from_bytes(self.buf[:2], "big")
        pad = -(2 + length) % 4
        total = 2 + length + pad + 4
        if len(self.buf) < total:
            return None
        framed = bytes(self.buf[:2 + length + pad])
        got = bytes(self.buf[2 + length + pad:total])
        del self.buf[:total]
        if self.crc and got != fpdu_crc(framed):
            raise MpaError(f"FPDU CRC {got.hex()}: expected {fpdu_crc(framed).hex()} (ULPDU_Length {length})",
                           field="CRC", code=2)
        return framed[2:2 + length]
