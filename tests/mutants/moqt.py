"""Broken MOQT relays (targets: python:tests.mutants.moqt:<Name>), for the moqt-relay suite's own tests.

Each class is the reference relay (``kvconform.moqt.relay.Relay``) with one method overridden, breaking
the requirement named in its docstring's first line; MUTANTS maps it to the check functions that must
fail. The harness starts them like the reference, with the policy the PICS declare.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
from collections.abc import Sequence
from typing import Any

from kvconform.moqt import quic
from kvconform.moqt.cache import CachedObject
from kvconform.moqt.data import SG_FIRST_OBJECT, EndOfRange, FetchObject, GroupOrder, ObjectStatus, SubgroupObject
from kvconform.moqt.errors import MoqtDecodeError, RequestErrorCode, SessionError, StreamResetCode
from kvconform.moqt.filters import RangeFilter
from kvconform.moqt.messages import Fetch, PublishNamespace, RequestError, Subscribe, SubscribeNamespace, SubscribeOk
from kvconform.moqt.parameters import Parameters
from kvconform.moqt.policy import Decision, Policy, Right, is_prefix
from kvconform.moqt.relay import (
    Downstream,
    FetchJob,
    FillJob,
    InStream,
    Peer,
    Relay,
    Track,
    Upstream,
    _Refusal,
)
from kvconform.moqt.session import Event, Request, SetupReceived
from kvconform.moqt.structures import AuthToken, KeyValuePair, Location, ParamType, SetupOption, TrackNamespace
from tests.mutants import Mutant

# ---- behaviours several mutants (of this lane and of kvcs-relay) share ----------------------------------


def with_granted_token(policy: Policy, right: Right, namespace: TrackNamespace, params: Parameters) -> Parameters:
    """``params`` carrying, instead of the requester's tokens, a token the policy grants ``right`` on
    ``namespace`` (so the request passes authorization whoever sent it)."""
    for key, grant in policy.tokens.items():
        if grant.expires is None and any(is_prefix(p, namespace.fields) for p in grant.prefixes(right)):
            return params.with_param(ParamType.AUTHORIZATION_TOKEN, AuthToken.use_value(key.value, key.type))
    return params


class _GrantedSubscribe(Relay):
    """Serves every SUBSCRIBE as if it carried a token granted on the track's namespace."""

    def handle_subscribe(self, peer: Peer, req: Request, msg: Subscribe) -> None:
        params = with_granted_token(self.policy, Right.SUBSCRIBE, msg.track_namespace, msg.parameters)
        super().handle_subscribe(peer, req, dataclasses.replace(msg, parameters=params))


class _GrantedFetch(Relay):
    """Serves every FETCH as if it carried a token granted on the track's namespace."""

    def handle_fetch(self, peer: Peer, req: Request, msg: Fetch) -> None:
        params = with_granted_token(self.policy, Right.SUBSCRIBE, msg.track_namespace, msg.parameters)
        super().handle_fetch(peer, req, dataclasses.replace(msg, parameters=params))


class _GrantedSubscribeNamespace(Relay):
    """Accepts every SUBSCRIBE_NAMESPACE as if it carried a token granted on the prefix."""

    def handle_subscribe_namespace(self, peer: Peer, req: Request, msg: SubscribeNamespace) -> None:
        params = with_granted_token(self.policy, Right.SUBSCRIBE, msg.track_namespace_prefix, msg.parameters)
        super().handle_subscribe_namespace(peer, req, dataclasses.replace(msg, parameters=params))


class _GrantedPublishNamespace(Relay):
    """Accepts every PUBLISH_NAMESPACE as if it carried a publisher token granted on the namespace."""

    def handle_publish_namespace(self, peer: Peer, req: Request, msg: PublishNamespace) -> None:
        params = with_granted_token(self.policy, Right.PUBLISH, msg.track_namespace, msg.parameters)
        super().handle_publish_namespace(peer, req, dataclasses.replace(msg, parameters=params))


class _StoredFetch(Relay):
    """Serves a FETCH of a track it does not follow once the whole upstream range is stored (no cut-through),
    so ``serve_fetch_range`` sees every FETCH response whole (a mutant reordering it reorders all of it)."""

    def cuts_through(self, job: FetchJob) -> bool:
        return False


# ---- delivery and fill ------------------------------------------------------------------------------


class DropsFillRelay(Relay):
    """MOQT-FILL-EXACTLY-ONCE: opens the fill stream and FINs it, but leaves out every cached object."""

    def fill_items(self, *args: Any, **kwargs: Any) -> list[FetchObject | EndOfRange]:
        return []


