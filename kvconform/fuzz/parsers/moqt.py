"""MOQT d22 parsers a peer reaches: vi64, control messages and streams, data streams, datagrams and the
common structures (profile §2-§9).  Streams are fed whole and in pieces (``splits``); a value that
decodes and re-encodes must decode to itself."""

from __future__ import annotations

from collections.abc import Callable, Iterator

from kvconform.fuzz.splits import feed_compare
from kvconform.fuzz.target import FuzzTarget, OracleError
from kvconform.moqt.data import (
    PADDING_STREAM_TYPE,
    DataStreamParser,
    EndOfRange,
    FetchObject,
    FetchStreamWriter,
    GroupOrder,
    ObjectDatagram,
    ObjectStatus,
    SubgroupHeader,
    SubgroupObject,
    SubgroupStreamWriter,
)
from kvconform.moqt.errors import MoqtDecodeError, MoqtEncodeError
from kvconform.moqt.filters import LocationFilter, RangeFilter
from kvconform.moqt.messages import (
    ControlMessage,
    ControlStreamParser,
    Fetch,
    FetchOk,
    Goaway,
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
    frame,
    parse_control_message,
)
from kvconform.moqt.parameters import FillParameters, Parameters
from kvconform.moqt.structures import (
    AuthAliasType,
    AuthToken,
    KeyValuePair,
    Location,
    ParamType,
    TrackNamespace,
    check_properties,
    decode_kvps,
    decode_reason_phrase,
    decode_track_name,
    encode_kvps,
    encode_reason_phrase,
    encode_track_name,
    property_int,
)
from kvconform.moqt.vi64 import MAX_VI64, Reader, decode_vi64, encode_vi64
from kvconform.testvectors import load_vectors

__all__ = ["TARGETS"]

_NS = TrackNamespace((b"kvcs-1", bytes(range(16)), bytes(range(32)), bytes(range(32, 64)), bytes(16)))
_TOKEN = AuthToken.use_value(b"token-1")
_PROPS = (KeyValuePair(0x04, 60000), KeyValuePair(0x0B, encode_kvps([KeyValuePair(0x3C, 1)])),
          KeyValuePair(0x0E, 128), KeyValuePair(0x22, 1), KeyValuePair(0x30, 1), KeyValuePair(0x4001, b"m"))
_BOUNDARIES = (0, 1, 63, 64, 127, 128, 2**14 - 1, 2**14, 2**16 - 1, 2**21, 2**32 - 1, 2**56 - 1, 2**56, 2**63,
               MAX_VI64)


# ---- vi64 ----------------------------------------------------------------------------------------


def vi64_sequence(data: bytes) -> list[int]:
    """Every vi64 of ``data`` in turn; each re-encodes (at its own, maybe non-minimal, size) to its bytes."""
    values, off = [], 0
    while off < len(data):
        value, end = decode_vi64(data, off)
        if encode_vi64(value, size=end - off) != data[off:end]:
            raise OracleError(f"vi64 {data[off:end].hex()} decodes as {value}, which re-encodes as "
                              f"{encode_vi64(value, size=end - off).hex()}")
        values.append(value)
        off = end
    return values


def vi64_seeds() -> Iterator[bytes]:
    yield b"".join(encode_vi64(v) for v in _BOUNDARIES)
    yield b"".join(encode_vi64(v, size=9) for v in (0, 1, MAX_VI64))
    # every size at its smallest and largest value
    yield b"".join(encode_vi64(0, size=n) + encode_vi64(min(2 ** (7 * n) - 1, MAX_VI64), size=n) for n in range(1, 10))


# ---- control messages ----------------------------------------------------------------------------


