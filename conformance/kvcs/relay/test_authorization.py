"""kvcs-relay: authorization by scope (KVCS "Relay Considerations", "Security Considerations":
"Relays MUST enforce authorization at least at the granularity of the namespace prefix ("kvcs-1", Scope
ID)" and "MUST authorize PUBLISH_NAMESPACE, SUBSCRIBE_NAMESPACE, SUBSCRIBE, and FETCH for KVCS namespaces by
scope"; moqt-d22-profile sections 3.6, 10.2, 12).

Two scopes are declared in the PICS, each with a publisher and a subscriber token. Every check runs both
ways (scope 0's tokens against scope 1's publication and back): a token valid for one scope must get
REQUEST_ERROR UNAUTHORIZED in the other (an unknown outsider token may get MALFORMED_AUTH_TOKEN), and
nothing of the other scope may reach its holder. "Nothing" is observed after a barrier: an authorized
subscriber of the other scope receives a layer published after the refusals.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from kvconform.fixtures.kvcs.relay import (
    KvcsRelay,
    barrier,
    cache_spec,
    describe,
    kvcs_publication,
    scope_id,
    subscribe_publication,
)
from kvconform.fixtures.moqt import (
    CLIENT_TIMEOUT,
    CLOSE_WAIT,
    UNAUTHORIZED,
    UNKNOWN_TOKEN,
    RelayUnderTest,
    leaked,
    record,
    refusal_problem,
    run_check,
    session,
    subscribe,
)
from kvconform.moqt.client import RequestRejected
from kvconform.moqt.filters import LocationFilter
from kvconform.moqt.structures import TrackNamespace

pytestmark = pytest.mark.usefixtures("kvcs_relay_sanity")

DIRECTIONS = ((0, 1), (1, 0))  # (the scope whose tokens are used, the scope whose publication is targeted)


def require_authorization(relay: KvcsRelay) -> None:
    if not relay.authorization:
        pytest.fail("PICS kvcs.relay.authorization is false, but a KVCS relay MUST authorize PUBLISH_NAMESPACE, "
                    "SUBSCRIBE_NAMESPACE, SUBSCRIBE and FETCH by scope (KVCS-RELAY-AUTHZ-SCOPE)", pytrace=False)


def foreign_attempts(own: RelayUnderTest) -> list[tuple[str, tuple[Any, ...], set[int]]]:
    """(label, tokens, acceptable REQUEST_ERROR codes) for requests into another scope: with the own scope's
    subscriber and publisher tokens (known to the relay: UNAUTHORIZED), the outsider's, and none."""
    return [("its own scope's subscriber token", own.token("subscriber"), UNAUTHORIZED),
            ("its own scope's publisher token", own.token("publisher"), UNAUTHORIZED),
            ("an outsider token", own.token("outsider"), UNKNOWN_TOKEN),
            ("no token", (), UNAUTHORIZED)]


@pytest.mark.req("KVCS-RELAY-AUTHZ-SCOPE", "KVCS-SEC-AUTHZ-SUBSCRIBE", "MOQT-AUTH-SUBSCRIBE")
def test_subscribe_into_another_scope_is_refused(kvcs_relay: KvcsRelay, rng: np.random.Generator) -> None:
    require_authorization(kvcs_relay)

    async def scenario() -> list[str]:
        problems: list[str] = []
        for x, y in DIRECTIONS:
            own, other = kvcs_relay.scopes[x], kvcs_relay.scopes[y]
            spec = cache_spec(rng, layers=3, blocks=2)
            async with kvcs_publication(other, spec, rng) as pub, session(own, f"scope {x} consumer") as intruder:
                pub.publish_manifest()
                pub.publish_layer(0)
                subs: list[tuple[str, Any]] = []
                for label, auth, acceptable in foreign_attempts(own):
                    track = pub.data_tracks[len(subs) % 2]
                    sub = await subscribe(intruder, pub.ns, track.name, auth=auth, wait=False)
                    subs.append((label, sub))
                    problem = await refusal_problem(f"[scope {x} -> {y}] SUBSCRIBE {track} with {label}",
                                                    sub.wait_ok(CLIENT_TIMEOUT), acceptable)
                    if problem:
                        problems.append(problem)
                await barrier(other, pub, 1)
                for label, sub in subs:
                    if sub.objects or sub.fills or sub.subgroup_streams:
                        problems.append(f"[scope {x} -> {y}] SUBSCRIBE with {label}: {len(sub.objects)} objects, "
                                        f"fill streams {sub.fills}, subgroup streams {sub.subgroup_streams} "
                                        "delivered")
                stray = leaked(intruder)
                if stray:
                    problems.append(f"[scope {x} -> {y}] the refused consumer's session received data: {stray}")
        return problems

    run_check(scenario, "KVCS-SEC-AUTHZ-SUBSCRIBE", "SUBSCRIBE into another scope")


