"""MOQT d22 control messages (profile §4.2, §5, §6, §7.2) as dataclasses.

Each message has ``encode() -> bytes`` (the framed ``Type (vi64), Length (16), Body``; checked) and a
``decode(data)`` classmethod; ``MESSAGE_TYPES`` maps each Message Type to its class, and
``parse_control_message(buf)`` frames one message off a stream buffer.  Requests carry no Request ID in
their responses: the bidi stream identifies the request, so a decoder that knows which request a
stream carries (``request_type``) checks REQUEST_UPDATE / REQUEST_OK parameters against it.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from enum import IntEnum
from typing import ClassVar, Self

from kvconform.moqt.errors import MoqtDecodeError, MoqtEncodeError, NeedMoreData, SessionError
from kvconform.moqt.parameters import Parameters
from kvconform.moqt.structures import (
    AuthToken,
    KeyValuePair,
    Location,
    ParamType,
    SetupOption,
    TrackNamespace,
    check_full_track_name,
    check_properties,
    decode_kvps,
    decode_reason_phrase,
    decode_track_name,
    encode_kvps,
    encode_reason_phrase,
    encode_track_name,
    find_kvp,
)
from kvconform.moqt.vi64 import Reader, encode_vi64

__all__ = [
    "ALLOWED_PARAMS",
    "MAX_GOAWAY_URI",
    "MAX_MESSAGE_LENGTH",
    "MESSAGE_TYPES",
    "REQUEST_MESSAGE_TYPES",
    "REQUEST_OK_ALLOWED",
    "REQUEST_UPDATE_ALLOWED",
    "ControlMessage",
    "ControlStreamParser",
    "Fetch",
    "FetchOk",
    "Goaway",
    "MessageType",
    "Namespace",
    "NamespaceDone",
    "Publish",
    "PublishDone",
    "PublishNamespace",
    "PublishSkipped",
    "PublishStateNotify",
    "Redirect",
    "RequestError",
    "RequestOk",
    "RequestUpdate",
    "Setup",
    "Subscribe",
    "SubscribeNamespace",
    "SubscribeOk",
    "SubscribeTracks",
    "TrackStatus",
    "check_request_id",
    "frame",
    "parse_control_message",
]

MAX_MESSAGE_LENGTH = 0xFFFF
MAX_GOAWAY_URI = 8192


class MessageType(IntEnum):
    """Control Message Types, d20 = d21 = d22 (profile §6.1)."""

    SETUP = 0x2F00
    GOAWAY = 0x10
    SUBSCRIBE = 0x03
    SUBSCRIBE_OK = 0x04
    REQUEST_UPDATE = 0x02
    PUBLISH_STATE_NOTIFY = 0x22
    PUBLISH = 0x1D
    PUBLISH_DONE = 0x0B
    FETCH = 0x16
    FETCH_OK = 0x18
    TRACK_STATUS = 0x0D
    PUBLISH_NAMESPACE = 0x06
    SUBSCRIBE_NAMESPACE = 0x50
    SUBSCRIBE_TRACKS = 0x51
    NAMESPACE = 0x08
    NAMESPACE_DONE = 0x0E
    PUBLISH_SKIPPED = 0x0F
    REQUEST_OK = 0x07
    REQUEST_ERROR = 0x05


# The message types that may open a request stream (profile §4.1); anything else first -> PV.
REQUEST_MESSAGE_TYPES = frozenset({MessageType.TRACK_STATUS, MessageType.SUBSCRIBE, MessageType.PUBLISH,
                                   MessageType.FETCH, MessageType.PUBLISH_NAMESPACE,
                                   MessageType.SUBSCRIBE_NAMESPACE, MessageType.SUBSCRIBE_TRACKS})


def _p(*codes: int) -> frozenset[int]:
    return frozenset(codes)


# Profile §7.2 (d20-d22).  SUBSCRIBE_TRACKS includes 0x21/0x23 per d22 §3.6.2 (profile §13 #12).
ALLOWED_PARAMS: dict[int, frozenset[int]] = {
    MessageType.SUBSCRIBE: _p(0x02, 0x03, 0x04, 0x06, 0x10, 0x20, 0x21, 0x22, 0x23, 0x25, 0x26, 0x27, 0x28,
                              0x32, 0x35),
    MessageType.SUBSCRIBE_OK: _p(0x08, 0x09),
    MessageType.FETCH: _p(0x03, 0x0A, 0x20, 0x21, 0x22, 0x25, 0x26, 0x27, 0x28, 0x35),
    MessageType.FETCH_OK: _p(),
    MessageType.TRACK_STATUS: _p(0x03, 0x35),
    MessageType.PUBLISH: _p(0x02, 0x03, 0x06, 0x08, 0x09, 0x10, 0x20, 0x21, 0x22),
    MessageType.PUBLISH_STATE_NOTIFY: _p(0x09, 0x10, 0x21),
    MessageType.PUBLISH_NAMESPACE: _p(0x03),
    MessageType.SUBSCRIBE_NAMESPACE: _p(0x03),
    MessageType.SUBSCRIBE_TRACKS: _p(0x03, 0x10, 0x21, 0x22, 0x23, 0x25, 0x26, 0x27, 0x28, 0x29, 0x35),
}
# REQUEST_UPDATE, keyed by the message type that opened the request stream.
REQUEST_UPDATE_ALLOWED: dict[int, frozenset[int]] = {
    MessageType.SUBSCRIBE: _p(0x02, 0x03, 0x06, 0x10, 0x20, 0x21, 0x23, 0x25, 0x26, 0x27, 0x28, 0x32),
    MessageType.PUBLISH: _p(0x02, 0x03, 0x06, 0x10, 0x20, 0x21, 0x23, 0x25, 0x26, 0x27, 0x28, 0x32),
    MessageType.FETCH: _p(0x03, 0x20),
    MessageType.PUBLISH_NAMESPACE: _p(0x03),
    MessageType.SUBSCRIBE_NAMESPACE: _p(0x03, 0x34),
    MessageType.SUBSCRIBE_TRACKS: _p(0x03, 0x10, 0x29, 0x34),
}
# REQUEST_OK, keyed by the request type; on every stream but TRACK_STATUS it may also answer an update.
REQUEST_OK_ALLOWED: dict[int, frozenset[int]] = {MessageType.TRACK_STATUS: _p(0x09)}
_REQUEST_OK_DEFAULT = _p(0x08, 0x09)
_UPDATE_UNION = frozenset().union(*REQUEST_UPDATE_ALLOWED.values())


def frame(msg_type: int, body: bytes, length: int | None = None) -> bytes:
    """``Type (vi64), Length (16), Body``; ``length`` overrides the computed one (raw path)."""
    n = len(body) if length is None else length
    if not 0 <= n <= MAX_MESSAGE_LENGTH:
        raise MoqtEncodeError(f"Message Length {n} does not fit the 16-bit field (max {MAX_MESSAGE_LENGTH})")
    return encode_vi64(msg_type) + n.to_bytes(2, "big") + body


def check_request_id(request_id: int, sender_is_client: bool, offset: int = 0) -> None:
    """Clients use even Request IDs, servers odd (profile §4.3); wrong parity -> INVALID_REQUEST_ID."""
    if request_id % 2 != (0 if sender_is_client else 1):
        who = "client" if sender_is_client else "server"
        raise MoqtDecodeError("Request ID", offset, f"{request_id} has the wrong parity for a {who}",
                              SessionError.INVALID_REQUEST_ID)


@dataclass(frozen=True)
class _DecodeContext:
    request_type: int | None = None


class ControlMessage:
    """Base of every control message: ``TYPE``, body codec and framing."""

    TYPE: ClassVar[int]

    def segments(self) -> list[tuple[str, bytes]]:
        """The body as named, checked field encodings in wire order (``craft`` swaps single ones)."""
        raise NotImplementedError

    def encode_body(self) -> bytes:
        return b"".join(v for _, v in self.segments())

    def encode(self) -> bytes:
        return frame(self.TYPE, self.encode_body())

    @classmethod
    def decode_body(cls, r: Reader, ctx: _DecodeContext) -> Self:
        raise NotImplementedError

    @classmethod
    def decode(cls, data: bytes, *, request_type: int | None = None) -> Self:
        """Decode exactly one framed message of this class from ``data``."""
        msg, used = parse_control_message(data, request_type=request_type)
        if not isinstance(msg, cls):
            raise MoqtDecodeError("Message Type", 0, f"expected {cls.__name__}, got {type(msg).__name__}")
        if used != len(data):
            raise MoqtDecodeError("Message Length", used, f"{len(data) - used} byte(s) after the message")
        return msg

    @classmethod
    def name(cls) -> str:
        return MessageType(cls.TYPE).name


def _params(r: Reader, msg_type: int, allowed: frozenset[int] | None = None) -> Parameters:
    allowed = ALLOWED_PARAMS[msg_type] if allowed is None else allowed
    return Parameters.decode(r, "Parameters", allowed=allowed, where=MessageType(msg_type).name)


def _enc_params(p: Parameters, msg_type: int, allowed: frozenset[int] | None = None) -> bytes:
    allowed = ALLOWED_PARAMS[msg_type] if allowed is None else allowed
    return p.encode(allowed=allowed, where=MessageType(msg_type).name)


def _track_properties(r: Reader) -> tuple[KeyValuePair, ...]:
    at = r.pos
    props = decode_kvps(r, "Track Properties")
    check_properties(r, props, "Track Properties", at)
    return props


def _track(r: Reader) -> tuple[TrackNamespace, bytes]:
    at = r.pos
    ns = TrackNamespace.decode(r, "Track Namespace")
    name = decode_track_name(r, "Track Name")
    check_full_track_name(r, ns, name, at)
    return ns, name


def _namespace_request_segments(
    request_id: int, ns_field: str, ns: TrackNamespace, params: Parameters, msg_type: int
) -> list[tuple[str, bytes]]:
    """PUBLISH_NAMESPACE / SUBSCRIBE_NAMESPACE / SUBSCRIBE_TRACKS: Request ID, namespace, Parameters."""
    return [("Request ID", encode_vi64(request_id)), (ns_field, ns.encode()),
            ("Parameters", _enc_params(params, msg_type))]


def _decode_namespace_request(r: Reader, ns_field: str, msg_type: int) -> tuple[int, TrackNamespace, Parameters]:
    rid = r.vi64("Request ID")
    ns = TrackNamespace.decode(r, ns_field)
    return rid, ns, _params(r, msg_type)


# ---------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Setup(ControlMessage):
    """SETUP (0x2F00, profile §5): Setup Options as KVPs to the end of the body, no count."""

    TYPE: ClassVar[int] = MessageType.SETUP
    options: tuple[KeyValuePair, ...] = ()

    @classmethod
    def build(
        cls,
        *,
        path: bytes | None = None,
        authority: bytes | None = None,
        max_filter_ranges: int | None = None,
        implementation: bytes | None = None,
        max_request_updates: int | None = None,
        max_auth_token_cache_size: int | None = None,
        auth_tokens: Iterable[AuthToken] = (),
        extra: Iterable[KeyValuePair] = (),
    ) -> Setup:
        opts: list[KeyValuePair] = []
        if path is not None:
            opts.append(KeyValuePair(SetupOption.PATH, path))
        opts += [KeyValuePair(SetupOption.AUTHORIZATION_TOKEN, t.encode()) for t in auth_tokens]
        if max_auth_token_cache_size is not None:
            opts.append(KeyValuePair(SetupOption.MAX_AUTH_TOKEN_CACHE_SIZE, max_auth_token_cache_size))
        if authority is not None:
            opts.append(KeyValuePair(SetupOption.AUTHORITY, authority))
        if max_filter_ranges is not None:
            opts.append(KeyValuePair(SetupOption.MAX_FILTER_RANGES, max_filter_ranges))
        if implementation is not None:
            opts.append(KeyValuePair(SetupOption.MOQT_IMPLEMENTATION, implementation))
        if max_request_updates is not None:
            opts.append(KeyValuePair(SetupOption.MAX_REQUEST_UPDATES, max_request_updates))
        opts += list(extra)
        return cls(tuple(sorted(opts, key=lambda kv: kv.type)))

    def _one(self, opt: int) -> int | bytes | None:
        vals = find_kvp(self.options, opt)
        return vals[0] if vals else None

    @property
    def path(self) -> bytes | None:
        v = self._one(SetupOption.PATH)
        return v if isinstance(v, bytes) else None

    @property
    def authority(self) -> bytes | None:
        v = self._one(SetupOption.AUTHORITY)
        return v if isinstance(v, bytes) else None

    @property
    def implementation(self) -> bytes | None:
        v = self._one(SetupOption.MOQT_IMPLEMENTATION)
        return v if isinstance(v, bytes) else None

    @property
    def max_filter_ranges(self) -> int:
        """Default 0: the peer MUST NOT send Range Filters."""
        v = self._one(SetupOption.MAX_FILTER_RANGES)
        return v if isinstance(v, int) else 0

    @property
    def max_request_updates(self) -> int:
        v = self._one(SetupOption.MAX_REQUEST_UPDATES)
        return v if isinstance(v, int) else 0

    @property
    def max_auth_token_cache_size(self) -> int:
        v = self._one(SetupOption.MAX_AUTH_TOKEN_CACHE_SIZE)
        return v if isinstance(v, int) else 0

    def auth_tokens(self) -> list[AuthToken]:
        """The AUTHORIZATION TOKEN options, decoded (KEY_VALUE_FORMATTING_ERROR when undecodable)."""
        out = []
        for v in find_kvp(self.options, SetupOption.AUTHORIZATION_TOKEN):
            assert isinstance(v, bytes)
            out.append(AuthToken.decode(Reader(v), "SETUP.AUTHORIZATION TOKEN"))
        return out

    def segments(self) -> list[tuple[str, bytes]]:
        known = {int(o) for o in SetupOption}
        seen: set[int] = set()
        for kv in self.options:
            if kv.type in known and kv.type in seen and kv.type != SetupOption.AUTHORIZATION_TOKEN:
                raise MoqtEncodeError(f"Setup Option {SetupOption(kv.type).name} repeated")
            seen.add(kv.type)
        return [("Setup Options", encode_kvps(self.options))]

    @classmethod
    def decode_body(cls, r: Reader, ctx: _DecodeContext) -> Self:
        opts = decode_kvps(r, "Setup Options")
        known = {int(o) for o in SetupOption}
        seen: set[int] = set()
        for kv in opts:
            if kv.type in known and kv.type in seen and kv.type != SetupOption.AUTHORIZATION_TOKEN:
                raise r.error("Setup Options", f"known option {SetupOption(kv.type).name} repeated")
            seen.add(kv.type)
        return cls(opts)


@dataclass(frozen=True)
class Goaway(ControlMessage):
    """GOAWAY (0x10): New Session URI (<= 8 192 bytes; clients send it empty) and Timeout ms."""

    TYPE: ClassVar[int] = MessageType.GOAWAY
    new_session_uri: bytes = b""
    timeout: int = 0

    def segments(self) -> list[tuple[str, bytes]]:
        if len(self.new_session_uri) > MAX_GOAWAY_URI:
            raise MoqtEncodeError(f"GOAWAY URI is {len(self.new_session_uri)} bytes, max {MAX_GOAWAY_URI}")
        return [("New Session URI", encode_vi64(len(self.new_session_uri)) + self.new_session_uri),
                ("Timeout", encode_vi64(self.timeout))]

    @classmethod
    def decode_body(cls, r: Reader, ctx: _DecodeContext) -> Self:
        at = r.pos
        n = r.vi64("New Session URI Length")
        if n > MAX_GOAWAY_URI:
            raise r.error("New Session URI Length", f"{n} > {MAX_GOAWAY_URI}", at)
        uri = r.take(n, "New Session URI")
        return cls(uri, r.vi64("Timeout"))


@dataclass(frozen=True)
class Subscribe(ControlMessage):
    """SUBSCRIBE (0x03): Request ID, Track Namespace, Track Name, Parameters."""

    TYPE: ClassVar[int] = MessageType.SUBSCRIBE
    request_id: int
    track_namespace: TrackNamespace
    track_name: bytes
    parameters: Parameters = field(default_factory=Parameters)

    def segments(self) -> list[tuple[str, bytes]]:
        return [("Request ID", encode_vi64(self.request_id)), ("Track Namespace", self.track_namespace.encode()),
                ("Track Name", encode_track_name(self.track_name)),
                ("Parameters", _enc_params(self.parameters, self.TYPE))]

    @classmethod
    def decode_body(cls, r: Reader, ctx: _DecodeContext) -> Self:
        rid = r.vi64("Request ID")
        ns, name = _track(r)
        return cls(rid, ns, name, _params(r, cls.TYPE))


@dataclass(frozen=True)
class TrackStatus(Subscribe):
    """TRACK_STATUS (0x0D): same layout as SUBSCRIBE."""

    TYPE: ClassVar[int] = MessageType.TRACK_STATUS


@dataclass(frozen=True)
class Fetch(Subscribe):
    """FETCH (0x16): same layout as SUBSCRIBE (no Fetch Type, no inline range; the range is
    LOCATION_FILTER)."""

    TYPE: ClassVar[int] = MessageType.FETCH


@dataclass(frozen=True)
class SubscribeOk(ControlMessage):
    """SUBSCRIBE_OK (0x04): Track Alias, Parameters (EXPIRES, LARGEST_OBJECT), Track Properties."""

    TYPE: ClassVar[int] = MessageType.SUBSCRIBE_OK
    track_alias: int
    parameters: Parameters = field(default_factory=Parameters)
    track_properties: tuple[KeyValuePair, ...] = ()

    @property
    def largest_object(self) -> Location | None:
        v = self.parameters.get(ParamType.LARGEST_OBJECT)
        return v if isinstance(v, Location) else None

    def segments(self) -> list[tuple[str, bytes]]:
        return [("Track Alias", encode_vi64(self.track_alias)), ("Parameters", _enc_params(self.parameters, self.TYPE)),
                ("Track Properties", encode_kvps(self.track_properties))]

    @classmethod
    def decode_body(cls, r: Reader, ctx: _DecodeContext) -> Self:
        alias = r.vi64("Track Alias")
        params = _params(r, cls.TYPE)
        return cls(alias, params, _track_properties(r))


@dataclass(frozen=True)
class RequestUpdate(ControlMessage):
    """REQUEST_UPDATE (0x02): a new Request ID (the stream names the request it updates), Parameters."""

    TYPE: ClassVar[int] = MessageType.REQUEST_UPDATE
    request_id: int
    parameters: Parameters = field(default_factory=Parameters)

    def segments(self) -> list[tuple[str, bytes]]:
        return [("Request ID", encode_vi64(self.request_id)),
                ("Parameters", self.parameters.encode(allowed=_UPDATE_UNION, where="REQUEST_UPDATE"))]

    def encode_for(self, request_type: int) -> bytes:
        """Checked against the parameters allowed for an update of ``request_type`` (profile §7.2)."""
        allowed = REQUEST_UPDATE_ALLOWED[request_type]
        where = f"REQUEST_UPDATE of {MessageType(request_type).name}"
        return frame(self.TYPE, encode_vi64(self.request_id) + self.parameters.encode(allowed=allowed, where=where))

    @classmethod
    def decode_body(cls, r: Reader, ctx: _DecodeContext) -> Self:
        rid = r.vi64("Request ID")
        if ctx.request_type is None:
            allowed, where = _UPDATE_UNION, "REQUEST_UPDATE"
        else:
            allowed = REQUEST_UPDATE_ALLOWED.get(ctx.request_type, _p())
            where = f"REQUEST_UPDATE of {MessageType(ctx.request_type).name}"
        return cls(rid, Parameters.decode(r, "Parameters", allowed=allowed, where=where))


@dataclass(frozen=True)
class PublishStateNotify(ControlMessage):
    """PUBLISH_STATE_NOTIFY (0x22), publisher -> subscriber: Parameters (LARGEST_OBJECT, FORWARD, filter)."""

    TYPE: ClassVar[int] = MessageType.PUBLISH_STATE_NOTIFY
    parameters: Parameters = field(default_factory=Parameters)

    def segments(self) -> list[tuple[str, bytes]]:
        return [("Parameters", _enc_params(self.parameters, self.TYPE))]

    @classmethod
    def decode_body(cls, r: Reader, ctx: _DecodeContext) -> Self:
        return cls(_params(r, cls.TYPE))


@dataclass(frozen=True)
class Publish(ControlMessage):
    """PUBLISH (0x1D): Request ID, Track Namespace, Name, Track Alias, Parameters, Track Properties."""

    TYPE: ClassVar[int] = MessageType.PUBLISH
    request_id: int
    track_namespace: TrackNamespace
    track_name: bytes
    track_alias: int
    parameters: Parameters = field(default_factory=Parameters)
    track_properties: tuple[KeyValuePair, ...] = ()

    def segments(self) -> list[tuple[str, bytes]]:
        return [("Request ID", encode_vi64(self.request_id)), ("Track Namespace", self.track_namespace.encode()),
                ("Track Name", encode_track_name(self.track_name)), ("Track Alias", encode_vi64(self.track_alias)),
                ("Parameters", _enc_params(self.parameters, self.TYPE)),
                ("Track Properties", encode_kvps(self.track_properties))]

    @classmethod
    def decode_body(cls, r: Reader, ctx: _DecodeContext) -> Self:
        rid = r.vi64("Request ID")
        ns, name = _track(r)
        alias = r.vi64("Track Alias")
        params = _params(r, cls.TYPE)
        return cls(rid, ns, name, alias, params, _track_properties(r))


@dataclass(frozen=True)
class PublishDone(ControlMessage):
    """PUBLISH_DONE (0x0B): Status Code, Stream Count (data + fill streams; 2^64-1 unknown), Reason."""

    TYPE: ClassVar[int] = MessageType.PUBLISH_DONE
    status_code: int
    stream_count: int
    reason: bytes = b""

    def segments(self) -> list[tuple[str, bytes]]:
        return [("Status Code", encode_vi64(self.status_code)), ("Stream Count", encode_vi64(self.stream_count)),
                ("Error Reason", encode_reason_phrase(self.reason))]

    @classmethod
    def decode_body(cls, r: Reader, ctx: _DecodeContext) -> Self:
        return cls(r.vi64("Status Code"), r.vi64("Stream Count"), decode_reason_phrase(r, "Error Reason"))


@dataclass(frozen=True)
class FetchOk(ControlMessage):
    """FETCH_OK (0x18): End Of Track (8), End Location (inclusive), Parameters (none defined), Track
    Properties."""

    TYPE: ClassVar[int] = MessageType.FETCH_OK
    end_of_track: int
    end_location: Location
    parameters: Parameters = field(default_factory=Parameters)
    track_properties: tuple[KeyValuePair, ...] = ()

    def segments(self) -> list[tuple[str, bytes]]:
        if self.end_of_track not in (0, 1):
            raise MoqtEncodeError(f"FETCH_OK End Of Track {self.end_of_track} is not 0 or 1")
        return [("End Of Track", bytes([self.end_of_track])), ("End Location", self.end_location.encode()),
                ("Parameters", _enc_params(self.parameters, self.TYPE)),
                ("Track Properties", encode_kvps(self.track_properties))]

    @classmethod
    def decode_body(cls, r: Reader, ctx: _DecodeContext) -> Self:
        at = r.pos
        eot = r.u8("End Of Track")
        if eot not in (0, 1):
            raise r.error("End Of Track", f"value {eot} is not 0 or 1", at)
        loc = Location.decode(r, "End Location")
        params = _params(r, cls.TYPE)
        return cls(eot, loc, params, _track_properties(r))


@dataclass(frozen=True)
class PublishNamespace(ControlMessage):
    """PUBLISH_NAMESPACE (0x06): Request ID, Track Namespace, Parameters (AUTHORIZATION_TOKEN only)."""

    TYPE: ClassVar[int] = MessageType.PUBLISH_NAMESPACE
    request_id: int
    track_namespace: TrackNamespace
    parameters: Parameters = field(default_factory=Parameters)

    def segments(self) -> list[tuple[str, bytes]]:
        return _namespace_request_segments(self.request_id, "Track Namespace", self.track_namespace,
                                           self.parameters, self.TYPE)

    @classmethod
    def decode_body(cls, r: Reader, ctx: _DecodeContext) -> Self:
        return cls(*_decode_namespace_request(r, "Track Namespace", cls.TYPE))


@dataclass(frozen=True)
class SubscribeNamespace(ControlMessage):
    """SUBSCRIBE_NAMESPACE (0x50): Request ID, Track Namespace Prefix (0..32 fields), Parameters."""

    TYPE: ClassVar[int] = MessageType.SUBSCRIBE_NAMESPACE
    request_id: int
    track_namespace_prefix: TrackNamespace
    parameters: Parameters = field(default_factory=Parameters)

    def segments(self) -> list[tuple[str, bytes]]:
        return _namespace_request_segments(self.request_id, "Track Namespace Prefix", self.track_namespace_prefix,
                                           self.parameters, self.TYPE)

    @classmethod
    def decode_body(cls, r: Reader, ctx: _DecodeContext) -> Self:
        return cls(*_decode_namespace_request(r, "Track Namespace Prefix", cls.TYPE))


@dataclass(frozen=True)
class SubscribeTracks(SubscribeNamespace):
    """SUBSCRIBE_TRACKS (0x51): same layout as SUBSCRIBE_NAMESPACE."""

    TYPE: ClassVar[int] = MessageType.SUBSCRIBE_TRACKS


@dataclass(frozen=True)
class Namespace(ControlMessage):
    """NAMESPACE (0x08) on a SUBSCRIBE_NAMESPACE stream: the fields after the subscribed prefix."""

    TYPE: ClassVar[int] = MessageType.NAMESPACE
    track_namespace_suffix: TrackNamespace

    def segments(self) -> list[tuple[str, bytes]]:
        return [("Track Namespace Suffix", self.track_namespace_suffix.encode())]

    @classmethod
    def decode_body(cls, r: Reader, ctx: _DecodeContext) -> Self:
        return cls(TrackNamespace.decode(r, "Track Namespace Suffix"))


@dataclass(frozen=True)
class NamespaceDone(Namespace):
    """NAMESPACE_DONE (0x0E): the suffix whose last publisher withdrew."""

    TYPE: ClassVar[int] = MessageType.NAMESPACE_DONE


@dataclass(frozen=True)
class PublishSkipped(ControlMessage):
    """PUBLISH_SKIPPED (0x0F) on a SUBSCRIBE_TRACKS stream: Track Namespace Suffix and Track Name."""

    TYPE: ClassVar[int] = MessageType.PUBLISH_SKIPPED
    track_namespace_suffix: TrackNamespace
    track_name: bytes

    def segments(self) -> list[tuple[str, bytes]]:
        return [("Track Namespace Suffix", self.track_namespace_suffix.encode()),
                ("Track Name", encode_track_name(self.track_name))]

    @classmethod
    def decode_body(cls, r: Reader, ctx: _DecodeContext) -> Self:
        ns = TrackNamespace.decode(r, "Track Namespace Suffix")
        return cls(ns, decode_track_name(r, "Track Name"))


@dataclass(frozen=True)
class RequestOk(ControlMessage):
    """REQUEST_OK (0x07), a.k.a. PUBLISH_OK, REQUEST_UPDATE_OK, TRACK_STATUS_OK, *_NAMESPACE_OK:
    Parameters and Track Properties (non-empty only as TRACK_STATUS_OK)."""

    TYPE: ClassVar[int] = MessageType.REQUEST_OK
    parameters: Parameters = field(default_factory=Parameters)
    track_properties: tuple[KeyValuePair, ...] = ()

    @property
    def largest_object(self) -> Location | None:
        v = self.parameters.get(ParamType.LARGEST_OBJECT)
        return v if isinstance(v, Location) else None

    def segments(self) -> list[tuple[str, bytes]]:
        allowed = _REQUEST_OK_DEFAULT | REQUEST_OK_ALLOWED[MessageType.TRACK_STATUS]
        return [("Parameters", self.parameters.encode(allowed=allowed, where="REQUEST_OK")),
                ("Track Properties", encode_kvps(self.track_properties))]

    @classmethod
    def decode_body(cls, r: Reader, ctx: _DecodeContext) -> Self:
        rt = ctx.request_type
        allowed = _REQUEST_OK_DEFAULT if rt is None else REQUEST_OK_ALLOWED.get(rt, _REQUEST_OK_DEFAULT)
        where = "REQUEST_OK" if rt is None else f"REQUEST_OK answering {MessageType(rt).name}"
        params = Parameters.decode(r, "Parameters", allowed=allowed, where=where)
        at = r.pos
        props = _track_properties(r)
        if props and rt is not None and rt != MessageType.TRACK_STATUS:
            raise r.error("Track Properties", f"must be empty in {where} (only TRACK_STATUS_OK has them)", at)
        return cls(params, props)


@dataclass(frozen=True)
class Redirect:
    """REQUEST_ERROR's Redirect (only with Error Code 0x34 REDIRECT)."""

    connect_uri: bytes
    track_namespace: TrackNamespace
    track_name: bytes = b""

    def encode(self) -> bytes:
        return (encode_vi64(len(self.connect_uri)) + self.connect_uri + self.track_namespace.encode()
                + encode_track_name(self.track_name))

    @classmethod
    def decode(cls, r: Reader) -> Redirect:
        n = r.vi64("Redirect.Connect URI Length")
        uri = r.take(n, "Redirect.Connect URI")
        ns = TrackNamespace.decode(r, "Redirect.Track Namespace")
        return cls(uri, ns, decode_track_name(r, "Redirect.Track Name"))