def _control_messages() -> list[ControlMessage]:
    live = Parameters.of((ParamType.LOCATION_FILTER, LocationFilter.next_object()), (
        ParamType.FILL_PARAMETERS, FillParameters.of((ParamType.LOCATION_FILTER, LocationFilter.absolute_start(0, 0)))))
    every = Parameters.of(
        (ParamType.OBJECT_DELIVERY_TIMEOUT, 100), (ParamType.AUTHORIZATION_TOKEN, _TOKEN),
        (ParamType.AUTHORIZATION_TOKEN, AuthToken(AuthAliasType.REGISTER, 0, b"v", alias=1)),
        (ParamType.SUBGROUP_DELIVERY_TIMEOUT, 2**20), (ParamType.FORWARD, 1), (ParamType.SUBSCRIBER_PRIORITY, 7),
        (ParamType.LOCATION_FILTER, LocationFilter.absolute_range(1, 2, 3, 4)), (ParamType.GROUP_ORDER, 2),
        (ParamType.FILL_PARAMETERS, FillParameters.of((ParamType.FILL_TIMEOUT, 500), (ParamType.GROUP_ORDER, 1))),
        (ParamType.SUBGROUP_FILTER, RangeFilter(ParamType.SUBGROUP_FILTER, 1, ((0, 3), (5, None)))),
        (ParamType.OBJECTID_FILTER, RangeFilter.first_objects(4)),
        (ParamType.PRIORITY_FILTER, RangeFilter(ParamType.PRIORITY_FILTER, 0, ((0, 255),))),
        (ParamType.OBJECT_PROPERTY_FILTER, RangeFilter(ParamType.OBJECT_PROPERTY_FILTER, 2, ((1, 1),), 0x3C)),
        (ParamType.NEW_GROUP_REQUEST, 1), (ParamType.INCLUDE_PROPERTIES, 1))
    prefix = TrackNamespace.of("kvcs-1")
    return [
        Setup.build(path=b"/kvcs", authority=b"relay.example:4443", max_filter_ranges=4, implementation=b"kvconform",
                    max_request_updates=2, max_auth_token_cache_size=1024, auth_tokens=[_TOKEN]),
        Goaway(b"moqt://relay.example/next", 1000),
        Subscribe(0, _NS, b"k.raw.s0", live), Subscribe(2, _NS, b"v.raw.s1", every),
        TrackStatus(4, _NS, b"manifest", Parameters.of((ParamType.AUTHORIZATION_TOKEN, _TOKEN))),
        Fetch(6, _NS, b"k.raw.s0", Parameters.of((ParamType.LOCATION_FILTER, LocationFilter.absolute_range(0, 0, 2, 5)),
                                                 (ParamType.FILL_TIMEOUT, 500), (ParamType.GROUP_ORDER, 2))),
        SubscribeOk(1, Parameters.of((ParamType.EXPIRES, 1000), (ParamType.LARGEST_OBJECT, Location(3, 4))), _PROPS),
        RequestUpdate(8, Parameters.of((ParamType.FORWARD, 0), (ParamType.SUBSCRIBER_PRIORITY, 5),
                                       (ParamType.TRACK_NAMESPACE_PREFIX, prefix))),
        PublishStateNotify(Parameters.of((ParamType.LARGEST_OBJECT, Location(1, 1)), (ParamType.FORWARD, 1))),
        Publish(10, _NS, b"v.raw.s1", 3, Parameters.of((ParamType.EXPIRES, 10), (ParamType.LARGEST_OBJECT,
                                                                                  Location(1, 0))), _PROPS[:2]),
        PublishDone(0x2, 5, b"track ended"), PublishDone(0x0, MAX_VI64),
        FetchOk(1, Location(2, 9), Parameters(), (KeyValuePair(0x22, 2),)),
        PublishNamespace(12, _NS, Parameters.of((ParamType.AUTHORIZATION_TOKEN, _TOKEN))),
        SubscribeNamespace(14, prefix, Parameters()),
        SubscribeTracks(16, prefix, Parameters.of((ParamType.TRACK_PROPERTY_FILTER, RangeFilter(
            ParamType.TRACK_PROPERTY_FILTER, 0, ((0, None),), 0x3C)))),
        Namespace(TrackNamespace.of("a", "b")), NamespaceDone(TrackNamespace.of("a")),
        PublishSkipped(TrackNamespace.of("x"), b"k.raw.s0"),
        RequestOk(Parameters.of((ParamType.LARGEST_OBJECT, Location(1, 2)))), RequestOk(Parameters(), _PROPS[:1]),
        RequestError(0x10, 1, b"does not exist"),
        RequestError(0x34, 0, b"moved", Redirect(b"moqt://other.example", _NS, b"k.raw.s0")),
    ]


