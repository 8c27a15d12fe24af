"""The relay's state: sessions, tracks, the subscriptions it holds upstream and serves downstream, its own
FETCHes, and its counters. Plain data: no asyncio, no clock.

What the adapter may await (an upstream subscription's answer, an upstream FETCH's end, the end of a wait for one)
is a ``Completion``: an interface the adapter fills with asyncio futures and a test with ``PlainCompletion``, so
the core sets them without knowing who waits. The core's own pending waits (``Rendezvous``, ``EstablishWait``,
``StatusWait``, ``UpstreamEnding``, ``FetchWait``) carry a deadline on the core's ``now`` scale and the handle of
the adapter's timer for it.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Generic, Protocol, TypeVar

from kvconform.moqt.cache import MAX_ID, FullTrackName, TrackCache
from kvconform.moqt.data import SubgroupHeader
from kvconform.moqt.filters import LocationFilter, RangeFilter
from kvconform.moqt.messages import FetchOk, PublishDone, RequestError, Subscribe, SubscribeOk
from kvconform.moqt.parameters import Parameters
from kvconform.moqt.policy import TokenKey
from kvconform.moqt.session import Request, RequestState
from kvconform.moqt.structures import (
    KeyValuePair,
    Location,
    PropertyType,
    TrackNamespace,
    find_kvp,
    render_full_track_name,
)

if TYPE_CHECKING:
    from kvconform.moqt.quic import MoqtConnection

__all__ = [
    "DEFAULT_CACHE_BYTES",
    "DEFAULT_FILL_TIMEOUT_MS",
    "Completion",
    "Downstream",
    "EstablishWait",
    "FetchJob",
    "FetchWait",
    "FillJob",
    "InStream",
    "Peer",
    "PlainCompletion",
    "PlainSignal",
    "Refusal",
    "RelayCounters",
    "Rendezvous",
    "StatusWait",
    "Track",
    "TrackCounters",
    "Upstream",
    "UpstreamEnding",
    "UpstreamFetch",
]

# The relay's own budget for upstream gap filling when a request names no FILL_TIMEOUT: time without
# progress (an object arriving), so a large range that keeps flowing is not cut off.
DEFAULT_FILL_TIMEOUT_MS = 5000
DEFAULT_CACHE_BYTES = 256 * 2**20  # payload bytes cached over all tracks before the oldest are evicted
UPSTREAM_TIMEOUT = 5.0  # seconds to wait for an upstream SUBSCRIBE_OK / TRACK_STATUS answer
# Seconds without progress (an object or a stream end) on an upstream subscription's data streams after
# its PUBLISH_DONE, before the relay stops waiting for the streams it counts: idle time, not total, so a
# publisher with megabytes still in flight is not cut off.
DONE_GRACE = 2.0
PUBLISH_DONE_AFTER_SENT = 10.0  # seconds a PUBLISH_DONE waits at most for the streams it counts to leave
UNKNOWN_AUTH_TOKEN_ALIAS = 0x17  # REQUEST_ERROR code aiomoqt uses (profile section 13 #14)

T = TypeVar("T")


# ---------------------------------------------------------------------------------------------------
# What the adapter waits on


class Completion(Protocol[T]):
    """A result set once (an ``asyncio.Future`` is one)."""

    def done(self) -> bool: ...

    def result(self) -> T: ...

    def set_result(self, result: T, /) -> None: ...


class Cancellable(Protocol):
    """Work the adapter runs for the core (an ``asyncio.Task`` is one)."""

    def cancel(self) -> Any: ...


@dataclass
class PlainCompletion(Generic[T]):
    """A ``Completion`` without a loop: for driving the core directly."""

    value: T | None = None
    is_done: bool = False

    def done(self) -> bool:
        return self.is_done

    def result(self) -> T:
        assert self.is_done, "no result yet"
        return self.value  # type: ignore[return-value]

    def set_result(self, result: T, /) -> None:
        assert not self.is_done, "result already set"
        self.value, self.is_done = result, True


@dataclass
class PlainSignal:
    """A flag the core sets as something arrives and its waiters clear."""

    flag: bool = False

    def set(self) -> None:
        self.flag = True

    def clear(self) -> None:
        self.flag = False

    def is_set(self) -> bool:
        return self.flag


# ---------------------------------------------------------------------------------------------------
# Counters


@dataclass
class TrackCounters:
    """Per-track progress, shown while the relay runs."""

    objects_in: int = 0  # objects received upstream (subscription and FETCH)
    bytes_in: int = 0
    duplicates: int = 0  # identical copies received again (not forwarded twice)
    forwarded: int = 0  # objects written on downstream subgroup streams
    fill_objects: int = 0
    fetch_objects: int = 0
    upstream_fetches: int = 0


@dataclass
class RelayCounters:
    """Relay-wide counters; ``line()`` is what ``kvconform serve moqt-relay`` prints."""

    sessions_total: int = 0
    sessions_open: int = 0
    requests: Counter[str] = field(default_factory=Counter)
    refused: Counter[str] = field(default_factory=Counter)
    session_closes: Counter[str] = field(default_factory=Counter)
    internal_errors: int = 0

    def line(self) -> str:
        req = " ".join(f"{k}={v}" for k, v in sorted(self.requests.items())) or "none"
        ref = " ".join(f"{k}={v}" for k, v in sorted(self.refused.items())) or "none"
        closes = " ".join(f"{k}={v}" for k, v in sorted(self.session_closes.items())) or "none"
        return (f"sessions open={self.sessions_open} total={self.sessions_total} closes {closes} | "
                f"requests {req} | refused {ref} | internal errors {self.internal_errors}")


# ---------------------------------------------------------------------------------------------------
# Sessions, tracks, subscriptions


@dataclass(eq=False)
class Peer:
    """One session at the relay (a publisher, a subscriber, or both)."""

    conn: MoqtConnection
    number: int
    setup_tokens: list[TokenKey] = field(default_factory=list)
    aliases: dict[int, TokenKey] = field(default_factory=dict)  # REGISTERed Token Aliases
    publications: dict[int, TrackNamespace] = field(default_factory=dict)  # PUBLISH_NAMESPACE stream -> ns
    namespace_subs: dict[int, TrackNamespace] = field(default_factory=dict)  # SUBSCRIBE_NAMESPACE -> prefix
    downstream: dict[int, Downstream] = field(default_factory=dict)  # peer's SUBSCRIBE streams
    upstream: dict[int, Upstream] = field(default_factory=dict)  # our SUBSCRIBE / its PUBLISH streams
    fetches: dict[int, UpstreamFetch] = field(default_factory=dict)  # our FETCH request streams
    fetch_streams: dict[int, UpstreamFetch] = field(default_factory=dict)  # their fetch data streams
    in_streams: dict[int, InStream] = field(default_factory=dict)  # its subgroup streams
    status_requests: dict[int, StatusWait] = field(default_factory=dict)  # our TRACK_STATUS request streams
    tasks: set[Any] = field(default_factory=set)  # the adapter's work for this session (Cancellable)
    fetch_jobs: dict[int, FetchJob] = field(default_factory=dict)  # its FETCHes being served, by request stream
    gone: bool = False

    @property
    def session(self) -> Any:  # a kvconform.moqt.session.Session; Any lets mutants reach its internals
        return self.conn.session

    def __str__(self) -> str:
        return f"session#{self.number}"


@dataclass(eq=False)
class Rendezvous:
    """A SUBSCRIBE held by RENDEZVOUS_TIMEOUT until a publisher appears: a pending wait of the core, ended by
    a source arriving (``Relay.source_arrived``) or by the adapter's timer at ``deadline`` (section 7.1)."""

    peer: Peer
    request: Request
    message: Subscribe
    track: Track
    timeout_ms: int
    deadline: float  # on the core's ``now`` scale
    timer: Any = None  # the adapter's handle for the timer (its ``cancel_timer`` takes it)


