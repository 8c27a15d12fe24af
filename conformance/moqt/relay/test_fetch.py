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

from kvconform.fixtures.moqt import Publisher, RelayUnderTest, fetch, publisher, record, run_check, session
from kvconform.moqt.client import RequestRejected
from kvconform.moqt.data import GroupOrder
from kvconform.moqt.errors import RequestErrorCode
from kvconform.moqt.filters import LocationFilter
from kvconform.moqt.structures import Location
from kvconform.verdicts import check_one_of

pytestmark = pytest.mark.usefixtures("moqt_relay_sanity")


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


async def fetch_cases(relay: RelayUnderTest, rng: np.random.Generator, descending: bool) -> list[str]:
    ns = relay.namespace(rng)
    problems: list[str] = []
    async with publisher(relay, ns) as pub, session(relay, "subscriber") as sub:
        per = published_track(pub, rng)
        for case in cases(per, rng):
            if (case.order == GroupOrder.DESCENDING) != descending:
                continue
            try:
                result = await fetch(sub, ns, location_filter=case.flt, group_order=case.order,
                                     auth=relay.token("subscriber"))
            except RequestRejected as exc:
                problems.append(f"[{case.label}] FETCH refused: {exc}")
                continue
            got = [(o.location, o.payload) for o in result.objects if o.end_of_range is None]
            want = expected(pub, case)
            if got != want:
                problems.append(f"[{case.label}] FETCH delivered {[str(loc) for loc, _ in got]}"
                                f"{' (payloads differ)' if [g[0] for g in got] == [w[0] for w in want] else ''}, "
                                f"expected {[str(loc) for loc, _ in want]}")
            records = [str(o.location) for o in result.objects if o.end_of_range is not None]
            if records:
                problems.append(f"[{case.label}] End of Range records {records} for a range the publisher holds")
            problems += _fetch_ok_problems(case, result, want, max(pub.published()))
    return problems


def _fetch_ok_problems(case: Case, result: Any, want: list[tuple[Location, bytes]], final: Location) -> list[str]:
    """FETCH_OK End Location is inclusive: the last object covered or the requested end (profile section
    13 #9); End Of Track is 1 only when End Location is the track's final object."""
    ok = result.request.response
    problems: list[str] = []
    if not want:
        return problems
    last = max(loc for loc, _ in want)
    acceptable = {last} | ({case.end} if case.end is not None else set())
    try:
        check_one_of(ok.end_location, acceptable, what=f"[{case.label}] FETCH_OK End Location",
                      req="MOQT-FETCH-OK")
    except AssertionError as exc:
        problems.append(str(exc))
    if ok.end_of_track and ok.end_location < final:
        problems.append(f"[{case.label}] FETCH_OK End Of Track = 1 with End Location {ok.end_location}, before the "
                        f"track's final object {final}")
    return problems


@pytest.mark.req("MOQT-FETCH-ORDER", "MOQT-FETCH-RANGE", "MOQT-FETCH-OK")
def test_fetch_ranges_arrive_in_ascending_group_order(moqt_relay: RelayUnderTest, rng: np.random.Generator) -> None:
    run_check(lambda: fetch_cases(moqt_relay, rng, descending=False), "MOQT-FETCH-ORDER", "FETCH ranges")


@pytest.mark.req("MOQT-FETCH-ORDER")
def test_fetch_descending_group_order(moqt_relay: RelayUnderTest, rng: np.random.Generator) -> None:
    run_check(lambda: fetch_cases(moqt_relay, rng, descending=True), "MOQT-FETCH-ORDER", "FETCH descending")


@pytest.mark.req("MOQT-FETCH-EMPTY")
def test_fetch_of_a_range_without_objects(moqt_relay: RelayUnderTest, rng: np.random.Generator) -> None:
    """The Locations after a group's End of Group exist in no object, yet lie below the Largest Object:
    FETCH_OK, then a fetch stream with only FETCH_HEADER, ended with FIN."""
    async def scenario() -> list[str]:
        ns = moqt_relay.namespace(rng)
        async with publisher(moqt_relay, ns) as pub, session(moqt_relay, "subscriber") as sub:
            per = published_track(pub, rng)
            g = int(rng.integers(0, len(per) - 1))
            flt = LocationFilter.absolute_range(g, per[g] + 1, 0, per[g] + 4)
            try:
                result = await fetch(sub, ns, location_filter=flt, auth=moqt_relay.token("subscriber"))
            except RequestRejected as exc:
                return [f"FETCH of {{{g},{per[g] + 1}}}..{{{g},{per[g] + 4}}} (after End of Group {{{g},{per[g]}}}, "
                        f"below Largest Object) refused or its stream reset: {exc}"]
            objs = [o for o in result.objects if o.end_of_range is None]
            return [f"FETCH of an empty range delivered {[str(o.location) for o in objs]}"] if objs else []

    run_check(scenario, "MOQT-FETCH-EMPTY", "FETCH of an empty range")


@pytest.mark.req("MOQT-FETCH-INVALID-RANGE")
def test_fetch_past_the_largest_object_is_invalid_range(moqt_relay: RelayUnderTest, rng: np.random.Generator) -> None:
    async def scenario() -> list[str]:
        ns = moqt_relay.namespace(rng)
        problems: list[str] = []
        async with publisher(moqt_relay, ns) as pub, session(moqt_relay, "subscriber") as sub:
            per = published_track(pub, rng)
            for start in (Location(len(per) + 1, 0), Location(len(per) + 7, 3)):
                try:
                    result = await fetch(sub, ns, location_filter=LocationFilter.absolute_start(start.group,
                                                                                                start.object),
                                         auth=moqt_relay.token("subscriber"))
                except RequestRejected as exc:
                    record("received", "REQUEST_ERROR", code=exc.code, start=str(start))
                    if exc.code != RequestErrorCode.INVALID_RANGE:
                        problems.append(f"FETCH from {start} (Largest Object {pub.track.largest}): {exc}, expected "
                                        "REQUEST_ERROR INVALID_RANGE (0x11)")
                    continue
                problems.append(f"FETCH from {start} past the Largest Object {pub.track.largest} was answered "
                                f"FETCH_OK with {len(result.objects)} objects, expected REQUEST_ERROR INVALID_RANGE")
        return problems

    run_check(scenario, "MOQT-FETCH-INVALID-RANGE", "FETCH past Largest")
