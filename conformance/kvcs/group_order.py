"""KVCS-GROUP-ORDER ("all objects of Group g before any of Group g+1", issue 24 item 3), judged two ways: from
the order a publisher opened its streams (what the wire proves, for any publisher) and from the exact order its
session issued its writes (where the harness runs the publisher: `kvconform.targets.kvcs.send_schedule`).
Arrival order across streams is never used: it is the transport's (flow control, priorities, loss)."""

from __future__ import annotations

from kvconform.targets.kvcs.recording_relay import Observation, Seen, track_name
from kvconform.targets.kvcs.send_schedule import ScheduledObject, SendSchedule

__all__ = ["opening_order_problems", "write_order_problems"]


def opening_order_problems(live: dict[bytes, list[Seen]]) -> list[str]:
    """What the wire proves: QUIC numbers a sender's streams in the order it opens them, so an object of Group g
    on a stream opened after one that carried Group g+1 (or later) was published after it. ``live``: each data
    track's live objects by (stream ID, place on the stream)."""
    problems = []
    for name, objects in live.items():
        highest: Seen | None = None
        for o in objects:
            if highest is not None and o.location.group < highest.location.group:
                problems.append(f"{track_name(name)}: {o.location} came on stream {o.stream_id}, opened after "
                                f"stream {highest.stream_id} of Group {highest.location.group}")
                break
            if highest is None or o.location.group > highest.location.group:
                highest = o
    return problems


def write_order_problems(obs: Observation, schedule: SendSchedule) -> list[str]:
    """What the publisher's own send schedule shows: an object of Group g written after any object of a later
    Group of the same track, on the relay's live subscription streams (fills and FETCHes answer requests)."""
    live = {o.stream_id: o.track for t in obs.data_tracks() for o in obs.live(t.name)}
    highest: dict[bytes, ScheduledObject] = {}
    flagged: set[bytes] = set()
    problems = []
    for o in schedule.objects:
        name = live.get(o.stream_id)
        if name is None or name in flagged:
            continue
        top = highest.get(name)
        if top is not None and o.group < top.group:
            flagged.add(name)
            problems.append(f"{track_name(name)}: {{{o.group},{o.object_id}}} was written (write {o.position} of "
                            f"{schedule.writes}, stream {o.stream_id}) after {{{top.group},{top.object_id}}} of "
                            f"Group {top.group} (write {top.position}, stream {top.stream_id})")
        elif top is None or o.group > top.group:
            highest[name] = o
    return problems
