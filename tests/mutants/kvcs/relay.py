"""Broken relays for the kvcs-relay suite (targets: python:tests.mutants.kvcs:<Name>).

Each class is the reference relay (``kvconform.moqt.relay.Relay``) with one method overridden, breaking the
KVCS relay requirement (or the MOQT rule KVCS relies on) named at the start of its docstring; MUTANTS maps
it to the check functions that must fail. The harness starts them like the reference, with the policy of the
two scopes the PICS declare.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Sequence

from kvconform.moqt.cache import CachedObject
from kvconform.moqt.data import EndOfRange, EndOfRangeKind, FetchObject, GroupOrder
from kvconform.moqt.filters import RangeFilter
from kvconform.moqt.parameters import Parameters
from kvconform.moqt.policy import Decision, Grant, Policy, Right, is_prefix
from kvconform.moqt.quic import granting_streams_uni
from kvconform.moqt.relay import Downstream, Peer, Relay, Track
from kvconform.moqt.session import Request, SessionUsageError
from kvconform.moqt.structures import KeyValuePair, Location, TrackNamespace
from tests.mutants import Mutant
from tests.mutants.moqt import (
    FinAfterDoneRelay,
    _GrantedFetch,
    _GrantedPublishNamespace,
    _GrantedSubscribe,
    _GrantedSubscribeNamespace,
    _StoredFetch,
)

SUITE = "kvcs-relay"
KVO1_FLAGS = slice(6, 8)  # the Flags field of the KVO1 header


# ---- authorization ------------------------------------------------------------------------------------


def _coarse(grant: Grant) -> Grant:
    return dataclasses.replace(grant, publish=tuple(p[:1] for p in grant.publish),
                               subscribe=tuple(p[:1] for p in grant.subscribe))


class ScopeBlindRelay(Relay):
    """KVCS-RELAY-AUTHZ-SCOPE: authorizes at the granularity of ("kvcs-1") only: a right in one scope is
    taken as a right in every scope."""

    def authorize(self, peer: Peer, right: Right, namespace: TrackNamespace, params: Parameters) -> Decision:
        policy = Policy(self.policy.allow_all, _coarse(self.policy.anonymous),
                        {key: _coarse(grant) for key, grant in self.policy.tokens.items()})
        return policy.check(right, namespace.fields, self.request_tokens(peer, params), self.wall_clock())


class DiscoveryLeakRelay(Relay):
    """KVCS-RELAY-AUTHZ-SCOPE: lets a token with a subscribe right in some scope SUBSCRIBE_NAMESPACE any
    shorter prefix (the empty one, ("kvcs-1")) and then announces every publication under it, of every scope."""

    def authorize(self, peer: Peer, right: Right, namespace: TrackNamespace, params: Parameters) -> Decision:
        decision = super().authorize(peer, right, namespace, params)
        if decision.allowed or right is not Right.SUBSCRIBE:
            return decision
        grants = [self.policy.tokens[k] for k in self.request_tokens(peer, params) if k in self.policy.tokens]
        if any(is_prefix(namespace.fields, p) for g in grants for p in g.subscribe):
            return Decision(True)
        return decision


class SubscribeAnyScopeRelay(_GrantedSubscribe):
    """KVCS-SEC-AUTHZ-SUBSCRIBE: serves a SUBSCRIBE as if it carried a token of the track's scope."""



class FetchAnyScopeRelay(_GrantedFetch):
    """KVCS-SEC-AUTHZ-FETCH: serves a FETCH as if it carried a token of the track's scope."""



class DiscoverAnyScopeRelay(_GrantedSubscribeNamespace):
    """KVCS-SEC-AUTHZ-SUBSCRIBE-NAMESPACE: accepts a SUBSCRIBE_NAMESPACE as if it carried a token of the
    prefix's scope."""



class PublishAnyScopeRelay(_GrantedPublishNamespace):
    """KVCS-SEC-AUTHZ-PUBLISH-NAMESPACE: accepts a PUBLISH_NAMESPACE as if it carried a publisher token of
    the namespace's scope (anyone can publish poisoned caches under any scope)."""



class FullNamespaceNoticeRelay(Relay):
    """MOQT-NS-SUBSCRIBE-NAMESPACE: names a new publication in NAMESPACE by its whole namespace instead of the
    suffix after the subscribed prefix, so a KVCS consumer discovering by content prefix reads a wrong
    Publication ID."""

    def _announce(self, ns: TrackNamespace, done: bool) -> None:
        for sub_peer in self.peers:
            if sub_peer.gone:
                continue
            for sid, prefix in list(sub_peer.namespace_subs.items()):
                if prefix.is_prefix_of(ns):
                    send = sub_peer.session.send_namespace_done if done else sub_peer.session.send_namespace
                    with contextlib.suppress(SessionUsageError):
                        send(sid, ns)


