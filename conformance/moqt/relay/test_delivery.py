"""moqt-relay: live delivery through the relay, the exactly-once fill pattern and end markers
(moqt-d22-profile sections 9.3, 11, 12).

The harness is both the original publisher and the subscribers. A subscriber joins a track while the
publisher is in the middle of it with LOCATION_FILTER Next Object + FILL_PARAMETERS {Absolute Start
{0,0}} (profile section 11.3); every published object must then arrive exactly once: by the fill if its
Location is <= the LARGEST_OBJECT L of SUBSCRIBE_OK, by the subscription otherwise (section 11.4).
The split point is chosen at the boundaries where relays differ: inside a group, right after an End of
Group marker, and with objects published while the SUBSCRIBE is in flight.
"""

from __future__ import annotations

import asyncio
import hashlib
from typing import Any

import numpy as np
import pytest

from kvconform.fixtures.moqt import (
    CLIENT_TIMEOUT,
    Publisher,
    RelayUnderTest,
    exactly_once_problems,
    finish,
    publisher,
    record,
    run_check,
    session,
    subscribe,
)
from kvconform.moqt.data import ObjectStatus
from kvconform.moqt.errors import PublishDoneCode
from kvconform.moqt.structures import Location

pytestmark = pytest.mark.usefixtures("moqt_relay_sanity")

SPLITS = ("mid-group", "after-end-of-group", "random")


def payload(rng: np.random.Generator, group: int, obj: int) -> bytes:
    """A payload whose size crosses packet boundaries now and then (1 .. 3000 bytes, sometimes 20 kB)."""
    size = 20_000 if rng.random() < 0.1 else int(rng.integers(1, 3000))
    return f"{group}.{obj}:".encode() + rng.bytes(size)


def publish_group(pub: Publisher, rng: np.random.Generator, group: int, n: int, start: int = 0,
                  end_of_group: bool = True) -> None:
    for obj in range(start, n):
        pub.publish(group, obj, payload(rng, group, obj))
    if end_of_group:
        pub.end_of_group(group, n)


@pytest.mark.req("MOQT-FILL-EXACTLY-ONCE", "MOQT-FILL-STREAM", "MOQT-SUB-LARGEST-OBJECT", "MOQT-RELAY-LARGEST-OBJECT")
def test_next_object_plus_fill_is_exactly_once_mid_track(moqt_relay: RelayUnderTest, rng: np.random.Generator) -> None:
    async def scenario() -> list[str]:
        problems: list[str] = []
        for split in SPLITS:
            ns = moqt_relay.namespace(rng)
            per = [int(rng.integers(2, 5)) for _ in range(int(rng.integers(3, 6)))]
            cut = int(rng.integers(1, len(per) - 1))  # the group the subscriber joins in
            async with publisher(moqt_relay, ns) as pub, session(moqt_relay, "subscriber") as sub_client:
                for g in range(cut):
                    publish_group(pub, rng, g, per[g])
                inside = {"mid-group": 1, "after-end-of-group": 0}.get(split, int(rng.integers(0, per[cut])))
                if inside:
                    publish_group(pub, rng, cut, inside, end_of_group=False)
                sub = await subscribe(sub_client, ns, auth=moqt_relay.token("subscriber"))
                expected_l = pub.track.largest
                if sub.largest != expected_l:
                    problems.append(f"[{split}] SUBSCRIBE_OK LARGEST_OBJECT {sub.largest}, but the publisher's "
                                    f"Largest Object was {expected_l} (MOQT-RELAY-LARGEST-OBJECT)")
                publish_group(pub, rng, cut, per[cut], start=inside)
                for g in range(cut + 1, len(per)):
                    publish_group(pub, rng, g, per[g])
                pub.end_track()
                await finish(sub)
                problems += [f"[{split}, L={sub.largest}] {p}" for p in exactly_once_problems(sub, pub.published())]
                if not sub.fills and sub.largest is not None:
                    problems.append(f"[{split}] no fill stream although LARGEST_OBJECT {sub.largest} was given "
                                    "(MOQT-FILL-STREAM)")
        return problems

    run_check(scenario, "MOQT-FILL-EXACTLY-ONCE", "exactly-once scenarios")


