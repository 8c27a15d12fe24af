"""Forwarding: what the relay writes to whom as objects arrive upstream, and how the subscriptions it serves end.

Every object received upstream is cached (``cache.TrackCache``) and forwarded unchanged, stream for stream, to
each subscription whose filter passes it; a stream's end or reset is mirrored on the streams forwarded from it.
A subscription ends with its streams closed first and PUBLISH_DONE after they have left (section 6.2).
"""

from __future__ import annotations

import contextlib
import functools
import logging

from kvconform.moqt.cache import Admit, CachedObject, next_loc
from kvconform.moqt.data import EndOfRange, EndOfRangeKind, FetchHeader, SubgroupHeader, SubgroupObject
from kvconform.moqt.errors import PublishDoneCode, StreamResetCode
from kvconform.moqt.filters import passes_range_filters
from kvconform.moqt.messages import PublishDone
from kvconform.moqt.relay.authorization import Authorization
from kvconform.moqt.relay.state import (
    DONE_GRACE,
    PUBLISH_DONE_AFTER_SENT,
    Downstream,
    InStream,
    Peer,
    Track,
    Upstream,
    UpstreamEnding,
)
from kvconform.moqt.session import DataStreamEnded, DataStreamOpened, ObjectReceived, SessionUsageError
from kvconform.moqt.structures import PropertyType, find_kvp

__all__ = ["Forwarding"]

log = logging.getLogger("kvconform.moqt.relay")