class DoubleFillRelay(Relay):
    """MOQT-FILL-EXACTLY-ONCE: serves each fill twice, so every fill object is delivered two times."""

    def serve_fill(self, *args: Any, **kwargs: Any) -> None:
        for _ in range(2):
            super().serve_fill(*args, **kwargs)


class AlteringRelay(Relay):
    """MOQT-RELAY-NO-MODIFY: reverses the payload bytes of the objects it forwards on subscriptions."""

    def forward_object(self, ds: Downstream, st: InStream, obj: SubgroupObject) -> None:
        if len(obj.payload) > 1:
            obj = SubgroupObject(obj.object_id, obj.payload[::-1], obj.status, obj.properties, obj.track_alias,
                                 obj.group_id, obj.subgroup_id, obj.publisher_priority)
        super().forward_object(ds, st, obj)


class DropsEndMarkersRelay(Relay):
    """MOQT-RELAY-END-MARKERS: does not forward End of Group and End of Track status objects."""

    def forward_object(self, ds: Downstream, st: InStream, obj: SubgroupObject) -> None:
        if obj.status in (ObjectStatus.END_OF_GROUP, ObjectStatus.END_OF_TRACK):
            return
        super().forward_object(ds, st, obj)


class FinAfterDoneRelay(Relay):
    """MOQT-SUB-PUBLISH-DONE: holds each fill stream's FIN back until the subscription ends, then sends PUBLISH_DONE
    first and the FIN only once PUBLISH_DONE has left (its Stream Count is right)."""

    held: dict[tuple[int, int], int]

    def finish_fill(self, job: FillJob, gap_kind: int) -> None:
        ds = job.ds
        self.write_fetch_items(ds.peer, job.stream_id,
                               self.fill_items(ds, job.start, job.end, job.descending, job.filters, gap_kind))
        self.__dict__.setdefault("held", {})[(ds.peer.number, ds.request.stream_id)] = job.stream_id

    def _end_downstream(self, ds: Downstream, status: int, reason: str) -> None:
        sid = self.__dict__.setdefault("held", {}).pop((ds.peer.number, ds.request.stream_id), None)
        if sid is None or ds.finished:
            super()._end_downstream(ds, status, reason)
            return
        ds.finished = True
        if ds in ds.track.subscribers:
            ds.track.subscribers.remove(ds)
        ds.peer.downstream.pop(ds.request.stream_id, None)
        session = ds.peer.session
        session.publish_done(ds.request.stream_id, status, reason)
        # once PUBLISH_DONE has left (bounded at 0.2 s, by when it has on loopback)
        ds.peer.conn.when_sent([ds.request.stream_id], functools.partial(session.end_data_stream, sid), 0.2)


class CorruptCacheRelay(Relay):
    """MOQT-RELAY-CACHE-IDENTICAL: serves cached objects (fills, FETCH) with their last payload byte flipped."""

    def to_fetch_object(self, obj: CachedObject) -> FetchObject:
        served = super().to_fetch_object(obj)
        if not served.payload:
            return served
        payload = served.payload[:-1] + bytes([served.payload[-1] ^ 0x01])
        return FetchObject(served.group_id, served.object_id, payload, served.subgroup_id,
                           served.publisher_priority, served.properties)


class Narrow32BitGroupRelay(Relay):
    """MOQT-RELAY-CACHE-IDENTICAL: keeps cached Group IDs in 32 bits, so objects of Group 2^32 and above are
    served from cache (fills, FETCH) in Group ID mod 2^32."""

    def to_fetch_object(self, obj: CachedObject) -> FetchObject:
        served = super().to_fetch_object(obj)
        return FetchObject(served.group_id & 0xFFFFFFFF, served.object_id, served.payload, served.subgroup_id,
                           served.publisher_priority, served.properties)


class MalformedPropertiesRelay(Relay):
    """MOQT-CTRL-KVP: forwards Object Properties as bytes that are no Key-Value-Pair (an odd Type with no
    Length)."""

    def forward_object(self, ds: Downstream, st: InStream, obj: SubgroupObject) -> None:
        if obj.properties:
            obj = SubgroupObject(obj.object_id, obj.payload, obj.status, b"\x01", obj.track_alias,
                                 obj.group_id, obj.subgroup_id, obj.publisher_priority)
        super().forward_object(ds, st, obj)


class NoFirstObjectRelay(Relay):
    """MOQT-DATA-FIRST-OBJECT: clears FIRST_OBJECT on every stream it forwards."""

    def forward_object(self, ds: Downstream, st: InStream, obj: SubgroupObject) -> None:
        st.header = dataclasses.replace(st.header, type_flags=st.header.type_flags & ~SG_FIRST_OBJECT)
        super().forward_object(ds, st, obj)


