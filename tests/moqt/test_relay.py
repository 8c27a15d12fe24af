"""The caching relay end to end over real QUIC on 127.0.0.1: a publisher and subscribers built with
``kvconform.moqt.client`` on one side, ``Relay`` on an OS-picked port in the middle.

Each test runs one scenario under ``asyncio.run`` with an overall bound; every wait inside is bounded by
the client's timeout.
"""

from __future__ import annotations

import asyncio
import io
import signal
import subprocess
import sys
import threading
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import TypeVar

import pytest

from kvconform.components import component
from kvconform.components.moqt import serve_moqt_relay
from kvconform.moqt import client as mc
from kvconform.moqt.client import MoqtClient, RequestRejected, Subscription
from kvconform.moqt.craft import unknown_type, with_forbidden_param, wrong_length
from kvconform.moqt.data import EndOfRange, EndOfRangeKind, FetchObject, GroupOrder, ObjectStatus, SubgroupObject
from kvconform.moqt.errors import PublishDoneCode, RequestErrorCode, SessionError
from kvconform.moqt.filters import LocationFilter
from kvconform.moqt.messages import FetchOk, PublishNamespace, Subscribe
from kvconform.moqt.parameters import FillParameters, Parameter, Parameters
from kvconform.moqt.policy import Decision, policy_from_mapping
from kvconform.moqt.relay import Downstream, InStream, Peer, Relay, Track, load_relay_class, run_relay
from kvconform.moqt.session import ObjectReceived, Request, SessionClosed
from kvconform.moqt.structures import AuthToken, KeyValuePair, Location, ParamType, PropertyType, TrackNamespace

T = TypeVar("T")
REPO = Path(__file__).resolve().parents[2]
SCENARIO_TIMEOUT = 60.0
CLIENT_TIMEOUT = 10.0
SCOPE = TrackNamespace.of("kvcs-1", "scope-a")
NS = SCOPE + TrackNamespace.of("compat", "anchor", "pub-1")
NAME = b"k.raw.s0"


def run(scenario: Callable[[], Awaitable[T]]) -> T:
    return asyncio.run(asyncio.wait_for(scenario(), SCENARIO_TIMEOUT))


@asynccontextmanager
async def connected(relay: Relay) -> AsyncIterator[MoqtClient]:
    client = await mc.connect(relay.url, timeout=CLIENT_TIMEOUT)
    try:
        yield client
    finally:
        await client.close()


def payloads(n_groups: int, per_group: int, start: int = 0) -> dict[int, list[bytes]]:
    return {g: [f"g{g}o{o}".encode() * (o + 1) for o in range(per_group)] for g in range(start, start + n_groups)}


def normal(objs: list[mc.ReceivedObject], kind: str | None = None) -> list[mc.ReceivedObject]:
    return [o for o in objs if o.end_of_range is None and o.status == ObjectStatus.NORMAL
            and (kind is None or o.kind == kind)]


# ---------------------------------------------------------------------------------------------------
# Subscriptions and fills


def test_next_object_plus_fill_is_exactly_once_while_the_publisher_is_mid_track() -> None:
    async def scenario() -> None:
        async with Relay() as relay, connected(relay) as pub, connected(relay) as sub:
            track = pub.track(NS, NAME)
            await pub.publish_namespace(NS)
            data = payloads(3, 3)
            track.publish_group(0, data[0])
            track.publish_group(1, data[1])
            track.publish_object(2, 0, data[2][0])  # mid-group 2
            s = await sub.subscribe_with_fill(NS, NAME)
            assert s.largest == Location(2, 0)
            track.publish_object(2, 1, data[2][1])
            track.publish_object(2, 2, data[2][2])
            track.publish_object(2, 3, status=ObjectStatus.END_OF_GROUP)
            track.end_track()
            assert await s.wait_fill() == "fin"
            done = await s.wait_complete()
            assert done.status_code == PublishDoneCode.TRACK_ENDED
            assert done.stream_count == s.streams_seen()  # fill + subgroup streams (section 6.2)
            assert s.violations == []
            fill = [o.location for o in normal(s.objects, "fill")]
            assert fill == [Location(0, 0), Location(0, 1), Location(0, 2), Location(1, 0), Location(1, 1),
                            Location(1, 2), Location(2, 0)]
            live = [(o.location, o.status) for o in s.objects if o.kind == "subgroup"]
            assert live == [(Location(2, 1), 0), (Location(2, 2), 0), (Location(2, 3), ObjectStatus.END_OF_GROUP),
                            (Location(3, 0), ObjectStatus.END_OF_TRACK)]
            published = {loc: o.payload for loc, o in track.objects.items() if o.status == ObjectStatus.NORMAL}
            assert s.payloads() == published  # byte-identical through the relay
            t = relay.tracks[(NS.fields, NAME)]
            assert t.counters.upstream_fetches == 1 and t.counters.fill_objects == 7

    run(scenario)


