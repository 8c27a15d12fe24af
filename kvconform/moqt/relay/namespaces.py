"""Namespaces: publishers announce with PUBLISH_NAMESPACE (authorized per namespace prefix); the relay answers
NAMESPACE / NAMESPACE_DONE on every matching SUBSCRIBE_NAMESPACE stream ([d22] it never forwards
PUBLISH_NAMESPACE itself), and a new publication becomes a source for the tracks subscribed under it.
"""

from __future__ import annotations

import contextlib

from kvconform.moqt.errors import RequestErrorCode
from kvconform.moqt.messages import PublishNamespace, RequestUpdate, SubscribeNamespace
from kvconform.moqt.policy import Right
from kvconform.moqt.relay.aggregation import Aggregation
from kvconform.moqt.relay.state import Peer, Refusal
from kvconform.moqt.session import Request, SessionUsageError
from kvconform.moqt.structures import TrackNamespace

__all__ = ["Namespaces"]


class Namespaces(Aggregation):
    """The relay's namespace concept (a part of ``RelayCore``)."""

    def handle_publish_namespace(self, peer: Peer, req: Request, msg: PublishNamespace) -> None:
        ns = msg.track_namespace
        self._require(peer, Right.PUBLISH, ns, msg.parameters)
        self._check_track_name(ns)
        peer.session.request_ok(req.stream_id)
        already = any(ns in p.publications.values() for p in self.peers if not p.gone)
        peer.publications[req.stream_id] = ns
        if not already:
            self._announce(ns, done=False)
        # Tracks subscribed downstream under this namespace get this publisher as a source too.
        for track in list(self.tracks.values()):
            if track.waiting and ns.is_prefix_of(track.namespace):
                self.source_arrived(track)
            if track.subscribers and ns.is_prefix_of(track.namespace) and \
                    not any(u.peer is peer for u in track.upstreams):
                self.open_upstream(peer, track)

    def _announce(self, ns: TrackNamespace, done: bool) -> None:
        """NAMESPACE (or NAMESPACE_DONE) on every SUBSCRIBE_NAMESPACE stream whose prefix matches."""
        for sub_peer in self.peers:
            if sub_peer.gone:
                continue
            for sid, prefix in list(sub_peer.namespace_subs.items()):
                if not prefix.is_prefix_of(ns):
                    continue
                suffix = ns.suffix_after(prefix)
                req = sub_peer.session.requests.get(sid)
                with contextlib.suppress(SessionUsageError):
                    if done and req is not None and suffix in req.namespaces:
                        sub_peer.session.send_namespace_done(sid, suffix)
                    elif not done and (req is None or suffix not in req.namespaces):
                        sub_peer.session.send_namespace(sid, suffix)

    def _withdraw(self, peer: Peer, stream_id: int) -> None:
        ns = peer.publications.pop(stream_id, None)
        if ns is not None and not any(ns in p.publications.values() for p in self.peers if not p.gone):
            self._announce(ns, done=True)

    def handle_subscribe_namespace(self, peer: Peer, req: Request, msg: SubscribeNamespace) -> None:
        prefix = msg.track_namespace_prefix
        self._require(peer, Right.SUBSCRIBE, prefix, msg.parameters)
        for other in peer.namespace_subs.values():
            if prefix.overlaps(other):
                raise Refusal(RequestErrorCode.PREFIX_OVERLAP,
                              f"prefix {prefix} overlaps active SUBSCRIBE_NAMESPACE {other} (section 12)")
        peer.session.request_ok(req.stream_id)
        peer.namespace_subs[req.stream_id] = prefix
        announced: set[TrackNamespace] = set()
        for pub in self.peers:
            if pub.gone:
                continue
            for ns in pub.publications.values():
                if prefix.is_prefix_of(ns) and ns not in announced:
                    announced.add(ns)
                    peer.session.send_namespace(req.stream_id, ns.suffix_after(prefix))

    def update_namespace_prefix(self, peer: Peer, req: Request, msg: RequestUpdate, prefix: TrackNamespace) -> None:
        """REQUEST_UPDATE with TRACK_NAMESPACE_PREFIX (EDR "Updating Namespace Subscriptions"): authorized
        and overlap-checked like a new SUBSCRIBE_NAMESPACE; publications the new prefix no longer covers
        get NAMESPACE_DONE (old suffix) before the REQUEST_OK, then every covered one a NAMESPACE with its
        suffix relative to the new prefix (so later NAMESPACE_DONEs name suffixes the subscriber knows)."""
        self._require(peer, Right.SUBSCRIBE, prefix, msg.parameters)
        sid = req.stream_id
        for other_sid, other in peer.namespace_subs.items():
            if other_sid != sid and prefix.overlaps(other):
                raise Refusal(RequestErrorCode.PREFIX_OVERLAP,
                              f"prefix {prefix} overlaps active SUBSCRIBE_NAMESPACE {other} (section 12)")
        old = peer.namespace_subs[sid]
        published = sorted({ns for p in self.peers if not p.gone for ns in p.publications.values()},
                           key=lambda n: n.fields)
        for ns in published:
            if old.is_prefix_of(ns) and not prefix.is_prefix_of(ns) and ns.suffix_after(old) in req.namespaces:
                peer.session.send_namespace_done(sid, ns.suffix_after(old))
        peer.session.request_ok(sid)
        peer.namespace_subs[sid] = prefix
        req.namespaces.clear()  # the session's record of announced suffixes, now relative to the new prefix
        for ns in published:
            if prefix.is_prefix_of(ns):
                peer.session.send_namespace(sid, ns.suffix_after(prefix))
