"""KVCS-GROUP-ORDER from the publisher's send schedule (issue 24 item 3): the session tap of an in-process publisher
gives every write in the order the publisher issued it; a publisher in another process is judged on the order it
opened its streams only. The interleaving mutant opens its streams in layer order, so only the schedule shows it."""

from __future__ import annotations

from kvconform.conformance.kvcs.group_order import opening_order_problems, write_order_problems
from kvconform.kvcs.publisher import KvcsPublisher
from kvconform.moqt.data import ObjectStatus, SubgroupHeader, SubgroupObject, SubgroupStreamWriter
from kvconform.moqt.session import WriteStream
from kvconform.targets.kvcs.publisher import InProcessPublisher
from kvconform.targets.kvcs.recording_relay import CASES, Observation, Seen, observe
from kvconform.targets.kvcs.send_schedule import ScheduleRecorder
from tests.mutants.kvcs.publisher import InterleavedGroupsPublisher

SEED = 2412


def _live(obs: Observation) -> dict[bytes, list[Seen]]:
    return {t.name: sorted(obs.live(t.name), key=lambda o: (o.stream_id, o.seq)) for t in obs.data_tracks()}


def test_the_recorder_names_the_write_that_completed_each_object_whatever_the_write_sizes() -> None:
    rec = ScheduleRecorder()
    a = SubgroupStreamWriter(SubgroupHeader.build(1, 0, 0, 0, first_object=True))
    b = SubgroupStreamWriter(SubgroupHeader.build(1, 1, 0, 0, first_object=True))
    first = a.header() + a.object(SubgroupObject(0, b"x" * 10))
    rec.tap("pub", "sent", WriteStream(2, first[:-3]))  # an object split across two writes
    rec.tap("pub", "sent", WriteStream(6, b.header() + b.object(SubgroupObject(0, b"y"))))
    rec.tap("pub", "sent", WriteStream(2, first[-3:]))
    rec.tap("pub", "sent", WriteStream(2, a.object(SubgroupObject(1, status=ObjectStatus.END_OF_GROUP)), True))
    rec.tap("pub", "sent", WriteStream(0, b"control"))  # a bidirectional stream: not data
    rec.tap("pub", "received", WriteStream(10, b"whatever"))
    rec.tap("another session", "sent", WriteStream(14, b"\x00"))
    schedule = rec.snapshot()
    assert [(o.position, o.stream_id, o.group, o.object_id) for o in schedule.objects] == [
        (1, 6, 1, 0), (2, 2, 0, 0), (3, 2, 0, 1)]
    assert schedule.writes == 4 and not schedule.undecodable


def test_interleaved_groups_pass_on_the_wire_and_fail_on_the_send_schedule() -> None:
    obs = observe(CASES["segmented"], InProcessPublisher(InterleavedGroupsPublisher), SEED)
    assert obs.complete and obs.schedule is not None
    assert opening_order_problems(_live(obs)) == [], "the streams open in layer order: the wire shows nothing"
    problems = write_order_problems(obs, obs.schedule)
    assert len(problems) == 4 and all("after {1,0} of Group 1" in p for p in problems), problems


def test_the_reference_is_in_layer_order_on_both() -> None:
    obs = observe(CASES["segmented"], InProcessPublisher(KvcsPublisher), SEED)
    assert obs.complete and obs.schedule is not None
    assert len(obs.schedule.objects) > 2 * 10 * 3
    assert opening_order_problems(_live(obs)) == [] and write_order_problems(obs, obs.schedule) == []
