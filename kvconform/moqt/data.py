"""MOQT d22 data plane (profile §9): SUBGROUP_HEADER variants and subgroup objects, FETCH_HEADER and
fetch objects incl. End-of-Range records, Object Status, and an incremental parser for uni streams.

Writers keep the delta state of one stream and emit the canonical (minimal) encoding; the parser is fed
bytes as they arrive and yields fully resolved objects (absolute Group/Subgroup/Object IDs).  Object
Properties are kept as their encoded bytes so a relay forwards and caches them unchanged (§8, §12).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from enum import IntEnum

from kvconform.moqt.errors import MoqtDecodeError, MoqtEncodeError, NeedMoreData
from kvconform.moqt.structures import KeyValuePair, Location, check_properties, decode_kvps
from kvconform.moqt.vi64 import MAX_VI64, Reader, encode_vi64

__all__ = [
    "FETCH_HEADER_TYPE",
    "PADDING_DATAGRAM_TYPE",
    "PADDING_STREAM_TYPE",
    "SETUP_STREAM_TYPE",
    "DataStreamParser",
    "EndOfRange",
    "EndOfRangeKind",
    "FetchHeader",
    "FetchObject",
    "FetchStreamWriter",
    "GroupOrder",
    "ObjectDatagram",
    "ObjectStatus",
    "StreamKind",
    "SubgroupHeader",
    "SubgroupObject",
    "SubgroupStreamWriter",
    "classify_uni_stream",
    "is_subgroup_type",
]

FETCH_HEADER_TYPE = 0x05
SETUP_STREAM_TYPE = 0x2F00
PADDING_STREAM_TYPE = 0x132B3E28


class ObjectStatus(IntEnum):
    """Object Status (profile §9.3); present only when Object Payload Length is 0."""

    NORMAL = 0x0
    END_OF_GROUP = 0x3
    END_OF_TRACK = 0x4


class GroupOrder(IntEnum):
    """GROUP_ORDER values (profile §7.1); a fetch stream's Group ID Delta depends on it."""

    ASCENDING = 0x1
    DESCENDING = 0x2


class EndOfRangeKind(IntEnum):
    """Serialization Flags values >= 128 that mark the end of a skipped range (profile §9.4)."""

    NON_EXISTENT = 0x8C
    UNKNOWN = 0x10C
    TIMED_OUT = 0x20C


class StreamKind(IntEnum):
    SUBGROUP = 1
    FETCH = 2
    CONTROL = 3
    PADDING = 4


# SUBGROUP_HEADER Type Flags bits (profile §9.2).
SG_PROPERTIES = 0x01
SG_ID_MODE_MASK = 0x06
SG_END_OF_GROUP = 0x08
SG_MARKER = 0x10
SG_DEFAULT_PRIORITY = 0x20
SG_FIRST_OBJECT = 0x40

SG_MODE_ZERO = 0b00
SG_MODE_FIRST_OBJECT_ID = 0b01
SG_MODE_FIELD = 0b10


def is_subgroup_type(t: int) -> bool:
    """0x10-0x7F with bit 4 set and Subgroup ID mode != 0b11 (profile §9.1-9.2)."""
    return t < 0x80 and bool(t & SG_MARKER) and (t & SG_ID_MODE_MASK) >> 1 != 0b11


def classify_uni_stream(stream_type: int, offset: int = 0) -> StreamKind:
    """The kind of a uni stream from its first vi64; any other value closes the session (§9.1)."""
    if stream_type == FETCH_HEADER_TYPE:
        return StreamKind.FETCH
    if stream_type == SETUP_STREAM_TYPE:
        return StreamKind.CONTROL
    if stream_type == PADDING_STREAM_TYPE:
        return StreamKind.PADDING
    if is_subgroup_type(stream_type):
        return StreamKind.SUBGROUP
    raise MoqtDecodeError("Stream Type", offset, f"unknown unidirectional stream type 0x{stream_type:x}")


# ---------------------------------------------------------------------------------------------------
# Subgroup streams (profile §9.2)


