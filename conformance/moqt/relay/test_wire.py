"""moqt-relay: the SETUP exchange, and what the relay writes decodes under the draft-22 wire rules
(moqt-d22-profile sections 1-9).

The harness decodes everything strictly with kvconform.moqt (its own vi64, framing, Key-Value-Pair,
parameter, subgroup and fetch codecs): a relay byte that breaks a layout rule makes the harness close its
own session with the decode error, which the decoding check reports under the rule the bytes broke. The
exchange touches every kind of relay output: SETUP on the relay's control stream, REQUEST_OK / REQUEST_ERROR
(with a Reason Phrase), SUBSCRIBE_OK with Track Properties, NAMESPACE, subgroup streams with Object Properties
and status objects, a fill stream and a FETCH stream.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import numpy as np
import pytest

from kvconform.fixtures.moqt import (
    CLIENT_TIMEOUT,
    CLOSE_WAIT,
    RelayUnderTest,
    expect_none,
    fetch,
    harness_close_requirement,
    publisher,
    record,
    refused,
    run,
    run_findings,
    session,
    subscribe,
    waiting,
)
from kvconform.moqt.client import SessionEnded
from kvconform.moqt.craft import CraftedMessage, vi64
from kvconform.moqt.messages import RequestOk, SubscribeNamespace
from kvconform.moqt.parameters import Parameter, Parameters
from kvconform.moqt.quic import ALPN
from kvconform.moqt.structures import KeyValuePair, ParamType, SetupOption, TrackNamespace, encode_kvps
from kvconform.verdicts import Findings, check

pytestmark = pytest.mark.usefixtures("moqt_relay_sanity")

# Setup Options no registry knows (even: a vi64 value, odd: bytes), the even one twice: ignored (profile section 5).
UNKNOWN_OPTIONS = (KeyValuePair(0x3E, 7), KeyValuePair(0x3E, 9), KeyValuePair(0x3F, b"kvconform"))


@pytest.mark.req("MOQT-SETUP-ALPN", "MOQT-CTRL-CONTROL-STREAMS", "MOQT-SETUP-PATH", "MOQT-SETUP-OPTIONS")
def test_the_relay_answers_setup(moqt_relay: RelayUnderTest, rng: np.random.Generator) -> None:
    """A session whose SETUP carries unknown Setup Options (one of them twice) is served like any other; the
    relay's own SETUP comes on a unidirectional control stream over ALPN moqt-22, carries no client-only
    option (PATH, AUTHORITY) and repeats no known option but AUTHORIZATION TOKEN."""
    async def scenario(f: Findings) -> None:
        try:
            client = await moqt_relay.connect("subscriber with unknown Setup Options",
                                              extra_setup_options=UNKNOWN_OPTIONS)
        except SessionEnded as exc:
            f.add("MOQT-SETUP-OPTIONS", f"SETUP with unknown Setup Options 0x3e (twice), 0x3f: seen the session "
                                        f"closed ({exc}), expected them ignored")
            return
        try:
            f.expect(client.connection.alpn == ALPN, "MOQT-SETUP-ALPN",
                     f"negotiated ALPN: seen {client.connection.alpn!r}, expected {ALPN!r}")
            setup, control = client.session.peer_setup, client.session.peer_control_stream_id
            f.expect(control is not None and control & 2, "MOQT-CTRL-CONTROL-STREAMS",
                     f"the relay's SETUP: seen on stream {control}, expected on a unidirectional stream")
            sent = [kv.type for kv in setup.options] if setup is not None else []
            record("received", "SETUP", options=[(kv.type, kv.value) for kv in setup.options] if setup else None)
            client_only = [SetupOption(t).name for t in sent if t in (SetupOption.PATH, SetupOption.AUTHORITY)]
            f.expect(not client_only, "MOQT-SETUP-PATH",
                     f"the relay's SETUP options: seen {client_only}, client-only options a server never sends")
            known = {int(o) for o in SetupOption} - {SetupOption.AUTHORIZATION_TOKEN}
            repeated = sorted(f"0x{t:x}" for t, n in Counter(sent).items() if n > 1 and t in known)
            f.expect(not repeated, "MOQT-SETUP-OPTIONS",
                     f"the relay's SETUP: known options {repeated} repeated, expected each at most once")
            prefix = TrackNamespace((*moqt_relay.access.prefix.fields, moqt_relay.field(rng, 8)))
            with waiting("REQUEST_OK to SUBSCRIBE_NAMESPACE on the session with unknown Setup Options",
                         "MOQT-SETUP-OPTIONS"):
                await client.subscribe_namespace(prefix, auth=moqt_relay.token("subscriber"))
            f.expect(client.session.closed is None, "MOQT-SETUP-OPTIONS",
                     f"the session with unknown Setup Options: seen closed ({client.session.closed}), expected served")
        finally:
            await client.close(timeout=CLOSE_WAIT)

    run_findings("the relay's SETUP", scenario)


DECODED = ("MOQT-WIRE-VI64", "MOQT-CTRL-FRAMING", "MOQT-CTRL-KVP", "MOQT-CTRL-REASON-PHRASE", "MOQT-PARAM-ENCODING",
           "MOQT-PARAM-ASCENDING", "MOQT-DATA-SUBGROUP-HEADER", "MOQT-DATA-OBJECT-STATUS", "MOQT-FETCH-OBJECT-ENCODING")


@pytest.mark.req("MOQT-WIRE-VI64", "MOQT-CTRL-FRAMING", "MOQT-CTRL-KVP", "MOQT-CTRL-REASON-PHRASE",
                 "MOQT-PARAM-ENCODING", "MOQT-PARAM-ASCENDING", "MOQT-DATA-SUBGROUP-HEADER", "MOQT-DATA-OBJECT-STATUS",
                 "MOQT-FETCH-OBJECT-ENCODING", "MOQT-SUB-ONE-RESPONSE", "MOQT-SUB-TRACK-ALIAS")
def test_everything_the_relay_writes_decodes(moqt_relay: RelayUnderTest, rng: np.random.Generator) -> None:
    """Each layout rule is asserted by the strict decoder: had a relay byte broken it, the harness would have
    closed its session naming that rule. Besides: two tracks of one session never share a Track Alias, and a
    SUBSCRIBE to a track no one publishes gets exactly one answer, a REQUEST_ERROR."""
    props = encode_kvps([KeyValuePair(0x78, int(rng.integers(0, 1 << 40))), KeyValuePair(0x79, rng.bytes(9))])
    track_props = (KeyValuePair(0x78, 5), KeyValuePair(0x7B, b"app-defined"))

    async def exchange(f: Findings, client: Any) -> None:
        ns = moqt_relay.namespace(rng)
        other = TrackNamespace((*ns.fields[:-1], moqt_relay.field(rng, 16)))
        token = moqt_relay.token("subscriber")
        async with publisher(moqt_relay, ns, properties=track_props, object_properties=True) as pub, \
                publisher(moqt_relay, other) as pub2:
            watcher = await client.subscribe_namespace(TrackNamespace(ns.fields[:-1]), auth=token)
            for o in range(3):
                pub.publish(0, o, rng.bytes(int(rng.integers(1, 2000))), properties=props if o != 1 else b"")
            pub.end_of_group(0, 3)
            sub = await subscribe(client, ns, auth=token)
            pub2.publish(0, 0, b"other track")
            sub2 = await subscribe(client, other, fill=False, auth=token)
            aliases = (sub.ok.track_alias, sub2.ok.track_alias)
            f.expect(aliases[0] != aliases[1], "MOQT-SUB-TRACK-ALIAS",
                     f"Track Alias of two tracks subscribed in one session: seen {aliases}, expected two aliases")
            pub.publish(1, 0, rng.bytes(300), properties=props)
            pub.end_of_group(1, 1)
            pub.end_track()
            with waiting("the end of the fill stream"):
                await sub.wait_fill(CLIENT_TIMEOUT)
            with waiting("PUBLISH_DONE and the subscription's data streams"):
                await sub.wait_complete(CLIENT_TIMEOUT)
            await fetch(client, ns, auth=token)
            nobody = TrackNamespace((*ns.fields[:-1], moqt_relay.field(rng, 16)))
            expect_none(f, "MOQT-SUB-ONE-RESPONSE", [p for p in [await refused(
                f"SUBSCRIBE to {nobody}, a track no one publishes", subscribe(client, nobody, auth=token))] if p])
            with waiting("NAMESPACE for the publications under the watched prefix"):
                await watcher.next(CLIENT_TIMEOUT)

    async def scenario(f: Findings) -> None:
        async with session(moqt_relay, "subscriber") as client:
            try:
                await exchange(f, client)
            except SessionEnded as exc:
                if exc.closed.by_peer:
                    raise  # the relay ended it: the policy judges
                # The harness's decoder refused relay bytes: the rule they broke fails, the others held.
                f.add(harness_close_requirement(exc.closed.code, exc.closed.reason, exc.setup_received),
                      "the relay wrote what does not decode: the harness closed its session with "
                      f"0x{exc.closed.code:x}: {exc.closed.reason}")
            closed = client.session.closed
            if closed is not None and not f.problems:  # closed after the last wait: no exception told it
                f.add(harness_close_requirement(closed.code, closed.reason, True),
                      f"the session ended during the exchange: {closed}")
            for req in DECODED:  # every layout rule held for everything decoded so far
                f.expect(True, req, "")

    run_findings("wire format of everything the relay wrote", scenario)


@pytest.mark.req("MOQT-WIRE-VI64-NONMINIMAL")
def test_non_minimal_integers_are_accepted(moqt_relay: RelayUnderTest, rng: np.random.Generator) -> None:
    """A SUBSCRIBE_NAMESPACE whose Request ID, field count, field lengths and parameter count use longer
    (legal) vi64 encodings is answered REQUEST_OK like the minimal one (profile section 2)."""
    prefix = TrackNamespace((*moqt_relay.access.prefix.fields, moqt_relay.field(rng, 8)))
    params = Parameters(tuple(Parameter(ParamType.AUTHORIZATION_TOKEN, t) for t in moqt_relay.token("subscriber")))
    msg = CraftedMessage.from_message(SubscribeNamespace(0, prefix, params))
    wide_ns = vi64(len(prefix), 4) + b"".join(vi64(len(f), 2) + f for f in prefix.fields)
    data = (msg.set_vi64("Request ID", 0, 8).set("Track Namespace Prefix", wide_ns)
            .set("Parameters", b"\x80" + msg.get("Parameters"))).build()  # count 80 0N = N

    async def scenario() -> tuple[str, Any]:
        record("sent", "SUBSCRIBE_NAMESPACE (non-minimal vi64)", raw=data.hex())
        async with session(moqt_relay, "subscriber") as client:
            raw = client.open_raw_request(data)
            try:
                with waiting("the answer to SUBSCRIBE_NAMESPACE with non-minimal vi64", "MOQT-WIRE-VI64-NONMINIMAL"):
                    event = await raw.next_event(CLIENT_TIMEOUT)
            except SessionEnded as exc:
                return "session closed", exc.closed
            return type(getattr(event, "message", event)).__name__, client.session.closed

    answer, closed = run(scenario, what="SUBSCRIBE_NAMESPACE with non-minimal vi64")
    check(answer == RequestOk.__name__ and closed is None, "answer to SUBSCRIBE_NAMESPACE with non-minimal vi64 "
          "(Request ID 8 octets, field count 4, field lengths 2, parameter count 2)", req="MOQT-WIRE-VI64-NONMINIMAL",
          seen=f"{answer}{f', session closed {closed}' if closed else ''}", expected="REQUEST_OK, session open")
