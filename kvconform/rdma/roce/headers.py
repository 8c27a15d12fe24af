"""IB transport headers as RoCEv2 carries them: BTH and the RC extension headers (rdma-bindings §4.2-§4.5).

Every field is big-endian. A packet here is BTH ‖ extension headers ‖ payload ‖ pad, without the ICRC
(`kvconform.rdma.roce.icrc` adds and checks it).
"""

from __future__ import annotations

import enum
import struct
from dataclasses import dataclass

PSN_MASK = (1 << 24) - 1
BTH_LEN = 12


class HeaderError(ValueError):
    """A header that cannot be decoded: names the field, the value seen and what §4 expects."""


class Opcode(enum.IntEnum):
    """RC opcodes (§4.3); the transport prefix of RC is 0x00."""

    SEND_FIRST = 0x00
    SEND_MIDDLE = 0x01
    SEND_LAST = 0x02
    SEND_LAST_IMM = 0x03
    SEND_ONLY = 0x04
    SEND_ONLY_IMM = 0x05
    WRITE_FIRST = 0x06
    WRITE_MIDDLE = 0x07
    WRITE_LAST = 0x08
    WRITE_LAST_IMM = 0x09
    WRITE_ONLY = 0x0A
    WRITE_ONLY_IMM = 0x0B
    READ_REQUEST = 0x0C
    READ_RESPONSE_FIRST = 0x0D
    READ_RESPONSE_MIDDLE = 0x0E
    READ_RESPONSE_LAST = 0x0F
    READ_RESPONSE_ONLY = 0x10
    ACKNOWLEDGE = 0x11
    ATOMIC_ACKNOWLEDGE = 0x12
    CMP_SWAP = 0x13
    FETCH_ADD = 0x14
    SEND_LAST_INV = 0x16
    SEND_ONLY_INV = 0x17


@dataclass(frozen=True, slots=True)
class OpInfo:
    """One row of the §4.3 table: the extension headers in order, and where the packet sits in its message."""

    ext: tuple[str, ...]  # of "reth", "imm", "ieth", "aeth", "atomic", "atomic_ack"
    first: bool
    last: bool
    payload: bool  # the packet may carry payload


OPCODES: dict[Opcode, OpInfo] = {
    Opcode.SEND_FIRST: OpInfo((), True, False, True),
    Opcode.SEND_MIDDLE: OpInfo((), False, False, True),
    Opcode.SEND_LAST: OpInfo((), False, True, True),
    Opcode.SEND_LAST_IMM: OpInfo(("imm",), False, True, True),
    Opcode.SEND_ONLY: OpInfo((), True, True, True),
    Opcode.SEND_ONLY_IMM: OpInfo(("imm",), True, True, True),
    Opcode.WRITE_FIRST: OpInfo(("reth",), True, False, True),
    Opcode.WRITE_MIDDLE: OpInfo((), False, False, True),
    Opcode.WRITE_LAST: OpInfo((), False, True, True),
    Opcode.WRITE_LAST_IMM: OpInfo(("imm",), False, True, True),
    Opcode.WRITE_ONLY: OpInfo(("reth",), True, True, True),
    Opcode.WRITE_ONLY_IMM: OpInfo(("reth", "imm"), True, True, True),
    Opcode.READ_REQUEST: OpInfo(("reth",), True, True, False),
    Opcode.READ_RESPONSE_FIRST: OpInfo(("aeth",), True, False, True),
    Opcode.READ_RESPONSE_MIDDLE: OpInfo((), False, False, True),
    Opcode.READ_RESPONSE_LAST: OpInfo(("aeth",), False, True, True),
    Opcode.READ_RESPONSE_ONLY: OpInfo(("aeth",), True, True, True),
    Opcode.ACKNOWLEDGE: OpInfo(("aeth",), True, True, False),
    Opcode.ATOMIC_ACKNOWLEDGE: OpInfo(("aeth", "atomic_ack"), True, True, False),
    # the payload of a CmpSwap is the harness's masked-atomic extension (engine.py); IB itself has none
    Opcode.CMP_SWAP: OpInfo(("atomic",), True, True, True),
    Opcode.FETCH_ADD: OpInfo(("atomic",), True, True, False),
    Opcode.SEND_LAST_INV: OpInfo(("ieth",), False, True, True),
    Opcode.SEND_ONLY_INV: OpInfo(("ieth",), True, True, True),
}
_OPCODE_OF: dict[int, Opcode] = {int(op): op for op in Opcode}
_PADS = (b"", bytes(1), bytes(2), bytes(3))
EXT_LEN = {"reth": 16, "imm": 4, "ieth": 4, "aeth": 4, "atomic": 28, "atomic_ack": 8}
SEND_OPS = frozenset(op for op in Opcode if op <= Opcode.SEND_ONLY_IMM or op >= Opcode.SEND_LAST_INV)
WRITE_OPS = frozenset(op for op in Opcode if Opcode.WRITE_FIRST <= op <= Opcode.WRITE_ONLY_IMM)
READ_RESPONSES = frozenset(op for op in Opcode if Opcode.READ_RESPONSE_FIRST <= op <= Opcode.READ_RESPONSE_ONLY)
REQUESTS = SEND_OPS | WRITE_OPS | {Opcode.READ_REQUEST, Opcode.CMP_SWAP, Opcode.FETCH_ADD}