@pytest.mark.req("MOQT-FILL-EXACTLY-ONCE", "MOQT-SUB-NEXT-OBJECT")
def test_objects_published_while_the_subscribe_is_in_flight(moqt_relay: RelayUnderTest,
                                                            rng: np.random.Generator) -> None:
    """The publisher keeps publishing while the SUBSCRIBE travels through the relay: whatever L the relay
    reports, objects <= L come by the fill and objects > L by the subscription, each exactly once."""
    async def scenario() -> list[str]:
        problems: list[str] = []
        for attempt in range(3):
            ns = moqt_relay.namespace(rng)
            async with publisher(moqt_relay, ns) as pub, session(moqt_relay, "subscriber") as sub_client:
                publish_group(pub, rng, 0, 3)
                pending = asyncio.ensure_future(subscribe(sub_client, ns, auth=moqt_relay.token("subscriber")))
                group, obj = 1, 0
                while not pending.done():  # one object per scheduling turn until SUBSCRIBE_OK arrives
                    pub.publish(group, obj, payload(rng, group, obj))
                    obj += 1
                    if obj == 4:
                        pub.end_of_group(group, obj)
                        group, obj = group + 1, 0
                    await asyncio.sleep(0)
                sub = pending.result()
                for o in range(obj, 3):
                    pub.publish(group, o, payload(rng, group, o))
                pub.end_of_group(group, max(obj, 3))
                publish_group(pub, rng, group + 1, 2)
                pub.end_track()
                await finish(sub)
                problems += [f"[attempt {attempt}, L={sub.largest}] {p}"
                             for p in exactly_once_problems(sub, pub.published())]
        return problems

    run_check(scenario, "MOQT-FILL-EXACTLY-ONCE", "publishing during SUBSCRIBE")


@pytest.mark.req("MOQT-SUB-MULTIPLE", "MOQT-RELAY-FILL-FROM-CACHE", "MOQT-FILL-EXACTLY-ONCE")
def test_several_subscribers_joining_at_different_points(moqt_relay: RelayUnderTest,
                                                         rng: np.random.Generator) -> None:
    """A first subscriber makes the relay follow the track; a second session joins later (its fill comes
    from what the relay cached) with two subscriptions of its own: each subscription gets every object once."""
    async def scenario() -> list[str]:
        ns = moqt_relay.namespace(rng)
        token = moqt_relay.token("subscriber")
        async with publisher(moqt_relay, ns) as pub, session(moqt_relay, "early") as early, \
                session(moqt_relay, "late") as late:
            publish_group(pub, rng, 0, 3)
            first = await subscribe(early, ns, auth=token)
            publish_group(pub, rng, 1, 4)
            publish_group(pub, rng, 2, 2, end_of_group=False)
            await asyncio.wait_for(_until_received(first, pub.track.largest), CLIENT_TIMEOUT)
            second = await subscribe(late, ns, auth=token)
            third = await subscribe(late, ns, auth=token)
            pub.publish(2, 2, payload(rng, 2, 2))
            pub.end_of_group(2, 3)
            publish_group(pub, rng, 3, 3)
            pub.end_track()
            problems: list[str] = []
            for label, sub in (("early", first), ("late #1", second), ("late #2", third)):
                await finish(sub)
                problems += [f"[{label}, L={sub.largest}] {p}" for p in exactly_once_problems(sub, pub.published())]
            return problems

    run_check(scenario, "MOQT-SUB-MULTIPLE", "several subscribers")


async def _until_received(sub: Any, loc: Location) -> None:
    """Wait (bounded by the caller) until the subscription delivered ``loc`` (fill or subscription)."""
    while loc not in sub.seen:
        await sub.next_object()