def _redecode(msg: ControlMessage) -> None:
    try:
        wire = msg.encode()
    except MoqtEncodeError:
        return  # the checked encoder may refuse what a tolerant decoder reads
    again, _ = parse_control_message(wire)
    if again != msg:
        raise OracleError(f"{type(msg).__name__} re-encodes as {wire.hex()}, which decodes to {again!r}")


def control_messages(data: bytes) -> list[ControlMessage]:
    """parse_control_message over the buffer, message after message; each decoded one re-encodes to itself."""
    out, off = [], 0
    while off < len(data):
        msg, used = parse_control_message(data, off)
        _redecode(msg)
        out.append(msg)
        off += used
    return out


def control_seeds() -> Iterator[bytes]:
    for msg in _control_messages():
        yield msg.encode()
    for case in load_vectors("kvcs-moqt-message"):
        yield bytes.fromhex(case["message"])


def control_body(data: bytes) -> list[ControlMessage]:
    """A Message Type vi64 and a body: framed with its true Length, then parsed (reaches every body field)."""
    msg_type, end = decode_vi64(data)
    body = data[end:]
    if len(body) > 0xFFFF:
        body = body[:0xFFFF]
    return control_messages(frame(msg_type, body))


def control_body_seeds() -> Iterator[bytes]:
    for wire in control_seeds():
        _, end = decode_vi64(wire)
        yield wire[:end] + wire[end + 2 :]


def control_stream(data: bytes) -> list[object]:
    """ControlStreamParser fed whole and in pieces: byte 0 is the mode (bit 0: a request stream; the rest
    seeds the cut points), the stream follows."""
    if not data:
        return []
    request_stream = bool(data[0] & 1)
    return feed_compare(lambda: ControlStreamParser(request_stream=request_stream), data[1:], data[0] >> 1)


def control_stream_seeds() -> Iterator[bytes]:
    messages = [m.encode() for m in _control_messages()]
    yield bytes([0x10]) + messages[0] + messages[1] + messages[-1]
    for i, wire in enumerate(messages[2:10]):
        # a request stream: the request, then updates and answers
        yield bytes([(i << 1) | 1]) + wire + messages[7] + messages[-4] + messages[-2]


# ---- data streams and datagrams ------------------------------------------------------------------


def _check_objects(events: list[object]) -> None:
    for ev in events:
        if isinstance(ev, SubgroupObject) and ev.properties:
            ev.property_pairs()  # kept as bytes after they were checked: they must still parse


def data_stream(data: bytes) -> list[object]:
    """DataStreamParser fed whole and in pieces: byte 0 is the mode (bit 0: Descending group order; the
    rest seeds the cut points), the uni stream follows."""
    if not data:
        return []
    order = GroupOrder.DESCENDING if data[0] & 1 else GroupOrder.ASCENDING
    events = feed_compare(lambda: DataStreamParser(order), data[1:], data[0] >> 1)
    _check_objects(events)
    return events