def test_a_later_subscriber_is_filled_from_cache_without_going_upstream() -> None:
    async def scenario() -> None:
        async with Relay() as relay, connected(relay) as pub, connected(relay) as first, \
                connected(relay) as second:
            track = pub.track(NS, NAME)
            await pub.publish_namespace(NS)
            for g, objs in payloads(2, 4).items():
                track.publish_group(g, objs)
            s1 = await first.subscribe_with_fill(NS, NAME)
            await s1.wait_fill()
            track.publish_group(2, [b"x", b"y"])
            t = relay.tracks[(NS.fields, NAME)]
            await wait_until(lambda: t.cache.largest == Location(2, 2))
            received = t.counters.objects_in
            s2 = await second.subscribe_with_fill(NS, NAME)
            assert s2.largest == Location(2, 2)
            assert await s2.wait_fill() == "fin"
            assert [o.location for o in normal(s2.objects, "fill")] == [
                Location(g, o) for g in range(2) for o in range(4)] + [Location(2, 0), Location(2, 1)]
            # Only the rest of group 1 after its End of Group (which a FETCH cannot carry) was unknown: the
            # relay asked upstream for that gap alone and no object came twice.
            assert t.counters.objects_in == received and t.counters.upstream_fetches <= 2
            track.publish_object(3, 0, b"z")
            for s in (s1, s2):
                obj = await next_normal(s)
                while obj.location < Location(3, 0):  # s1 also got group 2 live
                    obj = await next_normal(s)
                assert (obj.kind, obj.location, obj.payload) == ("subgroup", Location(3, 0), b"z")
                assert s.violations == []

    run(scenario)


async def next_normal(s: Subscription) -> mc.ReceivedObject:
    while True:
        obj = await s.next_object()
        if obj.kind == "subgroup" and obj.status == ObjectStatus.NORMAL:
            return obj


async def wait_until(cond: Callable[[], bool], timeout: float = CLIENT_TIMEOUT) -> None:
    """Poll a condition on relay state the clients cannot observe directly (bounded)."""
    async def poll() -> None:
        while not cond():
            await asyncio.sleep(0.01)
    await asyncio.wait_for(poll(), timeout)


def test_a_completed_track_is_filled_then_ended() -> None:
    async def scenario() -> None:
        async with Relay() as relay, connected(relay) as pub, connected(relay) as sub:
            track = pub.track(NS, NAME)
            await pub.publish_namespace(NS)
            track.publish_group(0, [b"a", b"b"])
            track.end_track()  # the publisher answers SUBSCRIBE_OK then PUBLISH_DONE at once
            for _ in range(2):  # the second subscriber meets a relay that already saw the track end
                s = await sub.subscribe_with_fill(NS, NAME)
                assert s.largest == Location(1, 0)
                done = await s.wait_complete()
                assert done.status_code == PublishDoneCode.TRACK_ENDED and done.stream_count == 1
                assert [(o.kind, o.payload) for o in s.objects] == [("fill", b"a"), ("fill", b"b")]

    run(scenario)


def test_forward_zero_sends_nothing_until_an_update_turns_it_on_with_a_fill() -> None:
    async def scenario() -> None:
        async with Relay() as relay, connected(relay) as pub, connected(relay) as sub:
            track = pub.track(NS, NAME)
            await pub.publish_namespace(NS)
            track.publish_group(0, [b"a"])
            fill = FillParameters.of((ParamType.LOCATION_FILTER, LocationFilter.absolute_start(0, 0)),
                                     (ParamType.GROUP_ORDER, GroupOrder.ASCENDING))
            s = await sub.subscribe(NS, NAME, forward=0, fill=fill)
            track.publish_object(1, 0, b"b")
            t = relay.tracks[(NS.fields, NAME)]
            await wait_until(lambda: t.cache.largest == Location(1, 0))
            assert s.objects == [] and s.fills == {}  # Forward 0: no object, no fill stream
            ok = await s.update(Parameters.of((ParamType.FORWARD, 1), (ParamType.FILL_PARAMETERS, fill)))
            assert ok.largest_object == Location(1, 0)
            assert await s.wait_fill() == "fin"
            track.publish_object(1, 1, b"c")
            assert (await next_normal(s)).location == Location(1, 1)
            assert [(o.kind, o.payload) for o in normal(s.objects)] == [
                ("fill", b"a"), ("fill", b"b"), ("subgroup", b"c")]
            assert s.violations == []

    run(scenario)


