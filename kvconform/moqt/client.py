"""A convenient async MOQT endpoint over one session (profile §4, §9, §11): publish, subscribe, fill, fetch.

`MoqtClient` wraps a `quic.MoqtConnection` and runs one dispatcher task that routes session events to
per-request handles. It plays both sides at once:

* publisher: `publish_namespace`, `track(...)` -> `LocalTrack` whose objects it stores and serves to
  incoming SUBSCRIBE (SUBSCRIBE_OK with LARGEST_OBJECT, a fill fetch stream from FILL_PARAMETERS, then
  subscription delivery on one subgroup stream per group with End of Group / End of Track, PUBLISH_DONE
  with the Stream Count), FETCH (FETCH_OK + one fetch stream), TRACK_STATUS and SUBSCRIBE_NAMESPACE;
* subscriber: `subscribe` -> `Subscription` (objects from subgroup and fill streams, with the
  exactly-once bookkeeping of profile §11.4), `fetch` -> `FetchResult`, `subscribe_namespace`,
  `track_status`;
* raw escape hatch for malformed-message checks: `send_control_raw`, `open_raw_request`, `send_raw`.

Every wait is bounded: each async method takes `timeout` (default `MoqtClient.timeout`) and raises
`TimeoutError` past it. A request the peer refuses raises `RequestRejected`; a session that ended raises
`SessionEnded`.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import TypeVar

from kvconform.moqt import quic
from kvconform.moqt.data import EndOfRange, FetchHeader, FetchObject, GroupOrder, ObjectStatus, SubgroupObject
from kvconform.moqt.errors import PublishDoneCode, RequestErrorCode, SessionError, StreamResetCode
from kvconform.moqt.filters import LocationFilter, LocationFilterType, RangeFilter, passes_range_filters
from kvconform.moqt.messages import (
    ControlMessage,
    Fetch,
    FetchOk,
    Namespace,
    NamespaceDone,
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
from kvconform.moqt.parameters import FillParameters, Parameter, Parameters
from kvconform.moqt.session import (
    NO_PARAMETERS,
    UNKNOWN_STREAM_COUNT,
    DataStreamEnded,
    DataStreamOpened,
    Event,
    GoawayReceived,
    MessageReceived,
    ObjectReceived,
    Request,
    RequestReceived,
    RequestStreamEnded,
    Role,
    Session,
    SessionClosed,
    SessionConfig,
    SetupReceived,
    unknown_mandatory_properties,
)
from kvconform.moqt.structures import AuthToken, KeyValuePair, Location, ParamType, TrackNamespace
from kvconform.moqt.url import MoqtUrl

__all__ = [
    "FetchResult",
    "LocalTrack",
    "MoqtClient",
    "NamespaceSubscription",
    "RawRequest",
    "ReceivedObject",
    "RequestRejected",
    "SessionEnded",
    "StoredObject",
    "Subscription",
    "build_parameters",
    "connect",
    "serve",
]

DEFAULT_TIMEOUT = 5.0
# Bound on holding PUBLISH_DONE back until the subscription's streams have sent everything (LocalTrack.end_track).
PUBLISH_DONE_AFTER_SENT = 10.0
T = TypeVar("T")


class RequestRejected(Exception):
    """The peer answered a request with REQUEST_ERROR (`error`), or FINed/reset it without an answer."""

    def __init__(self, what: str, error: RequestError | None, reset_code: int | None = None) -> None:
        self.error = error
        self.reset_code = reset_code
        if error is not None:
            detail = f"REQUEST_ERROR 0x{error.error_code:x} {error.reason!r}"
        else:
            detail = "stream ended without an answer" if reset_code is None else f"stream reset 0x{reset_code:x}"
        super().__init__(f"{what}: {detail}")

    @property
    def code(self) -> int | None:
        return self.error.error_code if self.error is not None else None


class SessionEnded(Exception):
    """The session closed while a request was waiting; `setup_received`: the peer's SETUP had arrived."""

    def __init__(self, closed: SessionClosed, *, setup_received: bool = True) -> None:
        self.closed = closed
        self.setup_received = setup_received
        who = "peer" if closed.by_peer else "this endpoint"
        how = "QUIC (no MOQT session close)" if closed.transport else who
        super().__init__(f"session closed by {how}: code 0x{closed.code:x} {closed.reason!r}")


def build_parameters(
    *,
    location_filter: LocationFilter | None = None,
    fill: FillParameters | bool | None = None,
    group_order: int | None = None,
    subscriber_priority: int | None = None,
    forward: int | None = None,
    auth: Iterable[AuthToken] = (),
    range_filters: Iterable[RangeFilter] = (),
    extra: Iterable[Parameter] = (),
) -> Parameters:
    """A parameter block from keyword arguments (`fill=True` = empty FILL_PARAMETERS, profile §7.4)."""
    items: list[Parameter] = [Parameter(ParamType.AUTHORIZATION_TOKEN, t) for t in auth]
    if forward is not None:
        items.append(Parameter(ParamType.FORWARD, forward))
    if subscriber_priority is not None:
        items.append(Parameter(ParamType.SUBSCRIBER_PRIORITY, subscriber_priority))
    if location_filter is not None:
        items.append(Parameter(ParamType.LOCATION_FILTER, location_filter))
    if group_order is not None:
        items.append(Parameter(ParamType.GROUP_ORDER, group_order))
    if fill is True:
        items.append(Parameter(ParamType.FILL_PARAMETERS, FillParameters()))
    elif isinstance(fill, FillParameters):
        items.append(Parameter(ParamType.FILL_PARAMETERS, fill))
    items += [Parameter(f.param_type, f) for f in range_filters]
    items += list(extra)
    return Parameters(tuple(items))


# ---------------------------------------------------------------------------------------------------
# Received objects and request handles