@dataclass(eq=False)
class EstablishWait:
    """A SUBSCRIBE held until one of its track's upstream subscriptions is Established (section 12): a pending
    wait of the core, looked at again whenever an upstream answers, ended at ``deadline`` by the adapter's
    timer (``upstream_timeout``)."""

    peer: Peer
    request: Request
    message: Subscribe
    track: Track
    deadline: float  # on the core's ``now`` scale
    last: SubscribeOk | RequestError | None = None  # the latest upstream answer seen while waiting
    timer: Any = None
    woken: bool = False  # a look after an upstream answer is scheduled


@dataclass(eq=False)
class StatusWait:
    """A TRACK_STATUS the relay sent upstream for a requester's TRACK_STATUS: answered when the source answers,
    or with TIMEOUT at the adapter's timer (``upstream_timeout``) or when the source's request ends first."""

    requester: Peer
    request: Request
    source: Peer
    stream_id: int  # the relay's request stream to the source
    timer: Any = None
    done: bool = False


@dataclass(eq=False)
class Track:
    """Everything the relay knows about one Full Track Name."""

    namespace: TrackNamespace
    name: bytes
    cache: TrackCache
    upstreams: list[Upstream] = field(default_factory=list)
    subscribers: list[Downstream] = field(default_factory=list)
    counters: TrackCounters = field(default_factory=TrackCounters)
    rendezvous: list[Rendezvous] = field(default_factory=list)  # SUBSCRIBEs waiting for a publisher
    wake_pending: bool = False  # a source arrived; the adapter's wake-up has not run yet
    establishing: list[EstablishWait] = field(default_factory=list)  # SUBSCRIBEs waiting for SUBSCRIBE_OK upstream

    @property
    def waiting(self) -> int:
        """SUBSCRIBEs held by RENDEZVOUS_TIMEOUT until a publisher appears."""
        return len(self.rendezvous)

    @property
    def key(self) -> FullTrackName:
        return (self.namespace.fields, self.name)

    def __str__(self) -> str:
        return render_full_track_name(self.namespace, self.name)


