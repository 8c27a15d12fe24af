"""KBTP messages and remotely read structures: frozen dataclasses, `decode`, checked and raw encoders.

Implements KBTP "Messages" (Common Header, Opcodes, Descriptors), "Session Establishment" (HELLO,
HELLO_ACK and its direct-mode descriptors), BIND, COMPLETION, GOODBYE, the Block Table Entry and the
24-octet completion record.  Everything is network byte order except, when the target selected ADDR_LE,
the Block Handle of initiator messages and the STag, Tagged Offset and Length of Data and Completion
Descriptors (and the Block Offset of table entries, see `TableEntry`).

Every message has two encoders: `encode()` refuses what the text forbids (it is `encode_raw()` followed by
`decode()` of the result, so the checked path and the decoder share one set of rules), and `encode_raw()`
writes exactly the field values it is given (wrong version, status in a request, RECORD without a
Completion Descriptor, inline data that disagrees with the descriptor Length, ...) for crafting malformed
messages.  Values wider than their field raise `struct.error` even on the raw path.
"""

from __future__ import annotations

import dataclasses
import struct
from dataclasses import dataclass, field, fields
from typing import ClassVar, Self, TypeAlias

from kvconform.kbtp.constants import (
    ADDR_LE_OPCODES,
    BIND_BODY_SIZE,
    COMPLETION_BODY_SIZE,
    COMPLETION_RECORD_SIZE,
    DESCRIPTOR_SIZE,
    DIRECT_ALLOC_SIZE,
    DIRECT_LOAD_SIZE,
    FLAGS_OF_OPCODE,
    HEADER_SIZE,
    HELLO_ACK_FIXED_SIZE,
    HELLO_BODY_SIZE,
    TABLE_ENTRY_SIZE,
    VERSION,
    EntryFlags,
    Features,
    GoodbyeFlags,
    Opcode,
    RequestFlags,
    Status,
)

__all__ = [
    "AllocStore",
    "Bind",
    "Completion",
    "CompletionDescriptor",
    "CompletionRecord",
    "DataDescriptor",
    "DirectAlloc",
    "DirectDescriptor",
    "DirectLoad",
    "Free",
    "Goodbye",
    "Header",
    "Hello",
    "HelloAck",
    "KbtpDecodeError",
    "KbtpEncodeError",
    "Load",
    "Message",
    "Request",
    "Store",
    "TableEntry",
    "decode",
    "decode_header",
    "pack_header",
]

# Requirement ids (conformance/requirements/kbtp.yaml) cited by the decoder.
R_LAYOUT = "KBTP-HDR-LAYOUT"
R_VERSION = "KBTP-HDR-VERSION"
R_OPCODE = "KBTP-OPCODES"
R_FLAGS = "KBTP-FLAGS"
R_STATUS = "KBTP-HDR-STATUS-ZERO"
R_SESSION_ZERO = "KBTP-HELLO-HEADER-ZERO"
R_BODY = "KBTP-BODY-LAYOUT"
R_RECORD = "KBTP-FLAG-RECORD"
R_INLINE = "KBTP-DESC-INLINE"
R_ACK = "KBTP-ACK-LAYOUT"
R_HEAD_ALIGN = "KBTP-ACK-HEAD-ALIGN"
R_DALLOC = "KBTP-ACK-DALLOC-DESC"
R_RING_SIZE = "KBTP-RING-SIZE"
R_GENERATION = "KBTP-GEN-NONZERO"
R_TABLE = "KBTP-TABLE-LAYOUT"
R_RECORD_LAYOUT = "KBTP-COMP-RECORD"
# The layout requirement of each opcode's body.
R_BODY_OF = {Opcode.HELLO: "KBTP-HELLO-LAYOUT", Opcode.HELLO_ACK: R_ACK, Opcode.BIND: "KBTP-BIND-LAYOUT",
             Opcode.COMPLETION: "KBTP-COMPLETION-LAYOUT"}

_HEADER = struct.Struct(">BBHQQHH")
_OFF_VERSION, _OFF_OPCODE, _OFF_FLAGS, _OFF_REQUEST_ID, _OFF_HANDLE, _OFF_GENERATION, _OFF_STATUS = (
    0, 1, 2, 4, 12, 20, 22)