@dataclass(frozen=True)
class ReceivedObject:
    """An object as a subscriber saw it. `kind`: "subgroup", "fill" or "fetch"; `end_of_range` holds
    the End of Range flags (0x8C/0x10C/0x20C) when this is such a record (profile §9.4)."""

    kind: str
    stream_id: int
    location: Location
    payload: bytes = b""
    status: int = ObjectStatus.NORMAL
    subgroup_id: int | None = 0
    publisher_priority: int | None = None
    properties: bytes | None = None
    end_of_range: int | None = None

    @classmethod
    def of(cls, kind: str, stream_id: int, obj: SubgroupObject | FetchObject | EndOfRange) -> ReceivedObject:
        if isinstance(obj, EndOfRange):
            return cls(kind, stream_id, obj.location, end_of_range=obj.kind)
        if isinstance(obj, SubgroupObject):
            return cls(kind, stream_id, obj.location, obj.payload, obj.status, obj.subgroup_id,
                       obj.publisher_priority, obj.properties)
        return cls(kind, stream_id, obj.location, obj.payload, ObjectStatus.NORMAL, obj.subgroup_id,
                   obj.publisher_priority, obj.properties)


class _Handle:
    """Common part of request handles: the answer future, update answers, a bounded event wait."""

    def __init__(self, client: MoqtClient, request: Request) -> None:
        self.client = client
        self.request = request
        self.answer: asyncio.Future[ControlMessage] = client._loop.create_future()
        self._updates: list[asyncio.Future[ControlMessage]] = []
        self.ended = asyncio.Event()
        self.end_reset_code: int | None = None
        client._handles[request.stream_id] = self

    @property
    def stream_id(self) -> int:
        return self.request.stream_id

    def _what(self) -> str:
        return f"{type(self.request.message).__name__} on stream {self.stream_id}"

    def _on_answer(self, msg: ControlMessage) -> None:
        if not self.answer.done():
            self.answer.set_result(msg)
        elif self._updates:
            fut = self._updates.pop(0)
            if not fut.done():  # its waiter may have timed out
                fut.set_result(msg)

    def _on_event(self, event: Event) -> None:
        if isinstance(event, MessageReceived) and isinstance(event.message, RequestOk | RequestError | SubscribeOk
                                                             | FetchOk):
            self._on_answer(event.message)
        elif isinstance(event, RequestStreamEnded):
            self.end_reset_code = event.reset_code
            self.ended.set()
            self._fail_waiters(RequestRejected(self._what(), None, event.reset_code))

    def _fail_waiters(self, exc: BaseException) -> None:
        if not self.answer.done():
            self.answer.set_exception(exc)
            self.answer.exception()  # mark retrieved: nobody may be waiting
        for fut in self._updates:
            if not fut.done():
                fut.set_exception(exc)
                fut.exception()
        self._updates.clear()

    async def _bounded(self, awaitable: Awaitable[T], timeout: float | None) -> T:
        """Await with a bound; SessionEnded at once if the session closes first."""
        return await self.client._bounded(awaitable, timeout)

    async def wait_answer(self, timeout: float | None = None) -> ControlMessage:
        """The first answer (OK of its kind); RequestRejected on REQUEST_ERROR or an unanswered FIN/reset."""
        msg = await self._bounded(asyncio.shield(self.answer), timeout)
        if isinstance(msg, RequestError):
            raise RequestRejected(self._what(), msg)
        return msg

    async def update(self, parameters: Parameters, timeout: float | None = None) -> RequestOk:
        """REQUEST_UPDATE and its REQUEST_OK (RequestRejected on REQUEST_ERROR)."""
        self.client.session.request_update(self.stream_id, parameters)
        fut: asyncio.Future[ControlMessage] = self.client._loop.create_future()
        self._updates.append(fut)
        msg = await self._bounded(asyncio.shield(fut), timeout)
        if isinstance(msg, RequestError):
            raise RequestRejected(f"REQUEST_UPDATE on stream {self.stream_id}", msg)
        assert isinstance(msg, RequestOk)
        return msg

    def cancel(self, code: int = StreamResetCode.CANCELLED) -> None:
        """Cancel the request (reset + STOP_SENDING, profile §4.4); unsubscribe / withdraw a namespace."""
        if self.client.session.closed is None:
            self.client.session.cancel(self.stream_id, code)
        self._fail_waiters(RequestRejected(self._what() + " (cancelled locally)", None, code))


