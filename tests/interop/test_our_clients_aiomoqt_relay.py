"""kvconform's publisher and subscriber (``kvconform.moqt.client``) through aiomoqt's relay.

The moqt-relay scenarios both sides support (PICS of ``testbeds/aiomoqt.yaml`` target aiomoqt-relay):
SETUP, PUBLISH_NAMESPACE + SUBSCRIBE routing, live delivery through a relay subscription, the KVCS
exactly-once pattern (Next Object + fill, profile §11.3-11.4), SUBSCRIBE_NAMESPACE discovery, FETCH, and
an unknown track. Each test uses its own namespace. A failure is a disagreement between the two stacks;
docs/interop-aiomoqt.md says whose, and an aiomoqt one is an xfail with its reason there and here.
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import pytest

from kvconform import evidence
from kvconform.moqt.client import MoqtClient, RequestRejected, connect
from kvconform.moqt.errors import PublishDoneCode, RequestErrorCode
from kvconform.moqt.filters import LocationFilter
from kvconform.moqt.structures import Location, TrackNamespace
from kvconform.targets.spec import Pics, parse_target

from .disagreements import AIOMOQT_FETCH_OPEN_END, AIOMOQT_NEXT_OBJECT_REPLAY
from .peers import RELAY_TARGET, RelayEndpoint, aiomoqt_testbed

pytestmark = pytest.mark.interop

TIMEOUT_S = 10.0
TRACK = b"k.raw.s0"
OBJECT_BYTES = 1500  # more than one QUIC packet per object



@pytest.fixture(scope="module")
def relay_pics() -> Pics:
    spec = parse_target(RELAY_TARGET, aiomoqt_testbed())
    return Pics(spec.pics, spec.source)


def _namespace(scenario: str) -> TrackNamespace:
    return TrackNamespace.of("kvconform-interop", scenario, secrets.token_hex(4))


def _payload(group: int, obj: int) -> bytes:
    # Distinct per Location, so a misrouted or duplicated object shows.
    head = f"g{group}o{obj}|".encode()
    return (head * (OBJECT_BYTES // len(head) + 1))[:OBJECT_BYTES]


@contextlib.asynccontextmanager
async def _client(url: str) -> AsyncIterator[MoqtClient]:
    client = await connect(url, timeout=TIMEOUT_S)
    try:
        yield client
    finally:
        await client.close(timeout=TIMEOUT_S)


def _run(url: str, body: Callable[[MoqtClient, MoqtClient], Awaitable[Any]]) -> Any:
    """Connect a publisher and a subscriber to ``url`` and run ``body(publisher, subscriber)``, bounded."""

    async def main() -> Any:
        async with asyncio.timeout(4 * TIMEOUT_S), _client(url) as publisher, _client(url) as subscriber:
            return await body(publisher, subscriber)

    return asyncio.run(main())


def test_setup_with_aiomoqt_relay(aiomoqt_relay_endpoint: RelayEndpoint, relay_pics: Pics) -> None:
    """Profile §1, §5: our client negotiates moqt-22 and receives the relay's SETUP; the declared
    MAX_FILTER_RANGES and implementation are what the wire says."""

    async def main() -> tuple[str | None, Any]:
        async with asyncio.timeout(TIMEOUT_S), _client(aiomoqt_relay_endpoint.url) as client:
            return client.connection.alpn, client.session.peer_setup

    alpn, setup = asyncio.run(main())
    assert alpn == "moqt-22", f"ALPN: got {alpn!r}, expected 'moqt-22'"
    assert setup is not None, "no SETUP from the relay"
    assert setup.implementation == str(relay_pics.get("moqt.implementation")).encode()
    assert setup.max_filter_ranges == relay_pics.get("moqt.max_filter_ranges")


def test_unknown_track_is_does_not_exist(aiomoqt_relay_endpoint: RelayEndpoint) -> None:
    """Profile §10.2, §12: SUBSCRIBE to a track no publisher announced -> REQUEST_ERROR DOES_NOT_EXIST."""

    async def body(publisher: MoqtClient, subscriber: MoqtClient) -> int | None:
        with pytest.raises(RequestRejected) as info:
            await subscriber.subscribe(_namespace("unknown"), TRACK, timeout=TIMEOUT_S)
        return info.value.code

    code = _run(aiomoqt_relay_endpoint.url, body)
    assert code == RequestErrorCode.DOES_NOT_EXIST, f"REQUEST_ERROR code: got {code}, expected 0x10 DOES_NOT_EXIST"


def test_live_delivery_through_relay(aiomoqt_relay_endpoint: RelayEndpoint) -> None:
    """Profile §12 (SUBSCRIBE routed upstream by namespace prefix, Established before SUBSCRIBE_OK),
    §9 and §11.4 item 7 (one subgroup stream per group, objects ascending, payloads unmodified), §6.2
    (PUBLISH_DONE TRACK_ENDED last)."""
    ns = _namespace("live")
    groups, per_group = 3, 5

    async def body(publisher: MoqtClient, subscriber: MoqtClient) -> Any:
        track = publisher.track(ns, TRACK)
        await publisher.publish_namespace(ns, timeout=TIMEOUT_S)
        sub = await subscriber.subscribe(ns, TRACK, timeout=TIMEOUT_S)
        for g in range(groups):
            track.publish_group(g, [_payload(g, o) for o in range(per_group)])
        expected = {Location(g, o): _payload(g, o) for g in range(groups) for o in range(per_group)}
        while not expected.keys() <= sub.payloads().keys():
            await sub.next_object(TIMEOUT_S)
        track.end_track()
        done = await sub.wait_done(TIMEOUT_S)
        return sub, expected, done

    sub, expected, done = _run(aiomoqt_relay_endpoint.url, body)
    evidence.record("note", "live-delivery", {"objects": len(sub.objects), "streams": len(sub.subgroup_streams),
                                              "publish_done": repr(done)})
    assert not sub.violations, sub.violations
    got = sub.payloads()
    assert {loc: got[loc] for loc in expected} == expected, "payloads differ from what was published"
    per_stream: dict[int, list[Location]] = {}
    for o in sub.objects:
        per_stream.setdefault(o.stream_id, []).append(o.location)
    # Streams interleave freely; within one subgroup stream objects ascend (§9, MOQT-RELAY-NO-REORDER).
    for sid, locations in per_stream.items():
        assert locations == sorted(locations), f"stream {sid}: objects out of order through the relay: {locations}"
    assert done.status_code == PublishDoneCode.TRACK_ENDED, f"PUBLISH_DONE status {done.status_code}"


@AIOMOQT_NEXT_OBJECT_REPLAY
def test_exactly_once_fill_then_live(aiomoqt_relay_endpoint: RelayEndpoint, relay_pics: Pics) -> None:
    """KVCS recipe (profile §11.3): Next Object + FILL_PARAMETERS {Absolute Start {0,0}} on a track with
    history; §11.4: fill objects <= LARGEST_OBJECT, live objects above it, every Location exactly once,
    the fill ends with FIN; §12: the relay fills from upstream (FETCH) what it has not cached."""
    relay_pics.require("moqt.relay.fill")
    ns = _namespace("fill")
    before, after, per_group = 2, 2, 4

    async def body(publisher: MoqtClient, subscriber: MoqtClient) -> Any:
        track = publisher.track(ns, TRACK)
        for g in range(before):
            track.publish_group(g, [_payload(g, o) for o in range(per_group)])
        await publisher.publish_namespace(ns, timeout=TIMEOUT_S)
        sub = await subscriber.subscribe_with_fill(ns, TRACK, timeout=TIMEOUT_S)
        fill_end = await sub.wait_fill(TIMEOUT_S)
        for g in range(before, before + after):
            track.publish_group(g, [_payload(g, o) for o in range(per_group)])
        expected = {Location(g, o): _payload(g, o) for g in range(before + after) for o in range(per_group)}
        while not expected.keys() <= sub.payloads().keys():
            await sub.next_object(TIMEOUT_S)
        return sub, expected, fill_end

    sub, expected, fill_end = _run(aiomoqt_relay_endpoint.url, body)
    evidence.record("note", "fill", {"largest": str(sub.largest), "fills": sub.fills,
                                     "kinds": [(o.kind, str(o.location)) for o in sub.objects]})
    assert fill_end == "fin", f"fill stream ended by {fill_end}, expected FIN (profile §11.2)"
    assert not sub.violations, sub.violations
    got = sub.payloads()
    assert {loc: got[loc] for loc in expected} == expected, "payloads differ from what was published"


def test_namespace_discovery(aiomoqt_relay_endpoint: RelayEndpoint, relay_pics: Pics) -> None:
    """Profile §12: SUBSCRIBE_NAMESPACE gets REQUEST_OK, then one NAMESPACE (the suffix after the prefix)
    when a publisher announces under the prefix; [d22] no PUBLISH_NAMESPACE is forwarded."""
    relay_pics.require("moqt.relay.subscribe_namespace")
    ns = _namespace("discovery")
    prefix = TrackNamespace(ns.fields[:2])

    async def body(publisher: MoqtClient, subscriber: MoqtClient) -> tuple[str, TrackNamespace]:
        watch = await subscriber.subscribe_namespace(prefix, timeout=TIMEOUT_S)
        await publisher.publish_namespace(ns, timeout=TIMEOUT_S)
        return await watch.next(TIMEOUT_S)

    kind, suffix = _run(aiomoqt_relay_endpoint.url, body)
    assert (kind, suffix) == ("namespace", ns.suffix_after(prefix)), \
        f"got {kind} {suffix}, expected NAMESPACE {ns.suffix_after(prefix)}"


@AIOMOQT_FETCH_OPEN_END
def test_fetch_through_relay(aiomoqt_relay_endpoint: RelayEndpoint, relay_pics: Pics) -> None:
    """Profile §6.2, §9.4, §12: a FETCH of published groups through the relay returns FETCH_OK and the
    objects in ascending order with unmodified payloads, on one fetch stream ending with FIN."""
    relay_pics.require("moqt.relay.fetch")
    ns = _namespace("fetch")
    groups, per_group = 2, 3

    async def body(publisher: MoqtClient, subscriber: MoqtClient) -> Any:
        track = publisher.track(ns, TRACK)
        for g in range(groups):
            track.publish_group(g, [_payload(g, o) for o in range(per_group)])
        await publisher.publish_namespace(ns, timeout=TIMEOUT_S)
        result = await subscriber.fetch(ns, TRACK, location_filter=LocationFilter.absolute_start(0, 0),
                                        timeout=TIMEOUT_S)
        return result

    result = _run(aiomoqt_relay_endpoint.url, body)
    objects = [o for o in result.objects if o.end_of_range is None]
    evidence.record("note", "fetch", {"objects": [str(o.location) for o in objects]})
    expected = [Location(g, o) for g in range(groups) for o in range(per_group)]
    assert [o.location for o in objects] == expected, f"fetched {[str(o.location) for o in objects]}"
    assert all(o.payload == _payload(o.location.group, o.location.object) for o in objects)

