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

from dataclasses import replace
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
    expect_refused,
    leaked,
    record,
    refused,
    rejection,
    run_findings,
    session,
    subscribe,
    waiting,
)
from kvconform.kvcs.namespace import KvcsNamespace
from kvconform.moqt.client import RequestRejected
from kvconform.moqt.filters import LocationFilter
from kvconform.moqt.structures import TrackNamespace
from kvconform.verdicts import Findings, violation

pytestmark = pytest.mark.usefixtures("kvcs_relay_sanity")

DIRECTIONS = ((0, 1), (1, 0))  # (the scope whose tokens are used, the scope whose publication is targeted)
SCOPE = "KVCS-RELAY-AUTHZ-SCOPE"


def require_authorization(relay: KvcsRelay, req: str) -> None:
    """A relay declaring no authorization declares that it breaks ``req``: a KVCS relay MUST authorize by scope."""
    if not relay.authorization:
        violation("PICS kvcs.relay.authorization", req=req, seen=False,
                  expected="true: a KVCS relay MUST authorize PUBLISH_NAMESPACE, SUBSCRIBE_NAMESPACE, SUBSCRIBE and "
                           "FETCH by scope (KVCS Security Considerations)")


def foreign_attempts(own: RelayUnderTest, other: RelayUnderTest, req: str,
                     right: str = "subscribe") -> list[tuple[str, tuple[Any, ...], set[int], str]]:
    """(label, tokens, acceptable REQUEST_ERROR codes, the rule accepting it breaks) for requests into the
    scope ``other``: with no token and an outsider's (accepting those is no authorization of the request at all:
    ``req``), then with the own scope's subscriber and publisher tokens (known to the relay: accepting those is
    authorization coarser than the scope, KVCS-RELAY-AUTHZ-SCOPE), but a token the PICS give ``right`` in
    ``other`` too (a value both scopes declare)."""
    out: list[tuple[str, tuple[Any, ...], set[int], str]] = [("no token", (), UNAUTHORIZED, req)]
    for label, role, acceptable, broken in (("an outsider token", "outsider", UNKNOWN_TOKEN, req),
                                            ("its own scope's subscriber token", "subscriber", UNAUTHORIZED, SCOPE),
                                            ("its own scope's publisher token", "publisher", UNAUTHORIZED, SCOPE)):
        if not granted(other, own.access.tokens.get(role), right):
            out.append((label, own.token(role), acceptable, broken))
    return out


def granted(scope: RelayUnderTest, value: bytes | None, right: str) -> bool:
    """Whether the PICS give the token ``value`` ``right`` ("publish", "subscribe") in ``scope``."""
    holders = ("publisher",) if right == "publish" else ("publisher", "subscriber")
    return value is not None and any(scope.access.tokens.get(h) == value for h in holders)


@pytest.mark.req("KVCS-RELAY-AUTHZ-SCOPE", "KVCS-SEC-AUTHZ-SUBSCRIBE", "MOQT-AUTH-SUBSCRIBE")
def test_subscribe_into_another_scope_is_refused(kvcs_relay: KvcsRelay, rng: np.random.Generator) -> None:
    req = "KVCS-SEC-AUTHZ-SUBSCRIBE"
    require_authorization(kvcs_relay, req)

    async def scenario(f: Findings) -> None:
        for x, y in DIRECTIONS:
            own, other = kvcs_relay.scopes[x], kvcs_relay.scopes[y]
            spec = cache_spec(rng, layers=3, blocks=2)
            async with kvcs_publication(other, spec, rng) as pub, session(own, f"scope {x} consumer") as intruder:
                pub.publish_manifest()
                pub.publish_layer(0)
                subs: list[tuple[str, Any, str]] = []
                for label, auth, acceptable, broken in foreign_attempts(own, other, req):
                    track = pub.data_tracks[len(subs) % 2]
                    sub = await subscribe(intruder, pub.ns, track.name, auth=auth, wait=False)
                    subs.append((label, sub, broken))
                    await expect_refused(f, f"[scope {x} -> {y}] SUBSCRIBE {track} with {label}",
                                         sub.wait_ok(CLIENT_TIMEOUT), acceptable, req=broken,
                                         code_req="MOQT-AUTH-SUBSCRIBE")
                await barrier(other, pub, 1)
                for label, sub, broken in subs:
                    f.expect(not (sub.objects or sub.fills or sub.subgroup_streams), broken,
                             f"[scope {x} -> {y}] SUBSCRIBE with {label}: seen {len(sub.objects)} objects, fill "
                             f"streams {sub.fills}, subgroup streams {sub.subgroup_streams} delivered, expected "
                             "nothing")
                stray = leaked(intruder)
                f.expect(not stray, SCOPE, f"[scope {x} -> {y}] the refused consumer's session: seen data {stray}, "
                                           "expected none")

    run_findings("SUBSCRIBE into another scope", scenario, req=req)


