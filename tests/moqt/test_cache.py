"""The relay cache: identity rules, knowledge ranges, MAX_CACHE_DURATION on an injected clock."""

from __future__ import annotations

from hypothesis import example, given
from hypothesis import strategies as st

from kvconform.moqt.cache import (
    Admit,
    CachedObject,
    LocationSet,
    ObjectCache,
    TrackCache,
    iter_groups,
)
from kvconform.moqt.structures import Location

NAME = ((b"kvcs-1", b"scope"), b"k.raw.s0")


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def obj(g: int, o: int, payload: bytes = b"x", *, status: int = 0, subgroup: int | None = 0, priority: int = 7,
        properties: bytes = b"", arrived: float = 100.0) -> CachedObject:
    return CachedObject(g, o, subgroup, priority, payload, status, properties, arrived)


def L(g: int, o: int) -> Location:
    return Location(g, o)


def test_new_then_duplicate_then_property_update() -> None:
    clock = FakeClock()
    cache = TrackCache(NAME, clock=clock)
    assert cache.add(obj(0, 0, b"ab")) is Admit.NEW
    assert cache.add(obj(0, 0, b"ab")) is Admit.DUPLICATE
    assert cache.add(obj(0, 0, b"ab", properties=b"\x02\x05")) is Admit.UPDATED
    stored = cache.get(L(0, 0))
    assert stored is not None and stored.payload == b"ab" and stored.properties == b"\x02\x05"
    assert cache.largest == L(0, 0)


def test_conflicting_duplicate_marks_track_malformed_and_drops_it() -> None:
    for changed in (obj(1, 2, b"other"), obj(1, 2, b"same", subgroup=1), obj(1, 2, b"same", priority=9),
                    obj(1, 2, b"same", subgroup=None)):
        cache = TrackCache(NAME, clock=FakeClock())
        assert cache.add(obj(1, 2, b"same")) is Admit.NEW
        assert cache.add(changed) is Admit.CONFLICT
        assert cache.malformed is not None and "{1,2}" in cache.malformed
        assert len(cache) == 0
        assert cache.add(obj(1, 3)) is Admit.CONFLICT  # nothing is cached after malformation


def test_end_of_group_makes_the_rest_of_the_group_known_absent() -> None:
    cache = TrackCache(NAME, clock=FakeClock())
    for o in range(3):
        cache.add(obj(0, o))
    cache.add(obj(0, 3, b"", status=0x3))
    assert cache.missing(L(0, 0), L(1, 0)) == []
    assert cache.add(obj(0, 7)) is Admit.NONEXISTENT
    assert cache.get(L(0, 7)) is None
    # group 1 was never seen: all of it is unknown
    assert cache.missing(L(0, 0), L(1, 5)) == [(L(1, 0), L(1, 5))]


def test_end_of_track_closes_everything_after_it() -> None:
    cache = TrackCache(NAME, clock=FakeClock())
    cache.add(obj(4, 0, b"", status=0x4))
    assert cache.end_of_track == L(4, 0)
    assert cache.missing(L(4, 0), L(9, 9)) == []
    assert cache.add(obj(5, 0)) is Admit.NONEXISTENT


def test_missing_lists_gaps_between_cached_objects() -> None:
    cache = TrackCache(NAME, clock=FakeClock())
    for loc in ((0, 0), (0, 1), (0, 4), (2, 0)):
        cache.add(obj(*loc))
    assert cache.missing(L(0, 0), L(2, 1)) == [(L(0, 2), L(0, 4)), (L(0, 5), L(2, 0))]
    cache.mark_nonexistent(L(0, 5), L(2, 0))  # e.g. an upstream FETCH covering it returned nothing
    assert cache.missing(L(0, 0), L(2, 1)) == [(L(0, 2), L(0, 4))]
    cache.end_group_after(0, 1)  # an END_OF_GROUP subgroup stream FINed after object 1 ...
    assert cache.missing(L(0, 0), L(2, 1)) == []


def test_objects_ascend_and_descending_group_order_keeps_objects_ascending() -> None:
    cache = TrackCache(NAME, clock=FakeClock())
    for loc in ((2, 1), (0, 1), (1, 0), (0, 0), (2, 0)):
        cache.add(obj(*loc))
    got = [o.location for o in cache.objects(L(0, 1), L(2, 1))]
    assert got == [L(0, 1), L(1, 0), L(2, 0)]
    down = [o.location for o in iter_groups(cache.objects(L(0, 0), L(3, 0)), descending=True)]
    assert down == [L(2, 0), L(2, 1), L(1, 0), L(0, 0), L(0, 1)]


def test_max_cache_duration_expires_objects_without_sleeping() -> None:
    clock = FakeClock()
    cache = TrackCache(NAME, clock=clock, max_cache_duration_ms=500)
    cache.add(obj(0, 0, arrived=100.0))
    cache.add(obj(0, 1, arrived=100.3))
    clock.now = 100.5  # exactly the limit: still servable
    assert [o.location for o in cache.objects(L(0, 0), L(1, 0))] == [L(0, 0), L(0, 1)]
    clock.now = 100.6  # {0,0} is 600 ms old, {0,1} 300 ms
    assert cache.get(L(0, 0)) is None
    assert [o.location for o in cache.objects(L(0, 0), L(1, 0))] == [L(0, 1)]
    assert cache.missing(L(0, 0), L(0, 2)) == [(L(0, 0), L(0, 1))]  # expired = unknown, not absent
    # a fresh copy (from an upstream FETCH) is admitted again
    assert cache.add(obj(0, 0, arrived=clock.now)) is Admit.NEW
    clock.now = 101.0
    assert cache.add(obj(3, 0, arrived=100.0)) is Admit.EXPIRED  # already stale on arrival