def data_stream_seeds() -> Iterator[bytes]:
    props = encode_kvps([KeyValuePair(0x0B, encode_kvps([KeyValuePair(0x3C, 2)])), KeyValuePair(0x3E, 1)])
    streams = [
        SubgroupStreamWriter(SubgroupHeader.build(1, 0, 0, 128)).encode(
            [SubgroupObject(0, b"payload"), SubgroupObject(1, b"x"),
             SubgroupObject(2, status=ObjectStatus.END_OF_GROUP)]),
        SubgroupStreamWriter(SubgroupHeader.build(7, 2**40, 5, None, properties=True, end_of_group=True,
                                                  first_object=True)).encode(
            [SubgroupObject(3, b"a" * 40, properties=props), SubgroupObject(9, status=ObjectStatus.END_OF_TRACK)]),
        SubgroupStreamWriter(SubgroupHeader(0x10 | 0x02, 3, 1, None, 9)).encode(
            [SubgroupObject(4, b"first names the subgroup"), SubgroupObject(5, b"y")]),
        FetchStreamWriter(3).encode([
            FetchObject(0, 0, b"a"), FetchObject(0, 1, b"b", subgroup_id=2), FetchObject(0, 3, b"b2", subgroup_id=3),
            FetchObject(1, 0, b"c", subgroup_id=3, publisher_priority=1, properties=props),
            EndOfRange(0x8C, 2, 5), FetchObject(3, 0, b"d", subgroup_id=None), EndOfRange(0x20C, 4, 0)]),
        FetchStreamWriter(0).encode([]),
        encode_vi64(PADDING_STREAM_TYPE) + bytes(12),
    ]
    for i, stream in enumerate(streams):
        yield bytes([i << 1]) + stream
    descending = FetchStreamWriter(5, GroupOrder.DESCENDING).encode(
        [FetchObject(5, 0, b"e"), FetchObject(4, 2, b"f"), FetchObject(2, 0, b"g", subgroup_id=1)])
    yield bytes([0x21]) + descending


def datagram(data: bytes) -> ObjectDatagram:
    """ObjectDatagram.decode; a decoded datagram that re-encodes decodes to itself."""
    d = ObjectDatagram.decode(data)
    try:
        wire = d.encode()
    except MoqtEncodeError:
        return d
    if ObjectDatagram.decode(wire) != d:
        raise OracleError(f"datagram {d!r} re-encodes as {wire.hex()}, which decodes differently")
    return d


def datagram_seeds() -> Iterator[bytes]:
    props = encode_kvps([KeyValuePair(0x3C, 1)])
    for d in (ObjectDatagram(1, 2, 3, b"payload"), ObjectDatagram(1, 0, 0, b"", status=ObjectStatus.END_OF_TRACK),
              ObjectDatagram(2**20, 5, 7, b"p", publisher_priority=9, properties=props, end_of_group=True),
              ObjectDatagram(0, 0, 0, b"", status=ObjectStatus.NORMAL)):
        yield d.encode()


# ---- common structures -----------------------------------------------------------------------------


def _range_filter(param_type: int) -> Callable[[Reader], object]:
    def decode(r: Reader) -> object:
        f = RangeFilter.decode(r, param_type)
        return f, f.problem(), f.matches(5)
    return decode


def _kvps(r: Reader) -> object:
    at = r.pos
    pairs = decode_kvps(r)
    check_properties(r, pairs, "Properties", at)
    return pairs, property_int(pairs, 0x3C)


# (decoder from a final Reader, checked encoder of the decoded value or None): the fuzz input's first byte
# picks one, modulo the count.
_STRUCTURES: list[tuple[Callable[[Reader], object], Callable[[object], bytes] | None]] = [
    (lambda r: TrackNamespace.decode(r), lambda v: v.encode()),  # type: ignore[attr-defined]
    (_kvps, None),
    (lambda r: Parameters.decode(r), lambda v: v.encode()),  # type: ignore[attr-defined]
    (lambda r: AuthToken.decode(r), lambda v: v.encode()),  # type: ignore[attr-defined]
    (lambda r: LocationFilter.decode(r), lambda v: v.encode()),  # type: ignore[attr-defined]
    (lambda r: FillParameters.decode(r), lambda v: v.encode()),  # type: ignore[attr-defined]
    (_range_filter(ParamType.SUBGROUP_FILTER), None),
    (_range_filter(ParamType.OBJECT_PROPERTY_FILTER), None),
    (lambda r: decode_reason_phrase(r), lambda v: encode_reason_phrase(v)),  # type: ignore[arg-type]
    (lambda r: Location.decode(r), lambda v: v.encode()),  # type: ignore[attr-defined]
    (lambda r: decode_track_name(r), lambda v: encode_track_name(v)),  # type: ignore[arg-type]
    (lambda r: Redirect.decode(r), lambda v: v.encode()),  # type: ignore[attr-defined]
]


