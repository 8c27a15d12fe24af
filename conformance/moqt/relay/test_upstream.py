"""moqt-relay: the requests the relay itself sends upstream to a publisher (moqt-d22-profile sections 3.3,
4.3, 5, 12).

The harness publisher sees every request the relay opens on its session (``on_request``): their Request
IDs, their parameters, and when they arrive relative to what the subscribers see.
"""

from __future__ import annotations

import asyncio
import itertools
from typing import Any

import numpy as np
import pytest

from kvconform.fixtures.moqt import (
    CLIENT_TIMEOUT,
    TRACK_NAME,
    RelayUnderTest,
    fetch,
    publisher,
    record,
    rejection,
    run_findings,
    session,
    subscribe,
    waiting,
)
from kvconform.moqt.client import RequestRejected, SessionEnded
from kvconform.moqt.filters import RangeFilter
from kvconform.moqt.messages import Subscribe
from kvconform.moqt.session import RequestReceived
from kvconform.moqt.structures import AuthToken, ParamType, SetupOption, TrackNamespace
from kvconform.verdicts import Findings

pytestmark = pytest.mark.usefixtures("moqt_relay_sanity")

HOLD = 0.5  # seconds the publisher withholds its SUBSCRIBE_OK; the subscriber must see no answer meanwhile


@pytest.mark.req("MOQT-RELAY-ESTABLISHED-BEFORE-OK")
def test_subscribe_ok_only_after_the_upstream_subscription_is_established(moqt_relay: RelayUnderTest,
                                                                          rng: np.random.Generator) -> None:
    """The publisher holds the relay's SUBSCRIBE unanswered; the subscriber's SUBSCRIBE must stay unanswered
    too (a bounded negative observation of HOLD seconds), and be answered once the publisher answers."""
    held: list[RequestReceived] = []
    arrived = asyncio.Event()

    def hold(client: Any, event: RequestReceived) -> bool:
        if isinstance(event.message, Subscribe) and event.message.TYPE == Subscribe.TYPE:
            held.append(event)
            arrived.set()
            return True  # handled: no answer yet
        return False

    req = "MOQT-RELAY-ESTABLISHED-BEFORE-OK"

    async def scenario(f: Findings) -> None:
        ns = moqt_relay.namespace(rng)
        async with publisher(moqt_relay, ns, on_request=hold) as pub, session(moqt_relay, "subscriber") as client:
            pub.publish(0, 0, b"before")
            sub = await subscribe(client, ns, fill=False, auth=moqt_relay.token("subscriber"), wait=False)
            with waiting("the relay's upstream SUBSCRIBE at the publisher"):
                await asyncio.wait_for(arrived.wait(), CLIENT_TIMEOUT)
            try:
                await asyncio.wait_for(asyncio.shield(sub.answer), HOLD)
                f.add(req, f"answer to the SUBSCRIBE while the upstream SUBSCRIBE is unanswered: seen "
                           f"{type(sub.answer.result()).__name__}, expected none until the publisher answers")
            except TimeoutError:
                record("note", "no answer while the upstream SUBSCRIBE is held", seconds=HOLD)
                f.expect(True, req, "")
            pub.track.serve_subscribe(held[0].request)
            with waiting("SUBSCRIBE_OK once the publisher answered the upstream SUBSCRIBE", req):
                await sub.wait_ok(CLIENT_TIMEOUT)

    run_findings("SUBSCRIBE_OK after upstream", scenario, req=req)


