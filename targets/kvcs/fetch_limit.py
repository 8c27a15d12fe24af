"""kvcs-publisher: the declared-limits scenario (KVCS "Security Considerations": "publishers SHOULD limit the
number of concurrent fetches per subscriber"; PICS ``kvcs.publisher.fetch_limit``).

What "concurrent" means on the wire: a FETCH is in progress at the publisher from its arrival until its outcome
is final, REQUEST_ERROR, or its data stream ended (FIN or RESET_STREAM). FETCH_OK alone ends nothing: the
objects still have to go out. The harness holds fetches in progress in the one way a correct publisher cannot
read as anything else: QUIC flow control. Its relay grants every unidirectional stream the publisher opens
``WINDOW`` octets (less than one object of the cache) and, while it holds, never raises the credit of a fetch
stream; every other stream gets credit as usual (aioquic doubles it as data arrives). A held fetch stream cannot
end with FIN, so the fetches that started stay in progress until the harness releases the credit; nothing is
cancelled, stopped or left unread.

``observe_fetch_limit(driver, seed, limit)`` publishes ``CASE`` to that relay (the recording relay of
``harness.py``), then, once the publication is complete, on the publisher's one session:

1. sends ``limit`` FETCHes of whole data tracks (from {0,0}, Ascending) and waits (bounded) until each started
   (FETCH_OK or its data stream opened) or was refused, or until nothing happened for ``SETTLE`` seconds (a
   publisher that serves them one at a time leaves the others waiting: that is a limit too);
2. sends one FETCH more (``--sweep wide``: three more) and waits the same way;
3. releases the credit and waits (bounded) until every fetch ended.

Every answer and stream event is stamped with the relay's event sequence number and whether it came while the
harness held, so the check can count the fetches in progress when each one started or was refused.
"""

from __future__ import annotations

import contextlib
import functools
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from kvconform import sweep
from kvconform.kvcs.tracks import MANIFEST, MANIFEST_COSE
from kvconform.moqt.data import GroupOrder
from kvconform.moqt.filters import LocationFilter
from kvconform.moqt.messages import FetchOk, RequestError
from kvconform.moqt.parameters import Parameters
from kvconform.moqt.quic import LoopThread, MoqtConnection
from kvconform.moqt.relay import Peer
from kvconform.moqt.session import DataStreamEnded, DataStreamOpened, Event, MessageReceived
from kvconform.moqt.structures import ParamType
from kvconform.targets.kvcs.publisher import PublisherDriver, PublisherExit
from kvconform.targets.kvcs.recording_relay import (
    Answer,
    Case,
    RecordingRelay,
    _wait_publication,
    publishing,
)
from kvconform.verdicts import HarnessBug

__all__ = ["CASE", "WINDOW", "FetchProbe", "LimitObservation", "observe_fetch_limit"]

# 2 layers x 2 blocks, k, v (and kv): every data track is 4 objects of > 128 octets, so no fetch of one fits in
# WINDOW and the publication itself is small and quick.
CASE = Case("fetch-limit", layers=2, blocks=2)
WINDOW = 64  # octets of flow-control credit per publisher-opened uni stream (a FETCH_HEADER fits, an object not)
SETTLE = 1.0  # seconds without any event after which a phase's unanswered fetches count as waiting
PHASE_TIMEOUT = 5.0  # seconds a phase waits at most
RELEASE_TIMEOUT = 10.0  # seconds for every fetch to end once the credit is released
STEP = 0.1  # seconds of one bounded wait for relay events
LIMIT = "limit-fetch"  # Answer.kind of the scenario's fetches


@dataclass
class FetchProbe:
    """One of the scenario's FETCHes: its answer, and when (relay event seq) it started, was refused, ended."""

    answer: Answer
    sent: int  # seq when sent
    started: int | None = None  # FETCH_OK or its data stream opened
    started_held: bool = False  # ... while the harness held the credit
    refused: int | None = None  # REQUEST_ERROR
    refused_held: bool = False
    ended: int | None = None  # its data stream ended (FIN or reset)
    ended_held: bool = False


@dataclass
class LimitObservation:
    """What ``observe_fetch_limit`` saw (see the module docstring)."""

    limit: int
    extra: int  # how many FETCHes over the limit were sent
    complete: bool  # the publication was complete before the fetches were sent
    tracks: list[bytes]
    probes: list[FetchProbe]
    released: int | None  # seq when the credit was released
    exit: PublisherExit
    notes: list[str] = field(default_factory=list)

    def in_progress_at(self, seq: int, other_than: FetchProbe) -> int:
        """How many of the other fetches had started and not ended (nor been refused) at ``seq``."""
        return sum(1 for p in self.probes if p is not other_than and p.started is not None and p.started < seq
                   and (p.ended is None or p.ended > seq) and (p.refused is None or p.refused > seq))

    def summary(self) -> dict[str, Any]:
        return {"limit": self.limit, "extra": self.extra, "complete": self.complete, "released": self.released,
                "notes": self.notes,
                "fetches": [{"track": p.answer.track.decode("ascii", "replace"), "sent": p.sent,
                             "started": p.started, "started_held": p.started_held, "refused": p.refused,
                             "error_code": p.answer.error_code, "ended": p.ended,
                             "streams": p.answer.data_streams, "publisher_exit": self.exit.code}
                            for p in self.probes]}