class Forwarding(Authorization):
    """The relay's forwarding concept (a part of ``RelayCore``)."""

    # -- data arriving upstream -------------------------------------------------------------------------

    def _on_data_opened(self, peer: Peer, event: DataStreamOpened) -> None:
        req = event.request
        if req is None:
            return
        if event.kind == "subgroup" and isinstance(event.header, SubgroupHeader):
            up = peer.upstream.get(req.stream_id)
            if up is not None:
                peer.in_streams[event.stream_id] = InStream(up, event.header)
        elif event.kind == "fetch" and isinstance(event.header, FetchHeader):
            fetch = peer.fetches.get(req.stream_id)
            if fetch is not None:
                peer.fetch_streams[event.stream_id] = fetch

    def _admit(self, track: Track, obj: CachedObject) -> Admit:
        admit = track.cache.add(obj)
        track.counters.objects_in += 1
        track.counters.bytes_in += len(obj.payload)
        if admit is Admit.DUPLICATE:
            track.counters.duplicates += 1
        elif admit is Admit.CONFLICT:
            self._track_malformed(track)
        return admit

    def _priority(self, track: Track, priority: int | None) -> int:
        if priority is not None:
            return priority
        default = find_kvp(track.cache.track_properties, PropertyType.DEFAULT_PUBLISHER_PRIORITY)
        return default[0] if default and isinstance(default[0], int) else 128

    def _on_object(self, peer: Peer, event: ObjectReceived) -> None:
        obj = event.object
        if isinstance(obj, SubgroupObject):
            st = peer.in_streams.get(event.stream_id)
            if st is None:
                return
            track = st.upstream.track
            cached = CachedObject(obj.group_id, obj.object_id, obj.subgroup_id,
                                  self._priority(track, obj.publisher_priority), obj.payload, obj.status,
                                  obj.properties, self.now)
            if self._admit(track, cached) in (Admit.CONFLICT, Admit.NONEXISTENT, Admit.EXPIRED):
                return
            if st.first_id is None:
                st.first_id = obj.object_id
            st.last_id = obj.object_id
            if st.upstream.ending is not None:
                self._ending_progress(st.upstream.ending)  # still arriving: the upstream's end keeps waiting
            for ds in list(track.subscribers):
                if self.subscription_passes(ds, obj, cached.priority):
                    with contextlib.suppress(SessionUsageError):
                        self.forward_object(ds, st, obj)
            return
        fetch = peer.fetch_streams.get(event.stream_id)
        if fetch is None:
            return
        if isinstance(obj, EndOfRange):
            if obj.kind != EndOfRangeKind.NON_EXISTENT:
                begin = next_loc(fetch.prev) if fetch.prev is not None else fetch.start
                fetch.unknown.append((begin, next_loc(obj.location)))
            fetch.prev = obj.location
            return
        fetch.prev = obj.location
        self._fetch_progress(fetch)
        self._admit(fetch.track, CachedObject(obj.group_id, obj.object_id, obj.subgroup_id, obj.publisher_priority,
                                              obj.payload, 0, obj.properties or b"", self.now))

    def subscription_passes(self, ds: Downstream, obj: SubgroupObject, priority: int) -> bool:
        """Is ``obj`` subscription-delivered to ``ds`` (section 11.1): FORWARD 1, inside the Location
        filter, not sent to it before, and passing its Range Filters (section 7.5)?"""
        return ds.wants(obj.location) and (not ds.filters or passes_range_filters(
            ds.filters, subgroup_id=obj.subgroup_id, object_id=obj.object_id, priority=priority,
            object_properties=obj.property_pairs(), track_properties=ds.track.cache.track_properties))

    def forward_object(self, ds: Downstream, st: InStream, obj: SubgroupObject) -> None:
        """Forward one upstream object on the downstream stream mirroring its upstream stream: same
        Group, Subgroup, priority (or DEFAULT_PRIORITY), END_OF_GROUP and PROPERTIES bits; FIRST_OBJECT
        only when this stream starts with the subgroup's first object (section 9.2); payload untouched."""
        session = ds.peer.session
        sid = st.out.get(ds)
        if sid is None:
            header = st.header
            first = header.first_object and st.first_id == obj.object_id
            sid = session.open_subgroup(ds.request.stream_id, obj.group_id, obj.subgroup_id,
                                        header.publisher_priority, first_object=first,
                                        end_of_group=header.end_of_group, properties=header.has_properties)
            st.out[ds] = sid
        if not session.data_stream_open(sid):
            return
        session.write_object(sid, obj.object_id, obj.payload, status=obj.status, properties=obj.properties)
        ds.sent.add(obj.location)
        ds.track.counters.forwarded += 1

    def _on_data_ended(self, peer: Peer, event: DataStreamEnded) -> None:
        st = peer.in_streams.pop(event.stream_id, None)
        if st is not None:
            up = st.upstream
            if event.reset_code is None and st.header.end_of_group and st.last_id is not None:
                up.track.cache.end_group_after(st.header.group_id, st.last_id)
            for ds, sid in st.out.items():
                with contextlib.suppress(SessionUsageError):
                    if ds.peer.session.data_stream_open(sid):
                        if event.reset_code is None:
                            ds.peer.session.end_data_stream(sid)
                        else:
                            ds.peer.session.reset_data_stream(sid, event.reset_code)
            up.streams_ended += 1
            if up.ending is not None:
                self._ending_progress(up.ending)
            return
        fetch = peer.fetch_streams.pop(event.stream_id, None)
        if fetch is not None:
            if event.reset_code is not None:
                self._fetch_finished(fetch, False)
            else:
                fetch.stream_fin = True
                if fetch.ok is not None:
                    self._fetch_finished(fetch, True)

    # -- ending subscriptions ---------------------------------------------------------------------------

    def upstream_done(self, up: Upstream) -> None:
        """PUBLISH_DONE upstream: once its data streams have ended (bounded: DONE_GRACE without progress), end
        the downstream subscriptions that have no other source, after their fills finished (DONE_GRACE at most
        each) and their own streams closed (section 6.2). Looked at first once the event is handled."""
        ending = up.ending = UpstreamEnding(up, self.now + DONE_GRACE)
        ending.timer = self.set_timer(ending.deadline, functools.partial(self._ending_deadline, ending))
        self._ending_look_soon(ending)

    def _ending_look_soon(self, ending: UpstreamEnding) -> None:
        if not ending.look_pending:
            ending.look_pending = True
            self.call_soon(functools.partial(self._ending_look, ending))

    def _ending_progress(self, ending: UpstreamEnding) -> None:
        if ending.phase == "streams":
            ending.deadline = self.now + DONE_GRACE  # idle time, not total: the timer moves on when it fires
            self._ending_look_soon(ending)

    def _ending_look(self, ending: UpstreamEnding) -> None:
        ending.look_pending = False
        up = ending.up
        assert up.done is not None
        if ending.phase == "streams" and up.streams_ended >= up.done.stream_count:
            self._ending_subscribers(ending)

    def _ending_deadline(self, ending: UpstreamEnding) -> None:
        ending.timer = None  # fired
        if self.now < ending.deadline:  # progress since it was set: wait on
            ending.timer = self.set_timer(ending.deadline, functools.partial(self._ending_deadline, ending))
        elif ending.phase == "streams":
            self._ending_subscribers(ending)
        elif ending.phase == "subscribers" and ending.current is not None:
            self._ending_next(ending)

    def _ending_subscribers(self, ending: UpstreamEnding) -> None:
        if ending.timer is not None:
            self.cancel_timer(ending.timer)
            ending.timer = None
        ending.phase = "subscribers"
        up = ending.up
        ending.ends_subscribers = not any(u.established for u in up.track.upstreams if u is not up)
        self._ending_next(ending)

    def _ending_next(self, ending: UpstreamEnding) -> None:
        """End the next subscription not handled yet (subscribers accepted meanwhile too, ``_answered``); one
        with a fill still running waits for it first, DONE_GRACE at most."""
        up, track = ending.up, ending.up.track
        assert up.done is not None
        if ending.current is not None:
            waited, ending.current = ending.current, None
            if ending.timer is not None:
                self.cancel_timer(ending.timer)
                ending.timer = None
            self._end_downstream(waited, up.done.status_code, up.done.reason.decode("utf-8", "replace"))
        while ending.ends_subscribers:
            ds: Downstream | None = next((d for d in track.subscribers if d not in ending.handled), None)
            if ds is None:
                break
            ending.handled.add(ds)
            if ds.fill_tasks:
                ending.current = ds
                ending.deadline = self.now + DONE_GRACE
                ending.timer = self.set_timer(ending.deadline, functools.partial(self._ending_deadline, ending))
                return
            self._end_downstream(ds, up.done.status_code, up.done.reason.decode("utf-8", "replace"))
        ending.phase = "ended"
        if up in track.upstreams:
            track.upstreams.remove(up)

    def fill_done(self, ds: Downstream) -> None:
        """A fill of ``ds`` finished: an upstream's end waiting for it goes on."""
        if ds.fill_tasks:
            return
        for up in list(ds.track.upstreams):
            if up.ending is not None and up.ending.current is ds:
                self._ending_next(up.ending)

    def _end_downstream(self, ds: Downstream, status: int, reason: str) -> None:
        if ds.finished:
            return
        ds.finished = True
        if ds in ds.track.subscribers:
            ds.track.subscribers.remove(ds)
        ds.peer.downstream.pop(ds.request.stream_id, None)
        session = ds.peer.session
        for job in list(ds.fill_tasks):
            job.cancel()
        with contextlib.suppress(SessionUsageError):
            for sid in ds.fill_streams:  # an unfinished fill failed: reset, never FIN (section 11.2)
                session.reset_data_stream(sid, StreamResetCode.CANCELLED)
            for sid in list(ds.request.data_streams):
                session.end_data_stream(sid) if status == PublishDoneCode.TRACK_ENDED else \
                    session.reset_data_stream(sid, StreamResetCode.INTERNAL_ERROR)
        # PUBLISH_DONE is sent only after every stream it counts was closed (section 6.2): once their data and
        # FIN (or reset) have left, bounded by PUBLISH_DONE_AFTER_SENT
        self.after_sent(ds.peer, session.data_streams_of(ds.request.stream_id),
                        functools.partial(self._publish_done, ds, status, reason), PUBLISH_DONE_AFTER_SENT)

    @staticmethod
    def _publish_done(ds: Downstream, status: int, reason: str) -> None:
        session = ds.peer.session
        with contextlib.suppress(SessionUsageError):
            if session.closed is None and ds.request.publishing:
                session.publish_done(ds.request.stream_id, status, reason)

    def _drop_downstream(self, ds: Downstream) -> None:
        """The subscriber cancelled: the session reset its streams; forget it."""
        ds.finished = True
        if ds in ds.track.subscribers:
            ds.track.subscribers.remove(ds)
        for job in list(ds.fill_tasks):
            job.cancel()

    def _drop_upstream(self, up: Upstream, reason: str) -> None:
        if up.done is not None:
            return
        if not up.ready.done():
            self.upstream_answered(up, None)
        up.done = PublishDone(PublishDoneCode.INTERNAL_ERROR, 0, reason.encode())
        if up in up.track.upstreams:
            up.track.upstreams.remove(up)
        if not any(u.established for u in up.track.upstreams):
            for ds in list(up.track.subscribers):
                self._end_downstream(ds, PublishDoneCode.INTERNAL_ERROR, reason)

    def _track_malformed(self, track: Track) -> None:
        """EDR "Malformed Tracks": end every subscription with MALFORMED_TRACK, cancel upstream."""
        reason = track.cache.malformed or "malformed track"
        log.warning("%s: %s", track, reason)
        for ds in list(track.subscribers):
            self._end_downstream(ds, PublishDoneCode.MALFORMED_TRACK, reason)
        for up in list(track.upstreams):
            with contextlib.suppress(SessionUsageError):
                if up.request.local:
                    up.peer.session.cancel(up.request.stream_id, StreamResetCode.MALFORMED_TRACK)
            track.upstreams.remove(up)