def test_two_publishers_are_deduplicated_and_a_conflicting_copy_makes_the_track_malformed() -> None:
    async def scenario() -> None:
        async with Relay() as relay, connected(relay) as pub_a, connected(relay) as pub_b, \
                connected(relay) as sub:
            tracks = [p.track(NS, NAME) for p in (pub_a, pub_b)]
            await pub_a.publish_namespace(NS)
            await pub_b.publish_namespace(SCOPE)
            s = await sub.subscribe(NS, NAME)
            await wait_until(lambda: all(t.subscribers for t in tracks))  # the relay subscribed to both
            for t in tracks:
                t.publish_object(0, 0, b"same")
            relayed = relay.tracks[(NS.fields, NAME)]
            # Both copies reached the relay and the one it forwarded reached the subscriber (under load it lags).
            await wait_until(lambda: relayed.counters.objects_in == 2 and bool(s.objects))
            assert relayed.counters.duplicates == 1 and [o.payload for o in s.objects] == [b"same"]
            tracks[0].publish_object(0, 1, b"one")
            tracks[1].publish_object(0, 1, b"two")
            done = await s.wait_done()
            assert done.status_code == PublishDoneCode.MALFORMED_TRACK
            assert relayed.cache.malformed is not None and "{0,1}" in relayed.cache.malformed
            with pytest.raises(RequestRejected) as exc:
                await sub.fetch(NS, NAME)
            assert exc.value.code == RequestErrorCode.MALFORMED_TRACK

    run(scenario)


def test_fill_timeout_zero_serves_only_the_cache_and_marks_the_rest() -> None:
    async def scenario() -> None:
        async with Relay() as relay, connected(relay) as pub, connected(relay) as sub:
            track = pub.track(NS, NAME)
            await pub.publish_namespace(NS)
            track.publish_group(0, [b"a", b"b"])
            live = await sub.subscribe(NS, NAME)  # the relay follows from {0,3}; nothing older is cached
            track.publish_object(1, 0, b"c")
            assert (await next_normal(live)).location == Location(1, 0)
            fill = FillParameters.of((ParamType.LOCATION_FILTER, LocationFilter.absolute_start(0, 0)),
                                     (ParamType.GROUP_ORDER, GroupOrder.ASCENDING), (ParamType.FILL_TIMEOUT, 0))
            s = await sub.subscribe(NS, NAME, fill=fill)
            assert s.largest == Location(1, 0) and await s.wait_fill() == "fin"
            # {0,0}..{0,*} unknown to the relay (budget 0: no upstream FETCH), then the cached {1,0}
            assert [(o.location, o.end_of_range, o.payload) for o in s.objects if o.kind == "fill"] == [
                (Location(0, 2**64 - 1), EndOfRangeKind.TIMED_OUT, b""), (Location(1, 0), None, b"c")]
            assert relay.tracks[(NS.fields, NAME)].counters.upstream_fetches == 0

    run(scenario)


def test_subscribe_without_publisher_is_does_not_exist() -> None:
    async def scenario() -> None:
        async with Relay() as relay, connected(relay) as sub:
            with pytest.raises(RequestRejected) as exc:
                await sub.subscribe(NS, NAME)
            assert exc.value.code == RequestErrorCode.DOES_NOT_EXIST

    run(scenario)


# ---------------------------------------------------------------------------------------------------
# FETCH


async def completed_track(pub: MoqtClient, n_groups: int, per_group: int) -> tuple[mc.LocalTrack,
                                                                                 dict[int, list[bytes]]]:
    """Publish NS/NAME: ``n_groups`` groups of ``payloads``, then End of Track."""
    track = pub.track(NS, NAME)
    await pub.publish_namespace(NS)
    data = payloads(n_groups, per_group)
    for g, objs in data.items():
        track.publish_group(g, objs)
    track.end_track()
    return track, data