class KbtpDecodeError(ValueError):
    """Bytes that are not a well-formed KBTP message: names the field, its offset and the requirement.

    `header` is the common header when it could be parsed (a target answers such a request with
    `status`, MALFORMED, echoing its Request ID), else None.
    """

    def __init__(self, field_name: str, offset: int, requirement: str, detail: str, *,
                 header: Header | None = None, status: Status = Status.MALFORMED) -> None:
        super().__init__(f"{field_name} at offset {offset}: {detail} ({requirement})")
        self.field = field_name
        self.offset = offset
        self.requirement = requirement
        self.detail = detail
        self.header = header
        self.status = status


class KbtpEncodeError(ValueError):
    """The checked encoder refused a value the text forbids: names the field and the requirement."""

    def __init__(self, field_name: str, requirement: str, detail: str) -> None:
        super().__init__(f"{field_name}: {detail} ({requirement})")
        self.field = field_name
        self.requirement = requirement
        self.detail = detail


# ---- descriptors ------------------------------------------------------------------------------


def _order(addr_le: bool) -> str:
    return "<" if addr_le else ">"


@dataclass(frozen=True)
class DataDescriptor:
    """Data Descriptor (KBTP "Descriptors"): STag (32), Tagged Offset (64), Length (32) of an initiator buffer."""

    stag: int
    tagged_offset: int
    length: int

    def pack(self, addr_le: bool = False) -> bytes:
        o = _order(addr_le)
        return struct.pack(f"{o}I", self.stag) + struct.pack(f"{o}Q", self.tagged_offset) + struct.pack(
            f"{o}I", self.length)

    @classmethod
    def unpack(cls, buf: bytes, offset: int = 0, addr_le: bool = False) -> DataDescriptor:
        o = _order(addr_le)
        return cls(struct.unpack_from(f"{o}I", buf, offset)[0], struct.unpack_from(f"{o}Q", buf, offset + 4)[0],
                   struct.unpack_from(f"{o}I", buf, offset + 12)[0])


@dataclass(frozen=True)
class CompletionDescriptor:
    """Completion Descriptor: STag (32), Tagged Offset (64), 32 reserved bits; names a 24-octet record slot."""

    stag: int
    tagged_offset: int
    reserved: int = 0

    def pack(self, addr_le: bool = False) -> bytes:
        o = _order(addr_le)
        return struct.pack(f"{o}I", self.stag) + struct.pack(f"{o}Q", self.tagged_offset) + struct.pack(
            ">I", self.reserved)

    @classmethod
    def unpack(cls, buf: bytes, offset: int = 0, addr_le: bool = False) -> CompletionDescriptor:
        o = _order(addr_le)
        return cls(struct.unpack_from(f"{o}I", buf, offset)[0], struct.unpack_from(f"{o}Q", buf, offset + 4)[0],
                   struct.unpack_from(">I", buf, offset + 12)[0])


@dataclass(frozen=True)
class DirectDescriptor:
    """Direct-mode descriptor of HELLO_ACK: STag (32), Tagged Offset (64), Count (32); always big-endian."""

    stag: int
    tagged_offset: int
    count: int

    _S: ClassVar[struct.Struct] = struct.Struct(">IQI")

    def pack(self) -> bytes:
        return self._S.pack(self.stag, self.tagged_offset, self.count)

    @classmethod
    def unpack(cls, buf: bytes, offset: int = 0) -> DirectDescriptor:
        return cls(*cls._S.unpack_from(buf, offset))


@dataclass(frozen=True)
class DirectLoad:
    """DIRECT_LOAD part of HELLO_ACK: Table descriptor, Table Base Handle, 8 reserved octets, Pool descriptor."""

    table: DirectDescriptor
    table_base_handle: int
    pool: DirectDescriptor
    reserved: int = 0  # the 8 reserved octets as a u64

    def pack(self) -> bytes:
        return self.table.pack() + struct.pack(">QQ", self.table_base_handle, self.reserved) + self.pool.pack()

    @classmethod
    def unpack(cls, buf: bytes, offset: int = 0) -> DirectLoad:
        base, reserved = struct.unpack_from(">QQ", buf, offset + DESCRIPTOR_SIZE)
        return cls(DirectDescriptor.unpack(buf, offset), base, DirectDescriptor.unpack(buf, offset + 32), reserved)


