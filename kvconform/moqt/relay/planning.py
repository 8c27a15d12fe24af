"""Fill and FETCH planning: which Locations a fill or a FETCH covers, what of them comes from the cache and what
is FETCHed upstream first, and the records a response carries, in order (sections 9.4, 11.2).

Fills and FETCHes are served from the cache; Locations the cache does not know are FETCHed upstream within
FILL_TIMEOUT (a pending wait of the core: ``FetchWait``), and what stays unknown is reported with End of Unknown /
Timed-Out Range records. MAX_CACHE_DURATION (Track Property 0x04) bounds how long an object may start being served.
"""

from __future__ import annotations

import contextlib
import functools
import logging
from collections.abc import Callable, Sequence

from kvconform.moqt.cache import MAX_ID, CachedObject, iter_groups, next_loc
from kvconform.moqt.data import EndOfRange, EndOfRangeKind, FetchObject, GroupOrder
from kvconform.moqt.errors import StreamResetCode
from kvconform.moqt.filters import LocationFilter, RangeFilter, passes_range_filters
from kvconform.moqt.parameters import FillParameters, Parameters
from kvconform.moqt.relay.forwarding import Forwarding
from kvconform.moqt.relay.state import (
    Completion,
    Downstream,
    FetchWait,
    FillJob,
    Peer,
    Track,
    UpstreamFetch,
    int_param,
    loc_before,
    loc_tuple,
    range_filter,
    range_filters,
)
from kvconform.moqt.session import Request, SessionUsageError
from kvconform.moqt.structures import Location, ParamType

__all__ = ["Planning"]

log = logging.getLogger("kvconform.moqt.relay")


