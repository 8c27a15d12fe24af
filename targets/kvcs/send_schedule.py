"""The send schedule of a publisher the harness runs in its own process (issue 24 item 3, KVCS-GROUP-ORDER).

The MOQT session of an in-process publisher reports every command it issues to the session tap
(`kvconform.moqt.quic.tapping`), in the order the publisher issued it: that is the publisher's own order of
writes, before any QUIC scheduling, flow control or loss. ``ScheduleRecorder.tap`` keeps the ``WriteStream``
commands of unidirectional (data) streams; ``snapshot()`` parses each stream's bytes as they were written and
names, for every object, the position of the write that completed it. Two objects completed by writes i < j
were written in that order; objects completed by one write were written together (in stream order).

A publisher in another process has no tap: the harness sees only the wire, where the order across streams is
the transport's (flow control, priorities, loss) and proves nothing about the order of writes.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

from kvconform.moqt.data import DataStreamParser, SubgroupHeader, SubgroupObject
from kvconform.moqt.errors import MoqtDecodeError
from kvconform.moqt.session import WriteStream

__all__ = ["ScheduleRecorder", "ScheduledObject", "SendSchedule", "ShowsSchedule"]


@dataclass(frozen=True)
class ScheduledObject:
    """One object of a subgroup stream and the position (0, 1, ...) of the write that completed it."""

    position: int
    stream_id: int
    group: int
    object_id: int
    status: int


@dataclass(frozen=True)
class SendSchedule:
    """Every object the publisher wrote on its subgroup streams, in write order; ``undecodable``: streams whose
    bytes did not parse (their objects from the failing write on are not listed)."""

    objects: tuple[ScheduledObject, ...]
    writes: int
    undecodable: dict[int, str] = field(default_factory=dict)


class ScheduleRecorder:
    """Records the data-stream writes of the first MOQT session made inside ``quic.tapping(recorder.tap)``."""

    def __init__(self) -> None:
        self._lock = threading.Lock()  # the tap runs on the publisher's thread, snapshot on the harness's
        self._session: object | None = None
        self._writes: list[tuple[int, bytes]] = []

    def tap(self, protocol: object, direction: str, item: object) -> None:
        """The session tap: keeps the ``WriteStream`` commands of unidirectional streams, in issue order."""
        if direction != "sent" or not isinstance(item, WriteStream) or not item.stream_id & 0x2:
            return
        with self._lock:
            if self._session is None:
                self._session = protocol
            if protocol is self._session and item.data:
                self._writes.append((item.stream_id, bytes(item.data)))

    def snapshot(self) -> SendSchedule:
        """The objects written so far, each with the position of the write that completed it."""
        with self._lock:
            writes = list(self._writes)
        parsers: dict[int, DataStreamParser] = {}
        undecodable: dict[int, str] = {}
        objects: list[ScheduledObject] = []
        for position, (sid, data) in enumerate(writes):
            if sid in undecodable:
                continue
            parser = parsers.setdefault(sid, DataStreamParser())
            try:
                events = parser.feed(data)
            except MoqtDecodeError as exc:
                undecodable[sid] = str(exc)
                continue
            if not isinstance(parser.header, SubgroupHeader):
                continue  # a fetch or fill stream answers a request: not the order of publication
            objects += [ScheduledObject(position, sid, e.group_id, e.object_id, e.status) for e in events
                        if isinstance(e, SubgroupObject)]
        return SendSchedule(tuple(objects), len(writes), undecodable)


@runtime_checkable
class ShowsSchedule(Protocol):
    """A publisher driver that can show the harness its send schedule (an in-process publisher)."""

    def send_schedule(self) -> SendSchedule:
        ...