class Subscription(_Handle):
    """A SUBSCRIBE this endpoint sent, with exactly-once bookkeeping (profile §11.4).

    `objects` holds every object in arrival order; `violations` lists breaches of §11.4 items 3-5
    (duplicate Locations, a fill object above Largest, a subscription object at or below it, status on a
    fill stream); `fills` maps each fill stream id to "open", "fin" or "reset".
    """

    def __init__(self, client: MoqtClient, request: Request) -> None:
        super().__init__(client, request)
        self.queue: asyncio.Queue[ReceivedObject] = asyncio.Queue()
        self.objects: list[ReceivedObject] = []
        self.seen: set[Location] = set()
        self.violations: list[str] = []
        self.fills: dict[int, str] = {}
        self.subgroup_streams: dict[int, str] = {}
        self.done: asyncio.Future[PublishDone] = client._loop.create_future()
        self._stream_event = asyncio.Event()
        self._last_on_stream: dict[int, Location] = {}
        self._fill_params: dict[int, FillParameters | None] = {}  # fill stream -> its carrying FILL_PARAMETERS
        self._group_end: dict[int, int] = {}
        self._track_end: Location | None = None

    @property
    def ok(self) -> SubscribeOk | None:
        return self.request.response if isinstance(self.request.response, SubscribeOk) else None

    @property
    def largest(self) -> Location | None:
        """The fill/subscription boundary L of §11.4: LARGEST_OBJECT of SUBSCRIBE_OK, or of the latest
        REQUEST_OK answering an update (which restarts delivery, e.g. FORWARD 0 -> 1)."""
        return self.request.largest

    async def wait_ok(self, timeout: float | None = None) -> SubscribeOk:
        """SUBSCRIBE_OK; a track with an unknown Mandatory Track Property is cancelled and refused (§8)."""
        msg = await self.wait_answer(timeout)
        assert isinstance(msg, SubscribeOk)
        mandatory = unknown_mandatory_properties(msg.track_properties)
        if mandatory:
            self.cancel()
            raise RequestRejected(f"{self._what()}: unknown Mandatory Track Property 0x{mandatory[0]:x} (§8)", None)
        return msg

    def _on_event(self, event: Event) -> None:
        if isinstance(event, MessageReceived) and isinstance(event.message, PublishDone):
            if not self.done.done():
                self.done.set_result(event.message)
            self._stream_event.set()
        elif isinstance(event, DataStreamOpened):
            (self.fills if event.kind == "fill" else self.subgroup_streams)[event.stream_id] = "open"
            if isinstance(event.header, FetchHeader):
                self._fill_params[event.stream_id] = self.client.session.fill_parameters_of(event.header.request_id)
            self._stream_event.set()
        elif isinstance(event, ObjectReceived):
            self._on_object(ReceivedObject.of(event.kind, event.stream_id, event.object))
        elif isinstance(event, DataStreamEnded):
            table = self.fills if event.kind == "fill" else self.subgroup_streams
            table[event.stream_id] = "fin" if event.reset_code is None else "reset"
            self._stream_event.set()
        elif isinstance(event, RequestStreamEnded) and not self.done.done():
            self.done.set_exception(RequestRejected(self._what() + " ended without PUBLISH_DONE", None,
                                                    event.reset_code))
            self.done.exception()
        super()._on_event(event)

    def _on_object(self, obj: ReceivedObject) -> None:
        largest = self.largest
        self._check_order(obj)
        if obj.end_of_range is None:
            self._check_track_end(obj)
            if obj.kind == "fill" and largest is not None and obj.location > largest:
                self.violations.append(f"fill object {obj.location} above LARGEST_OBJECT {largest} (§11.4 item 3)")
            if obj.kind == "subgroup" and largest is not None and obj.location <= largest and self.ok is not None:
                self.violations.append(f"subscription object {obj.location} at or below LARGEST_OBJECT {largest} "
                                       "(§11.4 item 3)")
            if obj.location in self.seen:
                self.violations.append(f"Location {obj.location} delivered twice (§11.4 item 4)")
            self.seen.add(obj.location)
        self.objects.append(obj)
        self.queue.put_nowait(obj)

    def _check_order(self, obj: ReceivedObject) -> None:
        """§11.4 item 5: on a fill stream groups follow the requested order, objects ascend per group."""
        if obj.kind != "fill":
            return
        prev = self._last_on_stream.get(obj.stream_id)
        self._last_on_stream[obj.stream_id] = obj.location
        if prev is None:
            return
        descending = self.request.group_order(self._fill_params.get(obj.stream_id)) == GroupOrder.DESCENDING
        if obj.location.group == prev.group:
            ok = obj.location.object > prev.object
        else:
            ok = (obj.location.group < prev.group) if descending else (obj.location.group > prev.group)
        if not ok:
            self.violations.append(f"fill stream {obj.stream_id}: {obj.location} after {prev} breaks the "
                                   f"{'descending' if descending else 'ascending'} order (§11.4 item 5)")

    def _check_track_end(self, obj: ReceivedObject) -> None:
        """Malformed track (§9.3): an object beyond its group's End of Group or beyond End of Track."""
        group_end = self._group_end.get(obj.location.group)
        if group_end is not None and obj.location.object > group_end:
            self.violations.append(f"object {obj.location} beyond End of Group at object {group_end} (§9.3)")
        if self._track_end is not None and obj.location > self._track_end:
            self.violations.append(f"object {obj.location} beyond End of Track {self._track_end} (§9.3)")
        # Objects may arrive before the end marker on another stream: check those already seen too.
        if obj.status == ObjectStatus.END_OF_GROUP:
            self._group_end[obj.location.group] = obj.location.object
            for loc in sorted(self.seen):
                if loc.group == obj.location.group and loc.object > obj.location.object:
                    self.violations.append(f"object {loc} beyond End of Group at object {obj.location.object} (§9.3)")
        elif obj.status == ObjectStatus.END_OF_TRACK:
            self._track_end = obj.location
            for loc in sorted(self.seen):
                if loc > obj.location:
                    self.violations.append(f"object {loc} beyond End of Track {obj.location} (§9.3)")

    async def next_object(self, timeout: float | None = None) -> ReceivedObject:
        """The next object (subgroup or fill) in arrival order."""
        return await self._bounded(self.queue.get(), timeout)

    async def wait_fill(self, timeout: float | None = None) -> str:
        """Wait until every fill stream seen so far ended (and at least one was seen): "fin" or "reset"."""
        async def ended() -> str:
            while not self.fills or "open" in self.fills.values():
                self._stream_event.clear()
                await self._stream_event.wait()
            return "reset" if "reset" in self.fills.values() else "fin"
        return await self._bounded(ended(), timeout)

    async def wait_done(self, timeout: float | None = None) -> PublishDone:
        """PUBLISH_DONE (the subscription's last message, profile §6.2)."""
        return await self._bounded(asyncio.shield(self.done), timeout)

    def streams_seen(self) -> int:
        return len(self.fills) + len(self.subgroup_streams)

    async def wait_streams_closed(self, timeout: float | None = None) -> None:
        """Wait until every data stream seen has ended and, once PUBLISH_DONE arrived, until as many
        streams as its Stream Count were seen (data streams may trail PUBLISH_DONE, profile §6.2)."""
        async def closed() -> None:
            while True:
                expected = self.done.result().stream_count if self.done.done() and not self.done.exception() else 0
                open_ = "open" in self.fills.values() or "open" in self.subgroup_streams.values()
                if not open_ and (expected == UNKNOWN_STREAM_COUNT or self.streams_seen() >= expected):
                    if expected != UNKNOWN_STREAM_COUNT and self.streams_seen() > expected:
                        self.violations.append(f"{self.streams_seen()} data streams but PUBLISH_DONE Stream Count "
                                               f"is {expected} (§6.2)")
                    return
                self._stream_event.clear()
                await self._stream_event.wait()
        await self._bounded(closed(), timeout)

    async def wait_complete(self, timeout: float | None = None) -> PublishDone:
        """PUBLISH_DONE and then every data stream it counts, ended (the whole subscription, §11.4)."""
        done = await self.wait_done(timeout)
        await self.wait_streams_closed(timeout)
        return done

    def payloads(self) -> dict[Location, bytes]:
        """Location -> payload of every Normal object received (fill and subscription)."""
        return {o.location: o.payload for o in self.objects if o.end_of_range is None and
                o.status == ObjectStatus.NORMAL}


