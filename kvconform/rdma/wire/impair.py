"""A seeded, replayable impairment stage for the harness's own wire links (issue 23, item 5).

``--impair loss=0.01,reorder=0.01,dup=0.01,delay=5ms,seed=S`` (`Impairment.parse`) puts it between a
`WireFabric`'s engines and its sockets, in both directions: what the fabric sends, and what it receives from a
peer in another process (a packet between two ends of the same fabric is impaired once, where it is sent).

What each fault means depends on the binding (rdma-bindings.md):

- **RoCEv2** (IB RC over UDP, §4): every datagram is lost (``loss``), duplicated (``dup``), held back behind the
  packets after it (``reorder``: for ``hold`` plus up to ``hold`` more) or delayed (``delay``: every datagram,
  so order is kept) - exactly what an Ethernet path does to RC, and what RC recovers from by itself: go-back-N on
  ACK timeout or PSN sequence error NAK within ``retry_cnt`` (§4.6), duplicates re-ACKed, READs re-executed and
  atomics answered from the responder's saved result.
- **iWARP** (MPA/DDP/RDMAP over TCP, §3): "TCP provides reliability" (§3.5): no datagram is ever lost,
  duplicated or reordered *above* TCP, so an RNIC cannot see those faults, only what TCP makes of them - the byte
  stream stalls. A lost segment stalls the stream (and everything behind it) for a retransmission timeout
  (``rto``, Linux's floor of 200 ms by default), a reordered one for a fast retransmit (``hold``), a duplicate is
  discarded by TCP (recorded, no effect); ``delay`` delays the stream in order, and ``split`` cuts a chunk of the
  stream at a random octet (TCP "may split or merge FPDUs arbitrarily", §3.5: the MPA reassembler's job), while
  chunks that come due together are written as one (coalescing).

Every decision is drawn from a random generator per link (a connection's direction), seeded from ``seed`` and
the link's name, with the same number of draws per packet, so the n-th packet of a link meets the same fate in
every run with that seed: the run replays. Every decision that is not "pass" is recorded (`Impairer.log`) with
its link and packet number, and `Impairer.summary` counts them all. Delays are timers of the fabric's event
loop (`next_deadline` / `poll`), never sleeps, and each is bounded by ``delay + hold`` or ``rto``.
"""

from __future__ import annotations

import heapq
import itertools
import random
import re
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field, fields
from typing import Any

LOG_LIMIT = 10_000  # decisions kept verbatim; the summary counts every one
SPLIT_GAP_S = 0.001  # between the two pieces of a cut chunk: the peer reads the first before the second comes
MAX_DELAY_S = 10.0  # a delay or timeout beyond this is a typo, not an impairment (every wait stays bounded)
# The kernel's devices build their own packets, out of this stage's reach: a testbed that puts `tc netem` on their
# interfaces says so in this variable of the run's environment, and coverage.json's meta records it ("netem")
# beside the seed (kvconform.testbeds.rdma_vm.netem)
NETEM_ENV = "KVCONFORM_NETEM"
# The grid of issue 23 item 5, each point alone and together: the userspace links' (tests/kbtp/test_impair_grid.py)
# and the testbed VM's netem (testbeds/rdma_vm/netem.py)
GRID = {
    "loss": "loss=0.01",
    "reorder": "reorder=0.01",
    "dup": "dup=0.01",
    "delay": "delay=5ms",
    "together": "loss=0.01,reorder=0.01,dup=0.01,delay=5ms",
}


class ImpairmentError(ValueError):
    """An ``--impair`` specification that cannot be used."""


def _fraction(name: str, text: str) -> float:
    try:
        value = float(text[:-1]) / 100 if text.endswith("%") else float(text)
    except ValueError:
        raise ImpairmentError(f"--impair {name}={text}: a probability (0.01 or 1%) is expected") from None
    if not 0.0 <= value <= 1.0:
        raise ImpairmentError(f"--impair {name}={text}: a probability between 0 and 1 is expected")
    return value


def _duration(name: str, text: str) -> float:
    m = re.fullmatch(r"([0-9]*\.?[0-9]+)\s*(us|ms|s)?", text.strip())
    if m is None:
        raise ImpairmentError(f"--impair {name}={text}: a duration (5ms, 0.005s, 200us) is expected")
    value = float(m.group(1)) * {"us": 1e-6, "ms": 1e-3, "s": 1.0, None: 1e-3}[m.group(2)]
    if value > MAX_DELAY_S:
        raise ImpairmentError(f"--impair {name}={text}: at most {MAX_DELAY_S:g} s")
    return value