@pytest.mark.req("KVCS-RELAY-AUTHZ-SCOPE", "KVCS-SEC-AUTHZ-FETCH", "MOQT-AUTH-FETCH")
def test_fetch_from_another_scope_is_refused(kvcs_relay: KvcsRelay, rng: np.random.Generator) -> None:
    """FETCH of a completed layer range, once the relay holds it (an authorized consumer received it) and
    once it does not (the relay would have to fetch it upstream)."""
    require_authorization(kvcs_relay)

    async def scenario() -> list[str]:
        problems: list[str] = []
        for x, y in DIRECTIONS:
            own, other = kvcs_relay.scopes[x], kvcs_relay.scopes[y]
            spec = cache_spec(rng, layers=3, blocks=2)
            async with kvcs_publication(other, spec, rng) as pub, session(own, f"scope {x} consumer") as intruder, \
                    session(other, f"scope {y} consumer") as legit:
                pub.publish_manifest()
                cached = pub.data_tracks[0]  # followed by an authorized consumer; the other track is not
                live = await subscribe(legit, pub.ns, cached.name, fill=False, auth=other.token("subscriber"))
                pub.publish_layer(0)
                while len([o for o in live.objects if not o.status]) < pub.blocks:
                    await live.next_object(CLIENT_TIMEOUT)
                fetches = []
                for track in pub.data_tracks:
                    for label, auth, acceptable in foreign_attempts(own):
                        result = await intruder.fetch(pub.ns, track.name, auth=auth, wait=False,
                                                      location_filter=LocationFilter.absolute_start_group_end(0, 0, 0))
                        record("sent", "FETCH", track=str(track), token=label)
                        fetches.append((f"{track} with {label}", result))
                        problem = await refusal_problem(f"[scope {x} -> {y}] FETCH of layer 0 of {track} with {label}",
                                                        result.wait_complete(CLIENT_TIMEOUT), acceptable)
                        if problem:
                            problems.append(problem)
                await barrier(other, pub, 1)
                for label, result in fetches:
                    if result.objects:
                        problems.append(f"[scope {x} -> {y}] FETCH {label}: {len(result.objects)} objects delivered")
                stray = leaked(intruder)
                if stray:
                    problems.append(f"[scope {x} -> {y}] the refused consumer's session received data: {stray}")
        return problems

    run_check(scenario, "KVCS-SEC-AUTHZ-FETCH", "FETCH from another scope")


@pytest.mark.req("KVCS-RELAY-AUTHZ-SCOPE", "KVCS-SEC-AUTHZ-SUBSCRIBE-NAMESPACE", "MOQT-AUTH-SUBSCRIBE-NAMESPACE")
def test_subscribe_namespace_into_another_scope_is_refused(kvcs_relay: KvcsRelay, rng: np.random.Generator) -> None:
    """Discovery in the other scope: its scope prefix, its content prefix ("kvcs-1", Scope ID, Compatibility
    ID, Anchor Key) and a full namespace; none may be accepted, none may receive NAMESPACE."""
    require_authorization(kvcs_relay)

    async def scenario() -> list[str]:
        problems: list[str] = []
        for x, y in DIRECTIONS:
            own, other = kvcs_relay.scopes[x], kvcs_relay.scopes[y]
            spec = cache_spec(rng, layers=2, blocks=2)
            content = TrackNamespace((b"kvcs-1", scope_id(other), spec.compat_id, spec.anchor_key))
            prefixes = {"scope prefix": other.access.prefix, "content prefix": content,
                        "full namespace": content + TrackNamespace((rng.bytes(16),))}
            handles: list[tuple[str, Any]] = []
            async with session(own, f"scope {x} consumer") as intruder, session(other, "watcher") as watcher_client:
                for what, prefix in prefixes.items():
                    for label, auth, acceptable in foreign_attempts(own):
                        record("sent", "SUBSCRIBE_NAMESPACE", prefix=str(prefix), token=label)
                        problem = await refusal_problem(
                            f"[scope {x} -> {y}] SUBSCRIBE_NAMESPACE {what} with {label}",
                            namespace_request(intruder, prefix, auth, f"{what} with {label}", handles), acceptable)
                        if problem:
                            problems.append(problem)
                watcher = await watcher_client.subscribe_namespace(content, auth=other.token("subscriber"))
                async with kvcs_publication(other, spec, rng):
                    await watcher.next(CLIENT_TIMEOUT)  # barrier: the relay announced the publication
                for label, handle in handles:
                    if not handle.queue.empty():
                        problems.append(f"[scope {x} -> {y}] SUBSCRIBE_NAMESPACE {label} received NAMESPACE "
                                        f"{handle.queue.get_nowait()}")
        return problems

    run_check(scenario, "KVCS-SEC-AUTHZ-SUBSCRIBE-NAMESPACE", "SUBSCRIBE_NAMESPACE into another scope")


