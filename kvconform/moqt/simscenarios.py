"""Relay scenarios for the deterministic transport, each with its invariants (issue 24 item 3).

`relay_fill_and_fetch` runs the reference relay (or a subclass: the mutants of the harness tests) with one
publisher and three subscribers over a `SimNetwork`: groups are published, ``sub1`` joins after two groups, ``sub2``
mid-group, both with Next Object + FILL_PARAMETERS {Absolute Start {0,0}} (profile §11.3); the track ends and
``sub3`` FETCHes all of it from the relay, which does not follow it for that request's whole range (cut-through:
the relay answers as the objects arrive). The invariants (`check_exactly_once`, `check_fetch`) raise
``AssertionError`` naming the requirement broken. The value a run returns is a short, stable summary.

`relay_authorization` runs the relay with a policy: a publisher may publish under ``kvcs-1``, a subscriber may
subscribe under ``kvcs-1/scope-a`` only, while the publisher announces and publishes under ``scope-a`` and
``scope-b`` at the same time the subscriber asks for both; nothing of ``scope-b`` may reach that subscriber (no
object, no FETCH, no wider SUBSCRIBE_NAMESPACE), each request out of its scope is refused UNAUTHORIZED, and what
is in scope arrives whole (profile section 12). `relay_cache_expiry` publishes a track with MAX_CACHE_DURATION, lets its
publisher go, and FETCHes it once inside the duration (everything, unaltered) and once after it (no expired
object may start being served: EDR "MAX_CACHE_DURATION").
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Sequence
from typing import Any

from kvconform.moqt import client as mc
from kvconform.moqt.data import FetchObject, ObjectStatus
from kvconform.moqt.errors import RequestErrorCode
from kvconform.moqt.policy import policy_from_mapping
from kvconform.moqt.relay import Relay
from kvconform.moqt.simrun import Main, Sim
from kvconform.moqt.structures import AuthToken, KeyValuePair, Location, PropertyType, TrackNamespace

__all__ = ["NAME", "NS", "RelayFactory", "check_exactly_once", "check_fetch", "relay_authorization",
           "relay_cache_expiry", "relay_fill_and_fetch"]

NS = TrackNamespace.of("kvcs-1", "scope-a", "compat", "anchor", "pub-1")
NAME = b"k.raw.s0"
FETCH_NAME = b"k.raw.s1"
TIMEOUT = 20.0  # virtual seconds: every wait of the scenario is bounded by it
CUT_THROUGH_POLL = 0.001  # virtual seconds between two looks at what the FETCH delivered so far

RelayFactory = type[Relay]


def _payload(g: int, o: int) -> bytes:
    return f"g{g}o{o}-".encode() * (o + 1)


def check_exactly_once(who: str, sub: mc.Subscription, published: dict[Location, bytes]) -> tuple[int, int]:
    """MOQT-FILL-EXACTLY-ONCE (profile §11.4): every published object reached ``sub`` once, fill (<= L) or live
    (> L), unaltered, nothing else. Returns (fill objects, live objects)."""
    normal = [o for o in sub.objects if o.end_of_range is None and o.status == ObjectStatus.NORMAL]
    counts = Counter(o.location for o in normal)
    twice = sorted(loc for loc, n in counts.items() if n > 1)
    assert not twice, f"MOQT-FILL-EXACTLY-ONCE: {who} got {twice} more than once (profile §11.4 item 4)"
    missing = sorted(set(published) - set(counts))
    assert not missing, f"MOQT-FILL-EXACTLY-ONCE: {who} never got {missing} (fill FIN + track ended, §11.4 item 6)"
    extra = sorted(set(counts) - set(published))
    assert not extra, f"MOQT-FILL-EXACTLY-ONCE: {who} got {extra}, never published (out of scope)"
    altered = sorted(o.location for o in normal if o.payload != published[o.location])
    assert not altered, f"MOQT-RELAY-NO-MODIFY: {who} got altered payloads at {altered} (§11.4 item 8)"
    largest = sub.largest
    if largest is not None:
        wrong = sorted(o.location for o in normal if (o.kind == "fill") != (o.location <= largest))
        assert not wrong, (f"MOQT-FILL-EXACTLY-ONCE: {who}: {wrong} on the wrong side of LARGEST_OBJECT {largest} "
                           "(fill <= L < subscription, §11.4 item 3)")
    assert not sub.violations, f"MOQT-FILL-EXACTLY-ONCE: {who}: {sub.violations}"
    fill = sum(1 for o in normal if o.kind == "fill")
    return fill, len(normal) - fill


def check_fetch(who: str, objects: Sequence[mc.ReceivedObject], published: dict[Location, bytes]) -> int:
    """MOQT-FETCH-RANGE / MOQT-FETCH-ORDER: the whole track, ascending, each object once and unaltered."""
    got = [(o.location, o.payload) for o in objects if o.end_of_range is None]
    want = sorted(published.items())
    locations = [loc for loc, _ in got]
    assert locations == sorted(set(locations)), f"MOQT-FETCH-ORDER: {who} got {locations} (not ascending, once each)"
    assert [loc for loc, _ in want] == locations, (f"MOQT-FETCH-RANGE: {who} got {locations}, the track holds "
                                                  f"{[loc for loc, _ in want]}")
    assert got == want, f"MOQT-RELAY-NO-MODIFY: {who}: payloads differ from what was published"
    return len(got)


async def cut_through_fetch(pub: mc.MoqtClient, track: mc.LocalTrack, sub: mc.MoqtClient) -> mc.FetchResult:
    """``sub`` FETCHes all of ``track``, whose publisher answers the relay's upstream FETCH with Group 0 and holds the
    rest back until ``sub`` has received Group 0: a relay that stores the whole upstream range before serving it
    never gets there (the reference relay's cut-through design, test_relay's
    ``test_a_fetch_of_a_track_the_relay_does_not_follow_is_served_as_it_arrives_upstream``, under every schedule)."""
    write_all = track._write_fetch_stream
    holder: list[mc.FetchResult] = []
    held: list[asyncio.Future[None]] = []

    def hold_back(sid: int, objects: list[mc.StoredObject]) -> None:
        first = [o for o in objects if o.location.group == 0]
        for o in first:
            pub.session.write_fetch_object(sid, FetchObject(o.location.group, o.location.object, o.payload,
                                                            o.subgroup_id, o.publisher_priority))

        async def the_rest() -> None:
            deadline = asyncio.get_running_loop().time() + TIMEOUT
            while not holder or sum(o.location.group == 0 for o in holder[0].objects) < len(first):
                assert asyncio.get_running_loop().time() < deadline and pub.session.data_stream_open(sid), (
                    "cut-through FETCH: the relay forwarded none of Group 0 while the upstream fetch stream was "
                    "open (it stores the whole range first)")
                await asyncio.sleep(CUT_THROUGH_POLL)  # virtual time: the poll costs no wall time
            # A relay that gave up waiting for the whole range serves Group 0 only after ending the upstream stream
            assert pub.session.data_stream_open(sid), (
                "cut-through FETCH: the relay forwarded Group 0 only after it had ended the upstream fetch stream "
                "(it stores the whole range first)")
            write_all(sid, objects[len(first):])
        held.append(asyncio.ensure_future(the_rest()))

    track._write_fetch_stream = hold_back  # type: ignore[method-assign]
    result = await sub.fetch(NS, track.name, wait=False)
    holder.append(result)
    await result.wait_complete(TIMEOUT)
    for future in held:
        await asyncio.wait_for(future, TIMEOUT)
    return result


def relay_fill_and_fetch(relay_class: RelayFactory = Relay, groups: int = 4, per_group: int = 3) -> Main:
    """The scenario as a `simulate` main: ``simulate(relay_fill_and_fetch(MutantRelay), scheduler, faults)``."""

    async def main(sim: Sim) -> object:
        sim.name_next("relay")
        relay = relay_class(clock=sim.loop.time, wall_clock=sim.loop.wall_time)
        await relay.start()
        clients: list[mc.MoqtClient] = []
        try:
            async def join(label: str) -> mc.MoqtClient:
                sim.name_next(label)
                client = await mc.connect(relay.url, timeout=TIMEOUT)
                clients.append(client)
                return client

            pub = await join("pub")
            sub1, sub2, sub3 = await join("sub1"), await join("sub2"), await join("sub3")
            track = pub.track(NS, NAME)
            await pub.publish_namespace(NS, timeout=TIMEOUT)
            published: dict[Location, bytes] = {}

            def put(g: int, o: int) -> None:
                published[Location(g, o)] = _payload(g, o)
                track.publish_object(g, o, _payload(g, o))

            for g in range(2):
                for o in range(per_group):
                    put(g, o)
            s1 = await sub1.subscribe_with_fill(NS, NAME, timeout=TIMEOUT)
            put(2, 0)
            await asyncio.sleep(0.002)  # virtual: lets the publisher's datagrams and the fill race
            s2 = await sub2.subscribe_with_fill(NS, NAME, timeout=TIMEOUT)
            for o in range(1, per_group):
                put(2, o)
            for g in range(3, groups):
                for o in range(per_group):
                    put(g, o)
            track.end_track()
            fills = (await s1.wait_fill(TIMEOUT), await s2.wait_fill(TIMEOUT))
            await s1.wait_complete(TIMEOUT)
            await s2.wait_complete(TIMEOUT)
            n1 = check_exactly_once("sub1", s1, published)
            n2 = check_exactly_once("sub2", s2, published)

            # cut-through FETCH of a second, completed track the relay does not follow
            other = pub.track(NS, FETCH_NAME)
            other_published: dict[Location, bytes] = {}
            for g in range(groups):
                for o in range(per_group):
                    other_published[Location(g, o)] = _payload(g, o) + b"f"
                    other.publish_object(g, o, _payload(g, o) + b"f")
            other.end_track()
            fetched = await cut_through_fetch(pub, other, sub3)
            n3 = check_fetch("sub3", fetched.objects, other_published)
            return {"fills": fills, "sub1": n1, "sub2": n2, "fetch": n3}
        finally:
            for client in reversed(clients):
                await client.close(timeout=TIMEOUT)
            await relay.close(TIMEOUT)

    return main


async def _start(sim: Sim, relay: Relay, clients: list[mc.MoqtClient], *labels: str) -> list[mc.MoqtClient]:
    sim.name_next("relay")
    await relay.start()
    for label in labels:
        sim.name_next(label)
        clients.append(await mc.connect(relay.url, timeout=TIMEOUT))
    return list(clients)


async def _stop(relay: Relay, clients: list[mc.MoqtClient]) -> None:
    for client in reversed(clients):
        await client.close(timeout=TIMEOUT)
    await relay.close(TIMEOUT)


async def _refused(req: str, what: str, request: Any) -> None:
    """``request`` (a coroutine of the client API) out of its token's scope ends with REQUEST_ERROR UNAUTHORIZED;
    anything else breaks ``req``."""
    try:
        await request
    except mc.RequestRejected as exc:
        code = exc.error.error_code if exc.error is not None else None
        assert code == RequestErrorCode.UNAUTHORIZED, (f"{req}: {what} ended with REQUEST_ERROR {code} / reset "
                                                       f"{exc.reset_code}, expected UNAUTHORIZED (0x1)")
        return
    raise AssertionError(f"{req}: {what} was accepted, though no token grants it (profile §12)")


SCOPE_A = TrackNamespace.of("kvcs-1", "scope-a", "compat", "anchor", "pub-1")
SCOPE_B = TrackNamespace.of("kvcs-1", "scope-b", "compat", "anchor", "pub-1")
# Other subscribers hold tokens for scope-b and for all of kvcs-1: a relay that serves a request with the wrong
# token's rights (the harness's open-relay mutants) then has one to use.
_POLICY = {"version": 1, "tokens": [{"name": "pub", "value": "pub-secret", "publish": [["kvcs-1"]]},
                                    {"name": "sub-a", "value": "sub-a-secret", "subscribe": [["kvcs-1", "scope-a"]]},
                                    {"name": "sub-b", "value": "sub-b-secret", "subscribe": [["kvcs-1", "scope-b"]]},
                                    {"name": "sub-all", "value": "sub-all-secret", "subscribe": [["kvcs-1"]]}]}


def relay_authorization(relay_class: RelayFactory = Relay, groups: int = 3, per_group: int = 2) -> Main:
    """Authorization under every interleaving: what a subscriber's token covers arrives whole, nothing else does."""

    async def main(sim: Sim) -> object:
        relay = relay_class(policy=policy_from_mapping(_POLICY), clock=sim.loop.time, wall_clock=sim.loop.wall_time)
        clients: list[mc.MoqtClient] = []
        try:
            pub, sub, wide = await _start(sim, relay, clients, "pub", "sub", "wide")
            pub_token, sub_token = (AuthToken.use_value(b"pub-secret"),), (AuthToken.use_value(b"sub-a-secret"),)
            published: dict[TrackNamespace, dict[Location, bytes]] = {SCOPE_A: {}, SCOPE_B: {}}
            tracks = {ns: pub.track(ns, NAME) for ns in published}

            async def publish() -> None:
                for ns in (SCOPE_B, SCOPE_A):
                    await pub.publish_namespace(ns, auth=pub_token, timeout=TIMEOUT)
                for g in range(groups):
                    for ns, track in tracks.items():
                        for o in range(per_group):
                            published[ns][Location(g, o)] = _payload(g, o) + ns.fields[1]
                            track.publish_object(g, o, _payload(g, o) + ns.fields[1])
                    await asyncio.sleep(0.002)  # virtual: the subscriber's requests interleave with the groups
                for track in tracks.values():
                    track.end_track()

            publishing = asyncio.ensure_future(publish())
            watcher = await sub.subscribe_namespace(TrackNamespace.of("kvcs-1", "scope-a"), auth=sub_token,
                                                    timeout=TIMEOUT)
            # From its own session: in the watcher's, a relay may refuse the overlapping prefix for that instead.
            await _refused("MOQT-AUTH-SUBSCRIBE-NAMESPACE", "SUBSCRIBE_NAMESPACE kvcs-1 (wider than scope-a)",
                           wide.subscribe_namespace(TrackNamespace.of("kvcs-1"), auth=sub_token, timeout=TIMEOUT))
            await _refused("MOQT-AUTH-SUBSCRIBE", "SUBSCRIBE to scope-b",
                           sub.subscribe(SCOPE_B, NAME, auth=sub_token, timeout=TIMEOUT))
            await _refused("MOQT-AUTH-SUBSCRIBE", "SUBSCRIBE to scope-b without a token",
                           sub.subscribe(SCOPE_B, NAME, timeout=TIMEOUT))
            await asyncio.wait_for(publishing, TIMEOUT)
            await _refused("MOQT-AUTH-FETCH", "FETCH of scope-b",
                           sub.fetch(SCOPE_B, NAME, auth=sub_token, timeout=TIMEOUT))
            fetched = await sub.fetch(SCOPE_A, NAME, auth=sub_token, timeout=TIMEOUT)
            n = check_fetch("sub (scope-a)", fetched.objects, published[SCOPE_A])
            await watcher.next(TIMEOUT)  # the scope-a publication, announced to the prefix the token covers
            return {"fetched": n, "announced": len(watcher.active)}
        finally:
            await _stop(relay, clients)

    return main


