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
    record,
    run,
    run_check,
    session,
    subscribe,
)
from kvconform.moqt.client import RequestRejected
from kvconform.moqt.errors import RequestErrorCode
from kvconform.moqt.structures import TrackNamespace

pytestmark = pytest.mark.usefixtures("moqt_relay_sanity")


async def _publish(client: Any, relay: RelayUnderTest, ns: TrackNamespace) -> Any:
    record("sent", "PUBLISH_NAMESPACE", namespace=str(ns))
    return await client.publish_namespace(ns, auth=relay.token("publisher"))


async def _collect(watcher: Any, wanted: list[tuple[str, TrackNamespace]], problems: list[str]) -> None:
    """Read notices until every wanted one arrived (bounded by the caller); note anything else."""
    pending = list(wanted)
    while pending:
        notice = await watcher.next(CLIENT_TIMEOUT)
        record("received", "NAMESPACE" if notice[0] == "namespace" else "NAMESPACE_DONE", suffix=str(notice[1]))
        if notice in pending:
            pending.remove(notice)
        else:
            problems.append(f"unexpected {notice[0].upper()} for suffix {notice[1]}")


@pytest.mark.req("MOQT-NS-SUBSCRIBE-NAMESPACE", "MOQT-NS-PREFIX-MATCH", "MOQT-NS-NO-FORWARD-PUBLISH-NAMESPACE")
def test_namespace_prefix_subscription_sees_every_matching_publication(moqt_relay: RelayUnderTest,
                                                                       rng: np.random.Generator) -> None:
    async def scenario() -> list[str]:
        base = moqt_relay.access.prefix
        compat = rng.bytes(8)
        prefix = base + TrackNamespace((compat,))
        a1, a2 = rng.bytes(12), rng.bytes(12)
        existing = prefix + TrackNamespace((a1, b"pub-1"))
        later = [prefix + TrackNamespace((a1, b"pub-2")), prefix + TrackNamespace((a2, b"pub-3"))]
        near_miss = [base + TrackNamespace((compat + b"x", a1, b"pub-4")),  # field extends the prefix's bytes
                     base + TrackNamespace((rng.bytes(8), a1, b"pub-5"))]
        problems: list[str] = []
        async with session(moqt_relay, "publisher A") as pub_a, session(moqt_relay, "publisher B") as pub_b, \
                session(moqt_relay, "watcher") as watcher_client:
            await _publish(pub_a, moqt_relay, existing)
            record("sent", "SUBSCRIBE_NAMESPACE", prefix=str(prefix))
            watcher = await watcher_client.subscribe_namespace(prefix, auth=moqt_relay.token("subscriber"))
            await _collect(watcher, [("namespace", existing.suffix_after(prefix))], problems)
            for ns in near_miss:  # processed before the matching ones below: a wrong NAMESPACE would come first
                await _publish(pub_b, moqt_relay, ns)
            handles = [await _publish(pub_b, moqt_relay, ns) for ns in later]
            await _collect(watcher, [("namespace", ns.suffix_after(prefix)) for ns in later], problems)
            handles[0].cancel()  # withdraw one publication
            await _collect(watcher, [("done", later[0].suffix_after(prefix))], problems)
            await pub_a.close(timeout=CLOSE_WAIT)  # a publisher's session ending withdraws what it published
            await _collect(watcher, [("done", existing.suffix_after(prefix))], problems)
            while not watcher.queue.empty():
                kind, suffix = watcher.queue.get_nowait()
                problems.append(f"unexpected {kind.upper()} for suffix {suffix}")
            if watcher_client.peer_namespaces:  # [d22] NAMESPACE only, never a forwarded PUBLISH_NAMESPACE
                problems.append(f"the relay sent PUBLISH_NAMESPACE to the namespace subscriber: "
                                f"{[str(n) for n in watcher_client.peer_namespaces.values()]}")
        return problems

    run_check(scenario, "MOQT-NS-SUBSCRIBE-NAMESPACE", "namespace discovery")