@dataclass(frozen=True)
class DirectAlloc:
    """DIRECT_ALLOC part of HELLO_ACK: Partition (Count = quota), Ring (Count = N), Head (Count = 1) descriptors."""

    partition: DirectDescriptor
    ring: DirectDescriptor
    head: DirectDescriptor

    def pack(self) -> bytes:
        return self.partition.pack() + self.ring.pack() + self.head.pack()

    @classmethod
    def unpack(cls, buf: bytes, offset: int = 0) -> DirectAlloc:
        return cls(*(DirectDescriptor.unpack(buf, offset + i * DESCRIPTOR_SIZE) for i in range(3)))


# ---- the common header ------------------------------------------------------------------------


@dataclass(frozen=True)
class Header:
    """KBTP Common Header (24 octets): Version, Opcode, Flags, Request ID, Block Handle, Generation, Status."""

    version: int
    opcode: int
    flags: int
    request_id: int
    handle: int
    generation: int
    status: int


def pack_header(header: Header, addr_le: bool = False) -> bytes:
    """The 24 header octets exactly as given; `addr_le` makes the Block Handle little-endian."""
    raw = bytearray(_HEADER.pack(header.version, header.opcode, header.flags, header.request_id, header.handle,
                                 header.generation, header.status))
    if addr_le:
        struct.pack_into("<Q", raw, _OFF_HANDLE, header.handle)
    return bytes(raw)


def decode_header(buf: bytes, addr_le: bool = False) -> Header:
    """The common header of `buf`, unchecked except for its length.

    `addr_le` applies only to the opcodes an initiator sends after HELLO_ACK (requests, BIND, GOODBYE).
    """
    if len(buf) < HEADER_SIZE:
        raise KbtpDecodeError("header", len(buf), R_LAYOUT,
                              f"got {len(buf)} octets, expected at least the {HEADER_SIZE}-octet common header")
    version, opcode, flags, request_id, handle, generation, status = _HEADER.unpack_from(buf)
    if addr_le and opcode in ADDR_LE_OPCODES:
        handle = struct.unpack_from("<Q", buf, _OFF_HANDLE)[0]
    return Header(version, opcode, flags, request_id, handle, generation, status)


# ---- messages ---------------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class _Message:
    """Common header fields shared by every message; the opcode is the class's."""

    OPCODE: ClassVar[Opcode]

    request_id: int = 0
    handle: int = 0
    generation: int = 0
    status: int = 0
    flags: int = 0
    version: int = VERSION

    def header(self, opcode: int | None = None) -> Header:
        return Header(self.version, self.OPCODE if opcode is None else opcode, self.flags, self.request_id,
                      self.handle, self.generation, self.status)

    def body_raw(self, addr_le: bool = False) -> bytes:
        raise NotImplementedError

    def encode_raw(self, *, addr_le: bool = False, opcode: int | None = None) -> bytes:
        """Exactly the fields given (and `opcode` instead of the class's when given); no check."""
        return pack_header(self.header(opcode), addr_le and self.OPCODE in ADDR_LE_OPCODES) + self.body_raw(addr_le)

    def encode(self, *, addr_le: bool = False) -> bytes:
        """The message, after checking it against every rule `decode` enforces; KbtpEncodeError otherwise."""
        _check_widths(self)
        self._check_parts()
        raw = self.encode_raw(addr_le=addr_le)
        try:
            back = decode(raw, addr_le=addr_le)
        except KbtpDecodeError as exc:
            raise KbtpEncodeError(exc.field, exc.requirement, exc.detail) from exc
        if back != self:
            # decode reads the bytes differently from the fields given: they contradict each other
            for f in fields(self):
                if getattr(back, f.name) != getattr(self, f.name):
                    raise KbtpEncodeError(f.name, _CONSISTENCY.get(f.name, R_BODY),
                                          f"got {getattr(self, f.name)!r}, but the message encodes "
                                          f"{getattr(back, f.name)!r}")
        return raw

    def _check_parts(self) -> None:
        """Optional parts agree with the flags or features that announce them (checked path only)."""



