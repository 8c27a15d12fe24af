"""What one selected data track delivered to the reference KVCS consumer in one attempt, and what follows from it
(the text's "Consumer Procedures", completion and recovery; issue 24 item 1: part of the consumer's sans-I/O core).

``Delivery`` is the plain state of the track's SUBSCRIBE or FETCH as the session reported it so far (the asyncio
adapter refreshes it from its request handle before each step of the core); ``TrackState`` adds what the consumer
made of it (payloads, verified Data, rejections, End of Group / End of Range) and answers whether a Location will
never come, and why.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from kvconform.kvcs.tracks import DataTrack
from kvconform.moqt.data import ObjectStatus
from kvconform.moqt.messages import PublishDone
from kvconform.moqt.session import UNKNOWN_STREAM_COUNT
from kvconform.moqt.structures import Location

if TYPE_CHECKING:
    from kvconform.moqt.client import ReceivedObject

__all__ = ["Delivery", "Needed", "TrackState"]


@dataclass
class Needed:
    """One selected data track of one used segment, and how many of its blocks are needed."""

    segment: int
    track: DataTrack
    blocks: int


@dataclass
class Delivery:
    """A SUBSCRIBE's or FETCH's state: its objects in arrival order, its data streams ("open", "fin", "reset"), the
    fill/subscription boundary (LARGEST_OBJECT), PUBLISH_DONE (or the request ending without it), and for a FETCH
    whether its data stream ended and why it was refused."""

    fetch: bool
    objects: list[ReceivedObject] = field(default_factory=list)
    fills: dict[int, str] = field(default_factory=dict)
    subgroup_streams: dict[int, str] = field(default_factory=dict)
    largest: Location | None = None
    done: PublishDone | None = None
    done_failed: bool = False  # the request ended without PUBLISH_DONE
    stream_ended: bool = False  # a FETCH's data stream ended (FIN or reset)
    refused: str | None = None  # a FETCH answered with anything but FETCH_OK

    def streams_seen(self) -> int:
        return len(self.fills) + len(self.subgroup_streams)


class TrackState:
    """What one data track delivered in one attempt."""

    def __init__(self, needed: Needed) -> None:
        self.needed = needed
        self.delivery: Delivery | None = None
        self.processed = 0  # objects of the delivery already looked at
        self.payloads: dict[Location, bytes] = {}
        self.data: dict[Location, bytes] = {}
        self.digests: dict[Location, bytes] = {}
        self.lost: dict[Location, str] = {}
        self.group_end: dict[int, int] = {}
        self.gaps: list[tuple[Location, Location]] = []  # End of Range spans (inclusive)
        self.last_on_stream: dict[int, Location] = {}
        self.recovered: set[Location] = set()  # Data from recover_block, not from the publication
        self.malformed: str | None = None
        self.failed: str | None = None  # the request was refused or the session ended
        self.excess = 0
        self.violations: list[str] = []
        self.touched: set[int] = set()  # groups (layers) with any Object received or lost

    @property
    def name(self) -> str:
        return str(self.needed.track)

    def ended(self) -> bool:
        """No more Objects can come: fetch stream ended, or End of Track / PUBLISH_DONE with streams closed."""
        d = self.delivery
        if self.failed is not None:
            return True
        if d is None:
            return False
        if d.fetch:
            return d.stream_ended
        if d.largest is not None and not d.fills:
            return False  # the fill of everything up to Largest Object has not even started
        if "open" in d.fills.values() or "open" in d.subgroup_streams.values():
            return False
        if d.done is not None:
            count = d.done.stream_count
            return count == UNKNOWN_STREAM_COUNT or d.streams_seen() >= count
        if d.done_failed:
            return True
        return self._groups_closed_by_end_of_track(d)

    def _groups_closed_by_end_of_track(self, d: Delivery) -> bool:
        """End of Track seen (before PUBLISH_DONE) and every Group below it accounted for: its End of Group
        arrived, or it lies wholly below Largest Object and the fill ended. End of Track can arrive before
        the streams of earlier Groups open (it has its own stream and priority), so alone it ends nothing."""
        ends = [o.location for o in d.objects if o.status == ObjectStatus.END_OF_TRACK]
        if not ends:
            return False
        below = d.largest.group if d.largest is not None and self.fill_done() else 0
        return all(g in self.group_end or g < below for g in range(min(ends).group))

    def fill_done(self) -> bool:
        """The fill fetch stream ended (FIN or reset): below Largest Object nothing more can come."""
        d = self.delivery
        return d is not None and not d.fetch and bool(d.fills) and "open" not in d.fills.values()

    def missing_reason(self, loc: Location) -> str | None:
        """Why a not-received Location will never come, or None while it still may."""
        if any(a <= loc <= b for a, b in self.gaps):
            return f"{self.name} {loc}: reported as an End of Range (missing)"
        end = self.group_end.get(loc.group)
        if end is not None and loc.object >= end:
            return f"{self.name} {loc}: past End of Group at object {end}"
        d = self.delivery
        if self.ended():
            return f"{self.name} {loc}: never delivered (the track or fetch ended)"
        if d is not None and not d.fetch:
            largest = d.largest
            if self.fill_done() and largest is not None and loc <= largest:
                how = "reset" if "reset" in d.fills.values() else "ended"
                return f"{self.name} {loc}: at or below Largest Object {largest}, and the fill {how} without it"
        return None
