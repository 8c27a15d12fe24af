"""Subscription aggregation and upstream choice (section 12).

A downstream SUBSCRIBE is aggregated onto one upstream subscription per publisher (LOCATION_FILTER Next
Object); SUBSCRIBE_OK is sent only once one upstream subscription is Established (a pending wait with a timer at
``upstream_timeout``), with LARGEST_OBJECT = max(upstream LARGEST_OBJECT, largest Location received). A SUBSCRIBE
with RENDEZVOUS_TIMEOUT and no publisher yet is a pending wait of the core: a timer at its deadline refuses it
with TIMEOUT, a publisher arriving first serves it (section 7.1). TRACK_STATUS of a track the relay does not
follow is asked of a publisher the same way.
"""

from __future__ import annotations

import functools

from kvconform.moqt.cache import FullTrackName
from kvconform.moqt.errors import RequestErrorCode
from kvconform.moqt.filters import LocationFilter
from kvconform.moqt.messages import Publish, RequestError, RequestOk, Subscribe, SubscribeOk, TrackStatus
from kvconform.moqt.parameters import FillParameters, Parameters
from kvconform.moqt.policy import Right
from kvconform.moqt.relay.fetching import Fetching
from kvconform.moqt.relay.state import (
    Downstream,
    EstablishWait,
    Peer,
    Refusal,
    Rendezvous,
    StatusWait,
    Track,
    Upstream,
    cache_duration,
    int_param,
    range_filters,
)
from kvconform.moqt.session import Request, RequestState
from kvconform.moqt.structures import KeyValuePair, Location, ParamType, TrackNamespace

__all__ = ["Aggregation"]


