"""kvcs-publisher: serving a relay after the fact (moqt-d22-profile sections 7.3, 9.4, 11.2-11.4; KVCS
"Retrieval during Production", "Retrieval of Completed Caches").

Once the publication is complete the relay asks the publisher, per data track, for a SUBSCRIBE with Next
Object + FILL_PARAMETERS {Absolute Start {0,0}, Ascending} (what a relay sends to fill a late KVCS subscriber)
and a FETCH of everything (Ascending), and for the manifest a SUBSCRIBE with fill {Relative Start 1}.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pytest

from kvconform.moqt.data import ObjectStatus
from kvconform.moqt.structures import Location
from kvconform.targets.kvcs.recording_relay import Answer, Observation, findings, need_publication, track_name
from kvconform.verdicts import Findings, inconclusive


def _published(obs: Observation, name: bytes) -> dict[Location, bytes]:
    """Location -> payload of every object of a track the relay received live."""
    return {o.location: o.payload for o in obs.live(name) if o.status == ObjectStatus.NORMAL}


@dataclass(frozen=True)
class Blame:
    """Which requirement each way a probe's delivery can go wrong breaks."""

    refused: str  # no OK answer
    stream: str  # not one data stream ended with FIN
    groups: str  # Groups not ascending
    objects: str  # an object twice, or Object IDs not ascending within a Group
    missing: str  # a published object not delivered
    changed: str  # a payload other than the published one


FILL = Blame("MOQT-FILL-STREAM", "MOQT-FILL-STREAM", "MOQT-FILL-EXACTLY-ONCE", "MOQT-FILL-EXACTLY-ONCE",
             "MOQT-FILL-EXACTLY-ONCE", "KVCS-PUB-NO-DUP-LOCATION")
FETCH = Blame("MOQT-FETCH-RANGE", "MOQT-FETCH-ORDER", "KVCS-FETCH-ASCENDING", "MOQT-FETCH-ORDER", "MOQT-FETCH-RANGE",
              "KVCS-PUB-NO-DUP-LOCATION")


def _delivery_problems(obs: Observation, a: Answer, via: str, what: str, found: Findings, blame: Blame) -> None:
    """One probe's answer and data stream: answered OK, one stream ended with FIN, every published object once in
    ascending order, each payload as published; each problem against the requirement ``blame`` names."""
    if not a.ok:
        found.add(blame.refused, f"{what}: answered "
                                 f"{'nothing' if a.ok is None else f'REQUEST_ERROR 0x{a.error_code:x}'}")
        return
    ends = sorted(a.data_streams.values())
    if ends != ["fin"]:
        found.add(blame.stream, f"{what}: data streams ended {ends or 'none opened'}, expected one stream ended with "
                                "FIN")
    objs = sorted((o for o in obs.of(a.track, via) if o.stream_id in a.data_streams), key=lambda o: o.seq)
    locs = [o.location for o in objs]
    groups = [loc.group for loc in locs]
    if groups != sorted(groups):
        found.add(blame.groups, f"{what}: Groups not in ascending order ({[str(x) for x in locs[:8]]})")
    elif locs != sorted(set(locs)):
        found.add(blame.objects, f"{what}: objects not once each in ascending Object ID order within their Group "
                                 f"({[str(x) for x in locs[:8]]})")
    published = _published(obs, a.track)
    got = {o.location: o.payload for o in objs}
    missing = sorted(set(published) - set(got))
    if missing:
        found.add(blame.missing, f"{what}: {len(missing)} published objects missing, e.g. "
                                 f"{[str(m) for m in missing[:5]]}")
    changed = sorted(loc for loc in got if loc in published and got[loc] != published[loc])
    if changed:
        found.add(blame.changed, f"{what}: payloads differ from the ones published live at "
                                 f"{[str(c) for c in changed[:5]]}")


@pytest.mark.req("MOQT-FILL-STREAM", "MOQT-FILL-EXACTLY-ONCE", "MOQT-SUB-PUBLISH-DONE", "KVCS-PUB-NO-DUP-LOCATION")
def test_a_late_subscription_is_filled_with_every_object_once(kvcs_publication: Any) -> None:
    """After the publication, Next Object + fill {0,0} gets SUBSCRIBE_OK and one fill stream carrying every
    object of the track once, in ascending order, identical to what was published, ended with FIN; the manifest
    with fill {Relative Start 1} gets the latest version."""
    obs = kvcs_publication
    need_publication(obs)
    found = findings(f"case {obs.case.name}: a late subscription is not filled with the publication",
                     "MOQT-FILL-STREAM", "MOQT-FILL-EXACTLY-ONCE", "KVCS-PUB-NO-DUP-LOCATION")
    for track in obs.data_tracks():
        for a in obs.answers_for(track.name, "probe-subscribe"):
            what = f"{track} SUBSCRIBE Next Object + fill {{0,0}}"
            _delivery_problems(obs, a, "fill", what, found, FILL)
            if a.done is not None:
                found.expect(a.done.stream_count in (len(a.data_streams), 2**64 - 1), "MOQT-SUB-PUBLISH-DONE",
                             f"{what}: PUBLISH_DONE Stream Count {a.done.stream_count}, {len(a.data_streams)} data "
                             "streams were opened")
    name = obs.manifest_track
    if name is not None:
        latest = max((o.location for o in obs.live(name) if o.status == ObjectStatus.NORMAL), default=None)
        for a in obs.answers_for(name, "probe-subscribe"):
            delivered = [o.location for o in obs.of(name, "fill") if o.stream_id in a.data_streams]
            if a.ok and latest is not None and delivered != [latest]:
                found.add("MOQT-FILL-STREAM", f"{track_name(name)} SUBSCRIBE fill {{Relative Start 1}}: delivered "
                                              f"{[str(g) for g in delivered]}, expected the latest version {latest}")
    found.judge()