class FetchResult(_Handle):
    """A FETCH this endpoint sent: FETCH_OK, then the objects of its one fetch stream (FIN or reset)."""

    def __init__(self, client: MoqtClient, request: Request) -> None:
        super().__init__(client, request)
        self.objects: list[ReceivedObject] = []
        self.stream_end: asyncio.Future[int | None] = client._loop.create_future()

    def _on_event(self, event: Event) -> None:
        if isinstance(event, ObjectReceived):
            self.objects.append(ReceivedObject.of("fetch", event.stream_id, event.object))
        elif isinstance(event, DataStreamEnded) and not self.stream_end.done():
            self.stream_end.set_result(event.reset_code)
        super()._on_event(event)

    async def wait_ok(self, timeout: float | None = None) -> FetchOk:
        msg = await self.wait_answer(timeout)
        assert isinstance(msg, FetchOk)
        return msg

    async def wait_complete(self, timeout: float | None = None) -> list[ReceivedObject]:
        """FETCH_OK and the fetch stream's FIN; RequestRejected on REQUEST_ERROR or a reset stream."""
        await self.wait_ok(timeout)
        code = await self._bounded(asyncio.shield(self.stream_end), timeout)
        if code is not None:
            raise RequestRejected(f"fetch stream of {self._what()}", None, code)
        return self.objects


class NamespaceSubscription(_Handle):
    """A SUBSCRIBE_NAMESPACE this endpoint sent: ("namespace" | "done", suffix) notices in order."""

    def __init__(self, client: MoqtClient, request: Request) -> None:
        super().__init__(client, request)
        self.queue: asyncio.Queue[tuple[str, TrackNamespace]] = asyncio.Queue()

    def _on_event(self, event: Event) -> None:
        if isinstance(event, MessageReceived) and isinstance(event.message, Namespace | NamespaceDone):
            kind = "done" if isinstance(event.message, NamespaceDone) else "namespace"
            self.queue.put_nowait((kind, event.message.track_namespace_suffix))
        super()._on_event(event)

    @property
    def active(self) -> set[TrackNamespace]:
        """Suffixes announced and not yet withdrawn."""
        return set(self.request.namespaces)

    async def next(self, timeout: float | None = None) -> tuple[str, TrackNamespace]:
        return await self._bounded(self.queue.get(), timeout)


class RawRequest(_Handle):
    """A request stream opened with raw bytes: every peer message and the stream end, in order."""

    def __init__(self, client: MoqtClient, request: Request) -> None:
        super().__init__(client, request)
        self.events: asyncio.Queue[Event] = asyncio.Queue()

    def _on_event(self, event: Event) -> None:
        self.events.put_nowait(event)
        super()._on_event(event)

    async def next_event(self, timeout: float | None = None) -> Event:
        return await self._bounded(self.events.get(), timeout)

    def send(self, data: bytes, end_stream: bool = False) -> None:
        self.client.session.send_raw(self.stream_id, data, end_stream)


# ---------------------------------------------------------------------------------------------------
# Publisher side


@dataclass(frozen=True)
class StoredObject:
    """An object this endpoint published (status objects included)."""

    location: Location
    subgroup_id: int
    publisher_priority: int
    payload: bytes = b""
    status: int = ObjectStatus.NORMAL
    properties: bytes = b""


@dataclass(eq=False)
class _Served:
    """One downstream subscription to a LocalTrack."""

    stream_id: int
    request_id: int
    location_filter: LocationFilter
    largest_at_start: Location | None
    forward: int
    range_filters: tuple[RangeFilter, ...]
    streams: dict[tuple[int, int], int] = field(default_factory=dict)  # (group, subgroup) -> data stream
    stopped: set[tuple[int, int]] = field(default_factory=set)


def _range_filters(params: Parameters) -> tuple[RangeFilter, ...]:
    return tuple(p.value for p in params if isinstance(p.value, RangeFilter) and p.value.set_id is not None)


