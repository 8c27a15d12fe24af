"""kvcs-relay: retrieval of a completed cache through the relay (KVCS "Retrieval of Completed Caches",
"Relay Considerations"; moqt-d22-profile sections 7.5, 9.4, 11.3, 12).

A consumer FETCHes layers a..b of a data track with LOCATION_FILTER Absolute Start, Group End {a,0}
EndGroupDelta b-a and GROUP_ORDER Ascending, optionally with OBJECTID_FILTER 0..n-1 (first n blocks).
The relay must deliver exactly those objects, groups ascending, objects ascending in each group, with the
published bytes, whether it followed the publication from the start, joined it mid-production (it holds
only the later layers and must fetch the earlier ones upstream) or never saw it (it fetches all upstream).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import pytest

from kvconform.fixtures.kvcs.relay import (
    KvcsPublication,
    KvcsRelay,
    cache_spec,
    content_problems,
    kvcs_publication,
    until_received,
)
from kvconform.fixtures.moqt import RelayUnderTest, fetch, run_check, session, subscribe
from kvconform.moqt.client import RequestRejected
from kvconform.moqt.data import GroupOrder
from kvconform.moqt.filters import LocationFilter, RangeFilter
from kvconform.moqt.structures import Location
from kvconform.verdicts import inconclusive

pytestmark = pytest.mark.usefixtures("kvcs_relay_sanity")

# How much of the publication the relay saw live before the FETCHes.
HISTORIES = ("followed from the start", "joined at layer 2", "never followed")


@dataclass(frozen=True)
class LayerRange:
    first: int
    last: int
    blocks: int | None = None  # OBJECTID_FILTER 0..blocks-1; None: every block

    def __str__(self) -> str:
        tail = f", first {self.blocks} blocks" if self.blocks is not None else ""
        return f"layers {self.first}..{self.last}{tail}"


async def publish_completed(view: RelayUnderTest, client: Any, pub: KvcsPublication, history: str) -> None:
    """Publish the whole publication and end it; with a live subscriber (no fill: the relay caches only
    what it forwards) from the start, from layer 2, or none."""
    layers = int(pub.spec.layers)
    join = {"followed from the start": 0, "joined at layer 2": 2}.get(history)
    subs = []
    pub.publish_manifest()
    for g in range(layers):
        if g == join:
            subs = [await subscribe(client, pub.ns, t.name, fill=False, auth=view.token("subscriber"))
                    for t in pub.data_tracks]
        pub.publish_layer(g)
    pub.publish_manifest()
    for sub in subs:  # the relay has received (and cached) everything it was sent
        await until_received(sub, Location(layers - 1, pub.blocks - 1))
    pub.end()


async def fetch_problems(view: RelayUnderTest, client: Any, pub: KvcsPublication, rng_case: LayerRange,
                         label: str) -> list[str]:
    """FETCH ``rng_case`` of every data track; what differs from the published objects of the range."""
    problems: list[str] = []
    a, b, n = rng_case.first, rng_case.last, rng_case.blocks
    flt = LocationFilter.absolute_start_group_end(a, 0, b - a)
    filters = (RangeFilter.first_objects(n),) if n is not None else ()
    for t in pub.data_tracks:
        where = f"{label}, {t}, {rng_case}"
        try:
            result = await fetch(client, pub.ns, t.name, location_filter=flt, group_order=GroupOrder.ASCENDING,
                                 auth=view.token("subscriber"), range_filters=filters)
        except RequestRejected as exc:
            problems.append(f"[{where}] FETCH refused or its stream reset: {exc}")
            continue
        got = [o.location for o in result.objects if o.end_of_range is None]
        want = sorted(loc for loc in pub.published(t.name)
                      if a <= loc.group <= b and (n is None or loc.object < n))
        if got != want:
            problems.append(f"[{where}] FETCH delivered {[str(x) for x in got]}, expected {[str(x) for x in want]} "
                            "(each layer's blocks, layers ascending)")
        records = [str(o.location) for o in result.objects if o.end_of_range is not None]
        if records:
            problems.append(f"[{where}] End of Range records {records} for layers the publisher holds")
        problems += content_problems(where, t.name, result.objects, pub)
        ok = result.request.response
        if want and not (max(want) <= ok.end_location <= Location(b, pub.blocks)):
            problems.append(f"[{where}] FETCH_OK End Location {ok.end_location}: not between the last object "
                            f"covered {max(want)} and layer {b}'s End of Group {Location(b, pub.blocks)} "
                            "(profile section 13 #9)")
        if ok.end_of_track and b != pub.spec.layers - 1:
            problems.append(f"[{where}] FETCH_OK End Of Track = 1 although layer {b} is not the last")
    return problems


def ranges(layers: int, rng: np.random.Generator, blocks: int | None = None) -> list[LayerRange]:
    a = int(rng.integers(0, layers - 1))
    b = int(rng.integers(a, layers))
    return [LayerRange(0, layers - 1, blocks), LayerRange(a, b, blocks), LayerRange(layers - 1, layers - 1, blocks)]


@pytest.mark.req("KVCS-FETCH-ASCENDING", "KVCS-RELAY-CACHE", "MOQT-FETCH-RANGE", "MOQT-FETCH-OK")
def test_fetch_of_layer_ranges_of_a_completed_cache(kvcs_relay: KvcsRelay, rng: np.random.Generator) -> None:
    view = kvcs_relay.scopes[0]

    async def scenario() -> list[str]:
        problems: list[str] = []
        for history in HISTORIES:
            spec = cache_spec(rng, layers=5, blocks=3)
            async with kvcs_publication(view, spec, rng) as pub, session(view, "consumer") as client:
                await publish_completed(view, client, pub, history)
                for case in ranges(spec.layers, rng):
                    problems += await fetch_problems(view, client, pub, case, history)
        return problems

    run_check(scenario, "KVCS-FETCH-ASCENDING", "FETCH of layer ranges")


@pytest.mark.req("MOQT-PARAM-RANGE-FILTER", "KVCS-FETCH-ASCENDING", "KVCS-RELAY-CACHE")
def test_fetch_of_the_first_blocks_with_objectid_filter(kvcs_relay: KvcsRelay, rng: np.random.Generator) -> None:
    """A consumer whose prompt diverges after n blocks adds OBJECTID_FILTER 0..n-1 (the relay's SETUP
    MAX_FILTER_RANGES permitting): only those blocks of each layer arrive."""
    view = kvcs_relay.scopes[0]

    async def scenario() -> list[str]:
        problems: list[str] = []
        for history in ("followed from the start", "never followed"):
            spec = cache_spec(rng, layers=4, blocks=5)
            async with kvcs_publication(view, spec, rng) as pub, session(view, "consumer") as client:
                setup = client.session.peer_setup
                if not (setup is not None and setup.max_filter_ranges):
                    inconclusive("the relay's SETUP has MAX_FILTER_RANGES 0 (or none): a KVCS consumer then discards "
                                 "the excess blocks instead of sending OBJECTID_FILTER")
                await publish_completed(view, client, pub, history)
                n = int(rng.integers(1, pub.blocks))
                for case in ranges(spec.layers, rng, blocks=n):
                    problems += await fetch_problems(view, client, pub, case, history)
        return problems

    run_check(scenario, "MOQT-PARAM-RANGE-FILTER", "FETCH with OBJECTID_FILTER")
