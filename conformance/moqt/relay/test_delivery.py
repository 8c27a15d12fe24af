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

from kvconform import sweep
from kvconform.fixtures.moqt import (
    CLIENT_TIMEOUT,
    OnceRules,
    Publisher,
    RelayUnderTest,
    done_after_streams,
    exactly_once,
    fetch,
    finish,
    packet_tap,
    publisher,
    record,
    run_findings,
    session,
    subscribe,
    waiting,
)
from kvconform.moqt.client import build_parameters
from kvconform.moqt.data import ObjectStatus
from kvconform.moqt.errors import PublishDoneCode
from kvconform.moqt.filters import LocationFilter, RangeFilter
from kvconform.moqt.messages import Fetch
from kvconform.moqt.parameters import FillParameters
from kvconform.moqt.session import RequestReceived
from kvconform.moqt.structures import KeyValuePair, Location, SetupOption, encode_kvps
from kvconform.verdicts import Findings, inconclusive

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


# Fill payloads are served from the relay's cache, subscription payloads forwarded live.
MID_TRACK = OnceRules(live="MOQT-RELAY-NO-MODIFY", cached="MOQT-RELAY-CACHE-IDENTICAL")
ONCE_FROM_CACHE = OnceRules(gaps="MOQT-RELAY-FILL-FROM-CACHE")


@pytest.mark.req("MOQT-FILL-EXACTLY-ONCE", "MOQT-FILL-STREAM", "MOQT-SUB-LARGEST-OBJECT", "MOQT-RELAY-LARGEST-OBJECT",
                 "MOQT-RELAY-NO-MODIFY", "MOQT-RELAY-CACHE-IDENTICAL")
def test_next_object_plus_fill_is_exactly_once_mid_track(moqt_relay: RelayUnderTest, rng: np.random.Generator) -> None:
    async def scenario(f: Findings) -> None:
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
                f.expect(sub.largest is not None, "MOQT-SUB-LARGEST-OBJECT",
                         f"[{split}] SUBSCRIBE_OK LARGEST_OBJECT: seen absent, expected {expected_l} (objects were "
                         "published)")
                f.expect(sub.largest is None or sub.largest == expected_l, "MOQT-RELAY-LARGEST-OBJECT",
                         f"[{split}] SUBSCRIBE_OK LARGEST_OBJECT: seen {sub.largest}, expected the publisher's "
                         f"Largest Object {expected_l}")
                publish_group(pub, rng, cut, per[cut], start=inside)
                for g in range(cut + 1, len(per)):
                    publish_group(pub, rng, g, per[g])
                pub.end_track()
                await finish(sub)
                exactly_once(f, split, sub, pub.published(), MID_TRACK)
                f.expect(bool(sub.fills) or sub.largest is None, "MOQT-FILL-STREAM",
                         f"[{split}] fill stream: seen none, expected one (FILL_PARAMETERS with LARGEST_OBJECT "
                         f"{sub.largest})")

    run_findings("exactly-once scenarios", scenario)


@pytest.mark.req("MOQT-FILL-EXACTLY-ONCE", "MOQT-SUB-NEXT-OBJECT")
def test_objects_published_while_the_subscribe_is_in_flight(moqt_relay: RelayUnderTest,
                                                            rng: np.random.Generator) -> None:
    """The publisher keeps publishing while the SUBSCRIBE travels through the relay: whatever L the relay
    reports, objects <= L come by the fill and objects > L by the subscription, each exactly once."""
    async def scenario(f: Findings) -> None:
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
                # Next Object: the subscription carries only what came after L (item 3 of section 11.4); judged
                # first, since the exactly-once bookkeeping counts such an object as a duplicate too.
                late = [o.location for o in sub.objects if o.kind == "subgroup" and sub.largest is not None
                        and o.location <= sub.largest]
                f.expect(not late, "MOQT-SUB-NEXT-OBJECT",
                         f"[attempt {attempt}] subscription objects: seen {[str(x) for x in late[:6]]} at or below "
                         f"LARGEST_OBJECT {sub.largest}, expected only later ones (Next Object)")
                exactly_once(f, f"attempt {attempt}", sub, pub.published())

    run_findings("publishing during SUBSCRIBE", scenario)


