"""The async MOQT API end to end over QUIC on 127.0.0.1: publish/subscribe with fills (exactly once),
every location filter, fetch ranges, namespaces, updates, cancellation and the raw escape hatch."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Iterator

import pytest

from kvconform.moqt import client as mc
from kvconform.moqt import craft, quic
from kvconform.moqt.data import GroupOrder, ObjectStatus
from kvconform.moqt.errors import PublishDoneCode, RequestErrorCode, SessionError, StreamResetCode
from kvconform.moqt.filters import LocationFilter, RangeFilter
from kvconform.moqt.messages import Subscribe
from kvconform.moqt.parameters import FillParameters, Parameters
from kvconform.moqt.session import RequestReceived, RequestState, Role, SessionConfig, SessionUsageError
from kvconform.moqt.structures import KeyValuePair, Location, ParamType, PropertyType, TrackNamespace, encode_kvps

TIMEOUT = 5.0
NS = TrackNamespace.of("kvcs-1", "scope", "compat", "anchor", "pub1")
NAME = b"k.raw.s0"

Scenario = Callable[[mc.MoqtClient, mc.MoqtClient], Awaitable[None]]


@pytest.fixture
def loop() -> Iterator[quic.LoopThread]:
    thread = quic.LoopThread()
    yield thread
    thread.close()


@pytest.fixture
def run(loop: quic.LoopThread) -> Iterator[Callable[[Scenario], None]]:
    """Run `scenario(subscriber, publisher)`: a client connected to a served endpoint, both MoqtClients."""
    servers: list[quic.MoqtServer] = []

    def go(scenario: Scenario) -> None:
        async def main() -> None:
            accepted: asyncio.Queue[mc.MoqtClient] = asyncio.Queue()

            async def handler(server_side: mc.MoqtClient) -> None:
                accepted.put_nowait(server_side)

            server = await mc.serve("127.0.0.1", 0, handler, timeout=TIMEOUT)
            servers.append(server)
            client = await mc.connect(server.url + "/kvcs", timeout=TIMEOUT)
            publisher = await asyncio.wait_for(accepted.get(), TIMEOUT)
            try:
                await scenario(client, publisher)
            finally:
                await client.close(timeout=TIMEOUT)

        loop.run(main(), timeout=20.0)

    yield go
    for server in servers:
        loop.run(server.close())


def groups(track: mc.LocalTrack, first: int, last: int, per_group: int = 2) -> None:
    for g in range(first, last + 1):
        track.publish_group(g, [bytes([g, o]) for o in range(per_group)], priority=g)


def locations(objects: list[mc.ReceivedObject]) -> list[tuple[int, int]]:
    return [(o.location.group, o.location.object) for o in objects]


# ---------------------------------------------------------------------------------------------------


def test_subscribe_with_fill_delivers_every_object_exactly_once(run: Callable[[Scenario], None]) -> None:
    """Profile §11.4: fill objects <= L, subscription objects > L, no Location twice, counts match."""
    async def scenario(sub_client: mc.MoqtClient, pub: mc.MoqtClient) -> None:
        track = pub.track(NS, NAME)
        groups(track, 0, 1)
        sub = await sub_client.subscribe_with_fill(NS, NAME)
        assert sub.largest == Location(1, 2)  # End of Group of group 1 is the largest object
        assert await sub.wait_fill() == "fin"
        groups(track, 2, 3)
        track.end_track()
        done = await sub.wait_complete()
        assert done.status_code == PublishDoneCode.TRACK_ENDED
        assert done.stream_count == sub.streams_seen() == 4  # fill + groups 2, 3 + End of Track stream
        assert sub.violations == []
        fill = [o for o in sub.objects if o.kind == "fill"]
        live = [o for o in sub.objects if o.kind == "subgroup"]
        assert locations(fill) == [(0, 0), (0, 1), (1, 0), (1, 1)]  # no status objects on a fill (§9.3)
        assert locations(live) == [(2, 0), (2, 1), (2, 2), (3, 0), (3, 1), (3, 2), (4, 0)]
        assert [o.status for o in live if o.status] == [ObjectStatus.END_OF_GROUP] * 2 + [ObjectStatus.END_OF_TRACK]
        assert sub.payloads() == {Location(g, o): bytes([g, o]) for g in range(4) for o in range(2)}
        assert [o.publisher_priority for o in live if o.location.object == 0] == [2, 3, 128]  # EoT: default

    run(scenario)


EXPECTED = {
    "none": [(g, o) for g in (2, 3, 4) for o in range(3)] + [(5, 0)],
    "relative_start": [(g, o) for g in (2, 3, 4) for o in range(3)] + [(5, 0)],
    "absolute_start": [(3, 1), (3, 2), (4, 0), (4, 1), (4, 2), (5, 0)],
    "absolute_start_group_end": [(g, o) for g in (2, 3) for o in range(3)],
    "absolute_range": [(2, 1), (2, 2), (3, 0)],
    "next_object": [(g, o) for g in (2, 3, 4) for o in range(3)] + [(5, 0)],
}
FILTERS = {
    "none": LocationFilter.none(),
    "relative_start": LocationFilter.relative_start(1),
    "absolute_start": LocationFilter.absolute_start(3, 1),
    "absolute_start_group_end": LocationFilter.absolute_start_group_end(2, 0, 1),
    "absolute_range": LocationFilter.absolute_range(2, 1, 1, 0),
    "next_object": LocationFilter.next_object(),
}


@pytest.mark.parametrize("name", list(FILTERS))
def test_location_filters_select_subscription_objects(run: Callable[[Scenario], None], name: str) -> None:
    """Profile §7.3: subscription delivery = objects published after SUBSCRIBE that pass the filter."""
    async def scenario(sub_client: mc.MoqtClient, pub: mc.MoqtClient) -> None:
        track = pub.track(NS, NAME)
        groups(track, 0, 1)
        sub = await sub_client.subscribe(NS, NAME, location_filter=FILTERS[name])
        groups(track, 2, 4)
        track.end_track()
        await sub.wait_complete()
        assert locations(sub.objects) == EXPECTED[name]
        assert sub.violations == []

    run(scenario)


def test_fetch_range_descending_with_objectid_filter(run: Callable[[Scenario], None]) -> None:
    """Profile §11.3 completed-cache FETCH: groups 2..5, first 3 objects, FETCH_OK End Location {5,3}."""
    async def scenario(client: mc.MoqtClient, pub: mc.MoqtClient) -> None:
        groups(pub.track(NS, NAME), 0, 6, per_group=4)
        result = await client.fetch(NS, NAME, location_filter=LocationFilter.absolute_start_group_end(2, 0, 3),
                                    group_order=GroupOrder.DESCENDING, range_filters=[RangeFilter.first_objects(3)])
        ok = await result.wait_ok()
        assert ok.end_location == Location(5, 3) and ok.end_of_track == 0
        assert locations(result.objects) == [(g, o) for g in (5, 4, 3, 2) for o in range(3)]
        assert all(o.payload == bytes(o.location.__dict__.values()) for o in result.objects)

    run(scenario)


def test_fetch_end_of_track(run: Callable[[Scenario], None]) -> None:
    async def scenario(client: mc.MoqtClient, pub: mc.MoqtClient) -> None:
        track = pub.track(NS, NAME)
        groups(track, 0, 1)
        track.end_track()
        result = await client.fetch(NS, NAME)
        ok = await result.wait_ok()
        assert ok.end_of_track == 1 and ok.end_location == Location(1, 1)
        assert locations(result.objects) == [(0, 0), (0, 1), (1, 0), (1, 1)]

    run(scenario)


@pytest.mark.parametrize(("publish", "code"), [(False, RequestErrorCode.DOES_NOT_EXIST),
                                               (True, RequestErrorCode.INVALID_RANGE)])
def test_fetch_refusals(run: Callable[[Scenario], None], publish: bool, code: int) -> None:
    """No such track -> DOES_NOT_EXIST; an empty track -> INVALID_RANGE (profile §7.3)."""
    async def scenario(client: mc.MoqtClient, pub: mc.MoqtClient) -> None:
        if publish:
            pub.track(NS, NAME)
        with pytest.raises(mc.RequestRejected) as info:
            await client.fetch(NS, NAME)
        assert info.value.code == code

    run(scenario)


def test_forward_zero_then_update_with_fill(run: Callable[[Scenario], None]) -> None:
    """FORWARD 0: nothing is sent; REQUEST_UPDATE FORWARD 1 + FILL_PARAMETERS opens a fill stream
    carrying the update's Request ID, then live objects flow (profile §11.1, §11.2)."""
    async def scenario(client: mc.MoqtClient, pub: mc.MoqtClient) -> None:
        track = pub.track(NS, NAME)
        groups(track, 0, 0)
        sub = await client.subscribe(NS, NAME, forward=0, fill=True)
        groups(track, 1, 1)
        assert sub.fills == {}  # Forward 0: no fill stream either
        fill = FillParameters.of((ParamType.LOCATION_FILTER, LocationFilter.absolute_start(0, 0)),
                                 (ParamType.GROUP_ORDER, 1))
        ok = await sub.update(Parameters.of((ParamType.FORWARD, 1), (ParamType.FILL_PARAMETERS, fill)))
        assert ok.largest_object == Location(1, 2)
        assert await sub.wait_fill() == "fin"
        groups(track, 2, 2)
        track.end_track()
        await sub.wait_complete()
        assert [o.location.group for o in sub.objects if o.kind == "fill"] == [0, 0, 1, 1]
        assert locations([o for o in sub.objects if o.kind == "subgroup"]) == [(2, 0), (2, 1), (2, 2), (3, 0)]
        assert sub.violations == []

    run(scenario)