class IgnoresForwardRelay(Relay):
    """MOQT-SUB-FORWARD: delivers objects to a subscription whose FORWARD is 0."""

    def accept_subscribe(self, peer: Peer, req: Request, msg: Subscribe, track: Track) -> Downstream:
        ds = super().accept_subscribe(peer, req, msg, track)
        ds.forward = True
        return ds


class DropsTrackPropertiesRelay(Relay):
    """MOQT-RELAY-TRACK-PROPERTIES: forgets the Track Properties its publishers announce."""

    def _learn_track(self, track: Track, props: tuple[KeyValuePair, ...], largest: Location | None) -> None:
        super()._learn_track(track, (), largest)


class RangeFilterBlindFillRelay(Relay):
    """MOQT-PARAM-RANGE-FILTER: serves fills without applying the subscription's Range Filters."""

    def fill_items(self, ds: Downstream, start: Location, end: Location, descending: bool,
                   filters: Sequence[RangeFilter], *rest: Any) -> list[FetchObject | EndOfRange]:
        return super().fill_items(ds, start, end, descending, (), *rest)


class NeverResetsRelay(Relay):
    """MOQT-FILL-CANCEL-RESETS: never resets a data stream, so a cancelled subscription's fill stays open."""

    async def _serve_peer(self, conn: quic.MoqtConnection) -> None:
        conn.session.reset_data_stream = lambda *args, **kwargs: None  # type: ignore[method-assign]
        await super()._serve_peer(conn)


class CacheForeverRelay(Relay):
    """MOQT-RELAY-MAX-CACHE-DURATION: ignores the Track Property MAX_CACHE_DURATION (serves expired objects)."""

    def _learn_track(self, track: Track, props: tuple[KeyValuePair, ...], largest: Location | None) -> None:
        super()._learn_track(track, props, largest)
        track.cache.max_cache_duration_ms = None


class AcceptsConflictsRelay(Relay):
    """MOQT-DATA-MALFORMED-DUPLICATE: drops a conflicting duplicate silently instead of treating the track as
    malformed (no PUBLISH_DONE MALFORMED_TRACK)."""

    def _track_malformed(self, track: Track) -> None:
        return None


# ---- FETCH ------------------------------------------------------------------------------------------


class ReorderedFetchRelay(_StoredFetch):
    """MOQT-FETCH-ORDER: writes a FETCH's groups in the opposite of the requested group order."""

    def serve_fetch_range(self, peer: Peer, req: Request, track: Track, stream_id: int,
                          items: Sequence[FetchObject | EndOfRange]) -> None:
        writer = peer.session._out[stream_id].fetch
        flipped = GroupOrder.DESCENDING if writer.group_order == GroupOrder.ASCENDING else GroupOrder.ASCENDING
        writer.group_order = flipped  # the stream stays decodable, with the groups in the wrong order
        objects = [i for i in items if isinstance(i, FetchObject)]
        sign = -1 if flipped == GroupOrder.DESCENDING else 1
        objects.sort(key=lambda o: (sign * o.group_id, o.object_id))
        self.write_fetch_items(peer, stream_id, objects)


class EmptyFetchResetRelay(Relay):
    """MOQT-FETCH-EMPTY: resets the fetch stream of a range that holds no object instead of ending it with FIN."""

    def serve_fetch_range(self, peer: Peer, req: Request, track: Track, stream_id: int,
                          items: Sequence[FetchObject | EndOfRange]) -> None:
        if not any(isinstance(i, FetchObject) for i in items):
            peer.session.reset_data_stream(stream_id, StreamResetCode.INTERNAL_ERROR)
            return
        super().serve_fetch_range(peer, req, track, stream_id, items)


class FetchNotSupportedRelay(Relay):
    """MOQT-FETCH-RANGE: refuses every standalone FETCH with REQUEST_ERROR NOT_SUPPORTED (moq-rs 0.5.1 does so for
    most ranges, docs/interop-moqrs.md #2): checks that FETCH on their way to something else fail on this rule."""

    def handle_fetch(self, peer: Peer, req: Request, msg: Fetch) -> None:
        raise _Refusal(RequestErrorCode.NOT_SUPPORTED, "FETCH not supported")