@pytest.mark.req("MOQT-SUB-MULTIPLE", "MOQT-RELAY-FILL-FROM-CACHE", "MOQT-FILL-EXACTLY-ONCE")
def test_several_subscribers_joining_at_different_points(moqt_relay: RelayUnderTest,
                                                         rng: np.random.Generator) -> None:
    """A first subscriber makes the relay follow the track; a second session joins later (its fill comes
    from what the relay cached) with two subscriptions of its own: each subscription gets every object once."""
    async def scenario(f: Findings) -> None:
        ns = moqt_relay.namespace(rng)
        token = moqt_relay.token("subscriber")
        async with publisher(moqt_relay, ns) as pub, session(moqt_relay, "early") as early, \
                session(moqt_relay, "late") as late:
            publish_group(pub, rng, 0, 3)
            first = await subscribe(early, ns, auth=token)
            publish_group(pub, rng, 1, 4)
            publish_group(pub, rng, 2, 2, end_of_group=False)
            with waiting("the first subscriber's copy of every object so far"):
                await asyncio.wait_for(_until_received(first, pub.track.largest), CLIENT_TIMEOUT)
            second = await subscribe(late, ns, auth=token)
            third = await subscribe(late, ns, auth=token)
            pub.publish(2, 2, payload(rng, 2, 2))
            pub.end_of_group(2, 3)
            publish_group(pub, rng, 3, 3)
            pub.end_track()
            each: dict[str, Findings] = {}
            for label, sub in (("early", first), ("late #1", second), ("late #2", third)):
                await finish(sub)
                each[label] = Findings(label)
                exactly_once(each[label], label, sub, pub.published(), ONCE_FROM_CACHE)
            # What every subscription suffers is the fill's doing; what only some suffer, their multiplicity's.
            broken = [label for label, found in each.items() if found.problems]
            for found in each.values():
                for req, problem in found.problems:
                    if req == "MOQT-FILL-EXACTLY-ONCE" and len(broken) < len(each):
                        req = "MOQT-SUB-MULTIPLE"
                    f.add(req, problem)
            for req in ("MOQT-SUB-MULTIPLE", "MOQT-FILL-EXACTLY-ONCE", "MOQT-RELAY-FILL-FROM-CACHE"):
                f.expect(True, req, "")

    run_findings("several subscribers", scenario)


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
    async def scenario(f: Findings) -> None:
        ns = moqt_relay.namespace(rng)
        per = [int(rng.integers(1, 4)) for _ in range(int(rng.integers(2, 5)))]
        async with publisher(moqt_relay, ns) as pub, session(moqt_relay, "subscriber") as sub_client:
            sub = await subscribe(sub_client, ns, fill=False, auth=moqt_relay.token("subscriber"))
            for g, n in enumerate(per):
                publish_group(pub, rng, g, n)
            pub.end_track()
            done = await finish(sub)
            statuses = {o.location: o.status for o in sub.objects if o.kind == "subgroup" and o.status}
            for g, n in enumerate(per):
                marker = Location(g, n)
                if statuses.get(marker) == ObjectStatus.END_OF_GROUP:
                    f.expect(True, "MOQT-RELAY-END-MARKERS", "")
                    continue
                # Re-expressed as the END_OF_GROUP header bit on the stream that carried the group's last
                # object, ended with FIN (profile section 12, "Non-existent ranges may be re-expressed").
                streams = {o.stream_id for o in sub.objects if o.location == Location(g, n - 1)}
                f.expect(any(getattr(sub.headers.get(s), "end_of_group", False)
                             and sub.subgroup_streams.get(s) == "fin" for s in streams), "MOQT-RELAY-END-MARKERS",
                         f"End of Group of group {g}: seen neither Object {marker} with status END_OF_GROUP nor the "
                         "END_OF_GROUP bit on the FINed stream of its last object, expected one of them")
            eot = Location(len(per), 0)
            f.expect(statuses.get(eot) == ObjectStatus.END_OF_TRACK, "MOQT-RELAY-END-MARKERS",
                     f"End of Track Object {eot}: seen status {statuses.get(eot)} (statuses seen: "
                     f"{ {str(k): v for k, v in statuses.items()} }), expected END_OF_TRACK (4)")
            # Subscribed before the first object: each forwarded stream starts with its subgroup's first object.
            unset = [sid for sid, h in sub.headers.items() if sid in sub.subgroup_streams and not h.first_object]
            f.expect(not unset, "MOQT-DATA-FIRST-OBJECT",
                     f"SUBGROUP_HEADER FIRST_OBJECT of forwarded streams {unset}: seen unset, expected set (each "
                     "starts with its subgroup's first object)")
            bad = {s: state for s, state in sub.subgroup_streams.items() if state != "fin"}
            f.expect(not bad, "MOQT-DATA-FIN", f"subgroup streams {bad}: seen not ended with FIN, expected FIN")
            f.expect(done.status_code == PublishDoneCode.TRACK_ENDED, "MOQT-SUB-PUBLISH-DONE",
                     f"PUBLISH_DONE Status Code: seen 0x{done.status_code:x}, expected TRACK_ENDED (0x2)")
            f.expect(done.stream_count == sub.streams_seen(), "MOQT-SUB-PUBLISH-DONE",
                     f"PUBLISH_DONE Stream Count: seen {done.stream_count}, expected {sub.streams_seen()} (the data "
                     "streams opened for the subscription)")

    run_findings("end markers", scenario)


