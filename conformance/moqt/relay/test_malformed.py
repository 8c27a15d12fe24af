"""moqt-relay: malformed control messages close the offending session with the right code, and the relay
keeps serving everyone else (moqt-d22-profile sections 3.3, 4.2, 4.3, 7.2, 10.1).

Each case is a valid message with one thing changed (``kvconform.moqt.craft``), sent on a fresh session
that carries the declared tokens, so the only reason to refuse it is the defect. The relay must close that
session with a MOQT session close (an application CONNECTION_CLOSE carrying the Session Termination code: a
QUIC transport close or silence is no such answer); the sanity probe (publish and receive one object on two
other sessions) runs after each case: a relay that dies with the offending session fails the case.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import pytest

from kvconform.fixtures.moqt import CLIENT_TIMEOUT, CLOSE_WAIT, TRACK_NAME, RelayUnderTest, record, run
from kvconform.moqt.craft import (
    CraftedMessage,
    RawParam,
    unknown_type,
    vi64,
    with_forbidden_param,
    with_parameters,
    wrong_length,
)
from kvconform.moqt.errors import SessionError
from kvconform.moqt.filters import LocationFilter
from kvconform.moqt.messages import (
    Fetch,
    Goaway,
    Namespace,
    PublishNamespace,
    RequestOk,
    Setup,
    Subscribe,
    SubscribeNamespace,
    SubscribeOk,
)
from kvconform.moqt.parameters import FillParameters, Parameter, Parameters
from kvconform.moqt.session import SessionClosed
from kvconform.moqt.structures import ParamType, TrackNamespace
from kvconform.verdicts import check, check_one_of, violation

pytestmark = pytest.mark.usefixtures("moqt_relay_sanity")


@dataclass(frozen=True)
class Offence:
    """What the offending session sends: raw bytes on a new request stream (``where="request"``), on its
    control stream (``"control"``, ``end_control`` FINs it after them) or on a new unidirectional stream
    (``"uni"``). It always follows a valid SUBSCRIBE_NAMESPACE (Request ID 0) answered REQUEST_OK, so the
    relay is serving the session when the defect arrives; a request it opens uses Request ID 2 (NEXT_ID)."""

    build: Callable[[RelayUnderTest, TrackNamespace], bytes]
    where: str = "request"
    end_control: bool = False


NEXT_ID = 2  # the offender's next valid Request ID after the SUBSCRIBE_NAMESPACE


def _auth(relay: RelayUnderTest, role: str) -> list[Parameter]:
    return [Parameter(ParamType.AUTHORIZATION_TOKEN, t) for t in relay.token(role)]


def _subscribe(relay: RelayUnderTest, ns: TrackNamespace, rid: int = NEXT_ID) -> Subscribe:
    params = [*_auth(relay, "subscriber"), Parameter(ParamType.LOCATION_FILTER, LocationFilter.next_object())]
    return Subscribe(rid, ns, TRACK_NAME, Parameters(tuple(params)))


def _fetch(relay: RelayUnderTest, ns: TrackNamespace, rid: int = NEXT_ID) -> Fetch:
    return Fetch(rid, ns, TRACK_NAME, Parameters(tuple(_auth(relay, "subscriber"))))


def _too_long(relay: RelayUnderTest, ns: TrackNamespace) -> bytes:
    msg = _subscribe(relay, ns)
    # Message Length one more than the body, and one stray byte so the stream holds the declared length.
    return CraftedMessage.from_message(msg).with_length(len(msg.encode_body()) + 1).build() + b"\x00"


LENGTH = {
    "request-stream-one-short": Offence(lambda r, ns: wrong_length(_subscribe(r, ns), -1)),
    "request-stream-one-long": Offence(_too_long),
    "control-stream-goaway-one-short": Offence(lambda r, ns: wrong_length(Goaway(), -1), where="control"),
}
UNKNOWN_TYPE = {
    "first-on-request-stream": Offence(lambda r, ns: unknown_type()),
    "on-control-stream": Offence(lambda r, ns: unknown_type(), where="control"),
    "two-byte-type-on-request-stream": Offence(lambda r, ns: unknown_type(0x2F01)),
}
PARITY = {
    "subscribe-odd-id": Offence(lambda r, ns: _subscribe(r, ns, rid=1).encode()),
    "fetch-odd-id": Offence(lambda r, ns: _fetch(r, ns, rid=3).encode()),
    "duplicate-id": Offence(lambda r, ns: _subscribe(r, ns, rid=0).encode()),  # the SUBSCRIBE_NAMESPACE's
}
NOT_ALLOWED = {
    "fill-parameters-in-fetch": Offence(lambda r, ns: with_forbidden_param(
        _fetch(r, ns), Parameter(ParamType.FILL_PARAMETERS, FillParameters()))),
    "forward-in-publish-namespace": Offence(lambda r, ns: with_forbidden_param(
        PublishNamespace(NEXT_ID, ns, Parameters(tuple(_auth(r, "publisher")))), Parameter(ParamType.FORWARD, 1))),
    "location-filter-in-subscribe-namespace": Offence(lambda r, ns: with_forbidden_param(
        SubscribeNamespace(NEXT_ID, ns, Parameters(tuple(_auth(r, "subscriber")))),
        Parameter(ParamType.LOCATION_FILTER, LocationFilter.next_object()))),
}


def _raw_subscribe(relay: RelayUnderTest, ns: TrackNamespace, field: str, data: bytes) -> bytes:
    """A SUBSCRIBE (with the subscriber's token) whose field ``field`` is replaced by ``data``."""
    return CraftedMessage.from_message(_subscribe(relay, ns)).set(field, data).build()


def _with_params(relay: RelayUnderTest, ns: TrackNamespace, *extra: RawParam) -> bytes:
    """A SUBSCRIBE carrying the subscriber's token then ``extra``, written unchecked (types ascending)."""
    return with_parameters(_subscribe(relay, ns), [*_auth(relay, "subscriber"), *extra])


def _namespace(fields: list[bytes]) -> bytes:
    return vi64(len(fields)) + b"".join(vi64(len(f)) + f for f in fields)


REQUEST_FIRST = {
    "request-ok-first": Offence(lambda r, ns: RequestOk().encode()),
    "namespace-first": Offence(lambda r, ns: Namespace(TrackNamespace.of("suffix")).encode()),
    "subscribe-ok-first": Offence(lambda r, ns: SubscribeOk(1).encode()),
}
CONTROL_STREAM = {
    "subscribe-on-control-stream": Offence(lambda r, ns: _subscribe(r, ns).encode(), where="control"),
    "second-setup": Offence(lambda r, ns: Setup.build(implementation=b"again").encode(), where="control"),
    "control-stream-fin": Offence(lambda r, ns: b"", where="control", end_control=True),
}
NAMESPACE_LIMITS = {
    "empty-namespace-field": Offence(lambda r, ns: _raw_subscribe(r, ns, "Track Namespace",
                                                                  _namespace([*ns.fields[:-1], b""]))),
    "33-namespace-fields": Offence(lambda r, ns: _raw_subscribe(r, ns, "Track Namespace",
                                                                _namespace([*ns.fields, *[b"f"] * (33 - len(ns))]))),
    # the value classes a narrow check misses: all-ones (2^64-1 fields, no field follows) and one byte over the
    # Full Track Name bound (namespace field bytes + name = 4 097)
    "all-ones-field-count": Offence(lambda r, ns: _raw_subscribe(r, ns, "Track Namespace", vi64(2**64 - 1))),
    "full-track-name-4097-bytes": Offence(lambda r, ns: _raw_subscribe(
        r, ns, "Track Name", vi64(4097 - sum(map(len, ns.fields))) + b"n" * (4097 - sum(map(len, ns.fields))))),
}
# FILL_PARAMETERS holding FORWARD (0x10), which d22 Table 7 does not allow inside it.
_FILL_WITH_FORWARD = vi64(3) + vi64(1) + vi64(ParamType.FORWARD) + bytes([1])


def offend(relay: RelayUnderTest, offence: Offence, rng: np.random.Generator, expected: int | None,
           requirement: str) -> None:
    """Send the offence on a fresh session; the relay must close it with a MOQT session close (an application
    CONNECTION_CLOSE) carrying ``expected`` (None = any error code). That it keeps serving other sessions is
    the sanity probe's to see (after every check: a relay that dies with the offending session fails it)."""
    ns = relay.namespace(rng)
    data = offence.build(relay, ns)

    async def scenario() -> SessionClosed | None:
        client = await relay.connect("offender")
        try:
            # A round trip first: the relay is serving this session (its own state set up) when the defect arrives.
            await client.subscribe_namespace(TrackNamespace(ns.fields[:-1]), auth=relay.token("subscriber"))
            record("sent", "malformed control message", stream=offence.where, raw=data.hex())
            if offence.where == "control":
                client.send_raw(client.session.control_stream_id, data, end_stream=offence.end_control)
            elif offence.where == "uni":
                client.open_raw_stream(data, unidirectional=True, end_stream=True)
            else:
                client.open_raw_request(data, end_stream=True)
            try:
                closed: SessionClosed = await client.wait_closed(CLIENT_TIMEOUT)
            except TimeoutError:
                return None
            return closed
        finally:
            await client.close(timeout=CLOSE_WAIT)

    closed = run(scenario, what=f"{requirement}: the offending session", req=requirement)
    what = f"the relay's answer to the malformed message ({offence.where} stream)"
    expected_close = ("a session close with " + (f"{SessionError(expected).name} (0x{expected:x})"
                                                 if expected is not None else "an error code"))
    if closed is None:
        violation(what, req=requirement, seen=f"the session still open {CLIENT_TIMEOUT:g} s later",
                  expected=expected_close)
    record("received", "CONNECTION_CLOSE", code=closed.code, reason=closed.reason, by_peer=closed.by_peer,
           transport=closed.transport)
    check(closed.by_peer, what, req=requirement, seen=f"the harness closed the session itself ({closed.reason!r}) "
          "before the relay answered", expected=expected_close)
    check(not closed.transport, what, req=requirement,
          seen=f"a QUIC CONNECTION_CLOSE without a MOQT session close (QUIC code 0x{closed.code:x}, "
               f"{closed.reason!r})", expected=expected_close + " (an application CONNECTION_CLOSE, profile section 1)")
    if expected is None:
        check(closed.code != SessionError.NO_ERROR, f"{what}: Session Termination code", req=requirement,
              seen=f"NO_ERROR (0x0) {closed.reason!r}", expected="an error code")
    else:
        check_one_of(closed.code, {int(expected)}, what=f"{what}: Session Termination code ({closed.reason!r})",
                     req=requirement)


@pytest.mark.req("MOQT-CTRL-LENGTH-MISMATCH")
@pytest.mark.parametrize("case", sorted(LENGTH))
def test_message_length_mismatch(case: str, moqt_relay: RelayUnderTest, rng: np.random.Generator) -> None:
    offend(moqt_relay, LENGTH[case], rng, SessionError.PROTOCOL_VIOLATION, "MOQT-CTRL-LENGTH-MISMATCH")


@pytest.mark.req("MOQT-CTRL-UNKNOWN-TYPE")
@pytest.mark.parametrize("case", sorted(UNKNOWN_TYPE))
def test_unknown_message_type(case: str, moqt_relay: RelayUnderTest, rng: np.random.Generator) -> None:
    offend(moqt_relay, UNKNOWN_TYPE[case], rng, SessionError.PROTOCOL_VIOLATION,
           "MOQT-CTRL-UNKNOWN-TYPE")


@pytest.mark.req("MOQT-CTRL-REQUEST-ID-PARITY")
@pytest.mark.parametrize("case", sorted(PARITY))
def test_wrong_request_id(case: str, moqt_relay: RelayUnderTest, rng: np.random.Generator) -> None:
    offend(moqt_relay, PARITY[case], rng, SessionError.INVALID_REQUEST_ID,
           "MOQT-CTRL-REQUEST-ID-PARITY")


@pytest.mark.req("MOQT-PARAM-NOT-ALLOWED")
@pytest.mark.parametrize("case", sorted(NOT_ALLOWED))
def test_parameter_not_allowed_in_message(case: str, moqt_relay: RelayUnderTest, rng: np.random.Generator) -> None:
    offend(moqt_relay, NOT_ALLOWED[case], rng, SessionError.PROTOCOL_VIOLATION,
           "MOQT-PARAM-NOT-ALLOWED")


@pytest.mark.req("MOQT-CTRL-REQUEST-STREAM-FIRST")
@pytest.mark.parametrize("case", sorted(REQUEST_FIRST))
def test_response_message_opens_a_request_stream(case: str, moqt_relay: RelayUnderTest,
                                                 rng: np.random.Generator) -> None:
    offend(moqt_relay, REQUEST_FIRST[case], rng, SessionError.PROTOCOL_VIOLATION,
           "MOQT-CTRL-REQUEST-STREAM-FIRST")


@pytest.mark.req("MOQT-CTRL-CONTROL-STREAMS")
@pytest.mark.parametrize("case", sorted(CONTROL_STREAM))
def test_control_stream_misuse(case: str, moqt_relay: RelayUnderTest, rng: np.random.Generator) -> None:
    offend(moqt_relay, CONTROL_STREAM[case], rng, SessionError.PROTOCOL_VIOLATION,
           "MOQT-CTRL-CONTROL-STREAMS")


@pytest.mark.req("MOQT-CTRL-NAMESPACE-LIMITS")
@pytest.mark.parametrize("case", sorted(NAMESPACE_LIMITS))
def test_namespace_limits(case: str, moqt_relay: RelayUnderTest, rng: np.random.Generator) -> None:
    offend(moqt_relay, NAMESPACE_LIMITS[case], rng, SessionError.PROTOCOL_VIOLATION,
           "MOQT-CTRL-NAMESPACE-LIMITS")


@pytest.mark.req("MOQT-PARAM-FILL-PARAMETERS")
def test_forbidden_parameter_inside_fill_parameters(moqt_relay: RelayUnderTest, rng: np.random.Generator) -> None:
    offence = Offence(lambda r, ns: _with_params(r, ns, RawParam(ParamType.LOCATION_FILTER, b"\x05"),
                                                 RawParam(ParamType.FILL_PARAMETERS, _FILL_WITH_FORWARD)))
    offend(moqt_relay, offence, rng, SessionError.PROTOCOL_VIOLATION, "MOQT-PARAM-FILL-PARAMETERS")


@pytest.mark.req("MOQT-PARAM-LOCATION-FILTER")
@pytest.mark.parametrize("filter_type", [0x06, 0x2A])
def test_unknown_location_filter_type(filter_type: int, moqt_relay: RelayUnderTest, rng: np.random.Generator) -> None:
    offence = Offence(lambda r, ns: _with_params(r, ns, RawParam(ParamType.LOCATION_FILTER, vi64(filter_type))))
    offend(moqt_relay, offence, rng, SessionError.PROTOCOL_VIOLATION, "MOQT-PARAM-LOCATION-FILTER")


@pytest.mark.req("MOQT-CTRL-UNKNOWN-STREAM-TYPE")
@pytest.mark.parametrize("stream_type", [0x06, 0x0F, 0x80, 0x2F01])
def test_unknown_unidirectional_stream_type(stream_type: int, moqt_relay: RelayUnderTest,
                                            rng: np.random.Generator) -> None:
    """Any other first vi64 closes the session (profile section 9.1; no code is named, so any error code)."""
    offence = Offence(lambda r, ns: vi64(stream_type) + b"\x00\x00\x00", where="uni")
    offend(moqt_relay, offence, rng, None, "MOQT-CTRL-UNKNOWN-STREAM-TYPE")