# Field widths in bits, by field name (DirectLoad's 8 reserved octets are the one 64-bit "reserved").
_WIDTH = {"version": 8, "flags": 16, "request_id": 64, "handle": 64, "generation": 16, "status": 16,
          "requested_features": 16, "completion_credits": 16, "features": 16, "request_credits": 16,
          "block_size": 32, "max_inline": 32, "allocation_quota": 32, "handle_base": 64, "handle_count": 32,
          "ticket_timeout_ms": 32, "ticket": 32, "data_length": 32, "block_offset": 64, "reserved": 32,
          "stag": 32, "tagged_offset": 64, "length": 32, "count": 32, "table_base_handle": 64}


_FIELD_NAMES: dict[type, tuple[str, ...]] = {}


def _field_names(cls: type) -> tuple[str, ...]:
    """A message class's field names, cached (``dataclasses.fields`` on every encode was a cost of its own)."""
    names = _FIELD_NAMES.get(cls)
    if names is None:
        names = _FIELD_NAMES[cls] = tuple(f.name for f in fields(cls))  # type: ignore[arg-type]
    return names


def _check_widths(obj: object, prefix: str = "") -> None:
    """KbtpEncodeError naming the first field whose value does not fit its width (HDR-LAYOUT)."""
    for field_name in _field_names(type(obj)):
        value = getattr(obj, field_name)
        name = prefix + field_name
        if isinstance(value, int):
            bits = 64 if isinstance(obj, DirectLoad) and field_name == "reserved" else _WIDTH[field_name]
            if not 0 <= value < 1 << bits:
                raise KbtpEncodeError(name, R_LAYOUT, f"got {value}, expected 0 <= value < 2^{bits}")
        elif dataclasses.is_dataclass(value):
            _check_widths(value, name + ".")
        elif name == "initiator_id" and len(value) != 16:
            raise KbtpEncodeError(name, "KBTP-HELLO-LAYOUT", f"got {len(value)} octets, expected 16")


# Which requirement an inconsistent field of a checked encode violates.
_CONSISTENCY = {"completion": R_RECORD, "inline": R_INLINE, "data": R_INLINE, "direct_load": R_ACK,
                "direct_alloc": R_ACK}


@dataclass(frozen=True, kw_only=True)
class Hello(_Message):
    """HELLO: Requested Features (16), Completion Credits (16), Initiator ID (128 bits, 16 octets)."""

    OPCODE: ClassVar[Opcode] = Opcode.HELLO

    requested_features: int = 0
    completion_credits: int = 0
    initiator_id: bytes = bytes(16)

    def body_raw(self, addr_le: bool = False) -> bytes:
        return struct.pack(">HH", self.requested_features, self.completion_credits) + self.initiator_id


@dataclass(frozen=True, kw_only=True)
class HelloAck(_Message):
    """HELLO_ACK (the Target Descriptor) and the direct-mode descriptors its Features announce."""

    OPCODE: ClassVar[Opcode] = Opcode.HELLO_ACK

    features: int = 0
    request_credits: int = 0
    block_size: int = 0
    max_inline: int = 0
    allocation_quota: int = 0
    handle_base: int = 0
    handle_count: int = 0
    ticket_timeout_ms: int = 0
    direct_load: DirectLoad | None = None
    direct_alloc: DirectAlloc | None = None

    _FIXED: ClassVar[struct.Struct] = struct.Struct(">HHIIIQII")

    def _check_parts(self) -> None:
        for name, feature in (("direct_load", Features.DIRECT_LOAD), ("direct_alloc", Features.DIRECT_ALLOC)):
            _agree(name, getattr(self, name) is not None, bool(self.features & feature), feature.name or "", R_ACK)

    def body_raw(self, addr_le: bool = False) -> bytes:
        body = self._FIXED.pack(self.features, self.request_credits, self.block_size, self.max_inline,
                                self.allocation_quota, self.handle_base, self.handle_count, self.ticket_timeout_ms)
        if self.direct_load is not None:
            body += self.direct_load.pack()
        if self.direct_alloc is not None:
            body += self.direct_alloc.pack()
        return body


def _agree(name: str, present: bool, announced: bool, announcer: str, requirement: str) -> None:
    if present != announced:
        raise KbtpEncodeError(name, requirement, f"{'present' if present else 'absent'} but {announcer} is "
                                                 f"{'clear' if present else 'set'}")


