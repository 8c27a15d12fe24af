"""One seeded run of MOQT endpoints on the deterministic transport, and its transcript (issue 24 item 3).

`simulate(main, scheduler, faults)` makes a `VirtualClockLoop` with a `SimNetwork` attached, runs ``main(sim)``
on it (relay, publisher, subscribers: the ordinary `kvconform.moqt` classes, in one process and one loop) and
returns a `SimResult`: the outcome, the schedule (the datagram labels in delivery order) and the *transcript*.

The transcript is the ordered list of ``(virtual time, endpoint, direction, what, digest)`` for every MOQT session
command an endpoint issued and every session event it observed (the adapter's tap, `kvconform.moqt.quic.tapping`):
``what`` is the command or event class, ``digest`` the first 12 hex digits of SHA-256 over the bytes written (for
stream writes and datagrams) or over the event's ``repr``. Endpoints are the network's labels (``pub``, ``sub1``;
the relay's side of a connection is ``relay[<peer>]``). QUIC packets are not in it: aioquic encrypts with random
keys, so packet bytes differ between runs while everything the endpoints say and see does not.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any

from kvconform.moqt import quic
from kvconform.moqt.session import SendDatagram, WriteStream
from kvconform.moqt.simclock import VirtualClockLoop, VirtualDeadlock, run_virtual
from kvconform.moqt.simnet import Faults, SimNetwork, SimTransport
from kvconform.rdma.scheduler import FifoScheduler, ScheduleError, Scheduler

__all__ = ["Sim", "SimResult", "TranscriptEntry", "simulate"]

TranscriptEntry = tuple[float, str, str, str, str]


@dataclass(slots=True)
class Sim:
    """What a scenario gets: the loop (its clock), the network (to name endpoints) and the transcript so far."""

    loop: VirtualClockLoop
    net: SimNetwork
    transcript: list[TranscriptEntry] = field(default_factory=list)

    def name_next(self, label: str) -> None:
        """The next endpoint bound on the network (a client's socket, a relay's) is called ``label``."""
        self.net.name(("127.0.0.1", self.net._next_port), label)

    def now(self) -> float:
        return self.loop.time()

    def tap(self, protocol: quic.MoqtProtocol, direction: str, item: object) -> None:
        if isinstance(item, WriteStream):
            what, blob = f"WriteStream s{item.stream_id}{' fin' if item.end_stream else ''}", bytes(item.data)
        elif isinstance(item, SendDatagram):
            what, blob = "SendDatagram", bytes(item.data)
        else:
            what, blob = type(item).__name__, repr(item).encode()
        digest = hashlib.sha256(blob).hexdigest()[:12]
        self.transcript.append((round(self.loop.time(), 9), self._endpoint(protocol), direction, what, digest))

    def _endpoint(self, protocol: quic.MoqtProtocol) -> str:
        transport = getattr(protocol, "_transport", None)
        if isinstance(transport, SimTransport) and transport.remote is not None:
            return self.net.label_of(transport.local)  # a client's connected socket
        paths = getattr(getattr(protocol, "_quic", None), "_network_paths", None) or []
        peer = paths[0].addr if paths else ("?", 0)
        local = transport.local if isinstance(transport, SimTransport) else ("?", 0)
        return f"{self.net.label_of(local)}[{self.net.label_of((str(peer[0]), int(peer[1])))}]"


@dataclass(frozen=True, slots=True)
class SimResult:
    """One run: ``ok`` and ``outcome`` (the scenario's value, or the failure), schedule, transcript, clock."""

    ok: bool
    outcome: str
    value: object
    schedule: tuple[str, ...]
    transcript: tuple[TranscriptEntry, ...]
    virtual_seconds: float
    stats: dict[str, int]

    def transcript_digest(self) -> str:
        """SHA-256 over the transcript lines: equal digests = byte-identical transcripts."""
        h = hashlib.sha256()
        for entry in self.transcript:
            h.update(repr(entry).encode() + b"\n")
        return h.hexdigest()

    def transcript_text(self) -> str:
        return "\n".join(f"{t:12.6f} {who:<20} {d:<8} {what} {digest}" for t, who, d, what, digest in self.transcript)


Main = Callable[[Sim], Coroutine[Any, Any, object]]


def simulate(main: Main, scheduler: Scheduler | None = None, faults: Faults | None = None) -> SimResult:
    """Run ``main(sim)`` on a fresh virtual loop and network; a failure (an ``AssertionError`` of the scenario, an
    exception, a deadlock, a schedule script that cannot be followed) is reported in the result, not raised."""
    holder: list[Sim] = []

    async def run(loop: VirtualClockLoop) -> object:
        net = SimNetwork(loop, scheduler or FifoScheduler(), faults or Faults())
        loop.network = net
        sim = Sim(loop, net)
        holder.append(sim)
        with quic.tapping(sim.tap):
            return await main(sim)

    ok, value = False, None
    try:
        value = run_virtual(run)
        outcome, ok = repr(value), True
    except AssertionError as exc:
        outcome = f"check: {exc}"
    except ScheduleError as exc:
        outcome = f"schedule: {exc}"
    except VirtualDeadlock as exc:
        outcome = f"deadlock: {exc}"
    except Exception as exc:  # any exception of the code under test is this run's outcome
        outcome = f"raised: {type(exc).__name__}: {exc}"
    if not holder:
        return SimResult(False, outcome, None, (), (), 0.0, {})
    sim = holder[0]
    if sim.net.error is not None:
        ok, outcome = False, f"schedule: {sim.net.error}"
    s = sim.net.stats
    stats = {"sent": s.sent, "delivered": s.delivered, "dropped": s.dropped, "duplicated": s.duplicated,
             "reordered": s.reordered, "interleaved": s.interleaved}
    return SimResult(ok, outcome, value, tuple(sim.net.schedule), tuple(sim.transcript), sim.loop.time(), stats)
