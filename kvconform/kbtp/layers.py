"""Scapy layers for crafting and dissecting KBTP messages (KBTP "Messages", "Session Establishment").

`KBTP` is the 24-octet common header in network byte order; `KBTPAddrLE` is the same header for a
session whose HELLO_ACK set ADDR_LE, where an initiator message's Block Handle and the STag, Tagged
Offset and Length of its descriptors are little-endian.  Bodies follow by opcode (`KBTPLoad`, ...); a
body layer reads the byte order of its descriptors from the header class below it.

Computed fields are filled in `post_build` only when left None: the header's `opcode` (from the body
layer, through `bind_layers`) and the Data Descriptor Length of an INLINE store (`len(inline)`).
Everything else is written as given, so a malformed message is a valid one with one field changed.
Dissection never raises: what does not fit the layout is kept as a `Raw` payload.  `to_message` turns a
dissected packet into the codec's dataclass, which the tests hold equal to `messages.decode`.
"""

from __future__ import annotations

import struct
from typing import Any, ClassVar

from scapy.fields import (
    ByteEnumField,
    ByteField,
    ConditionalField,
    IntField,
    LEIntField,
    MultipleTypeField,
    ShortEnumField,
    ShortField,
    StrField,
    StrFixedLenField,
    XIntField,
    XLEIntField,
    XLELongField,
    XLongField,
    XShortField,
)
from scapy.packet import Packet, Raw, bind_layers

from kvconform.kbtp.constants import ADDR_LE_OPCODES, HEADER_SIZE, VERSION, Features, Opcode, RequestFlags, Status
from kvconform.kbtp.messages import (
    AllocStore,
    Bind,
    Completion,
    CompletionDescriptor,
    DataDescriptor,
    DirectAlloc,
    DirectDescriptor,
    DirectLoad,
    Free,
    Goodbye,
    Hello,
    HelloAck,
    Load,
    Message,
    Store,
)

__all__ = [
    "BODY_LAYERS",
    "KBTP",
    "KBTPAddrLE",
    "KBTPAllocStore",
    "KBTPBind",
    "KBTPCompletion",
    "KBTPFree",
    "KBTPGoodbye",
    "KBTPHello",
    "KBTPHelloAck",
    "KBTPLoad",
    "KBTPStore",
    "craft",
    "dissect",
    "to_message",
]

_OPCODES = {int(o): o.name for o in Opcode}
_STATUS = {int(s): s.name for s in Status}


class _Lenient(Packet):  # type: ignore[misc]
    """A layer that, when its bytes are too short for its fields, keeps them whole as Raw and rebuilds them as is."""

    def _keep_raw(self) -> None:
        self._short = True
        self.raw_packet_cache = None
        self.explicit = 1

    def is_short(self) -> bool:
        return bool(getattr(self, "_short", False))

    def self_build(self) -> bytes:
        return b"" if self.is_short() else bytes(super().self_build())

    def post_build(self, pkt: bytes, pay: bytes) -> bytes:
        return pkt + pay if self.is_short() else self.post_build_fields(pkt, pay)

    def post_build_fields(self, pkt: bytes, pay: bytes) -> bytes:
        return pkt + pay


class KBTP(_Lenient):
    """KBTP Common Header (24 octets), network byte order; `opcode` None -> the body layer's."""

    name = "KBTP"
    fields_desc: ClassVar[list[Any]] = [
        ByteField("version", VERSION),
        ByteEnumField("opcode", None, _OPCODES),
        XShortField("flags", 0),
        XLongField("request_id", 0),
        XLongField("handle", 0),
        ShortField("generation", 0),
        ShortEnumField("status", 0, _STATUS),
    ]

    def do_dissect(self, s: bytes) -> bytes:
        if len(s) >= HEADER_SIZE:
            return bytes(super().do_dissect(s))
        # Shorter than a header: no field is dissected, every octet is kept as the Raw payload.
        self._keep_raw()
        return s

    def do_dissect_payload(self, s: bytes) -> None:
        cls = _BODY_OF.get(self.opcode)
        if not s and not self.is_short() and cls is not None:
            # scapy adds no layer for an empty body; GOODBYE and FREE without RECORD have one
            body = cls(_internal=1, _underlayer=self)
            body.do_dissect(b"")
            self.add_payload(body)
            return
        super().do_dissect_payload(s)

    def guess_payload_class(self, payload: bytes) -> type[Packet]:
        cls: type[Packet] = Raw if self.is_short() else _BODY_OF.get(self.opcode, Raw)
        return cls

    def post_build_fields(self, pkt: bytes, pay: bytes) -> bytes:
        if self.opcode is None:
            raise ValueError("opcode: got None and no body layer to take it from; give opcode=...")
        return pkt + pay