def test_fetch_ranges_in_group_order_with_end_location_and_end_of_track() -> None:
    async def scenario() -> None:
        async with Relay() as relay, connected(relay) as pub, connected(relay) as sub:
            _, data = await completed_track(pub, 4, 3)
            # the relay does not follow the track: it learns the range with an upstream FETCH
            everything = await sub.fetch(NS, NAME)
            ok = everything.request.response
            assert isinstance(ok, FetchOk)
            assert (ok.end_location, ok.end_of_track) == (Location(3, 2), 1)
            assert [(o.location, o.payload) for o in everything.objects] == [
                (Location(g, o), data[g][o]) for g in range(4) for o in range(3)]
            # a sub-range, descending: groups 2, 1 then objects ascending inside each
            down = await sub.fetch(NS, NAME, location_filter=LocationFilter.absolute_range(1, 1, 1, 1),
                                   group_order=GroupOrder.DESCENDING)
            assert [o.location for o in down.objects] == [Location(2, 0), Location(2, 1), Location(1, 1),
                                                          Location(1, 2)]
            ok = down.request.response
            assert isinstance(ok, FetchOk) and (ok.end_location, ok.end_of_track) == (Location(2, 1), 0)
            # a whole-group end: End Location is the last object actually covered
            grp = await sub.fetch(NS, NAME, location_filter=LocationFilter.absolute_start_group_end(1, 0, 0))
            ok = grp.request.response
            assert isinstance(ok, FetchOk) and ok.end_location == Location(1, 2)
            assert [o.location.group for o in grp.objects] == [1, 1, 1]
            status = await sub.track_status(NS, NAME)  # answered upstream: the relay does not follow it
            assert status.largest_object == Location(4, 0)  # End of Track at {L, 0}

    run(scenario)


def test_a_fetch_of_a_track_the_relay_does_not_follow_is_served_as_it_arrives_upstream() -> None:
    """Cut-through: the publisher holds back everything after Group 0 of its fetch stream until the relay has
    written Group 0 to the subscriber. A relay that stores the whole upstream range before answering never
    gets there (the bounded wait fails); this one delivers every object once, in order."""
    group0_written = asyncio.Event()

    class WatchingRelay(Relay):
        def serve_fetch_range(self, peer: Peer, req: Request, track: Track, stream_id: int,
                              items: Sequence[FetchObject | EndOfRange]) -> None:
            super().serve_fetch_range(peer, req, track, stream_id, items)
            if any(isinstance(i, FetchObject) and i.location == Location(0, 1) for i in items):
                group0_written.set()

    async def scenario() -> None:
        async with WatchingRelay() as relay, connected(relay) as pub, connected(relay) as sub:
            track, data = await completed_track(pub, 3, 2)
            write_all = track._write_fetch_stream
            held: list[asyncio.Future[None]] = []

            def hold_back(sid: int, objects: list[mc.StoredObject]) -> None:
                first = [o for o in objects if o.location.group == 0]
                for o in first:
                    pub.session.write_fetch_object(sid, FetchObject(o.location.group, o.location.object, o.payload,
                                                                    o.subgroup_id, o.publisher_priority))

                async def the_rest() -> None:
                    await asyncio.wait_for(group0_written.wait(), CLIENT_TIMEOUT)
                    write_all(sid, objects[len(first):])
                held.append(asyncio.ensure_future(the_rest()))

            track._write_fetch_stream = hold_back  # type: ignore[method-assign]
            result = await sub.fetch(NS, NAME)
            await held[0]
            assert [(o.location, o.payload) for o in result.objects] == [
                (Location(g, o), data[g][o]) for g in range(3) for o in range(2)]
            ok = result.request.response
            assert isinstance(ok, FetchOk) and (ok.end_location, ok.end_of_track) == (Location(2, 1), 1)

    run(scenario)


def test_fetch_refusals() -> None:
    async def scenario() -> None:
        async with Relay() as relay, connected(relay) as pub, connected(relay) as sub:
            with pytest.raises(RequestRejected) as exc:
                await sub.fetch(NS, NAME)
            assert exc.value.code == RequestErrorCode.DOES_NOT_EXIST
            track = pub.track(NS, NAME)
            await pub.publish_namespace(NS)
            track.publish_group(0, [b"a"])
            await sub.subscribe(NS, NAME)  # the relay now follows the track: Largest {0,1}
            with pytest.raises(RequestRejected) as exc:
                await sub.fetch(NS, NAME, location_filter=LocationFilter.absolute_start(5, 0))
            assert exc.value.code == RequestErrorCode.INVALID_RANGE

    run(scenario)


# ---------------------------------------------------------------------------------------------------
# Namespace discovery