@pytest.mark.req("MOQT-FETCH-ORDER", "KVCS-FETCH-ASCENDING", "MOQT-FETCH-RANGE", "MOQT-FETCH-OK",
                 "KVCS-PUB-NO-DUP-LOCATION")
def test_fetch_returns_the_track_in_ascending_order(kvcs_publication: Any) -> None:
    """A FETCH from {0,0} (Ascending) gets FETCH_OK whose End Location is the last object (or End of Track), then
    one stream with every object once, Groups ascending and objects ascending within each, as published."""
    obs = kvcs_publication
    need_publication(obs)
    found = findings(f"case {obs.case.name}: FETCH does not return the track in ascending order", "MOQT-FETCH-ORDER",
                     "KVCS-FETCH-ASCENDING", "MOQT-FETCH-RANGE", "MOQT-FETCH-OK", "KVCS-PUB-NO-DUP-LOCATION")
    for track in obs.data_tracks():
        published = _published(obs, track.name)
        for a in obs.answers_for(track.name, "probe-fetch"):
            what = f"{track} FETCH {{0,0}}.. Ascending"
            _delivery_problems(obs, a, "fetch", what, found, FETCH)
            last = max(published, default=None)
            ends = {o.location for o in obs.live(track.name) if o.status == ObjectStatus.END_OF_TRACK}
            if last is not None and a.ok and a.end_location not in {last, *ends}:
                found.add("MOQT-FETCH-OK", f"{what}: FETCH_OK End Location {a.end_location}, expected the last object "
                                           f"{last}")
    found.judge()


UNKNOWN_STREAM_COUNT = 2**64 - 1


@pytest.mark.req("MOQT-SUB-PUBLISH-DONE")
def test_publish_done_follows_the_streams_it_counts(kvcs_publication: Any) -> None:
    """Every PUBLISH_DONE the publisher sent (on the relay's live subscriptions and on the late subscriptions
    after the track ended) counts the data streams it opened for that subscription, fill streams included, and
    was sent only after each of them was closed (FIN or RESET_STREAM sent, RFC 9000 section 3.1): judged by the
    QUIC packet numbers the publisher sent them in, which network reordering and loss cannot invert (see
    kvconform.moqt.sendorder); an order a lost packet leaves open is undecided, never a pass."""
    obs = kvcs_publication
    need_publication(obs)
    order = obs.send_order
    if order is None:
        inconclusive(f"case {obs.case.name}: the publisher's packets were not recorded")
    done = [(a, msg) for a in obs.answers if a.kind in ("subscribe", "probe-subscribe")
            for msg in (a.done,) if msg is not None]
    if not done:
        inconclusive(f"case {obs.case.name}: the publisher sent no PUBLISH_DONE (it MAY delay it after End of "
                     "Track); nothing to judge")
    found = findings(f"case {obs.case.name}: PUBLISH_DONE does not follow the streams it counts",
                     "MOQT-SUB-PUBLISH-DONE")
    undecided: list[str] = []
    for a, msg in done:
        what = f"{track_name(a.track)} {a.kind} (request stream {a.stream_id})"
        opened = len(a.data_streams)
        if msg.stream_count not in (opened, UNKNOWN_STREAM_COUNT):
            found.add("MOQT-SUB-PUBLISH-DONE", f"{what}: PUBLISH_DONE Stream Count {msg.stream_count}, "
                                               f"{opened} data streams were opened for the subscription")
        sent = order.last_byte_in(a.stream_id)
        if sent is None:
            undecided.append(f"{what}: the packet carrying PUBLISH_DONE was not recorded")
            continue
        for sid in sorted(a.data_streams):
            ended = order.ended_in(sid)
            if ended is None and order.gap_at_or_below(max(order.packets)) is not None:
                undecided.append(f"{what}: stream {sid} shows no FIN, but a packet was lost")
                continue
            if ended is None:
                found.add("MOQT-SUB-PUBLISH-DONE", f"{what}: PUBLISH_DONE (packet {sent}) sent while its data "
                                                   f"stream {sid} was never closed (no FIN or RESET_STREAM arrived)")
                continue
            after = order.sent_before(sent, ended)
            if after:
                found.add("MOQT-SUB-PUBLISH-DONE", f"{what}: PUBLISH_DONE sent in packet {sent}, before its data "
                                                   f"stream {sid} was closed (FIN first sent in packet {ended}; "
                                                   f"no packet up to {sent} was lost)")
            elif after is None:
                undecided.append(f"{what}: stream {sid} FIN in packet {ended} after PUBLISH_DONE in packet {sent}, "
                                 f"but packet {order.gap_at_or_below(sent)} never arrived")
    if not found.problems and undecided:
        inconclusive(f"case {obs.case.name}: the send order is undecided: {undecided[:3]}")
    found.judge()