@pytest.mark.req("MOQT-RELAY-END-MARKERS", "MOQT-SUB-PUBLISH-DONE", "MOQT-DATA-FIN", "MOQT-DATA-FIRST-OBJECT")
def test_end_of_group_and_end_of_track_reach_the_subscriber(moqt_relay: RelayUnderTest,
                                                            rng: np.random.Generator) -> None:
    """Subscribed before the first object: each group's End of Group and the track's End of Track (as
    Object {L,0}, profile section 9.3) are forwarded, each subgroup stream is FINed, PUBLISH_DONE
    TRACK_ENDED counts every data stream."""
    async def scenario() -> list[str]:
        ns = moqt_relay.namespace(rng)
        per = [int(rng.integers(1, 4)) for _ in range(int(rng.integers(2, 5)))]
        async with publisher(moqt_relay, ns) as pub, session(moqt_relay, "subscriber") as sub_client:
            sub = await subscribe(sub_client, ns, fill=False, auth=moqt_relay.token("subscriber"))
            for g, n in enumerate(per):
                publish_group(pub, rng, g, n)
            pub.end_track()
            done = await finish(sub)
            problems: list[str] = []
            statuses = {o.location: o.status for o in sub.objects if o.kind == "subgroup" and o.status}
            for g, n in enumerate(per):
                marker = Location(g, n)
                if statuses.get(marker) == ObjectStatus.END_OF_GROUP:
                    continue
                # Re-expressed as the END_OF_GROUP header bit on the stream that carried the group's last
                # object, ended with FIN (profile section 12, "Non-existent ranges may be re-expressed").
                streams = {o.stream_id for o in sub.objects if o.location == Location(g, n - 1)}
                if not any(getattr(sub.headers.get(s), "end_of_group", False)
                           and sub.subgroup_streams.get(s) == "fin" for s in streams):
                    problems.append(f"End of Group of group {g} (Object {marker}) did not reach the subscriber")
            eot = Location(len(per), 0)
            if statuses.get(eot) != ObjectStatus.END_OF_TRACK:
                problems.append(f"End of Track at {eot} did not reach the subscriber (statuses seen: "
                                f"{ {str(k): v for k, v in statuses.items()} })")
            # Subscribed before the first object: each forwarded stream starts with its subgroup's first object.
            unset = [sid for sid, h in sub.headers.items() if sid in sub.subgroup_streams and not h.first_object]
            if unset:
                problems.append(f"FIRST_OBJECT not set on forwarded subgroup streams {unset} that start with the "
                                "subgroup's first object (MOQT-DATA-FIRST-OBJECT)")
            bad = {s: state for s, state in sub.subgroup_streams.items() if state != "fin"}
            if bad:
                problems.append(f"subgroup streams not ended with FIN: {bad}")
            if done.status_code != PublishDoneCode.TRACK_ENDED:
                problems.append(f"PUBLISH_DONE status 0x{done.status_code:x}, expected TRACK_ENDED (0x2)")
            if done.stream_count != sub.streams_seen():
                problems.append(f"PUBLISH_DONE Stream Count {done.stream_count}, but {sub.streams_seen()} data "
                                "streams were opened for the subscription")
            return problems

    run_check(scenario, "MOQT-RELAY-END-MARKERS", "end markers")


@pytest.mark.req("MOQT-RELAY-NO-MODIFY", "MOQT-RELAY-NO-REORDER")
def test_forwarded_objects_are_unchanged_and_in_order(moqt_relay: RelayUnderTest, rng: np.random.Generator) -> None:
    """Objects of every shape (empty Normal object, one byte, several packets, binary; two subgroups of a
    group with their own priorities; Object Properties) arrive with the fields they were published with,
    in their order on each stream."""
    from kvconform.moqt.structures import KeyValuePair, encode_kvps

    props = encode_kvps([KeyValuePair(0x78, int(rng.integers(0, 1 << 20))), KeyValuePair(0x79, rng.bytes(5))])

    async def scenario() -> list[str]:
        ns = moqt_relay.namespace(rng)
        async with publisher(moqt_relay, ns, object_properties=True) as pub, \
                session(moqt_relay, "subscriber") as sub_client:
            sub = await subscribe(sub_client, ns, fill=False, auth=moqt_relay.token("subscriber"))
            pub.publish(0, 0, rng.bytes(40), properties=props, priority=3)
            pub.publish(0, 1, b"", priority=3)
            pub.publish(0, 2, b"\x00", priority=3)
            pub.publish(0, 3, rng.bytes(70_000), priority=3)
            pub.publish(0, 5, rng.bytes(9), subgroup=1, priority=200)  # a gap in Object IDs, another subgroup
            pub.publish(0, 6, rng.bytes(1300), subgroup=1, priority=200, properties=props)
            pub.end_of_group(0, 7, subgroup=1, priority=200)
            pub.publish(1, 0, rng.bytes(100), priority=0)
            pub.end_of_group(1, 1, priority=0)
            pub.end_track()
            await finish(sub)
            problems: list[str] = []
            sent = pub.track.objects
            per_stream: dict[int, list[int]] = {}
            for o in sub.objects:
                if o.kind != "subgroup":
                    continue
                per_stream.setdefault(o.stream_id, []).append(o.location.object)
                want = sent.get(o.location)
                if want is None:
                    problems.append(f"{o.location}: forwarded but never published")
                    continue
                got = (o.payload, o.status, o.subgroup_id, o.publisher_priority, o.properties or b"")
                exp = (want.payload, want.status, want.subgroup_id, want.publisher_priority, want.properties)
                for name, g, e in zip(("payload", "status", "subgroup", "priority", "properties"), got, exp,
                                      strict=True):
                    if g != e and not (name == "priority" and g is None):  # None: DEFAULT_PRIORITY inherited
                        problems.append(f"{o.location}: {name} {_short(g)}, published {_short(e)}")
            for sid, ids in per_stream.items():
                if ids != sorted(ids):
                    problems.append(f"stream {sid}: objects in order {ids}, published ascending")
            missing = sorted(set(sent) - {o.location for o in sub.objects})
            if missing:
                problems.append(f"published objects never forwarded: {[str(m) for m in missing]}")
            return problems

    run_check(scenario, "MOQT-RELAY-NO-MODIFY", "forwarding")


