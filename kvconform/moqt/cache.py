"""The caching relay's object cache (EDR "Caching Relays", moqt-d22-profile sections 8 and 12).

Objects are keyed by Full Track Name, Group ID and Object ID and stored with every header field as
received (subgroup, priority, forwarding preference, properties bytes, status, payload) so that what a
relay serves from cache is byte-identical to what it was given. Alongside the objects each track keeps
what the relay *knows*: a set of Location ranges in which every Location is either cached or known not
to exist (End of Group / End of Track, ranges a FETCH response declared empty). A fill or FETCH
serves cached objects and asks upstream for the complement, ``TrackCache.missing``.

MAX_CACHE_DURATION (Track Property 0x04): an object may not *start* being forwarded more than that many
milliseconds after its first byte arrived; expired objects are dropped and their Location becomes
unknown again. Time is read from an injectable clock (seconds, monotonic), so tests never sleep.

Invariants: an object is admitted once; a later copy with a different payload, subgroup, priority or
forwarding preference marks the track malformed and is not stored; only Object Properties may change;
an object at a Location already known not to exist is not cached ("SHOULD NOT cache or forward").
"""

from __future__ import annotations

import bisect
import contextlib
import enum
import heapq
import time
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field, replace

from kvconform.moqt.structures import KeyValuePair, Location

__all__ = [
    "MAX_LOCATION",
    "Admit",
    "CachedObject",
    "FullTrackName",
    "Loc",
    "LocationSet",
    "ObjectCache",
    "TrackCache",
    "iter_groups",
    "next_loc",
]

Loc = Location  # ordered as in section 3.1
FullTrackName = tuple[tuple[bytes, ...], bytes]  # (namespace fields, track name), compared bytewise
Clock = Callable[[], float]

MAX_ID = 2**64 - 1
MAX_LOCATION = Location(MAX_ID, MAX_ID)
_END = Location(MAX_ID + 1, 0)  # exclusive end past every Location

STATUS_NORMAL = 0x0
STATUS_END_OF_GROUP = 0x3
STATUS_END_OF_TRACK = 0x4


def next_loc(loc: Loc) -> Loc:
    """The smallest Location after ``loc`` within its group (exclusive end of a range ending at loc)."""
    return Location(loc.group, loc.object + 1)


@dataclass(frozen=True)
class CachedObject:
    """One object with every header field the relay received (EDR "Object Header")."""

    group: int
    object: int
    subgroup: int | None  # None: datagram forwarding preference
    priority: int
    payload: bytes = b""
    status: int = STATUS_NORMAL
    properties: bytes = b""  # encoded Object Properties (KVPs) exactly as received
    arrived: float = 0.0  # cache clock when the first byte arrived

    @property
    def location(self) -> Loc:
        return Location(self.group, self.object)

    @property
    def is_status(self) -> bool:
        """End of Group / End of Track markers: cached, but never sent on FETCH or fill streams."""
        return self.status != STATUS_NORMAL

    def same_identity(self, other: CachedObject) -> bool:
        """Fields a duplicate must not change (EDR "Caching Relays"): else the track is malformed."""
        return (self.payload, self.status, self.subgroup, self.priority) == (
            other.payload, other.status, other.subgroup, other.priority)


class Admit(enum.Enum):
    """What ``TrackCache.add`` did with an object."""

    NEW = "new"  # stored; forward it
    DUPLICATE = "duplicate"  # identical copy already cached; do not forward again
    UPDATED = "updated"  # only its properties changed; stored
    CONFLICT = "conflict"  # different payload/subgroup/priority/preference: track is malformed
    NONEXISTENT = "nonexistent"  # Location already known not to exist: not cached, not forwarded
    EXPIRED = "expired"  # older than MAX_CACHE_DURATION on arrival (FETCH of stale data): not cached


@dataclass
class LocationSet:
    """A set of Locations as sorted, disjoint, non-adjacent half-open ranges [start, end)."""

    ranges: list[tuple[Loc, Loc]] = field(default_factory=list)

    def add(self, start: Loc, end: Loc) -> None:
        if start >= end:
            return
        kept: list[tuple[Loc, Loc]] = []
        for a, b in self.ranges:
            if b < start or a > end:
                kept.append((a, b))
            else:  # overlapping or adjacent: merge
                start, end = min(a, start), max(b, end)
        kept.append((start, end))
        kept.sort()
        self.ranges = kept

    def remove(self, start: Loc, end: Loc) -> None:
        if start >= end:
            return
        kept: list[tuple[Loc, Loc]] = []
        for a, b in self.ranges:
            if b <= start or a >= end:
                kept.append((a, b))
                continue
            if a < start:
                kept.append((a, start))
            if b > end:
                kept.append((end, b))
        self.ranges = kept

    def __contains__(self, loc: object) -> bool:
        return isinstance(loc, Location) and any(a <= loc < b for a, b in self.ranges)

    def gaps(self, start: Loc, end: Loc) -> list[tuple[Loc, Loc]]:
        """The parts of [start, end) not in the set, ascending."""
        out: list[tuple[Loc, Loc]] = []
        cursor = start
        for a, b in self.ranges:
            if b <= cursor:
                continue
            if a >= end:
                break
            if a > cursor:
                out.append((cursor, a))
            cursor = max(cursor, b)
            if cursor >= end:
                break
        if cursor < end:
            out.append((cursor, end))
        return out