def test_namespace_prefix_subscription_sees_every_matching_publication() -> None:
    async def scenario() -> None:
        async with Relay() as relay, connected(relay) as pub_a, connected(relay) as pub_b, \
                connected(relay) as sub:
            ns_a = SCOPE + TrackNamespace.of("c", "a", "pub-a")
            ns_b = SCOPE + TrackNamespace.of("c", "a", "pub-b")
            other = TrackNamespace.of("kvcs-1", "scope-b", "c", "a", "pub-c")
            await pub_a.publish_namespace(ns_a)
            watcher = await sub.subscribe_namespace(SCOPE + TrackNamespace.of("c", "a"))
            assert await watcher.next() == ("namespace", TrackNamespace.of("pub-a"))
            handle_b = await pub_b.publish_namespace(ns_b)
            await pub_b.publish_namespace(other)
            assert await watcher.next() == ("namespace", TrackNamespace.of("pub-b"))
            handle_b.cancel()
            assert await watcher.next() == ("done", TrackNamespace.of("pub-b"))
            assert watcher.queue.empty()  # scope-b was never announced here
            with pytest.raises(RequestRejected) as exc:
                await sub.subscribe_namespace(SCOPE)
            assert exc.value.code == RequestErrorCode.PREFIX_OVERLAP
            sibling = await sub.subscribe_namespace(TrackNamespace.of("kvcs-1", "scope-b"))
            assert await sibling.next() == ("namespace", TrackNamespace.of("c", "a", "pub-c"))
            await pub_a.close()  # a publisher's session ending withdraws its namespaces
            assert await watcher.next() == ("done", TrackNamespace.of("pub-a"))

    run(scenario)


def test_namespace_prefix_update_widens_the_subscription() -> None:
    async def scenario() -> None:
        async with Relay() as relay, connected(relay) as pub, connected(relay) as sub:
            await pub.publish_namespace(SCOPE + TrackNamespace.of("c", "a1", "pub-1"))
            await pub.publish_namespace(SCOPE + TrackNamespace.of("c", "a2", "pub-2"))
            watcher = await sub.subscribe_namespace(SCOPE + TrackNamespace.of("c", "a1"))
            other = await sub.subscribe_namespace(TrackNamespace.of("kvcs-1", "scope-b"))
            assert await watcher.next() == ("namespace", TrackNamespace.of("pub-1"))
            with pytest.raises(RequestRejected) as exc:  # would overlap the other active prefix
                await watcher.update(Parameters.of((ParamType.TRACK_NAMESPACE_PREFIX, TrackNamespace.of("kvcs-1"))))
            assert exc.value.code == RequestErrorCode.PREFIX_OVERLAP
            other.cancel()
            await wait_until(lambda: len(relay.peers[-1].namespace_subs) == 1)
            await watcher.update(Parameters.of((ParamType.TRACK_NAMESPACE_PREFIX, SCOPE + TrackNamespace.of("c"))))
            got = {await watcher.next(), await watcher.next()}
            assert got == {("namespace", TrackNamespace.of("a1", "pub-1")),
                           ("namespace", TrackNamespace.of("a2", "pub-2"))}

    run(scenario)


# ---------------------------------------------------------------------------------------------------
# Authorization


POLICY = {
    "version": 1,
    "tokens": [
        {"name": "pub", "value": "pub-token", "publish": [["kvcs-1", "scope-a"]]},
        {"name": "sub", "value": "sub-token", "subscribe": [["kvcs-1", "scope-a"]]},
        {"name": "old", "value": "old-token", "subscribe": [["kvcs-1"]], "expires": 1000},
    ],
}
PUB = AuthToken.use_value(b"pub-token")
SUB = AuthToken.use_value(b"sub-token")
OLD = AuthToken.use_value(b"old-token")
GUESS = AuthToken.use_value(b"no-such-token")


def test_unauthorized_requests_are_refused_and_nothing_is_delivered() -> None:
    async def scenario() -> None:
        async with Relay(policy=policy_from_mapping(POLICY)) as relay, connected(relay) as pub, \
                connected(relay) as sub:
            for auth in ((), (SUB,)):  # no token; a subscribe-only token
                with pytest.raises(RequestRejected) as exc:
                    await pub.publish_namespace(NS, auth=auth)
                assert exc.value.code == RequestErrorCode.UNAUTHORIZED
            track = pub.track(NS, NAME)
            await pub.publish_namespace(NS, auth=[PUB])
            track.publish_group(0, [b"secret"])
            calls: list[Callable[[tuple[AuthToken, ...]], Awaitable[object]]] = [
                lambda a: sub.subscribe_with_fill(NS, NAME, auth=a), lambda a: sub.fetch(NS, NAME, auth=a),
                lambda a: sub.subscribe_namespace(SCOPE, auth=a), lambda a: sub.track_status(NS, NAME, auth=a)]
            for call in calls:
                for auth, code in (((), RequestErrorCode.UNAUTHORIZED), ((PUB,), RequestErrorCode.UNAUTHORIZED),
                                   ((OLD,), RequestErrorCode.EXPIRED_AUTH_TOKEN),
                                   ((GUESS,), RequestErrorCode.MALFORMED_AUTH_TOKEN)):
                    with pytest.raises(RequestRejected) as exc:
                        await call(auth)
                    assert exc.value.code == code, (auth, exc.value)
            wide = TrackNamespace.of("kvcs-1")
            with pytest.raises(RequestRejected) as exc:
                await sub.subscribe_namespace(wide, auth=[SUB])
            assert exc.value.code == RequestErrorCode.UNAUTHORIZED
            # refused before anything happened: no upstream subscription or fetch, no object delivered
            assert (NS.fields, NAME) not in relay.tracks and track.subscribers == {}
            assert not [e for e in drain(sub) if isinstance(e, ObjectReceived)]
            s = await sub.subscribe_with_fill(NS, NAME, auth=[SUB])  # the right token works
            assert await s.wait_fill() == "fin"
            assert [o.payload for o in normal(s.objects)] == [b"secret"]

    run(scenario)