@dataclass(frozen=True, kw_only=True)
class _WithCompletion(_Message):
    completion: CompletionDescriptor | None = None  # present iff RECORD

    def _check_parts(self) -> None:
        _agree("completion", self.completion is not None, bool(self.flags & RequestFlags.RECORD), "RECORD",
               R_RECORD)


@dataclass(frozen=True, kw_only=True)
class Load(_WithCompletion):
    """LOAD: Data Descriptor (the destination) [, Completion Descriptor]."""

    OPCODE: ClassVar[Opcode] = Opcode.LOAD

    data: DataDescriptor = field(default_factory=lambda: DataDescriptor(0, 0, 0))

    def body_raw(self, addr_le: bool = False) -> bytes:
        return self.data.pack(addr_le) + (self.completion.pack(addr_le) if self.completion else b"")


@dataclass(frozen=True, kw_only=True)
class _StoreBase(_WithCompletion):
    data: DataDescriptor = field(default_factory=lambda: DataDescriptor(0, 0, 0))
    inline: bytes | None = None  # present iff INLINE

    def _check_parts(self) -> None:
        super()._check_parts()
        _agree("inline", self.inline is not None, bool(self.flags & RequestFlags.INLINE), "INLINE", R_INLINE)
        if self.inline is not None and self.data.length != len(self.inline):
            raise KbtpEncodeError("data.length", R_INLINE, f"got {self.data.length}, but the inline data is "
                                                           f"{len(self.inline)} octets")

    def body_raw(self, addr_le: bool = False) -> bytes:
        return (self.data.pack(addr_le) + (self.completion.pack(addr_le) if self.completion else b"")
                + (self.inline or b""))

    @classmethod
    def with_inline(cls, payload: bytes, *, request_id: int = 0, handle: int = 0, generation: int = 0,
                    flags: int = 0, completion: CompletionDescriptor | None = None) -> Self:
        """A store of inline `payload`: INLINE set, descriptor {STag 0, Tagged Offset 0, Length len(payload)};
        RECORD set when a Completion Descriptor is given."""
        flags |= RequestFlags.INLINE | (RequestFlags.RECORD if completion is not None else 0)
        return cls(data=DataDescriptor(0, 0, len(payload)), inline=bytes(payload), flags=flags,
                   request_id=request_id, handle=handle, generation=generation, completion=completion)


@dataclass(frozen=True, kw_only=True)
class Store(_StoreBase):
    """STORE (mapped): Data Descriptor [, Completion Descriptor] [, inline data]."""

    OPCODE: ClassVar[Opcode] = Opcode.STORE


@dataclass(frozen=True, kw_only=True)
class AllocStore(_StoreBase):
    """ALLOC_STORE (unmapped): Data Descriptor [, Completion Descriptor] [, inline data]."""

    OPCODE: ClassVar[Opcode] = Opcode.ALLOC_STORE


@dataclass(frozen=True, kw_only=True)
class Free(_WithCompletion):
    """FREE: [Completion Descriptor]."""

    OPCODE: ClassVar[Opcode] = Opcode.FREE

    def body_raw(self, addr_le: bool = False) -> bytes:
        return self.completion.pack(addr_le) if self.completion else b""


@dataclass(frozen=True, kw_only=True)
class Bind(_Message):
    """BIND (DIRECT_ALLOC): Ticket (32), Data Length (32), Block Offset (64)."""

    OPCODE: ClassVar[Opcode] = Opcode.BIND

    ticket: int = 0
    data_length: int = 0
    block_offset: int = 0

    def body_raw(self, addr_le: bool = False) -> bytes:
        return struct.pack(">IIQ", self.ticket, self.data_length, self.block_offset)


@dataclass(frozen=True, kw_only=True)
class Completion(_Message):
    """COMPLETION: Data Length (32), Reserved (32), Block Offset (64)."""

    OPCODE: ClassVar[Opcode] = Opcode.COMPLETION

    data_length: int = 0
    block_offset: int = 0
    reserved: int = 0

    def body_raw(self, addr_le: bool = False) -> bytes:
        return struct.pack(">IIQ", self.data_length, self.reserved, self.block_offset)


@dataclass(frozen=True, kw_only=True)
class Goodbye(_Message):
    """GOODBYE: no body; flag RELEASE frees every handle the initiator bound."""

    OPCODE: ClassVar[Opcode] = Opcode.GOODBYE

    def body_raw(self, addr_le: bool = False) -> bytes:
        return b""


