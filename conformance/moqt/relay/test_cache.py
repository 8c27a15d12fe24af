"""moqt-relay: objects served again (fill of a later subscriber, FETCH) are byte-identical to the published
ones in every field a cache must store (moqt-d22-profile section 12 "Caching"; EDR "Caching Relays").

A first subscriber makes the relay follow the track and receives all of it; then a second session joins
with Next Object + fill and FETCHes the whole track, both served from what the relay kept. Objects come
in every shape that exposes a lossy cache: empty, one byte, several packets, binary; Subgroup IDs 0, 1
and 3 (the fetch encoding's zero / next / explicit cases); priorities 0, 7 and 255; Object Properties.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

import numpy as np
import pytest

from kvconform import sweep
from kvconform.fixtures.moqt import (
    CLIENT_TIMEOUT,
    Publisher,
    RelayUnderTest,
    fetch,
    publisher,
    record,
    rejection,
    run_findings,
    session,
    sha,
    subscribe,
    waiting,
)
from kvconform.moqt.client import RequestRejected
from kvconform.moqt.errors import PublishDoneCode, RequestErrorCode
from kvconform.moqt.filters import LocationFilter
from kvconform.moqt.messages import Fetch
from kvconform.moqt.session import RequestReceived
from kvconform.moqt.structures import KeyValuePair, Location, PropertyType, encode_kvps
from kvconform.verdicts import Findings

pytestmark = pytest.mark.usefixtures("moqt_relay_sanity")


def publish_shapes(pub: Publisher, rng: np.random.Generator) -> None:
    props = encode_kvps([KeyValuePair(0x78, int(rng.integers(0, 1 << 30))), KeyValuePair(0x79, rng.bytes(7))])
    sizes = [0, 1, 1200, 70_000, int(rng.integers(2, 500))]
    for g, (subgroup, priority) in enumerate(((0, 7), (1, 0), (3, 255))):
        for o, size in enumerate(sizes):
            pub.publish(g, o, rng.bytes(size), subgroup=subgroup, priority=priority,
                        properties=props if o in (0, 3) else b"")
        pub.end_of_group(g, len(sizes), subgroup=subgroup, priority=priority)


def compare(f: Findings, req: str, label: str, objects: list[Any], published: dict[Location, Any]) -> None:
    """Every field a cache stores, of each object served, against the published one (under ``req``)."""
    seen = set()
    f.expect(True, req, "")
    for o in objects:
        if o.end_of_range is not None or o.status:
            continue
        seen.add(o.location)
        want = published.get(o.location)
        if want is None:
            f.add(req, f"[{label}] {o.location}: served, expected only published objects")
            continue
        f.expect(o.payload == want.payload, req,
                 f"[{label}] {o.location} payload: seen {sha(o.payload)}, expected the published {sha(want.payload)}")
        f.expect(o.subgroup_id == want.subgroup_id, req,
                 f"[{label}] {o.location} Subgroup ID: seen {o.subgroup_id}, expected {want.subgroup_id}")
        f.expect(o.publisher_priority in (None, want.publisher_priority), req,
                 f"[{label}] {o.location} Publisher Priority: seen {o.publisher_priority}, expected "
                 f"{want.publisher_priority}")
        f.expect((o.properties or b"") == want.properties, req,
                 f"[{label}] {o.location} Object Properties: seen {o.properties!r}, expected {want.properties!r}")
    missing = sorted(set(published) - seen)
    f.expect(not missing, req, f"[{label}] objects: {[str(m) for m in missing]} never served, expected every "
                               "published one")


# Group and Object IDs on both sides of the vi64 width steps (1 byte holds 0..127, 2 bytes ..16383, profile
# section 2) and of 32 bits, where a relay that keeps IDs in narrower integers wraps; the fetch encoding computes
# group and object deltas from them (section 9.4). --sweep wide adds the 3-, 4- and 8-byte steps.
VI64_GROUPS = sweep.pick([0, 127, 128, 16383, 16384, 2**32 - 1, 2**32],
                         [2**21 - 1, 2**21, 2**28 - 1, 2**28, 2**56 - 1, 2**56])
VI64_OBJECTS = (0, 127, 128, 16383, 16384)


async def _later_subscriber_sees_the_cache(f: Findings, client: Any, ns: Any, token: Any, published: Any) -> None:
    """A later subscriber's fill ends with FIN and, like its FETCH, carries every published object unchanged."""
    req = "MOQT-RELAY-CACHE-IDENTICAL"
    later = await subscribe(client, ns, auth=token)
    with waiting("the end of the later subscriber's fill stream"):
        state = await later.wait_fill(CLIENT_TIMEOUT)
    f.expect(state == "fin", req, f"[later subscriber, fill] fill stream: seen {state}, expected FIN")
    compare(f, req, "later subscriber, fill", [o for o in later.objects if o.kind == "fill"], published)
    try:
        result = await fetch(client, ns, auth=token)
        compare(f, req, "FETCH", result.objects, published)
    except RequestRejected as exc:
        f.add(req, f"[FETCH] of the cached track: seen {rejection(exc)}, expected FETCH_OK and the objects")


