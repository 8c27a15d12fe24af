"""kvcs-relay: the relay's cache of a publication (KVCS "Relay Considerations": relays cache KVCS Objects by
Full Track Name and Location and honor MAX_CACHE_DURATION; moqt-d22-profile sections 8, 12).

The publisher sets the Track Property MAX_CACHE_DURATION (as a KVCS publisher should, to the scope's
retention) and refuses every FETCH the relay sends upstream, so whatever a consumer's FETCH gets can only
come from the relay's cache: within the duration the layers it forwarded live must be served from it, after
it they must not (expired objects become "unknown").
"""

from __future__ import annotations

import asyncio
from typing import Any

import numpy as np
import pytest

from kvconform.fixtures.kvcs.relay import KvcsRelay, cache_spec, content, kvcs_publication, until_received
from kvconform.fixtures.moqt import fetch, record, rejection, run_findings, session, subscribe
from kvconform.moqt.client import RequestRejected
from kvconform.moqt.data import GroupOrder
from kvconform.moqt.errors import RequestErrorCode
from kvconform.moqt.filters import LocationFilter
from kvconform.moqt.messages import Fetch
from kvconform.moqt.session import RequestReceived
from kvconform.moqt.structures import Location
from kvconform.verdicts import Findings, inconclusive

pytestmark = pytest.mark.usefixtures("kvcs_relay_sanity")

# Long enough that a FETCH sent at once is answered within it on a loaded CI machine; the check waits it out.
CACHE_DURATION_MS = 1000


def refuse_fetch(client: Any, event: RequestReceived) -> bool:
    """The publisher's request hook: every upstream FETCH is refused, so nothing is served but the cache."""
    if isinstance(event.message, Fetch):
        client.session.reject(event.stream_id, RequestErrorCode.INTERNAL_ERROR, "kvconform: cache only")
        return True
    return False


@pytest.mark.req("KVCS-RELAY-MAX-CACHE-DURATION", "KVCS-RELAY-CACHE", "MOQT-RELAY-MAX-CACHE-DURATION")
def test_layers_are_served_from_cache_only_within_max_cache_duration(kvcs_relay: KvcsRelay,
                                                                     rng: np.random.Generator) -> None:
    view = kvcs_relay.scopes[0]
    token = view.token("subscriber")

    async def scenario(f: Findings) -> None:
        spec = cache_spec(rng, layers=3, blocks=3)
        async with kvcs_publication(view, spec, rng, cache_duration_ms=CACHE_DURATION_MS,
                                    on_request=refuse_fetch) as pub, session(view, "consumer") as client:
            track = pub.data_tracks[0]
            live = await subscribe(client, pub.ns, track.name, fill=False, auth=token)
            pub.publish_manifest()
            for g in range(2):
                pub.publish_layer(g)
            await until_received(live, Location(1, pub.blocks - 1))
            clock = asyncio.get_running_loop().time  # the loop's: virtual time on the deterministic transport
            arrived = clock()
            flt = LocationFilter.absolute_start_group_end(0, 0, 1)
            try:
                fresh = await fetch(client, pub.ns, track.name, location_filter=flt,
                                    group_order=GroupOrder.ASCENDING, auth=token)
            except RequestRejected as exc:
                if clock() - arrived > CACHE_DURATION_MS / 1000:
                    inconclusive(f"the FETCH within MAX_CACHE_DURATION was refused ({exc}), but its answer came "
                                 f"after {CACHE_DURATION_MS} ms: the machine is too slow to tell")
                f.add("KVCS-RELAY-CACHE", f"FETCH of layers 0..1 right after they were forwarded (MAX_CACHE_DURATION "
                                          f"{CACHE_DURATION_MS} ms): seen {rejection(exc)}, expected them served from "
                                          "the cache")
            else:
                got = sorted(o.location for o in fresh.objects if o.end_of_range is None)
                want = sorted(loc for loc in pub.published(track.name) if loc.group <= 1)
                f.expect(got == want, "KVCS-RELAY-CACHE",
                         f"FETCH within MAX_CACHE_DURATION: seen {[str(x) for x in got]}, expected "
                         f"{[str(x) for x in want]} from the cache")
                content(f, "KVCS-RELAY-CACHE", "FETCH within MAX_CACHE_DURATION", track.name, fresh.objects, pub)
            # Waiting out the duration is the condition under test, not a synchronisation.
            await asyncio.sleep(max(0.0, arrived + 1.5 * CACHE_DURATION_MS / 1000 - clock()))
            try:
                stale = await fetch(client, pub.ns, track.name, location_filter=flt,
                                    group_order=GroupOrder.ASCENDING, auth=token)
                served = [str(o.location) for o in stale.objects if o.end_of_range is None]
            except RequestRejected as exc:
                record("received", "FETCH refused or reset after MAX_CACHE_DURATION", error=str(exc))
                served = []
            for req in ("KVCS-RELAY-MAX-CACHE-DURATION", "MOQT-RELAY-MAX-CACHE-DURATION"):
                f.expect(not served, req, f"FETCH {1.5 * CACHE_DURATION_MS:.0f} ms after the objects arrived, "
                                          f"MAX_CACHE_DURATION {CACHE_DURATION_MS} ms: seen {served} served, expected "
                                          "none (a refusal or unknown ranges)")

    run_findings("MAX_CACHE_DURATION", scenario)
