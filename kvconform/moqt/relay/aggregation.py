"""Subscription aggregation and upstream choice (section 12).

A downstream SUBSCRIBE is aggregated onto one upstream subscription per publisher (LOCATION_FILTER Next
Object); SUBSCRIBE_OK is sent only once one upstream subscription is Established (the adapter waits for the
answers, bounded), with LARGEST_OBJECT = max(upstream LARGEST_OBJECT, largest Location received). A SUBSCRIBE
with RENDEZVOUS_TIMEOUT and no publisher yet is a pending wait of the core: a timer at its deadline refuses it
with TIMEOUT, a publisher arriving first serves it (section 7.1).
"""

from __future__ import annotations

import functools

from kvconform.moqt.cache import FullTrackName
from kvconform.moqt.errors import RequestErrorCode
from kvconform.moqt.filters import LocationFilter
from kvconform.moqt.messages import Publish, RequestError, Subscribe, SubscribeOk
from kvconform.moqt.parameters import FillParameters, Parameters
from kvconform.moqt.policy import Right
from kvconform.moqt.relay.planning import Planning
from kvconform.moqt.relay.state import (
    Downstream,
    Peer,
    Refusal,
    Rendezvous,
    Track,
    Upstream,
    cache_duration,
    int_param,
    range_filters,
)
from kvconform.moqt.session import Request, RequestState
from kvconform.moqt.structures import KeyValuePair, Location, ParamType, TrackNamespace

__all__ = ["Aggregation"]