def test_cancel_subscription_resets_its_data_streams(run: Callable[[Scenario], None]) -> None:
    async def scenario(client: mc.MoqtClient, pub: mc.MoqtClient) -> None:
        track = pub.track(NS, NAME)
        sub = await client.subscribe(NS, NAME)
        track.publish_object(0, 0, b"first")  # the subgroup stream stays open (no End of Group)
        obj = await sub.next_object()
        assert obj.payload == b"first"
        sub.cancel()
        await sub.wait_streams_closed()
        assert set(sub.subgroup_streams.values()) == {"reset"}

    run(scenario)


def test_stop_sending_on_a_subgroup_stream_is_not_reopened(run: Callable[[Scenario], None]) -> None:
    """STOP_SENDING -> the publisher resets the stream and does not reopen it (profile §9.2)."""
    async def scenario(client: mc.MoqtClient, pub: mc.MoqtClient) -> None:
        track = pub.track(NS, NAME)
        sub = await client.subscribe(NS, NAME)
        track.publish_object(0, 0, b"a")
        first = await sub.next_object()
        client.session.stop_raw(first.stream_id, StreamResetCode.CANCELLED)
        await sub.wait_streams_closed()
        assert sub.subgroup_streams == {first.stream_id: "reset"}
        track.publish_object(0, 1, b"b")  # same subgroup: dropped
        groups(track, 1, 1)  # another group: a new stream
        track.end_track()
        await sub.wait_complete()
        assert locations(sub.objects) == [(0, 0), (1, 0), (1, 1), (1, 2), (2, 0)]

    run(scenario)