REDIRECT_CODE = 0x34


@dataclass(frozen=True)
class RequestError(ControlMessage):
    """REQUEST_ERROR (0x05): Error Code, Retry Interval (ms + 1; 0 = never), Reason, [Redirect]."""

    TYPE: ClassVar[int] = MessageType.REQUEST_ERROR
    error_code: int
    retry_interval: int = 0
    reason: bytes = b""
    redirect: Redirect | None = None

    def segments(self) -> list[tuple[str, bytes]]:
        if (self.error_code == REDIRECT_CODE) != (self.redirect is not None):
            raise MoqtEncodeError("REQUEST_ERROR carries a Redirect iff Error Code is 0x34 REDIRECT")
        segs = [("Error Code", encode_vi64(self.error_code)), ("Retry Interval", encode_vi64(self.retry_interval)),
                ("Error Reason", encode_reason_phrase(self.reason))]
        return segs + ([("Redirect", self.redirect.encode())] if self.redirect is not None else [])

    @classmethod
    def decode_body(cls, r: Reader, ctx: _DecodeContext) -> Self:
        code = r.vi64("Error Code")
        retry = r.vi64("Retry Interval")
        reason = decode_reason_phrase(r, "Error Reason")
        redirect = Redirect.decode(r) if code == REDIRECT_CODE else None
        return cls(code, retry, reason, redirect)