def structure(data: bytes) -> object:
    """One common structure, chosen by byte 0, decoded from the rest; a decoded value that re-encodes
    decodes to itself."""
    if not data:
        return None
    decode, encode = _STRUCTURES[data[0] % len(_STRUCTURES)]
    value = decode(Reader(data, 1))
    if encode is not None:
        try:
            wire = encode(value)
        except MoqtEncodeError:
            return value
        if decode(Reader(wire)) != value:
            raise OracleError(f"{value!r} re-encodes as {wire.hex()}, which decodes differently")
    return value


def structure_seeds() -> Iterator[bytes]:
    values: list[bytes] = [
        _NS.encode(), encode_kvps(_PROPS),
        Parameters.of((ParamType.AUTHORIZATION_TOKEN, _TOKEN), (ParamType.FORWARD, 1),
                      (ParamType.LARGEST_OBJECT, Location(1, 2))).encode(),
        AuthToken(AuthAliasType.REGISTER, 0, b"value", alias=3).encode(),
        LocationFilter.absolute_range(1, 2, 3, 4).encode(),
        FillParameters.of((ParamType.FILL_TIMEOUT, 500), (ParamType.LOCATION_FILTER, LocationFilter.relative_start(1)),
                          (ParamType.SUBGROUP_FILTER, RangeFilter(ParamType.SUBGROUP_FILTER, 0, ((0, 1),)))).encode(),
        RangeFilter(ParamType.SUBGROUP_FILTER, 1, ((0, 3), (5, None))).encode(),
        RangeFilter(ParamType.OBJECT_PROPERTY_FILTER, 2, ((1, 1), (4, 9)), 0x3C).encode(),
        encode_reason_phrase(b"a reason"), Location(2**40, 7).encode(), encode_track_name(b"k.raw.s0"),
        Redirect(b"moqt://other.example", _NS, b"k.raw.s0").encode(),
    ]
    for i, v in enumerate(values):
        yield bytes([i]) + v


TARGETS = [
    FuzzTarget(name="moqt-vi64", protocol="moqt", description="decode_vi64 over a buffer; each value re-encoded",
               parse=vi64_sequence, accepts=(MoqtDecodeError,), seeds=vi64_seeds, varints=True),
    FuzzTarget(name="moqt-control-message", protocol="moqt",
               description="parse_control_message, message after message; each re-encoded and decoded",
               parse=control_messages, accepts=(MoqtDecodeError,), seeds=control_seeds, varints=True),
    FuzzTarget(name="moqt-control-body", protocol="moqt",
               description="a Message Type and body framed with its true Length, then parse_control_message",
               parse=control_body, accepts=(MoqtDecodeError,), seeds=control_body_seeds, varints=True),
    FuzzTarget(name="moqt-control-stream", protocol="moqt",
               description="ControlStreamParser (control or request stream) fed whole and in pieces",
               parse=control_stream, accepts=(MoqtDecodeError,), seeds=control_stream_seeds, varints=True,
               max_len=8192),
    FuzzTarget(name="moqt-data-stream", protocol="moqt",
               description="DataStreamParser (subgroup, fetch, padding streams) fed whole and in pieces",
               parse=data_stream, accepts=(MoqtDecodeError,), seeds=data_stream_seeds, varints=True),
    FuzzTarget(name="moqt-datagram", protocol="moqt", description="ObjectDatagram.decode; re-encoded and decoded",
               parse=datagram, accepts=(MoqtDecodeError,), seeds=datagram_seeds, varints=True),
    FuzzTarget(name="moqt-structures", protocol="moqt",
               description="Track Namespace/Name, KVPs and properties, Parameters, Authorization Token, filters, "
                           "Reason Phrase, Location, Redirect (byte 0 picks one)",
               parse=structure, accepts=(MoqtDecodeError,), seeds=structure_seeds, varints=True),
]
