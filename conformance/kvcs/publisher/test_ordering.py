"""kvcs-publisher: how the objects are delivered live (KVCS "Groups", "Objects"; moqt-d22-profile sections
9.2, 9.3 and 13 #11): layer by layer, one Subgroup 0 stream per Group in ascending Object ID order with
FIRST_OBJECT, End of Group after each layer, End of Track after the last, Publisher Priorities.

These read the relay's own subscriptions, which it opens before answering PUBLISH_NAMESPACE, so every object
of a publisher that waits for that answer is seen live, in the order it was sent.
"""

from __future__ import annotations

from typing import Any

import pytest

from kvconform.conformance.kvcs.group_order import opening_order_problems, write_order_problems
from kvconform.kvcs.tracks import MANIFEST, MANIFEST_COSE
from kvconform.moqt.data import SG_FIRST_OBJECT, ObjectStatus
from kvconform.moqt.structures import Location, PropertyType, property_int
from kvconform.targets.kvcs.recording_relay import Observation, Seen, findings, need_live, track_name
from kvconform.verdicts import check_no_problems, inconclusive, pass_basis


def _data_live(obs: Observation) -> dict[bytes, list[Seen]]:
    """Live objects per data track the publisher served, in the order it published them: by the stream they
    came on (QUIC numbers a sender's streams in the order it opens them), then in stream order. Arrival order
    across streams is the transport's (flow control, priorities), not the publisher's."""
    return {t.name: sorted(obs.live(t.name), key=lambda o: (o.stream_id, o.seq)) for t in obs.data_tracks()}


def _published_after(o: Seen, marker: Seen) -> bool:
    """``o`` was published after ``marker`` (on a stream opened later, or later on the same stream)."""
    return (o.stream_id, o.seq) > (marker.stream_id, marker.seq)


def _blocks(obs: Observation, name: bytes) -> int:
    segment = int(name.rsplit(b".s", 1)[1])
    return obs.spec.segment_layout()[segment].blocks


@pytest.mark.req("KVCS-GROUP-ORDER")
def test_groups_are_published_in_layer_order(kvcs_publication: Any) -> None:
    """In every data track all objects of Group g are published before any of Group g+1. Judged from the order
    the publisher opened its streams (no object of a Group on a stream opened after one of a later Group) and,
    when the harness runs the publisher itself, from the exact order its session issued every write (no object
    of Group g written after one of a later Group). Never from arrival times across streams: those are the
    transport's (flow control, priorities, loss), which a correct publisher cannot control."""
    obs = kvcs_publication
    need_live(obs)
    problems = opening_order_problems(_data_live(obs))
    if obs.schedule is not None:
        problems += write_order_problems(obs, obs.schedule)
    check_no_problems(problems, what=f"case {obs.case.name}: Groups are not published layer by layer",
                      req="KVCS-GROUP-ORDER")
    if obs.schedule is None:
        pass_basis("black box: judged on the order the publisher opened its Groups' streams (QUIC stream IDs); "
                   "the order of its writes on streams already open is not visible outside its process")


