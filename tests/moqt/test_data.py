"""Data plane (profile §9): the subgroup, End of Track and fill-stream examples byte for byte, End of Range
records, hypothesis round-trips through the incremental parser under any chunking, and decode errors that
name their field and stream offset."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvconform.moqt.data import (
    DataStreamParser,
    EndOfRange,
    EndOfRangeKind,
    FetchHeader,
    FetchObject,
    FetchStreamWriter,
    GroupOrder,
    ObjectDatagram,
    ObjectStatus,
    StreamKind,
    SubgroupHeader,
    SubgroupObject,
    SubgroupStreamWriter,
    classify_uni_stream,
    is_subgroup_type,
)
from kvconform.moqt.errors import MoqtDecodeError, MoqtEncodeError, SessionError
from kvconform.moqt.structures import KeyValuePair, Location, encode_kvps

H = bytes.fromhex


def parse_all(data: bytes, chunk: int = 0, order: int = GroupOrder.ASCENDING) -> list[object]:
    parser = DataStreamParser(order)
    out: list[object] = []
    step = chunk or len(data) or 1
    for i in range(0, len(data), step):
        out += parser.feed(data[i : i + step])
    parser.end_of_stream()
    return out


# ---------------------------------------------------------------------------------------------------
# Byte-exact examples


def test_valid_subgroup_types_match_profile_list() -> None:
    listed = set()
    for lo, hi in [(0x10, 0x15), (0x18, 0x1D), (0x30, 0x35), (0x38, 0x3D), (0x50, 0x55), (0x58, 0x5D),
                   (0x70, 0x75), (0x78, 0x7D)]:
        listed |= set(range(lo, hi + 1))
    assert {t for t in range(0x200) if is_subgroup_type(t)} == listed


def test_kvcs_data_subgroup_example() -> None:
    wire = H("50 01 03 0c  00 04 41424344  00 04 45464748  00 00 03")
    header = SubgroupHeader.build(1, 3, 0, 12, first_object=True)
    assert header.type_flags == 0x50
    objs = [SubgroupObject(0, b"ABCD"), SubgroupObject(1, b"EFGH"), SubgroupObject(2, status=ObjectStatus.END_OF_GROUP)]
    assert SubgroupStreamWriter(header).encode(objs) == wire
    events = parse_all(wire, chunk=1)
    assert events[0] == header
    got = events[1:]
    assert [(o.location, o.payload, o.status) for o in got] == [  # type: ignore[attr-defined]
        (Location(3, 0), b"ABCD", 0), (Location(3, 1), b"EFGH", 0), (Location(3, 2), b"", 3)]
    assert all(o.track_alias == 1 and o.publisher_priority == 12 for o in got)  # type: ignore[attr-defined]
    assert SubgroupHeader.build(1, 3, 0, 12, first_object=True, end_of_group=True).type_flags == 0x58


def test_end_of_track_example() -> None:
    wire = H("50 01 20 00 00 00 04")
    w = SubgroupStreamWriter(SubgroupHeader.build(1, 32, 0, 0, first_object=True))
    assert w.encode([SubgroupObject(0, status=ObjectStatus.END_OF_TRACK)]) == wire
    assert parse_all(wire)[1] == SubgroupObject(0, b"", 4, b"", 1, 32, 0, 0)


def test_fill_stream_example() -> None:
    wire = H("05 00  1c 00 00 00 02 6162  00 02 6364  1c 00 00 02 02 6566")
    objs = [FetchObject(0, 0, b"ab", 0, 0), FetchObject(0, 1, b"cd", 0, 0), FetchObject(1, 0, b"ef", 0, 2)]
    assert FetchStreamWriter(0).encode(objs) == wire
    assert parse_all(wire, chunk=1) == [FetchHeader(0), *objs]


def test_end_of_range_example_and_prior_fields() -> None:
    wire = H("05 07  1c 00 00 05 01 61  810c 07 03  01 01 62")
    items = parse_all(wire)
    assert items[2] == EndOfRange(EndOfRangeKind.UNKNOWN, 7, 3)
    # after the marker: prior Group/Object = marker's, prior Subgroup/Priority = last real object's
    assert items[3] == FetchObject(7, 4, b"b", 0, 5)
    # the writer picks the smallest flags: subgroup 0 as "zero" (00) rather than "prior" (01)
    written = FetchStreamWriter(7).encode(items[1:])  # type: ignore[arg-type]
    assert written == wire[:-3] + H("00 01 62")
    assert parse_all(written) == items


def test_empty_fetch_is_just_the_header() -> None:
    assert FetchStreamWriter(4).encode([]) == H("0504")
    assert parse_all(H("0504")) == [FetchHeader(4)]


def test_subgroup_id_modes() -> None:
    field = SubgroupHeader.build(9, 2, 5, None)
    assert field.default_priority and field.subgroup_id_mode == 0b10
    items = parse_all(SubgroupStreamWriter(field).encode([SubgroupObject(7, b"x")]))
    assert items[1].subgroup_id == 5 and items[1].publisher_priority is None  # type: ignore[attr-defined]
    first_id = SubgroupHeader(0x12, 9, 2, None, 1)  # mode 0b01: Subgroup ID = first Object ID
    items = parse_all(first_id.encode() + H("04 01 61  00 01 62"))
    assert [(o.subgroup_id, o.object_id) for o in items[1:]] == [(4, 4), (4, 5)]  # type: ignore[attr-defined]


def test_properties_kept_as_bytes() -> None:
    props = encode_kvps([KeyValuePair(0x3C, 2), KeyValuePair(0x41, b"zz")])
    header = SubgroupHeader.build(1, 0, 0, 0, properties=True)
    wire = SubgroupStreamWriter(header).encode([SubgroupObject(0, b"p", properties=props), SubgroupObject(1, b"q")])
    objs = parse_all(wire)[1:]
    assert objs[0].properties == props and objs[1].properties == b""  # type: ignore[attr-defined]
    assert objs[0].property_pairs() == (KeyValuePair(0x3C, 2), KeyValuePair(0x41, b"zz"))  # type: ignore[attr-defined]


def test_classify_uni_stream() -> None:
    assert classify_uni_stream(0x05) == StreamKind.FETCH
    assert classify_uni_stream(0x2F00) == StreamKind.CONTROL
    assert classify_uni_stream(0x132B3E28) == StreamKind.PADDING
    assert classify_uni_stream(0x7D) == StreamKind.SUBGROUP
    with pytest.raises(MoqtDecodeError) as info:
        classify_uni_stream(0x06, 0)
    assert info.value.field == "Stream Type"


def test_padding_stream() -> None:
    assert parse_all(H("f0132b3e28 000000")) == []


# ---------------------------------------------------------------------------------------------------
# Round-trips

payloads = st.binary(max_size=40)
_IMMUTABLE = encode_kvps([KeyValuePair(0x0B, encode_kvps([KeyValuePair(0x3C, 1)]))])
kvp_bytes = st.sampled_from([b"", encode_kvps([KeyValuePair(0x3C, 1)]), _IMMUTABLE])


@st.composite
def subgroup_streams(draw: st.DrawFn) -> tuple[SubgroupHeader, list[SubgroupObject]]:
    with_props = draw(st.booleans())
    header = SubgroupHeader.build(draw(st.integers(0, 1 << 40)), draw(st.integers(0, 1 << 40)),
                                  draw(st.integers(0, 300)), draw(st.one_of(st.none(), st.integers(0, 255))),
                                  properties=with_props, end_of_group=draw(st.booleans()),
                                  first_object=draw(st.booleans()))
    ids = sorted(set(draw(st.lists(st.integers(0, 1 << 20), min_size=1, max_size=8))))
    objs = []
    for oid in ids:
        status = draw(st.sampled_from([0, 0, 0, 3, 4]))
        payload = draw(payloads) if status == 0 else b""
        props = draw(kvp_bytes) if with_props and status == 0 else b""
        objs.append(SubgroupObject(oid, payload, status, props))
    return header, objs


@settings(max_examples=150, deadline=None)
@given(subgroup_streams(), st.integers(1, 9))
def test_subgroup_round_trip_any_chunking(stream: tuple[SubgroupHeader, list[SubgroupObject]], chunk: int) -> None:
    header, objs = stream
    wire = SubgroupStreamWriter(header).encode(objs)
    items = parse_all(wire, chunk)
    assert items[0] == header
    got = items[1:]
    assert [(o.object_id, o.payload, o.status, o.properties) for o in got] == [  # type: ignore[attr-defined]
        (o.object_id, o.payload, o.status, o.properties) for o in objs]
    assert all(o.group_id == header.group_id and o.subgroup_id == header.subgroup_id for o in got)  # type: ignore[attr-defined]


@st.composite
def fetch_streams(draw: st.DrawFn) -> tuple[int, list[FetchObject | EndOfRange]]:
    order = draw(st.sampled_from([GroupOrder.ASCENDING, GroupOrder.DESCENDING]))
    groups = sorted(set(draw(st.lists(st.integers(0, 1000), min_size=1, max_size=5))),
                    reverse=order == GroupOrder.DESCENDING)
    items: list[FetchObject | EndOfRange] = []
    for g in groups:
        marker = draw(st.booleans())
        if items and marker:
            items.append(EndOfRange(draw(st.sampled_from(list(EndOfRangeKind))), g, 0))
            first = 1
        else:
            first = 0
        for oid in sorted(set(draw(st.lists(st.integers(first, first + 50), min_size=1, max_size=4)))):
            items.append(FetchObject(g, oid, draw(payloads), draw(st.one_of(st.none(), st.integers(0, 5))),
                                     draw(st.integers(0, 255)), draw(st.one_of(st.none(), kvp_bytes))))
    return order, items


@settings(max_examples=150, deadline=None)
@given(fetch_streams(), st.integers(1, 9), st.integers(0, 1 << 30))
def test_fetch_round_trip_any_chunking(stream: tuple[int, list[FetchObject | EndOfRange]], chunk: int,
                                       rid: int) -> None:
    order, items = stream
    wire = FetchStreamWriter(rid, order).encode(items)
    assert parse_all(wire, chunk, order) == [FetchHeader(rid), *items]


def test_writers_refuse_bad_order() -> None:
    w = SubgroupStreamWriter(SubgroupHeader.build(1, 0))
    w.object(SubgroupObject(3, b"a"))
    with pytest.raises(MoqtEncodeError, match="ascend"):
        w.object(SubgroupObject(3, b"b"))
    f = FetchStreamWriter(0)
    f.object(FetchObject(5, 0, b"a"))
    with pytest.raises(MoqtEncodeError, match="Ascending"):
        f.object(FetchObject(4, 0, b"a"))
    with pytest.raises(MoqtEncodeError, match="carry no payload"):
        SubgroupStreamWriter(SubgroupHeader.build(1, 0)).object(SubgroupObject(0, b"x", ObjectStatus.END_OF_GROUP))
    with pytest.raises(MoqtEncodeError, match="PROPERTIES bit"):
        SubgroupStreamWriter(SubgroupHeader.build(1, 0)).object(SubgroupObject(0, b"x", properties=b"\x3c\x01"))


# ---------------------------------------------------------------------------------------------------
# Decode errors name their field and stream offset

DATA_ERRORS = [
    (H("16 01 00"), "Stream Type", 0),  # SUBGROUP_HEADER with Subgroup ID mode 0b11
    (H("80 90 01 00"), "Stream Type", 0),  # subgroup flags >= 128
    (H("06 01"), "Stream Type", 0),
    (H("af00"), "Stream Type", 0),
    (H("10 01 00 00  00 00 05"), "Object Status", 6),
    (H("11 01 00 00  00 02 3c01 00 03"), "Properties", 9),
    (H("11 01 00 00  00 02 3d 05"), "Properties[0](0x3d).Value", 8),
    (H("11 01 00 00  00 02 22 05 00 00"), "Properties", 6),  # DEFAULT_PUBLISHER_GROUP_ORDER 5
    (H("05 00  10 00 01 61"), "Serialization Flags", 2),  # first object lacks Group/Object ID
    (H("05 00  8d 00"), "Serialization Flags", 2),  # >= 128, not an End of Range
    (H("05 00  810c 01 01  01 05 00"), "Serialization Flags", 6),  # prior subgroup, none yet
    (H("05 00  810c 01 01  00 00"), "Serialization Flags", 6),  # prior priority, none yet
    (H("f0132b3e28 00 01"), "Padding Data", 6),
]


@pytest.mark.parametrize(("wire", "field", "offset"), DATA_ERRORS, ids=[f"{e[1]}@{e[2]}" for e in DATA_ERRORS])
def test_data_decode_error_names_field(wire: bytes, field: str, offset: int) -> None:
    with pytest.raises(MoqtDecodeError) as info:
        parse_all(wire, chunk=1)
    assert field in info.value.field, info.value
    assert info.value.offset == offset, info.value
    assert info.value.code == SessionError.PROTOCOL_VIOLATION


def test_descending_group_underflow() -> None:
    with pytest.raises(MoqtDecodeError) as info:
        parse_all(H("05 00  1c 02 00 00 00  08 05 00"), order=GroupOrder.DESCENDING)
    assert (info.value.field, info.value.offset) == ("Group ID Delta", 8)


@pytest.mark.parametrize("cut", [1, 3, 5, 8])
def test_fin_inside_header_or_object(cut: int) -> None:
    wire = H("50 01 03 0c  00 04 41424344")
    parser = DataStreamParser()
    parser.feed(wire[:cut])
    with pytest.raises(MoqtDecodeError, match="FIN inside") as info:
        parser.end_of_stream()
    assert info.value.offset == (0 if cut < 4 else 4)


# ---------------------------------------------------------------------------------------------------
# Datagrams (profile §9.5)


@settings(max_examples=100, deadline=None)
@given(st.integers(0, 1 << 30), st.integers(0, 1 << 30), st.integers(0, 1 << 20), payloads,
       st.one_of(st.none(), st.sampled_from([0, 3, 4])), st.one_of(st.none(), st.integers(0, 255)),
       st.sampled_from([None, encode_kvps([KeyValuePair(0x3C, 1)])]), st.booleans())
def test_datagram_round_trip(alias: int, group: int, oid: int, payload: bytes, status: int | None,
                             prio: int | None, props: bytes | None, eog: bool) -> None:
    if status is not None:
        payload, eog = b"", False
        props = props if status == 0 else None
    dg = ObjectDatagram(alias, group, oid, payload, status, prio, props, eog)
    assert ObjectDatagram.decode(dg.encode()) == dg


def test_datagram_fields_follow_the_flags() -> None:
    assert ObjectDatagram(1, 2, 0, b"hi", publisher_priority=None).encode() == H("0c 01 02") + b"hi"
    assert ObjectDatagram(1, 2, 5, status=3, publisher_priority=7).encode() == H("20 01 02 05 07 03")


@pytest.mark.parametrize(("wire", "field", "offset"), [
    (H("10 01 02 03"), "Type Flags", 0),  # bit 4 reserved
    (H("22 01 02 03"), "Type Flags", 0),  # STATUS with END_OF_GROUP
    (H("40 01 02 03"), "Type Flags", 0),  # unassigned bit
    (H("0d 01 02 00 61"), "Properties Length", 3),
    (H("2d 01 02 02 3c 01 03"), "Object Status", 6),  # properties on an End of Group status
    (H("2c 01 02 07"), "Object Status", 3),
    (H("2c 01 02 00 61"), "Object Payload", 4),
])
def test_datagram_decode_errors(wire: bytes, field: str, offset: int) -> None:
    with pytest.raises(MoqtDecodeError) as info:
        ObjectDatagram.decode(wire)
    assert info.value.field == "OBJECT_DATAGRAM." + field
    assert info.value.offset == offset
    assert info.value.code == SessionError.PROTOCOL_VIOLATION
