"""moqt-relay: authorization of PUBLISH_NAMESPACE, SUBSCRIBE, FETCH and SUBSCRIBE_NAMESPACE
(moqt-d22-profile sections 3.6, 10.2, 12; KVCS requires all four).

The tokens and the prefix they cover are declared in the PICS (moqt.relay.tokens, moqt.relay.prefix).
Each refused request must get REQUEST_ERROR UNAUTHORIZED (a token the relay does not know may also be
MALFORMED_AUTH_TOKEN) and nothing may reach the refused requester. "Nothing" is observed after a
barrier: an authorized subscriber on another session receives an object published after the refusals,
so whatever the relay was going to send for the refused requests has been sent by then.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from kvconform.fixtures.moqt import (
    CLIENT_TIMEOUT,
    TRACK_NAME,
    UNAUTHORIZED,
    UNKNOWN_TOKEN,
    RelayUnderTest,
    expect_none,
    leaked,
    publisher,
    record,
    refusal_problem,
    refused,
    run_findings,
    session,
    subscribe,
    waiting,
)
from kvconform.moqt.errors import RequestErrorCode
from kvconform.moqt.structures import Location, TrackNamespace
from kvconform.targets.spec import Pics
from kvconform.verdicts import Findings, not_applicable

pytestmark = pytest.mark.usefixtures("moqt_relay_sanity")

EXPIRED: set[int] = {RequestErrorCode.EXPIRED_AUTH_TOKEN}


def attempts(relay: RelayUnderTest, right: str, *roles: str) -> list[tuple[str, tuple[Any, ...], set[int]]]:
    """(label, tokens, acceptable codes) for requests without a token and with each named role's token, but a
    role whose token the PICS give ``right`` after all (the same value as an authorized role's)."""
    out: list[tuple[str, tuple[Any, ...], set[int]]] = [("no token", (), UNAUTHORIZED)]
    for role in roles:
        if not relay.grants(role, right):
            out.append((f"{role} token", relay.token(role), UNKNOWN_TOKEN if role == "outsider" else UNAUTHORIZED))
    return out


async def barrier(relay: RelayUnderTest, pub: Any, ns: TrackNamespace, group: int) -> None:
    """An authorized subscriber (own session) sees an object published now: the relay caught up."""
    async with session(relay, "authorized subscriber") as client:
        sub = await subscribe(client, ns, auth=relay.token("subscriber"))
        pub.publish(group, 0, b"barrier")
        with waiting(f"the barrier object {{{group},0}} at an authorized subscriber"):
            while Location(group, 0) not in sub.seen:
                await sub.next_object(CLIENT_TIMEOUT)


@pytest.mark.req("MOQT-AUTH-PUBLISH-NAMESPACE")
def test_unauthorized_publish_namespace_is_refused(moqt_relay: RelayUnderTest, pics: Pics,
                                                   rng: np.random.Generator) -> None:
    pics.require("moqt.relay.authorization")

    req = "MOQT-AUTH-PUBLISH-NAMESPACE"

    async def scenario(f: Findings) -> None:
        watch = TrackNamespace(moqt_relay.namespace(rng).fields[:-1])  # the prefix of the publications below
        async with session(moqt_relay, "watcher") as watcher_client, session(moqt_relay, "intruder") as intruder, \
                session(moqt_relay, "subscriber") as sub_client:
            watcher = await watcher_client.subscribe_namespace(watch, auth=moqt_relay.token("subscriber"))
            refused_ns = []
            for label, auth, acceptable in attempts(moqt_relay, "publish", "outsider", "subscriber"):
                ns = watch + TrackNamespace((moqt_relay.field(rng, 16),))
                intruder.track(ns, TRACK_NAME).publish_object(0, 0, b"must not be served")
                record("sent", "PUBLISH_NAMESPACE", namespace=str(ns), token=label)
                refused_ns.append(ns)
                expect_none(f, req, [await refusal_problem(
                    f"PUBLISH_NAMESPACE with {label}", intruder.publish_namespace(ns, auth=auth), acceptable)])
            legit = watch + TrackNamespace((moqt_relay.field(rng, 16),))
            async with publisher(moqt_relay, legit):
                with waiting("NAMESPACE for the authorized publication"):
                    notice = await watcher.next(CLIENT_TIMEOUT)
                    while notice != ("namespace", legit.suffix_after(watch)):  # anything before it: a refused one
                        f.add(req, f"NAMESPACE to the namespace subscriber: seen {notice[0].upper()} {notice[1]} of a "
                                   "refused publication, expected only the authorized one")
                        notice = await watcher.next(CLIENT_TIMEOUT)
            for ns in refused_ns:
                # No authorized source: DOES_NOT_EXIST, or any refusal; never the refused publisher's track.
                expect_none(f, req, [await refused(
                    f"SUBSCRIBE to {ns}, whose PUBLISH_NAMESPACE was refused",
                    subscribe(sub_client, ns, auth=moqt_relay.token("subscriber")))])

    run_findings("unauthorized PUBLISH_NAMESPACE", scenario, req=req)


@pytest.mark.req("MOQT-AUTH-SUBSCRIBE")
def test_unauthorized_subscribe_is_refused_and_nothing_delivered(moqt_relay: RelayUnderTest, pics: Pics,
                                                                 rng: np.random.Generator) -> None:
    pics.require("moqt.relay.authorization")
    req = "MOQT-AUTH-SUBSCRIBE"

    async def scenario(f: Findings) -> None:
        ns = moqt_relay.namespace(rng)
        async with publisher(moqt_relay, ns) as pub, session(moqt_relay, "intruder") as intruder:
            pub.publish(0, 0, b"secret 0")
            pub.publish(0, 1, b"secret 1")
            subs = []
            for label, auth, acceptable in attempts(moqt_relay, "subscribe", "outsider"):
                sub = await subscribe(intruder, ns, auth=auth, wait=False)
                subs.append((label, sub))
                expect_none(f, req, [await refusal_problem(f"SUBSCRIBE (Next Object + fill) with {label}",
                                                           sub.wait_ok(CLIENT_TIMEOUT), acceptable)])
            pub.publish(0, 2, b"secret 2")
            await barrier(moqt_relay, pub, ns, 1)
            for label, sub in subs:
                f.expect(not (sub.objects or sub.fills or sub.subgroup_streams), req,
                         f"SUBSCRIBE with {label}: seen {len(sub.objects)} objects, fill streams {sub.fills}, subgroup "
                         f"streams {sub.subgroup_streams} delivered, expected nothing")
            stray = leaked(intruder)
            f.expect(not stray, req, f"the refused subscriber's session: seen data {stray}, expected none")

    run_findings("unauthorized SUBSCRIBE", scenario, req=req)


@pytest.mark.req("MOQT-AUTH-FETCH")
def test_unauthorized_fetch_is_refused_and_nothing_delivered(moqt_relay: RelayUnderTest, pics: Pics,
                                                             rng: np.random.Generator) -> None:
    pics.require("moqt.relay.authorization")
    req = "MOQT-AUTH-FETCH"

    async def scenario(f: Findings) -> None:
        ns = moqt_relay.namespace(rng)
        async with publisher(moqt_relay, ns) as pub, session(moqt_relay, "intruder") as intruder:
            for o in range(3):
                pub.publish(0, o, b"secret %d" % o)
            pub.end_of_group(0, 3)
            fetches = []
            for label, auth, acceptable in attempts(moqt_relay, "subscribe", "outsider"):
                record("sent", "FETCH", token=label)
                result = await intruder.fetch(ns, TRACK_NAME, auth=auth, wait=False)
                fetches.append((label, result))
                expect_none(f, req, [await refusal_problem(f"FETCH with {label}", result.wait_complete(CLIENT_TIMEOUT),
                                                           acceptable)])
            await barrier(moqt_relay, pub, ns, 1)
            for label, result in fetches:
                f.expect(not result.objects, req,
                         f"FETCH with {label}: seen {len(result.objects)} objects delivered, expected none")
            stray = leaked(intruder)
            f.expect(not stray, req, f"the refused requester's session: seen data {stray}, expected none")

    run_findings("unauthorized FETCH", scenario, req=req)


@pytest.mark.req("MOQT-AUTH-SUBSCRIBE-NAMESPACE")
def test_unauthorized_subscribe_namespace_is_refused(moqt_relay: RelayUnderTest, pics: Pics,
                                                     rng: np.random.Generator) -> None:
    pics.require("moqt.relay.authorization")
    req = "MOQT-AUTH-SUBSCRIBE-NAMESPACE"

    async def scenario(f: Findings) -> None:
        base = moqt_relay.access.prefix
        tries = [(label, base, auth, acc) for label, auth, acc in attempts(moqt_relay, "subscribe", "outsider")]
        if len(base) > 1:  # the subscriber's right covers the declared prefix, not a shorter one
            tries.append(("subscriber token on a shorter prefix", TrackNamespace(base.fields[:-1]),
                          moqt_relay.token("subscriber"), UNAUTHORIZED))
        async with session(moqt_relay, "intruder") as intruder, session(moqt_relay, "watcher") as watcher_client:
            handles: list[tuple[str, Any]] = []
            for label, prefix, auth, acceptable in tries:
                record("sent", "SUBSCRIBE_NAMESPACE", prefix=str(prefix), token=label)

                async def request(label: str = label, prefix: TrackNamespace = prefix,
                                  auth: tuple[Any, ...] = auth) -> None:
                    handle = await intruder.subscribe_namespace(prefix, auth=auth)
                    handles.append((label, handle))
                    handle.cancel()  # an accepted overlapping prefix would make the next try PREFIX_OVERLAP

                expect_none(f, req, [await refusal_problem(f"SUBSCRIBE_NAMESPACE {prefix} with {label}", request(),
                                                           acceptable)])
            watch = base + TrackNamespace((moqt_relay.field(rng, 8),))
            watcher = await watcher_client.subscribe_namespace(watch, auth=moqt_relay.token("subscriber"))
            ns = watch + TrackNamespace((moqt_relay.field(rng, 16),))
            async with publisher(moqt_relay, ns):
                with waiting("NAMESPACE at the authorized watcher (the barrier)"):
                    await watcher.next(CLIENT_TIMEOUT)
            for label, handle in handles:
                f.expect(handle.queue.empty(), req,
                         f"SUBSCRIBE_NAMESPACE with {label}: seen NAMESPACE "
                         f"{None if handle.queue.empty() else handle.queue.get_nowait()}, expected none")

    run_findings("unauthorized SUBSCRIBE_NAMESPACE", scenario, req=req)


@pytest.mark.req("MOQT-AUTH-TOKEN")
def test_expired_token_is_expired_auth_token(moqt_relay: RelayUnderTest, pics: Pics, rng: np.random.Generator) -> None:
    """A subscribe token past its expiry (declared as moqt.relay.tokens.expired): EXPIRED_AUTH_TOKEN (0x5). An
    expired token at the relay is a configuration of the relay, not a capability every relay has: a defaulted
    one (an ad-hoc target's PICS from the testbed's defaults) is no declaration of it."""
    pics.require("moqt.relay.authorization")
    pics.require("moqt.relay.tokens.expired")
    if pics.is_defaulted("moqt.relay.tokens.expired"):
        not_applicable("moqt.relay.tokens.expired is the testbed's default, not declared for this relay")
    req = "MOQT-AUTH-TOKEN"

    async def scenario(f: Findings) -> None:
        ns = moqt_relay.namespace(rng)
        async with publisher(moqt_relay, ns) as pub, session(moqt_relay, "late subscriber") as client:
            pub.publish(0, 0, b"x")
            expect_none(f, req, [await refusal_problem("SUBSCRIBE with the expired token",
                                                       subscribe(client, ns, auth=moqt_relay.token("expired")),
                                                       EXPIRED)])

    run_findings("expired token", scenario, req=req)