class Planning(Forwarding):
    """The relay's fill and FETCH planning concept (a part of ``RelayCore``)."""

    # -- fills --------------------------------------------------------------------------------------------

    def start_fill(self, ds: Downstream, request_id: int, fill: FillParameters) -> None:
        """Open a fill fetch stream for the message with ``request_id`` if its range is not empty (11.2)."""
        inner = fill.params.get(ParamType.LOCATION_FILTER)
        flt = inner if isinstance(inner, LocationFilter) else ds.request.location_filter
        rng = (flt if flt is not None else LocationFilter.none()).fetch_range(ds.track.cache.largest)
        if rng is None:
            return
        timeout = int_param(fill.params, ParamType.FILL_TIMEOUT)
        order = ds.peer.session.fill_group_order(ds.request.stream_id, fill)
        filters = range_filters(fill.params) or ds.filters
        self.serve_fill(ds, request_id, fill, rng[0], rng[1], order == GroupOrder.DESCENDING, filters, timeout)

    def serve_fill(self, ds: Downstream, request_id: int, fill: FillParameters, start: Location, end: Location,
                   descending: bool, filters: Sequence[RangeFilter], timeout_ms: int | None) -> None:
        """A fill fetch stream: FETCH_HEADER at once, the range from cache once the gaps are FETCHed upstream
        (a pending wait, ``timeout_ms``: the fill's FILL_TIMEOUT), FIN. Failure = reset (section 11.2)."""
        sid = ds.peer.session.open_fill_stream(ds.request.stream_id, request_id, fill)
        job = FillJob(ds, sid, start, end, descending, tuple(filters))
        job.on_cancel = functools.partial(self._cancel_fill, job)
        ds.fill_streams.add(sid)
        ds.fill_tasks.add(job)
        try:
            planned = self.plan_gap_fetch(ds.track, start, end, timeout_ms)
        except Exception as exc:
            self._fill_failed(job, exc)
            return
        if isinstance(planned, UpstreamFetch):
            job.wait = self._wait_for_fetch(planned, timeout_ms, None, functools.partial(self._fill_fetched, job))
        else:
            self._fill_ready(job, planned)

    def _fill_fetched(self, job: FillJob, ok: bool) -> None:
        self._fill_ready(job, EndOfRangeKind.UNKNOWN if ok else EndOfRangeKind.TIMED_OUT)

    def _fill_ready(self, job: FillJob, gap_kind: int) -> None:
        if job.cancelled or job.finished:
            return
        try:
            self.finish_fill(job, gap_kind)
        except Exception as exc:
            self._fill_failed(job, exc)
            return
        self._fill_ended(job)

    def finish_fill(self, job: FillJob, gap_kind: int) -> None:
        """Write the fill's records (``fill_items``) and end the stream with FIN."""
        ds, sid = job.ds, job.stream_id
        session = ds.peer.session
        items = self.fill_items(ds, job.start, job.end, job.descending, job.filters, gap_kind)
        self.write_fetch_items(ds.peer, sid, items)
        ds.track.counters.fill_objects += sum(isinstance(i, FetchObject) for i in items)
        if session.data_stream_open(sid):
            session.end_data_stream(sid)

    def _fill_failed(self, job: FillJob, exc: Exception) -> None:
        with contextlib.suppress(SessionUsageError):
            job.ds.peer.session.reset_data_stream(job.stream_id, StreamResetCode.INTERNAL_ERROR)
        if isinstance(exc, SessionUsageError):  # the peer went away while we were writing to it
            log.debug("relay fill: %s", exc)
        else:  # a relay bug must not take other sessions down
            self.counters.internal_errors += 1
            log.error("relay fill failed", exc_info=exc)
        self._fill_ended(job)

    def _cancel_fill(self, job: FillJob) -> None:
        """The subscription ended or was cancelled before the fill was written: reset, never FIN (11.2)."""
        if job.cancelled or job.finished:
            return
        job.cancelled = True
        with contextlib.suppress(SessionUsageError):
            job.ds.peer.session.reset_data_stream(job.stream_id, StreamResetCode.CANCELLED)
        if job.wait is not None:
            self._drop_fetch_wait(job.wait)
        self._fill_ended(job)

    def _fill_ended(self, job: FillJob) -> None:
        job.finished = True
        job.ds.fill_streams.discard(job.stream_id)
        job.ds.fill_tasks.discard(job)
        self.fill_done(job.ds)

    def fill_items(self, ds: Downstream, start: Location, end: Location, descending: bool,
                   filters: Sequence[RangeFilter], gap_kind: int) -> list[FetchObject | EndOfRange]:
        """What a fill stream carries; the fetch rules apply (section 11.2)."""
        return self.fetch_items(ds.track, start, end, descending, filters, gap_kind)

    # -- filling the cache upstream ------------------------------------------------------------------------

    def plan_gap_fetch(self, track: Track, start: Location, end: Location,
                       timeout_ms: int | None) -> UpstreamFetch | int:
        """The first step of making [start, end] (inclusive) known: the FETCH it opens upstream for the span the
        cache does not know, for the adapter to wait on within ``timeout_ms`` (the request's FILL_TIMEOUT, a
        total budget; 0 = only what is cached now; None = ``fill_timeout_ms`` without progress), or, with
        nothing to wait for, the End of Range kind for what stays unknown: TIMED_OUT when the budget is 0 (or
        nothing is missing), UNKNOWN when no source could tell (section 9.4)."""
        gaps = track.cache.missing(start, next_loc(end))
        if not gaps or (timeout_ms is not None and timeout_ms <= 0):
            return EndOfRangeKind.TIMED_OUT
        sources = [u.peer for u in track.upstreams if u.established] or self.publishers_for(track.namespace)
        if not sources:
            return EndOfRangeKind.UNKNOWN
        return self.open_upstream_fetch(sources[0], track, gaps[0][0], gaps[-1][1])

    def upstream_fetch_parameters(self, track: Track, flt: LocationFilter) -> Parameters:
        """The relay's own FETCH upstream: only its range (parameters are hop-by-hop, section 3.3)."""
        return Parameters.of((ParamType.LOCATION_FILTER, flt))

    def open_upstream_fetch(self, source: Peer, track: Track, start: Location, end: Location,
                            flt: LocationFilter | None = None) -> UpstreamFetch:
        """FETCH [start, end) (or ``flt``) from ``source``; objects go to the cache as they arrive."""
        params = self.upstream_fetch_parameters(track, flt if flt is not None else range_filter(start, end))
        request = source.session.fetch(track.namespace, track.name, params)
        fetch = UpstreamFetch(source, request, track, start, end, self.new_completion())
        source.fetches[request.stream_id] = fetch
        track.counters.upstream_fetches += 1
        return fetch

    def _cancel_upstream_fetch(self, fetch: UpstreamFetch) -> None:
        with contextlib.suppress(SessionUsageError):
            fetch.peer.session.cancel(fetch.request.stream_id)
        self._fetch_finished(fetch, False)

    def _fetch_finished(self, fetch: UpstreamFetch, ok: bool) -> None:
        if fetch.done.done():
            return
        if ok and fetch.ok is not None:
            # Ascending, no Range Filters, FIN: gaps up to End Location do not exist (section 9.4). An End
            # Location short of a requested end within Largest Object is the publisher's "last Object"
            # clamp (e.g. an End of Group marker, which FETCH cannot carry), so the rest is absent too.
            cache = fetch.track.cache
            cache.note_largest(fetch.ok.end_location)
            assert cache.largest is not None
            end = fetch.end if fetch.end <= next_loc(cache.largest) else next_loc(fetch.ok.end_location)
            cache.mark_nonexistent(fetch.start, end)
            for a, b in fetch.unknown:
                cache.known.remove(a, b)
        fetch.peer.fetches.pop(fetch.request.stream_id, None)
        fetch.done.set_result(ok)
        self._fetch_notify(fetch)

    # -- waiting for an upstream FETCH -------------------------------------------------------------------------

    def wait_for_fetch(self, fetch: UpstreamFetch, timeout_ms: int | None,
                       until: Callable[[], bool] | None = None) -> Completion[bool]:
        """Wait for an upstream FETCH to finish, or only until ``until()`` holds: within ``timeout_ms`` in all
        (a request's FILL_TIMEOUT), or, with None, for as long as it makes progress (its answer or records
        arriving, ``fill_timeout_ms`` at most between two). The result is False (and the FETCH cancelled) when
        the budget ran out. A pending wait: a timer per window, looked at again as the FETCH progresses."""
        return self._wait_for_fetch(fetch, timeout_ms, until, None).result

    def _wait_for_fetch(self, fetch: UpstreamFetch, timeout_ms: int | None, until: Callable[[], bool] | None,
                        then: Callable[[bool], None] | None) -> FetchWait:
        deadline = None if timeout_ms is None else self.now + timeout_ms / 1000.0
        wait = FetchWait(fetch, deadline, until, self.new_completion(), then)
        if fetch.done.done() or (until is not None and until()):
            self._fetch_wait_over(wait, True)
            return wait
        fetch.waits.append(wait)
        self._fetch_window(wait)
        return wait

    def _drop_fetch_wait(self, wait: FetchWait) -> None:
        """Its waiter went away: the wait ends without an answer; the FETCH upstream goes on, for the cache."""
        if wait.result.done():
            return
        if wait in wait.fetch.waits:
            wait.fetch.waits.remove(wait)
        if wait.timer is not None:
            self.cancel_timer(wait.timer)
            wait.timer = None

    def fetch_budget(self, deadline: float | None) -> int | None:
        """What is left (ms) of a request's FILL_TIMEOUT ending at ``deadline`` (None: bounded by progress)."""
        return None if deadline is None else max(int((deadline - self.now) * 1000), 0)

    def _fetch_progress(self, fetch: UpstreamFetch) -> None:
        fetch.progress.set()
        self._fetch_notify(fetch)

    def _fetch_notify(self, fetch: UpstreamFetch) -> None:
        for wait in fetch.waits:
            if not wait.look_pending:
                wait.look_pending = True
                self.call_soon(functools.partial(self._fetch_look, wait))

    def _fetch_window(self, wait: FetchWait) -> None:
        """Wait on: what is left of the budget, or ``fill_timeout_ms`` for the next progress."""
        wait.fetch.progress.clear()
        end = self.now + self.fill_timeout_ms / 1000.0 if wait.deadline is None else wait.deadline
        if wait.timer is not None:
            self.cancel_timer(wait.timer)
        wait.timer = self.set_timer(end, functools.partial(self._fetch_window_over, wait))

    def _fetch_look(self, wait: FetchWait) -> None:
        wait.look_pending = False
        if wait.result.done():
            return
        fetch = wait.fetch
        if fetch.done.done() or (wait.until is not None and wait.until()):
            self._fetch_wait_over(wait, True)
        elif fetch.progress.is_set():
            self._fetch_window(wait)

    def _fetch_window_over(self, wait: FetchWait) -> None:
        wait.timer = None  # fired
        if wait.result.done():
            return
        if not wait.fetch.done.done() and not wait.fetch.progress.is_set():
            self._cancel_upstream_fetch(wait.fetch)  # first: what goes on after the wait sees it ended
            self._fetch_wait_over(wait, False)
        else:
            self._fetch_look(wait)

    def _fetch_wait_over(self, wait: FetchWait, ok: bool) -> None:
        if wait in wait.fetch.waits:
            wait.fetch.waits.remove(wait)
        if wait.timer is not None:
            self.cancel_timer(wait.timer)
            wait.timer = None
        wait.result.set_result(ok)
        if wait.then is not None:
            wait.then(ok)

    # -- what a response carries -----------------------------------------------------------------------------

    def fetch_items(self, track: Track, start: Location, end: Location, descending: bool,
                    filters: Sequence[RangeFilter], gap_kind: int) -> list[FetchObject | EndOfRange]:
        """The cached objects of [start, end] in the requested group order (objects ascending within a
        group), without status objects (FETCH carries none); in Ascending order what the cache does not
        know is marked with ``gap_kind`` records (End of Unknown / Timed-Out Range, section 9.4)."""
        cache = track.cache
        objects = [o for o in cache.objects(start, next_loc(end)) if not o.is_status and passes_range_filters(
            filters, subgroup_id=o.subgroup or 0, object_id=o.object, priority=o.priority,
            track_properties=cache.track_properties)]
        items: list[FetchObject | EndOfRange] = [self.to_fetch_object(o) for o in iter_groups(objects, descending)]
        if descending:
            return items
        out: list[FetchObject | EndOfRange] = []
        prev_end = start  # first Location not yet covered by a record
        gaps = cache.missing(start, next_loc(end))
        merged = sorted(
            [(i.location, 0, i) for i in items]
            + [(a, 1, EndOfRange(gap_kind, *loc_tuple(loc_before(b)))) for a, b in gaps],
            key=lambda t: (t[0], t[1]))
        for loc, is_gap, item in merged:
            if is_gap and loc > prev_end:
                # known-absent Locations before an unknown range get their own record (0x8C)
                out.append(EndOfRange(EndOfRangeKind.NON_EXISTENT, *loc_tuple(loc_before(loc))))
            out.append(item)
            prev_end = next_loc(item.location)
        return out

    def to_fetch_object(self, obj: CachedObject) -> FetchObject:
        """A cached object as a fetch object: every field as received (immutability, section 12)."""
        return FetchObject(obj.group, obj.object, obj.payload, obj.subgroup, obj.priority,
                           obj.properties if obj.properties else None)

    def write_fetch_items(self, peer: Peer, stream_id: int, items: Sequence[FetchObject | EndOfRange]) -> None:
        """Write fetch objects / End of Range records on an open fetch or fill stream."""
        session = peer.session
        for item in items:
            if not session.data_stream_open(stream_id):
                return
            session.write_fetch_object(stream_id, item)

    def serve_fetch_range(self, peer: Peer, req: Request, track: Track, stream_id: int,
                          items: Sequence[FetchObject | EndOfRange]) -> None:
        """Write a FETCH response's objects (already in the requested order) on its fetch stream."""
        self.write_fetch_items(peer, stream_id, items)

    def fetch_end_location(self, track: Track, items: Sequence[FetchObject | EndOfRange],
                           end: Location) -> Location:
        """FETCH_OK's End Location: the last Location actually covered (section 13 #9); a whole-group end or a
        Largest Object that is an End of Track marker is not an object a FETCH can carry."""
        covered = [i.location for i in items if i.location <= end]
        return max(covered) if covered else min(end, Location(end.group, MAX_ID))

    def _ends_track(self, track: Track, end_location: Location) -> bool:
        eot = track.cache.end_of_track
        if eot is None or end_location >= eot:
            return False
        after = next_loc(end_location)
        return not track.cache.missing(after, eot) and not any(
            not o.is_status for o in track.cache.objects(after, eot))
