"""kvcs-relay: a KVCS publication through the relay, live (KVCS "Retrieval during Production", "Relay
Considerations"; moqt-d22-profile sections 11.3, 11.4, 12).

The harness publishes a real publication (manifest, k.raw.s0, v.raw.s0; KVO1 objects of the test-content
convention) layer by layer, and consumers join it at the points where relays differ: before the first data
object, right after a layer's End of Group, in the middle of a layer (k and v split at different blocks),
and while objects are being published during their SUBSCRIBE. Each uses the KVCS recipe on every track, so
every object must arrive exactly once (fill if <= LARGEST_OBJECT, subscription otherwise), verify as KVO1
and be byte-identical to what was published, whichever way it came.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

from kvconform import sweep
from kvconform.fixtures.kvcs.relay import (
    KvcsPublication,
    KvcsRelay,
    cache_spec,
    content,
    expected_from,
    kvcs_publication,
    subscribe_publication,
    until_received,
)
from kvconform.fixtures.moqt import (
    CLIENT_TIMEOUT,
    OnceRules,
    done_after_streams,
    exactly_once,
    fetch,
    finish,
    packet_tap,
    rejection,
    run_findings,
    session,
    waiting,
)
from kvconform.moqt.client import RequestRejected
from kvconform.moqt.data import GroupOrder
from kvconform.moqt.errors import PublishDoneCode
from kvconform.moqt.structures import Location, TrackNamespace
from kvconform.verdicts import Findings

pytestmark = pytest.mark.usefixtures("kvcs_relay_sanity")


def steps(pub: KvcsPublication, layers: range) -> list[Callable[[], None]]:
    """Publishing ``layers`` one object (or End of Group) at a time, a manifest version after each layer."""
    out: list[Callable[[], None]] = []
    for g in layers:
        for t in pub.data_tracks:
            out += [functools.partial(pub.publish_blocks, t, g, (b,)) for b in range(pub.blocks)]
            out.append(functools.partial(pub.end_layer, t, g))
        out.append(pub.publish_manifest)
    return out


async def check_subscriptions(f: Findings, label: str, subs: dict[bytes, Any], pub: KvcsPublication,
                              rules: OnceRules) -> None:
    """Every track of one consumer: fill ended, PUBLISH_DONE, exactly once, KVO1-valid, published bytes."""
    for name, sub in subs.items():
        await finish(sub)
        where = f"{label}, {name.decode()}"
        exactly_once(f, where, sub, expected_from(name, sub, pub), rules)
        # The bytes were compared above; a KVO1 object that does not verify is one the relay changed.
        content(f, rules.live or rules.once, f"{where}, L={sub.largest}", name, sub.objects, pub, compare=False)


# Live consumers: each object once (profile section 11.4), the same bytes whichever way it came, the gaps of the
# relay's cache filled upstream.
LIVE = OnceRules(once="KVCS-LIVE-EXACTLY-ONCE", live="KVCS-RELAY-SAME-OBJECTS", cached="KVCS-RELAY-SAME-OBJECTS",
                 gaps="KVCS-RELAY-CACHE")


@pytest.mark.req("KVCS-LIVE-EXACTLY-ONCE", "KVCS-RELAY-SAME-OBJECTS", "KVCS-RELAY-CACHE")
def test_consumers_joining_a_live_publication_get_every_object_once(kvcs_relay: KvcsRelay,
                                                                    rng: np.random.Generator) -> None:
    view = kvcs_relay.scopes[0]
    token = view.token("subscriber")

    async def scenario(f: Findings) -> None:
        spec = cache_spec(rng, layers=5, blocks=3)
        async with kvcs_publication(view, spec, rng) as pub, session(view, "early") as early, \
                session(view, "layer boundary") as boundary, session(view, "mid-layer") as mid, \
                session(view, "in flight") as flight:
            k, v = pub.data_tracks
            pub.publish_manifest()  # the manifest before the first data object
            consumers = {"before the first object": await subscribe_publication(early, pub, token)}
            pub.publish_layer(0)
            pub.publish_layer(1)
            pub.publish_manifest()
            consumers["after End of Group of layer 1"] = await subscribe_publication(boundary, pub, token)
            cut_k, cut_v = int(rng.integers(1, pub.blocks)), int(rng.integers(0, pub.blocks))
            pub.publish_blocks(k, 2, range(cut_k))
            pub.publish_blocks(v, 2, range(cut_v))
            consumers[f"inside layer 2 (k at block {cut_k}, v at {cut_v})"] = \
                await subscribe_publication(mid, pub, token)
            pub.publish_blocks(k, 2, range(cut_k, pub.blocks))
            pub.end_layer(k, 2)
            pub.publish_blocks(v, 2, range(cut_v, pub.blocks))
            pub.end_layer(v, 2)
            pub.publish_manifest()
            # One object per scheduling turn while the three SUBSCRIBEs travel through the relay.
            pending = asyncio.ensure_future(subscribe_publication(flight, pub, token))
            todo = steps(pub, range(3, spec.layers))
            while todo and not pending.done():
                todo.pop(0)()
                await asyncio.sleep(0)
            consumers[f"during its SUBSCRIBE ({len(todo)} steps left)"] = await pending
            for step in todo:
                step()
            pub.end()
            for label, subs in consumers.items():
                await check_subscriptions(f, label, subs, pub, LIVE)
            f.expect(True, "KVCS-RELAY-CACHE", "")

    run_findings("consumers joining a live publication", scenario)


# A consumer that arrives after production ended: everything by the fill, once (profile section 11.4 with an
# empty subscription side). Layers: 9 is one more than a manifest cadence; --sweep wide adds 20 (three cadences).
LATE = OnceRules(once="KVCS-LIVE-EXACTLY-ONCE", cached="KVCS-RELAY-SAME-OBJECTS", gaps="KVCS-RELAY-CACHE")
LATE_LAYERS = sweep.pick([9], [20])
UNKNOWN_STREAM_COUNT = 2**64 - 1


@pytest.mark.req("KVCS-LIVE-EXACTLY-ONCE", "MOQT-SUB-PUBLISH-DONE", "MOQT-SUB-LARGEST-OBJECT",
                 "KVCS-RELAY-SAME-OBJECTS", "KVCS-RELAY-CACHE")
@pytest.mark.parametrize("layers", LATE_LAYERS)
def test_a_consumer_after_the_end_gets_every_layer_then_publish_done(kvcs_relay: KvcsRelay, rng: np.random.Generator,
                                                                     layers: int) -> None:
    """A consumer that subscribes with the KVCS recipe (Next Object + fill {0,0}) to each data track after End
    of Track (the relay followed the publication for a live consumer): SUBSCRIBE_OK LARGEST_OBJECT is the End of
    Track Location {L,0} or the last block {L-1,n-1}; the fill carries every object once, KVO1-valid and as
    published; PUBLISH_DONE TRACK_ENDED counts the fill stream and, as on the live consumer's subscriptions, was
    sent only after every stream it counts was closed (QUIC packet numbers, kvconform.moqt.sendorder)."""
    view = kvcs_relay.scopes[0]
    token = view.token("subscriber")
    req = "MOQT-SUB-PUBLISH-DONE"

    async def scenario(f: Findings) -> None:
        spec = cache_spec(rng, layers=layers, blocks=2)
        async with kvcs_publication(view, spec, rng) as pub, session(view, "live") as live_client, \
                session(view, "after the end") as late_client:
            live_tap, late_tap = packet_tap(live_client), packet_tap(late_client)
            pub.publish_manifest()
            live = await subscribe_publication(live_client, pub, token, manifest=False)
            for g in range(spec.layers):
                pub.publish_layer(g)
            pub.publish_manifest()
            pub.end()
            await check_subscriptions(f, "live", live, pub, LIVE)
            late = await subscribe_publication(late_client, pub, token, manifest=False)
            await check_subscriptions(f, "after the end", late, pub, LATE)
            last, eot = Location(spec.layers - 1, pub.blocks - 1), Location(spec.layers, 0)
            for name, sub in late.items():
                where = f"after the end, {name.decode()}"
                f.expect(sub.largest in (last, eot), "MOQT-SUB-LARGEST-OBJECT",
                         f"[{where}] SUBSCRIBE_OK LARGEST_OBJECT: seen {sub.largest}, expected {eot} (End of Track) "
                         f"or the last block {last}")
                done = await finish(sub)
                f.expect(done.status_code == PublishDoneCode.TRACK_ENDED, req,
                         f"[{where}] PUBLISH_DONE Status Code: seen 0x{done.status_code:x}, expected TRACK_ENDED (0x2)")
                f.expect(done.stream_count in (sub.streams_seen(), UNKNOWN_STREAM_COUNT), req,
                         f"[{where}] PUBLISH_DONE Stream Count: seen {done.stream_count}, expected "
                         f"{sub.streams_seen()} (the fill stream included)")
            for label, subs, tap in (("live", live, live_tap), ("after the end", late, late_tap)):
                order = tap.snapshot()
                for name, sub in subs.items():
                    done_after_streams(f, req, f"{label}, {name.decode()}", sub, order)

    run_findings("a consumer after the end", scenario)


# Several authorized subscribers: each gets every object once; each gets the published bytes.
SAME = OnceRules(once="MOQT-SUB-MULTIPLE", live="KVCS-RELAY-SAME-OBJECTS", cached="KVCS-RELAY-SAME-OBJECTS")


@pytest.mark.req("KVCS-RELAY-SAME-OBJECTS", "MOQT-RELAY-CACHE-IDENTICAL", "MOQT-SUB-MULTIPLE")
def test_every_authorized_subscriber_gets_identical_objects(kvcs_relay: KvcsRelay, rng: np.random.Generator) -> None:
    """Two live consumers (the scope's subscriber token and its publisher token, which may subscribe too),
    one that joins after production (its fill from the relay's cache) and a FETCH of each whole data track:
    every Location carries the same bytes for all of them, the published ones. Objects of 2 KiB sections
    span several QUIC packets."""
    view = kvcs_relay.scopes[0]

    async def scenario(f: Findings) -> None:
        spec = cache_spec(rng, layers=3, blocks=4, head_dim=128)
        async with kvcs_publication(view, spec, rng) as pub, session(view, "consumer 1") as c1, \
                session(view, "consumer 2") as c2, session(view, "late consumer") as c3:
            pub.publish_manifest()
            live = {"live, subscriber token": await subscribe_publication(c1, pub, view.token("subscriber")),
                    "live, publisher token": await subscribe_publication(c2, pub, view.token("publisher"))}
            for g in range(spec.layers):
                pub.publish_layer(g)
            pub.publish_manifest()
            last = Location(spec.layers - 1, pub.blocks - 1)
            for subs in live.values():
                for t in pub.data_tracks:
                    await until_received(subs[t.name], last)  # the relay holds the whole publication
            late = await subscribe_publication(c3, pub, view.token("subscriber"), manifest=False)
            pub.end()
            seen: dict[tuple[bytes, Location], dict[str, bytes]] = {}
            views = {**live, "after production (fill)": late}
            for label, subs in views.items():
                await check_subscriptions(f, label, subs, pub, SAME)
                for name, sub in subs.items():
                    for loc, payload in sub.payloads().items():
                        seen.setdefault((name, loc), {})[label] = payload
            for t in pub.data_tracks:
                try:
                    result = await fetch(c3, pub.ns, t.name, group_order=GroupOrder.ASCENDING,
                                         auth=view.token("subscriber"))
                except RequestRejected as exc:
                    f.add("MOQT-RELAY-CACHE-IDENTICAL", f"[FETCH {t}] of the completed publication: seen "
                                                        f"{rejection(exc)}, expected FETCH_OK and its objects")
                    continue
                content(f, "MOQT-RELAY-CACHE-IDENTICAL", f"FETCH {t}", t.name, result.objects, pub)
                for o in result.objects:
                    if o.end_of_range is None:
                        seen.setdefault((t.name, o.location), {})["FETCH"] = o.payload
            for (name, loc), by in sorted(seen.items()):
                f.expect(len(set(by.values())) == 1, "KVCS-RELAY-SAME-OBJECTS",
                         f"{name.decode()} {loc}: seen {len(set(by.values()))} different payloads among {sorted(by)}, "
                         "expected the same bytes for every subscriber")

    run_findings("identical objects to every subscriber", scenario)


# Two publications of one prefix: whatever one consumer gets of the other's is the cache's keying at fault.
APART = OnceRules(once="KVCS-RELAY-CACHE")


@pytest.mark.req("KVCS-RELAY-CACHE", "MOQT-NS-SUBSCRIBE-NAMESPACE")
def test_publications_of_one_token_prefix_are_kept_apart(kvcs_relay: KvcsRelay, rng: np.random.Generator) -> None:
    """Two productions of the same prefix (equal content fields, each its own Publication ID) whose bytes
    differ, as two computations on different hardware may: discovery by the content prefix names both, and
    every consumer, live, late (fill from the relay's cache) or by FETCH, gets its own publication's bytes:
    the relay caches by Full Track Name, which includes the Publication ID."""
    view = kvcs_relay.scopes[0]
    token = view.token("subscriber")

    async def scenario(f: Findings) -> None:
        first = cache_spec(rng, layers=3, blocks=2)
        second = dataclasses.replace(first, content_seed=rng.bytes(16))  # same namespace fields, other bytes
        async with kvcs_publication(view, first, rng) as p1, kvcs_publication(view, second, rng) as p2, \
                session(view, "watcher") as watcher_client, session(view, "live consumer") as live_client, \
                session(view, "late consumer") as late_client:
            pubs = {"publication 1": p1, "publication 2": p2}
            watcher = await watcher_client.subscribe_namespace(p1.namespace.content_prefix(), auth=token)
            with waiting("one NAMESPACE per publication at the content prefix's subscriber",
                         "MOQT-NS-SUBSCRIBE-NAMESPACE"):
                notices = {await watcher.next(CLIENT_TIMEOUT) for _ in pubs}
            expected = {("namespace", TrackNamespace((p.namespace.pub_id,))) for p in pubs.values()}
            f.expect(notices == expected, "MOQT-NS-SUBSCRIBE-NAMESPACE",
                     f"notices for the content prefix: seen {sorted(map(str, notices))}, expected one NAMESPACE per "
                     f"Publication ID {sorted(map(str, expected))}")
            live = {label: await subscribe_publication(live_client, p, token) for label, p in pubs.items()}
            for p in pubs.values():
                p.publish_manifest()
            for g in range(first.layers):  # interleaved: both publications' objects arrive side by side
                for p in pubs.values():
                    p.publish_layer(g)
            last = Location(first.layers - 1, p1.blocks - 1)
            for label, p in pubs.items():
                for t in p.data_tracks:
                    await until_received(live[label][t.name], last)
            late = {label: await subscribe_publication(late_client, p, token, manifest=False)
                    for label, p in pubs.items()}
            for label, p in pubs.items():
                p.publish_manifest()
                p.end()
                await check_subscriptions(f, f"{label}, live", live[label], p, APART)
                await check_subscriptions(f, f"{label}, late", late[label], p, APART)
                for t in p.data_tracks:
                    try:
                        result = await fetch(late_client, p.ns, t.name, group_order=GroupOrder.ASCENDING, auth=token)
                    except RequestRejected as exc:
                        f.add("KVCS-RELAY-CACHE", f"[{label}, FETCH {t}]: seen {rejection(exc)}, expected FETCH_OK "
                                                  "and its objects")
                        continue
                    content(f, "KVCS-RELAY-CACHE", f"{label}, FETCH", t.name, result.objects, p)

    run_findings("two publications of one prefix", scenario)