@dataclass
class TrackCache:
    """Cached objects and knowledge of one track (one Full Track Name)."""

    name: FullTrackName
    clock: Clock = time.monotonic
    max_cache_duration_ms: int | None = None  # Track Property 0x04; None = until evicted
    track_properties: tuple[KeyValuePair, ...] = ()  # as last received upstream, forwarded unchanged
    largest: Loc | None = None  # relay's Largest Object (section 12)
    end_of_track: Loc | None = None
    malformed: str | None = None  # why the track is malformed; then nothing is cached any more
    known: LocationSet = field(default_factory=LocationSet)
    on_store: Callable[[TrackCache, CachedObject], None] | None = None  # the owner's size accounting
    _objects: dict[Loc, CachedObject] = field(default_factory=dict)
    _order: list[Loc] = field(default_factory=list)  # sorted keys of _objects
    # (arrived, Location) of every stored object, oldest first: `expire` pops only what is
    # stale instead of scanning every object on each lookup (a FETCH of n objects was O(n^2)). Entries
    # whose object was forgotten or replaced since are skipped when they surface.
    _arrivals: list[tuple[float, Loc]] = field(default_factory=list)

    # -- admission -------------------------------------------------------------------------------------

    def add(self, obj: CachedObject) -> Admit:
        """Admit an object received upstream (subscription, fill or FETCH); ``obj.arrived`` is its first
        byte's time on this cache's clock."""
        if self.malformed is not None:
            return Admit.CONFLICT
        loc = obj.location
        self.note_largest(loc)
        old = self._objects.get(loc)
        if old is not None and not self._expired(old, self.clock()):
            if not old.same_identity(obj):
                self.mark_malformed(f"object {loc} received twice with different payload, status, subgroup "
                                    f"or priority (EDR 'Caching Relays')")
                return Admit.CONFLICT
            if old.properties == obj.properties:
                return Admit.DUPLICATE
            self._objects[loc] = replace(old, properties=obj.properties)
            return Admit.UPDATED
        if old is None and loc in self.known:
            return Admit.NONEXISTENT
        if self._expired(obj, self.clock()):
            return Admit.EXPIRED
        if old is None:
            bisect.insort(self._order, loc)
        self._objects[loc] = obj
        heapq.heappush(self._arrivals, (obj.arrived, loc))
        if len(self._arrivals) > 2 * len(self._objects) + 64:  # evictions left stale entries: rebuild
            self._arrivals = [(o.arrived, o.location) for o in self._objects.values()]
            heapq.heapify(self._arrivals)
        self.known.add(loc, next_loc(loc))
        if self.on_store is not None:
            self.on_store(self, obj)
        if obj.status == STATUS_END_OF_GROUP:
            self.known.add(loc, Location(obj.group + 1, 0))
        elif obj.status == STATUS_END_OF_TRACK:
            self.end_of_track = loc
            self.known.add(loc, _END)
        return Admit.NEW

    def note_largest(self, loc: Loc) -> None:
        """Largest Object advances with every Location received and every upstream LARGEST_OBJECT."""
        if self.largest is None or loc > self.largest:
            self.largest = loc

    def end_group_after(self, group: int, last_object: int) -> None:
        """A subgroup stream with END_OF_GROUP ended by FIN after ``last_object``: nothing follows it."""
        self.known.add(Location(group, last_object + 1), Location(group + 1, 0))

    def mark_nonexistent(self, start: Loc, end: Loc) -> None:
        """A FETCH response declared [start, end) empty except for the objects it carried."""
        self.known.add(start, end)

    @contextlib.contextmanager
    def settled(self, start: Loc, end: Loc) -> Iterator[None]:
        """Treat [start, end) as known while a cut-through FETCH response is built from it: the ascending
        upstream FETCH has passed it, but only its FIN settles it for good (``mark_nonexistent``)."""
        gaps = self.known.gaps(start, end)
        for a, b in gaps:
            self.known.add(a, b)
        try:
            yield
        finally:
            for a, b in gaps:
                self.known.remove(a, b)

    def mark_malformed(self, why: str) -> None:
        """EDR "Malformed Tracks": stop caching; the relay ends subscriptions with MALFORMED_TRACK."""
        self.malformed = why
        self._objects.clear()
        self._order.clear()
        self._arrivals.clear()
        self.known = LocationSet()

    # -- expiry ----------------------------------------------------------------------------------------

    def _expired(self, obj: CachedObject, now: float) -> bool:
        return self._stale(obj.arrived, now)

    def _stale(self, arrived: float, now: float) -> bool:
        limit = self.max_cache_duration_ms
        return limit is not None and (now - arrived) * 1000.0 > limit

    def expire(self) -> int:
        """Drop objects past MAX_CACHE_DURATION; their Locations become unknown. Returns how many."""
        if self.max_cache_duration_ms is None:
            return 0
        now = self.clock()
        arrivals, dropped = self._arrivals, 0
        # Staleness is monotone in arrival time, so the stale objects are a prefix of the heap.
        while arrivals and self._stale(arrivals[0][0], now):
            arrived, loc = heapq.heappop(arrivals)
            obj = self._objects.get(loc)
            if obj is not None and obj.arrived == arrived:  # else: forgotten or replaced since
                self.forget(loc)
                dropped += 1
        return dropped

    def forget(self, loc: Loc) -> CachedObject | None:
        """Drop the object at ``loc`` (expiry or eviction): its Location becomes unknown, not absent."""
        obj = self._objects.pop(loc, None)
        if obj is not None:
            self._order.pop(bisect.bisect_left(self._order, loc))
            self.known.remove(loc, next_loc(loc))
        return obj

    # -- lookup ----------------------------------------------------------------------------------------

    def get(self, loc: Loc) -> CachedObject | None:
        """The cached object at ``loc`` if it may still start being forwarded now."""
        obj = self._objects.get(loc)
        if obj is None or self._expired(obj, self.clock()):
            return None
        return obj

    def __len__(self) -> int:
        return len(self._objects)

    def get_stored(self, loc: Loc) -> CachedObject | None:
        """The stored object at ``loc``, expired or not (for accounting)."""
        return self._objects.get(loc)

    def objects(self, start: Loc, end: Loc) -> list[CachedObject]:
        """Servable cached objects with start <= Location < end, ascending (status objects included)."""
        self.expire()
        lo = bisect.bisect_left(self._order, start)
        hi = bisect.bisect_left(self._order, end)
        return [self._objects[loc] for loc in self._order[lo:hi]]

    def missing(self, start: Loc, end: Loc) -> list[tuple[Loc, Loc]]:
        """The sub-ranges of [start, end) whose content the relay does not know (to FETCH upstream)."""
        self.expire()
        return self.known.gaps(start, end)