Message: TypeAlias = Hello | HelloAck | Load | Store | AllocStore | Free | Bind | Completion | Goodbye
Request: TypeAlias = Load | Store | AllocStore | Free | Bind
_CLASSES: dict[int, type[_Message]] = {cls.OPCODE: cls for cls in (Hello, HelloAck, Load, Store, AllocStore,
                                                                    Free, Bind, Completion, Goodbye)}


# ---- decoding ---------------------------------------------------------------------------------


def _expect_length(buf: bytes, expected: int, header: Header, what: str) -> None:
    if len(buf) != expected:
        raise KbtpDecodeError("body", HEADER_SIZE, R_BODY_OF.get(Opcode(header.opcode), R_BODY),
                              f"{Opcode(header.opcode).name}: got {len(buf) - HEADER_SIZE} body octets, expected "
                              f"{expected - HEADER_SIZE} ({what})", header=header)


def _check_header(h: Header) -> None:
    if h.version != VERSION:
        raise KbtpDecodeError("version", _OFF_VERSION, R_VERSION, f"got {h.version}, expected {VERSION}", header=h)
    if h.opcode not in _CLASSES:
        raise KbtpDecodeError("opcode", _OFF_OPCODE, R_OPCODE,
                              f"got 0x{h.opcode:02x}, expected one of "
                              f"{', '.join(f'0x{int(o):02x}' for o in Opcode)}", header=h)
    allowed = FLAGS_OF_OPCODE.get(Opcode(h.opcode), 0)
    if h.flags & ~allowed:
        raise KbtpDecodeError("flags", _OFF_FLAGS, R_FLAGS,
                              f"got 0x{h.flags:04x}, {Opcode(h.opcode).name} defines only 0x{allowed:04x}", header=h)
    op = Opcode(h.opcode)
    if op in (Opcode.HELLO, Opcode.HELLO_ACK):
        for name, off in (("request_id", _OFF_REQUEST_ID), ("handle", _OFF_HANDLE),
                          ("generation", _OFF_GENERATION)):
            if getattr(h, name):
                raise KbtpDecodeError(name, off, R_SESSION_ZERO,
                                      f"got {getattr(h, name)}, expected 0 in {op.name}", header=h)
    if op not in (Opcode.HELLO_ACK, Opcode.COMPLETION) and h.status:
        raise KbtpDecodeError("status", _OFF_STATUS, R_SESSION_ZERO if op is Opcode.HELLO else R_STATUS,
                              f"got {h.status}, expected 0 in {op.name}", header=h)


def _common(h: Header) -> dict[str, int]:
    op = Opcode(h.opcode)
    flags: int = h.flags
    if op in FLAGS_OF_OPCODE:
        flags = GoodbyeFlags(h.flags) if op is Opcode.GOODBYE else RequestFlags(h.flags)
    status: int = Status(h.status) if h.status in Status._value2member_map_ else h.status
    return {"request_id": h.request_id, "handle": h.handle, "generation": h.generation, "status": status,
            "flags": flags, "version": h.version}