UNKNOWN_STREAM_COUNT = 2**64 - 1
# Groups of the ended track: one (End of Track right after the first End of Group) and several.
LATE_GROUPS = sweep.pick([1, 4], [2, 9])


@pytest.mark.req("MOQT-SUB-PUBLISH-DONE", "MOQT-SUB-LARGEST-OBJECT", "MOQT-FILL-EXACTLY-ONCE")
@pytest.mark.parametrize("groups", LATE_GROUPS)
def test_a_subscriber_after_the_end_gets_the_track_then_publish_done(moqt_relay: RelayUnderTest,
                                                                     rng: np.random.Generator, groups: int) -> None:
    """A subscriber that joins after End of Track (the relay cached the track through an earlier subscriber)
    with Next Object + fill {0,0}: SUBSCRIBE_OK LARGEST_OBJECT is the End of Track Location or the last object,
    the fill carries every object once, PUBLISH_DONE TRACK_ENDED counts the fill stream; on it and on the earlier
    live subscription PUBLISH_DONE was sent only after every stream it counts was closed, judged by the QUIC
    packet numbers the relay sent them in (which network reordering and loss cannot invert;
    kvconform.moqt.sendorder)."""
    req = "MOQT-SUB-PUBLISH-DONE"

    async def scenario(f: Findings) -> None:
        ns = moqt_relay.namespace(rng)
        per = [int(rng.integers(1, 4)) for _ in range(groups)]
        async with publisher(moqt_relay, ns) as pub, session(moqt_relay, "subscriber") as early_client, \
                session(moqt_relay, "subscriber") as late_client:
            tap, early_tap = packet_tap(late_client), packet_tap(early_client)
            early = await subscribe(early_client, ns, fill=False, auth=moqt_relay.token("subscriber"))
            for g, n in enumerate(per):
                publish_group(pub, rng, g, n)
            pub.end_track()
            await finish(early)  # the relay has the whole track and its end
            late = await subscribe(late_client, ns, auth=moqt_relay.token("subscriber"))
            # The last object published, not the track's Largest (after end_track that is the End of Track
            # marker's Location, so the check would accept End of Track only, against its own docstring).
            last, eot = max(pub.published()), Location(len(per), 0)
            f.expect(late.largest in (last, eot), "MOQT-SUB-LARGEST-OBJECT",
                     f"late SUBSCRIBE_OK LARGEST_OBJECT: seen {late.largest}, expected {eot} (End of Track) or the "
                     f"last object {last}")
            done = await finish(late)
            exactly_once(f, "late", late, pub.published(), OnceRules())
            f.expect(done.status_code == PublishDoneCode.TRACK_ENDED, req,
                     f"late PUBLISH_DONE Status Code: seen 0x{done.status_code:x}, expected TRACK_ENDED (0x2)")
            f.expect(done.stream_count in (late.streams_seen(), UNKNOWN_STREAM_COUNT), req,
                     f"late PUBLISH_DONE Stream Count: seen {done.stream_count}, expected {late.streams_seen()} (the "
                     "fill stream included)")
            for label, sub, tapped in (("live", early, early_tap), ("late", late, tap)):
                done_after_streams(f, req, label, sub, tapped.snapshot())

    run_findings("late subscriber", scenario)