def iter_groups(objs: Sequence[CachedObject], descending: bool) -> Iterator[CachedObject]:
    """Objects grouped in the requested group order, ascending Object ID within each group."""
    if not descending:
        yield from objs
        return
    groups: dict[int, list[CachedObject]] = {}
    for obj in objs:
        groups.setdefault(obj.group, []).append(obj)
    for g in sorted(groups, reverse=True):
        yield from groups[g]


@dataclass
class ObjectCache:
    """Every track's cache, by Full Track Name; one clock for all.

    ``max_bytes`` bounds the payload bytes held over all tracks: past it the objects stored first are
    evicted ("until implementation constraints cause them to be evicted", EDR MAX_CACHE_DURATION).
    """

    clock: Clock = time.monotonic
    max_bytes: int | None = None
    tracks: dict[FullTrackName, TrackCache] = field(default_factory=dict)
    stored_bytes: int = 0
    evicted: int = 0
    _fifo: deque[tuple[TrackCache, CachedObject]] = field(default_factory=deque)

    def track(self, name: FullTrackName) -> TrackCache:
        cache = self.tracks.get(name)
        if cache is None:
            cache = self.tracks[name] = TrackCache(name, clock=self.clock, on_store=self._stored)
        return cache

    def _stored(self, track: TrackCache, obj: CachedObject) -> None:
        self._fifo.append((track, obj))
        self.stored_bytes += len(obj.payload)
        while self.max_bytes is not None and self.stored_bytes > self.max_bytes and self._fifo:
            old_track, old = self._fifo.popleft()
            self.stored_bytes -= len(old.payload)
            stored = old_track.get_stored(old.location)
            if stored is not None and stored.arrived == old.arrived:  # the same copy (maybe property-updated)
                old_track.forget(old.location)
                self.evicted += 1

    def find(self, name: FullTrackName) -> TrackCache | None:
        return self.tracks.get(name)

    def expire(self) -> int:
        return sum(t.expire() for t in self.tracks.values())