def _short(value: object) -> str:
    """A field for a failure message: long byte strings by length and digest prefix."""
    if isinstance(value, bytes) and len(value) > 16:
        return f"<{len(value)} bytes, sha256 {hashlib.sha256(value).hexdigest()[:12]}>"
    return repr(value)


@pytest.mark.req("MOQT-SUB-FORWARD")
def test_forward_state_0_sends_nothing_until_updated(moqt_relay: RelayUnderTest, rng: np.random.Generator) -> None:
    """FORWARD 0: no object and no fill stream, control messages still flow; REQUEST_UPDATE FORWARD 1 starts
    delivery after the Largest Object of its REQUEST_OK (profile section 11.1)."""
    from kvconform.moqt.client import build_parameters
    from kvconform.moqt.filters import FillParameters, LocationFilter

    async def scenario() -> list[str]:
        ns = moqt_relay.namespace(rng)
        token = moqt_relay.token("subscriber")
        problems: list[str] = []
        async with publisher(moqt_relay, ns) as pub, session(moqt_relay, "paused") as paused_client, \
                session(moqt_relay, "witness") as witness_client:
            publish_group(pub, rng, 0, 2)
            paused = await paused_client.subscribe(ns, pub.track.name, forward=0, fill=FillParameters(), auth=token,
                                                   location_filter=LocationFilter.next_object())
            witness = await subscribe(witness_client, ns, fill=False, auth=token)
            publish_group(pub, rng, 1, 3)
            while Location(1, 3) not in witness.seen:  # barrier: the relay forwarded group 1
                await witness.next_object(CLIENT_TIMEOUT)
            if paused.objects or paused.fills or paused.subgroup_streams:
                problems.append(f"FORWARD 0: {len(paused.objects)} objects, fill streams {paused.fills}, subgroup "
                                f"streams {paused.subgroup_streams} delivered")
            ok = await paused.update(build_parameters(forward=1), CLIENT_TIMEOUT)
            record("received", "REQUEST_OK", largest=str(ok.largest_object))
            pub.publish(2, 0, payload(rng, 2, 0))
            obj = await paused.next_object(CLIENT_TIMEOUT)
            if obj.location != Location(2, 0):
                problems.append(f"after FORWARD 1 the first object was {obj.location} ({obj.kind}), expected {{2,0}}")
        return problems

    run_check(scenario, "MOQT-SUB-FORWARD", "FORWARD 0 then 1")


@pytest.mark.req("MOQT-RELAY-TRACK-PROPERTIES")
def test_track_properties_reach_subscribers(moqt_relay: RelayUnderTest, rng: np.random.Generator) -> None:
    """The publisher's Track Properties, an unknown application property included, come back unchanged in
    SUBSCRIBE_OK and FETCH_OK (profile section 8)."""
    from kvconform.fixtures.moqt import fetch
    from kvconform.moqt.structures import KeyValuePair

    props = (KeyValuePair(0x0E, 7), KeyValuePair(0x78, int(rng.integers(0, 1 << 30))),
             KeyValuePair(0x7B, b"kvconform " + rng.bytes(6)))

    async def scenario() -> list[str]:
        ns = moqt_relay.namespace(rng)
        token = moqt_relay.token("subscriber")
        problems: list[str] = []
        async with publisher(moqt_relay, ns, properties=props) as pub, session(moqt_relay, "subscriber") as client:
            publish_group(pub, rng, 0, 2)
            sub = await subscribe(client, ns, auth=token)
            if sub.ok.track_properties != props:
                problems.append(f"SUBSCRIBE_OK Track Properties {sub.ok.track_properties}, published {props}")
            result = await fetch(client, ns, auth=token)
            got = result.request.response.track_properties
            if got != props:
                problems.append(f"FETCH_OK Track Properties {got}, published {props}")
        return problems

    run_check(scenario, "MOQT-RELAY-TRACK-PROPERTIES", "Track Properties")