@pytest.mark.req("KVCS-RELAY-AUTHZ-SCOPE", "KVCS-SEC-AUTHZ-FETCH", "MOQT-AUTH-FETCH")
def test_fetch_from_another_scope_is_refused(kvcs_relay: KvcsRelay, rng: np.random.Generator) -> None:
    """FETCH of a completed layer range, once the relay holds it (an authorized consumer received it) and
    once it does not (the relay would have to fetch it upstream)."""
    req = "KVCS-SEC-AUTHZ-FETCH"
    require_authorization(kvcs_relay, req)

    async def scenario(f: Findings) -> None:
        for x, y in DIRECTIONS:
            own, other = kvcs_relay.scopes[x], kvcs_relay.scopes[y]
            spec = cache_spec(rng, layers=3, blocks=2)
            async with kvcs_publication(other, spec, rng) as pub, session(own, f"scope {x} consumer") as intruder, \
                    session(other, f"scope {y} consumer") as legit:
                pub.publish_manifest()
                cached = pub.data_tracks[0]  # followed by an authorized consumer; the other track is not
                live = await subscribe(legit, pub.ns, cached.name, fill=False, auth=other.token("subscriber"))
                pub.publish_layer(0)
                with waiting("layer 0 at the authorized consumer"):
                    while len([o for o in live.objects if not o.status]) < pub.blocks:
                        await live.next_object(CLIENT_TIMEOUT)
                fetches = []
                for track in pub.data_tracks:
                    for label, auth, acceptable, broken in foreign_attempts(own, other, req):
                        result = await intruder.fetch(pub.ns, track.name, auth=auth, wait=False,
                                                      location_filter=LocationFilter.absolute_start_group_end(0, 0, 0))
                        record("sent", "FETCH", track=str(track), token=label)
                        fetches.append((f"{track} with {label}", result, broken))
                        await expect_refused(f, f"[scope {x} -> {y}] FETCH of layer 0 of {track} with {label}",
                                             result.wait_complete(CLIENT_TIMEOUT), acceptable, req=broken,
                                             code_req="MOQT-AUTH-FETCH")
                await barrier(other, pub, 1)
                for label, result, broken in fetches:
                    f.expect(not result.objects, broken, f"[scope {x} -> {y}] FETCH {label}: seen "
                                                         f"{len(result.objects)} objects delivered, expected none")
                stray = leaked(intruder)
                f.expect(not stray, SCOPE, f"[scope {x} -> {y}] the refused consumer's session: seen data {stray}, "
                                           "expected none")

    run_findings("FETCH from another scope", scenario, req=req)


@pytest.mark.req("KVCS-RELAY-AUTHZ-SCOPE", "KVCS-SEC-AUTHZ-SUBSCRIBE-NAMESPACE", "MOQT-AUTH-SUBSCRIBE-NAMESPACE")
def test_subscribe_namespace_into_another_scope_is_refused(kvcs_relay: KvcsRelay, rng: np.random.Generator) -> None:
    """Discovery in the other scope: its scope prefix, its content prefix ("kvcs-1", Scope ID, Compatibility
    ID, Anchor Key) and a full namespace; none may be accepted, none may receive NAMESPACE."""
    req = "KVCS-SEC-AUTHZ-SUBSCRIBE-NAMESPACE"
    require_authorization(kvcs_relay, req)

    async def scenario(f: Findings) -> None:
        for x, y in DIRECTIONS:
            own, other = kvcs_relay.scopes[x], kvcs_relay.scopes[y]
            spec = cache_spec(rng, layers=2, blocks=2)
            content = TrackNamespace((b"kvcs-1", scope_id(other), spec.compat_id, spec.anchor_key))
            prefixes = {"scope prefix": other.access.prefix, "content prefix": content,
                        "full namespace": content + TrackNamespace((rng.bytes(16),))}
            handles: list[tuple[str, Any, str]] = []
            async with session(own, f"scope {x} consumer") as intruder, session(other, "watcher") as watcher_client:
                for what, prefix in prefixes.items():
                    for label, auth, acceptable, broken in foreign_attempts(own, other, req):
                        record("sent", "SUBSCRIBE_NAMESPACE", prefix=str(prefix), token=label)
                        await expect_refused(
                            f, f"[scope {x} -> {y}] SUBSCRIBE_NAMESPACE {what} with {label}",
                            namespace_request(intruder, prefix, auth, f"{what} with {label}", broken, handles),
                            acceptable, req=broken, code_req="MOQT-AUTH-SUBSCRIBE-NAMESPACE")
                watcher = await watcher_client.subscribe_namespace(content, auth=other.token("subscriber"))
                async with kvcs_publication(other, spec, rng):
                    with waiting("NAMESPACE at the authorized watcher (the barrier)"):
                        await watcher.next(CLIENT_TIMEOUT)
                for label, handle, broken in handles:
                    f.expect(handle.queue.empty(), broken,
                             f"[scope {x} -> {y}] SUBSCRIBE_NAMESPACE {label}: seen NAMESPACE "
                             f"{None if handle.queue.empty() else handle.queue.get_nowait()}, expected none")

    run_findings("SUBSCRIBE_NAMESPACE into another scope", scenario, req=req)