@dataclass(frozen=True)
class Impairment:
    """What the stage does (see the module docstring); all zero: nothing."""

    loss: float = 0.0
    reorder: float = 0.0
    dup: float = 0.0
    delay: float = 0.0  # seconds, every packet / the whole stream
    split: float = 0.0  # iWARP: probability that a chunk of the stream is cut in two
    hold: float = 0.002  # seconds a reordered datagram waits (up to twice that); iWARP: a fast retransmit's stall
    rto: float = 0.2  # iWARP: the stall a lost TCP segment costs
    seed: int = 0

    @classmethod
    def parse(cls, spec: str) -> Impairment:
        """``loss=0.01,reorder=1%,dup=0.01,delay=5ms,split=0.1,hold=2ms,rto=200ms,seed=7`` (any subset)."""
        known = {f.name for f in fields(cls)}
        values: dict[str, Any] = {}
        for item in filter(None, (p.strip() for p in spec.split(","))):
            name, sep, text = item.partition("=")
            name = name.strip()
            if not sep or name not in known:
                raise ImpairmentError(f"--impair {item!r}: expected NAME=VALUE with NAME one of "
                                      f"{', '.join(sorted(known))}")
            if name == "seed":
                try:
                    values[name] = int(text, 0)
                except ValueError:
                    raise ImpairmentError(f"--impair seed={text}: an integer is expected") from None
            elif name in ("delay", "hold", "rto"):
                values[name] = _duration(name, text)
            else:
                values[name] = _fraction(name, text.strip())
        return cls(**values)

    @property
    def active(self) -> bool:
        return any((self.loss, self.reorder, self.dup, self.delay, self.split))

    def spec(self) -> str:
        """The specification that gives this impairment (`parse` of it is equal to it)."""
        parts = [f"loss={self.loss:g}", f"reorder={self.reorder:g}", f"dup={self.dup:g}",
                 f"delay={self.delay * 1000:g}ms"]
        if self.split:
            parts.append(f"split={self.split:g}")
        parts += [f"hold={self.hold * 1000:g}ms", f"rto={self.rto * 1000:g}ms", f"seed={self.seed}"]
        return ",".join(parts)


@dataclass(order=True)
class _Due:
    at: float
    seq: int
    fn: Callable[[], None] = field(compare=False)
    link: str = field(compare=False)