class KBTPAddrLE(KBTP):
    """The common header of a session with ADDR_LE: an initiator message's Block Handle is little-endian.

    Opcodes outside the initiator's (HELLO, HELLO_ACK, COMPLETION) keep the network-order handle.
    """

    name = "KBTP (ADDR_LE)"
    fields_desc: ClassVar[list[Any]] = [
        *KBTP.fields_desc[:4],
        MultipleTypeField([(XLELongField("handle", 0), lambda pkt: pkt.opcode in ADDR_LE_OPCODES)],
                          XLongField("handle", 0)),
        *KBTP.fields_desc[5:],
    ]


def _le(pkt: Packet) -> bool:
    return isinstance(pkt.underlayer, KBTPAddrLE)


def _flags(pkt: Packet) -> int:
    return int(pkt.underlayer.flags) if isinstance(pkt.underlayer, KBTP) else 0


def _addr(name: str, default: int | None, be: Any, le: Any) -> MultipleTypeField:
    """A descriptor address field: little-endian under a KBTPAddrLE header, network order otherwise."""
    return MultipleTypeField([(le(name, default), _le)], be(name, default))


def _data_descriptor() -> list[Any]:
    return [_addr("data_stag", 0, XIntField, XLEIntField), _addr("data_tagged_offset", 0, XLongField, XLELongField),
            _addr("data_length", None, IntField, LEIntField)]


def _completion_descriptor() -> list[Any]:
    def record(pkt: Packet) -> bool:
        return bool(_flags(pkt) & RequestFlags.RECORD)

    return [ConditionalField(_addr("cd_stag", 0, XIntField, XLEIntField), record),
            ConditionalField(_addr("cd_tagged_offset", 0, XLongField, XLELongField), record),
            ConditionalField(XIntField("cd_reserved", 0), record)]


class _Body(_Lenient):
    def do_dissect(self, s: bytes) -> bytes:
        size = sum(_size(f, self) for f in self.fields_desc)
        if len(s) >= size:
            return bytes(super().do_dissect(s))
        # Too short for this body: keep it whole as Raw rather than half-parse it.
        self._keep_raw()
        self.add_payload(Raw(s))
        return b""

    def extract_padding(self, s: bytes) -> tuple[bytes, bytes | None]:
        return b"", s if s else None


def _size(f: Any, pkt: Packet) -> int:
    """Octets a fixed-size field takes in `pkt` (0 for absent conditional fields and the trailing StrField)."""
    if isinstance(f, ConditionalField):
        return _size(f.fld, pkt) if f._evalcond(pkt) else 0
    if isinstance(f, MultipleTypeField):
        return _size(f._find_fld_pkt(pkt), pkt)
    if isinstance(f, StrFixedLenField):
        return int(f.length_from(pkt))
    if isinstance(f, StrField):
        return 0
    return int(f.sz)


class KBTPHello(_Body):
    """HELLO body: Requested Features, Completion Credits, Initiator ID (16 octets)."""

    name = "KBTP HELLO"
    fields_desc: ClassVar[list[Any]] = [XShortField("requested_features", 0), ShortField("completion_credits", 0),
                                        StrFixedLenField("initiator_id", bytes(16), 16)]


def _has(feature: Features) -> Any:
    return lambda pkt: bool(pkt.features & feature)


def _direct(prefix: str, feature: Features) -> list[Any]:
    return [ConditionalField(XIntField(f"{prefix}_stag", 0), _has(feature)),
            ConditionalField(XLongField(f"{prefix}_tagged_offset", 0), _has(feature)),
            ConditionalField(IntField(f"{prefix}_count", 0), _has(feature))]