def drain(client: MoqtClient) -> list[object]:
    out: list[object] = []
    while not client.unhandled.empty():
        out.append(client.unhandled.get_nowait())
    return out


def test_setup_token_authorizes_the_session() -> None:
    async def scenario() -> None:
        from kvconform.moqt.session import Role, SessionConfig

        async with Relay(policy=policy_from_mapping(POLICY)) as relay:
            config = SessionConfig(role=Role.CLIENT, auth_tokens=(PUB,))
            pub = await mc.connect(relay.url, config=config, timeout=CLIENT_TIMEOUT)
            try:
                await pub.publish_namespace(NS)  # no token in the message: SETUP's counts
            finally:
                await pub.close()

    run(scenario)


# ---------------------------------------------------------------------------------------------------
# Malformed control messages: the offending session is closed with the right code; the relay survives


def _subscribe(rid: int) -> Subscribe:
    return Subscribe(rid, NS, NAME, Parameters.of((ParamType.LOCATION_FILTER, LocationFilter.next_object())))


MALFORMED: dict[str, tuple[Callable[[], bytes], int]] = {
    "bad length": (lambda: wrong_length(_subscribe(0), -1), SessionError.PROTOCOL_VIOLATION),
    "unknown type": (lambda: unknown_type(), SessionError.PROTOCOL_VIOLATION),
    "wrong parity": (lambda: _subscribe(1).encode(), SessionError.INVALID_REQUEST_ID),
    "parameter not allowed": (
        lambda: with_forbidden_param(PublishNamespace(0, NS), Parameter(ParamType.FORWARD, 1)),
        SessionError.PROTOCOL_VIOLATION),
}


@pytest.mark.parametrize("case", sorted(MALFORMED))
def test_malformed_request_closes_that_session_and_the_relay_survives(case: str) -> None:
    build, code = MALFORMED[case]

    async def scenario() -> None:
        async with Relay() as relay, connected(relay) as pub:
            track = pub.track(NS, NAME)
            await pub.publish_namespace(NS)
            track.publish_group(0, [b"a"])
            bad = await mc.connect(relay.url, timeout=CLIENT_TIMEOUT)
            bad.open_raw_request(build(), end_stream=True)
            closed = await bad.wait_closed()
            assert isinstance(closed, SessionClosed) and closed.by_peer
            assert closed.code == code
            async with connected(relay) as sub:  # sanity: the relay still serves
                s = await sub.subscribe_with_fill(NS, NAME)
                assert await s.wait_fill() == "fin"
            assert relay.counters.internal_errors == 0
            assert relay.counters.session_closes[f"relay:0x{int(code):x}"] == 1  # counted, shown while serving
            assert f"relay:0x{int(code):x}=1" in relay.status_lines()[0]

    run(scenario)


# ---------------------------------------------------------------------------------------------------
# MAX_CACHE_DURATION on an injected clock


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_max_cache_duration_expired_objects_are_fetched_again() -> None:
    async def scenario() -> None:
        clock = FakeClock()
        props = (KeyValuePair(PropertyType.MAX_CACHE_DURATION, 1000),)
        async with Relay(clock=clock) as relay, connected(relay) as pub, connected(relay) as sub:
            track = pub.track(NS, NAME, properties=props)
            await pub.publish_namespace(NS)
            track.publish_group(0, [b"a", b"b"])
            s1 = await sub.subscribe_with_fill(NS, NAME)
            assert s1.ok is not None and s1.ok.track_properties == props  # Track Properties forwarded
            await s1.wait_fill()
            t = relay.tracks[(NS.fields, NAME)]
            assert t.counters.upstream_fetches == 1
            clock.now += 0.5  # within MAX_CACHE_DURATION: served from cache
            f1 = await sub.fetch(NS, NAME, location_filter=LocationFilter.absolute_start(0, 0))
            assert [o.payload for o in f1.objects] == [b"a", b"b"] and t.counters.upstream_fetches == 1
            clock.now += 1.0  # 1.5 s after arrival: expired, state unknown, fetched upstream again
            f2 = await sub.fetch(NS, NAME, location_filter=LocationFilter.absolute_start(0, 0))
            assert [o.payload for o in f2.objects] == [b"a", b"b"] and t.counters.upstream_fetches == 2

    run(scenario)