@dataclass(eq=False)
class Upstream:
    """A subscription the relay holds upstream: its SUBSCRIBE to a publisher, or a publisher's PUBLISH."""

    peer: Peer
    request: Request
    track: Track
    # A Completion[SubscribeOk | RequestError | None] (None: the request failed otherwise), typed Any: under the
    # adapter it is the asyncio.Future that subclasses await (targets/kvcs/recording_relay.py, asyncio.wait).
    ready: Any
    done: PublishDone | None = None
    streams_ended: int = 0
    ending: UpstreamEnding | None = None  # after PUBLISH_DONE: its end being carried out

    @property
    def established(self) -> bool:
        return self.request.state is RequestState.ESTABLISHED and self.done is None and not self.peer.gone


@dataclass(eq=False)
class UpstreamEnding:
    """An upstream subscription's PUBLISH_DONE being carried out, a pending wait of the core in two phases: its data
    streams ending (``streams``: until PUBLISH_DONE's Stream Count have ended, or DONE_GRACE without progress),
    then its downstream subscriptions ending one by one, each once its fills finished (``subscribers``: DONE_GRACE
    at most each), section 6.2."""

    up: Upstream
    deadline: float  # on the core's ``now`` scale: the current phase's bound
    phase: str = "streams"  # "streams", "subscribers", "ended"
    ends_subscribers: bool = False  # no other upstream subscription of the track was Established
    handled: set[Downstream] = field(default_factory=set)
    current: Downstream | None = None  # the subscription whose fills are awaited
    timer: Any = None
    look_pending: bool = False


@dataclass(eq=False)
class InStream:
    """An upstream subgroup stream and the downstream streams it is forwarded on."""

    upstream: Upstream
    header: SubgroupHeader
    first_id: int | None = None
    last_id: int | None = None
    out: dict[Downstream, int] = field(default_factory=dict)


@dataclass(eq=False)
class Downstream:
    """A subscriber's SUBSCRIBE served by the relay."""

    peer: Peer
    request: Request
    track: Track
    start: Location
    end: Location | None
    forward: bool
    filters: tuple[RangeFilter, ...] = ()
    sent: set[Location] = field(default_factory=set)
    fill_tasks: set[FillJob] = field(default_factory=set)  # its fills still running
    fill_streams: set[int] = field(default_factory=set)  # open fill fetch streams
    finished: bool = False

    def wants(self, loc: Location) -> bool:
        """Subscription-delivered (section 11.1): FORWARD, the Location filter, not sent before."""
        return (self.forward and self.start <= loc and (self.end is None or loc <= self.end)
                and loc not in self.sent)


@dataclass(eq=False)
class UpstreamFetch:
    """A FETCH the relay sent upstream to fill a gap in its cache; [start, end) in Location order."""

    peer: Peer
    request: Request
    track: Track
    start: Location
    end: Location
    done: Completion[bool]  # True: FETCH_OK and the data stream ended with FIN
    progress: PlainSignal = field(default_factory=PlainSignal)  # set as its answer and objects arrive
    waits: list[FetchWait] = field(default_factory=list)  # who waits for it (fills, FETCHes)
    ok: FetchOk | None = None
    error: RequestError | None = None
    stream_fin: bool = False
    prev: Location | None = None  # last record seen on the data stream
    unknown: list[tuple[Location, Location]] = field(default_factory=list)