class Impairer:
    """The stage of one fabric: per-link seeded decisions, a timer queue of what is held, the record."""

    def __init__(self, spec: Impairment, binding: str, salt: str = "") -> None:
        self.spec = spec
        self.binding = binding
        self.salt = salt  # mixed into every link's seed (the bed's label: each check's links draw their own)
        self.log: list[tuple[str, int, str]] = []  # (link, packet number on it, decision) for every non-pass
        self.counts: Counter[str] = Counter()
        self._rngs: dict[str, random.Random] = {}
        self._n: Counter[str] = Counter()
        self._queue: list[_Due] = []
        self._seq = itertools.count()
        self._stream_due: dict[str, float] = {}  # iWARP: when a link's last queued chunk is due (order kept)
        self._held: Counter[str] = Counter()  # queued entries per link

    # ---- decisions -----------------------------------------------------------------------------------

    def _draws(self, link: str) -> tuple[int, list[float]]:
        rng = self._rngs.get(link)
        if rng is None:
            rng = self._rngs[link] = random.Random(f"{self.spec.seed}/{self.salt}/{link}")
        self._n[link] += 1
        return self._n[link], [rng.random() for _ in range(4)]  # always four: the n-th packet's fate replays

    def _record(self, link: str, n: int, what: str) -> None:
        self.counts[what] += 1
        if what != "pass" and len(self.log) < LOG_LIMIT:
            self.log.append((link, n, what))

    def datagram(self, link: str, payload: bytes, deliver: Callable[[bytes], None], now: float) -> None:
        """One RoCEv2 datagram on ``link``: dropped, or delivered (once or twice) now or when due."""
        s = self.spec
        n, (u_loss, u_dup, u_reorder, u_hold) = self._draws(link)
        if u_loss < s.loss:
            self._record(link, n, "loss")
            return
        due = now + s.delay
        what = "delay" if s.delay else "pass"
        if u_reorder < s.reorder:
            due += s.hold * (1.0 + u_hold)  # the packets after it overtake it
            what = "reorder"
        copies = 2 if u_dup < s.dup else 1
        if copies == 2:
            what = "dup" if what == "pass" else f"{what}+dup"
        self._record(link, n, what)
        for _ in range(copies):
            if due <= now:
                deliver(payload)
            else:
                self._push(due, link, lambda p=payload: deliver(p))  # type: ignore[misc]

    def stream(self, link: str, data: bytes, deliver: Callable[[bytes], None], now: float) -> None:
        """One chunk of an iWARP byte stream on ``link``: delayed or stalled in order, maybe cut in two."""
        s = self.spec
        n, (u_loss, u_dup, u_reorder, u_cut) = self._draws(link)
        stall, what = 0.0, "delay" if s.delay else "pass"
        if u_loss < s.loss:
            stall, what = s.rto, "loss:stall"  # TCP retransmits the segment after its RTO; the stream waits
        elif u_reorder < s.reorder:
            stall, what = s.hold, "reorder:stall"  # a fast retransmit
        if u_dup < s.dup:
            what = "dup:absorbed" if what == "pass" else f"{what}+dup:absorbed"  # TCP discards it
        pieces = [data]
        if len(data) > 1 and u_cut < s.split:
            cut = 1 + int(u_cut / s.split * (len(data) - 1)) % (len(data) - 1)
            pieces = [data[:cut], data[cut:]]
            what = f"{what}+split@{cut}"
        self._record(link, n, what)
        due = max(self._stream_due.get(link, 0.0), now + s.delay + stall)
        if due <= now and not self._held[link]:
            for p in pieces:
                deliver(p)
            return
        self._stream_due[link] = due
        for i, p in enumerate(pieces):
            # a cut chunk's second piece comes a moment later, so it travels as a segment of its own
            self._push(due + (SPLIT_GAP_S if i else 0.0), link, lambda p=p: deliver(p))  # type: ignore[misc]
        if len(pieces) > 1:
            self._stream_due[link] = due + SPLIT_GAP_S

    def after(self, links: list[str], fn: Callable[[], None], now: float) -> None:
        """``fn`` once everything queued on ``links`` is delivered: a connection's end (its TCP stream's FIN, the
        RoCEv2 side channel closing) comes after the packets the stage still holds for it, as it did on the wire."""
        last = max((d.at for d in self._queue if d.link in links), default=None)
        if last is None:
            fn()
            return
        self._push(max(last, now), links[0], fn)

    # ---- the timer queue -----------------------------------------------------------------------------

    def _push(self, at: float, link: str, fn: Callable[[], None]) -> None:
        self._held[link] += 1
        heapq.heappush(self._queue, _Due(at, next(self._seq), fn, link))

    def held(self, link: str) -> bool:
        """Whether anything is queued on ``link``."""
        return bool(self._held[link])

    def next_deadline(self) -> float | None:
        return self._queue[0].at if self._queue else None

    def poll(self, now: float) -> None:
        """Deliver everything due by ``now``, in due order (ties: the order it was queued)."""
        while self._queue and self._queue[0].at <= now:
            due = heapq.heappop(self._queue)
            self._held[due.link] -= 1
            due.fn()

    def forget(self, conn: str) -> None:
        """Drop what is queued for a connection that is gone, and its links' state (a server must not grow)."""
        links = {f"{conn}>", f"{conn}<"}
        keep = [d for d in self._queue if d.link not in links]
        if len(keep) != len(self._queue):
            self._queue = keep
            heapq.heapify(self._queue)
        for link in links:
            for table in (self._held, self._stream_due, self._rngs):
                table.pop(link, None)  # type: ignore[attr-defined]

    def counts_text(self) -> str:
        return ", ".join(f"{n} {what}" for what, n in sorted(self.counts.items())) or "no packets"

    def summary(self) -> dict[str, Any]:
        """What the stage did: the specification, counts per decision, the non-pass decisions (bounded)."""
        return {"impairment": self.spec.spec(), "binding": self.binding, "packets": sum(self._n.values()),
                "decisions": dict(sorted(self.counts.items())), "log": [list(x) for x in self.log[:200]],
                "logged": len(self.log)}
