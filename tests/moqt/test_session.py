"""Sans-I/O MOQT session: a client and a server Session moved byte-for-byte in memory (aioquic's
`roundtrip` pattern), then exact termination codes and reasons for protocol violations."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvconform.moqt import craft
from kvconform.moqt.data import FetchObject, ObjectStatus, SubgroupHeader, SubgroupObject, SubgroupStreamWriter
from kvconform.moqt.errors import SessionError, StreamResetCode
from kvconform.moqt.filters import LocationFilter, RangeFilter
from kvconform.moqt.messages import (
    Goaway,
    Namespace,
    NamespaceDone,
    PublishDone,
    PublishNamespace,
    RequestError,
    RequestOk,
    RequestUpdate,
    Setup,
    Subscribe,
    SubscribeOk,
)
from kvconform.moqt.parameters import FillParameters, Parameters
from kvconform.moqt.session import (
    CloseConnection,
    Command,
    DataStreamEnded,
    DataStreamOpened,
    Event,
    GoawayReceived,
    MessageReceived,
    ObjectReceived,
    RawRequestMessage,
    RequestAutoRejected,
    RequestReceived,
    RequestState,
    ResetStream,
    Role,
    Session,
    SessionClosed,
    SessionConfig,
    SessionUsageError,
    SetupReceived,
    StopSending,
    WriteStream,
)
from kvconform.moqt.structures import KeyValuePair, Location, ParamType, PropertyType, TrackNamespace

NS = TrackNamespace.of("kvcs-1", "scope", "pub")
NAME = b"k.raw.s0"


@dataclass
class Pair:
    """A client and a server session joined by an in-memory transport that keeps every command."""

    client: Session
    server: Session
    sent: dict[str, list[Command]] = field(default_factory=lambda: {"client": [], "server": []})
    events: dict[str, list[Event]] = field(default_factory=lambda: {"client": [], "server": []})

    def _move(self, name: str, src: Session, dst: Session) -> int:
        commands = src.commands()
        self.sent[name] += commands
        for cmd in commands:
            if isinstance(cmd, WriteStream):
                dst.receive_stream_data(cmd.stream_id, cmd.data, cmd.end_stream)
            elif isinstance(cmd, ResetStream):
                dst.receive_stream_reset(cmd.stream_id, cmd.code)
            elif isinstance(cmd, StopSending):
                dst.receive_stop_sending(cmd.stream_id, cmd.code)
            elif isinstance(cmd, CloseConnection):
                dst.connection_terminated(cmd.code, cmd.reason)
        return len(commands)

    def transfer(self) -> None:
        """Move commands both ways until neither side has more (bounded: sessions are finite)."""
        for _ in range(100):
            if not (self._move("client", self.client, self.server) + self._move("server", self.server, self.client)):
                break
        else:  # pragma: no cover - would mean a command ping-pong without end
            raise AssertionError("transfer did not settle in 100 rounds")
        self.events["client"] += self.client.events()
        self.events["server"] += self.server.events()

    def take(self, side: str) -> list[Event]:
        out, self.events[side] = self.events[side], []
        return out

    def closed_by(self, side: str) -> SessionClosed:
        session = self.client if side == "client" else self.server
        assert session.closed is not None, f"{side} did not close the session"
        assert not session.closed.by_peer, f"{side} did not close it itself: {session.closed}"
        return session.closed


def make_pair(client_config: SessionConfig | None = None, server_config: SessionConfig | None = None) -> Pair:
    pair = Pair(Session(client_config or SessionConfig(Role.CLIENT)), Session(server_config or
                                                                              SessionConfig(Role.SERVER)))
    pair.client.start()
    pair.server.start()
    pair.transfer()
    return pair


@pytest.fixture
def pair() -> Pair:
    p = make_pair()
    assert [type(e) for e in p.take("client")] == [SetupReceived]
    assert [type(e) for e in p.take("server")] == [SetupReceived]
    return p


def only(events: list[Event], kind: type) -> list:  # type: ignore[type-arg]
    return [e for e in events if isinstance(e, kind)]


def kvcs_subscribe_params(fill_order: int = 1) -> Parameters:
    fill = FillParameters.of((ParamType.LOCATION_FILTER, LocationFilter.absolute_start(0, 0)),
                             (ParamType.GROUP_ORDER, fill_order))
    return Parameters.of((ParamType.LOCATION_FILTER, LocationFilter.next_object()), (ParamType.FILL_PARAMETERS, fill))


# ---------------------------------------------------------------------------------------------------
# SETUP and stream topology


def test_client_setup_is_byte_exact_profile_example() -> None:
    """Profile §5 example: PATH /kvcs, AUTHORITY relay.example:4443, MAX_FILTER_RANGES 4, impl kvcs-h/0.1."""
    session = Session(SessionConfig(Role.CLIENT, implementation="kvcs-h/0.1", max_filter_ranges=4,
                                    authority="relay.example:4443", path="/kvcs"))
    session.start()
    (cmd,) = session.commands()
    assert isinstance(cmd, WriteStream)
    assert cmd.stream_id == 2  # the client's first unidirectional stream
    assert cmd.data == bytes.fromhex(
        "af000029 01052f6b766373 0412 72656c61792e6578616d706c653a34343433 0104 010a6b7663732d682f302e31"
        .replace(" ", ""))
    assert not cmd.end_stream  # the control stream stays open for the session's lifetime


def test_setup_exchange_and_options(pair: Pair) -> None:
    assert pair.client.control_stream_id == 2 and pair.server.control_stream_id == 3
    assert pair.server.peer_setup is not None and pair.client.peer_setup is not None
    assert pair.client.peer_setup.max_filter_ranges == 16
    assert pair.server.peer_setup.implementation == b"kvconform/0.1"
    assert pair.client.peer_setup.path is None and pair.client.peer_setup.authority is None


def test_request_id_parity_and_bidi_streams(pair: Pair) -> None:
    """Client Request IDs 0, 2, 4 on bidi streams 0, 4, 8; server 1, 3 on 1, 5 (profile §4.3)."""
    reqs = [pair.client.subscribe(NS, NAME), pair.client.fetch(NS, NAME), pair.client.subscribe_namespace(NS)]
    assert [(r.request_id, r.stream_id) for r in reqs] == [(0, 0), (2, 4), (4, 8)]
    sreqs = [pair.server.subscribe_namespace(NS), pair.server.publish_namespace(NS)]
    assert [(r.request_id, r.stream_id) for r in sreqs] == [(1, 1), (3, 5)]
    pair.transfer()
    assert [e.request.request_id for e in only(pair.take("server"), RequestReceived)] == [0, 2, 4]
    assert [e.request.request_id for e in only(pair.take("client"), RequestReceived)] == [1, 3]


# ---------------------------------------------------------------------------------------------------
# Subscriptions, fills and the exactly-once pattern (profile §11)


def test_subscribe_fill_and_subscription_delivery(pair: Pair) -> None:
    req = pair.client.subscribe(NS, NAME, kvcs_subscribe_params())
    pair.transfer()
    (received,) = only(pair.take("server"), RequestReceived)
    fill = received.message.parameters.get(ParamType.FILL_PARAMETERS)
    assert isinstance(fill, FillParameters)
    alias = pair.server.subscribe_ok(received.stream_id, largest=Location(0, 1))
    fill_sid = pair.server.open_fill_stream(received.stream_id, received.request.request_id, fill)
    pair.server.write_fetch_object(fill_sid, FetchObject(0, 0, b"ab", 0, 0))
    pair.server.write_fetch_object(fill_sid, FetchObject(0, 1, b"cd", 0, 0), end_stream=True)
    sg = pair.server.open_subgroup(received.stream_id, 0, 0, 0, first_object=False)
    pair.server.write_object(sg, 2, b"ef")
    pair.server.write_object(sg, 3, status=ObjectStatus.END_OF_GROUP, end_stream=True)
    pair.server.publish_done(received.stream_id, 0x2, "track ended")
    pair.transfer()
    events = pair.take("client")
    assert req.state is RequestState.DONE and req.track_alias == alias and req.largest == Location(0, 1)
    opened = only(events, DataStreamOpened)
    assert [(e.stream_id, e.kind) for e in opened] == [(fill_sid, "fill"), (sg, "subgroup")]
    objects = [(e.kind, e.object.location, getattr(e.object, "status", 0)) for e in only(events, ObjectReceived)]
    assert objects == [("fill", Location(0, 0), 0), ("fill", Location(0, 1), 0), ("subgroup", Location(0, 2), 0),
                       ("subgroup", Location(0, 3), ObjectStatus.END_OF_GROUP)]
    assert [e.reset_code for e in only(events, DataStreamEnded)] == [None, None]
    (done,) = [e.message for e in only(events, MessageReceived) if isinstance(e.message, PublishDone)]
    assert done.stream_count == 2  # subgroup stream + fill fetch stream (profile §6.2)


def test_subgroup_stream_before_subscribe_ok_is_buffered(pair: Pair) -> None:
    """Data may arrive before the SUBSCRIBE_OK that defines its Track Alias (profile §4.1)."""
    req = pair.client.subscribe(NS, NAME)
    pair.transfer()
    (received,) = only(pair.take("server"), RequestReceived)
    pair.server.subscribe_ok(received.stream_id, track_alias=7)
    ok_bytes = pair.server.commands()  # hold SUBSCRIBE_OK back
    sg = pair.server.open_subgroup(received.stream_id, 5, 0, 1)
    pair.server.write_object(sg, 0, b"x", end_stream=True)
    pair.transfer()
    assert not only(pair.take("client"), ObjectReceived)  # held: alias 7 is unknown
    for cmd in ok_bytes:
        assert isinstance(cmd, WriteStream)
        pair.client.receive_stream_data(cmd.stream_id, cmd.data, cmd.end_stream)
    pair.transfer()
    events = pair.take("client")
    (obj,) = only(events, ObjectReceived)
    assert obj.request is req and obj.object.location == Location(5, 0) and obj.object.payload == b"x"
    assert only(events, DataStreamEnded)[0].reset_code is None


@pytest.mark.parametrize("flt", [LocationFilter.none(), LocationFilter.relative_start(2),
                                 LocationFilter.absolute_start(3, 1), LocationFilter.absolute_start_group_end(1, 0, 2),
                                 LocationFilter.absolute_range(1, 2, 3, 4), LocationFilter.next_object()],
                         ids=lambda f: f"type{f.type}")
def test_every_location_filter_type_round_trips(pair: Pair, flt: LocationFilter) -> None:
    pair.client.subscribe(NS, NAME, Parameters.of((ParamType.LOCATION_FILTER, flt)))
    pair.transfer()
    (received,) = only(pair.take("server"), RequestReceived)
    assert received.request.location_filter == flt


def test_fetch_with_range_group_order_and_objectid_filter(pair: Pair) -> None:
    """Profile §11.3 completed-cache recipe: Absolute Start Group End, GROUP_ORDER, OBJECTID_FILTER."""
    params = Parameters.of((ParamType.LOCATION_FILTER, LocationFilter.absolute_start_group_end(2, 0, 3)),
                           (ParamType.GROUP_ORDER, 2), (ParamType.OBJECTID_FILTER, RangeFilter.first_objects(3)))
    req = pair.client.fetch(NS, NAME, params)
    pair.transfer()
    (received,) = only(pair.take("server"), RequestReceived)
    # The profile's byte-exact block, with GROUP_ORDER 0x02 (Descending) instead of 0x01.
    assert received.message.encode_body().endswith(bytes.fromhex("03210302000301020403000002"))
    pair.server.fetch_ok(received.stream_id, Location(5, 2), end_of_track=True)
    sid = pair.server.open_fetch_stream(received.stream_id)
    for g in (5, 4, 3, 2):  # descending groups, ascending objects within each
        for o in range(3):
            pair.server.write_fetch_object(sid, FetchObject(g, o, bytes([g, o])))
    pair.server.end_data_stream(sid)
    pair.transfer()
    events = pair.take("client")
    assert req.state is RequestState.ESTABLISHED
    locations = [e.object.location for e in only(events, ObjectReceived)]
    assert locations == [Location(g, o) for g in (5, 4, 3, 2) for o in range(3)]
    assert only(events, DataStreamOpened)[0].kind == "fetch"


def test_request_update_consumes_an_id_and_carries_a_fill(pair: Pair) -> None:
    req = pair.client.subscribe(NS, NAME, Parameters.of((ParamType.FORWARD, 0)))
    pair.transfer()
    (received,) = only(pair.take("server"), RequestReceived)
    pair.server.subscribe_ok(received.stream_id, largest=Location(1, 0))
    pair.transfer()
    fill = FillParameters.of((ParamType.GROUP_ORDER, 1))
    rid = pair.client.request_update(req.stream_id, Parameters.of((ParamType.FORWARD, 1),
                                                                  (ParamType.FILL_PARAMETERS, fill)))
    assert rid == 2
    pair.transfer()
    (upd,) = [e.message for e in only(pair.take("server"), MessageReceived)]
    assert isinstance(upd, RequestUpdate) and upd.request_id == 2
    pair.server.request_ok(received.stream_id, Parameters.of((ParamType.LARGEST_OBJECT, Location(1, 0))))
    fsid = pair.server.open_fill_stream(received.stream_id, rid, fill)
    pair.server.write_fetch_object(fsid, FetchObject(1, 0, b"z"), end_stream=True)
    pair.transfer()
    events = pair.take("client")
    assert [type(e.message) for e in only(events, MessageReceived)] == [SubscribeOk, RequestOk]
    assert only(events, DataStreamOpened)[0].kind == "fill"
    assert not req.pending_updates


def test_cancel_resets_every_data_stream_including_fill(pair: Pair) -> None:
    """Unsubscribe = cancel the stream; the publisher MUST reset all its data streams (profile §4.4)."""
    req = pair.client.subscribe(NS, NAME, kvcs_subscribe_params())
    pair.transfer()
    (received,) = only(pair.take("server"), RequestReceived)
    pair.server.subscribe_ok(received.stream_id, largest=Location(0, 0))
    fill_sid = pair.server.open_fill_stream(received.stream_id, 0, None)
    pair.server.write_fetch_object(fill_sid, FetchObject(0, 0, b"a"))
    sg = pair.server.open_subgroup(received.stream_id, 1)
    pair.server.write_object(sg, 0, b"b")
    pair.transfer()
    pair.client.cancel(req.stream_id)
    pair.transfer()
    resets = {c.stream_id: c.code for c in pair.sent["server"] if isinstance(c, ResetStream)}
    assert resets[fill_sid] == StreamResetCode.CANCELLED and resets[sg] == StreamResetCode.CANCELLED
    assert received.request.state is RequestState.CANCELLED
    stops = [c for c in pair.sent["client"] if isinstance(c, StopSending)]
    assert [s.stream_id for s in stops] == [req.stream_id]


def test_namespace_flow_and_publish_namespace(pair: Pair) -> None:
    prefix = TrackNamespace.of("kvcs-1", "scope")
    req = pair.client.subscribe_namespace(prefix)
    pub = pair.client.publish_namespace(NS)
    pair.transfer()
    sub_ev, pub_ev = only(pair.take("server"), RequestReceived)
    pair.server.request_ok(sub_ev.stream_id)
    pair.server.send_namespace(sub_ev.stream_id, TrackNamespace.of("pub"))
    pair.server.send_namespace_done(sub_ev.stream_id, TrackNamespace.of("pub"))
    pair.server.request_ok(pub_ev.stream_id)
    pair.transfer()
    msgs = [type(e.message) for e in only(pair.take("client"), MessageReceived)]
    assert msgs == [RequestOk, Namespace, NamespaceDone, RequestOk]
    assert req.state is RequestState.ESTABLISHED and not req.namespaces and pub.state is RequestState.ESTABLISHED
    with pytest.raises(SessionUsageError, match="never announced"):
        pair.server.send_namespace_done(sub_ev.stream_id, TrackNamespace.of("other"))


def test_goaway_on_control_stream(pair: Pair) -> None:
    pair.server.goaway(b"moqt://other:4443", 1000)
    pair.transfer()
    (ev,) = only(pair.take("client"), GoawayReceived)
    assert ev.stream_id is None and ev.message == Goaway(b"moqt://other:4443", 1000)
    with pytest.raises(SessionUsageError, match="GOAWAY"):
        pair.client.subscribe(NS, NAME)  # no new requests after GOAWAY


def test_track_properties_and_max_cache_duration_pass_through(pair: Pair) -> None:
    props = (KeyValuePair(PropertyType.MAX_CACHE_DURATION, 3_600_000),
             KeyValuePair(PropertyType.DEFAULT_PUBLISHER_GROUP_ORDER, 2))
    req = pair.client.subscribe(NS, NAME)
    pair.transfer()
    (received,) = only(pair.take("server"), RequestReceived)
    pair.server.subscribe_ok(received.stream_id, track_properties=props)
    pair.transfer()
    assert req.track_properties == props
    assert req.group_order() == 2  # the track default applies when SUBSCRIBE has no GROUP_ORDER


def test_range_filters_beyond_max_filter_ranges_get_invalid_filter() -> None:
    """MAX_FILTER_RANGES exceeded -> REQUEST_ERROR INVALID_FILTER (0x36), not a session close (§5)."""
    p = make_pair(server_config=SessionConfig(Role.SERVER, max_filter_ranges=1))
    two = RangeFilter(ParamType.OBJECTID_FILTER, 0, ((0, 1), (5, 6)))
    with pytest.raises(SessionUsageError, match="MAX_FILTER_RANGES is 1"):
        p.client.subscribe(NS, NAME, Parameters.of((ParamType.OBJECTID_FILTER, two)))
    raw = Subscribe(0, NS, NAME, Parameters.of((ParamType.OBJECTID_FILTER, two))).encode()
    sid = p.client.open_raw_stream(raw)
    p.transfer()
    (rejected,) = only(p.take("server"), RequestAutoRejected)
    assert rejected.code == 0x36 and "MAX_FILTER_RANGES is 1" in rejected.reason
    answers = [e.message for e in only(p.take("client"), MessageReceived) if e.stream_id == sid]
    assert isinstance(answers[0], RequestError) and answers[0].error_code == 0x36
    assert p.server.closed is None


# ---------------------------------------------------------------------------------------------------
# Protocol violations close the session with the profile's termination code


def violation(p: Pair, side: str, code: int, *reason_parts: str) -> None:
    p.transfer()
    closed = p.closed_by(side)
    assert closed.code == code, f"closed with 0x{closed.code:x} ({closed.reason}), expected 0x{code:x}"
    for part in reason_parts:
        assert part in closed.reason, f"{part!r} not in reason {closed.reason!r}"
    peer = p.server if side == "client" else p.client
    assert peer.closed is not None and peer.closed.by_peer and peer.closed.code == code


def test_wrong_request_id_parity_is_invalid_request_id(pair: Pair) -> None:
    pair.client.open_raw_stream(Subscribe(1, NS, NAME).encode())
    violation(pair, "server", SessionError.INVALID_REQUEST_ID, "Request ID 1", "parity")


def test_duplicate_request_id_is_invalid_request_id(pair: Pair) -> None:
    pair.client.open_raw_stream(Subscribe(0, NS, NAME).encode())
    pair.client.open_raw_stream(Subscribe(0, NS, b"other").encode())
    violation(pair, "server", SessionError.INVALID_REQUEST_ID, "Request ID 0", "duplicate")


def test_unknown_message_type_closes(pair: Pair) -> None:
    pair.client.open_raw_stream(craft.unknown_type())
    violation(pair, "server", SessionError.PROTOCOL_VIOLATION, "Message Type", "0x3f")


def test_response_cannot_open_a_request_stream(pair: Pair) -> None:
    pair.client.open_raw_stream(SubscribeOk(1).encode())
    violation(pair, "server", SessionError.PROTOCOL_VIOLATION, "cannot open a request stream")


def test_message_length_mismatch_closes(pair: Pair) -> None:
    pair.client.open_raw_stream(craft.wrong_length(Subscribe(0, NS, NAME), +1) + b"\x00")
    violation(pair, "server", SessionError.PROTOCOL_VIOLATION, "Length")


def test_fin_inside_a_message_closes(pair: Pair) -> None:
    data = Subscribe(0, NS, NAME).encode()
    pair.client.open_raw_stream(data[:-2], end_stream=True)
    violation(pair, "server", SessionError.PROTOCOL_VIOLATION, "ended inside a message")


def test_control_stream_fin_closes(pair: Pair) -> None:
    assert pair.client.control_stream_id is not None
    pair.client.send_raw(pair.client.control_stream_id, b"", end_stream=True)
    violation(pair, "server", SessionError.PROTOCOL_VIOLATION, "control stream", "FIN")


def test_control_stream_reset_closes(pair: Pair) -> None:
    assert pair.client.control_stream_id is not None
    pair.client.reset_raw(pair.client.control_stream_id, 0)
    violation(pair, "server", SessionError.PROTOCOL_VIOLATION, "reset its control stream")


def test_only_goaway_after_setup_on_control_stream(pair: Pair) -> None:
    assert pair.client.control_stream_id is not None
    pair.client.send_raw(pair.client.control_stream_id, Subscribe(0, NS, NAME).encode())
    violation(pair, "server", SessionError.PROTOCOL_VIOLATION, "only GOAWAY")


def test_second_goaway_closes(pair: Pair) -> None:
    assert pair.server.control_stream_id is not None
    pair.server.goaway()
    pair.server.send_raw(pair.server.control_stream_id, Goaway().encode())
    violation(pair, "client", SessionError.PROTOCOL_VIOLATION, "second GOAWAY")


def test_client_goaway_with_uri_closes(pair: Pair) -> None:
    assert pair.client.control_stream_id is not None
    pair.client.send_raw(pair.client.control_stream_id, Goaway(b"moqt://x").encode())
    violation(pair, "server", SessionError.PROTOCOL_VIOLATION, "New Session URI")


def test_unknown_uni_stream_type_closes(pair: Pair) -> None:
    pair.client.open_raw_stream(b"\x01\x02", unidirectional=True)
    violation(pair, "server", SessionError.PROTOCOL_VIOLATION, "Stream Type", "0x1")


def test_second_control_stream_closes(pair: Pair) -> None:
    pair.client.open_raw_stream(Setup.build().encode(), unidirectional=True)
    violation(pair, "server", SessionError.PROTOCOL_VIOLATION, "second control stream")


def test_server_sending_path_is_invalid_path() -> None:
    p = Pair(Session(SessionConfig(Role.CLIENT)), Session(SessionConfig(Role.SERVER, send_setup=False)))
    p.client.start()
    p.server.start()
    p.server.open_raw_stream(Setup.build(path=b"/x").encode(), unidirectional=True)
    violation(p, "client", SessionError.INVALID_PATH, "SETUP.PATH")


@pytest.mark.parametrize(("path", "code"), [("kvcs", SessionError.MALFORMED_PATH),
                                            ("/other", SessionError.INVALID_PATH)])
def test_client_path_checks(path: str, code: int) -> None:
    p = Pair(Session(SessionConfig(Role.CLIENT, path=path)),
             Session(SessionConfig(Role.SERVER, accept_paths=frozenset({"/kvcs"}))))
    p.client.start()
    p.server.start()
    violation(p, "server", code, "SETUP.PATH", repr(path))


def test_malformed_authority() -> None:
    p = Pair(Session(SessionConfig(Role.CLIENT, authority="host:port:x")), Session(SessionConfig(Role.SERVER)))
    p.client.start()
    p.server.start()
    violation(p, "server", SessionError.MALFORMED_AUTHORITY, "SETUP.AUTHORITY")


def test_undecodable_setup_token_is_key_value_formatting_error() -> None:
    p = Pair(Session(SessionConfig(Role.CLIENT, send_setup=False)), Session(SessionConfig(Role.SERVER)))
    p.client.start()
    p.server.start()
    bad = Setup((KeyValuePair(0x03, b"\x07"),))  # Alias Type 7 does not exist
    p.client.open_raw_stream(bad.encode(), unidirectional=True)
    violation(p, "server", SessionError.KEY_VALUE_FORMATTING_ERROR, "Alias Type")


def test_second_subscribe_ok_closes(pair: Pair) -> None:
    pair.client.subscribe(NS, NAME)
    pair.transfer()
    (received,) = only(pair.take("server"), RequestReceived)
    pair.server.subscribe_ok(received.stream_id)
    pair.server.send_raw(received.stream_id, SubscribeOk(9).encode())
    violation(pair, "client", SessionError.PROTOCOL_VIOLATION, "SUBSCRIBE_OK", "exactly one")


def test_namespace_done_before_namespace_closes(pair: Pair) -> None:
    pair.client.subscribe_namespace(NS)
    pair.transfer()
    (received,) = only(pair.take("server"), RequestReceived)
    pair.server.request_ok(received.stream_id)
    pair.server.send_raw(received.stream_id, NamespaceDone(TrackNamespace.of("x")).encode())
    violation(pair, "client", SessionError.PROTOCOL_VIOLATION, "NAMESPACE_DONE", "that no NAMESPACE has announced")


def test_a_second_namespace_done_for_one_namespace_closes(pair: Pair) -> None:
    """aiomoqt 0.13.3 sends NAMESPACE_DONE twice when a publisher leaves (docs/interop-aiomoqt.md #18)."""
    pair.client.subscribe_namespace(NS)
    pair.transfer()
    (received,) = only(pair.take("server"), RequestReceived)
    pair.server.request_ok(received.stream_id)
    for msg in (Namespace(TrackNamespace.of("x")), NamespaceDone(TrackNamespace.of("x"))):
        pair.server.send_raw(received.stream_id, msg.encode())
    pair.transfer()
    pair.take("client")
    pair.server.send_raw(received.stream_id, NamespaceDone(TrackNamespace.of("x")).encode())
    violation(pair, "client", SessionError.PROTOCOL_VIOLATION, "NAMESPACE_DONE", "again: it was done already")


def test_fetch_header_for_unknown_request_closes(pair: Pair) -> None:
    pair.server.open_raw_stream(bytes([0x05, 40]), unidirectional=True)
    violation(pair, "client", SessionError.PROTOCOL_VIOLATION, "FETCH_HEADER", "Request ID 40")


def test_duplicate_track_alias_closes(pair: Pair) -> None:
    pair.client.subscribe(NS, NAME)
    pair.client.subscribe(NS, b"other")
    pair.transfer()
    first, second = only(pair.take("server"), RequestReceived)
    pair.server.subscribe_ok(first.stream_id, track_alias=4)
    pair.server.subscribe_ok(second.stream_id, track_alias=4)
    violation(pair, "client", SessionError.DUPLICATE_TRACK_ALIAS, "Track Alias 4")


def test_too_many_request_updates() -> None:
    p = make_pair(server_config=SessionConfig(Role.SERVER, max_request_updates=1))
    req = p.client.subscribe(NS, NAME)
    p.transfer()
    (received,) = only(p.take("server"), RequestReceived)
    p.server.subscribe_ok(received.stream_id)
    p.transfer()
    p.client.request_update(req.stream_id, Parameters.of((ParamType.SUBSCRIBER_PRIORITY, 1)))
    with pytest.raises(SessionUsageError, match="MAX_REQUEST_UPDATES is 1"):  # the checked path refuses
        p.client.request_update(req.stream_id, Parameters.of((ParamType.SUBSCRIBER_PRIORITY, 2)))
    second = RequestUpdate(p.client.next_request_id(), Parameters.of((ParamType.SUBSCRIBER_PRIORITY, 2)))
    p.client.send_raw(req.stream_id, second.encode())
    violation(p, "server", SessionError.TOO_MANY_REQUEST_UPDATES, "MAX_REQUEST_UPDATES is 1")


def test_fin_inside_subgroup_object_closes(pair: Pair) -> None:
    pair.client.subscribe(NS, NAME)
    pair.transfer()
    (received,) = only(pair.take("server"), RequestReceived)
    pair.server.subscribe_ok(received.stream_id, track_alias=1)
    writer = SubgroupStreamWriter(SubgroupHeader.build(1, 0, 0, 0))
    data = writer.header() + writer.object(SubgroupObject(0, b"abcd"))
    pair.server.open_raw_stream(data[:-1], unidirectional=True, end_stream=True)
    violation(pair, "client", SessionError.PROTOCOL_VIOLATION, "subgroup stream", "FIN inside")


def test_usage_errors_refuse_illegal_sends(pair: Pair) -> None:
    req = pair.client.subscribe(NS, NAME)
    with pytest.raises(SessionUsageError):
        pair.client.subscribe_ok(req.stream_id)  # we are the requester, not the publisher
    with pytest.raises(SessionUsageError, match="empty New Session URI"):
        pair.client.goaway(b"moqt://elsewhere")


def test_publish_flow_objects_before_publish_ok(pair: Pair) -> None:
    """PUBLISH: objects may start before PUBLISH_OK; PUBLISH_DONE last (profile §4.4, §6.2)."""
    req = pair.server.publish(NS, NAME, Parameters.of((ParamType.LARGEST_OBJECT, Location(0, 0))))
    sg = pair.server.open_subgroup(req.stream_id, 1)
    pair.server.write_object(sg, 0, b"p", end_stream=True)
    pair.transfer()
    events = pair.take("client")
    (received,) = only(events, RequestReceived)
    assert received.request.track_alias == req.track_alias and received.request.largest == Location(0, 0)
    (obj,) = only(events, ObjectReceived)
    assert obj.request is received.request and obj.object.payload == b"p"
    pair.client.request_ok(received.stream_id)  # PUBLISH_OK
    pair.transfer()
    assert [type(e.message) for e in only(pair.take("server"), MessageReceived)] == [RequestOk]
    assert isinstance(req.response, RequestOk) and req.state is RequestState.ESTABLISHED
    rid = pair.client.request_update(received.stream_id, Parameters.of((ParamType.FORWARD, 0)))
    pair.transfer()
    (upd,) = [e.message for e in only(pair.take("server"), MessageReceived)]
    assert isinstance(upd, RequestUpdate) and upd.request_id == rid and rid % 2 == 0
    pair.server.request_ok(req.stream_id)
    pair.server.publish_done(req.stream_id, 0x2)
    pair.transfer()
    msgs = [e.message for e in only(pair.take("client"), MessageReceived)]
    assert [type(m) for m in msgs] == [RequestOk, PublishDone] and msgs[1].stream_count == 1
    assert received.request.state is RequestState.DONE


def test_subscribe_rejected_then_fin(pair: Pair) -> None:
    req = pair.client.subscribe(NS, NAME)
    pair.transfer()
    (received,) = only(pair.take("server"), RequestReceived)
    pair.server.reject(received.stream_id, 0x10, "no such track", retry_interval=0)
    pair.transfer()
    (msg,) = [e.message for e in only(pair.take("client"), MessageReceived)]
    assert isinstance(msg, RequestError) and msg.error_code == 0x10 and msg.reason == b"no such track"
    assert req.state is RequestState.FAILED and req.peer_fin


def test_goaway_on_a_request_stream(pair: Pair) -> None:
    req = pair.client.subscribe(NS, NAME)
    pair.transfer()
    (received,) = only(pair.take("server"), RequestReceived)
    pair.server.subscribe_ok(received.stream_id)
    pair.server.goaway(b"", 500, stream_id=received.stream_id)
    pair.transfer()
    (ev,) = only(pair.take("client"), GoawayReceived)
    assert ev.stream_id == req.stream_id and ev.message.timeout == 500 and req.goaway_received
    pair.server.send_raw(received.stream_id, Goaway().encode())
    violation(pair, "client", SessionError.PROTOCOL_VIOLATION, "second GOAWAY on request stream")


@settings(max_examples=40, deadline=None)
@given(cuts=st.lists(st.integers(min_value=1, max_value=7), min_size=1, max_size=40))
def test_events_do_not_depend_on_how_stream_bytes_are_split(cuts: list[int]) -> None:
    """Incremental parsing: delivering every stream write in arbitrary fragments gives the same events."""

    def scenario(split: list[int] | None) -> list[str]:
        client, server = Session(SessionConfig(Role.CLIENT, path="/p")), Session(SessionConfig(Role.SERVER))
        sizes = iter(split or [])

        def move(src: Session, dst: Session) -> int:
            commands = src.commands()
            for cmd in commands:
                if isinstance(cmd, WriteStream):
                    data = cmd.data
                    while split is not None and len(data) > 1:
                        n = next(sizes, 3)
                        dst.receive_stream_data(cmd.stream_id, data[:n], False)
                        data = data[n:]
                    dst.receive_stream_data(cmd.stream_id, data, cmd.end_stream)
            return len(commands)

        client.start()
        server.start()
        req = client.subscribe(NS, NAME, kvcs_subscribe_params())
        while move(client, server) + move(server, client):
            pass
        (received,) = only(server.events(), RequestReceived)
        server.subscribe_ok(received.stream_id, largest=Location(0, 1))
        fsid = server.open_fill_stream(received.stream_id, 0, None)
        server.write_fetch_object(fsid, FetchObject(0, 0, b"abc", 0, 1))
        server.write_fetch_object(fsid, FetchObject(0, 1, b"", 0, 1), end_stream=True)
        sg = server.open_subgroup(received.stream_id, 1, 0, 9, properties=True)
        server.write_object(sg, 0, b"x" * 200, properties=bytes([0x3C, 1]))
        server.write_object(sg, 1, status=ObjectStatus.END_OF_GROUP, end_stream=True)
        server.publish_done(received.stream_id, 2)
        while move(client, server) + move(server, client):
            pass
        assert client.closed is None and req.state is RequestState.DONE
        return [repr(e) for e in client.events()]

    assert scenario(cuts) == scenario(None)


def test_publish_with_unknown_mandatory_track_property_is_refused(pair: Pair) -> None:
    """Profile §8: PUBLISH of a track with a Mandatory Track Property we do not know -> 0x33."""
    pair.server.publish(NS, NAME, track_properties=(KeyValuePair(0x4000, 1),))
    pair.transfer()
    (rejected,) = only(pair.take("client"), RequestAutoRejected)
    assert rejected.code == 0x33 and "0x4000" in rejected.reason
    (msg,) = [e.message for e in only(pair.take("server"), MessageReceived)]
    assert isinstance(msg, RequestError) and msg.error_code == 0x33


def test_raw_request_streams_are_typed_when_they_parse(pair: Pair) -> None:
    """A raw PUBLISH_NAMESPACE is validated as one (REQUEST_OK is its answer); garbage is not judged."""
    good = pair.client.open_raw_stream(PublishNamespace(0, NS).encode())
    bad = pair.client.open_raw_stream(b"\x06\x00")  # a truncated request: no type to check answers by
    assert pair.client.requests[bad].message.__class__ is RawRequestMessage
    pair.transfer()
    (received,) = only(pair.take("server"), RequestReceived)
    pair.server.request_ok(received.stream_id)
    pair.transfer()
    (ok,) = only(pair.take("client"), MessageReceived)
    assert ok.stream_id == good and isinstance(ok.message, RequestOk)
    assert pair.client.requests[good].state is RequestState.ESTABLISHED


_PIECES = [
    Subscribe(0, NS, NAME, kvcs_subscribe_params()).encode(), Subscribe(1, NS, NAME).encode(), SubscribeOk(1).encode(),
    RequestOk().encode(), RequestError(0x10).encode(), PublishDone(2, 0).encode(), Goaway().encode(),
    Namespace(TrackNamespace.of("a")).encode(), NamespaceDone(TrackNamespace.of("a")).encode(),
    RequestUpdate(2, Parameters()).encode(), Setup.build().encode(), craft.unknown_type(),
    bytes.fromhex("50 01 03 0c 00 04 41424344 0000 03".replace(" ", "")), bytes.fromhex("0500 1c00000002 6162"),
]


@settings(max_examples=150, deadline=None)
@given(st.lists(st.tuples(st.booleans(), st.sampled_from([0, 1, 2, 3, 4, 5, 6, 7, 9, 11]),
                          st.one_of(st.sampled_from(_PIECES), st.binary(max_size=12)),
                          st.booleans(), st.sampled_from(["data", "data", "reset", "stop"])), max_size=12))
def test_arbitrary_peer_input_never_crashes_the_session(steps: list[tuple[bool, int, bytes, bool, str]]) -> None:
    """Whatever the peer sends, the session either carries on or closes with a registered code."""
    p = make_pair()
    p.client.subscribe(NS, NAME)
    p.transfer()
    for to_client, stream, data, fin, action in steps:
        target = p.client if to_client else p.server
        if action == "reset":
            target.receive_stream_reset(stream, 1)
        elif action == "stop":
            target.receive_stop_sending(stream, 1)
        else:
            target.receive_stream_data(stream, data, fin)
        target.commands()
        target.events()
    for closed in (p.client.closed, p.server.closed):
        assert closed is None or (closed.code in set(SessionError) and closed.reason)


def test_subscribe_tracks_with_publish_skipped_and_state_notify(pair: Pair) -> None:
    req = pair.client.subscribe_tracks(TrackNamespace.of("kvcs-1"))
    pair.transfer()
    (received,) = only(pair.take("server"), RequestReceived)
    pair.server.request_ok(received.stream_id)
    pair.server.send_publish_skipped(received.stream_id, TrackNamespace.of("x"), b"t")
    pub = pair.server.publish(NS, NAME)
    pair.server.publish_state_notify(pub.stream_id, Parameters.of((ParamType.FORWARD, 0)))
    pair.transfer()
    events = pair.take("client")
    msgs = [type(e.message).__name__ for e in only(events, MessageReceived)]
    assert msgs == ["RequestOk", "PublishSkipped", "PublishStateNotify"]
    assert req.state is RequestState.ESTABLISHED and len(only(events, RequestReceived)) == 1


def test_send_priority_orders_streams_as_profile_11_1(pair: Pair) -> None:
    """control < request < data; data by subscriber priority, publisher priority, group, fill first."""
    urgent = pair.client.subscribe(NS, NAME, Parameters.of((ParamType.SUBSCRIBER_PRIORITY, 10)))
    relaxed = pair.client.subscribe(NS, b"other")
    pair.transfer()
    a, b = only(pair.take("server"), RequestReceived)
    for ev in (a, b):
        pair.server.subscribe_ok(ev.stream_id, largest=Location(0, 0))
    s = pair.server
    late_group = s.open_subgroup(a.stream_id, 5, 0, 1)
    early_group = s.open_subgroup(a.stream_id, 4, 0, 1)
    low_pub = s.open_subgroup(a.stream_id, 9, 0, 0)
    fill = s.open_fill_stream(a.stream_id, 0, None)
    other = s.open_subgroup(b.stream_id, 0, 0, 0)
    assert s.control_stream_id is not None
    order = sorted([other, late_group, fill, early_group, low_pub, a.stream_id, s.control_stream_id],
                   key=s.send_priority)
    assert order == [s.control_stream_id, a.stream_id, fill, low_pub, early_group, late_group, other]
    assert (urgent.stream_id, relaxed.stream_id) == (a.stream_id, b.stream_id)
    pair.client.request_update(relaxed.stream_id, Parameters.of((ParamType.SUBSCRIBER_PRIORITY, 1)))
    pair.transfer()
    assert s.send_priority(other) < s.send_priority(fill)  # REQUEST_UPDATE changed the subscriber priority