def test_subscribe_namespace_and_prefix_overlap(run: Callable[[Scenario], None]) -> None:
    async def scenario(client: mc.MoqtClient, pub: mc.MoqtClient) -> None:
        pub.track(NS, NAME)
        prefix = TrackNamespace(NS.fields[:4])
        nsub = await client.subscribe_namespace(prefix)
        assert await nsub.next() == ("namespace", TrackNamespace.of("pub1"))
        pub.track(TrackNamespace((*NS.fields[:4], b"pub2")), b"manifest")
        assert await nsub.next() == ("namespace", TrackNamespace.of("pub2"))
        with pytest.raises(mc.RequestRejected) as info:
            await client.subscribe_namespace(TrackNamespace(NS.fields[:2]))  # a prefix of the active one
        assert info.value.code == RequestErrorCode.PREFIX_OVERLAP
        sibling = await client.subscribe_namespace(TrackNamespace((*NS.fields[:3], b"other")))
        assert sibling.request.namespaces == set()

    run(scenario)


def test_publish_namespace_and_track_status(run: Callable[[Scenario], None]) -> None:
    async def scenario(client: mc.MoqtClient, pub: mc.MoqtClient) -> None:
        props = (KeyValuePair(PropertyType.MAX_CACHE_DURATION, 60_000),)
        track = pub.track(NS, NAME, properties=props)
        groups(track, 0, 0)
        handle = await client.publish_namespace(TrackNamespace.of("kvcs-1", "mine"))
        assert list(pub.peer_namespaces.values()) == [TrackNamespace.of("kvcs-1", "mine")]
        status = await client.track_status(NS, NAME)
        assert status.largest_object == Location(0, 2) and status.track_properties == props
        sub = await client.subscribe(NS, NAME)
        assert sub.ok is not None and sub.ok.track_properties == props  # MAX_CACHE_DURATION passes through
        handle.cancel()

    run(scenario)