# Bth and Packet are not frozen: one of each is decoded per packet, and a frozen dataclass's __init__ costs four
# times a plain one's (bench_kbtp_wire.py); nothing changes one once decoded (dataclasses.replace makes a new one)
@dataclass(slots=True)
class Bth:
    """Base Transport Header, 12 octets (§4.2)."""

    opcode: int
    dest_qp: int
    psn: int
    ack_req: bool = False
    se: bool = False
    mig_req: bool = False
    pad: int = 0
    tver: int = 0
    p_key: int = 0xFFFF
    fecn: bool = False
    becn: bool = False

    def encode(self) -> bytes:
        return _bth_bytes(self.opcode, self.dest_qp, self.psn, self.ack_req, self.se, self.mig_req, self.pad, self.tver,
                          self.p_key, self.fecn, self.becn)

    @classmethod
    def decode(cls, data: bytes) -> Bth:
        if len(data) < BTH_LEN:
            raise HeaderError(f"BTH: {len(data)} octets, 12 expected (§4.2)")
        op, b1, p_key, w4, w8 = _BTH.unpack_from(data)
        # (comparisons, not bool() calls: this runs once per packet received)
        return cls(op, w4 & PSN_MASK, w8 & PSN_MASK, w8 >= 0x8000_0000, b1 >= 0x80, (b1 & 0x40) != 0,
                   (b1 >> 4) & 3, b1 & 0xF, p_key, w4 >= 0x8000_0000, (w4 & 0x4000_0000) != 0)


# BTH as two octets, a 16-bit P_Key and two 32-bit words (FECN, BECN, 6 reserved bits, DestQP; AckReq, 7 reserved
# bits, PSN): one struct call per packet on the hot path
_BTH = struct.Struct(">BBHII")


def _bth_bytes(opcode: int, dest_qp: int, psn: int, ack_req: bool, se: bool, mig_req: bool, pad: int, tver: int,
               p_key: int, fecn: bool, becn: bool) -> bytes:
    b1 = (se << 7) | (mig_req << 6) | ((pad & 3) << 4) | (tver & 0xF)
    return _BTH.pack(opcode, b1, p_key, (fecn << 31) | (becn << 30) | (dest_qp & PSN_MASK),
                     (ack_req << 31) | (psn & PSN_MASK))


@dataclass(frozen=True, slots=True)
class Reth:
    """RDMA Extended Transport Header, 16 octets: VA, R_Key, DMA Length (§4.4)."""

    va: int
    rkey: int
    length: int

    def encode(self) -> bytes:
        return struct.pack(">QII", self.va, self.rkey, self.length)

    @classmethod
    def decode(cls, data: bytes) -> Reth:
        return cls(*struct.unpack_from(">QII", data))


class AethType(enum.IntEnum):
    """AETH syndrome bits 6-5 (§4.5)."""

    ACK = 0
    RNR_NAK = 1
    NAK = 3