@dataclass(frozen=True)
class SubgroupHeader:
    """``SUBGROUP_HEADER { Type Flags, Track Alias, Group ID, [Subgroup ID], [Publisher Priority (8)] }``.

    ``subgroup_id`` is None on a decoded header in mode 0b01 until the first object names it.
    ``publisher_priority`` is None when DEFAULT_PRIORITY is set.
    """

    type_flags: int
    track_alias: int
    group_id: int
    subgroup_id: int | None = 0
    publisher_priority: int | None = None

    @classmethod
    def build(
        cls,
        track_alias: int,
        group_id: int,
        subgroup_id: int = 0,
        publisher_priority: int | None = 128,
        *,
        properties: bool = False,
        end_of_group: bool = False,
        first_object: bool = False,
    ) -> SubgroupHeader:
        """The canonical header: Subgroup ID 0 -> mode 0b00 (no field), else the field (0b10)."""
        flags = SG_MARKER
        flags |= SG_PROPERTIES if properties else 0
        flags |= SG_END_OF_GROUP if end_of_group else 0
        flags |= SG_FIRST_OBJECT if first_object else 0
        flags |= SG_DEFAULT_PRIORITY if publisher_priority is None else 0
        flags |= (SG_MODE_ZERO if subgroup_id == 0 else SG_MODE_FIELD) << 1
        return cls(flags, track_alias, group_id, subgroup_id, publisher_priority)

    @property
    def has_properties(self) -> bool:
        return bool(self.type_flags & SG_PROPERTIES)

    @property
    def subgroup_id_mode(self) -> int:
        return (self.type_flags & SG_ID_MODE_MASK) >> 1

    @property
    def end_of_group(self) -> bool:
        return bool(self.type_flags & SG_END_OF_GROUP)

    @property
    def default_priority(self) -> bool:
        return bool(self.type_flags & SG_DEFAULT_PRIORITY)

    @property
    def first_object(self) -> bool:
        return bool(self.type_flags & SG_FIRST_OBJECT)

    def encode(self) -> bytes:
        if not is_subgroup_type(self.type_flags):
            raise MoqtEncodeError(f"SUBGROUP_HEADER Type 0x{self.type_flags:x} is not a valid subgroup type")
        out = encode_vi64(self.type_flags) + encode_vi64(self.track_alias) + encode_vi64(self.group_id)
        if self.subgroup_id_mode == SG_MODE_FIELD:
            if self.subgroup_id is None:
                raise MoqtEncodeError("SUBGROUP_HEADER mode 0b10 needs a Subgroup ID")
            out += encode_vi64(self.subgroup_id)
        elif self.subgroup_id_mode == SG_MODE_ZERO and self.subgroup_id not in (0, None):
            raise MoqtEncodeError(f"SUBGROUP_HEADER mode 0b00 means Subgroup ID 0, not {self.subgroup_id}")
        if not self.default_priority:
            if self.publisher_priority is None or not 0 <= self.publisher_priority <= 255:
                raise MoqtEncodeError(f"Publisher Priority {self.publisher_priority!r} is not a uint8")
            out += bytes([self.publisher_priority])
        return out

    @classmethod
    def decode(cls, r: Reader) -> SubgroupHeader:
        at = r.pos
        flags = r.vi64("SUBGROUP_HEADER.Type Flags")
        if not is_subgroup_type(flags):
            raise r.error("SUBGROUP_HEADER.Type Flags", f"0x{flags:x} is not a valid subgroup type", at)
        alias = r.vi64("SUBGROUP_HEADER.Track Alias")
        group = r.vi64("SUBGROUP_HEADER.Group ID")
        mode = (flags & SG_ID_MODE_MASK) >> 1
        sub: int | None = 0 if mode == SG_MODE_ZERO else None
        if mode == SG_MODE_FIELD:
            sub = r.vi64("SUBGROUP_HEADER.Subgroup ID")
        prio = None if flags & SG_DEFAULT_PRIORITY else r.u8("SUBGROUP_HEADER.Publisher Priority")
        return cls(flags, alias, group, sub, prio)


@dataclass(frozen=True)
class SubgroupObject:
    """One object of a subgroup stream.  ``properties`` = the encoded KVPs (no length).

    The parser fills ``track_alias``/``group_id``/``subgroup_id``/``publisher_priority`` from the
    header; writers ignore them.
    """

    object_id: int
    payload: bytes = b""
    status: int = ObjectStatus.NORMAL
    properties: bytes = b""
    track_alias: int = 0
    group_id: int = 0
    subgroup_id: int = 0
    publisher_priority: int | None = None

    @property
    def location(self) -> Location:
        return Location(self.group_id, self.object_id)

    def property_pairs(self) -> tuple[KeyValuePair, ...]:
        return decode_kvps(Reader(self.properties), "Object Properties")