@pytest.mark.req("MOQT-PARAM-RANGE-FILTER")
def test_object_id_filter_selects_the_first_objects(moqt_relay: RelayUnderTest, rng: np.random.Generator) -> None:
    """OBJECTID_FILTER 0..n-1 (the KVCS "first n blocks" recipe) on Next Object + fill: only Object IDs
    below n arrive, by the fill and by the subscription (profile sections 7.5, 11.3)."""
    from kvconform.moqt.filters import RangeFilter
    from kvconform.moqt.structures import SetupOption
    from kvconform.verdicts import inconclusive

    n = int(rng.integers(1, 3))

    async def scenario() -> list[str]:
        ns = moqt_relay.namespace(rng)
        token = moqt_relay.token("subscriber")
        problems: list[str] = []
        async with publisher(moqt_relay, ns) as pub, session(moqt_relay, "subscriber") as client:
            setup = client.session.peer_setup
            limit = [kv.value for kv in setup.options if kv.type == SetupOption.MAX_FILTER_RANGES] if setup else []
            if not limit or not limit[0]:
                inconclusive("the relay's SETUP allows no Range Filters (MAX_FILTER_RANGES 0), so none can be sent")
            for g in range(2):
                publish_group(pub, rng, g, 4)
            sub = await subscribe(client, ns, auth=token, range_filters=(RangeFilter.first_objects(n),))
            for g in range(2, 4):
                publish_group(pub, rng, g, 4)
            pub.end_track()
            await finish(sub)
            got = sorted(o.location for o in sub.objects if o.end_of_range is None and o.status == ObjectStatus.NORMAL)
            want = sorted(loc for loc in pub.published() if loc.object < n)
            if got != want:
                problems.append(f"OBJECTID_FILTER 0..{n - 1}: received {[str(x) for x in got]}, expected "
                                f"{[str(x) for x in want]}")
        return problems

    run_check(scenario, "MOQT-PARAM-RANGE-FILTER", "OBJECTID_FILTER")


@pytest.mark.req("MOQT-FILL-CANCEL-RESETS")
def test_cancelling_the_subscription_resets_its_open_fill(moqt_relay: RelayUnderTest, rng: np.random.Generator) -> None:
    """The publisher holds the relay's upstream FETCH, so the fill of a subscriber that joins mid-track stays
    open; the subscriber cancels its SUBSCRIBE: the relay must reset the fill stream (not FIN it)."""
    from kvconform.moqt.messages import Fetch
    from kvconform.moqt.session import RequestReceived
    from kvconform.verdicts import inconclusive

    held = asyncio.Event()

    def hold_fetch(client: Any, event: RequestReceived) -> bool:
        if isinstance(event.message, Fetch):
            held.set()
            return True  # never answered: the relay's fill cannot complete
        return False

    async def scenario() -> list[str]:
        ns = moqt_relay.namespace(rng)
        async with publisher(moqt_relay, ns, on_request=hold_fetch) as pub, \
                session(moqt_relay, "subscriber") as client:
            publish_group(pub, rng, 0, 3)
            sub = await subscribe(client, ns, auth=moqt_relay.token("subscriber"))
            try:
                await asyncio.wait_for(held.wait(), CLIENT_TIMEOUT)
                await asyncio.wait_for(sub.wait_streams(lambda: bool(sub.fills)), CLIENT_TIMEOUT)
            except TimeoutError:
                inconclusive("the relay neither FETCHed the missing objects upstream nor opened the fill stream "
                             "while they were missing, so no fill stream was open to cancel")
            if "open" not in sub.fills.values():
                inconclusive(f"the fill ended ({sub.fills}) before the subscription could be cancelled")
            sub.cancel()
            record("sent", "cancel SUBSCRIBE (RESET_STREAM + STOP_SENDING)", fills=dict(sub.fills))
            try:
                await asyncio.wait_for(sub.wait_streams(lambda: "open" not in sub.fills.values()), 3.0)
            except TimeoutError:
                return [f"3 s after the cancellation the fill stream is still open: {sub.fills}"]
            bad = {sid: state for sid, state in sub.fills.items() if state != "reset"}
            return [f"fill streams not reset after the cancellation: {bad}"] if bad else []

    run_check(scenario, "MOQT-FILL-CANCEL-RESETS", "cancel with an open fill")

