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
    leaked,
    publisher,
    record,
    refusal_problem,
    run_check,
    session,
    subscribe,
)
from kvconform.moqt.client import RequestRejected
from kvconform.moqt.errors import RequestErrorCode
from kvconform.moqt.structures import Location, TrackNamespace
from kvconform.targets.spec import Pics

pytestmark = pytest.mark.usefixtures("moqt_relay_sanity")

EXPIRED: set[int] = {RequestErrorCode.EXPIRED_AUTH_TOKEN}


def attempts(relay: RelayUnderTest, *roles: str) -> list[tuple[str, tuple[Any, ...], set[int]]]:
    """(label, tokens, acceptable codes) for requests without a token and with each named role's token."""
    out: list[tuple[str, tuple[Any, ...], set[int]]] = [("no token", (), UNAUTHORIZED)]
    for role in roles:
        out.append((f"{role} token", relay.token(role), UNKNOWN_TOKEN if role == "outsider" else UNAUTHORIZED))
    return out


async def barrier(relay: RelayUnderTest, pub: Any, ns: TrackNamespace, group: int) -> None:
    """An authorized subscriber (own session) sees an object published now: the relay caught up."""
    async with session(relay, "authorized subscriber") as client:
        sub = await subscribe(client, ns, auth=relay.token("subscriber"))
        pub.publish(group, 0, b"barrier")
        while Location(group, 0) not in sub.seen:
            await sub.next_object(CLIENT_TIMEOUT)


@pytest.mark.req("MOQT-AUTH-PUBLISH-NAMESPACE")
def test_unauthorized_publish_namespace_is_refused(moqt_relay: RelayUnderTest, pics: Pics,
                                                   rng: np.random.Generator) -> None:
    pics.require("moqt.relay.authorization")

    async def scenario() -> list[str]:
        problems: list[str] = []
        watch = TrackNamespace(moqt_relay.namespace(rng).fields[:-1])  # the prefix of the publications below
        async with session(moqt_relay, "watcher") as watcher_client, session(moqt_relay, "intruder") as intruder, \
                session(moqt_relay, "subscriber") as sub_client:
            watcher = await watcher_client.subscribe_namespace(watch, auth=moqt_relay.token("subscriber"))
            refused = []
            for label, auth, acceptable in attempts(moqt_relay, "outsider", "subscriber"):
                ns = watch + TrackNamespace((rng.bytes(16),))
                intruder.track(ns, TRACK_NAME).publish_object(0, 0, b"must not be served")
                record("sent", "PUBLISH_NAMESPACE", namespace=str(ns), token=label)
                refused.append(ns)
                problem = await refusal_problem(f"PUBLISH_NAMESPACE with {label}",
                                                intruder.publish_namespace(ns, auth=auth), acceptable)
                if problem:
                    problems.append(problem)
            legit = watch + TrackNamespace((rng.bytes(16),))
            async with publisher(moqt_relay, legit):
                notice = await watcher.next(CLIENT_TIMEOUT)
                while notice != ("namespace", legit.suffix_after(watch)):  # anything before it was a refused one
                    problems.append(f"namespace subscribers were told about a refused publication: {notice}")
                    notice = await watcher.next(CLIENT_TIMEOUT)
            for ns in refused:
                try:
                    await subscribe(sub_client, ns, auth=moqt_relay.token("subscriber"))
                    problems.append(f"a SUBSCRIBE to {ns} was routed to the publisher whose PUBLISH_NAMESPACE "
                                    "was refused")
                except RequestRejected:
                    pass  # no authorized source: DOES_NOT_EXIST (or any refusal)
        return problems

    run_check(scenario, "MOQT-AUTH-PUBLISH-NAMESPACE", "unauthorized PUBLISH_NAMESPACE")


@pytest.mark.req("MOQT-AUTH-SUBSCRIBE")
def test_unauthorized_subscribe_is_refused_and_nothing_delivered(moqt_relay: RelayUnderTest, pics: Pics,
                                                                 rng: np.random.Generator) -> None:
    pics.require("moqt.relay.authorization")

    async def scenario() -> list[str]:
        problems: list[str] = []
        ns = moqt_relay.namespace(rng)
        async with publisher(moqt_relay, ns) as pub, session(moqt_relay, "intruder") as intruder:
            pub.publish(0, 0, b"secret 0")
            pub.publish(0, 1, b"secret 1")
            subs = []
            for label, auth, acceptable in attempts(moqt_relay, "outsider"):
                sub = await subscribe(intruder, ns, auth=auth, wait=False)
                subs.append((label, sub))
                problem = await refusal_problem(f"SUBSCRIBE (Next Object + fill) with {label}",
                                                sub.wait_ok(CLIENT_TIMEOUT), acceptable)
                if problem:
                    problems.append(problem)
            pub.publish(0, 2, b"secret 2")
            await barrier(moqt_relay, pub, ns, 1)
            for label, sub in subs:
                if sub.objects or sub.fills or sub.subgroup_streams:
                    problems.append(f"SUBSCRIBE with {label}: {len(sub.objects)} objects, fill streams {sub.fills}, "
                                    f"subgroup streams {sub.subgroup_streams} delivered")
            stray = leaked(intruder)
            if stray:
                problems.append(f"the refused subscriber's session received data: {stray}")
        return problems

    run_check(scenario, "MOQT-AUTH-SUBSCRIBE", "unauthorized SUBSCRIBE")