@pytest.mark.req("KVCS-GROUP-SUBGROUP-ZERO", "MOQT-DATA-FIRST-OBJECT", "MOQT-DATA-FIN")
def test_each_group_is_one_subgroup_0_stream_in_ascending_object_order(kvcs_publication: Any) -> None:
    """Each Group of a data track travels on one subgroup stream: Subgroup ID 0, FIRST_OBJECT set (the original
    publisher opens the subgroup), Object IDs ascending from 0, closed with FIN."""
    obs = kvcs_publication
    need_live(obs)
    found = findings(f"case {obs.case.name}: Groups are not one Subgroup 0 stream in Object ID order",
                     "KVCS-GROUP-SUBGROUP-ZERO", "MOQT-DATA-FIRST-OBJECT", "MOQT-DATA-FIN")
    ends = {sid: end for a in obs.answers if a.kind == "subscribe" for sid, end in a.data_streams.items()}
    for name, objects in _data_live(obs).items():
        groups: dict[int, list[Seen]] = {}
        for o in objects:
            groups.setdefault(o.location.group, []).append(o)
        for g, objs in sorted(groups.items()):
            where = f"{track_name(name)} Group {g}"
            streams = sorted({o.stream_id for o in objs})
            if len(streams) != 1:
                found.add("KVCS-GROUP-SUBGROUP-ZERO", f"{where}: on {len(streams)} subgroup streams, expected one")
            subgroups = sorted({o.subgroup for o in objs}, key=lambda s: -1 if s is None else s)
            if subgroups != [0]:
                found.add("KVCS-GROUP-SUBGROUP-ZERO", f"{where}: Subgroup IDs {subgroups}, expected only 0")
            ids = [o.location.object for o in objs]
            if ids != sorted(set(ids)) or ids[0] != 0:
                found.add("KVCS-GROUP-SUBGROUP-ZERO", f"{where}: Object IDs in the order {ids[:10]}, expected "
                                                      "ascending from 0")
            flags = objs[0].header_flags
            if flags is not None and not flags & SG_FIRST_OBJECT:
                found.add("MOQT-DATA-FIRST-OBJECT", f"{where}: SUBGROUP_HEADER 0x{flags:02x} without FIRST_OBJECT "
                                                    "(0x40) on the stream that opens the subgroup")
            for sid in streams:
                if ends.get(sid) != "fin":
                    found.add("MOQT-DATA-FIN", f"{where}: its stream {sid} ended {ends.get(sid, 'never')!r}, "
                                               "expected FIN")
    found.judge()


@pytest.mark.req("KVCS-GROUP-END-OF-GROUP", "MOQT-DATA-OBJECT-STATUS")
def test_end_of_group_after_each_layer(kvcs_publication: Any) -> None:
    """After the last object of each Group of a data track comes an End of Group status object (Object ID past
    the last block, no payload), and nothing after it in that Group. The last Group may end with End of Track
    instead (moqt-d22-profile section 13 #11)."""
    obs = kvcs_publication
    need_live(obs)
    found = findings(f"case {obs.case.name}: End of Group does not follow each layer", "KVCS-GROUP-END-OF-GROUP",
                     "MOQT-DATA-OBJECT-STATUS")
    layers = obs.spec.layers
    for name, objects in _data_live(obs).items():
        blocks = _blocks(obs, name)
        for g in range(layers):
            objs = [o for o in objects if o.location.group == g]
            where = f"{track_name(name)} Group {g}"
            eog = [o for o in objs if o.status == ObjectStatus.END_OF_GROUP]
            eot_here = [o for o in objs if o.status == ObjectStatus.END_OF_TRACK]
            if g == layers - 1 and eot_here and not eog:
                continue  # End of Track at {L-1, n} closes the last Group (accepted, section 13 #11)
            if len(eog) != 1:
                found.add("KVCS-GROUP-END-OF-GROUP", f"{where}: {len(eog)} End of Group status objects, expected one "
                                                     f"after Object {blocks - 1}")
                continue
            marker = eog[0]
            if marker.location.object < blocks:
                found.add("KVCS-GROUP-END-OF-GROUP", f"{where}: End of Group at Object {marker.location.object}, "
                                                     f"expected after the last block (Object ID >= {blocks})")
            if marker.payload:
                found.add("MOQT-DATA-OBJECT-STATUS", f"{where}: End of Group status object with a "
                                                     f"{len(marker.payload)}-octet payload")
            after = [o for o in objs if _published_after(o, marker) or o.location.object > marker.location.object]
            if after:
                found.add("KVCS-GROUP-END-OF-GROUP", f"{where}: {[str(o.location) for o in after][:4]} after its End "
                                                     "of Group")
    found.judge()


def _end_of_track(obs: Observation, name: bytes) -> Location | None:
    marks = [o.location for o in obs.live(name) if o.status == ObjectStatus.END_OF_TRACK]
    return marks[0] if len(marks) == 1 else None


