"""RDMAP messages (RFC 5040 §4, RFC 7306 §4-§5; rdma-bindings.md §1.1-§1.3, §2.1, §2.5)."""

from __future__ import annotations

import enum
import struct
from dataclasses import dataclass

from kvconform.rdma.fabric import DdpTaggedCode, DdpUntaggedCode, Layer, RdmapCode, Terminate


class Opcode(enum.IntEnum):
    WRITE = 0x0
    READ_REQUEST = 0x1
    READ_RESPONSE = 0x2
    SEND = 0x3
    SEND_INVALIDATE = 0x4
    SEND_SE = 0x5
    SEND_SE_INVALIDATE = 0x6
    TERMINATE = 0x7
    IMMEDIATE = 0x8
    IMMEDIATE_SE = 0x9
    ATOMIC_REQUEST = 0xA
    ATOMIC_RESPONSE = 0xB


SEND_OPCODES = frozenset({Opcode.SEND, Opcode.SEND_INVALIDATE, Opcode.SEND_SE, Opcode.SEND_SE_INVALIDATE})
INVALIDATE_OPCODES = frozenset({Opcode.SEND_INVALIDATE, Opcode.SEND_SE_INVALIDATE})
SOLICITED_OPCODES = frozenset({Opcode.SEND_SE, Opcode.SEND_SE_INVALIDATE, Opcode.IMMEDIATE_SE})
IMMEDIATE_BYTES = 8


class AtomicOp(enum.IntEnum):
    FETCH_ADD = 0
    SWAP = 1
    CMP_SWAP = 2


@dataclass(frozen=True)
class ReadRequest:
    """The 28-octet RDMA Read Request header."""

    sink_stag: int
    sink_to: int
    size: int
    source_stag: int
    source_to: int

    LENGTH = 28

    def encode(self) -> bytes:
        return struct.pack(">IQIIQ", self.sink_stag, self.sink_to, self.size, self.source_stag, self.source_to)

    @classmethod
    def decode(cls, data: bytes) -> ReadRequest:
        if len(data) < cls.LENGTH:
            raise ValueError(f"RDMA Read Request header of {len(data)} octets (28 expected)")
        return cls(*struct.unpack_from(">IQIIQ", data))


@dataclass(frozen=True)
class AtomicRequest:
    """The 52-octet RFC 7306 Atomic Request header."""

    op: AtomicOp
    request_id: int
    stag: int
    to: int
    add_swap: int = 0
    add_swap_mask: int = 0
    compare: int = 0
    compare_mask: int = 0

    LENGTH = 52

    def encode(self) -> bytes:
        return struct.pack(">IIIQQQQQ", int(self.op) & 0x0F, self.request_id, self.stag, self.to, self.add_swap,
                           self.add_swap_mask, self.compare, self.compare_mask)

    @classmethod
    def decode(cls, data: bytes) -> AtomicRequest:
        if len(data) < cls.LENGTH:
            raise ValueError(f"Atomic Request header of {len(data)} octets (52 expected)")
        word, rid, stag, to, add, add_mask, cmp, cmp_mask = struct.unpack_from(">IIIQQQQQ", data)
        return cls(AtomicOp(word & 0x0F), rid, stag, to, add, add_mask, cmp, cmp_mask)


@dataclass(frozen=True)
class AtomicResponse:
    """The 12-octet Atomic Response header: the request's id and the word's original value."""

    request_id: int
    original: int

    LENGTH = 12

    def encode(self) -> bytes:
        return struct.pack(">IQ", self.request_id, self.original)

    @classmethod
    def decode(cls, data: bytes) -> AtomicResponse:
        if len(data) < cls.LENGTH:
            raise ValueError(f"Atomic Response header of {len(data)} octets (12 expected)")
        return cls(*struct.unpack_from(">IQ", data))


HDRCT_M, HDRCT_D, HDRCT_R = 0x8000, 0x4000, 0x2000


def encode_terminate(term: Terminate, ddp_header: bytes = b"", rdmap_header: bytes = b"") -> bytes:
    """The Terminate header (§2.5) and the copies of the terminated headers it carries."""
    hdrct = (HDRCT_D if ddp_header else 0) | (HDRCT_R if rdmap_header else 0)
    out = struct.pack(">BBH", (int(term.layer) << 4) | (int(term.etype) & 0x0F), int(term.code) & 0xFF, hdrct)
    if ddp_header:
        out += struct.pack(">H", len(ddp_header)) + ddp_header
    return out + rdmap_header


def _code_name(layer: int, etype: int, code: int) -> str:
    table: type[enum.IntEnum] | None = RdmapCode if layer == 0 else DdpTaggedCode if (layer, etype) == (1, 1) \
        else DdpUntaggedCode if (layer, etype) == (1, 2) else None
    if table is not None:
        try:
            return table(code).name.lower().replace("_", " ")
        except ValueError:
            pass
    return f"code {code:#04x}"


@dataclass(frozen=True)
class TerminateMessage:
    """A decoded Terminate: the error, and the copy of the terminated DDP header when it carries one."""

    terminate: Terminate
    ddp_header: bytes = b""

    @property
    def about_read_queue(self) -> bool:
        """The terminated segment was an untagged one on QN 1 (a Read or Atomic Request of the receiver)."""
        h = self.ddp_header
        return len(h) >= 10 and not h[0] & 0x80 and int.from_bytes(h[6:10], "big") == 1


def decode_terminate(data: bytes, sender: str) -> TerminateMessage:
    if len(data) < 4:
        raise ValueError(f"Terminate header of {len(data)} octets (4 expected)")
    layer, etype, code = data[0] >> 4, data[0] & 0x0F, data[1]
    hdrct = int.from_bytes(data[2:4], "big")
    copy = b""
    if hdrct & HDRCT_D and len(data) >= 6:
        n = int.from_bytes(data[4:6], "big")
        copy = bytes(data[6:6 + n])
    names = {0: "RDMAP", 1: "DDP", 2: "LLP (MPA)"}
    term = Terminate(Layer(layer) if layer in (0, 1, 2) else Layer.RDMAP, etype, code,
                     f"Terminate from {sender}: {names.get(layer, f'layer {layer}')} EType {etype}, "
                     f"{_code_name(layer, etype, code)}", sender, bytes(data))
    return TerminateMessage(term, copy)
