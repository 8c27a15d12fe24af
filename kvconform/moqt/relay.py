"""The caching MOQT draft-22 relay (EDR "Relays", moqt-d22-profile sections 11 and 12).

One asyncio task per session reads that session's events (``kvconform.moqt.quic``) and drives the
relay's state, which is shared by all sessions:

* publishers announce with PUBLISH_NAMESPACE (authorized per namespace prefix by a ``Policy``); the
  relay answers NAMESPACE / NAMESPACE_DONE on every matching SUBSCRIBE_NAMESPACE stream ([d22] it
  never forwards PUBLISH_NAMESPACE itself);
* a downstream SUBSCRIBE is aggregated onto one upstream subscription per publisher (LOCATION_FILTER
  Next Object); SUBSCRIBE_OK is sent only once one upstream subscription is Established, with
  LARGEST_OBJECT = max(upstream LARGEST_OBJECT, largest Location received) (section 12);
* every object received upstream is cached by Full Track Name and Location (``cache.TrackCache``) and
  forwarded unchanged, stream for stream, to each subscription whose filter passes it;
* fills and FETCHes are served from the cache; Locations the cache does not know are FETCHed upstream
  within FILL_TIMEOUT, and what stays unknown is reported with End of Unknown / Timed-Out Range records;
* MAX_CACHE_DURATION (Track Property 0x04) bounds how long an object may start being served.

Mutant relays (``tests/mutants``) subclass ``Relay`` and override one small method per behaviour:
``authorize``, ``forward_object``, ``serve_fill``, ``fill_items``, ``fetch_items``, ``serve_fetch_range``,
``write_fetch_items``, ``subscription_passes``, ``track_properties``, ``upstream_subscribe_parameters``,
``upstream_fetch_parameters``, ``accept_subscribe``, ``start_fill``. The session's checked writers refuse what a
broken relay would send (descending groups on an Ascending stream, a repeated Object ID); a mutant writes
such bytes on the stream with ``peer.session.send_raw(stream_id, ...)``, encoding them with
``data.FetchStreamWriter`` (another group order) or ``craft.raw_fetch_object``.

Use in-process::

    async with Relay(policy=load_policy("policy.yaml")) as relay:   # 127.0.0.1, a free port
        url = relay.url                                             # moqt://127.0.0.1:PORT
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Coroutine, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, TextIO

from kvconform.loading import load_subclass
from kvconform.moqt import quic
from kvconform.moqt.cache import (
    MAX_ID,
    Admit,
    CachedObject,
    FullTrackName,
    ObjectCache,
    TrackCache,
    iter_groups,
    next_loc,
)
from kvconform.moqt.data import (
    EndOfRange,
    EndOfRangeKind,
    FetchHeader,
    FetchObject,
    GroupOrder,
    SubgroupHeader,
    SubgroupObject,
)
from kvconform.moqt.errors import PublishDoneCode, RequestErrorCode, StreamResetCode
from kvconform.moqt.filters import LocationFilter, RangeFilter, passes_range_filters
from kvconform.moqt.messages import (
    Fetch,
    FetchOk,
    MessageType,
    Publish,
    PublishDone,
    PublishNamespace,
    RequestError,
    RequestOk,
    RequestUpdate,
    Subscribe,
    SubscribeNamespace,
    SubscribeOk,
    TrackStatus,
)
from kvconform.moqt.parameters import FillParameters, Parameters
from kvconform.moqt.policy import Decision, Policy, Right, TokenKey
from kvconform.moqt.session import (
    DataStreamEnded,
    DataStreamOpened,
    Event,
    MessageReceived,
    ObjectReceived,
    Request,
    RequestAutoRejected,
    RequestReceived,
    RequestState,
    RequestStreamEnded,
    Role,
    SessionClosed,
    SessionConfig,
    SessionUsageError,
    SetupReceived,
    StopSendingReceived,
)
from kvconform.moqt.structures import (
    AuthAliasType,
    AuthToken,
    KeyValuePair,
    Location,
    ParamType,
    PropertyType,
    TrackNamespace,
    find_kvp,
    render_full_track_name,
)

__all__ = [
    "DEFAULT_CACHE_BYTES",
    "DEFAULT_FILL_TIMEOUT_MS",
    "Downstream",
    "Peer",
    "Relay",
    "RelayCounters",
    "Track",
    "TrackCounters",
    "Upstream",
    "UpstreamFetch",
    "load_relay_class",
    "run_relay",
]

log = logging.getLogger("kvconform.moqt.relay")

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
EVENT_WAIT = 30.0  # a session task's bounded wait for its next event (it re-checks liveness after)
UNKNOWN_AUTH_TOKEN_ALIAS = 0x17  # REQUEST_ERROR code aiomoqt uses (profile section 13 #14)


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
# Relay state


@dataclass(eq=False)
class Peer:
    """One session at the relay (a publisher, a subscriber, or both)."""

    conn: quic.MoqtConnection
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
    status_requests: dict[int, asyncio.Future[RequestOk | RequestError | None]] = field(default_factory=dict)
    tasks: set[asyncio.Task[None]] = field(default_factory=set)
    gone: bool = False

    @property
    def session(self) -> Any:  # a kvconform.moqt.session.Session; Any lets mutants reach its internals
        return self.conn.session

    def __str__(self) -> str:
        return f"session#{self.number}"


@dataclass(eq=False)
class Track:
    """Everything the relay knows about one Full Track Name."""

    namespace: TrackNamespace
    name: bytes
    cache: TrackCache
    upstreams: list[Upstream] = field(default_factory=list)
    subscribers: list[Downstream] = field(default_factory=list)
    counters: TrackCounters = field(default_factory=TrackCounters)
    waiting: int = 0  # SUBSCRIBEs held by RENDEZVOUS_TIMEOUT until a publisher appears
    source_arrived: asyncio.Event = field(default_factory=asyncio.Event)

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
    ready: asyncio.Future[SubscribeOk | RequestError | None]  # None: the request failed otherwise
    done: PublishDone | None = None
    streams_ended: int = 0
    progress: asyncio.Event = field(default_factory=asyncio.Event)

    @property
    def established(self) -> bool:
        return self.request.state is RequestState.ESTABLISHED and self.done is None and not self.peer.gone


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
    fill_tasks: set[asyncio.Task[None]] = field(default_factory=set)
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
    done: asyncio.Future[bool]  # True: FETCH_OK and the data stream ended with FIN
    ok: FetchOk | None = None
    error: RequestError | None = None
    stream_fin: bool = False
    prev: Location | None = None  # last record seen on the data stream
    unknown: list[tuple[Location, Location]] = field(default_factory=list)
    progress: asyncio.Event = field(default_factory=asyncio.Event)  # set as objects arrive


class _Refusal(Exception):
    """Internal: answer the request with REQUEST_ERROR ``code``."""

    def __init__(self, code: int, reason: str) -> None:
        super().__init__(reason)
        self.code = code
        self.reason = reason


def _loc_before(loc: Location) -> Location:
    """The largest Location smaller than ``loc`` (a whole-group end is Object 2^64-1)."""
    return Location(loc.group, loc.object - 1) if loc.object > 0 else Location(loc.group - 1, MAX_ID)


def _range_filter(start: Location, end: Location) -> LocationFilter:
    """LOCATION_FILTER selecting [start, end) as a FETCH range (section 7.3 types 0x03 / 0x04)."""
    if end.object > MAX_ID:
        end = Location(end.group + 1, 0)
    if end.object == 0:
        return LocationFilter.absolute_start_group_end(start.group, start.object, end.group - 1 - start.group)
    return LocationFilter.absolute_range(start.group, start.object, end.group - start.group, end.object - 1)


def _range_filters(params: Parameters) -> tuple[RangeFilter, ...]:
    return tuple(p.value for p in params if isinstance(p.value, RangeFilter) and p.value.set_id is not None)


def _int_param(params: Parameters, ptype: int) -> int | None:
    value = params.get(ptype)
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _cache_duration(props: Sequence[KeyValuePair]) -> int | None:
    values = find_kvp(props, PropertyType.MAX_CACHE_DURATION)
    return values[0] if values and isinstance(values[0], int) else None


# ---------------------------------------------------------------------------------------------------


class Relay:
    """A caching relay listening on (host, port); ``await start()`` / ``close()`` or ``async with``."""

    def __init__(
        self,
        *,
        policy: Policy | None = None,
        host: str = "127.0.0.1",
        port: int = 0,
        clock: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], float] = time.time,
        fill_timeout_ms: int = DEFAULT_FILL_TIMEOUT_MS,
        upstream_timeout: float = UPSTREAM_TIMEOUT,
        idle_timeout: float = 30.0,
        cache_bytes: int | None = DEFAULT_CACHE_BYTES,
    ) -> None:
        self.policy = policy if policy is not None else Policy.allow_everything()
        self.host = host
        self.requested_port = port
        self.clock = clock  # cache clock (MAX_CACHE_DURATION), seconds
        self.wall_clock = wall_clock  # token expiry, Unix seconds
        self.fill_timeout_ms = fill_timeout_ms
        self.upstream_timeout = upstream_timeout
        self.idle_timeout = idle_timeout
        self.cache = ObjectCache(clock=clock, max_bytes=cache_bytes)
        self.tracks: dict[FullTrackName, Track] = {}
        self.peers: list[Peer] = []
        self.counters = RelayCounters()
        self._server: quic.MoqtServer | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self._numbers = 0

    # -- lifecycle ------------------------------------------------------------------------------------

    async def start(self) -> Relay:
        self._server = await quic.serve(self.host, self.requested_port, self._serve_peer,
                                        config_factory=self.session_config, idle_timeout=self.idle_timeout)
        return self

    async def close(self, timeout: float = 5.0) -> None:
        for task in list(self._tasks):
            task.cancel()
        if self._tasks:
            await asyncio.wait(self._tasks, timeout=timeout)
        if self._server is not None:
            await self._server.close(timeout)
            self._server = None

    async def __aenter__(self) -> Relay:
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    @property
    def port(self) -> int:
        assert self._server is not None, "relay not started"
        return self._server.port

    @property
    def url(self) -> str:
        assert self._server is not None, "relay not started"
        return self._server.url

    def session_config(self) -> SessionConfig:
        """SETUP the relay sends: Range Filters accepted, no token aliases cache."""
        return SessionConfig(role=Role.SERVER, implementation="kvconform-relay/0.1", max_filter_ranges=16)

    def status_lines(self) -> list[str]:
        """The counter lines printed every few seconds while serving."""
        lines = [self.counters.line() + f" | cache {self.cache.stored_bytes} B, {self.cache.evicted} evicted"]
        for track in self.tracks.values():
            c = track.counters
            lines.append(f"  {track}: cached={len(track.cache)} largest={track.cache.largest} "
                         f"in={c.objects_in} dup={c.duplicates} fwd={c.forwarded} fill={c.fill_objects} "
                         f"fetch={c.fetch_objects} upfetch={c.upstream_fetches} subs={len(track.subscribers)}"
                         + (f" MALFORMED ({track.cache.malformed})" if track.cache.malformed else ""))
        return lines

    def _spawn(self, coro: Coroutine[Any, Any, None], peer: Peer | None = None) -> asyncio.Task[None]:
        task = asyncio.get_running_loop().create_task(self._guarded(coro))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        if peer is not None:
            peer.tasks.add(task)
            task.add_done_callback(peer.tasks.discard)
        return task

    async def _guarded(self, coro: Coroutine[Any, Any, None]) -> None:
        try:
            await coro
        except asyncio.CancelledError:
            raise
        except SessionUsageError as exc:  # the peer went away while we were writing to it
            log.debug("relay task: %s", exc)
        except Exception:  # a relay bug must not take other sessions down
            self.counters.internal_errors += 1
            log.exception("relay task failed")

    # -- per-session loop -----------------------------------------------------------------------------

    async def _serve_peer(self, conn: quic.MoqtConnection) -> None:
        self._numbers += 1
        peer = Peer(conn, self._numbers)
        self.peers.append(peer)
        self.counters.sessions_total += 1
        self.counters.sessions_open += 1
        try:
            event: Event | None = None
            while conn.closed is None:
                # A run of objects is taken without a wait (an await per event, i.e. a task and a loop turn or
                # more each, let a fast publisher's objects queue up here: the relay forwarded a fraction of what
                # it received, bench/bench_moqt_relay.py). Every other event, and the object after one, still
                # comes through a wait, so the tasks it wakes or spawns (a held SUBSCRIBE seeing SUBSCRIBE_OK
                # before the PUBLISH_DONE behind it ends the upstream) run first, as they always did.
                event = conn.next_event_nowait(ObjectReceived) if isinstance(event, ObjectReceived) else None
                if event is None:
                    try:
                        event = await conn.next_event(EVENT_WAIT)
                    except TimeoutError:
                        continue
                if isinstance(event, SessionClosed):
                    self.counters.session_closes[f"{'peer' if event.by_peer else 'relay'}:0x{event.code:x}"] += 1
                    log.info("%s closed (%s) with 0x%x: %s", peer, "by peer" if event.by_peer else "by relay",
                             event.code, event.reason)
                    break
                try:
                    self.dispatch(peer, event)
                except SessionUsageError as exc:
                    log.debug("%s: %s", peer, exc)
                except Exception:
                    self.counters.internal_errors += 1
                    log.exception("%s: relay failed on %s", peer, type(event).__name__)
        finally:
            self.counters.sessions_open -= 1
            self._peer_gone(peer)

    def dispatch(self, peer: Peer, event: Event) -> None:
        """Route one session event."""
        if isinstance(event, SetupReceived):
            peer.setup_tokens = self._setup_tokens(peer, event.setup.auth_tokens())
        elif isinstance(event, RequestReceived):
            self.counters.requests[MessageType(event.request.kind).name] += 1
            self._on_request(peer, event.request)
        elif isinstance(event, RequestAutoRejected):
            self.counters.refused[f"{MessageType(event.message.TYPE).name}:0x{event.code:x}"] += 1
        elif isinstance(event, MessageReceived):
            self._on_message(peer, event)
        elif isinstance(event, RequestStreamEnded):
            self._on_request_ended(peer, event)
        elif isinstance(event, DataStreamOpened):
            self._on_data_opened(peer, event)
        elif isinstance(event, ObjectReceived):
            self._on_object(peer, event)
        elif isinstance(event, DataStreamEnded):
            self._on_data_ended(peer, event)
        elif isinstance(event, StopSendingReceived):
            return  # the session already reset the stream; later writes check data_stream_open

    # -- authorization --------------------------------------------------------------------------------

    def _resolve(self, peer: Peer, token: AuthToken) -> TokenKey | None:
        """A token as (type, value) after alias processing (section 3.6); None = nothing to present."""
        if token.alias_type == AuthAliasType.USE_VALUE:
            return TokenKey(token.token_type or 0, token.value)
        if token.alias_type == AuthAliasType.REGISTER:
            key = TokenKey(token.token_type or 0, token.value)
            if token.alias is not None:
                peer.aliases[token.alias] = key
            return key
        if token.alias_type == AuthAliasType.DELETE:
            if token.alias is not None:
                peer.aliases.pop(token.alias, None)
            return None
        alias = peer.aliases.get(token.alias if token.alias is not None else -1)
        if alias is None:
            raise _Refusal(UNKNOWN_AUTH_TOKEN_ALIAS, f"Token Alias {token.alias} is not registered (section 3.6)")
        return alias

    def _setup_tokens(self, peer: Peer, tokens: Iterable[AuthToken]) -> list[TokenKey]:
        out: list[TokenKey] = []
        for token in tokens:
            with contextlib.suppress(_Refusal):
                key = self._resolve(peer, token)
                if key is not None:
                    out.append(key)
        return out

    def request_tokens(self, peer: Peer, params: Parameters) -> list[TokenKey]:
        """The tokens a request presents: its AUTHORIZATION_TOKEN parameters plus the session's."""
        keys = [self._resolve(peer, t) for t in params.all(ParamType.AUTHORIZATION_TOKEN) if isinstance(t, AuthToken)]
        return [k for k in keys if k is not None] + peer.setup_tokens

    def authorize(self, peer: Peer, right: Right, namespace: TrackNamespace, params: Parameters) -> Decision:
        """May this request use ``right`` on ``namespace`` (a track's, or a SUBSCRIBE_NAMESPACE prefix)?"""
        return self.policy.check(right, namespace.fields, self.request_tokens(peer, params), self.wall_clock())

    def _require(self, peer: Peer, right: Right, namespace: TrackNamespace, params: Parameters) -> None:
        decision = self.authorize(peer, right, namespace, params)
        if not decision.allowed:
            raise _Refusal(decision.code, decision.reason)

    # -- requests from peers --------------------------------------------------------------------------

    def _refuse(self, peer: Peer, req: Request, code: int, reason: str) -> None:
        self.counters.refused[f"{MessageType(req.kind).name}:0x{code:x}"] += 1
        log.info("%s: refusing %s with 0x%x: %s", peer, MessageType(req.kind).name, code, reason)
        with contextlib.suppress(SessionUsageError):
            peer.session.reject(req.stream_id, code, reason)

    def _on_request(self, peer: Peer, req: Request) -> None:
        msg = req.message
        try:
            if isinstance(msg, TrackStatus):
                self._spawn(self._refusing(peer, req, self.handle_track_status(peer, req, msg)), peer)
            elif isinstance(msg, Fetch):
                self._spawn(self._refusing(peer, req, self.handle_fetch(peer, req, msg)), peer)
            elif isinstance(msg, Subscribe):
                self.handle_subscribe(peer, req, msg)
            elif isinstance(msg, PublishNamespace):
                self.handle_publish_namespace(peer, req, msg)
            elif isinstance(msg, SubscribeNamespace) and msg.TYPE == MessageType.SUBSCRIBE_NAMESPACE:
                self.handle_subscribe_namespace(peer, req, msg)
            elif isinstance(msg, Publish):
                self.handle_publish(peer, req, msg)
            else:
                raise _Refusal(RequestErrorCode.NOT_SUPPORTED, f"{type(msg).__name__} is not supported by this relay")
        except _Refusal as refusal:
            self._refuse(peer, req, refusal.code, refusal.reason)

    async def _refusing(self, peer: Peer, req: Request, coro: Coroutine[Any, Any, None]) -> None:
        try:
            await coro
        except _Refusal as refusal:
            self._refuse(peer, req, refusal.code, refusal.reason)

    def track_for(self, namespace: TrackNamespace, name: bytes) -> Track:
        key: FullTrackName = (namespace.fields, name)
        track = self.tracks.get(key)
        if track is None:
            track = self.tracks[key] = Track(namespace, name, self.cache.track(key))
        return track

    def publishers_for(self, namespace: TrackNamespace) -> list[Peer]:
        """Sessions whose PUBLISH_NAMESPACE is a prefix of ``namespace`` (section 12), oldest first."""
        return [p for p in self.peers if not p.gone
                and any(ns.is_prefix_of(namespace) for ns in p.publications.values())]

    def _check_track_name(self, namespace: TrackNamespace) -> None:
        if namespace.fields and namespace.fields[0].startswith(b"."):
            raise _Refusal(RequestErrorCode.DOES_NOT_EXIST, "namespaces starting with '.' are reserved (section 3.4)")

    # SUBSCRIBE ---------------------------------------------------------------------------------------

    def handle_subscribe(self, peer: Peer, req: Request, msg: Subscribe) -> None:
        self._require(peer, Right.SUBSCRIBE, msg.track_namespace, msg.parameters)
        self._check_track_name(msg.track_namespace)
        track = self.track_for(msg.track_namespace, msg.track_name)
        if track.cache.malformed:
            raise _Refusal(RequestErrorCode.MALFORMED_TRACK, track.cache.malformed)
        if self._answered(track) is not None:
            self.accept_subscribe(peer, req, msg, track)
            return
        sources = [p for p in self.publishers_for(msg.track_namespace)
                   if not any(u.peer is p for u in track.upstreams)]
        if not sources and not track.upstreams:
            rendezvous_ms = _int_param(msg.parameters, ParamType.RENDEZVOUS_TIMEOUT) or 0
            if rendezvous_ms == 0:
                raise _Refusal(RequestErrorCode.DOES_NOT_EXIST, f"no publisher for {track} (RENDEZVOUS_TIMEOUT 0)")
            self._spawn(self._refusing(peer, req, self._rendezvous(peer, req, msg, track, rendezvous_ms)), peer)
            return
        for source in sources:
            self.open_upstream(source, track)
        self._spawn(self._refusing(peer, req, self._subscribe_when_ready(peer, req, msg, track)), peer)

    async def _rendezvous(self, peer: Peer, req: Request, msg: Subscribe, track: Track, timeout_ms: int) -> None:
        """Hold a SUBSCRIBE until a matching PUBLISH_NAMESPACE or PUBLISH arrives (RENDEZVOUS_TIMEOUT,
        section 7.1); TIMEOUT (0x2) when none does in time."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_ms / 1000.0
        track.waiting += 1
        try:
            while not (self.publishers_for(track.namespace) or track.upstreams):
                track.source_arrived.clear()
                try:
                    await asyncio.wait_for(track.source_arrived.wait(), max(0.0, deadline - loop.time()))
                except TimeoutError:
                    raise _Refusal(RequestErrorCode.TIMEOUT,
                                   f"no publisher for {track} within RENDEZVOUS_TIMEOUT {timeout_ms} ms") from None
        finally:
            track.waiting -= 1
        if not peer.gone and req.state is RequestState.PENDING:
            self.handle_subscribe(peer, req, msg)

    def upstream_subscribe_parameters(self, track: Track) -> Parameters:
        """The relay's own SUBSCRIBE upstream: FORWARD 1 (default), aggregating with Next Object."""
        return Parameters.of((ParamType.LOCATION_FILTER, LocationFilter.next_object()))

    def open_upstream(self, source: Peer, track: Track) -> Upstream:
        request = source.session.subscribe(track.namespace, track.name, self.upstream_subscribe_parameters(track))
        up = Upstream(source, request, track, asyncio.get_running_loop().create_future())
        source.upstream[request.stream_id] = up
        track.upstreams.append(up)
        return up

    async def _subscribe_when_ready(self, peer: Peer, req: Request, msg: Subscribe, track: Track) -> None:
        """Hold the downstream SUBSCRIBE until an upstream subscription is Established (section 12)."""
        last: SubscribeOk | RequestError | None = None
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.upstream_timeout
        while self._answered(track) is None:
            pending = [u.ready for u in track.upstreams if not u.ready.done()]
            if not pending or loop.time() >= deadline:
                break
            done, _ = await asyncio.wait(pending, timeout=deadline - loop.time(),
                                         return_when=asyncio.FIRST_COMPLETED)
            for fut in done:
                last = fut.result()
        if peer.gone or req.state is not RequestState.PENDING:
            return  # the subscriber cancelled meanwhile
        if self._answered(track) is None:
            if isinstance(last, RequestError):
                raise _Refusal(last.error_code, f"upstream refused: {last.reason.decode('utf-8', 'replace')}")
            raise _Refusal(RequestErrorCode.TIMEOUT if track.upstreams else RequestErrorCode.DOES_NOT_EXIST,
                           f"no upstream subscription for {track} became Established")
        self.accept_subscribe(peer, req, msg, track)

    @staticmethod
    def _answered(track: Track) -> Upstream | None:
        """An upstream subscription that is Established, or was answered with SUBSCRIBE_OK and is ending
        (a complete track: PUBLISH_DONE right after SUBSCRIBE_OK); its downstream gets PUBLISH_DONE too."""
        for up in track.upstreams:
            if up.established:
                return up
        for up in track.upstreams:
            if up.ready.done() and isinstance(up.ready.result(), SubscribeOk):
                return up
        return None

    def accept_subscribe(self, peer: Peer, req: Request, msg: Subscribe, track: Track) -> Downstream:
        """SUBSCRIBE_OK with the relay's Largest Object, then a fill if asked (no await inside: objects
        processed after this point are > Largest and go by subscription, the rest by the fill)."""
        params = msg.parameters
        flt = req.location_filter
        largest = track.cache.largest
        forward = _int_param(params, ParamType.FORWARD) != 0
        start = flt.start(largest) if flt is not None else Location(0, 0)
        end = flt.end() if flt is not None else None
        peer.session.subscribe_ok(req.stream_id, largest=largest, track_properties=self.track_properties(track))
        ds = Downstream(peer, req, track, start, end, forward, _range_filters(params))
        peer.downstream[req.stream_id] = ds
        track.subscribers.append(ds)
        fill = params.get(ParamType.FILL_PARAMETERS)
        if isinstance(fill, FillParameters) and forward:
            self.start_fill(ds, req.request_id, fill)
        return ds

    # fills ---------------------------------------------------------------------------------------------

    def start_fill(self, ds: Downstream, request_id: int, fill: FillParameters) -> None:
        """Open a fill fetch stream for the message with ``request_id`` if its range is not empty (11.2)."""
        inner = fill.params.get(ParamType.LOCATION_FILTER)
        flt = inner if isinstance(inner, LocationFilter) else ds.request.location_filter
        rng = (flt if flt is not None else LocationFilter.none()).fetch_range(ds.track.cache.largest)
        if rng is None:
            return
        timeout = _int_param(fill.params, ParamType.FILL_TIMEOUT)
        order = ds.peer.session.fill_group_order(ds.request.stream_id, fill)
        filters = _range_filters(fill.params) or ds.filters
        task = self._spawn(self.serve_fill(ds, request_id, fill, rng[0], rng[1], order == GroupOrder.DESCENDING,
                                           filters, timeout), ds.peer)
        ds.fill_tasks.add(task)
        task.add_done_callback(ds.fill_tasks.discard)

    async def serve_fill(self, ds: Downstream, request_id: int, fill: FillParameters, start: Location,
                         end: Location, descending: bool, filters: Sequence[RangeFilter],
                         timeout_ms: int | None) -> None:
        """A fill fetch stream: FETCH_HEADER at once, the range from cache (gaps fetched upstream), FIN.
        Failure = reset (section 11.2)."""
        session = ds.peer.session
        sid = session.open_fill_stream(ds.request.stream_id, request_id, fill)
        ds.fill_streams.add(sid)
        try:
            gap_kind = await self.ensure_cached(ds.track, start, end, timeout_ms)
            items = self.fill_items(ds, start, end, descending, filters, gap_kind)
            self.write_fetch_items(ds.peer, sid, items)
            ds.track.counters.fill_objects += sum(isinstance(i, FetchObject) for i in items)
            if session.data_stream_open(sid):
                session.end_data_stream(sid)
        except asyncio.CancelledError:
            with contextlib.suppress(SessionUsageError):
                session.reset_data_stream(sid, StreamResetCode.CANCELLED)
            raise
        except Exception:
            with contextlib.suppress(SessionUsageError):
                session.reset_data_stream(sid, StreamResetCode.INTERNAL_ERROR)
            raise
        finally:
            ds.fill_streams.discard(sid)

    def fill_items(self, ds: Downstream, start: Location, end: Location, descending: bool,
                   filters: Sequence[RangeFilter], gap_kind: int) -> list[FetchObject | EndOfRange]:
        """What a fill stream carries; the fetch rules apply (section 11.2)."""
        return self.fetch_items(ds.track, start, end, descending, filters, gap_kind)

    # cache filling and serving ranges -----------------------------------------------------------------

    async def ensure_cached(self, track: Track, start: Location, end: Location, timeout_ms: int | None) -> int:
        """Make [start, end] (inclusive) known, FETCHing the unknown span upstream within ``timeout_ms``
        (the request's FILL_TIMEOUT, a total budget; 0 = only what is cached now; None = the relay's
        ``fill_timeout_ms`` without progress). Returns the End of Range kind for what stays unknown:
        TIMED_OUT when the budget ran out (or was 0), UNKNOWN when no source could tell (section 9.4)."""
        gaps = track.cache.missing(start, next_loc(end))
        if not gaps or (timeout_ms is not None and timeout_ms <= 0):
            return EndOfRangeKind.TIMED_OUT
        sources = [u.peer for u in track.upstreams if u.established] or self.publishers_for(track.namespace)
        if not sources:
            return EndOfRangeKind.UNKNOWN
        fetch = self.open_upstream_fetch(sources[0], track, gaps[0][0], gaps[-1][1])
        if not await self._await_fetch(fetch, timeout_ms):
            return EndOfRangeKind.TIMED_OUT
        return EndOfRangeKind.UNKNOWN

    async def _await_fetch(self, fetch: UpstreamFetch, timeout_ms: int | None,
                           until: Callable[[], bool] | None = None) -> bool:
        """Wait for an upstream FETCH to finish, or only until ``until()`` holds: within ``timeout_ms`` in all
        (a request's FILL_TIMEOUT), or, with None, for as long as it makes progress (its answer or records
        arriving, ``fill_timeout_ms`` at most between two). False (and the FETCH cancelled) when the budget
        ran out."""
        loop = asyncio.get_running_loop()
        deadline = None if timeout_ms is None else loop.time() + timeout_ms / 1000.0
        done: asyncio.Future[Any] = fetch.done
        while not done.done() and not (until is not None and until()):
            fetch.progress.clear()
            wait = self.fill_timeout_ms / 1000.0 if deadline is None else deadline - loop.time()
            progressed: asyncio.Future[Any] = asyncio.ensure_future(fetch.progress.wait())
            try:
                await asyncio.wait({progressed, done}, timeout=max(wait, 0.0), return_when=asyncio.FIRST_COMPLETED)
            finally:
                progressed.cancel()
            if not done.done() and not fetch.progress.is_set():
                self._cancel_upstream_fetch(fetch)
                return False
        return True

    def _cancel_upstream_fetch(self, fetch: UpstreamFetch) -> None:
        with contextlib.suppress(SessionUsageError):
            fetch.peer.session.cancel(fetch.request.stream_id)
        self._fetch_finished(fetch, False)

    def upstream_fetch_parameters(self, track: Track, flt: LocationFilter) -> Parameters:
        """The relay's own FETCH upstream: only its range (parameters are hop-by-hop, section 3.3)."""
        return Parameters.of((ParamType.LOCATION_FILTER, flt))

    def open_upstream_fetch(self, source: Peer, track: Track, start: Location, end: Location,
                            flt: LocationFilter | None = None) -> UpstreamFetch:
        """FETCH [start, end) (or ``flt``) from ``source``; objects go to the cache as they arrive."""
        params = self.upstream_fetch_parameters(track, flt if flt is not None else _range_filter(start, end))
        request = source.session.fetch(track.namespace, track.name, params)
        fetch = UpstreamFetch(source, request, track, start, end, asyncio.get_running_loop().create_future())
        source.fetches[request.stream_id] = fetch
        track.counters.upstream_fetches += 1
        return fetch

    def _fetch_finished(self, fetch: UpstreamFetch, ok: bool) -> None:
        if fetch.done.done():
            return
        if ok and fetch.ok is not None:
            # Ascending, no Range Filters, FIN: gaps up to End Location do not exist (section 9.4). An End
            # Location short of a requested end within Largest Object is the publisher's "last Object"
            # clamp (e.g. an End of Group marker, which FETCH cannot carry), so the rest is absent too.
            cache = fetch.track.cache
            cache.note_largest(fetch.ok.end_location)
            assert cache.largest is not None
            end = fetch.end if fetch.end <= next_loc(cache.largest) else next_loc(fetch.ok.end_location)
            cache.mark_nonexistent(fetch.start, end)
            for a, b in fetch.unknown:
                cache.known.remove(a, b)
        fetch.peer.fetches.pop(fetch.request.stream_id, None)
        fetch.done.set_result(ok)

    def fetch_items(self, track: Track, start: Location, end: Location, descending: bool,
                    filters: Sequence[RangeFilter], gap_kind: int) -> list[FetchObject | EndOfRange]:
        """The cached objects of [start, end] in the requested group order (objects ascending within a
        group), without status objects (FETCH carries none); in Ascending order what the cache does not
        know is marked with ``gap_kind`` records (End of Unknown / Timed-Out Range, section 9.4)."""
        cache = track.cache
        objects = [o for o in cache.objects(start, next_loc(end)) if not o.is_status and passes_range_filters(
            filters, subgroup_id=o.subgroup or 0, object_id=o.object, priority=o.priority,
            track_properties=cache.track_properties)]
        items: list[FetchObject | EndOfRange] = [self.to_fetch_object(o) for o in iter_groups(objects, descending)]
        if descending:
            return items
        out: list[FetchObject | EndOfRange] = []
        prev_end = start  # first Location not yet covered by a record
        gaps = cache.missing(start, next_loc(end))
        merged = sorted(
            [(i.location, 0, i) for i in items]
            + [(a, 1, EndOfRange(gap_kind, *_loc_tuple(_loc_before(b)))) for a, b in gaps],
            key=lambda t: (t[0], t[1]))
        for loc, is_gap, item in merged:
            if is_gap and loc > prev_end:
                # known-absent Locations before an unknown range get their own record (0x8C)
                out.append(EndOfRange(EndOfRangeKind.NON_EXISTENT, *_loc_tuple(_loc_before(loc))))
            out.append(item)
            prev_end = next_loc(item.location)
        return out

    def to_fetch_object(self, obj: CachedObject) -> FetchObject:
        """A cached object as a fetch object: every field as received (immutability, section 12)."""
        return FetchObject(obj.group, obj.object, obj.payload, obj.subgroup, obj.priority,
                           obj.properties if obj.properties else None)

    def write_fetch_items(self, peer: Peer, stream_id: int, items: Sequence[FetchObject | EndOfRange]) -> None:
        """Write fetch objects / End of Range records on an open fetch or fill stream."""
        session = peer.session
        for item in items:
            if not session.data_stream_open(stream_id):
                return
            session.write_fetch_object(stream_id, item)

    # FETCH ---------------------------------------------------------------------------------------------

    async def handle_fetch(self, peer: Peer, req: Request, msg: Fetch) -> None:
        self._require(peer, Right.SUBSCRIBE, msg.track_namespace, msg.parameters)
        self._check_track_name(msg.track_namespace)
        params = msg.parameters
        track = self.track_for(msg.track_namespace, msg.track_name)
        if track.cache.malformed:
            raise _Refusal(RequestErrorCode.MALFORMED_TRACK, track.cache.malformed)
        flt = req.location_filter or LocationFilter.none()
        descending = _int_param(params, ParamType.GROUP_ORDER) == GroupOrder.DESCENDING
        timeout_ms = _int_param(params, ParamType.FILL_TIMEOUT)
        loop = asyncio.get_running_loop()
        deadline = None if timeout_ms is None else loop.time() + timeout_ms / 1000.0

        def budget() -> int | None:  # what is left of the request's FILL_TIMEOUT (None: by progress)
            return None if deadline is None else max(int((deadline - loop.time()) * 1000), 0)

        end_of_track: bool | None = None
        live = any(u.established for u in track.upstreams) or track.cache.end_of_track is not None
        sources = self.publishers_for(msg.track_namespace)
        rng: tuple[Location, Location] | None
        if not live and sources:
            # The relay does not follow this track: ask upstream for the same range to learn it.
            start = flt.start(None)
            fetch = self.open_upstream_fetch(sources[0], track, start, Location(MAX_ID + 1, 0), flt)
            await self._await_fetch(fetch, budget(), until=lambda: fetch.ok is not None)
            if fetch.error is not None:
                raise _Refusal(fetch.error.error_code, "upstream FETCH failed: "
                               + fetch.error.reason.decode("utf-8", "replace"))
            if fetch.ok is None:
                raise _Refusal(RequestErrorCode.TIMEOUT, f"upstream FETCH of {track} did not complete")
            end_loc = fetch.ok.end_location
            flt_end = flt.end()
            rng = (start, end_loc if flt_end is None else min(flt_end, end_loc))
            end_of_track = bool(fetch.ok.end_of_track) and rng[1] == end_loc
            if not descending and rng[1] == end_loc and start <= end_loc:
                await self.serve_fetch_cut_through(peer, req, track, fetch, rng, end_of_track,
                                                   _range_filters(params), budget)
                return
            await self._await_fetch(fetch, budget())
        else:
            if not live and len(track.cache) == 0:
                raise _Refusal(RequestErrorCode.DOES_NOT_EXIST, f"no publisher and nothing cached for {track}")
            rng = flt.fetch_range(track.cache.largest)
        if rng is None:
            raise _Refusal(RequestErrorCode.INVALID_RANGE,
                           f"FETCH range starts after Largest Object {track.cache.largest} (section 7.3)")
        if peer.gone or req.state is not RequestState.PENDING:
            return
        start, end = rng
        gap_kind = await self.ensure_cached(track, start, end, budget())
        items = self.fetch_items(track, start, end, descending, _range_filters(params), gap_kind)
        # The last Location actually covered (section 13 #9): a whole-group end or a Largest Object that
        # is an End of Track marker is not an object a FETCH can carry.
        covered = [i.location for i in items if i.location <= end]
        end_location = max(covered) if covered else min(end, Location(end.group, MAX_ID))
        if end_of_track is None:
            end_of_track = self._ends_track(track, end_location)
        if peer.gone or req.state is not RequestState.PENDING:
            return
        peer.session.fetch_ok(req.stream_id, end_location, end_of_track=end_of_track,
                              track_properties=self.track_properties(track))
        sid = peer.session.open_fetch_stream(req.stream_id)
        self.serve_fetch_range(peer, req, track, sid, items)
        track.counters.fetch_objects += sum(isinstance(i, FetchObject) for i in items)
        if peer.session.data_stream_open(sid):
            peer.session.end_data_stream(sid)
        with contextlib.suppress(SessionUsageError):
            peer.session.finish_request(req.stream_id)

    async def serve_fetch_cut_through(self, peer: Peer, req: Request, track: Track, fetch: UpstreamFetch,
                                      rng: tuple[Location, Location], end_of_track: bool,
                                      filters: Sequence[RangeFilter], budget: Callable[[], int | None]) -> None:
        """Serve an Ascending FETCH of a track the relay does not follow while its own FETCH upstream is still
        arriving, instead of storing the whole range first: FETCH_OK with the upstream End Location, then each
        object as soon as every Location before it has come from upstream (the upstream stream is ascending,
        so the objects keep their order). What stays unknown is settled at the end as in the stored path."""
        start, end = rng
        if peer.gone or req.state is not RequestState.PENDING:
            self._cancel_upstream_fetch(fetch)
            return
        session = peer.session
        session.fetch_ok(req.stream_id, end, end_of_track=end_of_track, track_properties=self.track_properties(track))
        sid = session.open_fetch_stream(req.stream_id)
        cursor, served = start, 0
        while cursor <= end and not fetch.unknown:  # an unknown range: its record is written at the end
            fetch.progress.clear()
            arrived = next_loc(fetch.prev) if fetch.prev is not None else start  # all before it has come
            upto = min(arrived, next_loc(end))
            if upto > cursor:
                with track.cache.settled(cursor, upto):
                    items = self.fetch_items(track, cursor, _loc_before(upto), False, filters, EndOfRangeKind.UNKNOWN)
                if items:
                    self.serve_fetch_range(peer, req, track, sid, items)
                    served += sum(isinstance(i, FetchObject) for i in items)
                cursor = upto
            if not session.data_stream_open(sid):  # cancelled or reset downstream: stop fetching for it
                self._cancel_upstream_fetch(fetch)
                return
            if fetch.done.done() or not await self._await_fetch(fetch, budget(), until=fetch.progress.is_set):
                break
        rest: list[FetchObject | EndOfRange] = []
        if cursor <= end:
            if not fetch.done.done():  # stopped at an unknown range: the FETCH first settles what it covers
                await self._await_fetch(fetch, budget())
            gap_kind = await self.ensure_cached(track, cursor, end, budget())
            rest = self.fetch_items(track, cursor, end, False, filters, gap_kind)
        if rest or not served:
            self.serve_fetch_range(peer, req, track, sid, rest)
            served += sum(isinstance(i, FetchObject) for i in rest)
        track.counters.fetch_objects += served
        if session.data_stream_open(sid):
            session.end_data_stream(sid)
        with contextlib.suppress(SessionUsageError):
            session.finish_request(req.stream_id)

    def serve_fetch_range(self, peer: Peer, req: Request, track: Track, stream_id: int,
                          items: Sequence[FetchObject | EndOfRange]) -> None:
        """Write a FETCH response's objects (already in the requested order) on its fetch stream."""
        self.write_fetch_items(peer, stream_id, items)

    def _ends_track(self, track: Track, end_location: Location) -> bool:
        eot = track.cache.end_of_track
        if eot is None or end_location >= eot:
            return False
        after = next_loc(end_location)
        return not track.cache.missing(after, eot) and not any(
            not o.is_status for o in track.cache.objects(after, eot))

    # TRACK_STATUS ---------------------------------------------------------------------------------------

    async def handle_track_status(self, peer: Peer, req: Request, msg: TrackStatus) -> None:
        self._require(peer, Right.SUBSCRIBE, msg.track_namespace, msg.parameters)
        self._check_track_name(msg.track_namespace)
        track = self.tracks.get((msg.track_namespace.fields, msg.track_name))
        if track is not None and (any(u.established for u in track.upstreams) or track.cache.end_of_track):
            largest, props = track.cache.largest, self.track_properties(track)
        else:
            sources = self.publishers_for(msg.track_namespace)
            if not sources:
                raise _Refusal(RequestErrorCode.DOES_NOT_EXIST, "no publisher for this track")
            upstream = sources[0].session.track_status(msg.track_namespace, msg.track_name)
            fut: asyncio.Future[RequestOk | RequestError | None] = asyncio.get_running_loop().create_future()
            sources[0].status_requests[upstream.stream_id] = fut
            try:
                answer = await asyncio.wait_for(fut, self.upstream_timeout)
            except TimeoutError:
                answer = None
            if isinstance(answer, RequestError):
                raise _Refusal(answer.error_code, answer.reason.decode("utf-8", "replace"))
            if answer is None:
                raise _Refusal(RequestErrorCode.TIMEOUT, "upstream TRACK_STATUS was not answered")
            largest, props = answer.largest_object, answer.track_properties
        if peer.gone:
            return
        params = Parameters.of((ParamType.LARGEST_OBJECT, largest)) if largest is not None else Parameters()
        peer.session.request_ok(req.stream_id, params, props)

    # PUBLISH_NAMESPACE / SUBSCRIBE_NAMESPACE ------------------------------------------------------------

    def handle_publish_namespace(self, peer: Peer, req: Request, msg: PublishNamespace) -> None:
        ns = msg.track_namespace
        self._require(peer, Right.PUBLISH, ns, msg.parameters)
        self._check_track_name(ns)
        peer.session.request_ok(req.stream_id)
        already = any(ns in p.publications.values() for p in self.peers if not p.gone)
        peer.publications[req.stream_id] = ns
        if not already:
            self._announce(ns, done=False)
        # Tracks subscribed downstream under this namespace get this publisher as a source too.
        for track in list(self.tracks.values()):
            if track.waiting and ns.is_prefix_of(track.namespace):
                track.source_arrived.set()
            if track.subscribers and ns.is_prefix_of(track.namespace) and \
                    not any(u.peer is peer for u in track.upstreams):
                self.open_upstream(peer, track)

    def _announce(self, ns: TrackNamespace, done: bool) -> None:
        """NAMESPACE (or NAMESPACE_DONE) on every SUBSCRIBE_NAMESPACE stream whose prefix matches."""
        for sub_peer in self.peers:
            if sub_peer.gone:
                continue
            for sid, prefix in list(sub_peer.namespace_subs.items()):
                if not prefix.is_prefix_of(ns):
                    continue
                suffix = ns.suffix_after(prefix)
                req = sub_peer.session.requests.get(sid)
                with contextlib.suppress(SessionUsageError):
                    if done and req is not None and suffix in req.namespaces:
                        sub_peer.session.send_namespace_done(sid, suffix)
                    elif not done and (req is None or suffix not in req.namespaces):
                        sub_peer.session.send_namespace(sid, suffix)

    def _withdraw(self, peer: Peer, stream_id: int) -> None:
        ns = peer.publications.pop(stream_id, None)
        if ns is not None and not any(ns in p.publications.values() for p in self.peers if not p.gone):
            self._announce(ns, done=True)

    def handle_subscribe_namespace(self, peer: Peer, req: Request, msg: SubscribeNamespace) -> None:
        prefix = msg.track_namespace_prefix
        self._require(peer, Right.SUBSCRIBE, prefix, msg.parameters)
        for other in peer.namespace_subs.values():
            if prefix.overlaps(other):
                raise _Refusal(RequestErrorCode.PREFIX_OVERLAP,
                               f"prefix {prefix} overlaps active SUBSCRIBE_NAMESPACE {other} (section 12)")
        peer.session.request_ok(req.stream_id)
        peer.namespace_subs[req.stream_id] = prefix
        announced: set[TrackNamespace] = set()
        for pub in self.peers:
            if pub.gone:
                continue
            for ns in pub.publications.values():
                if prefix.is_prefix_of(ns) and ns not in announced:
                    announced.add(ns)
                    peer.session.send_namespace(req.stream_id, ns.suffix_after(prefix))

    def update_namespace_prefix(self, peer: Peer, req: Request, msg: RequestUpdate, prefix: TrackNamespace) -> None:
        """REQUEST_UPDATE with TRACK_NAMESPACE_PREFIX (EDR "Updating Namespace Subscriptions"): authorized
        and overlap-checked like a new SUBSCRIBE_NAMESPACE; publications the new prefix no longer covers
        get NAMESPACE_DONE (old suffix) before the REQUEST_OK, then every covered one a NAMESPACE with its
        suffix relative to the new prefix (so later NAMESPACE_DONEs name suffixes the subscriber knows)."""
        self._require(peer, Right.SUBSCRIBE, prefix, msg.parameters)
        sid = req.stream_id
        for other_sid, other in peer.namespace_subs.items():
            if other_sid != sid and prefix.overlaps(other):
                raise _Refusal(RequestErrorCode.PREFIX_OVERLAP,
                               f"prefix {prefix} overlaps active SUBSCRIBE_NAMESPACE {other} (section 12)")
        old = peer.namespace_subs[sid]
        published = sorted({ns for p in self.peers if not p.gone for ns in p.publications.values()},
                           key=lambda n: n.fields)
        for ns in published:
            if old.is_prefix_of(ns) and not prefix.is_prefix_of(ns) and ns.suffix_after(old) in req.namespaces:
                peer.session.send_namespace_done(sid, ns.suffix_after(old))
        peer.session.request_ok(sid)
        peer.namespace_subs[sid] = prefix
        req.namespaces.clear()  # the session's record of announced suffixes, now relative to the new prefix
        for ns in published:
            if prefix.is_prefix_of(ns):
                peer.session.send_namespace(sid, ns.suffix_after(prefix))

    # PUBLISH (publisher-initiated subscription) --------------------------------------------------------

    def handle_publish(self, peer: Peer, req: Request, msg: Publish) -> None:
        self._require(peer, Right.PUBLISH, msg.track_namespace, msg.parameters)
        self._check_track_name(msg.track_namespace)
        track = self.track_for(msg.track_namespace, msg.track_name)
        fut: asyncio.Future[SubscribeOk | RequestError | None] = asyncio.get_running_loop().create_future()
        fut.set_result(None)
        up = Upstream(peer, req, track, fut)
        peer.upstream[req.stream_id] = up
        track.upstreams.append(up)
        self._learn_track(track, msg.track_properties, req.largest)
        peer.session.request_ok(req.stream_id)
        if _int_param(msg.parameters, ParamType.FORWARD) == 0:
            # keep the cache warm (EDR "Forward Handling"): ask for the objects now
            peer.session.request_update(req.stream_id, Parameters.of((ParamType.FORWARD, 1)))
        track.source_arrived.set()

    def track_properties(self, track: Track) -> tuple[KeyValuePair, ...]:
        """The Track Properties the relay sends in SUBSCRIBE_OK, FETCH_OK and TRACK_STATUS_OK: all it
        knows, as received upstream (EDR "Relay Track Handling")."""
        return track.cache.track_properties

    def _learn_track(self, track: Track, props: tuple[KeyValuePair, ...], largest: Location | None) -> None:
        if props:
            track.cache.track_properties = props
            track.cache.max_cache_duration_ms = _cache_duration(props)
        if largest is not None:
            track.cache.note_largest(largest)

    # -- responses and updates ------------------------------------------------------------------------

    def _on_message(self, peer: Peer, event: MessageReceived) -> None:
        sid, msg = event.stream_id, event.message
        up = peer.upstream.get(sid)
        if up is not None:
            if isinstance(msg, SubscribeOk):
                self._learn_track(up.track, msg.track_properties, msg.largest_object)
                if not up.ready.done():
                    up.ready.set_result(msg)
            elif isinstance(msg, RequestError) and not up.ready.done():
                up.track.upstreams.remove(up)
                up.ready.set_result(msg)
            elif isinstance(msg, PublishDone):
                up.done = msg
                self._spawn(self._upstream_done(up))
            return
        fetch = peer.fetches.get(sid)
        if fetch is not None:
            if isinstance(msg, FetchOk):
                fetch.ok = msg
                fetch.progress.set()
                if msg.track_properties:
                    self._learn_track(fetch.track, msg.track_properties, None)
                if fetch.stream_fin:
                    self._fetch_finished(fetch, True)
            elif isinstance(msg, RequestError):
                fetch.error = msg
                self._fetch_finished(fetch, False)
            return
        status = peer.status_requests.pop(sid, None)
        if status is not None:
            if isinstance(msg, RequestOk | RequestError) and not status.done():
                status.set_result(msg)
            return
        if isinstance(msg, RequestUpdate):
            self._on_update(peer, event.request, msg)

    def _on_update(self, peer: Peer, req: Request, msg: RequestUpdate) -> None:
        ds = peer.downstream.get(req.stream_id)
        if ds is None:
            prefix = msg.parameters.get(ParamType.TRACK_NAMESPACE_PREFIX)
            if req.stream_id in peer.namespace_subs and isinstance(prefix, TrackNamespace):
                try:
                    self.update_namespace_prefix(peer, req, msg, prefix)
                except _Refusal as refusal:
                    self.counters.refused[f"REQUEST_UPDATE:0x{refusal.code:x}"] += 1
                    peer.session.reject(req.stream_id, refusal.code, refusal.reason)
            else:
                peer.session.request_ok(req.stream_id)
            return
        params = msg.parameters
        largest = ds.track.cache.largest
        forward = _int_param(params, ParamType.FORWARD)
        if forward is not None:
            if forward == 1 and not ds.forward and largest is not None:
                ds.start = max(ds.start, next_loc(largest))  # the Largest of this REQUEST_UPDATE_OK
            ds.forward = forward == 1
        flt = params.get(ParamType.LOCATION_FILTER)
        if isinstance(flt, LocationFilter):
            ds.end = flt.end()
            if flt.type != 0:
                ds.start = max(ds.start, flt.start(largest))
        ok_params = Parameters.of((ParamType.LARGEST_OBJECT, largest)) if largest is not None else Parameters()
        peer.session.request_ok(req.stream_id, ok_params)
        fill = params.get(ParamType.FILL_PARAMETERS)
        if isinstance(fill, FillParameters) and ds.forward:
            self.start_fill(ds, msg.request_id, fill)

    def _on_request_ended(self, peer: Peer, event: RequestStreamEnded) -> None:
        sid = event.stream_id
        if event.request.local:
            up = peer.upstream.get(sid)
            if up is not None and event.reset_code is not None:
                self._drop_upstream(up, "upstream cancelled the subscription")
            fetch = peer.fetches.get(sid)
            if fetch is not None and fetch.ok is None:
                self._fetch_finished(fetch, False)
            status = peer.status_requests.pop(sid, None)
            if status is not None and not status.done():
                status.set_result(None)
            return
        if event.reset_code is None:
            return  # FIN from a requester: no more updates, not a cancellation (section 4.4)
        ds = peer.downstream.pop(sid, None)
        if ds is not None:
            self._drop_downstream(ds)
        if sid in peer.publications:
            self._withdraw(peer, sid)
        peer.namespace_subs.pop(sid, None)
        up = peer.upstream.get(sid)  # a PUBLISH withdrawn by its publisher
        if up is not None:
            self._drop_upstream(up, "publisher cancelled its PUBLISH")

    # -- data -----------------------------------------------------------------------------------------

    def _on_data_opened(self, peer: Peer, event: DataStreamOpened) -> None:
        req = event.request
        if req is None:
            return
        if event.kind == "subgroup" and isinstance(event.header, SubgroupHeader):
            up = peer.upstream.get(req.stream_id)
            if up is not None:
                peer.in_streams[event.stream_id] = InStream(up, event.header)
        elif event.kind == "fetch" and isinstance(event.header, FetchHeader):
            fetch = peer.fetches.get(req.stream_id)
            if fetch is not None:
                peer.fetch_streams[event.stream_id] = fetch

    def _admit(self, track: Track, obj: CachedObject) -> Admit:
        admit = track.cache.add(obj)
        track.counters.objects_in += 1
        track.counters.bytes_in += len(obj.payload)
        if admit is Admit.DUPLICATE:
            track.counters.duplicates += 1
        elif admit is Admit.CONFLICT:
            self._track_malformed(track)
        return admit

    def _priority(self, track: Track, priority: int | None) -> int:
        if priority is not None:
            return priority
        default = find_kvp(track.cache.track_properties, PropertyType.DEFAULT_PUBLISHER_PRIORITY)
        return default[0] if default and isinstance(default[0], int) else 128

    def _on_object(self, peer: Peer, event: ObjectReceived) -> None:
        obj = event.object
        if isinstance(obj, SubgroupObject):
            st = peer.in_streams.get(event.stream_id)
            if st is None:
                return
            track = st.upstream.track
            cached = CachedObject(obj.group_id, obj.object_id, obj.subgroup_id,
                                  self._priority(track, obj.publisher_priority), obj.payload, obj.status,
                                  obj.properties, self.clock())
            if self._admit(track, cached) in (Admit.CONFLICT, Admit.NONEXISTENT, Admit.EXPIRED):
                return
            if st.first_id is None:
                st.first_id = obj.object_id
            st.last_id = obj.object_id
            if st.upstream.done is not None:
                st.upstream.progress.set()  # still arriving: _upstream_done keeps waiting
            for ds in list(track.subscribers):
                if self.subscription_passes(ds, obj, cached.priority):
                    with contextlib.suppress(SessionUsageError):
                        self.forward_object(ds, st, obj)
            return
        fetch = peer.fetch_streams.get(event.stream_id)
        if fetch is None:
            return
        if isinstance(obj, EndOfRange):
            if obj.kind != EndOfRangeKind.NON_EXISTENT:
                begin = next_loc(fetch.prev) if fetch.prev is not None else fetch.start
                fetch.unknown.append((begin, next_loc(obj.location)))
            fetch.prev = obj.location
            return
        fetch.prev = obj.location
        fetch.progress.set()
        self._admit(fetch.track, CachedObject(obj.group_id, obj.object_id, obj.subgroup_id, obj.publisher_priority,
                                              obj.payload, 0, obj.properties or b"", self.clock()))

    def subscription_passes(self, ds: Downstream, obj: SubgroupObject, priority: int) -> bool:
        """Is ``obj`` subscription-delivered to ``ds`` (section 11.1): FORWARD 1, inside the Location
        filter, not sent to it before, and passing its Range Filters (section 7.5)?"""
        return ds.wants(obj.location) and (not ds.filters or passes_range_filters(
            ds.filters, subgroup_id=obj.subgroup_id, object_id=obj.object_id, priority=priority,
            object_properties=obj.property_pairs(), track_properties=ds.track.cache.track_properties))

    def forward_object(self, ds: Downstream, st: InStream, obj: SubgroupObject) -> None:
        """Forward one upstream object on the downstream stream mirroring its upstream stream: same
        Group, Subgroup, priority (or DEFAULT_PRIORITY), END_OF_GROUP and PROPERTIES bits; FIRST_OBJECT
        only when this stream starts with the subgroup's first object (section 9.2); payload untouched."""
        session = ds.peer.session
        sid = st.out.get(ds)
        if sid is None:
            header = st.header
            first = header.first_object and st.first_id == obj.object_id
            sid = session.open_subgroup(ds.request.stream_id, obj.group_id, obj.subgroup_id,
                                        header.publisher_priority, first_object=first,
                                        end_of_group=header.end_of_group, properties=header.has_properties)
            st.out[ds] = sid
        if not session.data_stream_open(sid):
            return
        session.write_object(sid, obj.object_id, obj.payload, status=obj.status, properties=obj.properties)
        ds.sent.add(obj.location)
        ds.track.counters.forwarded += 1

    def _on_data_ended(self, peer: Peer, event: DataStreamEnded) -> None:
        st = peer.in_streams.pop(event.stream_id, None)
        if st is not None:
            up = st.upstream
            if event.reset_code is None and st.header.end_of_group and st.last_id is not None:
                up.track.cache.end_group_after(st.header.group_id, st.last_id)
            for ds, sid in st.out.items():
                with contextlib.suppress(SessionUsageError):
                    if ds.peer.session.data_stream_open(sid):
                        if event.reset_code is None:
                            ds.peer.session.end_data_stream(sid)
                        else:
                            ds.peer.session.reset_data_stream(sid, event.reset_code)
            up.streams_ended += 1
            up.progress.set()
            return
        fetch = peer.fetch_streams.pop(event.stream_id, None)
        if fetch is not None:
            if event.reset_code is not None:
                self._fetch_finished(fetch, False)
            else:
                fetch.stream_fin = True
                if fetch.ok is not None:
                    self._fetch_finished(fetch, True)

    # -- ending subscriptions -------------------------------------------------------------------------

    async def _upstream_done(self, up: Upstream) -> None:
        """PUBLISH_DONE upstream: once its data streams have ended (bounded: DONE_GRACE without progress),
        end the downstream subscriptions that have no other source, after their own streams closed
        (section 6.2)."""
        assert up.done is not None
        while up.streams_ended < up.done.stream_count:
            up.progress.clear()
            try:
                await asyncio.wait_for(up.progress.wait(), DONE_GRACE)
            except TimeoutError:
                break
        track = up.track
        if not any(u.established for u in track.upstreams if u is not up):
            # Subscribers accepted while this runs (``_answered``) are ended here too.
            handled: set[Downstream] = set()
            while batch := [ds for ds in track.subscribers if ds not in handled]:
                for ds in batch:
                    handled.add(ds)
                    await self._finish_downstream(ds, up.done.status_code, up.done.reason.decode("utf-8", "replace"))
        if up in track.upstreams:
            track.upstreams.remove(up)

    async def _finish_downstream(self, ds: Downstream, status: int, reason: str) -> None:
        if ds.fill_tasks:
            await asyncio.wait(set(ds.fill_tasks), timeout=DONE_GRACE)
        self._end_downstream(ds, status, reason)

    def _end_downstream(self, ds: Downstream, status: int, reason: str) -> None:
        if ds.finished:
            return
        ds.finished = True
        if ds in ds.track.subscribers:
            ds.track.subscribers.remove(ds)
        ds.peer.downstream.pop(ds.request.stream_id, None)
        session = ds.peer.session
        for task in ds.fill_tasks:
            task.cancel()
        with contextlib.suppress(SessionUsageError):
            for sid in ds.fill_streams:  # an unfinished fill failed: reset, never FIN (section 11.2)
                session.reset_data_stream(sid, StreamResetCode.CANCELLED)
            for sid in list(ds.request.data_streams):
                session.end_data_stream(sid) if status == PublishDoneCode.TRACK_ENDED else \
                    session.reset_data_stream(sid, StreamResetCode.INTERNAL_ERROR)
        # PUBLISH_DONE is sent only after every stream it counts was closed (section 6.2): once their data and
        # FIN (or reset) have left, bounded by PUBLISH_DONE_AFTER_SENT
        ds.peer.conn.when_sent(session.data_streams_of(ds.request.stream_id),
                               functools.partial(self._publish_done, ds, status, reason), PUBLISH_DONE_AFTER_SENT)

    @staticmethod
    def _publish_done(ds: Downstream, status: int, reason: str) -> None:
        session = ds.peer.session
        with contextlib.suppress(SessionUsageError):
            if session.closed is None and ds.request.publishing:
                session.publish_done(ds.request.stream_id, status, reason)

    def _drop_downstream(self, ds: Downstream) -> None:
        """The subscriber cancelled: the session reset its streams; forget it."""
        ds.finished = True
        if ds in ds.track.subscribers:
            ds.track.subscribers.remove(ds)
        for task in ds.fill_tasks:
            task.cancel()

    def _drop_upstream(self, up: Upstream, reason: str) -> None:
        if up.done is not None:
            return
        if not up.ready.done():
            up.ready.set_result(None)
        up.done = PublishDone(PublishDoneCode.INTERNAL_ERROR, 0, reason.encode())
        if up in up.track.upstreams:
            up.track.upstreams.remove(up)
        if not any(u.established for u in up.track.upstreams):
            for ds in list(up.track.subscribers):
                self._end_downstream(ds, PublishDoneCode.INTERNAL_ERROR, reason)

    def _track_malformed(self, track: Track) -> None:
        """EDR "Malformed Tracks": end every subscription with MALFORMED_TRACK, cancel upstream."""
        reason = track.cache.malformed or "malformed track"
        log.warning("%s: %s", track, reason)
        for ds in list(track.subscribers):
            self._end_downstream(ds, PublishDoneCode.MALFORMED_TRACK, reason)
        for up in list(track.upstreams):
            with contextlib.suppress(SessionUsageError):
                if up.request.local:
                    up.peer.session.cancel(up.request.stream_id, StreamResetCode.MALFORMED_TRACK)
            track.upstreams.remove(up)

    def _peer_gone(self, peer: Peer) -> None:
        """A session ended: withdraw what it published and subscribed."""
        peer.gone = True
        for task in list(peer.tasks):
            task.cancel()
        for sid in list(peer.publications):
            self._withdraw(peer, sid)
        peer.namespace_subs.clear()
        for ds in list(peer.downstream.values()):
            self._drop_downstream(ds)
        peer.downstream.clear()
        for up in list(peer.upstream.values()):
            self._drop_upstream(up, f"upstream {peer} closed")
        for fetch in list(peer.fetches.values()):
            self._fetch_finished(fetch, False)
        for fut in peer.status_requests.values():
            if not fut.done():
                fut.set_result(None)
        if peer in self.peers:
            self.peers.remove(peer)