class KBTPHelloAck(_Body):
    """HELLO_ACK body (Target Descriptor) and the direct-mode descriptors its Features announce."""

    name = "KBTP HELLO_ACK"
    fields_desc: ClassVar[list[Any]] = [
        XShortField("features", 0), ShortField("request_credits", 0), IntField("block_size", 0),
        IntField("max_inline", 0), IntField("allocation_quota", 0), XLongField("handle_base", 0),
        IntField("handle_count", 0), IntField("ticket_timeout_ms", 0),
        *_direct("table", Features.DIRECT_LOAD),
        ConditionalField(XLongField("table_base_handle", 0), _has(Features.DIRECT_LOAD)),
        ConditionalField(XLongField("table_reserved", 0), _has(Features.DIRECT_LOAD)),
        *_direct("pool", Features.DIRECT_LOAD),
        *_direct("partition", Features.DIRECT_ALLOC),
        *_direct("ring", Features.DIRECT_ALLOC),
        *_direct("head", Features.DIRECT_ALLOC),
    ]


class KBTPLoad(_Body):
    """LOAD body: Data Descriptor [, Completion Descriptor (RECORD)]."""

    name = "KBTP LOAD"
    fields_desc: ClassVar[list[Any]] = [*_data_descriptor(), *_completion_descriptor()]

    def post_build_fields(self, pkt: bytes, pay: bytes) -> bytes:
        if self.data_length is None:
            raise ValueError("data_length: got None, expected the destination buffer's Length")
        return pkt + pay


class _StoreBody(_Body):
    def post_build_fields(self, pkt: bytes, pay: bytes) -> bytes:
        if self.data_length is None:
            if self.inline is None:
                raise ValueError("data_length: got None without inline data; give the source buffer's Length")
            pkt = pkt[:12] + struct.pack("<I" if _le(self) else ">I", len(self.inline)) + pkt[16:]
        return pkt + pay


def _inline(pkt: Packet) -> bool:
    return bool(_flags(pkt) & RequestFlags.INLINE)


class KBTPStore(_StoreBody):
    """STORE body: Data Descriptor [, Completion Descriptor] [, inline data (INLINE)]; Length None -> len(inline)."""

    name = "KBTP STORE"
    fields_desc: ClassVar[list[Any]] = [*_data_descriptor(), *_completion_descriptor(),
                                        ConditionalField(StrField("inline", b""), _inline)]


class KBTPAllocStore(_StoreBody):
    """ALLOC_STORE body: as STORE."""

    name = "KBTP ALLOC_STORE"
    fields_desc: ClassVar[list[Any]] = KBTPStore.fields_desc


class KBTPFree(_Body):
    """FREE body: [Completion Descriptor (RECORD)]."""

    name = "KBTP FREE"
    fields_desc: ClassVar[list[Any]] = _completion_descriptor()


class KBTPBind(_Body):
    """BIND body: Ticket (32), Data Length (32), Block Offset (64)."""

    name = "KBTP BIND"
    fields_desc: ClassVar[list[Any]] = [IntField("ticket", 0), IntField("data_length", 0),
                                        XLongField("block_offset", 0)]


class KBTPCompletion(_Body):
    """COMPLETION body: Data Length (32), Reserved (32), Block Offset (64)."""

    name = "KBTP COMPLETION"
    fields_desc: ClassVar[list[Any]] = [IntField("data_length", 0), XIntField("reserved", 0),
                                        XLongField("block_offset", 0)]


class KBTPGoodbye(_Body):
    """GOODBYE: no body (a layer of its own so that `KBTP()/KBTPGoodbye()` sets the opcode)."""

    name = "KBTP GOODBYE"
    fields_desc: ClassVar[list[Any]] = []


BODY_LAYERS: dict[Opcode, type[Packet]] = {
    Opcode.HELLO: KBTPHello, Opcode.HELLO_ACK: KBTPHelloAck, Opcode.LOAD: KBTPLoad, Opcode.STORE: KBTPStore,
    Opcode.ALLOC_STORE: KBTPAllocStore, Opcode.FREE: KBTPFree, Opcode.BIND: KBTPBind,
    Opcode.COMPLETION: KBTPCompletion, Opcode.GOODBYE: KBTPGoodbye,
}
_BODY_OF: dict[int, type[Packet]] = {int(op): cls for op, cls in BODY_LAYERS.items()}
for _header in (KBTP, KBTPAddrLE):
    for _op, _cls in BODY_LAYERS.items():
        bind_layers(_header, _cls, opcode=int(_op))


def dissect(data: bytes, *, addr_le: bool = False) -> KBTP:
    """The layers of one KBTP message; never raises on lengths, opcodes or values that do not fit."""
    pkt = (KBTPAddrLE if addr_le else KBTP)(bytes(data))
    if not data:  # scapy does not dissect empty bytes at all
        pkt._keep_raw()
    return pkt


