"""moqt-relay: FETCH through the relay (moqt-d22-profile sections 6.2 FETCH_OK, 7.3, 9.4).

The publisher publishes a whole track with End of Group markers and ends it; the subscriber FETCHes
ranges chosen by the seed: everything, from a start, an Absolute Range, whole groups (Absolute Start
Group End), both group orders, a range that holds no object, and one past the Largest Object. FETCH
streams carry no Object Status, so the expected objects are the Normal ones of the range.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import pytest

from kvconform.fixtures.moqt import (
    Publisher,
    RelayUnderTest,
    expect_none,
    fetch,
    other_order,
    publisher,
    refusal_problem,
    rejection,
    run_findings,
    session,
)
from kvconform.moqt.client import RequestRejected
from kvconform.moqt.data import GroupOrder
from kvconform.moqt.errors import RequestErrorCode
from kvconform.moqt.filters import LocationFilter
from kvconform.moqt.structures import Location
from kvconform.verdicts import Findings

pytestmark = pytest.mark.usefixtures("moqt_relay_sanity")

INVALID_RANGE: set[int] = {RequestErrorCode.INVALID_RANGE}


@dataclass(frozen=True)
class Case:
    """One FETCH: its filter, the requested [start, end] (None = up to Largest) and the group order."""

    label: str
    flt: LocationFilter | None
    start: Location
    end: Location | None
    order: int = GroupOrder.ASCENDING


def published_track(pub: Publisher, rng: np.random.Generator) -> list[int]:
    """4..6 groups of 1..5 objects, each ended by End of Group, then End of Track; returns objects per group."""
    per = [int(rng.integers(1, 6)) for _ in range(int(rng.integers(4, 7)))]
    for g, n in enumerate(per):
        for o in range(n):
            pub.publish(g, o, f"{g}.{o}:".encode() + rng.bytes(int(rng.integers(1, 1500))))
        pub.end_of_group(g, n)
    pub.end_track()
    return per


def cases(per: list[int], rng: np.random.Generator) -> list[Case]:
    last = len(per) - 1
    g1 = int(rng.integers(0, last))
    o1 = int(rng.integers(0, per[g1]))
    d = int(rng.integers(1, last - g1 + 1))
    eo = int(rng.integers(0, per[g1 + d]))
    return [
        Case("everything", None, Location(0, 0), None),
        Case("absolute start", LocationFilter.absolute_start(g1, o1), Location(g1, o1), None),
        Case("absolute range", LocationFilter.absolute_range(g1, o1, d, eo), Location(g1, o1), Location(g1 + d, eo)),
        Case("whole groups", LocationFilter.absolute_start_group_end(g1, 0, d), Location(g1, 0),
             Location(g1 + d, per[g1 + d] - 1)),
        Case("descending range", LocationFilter.absolute_range(g1, o1, d, eo), Location(g1, o1),
             Location(g1 + d, eo), GroupOrder.DESCENDING),
        Case("descending, everything", None, Location(0, 0), None, GroupOrder.DESCENDING),
    ]


def expected(pub: Publisher, case: Case) -> list[tuple[Location, bytes]]:
    """The Normal objects of the range, groups in the requested order, objects ascending in each group."""
    objs = sorted((loc, o.payload) for loc, o in pub.published().items()
                  if case.start <= loc and (case.end is None or loc <= case.end))
    if case.order == GroupOrder.DESCENDING:
        objs.sort(key=lambda t: (-t[0].group, t[0].object))
    return objs


async def fetch_cases(f: Findings, relay: RelayUnderTest, rng: np.random.Generator, descending: bool) -> None:
    ns = relay.namespace(rng)
    async with publisher(relay, ns) as pub, session(relay, "subscriber") as sub:
        per = published_track(pub, rng)
        for case in cases(per, rng):
            if (case.order == GroupOrder.DESCENDING) != descending:
                continue
            try:
                result = await fetch(sub, ns, location_filter=case.flt, group_order=case.order,
                                     auth=relay.token("subscriber"))
            except RequestRejected as exc:
                f.add("MOQT-FETCH-RANGE", f"[{case.label}] FETCH of a range the publisher holds: seen "
                                          f"{rejection(exc)}, expected FETCH_OK and its objects")
                continue
            got = [(o.location, o.payload) for o in result.objects if o.end_of_range is None]
            want = expected(pub, case)
            got_locs, want_locs = [loc for loc, _ in got], [loc for loc, _ in want]
            shown = f"seen {[str(x) for x in got_locs]}, expected {[str(x) for x in want_locs]}"
            order = "Descending" if descending else "Ascending"
            # Groups written in the other order decode as other groups: the range's objects, meant the other way.
            meant = other_order(got_locs, case.order)
            reordered = got_locs != want_locs and sorted(meant) == sorted(want_locs)
            f.expect(not reordered, "MOQT-FETCH-ORDER",
                     f"[{case.label}] group order of the fetch stream: seen the range's groups written in the other "
                     f"order ({[str(x) for x in meant]} as meant, decoded {order} as {[str(x) for x in got_locs]}), "
                     f"expected {order} {[str(x) for x in want_locs]}")
            f.expect(reordered or sorted(got_locs) == sorted(want_locs), "MOQT-FETCH-RANGE",
                     f"[{case.label}] objects of the range: {shown}")
            f.expect(reordered or sorted(got_locs) != sorted(want_locs) or got_locs == want_locs, "MOQT-FETCH-ORDER",
                     f"[{case.label}] order of the objects ({order} groups, objects ascending): {shown}")
            published = dict(want)
            differ = [] if reordered else [str(loc) for loc, payload in got if loc in published
                                           and payload != published[loc]]
            f.expect(not differ, "MOQT-RELAY-CACHE-IDENTICAL",
                     f"[{case.label}] payloads of {differ}: seen other bytes than the published ones, expected them")
            records = [str(o.location) for o in result.objects if o.end_of_range is not None]
            f.expect(not records, "MOQT-FETCH-RANGE",
                     f"[{case.label}] End of Range records: seen {records} for a range the publisher holds, "
                     "expected its objects")
            fetch_ok(f, case, result, want, max(pub.published()))


def fetch_ok(f: Findings, case: Case, result: Any, want: list[tuple[Location, bytes]], final: Location) -> None:
    """FETCH_OK End Location is inclusive: the last object covered or the requested end (profile section
    13 #9); End Of Track is 1 only when End Location is the track's final object."""
    ok = result.request.response
    if not want:
        return
    last = max(loc for loc, _ in want)
    acceptable = {last} | ({case.end} if case.end is not None else set())
    f.expect(ok.end_location in acceptable, "MOQT-FETCH-OK",
             f"[{case.label}] FETCH_OK End Location: seen {ok.end_location}, expected one of "
             f"{sorted(str(x) for x in acceptable)}")
    f.expect(not (ok.end_of_track and ok.end_location < final), "MOQT-FETCH-OK",
             f"[{case.label}] FETCH_OK End Of Track: seen 1 with End Location {ok.end_location}, expected 0 before "
             f"the track's final object {final}")


@pytest.mark.req("MOQT-FETCH-ORDER", "MOQT-FETCH-RANGE", "MOQT-FETCH-OK", "MOQT-RELAY-CACHE-IDENTICAL")
def test_fetch_ranges_arrive_in_ascending_group_order(moqt_relay: RelayUnderTest, rng: np.random.Generator) -> None:
    run_findings("FETCH ranges", lambda f: fetch_cases(f, moqt_relay, rng, descending=False),
                 req="MOQT-FETCH-RANGE")


@pytest.mark.req("MOQT-FETCH-ORDER", "MOQT-FETCH-RANGE", "MOQT-FETCH-OK", "MOQT-RELAY-CACHE-IDENTICAL")
def test_fetch_descending_group_order(moqt_relay: RelayUnderTest, rng: np.random.Generator) -> None:
    run_findings("FETCH descending", lambda f: fetch_cases(f, moqt_relay, rng, descending=True),
                 req="MOQT-FETCH-RANGE")


@pytest.mark.req("MOQT-FETCH-EMPTY")
def test_fetch_of_a_range_without_objects(moqt_relay: RelayUnderTest, rng: np.random.Generator) -> None:
    """The Locations after a group's End of Group exist in no object, yet lie below the Largest Object:
    FETCH_OK, then a fetch stream with only FETCH_HEADER, ended with FIN."""
    req = "MOQT-FETCH-EMPTY"

    async def scenario(f: Findings) -> None:
        ns = moqt_relay.namespace(rng)
        async with publisher(moqt_relay, ns) as pub, session(moqt_relay, "subscriber") as sub:
            per = published_track(pub, rng)
            g = int(rng.integers(0, len(per) - 1))
            flt = LocationFilter.absolute_range(g, per[g] + 1, 0, per[g] + 4)
            what = (f"FETCH of {{{g},{per[g] + 1}}}..{{{g},{per[g] + 4}}} (after End of Group {{{g},{per[g]}}}, below "
                    "the Largest Object)")
            try:
                result = await fetch(sub, ns, location_filter=flt, auth=moqt_relay.token("subscriber"))
            except RequestRejected as exc:
                f.add(req, f"{what}: seen {rejection(exc)}, expected FETCH_OK and an empty fetch stream ended with FIN")
                return
            objs = [str(o.location) for o in result.objects if o.end_of_range is None]
            f.expect(not objs, req, f"{what}: seen objects {objs}, expected none")

    run_findings("FETCH of an empty range", scenario, req=req)


@pytest.mark.req("MOQT-FETCH-INVALID-RANGE")
def test_fetch_past_the_largest_object_is_invalid_range(moqt_relay: RelayUnderTest, rng: np.random.Generator) -> None:
    req = "MOQT-FETCH-INVALID-RANGE"

    async def scenario(f: Findings) -> None:
        ns = moqt_relay.namespace(rng)
        async with publisher(moqt_relay, ns) as pub, session(moqt_relay, "subscriber") as sub:
            per = published_track(pub, rng)
            for start in (Location(len(per) + 1, 0), Location(len(per) + 7, 3)):
                flt = LocationFilter.absolute_start(start.group, start.object)
                expect_none(f, req, [await refusal_problem(
                    f"FETCH from {start} (Largest Object {pub.track.largest})",
                    fetch(sub, ns, location_filter=flt, auth=moqt_relay.token("subscriber")), INVALID_RANGE)])

    run_findings("FETCH past Largest", scenario, req=req)
