"""Control messages, structures and filters: the profile's byte-exact examples, hypothesis round-trips of
every message type, and a decode error naming the field (and offset) for each malformation."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvconform.moqt.errors import MoqtDecodeError, MoqtEncodeError, NeedMoreData, SessionError
from kvconform.moqt.filters import LocationFilter, RangeFilter, passes_range_filters
from kvconform.moqt.messages import (
    ALLOWED_PARAMS,
    MESSAGE_TYPES,
    ControlMessage,
    ControlStreamParser,
    Fetch,
    FetchOk,
    Goaway,
    MessageType,
    Namespace,
    NamespaceDone,
    Publish,
    PublishDone,
    PublishNamespace,
    PublishSkipped,
    PublishStateNotify,
    Redirect,
    RequestError,
    RequestOk,
    RequestUpdate,
    Setup,
    Subscribe,
    SubscribeNamespace,
    SubscribeOk,
    SubscribeTracks,
    TrackStatus,
    check_request_id,
    parse_control_message,
)
from kvconform.moqt.parameters import FillParameters, Parameter, Parameters
from kvconform.moqt.structures import (
    AuthToken,
    KeyValuePair,
    Location,
    ParamType,
    TrackNamespace,
    encode_kvps,
    property_int,
    render_full_track_name,
)
from kvconform.moqt.vi64 import Reader

H = bytes.fromhex
SCOPE = H("6d1c6481cd428737da312c089db3832a")
COMPAT = H("5ed5c2f23883 9655d7c4029e12b7f31caf9e7421f4edb4057feee6dab760ee0f".replace(" ", ""))
ANCHOR = H("653275884ca44f8945fd4c902611c467394b73656e64c78d8522648cb75aefc1")
PUB = H("0123456789abcdef0123456789abcdef")
KVCS_NS = TrackNamespace((b"kvcs-1", SCOPE, COMPAT, ANCHOR, PUB))
KVCS_NS_BYTES = H(
    "05066b7663732d31106d1c6481cd428737da312c089db3832a205ed5c2f238839655d7c4029e12b7f31caf9e7421f4edb4057f"
    "eee6dab760ee0f20653275884ca44f8945fd4c902611c467394b73656e64c78d8522648cb75aefc1100123456789abcdef0123"
    "456789abcdef"
)
LIVE_PARAMS = Parameters.of(
    (ParamType.LOCATION_FILTER, LocationFilter.next_object()),
    (ParamType.FILL_PARAMETERS, FillParameters.of((ParamType.LOCATION_FILTER, LocationFilter.absolute_start(0, 0)))),
)


# ---------------------------------------------------------------------------------------------------
# Byte-exact examples of the profile


def test_kvcs_namespace_is_108_octets() -> None:
    assert KVCS_NS.encode() == KVCS_NS_BYTES
    assert len(KVCS_NS_BYTES) == 108
    assert TrackNamespace.decode(Reader(KVCS_NS_BYTES)) == KVCS_NS
    assert KVCS_NS.byte_length() + len(b"k.raw.s0") == 110  # Full Track Name length, profile §3.4


def test_setup_example() -> None:
    wire = H("af000029 01052f6b766373 0412 72656c61792e6578616d706c653a34343433 0104 010a6b7663732d682f302e31"
             .replace(" ", ""))
    msg = Setup.build(path=b"/kvcs", authority=b"relay.example:4443", max_filter_ranges=4,
                      implementation=b"kvcs-h/0.1")
    assert msg.encode() == wire
    decoded = Setup.decode(wire)
    assert decoded == msg
    assert (decoded.path, decoded.authority, decoded.max_filter_ranges) == (b"/kvcs", b"relay.example:4443", 4)
    assert decoded.max_request_updates == 0 and decoded.max_auth_token_cache_size == 0


def test_live_subscribe_example_131_bytes() -> None:
    wire = H("03 0080 00") + KVCS_NS_BYTES + H("08 6b2e7261772e7330 02 2105 02050121020000")
    msg = Subscribe(0, KVCS_NS, b"k.raw.s0", LIVE_PARAMS)
    assert len(wire) == 131
    assert msg.encode() == wire
    assert Subscribe.decode(wire) == msg


def test_parameter_block_with_token() -> None:
    params = LIVE_PARAMS.with_param(ParamType.AUTHORIZATION_TOKEN, AuthToken.use_value(b"tok"))
    assert params.encode() == H("0303050300746f6b1e0502050121020000")


def test_fill_with_group_order_inner_block() -> None:
    fill = FillParameters.of((ParamType.LOCATION_FILTER, LocationFilter.absolute_start(0, 0)),
                             (ParamType.GROUP_ORDER, 1))
    assert fill.encode() == H("07 02 21020000 0101".replace(" ", ""))


def test_manifest_recipe() -> None:
    params = Parameters.of(
        (ParamType.LOCATION_FILTER, LocationFilter.next_object()),
        (ParamType.FILL_PARAMETERS, FillParameters.of((ParamType.LOCATION_FILTER, LocationFilter.relative_start(1)))),
    )
    assert params.encode() == H("022105020401210101")


def test_completed_cache_fetch_block() -> None:
    params = Parameters.of(
        (ParamType.LOCATION_FILTER, LocationFilter.absolute_start_group_end(2, 0, 3)),
        (ParamType.GROUP_ORDER, 1),
        (ParamType.OBJECTID_FILTER, RangeFilter.first_objects(3)),
    )
    block = H("03210302000301010403000002")
    assert params.encode() == block
    fetch = Fetch(2, KVCS_NS, b"k.raw.s0", params)
    wire = fetch.encode()
    assert wire[:1] == b"\x16" and int.from_bytes(wire[1:3], "big") == len(wire) - 3
    assert wire.endswith(block)
    assert Fetch.decode(wire) == fetch


def test_subscribe_namespace_discovery_example() -> None:
    msg = SubscribeNamespace(4, TrackNamespace(KVCS_NS.fields[:4]))
    wire = msg.encode()
    assert wire[:5] == H("50005d0404") and wire[5:12] == b"\x06kvcs-1" and wire.endswith(H("efc100"))
    assert SubscribeNamespace.decode(wire) == msg
    assert RequestOk().encode() == H("07000100")
    ns = Namespace(TrackNamespace((PUB,)))
    assert ns.encode() == H("0800120110") + PUB
    assert KVCS_NS.suffix_after(msg.track_namespace_prefix) == ns.track_namespace_suffix


def test_range_filter_delta_example() -> None:
    rf = RangeFilter(ParamType.SUBGROUP_FILTER, 0, ((3, 5), (10, 15)))
    assert rf.encode() == H("05 00 03020505".replace(" ", ""))
    assert RangeFilter.decode(Reader(rf.encode()), ParamType.SUBGROUP_FILTER) == rf


def test_location_filter_d22_vs_d20_trap() -> None:
    # `21 02 00 00` is Absolute Start {0,0} in d22; Next Object is `21 05` (profile §7.3).
    p = Parameters.decode(Reader(H("01 21020000".replace(" ", ""))))
    assert p.get(ParamType.LOCATION_FILTER) == LocationFilter.absolute_start(0, 0)
    assert LocationFilter.next_object().encode() == b"\x05"


def test_render_full_track_name() -> None:
    ns = TrackNamespace.of("kvcs-1", b"\x01\xff")
    assert render_full_track_name(ns, b"k.raw.s0") == "kvcs.2d1-.01.ff--k.2eraw.2es0"


# ---------------------------------------------------------------------------------------------------
# Filter evaluation (profile §7.3, §7.5)


def test_location_filter_evaluation() -> None:
    largest = Location(4, 7)
    assert LocationFilter.next_object().start(largest) == Location(4, 8)
    assert LocationFilter.next_object().start(None) == Location(0, 0)
    assert LocationFilter.relative_start(1).start(largest) == Location(4, 0)
    assert LocationFilter.relative_start(0).start(largest) == Location(5, 0)
    assert LocationFilter.relative_start(9).start(largest) == Location(0, 0)
    assert LocationFilter.absolute_start(0, 0).fetch_range(largest) == (Location(0, 0), largest)
    assert LocationFilter.absolute_start_group_end(2, 0, 1).fetch_range(largest)[1].group == 3  # type: ignore[index]
    assert LocationFilter.absolute_range(1, 2, 10, 5).fetch_range(largest) == (Location(1, 2), largest)
    assert LocationFilter.absolute_start(5, 0).fetch_range(largest) is None
    assert LocationFilter.next_object().fetch_range(largest) is None
    assert LocationFilter.none().fetch_range(None) is None
    f = LocationFilter.absolute_range(1, 0, 1, 3)
    assert f.contains(Location(2, 3), largest) and not f.contains(Location(2, 4), largest)


def test_range_filter_sets() -> None:
    first3 = RangeFilter.first_objects(3)
    prio = RangeFilter(ParamType.PRIORITY_FILTER, 1, ((0, 10),))
    assert passes_range_filters([], subgroup_id=0, object_id=99, priority=200)
    assert passes_range_filters([first3], subgroup_id=0, object_id=2, priority=200)
    assert not passes_range_filters([first3], subgroup_id=0, object_id=3, priority=200)
    assert passes_range_filters([first3, prio], subgroup_id=0, object_id=5, priority=4)  # sets are ORed
    same_set = RangeFilter(ParamType.PRIORITY_FILTER, 0, ((0, 10),))
    assert not passes_range_filters([first3, same_set], subgroup_id=0, object_id=1, priority=11)  # ANDed
    prop = RangeFilter(ParamType.OBJECT_PROPERTY_FILTER, 0, ((5, None),), property_type=0x40)
    assert passes_range_filters([prop], subgroup_id=0, object_id=0, priority=0,
                                object_properties=[KeyValuePair(0x40, 7)])
    assert not passes_range_filters([prop], subgroup_id=0, object_id=0, priority=0)
    assert RangeFilter(ParamType.PRIORITY_FILTER, 0, ((0, 256),)).problem() is not None
    assert RangeFilter(ParamType.OBJECT_PROPERTY_FILTER, 0, ((0, 1),), 3).problem() is not None
    assert first3.problem() is None


# ---------------------------------------------------------------------------------------------------
# Hypothesis round-trips of every message type

field_bytes = st.binary(min_size=1, max_size=12)
namespaces = st.lists(field_bytes, max_size=6).map(lambda fs: TrackNamespace(tuple(fs)))
names = st.binary(max_size=20)
u62 = st.integers(0, (1 << 62) - 1)
small = st.integers(0, 5000)
locations = st.builds(Location, u62, u62)
location_filters = st.one_of(
    st.just(LocationFilter.none()),
    st.just(LocationFilter.next_object()),
    st.builds(LocationFilter.relative_start, small),
    st.builds(LocationFilter.absolute_start, small, small),
    st.builds(LocationFilter.absolute_start_group_end, small, small, small),
    st.builds(LocationFilter.absolute_range, small, small, small, small),
)


def range_filters(ptype: int) -> st.SearchStrategy[RangeFilter]:
    prop = st.integers(0, 100).map(lambda v: v * 2) if ptype in (0x28, 0x29) else st.none()
    pairs = st.lists(st.tuples(st.integers(0, 50), st.integers(0, 50)), min_size=1, max_size=4)

    def build(set_id: int, deltas: list[tuple[int, int]], open_end: bool, p: int | None) -> RangeFilter:
        ranges: list[tuple[int, int | None]] = []
        prev = 0
        for d_start, d_len in deltas:
            start = prev + d_start
            prev = start + d_len
            ranges.append((start, prev))
        if open_end:
            ranges[-1] = (ranges[-1][0], None)
        return RangeFilter(ptype, set_id, tuple(ranges), p)

    return st.builds(build, st.integers(0, 255), pairs, st.booleans(), prop)


def value_for(ptype: int) -> st.SearchStrategy[Any]:
    if ptype in (0x10, 0x35):
        return st.integers(0, 1)
    if ptype == 0x20:
        return st.integers(0, 255)
    if ptype == 0x22:
        return st.integers(1, 2)
    if ptype in (0x02, 0x04, 0x06, 0x08, 0x0A, 0x32):
        return u62
    if ptype == 0x09:
        return locations
    if ptype == 0x03:
        return st.builds(AuthToken.use_value, st.binary(max_size=16), st.integers(0, 3))
    if ptype == 0x21:
        return location_filters
    if ptype == 0x23:
        return params_for(frozenset({0x0A, 0x20, 0x21, 0x22, 0x26}), 3).map(FillParameters)
    if ptype in (0x25, 0x26, 0x27, 0x28, 0x29):
        return range_filters(ptype)
    if ptype == 0x34:
        return namespaces
    raise AssertionError(ptype)


def param_of(ptype: int) -> st.SearchStrategy[Parameter]:
    return st.builds(Parameter, st.just(ptype), value_for(ptype))


def params_with(types: list[int]) -> st.SearchStrategy[Parameters]:
    return st.tuples(*[param_of(t) for t in sorted(types)]).map(Parameters)


def params_for(allowed: frozenset[int], max_size: int = 5) -> st.SearchStrategy[Parameters]:
    if not allowed:
        return st.just(Parameters())
    return st.lists(st.sampled_from(sorted(allowed)), unique=True, max_size=max_size).flatmap(params_with)


props = st.lists(st.tuples(st.integers(0, 40), st.one_of(u62, st.binary(max_size=8))), max_size=4).map(
    lambda raw: tuple(_kvps(raw))
)


# Known property types get a valid value (their definitions are checked on decode).
_VALID_PROPERTY: dict[int, int | bytes] = {0x0B: encode_kvps([KeyValuePair(0x3C, 1)]), 0x0E: 7, 0x22: 2, 0x30: 1}


def _kvps(raw: list[tuple[int, int | bytes]]) -> list[KeyValuePair]:
    out, t = [], 0
    for delta, v in raw:
        t += delta
        # even types carry an int, odd ones bytes
        value = v if (t % 2 == 0) == isinstance(v, int) else (0 if t % 2 == 0 else b"x")
        out.append(KeyValuePair(t, _VALID_PROPERTY.get(t, value)))
    return out


def p(msg_type: int) -> st.SearchStrategy[Parameters]:
    return params_for(ALLOWED_PARAMS[msg_type])


MESSAGES: dict[type[ControlMessage], st.SearchStrategy[Any]] = {
    Setup: props.map(lambda kv: Setup(tuple(x for x in kv if x.type not in range(1, 9)))),
    Goaway: st.builds(Goaway, st.binary(max_size=30), u62),
    Subscribe: st.builds(Subscribe, u62, namespaces, names, p(MessageType.SUBSCRIBE)),
    TrackStatus: st.builds(TrackStatus, u62, namespaces, names, p(MessageType.TRACK_STATUS)),
    Fetch: st.builds(Fetch, u62, namespaces, names, p(MessageType.FETCH)),
    SubscribeOk: st.builds(SubscribeOk, u62, p(MessageType.SUBSCRIBE_OK), props),
    RequestUpdate: st.builds(RequestUpdate, u62, params_for(frozenset({0x02, 0x03, 0x10, 0x21, 0x23, 0x26, 0x34}))),
    PublishStateNotify: st.builds(PublishStateNotify, p(MessageType.PUBLISH_STATE_NOTIFY)),
    Publish: st.builds(Publish, u62, namespaces, names, u62, p(MessageType.PUBLISH), props),
    PublishDone: st.builds(PublishDone, u62, u62, st.binary(max_size=40)),
    FetchOk: st.builds(FetchOk, st.integers(0, 1), locations, st.just(Parameters()), props),
    PublishNamespace: st.builds(PublishNamespace, u62, namespaces, p(MessageType.PUBLISH_NAMESPACE)),
    SubscribeNamespace: st.builds(SubscribeNamespace, u62, namespaces, p(MessageType.SUBSCRIBE_NAMESPACE)),
    SubscribeTracks: st.builds(SubscribeTracks, u62, namespaces, p(MessageType.SUBSCRIBE_TRACKS)),
    Namespace: st.builds(Namespace, namespaces),
    NamespaceDone: st.builds(NamespaceDone, namespaces),
    PublishSkipped: st.builds(PublishSkipped, namespaces, names),
    RequestOk: st.builds(RequestOk, params_for(frozenset({0x08, 0x09})), props),
    RequestError: st.one_of(
        st.builds(RequestError, u62.filter(lambda c: c != 0x34), u62, st.binary(max_size=30)),
        st.builds(RequestError, st.just(0x34), u62, st.binary(max_size=5),
                  st.builds(Redirect, st.binary(max_size=20), namespaces, names)),
    ),
}


def test_every_registered_type_has_a_strategy() -> None:
    assert set(MESSAGES) == set(MESSAGE_TYPES.values())


@pytest.mark.parametrize("cls", list(MESSAGES), ids=lambda c: c.__name__)
@settings(max_examples=60, deadline=None)
@given(data=st.data())
def test_round_trip(cls: type[ControlMessage], data: st.DataObject) -> None:
    msg = data.draw(MESSAGES[cls])
    wire = msg.encode()
    decoded, used = parse_control_message(wire + b"\x10\x00")  # trailing bytes belong to the next message
    assert used == len(wire)
    assert decoded == _canonical(msg)
    assert decoded.encode() == wire


def _canonical(msg: ControlMessage) -> ControlMessage:
    """Decoding yields parameters in wire (ascending Type) order."""
    params = getattr(msg, "parameters", None)
    if params is None:
        return msg
    from dataclasses import replace

    return replace(msg, parameters=Parameters(tuple(sorted(params.items, key=lambda q: q.type))))  # type: ignore[type-var]


@settings(max_examples=40, deadline=None)
@given(st.lists(st.sampled_from([Subscribe, SubscribeOk, RequestOk, PublishDone, Namespace]), min_size=1,
                max_size=6).flatmap(lambda cs: st.tuples(*[MESSAGES[c] for c in cs])), st.integers(1, 7))
def test_stream_parser_any_chunking(msgs: tuple[ControlMessage, ...], chunk: int) -> None:
    wire = b"".join(m.encode() for m in msgs)
    parser = ControlStreamParser()
    out: list[ControlMessage] = []
    for i in range(0, len(wire), chunk):
        out += parser.feed(wire[i : i + chunk])
    parser.end_of_stream()
    assert [type(m) for m in out] == [type(m) for m in msgs]
    assert b"".join(m.encode() for m in out) == wire


# ---------------------------------------------------------------------------------------------------
# Checked encoders refuse what the profile forbids


@pytest.mark.parametrize(
    ("build", "match"),
    [
        (lambda: Fetch(0, KVCS_NS, b"t", Parameters.of((0x23, FillParameters()))).encode(), "not allowed in FETCH"),
        (lambda: Subscribe(0, KVCS_NS, b"t", Parameters.of((0x10, 2))).encode(), "not in"),
        (lambda: Subscribe(0, KVCS_NS, b"t", Parameters.of((0x10, 1), (0x10, 1))).encode(), "not repeatable"),
        (lambda: Subscribe(0, KVCS_NS, b"t", Parameters.of((0x21, b"\x05"), (0x77, b""))).encode(), "not allowed"),
        (lambda: FetchOk(2, Location(0, 0)).encode(), "End Of Track"),
        (lambda: RequestError(0x34).encode(), "Redirect"),
        (lambda: Goaway(b"x" * 8193).encode(), "GOAWAY URI"),
        (lambda: PublishDone(0, 0, b"x" * 1025).encode(), "Reason Phrase"),
        (lambda: TrackNamespace((b"",)).encode(), "empty"),
        (lambda: TrackNamespace(tuple(b"a" for _ in range(33))).encode(), "33 fields"),
        (lambda: Setup((KeyValuePair(6, 1), KeyValuePair(6, 2))).encode(), "repeated"),
        (lambda: KeyValuePair(3, 5).check(), "odd"),
        (lambda: FillParameters.of((0x02, 5)).encode(), "not allowed in FILL_PARAMETERS"),
        (lambda: LocationFilter(6).encode(), "not 0..5"),
    ],
)
def test_checked_encoders_refuse(build: Any, match: str) -> None:
    with pytest.raises(MoqtEncodeError, match=match):
        build()


# ---------------------------------------------------------------------------------------------------
# Every decode error names its field and offset


def framed(msg_type: int, body: str) -> bytes:
    b = H(body.replace(" ", ""))
    from kvconform.moqt.vi64 import encode_vi64

    return encode_vi64(msg_type) + len(b).to_bytes(2, "big") + b


DECODE_ERRORS = [
    # (wire, field substring, offset, code)
    (H("3f0000"), "Message Type", 0, SessionError.PROTOCOL_VIOLATION),
    (framed(0x03, "00 01 01 61 00 00 ff"), "SUBSCRIBE.Message Length", 9, SessionError.PROTOCOL_VIOLATION),
    (framed(0x03, "00 01 01 61 00"), "SUBSCRIBE.Parameters.Number of Parameters", 8, SessionError.PROTOCOL_VIOLATION),
    (framed(0x03, "00 00 00 01 05"), "SUBSCRIBE.Parameters[0].Type Delta", 7, SessionError.PROTOCOL_VIOLATION),
    (framed(0x03, "00 00 00 01 10 02"), "SUBSCRIBE.Parameters[0](FORWARD)", 8, SessionError.PROTOCOL_VIOLATION),
    (framed(0x03, "00 00 00 01 22 00"), "SUBSCRIBE.Parameters[0](GROUP_ORDER)", 8, SessionError.PROTOCOL_VIOLATION),
    (framed(0x03, "00 00 00 02 10 01 00 01"), "SUBSCRIBE.Parameters[1].Type Delta", 9,
     SessionError.PROTOCOL_VIOLATION),
    (framed(0x03, "00 00 00 01 21 06"), "SUBSCRIBE.Parameters[0](LOCATION_FILTER).Location Filter Type", 8,
     SessionError.PROTOCOL_VIOLATION),
    (framed(0x03, "00 00 00 01 23 03 01 02 05"), "SUBSCRIBE.Parameters[0](FILL_PARAMETERS)[0].Type Delta", 10,
     SessionError.PROTOCOL_VIOLATION),
    (framed(0x16, "00 00 00 01 23 01 00"), "FETCH.Parameters[0].Type Delta", 7, SessionError.PROTOCOL_VIOLATION),
    (framed(0x06, "00 01 01 61 01 21 05"), "PUBLISH_NAMESPACE.Parameters[0].Type Delta", 8,
     SessionError.PROTOCOL_VIOLATION),
    (framed(0x03, "00 01 00 00 00"), "SUBSCRIBE.Track Namespace.Field[0].Length", 5, SessionError.PROTOCOL_VIOLATION),
    (framed(0x03, "00 21" + "0161" * 33 + "00 00"), "SUBSCRIBE.Track Namespace.Number of Fields", 4,
     SessionError.PROTOCOL_VIOLATION),
    (framed(0x03, "00 01 80 81" + "61" * 129 + "8f 80" + "62" * 3968 + "00"), "SUBSCRIBE.Full Track Name", 4,
     SessionError.PROTOCOL_VIOLATION),
    (framed(0x03, "00 00 00 01 03 02 05 00"), "SUBSCRIBE.Parameters[0](AUTHORIZATION_TOKEN).Token.Alias Type", 9,
     SessionError.KEY_VALUE_FORMATTING_ERROR),
    (framed(0x03, "00 00 00 01 03 01 03"), "SUBSCRIBE.Parameters[0](AUTHORIZATION_TOKEN).Token.Token Type", 10,
     SessionError.KEY_VALUE_FORMATTING_ERROR),
    (framed(0x18, "02 00 00 00"), "FETCH_OK.End Of Track", 3, SessionError.PROTOCOL_VIOLATION),
    (framed(0x18, "00 00 00 01 08 00"), "FETCH_OK.Parameters[0].Type Delta", 7, SessionError.PROTOCOL_VIOLATION),
    (framed(0x0B, "00 00 84 01" + "00" * 1025), "PUBLISH_DONE.Error Reason.Length", 5,
     SessionError.PROTOCOL_VIOLATION),
    (framed(0x10, "a0 01" + "00" * 8193 + "00"), "GOAWAY.New Session URI Length", 3, SessionError.PROTOCOL_VIOLATION),
    (framed(0x2F00, "06 01 00 02"), "SETUP.Setup Options", 8, SessionError.PROTOCOL_VIOLATION),
    (framed(0x2F00, "01 c1 00 00 00"), "SETUP.Setup Options[0](0x1).Length", 5, SessionError.PROTOCOL_VIOLATION),
    (framed(0x04, "01 00 01"), "SUBSCRIBE_OK.Track Properties[0](0x1).Length", 6, SessionError.PROTOCOL_VIOLATION),
]


@pytest.mark.parametrize(("wire", "field", "offset", "code"), DECODE_ERRORS,
                         ids=[e[1] for e in DECODE_ERRORS])
def test_decode_error_names_field(wire: bytes, field: str, offset: int, code: SessionError) -> None:
    with pytest.raises(MoqtDecodeError) as info:
        parse_control_message(wire)
    err = info.value
    assert not isinstance(err, NeedMoreData)
    assert field in err.field, err
    assert err.offset == offset, err
    assert err.code == code
    assert field in str(err) and f"offset {offset}" in str(err)


def test_request_ok_context_rules() -> None:
    with_props = framed(0x07, "00 02 05")
    assert parse_control_message(with_props, request_type=MessageType.TRACK_STATUS)[0] == RequestOk(
        Parameters(), (KeyValuePair(2, 5),))
    with pytest.raises(MoqtDecodeError, match=r"Track Properties.*must be empty"):
        parse_control_message(with_props, request_type=MessageType.SUBSCRIBE)
    expires = framed(0x07, "01 08 05")
    parse_control_message(expires, request_type=MessageType.PUBLISH)
    with pytest.raises(MoqtDecodeError, match="EXPIRES is not allowed in REQUEST_OK answering TRACK_STATUS"):
        parse_control_message(expires, request_type=MessageType.TRACK_STATUS)


def test_request_update_context_rules() -> None:
    prefix_update = RequestUpdate(2, Parameters.of((ParamType.TRACK_NAMESPACE_PREFIX, TrackNamespace.of("a"))))
    wire = prefix_update.encode()
    assert parse_control_message(wire, request_type=MessageType.SUBSCRIBE_NAMESPACE)[0] == prefix_update
    with pytest.raises(MoqtDecodeError) as info:
        parse_control_message(wire, request_type=MessageType.FETCH)
    assert "TRACK_NAMESPACE_PREFIX is not allowed in REQUEST_UPDATE of FETCH" in str(info.value)
    assert info.value.field == "REQUEST_UPDATE.Parameters[0].Type Delta"
    with pytest.raises(MoqtEncodeError):
        prefix_update.encode_for(MessageType.SUBSCRIBE)
    assert prefix_update.encode_for(MessageType.SUBSCRIBE_NAMESPACE) == wire


def test_need_more_data_on_partial_message() -> None:
    wire = Subscribe(0, KVCS_NS, b"k.raw.s0", LIVE_PARAMS).encode()
    for cut in (0, 1, 2, 3, 50, len(wire) - 1):
        with pytest.raises(NeedMoreData):
            parse_control_message(wire[:cut])


def test_request_stream_parser_checks_first_message_and_fin() -> None:
    parser = ControlStreamParser(request_stream=True)
    with pytest.raises(MoqtDecodeError, match="cannot open a request stream") as info:
        parser.feed(RequestOk().encode())
    assert info.value.field == "Message Type"
    parser = ControlStreamParser(request_stream=True)
    sub = Subscribe(0, KVCS_NS, b"k", LIVE_PARAMS).encode()
    assert parser.feed(sub + RequestUpdate(2).encode()[:2]) and parser.request_type == MessageType.SUBSCRIBE
    with pytest.raises(MoqtDecodeError, match="stream ended inside a message") as info:
        parser.end_of_stream()
    assert info.value.offset == len(sub)
    # offsets in errors count from the start of the stream
    parser = ControlStreamParser()
    with pytest.raises(MoqtDecodeError) as info:
        parser.feed(RequestOk().encode() + H("3f0000"))
    assert (info.value.field, info.value.offset) == ("Message Type", 4)


@pytest.mark.parametrize(("rid", "client", "ok"), [(0, True, True), (1, True, False), (3, False, True),
                                                   (4, False, False)])
def test_request_id_parity(rid: int, client: bool, ok: bool) -> None:
    if ok:
        check_request_id(rid, client)
    else:
        with pytest.raises(MoqtDecodeError) as info:
            check_request_id(rid, client, offset=3)
        assert (info.value.field, info.value.offset, info.value.code) == ("Request ID", 3,
                                                                          SessionError.INVALID_REQUEST_ID)


def test_auth_token_forms() -> None:
    for tok, wire in [
        (AuthToken.use_value(b"tok"), "0300746f6b"),
        (AuthToken(0, None, b"", alias=7), "0007"),
        (AuthToken(1, 0, b"ab", alias=7), "01070061 62".replace(" ", "")),
        (AuthToken(2, None, b"", alias=9), "0209"),
    ]:
        assert tok.encode().hex() == wire
        assert AuthToken.decode(Reader(tok.encode())) == tok
    with pytest.raises(MoqtDecodeError) as info:
        AuthToken.decode(Reader(H("020901")))
    assert info.value.code == SessionError.KEY_VALUE_FORMATTING_ERROR
    setup = Setup.build(auth_tokens=[AuthToken.use_value(b"a"), AuthToken.use_value(b"b")])
    assert Setup.decode(setup.encode()).auth_tokens() == [AuthToken.use_value(b"a"), AuthToken.use_value(b"b")]


def test_namespace_prefix_relations() -> None:
    foo, foobar = TrackNamespace.of("foo"), TrackNamespace.of("foobar")
    foo_bar = TrackNamespace.of("foo", "bar")
    assert foo.is_prefix_of(foo_bar) and foo_bar.is_prefix_of(foo_bar)
    assert not foobar.is_prefix_of(foo_bar)
    assert TrackNamespace().is_prefix_of(foo)
    assert foo.overlaps(foo_bar) and foo_bar.overlaps(foo)
    assert not TrackNamespace.of("foo", "baz").overlaps(foo_bar)


def test_lookup_and_grease() -> None:
    from kvconform.moqt.errors import RequestErrorCode, is_grease, lookup

    assert lookup(RequestErrorCode, 0x36) == "INVALID_FILTER"
    assert "INTERNAL_ERROR" in lookup(RequestErrorCode, 0x99)
    assert is_grease(0x9D) and is_grease(0x9D + 0x7F) and not is_grease(0x9E)


PROPERTY_ERRORS = [
    ("0b 01 05", SessionError.KEY_VALUE_FORMATTING_ERROR, "does not parse"),
    ("0b 02 0b 00", SessionError.KEY_VALUE_FORMATTING_ERROR, "nested"),
    ("0e 81 00", SessionError.KEY_VALUE_FORMATTING_ERROR, "> 255"),
    ("22 03", SessionError.PROTOCOL_VIOLATION, "not 1 or 2"),
    ("30 02", SessionError.KEY_VALUE_FORMATTING_ERROR, "not 0 or 1"),
]


@pytest.mark.parametrize(("props", "code", "match"), PROPERTY_ERRORS, ids=[e[2] for e in PROPERTY_ERRORS])
def test_known_track_property_values_are_checked(props: str, code: SessionError, match: str) -> None:
    with pytest.raises(MoqtDecodeError, match=match) as info:
        parse_control_message(framed(0x04, "01 00" + props))
    assert (info.value.field, info.value.offset, info.value.code) == ("SUBSCRIBE_OK.Track Properties", 5, code)


def test_property_int_looks_inside_immutable() -> None:
    inner = encode_kvps([KeyValuePair(0x04, 3_600_000)])
    props = (KeyValuePair(0x0B, inner), KeyValuePair(0x0E, 12))
    assert property_int(props, 0x04) == 3_600_000
    assert property_int(props, 0x0E) == 12
    assert property_int(props, 0x22, 1) == 1