@pytest.mark.req("MOQT-RELAY-CACHE-IDENTICAL", "MOQT-RELAY-NO-MODIFY")
def test_ids_at_vi64_width_boundaries_survive_the_cache(moqt_relay: RelayUnderTest, rng: np.random.Generator) -> None:
    """Groups and objects whose IDs sit at the vi64 width steps and at 2^32 are forwarded live with their IDs
    (MOQT-RELAY-NO-MODIFY), and a later subscriber's fill and a FETCH of the whole track serve every one of them
    at its own Location with its own payload (MOQT-RELAY-CACHE-IDENTICAL)."""
    async def scenario(f: Findings) -> None:
        ns = moqt_relay.namespace(rng)
        token = moqt_relay.token("subscriber")
        groups = sorted(VI64_GROUPS)
        async with publisher(moqt_relay, ns) as pub, session(moqt_relay, "first subscriber") as first_client, \
                session(moqt_relay, "later subscriber") as later_client:
            first = await subscribe(first_client, ns, fill=False, auth=token)
            for g in groups:
                for o in VI64_OBJECTS:
                    pub.publish(g, o, f"{g}.{o}:".encode() + rng.bytes(int(rng.integers(0, 40))))
                pub.end_of_group(g, VI64_OBJECTS[-1] + 1)
            pub.end_track()
            published = pub.published()
            with contextlib.suppress(TimeoutError):
                while not published.keys() <= first.seen:
                    await first.next_object(CLIENT_TIMEOUT)
            compare(f, "MOQT-RELAY-NO-MODIFY", "first subscriber, live",
                    [o for o in first.objects if o.kind == "subgroup"], published)
            await _later_subscriber_sees_the_cache(f, later_client, ns, token, published)

    run_findings("vi64 boundary IDs", scenario)


@pytest.mark.req("MOQT-RELAY-CACHE-IDENTICAL")
def test_cached_objects_are_byte_identical(moqt_relay: RelayUnderTest, rng: np.random.Generator) -> None:
    req = "MOQT-RELAY-CACHE-IDENTICAL"

    async def scenario(f: Findings) -> None:
        ns = moqt_relay.namespace(rng)
        token = moqt_relay.token("subscriber")
        async with publisher(moqt_relay, ns, object_properties=True) as pub, \
                session(moqt_relay, "first subscriber") as first_client, \
                session(moqt_relay, "later subscriber") as later_client:
            first = await subscribe(first_client, ns, auth=token)
            publish_shapes(pub, rng)
            published = pub.published()
            # The relay has received (and cached) everything once the first subscriber has it all: the
            # objects travel on several subgroup streams, which the transport may deliver in any order, so
            # the largest Location arriving says nothing of the others. On timeout compare() names the rest.
            with contextlib.suppress(TimeoutError):
                while not published.keys() <= first.seen:
                    await first.next_object(CLIENT_TIMEOUT)
            compare(f, req, "first subscriber, live", list(first.objects), published)
            await _later_subscriber_sees_the_cache(f, later_client, ns, token, published)

    run_findings("cache identity", scenario, req=req)


