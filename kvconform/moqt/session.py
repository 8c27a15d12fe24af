"""Sans-I/O MOQT draft-22 session, client and server roles (profile §4, §5, §6, §9, §11).

Bytes and QUIC stream events go in (`receive_stream_data`, `receive_stream_reset`, `receive_stop_sending`,
`receive_datagram`, `connection_terminated`); transport commands (`commands()`) and session events
(`events()`) come out. No asyncio and no sockets here: `kvconform.moqt.quic` moves the bytes.

Topology (profile §4.1): a pair of unidirectional control streams (each starts with its sender's SETUP;
afterwards only GOAWAY), one bidirectional stream per request (the stream identifies the request, so
responses carry no Request ID), data on unidirectional streams (SUBGROUP_HEADER / FETCH_HEADER).

Request lifecycle (which message, FIN or cancellation each end may send in each state): the one table
of `kvconform.moqt.lifecycle`; every state change and lifecycle guard here is a `transition` call.

Strict validation: any violation the profile assigns a Session Termination code closes the session with
that code (`CloseConnection`) and a reason naming the field, the stream and the profile section.
Invariants: `commands()` only ever returns stream writes in the order the session produced them; a
stream id is allocated only when its first bytes are written; after `closed` is set nothing more is
emitted but the `SessionClosed` event.
"""

from __future__ import annotations

import enum
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from urllib.parse import urlsplit

from kvconform.moqt.data import (
    FETCH_HEADER_TYPE,
    PADDING_STREAM_TYPE,
    SETUP_STREAM_TYPE,
    DataStreamParser,
    EndOfRange,
    FetchHeader,
    FetchObject,
    FetchStreamWriter,
    GroupOrder,
    ObjectStatus,
    SubgroupHeader,
    SubgroupObject,
    SubgroupStreamWriter,
    classify_uni_stream,
)
from kvconform.moqt.errors import MoqtDecodeError, NeedMoreData, RequestErrorCode, SessionError, StreamResetCode
from kvconform.moqt.filters import LocationFilter, LocationFilterType, RangeFilter
from kvconform.moqt.lifecycle import (
    LifecycleError,
    RequestEvent,
    RequestState,
    Side,
    answer_event,
    sends_objects,
    transition,
)
from kvconform.moqt.messages import (
    REQUEST_MESSAGE_TYPES,
    ControlMessage,
    ControlStreamParser,
    Fetch,
    FetchOk,
    Goaway,
    MessageType,
    Namespace,
    NamespaceDone,
    Publish,
    PublishDone,
    PublishNamespace,
    PublishSkipped,
    PublishStateNotify,
    Redirect,
    RequestError,
    RequestOk,
    RequestUpdate,
    Setup,
    Subscribe,
    SubscribeNamespace,
    SubscribeOk,
    SubscribeTracks,
    TrackStatus,
    parse_control_message,
)
from kvconform.moqt.parameters import FillParameters, Parameters
from kvconform.moqt.structures import (
    AuthAliasType,
    AuthToken,
    KeyValuePair,
    Location,
    ParamType,
    PropertyType,
    TrackNamespace,
    find_kvp,
    is_mandatory_track_property,
)
from kvconform.moqt.vi64 import decode_vi64

__all__ = [
    "CloseConnection",
    "Command",
    "DataStreamEnded",
    "DataStreamOpened",
    "DatagramReceived",
    "Event",
    "GoawayReceived",
    "MessageReceived",
    "ObjectReceived",
    "RawRequestMessage",
    "Request",
    "RequestAutoRejected",
    "RequestReceived",
    "RequestState",
    "RequestStreamEnded",
    "ResetStream",
    "Role",
    "SendDatagram",
    "Session",
    "SessionClosed",
    "SessionConfig",
    "SessionUsageError",
    "SetupReceived",
    "StopSending",
    "StopSendingReceived",
    "WriteStream",
]

UNKNOWN_STREAM_COUNT = (1 << 64) - 1
NO_PARAMETERS = Parameters()  # an empty block (Parameters is immutable, so one instance serves as default)


# ---------------------------------------------------------------------------------------------------
# Configuration


class Role(enum.Enum):
    """Which QUIC endpoint this session is: it fixes Request ID parity (profile §4.3) and stream ids."""

    CLIENT = "client"
    SERVER = "server"


@dataclass
class SessionConfig:
    """What this endpoint announces in SETUP (profile §5) and accepts from the peer.

    `path`/`authority` are sent by a client only (PATH 0x01, AUTHORITY 0x05); a server with
    `accept_paths`/`accept_authorities` closes with INVALID_PATH / INVALID_AUTHORITY for others.
    `max_filter_ranges` is how many Ranges the *peer* may send us (None = option omitted = 0).
    `send_setup=False` leaves writing the control stream to the caller (raw malformed-SETUP tests).
    """

    role: Role
    implementation: str | None = "kvconform/0.1"
    max_filter_ranges: int | None = 16
    max_request_updates: int | None = None
    max_auth_token_cache_size: int | None = None
    authority: str | None = None
    path: str | None = None
    auth_tokens: tuple[AuthToken, ...] = ()
    extra_setup_options: tuple[KeyValuePair, ...] = ()
    accept_paths: frozenset[str] | None = None
    accept_authorities: frozenset[str] | None = None
    send_setup: bool = True

    def setup(self) -> Setup:
        client = self.role is Role.CLIENT
        return Setup.build(
            path=self.path.encode() if client and self.path is not None else None,
            authority=self.authority.encode() if client and self.authority is not None else None,
            max_filter_ranges=self.max_filter_ranges,
            implementation=self.implementation.encode() if self.implementation is not None else None,
            max_request_updates=self.max_request_updates,
            max_auth_token_cache_size=self.max_auth_token_cache_size,
            auth_tokens=self.auth_tokens,
            extra=self.extra_setup_options,
        )


class SessionUsageError(ValueError):
    """The caller asked the checked API for something the profile forbids (the raw path is `send_raw`)."""


# ---------------------------------------------------------------------------------------------------
# Commands: what the I/O layer must do


@dataclass(frozen=True)
class WriteStream:
    """Write `data` on `stream_id` (opening it if new); FIN after it when `end_stream`."""

    stream_id: int
    data: bytes
    end_stream: bool = False


@dataclass(frozen=True)
class ResetStream:
    """RESET_STREAM the sending direction of `stream_id` with an application code (profile §10.4)."""

    stream_id: int
    code: int


@dataclass(frozen=True)
class StopSending:
    """STOP_SENDING on the receiving direction of `stream_id` (profile §10.4)."""

    stream_id: int
    code: int


@dataclass(frozen=True)
class SendDatagram:
    data: bytes


@dataclass(frozen=True)
class CloseConnection:
    """QUIC application CONNECTION_CLOSE with a Session Termination code (profile §1, §10.1)."""

    code: int
    reason: str


Command = WriteStream | ResetStream | StopSending | SendDatagram | CloseConnection


# ---------------------------------------------------------------------------------------------------
# Events: what happened


@dataclass(frozen=True)
class SetupReceived:
    """The peer's SETUP (profile §5); its options are in `setup`."""

    setup: Setup


@dataclass(frozen=True)
class RequestReceived:
    """The peer opened request stream `stream_id` with `message` (SUBSCRIBE, FETCH, PUBLISH, ...)."""

    stream_id: int
    request: Request
    message: ControlMessage


@dataclass(frozen=True)
class RequestAutoRejected:
    """The session answered a peer request with REQUEST_ERROR itself (e.g. INVALID_FILTER, profile §7.5)."""

    stream_id: int
    message: ControlMessage
    code: int
    reason: str


@dataclass(frozen=True)
class MessageReceived:
    """A later message on a request stream: a response, REQUEST_UPDATE, NAMESPACE, PUBLISH_DONE, ..."""

    stream_id: int
    request: Request
    message: ControlMessage


@dataclass(frozen=True)
class GoawayReceived:
    """GOAWAY on the control stream (`stream_id` None: migrate the session) or on a request stream."""

    stream_id: int | None
    message: Goaway


@dataclass(frozen=True)
class RequestStreamEnded:
    """The peer finished (`reset_code` None = FIN) or reset its sending side of a request stream."""

    stream_id: int
    request: Request
    reset_code: int | None


@dataclass(frozen=True)
class StopSendingReceived:
    """The peer sent STOP_SENDING for one of our streams (the session already reset it)."""

    stream_id: int
    code: int


@dataclass(frozen=True)
class DataStreamOpened:
    """A data stream's header arrived. `kind`: "subgroup", "fetch" or "fill" (profile §9, §11.2)."""

    stream_id: int
    kind: str
    request: Request | None
    header: SubgroupHeader | FetchHeader


