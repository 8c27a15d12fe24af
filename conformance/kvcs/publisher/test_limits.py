"""kvcs-publisher: limits the publisher declares (KVCS "Security Considerations": "publishers SHOULD limit the
number of concurrent fetches per subscriber"; "Publisher Behavior": "During live production it publishes each
Object as soon as the layer of the block is computed").

Neither text sets a number, so the checks hold a publisher to what it declares. Fetches: the limit it declares
(PICS ``kvcs.publisher.fetch_limit: N``; undeclared: not applicable). The scenario (``limits.py``) keeps the
fetches that started in progress by withholding flow-control credit from their data streams, sends N FETCHes on
the publisher's one session and then one more (three with ``--sweep wide``), and then releases the credit. Live
timing: a declared bound on its computation per layer (PICS ``kvcs.publisher.live_delay_ms``; undeclared: not
applicable).
"""

from __future__ import annotations

from typing import Any

import pytest

from kvconform.moqt.data import ObjectStatus
from kvconform.moqt.errors import RequestErrorCode
from kvconform.targets.kvcs.fetch_limit import FetchProbe, LimitObservation
from kvconform.targets.kvcs.recording_relay import Observation, findings, need_live, track_name
from kvconform.targets.spec import Pics
from kvconform.verdicts import inconclusive, not_applicable

REQ = "KVCS-SEC-FETCH-LIMIT"
# How a publisher may refuse a FETCH for load (profile section 10.2).
REFUSAL_CODES = (RequestErrorCode.EXCESSIVE_LOAD,)


def _what(obs: LimitObservation, p: FetchProbe) -> str:
    return f"FETCH {obs.probes.index(p) + 1} of {len(obs.probes)} ({track_name(p.answer.track)})"


@pytest.mark.req(REQ)
def test_the_declared_fetch_limit_holds(kvcs_fetch_limit: Any) -> None:
    """With N (the declared limit) fetches of one session in progress, the publisher starts no other one (it
    refuses it with REQUEST_ERROR EXCESSIVE_LOAD, or leaves it waiting until a slot frees); it refuses none while
    fewer than N are in progress; once the credit is released every fetch it did not refuse is served to FIN."""
    obs: LimitObservation = kvcs_fetch_limit
    if not obs.complete or len(obs.probes) != obs.limit + obs.extra:
        inconclusive(f"the fetch-limit scenario could not run its {obs.limit + obs.extra} fetches "
                     f"({len(obs.probes)} sent); notes: {obs.notes}")
    held_fin = [p for p in obs.probes if p.ended_held and p.answer.data_streams
                and "fin" in p.answer.data_streams.values()]
    if held_fin:
        inconclusive(f"{_what(obs, held_fin[0])}: its data stream ended with FIN while the harness withheld credit "
                     "(the hold did not hold); nothing to judge")
    found = findings(f"the publisher does not keep to its declared fetch limit {obs.limit}", REQ)
    for p in obs.probes:
        what = _what(obs, p)
        if p.refused is not None:
            if p.answer.error_code not in REFUSAL_CODES:
                found.add(REQ, f"{what}: refused with REQUEST_ERROR 0x{p.answer.error_code or 0:x}, expected "
                               f"EXCESSIVE_LOAD (0x{RequestErrorCode.EXCESSIVE_LOAD:x}) for a fetch over the limit")
            busy = obs.in_progress_at(p.refused, p)
            if p.refused_held and busy < obs.limit:
                found.add(REQ, f"{what}: refused while only {busy} other fetch(es) were in progress, below the "
                               f"declared limit {obs.limit}")
            continue
        if p.started is not None and p.started_held:
            busy = obs.in_progress_at(p.started, p)
            if busy >= obs.limit:
                found.add(REQ, f"{what}: started (FETCH_OK or its data stream) while {busy} other fetches were in "
                               f"progress, over the declared limit {obs.limit}")
        ends = sorted(p.answer.data_streams.values())
        if p.answer.ok is not True or ends != ["fin"]:
            state = ("unanswered" if p.answer.ok is None and p.started is None else
                     f"FETCH_OK {p.answer.ok}, data streams {ends or 'none'}")
            found.add(REQ, f"{what}: not served once the credit was released ({state}); a fetch under the limit, "
                           "or one waiting for a slot, must be served")
    found.judge()


LIVE = "KVCS-PUB-LIVE-ASAP"
# Seconds the check allows on top of the declared computation time for sending, the transport and the harness's
# own scheduling (coarse: a loaded CI machine; a publisher that holds its layers back misses it by its whole
# production time).
TRANSPORT_ALLOWANCE = 1.5


@pytest.mark.req(LIVE)
def test_live_objects_arrive_within_the_declared_layer_time(pics: Pics, kvcs_plain: Any) -> None:
    """With a declared live_delay_ms D (each layer computed within D of the previous one, the first within D of
    the REQUEST_OK to its PUBLISH_NAMESPACE), every Object of Group g of the plain case's 20 layers arrives live
    by (g + 1) x D + TRANSPORT_ALLOWANCE after that REQUEST_OK: a publisher that holds layers back until later
    ones are computed misses it."""
    path = "kvcs.publisher.live_delay_ms"
    if pics.is_defaulted(path):
        not_applicable(f"PICS {path} is only a testbed default, not the publisher's declaration")
    delay = float(pics.require(path)) / 1000.0
    obs: Observation = kvcs_plain
    need_live(obs)
    if obs.accepted_at is None:
        inconclusive("the harness's REQUEST_OK to the publisher's PUBLISH_NAMESPACE was not recorded")
    found = findings(f"case {obs.case.name}: live Objects arrive later than the declared layer time "
                     f"{delay * 1000:g} ms allows", LIVE)
    for track in obs.data_tracks():
        if track.segment != 0:
            continue
        last: dict[int, float] = {}
        for o in obs.live(track.name):
            if o.status == ObjectStatus.NORMAL:
                last[o.location.group] = max(last.get(o.location.group, 0.0), o.at)
        for group, at in sorted(last.items()):
            late = at - obs.accepted_at
            bound = (group + 1) * delay + TRANSPORT_ALLOWANCE
            if late > bound:
                found.add(LIVE, f"{track} Group {group}: its last Object arrived {late:.2f} s after REQUEST_OK, "
                                f"expected by {bound:.2f} s ((g + 1) x {delay * 1000:g} ms + {TRANSPORT_ALLOWANCE} s)")
                break
    found.judge()
