"""Relay scenarios for the deterministic transport, each with its invariants (issue 24 item 3).

`relay_fill_and_fetch` runs the reference relay (or a subclass: the mutants of the harness tests) with one
publisher and three subscribers over a `SimNetwork`: groups are published, ``sub1`` joins after two groups, ``sub2``
mid-group, both with Next Object + FILL_PARAMETERS {Absolute Start {0,0}} (profile §11.3); the track ends and
``sub3`` FETCHes all of it from the relay, which does not follow it for that request's whole range (cut-through:
the relay answers as the objects arrive). The invariants (`check_exactly_once`, `check_fetch`) raise
``AssertionError`` naming the requirement broken. The value a run returns is a short, stable summary.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Sequence

from kvconform.moqt import client as mc
from kvconform.moqt.data import FetchObject, ObjectStatus
from kvconform.moqt.relay import Relay
from kvconform.moqt.simrun import Main, Sim
from kvconform.moqt.structures import Location, TrackNamespace

__all__ = ["NAME", "NS", "RelayFactory", "check_exactly_once", "check_fetch", "relay_fill_and_fetch"]

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
