"""Incremental parsers fed the same stream whole and in pieces: both must tell the same story.

A stream arrives in whatever pieces the transport hands over, so an incremental parser's events and its
first error may not depend on where the stream was cut.  The cut points come from a seed byte of the
fuzz input itself, so a finding replays from its bytes alone.
"""

from __future__ import annotations

import itertools
import random
from collections.abc import Callable, Sequence
from typing import Protocol

from kvconform.fuzz.target import OracleError
from kvconform.moqt.errors import MoqtDecodeError

__all__ = ["StreamParser", "feed_compare", "split_points"]


class StreamParser(Protocol):
    """What ControlStreamParser and DataStreamParser share: feed pieces, then the end of the stream."""

    def feed(self, data: bytes) -> Sequence[object]: ...

    def end_of_stream(self) -> None: ...


def split_points(seed: int, length: int) -> list[int]:
    """Cut offsets in 1..length-1 (ascending), piece sizes from 1 octet to a few hundred."""
    rng = random.Random(seed)
    cuts: list[int] = []
    at = 0
    while True:
        at += rng.randint(1, rng.choice((1, 3, 16, 300)))
        if at >= length:
            return cuts
        cuts.append(at)


def _run(parser: StreamParser, pieces: Sequence[bytes]) -> tuple[list[object], MoqtDecodeError | None]:
    events: list[object] = []
    try:
        for piece in pieces:
            events.extend(parser.feed(piece))
        parser.end_of_stream()
    except MoqtDecodeError as exc:
        return events, exc
    return events, None


def _first_difference(a: Sequence[object], b: Sequence[object]) -> int:
    for i, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y:
            return i
    return min(len(a), len(b))


def feed_compare(make: Callable[[], StreamParser], stream: bytes, seed: int) -> list[object]:
    """The events of ``stream`` fed whole; OracleError if feeding it in pieces gives other events or
    another first error (field, offset, close code); the whole feed's MoqtDecodeError is re-raised."""
    whole_events, whole_error = _run(make(), [stream])
    cuts = [0, *split_points(seed, len(stream)), len(stream)]
    split_events, split_error = _run(make(), [stream[a:b] for a, b in itertools.pairwise(cuts)])

    def key(exc: MoqtDecodeError | None) -> tuple[str, int, int] | None:
        return None if exc is None else (exc.field, exc.offset, int(exc.code))

    if key(whole_error) != key(split_error):
        raise OracleError(f"fed whole: {whole_error or 'no error'}; fed in pieces cut at {cuts[1:-1]}: "
                          f"{split_error or 'no error'}")
    if whole_error is None and whole_events != split_events:
        raise OracleError(f"fed whole: {len(whole_events)} events; in pieces cut at {cuts[1:-1]}: "
                          f"{len(split_events)} events, the first difference at event "
                          f"{_first_difference(whole_events, split_events)}")
    if whole_error is not None:
        raise whole_error
    return whole_events