CACHE_DURATION_MS = 1000


def relay_cache_expiry(relay_class: RelayFactory = Relay, objects: int = 4) -> Main:
    """MOQT-RELAY-MAX-CACHE-DURATION under every interleaving: inside the duration a FETCH gets the whole track from
    the cache, after it (the publisher gone, so nothing can be fetched afresh) no expired object is served."""

    async def main(sim: Sim) -> object:
        relay = relay_class(clock=sim.loop.time, wall_clock=sim.loop.wall_time)
        clients: list[mc.MoqtClient] = []
        try:
            pub, sub, late = await _start(sim, relay, clients, "pub", "sub", "late")
            props = (KeyValuePair(PropertyType.MAX_CACHE_DURATION, CACHE_DURATION_MS),)
            track = pub.track(NS, NAME, properties=props)
            await pub.publish_namespace(NS, timeout=TIMEOUT)
            live = await sub.subscribe(NS, NAME, timeout=TIMEOUT)  # the relay follows the track: it caches
            published = {Location(0, o): _payload(0, o) for o in range(objects)}
            for loc, payload in published.items():
                track.publish_object(loc.group, loc.object, payload)
            track.end_track()
            await live.wait_complete(TIMEOUT)
            started = sim.loop.time()
            fresh = await sub.fetch(NS, NAME, timeout=TIMEOUT)
            n = check_fetch("sub (inside MAX_CACHE_DURATION)", fresh.objects, published)
            assert sim.loop.time() - started < CACHE_DURATION_MS / 2000, "the scenario's first FETCH took too long"
            await pub.close(timeout=TIMEOUT)
            clients.remove(pub)
            await asyncio.sleep(2 * CACHE_DURATION_MS / 1000)  # virtual: every object is past the duration
            try:
                stale = await late.fetch(NS, NAME, timeout=TIMEOUT)
                served = sorted(o.location for o in stale.objects if o.end_of_range is None)
            except mc.RequestRejected as exc:
                served = []
                refusal = exc.error.error_code if exc.error is not None else exc.reset_code
                assert refusal is not None, "a FETCH after expiry ended without a REQUEST_ERROR or a reset code"
            assert not served, (f"MOQT-RELAY-MAX-CACHE-DURATION: {served} were served "
                                f"{2 * CACHE_DURATION_MS} ms after they arrived, past MAX_CACHE_DURATION "
                                f"{CACHE_DURATION_MS} ms")
            return {"fresh": n, "stale": len(served)}
        finally:
            await _stop(relay, clients)

    return main