@dataclass(eq=False)
class FetchWait:
    """A wait for an upstream FETCH to finish, or only until ``until()`` holds: within ``deadline`` in all (a
    request's FILL_TIMEOUT), or, with None, for as long as it makes progress (``fill_timeout_ms`` at most between
    two answers or records). A pending wait of the core; ``result`` is False when the budget ran out."""

    fetch: UpstreamFetch
    deadline: float | None  # on the core's ``now`` scale
    until: Callable[[], bool] | None
    result: Completion[bool]
    then: Callable[[bool], None] | None = None  # the core's own continuation, if a core flow waits
    timer: Any = None
    look_pending: bool = False


@dataclass(eq=False)
class FillJob:
    """A fill fetch stream being served (section 11.2): waiting, if the cache lacks part of [start, end], for the
    FETCH the relay sent upstream (``wait``), then written from the cache and ended. ``cancel`` (the subscription
    ended or was cancelled) resets the stream; ``Downstream.fill_tasks`` holds the jobs still running."""

    ds: Downstream
    stream_id: int
    start: Location
    end: Location
    descending: bool
    filters: tuple[RangeFilter, ...]
    on_cancel: Callable[[], None] | None = None  # the core's, set when the job starts
    wait: FetchWait | None = None
    cancelled: bool = False
    finished: bool = False

    def cancel(self) -> None:
        if self.on_cancel is not None:
            self.on_cancel()


@dataclass(eq=False)
class FetchJob:
    """A standalone FETCH being served (section 7.3): a pending job of the core, like ``FillJob``. Served from
    the cache once the gaps of its range are FETCHed upstream (``wait``), or, for a track the relay does not
    follow, cut through from the relay's own FETCH upstream (``upstream``) as its objects arrive. ``deadline``
    is the end of the request's FILL_TIMEOUT on the core's ``now`` scale (None: bounded by progress)."""

    peer: Peer
    request: Request
    track: Track
    descending: bool
    filters: tuple[RangeFilter, ...]
    deadline: float | None
    rng: tuple[Location, Location] | None = None  # inclusive, once known
    end_of_track: bool | None = None  # FETCH_OK's End Of Track, when the upstream's answer decides it
    upstream: UpstreamFetch | None = None  # the relay's FETCH of the same range (a track it does not follow)
    cut_through: bool = False  # served while ``upstream`` arrives
    stream_id: int | None = None  # the fetch stream, once FETCH_OK is sent
    cursor: Location | None = None  # cut-through: the first Location not yet written
    served: int = 0  # fetch objects written
    wait: FetchWait | None = None
    finished: bool = False


class Refusal(Exception):
    """Answer the request with REQUEST_ERROR ``code``."""

    def __init__(self, code: int, reason: str) -> None:
        super().__init__(reason)
        self.code = code
        self.reason = reason


# ---------------------------------------------------------------------------------------------------
# Small helpers the concepts share


def loc_before(loc: Location) -> Location:
    """The largest Location smaller than ``loc`` (a whole-group end is Object 2^64-1)."""
    return Location(loc.group, loc.object - 1) if loc.object > 0 else Location(loc.group - 1, MAX_ID)


def loc_tuple(loc: Location) -> tuple[int, int]:
    return loc.group, loc.object


def range_filter(start: Location, end: Location) -> LocationFilter:
    """LOCATION_FILTER selecting [start, end) as a FETCH range (section 7.3 types 0x03 / 0x04)."""
    if end.object > MAX_ID:
        end = Location(end.group + 1, 0)
    if end.object == 0:
        return LocationFilter.absolute_start_group_end(start.group, start.object, end.group - 1 - start.group)
    return LocationFilter.absolute_range(start.group, start.object, end.group - start.group, end.object - 1)


def range_filters(params: Parameters) -> tuple[RangeFilter, ...]:
    return tuple(p.value for p in params if isinstance(p.value, RangeFilter) and p.value.set_id is not None)


def int_param(params: Parameters, ptype: int) -> int | None:
    value = params.get(ptype)
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def cache_duration(props: Sequence[KeyValuePair]) -> int | None:
    values = find_kvp(props, PropertyType.MAX_CACHE_DURATION)
    return values[0] if values and isinstance(values[0], int) else None