@pytest.mark.req("MOQT-RELAY-MAX-CACHE-DURATION")
def test_expired_objects_are_not_served_from_cache(moqt_relay: RelayUnderTest, rng: np.random.Generator) -> None:
    """Track Property MAX_CACHE_DURATION 300 ms; the relay received the objects live; 0.6 s later (real time:
    the expiry itself is under test) a FETCH must not be served from the expired entries, and the publisher
    refuses the relay's FETCH, so nothing may be delivered (a REQUEST_ERROR or unknown ranges instead)."""

    def refuse_fetch(client: Any, event: RequestReceived) -> bool:
        if isinstance(event.message, Fetch):
            client.session.reject(event.stream_id, RequestErrorCode.INTERNAL_ERROR, "kvconform: not served")
            return True
        return False

    req = "MOQT-RELAY-MAX-CACHE-DURATION"

    async def scenario(f: Findings) -> None:
        ns = moqt_relay.namespace(rng)
        token = moqt_relay.token("subscriber")
        props = (KeyValuePair(PropertyType.MAX_CACHE_DURATION, 300),)
        async with publisher(moqt_relay, ns, properties=props, on_request=refuse_fetch) as pub, \
                session(moqt_relay, "subscriber") as client:
            live = await subscribe(client, ns, fill=False, auth=token)
            for o in range(3):
                pub.publish(0, o, rng.bytes(64))
            with waiting("the three objects at the live subscriber"):
                while Location(0, 2) not in live.seen:
                    await live.next_object(CLIENT_TIMEOUT)
            await asyncio.sleep(0.6)  # let MAX_CACHE_DURATION pass: the condition under test, not a sync wait
            try:
                result = await fetch(client, ns, location_filter=LocationFilter.absolute_start(0, 0), auth=token)
            except RequestRejected as exc:
                record("received", "FETCH refused or reset", error=str(exc))
                f.expect(True, req, "")
                return
            served = [str(o.location) for o in result.objects if o.end_of_range is None]
            f.expect(not served, req, f"FETCH 0.6 s after the objects arrived, MAX_CACHE_DURATION 300 ms: seen "
                                      f"{served} served, expected none (a refusal or unknown ranges)")

    run_findings("MAX_CACHE_DURATION", scenario, req=req)


@pytest.mark.req("MOQT-DATA-MALFORMED-DUPLICATE")
def test_a_duplicate_object_with_another_payload_makes_the_track_malformed(moqt_relay: RelayUnderTest,
                                                                         rng: np.random.Generator) -> None:
    """The publisher sends Object {0,0} again on a second subgroup stream with a different payload: the
    relay must end the subscription with PUBLISH_DONE MALFORMED_TRACK (0x12) and never forward the second
    payload (profile sections 9.3, 12)."""

    req = "MOQT-DATA-MALFORMED-DUPLICATE"

    async def scenario(f: Findings) -> None:
        ns = moqt_relay.namespace(rng)
        async with publisher(moqt_relay, ns) as pub, session(moqt_relay, "subscriber") as client:
            sub = await subscribe(client, ns, fill=False, auth=moqt_relay.token("subscriber"))
            first, second = b"first " + rng.bytes(8), b"second " + rng.bytes(8)
            pub.publish(0, 0, first)
            with waiting("Object {0,0} at the subscriber"):
                while Location(0, 0) not in sub.seen:
                    await sub.next_object(CLIENT_TIMEOUT)
            session_ = pub.client.session
            for stream_id in list(pub.track.subscribers):  # the relay's upstream subscription(s)
                sid = session_.open_subgroup(stream_id, 0, 0, 128, first_object=True)
                session_.write_object(sid, 0, second, end_stream=True)
            record("sent", "duplicate Object {0,0} with another payload", len=len(second))
            with waiting("PUBLISH_DONE MALFORMED_TRACK after the conflicting duplicate", req):
                done = await sub.wait_done(CLIENT_TIMEOUT)
            f.expect(done.status_code == PublishDoneCode.MALFORMED_TRACK, req,
                     f"PUBLISH_DONE status: seen 0x{done.status_code:x}, expected MALFORMED_TRACK (0x12)")
            f.expect(not any(o.payload == second for o in sub.objects), req,
                     "the conflicting second payload: seen forwarded, expected never forwarded")

    run_findings("malformed duplicate", scenario, req=req)