class NakCode(enum.IntEnum):
    """Low 5 bits of a NAK syndrome (§4.5)."""

    PSN_SEQUENCE_ERROR = 0
    INVALID_REQUEST = 1
    REMOTE_ACCESS_ERROR = 2
    REMOTE_OPERATIONAL_ERROR = 3
    INVALID_RD_REQUEST = 4


CREDIT_INVALID = 0x1F  # "invalid/unlimited": what rxe always sends (§4.5)
# RNR timer codes in milliseconds (§4.5); code 0 is the longest
RNR_TIMER_MS = (655.36, 0.01, 0.02, 0.03, 0.04, 0.06, 0.08, 0.12, 0.16, 0.24, 0.32, 0.48, 0.64, 0.96, 1.28, 1.92,
                2.56, 3.84, 5.12, 7.68, 10.24, 15.36, 20.48, 30.72, 40.96, 61.44, 81.92, 122.88, 163.84, 245.76,
                327.68, 491.52)


_AETH_KINDS = (AethType.ACK, AethType.RNR_NAK, None, AethType.NAK)


@dataclass(frozen=True, slots=True)
class Aeth:
    """ACK Extended Transport Header, 4 octets: Syndrome and MSN (§4.4, §4.5)."""

    syndrome: int
    msn: int

    @classmethod
    def ack(cls, msn: int, credit: int = CREDIT_INVALID) -> Aeth:
        return cls(credit & 0x1F, msn)

    @classmethod
    def rnr_nak(cls, msn: int, timer: int) -> Aeth:
        return cls(0x20 | (timer & 0x1F), msn)

    @classmethod
    def nak(cls, msn: int, code: NakCode) -> Aeth:
        return cls(0x60 | int(code), msn)

    @property
    def kind(self) -> AethType | None:
        """ACK, RNR NAK or NAK; None for the reserved type 10b."""
        return _AETH_KINDS[(self.syndrome >> 5) & 3]

    @property
    def value(self) -> int:
        """The credit code, RNR timer code or NAK code."""
        return self.syndrome & 0x1F

    def encode(self) -> bytes:
        return bytes([self.syndrome]) + (self.msn & PSN_MASK).to_bytes(3, "big")

    @classmethod
    def decode(cls, data: bytes) -> Aeth:
        return cls(data[0], int.from_bytes(data[1:4], "big"))


@dataclass(frozen=True, slots=True)
class AtomicEth:
    """Atomic Extended Transport Header, 28 octets: VA, R_Key, Swap/Add Data, Compare Data (§4.4)."""

    va: int
    rkey: int
    swap_add: int
    compare: int

    def encode(self) -> bytes:
        return struct.pack(">QIQQ", self.va, self.rkey, self.swap_add, self.compare)

    @classmethod
    def decode(cls, data: bytes) -> AtomicEth:
        return cls(*struct.unpack_from(">QIQQ", data))


@dataclass(slots=True)
class Packet:
    """A decoded RC packet: BTH, the extension headers its opcode carries, and the payload without pad."""

    bth: Bth
    reth: Reth | None = None
    aeth: Aeth | None = None
    atomic: AtomicEth | None = None
    atomic_ack: int | None = None  # AtomicAckETH: Original Remote Data (64 bits)
    imm: bytes | None = None  # ImmDt: 4 opaque octets
    ieth: int | None = None  # IETH: the R_Key to invalidate
    payload: bytes = b""

    @property
    def opcode(self) -> Opcode:
        op = _OPCODE_OF.get(self.bth.opcode)
        return Opcode(self.bth.opcode) if op is None else op  # an unknown opcode raises ValueError as before

    def encode(self) -> bytes:
        """BTH ‖ extension headers ‖ payload ‖ zero pad to 4 octets, PadCnt set to match (§4.7)."""
        b = self.bth
        info = OPCODES[b.opcode]  # type: ignore[index]  # (an IntEnum key is found by its int)
        pad = -len(self.payload) % 4
        head = _bth_bytes(b.opcode, b.dest_qp, b.psn, b.ack_req, b.se, b.mig_req, pad, b.tver, b.p_key, b.fecn, b.becn)
        if not info.ext:
            return head + self.payload + _PADS[pad] if pad else head + self.payload
        return b"".join([head, *(_encode_ext(self, name) for name in info.ext), self.payload, _PADS[pad]])

    @classmethod
    def decode(cls, data: bytes, bth: Bth | None = None) -> Packet:
        """Decode BTH ‖ headers ‖ payload ‖ pad (the ICRC already removed); ``bth``: its BTH, already decoded."""
        if bth is None:
            bth = Bth.decode(data)
        layout = _LAYOUT.get(bth.opcode)
        if layout is None:
            raise HeaderError(f"BTH.OpCode {bth.opcode:#04x}: not an RC opcode of §4.3")
        end = len(data) - bth.pad
        if not layout:  # no extension header (Send and Write Middle/Last, Read Response Middle): the common case
            if end < BTH_LEN:
                raise HeaderError(f"BTH.PadCnt {bth.pad}: more pad than the {len(data) - BTH_LEN} octets after "
                                  "the headers")
            return cls(bth, payload=data[BTH_LEN:end])
        off = BTH_LEN
        fields: dict[str, object] = {}
        for name, n in layout:
            if len(data) < off + n:
                raise HeaderError(f"{_OPCODE_OF[bth.opcode].name}: {len(data)} octets, too short for its {name} "
                                  "header (§4.4)")
            fields[name] = _decode_ext(name, data[off:off + n])
            off += n
        if end < off:
            raise HeaderError(f"BTH.PadCnt {bth.pad}: more pad than the {len(data) - off} octets after the headers")
        return cls(bth, payload=data[off:end], **fields)  # type: ignore[arg-type]