def _decode_request(buf: bytes, h: Header, addr_le: bool) -> Message:
    op = Opcode(h.opcode)
    record = bool(h.flags & RequestFlags.RECORD)
    inline = bool(h.flags & RequestFlags.INLINE)
    if inline and op in (Opcode.LOAD, Opcode.FREE):
        raise KbtpDecodeError("flags", _OFF_FLAGS, R_BODY,
                              f"INLINE set in {op.name}, whose body has no inline data", header=h)
    off = HEADER_SIZE
    data: DataDescriptor | None = None
    if op is not Opcode.FREE:
        if len(buf) < off + DESCRIPTOR_SIZE:
            _expect_length(buf, off + DESCRIPTOR_SIZE, h, "a Data Descriptor")
        data = DataDescriptor.unpack(buf, off, addr_le)
        off += DESCRIPTOR_SIZE
    completion = None
    if record:
        if len(buf) < off + DESCRIPTOR_SIZE:
            raise KbtpDecodeError("completion", off, R_RECORD,
                                  f"RECORD is set but only {len(buf) - off} of the Completion Descriptor's "
                                  f"{DESCRIPTOR_SIZE} octets follow", header=h)
        completion = CompletionDescriptor.unpack(buf, off, addr_le)
        off += DESCRIPTOR_SIZE
    common = _common(h)
    if op is Opcode.FREE:
        _expect_length(buf, off, h, "RECORD is set" if record else "RECORD is clear: no body")
        return Free(completion=completion, **common)
    assert data is not None
    if op is Opcode.LOAD:
        _expect_length(buf, off, h, "the Data Descriptor" + (" and a Completion Descriptor" if record else ""))
        return Load(data=data, completion=completion, **common)
    payload: bytes | None = None
    if inline:
        if data.stag or data.tagged_offset:
            bad = "stag" if data.stag else "tagged_offset"
            raise KbtpDecodeError(f"data.{bad}", HEADER_SIZE + (0 if data.stag else 4), R_INLINE,
                                  f"got {getattr(data, bad)}, expected 0 with INLINE", header=h)
        if len(buf) != off + data.length:
            raise KbtpDecodeError("data.length", HEADER_SIZE + 12, R_INLINE,
                                  f"got {data.length}, but {len(buf) - off} octets of inline data follow", header=h)
        payload = bytes(buf[off:])
    else:
        _expect_length(buf, off, h, "INLINE is clear: no inline data")
    cls = Store if op is Opcode.STORE else AllocStore
    return cls(data=data, completion=completion, inline=payload, **common)


def _decode_hello_ack(buf: bytes, h: Header) -> HelloAck:
    end = HEADER_SIZE + HELLO_ACK_FIXED_SIZE
    if len(buf) < end:
        _expect_length(buf, end, h, "the Target Descriptor")
    values = HelloAck._FIXED.unpack_from(buf, HEADER_SIZE)
    features = Features(values[0])
    direct_load = direct_alloc = None
    expected = end + (DIRECT_LOAD_SIZE if features & Features.DIRECT_LOAD else 0) + (
        DIRECT_ALLOC_SIZE if features & Features.DIRECT_ALLOC else 0)
    if len(buf) != expected:
        raise KbtpDecodeError("body", end, R_ACK,
                              f"got {len(buf) - end} octets of direct-mode descriptors, expected "
                              f"{expected - end} for Features 0x{int(features):04x}", header=h)
    off = end
    if features & Features.DIRECT_LOAD:
        direct_load = DirectLoad.unpack(buf, off)
        off += DIRECT_LOAD_SIZE
    if features & Features.DIRECT_ALLOC:
        direct_alloc = DirectAlloc.unpack(buf, off)
        head_off = off + 2 * DESCRIPTOR_SIZE
        if direct_alloc.head.tagged_offset % 8:
            raise KbtpDecodeError("direct_alloc.head.tagged_offset", head_off + 4, R_HEAD_ALIGN,
                                  f"got 0x{direct_alloc.head.tagged_offset:x}, expected a multiple of 8 (FetchAdd)",
                                  header=h)
        if direct_alloc.head.count != 1:
            raise KbtpDecodeError("direct_alloc.head.count", head_off + 12, R_DALLOC,
                                  f"got {direct_alloc.head.count}, expected 1", header=h)
        if direct_alloc.partition.count != values[4]:
            raise KbtpDecodeError("direct_alloc.partition.count", off + 12, R_DALLOC,
                                  f"got {direct_alloc.partition.count}, expected the Allocation Quota {values[4]}",
                                  header=h)
        n = direct_alloc.ring.count
        if n < 2 or n & (n - 1) or n < direct_alloc.partition.count:
            raise KbtpDecodeError("direct_alloc.ring.count", off + DESCRIPTOR_SIZE + 12, R_RING_SIZE,
                                  f"got {n}, expected N = 2^n (n >= 1) not smaller than the partition's "
                                  f"{direct_alloc.partition.count} blocks", header=h)
    return HelloAck(features=features, request_credits=values[1], block_size=values[2], max_inline=values[3],
                    allocation_quota=values[4], handle_base=values[5], handle_count=values[6],
                    ticket_timeout_ms=values[7], direct_load=direct_load, direct_alloc=direct_alloc, **_common(h))