# ---------------------------------------------------------------------------------------------------
# Overridable behaviour (what mutant relays subclass)


class AlteringRelay(Relay):
    """Changes payloads on the subscription path: the hook must be the one the relay uses."""

    def forward_object(self, ds: Downstream, st: InStream, obj: SubgroupObject) -> None:
        if obj.payload:
            obj = SubgroupObject(obj.object_id, obj.payload[::-1], obj.status, obj.properties, obj.track_alias,
                                 obj.group_id, obj.subgroup_id, obj.publisher_priority)
        super().forward_object(ds, st, obj)


class OpenRelay(Relay):
    def authorize(self, peer: Peer, right: object, namespace: TrackNamespace, params: Parameters) -> Decision:
        return Decision(True)


def test_subclass_hooks_are_on_the_delivery_and_authorization_paths() -> None:
    async def scenario() -> None:
        async with AlteringRelay() as relay, connected(relay) as pub, connected(relay) as sub:
            track = pub.track(NS, NAME)
            await pub.publish_namespace(NS)
            s = await sub.subscribe(NS, NAME)
            track.publish_object(0, 0, b"abc")
            assert (await next_normal(s)).payload == b"cba"
        async with OpenRelay(policy=policy_from_mapping({"version": 1})) as relay, connected(relay) as pub:
            await pub.publish_namespace(NS)  # no token, yet accepted

    run(scenario)


def test_subscriber_cancel_and_publisher_loss_end_cleanly() -> None:
    async def scenario() -> None:
        async with Relay() as relay, connected(relay) as sub:
            pub = await mc.connect(relay.url, timeout=CLIENT_TIMEOUT)
            track = pub.track(NS, NAME)
            await pub.publish_namespace(NS)
            track.publish_group(0, [b"a"])
            s1 = await sub.subscribe(NS, NAME)
            s2 = await sub.subscribe(NS, NAME)
            s1.cancel()
            await wait_until(lambda: len(relay.tracks[(NS.fields, NAME)].subscribers) == 1)
            await pub.close()
            done = await s2.wait_done()
            assert done.status_code == PublishDoneCode.INTERNAL_ERROR
            assert relay.counters.internal_errors == 0
            with pytest.raises(RequestRejected) as exc:  # no publisher any more
                await sub.subscribe(NS, NAME)
            assert exc.value.code == RequestErrorCode.DOES_NOT_EXIST

    run(scenario)


# ---------------------------------------------------------------------------------------------------
# `kvconform serve moqt-relay`


def _spawn_relay(*args: str) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-m", "kvconform.cli", "serve", "moqt-relay", "--port", "0", *args],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True,
                            cwd=REPO)


def _listening_port(proc: subprocess.Popen[str]) -> int:
    watchdog = threading.Timer(SCENARIO_TIMEOUT, proc.kill)  # a process that never prints is killed
    watchdog.start()
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline().strip()
    finally:
        watchdog.cancel()
    assert line.startswith("listening on 127.0.0.1:"), line
    return int(line.rsplit(":", 1)[1])


@pytest.fixture
def spawned_relays() -> Iterator[list[subprocess.Popen[str]]]:
    procs: list[subprocess.Popen[str]] = []
    yield procs
    for proc in procs:
        if proc.poll() is None:
            proc.kill()
        proc.communicate(timeout=SCENARIO_TIMEOUT)


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_spawned_relay_with_policy_and_relay_class(spawned_relays: list[subprocess.Popen[str]],
                                                   signum: int) -> None:
    proc = _spawn_relay("--policy", str(REPO / "testbeds" / "moqt-relay-policy.yaml"),
                        "--relay-class", "tests.moqt.test_relay:AlteringRelay")
    spawned_relays.append(proc)
    port = _listening_port(proc)
    ns = TrackNamespace.of("kvcs-1", bytes.fromhex("6d1c6481cd428737da312c089db3832a"), "c", "a", "p")

    async def scenario() -> None:
        url = f"moqt://127.0.0.1:{port}"
        pub = await mc.connect(url, timeout=CLIENT_TIMEOUT)
        sub = await mc.connect(url, timeout=CLIENT_TIMEOUT)
        try:
            track = pub.track(ns, NAME)
            with pytest.raises(RequestRejected) as exc:
                await pub.publish_namespace(ns)
            assert exc.value.code == RequestErrorCode.UNAUTHORIZED
            await pub.publish_namespace(ns, auth=[AuthToken.use_value(b"kvcs-publisher-token")])
            s = await sub.subscribe(ns, NAME, auth=[AuthToken.use_value(b"kvcs-consumer-token")])
            track.publish_object(0, 0, b"abc")
            assert (await next_normal(s)).payload == b"cba"  # the subclass named on the command line runs
        finally:
            await pub.close()
            await sub.close()

    run(scenario)
    proc.send_signal(signum)
    assert proc.wait(timeout=SCENARIO_TIMEOUT) == 0