class LocalTrack:
    """A track this endpoint publishes and serves (profile §9, §11).

    `publish_object` stores an object and forwards it to every live subscription it passes; `end_group`
    writes End of Group; `end_track` writes End of Track as Object {L, 0} on its own subgroup stream
    (profile §9.3), FINs every stream and sends PUBLISH_DONE TRACK_ENDED with the Stream Count.
    """

    def __init__(self, client: MoqtClient, namespace: TrackNamespace, name: bytes, *,
                 properties: tuple[KeyValuePair, ...] = (), publisher_priority: int = 128,
                 object_properties: bool = False) -> None:
        self.client = client
        # Subgroup headers carry the PROPERTIES bit iff the track's objects may have properties (§9.2).
        self.object_properties = object_properties
        self.namespace = namespace
        self.name = name
        self.properties = properties
        self.publisher_priority = publisher_priority
        self.objects: dict[Location, StoredObject] = {}
        self._first_in_subgroup: dict[tuple[int, int], int] = {}  # (group, subgroup) -> smallest Object ID
        self.largest: Location | None = None
        self.ended = False
        self.subscribers: dict[int, _Served] = {}

    @property
    def session(self) -> Session:
        return self.client.session

    def publish_object(self, group: int, object_id: int, payload: bytes = b"", *, subgroup: int = 0,
                       priority: int | None = None, status: int = ObjectStatus.NORMAL, properties: bytes = b"",
                       end_subgroup: bool = False) -> StoredObject:
        """Store and forward one object; `end_subgroup` FINs the subgroup streams after it."""
        loc = Location(group, object_id)
        if properties and not self.object_properties:
            raise ValueError(f"object {loc} has properties but the track was created with object_properties=False")
        if loc in self.objects:
            raise ValueError(f"object {loc} already published (objects are immutable, profile §12)")
        obj = StoredObject(loc, subgroup, self.publisher_priority if priority is None else priority, payload, status,
                           properties)
        self.objects[loc] = obj
        key = (group, subgroup)
        self._first_in_subgroup[key] = min(self._first_in_subgroup.get(key, object_id), object_id)
        if self.largest is None or loc > self.largest:
            self.largest = loc  # advances when a larger object is published (profile §7.3)
        end = end_subgroup or status in (ObjectStatus.END_OF_GROUP, ObjectStatus.END_OF_TRACK)
        if self.session.closed is None:  # stored either way; a closed session has no one to deliver to
            for served in list(self.subscribers.values()):
                self._deliver(served, obj, end)
        return obj

    def publish_group(self, group: int, payloads: Sequence[bytes], *, priority: int | None = None,
                      subgroup: int = 0, end_of_group: bool = True) -> None:
        """Objects 0..n-1 of `group`, then End of Group at Object n (profile §9.3) unless disabled."""
        for oid, payload in enumerate(payloads):
            self.publish_object(group, oid, payload, subgroup=subgroup, priority=priority)
        if end_of_group:
            self.publish_object(group, len(payloads), subgroup=subgroup, priority=priority,
                                status=ObjectStatus.END_OF_GROUP)

    def end_track(self, *, publish_done: bool = True) -> None:
        """End of Track at {last group + 1, 0} (profile §9.3, §13 #11), then PUBLISH_DONE TRACK_ENDED once the
        subscription's streams have sent their data and FIN (bounded by PUBLISH_DONE_AFTER_SENT): a relay
        that gives the streams PUBLISH_DONE counts only a short grace must not cut off megabytes still in
        this endpoint's send buffers."""
        group = 0 if self.largest is None else self.largest.group + 1
        self.publish_object(group, 0, status=ObjectStatus.END_OF_TRACK)
        self.ended = True
        if self.session.closed is not None:
            return
        for served in list(self.subscribers.values()):
            ending = [sid for sid in served.streams.values() if self.session.data_stream_open(sid)]
            for sid in ending:
                self.session.end_data_stream(sid)
            served.streams.clear()
            if publish_done:  # after every stream it counts, not only those ended here (profile §6.2)
                self.client.connection.when_sent(self.session.data_streams_of(served.stream_id),
                                                 functools.partial(self._done, served.stream_id),
                                                 PUBLISH_DONE_AFTER_SENT)

    def _done(self, stream_id: int) -> None:
        if self.session.closed is None:
            self.finish(stream_id, PublishDoneCode.TRACK_ENDED)

    def finish(self, stream_id: int, status: int = PublishDoneCode.TRACK_ENDED, reason: str = "") -> None:
        """PUBLISH_DONE on one subscription (after its data streams are closed)."""
        served = self.subscribers.pop(stream_id, None)
        if served is None:
            return
        for sid in served.streams.values():
            self.session.reset_data_stream(sid, StreamResetCode.CANCELLED)
        req = self.session.requests.get(stream_id)
        if req is not None and req.publishing and not req.sent_fin:
            self.session.publish_done(stream_id, status, reason)

    # -- serving ------------------------------------------------------------------------------------

    def _passes(self, served: _Served, obj: StoredObject) -> bool:
        if not served.forward:
            return False
        if not served.location_filter.contains(obj.location, served.largest_at_start):
            return False
        return passes_range_filters(served.range_filters, subgroup_id=obj.subgroup_id,
                                    object_id=obj.location.object, priority=obj.publisher_priority,
                                    track_properties=self.properties)

    def _deliver(self, served: _Served, obj: StoredObject, end: bool) -> None:
        key = (obj.location.group, obj.subgroup_id)
        if key in served.stopped or not self._passes(served, obj):
            return
        sid = served.streams.get(key)
        if sid is not None and not self.session.data_stream_open(sid):
            served.stopped.add(key)  # STOP_SENDING: reset and do not reopen (profile §9.2)
            served.streams.pop(key, None)
            return
        if sid is None:
            # FIRST_OBJECT: this stream starts with the first object ever published in the subgroup (§9.2).
            first = self._first_in_subgroup[key] == obj.location.object
            sid = self.session.open_subgroup(served.stream_id, obj.location.group, obj.subgroup_id,
                                             obj.publisher_priority, first_object=first,
                                             properties=self.object_properties)
            served.streams[key] = sid
        self.session.write_object(sid, obj.location.object, obj.payload, status=obj.status,
                                  properties=obj.properties, end_stream=end)
        if end:
            served.streams.pop(key, None)

    def _objects_in(self, start: Location, end: Location, order: int,
                    filters: tuple[RangeFilter, ...]) -> list[StoredObject]:
        """Normal objects in [start, end] in fetch order (groups by `order`, objects ascending)."""
        chosen = [o for loc, o in self.objects.items() if start <= loc <= end and o.status == ObjectStatus.NORMAL
                  and passes_range_filters(filters, subgroup_id=o.subgroup_id, object_id=loc.object,
                                           priority=o.publisher_priority, track_properties=self.properties)]
        if order == GroupOrder.DESCENDING:
            return sorted(chosen, key=lambda o: (-o.location.group, o.location.object))
        return sorted(chosen, key=lambda o: o.location)

    def _write_fetch_stream(self, sid: int, objects: list[StoredObject]) -> None:
        for obj in objects:
            self.session.write_fetch_object(sid, FetchObject(obj.location.group, obj.location.object, obj.payload,
                                                             obj.subgroup_id, obj.publisher_priority,
                                                             obj.properties or None))
        self.session.end_data_stream(sid)

    def serve_subscribe(self, req: Request) -> None:
        """SUBSCRIBE_OK, the fill stream if asked (Forward 1), then live delivery (profile §11)."""
        params = req.parameters
        largest = self.largest
        flt = req.location_filter or LocationFilter.none()
        forward = params.get(ParamType.FORWARD, 1)
        served = _Served(req.stream_id, req.request_id, flt, largest, int(forward) if isinstance(forward, int) else 1,
                         _range_filters(params))
        self.session.subscribe_ok(req.stream_id, largest=largest, track_properties=self.properties)
        self.subscribers[req.stream_id] = served
        fill = params.get(ParamType.FILL_PARAMETERS)
        if isinstance(fill, FillParameters) and served.forward:
            self._serve_fill(served, req.request_id, fill)
        if self.ended:
            # PUBLISH_DONE only once the fill stream's data and FIN have left (profile §6.2: "sent only after
            # all those streams are closed"), as end_track does for live streams
            self.client.connection.when_sent(self.session.data_streams_of(req.stream_id),
                                             functools.partial(self._done, req.stream_id), PUBLISH_DONE_AFTER_SENT)

    def _serve_fill(self, served: _Served, request_id: int, fill: FillParameters) -> int | None:
        """One fill fetch stream for the carrying message: objects <= Largest now, then FIN (§11.2); its stream
        id (None: the fill range is empty, no stream)."""
        inner = fill.params.get(ParamType.LOCATION_FILTER)
        flt = inner if isinstance(inner, LocationFilter) else served.location_filter
        span = flt.fetch_range(self.largest)
        if span is None:
            return None  # empty fill range: no stream (profile §11.2)
        filters = _range_filters(fill.params) or served.range_filters
        order = self.session.fill_group_order(served.stream_id, fill)
        sid = self.session.open_fill_stream(served.stream_id, request_id, fill)
        self._write_fetch_stream(sid, self._objects_in(span[0], span[1], order, filters))
        return sid

    def serve_update(self, req: Request, update: RequestUpdate) -> None:
        """REQUEST_UPDATE of a subscription: FORWARD, LOCATION_FILTER, range filters, FILL_PARAMETERS."""
        served = self.subscribers.get(req.stream_id)
        if served is None:
            self.session.reject(req.stream_id, RequestErrorCode.INTERNAL_ERROR, "subscription no longer served")
            return
        params = update.parameters
        forward = params.get(ParamType.FORWARD)
        if isinstance(forward, int):
            if forward and not served.forward:
                served.largest_at_start = self.largest  # saved when Forward switches 0 -> 1 (profile §11.1)
                served.stopped.clear()
            elif not forward:
                for sid in served.streams.values():  # Forward 0: open subgroup streams are reset (§9.2)
                    self.session.reset_data_stream(sid, StreamResetCode.CANCELLED)
                served.streams.clear()
            served.forward = forward
        flt = params.get(ParamType.LOCATION_FILTER)
        if isinstance(flt, LocationFilter):
            served.location_filter = flt
            served.largest_at_start = self.largest
        filters = _range_filters(params)
        if filters:
            served.range_filters = filters
        ok_params = Parameters.of((ParamType.LARGEST_OBJECT, self.largest)) if self.largest else NO_PARAMETERS
        self.session.request_ok(req.stream_id, ok_params)
        fill = params.get(ParamType.FILL_PARAMETERS)
        if isinstance(fill, FillParameters) and served.forward:
            self._serve_fill(served, update.request_id, fill)

    def serve_fetch(self, req: Request) -> None:
        """FETCH_OK with the inclusive End Location, then one fetch stream; INVALID_RANGE when empty."""
        params = req.parameters
        flt = req.location_filter or LocationFilter.none()
        if flt.type in (LocationFilterType.NEXT_OBJECT,):
            self.session.reject(req.stream_id, RequestErrorCode.INVALID_RANGE, "Next Object starts after Largest "
                                "Object (profile §13 #10)")
            return
        span = flt.fetch_range(self.largest)
        if span is None:
            self.session.reject(req.stream_id, RequestErrorCode.INVALID_RANGE,
                                f"nothing in range (Largest Object {self.largest}, profile §7.3)")
            return
        order = params.get(ParamType.GROUP_ORDER, GroupOrder.ASCENDING)
        objects = self._objects_in(span[0], span[1], int(order) if isinstance(order, int) else 1,
                                   _range_filters(params))
        covered = [loc for loc, o in self.objects.items() if span[0] <= loc <= span[1] and
                   o.status == ObjectStatus.NORMAL]
        end = max(covered) if covered else span[1]  # last object actually covered (profile §13 #9)
        last_normal = max((loc for loc, o in self.objects.items() if o.status == ObjectStatus.NORMAL), default=None)
        self.session.fetch_ok(req.stream_id, end, end_of_track=self.ended and end == last_normal,
                              track_properties=self.properties)
        sid = self.session.open_fetch_stream(req.stream_id)
        self._write_fetch_stream(sid, objects)