def test_without_max_cache_duration_objects_stay() -> None:
    clock = FakeClock()
    cache = ObjectCache(clock=clock)
    track = cache.track(NAME)
    track.add(obj(0, 0))
    clock.now = 1e9
    assert track.get(L(0, 0)) is not None
    assert cache.expire() == 0
    assert cache.find(NAME) is track and cache.find((NAME[0], b"other")) is None


LOCS = st.tuples(st.integers(0, 4), st.integers(0, 4)).map(lambda t: Location(*t))


@given(st.lists(st.tuples(LOCS, LOCS, st.booleans()), max_size=12), LOCS, LOCS)
def test_location_set_matches_a_model(ops: list[tuple[Location, Location, bool]], a: Location,
                                      b: Location) -> None:
    """LocationSet over a small grid equals a plain set of Locations (objects 0..4 of groups 0..4)."""
    grid = [Location(g, o) for g in range(6) for o in range(6)]
    model: set[Location] = set()
    ls = LocationSet()
    for start, end, add in ops:
        span = {x for x in grid if start <= x < end}
        if add:
            ls.add(start, end)
            model |= span
        else:
            ls.remove(start, end)
            model -= span
    assert {x for x in grid if x in ls} == model
    for (x, y), (u, v) in zip(ls.ranges, ls.ranges[1:], strict=False):
        assert x < y < u < v  # disjoint, sorted, not adjacent
    gaps = ls.gaps(a, b)
    assert {x for x in grid if any(s <= x < e for s, e in gaps)} == {x for x in grid if a <= x < b} - model


def test_object_cache_evicts_the_oldest_objects_past_its_byte_bound() -> None:
    cache = ObjectCache(clock=FakeClock(), max_bytes=10)
    a, b = cache.track(NAME), cache.track((NAME[0], b"other"))
    a.add(obj(0, 0, b"aaaa"))
    b.add(obj(0, 0, b"bbbb"))
    a.add(obj(0, 0, b"aaaa", properties=b"\x02\x01"))  # a property update keeps it the same copy
    assert cache.evicted == 0 and cache.stored_bytes == 8
    a.add(obj(0, 1, b"cccc"))  # 12 bytes: the first stored ({0,0} of track a) goes
    assert cache.evicted == 1 and a.get(L(0, 0)) is None and b.get(L(0, 0)) is not None
    assert a.missing(L(0, 0), L(0, 2)) == [(L(0, 0), L(0, 1))]  # evicted = unknown again
    assert a.add(obj(0, 0, b"aaaa")) is Admit.NEW  # and can be cached again


ARRIVALS = st.floats(99.0, 101.0, allow_nan=False)
STEPS = st.lists(st.one_of(
    st.tuples(st.just("add"), LOCS, ARRIVALS),  # a copy arriving (maybe out of arrival order, maybe a repeat)
    st.tuples(st.just("props"), LOCS, ARRIVALS),  # the same object with other properties
    st.tuples(st.just("forget"), LOCS, ARRIVALS),  # eviction
    st.tuples(st.just("tick"), LOCS, st.floats(0.0, 0.4, allow_nan=False)),
), max_size=40)


@given(STEPS)
@example([("add", Location(0, 0), 99.6), ("forget", Location(0, 0), 0.0), ("add", Location(0, 0), 100.9),
          ("tick", Location(0, 0), 0.2)])  # the evicted copy's heap entry must not expire the new one
def test_expire_drops_exactly_the_stale_objects(steps: list[tuple[str, Location, float]]) -> None:
    """``expire`` pops stale objects from an arrival-ordered heap instead of scanning every object: whatever
    the order of arrivals, repeats, property updates and evictions, it drops exactly the objects older
    than MAX_CACHE_DURATION and keeps the rest (checked against a scan of every Location)."""
    clock = FakeClock()
    cache = TrackCache(NAME, clock=clock, max_cache_duration_ms=500)
    universe = [Location(g, o) for g in range(5) for o in range(5)]
    for kind, loc, value in steps:
        if kind == "add":
            cache.add(obj(loc.group, loc.object, arrived=value))
        elif kind == "props":
            cache.add(obj(loc.group, loc.object, arrived=value, properties=b"\x02\x01"))
        elif kind == "forget":
            cache.forget(loc)
        else:
            clock.now += value
        stored = {at: o for at in universe if (o := cache.get_stored(at)) is not None}
        stale = {at for at, o in stored.items() if (clock.now - o.arrived) * 1000.0 > 500}
        assert cache.expire() == len(stale)
        assert {at for at in universe if cache.get_stored(at) is not None} == set(stored) - stale
        assert all(at not in cache.known for at in stale)  # an expired Location is unknown again


def test_expiry_bookkeeping_stays_bounded_under_eviction() -> None:
    """Evicted objects leave entries in the arrival heap; it is rebuilt before it outgrows the cache."""
    cache = ObjectCache(clock=FakeClock(), max_bytes=10)
    track = cache.track(NAME)
    for i in range(1000):
        track.add(obj(i, 0, b"x" * 5))
    assert len(track) == 2 and cache.evicted == 998
    assert len(track._arrivals) <= 2 * len(track) + 64