class InternalErrorRefusalRelay(Relay):
    """MOQT-FETCH-INVALID-RANGE: refuses every request it refuses with REQUEST_ERROR INTERNAL_ERROR (0x0)."""

    def _refuse(self, peer: Peer, req: Request, code: int, reason: str) -> None:
        super()._refuse(peer, req, RequestErrorCode.INTERNAL_ERROR, reason)


# ---- namespaces ---------------------------------------------------------------------------------------


class SilentNamespaceRelay(Relay):
    """MOQT-NS-SUBSCRIBE-NAMESPACE: announces only the publications that existed when SUBSCRIBE_NAMESPACE
    arrived; later ones and withdrawals are never sent (no NAMESPACE / NAMESPACE_DONE)."""

    def _announce(self, ns: TrackNamespace, done: bool) -> None:
        return None


class OverlapBlindRelay(Relay):
    """MOQT-NS-PREFIX-OVERLAP: accepts a SUBSCRIBE_NAMESPACE whose prefix overlaps an active one."""

    def handle_subscribe_namespace(self, peer: Peer, req: Request, msg: SubscribeNamespace) -> None:
        active = dict(peer.namespace_subs)
        peer.namespace_subs.clear()  # hide the active prefixes from the overlap test
        try:
            super().handle_subscribe_namespace(peer, req, msg)
        finally:
            peer.namespace_subs.update(active)


class ExactRoutingRelay(Relay):
    """MOQT-RELAY-SUBSCRIBE-ROUTING: routes a SUBSCRIBE only to a publisher of exactly its namespace, not
    to the publishers of its prefixes."""

    def publishers_for(self, namespace: TrackNamespace) -> list[Peer]:
        return [p for p in self.peers if not p.gone and namespace in p.publications.values()]


class ForwardsPublishNamespaceRelay(Relay):
    """MOQT-NS-NO-FORWARD-PUBLISH-NAMESPACE: also forwards PUBLISH_NAMESPACE to namespace subscribers (the
    pre-d22 behaviour)."""

    def _announce(self, ns: TrackNamespace, done: bool) -> None:
        super()._announce(ns, done)
        if done:
            return
        for sub_peer in self.peers:
            if not sub_peer.gone and any(p.is_prefix_of(ns) for p in sub_peer.namespace_subs.values()):
                sub_peer.session.publish_namespace(ns)


class EagerOkRelay(Relay):
    """MOQT-RELAY-ESTABLISHED-BEFORE-OK: answers SUBSCRIBE_OK without waiting for the upstream subscription."""

    def hold_until_established(self, peer: Peer, req: Request, msg: Subscribe, track: Track) -> None:
        self.accept_subscribe(peer, req, msg, track)


class ClosesOnUnknownCodeRelay(Relay):
    """MOQT-ERR-UNKNOWN-CODE: closes the publisher's session when it refuses a SUBSCRIBE with a code the relay
    does not know."""

    sources: dict[int, list[Peer]]  # a held SUBSCRIBE (id of its Request) -> the publishers asked for it

    def hold_until_established(self, peer: Peer, req: Request, msg: Subscribe, track: Track) -> None:
        self.__dict__.setdefault("sources", {})[id(req)] = [u.peer for u in track.upstreams]
        super().hold_until_established(peer, req, msg, track)

    def subscribe_established(self, peer: Peer, req: Request, msg: Subscribe, track: Track,
                              last: SubscribeOk | RequestError | None) -> None:
        sources = self.__dict__.setdefault("sources", {}).pop(id(req), [])
        try:
            super().subscribe_established(peer, req, msg, track, last)
        except _Refusal as refusal:
            if refusal.code not in set(RequestErrorCode):
                for source in sources:
                    source.session.close(SessionError.PROTOCOL_VIOLATION, f"unknown code 0x{refusal.code:x}")
            raise


class SkipsRequestIdRelay(Relay):
    """MOQT-CTRL-REQUEST-ID-SEQUENCE: burns a Request ID before each upstream SUBSCRIBE (gaps in 1, 3, 5...)."""

    def open_upstream(self, source: Peer, track: Track) -> Upstream:
        source.session.next_request_id()
        return super().open_upstream(source, track)


# ---- authorization ------------------------------------------------------------------------------------


class OpenRelay(Relay):
    """MOQT-AUTH-SUBSCRIBE: authorizes every request whatever its token (no authorization at all)."""

    def authorize(self, peer: Peer, right: Right, namespace: TrackNamespace, params: Parameters) -> Decision:
        return Decision(True)


class OpenPublishNamespaceRelay(_GrantedPublishNamespace):
    """MOQT-AUTH-PUBLISH-NAMESPACE: accepts every PUBLISH_NAMESPACE as if it carried the publisher token."""