@dataclass(frozen=True)
class ObjectReceived:
    """One object (or End of Range record) of a data stream, with absolute IDs."""

    stream_id: int
    kind: str
    request: Request | None
    object: SubgroupObject | FetchObject | EndOfRange


@dataclass(frozen=True)
class DataStreamEnded:
    """A data stream ended: FIN (`reset_code` None) or reset by the peer."""

    stream_id: int
    kind: str
    request: Request | None
    reset_code: int | None


@dataclass(frozen=True)
class DatagramReceived:
    """A QUIC DATAGRAM, undecoded (KVCS uses no datagrams)."""

    data: bytes


@dataclass(frozen=True)
class SessionClosed:
    """The session ended: `by_peer` False when this endpoint closed it (with `code` and `reason`).

    `transport` True when QUIC ended the connection without a MOQT session close (profile §1: a session
    closes with an application CONNECTION_CLOSE carrying a Session Termination code): a transport
    CONNECTION_CLOSE (its `code` is then a QUIC transport error code), an idle timeout, a lost path."""

    code: int
    reason: str
    by_peer: bool
    transport: bool = False


Event = (
    SetupReceived
    | RequestReceived
    | RequestAutoRejected
    | MessageReceived
    | GoawayReceived
    | RequestStreamEnded
    | StopSendingReceived
    | DataStreamOpened
    | ObjectReceived
    | DataStreamEnded
    | DatagramReceived
    | SessionClosed
)


# ---------------------------------------------------------------------------------------------------
# Requests (profile §4.4, §11.1); their states move only by `lifecycle.transition`


@dataclass(eq=False)
class Request:
    """One request stream (profile §4.4). `local`: this endpoint sent the request message."""

    stream_id: int
    request_id: int
    message: ControlMessage
    local: bool
    state: RequestState = RequestState.PENDING
    response: ControlMessage | None = None
    track_alias: int | None = None
    largest: Location | None = None
    track_properties: tuple[KeyValuePair, ...] = ()
    namespaces: set[TrackNamespace] = field(default_factory=set)
    namespaces_done: set[TrackNamespace] = field(default_factory=set)  # ended by NAMESPACE_DONE (for the message)
    data_streams: set[int] = field(default_factory=set)
    streams_opened: int = 0
    pending_updates: deque[int] = field(default_factory=deque)
    fill_streams: dict[int, int] = field(default_factory=dict)  # carrying Request ID -> fill stream id
    sent_fin: bool = False
    peer_fin: bool = False
    goaway_received: bool = False
    priority_update: int | None = None  # SUBSCRIBER_PRIORITY from the latest REQUEST_UPDATE (sticky)

    def __repr__(self) -> str:
        side = "local" if self.local else "peer"
        return (f"Request(stream={self.stream_id}, rid={self.request_id}, {MessageType(self.kind).name}, {side}, "
                f"{self.state.value}, alias={self.track_alias})")

    @property
    def kind(self) -> int:
        """The MessageType that opened the stream."""
        return self.message.TYPE

    @property
    def side(self) -> Side:
        """This endpoint's end of the request."""
        return Side.REQUESTER if self.local else Side.RESPONDER

    @property
    def peer_side(self) -> Side:
        return Side.RESPONDER if self.local else Side.REQUESTER

    @property
    def publishing(self) -> bool:
        """Whether this endpoint may send the subscription's objects now (a PUBLISH's before PUBLISH_OK too)."""
        return sends_objects(self.kind, self.side, self.state)

    @property
    def parameters(self) -> Parameters:
        params = getattr(self.message, "parameters", None)
        return params if isinstance(params, Parameters) else Parameters()

    @property
    def track(self) -> tuple[TrackNamespace, bytes] | None:
        """(namespace, name) for track requests (SUBSCRIBE, FETCH, TRACK_STATUS, PUBLISH)."""
        if isinstance(self.message, Subscribe | Publish):
            return self.message.track_namespace, self.message.track_name
        return None

    @property
    def subscriber_priority(self) -> int:
        """SUBSCRIBER_PRIORITY (absent = 128; lower = more urgent), updated by REQUEST_UPDATE (§7.1)."""
        if self.priority_update is not None:
            return self.priority_update
        value = self.parameters.get(ParamType.SUBSCRIBER_PRIORITY)
        return value if isinstance(value, int) else 128

    @property
    def location_filter(self) -> LocationFilter | None:
        value = self.parameters.get(ParamType.LOCATION_FILTER)
        return value if isinstance(value, LocationFilter) else None

    def group_order(self, fill: FillParameters | None = None) -> int:
        """Effective group order: FILL_PARAMETERS', else the request's, else the track default (§9.4)."""
        for params in ([fill.params] if fill is not None else []) + [self.parameters]:
            order = params.get(ParamType.GROUP_ORDER)
            if isinstance(order, int):
                return order
        defaults = find_kvp(self.track_properties, PropertyType.DEFAULT_PUBLISHER_GROUP_ORDER)
        if defaults and defaults[0] in (GroupOrder.ASCENDING, GroupOrder.DESCENDING):
            return int(defaults[0])
        return GroupOrder.ASCENDING


@dataclass(eq=False)
class _InStream:
    """A peer-opened (or peer-written) stream's receive state."""

    stream_id: int
    buf: bytearray = field(default_factory=bytearray)  # bytes before the stream kind is known
    kind: str = ""  # "control" | "request" | "subgroup" | "fetch" | "fill" | "padding"
    control: ControlStreamParser | None = None
    data: DataStreamParser | None = None
    request: Request | None = None
    held: list[SubgroupHeader | SubgroupObject | FetchHeader | FetchObject | EndOfRange] = field(default_factory=list)
    held_end: tuple[bool, int | None] | None = None  # (ended, reset code) while held
    alias: int | None = None
    fin: bool = False


@dataclass(eq=False)
class _OutData:
    """One of our data streams."""

    stream_id: int
    request: Request
    subgroup: SubgroupStreamWriter | None = None
    fetch: FetchStreamWriter | None = None
    finished: bool = False
    group: int = 0
    publisher_priority: int = 128
    subscriber_priority: int | None = None  # a fill's own SUBSCRIBER_PRIORITY (FILL_PARAMETERS)


class _Violation(Exception):
    """Internal: close the session with `code` and `reason`."""

    def __init__(self, code: int, reason: str) -> None:
        super().__init__(reason)
        self.code = code
        self.reason = reason


def _pv(reason: str) -> _Violation:
    return _Violation(SessionError.PROTOCOL_VIOLATION, reason)


def count_ranges(params: Parameters) -> int:
    """Total Ranges in all Range Filter parameters, FILL_PARAMETERS' included (profile §7.5)."""
    total = 0
    for p in params:
        if isinstance(p.value, RangeFilter):
            total += len(p.value.ranges)
        elif isinstance(p.value, FillParameters):
            total += count_ranges(p.value.params)
    return total


def _default_priority(properties: Iterable[KeyValuePair]) -> int:
    """DEFAULT_PUBLISHER_PRIORITY of a track (absent = 128, profile §8)."""
    values = find_kvp(properties, PropertyType.DEFAULT_PUBLISHER_PRIORITY)
    return values[0] if values and isinstance(values[0], int) else 128


def unknown_mandatory_properties(properties: Iterable[KeyValuePair]) -> list[int]:
    """Mandatory Track Property types (0x4000-0x7FFF) this implementation does not understand (§8):
    none is assigned, so every one present is unknown."""
    return [kv.type for kv in properties if is_mandatory_track_property(kv.type)]


def _range_filter_problem(params: Parameters) -> str | None:
    seen: set[tuple[int, int | None, int | None]] = set()
    for p in params:
        value = p.value
        if isinstance(value, FillParameters):
            inner = _range_filter_problem(value.params)
            if inner:
                return "FILL_PARAMETERS: " + inner
        if isinstance(value, RangeFilter):
            problem = value.problem()
            if problem:
                return f"parameter 0x{p.type:x}: {problem}"
            key = (p.type, value.set_id, value.property_type)
            if key in seen:
                return f"two 0x{p.type:x} filters with SetID {value.set_id} (profile §7.2)"
            seen.add(key)
    return None


# ---------------------------------------------------------------------------------------------------