# ---- delivery and cache -------------------------------------------------------------------------------


class TaggedCopiesRelay(Relay):
    """KVCS-RELAY-SAME-OBJECTS: tags the copies it serves from its cache (fills, FETCH) by setting the KVO1
    Flags field, so later consumers get other bytes than live ones (Flags are ignored on receipt: only a
    byte comparison sees it)."""

    def to_fetch_object(self, obj: CachedObject) -> FetchObject:
        served = super().to_fetch_object(obj)
        if len(served.payload) < KVO1_FLAGS.stop:
            return served
        payload = served.payload[:KVO1_FLAGS.start] + b"\x00\x01" + served.payload[KVO1_FLAGS.stop:]
        return dataclasses.replace(served, payload=payload)


class ShortFillRelay(Relay):
    """KVCS-LIVE-EXACTLY-ONCE: its fill stops one group short: the objects of the last layer (or manifest
    version) up to LARGEST_OBJECT are never delivered."""

    def fill_items(self, ds: Downstream, start: Location, end: Location, descending: bool,
                   filters: Sequence[RangeFilter], gap_kind: int) -> list[FetchObject | EndOfRange]:
        items = super().fill_items(ds, start, end, descending, filters, gap_kind)
        return [i for i in items if i.location.group != end.group]


class CacheDurationInSecondsRelay(Relay):
    """KVCS-RELAY-MAX-CACHE-DURATION: reads the Track Property MAX_CACHE_DURATION as seconds, not
    milliseconds, so it serves objects long after they expired."""

    def _learn_track(self, track: Track, props: tuple[KeyValuePair, ...], largest: Location | None) -> None:
        super()._learn_track(track, props, largest)
        if track.cache.max_cache_duration_ms is not None:
            track.cache.max_cache_duration_ms *= 1000


class PublicationBlindRelay(Relay):
    """KVCS-RELAY-CACHE: keys its tracks and cache by the content fields ("kvcs-1", Scope ID, Compatibility
    ID, Anchor Key) and the track name, not the Full Track Name: two publications of one token prefix share
    one cache, so consumers of one get the other's objects."""

    def track_for(self, namespace: TrackNamespace, name: bytes) -> Track:
        key = (namespace.fields[:4], name)
        track = self.tracks.get(key)
        if track is None:
            track = self.tracks[key] = Track(namespace, name, self.cache.track(key))
        return track


class NoGapFetchRelay(Relay):
    """KVCS-RELAY-CACHE: never fetches upstream what its cache lacks (a relay that joined a publication
    mid-production reports the earlier layers as unknown instead of filling the gap)."""

    def plan_gap_fetch(self, track: Track, start: Location, end: Location, timeout_ms: int | None) -> int:
        return int(EndOfRangeKind.UNKNOWN)


class DescendingLayersRelay(_StoredFetch):
    """KVCS-FETCH-ASCENDING: delivers the layers of a FETCH in descending order although Ascending was
    requested (a consumer cannot pipeline from the first layer)."""

    def serve_fetch_range(self, peer: Peer, req: Request, track: Track, stream_id: int,
                          items: Sequence[FetchObject | EndOfRange]) -> None:
        writer = peer.session._out[stream_id].fetch
        writer.group_order = GroupOrder.DESCENDING  # keeps the stream decodable with the groups reversed
        objects = sorted((i for i in items if isinstance(i, FetchObject)), key=lambda o: (-o.group_id, o.object_id))
        self.write_fetch_items(peer, stream_id, objects)


class ObjectIdFilterBlindRelay(Relay):
    """MOQT-PARAM-RANGE-FILTER: ignores the Range Filters (OBJECTID_FILTER) of a FETCH: a consumer asking for
    the first n blocks of each layer gets all of them."""

    def fetch_items(self, track: Track, start: Location, end: Location, descending: bool,
                    filters: Sequence[RangeFilter], gap_kind: int) -> list[FetchObject | EndOfRange]:
        return super().fetch_items(track, start, end, descending, (), gap_kind)


_AUTH_CROSS = ("test_subscribe_into_another_scope_is_refused", "test_fetch_from_another_scope_is_refused",
               "test_subscribe_namespace_into_another_scope_is_refused",
               "test_publish_namespace_into_another_scope_is_refused")

