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
    content,
    kvcs_publication,
    until_received,
)
from kvconform.fixtures.moqt import RelayUnderTest, fetch, other_order, rejection, run_findings, session, subscribe
from kvconform.moqt.client import RequestRejected
from kvconform.moqt.data import GroupOrder
from kvconform.moqt.filters import LocationFilter, RangeFilter
from kvconform.moqt.structures import Location
from kvconform.verdicts import Findings, inconclusive

pytestmark = pytest.mark.usefixtures("kvcs_relay_sanity")

CACHE, ASCENDING = "KVCS-RELAY-CACHE", "KVCS-FETCH-ASCENDING"
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


async def fetch_layers(f: Findings, view: RelayUnderTest, client: Any, pub: KvcsPublication, rng_case: LayerRange,
                       label: str, *, extra_req: str, ok_req: str | None = None) -> None:
    """FETCH ``rng_case`` of every data track, judged against the published objects of the range: an object the
    relay does not deliver (or reports unknown) is a gap it did not fill (KVCS-RELAY-CACHE), one it delivers
    beyond the range breaks ``extra_req``, the same objects in another order KVCS-FETCH-ASCENDING; with ``ok_req``
    FETCH_OK too."""
    a, b, n = rng_case.first, rng_case.last, rng_case.blocks
    flt = LocationFilter.absolute_start_group_end(a, 0, b - a)
    filters = (RangeFilter.first_objects(n),) if n is not None else ()
    for rule in (CACHE, ASCENDING, extra_req):
        f.expect(True, rule, "")
    for t in pub.data_tracks:
        where = f"{label}, {t}, {rng_case}"
        try:
            result = await fetch(client, pub.ns, t.name, location_filter=flt, group_order=GroupOrder.ASCENDING,
                                 auth=view.token("subscriber"), range_filters=filters)
        except RequestRejected as exc:
            f.add(CACHE, f"[{where}] FETCH: seen {rejection(exc)}, expected FETCH_OK and the range's objects")
            continue
        got = [o.location for o in result.objects if o.end_of_range is None]
        want = sorted(loc for loc in pub.published(t.name)
                      if a <= loc.group <= b and (n is None or loc.object < n))
        meant = other_order(got, GroupOrder.ASCENDING)  # groups written Descending decode as other groups
        if got != want and sorted(meant) == sorted(want):
            f.add(ASCENDING, f"[{where}] group order of the fetch stream: seen the layers written Descending "
                             f"({[str(x) for x in meant]} as meant, decoded Ascending as {[str(x) for x in got]}), "
                             f"expected Ascending {[str(x) for x in want]}")
            continue
        records = [str(o.location) for o in result.objects if o.end_of_range is not None]
        if records:
            f.add(CACHE, f"[{where}] End of Range records: seen {records} for layers the publisher holds, expected "
                         "their objects (fetched upstream where the relay lacks them)")
        missing = sorted(set(want) - set(got))
        if missing:
            f.add(CACHE, f"[{where}] objects: seen {[str(x) for x in missing]} missing, expected every published "
                         "object of the range")
        extra = sorted(set(got) - set(want))
        if extra:
            f.add(extra_req, f"[{where}] objects: seen {[str(x) for x in extra]} beyond the requested range, "
                             "expected none")
        if not missing and not extra and got != want:
            f.add(ASCENDING, f"[{where}] order: seen {[str(x) for x in got]}, expected {[str(x) for x in want]} "
                             "(layers ascending, each layer's blocks ascending)")
        content(f, CACHE, where, t.name, result.objects, pub)
        if ok_req is None or not want:
            continue
        ok = result.request.response
        f.expect(max(want) <= ok.end_location <= Location(b, pub.blocks), ok_req,
                 f"[{where}] FETCH_OK End Location: seen {ok.end_location}, expected between the last object covered "
                 f"{max(want)} and layer {b}'s End of Group {Location(b, pub.blocks)} (profile section 13 #9)")
        f.expect(not ok.end_of_track or b == pub.spec.layers - 1, ok_req,
                 f"[{where}] FETCH_OK End Of Track: seen 1, expected 0 (layer {b} is not the last)")


def ranges(layers: int, rng: np.random.Generator, blocks: int | None = None) -> list[LayerRange]:
    a = int(rng.integers(0, layers - 1))
    b = int(rng.integers(a, layers))
    return [LayerRange(0, layers - 1, blocks), LayerRange(a, b, blocks), LayerRange(layers - 1, layers - 1, blocks)]


@pytest.mark.req("KVCS-FETCH-ASCENDING", "KVCS-RELAY-CACHE", "MOQT-FETCH-RANGE", "MOQT-FETCH-OK")
def test_fetch_of_layer_ranges_of_a_completed_cache(kvcs_relay: KvcsRelay, rng: np.random.Generator) -> None:
    view = kvcs_relay.scopes[0]

    async def scenario(f: Findings) -> None:
        for history in HISTORIES:
            spec = cache_spec(rng, layers=5, blocks=3)
            async with kvcs_publication(view, spec, rng) as pub, session(view, "consumer") as client:
                await publish_completed(view, client, pub, history)
                for case in ranges(spec.layers, rng):
                    await fetch_layers(f, view, client, pub, case, history, extra_req="MOQT-FETCH-RANGE",
                                       ok_req="MOQT-FETCH-OK")

    run_findings("FETCH of layer ranges", scenario)


@pytest.mark.req("MOQT-PARAM-RANGE-FILTER", "KVCS-FETCH-ASCENDING", "KVCS-RELAY-CACHE")
def test_fetch_of_the_first_blocks_with_objectid_filter(kvcs_relay: KvcsRelay, rng: np.random.Generator) -> None:
    """A consumer whose prompt diverges after n blocks adds OBJECTID_FILTER 0..n-1 (the relay's SETUP
    MAX_FILTER_RANGES permitting): only those blocks of each layer arrive."""
    view = kvcs_relay.scopes[0]

    async def scenario(f: Findings) -> None:
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
                    await fetch_layers(f, view, client, pub, case, history, extra_req="MOQT-PARAM-RANGE-FILTER")

    run_findings("FETCH with OBJECTID_FILTER", scenario)