class Aggregation(Fetching):
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
        self.hold_until_established(peer, req, msg, track)

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

    # -- upstream subscriptions -----------------------------------------------------------------------------

    def upstream_subscribe_parameters(self, track: Track) -> Parameters:
        """The relay's own SUBSCRIBE upstream: FORWARD 1 (default), aggregating with Next Object."""
        return Parameters.of((ParamType.LOCATION_FILTER, LocationFilter.next_object()))

    def open_upstream(self, source: Peer, track: Track) -> Upstream:
        request = source.session.subscribe(track.namespace, track.name, self.upstream_subscribe_parameters(track))
        up = Upstream(source, request, track, self.new_completion())
        source.upstream[request.stream_id] = up
        track.upstreams.append(up)
        return up

    def hold_until_established(self, peer: Peer, req: Request, msg: Subscribe, track: Track) -> None:
        """Hold the downstream SUBSCRIBE until an upstream subscription is Established (section 12): a pending
        wait, looked at once the request has been handled and whenever an upstream answers, with a timer at
        ``upstream_timeout``."""
        wait = EstablishWait(peer, req, msg, track, self.now + self.upstream_timeout)
        track.establishing.append(wait)
        wait.timer = self.set_timer(wait.deadline, functools.partial(self._establish_deadline, wait))
        wait.woken = True
        self.call_soon(functools.partial(self._look_at_establish, wait))

    def upstream_answered(self, up: Upstream, answer: SubscribeOk | RequestError | None) -> None:
        """The upstream subscription ``up`` was answered (None: it failed otherwise): the SUBSCRIBEs held for its
        track look again once the event being handled is done."""
        up.ready.set_result(answer)
        for wait in up.track.establishing:
            wait.last = answer
            if not wait.woken:
                wait.woken = True
                self.call_soon(functools.partial(self._look_at_establish, wait))

    def _look_at_establish(self, wait: EstablishWait) -> None:
        wait.woken = False
        track = wait.track
        if wait not in track.establishing:
            return
        if self._answered(track) is None and any(not u.ready.done() for u in track.upstreams) \
                and self.now < wait.deadline:
            return  # answers still to come
        self._settle_establish(wait)

    def _establish_deadline(self, wait: EstablishWait) -> None:
        wait.timer = None  # fired
        self._settle_establish(wait)

    def _settle_establish(self, wait: EstablishWait) -> None:
        if wait not in wait.track.establishing:
            return
        wait.track.establishing.remove(wait)
        if wait.timer is not None:
            self.cancel_timer(wait.timer)
            wait.timer = None
        try:
            self.subscribe_established(wait.peer, wait.request, wait.message, wait.track, wait.last)
        except Refusal as refusal:
            self._refuse(wait.peer, wait.request, refusal.code, refusal.reason)

    def subscribe_established(self, peer: Peer, req: Request, msg: Subscribe, track: Track,
                              last: SubscribeOk | RequestError | None) -> None:
        """The end of a held SUBSCRIBE's wait: SUBSCRIBE_OK if an upstream subscription is Established, else
        the refusal ``upstream_refusal`` gives (``last``: the latest upstream answer seen while waiting)."""
        if peer.gone or req.state is not RequestState.PENDING:
            return  # the subscriber cancelled meanwhile
        if self._answered(track) is None:
            raise self.upstream_refusal(track, last)
        self.accept_subscribe(peer, req, msg, track)

    def _drop_waits(self, peer: Peer) -> None:
        """A session ended: forget the SUBSCRIBEs it had waiting (nothing is answered on a closed session)."""
        for track in self.tracks.values():
            for rv in [r for r in track.rendezvous if r.peer is peer]:
                self._end_rendezvous(rv)
            for wait in [w for w in track.establishing if w.peer is peer]:
                track.establishing.remove(wait)
                if wait.timer is not None:
                    self.cancel_timer(wait.timer)
                    wait.timer = None

    # -- TRACK_STATUS -----------------------------------------------------------------------------------------

    def handle_track_status(self, peer: Peer, req: Request, msg: TrackStatus) -> None:
        """TRACK_STATUS: answered from what the relay knows of a track it follows, else asked of a publisher
        (a pending wait with a timer at ``upstream_timeout``)."""
        self._require(peer, Right.SUBSCRIBE, msg.track_namespace, msg.parameters)
        self._check_track_name(msg.track_namespace)
        track = self.tracks.get((msg.track_namespace.fields, msg.track_name))
        if track is not None and (any(u.established for u in track.upstreams) or track.cache.end_of_track):
            self._answer_track_status(peer, req, track.cache.largest, self.track_properties(track))
            return
        sources = self.publishers_for(msg.track_namespace)
        if not sources:
            raise Refusal(RequestErrorCode.DOES_NOT_EXIST, "no publisher for this track")
        upstream = sources[0].session.track_status(msg.track_namespace, msg.track_name)
        wait = StatusWait(peer, req, sources[0], upstream.stream_id)
        sources[0].status_requests[upstream.stream_id] = wait
        wait.timer = self.set_timer(self.now + self.upstream_timeout, functools.partial(self._status_deadline, wait))

    def _status_deadline(self, wait: StatusWait) -> None:
        wait.timer = None  # fired
        self.track_status_answered(wait, None)

    def track_status_answered(self, wait: StatusWait, answer: RequestOk | RequestError | None) -> None:
        """The source answered (None: it did not, in time or at all): answer the requester."""
        if wait.done:
            return
        wait.done = True
        if wait.timer is not None:
            self.cancel_timer(wait.timer)
            wait.timer = None
        peer, req = wait.requester, wait.request
        if peer.gone:
            return
        if isinstance(answer, RequestError):
            self._refuse(peer, req, answer.error_code, answer.reason.decode("utf-8", "replace"))
        elif answer is None:
            self._refuse(peer, req, RequestErrorCode.TIMEOUT, "upstream TRACK_STATUS was not answered")
        else:
            self._answer_track_status(peer, req, answer.largest_object, answer.track_properties)

    @staticmethod
    def _answer_track_status(peer: Peer, req: Request, largest: Location | None,
                             props: tuple[KeyValuePair, ...]) -> None:
        params = Parameters.of((ParamType.LARGEST_OBJECT, largest)) if largest is not None else Parameters()
        peer.session.request_ok(req.stream_id, params, props)

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
        up = Upstream(peer, req, track, ready)
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