@pytest.mark.req("MOQT-RELAY-NO-MODIFY", "MOQT-RELAY-NO-REORDER")
def test_forwarded_objects_are_unchanged_and_in_order(moqt_relay: RelayUnderTest, rng: np.random.Generator) -> None:
    """Objects of every shape (empty Normal object, one byte, several packets, binary; two subgroups of a
    group with their own priorities; Object Properties) arrive with the fields they were published with,
    in their order on each stream."""

    props = encode_kvps([KeyValuePair(0x78, int(rng.integers(0, 1 << 20))), KeyValuePair(0x79, rng.bytes(5))])

    async def scenario(f: Findings) -> None:
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
            sent = pub.track.objects
            per_stream: dict[int, list[int]] = {}
            f.expect(True, "MOQT-RELAY-NO-MODIFY", "")
            for o in sub.objects:
                if o.kind != "subgroup":
                    continue
                per_stream.setdefault(o.stream_id, []).append(o.location.object)
                want = sent.get(o.location)
                if want is None:
                    f.add("MOQT-RELAY-NO-MODIFY", f"{o.location}: forwarded, expected only published objects")
                    continue
                got = (o.payload, o.status, o.subgroup_id, o.publisher_priority, o.properties or b"")
                exp = (want.payload, want.status, want.subgroup_id, want.publisher_priority, want.properties)
                for name, g, e in zip(("payload", "status", "subgroup", "priority", "properties"), got, exp,
                                      strict=True):
                    if g != e and not (name == "priority" and g is None):  # None: DEFAULT_PRIORITY inherited
                        f.add("MOQT-RELAY-NO-MODIFY", f"{o.location} {name}: seen {_short(g)}, expected the "
                                                      f"published {_short(e)}")
            for sid, ids in per_stream.items():
                f.expect(ids == sorted(ids), "MOQT-RELAY-NO-REORDER",
                         f"stream {sid} Object IDs in arrival order: seen {ids}, expected ascending as published")
            missing = sorted(set(sent) - {o.location for o in sub.objects})
            f.expect(not missing, "MOQT-RELAY-NO-REORDER",
                     f"published objects: seen {[str(m) for m in missing]} never forwarded, expected none dropped")

    run_findings("forwarding", scenario)


def _short(value: object) -> str:
    """A field for a failure message: long byte strings by length and digest prefix."""
    if isinstance(value, bytes) and len(value) > 16:
        return f"<{len(value)} bytes, sha256 {hashlib.sha256(value).hexdigest()[:12]}>"
    return repr(value)


@pytest.mark.req("MOQT-SUB-FORWARD")
def test_forward_state_0_sends_nothing_until_updated(moqt_relay: RelayUnderTest, rng: np.random.Generator) -> None:
    """FORWARD 0: no object and no fill stream, control messages still flow; REQUEST_UPDATE FORWARD 1 starts
    delivery after the Largest Object of its REQUEST_OK (profile section 11.1)."""

    req = "MOQT-SUB-FORWARD"

    async def scenario(f: Findings) -> None:
        ns = moqt_relay.namespace(rng)
        token = moqt_relay.token("subscriber")
        async with publisher(moqt_relay, ns) as pub, session(moqt_relay, "paused") as paused_client, \
                session(moqt_relay, "witness") as witness_client:
            publish_group(pub, rng, 0, 2)
            with waiting("SUBSCRIBE_OK to the SUBSCRIBE with FORWARD 0"):
                paused = await paused_client.subscribe(ns, pub.track.name, forward=0, fill=FillParameters(),
                                                       auth=token, location_filter=LocationFilter.next_object())
            witness = await subscribe(witness_client, ns, fill=False, auth=token)
            publish_group(pub, rng, 1, 3)
            with waiting("group 1 at the witness subscriber (the barrier)"):
                while Location(1, 3) not in witness.seen:
                    await witness.next_object(CLIENT_TIMEOUT)
            f.expect(not (paused.objects or paused.fills or paused.subgroup_streams), req,
                     f"FORWARD 0: seen {len(paused.objects)} objects, fill streams {paused.fills}, subgroup streams "
                     f"{paused.subgroup_streams} delivered, expected nothing")
            with waiting("REQUEST_OK to REQUEST_UPDATE FORWARD 1", req):
                ok = await paused.update(build_parameters(forward=1), CLIENT_TIMEOUT)
            record("received", "REQUEST_OK", largest=str(ok.largest_object))
            pub.publish(2, 0, payload(rng, 2, 0))
            with waiting("the first object after FORWARD 1", req):
                obj = await paused.next_object(CLIENT_TIMEOUT)
            f.expect(obj.location == Location(2, 0), req,
                     f"first object after FORWARD 1: seen {obj.location} ({obj.kind}), expected {{2,0}}")

    run_findings("FORWARD 0 then 1", scenario, req=req)


