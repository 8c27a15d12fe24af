"""craft: each malformation is a valid message with one explicit wrong value, and the decoder reports it
with the field, offset and close code the profile names (the relay suite sends these bytes)."""

from __future__ import annotations

import pytest

from kvconform.moqt.craft import (
    UNKNOWN_MESSAGE_TYPE,
    CraftedMessage,
    RawParam,
    raw_fetch_object,
    raw_parameters,
    raw_subgroup_header,
    raw_subgroup_object,
    unknown_type,
    vi64,
    with_forbidden_param,
    with_parameters,
    wrong_length,
)
from kvconform.moqt.data import DataStreamParser, FetchObject, SubgroupObject
from kvconform.moqt.errors import MoqtDecodeError, NeedMoreData, SessionError
from kvconform.moqt.filters import LocationFilter
from kvconform.moqt.messages import (
    MESSAGE_TYPES,
    Fetch,
    PublishNamespace,
    RequestOk,
    Subscribe,
    check_request_id,
    parse_control_message,
)
from kvconform.moqt.parameters import FillParameters, Parameter, Parameters
from kvconform.moqt.structures import AuthToken, ParamType, TrackNamespace

NS = TrackNamespace.of("kvcs-1", b"\x01" * 16)
SUB = Subscribe(0, NS, b"k.raw.s0", Parameters.of((ParamType.LOCATION_FILTER, LocationFilter.next_object())))


def test_unmodified_craft_is_the_checked_encoding() -> None:
    for msg in (SUB, RequestOk(), PublishNamespace(2, NS, Parameters.of((3, AuthToken.use_value(b"t"))))):
        assert CraftedMessage.from_message(msg).build() == msg.encode()


def test_field_names_follow_the_layout() -> None:
    assert CraftedMessage.from_message(SUB).names() == ["Request ID", "Track Namespace", "Track Name", "Parameters"]
    with pytest.raises(KeyError, match="Track Alias"):
        CraftedMessage.from_message(SUB).set("Track Alias", b"")


@pytest.mark.parametrize("delta", [-2, -1, 1, 3])
def test_wrong_length_is_a_protocol_violation(delta: int) -> None:
    wire = wrong_length(SUB, delta) + b"\x00" * 8  # bytes after it so a longer Length is still complete
    with pytest.raises(MoqtDecodeError) as info:
        parse_control_message(wire)
    err = info.value
    assert err.code == SessionError.PROTOCOL_VIOLATION
    assert err.field.startswith("SUBSCRIBE.")
    assert "Message Length" in str(err) or "too short" in str(err)


def test_longer_length_without_more_bytes_waits() -> None:
    with pytest.raises(NeedMoreData):
        parse_control_message(wrong_length(SUB, 5))


def test_unknown_type() -> None:
    assert UNKNOWN_MESSAGE_TYPE not in MESSAGE_TYPES
    with pytest.raises(MoqtDecodeError) as info:
        parse_control_message(unknown_type(body=b"\x01\x02"))
    assert (info.value.field, info.value.offset) == ("Message Type", 0)
    assert "0x3f" in info.value.message


def test_forbidden_parameter() -> None:
    fetch = Fetch(4, NS, b"k.raw.s0", Parameters.of((ParamType.GROUP_ORDER, 1)))
    wire = with_forbidden_param(fetch, Parameter(ParamType.FILL_PARAMETERS, FillParameters()))
    with pytest.raises(MoqtDecodeError) as info:
        parse_control_message(wire)
    assert "FILL_PARAMETERS is not allowed in FETCH" in info.value.message
    assert info.value.field == "FETCH.Parameters[1].Type Delta"
    assert wire[info.value.offset] == 0x01  # delta 0x22 -> 0x23


def test_parameter_in_namespace_message() -> None:
    wire = with_forbidden_param(PublishNamespace(2, NS), RawParam(ParamType.LOCATION_FILTER, b"\x05"))
    with pytest.raises(MoqtDecodeError, match="LOCATION_FILTER is not allowed in PUBLISH_NAMESPACE"):
        parse_control_message(wire)