# per opcode: its extension headers and their lengths, in order (decoding looks up one dict)
_LAYOUT: dict[int, tuple[tuple[str, int], ...]] = {
    int(op): tuple((name, EXT_LEN[name]) for name in info.ext) for op, info in OPCODES.items()}
_RETH = struct.Struct(">QII")
_AETH = struct.Struct(">I")
_ATOMIC = struct.Struct(">QIQQ")
_U64 = struct.Struct(">Q")
_U32 = struct.Struct(">I")


def packet_head(opcode: int, dest_qp: int, psn: int, pad: int, *, ack_req: bool = False, se: bool = False,
                p_key: int = 0xFFFF) -> bytes:
    """The BTH of a packet with ``pad`` octets of pad (MigReq 0, TVer 0, FECN/BECN 0): what an engine sends,
    without a `Bth` and a `Packet` object per packet (the hot path of bench_kbtp_wire.py)."""
    return _BTH.pack(opcode, (se << 7) | (pad << 4), p_key, dest_qp & PSN_MASK, (ack_req << 31) | (psn & PSN_MASK))


def reth_bytes(va: int, rkey: int, length: int) -> bytes:
    return _RETH.pack(va, rkey, length)


def aeth_bytes(syndrome: int, msn: int) -> bytes:
    return _AETH.pack(((syndrome & 0xFF) << 24) | (msn & PSN_MASK))


def atomic_eth_bytes(va: int, rkey: int, swap_add: int, compare: int) -> bytes:
    return _ATOMIC.pack(va, rkey, swap_add, compare)


def u64_bytes(value: int) -> bytes:
    return _U64.pack(value)


def u32_bytes(value: int) -> bytes:
    return _U32.pack(value)


def _encode_ext(p: Packet, name: str) -> bytes:
    value = {"reth": p.reth, "aeth": p.aeth, "atomic": p.atomic}.get(name)
    if value is not None:
        return value.encode()  # type: ignore[attr-defined, no-any-return]
    if name == "atomic_ack" and p.atomic_ack is not None:
        return struct.pack(">Q", p.atomic_ack)
    if name == "imm" and p.imm is not None and len(p.imm) == 4:
        return p.imm
    if name == "ieth" and p.ieth is not None:
        return struct.pack(">I", p.ieth)
    raise HeaderError(f"{Opcode(p.bth.opcode).name}: the {name} header is missing (§4.3)")


def _decode_ext(name: str, raw: bytes) -> object:
    if name == "reth":
        return Reth.decode(raw)
    if name == "aeth":
        return Aeth.decode(raw)
    if name == "atomic":
        return AtomicEth.decode(raw)
    if name == "atomic_ack":
        return struct.unpack(">Q", raw)[0]
    if name == "ieth":
        return struct.unpack(">I", raw)[0]
    return bytes(raw)  # imm