async def namespace_request(client: Any, prefix: TrackNamespace, auth: tuple[Any, ...], label: str,
                            accepted: list[tuple[str, Any]]) -> None:
    """SUBSCRIBE_NAMESPACE; an accepted one is kept in ``accepted`` (to look for NAMESPACE later) and
    cancelled at once, since it would make the next try of an overlapping prefix PREFIX_OVERLAP."""
    handle = await client.subscribe_namespace(prefix, auth=auth)
    accepted.append((label, handle))
    handle.cancel()


@pytest.mark.req("KVCS-RELAY-AUTHZ-SCOPE", "MOQT-NS-SUBSCRIBE-NAMESPACE")
def test_no_namespace_of_another_scope_leaks_to_a_broader_prefix(kvcs_relay: KvcsRelay,
                                                                 rng: np.random.Generator) -> None:
    """A scope's consumer asks SUBSCRIBE_NAMESPACE for the empty prefix and for ("kvcs-1"). A relay may
    refuse both; if it accepts one, it may announce only publications the consumer is authorized for: a
    publication of the other scope must never be named to it."""
    require_authorization(kvcs_relay)

    async def scenario() -> list[str]:
        problems: list[str] = []
        for x, y in DIRECTIONS:
            own, other = kvcs_relay.scopes[x], kvcs_relay.scopes[y]
            watchers: list[tuple[TrackNamespace, Any, Any]] = []
            try:
                for prefix in (TrackNamespace(()), TrackNamespace((b"kvcs-1",))):
                    client = await own.connect(f"scope {x} consumer, prefix {prefix}")  # one each: they overlap
                    watchers.append((prefix, client, None))
                    try:
                        record("sent", "SUBSCRIBE_NAMESPACE", prefix=str(prefix), token="subscriber")
                        handle = await client.subscribe_namespace(prefix, auth=own.token("subscriber"))
                    except RequestRejected as exc:
                        record("received", "REQUEST_ERROR", prefix=str(prefix), code=exc.code)
                        continue
                    watchers[-1] = (prefix, client, handle)
                accepted = [(p, h) for p, _, h in watchers if h is not None]
                foreign_spec, own_spec = cache_spec(rng, layers=2, blocks=2), cache_spec(rng, layers=2, blocks=2)
                async with kvcs_publication(other, foreign_spec, rng) as foreign, \
                        kvcs_publication(own, own_spec, rng) as mine:
                    for prefix, handle in accepted:
                        problems += await leaks(f"scope {x} -> {y}, prefix {describe(prefix)}", prefix, handle,
                                                foreign.ns, mine.ns)
            finally:
                for _, client, _ in watchers:
                    await client.close(timeout=CLOSE_WAIT)
        return problems

    run_check(scenario, "KVCS-RELAY-AUTHZ-SCOPE", "NAMESPACE leaks to a broader prefix")