def decode(buf: bytes, *, addr_le: bool = False) -> Message:
    """The message in `buf` (one Send payload), validated per the text; KbtpDecodeError otherwise.

    `addr_le`: the session's HELLO_ACK set ADDR_LE, so the Block Handle of initiator messages and the
    address fields of their descriptors are little-endian.
    """
    buf = bytes(buf)
    h = decode_header(buf, addr_le)
    _check_header(h)
    op = Opcode(h.opcode)
    if op in (Opcode.LOAD, Opcode.STORE, Opcode.ALLOC_STORE, Opcode.FREE):
        return _decode_request(buf, h, addr_le)
    if op is Opcode.HELLO:
        _expect_length(buf, HEADER_SIZE + HELLO_BODY_SIZE, h, "Requested Features, Completion Credits, Initiator ID")
        features, credits = struct.unpack_from(">HH", buf, HEADER_SIZE)
        return Hello(requested_features=Features(features), completion_credits=credits,
                     initiator_id=buf[HEADER_SIZE + 4 :], **_common(h))
    if op is Opcode.HELLO_ACK:
        return _decode_hello_ack(buf, h)
    if op is Opcode.BIND:
        _expect_length(buf, HEADER_SIZE + BIND_BODY_SIZE, h, "Ticket, Data Length, Block Offset")
        ticket, length, offset = struct.unpack_from(">IIQ", buf, HEADER_SIZE)
        return Bind(ticket=ticket, data_length=length, block_offset=offset, **_common(h))
    if op is Opcode.COMPLETION:
        _expect_length(buf, HEADER_SIZE + COMPLETION_BODY_SIZE, h, "Data Length, Reserved, Block Offset")
        length, reserved, offset = struct.unpack_from(">IIQ", buf, HEADER_SIZE)
        return Completion(data_length=length, reserved=reserved, block_offset=offset, **_common(h))
    _expect_length(buf, HEADER_SIZE, h, "GOODBYE has no body")
    return Goodbye(**_common(h))


# ---- structures read or written by RDMA ----------------------------------------------------


@dataclass(frozen=True)
class TableEntry:
    """Block Table Entry (16 octets): Flags (16), Generation (16), Data Length (32), Block Offset (64).

    The Block Offset is little-endian when the target selected ADDR_LE.
    """

    flags: int
    generation: int
    data_length: int
    block_offset: int

    def pack(self, addr_le: bool = False) -> bytes:
        return struct.pack(">HHI", self.flags, self.generation, self.data_length) + struct.pack(
            f"{_order(addr_le)}Q", self.block_offset)

    @classmethod
    def unpack(cls, buf: bytes, offset: int = 0, addr_le: bool = False) -> TableEntry:
        """The entry at `offset`; KbtpDecodeError for a short buffer or Generation 0 ("never takes the value zero")."""
        if len(buf) < offset + TABLE_ENTRY_SIZE:
            raise KbtpDecodeError("entry", offset, R_TABLE,
                                  f"got {len(buf) - offset} octets, expected {TABLE_ENTRY_SIZE}")
        flags, generation, length = struct.unpack_from(">HHI", buf, offset)
        if generation == 0:
            raise KbtpDecodeError("generation", offset + 2, R_GENERATION, "got 0, which a Generation never takes")
        (block_offset,) = struct.unpack_from(f"{_order(addr_le)}Q", buf, offset + 8)
        return cls(EntryFlags(flags), generation, length, block_offset)


@dataclass(frozen=True)
class CompletionRecord:
    """Completion record (24 octets): Request ID (64), Status (16), Generation (16), Data Length (32),
    Block Offset (64)."""

    request_id: int
    status: int
    generation: int
    data_length: int
    block_offset: int

    _S: ClassVar[struct.Struct] = struct.Struct(">QHHIQ")

    def pack(self) -> bytes:
        return self._S.pack(self.request_id, self.status, self.generation, self.data_length, self.block_offset)

    @classmethod
    def unpack(cls, buf: bytes, offset: int = 0) -> CompletionRecord:
        if len(buf) < offset + COMPLETION_RECORD_SIZE:
            raise KbtpDecodeError("record", offset, R_RECORD_LAYOUT,
                                  f"got {len(buf) - offset} octets, expected {COMPLETION_RECORD_SIZE}")
        rid, status, generation, length, block_offset = cls._S.unpack_from(buf, offset)
        return cls(rid, Status(status) if status in Status._value2member_map_ else status, generation, length,
                   block_offset)
