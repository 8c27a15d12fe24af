"""The order of an initiator's one-sided operations, judged from the harness target's end of a userspace wire.

On the emulated fabric a check orders the initiator's posts against the target's read samples step by step. Over
a wire (``kbtp+roce``, ``kbtp+iwarp``: the harness's target in this process, the initiator in another one or in
this one) the target sees only what reaches it: the initiator's requests on its connection, in the order the
responder executes them (their PSN order on IB RC over RoCEv2, the DDP/RDMAP order of the TCP stream on iWARP;
rdma-bindings.md). A read the initiator issues before the previous one completed can be told from outside only if
its request reaches the target before the target's answer to the previous one has left - so the witness *holds*
every answer on the connection for ``hold_s`` (a stage on the fabric's send path, `kvconform.rdma.wire.impair`):
a request that enters the harness while the previous read's answer is still held was issued before that read
completed (it cannot have completed without its answer). One that enters after the answer left was issued at least
``hold_s`` after the previous request reached the target, which an initiator that pipelines its reads does not
wait: that is the bound of the judgement, and the verdict's evidence says so.

Events are numbered in one sequence of the fabric's single-threaded loop (a request entering, an answer leaving),
and tied to the trace steps that processed them, so the comparison needs no clock. Where the witness cannot tie a
request to the moment it entered (it was not installed, or the path gives no trace), the check is inconclusive.

The same stage serves the other direction: on a *harness initiator's* connection to a target in another process it
holds that initiator's output, so the data a target fetches by RDMA Read from it cannot reach the target before the
witness lets it go (test_entry_written_after_data over a wire). `watch_reads` stamps the arrival of the target's
Read Requests, `stamp` places the check's own observations in the same sequence (with the fabric's time, for the
report), and `left_after` tells when the first output held after an event left."""

from __future__ import annotations

import itertools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from kvconform.rdma.wire.impair import Impairer, Impairment

ORDER_HOLD_S = 0.03  # each answer held this long: well under RC's ACK timeout (134 ms), so no retransmission


@dataclass(frozen=True)
class Stamp:
    """A place in the witness's event sequence, and the fabric's time then (for reports; the order is ``seq``)."""

    seq: int
    t: float


@dataclass
class HeldChunk:
    """One chunk of the held output: when it entered the hold, and when it left (None: still held)."""

    entered: Stamp
    left: Stamp | None = None
    produced: int = -1  # the fabric's step when the engine sent it


class _ReadsOf:
    """An engine's memory that also calls ``seen`` when an RDMA Read Request of ``stag`` arrives (the engines note
    "rdma_read-arrive" before they execute it); everything else is the engine's memory."""

    def __init__(self, inner: Any, stag: int, seen: Callable[[], None]) -> None:
        self._inner = inner
        self._stag = stag
        self._seen = seen

    def note(self, what: str, **args: Any) -> None:
        if what == "rdma_read-arrive" and args.get("stag") == self._stag:
            self._seen()
        self._inner.note(what, **args)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


@dataclass(frozen=True)
class Release:
    """When the target's output produced at one trace step left the harness (its last chunk)."""

    seq: int  # in the witness's event sequence
    steps: int  # the fabric's step count then (it left between that step and the next)


