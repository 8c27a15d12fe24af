"""kvcs-publisher: limits the publisher declares (KVCS "Security Considerations": "publishers SHOULD limit the
number of concurrent fetches per subscriber").

The text sets no number, so the check holds a publisher to the limit it declares (PICS
``kvcs.publisher.fetch_limit: N``; undeclared: not applicable). The scenario (``limits.py``) keeps the fetches
that started in progress by withholding flow-control credit from their data streams, sends N FETCHes on the
publisher's one session and then one more, and then releases the credit.
"""

from __future__ import annotations

from typing import Any

import pytest

from kvconform.conformance.kvcs.publisher.harness import findings, track_name
from kvconform.conformance.kvcs.publisher.limits import FetchProbe, LimitObservation
from kvconform.moqt.errors import RequestErrorCode
from kvconform.verdicts import inconclusive

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
    if not obs.complete or len(obs.probes) != obs.limit + 1:
        inconclusive(f"the fetch-limit scenario could not run its {obs.limit + 1} fetches ({len(obs.probes)} sent); "
                     f"notes: {obs.notes}")
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