async def leaks(label: str, prefix: TrackNamespace, handle: Any, foreign: TrackNamespace,
                mine: TrackNamespace) -> list[str]:
    """Read an accepted broad namespace subscription until it names the consumer's own scope's publication
    (published after the foreign one); any notice of a namespace in the foreign scope is a leak."""
    problems: list[str] = []
    foreign_scope = TrackNamespace(foreign.fields[:2])
    while True:
        try:
            kind, suffix = await handle.next(CLIENT_TIMEOUT)
        except TimeoutError:
            problems.append(f"[{label}] the relay accepted the SUBSCRIBE_NAMESPACE but never announced the "
                            f"consumer's own scope's publication {describe(mine)} (MOQT-NS-SUBSCRIBE-NAMESPACE)")
            return problems
        full = prefix + suffix
        record("received", "NAMESPACE" if kind == "namespace" else "NAMESPACE_DONE", namespace=describe(full))
        if foreign_scope.is_prefix_of(full):
            problems.append(f"[{label}] {'NAMESPACE' if kind == 'namespace' else 'NAMESPACE_DONE'} {describe(full)} "
                            "of a scope the consumer is not "
                            "authorized for")
        if full == mine:
            return problems


@pytest.mark.req("KVCS-SEC-AUTHZ-PUBLISH-NAMESPACE", "KVCS-RELAY-AUTHZ-SCOPE", "MOQT-AUTH-PUBLISH-NAMESPACE")
def test_publish_namespace_into_another_scope_is_refused(kvcs_relay: KvcsRelay, rng: np.random.Generator) -> None:
    """A would-be poisoner announces a publication with the other scope's content fields (same Compatibility
    ID and Anchor Key as a legitimate one, its own Publication ID) and serves objects in it: the relay must
    refuse the PUBLISH_NAMESPACE, announce it to no namespace subscriber, and route no SUBSCRIBE to it."""
    require_authorization(kvcs_relay)

    async def scenario() -> list[str]:
        problems: list[str] = []
        for x, y in DIRECTIONS:
            own, other = kvcs_relay.scopes[x], kvcs_relay.scopes[y]
            spec = cache_spec(rng, layers=2, blocks=2)
            content = TrackNamespace((b"kvcs-1", scope_id(other), spec.compat_id, spec.anchor_key))
            attempts = [("its own scope's publisher token", own.token("publisher"), UNAUTHORIZED),
                        ("the target scope's subscriber token", other.token("subscriber"), UNAUTHORIZED),
                        ("an outsider token", own.token("outsider"), UNKNOWN_TOKEN),
                        ("no token", (), UNAUTHORIZED)]
            async with session(own, f"scope {x} publisher") as intruder, session(other, "watcher") as watcher_client, \
                    session(other, f"scope {y} consumer") as consumer:
                watcher = await watcher_client.subscribe_namespace(content, auth=other.token("subscriber"))
                refused = []
                for label, auth, acceptable in attempts:
                    ns = content + TrackNamespace((rng.bytes(16),))
                    for t in spec.data_tracks(0):
                        intruder.track(ns, t.name).publish_object(0, 0, spec.object_payload(t, 0, 0))
                    record("sent", "PUBLISH_NAMESPACE", namespace=describe(ns), token=label)
                    refused.append(ns)
                    problem = await refusal_problem(f"[scope {x} -> {y}] PUBLISH_NAMESPACE with {label}",
                                                    intruder.publish_namespace(ns, auth=auth), acceptable)
                    if problem:
                        problems.append(problem)
                async with kvcs_publication(other, spec, rng) as legit:
                    notice = await watcher.next(CLIENT_TIMEOUT)
                    while notice != ("namespace", legit.ns.suffix_after(content)):  # earlier ones: refused ones
                        problems.append(f"[scope {x} -> {y}] namespace subscribers were told about a refused "
                                        f"publication: {notice}")
                        notice = await watcher.next(CLIENT_TIMEOUT)
                    for ns in refused:
                        try:
                            subs = await subscribe_publication(consumer, _shadow(legit, ns), other.token("subscriber"),
                                                               manifest=False)
                        except RequestRejected:
                            continue  # no authorized source: DOES_NOT_EXIST (or any refusal)
                        problems.append(f"[scope {x} -> {y}] SUBSCRIBE to {describe(ns)} was routed to the publisher "
                                        f"whose PUBLISH_NAMESPACE was refused ({len(subs)} subscriptions accepted)")
        return problems

    run_check(scenario, "KVCS-SEC-AUTHZ-PUBLISH-NAMESPACE", "PUBLISH_NAMESPACE into another scope")


def _shadow(legit: Any, ns: TrackNamespace) -> Any:
    """The legitimate publication's tracks under the refused namespace ``ns`` (what a consumer would try)."""
    from dataclasses import replace

    from kvconform.kvcs.namespace import KvcsNamespace

    return replace(legit, namespace=KvcsNamespace.parse(ns))