def test_subscriber_priority_reaches_the_publisher(run: Callable[[Scenario], None]) -> None:
    async def scenario(client: mc.MoqtClient, pub: mc.MoqtClient) -> None:
        pub.track(NS, NAME)
        sub = await client.subscribe(NS, NAME, subscriber_priority=7)
        (served,) = [r for r in pub.session.requests.values() if r.request_id == sub.request.request_id]
        assert served.parameters.get(ParamType.SUBSCRIBER_PRIORITY) == 7

    run(scenario)


def test_raw_request_with_wrong_parity_closes_the_session(run: Callable[[Scenario], None]) -> None:
    async def scenario(client: mc.MoqtClient, pub: mc.MoqtClient) -> None:
        client.open_raw_request(Subscribe(1, NS, NAME).encode())
        closed = await client.wait_closed()
        assert closed.by_peer and closed.code == SessionError.INVALID_REQUEST_ID
        assert "Request ID 1" in closed.reason

    run(scenario)


def test_raw_request_sees_the_answer(run: Callable[[Scenario], None]) -> None:
    async def scenario(client: mc.MoqtClient, pub: mc.MoqtClient) -> None:
        raw = client.open_raw_request(Subscribe(client.session.next_request_id(), NS, b"missing").encode())
        event = await raw.next_event()
        message = getattr(event, "message", None)
        assert message is not None and getattr(message, "error_code", None) == RequestErrorCode.DOES_NOT_EXIST

    run(scenario)


def test_unknown_mandatory_track_property_cancels_the_subscription(run: Callable[[Scenario], None]) -> None:
    async def scenario(client: mc.MoqtClient, pub: mc.MoqtClient) -> None:
        pub.track(NS, NAME, properties=(KeyValuePair(0x4002, 5),))
        with pytest.raises(mc.RequestRejected, match="Mandatory Track Property 0x4002"):
            await client.subscribe(NS, NAME)
        (req,) = client.session.requests.values()
        assert req.state is RequestState.CANCELLED

    run(scenario)


def test_connect_to_a_server_refusing_the_path(loop: quic.LoopThread) -> None:
    """The server closes with INVALID_PATH and says which path (profile §5)."""
    async def main() -> None:
        server = await mc.serve("127.0.0.1", 0, config_factory=lambda: SessionConfig(
            Role.SERVER, accept_paths=frozenset({"/kvcs"})), timeout=TIMEOUT)
        try:
            # The server's SETUP may or may not arrive before its close: both outcomes are legal.
            try:
                client = await mc.connect(server.url + "/elsewhere", timeout=TIMEOUT)
            except mc.SessionEnded as exc:
                closed = exc.closed
            else:
                closed = await client.wait_closed()
            assert closed.code == SessionError.INVALID_PATH and closed.by_peer
            assert "'/elsewhere'" in closed.reason
        finally:
            await server.close()

    loop.run(main(), timeout=15.0)