# ---------------------------------------------------------------------------------------------------


RequestHook = Callable[["MoqtClient", RequestReceived], bool]


class MoqtClient:
    """The async API over one MOQT session (either QUIC role). See the module docstring."""

    def __init__(self, connection: quic.MoqtConnection, *, timeout: float = DEFAULT_TIMEOUT,
                 on_request: RequestHook | None = None) -> None:
        self.connection = connection
        self.timeout = timeout
        self.on_request = on_request
        self._loop = asyncio.get_running_loop()
        self._handles: dict[int, _Handle] = {}
        self.tracks: dict[tuple[TrackNamespace, bytes], LocalTrack] = {}
        self.local_namespaces: set[TrackNamespace] = set()
        self.peer_namespaces: dict[int, TrackNamespace] = {}  # PUBLISH_NAMESPACE stream -> namespace
        self._namespace_subscribers: dict[int, TrackNamespace] = {}  # peer SUBSCRIBE_NAMESPACE -> prefix
        self.setup = asyncio.Event()
        self.goaway: GoawayReceived | None = None
        self.closed = asyncio.Event()
        self.unhandled: asyncio.Queue[Event] = asyncio.Queue()
        self._task = self._loop.create_task(self._dispatch())

    @property
    def session(self) -> Session:
        return self.connection.session

    # -- lifecycle ------------------------------------------------------------------------------------

    async def _bounded(self, awaitable: Awaitable[T], timeout: float | None) -> T:
        """`awaitable` within `timeout` (TimeoutError), or SessionEnded as soon as the session closes."""
        task = asyncio.ensure_future(awaitable)
        closed = self._loop.create_task(self.closed.wait())
        try:
            await asyncio.wait([task, closed], timeout=timeout or self.timeout, return_when=asyncio.FIRST_COMPLETED)
        finally:
            closed.cancel()
        if task.done():
            return task.result()
        task.cancel()
        if self.session.closed is not None and self.closed.is_set():
            raise SessionEnded(self.session.closed, setup_received=self.session.peer_setup is not None)
        raise TimeoutError(f"no result within {timeout or self.timeout} s")

    async def wait_setup(self, timeout: float | None = None) -> None:
        """Wait for the peer's SETUP (profile §5); its options are `session.peer_setup`.
        SessionEnded if the session closes first (e.g. the server refused our SETUP)."""
        await self._bounded(self.setup.wait(), timeout)

    async def close(self, code: int = SessionError.NO_ERROR, reason: str = "", timeout: float | None = None) -> None:
        await self.connection.close(code, reason, timeout or self.timeout)
        await self._stop_dispatch(timeout)

    async def wait_closed(self, timeout: float | None = None) -> SessionClosed:
        """Wait until the session ends (e.g. the peer closed it for a protocol violation)."""
        closed = await self.connection.wait_closed(timeout or self.timeout)
        await self._stop_dispatch(timeout)
        return closed

    async def _stop_dispatch(self, timeout: float | None) -> None:
        if not self._task.done():
            self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError, TimeoutError):
            await asyncio.wait_for(self._task, timeout or self.timeout)

    async def __aenter__(self) -> MoqtClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # -- dispatch -------------------------------------------------------------------------------------

    async def _dispatch(self) -> None:
        """Route every session event; runs until the session closes (its lifetime bounds this loop)."""
        while True:
            try:
                event = await self.connection.next_event(timeout=60.0)
            except TimeoutError:
                continue  # idle; QUIC's idle timeout ends a dead session with SessionClosed
            try:
                self._route(event)
            except Exception as exc:  # a bug in a handler must not silently kill the session's dispatcher
                self.session.close(SessionError.INTERNAL_ERROR, f"client dispatcher: {exc!r}")
            if isinstance(event, SessionClosed):
                self._on_closed(event)
                return

    def _route(self, event: Event) -> None:
        if isinstance(event, SetupReceived):
            self.setup.set()
            return
        if isinstance(event, GoawayReceived) and event.stream_id is None:
            self.goaway = event
            return
        if isinstance(event, RequestReceived):
            if self.on_request is None or not self.on_request(self, event):
                self._serve(event)
            return
        request = getattr(event, "request", None)
        stream = request.stream_id if isinstance(request, Request) else None
        handle = self._handles.get(stream) if stream is not None else None
        if handle is not None:
            handle._on_event(event)
            return
        if isinstance(request, Request) and not request.local:
            self._on_served_event(request, event)
            return
        self.unhandled.put_nowait(event)

    def _on_closed(self, closed: SessionClosed) -> None:
        self.closed.set()
        for handle in list(self._handles.values()):
            handle._fail_waiters(SessionEnded(closed, setup_received=self.session.peer_setup is not None))

    # -- serving peer requests ------------------------------------------------------------------------

    def _serve(self, event: RequestReceived) -> None:
        msg = event.message
        req = event.request
        sid = event.stream_id
        if self.session.goaway_sent:
            self.session.reject(sid, RequestErrorCode.GOING_AWAY, "this endpoint sent GOAWAY (profile §6.2)")
        elif isinstance(msg, Subscribe):  # Fetch and TrackStatus share its layout: test them first
            track = self.tracks.get((msg.track_namespace, msg.track_name))
            if track is None or (msg.track_namespace.fields[:1] == (b".",)):
                self.session.reject(sid, RequestErrorCode.DOES_NOT_EXIST, "no such track here")
            elif isinstance(msg, Fetch):
                track.serve_fetch(req)
            elif isinstance(msg, TrackStatus):
                params = Parameters.of((ParamType.LARGEST_OBJECT, track.largest)) if track.largest else NO_PARAMETERS
                self.session.request_ok(sid, params, track.properties)
            else:
                track.serve_subscribe(req)
        elif isinstance(msg, PublishNamespace):
            self.peer_namespaces[sid] = msg.track_namespace
            self.session.request_ok(sid)
        elif isinstance(msg, SubscribeNamespace):
            prefix = msg.track_namespace_prefix
            if any(prefix.overlaps(p) for p in self._namespace_subscribers.values()):
                self.session.reject(sid, RequestErrorCode.PREFIX_OVERLAP, f"prefix {prefix} overlaps an active one")
                return
            self._namespace_subscribers[sid] = prefix
            self.session.request_ok(sid)
            for ns in sorted(self.local_namespaces, key=lambda n: n.fields):
                if prefix.is_prefix_of(ns):
                    self.session.send_namespace(sid, ns.suffix_after(prefix))
        else:
            self.session.reject(sid, RequestErrorCode.NOT_SUPPORTED, f"{type(msg).__name__} is not served here")

    def _on_served_event(self, req: Request, event: Event) -> None:
        sid = req.stream_id
        if isinstance(event, MessageReceived) and isinstance(event.message, RequestUpdate):
            track = self._track_for(req)
            if track is not None and req.kind == Subscribe.TYPE:
                track.serve_update(req, event.message)
            else:
                self.session.request_ok(sid)
        elif isinstance(event, RequestStreamEnded) and event.reset_code is not None:
            # Cancellation: the session already reset the data streams; forget the subscriber.
            track = self._track_for(req)
            if track is not None:
                track.subscribers.pop(sid, None)
            self._namespace_subscribers.pop(sid, None)
            self.peer_namespaces.pop(sid, None)
        else:
            self.unhandled.put_nowait(event)

    def _track_for(self, req: Request) -> LocalTrack | None:
        track = req.track
        return self.tracks.get(track) if track is not None else None

    def send_goaway(self, new_session_uri: bytes = b"", timeout_ms: int = 0) -> None:
        """GOAWAY on the control stream; later peer requests are refused with GOING_AWAY (profile §6.2)."""
        self.session.goaway(new_session_uri, timeout_ms)

    # -- publisher API --------------------------------------------------------------------------------

    def track(self, namespace: TrackNamespace, name: bytes, *, properties: tuple[KeyValuePair, ...] = (),
              publisher_priority: int = 128, object_properties: bool = False) -> LocalTrack:
        """Register a track this endpoint serves (its namespace is announced to namespace subscribers)."""
        key = (namespace, name)
        if key not in self.tracks:
            self.tracks[key] = LocalTrack(self, namespace, name, properties=properties,
                                          publisher_priority=publisher_priority, object_properties=object_properties)
            self._announce(namespace)
        return self.tracks[key]

    def _announce(self, namespace: TrackNamespace) -> None:
        if namespace in self.local_namespaces:
            return
        self.local_namespaces.add(namespace)
        for sid, prefix in self._namespace_subscribers.items():
            if prefix.is_prefix_of(namespace):
                self.session.send_namespace(sid, namespace.suffix_after(prefix))

    async def publish_namespace(self, namespace: TrackNamespace, *, auth: Iterable[AuthToken] = (),
                                timeout: float | None = None) -> _Handle:
        """PUBLISH_NAMESPACE and its REQUEST_OK; `handle.cancel()` withdraws it (profile §4.4)."""
        self._announce(namespace)
        req = self.session.publish_namespace(namespace, build_parameters(auth=auth))
        handle = _Handle(self, req)
        await handle.wait_answer(timeout)
        return handle

    # -- subscriber API -------------------------------------------------------------------------------

    async def subscribe(self, namespace: TrackNamespace, name: bytes, *,
                        location_filter: LocationFilter | None = None, fill: FillParameters | bool | None = None,
                        group_order: int | None = None, subscriber_priority: int | None = None,
                        forward: int | None = None, auth: Iterable[AuthToken] = (),
                        range_filters: Iterable[RangeFilter] = (), extra: Iterable[Parameter] = (),
                        wait: bool = True, timeout: float | None = None) -> Subscription:
        """SUBSCRIBE (default filter: Next Object) and, with `wait`, its SUBSCRIBE_OK."""
        params = build_parameters(location_filter=location_filter or LocationFilter.next_object(), fill=fill,
                                  group_order=group_order, subscriber_priority=subscriber_priority,
                                  forward=forward, auth=auth, range_filters=range_filters, extra=extra)
        sub = Subscription(self, self.session.subscribe(namespace, name, params))
        if wait:
            await sub.wait_ok(timeout)
        return sub

    async def subscribe_with_fill(self, namespace: TrackNamespace, name: bytes, *,
                                  group_order: int = GroupOrder.ASCENDING, timeout: float | None = None,
                                  **kwargs: object) -> Subscription:
        """The KVCS recipe (profile §11.3): Next Object + FILL_PARAMETERS {Absolute Start {0,0}, order}."""
        fill = FillParameters.of((ParamType.LOCATION_FILTER, LocationFilter.absolute_start(0, 0)),
                                 (ParamType.GROUP_ORDER, group_order))
        return await self.subscribe(namespace, name, fill=fill, timeout=timeout, **kwargs)  # type: ignore[arg-type]

    async def fetch(self, namespace: TrackNamespace, name: bytes, *, location_filter: LocationFilter | None = None,
                    group_order: int | None = None, range_filters: Iterable[RangeFilter] = (),
                    auth: Iterable[AuthToken] = (), extra: Iterable[Parameter] = (), wait: bool = True,
                    timeout: float | None = None) -> FetchResult:
        """FETCH a range (LOCATION_FILTER, default everything up to Largest) and, with `wait`, all of it."""
        params = build_parameters(location_filter=location_filter, group_order=group_order,
                                  range_filters=range_filters, auth=auth, extra=extra)
        result = FetchResult(self, self.session.fetch(namespace, name, params))
        if wait:
            await result.wait_complete(timeout)
        return result

    async def track_status(self, namespace: TrackNamespace, name: bytes, *, auth: Iterable[AuthToken] = (),
                           timeout: float | None = None) -> RequestOk:
        """TRACK_STATUS -> REQUEST_OK with LARGEST_OBJECT and Track Properties."""
        handle = _Handle(self, self.session.track_status(namespace, name, build_parameters(auth=auth)))
        msg = await handle.wait_answer(timeout)
        assert isinstance(msg, RequestOk)
        return msg

    async def subscribe_namespace(self, prefix: TrackNamespace, *, auth: Iterable[AuthToken] = (),
                                  timeout: float | None = None) -> NamespaceSubscription:
        """SUBSCRIBE_NAMESPACE and its REQUEST_OK; NAMESPACE / NAMESPACE_DONE arrive via `next()`."""
        sub = NamespaceSubscription(self, self.session.subscribe_namespace(prefix, build_parameters(auth=auth)))
        await sub.wait_answer(timeout)
        return sub

    # -- raw escape hatch -----------------------------------------------------------------------------

    def send_control_raw(self, data: bytes) -> None:
        """Append arbitrary bytes to our control stream (after SETUP)."""
        sid = self.session.control_stream_id
        if sid is None:
            raise RuntimeError("no control stream (SessionConfig.send_setup=False): use open_raw_stream")
        self.session.send_raw(sid, data)

    def open_raw_request(self, data: bytes, *, end_stream: bool = False) -> RawRequest:
        """Open a request stream with arbitrary bytes; the peer's answers arrive on the handle."""
        sid = self.session.open_raw_stream(data, end_stream=end_stream)
        return RawRequest(self, self.session.requests[sid])

    def open_raw_stream(self, data: bytes, *, unidirectional: bool = True, end_stream: bool = False) -> int:
        """Open a stream (data or control-like) with arbitrary bytes; returns its id."""
        return self.session.open_raw_stream(data, unidirectional=unidirectional, end_stream=end_stream,
                                            track_request=False)

    def send_raw(self, stream_id: int, data: bytes, end_stream: bool = False) -> None:
        self.session.send_raw(stream_id, data, end_stream)