def _encode_status_or_payload(payload: bytes, status: int, where: str) -> bytes:
    if payload:
        if status != ObjectStatus.NORMAL:
            raise MoqtEncodeError(f"{where}: status 0x{status:x} objects carry no payload")
        return encode_vi64(len(payload)) + payload
    return encode_vi64(0) + encode_vi64(status)


class SubgroupStreamWriter:
    """Encodes one subgroup stream: ``header()`` once, then ``object(...)`` in ascending Object ID order."""

    def __init__(self, header: SubgroupHeader) -> None:
        self.header_value = header
        self._prev: int | None = None

    def header(self) -> bytes:
        return self.header_value.encode()

    def object(self, obj: SubgroupObject) -> bytes:
        if self._prev is not None and obj.object_id <= self._prev:
            raise MoqtEncodeError(f"Object ID {obj.object_id} after {self._prev}: objects must ascend on a stream")
        delta = obj.object_id if self._prev is None else obj.object_id - self._prev - 1
        out = bytearray(encode_vi64(delta))
        if self.header_value.has_properties:
            if obj.properties and obj.status != ObjectStatus.NORMAL:
                raise MoqtEncodeError("status objects cannot carry properties (profile §9.3)")
            out += encode_vi64(len(obj.properties)) + obj.properties
        elif obj.properties:
            raise MoqtEncodeError("object has properties but the header's PROPERTIES bit is clear")
        out += _encode_status_or_payload(obj.payload, obj.status, f"Object {obj.object_id}")
        self._prev = obj.object_id
        return bytes(out)

    def encode(self, objects: Iterable[SubgroupObject]) -> bytes:
        return self.header() + b"".join(self.object(o) for o in objects)


# ---------------------------------------------------------------------------------------------------
# Fetch streams (profile §9.4)

FO_SUBGROUP_MASK = 0x03
FO_SUBGROUP_ZERO = 0x00
FO_SUBGROUP_PRIOR = 0x01
FO_SUBGROUP_NEXT = 0x02
FO_SUBGROUP_FIELD = 0x03
FO_OBJECT_ID = 0x04
FO_GROUP_ID = 0x08
FO_PRIORITY = 0x10
FO_PROPERTIES = 0x20
FO_DATAGRAM = 0x40


@dataclass(frozen=True)
class FetchHeader:
    """``FETCH_HEADER { Type = 0x05, Request ID }`` (fill streams carry the SUBSCRIBE's / update's ID)."""

    request_id: int

    def encode(self) -> bytes:
        return encode_vi64(FETCH_HEADER_TYPE) + encode_vi64(self.request_id)


@dataclass(frozen=True)
class FetchObject:
    """One object of a fetch stream, absolute IDs.  ``subgroup_id`` None = Datagram preference;
    ``properties`` None = flag 0x20 clear.  Fetch streams carry no Object Status (§9.3)."""

    group_id: int
    object_id: int
    payload: bytes = b""
    subgroup_id: int | None = 0
    publisher_priority: int = 128
    properties: bytes | None = None

    @property
    def location(self) -> Location:
        return Location(self.group_id, self.object_id)


@dataclass(frozen=True)
class EndOfRange:
    """End of Non-Existent / Unknown / Timed-Out Range: ``Flags, Group ID, Object ID`` absolute (§9.4,
    §13 #8): every Location after the previous record up to and including this one."""

    kind: int
    group_id: int
    object_id: int

    @property
    def location(self) -> Location:
        return Location(self.group_id, self.object_id)

    def encode(self) -> bytes:
        if self.kind not in tuple(EndOfRangeKind):
            raise MoqtEncodeError(f"End of Range flags 0x{self.kind:x} not in 0x8C/0x10C/0x20C")
        return encode_vi64(self.kind) + encode_vi64(self.group_id) + encode_vi64(self.object_id)