def test_serve_arguments_and_in_process_stop(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    # Loading this file by its path registers it under a second name; undone after the test (tests/test_layout.py
    # holds the session to one name per file).
    monkeypatch.setitem(sys.modules, "_class_from_test_relay", sys.modules[__name__])
    assert component("moqt-relay") is serve_moqt_relay
    assert serve_moqt_relay(["--relay-class", "kvconform.moqt.policy:Policy"]) == 2
    assert "not a subclass" in capsys.readouterr().err
    assert serve_moqt_relay(["--relay-class", "nocolon"]) == 2
    bad = tmp_path / "p.yaml"
    bad.write_text("version: 7\n")
    assert serve_moqt_relay(["--policy", str(bad)]) == 2
    assert "$.version" in capsys.readouterr().err
    stop = threading.Event()
    stop.set()  # start, announce, stop at once
    handler = signal.getsignal(signal.SIGINT)
    assert serve_moqt_relay(["--port", "0"], stop=stop) == 0
    assert capsys.readouterr().out.startswith("listening on 127.0.0.1:")
    assert signal.getsignal(signal.SIGINT) is handler
    assert load_relay_class("tests.moqt.test_relay:OpenRelay") is OpenRelay
    by_path = load_relay_class(f"{Path(__file__).resolve()}:OpenRelay")
    assert issubclass(by_path, Relay) and by_path.__name__ == "OpenRelay"


def test_rendezvous_timeout_holds_a_subscribe_until_a_publisher_arrives() -> None:
    rendezvous = Parameter(ParamType.RENDEZVOUS_TIMEOUT, 3000)

    async def scenario() -> None:
        async with Relay() as relay, connected(relay) as pub, connected(relay) as sub:
            held = await sub.subscribe(NS, NAME, extra=[rendezvous], wait=False)
            await wait_until(lambda: (NS.fields, NAME) in relay.tracks and relay.tracks[(NS.fields, NAME)].waiting == 1)
            track = pub.track(NS, NAME)
            track.publish_group(0, [b"a"])
            await pub.publish_namespace(SCOPE)  # a prefix of the track's namespace
            ok = await held.wait_ok()
            assert ok.largest_object == Location(0, 1)
            short = await sub.subscribe(NS, b"never", extra=[Parameter(ParamType.RENDEZVOUS_TIMEOUT, 1)],
                                        wait=False)
            with pytest.raises(RequestRejected) as exc:
                await short.wait_ok()
            # the namespace has a publisher, which refuses the unknown track
            assert exc.value.code == RequestErrorCode.DOES_NOT_EXIST
            other = TrackNamespace.of("elsewhere")
            lonely = await sub.subscribe(other, NAME, extra=[Parameter(ParamType.RENDEZVOUS_TIMEOUT, 1)],
                                         wait=False)
            with pytest.raises(RequestRejected) as exc:
                await lonely.wait_ok()
            assert exc.value.code == RequestErrorCode.TIMEOUT

    run(scenario)


def test_counters_are_printed_while_serving() -> None:
    stop = threading.Event()

    class Out(io.StringIO):
        def write(self, s: str) -> int:
            if "sessions open=" in s:
                stop.set()  # one counter block seen: stop serving
            return super().write(s)

    out = Out()
    backstop = threading.Timer(SCENARIO_TIMEOUT, stop.set)  # bounds the test if nothing is ever printed
    backstop.start()
    try:
        assert run_relay(Relay(), stop, interval=0.05, show_counters=True, out=out) == 0
    finally:
        backstop.cancel()
    lines = out.getvalue().splitlines()
    assert lines[0].startswith("listening on 127.0.0.1:")
    assert lines[1].startswith("sessions open=0 total=0 closes none | requests none | refused none")