async def namespace_request(client: Any, prefix: TrackNamespace, auth: tuple[Any, ...], label: str, broken: str,
                            accepted: list[tuple[str, Any, str]]) -> None:
    """SUBSCRIBE_NAMESPACE; an accepted one is kept in ``accepted`` (to look for NAMESPACE later) and
    cancelled at once, since it would make the next try of an overlapping prefix PREFIX_OVERLAP."""
    handle = await client.subscribe_namespace(prefix, auth=auth)
    accepted.append((label, handle, broken))
    handle.cancel()


@pytest.mark.req("KVCS-RELAY-AUTHZ-SCOPE", "MOQT-NS-SUBSCRIBE-NAMESPACE")
def test_no_namespace_of_another_scope_leaks_to_a_broader_prefix(kvcs_relay: KvcsRelay,
                                                                 rng: np.random.Generator) -> None:
    """A scope's consumer asks SUBSCRIBE_NAMESPACE for the empty prefix and for ("kvcs-1"). A relay may
    refuse both; if it accepts one, it may announce only publications the consumer is authorized for: a
    publication of the other scope must never be named to it."""
    require_authorization(kvcs_relay, SCOPE)

    async def scenario(f: Findings) -> None:
        for x, y in DIRECTIONS:
            own, other = kvcs_relay.scopes[x], kvcs_relay.scopes[y]
            if granted(other, own.access.tokens.get("subscriber"), "subscribe"):
                continue  # one subscriber token for both scopes: the other scope's publications are its to see
            watchers: list[tuple[TrackNamespace, Any, Any]] = []
            try:
                for prefix in (TrackNamespace(()), TrackNamespace((b"kvcs-1",))):
                    client = await own.connect(f"scope {x} consumer, prefix {prefix}")  # one each: they overlap
                    watchers.append((prefix, client, None))
                    try:
                        record("sent", "SUBSCRIBE_NAMESPACE", prefix=str(prefix), token="subscriber")
                        with waiting(f"the answer to SUBSCRIBE_NAMESPACE {prefix}"):
                            handle = await client.subscribe_namespace(prefix, auth=own.token("subscriber"))
                    except RequestRejected as exc:  # a relay may refuse a prefix broader than a scope
                        record("received", "REQUEST_ERROR", prefix=str(prefix), code=exc.code)
                        f.expect(exc.error is not None, "MOQT-NS-SUBSCRIBE-NAMESPACE",
                                 f"[scope {x}] first answer to SUBSCRIBE_NAMESPACE {describe(prefix)}: seen "
                                 f"{rejection(exc)}, expected REQUEST_OK or REQUEST_ERROR")
                        continue
                    watchers[-1] = (prefix, client, handle)
                accepted = [(p, h) for p, _, h in watchers if h is not None]
                foreign_spec, own_spec = cache_spec(rng, layers=2, blocks=2), cache_spec(rng, layers=2, blocks=2)
                async with kvcs_publication(other, foreign_spec, rng) as foreign, \
                        kvcs_publication(own, own_spec, rng) as mine:
                    for prefix, handle in accepted:
                        await leaks(f, f"scope {x} -> {y}, prefix {describe(prefix)}", prefix, handle, foreign.ns,
                                    mine.ns)
            finally:
                for _, client, _ in watchers:
                    await client.close(timeout=CLOSE_WAIT)
        f.expect(True, SCOPE, "")

    run_findings("NAMESPACE leaks to a broader prefix", scenario, req=SCOPE)