# ---- operations ------------------------------------------------------------------------------------------

FEW_STREAMS = 4  # initial_max_streams_uni the under-granting relay grants every session


class FewStreamsRelay(Relay):
    """KVCS-OPS-STREAMS: grants every session initial_max_streams_uni 4, less than the 12 the suite's 5-layer
    publications need (aioquic raises it with MAX_STREAMS as streams are used)."""

    async def start(self) -> Relay:
        with granting_streams_uni(FEW_STREAMS):
            return await super().start()


# ---- ending subscriptions --------------------------------------------------------------------------------


class LateDoneRelay(FinAfterDoneRelay):
    """MOQT-SUB-PUBLISH-DONE: holds each fill stream's FIN back until the subscription ends, then sends PUBLISH_DONE
    first and the FIN only once PUBLISH_DONE has left (a KVCS consumer after the end sees its layers, then the
    end out of order)."""


MUTANTS: dict[str, Mutant] = {
    "LateDoneRelay": Mutant(SUITE, "MOQT-SUB-PUBLISH-DONE",
                            ("test_a_consumer_after_the_end_gets_every_layer_then_publish_done",)),
    "ScopeBlindRelay": Mutant(SUITE, "KVCS-RELAY-AUTHZ-SCOPE",
                              (*_AUTH_CROSS, "test_no_namespace_of_another_scope_leaks_to_a_broader_prefix")),
    "DiscoveryLeakRelay": Mutant(SUITE, "KVCS-RELAY-AUTHZ-SCOPE",
                                 ("test_no_namespace_of_another_scope_leaks_to_a_broader_prefix",)),
    "SubscribeAnyScopeRelay": Mutant(SUITE, "KVCS-SEC-AUTHZ-SUBSCRIBE",
                                     ("test_subscribe_into_another_scope_is_refused",)),
    "FetchAnyScopeRelay": Mutant(SUITE, "KVCS-SEC-AUTHZ-FETCH", ("test_fetch_from_another_scope_is_refused",)),
    "DiscoverAnyScopeRelay": Mutant(SUITE, "KVCS-SEC-AUTHZ-SUBSCRIBE-NAMESPACE",
                                    ("test_subscribe_namespace_into_another_scope_is_refused",)),
    "PublishAnyScopeRelay": Mutant(SUITE, "KVCS-SEC-AUTHZ-PUBLISH-NAMESPACE",
                                   ("test_publish_namespace_into_another_scope_is_refused",)),
    "FullNamespaceNoticeRelay": Mutant(SUITE, "MOQT-NS-SUBSCRIBE-NAMESPACE",
                                       ("test_the_texts_example_namespace_is_discovered_and_delivered",)),
    "TaggedCopiesRelay": Mutant(SUITE, "KVCS-RELAY-SAME-OBJECTS",
                                ("test_every_authorized_subscriber_gets_identical_objects",
                                 "test_consumers_joining_a_live_publication_get_every_object_once")),
    "ShortFillRelay": Mutant(SUITE, "KVCS-LIVE-EXACTLY-ONCE",
                             ("test_consumers_joining_a_live_publication_get_every_object_once",)),
    "CacheDurationInSecondsRelay": Mutant(SUITE, "KVCS-RELAY-MAX-CACHE-DURATION",
                                          ("test_layers_are_served_from_cache_only_within_max_cache_duration",)),
    "PublicationBlindRelay": Mutant(SUITE, "KVCS-RELAY-CACHE",
                                    ("test_publications_of_one_token_prefix_are_kept_apart",)),
    "NoGapFetchRelay": Mutant(SUITE, "KVCS-RELAY-CACHE", ("test_fetch_of_layer_ranges_of_a_completed_cache",)),
    "DescendingLayersRelay": Mutant(SUITE, "KVCS-FETCH-ASCENDING",
                                    ("test_fetch_of_layer_ranges_of_a_completed_cache",)),
    "ObjectIdFilterBlindRelay": Mutant(SUITE, "MOQT-PARAM-RANGE-FILTER",
                                       ("test_fetch_of_the_first_blocks_with_objectid_filter",)),
    "FewStreamsRelay": Mutant(SUITE, "KVCS-OPS-STREAMS", ("test_enough_unidirectional_streams_are_granted",)),
}

# Every kvcs-relay check is failed by some mutant above.
UNMUTATED_CHECKS: dict[str, str] = {}