class OpenFetchRelay(_GrantedFetch):
    """MOQT-AUTH-FETCH: serves every FETCH as if it carried the subscriber token."""


class OpenSubscribeNamespaceRelay(_GrantedSubscribeNamespace):
    """MOQT-AUTH-SUBSCRIBE-NAMESPACE: accepts every SUBSCRIBE_NAMESPACE as if it carried the subscriber token."""


class ExpiryBlindRelay(Relay):
    """MOQT-AUTH-TOKEN: refuses an expired token with UNAUTHORIZED instead of EXPIRED_AUTH_TOKEN (0x5)."""

    def authorize(self, peer: Peer, right: Right, namespace: TrackNamespace, params: Parameters) -> Decision:
        decision = super().authorize(peer, right, namespace, params)
        if not decision.allowed and decision.code == RequestErrorCode.EXPIRED_AUTH_TOKEN:
            return Decision(False, RequestErrorCode.UNAUTHORIZED, decision.reason)
        return decision


# ---- malformed control messages -----------------------------------------------------------------------


class _WrongCloseCode(Relay):
    """Closes offending sessions with ``wrong`` wherever the session would have used ``right`` for a defect
    ``breaks`` says (from the reason the reference closes with); any other defect it closes for right."""

    right: int = SessionError.PROTOCOL_VIOLATION
    wrong: int = SessionError.INTERNAL_ERROR

    @staticmethod
    def breaks(reason: str) -> bool:
        return True

    async def _serve_peer(self, conn: quic.MoqtConnection) -> None:
        session = conn.session
        close = session.close

        def close_with_wrong_code(code: int = SessionError.NO_ERROR, reason: str = "") -> None:
            close(self.wrong if code == self.right and self.breaks(reason) else code, reason)

        session.close = close_with_wrong_code  # type: ignore[method-assign]
        await super()._serve_peer(conn)


class InternalErrorCloseRelay(_WrongCloseCode):
    """MOQT-CTRL-LENGTH-MISMATCH: closes a session whose message body does not match its Message Length with
    INTERNAL_ERROR (0x1) instead of PROTOCOL_VIOLATION (0x3)."""

    @staticmethod
    def breaks(reason: str) -> bool:
        return "Message Length" in reason or "needs " in reason


class UnknownTypeInternalErrorRelay(_WrongCloseCode):
    """MOQT-CTRL-UNKNOWN-TYPE: closes on an unknown control message type with INTERNAL_ERROR (0x1) instead of
    PROTOCOL_VIOLATION (0x3)."""

    @staticmethod
    def breaks(reason: str) -> bool:
        return "unknown control message type" in reason


class NotAllowedInternalErrorRelay(_WrongCloseCode):
    """MOQT-PARAM-NOT-ALLOWED: closes on a parameter the message type does not allow with INTERNAL_ERROR (0x1)
    instead of PROTOCOL_VIOLATION (0x3)."""

    @staticmethod
    def breaks(reason: str) -> bool:
        return "is not allowed in" in reason and "(FILL_PARAMETERS)[" not in reason


class RequestFirstInternalErrorRelay(_WrongCloseCode):
    """MOQT-CTRL-REQUEST-STREAM-FIRST: closes on a response message opening a request stream with
    INTERNAL_ERROR (0x1) instead of PROTOCOL_VIOLATION (0x3)."""

    @staticmethod
    def breaks(reason: str) -> bool:
        return "cannot open a request stream" in reason


class ControlStreamInternalErrorRelay(_WrongCloseCode):
    """MOQT-CTRL-CONTROL-STREAMS: closes on a misused control stream (a second SETUP, a request on it, its FIN)
    with INTERNAL_ERROR (0x1) instead of PROTOCOL_VIOLATION (0x3)."""

    @staticmethod
    def breaks(reason: str) -> bool:
        return "§4.1" in reason


class NamespaceLimitsInternalErrorRelay(_WrongCloseCode):
    """MOQT-CTRL-NAMESPACE-LIMITS: closes on a namespace of 33 fields or with an empty field with INTERNAL_ERROR
    (0x1) instead of PROTOCOL_VIOLATION (0x3)."""

    @staticmethod
    def breaks(reason: str) -> bool:
        return "Number of Fields" in reason or "zero-length namespace field" in reason