def test_object_properties_travel_on_fill_and_subgroup_streams(run: Callable[[Scenario], None]) -> None:
    async def scenario(client: mc.MoqtClient, pub: mc.MoqtClient) -> None:
        props = encode_kvps([KeyValuePair(PropertyType.PRIOR_OBJECT_ID_GAP, 2)])
        track = pub.track(NS, NAME, object_properties=True)
        track.publish_object(0, 0, b"old", properties=props)
        sub = await client.subscribe_with_fill(NS, NAME)
        track.publish_object(0, 3, b"new", properties=props, end_subgroup=True)
        await sub.wait_fill()
        await sub.next_object()
        live = await sub.next_object()
        assert [(o.kind, o.properties) for o in sub.objects] == [("fill", props), ("subgroup", props)]
        assert live.location == Location(0, 3)
        with pytest.raises(ValueError, match="object_properties=False"):
            pub.track(NS, b"plain").publish_object(0, 0, b"x", properties=props)

    run(scenario)


def test_subscription_flags_malformed_delivery(run: Callable[[Scenario], None]) -> None:
    """The exactly-once bookkeeping catches what a broken publisher sends (profile §9.3, §11.4)."""
    async def scenario(client: mc.MoqtClient, pub: mc.MoqtClient) -> None:
        track = pub.track(NS, NAME)
        groups(track, 0, 0)  # largest {0,2}
        sub = await client.subscribe_with_fill(NS, NAME)
        await sub.wait_fill()
        alias = sub.request.track_alias
        assert alias is not None
        # Group 1 ends at Object 1, then Object 2 of group 1 arrives on another stream.
        pub.session.open_raw_stream(craft.raw_subgroup_header(0x10, alias, 1, None, 0) + craft.raw_subgroup_object(
            0, b"a") + craft.raw_subgroup_object(0, status=ObjectStatus.END_OF_GROUP), unidirectional=True,
            end_stream=True)
        pub.session.open_raw_stream(craft.raw_subgroup_header(0x10, alias, 1, None, 0) + craft.raw_subgroup_object(
            2, b"late"), unidirectional=True, end_stream=True)
        # A second fill stream for Request ID 0 would close the session; a fill-like order breach is
        # checked on the genuine fill above, so here: Object {0,1} again on the subscription.
        pub.session.open_raw_stream(craft.raw_subgroup_header(0x10, alias, 0, None, 0) + craft.raw_subgroup_object(
            1, b"dup"), unidirectional=True, end_stream=True)
        for _ in range(6):  # 2 fill objects, then 4 on the raw streams
            await sub.next_object()
        assert any("beyond End of Group" in v for v in sub.violations)
        assert any("{0,1} delivered twice" in v for v in sub.violations)
        assert any("{0,1} at or below LARGEST_OBJECT" in v for v in sub.violations)

    run(scenario)


def test_fill_order_breach_is_flagged(run: Callable[[Scenario], None]) -> None:
    async def scenario(client: mc.MoqtClient, pub: mc.MoqtClient) -> None:
        captured: asyncio.Queue[RequestReceived] = asyncio.Queue()

        def hook(_: mc.MoqtClient, event: RequestReceived) -> bool:
            captured.put_nowait(event)
            return True  # answered by hand below, not by the default publisher

        pub.on_request = hook
        sub = await client.subscribe(NS, NAME, fill=True, wait=False)
        served = (await asyncio.wait_for(captured.get(), TIMEOUT)).request
        # SUBSCRIBE_OK, then a fill stream whose second object repeats {0,0}.
        pub.session.subscribe_ok(served.stream_id, largest=Location(0, 3))
        pub.session.open_raw_stream(bytes([0x05, served.request_id]) + craft.raw_fetch_object(
            0x1C, group_delta=0, object_delta=0, priority=0, payload=b"a") + craft.raw_fetch_object(
            0x04, object_delta=0, payload=b"b"), unidirectional=True, end_stream=True)
        await sub.wait_ok()
        assert await sub.wait_fill() == "fin"
        assert any("breaks the ascending order" in v for v in sub.violations)
        assert any("delivered twice" in v for v in sub.violations)

    run(scenario)


def test_goaway_refuses_new_requests(run: Callable[[Scenario], None]) -> None:
    async def scenario(client: mc.MoqtClient, pub: mc.MoqtClient) -> None:
        pub.track(NS, NAME)
        pub.send_goaway(b"moqt://elsewhere:1", 100)
        raw = client.open_raw_request(Subscribe(client.session.next_request_id(), NS, NAME).encode())
        event = await raw.next_event()
        assert getattr(getattr(event, "message", None), "error_code", None) == RequestErrorCode.GOING_AWAY
        assert client.goaway is not None and client.goaway.message.new_session_uri == b"moqt://elsewhere:1"
        with pytest.raises(SessionUsageError, match="GOAWAY"):
            await client.subscribe(NS, NAME)

    run(scenario)