class OrderWitness(Impairer):
    """The stage that holds the target's output on connection ``conn`` (its link ``conn>``) for ``hold_s`` and
    records when each request entered and each answer left; every other link keeps ``base``'s behaviour (the
    impairment the run asked for, or none)."""

    def __init__(self, fabric: Any, conn: str, hold_s: float = ORDER_HOLD_S, base: Impairer | None = None) -> None:
        spec = base.spec if base is not None else Impairment()
        super().__init__(spec, fabric.binding, base.salt if base is not None else "")
        self.fabric = fabric
        self.conn = conn
        self.hold_s = hold_s
        self._seq = itertools.count(1)
        self.entered: dict[int, int] = {}  # trace step that processed a chunk from the initiator -> its entry seq
        self.released: dict[int, Release] = {}  # trace step whose output it is -> when that output left
        self._due = 0.0  # the held link's last release time (its chunks leave in order)
        self.held_out: list[HeldChunk] = []  # every chunk of the held output, in order

    # ---- the stage -----------------------------------------------------------------------------------

    def datagram(self, link: str, payload: bytes, deliver: Callable[[bytes], None], now: float) -> None:
        if link == f"{self.conn}>":
            self._hold(link, payload, deliver, now)
        else:
            super().datagram(link, payload, self._entering(link, deliver), now)

    def stream(self, link: str, data: bytes, deliver: Callable[[bytes], None], now: float) -> None:
        if link == f"{self.conn}>":
            self._hold(link, data, deliver, now)
        else:
            super().stream(link, data, self._entering(link, deliver), now)

    def _hold(self, link: str, data: bytes, deliver: Callable[[bytes], None], now: float) -> None:
        """The target's output: it leaves ``hold_s`` from now, in order behind what is already held."""
        produced = self.fabric.steps  # the step whose engine work (or actor) produced it
        n, _ = self._draws(link)
        self._record(link, n, "order-hold")
        self._due = max(self._due, now + self.hold_s)
        held = HeldChunk(self.stamp(), produced=produced)
        self.held_out.append(held)

        def release() -> None:
            left = self.stamp()
            held.left = left
            self.released[produced] = Release(left.seq, self.fabric.steps)
            deliver(data)

        self._push(self._due, link, release)

    def _entering(self, link: str, deliver: Callable[[bytes], None]) -> Callable[[bytes], None]:
        """``deliver`` that ties what the initiator sent to the trace step(s) that processed it; it entered when it
        reached the harness (now), even if the run's impairment delivers it later."""
        if link != f"{self.conn}<":
            return deliver
        seq = next(self._seq)

        def enter(data: bytes) -> None:
            before = self.fabric.steps
            deliver(data)
            for step in range(before + 1, self.fabric.steps + 1):
                self.entered.setdefault(step, seq)

        return enter

    # ---- the judgement's questions -------------------------------------------------------------------

    def stamp(self) -> Stamp:
        """The next place in the event sequence: what happens before this call comes before it."""
        return Stamp(next(self._seq), float(self.fabric.now))

    def watch_reads(self, conn: Any, stag: int) -> list[Stamp] | None:
        """Stamp every RDMA Read Request of ``stag`` (a buffer of the held side) that reaches ``conn``'s engine, from
        now on; the list fills as they arrive. None where the connection has no engine the harness runs."""
        engine = getattr(conn, "engine", None)
        memory = getattr(engine, "memory", None)
        if memory is None:
            return None
        arrived: list[Stamp] = []
        engine.memory = _ReadsOf(memory, stag, lambda: arrived.append(self.stamp()))  # type: ignore[union-attr]
        return arrived

    def left_after(self, event: Stamp) -> Stamp | None:
        """When the first chunk held after ``event`` left the harness (None: none held since, or still held). Chunks
        leave in order, so nothing the held side produced in answer to ``event`` left before that."""
        for held in self.held_out:
            if held.entered.seq > event.seq:
                return held.left
        return None

    def answered_before(self, prev_step: int, nxt_step: int) -> bool | None:
        """Whether the target's answer to the request processed at ``prev_step`` left the harness before the
        request processed at ``nxt_step`` entered it; None when the witness cannot tell (it did not see that
        request enter: it came another way; or of what was sent in between, some left before and some after).

        The answer to the first request is sent at ``prev_step`` or, on a busy host, later: the wire fabric processes
        a round of arrivals (the read and, say, an ACK after it) and then flushes once, from the round's last step.
        Chunks leave in the order they were sent, so when nothing left from ``prev_step`` itself the last chunk sent
        before ``nxt_step`` tells: it left before the next request entered, so did the answer; nothing sent since
        ``prev_step`` left by then, the answer had not either."""
        entered = self.entered.get(nxt_step)
        if entered is None:
            return None
        left = self.released.get(prev_step)
        if left is not None:
            return left.seq < entered
        span = [h for h in self.held_out if prev_step <= h.produced < nxt_step]
        if span and span[-1].left is not None and span[-1].left.seq < entered:
            return True
        if all(h.left is None or h.left.seq > entered for h in span):
            return False
        return None


def install(fabric: Any, conn: str, hold_s: float = ORDER_HOLD_S) -> OrderWitness | None:
    """Put the witness on ``fabric``'s links for the target's connection ``conn``; None where the fabric has no
    send path the harness owns (the emulated fabric orders by its own steps; a verbs device sends by itself)."""
    if getattr(fabric, "owns_races", True) or not hasattr(fabric, "impairer") \
            or not getattr(fabric, "crafts_frames", True):
        return None
    witness = OrderWitness(fabric, conn, hold_s, fabric.impairer)
    fabric.impairer = witness
    return witness