class Session:
    """One MOQT session (profile §4), either role, as a pure state machine.

    Requester API: `subscribe`, `fetch`, `publish_namespace`, `subscribe_namespace`, `subscribe_tracks`,
    `track_status`, `publish`, `request_update`, `cancel`, `finish_request`, `goaway`.
    Responder API: `subscribe_ok`, `request_ok`, `reject`, `fetch_ok`, `send_namespace`,
    `send_namespace_done`, `send_publish_skipped`, `publish_state_notify`, `publish_done`.
    Data API: `open_subgroup`, `write_object`, `open_fetch_stream`, `write_fetch_object`,
    `end_data_stream`, `reset_data_stream`.
    Raw escape hatch (malformed-message checks): `send_raw`, `open_raw_stream`.
    """

    def __init__(self, config: SessionConfig) -> None:
        self.config = config
        self.role = config.role
        self.is_client = config.role is Role.CLIENT
        # Called whenever commands or events were queued (the I/O adapter schedules a flush).
        self.on_pending: Callable[[], None] | None = None
        self.started = False
        self.closed: SessionClosed | None = None
        self.peer_setup: Setup | None = None
        self.goaway_received: Goaway | None = None
        self.goaway_sent = False  # on the control stream; new peer requests may then get GOING_AWAY
        self.control_stream_id: int | None = None
        self.peer_control_stream_id: int | None = None
        self.requests: dict[int, Request] = {}  # by stream id
        self._commands: deque[Command] = deque()
        self._events: deque[Event] = deque()
        base = 0 if self.is_client else 1
        self._next_bidi = base
        self._next_uni = base | 2
        self._next_request_id = base
        self._peer_request_ids: set[int] = set()
        self._local_rids: dict[int, tuple[Request, FillParameters | None]] = {}
        self._alias_requests: dict[int, Request] = {}  # alias -> subscription receiving its data
        self._next_alias = 1
        self._in: dict[int, _InStream] = {}
        self._out: dict[int, _OutData] = {}
        self._raw_streams: set[int] = set()

    # -- plumbing -------------------------------------------------------------------------------------

    def commands(self) -> list[Command]:
        """Drain the transport commands queued so far (in order)."""
        out = list(self._commands)
        self._commands.clear()
        return out

    def events(self) -> list[Event]:
        """Drain the session events queued so far (in order)."""
        out = list(self._events)
        self._events.clear()
        return out

    def has_pending(self) -> bool:
        """Whether commands or events are queued (the adapter skips a send pass when there are none)."""
        return bool(self._commands or self._events)

    def _cmd(self, command: Command) -> None:
        if self.closed is not None and not isinstance(command, CloseConnection):
            return
        self._commands.append(command)
        if self.on_pending is not None:
            self.on_pending()

    def _event(self, event: Event) -> None:
        self._events.append(event)
        if self.on_pending is not None:
            self.on_pending()

    def _new_stream_id(self, unidirectional: bool) -> int:
        if unidirectional:
            sid, self._next_uni = self._next_uni, self._next_uni + 4
        else:
            sid, self._next_bidi = self._next_bidi, self._next_bidi + 4
        return sid

    def next_request_id(self) -> int:
        """Consume this endpoint's next Request ID (client even from 0, server odd from 1; +2)."""
        rid, self._next_request_id = self._next_request_id, self._next_request_id + 2
        return rid

    def _is_local_stream(self, stream_id: int) -> bool:
        return (stream_id & 1) == (0 if self.is_client else 1)

    def _check_open(self) -> None:
        if self.closed is not None:
            raise SessionUsageError(f"session is closed ({self.closed.reason})")

    # -- lifecycle ------------------------------------------------------------------------------------

    def start(self) -> None:
        """Open our control stream and send SETUP (called by the adapter once QUIC is up)."""
        if self.started:
            return
        self.started = True
        if self.config.send_setup:
            self.control_stream_id = self._new_stream_id(True)
            self._cmd(WriteStream(self.control_stream_id, self.config.setup().encode()))

    def close(self, code: int = SessionError.NO_ERROR, reason: str = "") -> None:
        """Close the session (QUIC CONNECTION_CLOSE with a Session Termination code); idempotent."""
        if self.closed is not None:
            return
        self.closed = SessionClosed(int(code), reason, by_peer=False)
        self._cmd(CloseConnection(int(code), reason))
        self._event(self.closed)

    def connection_terminated(self, code: int, reason: str, *, transport: bool = False) -> None:
        """QUIC reported the connection gone (peer close, idle timeout, or our own close completing);
        `transport`: not by an application CONNECTION_CLOSE (see `SessionClosed.transport`)."""
        if self.closed is None:
            self.closed = SessionClosed(code, reason, by_peer=True, transport=transport)
            self._event(self.closed)

    def _guard(self, fn: Callable[[], None]) -> None:
        if self.closed is not None:
            return
        try:
            fn()
        except _Violation as v:
            self.close(v.code, v.reason)
        except MoqtDecodeError as exc:
            self.close(exc.code, str(exc))

    # -- inputs ---------------------------------------------------------------------------------------

    def receive_stream_data(self, stream_id: int, data: bytes, end_stream: bool) -> None:
        """Bytes (and FIN) that arrived on `stream_id`."""
        self._guard(lambda: self._on_stream_data(stream_id, data, end_stream))

    def receive_stream_reset(self, stream_id: int, code: int) -> None:
        """The peer reset its sending side of `stream_id`."""
        self._guard(lambda: self._on_stream_reset(stream_id, code))

    def receive_stop_sending(self, stream_id: int, code: int) -> None:
        """The peer asked us to stop sending on `stream_id`."""
        self._guard(lambda: self._on_stop_sending(stream_id, code))

    def receive_datagram(self, data: bytes) -> None:
        if self.closed is None:
            self._event(DatagramReceived(data))

    # -- stream dispatch ------------------------------------------------------------------------------

    def _on_stream_data(self, stream_id: int, data: bytes, fin: bool) -> None:
        st = self._in.get(stream_id)
        if st is None:
            st = self._in[stream_id] = _InStream(stream_id)
            if not (stream_id & 2):  # bidirectional: a request stream
                st.kind = "request"
                req = self.requests.get(stream_id)
                if req is not None:
                    st.request = req
                    st.control = ControlStreamParser(request_type=req.kind)
                elif self._is_local_stream(stream_id):
                    raise _pv(f"data on stream {stream_id}, a bidirectional stream this endpoint never opened")
                else:
                    st.control = ControlStreamParser(request_stream=True)
        if st.fin:
            return  # QUIC never delivers past FIN; defensive
        st.fin = fin
        if st.kind == "":
            st.buf += data
            if not self._classify(st):
                if fin:
                    raise _pv(f"uni stream {stream_id} ended inside its stream type/header (profile §4.4)")
                return
            data, st.buf = bytes(st.buf), bytearray()
        if st.kind in ("control", "request"):
            self._on_control_bytes(st, data, fin)
        elif st.kind == "padding":
            return
        else:
            self._on_data_bytes(st, data, fin)

    def _classify(self, st: _InStream) -> bool:
        """Decide a uni stream's kind from its first vi64 (and a FETCH_HEADER's Request ID)."""
        try:
            stream_type, pos = decode_vi64(st.buf, 0, "Stream Type")
        except NeedMoreData:
            return False
        classify_uni_stream(stream_type, 0)  # unknown type -> PROTOCOL_VIOLATION (profile §9.1)
        if stream_type == SETUP_STREAM_TYPE:
            if self.peer_control_stream_id is not None:
                raise _pv(f"second control stream {st.stream_id} (the peer's is {self.peer_control_stream_id})")
            self.peer_control_stream_id = st.stream_id
            st.kind = "control"
            st.control = ControlStreamParser()
            return True
        if stream_type == PADDING_STREAM_TYPE:
            st.kind = "padding"
            return True
        order: int = GroupOrder.ASCENDING
        if stream_type == FETCH_HEADER_TYPE:
            try:
                rid, _ = decode_vi64(st.buf, pos, "FETCH_HEADER.Request ID")
            except NeedMoreData:
                return False
            entry = self._local_rids.get(rid)
            if entry is None:
                raise _pv(f"FETCH_HEADER on stream {st.stream_id}: Request ID {rid} names no FETCH, SUBSCRIBE or "
                          "REQUEST_UPDATE of this endpoint (profile §9.4)")
            req, fill = entry
            st.request = req
            if req.kind == MessageType.FETCH:
                st.kind = "fetch"
            else:
                st.kind = "fill"
                if rid in req.fill_streams:
                    raise _pv(f"second fill stream {st.stream_id} for Request ID {rid} (first: "
                              f"{req.fill_streams[rid]}); one per carrying message (profile §11.4)")
                req.fill_streams[rid] = st.stream_id
            order = req.group_order(fill)
        else:
            st.kind = "subgroup"
        st.data = DataStreamParser(group_order=order)
        return True

    # -- control and request streams ------------------------------------------------------------------

    def _on_control_bytes(self, st: _InStream, data: bytes, fin: bool) -> None:
        assert st.control is not None
        try:
            messages = st.control.feed(data)
        except MoqtDecodeError as exc:
            where = "control stream" if st.kind == "control" else "request stream"
            raise _Violation(exc.code, f"{where} {st.stream_id}: {exc}") from exc
        for msg in messages:
            if st.kind == "control":
                self._on_control_message(st, msg)
            else:
                self._on_request_stream_message(st, msg)
            if self.closed is not None:
                return
        if fin:
            if st.kind == "control":
                raise _pv(f"peer closed its control stream {st.stream_id} with FIN (profile §4.1)")
            try:
                st.control.end_of_stream()
            except MoqtDecodeError as exc:
                raise _pv(f"request stream {st.stream_id}: {exc} (profile §4.4)") from exc
            if st.request is not None:
                self._on_request_fin(st.request)

    def _on_control_message(self, st: _InStream, msg: ControlMessage) -> None:
        if self.peer_setup is None:  # the first message (a rejected SETUP has closed the session)
            if not isinstance(msg, Setup):
                raise _pv(f"control stream {st.stream_id} starts with {type(msg).__name__}, not SETUP (profile §4.1)")
            self._on_setup(msg)
            return
        if isinstance(msg, Setup):
            raise _pv(f"second SETUP on control stream {st.stream_id} (profile §4.1)")
        if not isinstance(msg, Goaway):
            raise _pv(f"{type(msg).__name__} on control stream {st.stream_id}; after SETUP only GOAWAY is allowed "
                      "(profile §4.1)")
        if self.goaway_received is not None:
            raise _pv("second GOAWAY on the control stream (profile §6.2)")
        self._check_goaway(msg)
        self.goaway_received = msg
        self._event(GoawayReceived(None, msg))

    def _check_goaway(self, msg: Goaway) -> None:
        if not self.is_client and msg.new_session_uri:
            raise _pv("GOAWAY.New Session URI is non-empty but clients send it empty (profile §6.2)")

    def _on_setup(self, setup: Setup) -> None:
        if self.is_client:
            if setup.path is not None:
                raise _Violation(SessionError.INVALID_PATH, "SETUP.PATH sent by the server (client only, profile §5)")
            if setup.authority is not None:
                raise _Violation(SessionError.INVALID_AUTHORITY,
                                 "SETUP.AUTHORITY sent by the server (client only, profile §5)")
        else:
            self._check_path(setup.path)
            self._check_authority(setup.authority)
        impl = setup.implementation
        if impl is not None:
            try:
                impl.decode("utf-8")
            except UnicodeDecodeError as exc:
                raise _Violation(SessionError.KEY_VALUE_FORMATTING_ERROR,
                                 f"SETUP.MOQT_IMPLEMENTATION is not UTF-8 at byte {exc.start} (profile §5)") from exc
        try:
            tokens = setup.auth_tokens()
        except MoqtDecodeError as exc:
            raise _Violation(SessionError.KEY_VALUE_FORMATTING_ERROR, f"SETUP: {exc}") from exc
        if not self.is_client:
            for tok in tokens:
                if tok.alias_type in (AuthAliasType.DELETE, AuthAliasType.USE_ALIAS):
                    raise _pv(f"SETUP.AUTHORIZATION TOKEN with Alias Type {AuthAliasType(tok.alias_type).name} "
                              "(a server MUST NOT accept DELETE/USE_ALIAS in SETUP, profile §3.6)")
        self.peer_setup = setup
        self._event(SetupReceived(setup))

    def _check_path(self, path: bytes | None) -> None:
        if path is None:
            return
        try:
            text = path.decode("ascii")
        except UnicodeDecodeError as exc:
            raise _Violation(SessionError.MALFORMED_PATH, f"SETUP.PATH byte {exc.start} is not ASCII") from exc
        if (text and not text.startswith("/")) or any(c in text for c in " #\r\n\t"):
            raise _Violation(SessionError.MALFORMED_PATH,
                             f"SETUP.PATH {text!r} is not path-abempty [?query] (profile §5)")
        accepted = self.config.accept_paths
        if accepted is not None and text not in accepted:
            raise _Violation(SessionError.INVALID_PATH, f"SETUP.PATH {text!r} is not served here (profile §5)")

    def _check_authority(self, authority: bytes | None) -> None:
        if authority is None:
            return
        try:
            text = authority.decode("ascii")
            parts = urlsplit("//" + text)
            ok = bool(parts.hostname) and parts.username is None and not parts.path and (parts.port or 0) >= 0
        except (UnicodeDecodeError, ValueError):
            ok = False
            text = repr(authority)
        if not ok:
            raise _Violation(SessionError.MALFORMED_AUTHORITY, f"SETUP.AUTHORITY {text!r} is not host[:port]")
        accepted = self.config.accept_authorities
        if accepted is not None and text not in accepted:
            raise _Violation(SessionError.INVALID_AUTHORITY, f"SETUP.AUTHORITY {text!r} is not served here")

    def _on_request_stream_message(self, st: _InStream, msg: ControlMessage) -> None:
        req = st.request
        if req is None:  # the first message of a peer-opened request stream
            self._on_new_request(st, msg)
            return
        if isinstance(req.message, RawRequestMessage):  # we sent garbage: report, do not judge the answer
            self._event(MessageReceived(st.stream_id, req, msg))
            return
        event = _event_of(req, msg)
        if event is None:
            raise _pv(f"{type(msg).__name__} is not allowed on request stream {st.stream_id} "
                      f"({MessageType(req.kind).name}, profile §4.4)")
        crossed = req.state is RequestState.CANCELLED  # after our cancellation: not judged, not applied
        self._advance(req, event, by_peer=True)
        if isinstance(msg, Goaway):
            if req.goaway_received:
                raise _pv(f"second GOAWAY on request stream {st.stream_id} (profile §6.2)")
            self._check_goaway(msg)
            req.goaway_received = True
            self._event(GoawayReceived(st.stream_id, msg))
            return
        if not crossed:
            self._apply_peer_message(req, msg, event)
        self._event(MessageReceived(st.stream_id, req, msg))

    def _apply_peer_message(self, req: Request, msg: ControlMessage, event: RequestEvent) -> None:
        """What an accepted message changes beyond the state, and the content checks with their own codes."""
        if isinstance(msg, RequestUpdate):
            self._on_peer_update(req, msg)
        elif isinstance(msg, RequestOk | RequestError):
            self._on_ok_or_error(req, msg, event)
        elif isinstance(msg, SubscribeOk):
            self._on_subscribe_ok(req, msg)
        elif isinstance(msg, FetchOk):
            self._on_fetch_ok(req, msg)
        elif isinstance(msg, Namespace | NamespaceDone):
            suffix = msg.track_namespace_suffix
            if isinstance(msg, NamespaceDone):
                if suffix not in req.namespaces:
                    again = " (again: it was done already)" if suffix in req.namespaces_done else ""
                    raise _pv(f"NAMESPACE_DONE for {suffix} that no NAMESPACE has announced{again} on stream "
                              f"{req.stream_id} (profile §6.2)")
                req.namespaces_done.add(suffix)
                req.namespaces.discard(suffix)
            else:
                req.namespaces.add(suffix)
                req.namespaces_done.discard(suffix)

    def _next(self, req: Request, event: RequestEvent, *, by_peer: bool) -> RequestState:
        """The lifecycle table's cell for `event`, or its refusal: a peer's event closes the session with
        the cell's code, our own is a usage error (and nothing is sent)."""
        sender = req.peer_side if by_peer else req.side
        try:
            return transition(req.kind, sender, event, req.state)
        except LifecycleError as exc:
            if by_peer:
                raise _Violation(exc.code, f"{exc} on request stream {req.stream_id}") from exc
            raise SessionUsageError(f"stream {req.stream_id}: {exc}") from exc

    def _advance(self, req: Request, event: RequestEvent, *, by_peer: bool) -> None:
        """The one place a request's state changes."""
        req.state = self._next(req, event, by_peer=by_peer)

    def _check_peer_request_id(self, rid: int, stream_id: int) -> None:
        if rid % 2 != (1 if self.is_client else 0):
            who = "server" if self.is_client else "client"
            raise _Violation(SessionError.INVALID_REQUEST_ID,
                             f"Request ID {rid} on stream {stream_id} has the wrong parity for a {who} (profile §4.3)")
        if rid in self._peer_request_ids:
            raise _Violation(SessionError.INVALID_REQUEST_ID,
                             f"Request ID {rid} on stream {stream_id} is a duplicate (profile §4.3)")
        self._peer_request_ids.add(rid)

    def _on_new_request(self, st: _InStream, msg: ControlMessage) -> None:
        rid = getattr(msg, "request_id", None)
        assert isinstance(rid, int)  # ControlStreamParser admits only request messages here
        self._check_peer_request_id(rid, st.stream_id)
        req = Request(st.stream_id, rid, msg, local=False)
        st.request = req
        self.requests[st.stream_id] = req
        if isinstance(msg, Publish):
            self._bind_alias(req, msg.track_alias)
            req.track_properties = msg.track_properties
            largest = msg.parameters.get(ParamType.LARGEST_OBJECT)
            req.largest = largest if isinstance(largest, Location) else None
        problem = self._filter_problem(req.parameters)
        code = RequestErrorCode.INVALID_FILTER  # profile §7.5
        if problem is None and isinstance(msg, Publish):
            mandatory = unknown_mandatory_properties(msg.track_properties)
            if mandatory:
                code = RequestErrorCode.UNSUPPORTED_EXTENSION  # profile §8
                problem = f"PUBLISH.Track Properties: unknown Mandatory Track Property 0x{mandatory[0]:x}"
        if problem is not None:
            self.reject(st.stream_id, code, problem)
            self._event(RequestAutoRejected(st.stream_id, msg, code, problem))
            return
        self._event(RequestReceived(st.stream_id, req, msg))

    def _filter_problem(self, params: Parameters) -> str | None:
        ranges = count_ranges(params)
        allowed = self.config.max_filter_ranges or 0
        if ranges > allowed:
            return f"{ranges} Range Filter ranges but this endpoint's MAX_FILTER_RANGES is {allowed} (profile §7.5)"
        return _range_filter_problem(params)

    def _on_peer_update(self, req: Request, msg: RequestUpdate) -> None:
        self._check_peer_request_id(msg.request_id, req.stream_id)
        limit = self.config.max_request_updates or 0
        if limit and len(req.pending_updates) >= limit:
            raise _Violation(SessionError.TOO_MANY_REQUEST_UPDATES,
                             f"REQUEST_UPDATE {msg.request_id} on stream {req.stream_id}: "
                             f"{len(req.pending_updates)} unanswered, MAX_REQUEST_UPDATES is {limit} (profile §4.4)")
        req.pending_updates.append(msg.request_id)
        priority = msg.parameters.get(ParamType.SUBSCRIBER_PRIORITY)
        if isinstance(priority, int):
            req.priority_update = priority

    def _on_ok_or_error(self, req: Request, msg: RequestOk | RequestError, event: RequestEvent) -> None:
        name = type(msg).__name__
        if event in (RequestEvent.REQUEST_OK, RequestEvent.REQUEST_ERROR):  # answers the request itself
            if req.response is None:
                req.response = msg
            if isinstance(msg, RequestOk) and req.kind == MessageType.TRACK_STATUS:
                req.largest = msg.largest_object
                req.track_properties = msg.track_properties
            return
        if not req.pending_updates:
            raise _pv(f"{name} on stream {req.stream_id} answers no outstanding REQUEST_UPDATE (profile §4.4)")
        req.pending_updates.popleft()
        if isinstance(msg, RequestOk) and msg.largest_object is not None:
            req.largest = msg.largest_object

    def _on_subscribe_ok(self, req: Request, msg: SubscribeOk) -> None:
        track = req.track
        other = self._alias_requests.get(msg.track_alias)
        if other is not None and other is not req and other.state is RequestState.ESTABLISHED and other.track != track:
            raise _Violation(SessionError.DUPLICATE_TRACK_ALIAS,
                             f"SUBSCRIBE_OK on stream {req.stream_id}: Track Alias {msg.track_alias} already names "
                             f"another track's subscription (stream {other.stream_id}, profile §6.2)")
        req.response = msg
        req.largest = msg.largest_object
        req.track_properties = msg.track_properties
        self._bind_alias(req, msg.track_alias)

    def _bind_alias(self, req: Request, alias: int) -> None:
        req.track_alias = alias
        self._alias_requests.setdefault(alias, req)
        if self._alias_requests[alias].state is not RequestState.ESTABLISHED:
            self._alias_requests[alias] = req
        # Release subgroup streams that arrived before the alias was known (profile §4.1).
        for st in list(self._in.values()):
            if st.kind == "subgroup" and st.alias == alias and st.request is None:
                st.request = req
                held, st.held = st.held, []
                for item in held:
                    self._emit_data(st, item)
                if st.held_end is not None:
                    self._end_data(st, st.held_end[1])

    def _on_fetch_ok(self, req: Request, msg: FetchOk) -> None:
        flt = req.location_filter
        if flt is not None and flt.type not in (LocationFilterType.RELATIVE_START, LocationFilterType.NEXT_OBJECT):
            start = flt.start(None)
            if msg.end_location < start:
                raise _pv(f"FETCH_OK.End Location {msg.end_location} on stream {req.stream_id} is before the "
                          f"requested start {start} (profile §6.2)")
        req.response = msg
        req.track_properties = msg.track_properties

    def _on_request_fin(self, req: Request) -> None:
        req.peer_fin = True
        self._advance(req, RequestEvent.FIN, by_peer=True)  # before a required message: failed (§4.4)
        if req.local and req.kind == MessageType.SUBSCRIBE_NAMESPACE:
            req.namespaces.clear()  # FIN = NAMESPACE_DONE for all (profile §6.2)
        self._event(RequestStreamEnded(req.stream_id, req, None))

    # -- data streams ---------------------------------------------------------------------------------

    def _on_data_bytes(self, st: _InStream, data: bytes, fin: bool) -> None:
        assert st.data is not None
        try:
            items = st.data.feed(data)
            if fin:
                st.data.end_of_stream()
        except MoqtDecodeError as exc:
            raise _Violation(exc.code, f"{st.kind} stream {st.stream_id}: {exc}") from exc
        for item in items:
            if isinstance(item, SubgroupHeader):
                st.alias = item.track_alias
                st.request = self._alias_requests.get(item.track_alias)
            if st.kind == "subgroup" and st.request is None:
                st.held.append(item)  # the alias is not known yet: buffer (profile §4.1)
            else:
                self._emit_data(st, item)
        if fin:
            if st.kind == "subgroup" and st.request is None:
                st.held_end = (True, None)
            else:
                self._end_data(st, None)

    def _emit_data(self, st: _InStream, item: SubgroupHeader | SubgroupObject | FetchHeader | FetchObject
                   | EndOfRange) -> None:
        if isinstance(item, SubgroupHeader | FetchHeader):
            self._event(DataStreamOpened(st.stream_id, st.kind, st.request, item))
            return
        self._event(ObjectReceived(st.stream_id, st.kind, st.request, item))

    def _end_data(self, st: _InStream, reset_code: int | None) -> None:
        self._event(DataStreamEnded(st.stream_id, st.kind, st.request, reset_code))

    # -- resets ---------------------------------------------------------------------------------------

    def _on_stream_reset(self, stream_id: int, code: int) -> None:
        if stream_id == self.peer_control_stream_id:
            raise _pv(f"peer reset its control stream {stream_id} (code 0x{code:x}, profile §4.1)")
        st = self._in.get(stream_id)
        if st is not None:
            st.fin = True
        req = self.requests.get(stream_id)
        if req is not None:
            req.peer_fin = True
            self._peer_cancelled(req, code)
            self._event(RequestStreamEnded(stream_id, req, code))
            return
        if st is not None and st.kind in ("subgroup", "fetch", "fill"):
            if st.kind == "subgroup" and st.request is None:
                st.held_end = (True, code)
            else:
                self._end_data(st, code)

    def _peer_cancelled(self, req: Request, code: int) -> None:
        """The peer reset (or stopped) a request stream: cancellation (profile §4.4)."""
        if req.state is RequestState.CANCELLED:
            return
        if req.local and req.kind == MessageType.SUBSCRIBE_NAMESPACE:
            req.namespaces.clear()
        self._advance(req, RequestEvent.CANCEL, by_peer=True)
        # The publisher MUST reset every data stream of the subscription, fill streams included.
        for sid in list(req.data_streams):
            self.reset_data_stream(sid, StreamResetCode.CANCELLED)
        if not req.sent_fin:
            req.sent_fin = True
            self._cmd(ResetStream(req.stream_id, StreamResetCode.CANCELLED))

    def _on_stop_sending(self, stream_id: int, code: int) -> None:
        if stream_id == self.control_stream_id:
            raise _pv(f"peer sent STOP_SENDING on our control stream {stream_id} (code 0x{code:x}, profile §4.1)")
        out = self._out.get(stream_id)
        if out is not None:
            # STOP_SENDING on a data stream: reset it and do not reopen (profile §9.2).
            self.reset_data_stream(stream_id, code)
        req = self.requests.get(stream_id)
        if req is not None:
            self._advance(req, RequestEvent.CANCEL, by_peer=True)  # either half of a cancellation (§4.4)
        if req is not None and not req.sent_fin:
            req.sent_fin = True
            self._cmd(ResetStream(stream_id, code))
            for sid in list(req.data_streams):
                self.reset_data_stream(sid, StreamResetCode.CANCELLED)
        self._event(StopSendingReceived(stream_id, code))

    # -- requester API --------------------------------------------------------------------------------

    def _open_request(self, message: ControlMessage, request_id: int, end_stream: bool = False) -> Request:
        self._check_open()
        sid = self._new_stream_id(False)
        req = Request(sid, request_id, message, local=True)
        self.requests[sid] = req
        self._local_rids[request_id] = (req, None)
        fill = req.parameters.get(ParamType.FILL_PARAMETERS)
        if isinstance(fill, FillParameters):
            self._local_rids[request_id] = (req, fill)
        req.sent_fin = end_stream
        self._cmd(WriteStream(sid, message.encode(), end_stream))
        return req

    def _check_peer_ranges(self, params: Parameters, what: str) -> None:
        ranges = count_ranges(params)
        limit = self.peer_setup.max_filter_ranges if self.peer_setup is not None else 0
        if ranges > limit:
            raise SessionUsageError(f"{what}: {ranges} Range Filter ranges but the peer's MAX_FILTER_RANGES is "
                                    f"{limit} (profile §5, §7.5)")

    def _check_goaway_sent(self, what: str) -> None:
        if self.goaway_received is not None:
            raise SessionUsageError(f"{what}: the peer sent GOAWAY; no new requests (profile §6.2)")

    def subscribe(self, namespace: TrackNamespace, name: bytes, parameters: Parameters = NO_PARAMETERS) -> Request:
        """Open a request stream with SUBSCRIBE (profile §6.2, §11). FILL_PARAMETERS asks for a fill stream."""
        self._check_goaway_sent("SUBSCRIBE")
        self._check_peer_ranges(parameters, "SUBSCRIBE")
        return self._open_track_request(Subscribe, namespace, name, parameters)

    def _open_track_request(self, cls: type[Subscribe], namespace: TrackNamespace, name: bytes,
                            parameters: Parameters, end_stream: bool = False) -> Request:
        rid = self.next_request_id()
        return self._open_request(cls(rid, namespace, name, parameters), rid, end_stream)

    def fetch(self, namespace: TrackNamespace, name: bytes, parameters: Parameters = NO_PARAMETERS) -> Request:
        """Open a request stream with FETCH; the range is LOCATION_FILTER (profile §6.2, §7.3)."""
        self._check_goaway_sent("FETCH")
        self._check_peer_ranges(parameters, "FETCH")
        return self._open_track_request(Fetch, namespace, name, parameters)

    def track_status(self, namespace: TrackNamespace, name: bytes, parameters: Parameters = NO_PARAMETERS) -> Request:
        """TRACK_STATUS (its only message, so the stream is FINed with it, profile §4.4)."""
        self._check_goaway_sent("TRACK_STATUS")
        return self._open_track_request(TrackStatus, namespace, name, parameters, end_stream=True)

    def publish_namespace(self, namespace: TrackNamespace, parameters: Parameters = NO_PARAMETERS) -> Request:
        """PUBLISH_NAMESPACE; withdrawn later with `cancel` (there is no _DONE message, profile §4.4)."""
        self._check_goaway_sent("PUBLISH_NAMESPACE")
        rid = self.next_request_id()
        return self._open_request(PublishNamespace(rid, namespace, parameters), rid)

    def subscribe_namespace(self, prefix: TrackNamespace, parameters: Parameters = NO_PARAMETERS) -> Request:
        """SUBSCRIBE_NAMESPACE; the answer is REQUEST_OK then NAMESPACE / NAMESPACE_DONE (profile §4.4)."""
        self._check_goaway_sent("SUBSCRIBE_NAMESPACE")
        rid = self.next_request_id()
        return self._open_request(SubscribeNamespace(rid, prefix, parameters), rid)

    def subscribe_tracks(self, prefix: TrackNamespace, parameters: Parameters = NO_PARAMETERS) -> Request:
        """SUBSCRIBE_TRACKS: REQUEST_OK, then PUBLISH on new streams / PUBLISH_SKIPPED here (profile §4.4)."""
        self._check_goaway_sent("SUBSCRIBE_TRACKS")
        self._check_peer_ranges(parameters, "SUBSCRIBE_TRACKS")
        rid = self.next_request_id()
        return self._open_request(SubscribeTracks(rid, prefix, parameters), rid)

    def publish(self, namespace: TrackNamespace, name: bytes, parameters: Parameters = NO_PARAMETERS,
                track_properties: tuple[KeyValuePair, ...] = (), track_alias: int | None = None) -> Request:
        """PUBLISH: a publisher-initiated subscription (profile §6.2); data may follow at once."""
        self._check_goaway_sent("PUBLISH")
        rid = self.next_request_id()
        alias = self._allocate_alias() if track_alias is None else track_alias
        req = self._open_request(Publish(rid, namespace, name, alias, parameters, track_properties), rid)
        req.track_alias = alias
        req.track_properties = track_properties
        return req  # PENDING until PUBLISH_OK, objects may flow meanwhile (`Request.publishing`, profile §6.2)

    def request_update(self, stream_id: int, parameters: Parameters) -> int:
        """REQUEST_UPDATE on a request stream; returns its (new) Request ID (profile §4.3, §4.4).

        With FILL_PARAMETERS on a subscription it asks for a fill stream carrying this Request ID.
        """
        req = self._request(stream_id)
        self._next(req, RequestEvent.REQUEST_UPDATE, by_peer=False)  # refused before a Request ID is spent
        if req.sent_fin:
            raise SessionUsageError(f"request stream {stream_id} is already finished or reset")
        self._check_peer_ranges(parameters, "REQUEST_UPDATE")
        limit = self.peer_setup.max_request_updates if self.peer_setup is not None else 0
        if limit and len(req.pending_updates) >= limit:
            raise SessionUsageError(f"{len(req.pending_updates)} REQUEST_UPDATEs unanswered on stream {stream_id}; "
                                    f"the peer's MAX_REQUEST_UPDATES is {limit} (profile §4.4)")
        rid = self.next_request_id()
        data = RequestUpdate(rid, parameters).encode_for(MessageType.SUBSCRIBE if req.kind == MessageType.PUBLISH
                                                          else req.kind)
        fill = parameters.get(ParamType.FILL_PARAMETERS)
        self._local_rids[rid] = (req, fill if isinstance(fill, FillParameters) else None)
        req.pending_updates.append(rid)
        self._send(req, RequestEvent.REQUEST_UPDATE, data)
        return rid

    def cancel(self, stream_id: int, code: int = StreamResetCode.CANCELLED) -> None:
        """Cancel a request: RESET_STREAM our side, STOP_SENDING theirs (profile §4.4).

        Unsubscribe = cancel the SUBSCRIBE stream; withdraw a namespace = cancel PUBLISH_NAMESPACE. As a
        publisher, every data stream of the request (fill streams included) is reset too.
        """
        req = self._request(stream_id)
        self._advance(req, RequestEvent.CANCEL, by_peer=False)
        if not req.sent_fin:
            self._cmd(ResetStream(stream_id, code))
        req.sent_fin = True
        if not req.peer_fin:
            self._cmd(StopSending(stream_id, code))
        for sid in list(req.data_streams):
            self.reset_data_stream(sid, StreamResetCode.CANCELLED)

    def finish_request(self, stream_id: int) -> None:
        """FIN our sending side of a request stream ("nothing more from me", not a cancellation)."""
        self._send(self._request(stream_id), RequestEvent.FIN, b"", end_stream=True)

    def goaway(self, new_session_uri: bytes = b"", timeout_ms: int = 0, stream_id: int | None = None) -> None:
        """GOAWAY on the control stream (session migration) or on one request stream (profile §6.2)."""
        self._check_open()
        if self.is_client and new_session_uri:
            raise SessionUsageError("a client sends GOAWAY with an empty New Session URI (profile §6.2)")
        data = Goaway(new_session_uri, timeout_ms).encode()
        if stream_id is None:
            if self.control_stream_id is None:
                raise SessionUsageError("no control stream (send_setup=False)")
            if self.goaway_sent:
                raise SessionUsageError("GOAWAY was already sent on the control stream (profile §6.2)")
            self.goaway_sent = True
            self._cmd(WriteStream(self.control_stream_id, data))
        else:
            self._send(self._request(stream_id), RequestEvent.GOAWAY, data)

    # -- responder API --------------------------------------------------------------------------------

    def _request(self, stream_id: int) -> Request:
        self._check_open()
        req = self.requests.get(stream_id)
        if req is None:
            raise SessionUsageError(f"stream {stream_id} is not a request stream of this session")
        return req

    def _send(self, req: Request, event: RequestEvent, data: bytes, end_stream: bool = False) -> None:
        """Write one message (or FIN) of ours that moves the request: the table allows it or nothing is sent."""
        after = self._next(req, event, by_peer=False)
        if req.sent_fin:
            raise SessionUsageError(f"request stream {req.stream_id} is already finished or reset")
        req.state = after
        req.sent_fin = end_stream
        self._cmd(WriteStream(req.stream_id, data, end_stream))

    def _answer_event(self, req: Request, ok: bool) -> RequestEvent:
        """Whether our next OK/ERROR answers the request itself or the oldest outstanding update."""
        event = answer_event(req.kind, ok, req.side, req.state)
        self._next(req, event, by_peer=False)
        if event in (RequestEvent.UPDATE_OK, RequestEvent.UPDATE_ERROR) and not req.pending_updates:
            raise SessionUsageError(f"nothing to answer on stream {req.stream_id} ({req.state.value}, no update)")
        return event

    def _allocate_alias(self) -> int:
        while self._next_alias in self._alias_requests or any(
                o.track_alias == self._next_alias for o in self.requests.values() if not o.local or
                o.kind == MessageType.PUBLISH):
            self._next_alias += 1
        alias, self._next_alias = self._next_alias, self._next_alias + 1
        return alias

    def subscribe_ok(self, stream_id: int, *, largest: Location | None = None, track_alias: int | None = None,
                     expires_ms: int = 0, track_properties: tuple[KeyValuePair, ...] = ()) -> int:
        """Answer a SUBSCRIBE; returns the Track Alias. LARGEST_OBJECT is REQUIRED if anything was
        published (profile §6.2), so pass `largest` whenever the track has objects."""
        req = self._request(stream_id)
        self._next(req, RequestEvent.SUBSCRIBE_OK, by_peer=False)  # before an alias is spent
        alias = self._allocate_alias() if track_alias is None else track_alias
        params: list[tuple[int, object]] = []
        if expires_ms:
            params.append((ParamType.EXPIRES, expires_ms))
        if largest is not None:
            params.append((ParamType.LARGEST_OBJECT, largest))
        msg = SubscribeOk(alias, Parameters.of(*params), track_properties)  # type: ignore[arg-type]
        self._send(req, RequestEvent.SUBSCRIBE_OK, msg.encode())
        req.response = msg
        req.track_alias = alias
        req.largest = largest
        req.track_properties = track_properties
        return alias

    def request_ok(self, stream_id: int, parameters: Parameters = NO_PARAMETERS,
                   track_properties: tuple[KeyValuePair, ...] = ()) -> None:
        """REQUEST_OK: answers PUBLISH_NAMESPACE / SUBSCRIBE_NAMESPACE / TRACK_STATUS (then FIN) / PUBLISH,
        or the oldest outstanding REQUEST_UPDATE (profile §4.4)."""
        req = self._request(stream_id)
        event = self._answer_event(req, ok=True)
        first = event is RequestEvent.REQUEST_OK
        if track_properties and not (first and req.kind == MessageType.TRACK_STATUS):
            raise SessionUsageError("Track Properties only in TRACK_STATUS_OK (profile §6.2)")
        msg = RequestOk(parameters, track_properties)
        if first:
            self._send(req, event, msg.encode(), end_stream=req.kind == MessageType.TRACK_STATUS)
            req.response = msg
        else:
            self._send(req, event, msg.encode())
            req.pending_updates.popleft()

    def reject(self, stream_id: int, code: int, reason: str = "", retry_interval: int = 0,
               redirect: Redirect | None = None) -> None:
        """REQUEST_ERROR: refuses the request itself (then FIN) or the oldest outstanding update."""
        req = self._request(stream_id)
        event = self._answer_event(req, ok=False)
        msg = RequestError(code, retry_interval, reason.encode()[:1024], redirect)
        if event is RequestEvent.REQUEST_ERROR:
            self._send(req, event, msg.encode(), end_stream=True)
            req.response = msg
        else:
            self._send(req, event, msg.encode())
            req.pending_updates.popleft()

    def fetch_ok(self, stream_id: int, end_location: Location, *, end_of_track: bool = False,
                 track_properties: tuple[KeyValuePair, ...] = ()) -> None:
        """FETCH_OK with the inclusive End Location (profile §6.2)."""
        req = self._request(stream_id)
        msg = FetchOk(1 if end_of_track else 0, end_location, Parameters(), track_properties)
        self._send(req, RequestEvent.FETCH_OK, msg.encode())
        req.response = msg

    def send_namespace(self, stream_id: int, suffix: TrackNamespace) -> None:
        """NAMESPACE on an answered SUBSCRIBE_NAMESPACE stream (the fields after the prefix)."""
        req = self._request(stream_id)
        self._send(req, RequestEvent.NAMESPACE, Namespace(suffix).encode())
        req.namespaces.add(suffix)

    def send_namespace_done(self, stream_id: int, suffix: TrackNamespace) -> None:
        """NAMESPACE_DONE for a suffix previously announced with NAMESPACE (profile §6.2)."""
        req = self._request(stream_id)
        self._next(req, RequestEvent.NAMESPACE_DONE, by_peer=False)
        if suffix not in req.namespaces:
            raise SessionUsageError(f"NAMESPACE_DONE for {suffix} which was never announced on stream {stream_id}")
        self._send(req, RequestEvent.NAMESPACE_DONE, NamespaceDone(suffix).encode())
        req.namespaces.discard(suffix)

    def send_publish_skipped(self, stream_id: int, suffix: TrackNamespace, name: bytes) -> None:
        """PUBLISH_SKIPPED on an answered peer SUBSCRIBE_TRACKS stream (profile §6.2)."""
        self._send(self._request(stream_id), RequestEvent.PUBLISH_SKIPPED, PublishSkipped(suffix, name).encode())

    def publish_state_notify(self, stream_id: int, parameters: Parameters) -> None:
        self._send(self._request(stream_id), RequestEvent.PUBLISH_STATE_NOTIFY, PublishStateNotify(parameters).encode())

    def _publisher_side(self, stream_id: int) -> Request:
        req = self._request(stream_id)
        if not req.publishing:
            raise SessionUsageError(f"stream {stream_id} ({MessageType(req.kind).name}, {req.state.value}) is not a "
                                    "live subscription this endpoint publishes (lifecycle.sends_objects)")
        return req

    def publish_done(self, stream_id: int, status: int, reason: str = "", stream_count: int | None = None) -> None:
        """PUBLISH_DONE then FIN. Stream Count defaults to the data streams opened for the subscription,
        fill streams included (profile §6.2); send it only after they are all closed."""
        req = self._request(stream_id)
        count = req.streams_opened if stream_count is None else stream_count
        self._send(req, RequestEvent.PUBLISH_DONE, PublishDone(status, count, reason.encode()[:1024]).encode(),
                   end_stream=True)

    # -- data API (publisher side) --------------------------------------------------------------------

    def open_subgroup(self, stream_id: int, group_id: int, subgroup_id: int = 0, publisher_priority: int | None = 128,
                      *, first_object: bool = True, end_of_group: bool = False, properties: bool = False) -> int:
        """Open a subgroup stream for the subscription on request stream `stream_id` (profile §9.2);
        returns the data stream id. The original publisher sets FIRST_OBJECT on a new subgroup."""
        req = self._publisher_side(stream_id)
        assert req.track_alias is not None
        header = SubgroupHeader.build(req.track_alias, group_id, subgroup_id, publisher_priority,
                                      properties=properties, end_of_group=end_of_group, first_object=first_object)
        writer = SubgroupStreamWriter(header)
        sid = self._open_data(req)
        prio = publisher_priority if publisher_priority is not None else _default_priority(req.track_properties)
        self._out[sid] = _OutData(sid, req, subgroup=writer, group=group_id, publisher_priority=prio)
        self._cmd(WriteStream(sid, writer.header()))
        return sid

    def _open_data(self, req: Request) -> int:
        sid = self._new_stream_id(True)
        req.data_streams.add(sid)
        req.streams_opened += 1
        return sid

    def write_object(self, stream_id: int, object_id: int, payload: bytes = b"", *, status: int = ObjectStatus.NORMAL,
                     properties: bytes = b"", end_stream: bool = False) -> None:
        """One object on a subgroup stream (ascending Object IDs; a status object has no payload)."""
        out = self._data_out(stream_id)
        if out.subgroup is None:
            raise SessionUsageError(f"stream {stream_id} is a fetch stream; use write_fetch_object")
        data = out.subgroup.object(SubgroupObject(object_id, payload, status, properties))
        self._write_data(out, data, end_stream)

    def open_fetch_stream(self, stream_id: int, request_id: int | None = None) -> int:
        """Open the data stream answering a FETCH, or a fill stream (`request_id` = the SUBSCRIBE's or the
        REQUEST_UPDATE's that carried FILL_PARAMETERS, profile §11.2). Returns the data stream id."""
        req = self._request(stream_id)
        rid = req.request_id if request_id is None else request_id
        if req.local or req.kind not in (MessageType.FETCH, MessageType.SUBSCRIBE):
            raise SessionUsageError(f"stream {stream_id} is not a peer FETCH or SUBSCRIBE")
        order = req.group_order()
        writer = FetchStreamWriter(rid, order)
        sid = self._open_data(req)
        self._out[sid] = _OutData(sid, req, fetch=writer)
        self._cmd(WriteStream(sid, writer.header()))
        return sid

    def fill_parameters_of(self, request_id: int) -> FillParameters | None:
        """FILL_PARAMETERS of our SUBSCRIBE / REQUEST_UPDATE with `request_id` (None if it had none)."""
        entry = self._local_rids.get(request_id)
        return entry[1] if entry is not None else None

    def fill_group_order(self, stream_id: int, fill: FillParameters | None) -> int:
        """The group order a fill stream for this subscription must use (profile §9.4)."""
        return self._request(stream_id).group_order(fill)

    def open_fill_stream(self, stream_id: int, request_id: int, fill: FillParameters | None) -> int:
        """`open_fetch_stream` with the group order the fill's FILL_PARAMETERS select."""
        sid = self.open_fetch_stream(stream_id, request_id)
        out = self._out[sid]
        assert out.fetch is not None
        out.fetch.group_order = self.fill_group_order(stream_id, fill)
        own = fill.params.get(ParamType.SUBSCRIBER_PRIORITY) if fill is not None else None
        out.subscriber_priority = own if isinstance(own, int) else None
        return sid

    def send_priority(self, stream_id: int) -> tuple[int, int, int, int, int]:
        """Send-order key of one of our streams, lower first (profile §11.1): control, then request
        streams, then data by subscriber priority, publisher priority, group order, and within a group
        fill-delivered before subscription-delivered. The I/O adapter orders QUIC's stream queue by it."""
        if stream_id == self.control_stream_id:
            return (0, 0, 0, 0, 0)
        out = self._out.get(stream_id)
        if out is None:
            return (1, 0, 0, 0, 0)
        req = out.request
        subscriber = out.subscriber_priority if out.subscriber_priority is not None else req.subscriber_priority
        if out.fetch is not None:  # fetch and fill streams: before any subgroup of the same priorities
            return (2, subscriber, 0, 0, 0)
        group = -out.group if req.group_order() == GroupOrder.DESCENDING else out.group
        return (2, subscriber, out.publisher_priority, group, 1)

    def write_fetch_object(self, stream_id: int, item: FetchObject | EndOfRange, *, end_stream: bool = False) -> None:
        """One fetch object (absolute IDs; the writer picks the delta flags) or an End of Range record."""
        out = self._data_out(stream_id)
        if out.fetch is None:
            raise SessionUsageError(f"stream {stream_id} is a subgroup stream; use write_object")
        data = out.fetch.end_of_range(item) if isinstance(item, EndOfRange) else out.fetch.object(item)
        self._write_data(out, data, end_stream)

    def data_streams_of(self, stream_id: int) -> list[int]:
        """Every data stream this endpoint opened for the request on ``stream_id`` (ended ones included): what a
        PUBLISH_DONE counts and must follow (profile §6.2)."""
        return [sid for sid, out in self._out.items() if out.request.stream_id == stream_id]

    def end_data_stream(self, stream_id: int) -> None:
        """FIN a data stream: every object was sent (profile §9.2)."""
        out = self._data_out(stream_id)
        self._write_data(out, b"", True)

    def reset_data_stream(self, stream_id: int, code: int = StreamResetCode.CANCELLED) -> None:
        """RESET_STREAM a data stream (cancellation, timeout, a failed fill, profile §9.2, §11.2)."""
        out = self._out.get(stream_id)
        if out is None or out.finished:
            return
        out.finished = True
        out.request.data_streams.discard(stream_id)
        self._cmd(ResetStream(stream_id, code))

    def data_stream_open(self, stream_id: int) -> bool:
        """Whether our data stream `stream_id` can still be written (not finished, reset or stopped)."""
        out = self._out.get(stream_id)
        return out is not None and not out.finished

    def _data_out(self, stream_id: int) -> _OutData:
        self._check_open()
        out = self._out.get(stream_id)
        if out is None:
            raise SessionUsageError(f"stream {stream_id} is not a data stream of this session")
        if out.finished:
            raise SessionUsageError(f"data stream {stream_id} is already finished or reset")
        return out

    def _write_data(self, out: _OutData, data: bytes, end_stream: bool) -> None:
        if end_stream:
            out.finished = True
            out.request.data_streams.discard(out.stream_id)
        self._cmd(WriteStream(out.stream_id, data, end_stream))

    # -- raw escape hatch -----------------------------------------------------------------------------

    def send_raw(self, stream_id: int, data: bytes, end_stream: bool = False) -> None:
        """Write arbitrary bytes on any of our sendable streams (control, request, data): no checks."""
        self._check_open()
        if stream_id in self.requests and end_stream:
            self.requests[stream_id].sent_fin = True
        self._cmd(WriteStream(stream_id, data, end_stream))

    def open_raw_stream(self, data: bytes, *, unidirectional: bool = False, end_stream: bool = False,
                        track_request: bool = True) -> int:
        """Open a new stream and write `data` verbatim (malformed SETUP, requests, data headers).

        A bidirectional raw stream is tracked as a local request (when `track_request`) so the peer's
        answers surface as `MessageReceived` events; its Request ID is read from `data` when it parses.
        """
        self._check_open()
        sid = self._new_stream_id(unidirectional)
        if not unidirectional and track_request:
            req = Request(sid, -1, _raw_request_message(data), local=True)
            rid = getattr(req.message, "request_id", None)
            if isinstance(rid, int):  # a well-formed request: answers are validated against its type
                req.request_id = rid
                self._local_rids.setdefault(rid, (req, None))
            req.sent_fin = end_stream
            self.requests[sid] = req
        self._raw_streams.add(sid)
        self._cmd(WriteStream(sid, data, end_stream))
        return sid

    def reset_raw(self, stream_id: int, code: int) -> None:
        """RESET_STREAM any of our streams with any code (raw path)."""
        self._check_open()
        self._cmd(ResetStream(stream_id, code))

    def stop_raw(self, stream_id: int, code: int) -> None:
        """STOP_SENDING any readable stream with any code (raw path)."""
        self._check_open()
        self._cmd(StopSending(stream_id, code))

    def send_datagram(self, data: bytes) -> None:
        """A QUIC DATAGRAM, verbatim."""
        self._check_open()
        self._cmd(SendDatagram(data))