class FetchStreamWriter:
    """Encodes one fetch (or fill) stream with the smallest flags the prior-object rules allow."""

    def __init__(self, request_id: int, group_order: int = GroupOrder.ASCENDING) -> None:
        self.request_id = request_id
        self.group_order = group_order
        self._group: int | None = None
        self._object: int | None = None
        self._subgroup: int | None = None  # last real object's
        self._priority: int | None = None  # last real object's

    def header(self) -> bytes:
        return FetchHeader(self.request_id).encode()

    def end_of_range(self, marker: EndOfRange) -> bytes:
        self._group, self._object = marker.group_id, marker.object_id
        return marker.encode()

    def object(self, obj: FetchObject) -> bytes:
        flags = 0
        fields = bytearray()
        first = self._group is None or self._object is None
        if first:
            flags |= FO_GROUP_ID | FO_OBJECT_ID
            group_field: int | None = obj.group_id
            object_field: int | None = obj.object_id
        else:
            assert self._group is not None and self._object is not None
            group_field = object_field = None
            if obj.group_id != self._group:
                if self.group_order == GroupOrder.ASCENDING:
                    if obj.group_id < self._group:
                        raise MoqtEncodeError(f"Group {obj.group_id} after {self._group} in an Ascending fetch")
                    group_field = obj.group_id - self._group - 1
                else:
                    if obj.group_id > self._group:
                        raise MoqtEncodeError(f"Group {obj.group_id} after {self._group} in a Descending fetch")
                    group_field = self._group - obj.group_id - 1
                flags |= FO_GROUP_ID
                if obj.object_id != self._object + 1:
                    flags |= FO_OBJECT_ID
                    object_field = obj.object_id
            else:
                if obj.object_id <= self._object:
                    raise MoqtEncodeError(f"Object {obj.object_id} after {self._object} in group {obj.group_id}")
                if obj.object_id != self._object + 1:
                    flags |= FO_OBJECT_ID
                    object_field = obj.object_id - self._object
        subgroup_field: int | None = None
        if obj.subgroup_id is None:
            flags |= FO_DATAGRAM
        elif obj.subgroup_id == 0:
            flags |= FO_SUBGROUP_ZERO
        elif self._subgroup is not None and obj.subgroup_id == self._subgroup:
            flags |= FO_SUBGROUP_PRIOR
        elif self._subgroup is not None and obj.subgroup_id == self._subgroup + 1:
            flags |= FO_SUBGROUP_NEXT
        else:
            flags |= FO_SUBGROUP_FIELD
            subgroup_field = obj.subgroup_id
        if self._priority is None or obj.publisher_priority != self._priority:
            flags |= FO_PRIORITY
        if obj.properties is not None:
            flags |= FO_PROPERTIES
        fields += encode_vi64(flags)
        if group_field is not None:
            fields += encode_vi64(group_field)
        if subgroup_field is not None:
            fields += encode_vi64(subgroup_field)
        if object_field is not None:
            fields += encode_vi64(object_field)
        if flags & FO_PRIORITY:
            if not 0 <= obj.publisher_priority <= 255:
                raise MoqtEncodeError(f"Publisher Priority {obj.publisher_priority} is not a uint8")
            fields.append(obj.publisher_priority)
        if obj.properties is not None:
            fields += encode_vi64(len(obj.properties)) + obj.properties
        fields += encode_vi64(len(obj.payload)) + obj.payload
        self._group, self._object = obj.group_id, obj.object_id
        if obj.subgroup_id is not None:
            self._subgroup = obj.subgroup_id
        self._priority = obj.publisher_priority
        return bytes(fields)

    def encode(self, items: Iterable[FetchObject | EndOfRange]) -> bytes:
        out = bytearray(self.header())
        for item in items:
            out += self.end_of_range(item) if isinstance(item, EndOfRange) else self.object(item)
        return bytes(out)


# ---------------------------------------------------------------------------------------------------
# Datagrams (profile §9.5; KVCS does not use them, a relay still has to parse them)

DG_PROPERTIES = 0x01
DG_END_OF_GROUP = 0x02
DG_ZERO_OBJECT_ID = 0x04
DG_DEFAULT_PRIORITY = 0x08
DG_STATUS = 0x20
_DG_KNOWN = DG_PROPERTIES | DG_END_OF_GROUP | DG_ZERO_OBJECT_ID | DG_DEFAULT_PRIORITY | DG_STATUS
PADDING_DATAGRAM_TYPE = 0x132B3E29