class TextOnlyNamesRelay(Relay):
    """MOQT-CTRL-NAMESPACE-BYTES: closes the session with PROTOCOL_VIOLATION 'invalid string' on a request whose
    Track Namespace (or prefix) has a field that is not UTF-8, as moq-rs 0.5.1 does (docs/interop-moqrs.md #1)."""

    def _on_request(self, peer: Peer, req: Request) -> None:
        msg = req.message
        ns = getattr(msg, "track_namespace", None) or getattr(msg, "track_namespace_prefix", None)
        for field in ns.fields if ns is not None else ():
            try:
                field.decode("utf-8")
            except UnicodeDecodeError:
                peer.session.close(SessionError.PROTOCOL_VIOLATION, "invalid string")
                return
        super()._on_request(peer, req)


class LongNamesAcceptedRelay(Relay):
    """MOQT-CTRL-NAMESPACE-LIMITS: does not close a session whose request names a Full Track Name over 4 096 bytes
    (the request is dropped, the session stays open)."""

    async def _serve_peer(self, conn: quic.MoqtConnection) -> None:
        session = conn.session
        close = session.close

        def close_unless_long(code: int = SessionError.NO_ERROR, reason: str = "") -> None:
            if "Full Track Name" not in reason:
                close(code, reason)

        session.close = close_unless_long  # type: ignore[method-assign]
        await super()._serve_peer(conn)


class FillParametersInternalErrorRelay(_WrongCloseCode):
    """MOQT-PARAM-FILL-PARAMETERS: closes on a parameter FILL_PARAMETERS may not hold with INTERNAL_ERROR (0x1)
    instead of PROTOCOL_VIOLATION (0x3)."""

    @staticmethod
    def breaks(reason: str) -> bool:
        return "(FILL_PARAMETERS)[" in reason


class LocationFilterInternalErrorRelay(_WrongCloseCode):
    """MOQT-PARAM-LOCATION-FILTER: closes on an unknown LOCATION_FILTER Filter Type with INTERNAL_ERROR (0x1)
    instead of PROTOCOL_VIOLATION (0x3)."""

    @staticmethod
    def breaks(reason: str) -> bool:
        return "Location Filter Type" in reason and "needs " not in reason


class ParityAsViolationRelay(_WrongCloseCode):
    """MOQT-CTRL-REQUEST-ID-PARITY: closes on a wrong-parity or duplicate Request ID with
    PROTOCOL_VIOLATION instead of INVALID_REQUEST_ID (0x4)."""

    right = SessionError.INVALID_REQUEST_ID
    wrong = SessionError.PROTOCOL_VIOLATION


class IgnoresUnknownStreamsRelay(Relay):
    """MOQT-CTRL-UNKNOWN-STREAM-TYPE: reads a unidirectional stream of unknown type as padding instead of
    closing the session."""

    async def _serve_peer(self, conn: quic.MoqtConnection) -> None:
        session = conn.session
        classify = session._classify

        def lenient(st: Any) -> bool:
            try:
                return bool(classify(st))
            except MoqtDecodeError:
                st.kind = "padding"
                return True

        session._classify = lenient  # type: ignore[method-assign]
        await super()._serve_peer(conn)


class UnknownOptionsRefusedRelay(Relay):
    """MOQT-SETUP-OPTIONS: closes a session whose SETUP carries a Setup Option it does not know, instead of
    ignoring it."""

    def dispatch(self, peer: Peer, event: Event) -> None:
        if isinstance(event, SetupReceived) and any(kv.type not in set(SetupOption) for kv in event.setup.options):
            peer.session.close(SessionError.PROTOCOL_VIOLATION, "unknown Setup Option")
            return
        super().dispatch(peer, event)


class FragileRelay(Relay):
    """MOQT-CTRL-LENGTH-MISMATCH: closes the offending session, then shuts down the whole relay with it."""

    def _peer_gone(self, peer: Peer) -> None:
        super()._peer_gone(peer)
        closed = peer.session.closed
        if closed is not None and not closed.by_peer and closed.code != SessionError.NO_ERROR:
            asyncio.get_running_loop().create_task(self.close())


# ---------------------------------------------------------------------------------------------------------


_EXACTLY_ONCE = ("test_next_object_plus_fill_is_exactly_once_mid_track",
                 "test_objects_published_while_the_subscribe_is_in_flight",
                 "test_several_subscribers_joining_at_different_points")