def _header_kwargs(h: KBTP) -> dict[str, Any]:
    return {"request_id": h.request_id, "handle": h.handle, "generation": h.generation, "status": h.status,
            "flags": h.flags, "version": h.version}


def _direct_descriptor(b: Packet, prefix: str) -> DirectDescriptor:
    return DirectDescriptor(getattr(b, f"{prefix}_stag"), getattr(b, f"{prefix}_tagged_offset"),
                            getattr(b, f"{prefix}_count"))


def to_message(pkt: KBTP) -> Message:
    """The codec dataclass of a dissected packet (no validation: compare with `messages.decode`).

    ValueError when the packet has no body layer that matches its opcode (a too-short or unknown message).
    """
    body = pkt.payload
    cls = _BODY_OF.get(pkt.opcode)
    if cls is None or not isinstance(body, cls) or isinstance(body.payload, Raw):
        what = cls.__name__ if cls else "body layer"
        raise ValueError(f"opcode 0x{pkt.opcode or 0:02x}: the packet has no complete {what}")
    common = _header_kwargs(pkt)
    if isinstance(body, KBTPHello):
        return Hello(requested_features=body.requested_features, completion_credits=body.completion_credits,
                     initiator_id=body.initiator_id, **common)
    if isinstance(body, KBTPHelloAck):
        dl = da = None
        if body.features & Features.DIRECT_LOAD:
            dl = DirectLoad(_direct_descriptor(body, "table"), body.table_base_handle,
                            _direct_descriptor(body, "pool"), body.table_reserved)
        if body.features & Features.DIRECT_ALLOC:
            da = DirectAlloc(*(_direct_descriptor(body, p) for p in ("partition", "ring", "head")))
        return HelloAck(features=body.features, request_credits=body.request_credits, block_size=body.block_size,
                        max_inline=body.max_inline, allocation_quota=body.allocation_quota,
                        handle_base=body.handle_base, handle_count=body.handle_count,
                        ticket_timeout_ms=body.ticket_timeout_ms, direct_load=dl, direct_alloc=da, **common)
    if isinstance(body, KBTPBind):
        return Bind(ticket=body.ticket, data_length=body.data_length, block_offset=body.block_offset, **common)
    if isinstance(body, KBTPCompletion):
        return Completion(data_length=body.data_length, reserved=body.reserved, block_offset=body.block_offset,
                          **common)
    if isinstance(body, KBTPGoodbye):
        return Goodbye(**common)
    completion = (CompletionDescriptor(body.cd_stag, body.cd_tagged_offset, body.cd_reserved)
                  if pkt.flags & RequestFlags.RECORD else None)
    if isinstance(body, KBTPFree):
        return Free(completion=completion, **common)
    data = DataDescriptor(body.data_stag, body.data_tagged_offset, body.data_length)
    if isinstance(body, KBTPLoad):
        return Load(data=data, completion=completion, **common)
    inline = bytes(body.inline) if pkt.flags & RequestFlags.INLINE else None
    store = Store if isinstance(body, KBTPStore) else AllocStore
    return store(data=data, completion=completion, inline=inline, **common)


def craft(message: Message, /, *, addr_le: bool = False, **overrides: Any) -> bytes:
    """The raw encoding of `message` with header or body fields overridden by name, rebuilt.

    Keys are field names of the header (`version`, `opcode`, `flags`, ...) or of the body layer
    (`data_length`, `cd_stag`, `inline`, `head_tagged_offset`, ...).  Every dissected field keeps its value
    (the Data Descriptor Length does not follow an overridden `inline` unless `data_length=None` is given),
    so exactly the overridden fields change.  A flag override changes which conditional fields exist:
    a newly present Completion Descriptor is written as zeros.
    """
    pkt = dissect(message.encode_raw(addr_le=addr_le), addr_le=addr_le)
    body = pkt.payload
    header_names = {f.name for f in pkt.fields_desc}
    body_names = {f.name for f in getattr(body, "fields_desc", [])}
    for key, value in overrides.items():
        if key in header_names:
            setattr(pkt, key, value)
        elif key in body_names:
            setattr(body, key, value)
        else:
            raise KeyError(f"override {key!r}: expected a field of {sorted(header_names)} or {sorted(body_names)}")
    pkt.clear_cache()
    return bytes(pkt)