@dataclass(frozen=True)
class ObjectDatagram:
    """``OBJECT_DATAGRAM``: one object per QUIC datagram; the payload is the rest of the datagram.

    ``status`` None = a payload datagram; ``publisher_priority`` None = DEFAULT_PRIORITY;
    ``properties`` None = PROPERTIES bit clear.
    """

    track_alias: int
    group_id: int
    object_id: int
    payload: bytes = b""
    status: int | None = None
    publisher_priority: int | None = None
    properties: bytes | None = None
    end_of_group: bool = False

    @property
    def location(self) -> Location:
        return Location(self.group_id, self.object_id)

    def type_flags(self) -> int:
        flags = DG_PROPERTIES if self.properties is not None else 0
        flags |= DG_END_OF_GROUP if self.end_of_group else 0
        flags |= DG_ZERO_OBJECT_ID if self.object_id == 0 else 0
        flags |= DG_DEFAULT_PRIORITY if self.publisher_priority is None else 0
        return flags | (DG_STATUS if self.status is not None else 0)

    def encode(self) -> bytes:
        flags = self.type_flags()
        if flags & DG_STATUS and flags & DG_END_OF_GROUP:
            raise MoqtEncodeError("OBJECT_DATAGRAM cannot set both STATUS and END_OF_GROUP")
        if self.properties is not None and not self.properties:
            raise MoqtEncodeError("OBJECT_DATAGRAM with PROPERTIES needs a non-empty Properties field")
        if self.properties and self.status not in (None, ObjectStatus.NORMAL):
            raise MoqtEncodeError("only Normal objects carry properties")
        if self.status is not None and self.payload:
            raise MoqtEncodeError("a STATUS datagram carries no payload")
        out = bytearray(encode_vi64(flags) + encode_vi64(self.track_alias) + encode_vi64(self.group_id))
        if self.object_id != 0:
            out += encode_vi64(self.object_id)
        if self.publisher_priority is not None:
            out.append(self.publisher_priority)
        if self.properties is not None:
            out += encode_vi64(len(self.properties)) + self.properties
        if self.status is not None:
            out += encode_vi64(self.status)
        return bytes(out + self.payload)

    @classmethod
    def decode(cls, data: bytes) -> ObjectDatagram:
        """One whole datagram; errors name the field and its offset in the datagram."""
        r = Reader(data, final=True, context="OBJECT_DATAGRAM.")
        flags = r.vi64("Type Flags")
        if flags & ~_DG_KNOWN or (flags & DG_STATUS and flags & DG_END_OF_GROUP):
            raise r.error("Type Flags", f"0x{flags:x}: reserved/unknown bit, or STATUS with END_OF_GROUP", 0)
        alias = r.vi64("Track Alias")
        group = r.vi64("Group ID")
        oid = 0 if flags & DG_ZERO_OBJECT_ID else r.vi64("Object ID")
        prio = None if flags & DG_DEFAULT_PRIORITY else r.u8("Publisher Priority")
        props: bytes | None = None
        if flags & DG_PROPERTIES:
            at = r.pos
            plen = r.vi64("Properties Length")
            if plen == 0:
                raise r.error("Properties Length", "0 with the PROPERTIES bit set", at)
            props_r = r.sub(plen, "Properties")
            check_properties(r, decode_kvps(props_r, "Properties"), "Properties", at)
            props = bytes(data[props_r.end - plen : props_r.end])
        status: int | None = None
        if flags & DG_STATUS:
            at = r.pos
            status = r.vi64("Object Status")
            if status not in tuple(ObjectStatus):
                raise r.error("Object Status", f"unknown status 0x{status:x}", at)
            if props and status != ObjectStatus.NORMAL:
                raise r.error("Object Status", "only Normal objects carry properties", at)
            if not r.at_end():
                raise r.error("Object Payload", "a STATUS datagram carries no payload")
        payload = r.rest()
        return cls(alias, group, oid, payload, status, prio, props, bool(flags & DG_END_OF_GROUP))


# ---------------------------------------------------------------------------------------------------
# Incremental uni-stream parser