MESSAGE_TYPES: dict[int, type[ControlMessage]] = {
    cls.TYPE: cls
    for cls in (Setup, Goaway, Subscribe, SubscribeOk, RequestUpdate, PublishStateNotify, Publish, PublishDone,
                Fetch, FetchOk, TrackStatus, PublishNamespace, SubscribeNamespace, SubscribeTracks, Namespace,
                NamespaceDone, PublishSkipped, RequestOk, RequestError)
}


def parse_control_message(
    buf: bytes | bytearray | memoryview, offset: int = 0, *, request_type: int | None = None
) -> tuple[ControlMessage, int]:
    """(message, bytes consumed) for the message at ``buf[offset:]`` (profile §4.2).

    NeedMoreData when the buffer ends inside the header or body; MoqtDecodeError (PROTOCOL_VIOLATION
    unless the field says otherwise) for an unknown type or a body that does not match its Length.
    ``request_type``: the message type that opened this request stream, if known.
    """
    r = Reader(buf, offset, final=False)
    type_at = r.pos
    msg_type = r.vi64("Message Type")
    length = r.u16("Message Length")
    body_at = r.pos
    if body_at + length > len(buf):
        raise NeedMoreData("Message Body", body_at, f"Length {length}, {len(buf) - body_at} byte(s) available")
    cls = MESSAGE_TYPES.get(msg_type)
    if cls is None:
        raise MoqtDecodeError("Message Type", type_at, f"unknown control message type 0x{msg_type:x}")
    name = MessageType(msg_type).name
    body = Reader(buf, body_at, body_at + length, final=True, context=name + ".")
    try:
        msg = cls.decode_body(body, _DecodeContext(request_type))
    except NeedMoreData as exc:  # pragma: no cover - a final Reader never raises it
        raise MoqtDecodeError(exc.field, exc.offset, exc.message) from exc
    except MoqtDecodeError as exc:
        if "before the end at" in exc.message:
            raise MoqtDecodeError(exc.field, exc.offset, exc.message + f" (Message Length {length} too short)",
                                  exc.code) from exc
        raise
    if not body.at_end():
        raise MoqtDecodeError(name + ".Message Length", body.pos,
                              f"Length {length} but the body parsed in {body.pos - body_at} byte(s)")
    return msg, body.end - offset