class HoldingRelay(RecordingRelay):
    """The recording relay, able to withhold flow-control credit from the publisher's fetch streams."""

    def __init__(self, **options: Any) -> None:
        super().__init__(**options)
        self.holding = False
        self.probes: dict[int, FetchProbe] = {}  # request stream id -> probe
        self.connections: list[MoqtConnection] = []

    async def _serve_peer(self, conn: Any) -> None:
        quic = conn._protocol._quic
        session = conn.session
        original = quic._write_stream_limits

        def limits(*, builder: Any, space: Any, stream: Any) -> None:
            sid = stream.stream_id
            if self.holding and sid & 0x3 == 0x2:  # a uni stream the publisher (the QUIC client) opened
                st = session._in.get(sid)
                if st is None or st.kind in ("", "fetch"):
                    return  # a fetch stream (or one whose kind is not known yet): no more credit
            original(builder=builder, space=space, stream=stream)

        quic._write_stream_limits = limits
        self.connections.append(conn)
        await super()._serve_peer(conn)

    def _record(self, peer: Peer, event: Event) -> None:
        super()._record(peer, event)
        request = getattr(event, "request", None)
        probe = self.probes.get(request.stream_id) if request is not None and request.local else None
        if probe is None:
            return
        if (isinstance(event, MessageReceived) and isinstance(event.message, FetchOk)) or \
                isinstance(event, DataStreamOpened):
            if probe.started is None:
                probe.started, probe.started_held = self.seq, self.holding
        elif isinstance(event, MessageReceived) and isinstance(event.message, RequestError):
            if probe.refused is None:
                probe.refused, probe.refused_held = self.seq, self.holding
        elif isinstance(event, DataStreamEnded) and probe.ended is None:
            probe.ended, probe.ended_held = self.seq, self.holding

    def send_fetch(self, name: bytes) -> FetchProbe | None:
        if self.source is None or self.source_ns is None or self.source.gone:
            return None
        req = self.source.session.fetch(self.source_ns, name, Parameters.of(
            (ParamType.LOCATION_FILTER, LocationFilter.absolute_start(0, 0)),
            (ParamType.GROUP_ORDER, GroupOrder.ASCENDING)))
        ans = Answer(name, LIMIT, req.stream_id, self._tick())
        self.answers[req.stream_id] = ans
        probe = self.probes[req.stream_id] = FetchProbe(ans, ans.seq)
        return probe

    def release(self) -> int:
        self.holding = False
        for conn in self.connections:
            with contextlib.suppress(Exception):
                conn._protocol.transmit()  # the withheld MAX_STREAM_DATA frames go out now
        return self._tick()


def observe_fetch_limit(driver: PublisherDriver, seed: int, limit: int, *,
                        log: Callable[[str], None] | None = None) -> LimitObservation:
    """Run the scenario (see the module docstring); always stops the publisher and the relay."""
    with publishing(CASE, driver, seed, relay_class=HoldingRelay, stream_data_uni=WINDOW) as run:
        relay = run.relay
        if not isinstance(relay, HoldingRelay):
            raise HarnessBug(f"the fetch-limit scenario got a {type(relay).__name__}, not a HoldingRelay")
        complete = _wait_publication(run.thread, relay, driver, run.spec, run.keys, run.notes)
        obs = _drive(run.thread, relay, limit, complete, run.notes)
    obs.exit = run.exit
    if log is not None:
        log(f"fetch-limit: {obs.summary()}")
    return obs


def _drive(thread: LoopThread, relay: HoldingRelay, limit: int, complete: bool, notes: list[str]) -> LimitObservation:
    tracks = sorted({a.track for a in relay.answers.values() if a.kind == "subscribe" and a.ok
                     and a.track not in (MANIFEST, MANIFEST_COSE)})
    extra = max(sweep.pick([1], [3]))  # N + 1 is the boundary; a wide sweep presses past it
    obs = LimitObservation(limit, extra, complete, tracks, [], None, PublisherExit(None, "", ""), notes)
    if not complete or not tracks:
        notes.append(f"no complete publication to fetch from (data tracks served: {len(tracks)})")
        return obs

    async def hold() -> None:
        relay.holding = True

    def send(count: int) -> list[FetchProbe]:
        async def run() -> list[FetchProbe]:
            start = len(obs.probes)
            return [p for i in range(count) for p in (relay.send_fetch(tracks[(start + i) % len(tracks)]),)
                    if p is not None]
        return thread.run(run(), 5.0)

    thread.run(hold(), 5.0)
    for count in (limit, extra):  # the declared limit's worth, then more
        batch = send(count)
        obs.probes.extend(batch)
        _wait(thread, relay, functools.partial(_answered, batch), SETTLE, PHASE_TIMEOUT)

    async def release() -> int:
        return relay.release()

    obs.released = thread.run(release(), 5.0)
    if not _wait(thread, relay, lambda: all(p.refused is not None or p.ended is not None for p in obs.probes),
                 None, RELEASE_TIMEOUT):
        notes.append(f"not every fetch ended within {RELEASE_TIMEOUT} s of the release")
    return obs


def _answered(batch: list[FetchProbe]) -> bool:
    return all(p.started is not None or p.refused is not None for p in batch)


def _wait(thread: LoopThread, relay: HoldingRelay, done: Callable[[], bool], quiet: float | None,
          timeout: float) -> bool:
    """Until ``done()``, or ``quiet`` seconds without a relay event, or ``timeout``; whether ``done()``."""
    deadline = time.monotonic() + timeout
    while not done():
        now = time.monotonic()
        if now > deadline or (quiet is not None and now - relay.last_change > quiet):
            return False
        thread.run(relay.wait_change(STEP), STEP + 2.0)
    return True
