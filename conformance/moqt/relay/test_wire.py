"""moqt-relay: what the relay writes decodes under the draft-22 wire rules (moqt-d22-profile sections 1-9).

The harness decodes everything strictly with kvconform.moqt (its own vi64, framing, Key-Value-Pair,
parameter, subgroup and fetch codecs): a relay byte that breaks a layout rule makes the harness close its
own session with the decode error, which this check reports. The exchange touches every kind of relay
output: SETUP on the relay's control stream, REQUEST_OK / REQUEST_ERROR (with a Reason Phrase),
SUBSCRIBE_OK with Track Properties, NAMESPACE, subgroup streams with Object Properties and status objects,
a fill stream and a FETCH stream.
"""

from __future__ import annotations

import numpy as np
import pytest

from kvconform.fixtures.moqt import (
    CLIENT_TIMEOUT,
    RelayUnderTest,
    fetch,
    publisher,
    record,
    run_check,
    session,
    subscribe,
)
from kvconform.moqt.client import RequestRejected
from kvconform.moqt.craft import CraftedMessage, vi64
from kvconform.moqt.messages import RequestOk, SubscribeNamespace
from kvconform.moqt.quic import ALPN
from kvconform.moqt.structures import (
    KeyValuePair,
    Parameter,
    Parameters,
    ParamType,
    SetupOption,
    TrackNamespace,
    encode_kvps,
)

pytestmark = pytest.mark.usefixtures("moqt_relay_sanity")


@pytest.mark.req("MOQT-SETUP-ALPN", "MOQT-SETUP-OPTIONS", "MOQT-SETUP-PATH", "MOQT-CTRL-CONTROL-STREAMS",
                 "MOQT-WIRE-VI64", "MOQT-CTRL-FRAMING", "MOQT-CTRL-KVP", "MOQT-CTRL-REASON-PHRASE",
                 "MOQT-PARAM-ENCODING", "MOQT-PARAM-ASCENDING", "MOQT-DATA-SUBGROUP-HEADER",
                 "MOQT-DATA-OBJECT-STATUS", "MOQT-FETCH-OBJECT-ENCODING", "MOQT-SUB-ONE-RESPONSE",
                 "MOQT-SUB-TRACK-ALIAS")
def test_everything_the_relay_writes_decodes(moqt_relay: RelayUnderTest, rng: np.random.Generator) -> None:
    props = encode_kvps([KeyValuePair(0x78, int(rng.integers(0, 1 << 40))), KeyValuePair(0x79, rng.bytes(9))])
    track_props = (KeyValuePair(0x78, 5), KeyValuePair(0x7B, b"app-defined"))

    async def scenario() -> list[str]:
        problems: list[str] = []
        ns = moqt_relay.namespace(rng)
        other = TrackNamespace((*ns.fields[:-1], rng.bytes(16)))
        token = moqt_relay.token("subscriber")
        async with publisher(moqt_relay, ns, properties=track_props, object_properties=True) as pub, \
                publisher(moqt_relay, other) as pub2, session(moqt_relay, "subscriber") as client:
            session_ = client.session
            if client.connection.alpn != ALPN:
                problems.append(f"ALPN {client.connection.alpn!r}, expected {ALPN!r}")
            setup = session_.peer_setup
            control = session_.peer_control_stream_id
            if setup is None or control is None or not control & 2:
                problems.append(f"no SETUP on a unidirectional control stream from the relay (stream {control})")
            else:
                sent = {kv.type for kv in setup.options}
                for opt in (SetupOption.PATH, SetupOption.AUTHORITY):
                    if opt in sent:
                        problems.append(f"the relay's SETUP carries {SetupOption(opt).name}, a client-only option")
                record("received", "SETUP", options=[(kv.type, kv.value) for kv in setup.options])
            watcher = await client.subscribe_namespace(TrackNamespace(ns.fields[:-1]), auth=token)
            for o in range(3):
                pub.publish(0, o, rng.bytes(int(rng.integers(1, 2000))), properties=props if o != 1 else b"")
            pub.end_of_group(0, 3)
            sub = await subscribe(client, ns, auth=token)
            pub2.publish(0, 0, b"other track")
            sub2 = await subscribe(client, other, fill=False, auth=token)
            ok1, ok2 = sub.ok, sub2.ok
            if ok1 is not None and ok2 is not None and ok1.track_alias == ok2.track_alias:
                problems.append(f"two tracks subscribed in one session share Track Alias {ok1.track_alias}")
            pub.publish(1, 0, rng.bytes(300), properties=props)
            pub.end_of_group(1, 1)
            pub.end_track()
            await sub.wait_fill(CLIENT_TIMEOUT)
            await sub.wait_complete(CLIENT_TIMEOUT)
            await fetch(client, ns, auth=token)
            try:
                await subscribe(client, TrackNamespace((*ns.fields[:-1], rng.bytes(16))), auth=token)
                problems.append("SUBSCRIBE to a track without publisher was accepted")
            except RequestRejected as exc:
                record("received", "REQUEST_ERROR", code=exc.code, reason=exc.error.reason if exc.error else None)
            await watcher.next(CLIENT_TIMEOUT)
            if session_.closed is not None:
                problems.append(f"the harness had to close its session: {session_.closed.reason}")
        return problems

    run_check(scenario, "MOQT wire format", "wire format")


@pytest.mark.req("MOQT-WIRE-VI64-NONMINIMAL")
def test_non_minimal_integers_are_accepted(moqt_relay: RelayUnderTest, rng: np.random.Generator) -> None:
    """A SUBSCRIBE_NAMESPACE whose Request ID, field count, field lengths and parameter count use longer
    (legal) vi64 encodings is answered REQUEST_OK like the minimal one (profile section 2)."""
    async def scenario() -> list[str]:
        prefix = TrackNamespace((*moqt_relay.access.prefix.fields, rng.bytes(8)))
        params = Parameters(tuple(Parameter(ParamType.AUTHORIZATION_TOKEN, t)
                                  for t in moqt_relay.token("subscriber")))
        msg = CraftedMessage.from_message(SubscribeNamespace(0, prefix, params))
        wide_ns = vi64(len(prefix), 4) + b"".join(vi64(len(f), 2) + f for f in prefix.fields)
        data = (msg.set_vi64("Request ID", 0, 8).set("Track Namespace Prefix", wide_ns)
                .set("Parameters", b"\x80" + msg.get("Parameters"))).build()  # count 80 0N = N
        record("sent", "SUBSCRIBE_NAMESPACE (non-minimal vi64)", raw=data.hex())
        async with session(moqt_relay, "subscriber") as client:
            raw = client.open_raw_request(data)
            event = await raw.next_event(CLIENT_TIMEOUT)
            message = getattr(event, "message", None)
            if not isinstance(message, RequestOk):
                return [f"answered {event!r}, expected REQUEST_OK"]
            if client.session.closed is not None:
                return [f"session closed: {client.session.closed}"]
        return []

    run_check(scenario, "MOQT-WIRE-VI64-NONMINIMAL", "non-minimal vi64")
