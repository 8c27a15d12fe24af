"""The relay's sans-I/O core: session events and ``now`` in, session commands and adapter hooks out.

``RelayCore`` joins the concepts (authorization, forwarding, planning, aggregation, namespaces; each its own
module) and routes a session's events to them. It imports no asyncio and reads no clock: ``adapter.Relay``
sets ``now`` / ``wall_now`` before each call and implements the hooks of ``hooks.CoreBase``; a test drives it
directly with plain completions, signals and timers (tests/moqt/test_relay_core.py).
"""

from __future__ import annotations

import contextlib
import logging
from typing import Any

from kvconform.moqt.cache import FullTrackName, ObjectCache, next_loc
from kvconform.moqt.errors import RequestErrorCode
from kvconform.moqt.filters import LocationFilter
from kvconform.moqt.messages import (
    Fetch,
    FetchOk,
    MessageType,
    Publish,
    PublishDone,
    PublishNamespace,
    RequestError,
    RequestOk,
    RequestUpdate,
    Subscribe,
    SubscribeNamespace,
    SubscribeOk,
    TrackStatus,
)
from kvconform.moqt.parameters import FillParameters, Parameters
from kvconform.moqt.policy import Policy
from kvconform.moqt.relay.namespaces import Namespaces
from kvconform.moqt.relay.state import (
    DEFAULT_FILL_TIMEOUT_MS,
    UPSTREAM_TIMEOUT,
    Peer,
    Refusal,
    RelayCounters,
    Track,
    int_param,
)
from kvconform.moqt.session import (
    DataStreamEnded,
    DataStreamOpened,
    Event,
    MessageReceived,
    ObjectReceived,
    Request,
    RequestAutoRejected,
    RequestReceived,
    RequestStreamEnded,
    Role,
    SessionClosed,
    SessionConfig,
    SessionUsageError,
    SetupReceived,
    StopSendingReceived,
)
from kvconform.moqt.structures import ParamType, TrackNamespace

__all__ = ["RelayCore"]

log = logging.getLogger("kvconform.moqt.relay")