async def leaks(f: Findings, label: str, prefix: TrackNamespace, handle: Any, foreign: TrackNamespace,
                mine: TrackNamespace) -> None:
    """Read an accepted broad namespace subscription until it names the consumer's own scope's publication
    (published after the foreign one); any notice of a namespace in the foreign scope is a leak."""
    foreign_scope = TrackNamespace(foreign.fields[:2])
    while True:
        try:
            kind, suffix = await handle.next(CLIENT_TIMEOUT)
        except TimeoutError:
            f.add("MOQT-NS-SUBSCRIBE-NAMESPACE", f"[{label}] accepted SUBSCRIBE_NAMESPACE: seen no NAMESPACE for the "
                                                 f"consumer's own scope's publication {describe(mine)}, expected one")
            return
        full = prefix + suffix
        record("received", "NAMESPACE" if kind == "namespace" else "NAMESPACE_DONE", namespace=describe(full))
        f.expect(not foreign_scope.is_prefix_of(full), SCOPE,
                 f"[{label}] notice: seen {'NAMESPACE' if kind == 'namespace' else 'NAMESPACE_DONE'} {describe(full)} "
                 "of a scope the consumer is not authorized for, expected only its own scope's")
        if full == mine:
            f.expect(True, "MOQT-NS-SUBSCRIBE-NAMESPACE", "")
            return


@pytest.mark.req("KVCS-SEC-AUTHZ-PUBLISH-NAMESPACE", "KVCS-RELAY-AUTHZ-SCOPE", "MOQT-AUTH-PUBLISH-NAMESPACE")
def test_publish_namespace_into_another_scope_is_refused(kvcs_relay: KvcsRelay, rng: np.random.Generator) -> None:
    """A would-be poisoner announces a publication with the other scope's content fields (same Compatibility
    ID and Anchor Key as a legitimate one, its own Publication ID) and serves objects in it: the relay must
    refuse the PUBLISH_NAMESPACE, announce it to no namespace subscriber, and route no SUBSCRIBE to it."""
    req = "KVCS-SEC-AUTHZ-PUBLISH-NAMESPACE"
    require_authorization(kvcs_relay, req)

    async def scenario(f: Findings) -> None:
        for x, y in DIRECTIONS:
            own, other = kvcs_relay.scopes[x], kvcs_relay.scopes[y]
            spec = cache_spec(rng, layers=2, blocks=2)
            content = TrackNamespace((b"kvcs-1", scope_id(other), spec.compat_id, spec.anchor_key))
            attempts = [("no token", (), UNAUTHORIZED, req),
                        ("an outsider token", own.token("outsider"), UNKNOWN_TOKEN, req),
                        ("the target scope's subscriber token", other.token("subscriber"), UNAUTHORIZED, req),
                        ("its own scope's publisher token", own.token("publisher"), UNAUTHORIZED, SCOPE)]
            attempts = [a for a in attempts if not any(granted(other, t.value, "publish") for t in a[1])]
            async with session(own, f"scope {x} publisher") as intruder, session(other, "watcher") as watcher_client, \
                    session(other, f"scope {y} consumer") as consumer:
                watcher = await watcher_client.subscribe_namespace(content, auth=other.token("subscriber"))
                refused_ns = []
                for label, auth, acceptable, broken in attempts:
                    ns = content + TrackNamespace((rng.bytes(16),))
                    for t in spec.data_tracks(0):
                        intruder.track(ns, t.name).publish_object(0, 0, spec.object_payload(t, 0, 0))
                    record("sent", "PUBLISH_NAMESPACE", namespace=describe(ns), token=label)
                    refused_ns.append((ns, broken))
                    await expect_refused(f, f"[scope {x} -> {y}] PUBLISH_NAMESPACE with {label}",
                                         intruder.publish_namespace(ns, auth=auth), acceptable, req=broken,
                                         code_req="MOQT-AUTH-PUBLISH-NAMESPACE")
                async with kvcs_publication(other, spec, rng) as legit:
                    with waiting("NAMESPACE for the legitimate publication"):
                        notice = await watcher.next(CLIENT_TIMEOUT)
                        while notice != ("namespace", legit.ns.suffix_after(content)):  # earlier ones: refused ones
                            f.add(req, f"[scope {x} -> {y}] notice to the namespace subscriber: seen "
                                       f"{notice[0].upper()} {notice[1]} of a refused publication, expected only the "
                                       "legitimate one")
                            notice = await watcher.next(CLIENT_TIMEOUT)
                    for ns, broken in refused_ns:
                        problem = await refused(f"[scope {x} -> {y}] SUBSCRIBE to {describe(ns)}, whose "
                                                "PUBLISH_NAMESPACE was refused",
                                                subscribe_publication(consumer, _shadow(legit, ns),
                                                                      other.token("subscriber"), manifest=False))
                        f.expect(problem is None, broken, str(problem))

    run_findings("PUBLISH_NAMESPACE into another scope", scenario, req=req)


def _shadow(legit: Any, ns: TrackNamespace) -> Any:
    """The legitimate publication's tracks under the refused namespace ``ns`` (what a consumer would try)."""


    return replace(legit, namespace=KvcsNamespace.parse(ns))