@pytest.mark.req("MOQT-CTRL-REQUEST-ID-SEQUENCE", "MOQT-PARAM-HOP-BY-HOP", "MOQT-SETUP-MAX-FILTER-RANGES")
def test_the_relays_own_requests(moqt_relay: RelayUnderTest, rng: np.random.Generator) -> None:
    """Subscriptions to two tracks and a FETCH make the relay open requests on the publisher's session:
    their Request IDs are odd, from 1, +2 each (the relay is the server); they carry none of the
    subscribers' tokens (parameters are hop-by-hop) and no Range Filter, which the publisher's SETUP
    (no MAX_FILTER_RANGES = 0) does not allow, although the subscribers sent OBJECTID_FILTERs."""
    seen: list[tuple[int, str, tuple[Any, ...]]] = []

    def observe(client: Any, event: RequestReceived) -> bool:
        params = getattr(event.message, "parameters", None)
        seen.append((event.request.request_id, type(event.message).__name__, tuple(params or ())))
        return False  # the publisher answers as usual

    async def scenario(f: Findings) -> None:
        base = moqt_relay.namespace(rng)
        ns_b = TrackNamespace((*base.fields[:-1], moqt_relay.field(rng, 16)))
        token = moqt_relay.token("subscriber")
        async with publisher(moqt_relay, base, on_request=observe, max_filter_ranges=None) as pub, \
                session(moqt_relay, "subscriber") as client:
            pub.client.track(ns_b, TRACK_NAME).publish_object(0, 0, b"b")
            await pub.client.publish_namespace(ns_b, auth=moqt_relay.token("publisher"))
            pub.publish(0, 0, b"a0")
            pub.publish(0, 1, b"a1")
            # The OBJECTID_FILTER only when the relay's SETUP allows Range Filters (a relay may announce
            # MAX_FILTER_RANGES 0: then sending one would be the harness's error, profile §5); the relay's own
            # requests must carry none either way.
            setup = client.session.peer_setup
            limit = [kv.value for kv in setup.options if kv.type == SetupOption.MAX_FILTER_RANGES] if setup else []
            filters = (RangeFilter.first_objects(1),) if limit and limit[0] else ()
            if not filters:
                record("note", "the relay's SETUP allows no Range Filters: the first SUBSCRIBE carries none")
            await subscribe(client, base, auth=token, range_filters=filters)
            await subscribe(client, ns_b, fill=False, auth=token)
            other = TrackNamespace((*base.fields[:-1], moqt_relay.field(rng, 16)))
            pub.client.track(other, TRACK_NAME).publish_object(0, 0, b"c")
            await pub.client.publish_namespace(other, auth=moqt_relay.token("publisher"))
            await fetch(client, other, auth=token)
        record("note", "requests the relay sent to the publisher", requests=[(r, k) for r, k, _ in seen])
        rids = [rid for rid, _, _ in seen]
        f.expect(bool(rids) and rids[0] == 1 and all(b - a == 2 for a, b in itertools.pairwise(rids)),
                 "MOQT-CTRL-REQUEST-ID-SEQUENCE",
                 f"Request IDs of the relay's requests to the publisher, in arrival order: seen {rids}, expected 1, 3, "
                 "5, ... (the relay is the server)")
        tokens = {t.value for t in token if isinstance(t, AuthToken)}
        f.expect(True, "MOQT-PARAM-HOP-BY-HOP", "")
        f.expect(True, "MOQT-SETUP-MAX-FILTER-RANGES", "")
        for rid, kind, params in seen:
            for p in params:
                if p.type == ParamType.AUTHORIZATION_TOKEN and getattr(p.value, "value", None) in tokens:
                    f.add("MOQT-PARAM-HOP-BY-HOP", f"{kind} (Request ID {rid}) parameters: seen the subscriber's "
                                                   "AUTHORIZATION_TOKEN, expected none of the downstream parameters")
                if 0x25 <= p.type <= 0x29:
                    f.add("MOQT-SETUP-MAX-FILTER-RANGES", f"{kind} (Request ID {rid}) parameters: seen Range Filter "
                                                          f"0x{p.type:x}, expected none (the publisher's SETUP has no "
                                                          "MAX_FILTER_RANGES: 0)")

    run_findings("the relay's upstream requests", scenario)


@pytest.mark.req("MOQT-ERR-UNKNOWN-CODE")
def test_unknown_error_code_from_upstream_keeps_the_session(moqt_relay: RelayUnderTest,
                                                           rng: np.random.Generator) -> None:
    """The publisher refuses the relay's SUBSCRIBE with REQUEST_ERROR code 0x7ABC, in no registry: the
    relay treats it as INTERNAL_ERROR, refuses downstream, and keeps the publisher's session."""

    def refuse_oddly(client: Any, event: RequestReceived) -> bool:
        if isinstance(event.message, Subscribe) and event.message.TYPE == Subscribe.TYPE:
            client.session.reject(event.stream_id, 0x7ABC, "kvconform: a code in no registry")
            return True
        return False

    req = "MOQT-ERR-UNKNOWN-CODE"

    async def scenario(f: Findings) -> None:
        ns = moqt_relay.namespace(rng)
        async with publisher(moqt_relay, ns, on_request=refuse_oddly) as pub, \
                session(moqt_relay, "subscriber") as client:
            pub.publish(0, 0, b"x")
            try:
                await subscribe(client, ns, fill=False, auth=moqt_relay.token("subscriber"))
                f.add(req, "SUBSCRIBE whose only publisher refused the relay's SUBSCRIBE: seen accepted, expected a "
                           "REQUEST_ERROR")
            except RequestRejected as exc:
                record("received", "REQUEST_ERROR", code=exc.code)
                f.expect(exc.error is not None, req, f"SUBSCRIBE whose only publisher refused the relay's SUBSCRIBE: "
                                                     f"seen {rejection(exc)}, expected a REQUEST_ERROR")
            more = TrackNamespace((*ns.fields[:-1], moqt_relay.field(rng, 16)))
            try:  # the publisher's session is still served
                with waiting("REQUEST_OK to the publisher's next PUBLISH_NAMESPACE", req):
                    await pub.client.publish_namespace(more, auth=moqt_relay.token("publisher"))
            except (RequestRejected, SessionEnded) as exc:  # a closed session or a refusal: the relay dropped it
                f.add(req, f"the publisher's session after the unknown code: seen {exc}, expected still served")
            closed = pub.client.session.closed
            f.expect(closed is None, req, f"the publisher's session after the unknown code: seen closed ({closed}), "
                                          "expected open")

    run_findings("unknown REQUEST_ERROR code", scenario, req=req)