# The request-stream messages that move a request, but REQUEST_OK / REQUEST_ERROR (`answer_event`).
_MESSAGE_EVENTS: dict[type[ControlMessage], RequestEvent] = {
    SubscribeOk: RequestEvent.SUBSCRIBE_OK,
    FetchOk: RequestEvent.FETCH_OK,
    RequestUpdate: RequestEvent.REQUEST_UPDATE,
    PublishStateNotify: RequestEvent.PUBLISH_STATE_NOTIFY,
    PublishDone: RequestEvent.PUBLISH_DONE,
    Namespace: RequestEvent.NAMESPACE,
    NamespaceDone: RequestEvent.NAMESPACE_DONE,
    PublishSkipped: RequestEvent.PUBLISH_SKIPPED,
    Goaway: RequestEvent.GOAWAY,
}


def _event_of(req: Request, msg: ControlMessage) -> RequestEvent | None:
    """The lifecycle event of a message the peer sent on `req`'s stream (None: an opening message)."""
    if isinstance(msg, RequestOk | RequestError):
        return answer_event(req.kind, isinstance(msg, RequestOk), req.peer_side, req.state)
    return _MESSAGE_EVENTS.get(type(msg))


class RawRequestMessage(ControlMessage):
    """Stand-in request of a raw request stream whose bytes do not parse as a request: the peer's
    answers are framed and decoded but not checked against a request type."""

    TYPE = MessageType.SUBSCRIBE  # only for framing REQUEST_UPDATE / REQUEST_OK parameter checks

    def encode_body(self) -> bytes:  # pragma: no cover - never encoded
        raise NotImplementedError


def _raw_request_message(data: bytes) -> ControlMessage:
    try:
        msg, _ = parse_control_message(data)
    except MoqtDecodeError:
        return RawRequestMessage()
    return msg if msg.TYPE in REQUEST_MESSAGE_TYPES else RawRequestMessage()
