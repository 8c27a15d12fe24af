"""Standalone FETCH serving (section 7.3): authorization, the range, from the cache or cut through from the relay's
own FETCH upstream, the request's FILL_TIMEOUT, the fetch stream, FETCH_OK with the End Location, cancellation.

A FETCH is a pending job of the core (``state.FetchJob``), like a fill (``FillJob``): each step that waits for an
upstream FETCH is a ``FetchWait`` (a deadline and an adapter timer) whose continuation is the next step, so the
adapter runs no FETCH flow of its own. Override points for mutant relays: ``handle_fetch`` (the request),
``cuts_through`` (serve while the upstream FETCH arrives, or store it first), ``serve_fetch_range`` (the records
written), ``fetch_served`` (the response ended), and the planning hooks (``fetch_items``, ``plan_gap_fetch``).
"""

from __future__ import annotations

import contextlib
import functools
import logging
from collections.abc import Callable, Sequence

from kvconform.moqt.cache import MAX_ID, next_loc
from kvconform.moqt.data import EndOfRange, EndOfRangeKind, FetchObject, GroupOrder
from kvconform.moqt.errors import RequestErrorCode
from kvconform.moqt.filters import LocationFilter
from kvconform.moqt.messages import Fetch
from kvconform.moqt.policy import Right
from kvconform.moqt.relay.planning import Planning
from kvconform.moqt.relay.state import (
    FetchJob,
    Peer,
    Refusal,
    UpstreamFetch,
    int_param,
    loc_before,
    range_filters,
)
from kvconform.moqt.session import Request, RequestState, SessionUsageError
from kvconform.moqt.structures import Location, ParamType

__all__ = ["Fetching"]

log = logging.getLogger("kvconform.moqt.relay")