# ---------------------------------------------------------------------------------------------------


async def connect(url: str | MoqtUrl, *, config: SessionConfig | None = None, verify: bool | bytes = False,
                  timeout: float = DEFAULT_TIMEOUT, on_request: RequestHook | None = None,
                  wait_setup: bool = True, transcript: bool = False) -> MoqtClient:
    """Connect to `moqt://host:port[/path]` and (with `wait_setup`) wait for the server's SETUP.
    `transcript` records the session in the running test's evidence (see `quic.connect`)."""
    connection = await quic.connect(url, config=config, verify=verify, timeout=timeout, transcript=transcript)
    client = MoqtClient(connection, timeout=timeout, on_request=on_request)
    if wait_setup:
        try:
            await client.wait_setup(timeout)
        except BaseException:
            await client.close(SessionError.INTERNAL_ERROR, "no SETUP from the server")
            raise
    return client


async def serve(host: str, port: int, handler: Callable[[MoqtClient], Awaitable[None]] | None = None, *,
                config_factory: Callable[[], SessionConfig] | None = None, timeout: float = DEFAULT_TIMEOUT,
                on_request: RequestHook | None = None, transcript: bool = False) -> quic.MoqtServer:
    """Listen and give each session a `MoqtClient`; without `handler` the session is served until it
    ends (the default publisher behaviour answers requests for the tracks the handler registers)."""

    async def run(connection: quic.MoqtConnection) -> None:
        client = MoqtClient(connection, timeout=timeout, on_request=on_request)
        try:
            if handler is not None:
                await handler(client)
            await client.closed.wait()  # bounded by the QUIC idle timeout and MoqtServer.close()
        finally:
            await client._stop_dispatch(timeout)

    return await quic.serve(host, port, run, config_factory=config_factory or (lambda: SessionConfig(Role.SERVER)),
                            transcript=transcript)