class Aggregation(Planning):
    """The relay's subscription aggregation concept (a part of ``RelayCore``)."""

    def track_for(self, namespace: TrackNamespace, name: bytes) -> Track:
        key: FullTrackName = (namespace.fields, name)
        track = self.tracks.get(key)
        if track is None:
            track = self.tracks[key] = Track(namespace, name, self.cache.track(key))
        return track

    def publishers_for(self, namespace: TrackNamespace) -> list[Peer]:
        """Sessions whose PUBLISH_NAMESPACE is a prefix of ``namespace`` (section 12), oldest first."""
        return [p for p in self.peers if not p.gone
                and any(ns.is_prefix_of(namespace) for ns in p.publications.values())]

    # -- SUBSCRIBE ------------------------------------------------------------------------------------------

    def handle_subscribe(self, peer: Peer, req: Request, msg: Subscribe) -> None:
        self._require(peer, Right.SUBSCRIBE, msg.track_namespace, msg.parameters)
        self._check_track_name(msg.track_namespace)
        track = self.track_for(msg.track_namespace, msg.track_name)
        if track.cache.malformed:
            raise Refusal(RequestErrorCode.MALFORMED_TRACK, track.cache.malformed)
        if self._answered(track) is not None:
            self.accept_subscribe(peer, req, msg, track)
            return
        sources = [p for p in self.publishers_for(msg.track_namespace)
                   if not any(u.peer is p for u in track.upstreams)]
        if not sources and not track.upstreams:
            rendezvous_ms = int_param(msg.parameters, ParamType.RENDEZVOUS_TIMEOUT) or 0
            if rendezvous_ms == 0:
                raise Refusal(RequestErrorCode.DOES_NOT_EXIST, f"no publisher for {track} (RENDEZVOUS_TIMEOUT 0)")
            self.hold_for_rendezvous(peer, req, msg, track, rendezvous_ms)
            return
        for source in sources:
            self.open_upstream(source, track)
        self.run_subscribe_when_ready(peer, req, msg, track)

    def hold_for_rendezvous(self, peer: Peer, req: Request, msg: Subscribe, track: Track, timeout_ms: int) -> None:
        """Hold a SUBSCRIBE until a matching PUBLISH_NAMESPACE or PUBLISH arrives (RENDEZVOUS_TIMEOUT,
        section 7.1): a pending wait, and a timer at its deadline."""
        rv = Rendezvous(peer, req, msg, track, timeout_ms, self.now + timeout_ms / 1000.0)
        track.rendezvous.append(rv)
        rv.timer = self.set_timer(rv.deadline, functools.partial(self._rendezvous_expired, rv))

    def source_arrived(self, track: Track) -> None:
        """A publisher for ``track`` appeared: the SUBSCRIBEs held for it are looked at again once the request
        that brought it has been handled."""
        if track.rendezvous and not track.wake_pending:
            track.wake_pending = True
            self.call_soon(functools.partial(self._wake_rendezvous, track))

    def _wake_rendezvous(self, track: Track) -> None:
        track.wake_pending = False
        if not (self.publishers_for(track.namespace) or track.upstreams):
            return  # still no source: keep waiting until the deadline
        for rv in list(track.rendezvous):
            if rv not in track.rendezvous:
                continue  # ended by an earlier one's handling
            self._end_rendezvous(rv)
            if not rv.peer.gone and rv.request.state is RequestState.PENDING:
                try:
                    self.handle_subscribe(rv.peer, rv.request, rv.message)
                except Refusal as refusal:
                    self._refuse(rv.peer, rv.request, refusal.code, refusal.reason)

    def _rendezvous_expired(self, rv: Rendezvous) -> None:
        if rv not in rv.track.rendezvous:
            return
        rv.timer = None
        self._end_rendezvous(rv)
        self._refuse(rv.peer, rv.request, RequestErrorCode.TIMEOUT,
                     f"no publisher for {rv.track} within RENDEZVOUS_TIMEOUT {rv.timeout_ms} ms")

    def _end_rendezvous(self, rv: Rendezvous) -> None:
        rv.track.rendezvous.remove(rv)
        if rv.timer is not None:
            self.cancel_timer(rv.timer)
            rv.timer = None

    def _drop_rendezvous(self, peer: Peer) -> None:
        """A session ended: forget the SUBSCRIBEs it had waiting (nothing is answered on a closed session)."""
        for track in self.tracks.values():
            for rv in [r for r in track.rendezvous if r.peer is peer]:
                self._end_rendezvous(rv)

    # -- upstream subscriptions -----------------------------------------------------------------------------

    def upstream_subscribe_parameters(self, track: Track) -> Parameters:
        """The relay's own SUBSCRIBE upstream: FORWARD 1 (default), aggregating with Next Object."""
        return Parameters.of((ParamType.LOCATION_FILTER, LocationFilter.next_object()))

    def open_upstream(self, source: Peer, track: Track) -> Upstream:
        request = source.session.subscribe(track.namespace, track.name, self.upstream_subscribe_parameters(track))
        up = Upstream(source, request, track, self.new_completion(), self.new_signal())
        source.upstream[request.stream_id] = up
        track.upstreams.append(up)
        return up

    def _answered(self, track: Track) -> Upstream | None:
        """An upstream subscription that is Established, or was answered with SUBSCRIBE_OK and is ending
        (a complete track: PUBLISH_DONE right after SUBSCRIBE_OK); its downstream gets PUBLISH_DONE too."""
        for up in track.upstreams:
            if up.established:
                return up
        for up in track.upstreams:
            if up.ready.done() and isinstance(up.ready.result(), SubscribeOk):
                return up
        return None

    def upstream_refusal(self, track: Track, last: SubscribeOk | RequestError | None) -> Refusal:
        """Why a held SUBSCRIBE is refused when no upstream subscription became Established in time: the
        publisher's own refusal if it answered with one, else TIMEOUT (or DOES_NOT_EXIST with no upstream)."""
        if isinstance(last, RequestError):
            return Refusal(last.error_code, f"upstream refused: {last.reason.decode('utf-8', 'replace')}")
        return Refusal(RequestErrorCode.TIMEOUT if track.upstreams else RequestErrorCode.DOES_NOT_EXIST,
                       f"no upstream subscription for {track} became Established")

    def accept_subscribe(self, peer: Peer, req: Request, msg: Subscribe, track: Track) -> Downstream:
        """SUBSCRIBE_OK with the relay's Largest Object, then a fill if asked (no wait inside: objects
        processed after this point are > Largest and go by subscription, the rest by the fill)."""
        params = msg.parameters
        flt = req.location_filter
        largest = track.cache.largest
        forward = int_param(params, ParamType.FORWARD) != 0
        start = flt.start(largest) if flt is not None else Location(0, 0)
        end = flt.end() if flt is not None else None
        peer.session.subscribe_ok(req.stream_id, largest=largest, track_properties=self.track_properties(track))
        ds = Downstream(peer, req, track, start, end, forward, range_filters(params))
        peer.downstream[req.stream_id] = ds
        track.subscribers.append(ds)
        fill = params.get(ParamType.FILL_PARAMETERS)
        if isinstance(fill, FillParameters) and forward:
            self.start_fill(ds, req.request_id, fill)
        return ds

    # -- PUBLISH (publisher-initiated subscription) ----------------------------------------------------------

    def handle_publish(self, peer: Peer, req: Request, msg: Publish) -> None:
        self._require(peer, Right.PUBLISH, msg.track_namespace, msg.parameters)
        self._check_track_name(msg.track_namespace)
        track = self.track_for(msg.track_namespace, msg.track_name)
        ready = self.new_completion()
        ready.set_result(None)
        up = Upstream(peer, req, track, ready, self.new_signal())
        peer.upstream[req.stream_id] = up
        track.upstreams.append(up)
        self._learn_track(track, msg.track_properties, req.largest)
        peer.session.request_ok(req.stream_id)
        if int_param(msg.parameters, ParamType.FORWARD) == 0:
            # keep the cache warm (EDR "Forward Handling"): ask for the objects now
            peer.session.request_update(req.stream_id, Parameters.of((ParamType.FORWARD, 1)))
        self.source_arrived(track)

    def track_properties(self, track: Track) -> tuple[KeyValuePair, ...]:
        """The Track Properties the relay sends in SUBSCRIBE_OK, FETCH_OK and TRACK_STATUS_OK: all it
        knows, as received upstream (EDR "Relay Track Handling")."""
        return track.cache.track_properties

    def _learn_track(self, track: Track, props: tuple[KeyValuePair, ...], largest: Location | None) -> None:
        if props:
            track.cache.track_properties = props
            track.cache.max_cache_duration_ms = cache_duration(props)
        if largest is not None:
            track.cache.note_largest(largest)