@pytest.mark.req("MOQT-RELAY-TRACK-PROPERTIES")
def test_track_properties_reach_subscribers(moqt_relay: RelayUnderTest, rng: np.random.Generator) -> None:
    """The publisher's Track Properties, an unknown application property included, come back unchanged in
    SUBSCRIBE_OK and FETCH_OK (profile section 8)."""

    props = (KeyValuePair(0x0E, 7), KeyValuePair(0x78, int(rng.integers(0, 1 << 30))),
             KeyValuePair(0x7B, b"kvconform " + rng.bytes(6)))

    req = "MOQT-RELAY-TRACK-PROPERTIES"

    async def scenario(f: Findings) -> None:
        ns = moqt_relay.namespace(rng)
        token = moqt_relay.token("subscriber")
        async with publisher(moqt_relay, ns, properties=props) as pub, session(moqt_relay, "subscriber") as client:
            publish_group(pub, rng, 0, 2)
            sub = await subscribe(client, ns, auth=token)
            f.expect(sub.ok.track_properties == props, req,
                     f"SUBSCRIBE_OK Track Properties: seen {sub.ok.track_properties}, expected the published {props}")
            result = await fetch(client, ns, auth=token)
            got = result.request.response.track_properties
            f.expect(got == props, req, f"FETCH_OK Track Properties: seen {got}, expected the published {props}")

    run_findings("Track Properties", scenario, req=req)


@pytest.mark.req("MOQT-PARAM-RANGE-FILTER")
def test_object_id_filter_selects_the_first_objects(moqt_relay: RelayUnderTest, rng: np.random.Generator) -> None:
    """OBJECTID_FILTER 0..n-1 (the KVCS "first n blocks" recipe) on Next Object + fill: only Object IDs
    below n arrive, by the fill and by the subscription (profile sections 7.5, 11.3)."""

    n = int(rng.integers(1, 3))

    req = "MOQT-PARAM-RANGE-FILTER"

    async def scenario(f: Findings) -> None:
        ns = moqt_relay.namespace(rng)
        token = moqt_relay.token("subscriber")
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
            f.expect(got == want, req, f"objects with OBJECTID_FILTER 0..{n - 1}: seen {[str(x) for x in got]}, "
                                       f"expected {[str(x) for x in want]}")

    run_findings("OBJECTID_FILTER", scenario, req=req)


@pytest.mark.req("MOQT-FILL-CANCEL-RESETS")
def test_cancelling_the_subscription_resets_its_open_fill(moqt_relay: RelayUnderTest, rng: np.random.Generator) -> None:
    """The publisher holds the relay's upstream FETCH, so the fill of a subscriber that joins mid-track stays
    open; the subscriber cancels its SUBSCRIBE: the relay must reset the fill stream (not FIN it)."""

    held = asyncio.Event()

    def hold_fetch(client: Any, event: RequestReceived) -> bool:
        if isinstance(event.message, Fetch):
            held.set()
            return True  # never answered: the relay's fill cannot complete
        return False

    req = "MOQT-FILL-CANCEL-RESETS"

    async def scenario(f: Findings) -> None:
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
                f.add(req, f"fill streams 3 s after the cancellation: seen still open {sub.fills}, expected reset")
                return
            bad = {sid: state for sid, state in sub.fills.items() if state != "reset"}
            f.expect(not bad, req, f"fill streams after the cancellation: seen {bad}, expected reset")

    run_findings("cancel with an open fill", scenario, req=req)