@pytest.mark.req("KVCS-GROUP-END-OF-TRACK", "MOQT-SUB-LARGEST-OBJECT")
def test_end_of_track_after_the_last_layer(kvcs_publication: Any) -> None:
    """After the last Group of each data track comes one End of Track status object at {L, 0} (or at {L-1, n}
    past the last block, moqt-d22-profile section 13 #11) and nothing after it; a later SUBSCRIBE_OK's
    LARGEST_OBJECT is that Location or the last object."""
    obs = kvcs_publication
    need_live(obs)
    layers = obs.spec.layers
    found = findings(f"case {obs.case.name}: End of Track does not follow the last layer", "KVCS-GROUP-END-OF-TRACK",
                     "MOQT-SUB-LARGEST-OBJECT")
    for name, objects in _data_live(obs).items():
        blocks = _blocks(obs, name)
        marks = [o for o in objects if o.status == ObjectStatus.END_OF_TRACK]
        where = track_name(name)
        if len(marks) != 1:
            found.add("KVCS-GROUP-END-OF-TRACK", f"{where}: {len(marks)} End of Track status objects, expected one "
                                                 f"after Group {layers - 1}")
            continue
        loc = marks[0].location
        if loc != Location(layers, 0) and not (loc.group == layers - 1 and loc.object >= blocks):
            found.add("KVCS-GROUP-END-OF-TRACK", f"{where}: End of Track at {loc}, expected {{{layers},0}} (or "
                                                 f"{{{layers - 1},n>={blocks}}})")
        after = [o.location for o in objects if _published_after(o, marks[0]) or o.location > loc]
        if after:
            found.add("KVCS-GROUP-END-OF-TRACK", f"{where}: {[str(a) for a in after[:4]]} after End of Track")
        last = Location(layers - 1, blocks - 1)
        for a in obs.answers_for(name, "probe-subscribe"):
            if a.ok and a.largest not in (loc, last):
                found.add("MOQT-SUB-LARGEST-OBJECT", f"{where}: SUBSCRIBE_OK after the end has LARGEST_OBJECT "
                                                     f"{a.largest}, expected {loc} (End of Track) or {last}")
    found.judge()


def _priority(obs: Observation, o: Seen) -> int:
    """The Publisher Priority an object carries (DEFAULT_PRIORITY: the track's DEFAULT_PUBLISHER_PRIORITY)."""
    if o.priority is not None:
        return o.priority
    props = next((a.track_properties for a in obs.answers_for(o.track, "subscribe") if a.ok), ())
    return property_int(props, PropertyType.DEFAULT_PUBLISHER_PRIORITY, 128) or 0


@pytest.mark.req("KVCS-OBJ-PRIORITY")
def test_data_priority_is_floor_128_g_over_l(kvcs_publication: Any) -> None:
    """The objects of Group g carry Publisher Priority floor(128 * g / L) (the cases' layer counts make floor,
    round and ceil differ)."""
    obs = kvcs_publication
    need_live(obs)
    layers = obs.spec.layers
    problems = []
    for name, objects in _data_live(obs).items():
        for o in objects:
            if o.location.group >= layers:
                continue  # End of Track at {L, 0} has no layer
            want = 128 * o.location.group // layers
            got = _priority(obs, o)
            if got != want:
                problems.append(f"{track_name(name)} {o.location}: Publisher Priority {got}, expected floor(128*"
                                f"{o.location.group}/{layers}) = {want}")
                break
    check_no_problems(problems, what=f"case {obs.case.name}: data objects do not carry floor(128*g/L)",
                      req="KVCS-OBJ-PRIORITY")


@pytest.mark.req("KVCS-OBJ-MANIFEST-PRIORITY")
def test_manifest_priority_is_0(kvcs_publication: Any) -> None:
    """Every manifest version carries Publisher Priority 0."""
    obs = kvcs_publication
    need_live(obs)
    manifests = [o for name in (MANIFEST, MANIFEST_COSE) for o in obs.live(name)]
    if not manifests:
        inconclusive(f"case {obs.case.name}: no manifest object arrived live (the manifest-first check judges that)")
    problems = [f"{track_name(o.track)} {o.location}: Publisher Priority {_priority(obs, o)}, expected 0"
                for o in manifests if _priority(obs, o) != 0]
    check_no_problems(problems, what=f"case {obs.case.name}: the manifest track does not use Publisher Priority 0",
                      req="KVCS-OBJ-MANIFEST-PRIORITY")