def test_waits_end_with_session_ended_when_the_peer_closes(run: Callable[[Scenario], None]) -> None:
    async def scenario(client: mc.MoqtClient, pub: mc.MoqtClient) -> None:
        pub.track(NS, NAME)
        sub = await client.subscribe(NS, NAME)
        pub.session.close(SessionError.GOAWAY_TIMEOUT, "bye")
        start = asyncio.get_running_loop().time()
        with pytest.raises(mc.SessionEnded) as info:
            await sub.next_object(timeout=TIMEOUT)
        assert info.value.closed.code == SessionError.GOAWAY_TIMEOUT and info.value.closed.reason == "bye"
        assert asyncio.get_running_loop().time() - start < TIMEOUT  # not a timeout

    run(scenario)


def test_forward_zero_pauses_and_resets_open_streams(run: Callable[[Scenario], None]) -> None:
    async def scenario(client: mc.MoqtClient, pub: mc.MoqtClient) -> None:
        track = pub.track(NS, NAME)
        sub = await client.subscribe(NS, NAME)
        track.publish_object(0, 0, b"a")
        await sub.next_object()
        await sub.update(Parameters.of((ParamType.FORWARD, 0)))
        await sub.wait_streams_closed()
        assert list(sub.subgroup_streams.values()) == ["reset"]
        track.publish_object(0, 1, b"paused")  # not sent while Forward is 0
        await sub.update(Parameters.of((ParamType.FORWARD, 1)))
        track.publish_object(0, 2, b"b", end_subgroup=True)
        assert (await sub.next_object()).location == Location(0, 2)
        assert [o.payload for o in sub.objects] == [b"a", b"b"]

    run(scenario)


def test_publisher_priority_orders_what_goes_out_first(run: Callable[[Scenario], None]) -> None:
    """Two groups written in the same tick: the lower Publisher Priority is sent first (profile §11.1)."""
    async def scenario(client: mc.MoqtClient, pub: mc.MoqtClient) -> None:
        track = pub.track(NS, NAME)
        sub = await client.subscribe(NS, NAME)
        track.publish_object(0, 0, b"later", priority=200, end_subgroup=True)
        track.publish_object(1, 0, b"urgent", priority=1, end_subgroup=True)
        first = await sub.next_object()
        second = await sub.next_object()
        assert (first.payload, second.payload) == (b"urgent", b"later")

    run(scenario)


def test_publish_done_waits_until_the_streams_have_sent_everything(run: Callable[[Scenario], None]) -> None:
    """End of Track FINs the subscription's streams at once but holds PUBLISH_DONE back until their data and
    FIN have left this endpoint: a relay that gives counted streams only a short grace after PUBLISH_DONE
    must not cut off what is still in the send buffers (issue 5: a 128 MiB KV cache through a relay)."""
    async def scenario(sub_client: mc.MoqtClient, pub: mc.MoqtClient) -> None:
        track = pub.track(NS, NAME)
        sub = await sub_client.subscribe(NS, NAME, location_filter=LocationFilter.next_object())
        assert track.subscribers, "SUBSCRIBE_OK came before the publisher served the subscription"
        for g in range(4):
            track.publish_group(g, [bytes([g]) * 65536 for _ in range(4)])
        served = next(iter(track.subscribers.values()))
        streams = list(served.streams.values())
        request = pub.session.requests[served.stream_id]
        protocol = pub.connection._protocol
        track.end_track()
        assert not request.sent_fin, "PUBLISH_DONE went out with 1 MiB still unsent"
        done = await sub.wait_complete(TIMEOUT)
        assert done.status_code == PublishDoneCode.TRACK_ENDED and request.sent_fin
        assert all(protocol._stream_sent(sid) for sid in streams)
        assert len([o for o in sub.objects if o.status == ObjectStatus.NORMAL]) == 16

    run(scenario)