@pytest.mark.req("MOQT-NS-PREFIX-OVERLAP")
def test_overlapping_namespace_prefixes_in_one_session(moqt_relay: RelayUnderTest, rng: np.random.Generator) -> None:
    """Equal, longer and shorter prefixes of an active SUBSCRIBE_NAMESPACE are PREFIX_OVERLAP; a sibling is fine."""
    async def scenario() -> list[str]:
        base = moqt_relay.access.prefix
        prefix = base + TrackNamespace((rng.bytes(8),))
        token = moqt_relay.token("subscriber")
        problems: list[str] = []
        async with session(moqt_relay, "watcher") as client:
            await client.subscribe_namespace(prefix, auth=token)
            for label, other in (("equal", prefix), ("longer", prefix + TrackNamespace((b"anchor",))),
                                 ("shorter", base)):
                try:
                    await client.subscribe_namespace(other, auth=token)
                    problems.append(f"{label} prefix {other} accepted while {prefix} is active")
                except RequestRejected as exc:
                    record("received", "REQUEST_ERROR", prefix=str(other), code=exc.code)
                    if exc.code != RequestErrorCode.PREFIX_OVERLAP:
                        problems.append(f"{label} prefix: {exc}, expected PREFIX_OVERLAP (0x30)")
            sibling = base + TrackNamespace((rng.bytes(8),))
            try:
                await client.subscribe_namespace(sibling, auth=token)
            except RequestRejected as exc:
                problems.append(f"sibling prefix {sibling} refused: {exc}")
        return problems

    run_check(scenario, "MOQT-NS-PREFIX-OVERLAP", "prefix overlap")


@pytest.mark.req("MOQT-RELAY-SUBSCRIBE-ROUTING", "MOQT-NS-PREFIX-MATCH")
def test_subscribe_reaches_the_publisher_of_a_namespace_prefix(moqt_relay: RelayUnderTest,
                                                               rng: np.random.Generator) -> None:
    """The publisher announces a 4-field namespace and serves a track in a 5-field namespace below it: a
    SUBSCRIBE to that track reaches it; a track under a near-miss namespace has no publisher (DOES_NOT_EXIST)."""
    async def scenario() -> list[str]:
        base = moqt_relay.access.prefix
        compat, anchor = rng.bytes(16), rng.bytes(16)
        announced = base + TrackNamespace((compat, anchor))
        track_ns = announced + TrackNamespace((rng.bytes(16),))
        near_miss = base + TrackNamespace((compat, anchor + b"x", rng.bytes(16)))
        problems: list[str] = []
        async with session(moqt_relay, "publisher") as pub_client, session(moqt_relay, "subscriber") as sub_client:
            track = pub_client.track(track_ns, TRACK_NAME)
            pub_client.track(near_miss, TRACK_NAME).publish_object(0, 0, b"never routed here")
            await _publish(pub_client, moqt_relay, announced)
            sub = await subscribe(sub_client, track_ns, fill=False, auth=moqt_relay.token("subscriber"))
            track.publish_object(0, 0, b"first")
            track.publish_object(0, 1, b"second")
            got: list[bytes] = []
            while len(got) < 2:
                obj = await sub.next_object(CLIENT_TIMEOUT)
                got.append(obj.payload)
            if sorted(got) != [b"first", b"second"]:
                problems.append(f"subscriber received {got!r}, published [b'first', b'second']")
            try:
                await subscribe(sub_client, near_miss, fill=False, auth=moqt_relay.token("subscriber"))
                problems.append(f"SUBSCRIBE to {near_miss}, which no PUBLISH_NAMESPACE is a field-wise prefix of, "
                                "was accepted")
            except RequestRejected as exc:
                if exc.code != RequestErrorCode.DOES_NOT_EXIST:
                    problems.append(f"SUBSCRIBE with no matching publisher: {exc}, expected DOES_NOT_EXIST (0x10)")
        return problems

    try:
        problems = run(scenario, what="SUBSCRIBE routing")
    except RequestRejected as exc:
        problems = [f"SUBSCRIBE to a track below the announced namespace failed: {exc}"]
    assert not problems, "MOQT-RELAY-SUBSCRIBE-ROUTING:\n  " + "\n  ".join(problems)