def _loc_tuple(loc: Location) -> tuple[int, int]:
    return loc.group, loc.object


def load_relay_class(spec: str) -> type[Relay]:
    """``module:Class`` or ``path/to/file.py:Class`` naming a ``Relay`` subclass (the mutant runner starts
    mutants this way)."""

    return load_subclass(spec, Relay, "--relay-class")


def run_relay(relay: Relay, stop: threading.Event, *, interval: float = 5.0,
              show_counters: bool = False, verbose: bool = False, out: TextIO | None = None) -> int:
    """Serve until ``stop`` is set: print ``listening on HOST:PORT`` (flushed) once ready, the counter
    lines every ``interval`` seconds when ``show_counters``; 1 if the port cannot be bound. ``verbose``
    logs the relay's refusals and session closes to stderr."""
    stream = out if out is not None else sys.stdout
    if verbose and not log.handlers:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("%(asctime)s relay %(message)s"))
        log.addHandler(handler)
        log.setLevel(logging.INFO)

    async def main() -> int:
        try:
            await relay.start()
        except OSError as exc:
            print(f"kvconform serve moqt-relay: {exc}", file=sys.stderr)
            return 1
        host = relay.host
        print(f"listening on {f'[{host}]' if ':' in host else host}:{relay.port}", file=stream, flush=True)
        loop = asyncio.get_running_loop()
        try:
            # stop.wait runs in a worker thread so signal handlers and other threads can end the wait
            while not await loop.run_in_executor(None, stop.wait, interval):
                if show_counters:
                    print("\n".join(relay.status_lines()), file=stream, flush=True)
        finally:
            await relay.close()
        return 0

    return asyncio.run(main())