class Fetching(Planning):
    """The relay's standalone FETCH concept (a part of ``RelayCore``)."""

    def handle_fetch(self, peer: Peer, req: Request, msg: Fetch) -> None:
        """Start serving a FETCH (a ``Refusal`` raised here is its REQUEST_ERROR): from the cache, once the gaps
        of its range are FETCHed upstream; for a track the relay does not follow, from its own FETCH upstream of
        the same range, whose answer gives the range."""
        self._require(peer, Right.SUBSCRIBE, msg.track_namespace, msg.parameters)
        self._check_track_name(msg.track_namespace)
        params = msg.parameters
        track = self.track_for(msg.track_namespace, msg.track_name)
        if track.cache.malformed:
            raise Refusal(RequestErrorCode.MALFORMED_TRACK, track.cache.malformed)
        flt = req.location_filter or LocationFilter.none()
        timeout_ms = int_param(params, ParamType.FILL_TIMEOUT)
        job = FetchJob(peer, req, track, int_param(params, ParamType.GROUP_ORDER) == GroupOrder.DESCENDING,
                       range_filters(params), None if timeout_ms is None else self.now + timeout_ms / 1000.0)
        live = any(u.established for u in track.upstreams) or track.cache.end_of_track is not None
        sources = self.publishers_for(msg.track_namespace)
        if not live and sources:
            # The relay does not follow this track: ask upstream for the same range to learn it.
            fetch = self.open_upstream_fetch(sources[0], track, flt.start(None), Location(MAX_ID + 1, 0), flt)
            job.upstream = fetch
            peer.fetch_jobs[req.stream_id] = job
            self._fetch_wait(job, fetch, lambda: fetch.ok is not None,
                             functools.partial(self._fetch_answered_upstream, job, flt))
            return
        if not live and len(track.cache) == 0:
            raise Refusal(RequestErrorCode.DOES_NOT_EXIST, f"no publisher and nothing cached for {track}")
        job.rng = flt.fetch_range(track.cache.largest)
        if job.rng is None:
            raise Refusal(RequestErrorCode.INVALID_RANGE,
                          f"FETCH range starts after Largest Object {track.cache.largest} (section 7.3)")
        peer.fetch_jobs[req.stream_id] = job
        self._fetch_step(job, self._fetch_from_cache, job)

    def cuts_through(self, job: FetchJob) -> bool:
        """Serve an Ascending FETCH of a track the relay does not follow while its own FETCH upstream is still
        arriving (True), instead of storing the whole range first."""
        return True

    def fetch_served(self, job: FetchJob) -> None:
        """The FETCH's response was written and ended (a hook for relays that watch their FETCHes)."""

    def cancel_fetch(self, job: FetchJob) -> None:
        """The requester cancelled the FETCH or went away: stop serving it. A cut-through's upstream FETCH was
        only for it and is cancelled; another FETCH upstream goes on, for the cache."""
        if job.finished:
            return
        self._end_fetch_job(job)
        if job.cut_through and job.upstream is not None and not job.upstream.done.done():
            self._cancel_upstream_fetch(job.upstream)

    # -- the job's steps -----------------------------------------------------------------------------------

    def _fetch_step(self, job: FetchJob, step: Callable[..., None], *args: object) -> None:
        """Run a step of the job; a refusal answers the FETCH, a failure ends it (never other sessions)."""
        try:
            step(*args)
        except Refusal as refusal:
            self._end_fetch_job(job)
            self._refuse(job.peer, job.request, refusal.code, refusal.reason)
        except SessionUsageError as exc:  # the peer went away while we were writing to it
            self._end_fetch_job(job)
            log.debug("relay FETCH: %s", exc)
        except Exception:  # a relay bug must not take other sessions down
            self._end_fetch_job(job)
            self.counters.internal_errors += 1
            log.exception("relay FETCH failed")

    def _fetch_wait(self, job: FetchJob, fetch: UpstreamFetch, until: Callable[[], bool] | None,
                    then: Callable[[bool], None]) -> None:
        """Wait for ``fetch`` (within what is left of the job's FILL_TIMEOUT), then go on with ``then(ok)``."""
        wait = self._wait_for_fetch(fetch, self.fetch_budget(job.deadline), until,
                                    functools.partial(self._fetch_woken, job, then))
        if not wait.result.done():  # (a wait over at once has already run ``then``)
            job.wait = wait

    def _fetch_woken(self, job: FetchJob, then: Callable[[bool], None], ok: bool) -> None:
        job.wait = None
        if not job.finished:
            self._fetch_step(job, then, ok)

    def _fetch_gone(self, job: FetchJob) -> bool:
        """Nobody waits for the answer any more (the requester left or cancelled)."""
        return job.peer.gone or job.request.state is not RequestState.PENDING

    def _fetch_answered_upstream(self, job: FetchJob, flt: LocationFilter, ok: bool) -> None:
        fetch = job.upstream
        assert fetch is not None
        if fetch.error is not None:
            raise Refusal(fetch.error.error_code, "upstream FETCH failed: "
                          + fetch.error.reason.decode("utf-8", "replace"))
        if fetch.ok is None:
            raise Refusal(RequestErrorCode.TIMEOUT, f"upstream FETCH of {job.track} did not complete")
        end_loc = fetch.ok.end_location
        flt_end = flt.end()
        start = fetch.start
        job.rng = (start, end_loc if flt_end is None else min(flt_end, end_loc))
        job.end_of_track = bool(fetch.ok.end_of_track) and job.rng[1] == end_loc
        if not job.descending and job.rng[1] == end_loc and start <= end_loc and self.cuts_through(job):
            self._start_cut_through(job)
            return
        self._fetch_wait(job, fetch, None, lambda ok: self._fetch_from_cache(job))

    def _ensure_cached(self, job: FetchJob, start: Location, end: Location, then: Callable[[int], None]) -> None:
        """Make [start, end] (inclusive) known, FETCHing the unknown span upstream within the job's budget
        (``plan_gap_fetch``), then ``then(kind)``: the End of Range kind for what stays unknown, TIMED_OUT when
        the budget ran out (or was 0), UNKNOWN when no source could tell (section 9.4)."""
        planned = self.plan_gap_fetch(job.track, start, end, self.fetch_budget(job.deadline))
        if not isinstance(planned, UpstreamFetch):
            then(planned)
            return
        self._fetch_wait(job, planned, None,
                         lambda ok: then(EndOfRangeKind.UNKNOWN if ok else EndOfRangeKind.TIMED_OUT))

    def _fetch_from_cache(self, job: FetchJob) -> None:
        if self._fetch_gone(job):
            self._end_fetch_job(job)
            return
        assert job.rng is not None
        self._ensure_cached(job, job.rng[0], job.rng[1], functools.partial(self._serve_from_cache, job))

    def _serve_from_cache(self, job: FetchJob, gap_kind: int) -> None:
        """FETCH_OK with the End Location actually covered, the records, FIN."""
        peer, req, track = job.peer, job.request, job.track
        assert job.rng is not None
        start, end = job.rng
        items = self.fetch_items(track, start, end, job.descending, job.filters, gap_kind)
        end_location = self.fetch_end_location(track, items, end)
        end_of_track = job.end_of_track if job.end_of_track is not None else self._ends_track(track, end_location)
        if self._fetch_gone(job):
            self._end_fetch_job(job)
            return
        peer.session.fetch_ok(req.stream_id, end_location, end_of_track=end_of_track,
                              track_properties=self.track_properties(track))
        job.stream_id = peer.session.open_fetch_stream(req.stream_id)
        self.serve_fetch_range(peer, req, track, job.stream_id, items)
        track.counters.fetch_objects += sum(isinstance(i, FetchObject) for i in items)
        self._fetch_written(job)

    # -- cut-through -----------------------------------------------------------------------------------------

    def _start_cut_through(self, job: FetchJob) -> None:
        """FETCH_OK with the upstream End Location at once, then each object as soon as every Location before it
        has come from upstream (the upstream stream is ascending, so the objects keep their order). What stays
        unknown is settled at the end as in the stored path."""
        fetch, rng = job.upstream, job.rng
        assert fetch is not None and rng is not None
        if self._fetch_gone(job):
            self._end_fetch_job(job)
            self._cancel_upstream_fetch(fetch)
            return
        job.cut_through = True
        session = job.peer.session
        session.fetch_ok(job.request.stream_id, rng[1], end_of_track=bool(job.end_of_track),
                         track_properties=self.track_properties(job.track))
        job.stream_id = session.open_fetch_stream(job.request.stream_id)
        job.cursor = rng[0]
        self._cut_through(job)

    def _cut_through(self, job: FetchJob) -> None:
        """Write what has arrived upstream since the last step, then wait for more (or settle the rest)."""
        fetch, rng, cursor, sid = job.upstream, job.rng, job.cursor, job.stream_id
        assert fetch is not None and rng is not None and cursor is not None and sid is not None
        start, end = rng
        if cursor <= end and not fetch.unknown:  # an unknown range: its record is written at the end
            fetch.progress.clear()
            arrived = next_loc(fetch.prev) if fetch.prev is not None else start  # all before it has come
            upto = min(arrived, next_loc(end))
            if upto > cursor:
                with job.track.cache.settled(cursor, upto):
                    items = self.fetch_items(job.track, cursor, loc_before(upto), False, job.filters,
                                             EndOfRangeKind.UNKNOWN)
                if items:
                    self.serve_fetch_range(job.peer, job.request, job.track, sid, items)
                    job.served += sum(isinstance(i, FetchObject) for i in items)
                job.cursor = upto
            if not job.peer.session.data_stream_open(sid):  # cancelled or reset downstream: stop fetching for it
                self.cancel_fetch(job)
                return
            if not fetch.done.done():
                self._fetch_wait(job, fetch, fetch.progress.is_set, functools.partial(self._cut_through_woken, job))
                return
        self._cut_through_rest(job)

    def _cut_through_woken(self, job: FetchJob, ok: bool) -> None:
        if ok:
            self._cut_through(job)
        else:  # the budget ran out (the upstream FETCH is cancelled): settle the rest
            self._cut_through_rest(job)

    def _cut_through_rest(self, job: FetchJob) -> None:
        fetch, rng, cursor = job.upstream, job.rng, job.cursor
        assert fetch is not None and rng is not None and cursor is not None
        if cursor > rng[1]:
            self._cut_through_last(job, [])
        elif not fetch.done.done():  # stopped at an unknown range: the FETCH first settles what it covers
            self._fetch_wait(job, fetch, None, lambda ok: self._ensure_cached(
                job, cursor, rng[1], functools.partial(self._cut_through_tail, job)))
        else:
            self._ensure_cached(job, cursor, rng[1], functools.partial(self._cut_through_tail, job))

    def _cut_through_tail(self, job: FetchJob, gap_kind: int) -> None:
        assert job.rng is not None and job.cursor is not None
        self._cut_through_last(job, self.fetch_items(job.track, job.cursor, job.rng[1], False, job.filters,
                                                     gap_kind))

    def _cut_through_last(self, job: FetchJob, rest: Sequence[FetchObject | EndOfRange]) -> None:
        assert job.stream_id is not None
        if rest or not job.served:
            self.serve_fetch_range(job.peer, job.request, job.track, job.stream_id, rest)
            job.served += sum(isinstance(i, FetchObject) for i in rest)
        job.track.counters.fetch_objects += job.served
        self._fetch_written(job)

    # -- the end -----------------------------------------------------------------------------------------------

    def _fetch_written(self, job: FetchJob) -> None:
        """FIN the fetch stream and the request stream: the response is complete."""
        session, sid = job.peer.session, job.stream_id
        if sid is not None and session.data_stream_open(sid):
            session.end_data_stream(sid)
        with contextlib.suppress(SessionUsageError):
            session.finish_request(job.request.stream_id)
        self._end_fetch_job(job)
        self.fetch_served(job)

    def _end_fetch_job(self, job: FetchJob) -> None:
        job.finished = True
        if job.peer.fetch_jobs.get(job.request.stream_id) is job:
            del job.peer.fetch_jobs[job.request.stream_id]
        wait, job.wait = job.wait, None
        if wait is not None:
            self._drop_fetch_wait(wait)