MUTANTS: dict[str, Mutant] = {
    "DropsFillRelay": Mutant("moqt-relay", "MOQT-FILL-EXACTLY-ONCE", _EXACTLY_ONCE),
    "DoubleFillRelay": Mutant("moqt-relay", "MOQT-FILL-EXACTLY-ONCE", _EXACTLY_ONCE),
    "AlteringRelay": Mutant("moqt-relay", "MOQT-RELAY-NO-MODIFY", ("test_forwarded_objects_are_unchanged_and_in_order",
                                                                   "test_next_object_plus_fill_is_exactly_once_mid_track")),
    "DropsEndMarkersRelay": Mutant("moqt-relay", "MOQT-RELAY-END-MARKERS",
                                   ("test_end_of_group_and_end_of_track_reach_the_subscriber",)),
    "Narrow32BitGroupRelay": Mutant("moqt-relay", "MOQT-RELAY-CACHE-IDENTICAL",
                                    ("test_ids_at_vi64_width_boundaries_survive_the_cache",)),
    "FinAfterDoneRelay": Mutant("moqt-relay", "MOQT-SUB-PUBLISH-DONE",
                                ("test_a_subscriber_after_the_end_gets_the_track_then_publish_done",)),
    "CorruptCacheRelay": Mutant("moqt-relay", "MOQT-RELAY-CACHE-IDENTICAL",
                                ("test_cached_objects_are_byte_identical",
                                 "test_fetch_ranges_arrive_in_ascending_group_order")),
    "ReorderedFetchRelay": Mutant("moqt-relay", "MOQT-FETCH-ORDER",
                                  ("test_fetch_ranges_arrive_in_ascending_group_order",
                                   "test_fetch_descending_group_order")),
    "EmptyFetchResetRelay": Mutant("moqt-relay", "MOQT-FETCH-EMPTY", ("test_fetch_of_a_range_without_objects",)),
    "FetchNotSupportedRelay": Mutant("moqt-relay", "MOQT-FETCH-RANGE",
                                     ("test_the_relays_own_requests", "test_everything_the_relay_writes_decodes")),
    "InternalErrorRefusalRelay": Mutant("moqt-relay", "MOQT-FETCH-INVALID-RANGE",
                                        ("test_fetch_past_the_largest_object_is_invalid_range",)),
    "SilentNamespaceRelay": Mutant("moqt-relay", "MOQT-NS-SUBSCRIBE-NAMESPACE",
                                   ("test_namespace_prefix_subscription_sees_every_matching_publication",)),
    "OverlapBlindRelay": Mutant("moqt-relay", "MOQT-NS-PREFIX-OVERLAP",
                                ("test_overlapping_namespace_prefixes_in_one_session",)),
    "ExactRoutingRelay": Mutant("moqt-relay", "MOQT-RELAY-SUBSCRIBE-ROUTING",
                                ("test_subscribe_reaches_the_publisher_of_a_namespace_prefix",)),
    "OpenRelay": Mutant("moqt-relay", "MOQT-AUTH-SUBSCRIBE",
                        ("test_unauthorized_subscribe_is_refused_and_nothing_delivered",)),
    "OpenPublishNamespaceRelay": Mutant("moqt-relay", "MOQT-AUTH-PUBLISH-NAMESPACE",
                                        ("test_unauthorized_publish_namespace_is_refused",)),
    "OpenFetchRelay": Mutant("moqt-relay", "MOQT-AUTH-FETCH",
                             ("test_unauthorized_fetch_is_refused_and_nothing_delivered",)),
    "OpenSubscribeNamespaceRelay": Mutant("moqt-relay", "MOQT-AUTH-SUBSCRIBE-NAMESPACE",
                                          ("test_unauthorized_subscribe_namespace_is_refused",)),
    # The expired token is declared (a testbed default is no declaration of one).
    "ExpiryBlindRelay": Mutant("moqt-relay", "MOQT-AUTH-TOKEN", ("test_expired_token_is_expired_auth_token",),
                               pics=("moqt.relay.tokens.expired=kvcs-old-token",)),
    "UnknownOptionsRefusedRelay": Mutant("moqt-relay", "MOQT-SETUP-OPTIONS", ("test_the_relay_answers_setup",)),
    "InternalErrorCloseRelay": Mutant("moqt-relay", "MOQT-CTRL-LENGTH-MISMATCH", ("test_message_length_mismatch",)),
    "UnknownTypeInternalErrorRelay": Mutant("moqt-relay", "MOQT-CTRL-UNKNOWN-TYPE", ("test_unknown_message_type",)),
    "NotAllowedInternalErrorRelay": Mutant("moqt-relay", "MOQT-PARAM-NOT-ALLOWED",
                                           ("test_parameter_not_allowed_in_message",)),
    "RequestFirstInternalErrorRelay": Mutant("moqt-relay", "MOQT-CTRL-REQUEST-STREAM-FIRST",
                                             ("test_response_message_opens_a_request_stream",)),
    "ControlStreamInternalErrorRelay": Mutant("moqt-relay", "MOQT-CTRL-CONTROL-STREAMS",
                                              ("test_control_stream_misuse",)),
    "NamespaceLimitsInternalErrorRelay": Mutant("moqt-relay", "MOQT-CTRL-NAMESPACE-LIMITS",
                                                ("test_namespace_limits",)),
    # A text prefix (the loopback PICS declare a binary Scope ID field), as a relay of text names would have.
    "TextOnlyNamesRelay": Mutant("moqt-relay", "MOQT-CTRL-NAMESPACE-BYTES",
                                 ("test_binary_namespace_fields_are_accepted",),
                                 pics=("moqt.relay.prefix=[kvconform, text-only]",)),
    "LongNamesAcceptedRelay": Mutant("moqt-relay", "MOQT-CTRL-NAMESPACE-LIMITS", ("test_namespace_limits",)),
    "FillParametersInternalErrorRelay": Mutant("moqt-relay", "MOQT-PARAM-FILL-PARAMETERS",
                                               ("test_forbidden_parameter_inside_fill_parameters",)),
    "LocationFilterInternalErrorRelay": Mutant("moqt-relay", "MOQT-PARAM-LOCATION-FILTER",
                                               ("test_unknown_location_filter_type",)),
    "IgnoresUnknownStreamsRelay": Mutant("moqt-relay", "MOQT-CTRL-UNKNOWN-STREAM-TYPE",
                                         ("test_unknown_unidirectional_stream_type",)),
    "MalformedPropertiesRelay": Mutant("moqt-relay", "MOQT-CTRL-KVP", ("test_everything_the_relay_writes_decodes",)),
    "NoFirstObjectRelay": Mutant("moqt-relay", "MOQT-DATA-FIRST-OBJECT",
                                 ("test_end_of_group_and_end_of_track_reach_the_subscriber",)),
    "IgnoresForwardRelay": Mutant("moqt-relay", "MOQT-SUB-FORWARD",
                                  ("test_forward_state_0_sends_nothing_until_updated",)),
    "DropsTrackPropertiesRelay": Mutant("moqt-relay", "MOQT-RELAY-TRACK-PROPERTIES",
                                        ("test_track_properties_reach_subscribers",)),
    "RangeFilterBlindFillRelay": Mutant("moqt-relay", "MOQT-PARAM-RANGE-FILTER",
                                        ("test_object_id_filter_selects_the_first_objects",)),
    "ForwardsPublishNamespaceRelay": Mutant("moqt-relay", "MOQT-NS-NO-FORWARD-PUBLISH-NAMESPACE",
                                            ("test_namespace_prefix_subscription_sees_every_matching_publication",)),
    "EagerOkRelay": Mutant("moqt-relay", "MOQT-RELAY-ESTABLISHED-BEFORE-OK",
                           ("test_subscribe_ok_only_after_the_upstream_subscription_is_established",)),
    "NeverResetsRelay": Mutant("moqt-relay", "MOQT-FILL-CANCEL-RESETS",
                               ("test_cancelling_the_subscription_resets_its_open_fill",)),
    "CacheForeverRelay": Mutant("moqt-relay", "MOQT-RELAY-MAX-CACHE-DURATION",
                                ("test_expired_objects_are_not_served_from_cache",)),
    "AcceptsConflictsRelay": Mutant("moqt-relay", "MOQT-DATA-MALFORMED-DUPLICATE",
                                    ("test_a_duplicate_object_with_another_payload_makes_the_track_malformed",)),
    "ClosesOnUnknownCodeRelay": Mutant("moqt-relay", "MOQT-ERR-UNKNOWN-CODE",
                                       ("test_unknown_error_code_from_upstream_keeps_the_session",)),
    "SkipsRequestIdRelay": Mutant("moqt-relay", "MOQT-CTRL-REQUEST-ID-SEQUENCE", ("test_the_relays_own_requests",)),
    "ParityAsViolationRelay": Mutant("moqt-relay", "MOQT-CTRL-REQUEST-ID-PARITY", ("test_wrong_request_id",)),
    "FragileRelay": Mutant("moqt-relay", "MOQT-CTRL-LENGTH-MISMATCH", ("test_message_length_mismatch",)),
}

# Checks no mutant is required to fail, and why.
UNMUTATED_CHECKS: dict[str, str] = {
    "test_non_minimal_integers_are_accepted": (
        "vi64 decoding is the shared codec (kvconform.moqt.vi64) under every Relay subclass, so no relay mutant can "
        "refuse non-minimal encodings without replacing the codec; tests/moqt/test_vi64.py covers the decoder"),
}
