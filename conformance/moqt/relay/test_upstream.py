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
    run_check,
    session,
    subscribe,
)
from kvconform.moqt.filters import RangeFilter
from kvconform.moqt.messages import Subscribe
from kvconform.moqt.session import RequestReceived
from kvconform.moqt.structures import AuthToken, ParamType, TrackNamespace

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

    async def scenario() -> list[str]:
        ns = moqt_relay.namespace(rng)
        problems: list[str] = []
        async with publisher(moqt_relay, ns, on_request=hold) as pub, session(moqt_relay, "subscriber") as client:
            pub.publish(0, 0, b"before")
            sub = await subscribe(client, ns, fill=False, auth=moqt_relay.token("subscriber"), wait=False)
            await asyncio.wait_for(arrived.wait(), CLIENT_TIMEOUT)  # the relay's upstream SUBSCRIBE arrived
            try:
                await asyncio.wait_for(asyncio.shield(sub.answer), HOLD)
                problems.append(f"the relay answered the SUBSCRIBE ({type(sub.answer.result()).__name__}) while its "
                                "upstream SUBSCRIBE was still unanswered")
            except TimeoutError:
                record("note", "no answer while the upstream SUBSCRIBE is held", seconds=HOLD)
            pub.track.serve_subscribe(held[0].request)
            await sub.wait_ok(CLIENT_TIMEOUT)
        return problems

    run_check(scenario, "MOQT-RELAY-ESTABLISHED-BEFORE-OK", "SUBSCRIBE_OK after upstream")


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

    async def scenario() -> list[str]:
        base = moqt_relay.namespace(rng)
        ns_b = TrackNamespace((*base.fields[:-1], rng.bytes(16)))
        token = moqt_relay.token("subscriber")
        problems: list[str] = []
        async with publisher(moqt_relay, base, on_request=observe, max_filter_ranges=None) as pub, \
                session(moqt_relay, "subscriber") as client:
            pub.client.track(ns_b, TRACK_NAME).publish_object(0, 0, b"b")
            await pub.client.publish_namespace(ns_b, auth=moqt_relay.token("publisher"))
            pub.publish(0, 0, b"a0")
            pub.publish(0, 1, b"a1")
            await subscribe(client, base, auth=token, range_filters=(RangeFilter.first_objects(1),))
            await subscribe(client, ns_b, fill=False, auth=token)
            other = TrackNamespace((*base.fields[:-1], rng.bytes(16)))
            pub.client.track(other, TRACK_NAME).publish_object(0, 0, b"c")
            await pub.client.publish_namespace(other, auth=moqt_relay.token("publisher"))
            await fetch(client, other, auth=token)
        record("note", "requests the relay sent to the publisher", requests=[(r, k) for r, k, _ in seen])
        rids = [rid for rid, _, _ in seen]
        if not rids:
            return ["the relay sent no request to the publisher"]
        if rids[0] != 1 or any(b - a != 2 for a, b in itertools.pairwise(rids)):
            problems.append(f"Request IDs of the relay's requests in arrival order: {rids}; a server's are 1, 3, "
                            "5, ... (MOQT-CTRL-REQUEST-ID-SEQUENCE)")
        tokens = {t.value for t in token if isinstance(t, AuthToken)}
        for rid, kind, params in seen:
            for p in params:
                if p.type == ParamType.AUTHORIZATION_TOKEN and getattr(p.value, "value", None) in tokens:
                    problems.append(f"{kind} (Request ID {rid}) carries the subscriber's AUTHORIZATION_TOKEN "
                                    "(MOQT-PARAM-HOP-BY-HOP)")
                if 0x25 <= p.type <= 0x29:
                    problems.append(f"{kind} (Request ID {rid}) carries Range Filter 0x{p.type:x} although the "
                                    "publisher's SETUP allows none (MOQT-SETUP-MAX-FILTER-RANGES)")
        return problems

    run_check(scenario, "MOQT relay upstream requests", "the relay's upstream requests")


@pytest.mark.req("MOQT-ERR-UNKNOWN-CODE")
def test_unknown_error_code_from_upstream_keeps_the_session(moqt_relay: RelayUnderTest,
                                                           rng: np.random.Generator) -> None:
    """The publisher refuses the relay's SUBSCRIBE with REQUEST_ERROR code 0x7ABC, in no registry: the
    relay treats it as INTERNAL_ERROR, refuses downstream, and keeps the publisher's session."""
    from kvconform.moqt.client import RequestRejected

    def refuse_oddly(client: Any, event: RequestReceived) -> bool:
        if isinstance(event.message, Subscribe) and event.message.TYPE == Subscribe.TYPE:
            client.session.reject(event.stream_id, 0x7ABC, "kvconform: a code in no registry")
            return True
        return False

    async def scenario() -> list[str]:
        ns = moqt_relay.namespace(rng)
        problems: list[str] = []
        async with publisher(moqt_relay, ns, on_request=refuse_oddly) as pub, \
                session(moqt_relay, "subscriber") as client:
            pub.publish(0, 0, b"x")
            try:
                await subscribe(client, ns, fill=False, auth=moqt_relay.token("subscriber"))
                problems.append("SUBSCRIBE accepted although the only publisher refused the relay's SUBSCRIBE")
            except RequestRejected as exc:
                record("received", "REQUEST_ERROR", code=exc.code)
            more = TrackNamespace((*ns.fields[:-1], rng.bytes(16)))
            try:  # the publisher's session is still served
                await pub.client.publish_namespace(more, auth=moqt_relay.token("publisher"))
            except Exception as exc:  # a closed session or a refusal both mean the relay dropped it
                problems.append(f"after the unknown code the publisher's session is no longer served: {exc!r}")
            if pub.client.session.closed is not None:
                problems.append(f"the relay closed the publisher's session: {pub.client.session.closed}")
        return problems

    run_check(scenario, "MOQT-ERR-UNKNOWN-CODE", "unknown REQUEST_ERROR code")
