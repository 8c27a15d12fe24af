"""kvcs-publisher: serving a relay after the fact (moqt-d22-profile sections 7.3, 9.4, 11.2-11.4; KVCS
"Retrieval during Production", "Retrieval of Completed Caches").

Once the publication is complete the relay asks the publisher, per data track, for a SUBSCRIBE with Next
Object + FILL_PARAMETERS {Absolute Start {0,0}, Ascending} (what a relay sends to fill a late KVCS subscriber)
and a FETCH of everything (Ascending), and for the manifest a SUBSCRIBE with fill {Relative Start 1}.
"""

from __future__ import annotations

from typing import Any

import pytest

from kvconform.conformance.kvcs.publisher.harness import Answer, Observation, need_publication, report, track_name
from kvconform.moqt.data import ObjectStatus
from kvconform.moqt.structures import Location


def _published(obs: Observation, name: bytes) -> dict[Location, bytes]:
    """Location -> payload of every object of a track the relay received live."""
    return {o.location: o.payload for o in obs.live(name) if o.status == ObjectStatus.NORMAL}


def _stream_problems(a: Answer, what: str) -> list[str]:
    ends = sorted(a.data_streams.values())
    if ends != ["fin"]:
        return [f"{what}: data streams ended {ends or 'none opened'}, expected one stream ended with FIN"]
    return []


def _delivery_problems(obs: Observation, a: Answer, via: str, what: str, order_req: str,
                       content_req: str) -> list[str]:
    """One probe's answer and data stream: answered OK, one stream ended with FIN, every published object once
    in ascending order, each payload as published. ``order_req`` / ``content_req``: the ids cited."""
    if not a.ok:
        return [f"{what}: answered {'nothing' if a.ok is None else f'REQUEST_ERROR 0x{a.error_code:x}'} "
                f"[{content_req}]"]
    problems = [f"{p} [{order_req}]" for p in _stream_problems(a, what)]
    objs = sorted((o for o in obs.of(a.track, via) if o.stream_id in a.data_streams), key=lambda o: o.seq)
    locs = [o.location for o in objs]
    if locs != sorted(set(locs)):
        problems.append(f"{what}: objects not once each in ascending Group and Object order "
                        f"({[str(x) for x in locs[:8]]}) [{order_req}]")
    published = _published(obs, a.track)
    got = {o.location: o.payload for o in objs}
    missing = sorted(set(published) - set(got))
    if missing:
        problems.append(f"{what}: {len(missing)} published objects missing, e.g. {[str(m) for m in missing[:5]]} "
                        f"[{content_req}]")
    changed = sorted(loc for loc in got if loc in published and got[loc] != published[loc])
    if changed:
        problems.append(f"{what}: payloads differ from the published ones at {[str(c) for c in changed[:5]]} "
                        f"[{content_req}]")
    return problems


@pytest.mark.req("MOQT-FILL-STREAM", "MOQT-FILL-EXACTLY-ONCE", "MOQT-SUB-PUBLISH-DONE")
def test_a_late_subscription_is_filled_with_every_object_once(kvcs_publication: Any) -> None:
    """After the publication, Next Object + fill {0,0} gets SUBSCRIBE_OK and one fill stream carrying every
    object of the track once, in ascending order, identical to what was published, ended with FIN; the manifest
    with fill {Relative Start 1} gets the latest version."""
    obs = kvcs_publication
    need_publication(obs)
    problems = []
    for track in obs.data_tracks():
        name = track.name
        for a in obs.answers_for(name, "probe-subscribe"):
            what = f"{track} SUBSCRIBE Next Object + fill {{0,0}}"
            problems += _delivery_problems(obs, a, "fill", what, "MOQT-FILL-STREAM, MOQT-FILL-EXACTLY-ONCE",
                                           "MOQT-FILL-EXACTLY-ONCE")
            if a.done is not None and a.done.stream_count not in (len(a.data_streams), 2**64 - 1):
                problems.append(f"{what}: PUBLISH_DONE Stream Count {a.done.stream_count}, {len(a.data_streams)} data "
                                "streams were opened [MOQT-SUB-PUBLISH-DONE]")
    name = obs.manifest_track
    if name is not None:
        latest = max((o.location for o in obs.live(name) if o.status == ObjectStatus.NORMAL), default=None)
        for a in obs.answers_for(name, "probe-subscribe"):
            delivered = [o.location for o in obs.of(name, "fill") if o.stream_id in a.data_streams]
            if a.ok and latest is not None and delivered != [latest]:
                problems.append(f"{track_name(name)} SUBSCRIBE fill {{Relative Start 1}}: delivered "
                                f"{[str(g) for g in delivered]}, expected the latest version {latest} "
                                "[MOQT-FILL-STREAM]")
    report(problems, f"case {obs.case.name}: a late subscription is not filled with the publication")


@pytest.mark.req("MOQT-FETCH-ORDER", "KVCS-FETCH-ASCENDING", "MOQT-FETCH-RANGE", "MOQT-FETCH-OK")
def test_fetch_returns_the_track_in_ascending_order(kvcs_publication: Any) -> None:
    """A FETCH from {0,0} (Ascending) gets FETCH_OK whose End Location is the last object (or End of Track), then
    one stream with every object once, Groups ascending and objects ascending within each, as published."""
    obs = kvcs_publication
    need_publication(obs)
    problems = []
    for track in obs.data_tracks():
        name = track.name
        published = _published(obs, name)
        for a in obs.answers_for(name, "probe-fetch"):
            what = f"{track} FETCH {{0,0}}.. Ascending"
            problems += _delivery_problems(obs, a, "fetch", what, "MOQT-FETCH-ORDER, KVCS-FETCH-ASCENDING",
                                           "MOQT-FETCH-RANGE")
            last = max(published, default=None)
            ends = {o.location for o in obs.live(name) if o.status == ObjectStatus.END_OF_TRACK}
            if last is not None and a.end_location not in {last, *ends}:
                problems.append(f"{what}: FETCH_OK End Location {a.end_location}, expected the last object {last} "
                                "[MOQT-FETCH-OK]")
    report(problems, f"case {obs.case.name}: FETCH does not return the track in ascending order")