class ControlStreamParser:
    """Incremental framing of one control or request stream: ``feed(data) -> [messages]``.

    Errors carry offsets counted from the start of the stream.  On a request stream the first message
    sets ``request_type`` (it must be one of REQUEST_MESSAGE_TYPES when ``request_stream``); later
    REQUEST_UPDATE / REQUEST_OK parameters are checked against it.
    """

    def __init__(self, *, request_stream: bool = False, request_type: int | None = None) -> None:
        self._buf = bytearray()
        self._base = 0
        self.request_stream = request_stream
        self.request_type = request_type
        self.count = 0

    def feed(self, data: bytes) -> list[ControlMessage]:
        self._buf += data
        out: list[ControlMessage] = []
        while self._buf:
            try:
                msg, used = parse_control_message(self._buf, request_type=self.request_type)
            except NeedMoreData:
                break
            except MoqtDecodeError as exc:
                raise MoqtDecodeError(exc.field, exc.offset + self._base, exc.message, exc.code) from exc
            if self.request_stream and self.count == 0:
                if msg.TYPE not in REQUEST_MESSAGE_TYPES:
                    raise MoqtDecodeError("Message Type", self._base, f"{type(msg).__name__} cannot open a request "
                                          "stream")
                self.request_type = msg.TYPE
            del self._buf[:used]
            self._base += used
            self.count += 1
            out.append(msg)
        return out

    def end_of_stream(self) -> None:
        """FIN: bytes left over mean the stream ended mid-message (PROTOCOL_VIOLATION, profile §4.4)."""
        if self._buf:
            raise MoqtDecodeError("Message", self._base, f"stream ended inside a message ({len(self._buf)} byte(s))")