@pytest.mark.req("MOQT-AUTH-FETCH")
def test_unauthorized_fetch_is_refused_and_nothing_delivered(moqt_relay: RelayUnderTest, pics: Pics,
                                                             rng: np.random.Generator) -> None:
    pics.require("moqt.relay.authorization")

    async def scenario() -> list[str]:
        problems: list[str] = []
        ns = moqt_relay.namespace(rng)
        async with publisher(moqt_relay, ns) as pub, session(moqt_relay, "intruder") as intruder:
            for o in range(3):
                pub.publish(0, o, b"secret %d" % o)
            pub.end_of_group(0, 3)
            fetches = []
            for label, auth, acceptable in attempts(moqt_relay, "outsider"):
                record("sent", "FETCH", token=label)
                result = await intruder.fetch(ns, TRACK_NAME, auth=auth, wait=False)
                fetches.append((label, result))
                problem = await refusal_problem(f"FETCH with {label}", result.wait_complete(CLIENT_TIMEOUT),
                                                acceptable)
                if problem:
                    problems.append(problem)
            await barrier(moqt_relay, pub, ns, 1)
            for label, result in fetches:
                if result.objects:
                    problems.append(f"FETCH with {label}: {len(result.objects)} objects delivered")
            stray = leaked(intruder)
            if stray:
                problems.append(f"the refused requester's session received data: {stray}")
        return problems

    run_check(scenario, "MOQT-AUTH-FETCH", "unauthorized FETCH")


@pytest.mark.req("MOQT-AUTH-SUBSCRIBE-NAMESPACE")
def test_unauthorized_subscribe_namespace_is_refused(moqt_relay: RelayUnderTest, pics: Pics,
                                                     rng: np.random.Generator) -> None:
    pics.require("moqt.relay.authorization")

    async def scenario() -> list[str]:
        problems: list[str] = []
        base = moqt_relay.access.prefix
        tries = [(label, base, auth, acc) for label, auth, acc in attempts(moqt_relay, "outsider")]
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

                problem = await refusal_problem(f"SUBSCRIBE_NAMESPACE {prefix} with {label}", request(), acceptable)
                if problem:
                    problems.append(problem)
            watch = base + TrackNamespace((rng.bytes(8),))
            watcher = await watcher_client.subscribe_namespace(watch, auth=moqt_relay.token("subscriber"))
            ns = watch + TrackNamespace((rng.bytes(16),))
            async with publisher(moqt_relay, ns):
                await watcher.next(CLIENT_TIMEOUT)  # barrier: the relay announced the publication
            for label, handle in handles:
                if not handle.queue.empty():
                    problems.append(f"SUBSCRIBE_NAMESPACE with {label} received NAMESPACE {handle.queue.get_nowait()}")
        return problems

    run_check(scenario, "MOQT-AUTH-SUBSCRIBE-NAMESPACE", "unauthorized SUBSCRIBE_NAMESPACE")


@pytest.mark.req("MOQT-AUTH-TOKEN")
def test_expired_token_is_expired_auth_token(moqt_relay: RelayUnderTest, pics: Pics, rng: np.random.Generator) -> None:
    """A subscribe token past its expiry (declared as moqt.relay.tokens.expired): EXPIRED_AUTH_TOKEN (0x5)."""
    pics.require("moqt.relay.authorization")
    pics.require("moqt.relay.tokens.expired")

    async def scenario() -> list[str]:
        ns = moqt_relay.namespace(rng)
        async with publisher(moqt_relay, ns) as pub, session(moqt_relay, "late subscriber") as client:
            pub.publish(0, 0, b"x")
            problem = await refusal_problem("SUBSCRIBE with the expired token",
                                            subscribe(client, ns, auth=moqt_relay.token("expired")), EXPIRED)
            return [problem] if problem else []

    run_check(scenario, "MOQT-AUTH-TOKEN", "expired token")
