"""moqt-relay: namespace discovery and routing by namespace prefix (moqt-d22-profile section 12).

Prefix matching is field by field with exact bytes: a namespace whose field only *starts with* the
prefix's bytes (the (foobar) vs (foo) case) must not match. The harness publishes matching and
near-miss namespaces from two sessions, before and after the SUBSCRIBE_NAMESPACE, then withdraws some.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from kvconform.fixtures.moqt import (
    CLIENT_TIMEOUT,
    CLOSE_WAIT,
    TRACK_NAME,
    RelayUnderTest,
    expect_none,
    publisher,
    record,
    refusal_problem,
    rejection,
    run_findings,
    session,
    subscribe,
    waiting,
)
from kvconform.moqt.client import RequestRejected
from kvconform.moqt.errors import RequestErrorCode
from kvconform.moqt.structures import TrackNamespace
from kvconform.verdicts import Findings

pytestmark = pytest.mark.usefixtures("moqt_relay_sanity")

PREFIX_OVERLAP: set[int] = {RequestErrorCode.PREFIX_OVERLAP}
DOES_NOT_EXIST: set[int] = {RequestErrorCode.DOES_NOT_EXIST}


async def _publish(client: Any, relay: RelayUnderTest, ns: TrackNamespace) -> Any:
    record("sent", "PUBLISH_NAMESPACE", namespace=str(ns))
    return await client.publish_namespace(ns, auth=relay.token("publisher"))


async def _collect(f: Findings, req: str, watcher: Any, wanted: list[tuple[str, TrackNamespace]]) -> None:
    """Read notices until every wanted one arrived (bounded by the caller); anything else is a problem of
    ``req``."""
    pending = list(wanted)
    f.expect(True, req, "")
    with waiting(f"{', '.join(f'{k.upper()} {s}' for k, s in pending)} at the namespace subscriber",
                 "MOQT-NS-SUBSCRIBE-NAMESPACE"):
        while pending:
            notice = await watcher.next(CLIENT_TIMEOUT)
            record("received", "NAMESPACE" if notice[0] == "namespace" else "NAMESPACE_DONE", suffix=str(notice[1]))
            if notice in pending:
                pending.remove(notice)
            else:
                f.add(req, f"notice to the namespace subscriber: seen {notice[0].upper()} for suffix {notice[1]}, "
                           f"expected only {', '.join(f'{k.upper()} {s}' for k, s in wanted)}")


@pytest.mark.req("MOQT-NS-SUBSCRIBE-NAMESPACE", "MOQT-NS-PREFIX-MATCH", "MOQT-NS-NO-FORWARD-PUBLISH-NAMESPACE")
def test_namespace_prefix_subscription_sees_every_matching_publication(moqt_relay: RelayUnderTest,
                                                                       rng: np.random.Generator) -> None:
    async def scenario(f: Findings) -> None:
        base = moqt_relay.access.prefix
        compat = moqt_relay.field(rng, 8)
        prefix = base + TrackNamespace((compat,))
        a1, a2 = moqt_relay.field(rng, 12), moqt_relay.field(rng, 12)
        existing = prefix + TrackNamespace((a1, b"pub-1"))
        later = [prefix + TrackNamespace((a1, b"pub-2")), prefix + TrackNamespace((a2, b"pub-3"))]
        near_miss = [base + TrackNamespace((compat + b"x", a1, b"pub-4")),  # field extends the prefix's bytes
                     base + TrackNamespace((moqt_relay.field(rng, 8), a1, b"pub-5"))]
        ns_req, match_req = "MOQT-NS-SUBSCRIBE-NAMESPACE", "MOQT-NS-PREFIX-MATCH"
        async with session(moqt_relay, "publisher A") as pub_a, session(moqt_relay, "publisher B") as pub_b, \
                session(moqt_relay, "watcher") as watcher_client:
            await _publish(pub_a, moqt_relay, existing)
            record("sent", "SUBSCRIBE_NAMESPACE", prefix=str(prefix))
            watcher = await watcher_client.subscribe_namespace(prefix, auth=moqt_relay.token("subscriber"))
            await _collect(f, ns_req, watcher, [("namespace", existing.suffix_after(prefix))])
            for ns in near_miss:  # processed before the matching ones below: a wrong NAMESPACE would come first
                await _publish(pub_b, moqt_relay, ns)
            handles = [await _publish(pub_b, moqt_relay, ns) for ns in later]
            # What arrives before the later publications' notices is a near miss the relay matched by bytes.
            await _collect(f, match_req, watcher, [("namespace", ns.suffix_after(prefix)) for ns in later])
            handles[0].cancel()  # withdraw one publication
            await _collect(f, ns_req, watcher, [("done", later[0].suffix_after(prefix))])
            await pub_a.close(timeout=CLOSE_WAIT)  # a publisher's session ending withdraws what it published
            await _collect(f, ns_req, watcher, [("done", existing.suffix_after(prefix))])
            while not watcher.queue.empty():
                kind, suffix = watcher.queue.get_nowait()
                f.add(ns_req, f"notice to the namespace subscriber: seen {kind.upper()} for suffix {suffix}, "
                              "expected none more")
            forwarded = [str(n) for n in watcher_client.peer_namespaces.values()]
            f.expect(not forwarded, "MOQT-NS-NO-FORWARD-PUBLISH-NAMESPACE",  # [d22] NAMESPACE only
                     f"to the namespace subscriber: seen PUBLISH_NAMESPACE {forwarded}, expected NAMESPACE only")
            f.expect(True, match_req, "")

    run_findings("namespace discovery", scenario)


@pytest.mark.req("MOQT-NS-PREFIX-OVERLAP")
def test_overlapping_namespace_prefixes_in_one_session(moqt_relay: RelayUnderTest, rng: np.random.Generator) -> None:
    """Equal, longer and shorter prefixes of an active SUBSCRIBE_NAMESPACE are PREFIX_OVERLAP; a sibling is fine."""
    req = "MOQT-NS-PREFIX-OVERLAP"

    async def scenario(f: Findings) -> None:
        base = moqt_relay.access.prefix
        prefix = base + TrackNamespace((moqt_relay.field(rng, 8),))
        token = moqt_relay.token("subscriber")
        async with session(moqt_relay, "watcher") as client:
            await client.subscribe_namespace(prefix, auth=token)
            for label, other in (("equal", prefix), ("longer", prefix + TrackNamespace((b"anchor",))),
                                 ("shorter", base)):
                expect_none(f, req, [await refusal_problem(
                    f"{label} prefix {other} while {prefix} is active", client.subscribe_namespace(other, auth=token),
                    PREFIX_OVERLAP)])
            sibling = base + TrackNamespace((moqt_relay.field(rng, 8),))
            try:
                with waiting(f"REQUEST_OK to SUBSCRIBE_NAMESPACE of the sibling prefix {sibling}", req):
                    await client.subscribe_namespace(sibling, auth=token)
            except RequestRejected as exc:
                f.add(req, f"sibling prefix {sibling}: seen {rejection(exc)}, expected REQUEST_OK")

    run_findings("prefix overlap", scenario, req=req)


@pytest.mark.req("MOQT-RELAY-SUBSCRIBE-ROUTING", "MOQT-NS-PREFIX-MATCH")
def test_subscribe_reaches_the_publisher_of_a_namespace_prefix(moqt_relay: RelayUnderTest,
                                                               rng: np.random.Generator) -> None:
    """The publisher announces a 4-field namespace and serves a track in a 5-field namespace below it: a
    SUBSCRIBE to that track reaches it; a track under a near-miss namespace has no publisher (DOES_NOT_EXIST)."""
    routing = "MOQT-RELAY-SUBSCRIBE-ROUTING"

    async def scenario(f: Findings) -> None:
        base = moqt_relay.access.prefix
        compat, anchor = moqt_relay.field(rng, 16), moqt_relay.field(rng, 16)
        announced = base + TrackNamespace((compat, anchor))
        track_ns = announced + TrackNamespace((moqt_relay.field(rng, 16),))
        near_miss = base + TrackNamespace((compat, anchor + b"x", moqt_relay.field(rng, 16)))
        async with session(moqt_relay, "publisher") as pub_client, session(moqt_relay, "subscriber") as sub_client:
            track = pub_client.track(track_ns, TRACK_NAME)
            pub_client.track(near_miss, TRACK_NAME).publish_object(0, 0, b"never routed here")
            await _publish(pub_client, moqt_relay, announced)
            try:
                with waiting("SUBSCRIBE_OK to a track below the announced namespace", routing):
                    sub = await subscribe(sub_client, track_ns, fill=False, auth=moqt_relay.token("subscriber"))
            except RequestRejected as exc:
                f.add(routing, f"SUBSCRIBE to {track_ns}, below the announced {announced}: seen {rejection(exc)}, "
                               "expected SUBSCRIBE_OK (routed to its publisher)")
                return
            track.publish_object(0, 0, b"first")
            track.publish_object(0, 1, b"second")
            got: list[bytes] = []
            with waiting("the two objects of the routed track", routing):
                while len(got) < 2:
                    obj = await sub.next_object(CLIENT_TIMEOUT)
                    got.append(obj.payload)
            f.expect(sorted(got) == [b"first", b"second"], routing,
                     f"objects of the routed track: seen {got!r}, expected [b'first', b'second']")
            expect_none(f, "MOQT-NS-PREFIX-MATCH", [await refusal_problem(
                f"SUBSCRIBE to {near_miss}, which no PUBLISH_NAMESPACE is a field-wise prefix of",
                subscribe(sub_client, near_miss, fill=False, auth=moqt_relay.token("subscriber")), DOES_NOT_EXIST)])

    run_findings("SUBSCRIBE routing", scenario, req=routing)


@pytest.mark.req("MOQT-CTRL-NAMESPACE-BYTES")
def test_binary_namespace_fields_are_accepted(moqt_relay: RelayUnderTest, rng: np.random.Generator) -> None:
    """A publication whose Track Namespace fields are not UTF-8 (0xFF, 0x00, a UTF-8 lead byte without its
    continuation) is announced, subscribed to and delivered like any other: fields are bytes in no encoding.
    Sent binary whatever the PICS declare: ``moqt.name_bytes: utf8`` declares a deviation from this rule (the
    other checks then use text fields), so this check still judges it."""
    req = "MOQT-CTRL-NAMESPACE-BYTES"

    async def scenario(f: Findings) -> None:
        binary = TrackNamespace((b"\xff\x00" + bytes(rng.bytes(14)), b"\xc3\x28" + bytes(rng.bytes(6))))
        ns = moqt_relay.access.prefix + binary
        record("note", "namespace fields that are not UTF-8", fields=[field.hex() for field in binary.fields])
        payload = b"binary-named " + bytes(rng.bytes(8))
        async with publisher(moqt_relay, ns) as pub, session(moqt_relay, "subscriber") as client:
            with waiting(f"SUBSCRIBE_OK to {ns} (fields {', '.join(x.hex() for x in binary.fields)} are not "
                         "UTF-8)", req):
                sub = await subscribe(client, ns, fill=False, auth=moqt_relay.token("subscriber"))
            pub.publish(0, 0, payload)
            with waiting("the object of the track with binary namespace fields", req):
                got = await sub.next_object(CLIENT_TIMEOUT)
            f.expect(got.payload == payload, req, f"object of the track {ns}: seen {got.payload!r}, expected "
                                                  f"{payload!r}")

    run_findings("binary namespace fields", scenario, req=req)