DataEvent = SubgroupHeader | SubgroupObject | FetchHeader | FetchObject | EndOfRange


class DataStreamParser:
    """Feed the bytes of one data uni stream (from its first byte); get headers and resolved objects.

    ``group_order`` decodes a fetch stream's Group ID Deltas (FETCH: its GROUP_ORDER, absent =
    Ascending; fill: see profile §9.4); it may be changed until the first group change.  Offsets in
    errors count from the start of the stream.  ``end_of_stream()`` on FIN.
    """

    def __init__(self, group_order: int = GroupOrder.ASCENDING) -> None:
        self.group_order = group_order
        self.kind: StreamKind | None = None
        self.header: SubgroupHeader | FetchHeader | None = None
        self._buf = bytearray()
        self._base = 0  # stream offset of _buf[0]
        # Bytes _buf must hold before the next object can be complete: set once an object's header
        # parsed but its payload has not all arrived, so a big payload arriving packet by packet is not
        # re-parsed (and re-failed) on every chunk; parsing the same prefix again gives the same result.
        self._need = 0
        # subgroup state
        self._sg_prev: int | None = None
        self._sg_id: int | None = None
        # fetch state
        self._group: int | None = None
        self._object: int | None = None
        self._subgroup: int | None = None
        self._priority: int | None = None

    def feed(self, data: bytes) -> list[DataEvent]:
        self._buf += data
        if len(self._buf) < self._need:
            return []
        self._need = 0
        out: list[DataEvent] = []
        while self._buf:
            r = Reader(self._buf, 0, final=False)
            try:
                event = self._next(r)
            except NeedMoreData:
                break
            except MoqtDecodeError as exc:
                raise MoqtDecodeError(exc.field, exc.offset + self._base, exc.message, exc.code) from exc
            del self._buf[: r.pos]
            self._base += r.pos
            if event is not None:
                out.append(event)
        return out

    def end_of_stream(self) -> None:
        """FIN: leftover bytes mean the stream ended inside a header or an object (PROTOCOL_VIOLATION)."""
        if self._buf:
            what = "header" if self.header is None else "object"
            raise MoqtDecodeError("Stream", self._base, f"FIN inside a {what} ({len(self._buf)} byte(s) left)")

    @property
    def offset(self) -> int:
        """Stream bytes consumed so far."""
        return self._base

    def _next(self, r: Reader) -> DataEvent | None:
        if self.kind is None:
            at = r.pos
            stream_type, _ = _peek(r, "Stream Type")
            kind = classify_uni_stream(stream_type, at)
            if kind == StreamKind.CONTROL:
                raise r.error("Stream Type", "a SETUP control stream is not a data stream", at)
            if kind == StreamKind.PADDING:
                r.vi64("Stream Type")
                self.kind = kind
                return None
            if kind == StreamKind.FETCH:
                r.vi64("Stream Type")
                header: SubgroupHeader | FetchHeader = FetchHeader(r.vi64("FETCH_HEADER.Request ID"))
            else:
                header = SubgroupHeader.decode(r)
            self.kind, self.header = kind, header
            return header
        if self.kind == StreamKind.PADDING:
            start = r.pos
            data = r.rest()
            if any(data):
                at = start + next(i for i, b in enumerate(data) if b)
                raise r.error("Padding Data", "padding bytes must all be zero", at)
            return None
        if self.kind == StreamKind.SUBGROUP:
            return self._subgroup_object(r)
        return self._fetch_object(r)

    def _subgroup_object(self, r: Reader) -> SubgroupObject:
        h = self.header
        assert isinstance(h, SubgroupHeader)
        at = r.pos
        delta = r.vi64("Object ID Delta")
        oid = delta if self._sg_prev is None else self._sg_prev + delta + 1
        if oid > MAX_VI64:
            raise r.error("Object ID Delta", "Object ID exceeds 2^64-1", at)
        props = b""
        if h.has_properties:
            plen = r.vi64("Properties Length")
            props_r = r.sub(plen, "Properties")
            check_properties(r, decode_kvps(props_r, "Properties"), "Properties", props_r.end - plen)  # kept as bytes
            props = bytes(self._buf[props_r.end - plen : props_r.end])
        length = r.vi64("Object Payload Length")
        status: int = ObjectStatus.NORMAL
        payload = b""
        if length == 0:
            sat = r.pos
            status = r.vi64("Object Status")
            if status not in tuple(ObjectStatus):
                raise r.error("Object Status", f"unknown status 0x{status:x}", sat)
            if status != ObjectStatus.NORMAL and props:
                raise r.error("Properties", "status objects cannot carry properties", sat)
        else:
            payload = self._payload(r, length)
        sub = h.subgroup_id
        if sub is None:  # mode 0b01: the first Object ID on this stream
            sub = self._sg_id if self._sg_id is not None else oid
        self._sg_prev, self._sg_id = oid, sub
        return SubgroupObject(oid, payload, status, props, h.track_alias, h.group_id, sub, h.publisher_priority)

    def _payload(self, r: Reader, length: int) -> bytes:
        if r.pos + length > r.end:
            self._need = r.pos + length  # r reads _buf from 0: wait for the whole payload
        return r.take(length, "Object Payload")

    def _fetch_object(self, r: Reader) -> FetchObject | EndOfRange:
        at = r.pos
        flags = r.vi64("Serialization Flags")
        if flags >= 0x80:
            if flags not in tuple(EndOfRangeKind):
                raise r.error("Serialization Flags", f"0x{flags:x} is neither < 0x80 nor an End of Range", at)
            marker = EndOfRange(flags, r.vi64("End of Range.Group ID"), r.vi64("End of Range.Object ID"))
            self._group, self._object = marker.group_id, marker.object_id
            return marker
        first = self._group is None
        if first and not (flags & FO_GROUP_ID and flags & FO_OBJECT_ID):
            raise r.error("Serialization Flags", f"first object 0x{flags:02x} lacks Group and Object ID", at)
        group = self._group
        gat = r.pos
        if flags & FO_GROUP_ID:
            gdelta = r.vi64("Group ID Delta")
            if first:
                group = gdelta
            else:
                assert self._group is not None
                if self.group_order == GroupOrder.DESCENDING:
                    group = self._group - gdelta - 1
                else:
                    group = self._group + gdelta + 1
                if not 0 <= group <= MAX_VI64:
                    raise r.error("Group ID Delta", f"Group ID {group} out of range", gat)
        subgroup: int | None
        mode = flags & FO_SUBGROUP_MASK
        if flags & FO_DATAGRAM:
            subgroup = None
        elif mode == FO_SUBGROUP_ZERO:
            subgroup = 0
        elif mode == FO_SUBGROUP_FIELD:
            subgroup = r.vi64("Subgroup ID")
        else:
            if self._subgroup is None:
                raise r.error("Serialization Flags", "refers to the prior Subgroup ID but there is none", at)
            subgroup = self._subgroup + (1 if mode == FO_SUBGROUP_NEXT else 0)
        oat = r.pos
        if flags & FO_OBJECT_ID:
            odelta = r.vi64("Object ID Delta")
            if first or flags & FO_GROUP_ID:
                obj = odelta
            else:
                assert self._object is not None
                obj = self._object + odelta
        else:
            assert self._object is not None
            obj = self._object + 1
        if obj > MAX_VI64:
            raise r.error("Object ID Delta", "Object ID exceeds 2^64-1", oat)
        if flags & FO_PRIORITY:
            prio = r.u8("Publisher Priority")
        else:
            if self._priority is None:
                raise r.error("Serialization Flags", "refers to the prior Priority but there is none", at)
            prio = self._priority
        props: bytes | None = None
        if flags & FO_PROPERTIES:
            plen = r.vi64("Properties Length")
            props_r = r.sub(plen, "Properties")
            check_properties(r, decode_kvps(props_r, "Properties"), "Properties", props_r.end - plen)
            props = bytes(self._buf[props_r.end - plen : props_r.end])
        length = r.vi64("Object Payload Length")
        payload = self._payload(r, length)
        assert group is not None
        self._group, self._object, self._priority = group, obj, prio
        if subgroup is not None:
            self._subgroup = subgroup
        return FetchObject(group, obj, payload, subgroup, prio, props)


def _peek(r: Reader, field: str) -> tuple[int, int]:
    save = r.pos
    value = r.vi64(field)
    end = r.pos
    r.pos = save
    return value, end