class RelayCore(Namespaces):
    """The relay's state and behaviour without I/O; ``adapter.Relay`` runs it on asyncio and QUIC."""

    def __init__(self, *, policy: Policy | None, cache: ObjectCache, fill_timeout_ms: int = DEFAULT_FILL_TIMEOUT_MS,
                 upstream_timeout: float = UPSTREAM_TIMEOUT, now: float = 0.0, wall_now: float = 0.0) -> None:
        self.policy = policy if policy is not None else Policy.allow_everything()
        self.fill_timeout_ms = fill_timeout_ms
        self.upstream_timeout = upstream_timeout
        self.cache = cache
        self.tracks: dict[FullTrackName, Track] = {}
        self.peers: list[Peer] = []
        self.counters = RelayCounters()
        self.now = now
        self.wall_now = wall_now
        self._numbers = 0

    def session_config(self) -> SessionConfig:
        """SETUP the relay sends: Range Filters accepted, no token aliases cache."""
        return SessionConfig(role=Role.SERVER, implementation="kvconform-relay/0.1", max_filter_ranges=16)

    def status_lines(self) -> list[str]:
        """The counter lines printed every few seconds while serving."""
        lines = [self.counters.line() + f" | cache {self.cache.stored_bytes} B, {self.cache.evicted} evicted"]
        for track in self.tracks.values():
            c = track.counters
            lines.append(f"  {track}: cached={len(track.cache)} largest={track.cache.largest} "
                         f"in={c.objects_in} dup={c.duplicates} fwd={c.forwarded} fill={c.fill_objects} "
                         f"fetch={c.fetch_objects} upfetch={c.upstream_fetches} subs={len(track.subscribers)}"
                         + (f" MALFORMED ({track.cache.malformed})" if track.cache.malformed else ""))
        return lines

    # -- sessions ---------------------------------------------------------------------------------------

    def open_peer(self, conn: Any) -> Peer:
        """A session was accepted (``conn``: its ``quic.MoqtConnection``, or anything with a ``session``)."""
        self._numbers += 1
        peer = Peer(conn, self._numbers)
        self.peers.append(peer)
        self.counters.sessions_total += 1
        self.counters.sessions_open += 1
        return peer

    def session_closed(self, peer: Peer, event: SessionClosed) -> None:
        self.counters.session_closes[f"{'peer' if event.by_peer else 'relay'}:0x{event.code:x}"] += 1
        log.info("%s closed (%s) with 0x%x: %s", peer, "by peer" if event.by_peer else "by relay",
                 event.code, event.reason)

    def close_peer(self, peer: Peer) -> None:
        """The session's task ended (closed, or the relay stopping)."""
        self.counters.sessions_open -= 1
        self._peer_gone(peer)

    def dispatch(self, peer: Peer, event: Event) -> None:
        """Route one session event."""
        if isinstance(event, SetupReceived):
            peer.setup_tokens = self._setup_tokens(peer, event.setup.auth_tokens())
        elif isinstance(event, RequestReceived):
            self.counters.requests[MessageType(event.request.kind).name] += 1
            self._on_request(peer, event.request)
        elif isinstance(event, RequestAutoRejected):
            self.counters.refused[f"{MessageType(event.message.TYPE).name}:0x{event.code:x}"] += 1
        elif isinstance(event, MessageReceived):
            self._on_message(peer, event)
        elif isinstance(event, RequestStreamEnded):
            self._on_request_ended(peer, event)
        elif isinstance(event, DataStreamOpened):
            self._on_data_opened(peer, event)
        elif isinstance(event, ObjectReceived):
            self._on_object(peer, event)
        elif isinstance(event, DataStreamEnded):
            self._on_data_ended(peer, event)
        elif isinstance(event, StopSendingReceived):
            return  # the session already reset the stream; later writes check data_stream_open

    # -- requests from peers ----------------------------------------------------------------------------

    def _refuse(self, peer: Peer, req: Request, code: int, reason: str) -> None:
        self.counters.refused[f"{MessageType(req.kind).name}:0x{code:x}"] += 1
        log.info("%s: refusing %s with 0x%x: %s", peer, MessageType(req.kind).name, code, reason)
        with contextlib.suppress(SessionUsageError):
            peer.session.reject(req.stream_id, code, reason)

    def _on_request(self, peer: Peer, req: Request) -> None:
        msg = req.message
        try:
            if isinstance(msg, TrackStatus):
                self.handle_track_status(peer, req, msg)
            elif isinstance(msg, Fetch):
                self.handle_fetch(peer, req, msg)
            elif isinstance(msg, Subscribe):
                self.handle_subscribe(peer, req, msg)
            elif isinstance(msg, PublishNamespace):
                self.handle_publish_namespace(peer, req, msg)
            elif isinstance(msg, SubscribeNamespace) and msg.TYPE == MessageType.SUBSCRIBE_NAMESPACE:
                self.handle_subscribe_namespace(peer, req, msg)
            elif isinstance(msg, Publish):
                self.handle_publish(peer, req, msg)
            else:
                raise Refusal(RequestErrorCode.NOT_SUPPORTED, f"{type(msg).__name__} is not supported by this relay")
        except Refusal as refusal:
            self._refuse(peer, req, refusal.code, refusal.reason)

    def _on_request_ended(self, peer: Peer, event: RequestStreamEnded) -> None:
        sid = event.stream_id
        if event.request.local:
            up = peer.upstream.get(sid)
            if up is not None and event.reset_code is not None:
                self._drop_upstream(up, "upstream cancelled the subscription")
            fetch = peer.fetches.get(sid)
            if fetch is not None and fetch.ok is None:
                self._fetch_finished(fetch, False)
            status = peer.status_requests.pop(sid, None)
            if status is not None:
                self.track_status_answered(status, None)
            return
        if event.reset_code is None:
            return  # FIN from a requester: no more updates, not a cancellation (section 4.4)
        job = peer.fetch_jobs.get(sid)
        if job is not None:
            self.cancel_fetch(job)
        ds = peer.downstream.pop(sid, None)
        if ds is not None:
            self._drop_downstream(ds)
        if sid in peer.publications:
            self._withdraw(peer, sid)
        peer.namespace_subs.pop(sid, None)
        up = peer.upstream.get(sid)  # a PUBLISH withdrawn by its publisher
        if up is not None:
            self._drop_upstream(up, "publisher cancelled its PUBLISH")

    # -- responses and updates --------------------------------------------------------------------------

    def _on_message(self, peer: Peer, event: MessageReceived) -> None:
        sid, msg = event.stream_id, event.message
        up = peer.upstream.get(sid)
        if up is not None:
            if isinstance(msg, SubscribeOk):
                self._learn_track(up.track, msg.track_properties, msg.largest_object)
                if not up.ready.done():
                    self.upstream_answered(up, msg)
            elif isinstance(msg, RequestError) and not up.ready.done():
                up.track.upstreams.remove(up)
                self.upstream_answered(up, msg)
            elif isinstance(msg, PublishDone):
                up.done = msg
                self.upstream_done(up)
            return
        fetch = peer.fetches.get(sid)
        if fetch is not None:
            if isinstance(msg, FetchOk):
                fetch.ok = msg
                self._fetch_progress(fetch)
                if msg.track_properties:
                    self._learn_track(fetch.track, msg.track_properties, None)
                if fetch.stream_fin:
                    self._fetch_finished(fetch, True)
            elif isinstance(msg, RequestError):
                fetch.error = msg
                self._fetch_finished(fetch, False)
            return
        status = peer.status_requests.pop(sid, None)
        if status is not None:
            if isinstance(msg, RequestOk | RequestError):
                self.track_status_answered(status, msg)
            return
        if isinstance(msg, RequestUpdate):
            self._on_update(peer, event.request, msg)

    def _on_update(self, peer: Peer, req: Request, msg: RequestUpdate) -> None:
        ds = peer.downstream.get(req.stream_id)
        if ds is None:
            prefix = msg.parameters.get(ParamType.TRACK_NAMESPACE_PREFIX)
            if req.stream_id in peer.namespace_subs and isinstance(prefix, TrackNamespace):
                try:
                    self.update_namespace_prefix(peer, req, msg, prefix)
                except Refusal as refusal:
                    self.counters.refused[f"REQUEST_UPDATE:0x{refusal.code:x}"] += 1
                    peer.session.reject(req.stream_id, refusal.code, refusal.reason)
            else:
                peer.session.request_ok(req.stream_id)
            return
        params = msg.parameters
        largest = ds.track.cache.largest
        forward = int_param(params, ParamType.FORWARD)
        if forward is not None:
            if forward == 1 and not ds.forward and largest is not None:
                ds.start = max(ds.start, next_loc(largest))  # the Largest of this REQUEST_UPDATE_OK
            ds.forward = forward == 1
        flt = params.get(ParamType.LOCATION_FILTER)
        if isinstance(flt, LocationFilter):
            ds.end = flt.end()
            if flt.type != 0:
                ds.start = max(ds.start, flt.start(largest))
        ok_params = Parameters.of((ParamType.LARGEST_OBJECT, largest)) if largest is not None else Parameters()
        peer.session.request_ok(req.stream_id, ok_params)
        fill = params.get(ParamType.FILL_PARAMETERS)
        if isinstance(fill, FillParameters) and ds.forward:
            self.start_fill(ds, msg.request_id, fill)

    def _peer_gone(self, peer: Peer) -> None:
        """A session ended: withdraw what it published and subscribed."""
        peer.gone = True
        for task in list(peer.tasks):
            task.cancel()
        self._drop_waits(peer)
        for job in list(peer.fetch_jobs.values()):
            self.cancel_fetch(job)
        for sid in list(peer.publications):
            self._withdraw(peer, sid)
        peer.namespace_subs.clear()
        for ds in list(peer.downstream.values()):
            self._drop_downstream(ds)
        peer.downstream.clear()
        for up in list(peer.upstream.values()):
            self._drop_upstream(up, f"upstream {peer} closed")
        for fetch in list(peer.fetches.values()):
            self._fetch_finished(fetch, False)
        for status in list(peer.status_requests.values()):
            self.track_status_answered(status, None)
        if peer in self.peers:
            self.peers.remove(peer)