def test_raw_parameters_unchecked_orders_and_counts() -> None:
    descending = raw_parameters([RawParam(0x22, b"\x01"), RawParam(0x21, b"\x05", delta=0)])
    assert descending == bytes.fromhex("02 22 01 00 05".replace(" ", ""))
    with pytest.raises(ValueError, match="descending"):
        raw_parameters([RawParam(0x22, b"\x01"), RawParam(0x21, b"\x05")])
    wire = with_parameters(SUB, [RawParam(0x10, b"\x01"), RawParam(0x10, b"\x01", delta=0)])
    with pytest.raises(MoqtDecodeError, match="second FORWARD"):
        parse_control_message(wire)
    short_count = with_parameters(SUB, [Parameter(0x21, LocationFilter.next_object())], count=2)
    with pytest.raises(MoqtDecodeError, match="Type Delta"):
        parse_control_message(short_count)


def test_wrong_parity_request_id() -> None:
    wire = CraftedMessage.from_message(SUB).set_vi64("Request ID", 3).build()
    msg, _ = parse_control_message(wire)
    assert isinstance(msg, Subscribe) and msg.request_id == 3
    with pytest.raises(MoqtDecodeError) as info:
        check_request_id(msg.request_id, sender_is_client=True)
    assert info.value.code == SessionError.INVALID_REQUEST_ID


def test_non_minimal_fields_are_still_valid() -> None:
    wire = CraftedMessage.from_message(SUB).with_type(0x03, size=2).set_vi64("Request ID", 0, size=4).build()
    assert wire[:2] == b"\x80\x03"
    assert parse_control_message(wire)[0] == SUB


def test_insert_remove_append() -> None:
    c = CraftedMessage.from_message(SUB)
    assert c.remove("Parameters").insert("Track Name", "Parameters", b"\x00").build() == c.set(
        "Parameters", b"\x00").build()
    trailing = c.append("Junk", b"\xff").build()
    with pytest.raises(MoqtDecodeError, match="Message Length"):
        parse_control_message(trailing)
    assert c.get("Request ID") == b"\x00"


def test_with_length_bounds() -> None:
    with pytest.raises(ValueError, match="16 bits"):
        CraftedMessage.from_message(SUB).with_length(70000).build()


def test_raw_data_plane_builders() -> None:
    stream = raw_subgroup_header(0x14, 2, 0, 0, 0) + raw_subgroup_object(0, b"abcd") + raw_subgroup_object(
        0, status=3)
    parser = DataStreamParser()
    items = parser.feed(stream)
    parser.end_of_stream()
    assert items[1] == SubgroupObject(0, b"abcd", 0, b"", 2, 0, 0, 0)
    assert items[2].status == 3  # type: ignore[union-attr]
    bad_status = raw_subgroup_header(0x10, 2, 0) + b"\x00" + raw_subgroup_object(0, status=9)
    with pytest.raises(MoqtDecodeError, match="unknown status"):
        DataStreamParser().feed(bad_status)
    fetch = vi64(5) + vi64(1) + raw_fetch_object(0x1C, group_delta=3, object_delta=1, priority=7, payload=b"z")
    assert DataStreamParser().feed(fetch)[1] == FetchObject(3, 1, b"z", 0, 7)
    lying_flags = vi64(5) + vi64(1) + raw_fetch_object(0x0C, group_delta=3, object_delta=1, payload=b"z")
    with pytest.raises(MoqtDecodeError, match="prior Priority"):
        DataStreamParser().feed(lying_flags)
    truncated = vi64(5) + vi64(1) + raw_fetch_object(0x1C, group_delta=3, object_delta=1, priority=7,
                                                     payload=b"z", payload_length=5)
    parser = DataStreamParser()
    parser.feed(truncated)
    with pytest.raises(MoqtDecodeError, match="FIN inside"):
        parser.end_of_stream()
