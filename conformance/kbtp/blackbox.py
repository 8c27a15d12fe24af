"""Races on the free-block ring judged from outside (KBTP "Free-Block Ring", "Direct Modes", "Examples").

A target the harness cannot schedule (over a wire, on a device) has no race points to hold. The harness then owns
the race from outside: as a DIRECT_ALLOC initiator it executes its own allocations on its own partition ring, so
it knows every ticket of that ring that is taken and not yet bound (the target consumes a slot only when it
processes BIND), and can predict the Tail ticket of each FREE (the ring holds all F blocks of the partition when
the session starts, so Tail = the first Head ticket + F, and each FREE of one of its blocks advances it by one).
With that it opens the windows of the text deterministically (a FREE whose Tail ticket lands on the slot of a
ticket it holds) or watches them with a steady stream of reads spread over the target's writes (`Probe`), while
other sessions keep the target busy (`Crowd`). An attempt counts as opened only on a read that proves it fell
inside the window.

`Windows` keeps the count: a check passes only when its window opened at least PICS kbtp.target.race_windows
times within kbtp.target.race_budget_s with every invariant intact, and the pass says "black box: window opened
n of N attempts"; fewer openings are inconclusive, naming the count. A window that did not open is never a pass.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from kvconform import evidence
from kvconform.conformance.kbtp import expect
from kvconform.kbtp.constants import RING_SLOT_SIZE, TABLE_ENTRY_SIZE, Features, RequestFlags, Status
from kvconform.kbtp.messages import AllocStore, Free, Load
from kvconform.rdma import Access, Op, Region, SendWr, pause, wait_completion_for
from kvconform.targets.kbtp import TargetParams
from kvconform.targets.kbtp_bed import Bed
from kvconform.targets.kbtp_client import Gen, HarnessInitiator, decode_entry, decode_slot, precise
from kvconform.verdicts import check, inconclusive, not_applicable, pass_basis

__all__ = ["CHURN_CATCHES", "TICKETS", "Churn", "ChurnReqs", "Crowd", "Held", "Partition", "Probe", "Reqs", "Windows",
           "open_partition", "repetitions"]

TICKETS = 1 << 32
PROBE_IN_FLIGHT = 14  # RDMA Reads a probe keeps in flight: a steady stream, within the responder's 16 resources
PROBE_WAIT_S = 5.0  # a probe read that never completes
MAX_ATTEMPTS_PER_WINDOW = 50  # attempts per window asked for, at most (the budget usually ends them first)


@dataclass
class Windows:
    """Attempts at one race window and how many of them opened it."""

    what: str
    needed: int
    budget_s: float
    attempts: int = 0
    opened: int = 0
    started: float = field(default_factory=time.monotonic)

    @classmethod
    def of(cls, params: TargetParams, what: str) -> Windows:
        return cls(what, max(1, params.race_windows), params.race_budget_s)

    def more(self) -> bool:
        """Whether to make another attempt: too few openings, attempts and time left."""
        return (self.opened < self.needed and self.attempts < MAX_ATTEMPTS_PER_WINDOW * self.needed
                and time.monotonic() - self.started < self.budget_s)

    def attempt(self, opened: bool, **detail: Any) -> None:
        self.attempts += 1
        self.opened += int(opened)
        evidence.record("note", "kbtp-race-window", {"window": self.what, "attempt": self.attempts,
                                                     "opened": opened, **detail})

    @property
    def summary(self) -> str:
        return f"black box: window opened {self.opened} of {self.attempts} attempts ({self.what})"

    def judge(self) -> None:
        """Pass (saying how) when the window opened often enough; else inconclusive with the count."""
        evidence.note(self.summary)
        if self.opened < self.needed:
            inconclusive(f"{self.summary}; PICS kbtp.target.race_windows asks for {self.needed} within "
                         f"kbtp.target.race_budget_s {self.budget_s:g} s: the race was not observed often enough "
                         "to judge it")
        pass_basis(self.summary)


def repetitions(runs: int, params: TargetParams, *, black_box: bool) -> Iterator[int]:
    """Indices of a check's ``runs`` repetitions. Against a black box no schedule applies and each run costs real time
    (a large ring over a wire, a wait for the Ticket Timeout), so only as many start as fit in
    kbtp.target.race_budget_s, at least one: the check's bound must not blame the target for the harness's time."""
    until = time.monotonic() + params.race_budget_s
    for i in range(runs):
        if black_box and i and time.monotonic() > until:
            return
        yield i


@dataclass(frozen=True)
class Held:
    """A block this initiator bound through its partition."""

    handle: int
    ticket: int
    block: int
    data: bytes
    generation: int


@dataclass
class Reqs:
    """The requirement each step of a direct allocation answers to."""

    atomics: str = "KBTP-RDMAP-ATOMICS"  # the Head takes FetchAdd
    wait: str = "KBTP-RING-ALLOC-WAIT"  # the ticket's slot fills
    bind: str = "KBTP-BIND-VERIFY"  # the write into the partition and the BIND
    unique: str = "KBTP-RING-NO-LOSS"  # no block handed out twice
    free: str = "KBTP-FREE-RETURN"  # a FREE completes

    @classmethod
    def cited(cls, fallback: str) -> Reqs:
        """Each step's own requirement where the running check cites it, else ``fallback`` (the requirement of
        the check that the step serves): a check cites only what every path of it asserts."""
        d = cls()
        return cls(*(precise(named, fallback) for named in (d.atomics, d.wait, d.bind, d.unique, d.free)))


@dataclass
class Partition:
    """The harness as the DIRECT_ALLOC allocations of its own partition ring (see the module docstring)."""

    ini: HarnessInitiator
    quota: int  # F: the partition's blocks (= the Allocation Quota)
    slots: int  # N: its ring's slots
    reqs: Reqs = field(default_factory=Reqs)
    tail: int | None = None  # the Tail ticket the next FREE of this partition's blocks gets
    bound: dict[int, Held] = field(default_factory=dict)  # handle -> what it holds
    taken: dict[int, float] = field(default_factory=dict)  # ticket -> when (fabric time) the harness took it

    def slot_of(self, ticket: int) -> int:
        """Slot Offset of a ticket on this ring."""
        return RING_SLOT_SIZE * (ticket % self.slots)

    def take(self) -> Gen:
        """FetchAdd on the Head: (ticket, slot offset); the first one also fixes the Tail prediction."""
        ticket, slot = yield from self.ini.take_ticket(req=self.reqs.atomics)
        self.taken[ticket] = self.ini.fabric.now
        if self.tail is None:
            self.tail = (ticket + self.quota) % TICKETS
        return ticket, slot

    def await_block(self, ticket: int, slot: int) -> Gen:
        """The block of a taken ticket, from its slot (re-read until it shows the ticket with a block)."""
        block = yield from self.ini.await_slot(ticket, slot, req=self.reqs.wait)
        holders = [h for h, held in self.bound.items() if held.block == block]
        check(not holders, f"{self.ini.name}: ticket {ticket}'s slot {slot} holds Block Offset {block:#x}, which bound "
              f"handle {holders[0] if holders else 0:#x} still holds", req=self.reqs.unique, seen=f"{block:#x}")
        return block

    def bind(self, handle: int, ticket: int, block: int, data: bytes, *, abandoned_after: float | None = None,
             started: float = 0.0) -> Gen:
        """Write ``data`` into ``block`` and BIND ``handle`` to it with ``ticket``; the Held. ``abandoned_after``: a
        ticket held on purpose since ``started`` (fabric time) may be reclaimed once that many seconds (the Ticket
        Timeout) have passed: then TICKET_ABANDONED is right, and the result is None."""
        wc = yield from self.ini.write_block(block, data, req=self.reqs.bind)
        check(wc.ok, f"{self.ini.name}: the RDMA Write into the partition at {block:#x} failed: {wc.status.name}",
              req=self.reqs.bind)
        r = yield from self.ini.bind(handle, ticket, len(data), block, req=self.reqs.bind)
        if (abandoned_after is not None and r.status == Status.TICKET_ABANDONED
                and self.ini.fabric.now - started >= abandoned_after):
            return None
        held_for = self.ini.fabric.now - self.taken.pop(ticket, self.ini.fabric.now)
        timeout_s = self.ini.ack.ticket_timeout_ms / 1000
        if r.status == Status.TICKET_ABANDONED and held_for >= timeout_s:
            inconclusive(f"{self.ini.name}: the BIND of ticket {ticket} was refused TICKET_ABANDONED, and the harness "
                         f"had held the ticket {held_for:.3f} s, past the Ticket Timeout ({timeout_s:g} s, HELLO_ACK): "
                         "the refusal is the rule's, the delay the harness's or the link's (a stall)")
        expect.status_is(r, Status.OK, req=self.reqs.bind, what=f"BIND of ticket {ticket} (Block Offset {block:#x})")
        held = Held(handle, ticket, block, data, r.generation)
        self.bound[handle] = held
        return held

    def alloc(self, data: bytes) -> Gen:
        """One whole direct allocation into the lowest free handle: ticket, slot, write, BIND."""
        handle = self.free_handle()
        ticket, slot = yield from self.take()
        block = yield from self.await_block(ticket, slot)
        held = yield from self.bind(handle, ticket, block, data)
        return held

    def free_handle(self) -> int:
        for i in range(self.ini.ack.handle_count):
            if self.ini.handle(i) not in self.bound:
                return self.ini.handle(i)
        inconclusive(f"{self.ini.name}: every handle of its range is bound")

    @property
    def next_tail(self) -> int:
        """The Tail ticket the next FREE of this partition's blocks gets."""
        if self.tail is None:  # the harness's own sequencing, never the target's: an error, not a verdict
            raise RuntimeError("the next Tail ticket asked for before any ticket was taken")
        return self.tail

    def send_free(self, handle: int) -> int:
        """Send FREE of ``handle`` without waiting; the Tail ticket it will get."""
        u = self.next_tail
        self.tail = (u + 1) % TICKETS
        self.ini.send(self.ini.enc(Free(request_id=self.ini.next_id(), handle=handle)))
        return u

    def finish_free(self, handle: int, u: int) -> Gen:
        """The COMPLETION of a FREE sent by `send_free`."""
        r = yield from self.ini.receive(req=self.reqs.free, what=f"COMPLETION of FREE of handle {handle:#x} (Tail "
                                        f"ticket {u})")
        expect.status_is(r, Status.OK, req=self.reqs.free, what=f"FREE of handle {handle:#x} (Tail ticket {u})")
        del self.bound[handle]
        return r

    def free(self, handle: int) -> Gen:
        u = self.send_free(handle)
        yield from self.finish_free(handle, u)
        return u

    def free_all(self) -> Gen:
        for h in list(self.bound):
            yield from self.free(h)

    def read_slot(self, slot: int, req: str) -> Gen:
        da = self.ini.da
        got = yield from self.ini.read_slot(da.ring.stag, da.ring.tagged_offset, slot, req=req)
        if got is None:
            inconclusive(f"{self.ini.name}: the RDMA Read of its ring slot {slot} failed, so it could not be observed")
        return got


def open_partition(bed: Bed, name: str, need: Features, reqs: Reqs | None = None, *, hold: bool = True) -> Gen:
    """A session granted ``need`` (DIRECT_ALLOC at least) and its Partition; with ``hold`` (a check that holds a
    ticket while it frees another block of the ring) not-applicable when the quota makes the partition too small
    for that (F < 2)."""
    ini = bed.initiator(name)
    ack = yield from bed.open(ini, need)
    if (ack.features & need) != need:
        inconclusive(f"{name} was granted {Features(ack.features)!r}, not the {need!r} PICS declare and the check "
                     "needs")
    da = ack.direct_alloc
    f, n = ack.allocation_quota, da.ring.count
    evidence.note(f"{name}: DIRECT_ALLOC partition of F {f} blocks on a ring of N {n} slots (HELLO_ACK)")
    if hold and f < 2:
        not_applicable(f"the Allocation Quota {f} announced in HELLO_ACK makes a DIRECT_ALLOC partition of {f} block: "
                       "the harness cannot hold a ticket and free another block of the ring at once")
    return Partition(ini, f, n, reqs or Reqs.cited("KBTP-HELLO-FIRST"))


@dataclass
class Crowd:
    """Other sessions of the harness that keep the target busy while a probe watches it: each holds one whole
    block and, at ``burst``, sends LOADs of it back to back. A target serving them interleaves their steps with
    the watched operation's, so the harness's reads reach it between that operation's writes more often (the
    window widens; whether it opened is still judged from what the reads show)."""

    inis: list[HarnessInitiator] = field(default_factory=list)
    handles: list[int] = field(default_factory=list)
    sent: list[int] = field(default_factory=list)
    length: int = 0
    req: str = "KBTP-LOAD-COMPLETE"
    per: int = 1  # LOADs per session and burst (within its Request Credits)

    @classmethod
    def join(cls, bed: Bed, count: int, block_size: int, *, req: str) -> Gen:
        """Up to ``count`` sessions on the shared ring, each with one sealed block of ``block_size`` octets. Their
        allocation and LOADs answer to their own requirements where the running check cites them, else to ``req``
        (the check's: the target failing them fails the check)."""
        crowd = cls(length=block_size, req=precise("KBTP-LOAD-COMPLETE", req))
        alloc_req = precise("KBTP-QUOTA-ALLOC-BOUNDED", req)
        data = bytes(range(256)) * (block_size // 256) + bytes(block_size % 256)
        for k in range(count):
            ini = bed.initiator(f"C{k}")
            ack = yield from bed.open(ini, Features(0))
            src = ini.buffer(block_size, Access.REMOTE_READ, data)
            r = yield from ini.alloc_store(ini.handle(0), data, source=src, req=alloc_req)
            expect.status_is(r, Status.OK, req=alloc_req, what=f"{ini.name}'s ALLOC_STORE of the block it loads")
            crowd.inis.append(ini)
            crowd.handles.append(ini.handle(0))
            crowd.sent.append(0)
            crowd.per = max(1, min(8, ack.request_credits))
        return crowd

    def burst(self) -> None:
        for k, ini in enumerate(self.inis):
            for _ in range(self.per):
                ini.send(ini.enc(Load(request_id=ini.next_id(), handle=self.handles[k],
                                      data=ini.descriptor(ini.buffer(self.length), self.length))))
            self.sent[k] += self.per

    def drain(self) -> Gen:
        for k, ini in enumerate(self.inis):
            while self.sent[k]:
                r = yield from ini.receive(req=self.req, what=f"COMPLETION of a LOAD of {ini.name}")
                expect.status_is(r, Status.OK, req=self.req, what=f"{ini.name}'s LOAD of its own block")
                self.sent[k] -= 1


@dataclass
class Probe:
    """RDMA Reads of a few locations of the target, over and over, in a steady stream (``PROBE_IN_FLIGHT`` in
    flight, one posted as each completes), while the target works: each round is one read of every location in
    order, and RDMA Reads on one connection are executed in order, so each read was executed after the one
    before it. ``kick`` (what starts the target's work, a FREE) is sent once the first round is back: the
    stream is already flowing when the target starts, so reads reach it throughout its work."""

    ini: HarnessInitiator
    where: list[tuple[str, int, int, int]]  # (kind 'slot' | 'entry', stag, tagged offset, length)
    # A target in its own process: a round per turn of the harness's loop, so the rounds leave (and reach it)
    # spread out rather than in one burst per round trip. A target in the harness's own loop (--kbtp-wire)
    # interleaves its steps with the harness's: rounds posted back to back reach it between them.
    spread: bool = True
    rounds: list[list[Any]] = field(default_factory=list)

    @classmethod
    def slot(cls, part: Partition, slot: int) -> tuple[str, int, int, int]:
        da = part.ini.da
        return ("slot", da.ring.stag, da.ring.tagged_offset + slot, RING_SLOT_SIZE)

    @classmethod
    def entry(cls, ini: HarnessInitiator, handle: int) -> tuple[str, int, int, int]:
        dl = ini.dl
        return ("entry", dl.table.stag, dl.table.tagged_offset + TABLE_ENTRY_SIZE * (handle - dl.table_base_handle),
                TABLE_ENTRY_SIZE)

    def run(self, done: Callable[[list[list[Any]]], bool], max_rounds: int, *, req: str,
            kick: Callable[[], None] | None = None) -> Gen:
        """Read round after round until ``done(rounds)`` holds (then one more round) or ``max_rounds``; the reads
        still in flight are drained before it returns. A read that fails ends the probe inconclusive."""
        conn, per = self.ini.conn, len(self.where)
        size = max(length for _, _, _, length in self.where)
        depth = max(per, PROBE_IN_FLIGHT - PROBE_IN_FLIGHT % per)
        buf = self.ini.buffer(size * depth, Access.LOCAL_WRITE)
        flight: deque[tuple[int, int]] = deque()  # (index in the round, buffer cell)
        posted = 0
        last_round = max_rounds
        current: list[Any] = []
        while True:
            # whole rounds at a time: a round's reads travel together and reach the target in the same instant
            # (a work-request list: one post, so over a wire the round's Read Requests leave in one batch)
            while len(flight) + per <= depth and posted < last_round * per:
                wrs = []
                for idx, (kind, stag, to, length) in enumerate(self.where):
                    cell = posted % depth
                    wrs.append(SendWr.read(buf.sge(cell * size, length), stag, to, 0x7F00_0000 + cell,
                                           tag=f"probe-{kind}"))
                    flight.append((idx, cell))
                    posted += 1
                conn.post_list(wrs)
                if self.spread:
                    yield from pause("probe-round")
            if not flight:
                break
            self.ini.waiting = (req, "an RDMA Read of the probe")
            try:
                wc = yield from wait_completion_for(conn.cq, PROBE_WAIT_S,
                                                    lambda c: c.op is Op.RDMA_READ or not c.ok)
            finally:
                self.ini.waiting = None
            if wc is None or not wc.ok:
                inconclusive(f"{self.ini.name}: an RDMA Read of the probe did not complete "
                             f"({'none within' if wc is None else wc.status.name} {PROBE_WAIT_S} s): the window "
                             "could not be observed")
            idx, cell = flight.popleft()
            kind, _, _, length = self.where[idx]
            raw = buf.read(cell * size, length)
            current.append(decode_slot(raw, self.ini.addr_le) if kind == "slot" else
                           decode_entry(raw, self.ini.addr_le))
            if idx < per - 1:
                continue
            self.rounds.append(current)
            current = []
            if kick is not None:
                kick()
                kick = None
            elif last_round == max_rounds and done(self.rounds):
                last_round = min(max_rounds, len(self.rounds) + 1)  # one more round, then drain
        evidence.record("note", "kbtp-probe", {"initiator": self.ini.name, "rounds": len(self.rounds)})
        return self.rounds




# ---- a target without DIRECT_ALLOC: the shared ring churned at full circulation ----------------------------------

CHURN_WAIT_S = 5.0  # a COMPLETION that does not come: an allocation within quota stalled, or an answer lost
CHURN_MIN_CYCLES = 20  # full-quota cycles (per initiator on average) a judgement needs, at the least
CHURN_CYCLES = 600  # cycles of all initiators together a churn stops at (within the budget): ~4 s on loopback
CHURN_MAX_CYCLES = 400  # per initiator, at most
OVERLAPPED = ("; a FREE of another initiator was outstanding meanwhile: a free that wrote the slot of this "
              "allocation's ticket before the allocation read it, instead of deferring (KBTP-FREE-NO-OVERWRITE), "
              "leaves it waiting for ever")
CHURN_MARK = 0x43  # first octet of every block the churn stores: (mark, initiator, cycle, unit) repeated

# What the churn (`Churn`) caught of race targets served in their own process without DIRECT_ALLOC, over RoCEv2 and
# iWARP together (tools/race_catch_rates.py; docs/kbtp-wire.md, "A target without DIRECT_ALLOC"): per requirement,
# target (tests/mutants/kbtp.py, tests/mutants/kbtp_races.py) -> (runs that failed on the requirement, runs). The race
# mutants of tests/mutants/kbtp.py keep their window one step of the served target's loop wide, which the churn never
# opens: they answer as the reference does. The Staged / Clears targets break the same rule in a window a real target
# may keep open (an allocation waiting on its data with its ticket taken; a block cleared before the entry changes).
# A pass names every rate; a requirement no served target was caught on stays inconclusive.
CHURN_CATCHES: dict[str, dict[str, tuple[int, int]]] = {
    # 2026-12-07, --runs 2 --budget 6 per wire (2 RoCEv2 + 2 iWARP runs), 600 cycles at F == N == 8
    "KBTP-FREE-NO-OVERWRITE": {"StagedOverwritesUnconsumedSlot": (4, 4), "OverwritesUnconsumedSlot": (0, 4)},
    "KBTP-FREE-TABLE-FIRST": {"ClearsBeforeEntryUpdate": (4, 4), "FreeReturnsBeforeEntryUpdate": (0, 4)},
}


@dataclass
class ChurnReqs:
    """The requirement each invariant of the churn answers to, as the running check cites them."""

    twice: str = "KBTP-RING-NO-LOSS"  # a Block Offset handed out while a bound handle still holds it
    intact: str = "KBTP-ALLOC-RING"  # a LOAD of an own handle returns what was stored: the data went into its block
    # an allocation within quota that never completes breaks the bound of the text ("waits at most for an in-progress
    # free"); once the ring has served allocations across two wraps, one overlapped by a FREE that never completes
    # is what a free writing the slot of a ticket taken and not yet read (instead of deferring) does
    overlapped_stall: str = "KBTP-FREE-NO-OVERWRITE"
    stall: str = "KBTP-QUOTA-ALLOC-BOUNDED"
    cross: str = "KBTP-RING-NO-LOSS"  # a LOAD of another initiator's handle racing its FREE
    free: str = "KBTP-FREE-RETURN"
    load: str = "KBTP-LOAD-COMPLETE"

    @classmethod
    def cited(cls, fallback: str, **named: str) -> ChurnReqs:
        """Each invariant's own requirement (or the one ``named`` for it) where the running check cites it, else
        ``fallback``."""
        d = cls(**named)
        return cls(*(precise(getattr(d, f), fallback) for f in ("twice", "intact", "overlapped_stall", "stall",
                                                                  "cross", "free", "load")))


def churn_pattern(k: int, cycle: int, unit: int) -> bytes:
    return bytes([CHURN_MARK, k & 0xFF, cycle & 0xFF, unit & 0xFF]) * 8


@dataclass
class Churn:
    """The harness owns every initiator a target without DIRECT_ALLOC serves on its shared ring, each with the whole
    quota, so every block is in circulation; each allocates its quota (ALLOC_STORE, pipelined), loads it back, loads
    the handles its neighbour is freeing, and frees its quota (FREE, pipelined), cycle after cycle, until the budget.
    The target executes every allocation: its tickets and its ring are invisible, so whether a FREE reached the slot
    of an allocation that had taken its ticket and not yet read it (the deferred free of the text's example) cannot
    be seen. What can: ``overlaps``, FREEs answered while another initiator's ALLOC_STORE was outstanding (an upper
    bound on the openings, not a count of them), and the invariants the rules guarantee, each checked as it happens:
    no Block Offset handed out while a bound handle holds it, every allocation within quota completes, a LOAD returns
    what was stored, a LOAD of a handle being freed returns its data or a refusal, every FREE answers OK."""

    inis: list[HarnessInitiator]
    quota: int
    slots: int  # N of the shared ring (as declared)
    budget_s: float
    reqs: ChurnReqs = field(default_factory=ChurnReqs)
    cycles: int = 0
    allocations: int = 0  # answered OK
    overlaps: int = 0
    cross_loads: int = 0  # OK answers to LOADs of a neighbour's handle, each checked
    bound: dict[int, tuple[str, int]] = field(default_factory=dict)  # Block Offset -> (initiator, handle)
    allocating: dict[str, int] = field(default_factory=dict)  # initiator -> ALLOC_STOREs outstanding
    freeing: dict[str, int] = field(default_factory=dict)  # initiator -> FREEs outstanding
    blocks: dict[tuple[str, int], int] = field(default_factory=dict)  # (initiator, handle) -> its Block Offset
    buffers: dict[tuple[str, str, int], Region] = field(default_factory=dict)
    deadline: float = 0.0

    @classmethod
    def join(cls, bed: Bed, count: int, quota: int, slots: int, budget_s: float, reqs: ChurnReqs) -> Gen:
        churn = cls([], quota, slots, budget_s, reqs)
        for k in range(count):
            ini = bed.initiator(f"K{k}")
            ini.quiet = True  # thousands of answers: the evidence keeps the churn's counts, not each message
            ack = yield from bed.open(ini, Features(0))
            if ack.allocation_quota < quota:
                inconclusive(f"{ini.name} was granted an Allocation Quota of {ack.allocation_quota}, not the "
                             f"{quota} PICS declare: the churn cannot put every block in circulation")
            churn.inis.append(ini)
        return churn

    def warm_up(self) -> Gen:
        """One initiator at a time allocates and frees its quota until the ring has served allocations across two
        wraps, nothing overlapping: a ring that loses blocks or never takes a free back stalls here (blamed
        KBTP-QUOTA-ALLOC-BOUNDED), so a stall overlapped by a FREE later is the deferred free's."""
        c = 0
        while self.allocations < 2 * self.slots:
            for k, ini in enumerate(self.inis):
                handles = [ini.handle(j) for j in range(self.quota)]
                yield from self._alloc_all(ini, k, c, handles)
                yield from self._free_all(ini, handles)
            c += 1

    def actors(self) -> dict[str, Gen]:
        self.deadline = time.monotonic() + self.budget_s
        return {f"churn-{ini.name}": self.run_one(k) for k, ini in enumerate(self.inis)}

    def _others(self, table: dict[str, int], me: str) -> bool:
        return any(n for name, n in table.items() if name != me)

    def run_one(self, k: int) -> Gen:
        """Initiators of even index hold: allocate the quota (every other unit by RDMA Read of the data), load it
        back, load the neighbour's, free it. Odd ones flick: each unit's ALLOC_STORE and FREE sent back to back, so a
        block goes out and back within the target's own turns, no round trip of the harness between, while a holder's
        allocation may still wait on its data (the text's delayed allocation X, and Y allocating and freeing)."""
        ini, n = self.inis[k], len(self.inis)
        peer = (k + 2) % n if n > 2 else (k + 1) % n  # the next holder: its handles are bound between its frees
        handles = [ini.handle(j) for j in range(self.quota)]
        for c in range(CHURN_MAX_CYCLES):
            if time.monotonic() >= self.deadline or self.cycles >= CHURN_CYCLES:
                return
            if k % 2:
                yield from self._flick(ini, k, c, handles)
            else:
                yield from self._alloc_all(ini, k, c, handles)
                yield from self._load_own(ini, k, c, handles)
                if peer != k:
                    yield from self._load_neighbour(ini, self.inis[peer], peer)
                yield from self._free_all(ini, handles)
            self.cycles += 1

    def _flick(self, ini: HarnessInitiator, k: int, c: int, handles: list[int]) -> Gen:
        sent = []
        for j, h in enumerate(handles):
            a, f = ini.next_id(), ini.next_id()
            ini.send(ini.enc(AllocStore.with_inline(churn_pattern(k, c, j), flags=RequestFlags.SEAL, request_id=a,
                                                    handle=h)))
            ini.send(ini.enc(Free(request_id=f, handle=h)))
            sent.append((a, f, h))
        self.allocating[ini.name] = self.freeing[ini.name] = len(sent)
        for a, f, h in sent:
            wrapped = self.allocations >= 2 * self.slots
            r = yield from ini.receive(
                req=self.reqs.overlapped_stall if wrapped else self.reqs.stall, timeout=CHURN_WAIT_S,
                what=f"COMPLETION of ALLOC_STORE {a} (handle {h:#x}, within quota, every block in circulation, after "
                     f"{self.allocations} allocations answered{OVERLAPPED})")
            self.allocating[ini.name] -= 1
            expect.status_is(r, Status.OK, req=self.reqs.stall, what=f"{ini.name}'s ALLOC_STORE {a} within quota")
            block = r.block_offset
            holder = self.bound.get(block)
            check(holder is None, f"{ini.name}'s ALLOC_STORE {a} (handle {h:#x}) got Block Offset {block:#x}, which "
                  f"{holder[0] if holder else ''}'s handle {holder[1] if holder else 0:#x} still holds (bound, not "
                  "freed): a block handed out twice", req=self.reqs.twice, seen=f"{block:#x}")
            self.allocations += 1
            r = yield from ini.receive(req=self.reqs.free, timeout=CHURN_WAIT_S,
                                       what=f"COMPLETION of FREE {f} (handle {h:#x})")
            self.freeing[ini.name] -= 1
            expect.status_is(r, Status.OK, req=self.reqs.free, what=f"{ini.name}'s FREE {f} of handle {h:#x}")
            if self._others(self.allocating, ini.name):
                self.overlaps += 1

    def _alloc_all(self, ini: HarnessInitiator, k: int, c: int, handles: list[int]) -> Gen:
        sent = []
        for j, h in enumerate(handles):
            rid = ini.next_id()
            data = churn_pattern(k, c, j)
            if (c + j) % 2:  # every other one by RDMA Read of the harness's buffer: the target's data fetch takes a
                # round trip, and a target that takes its ticket first holds it unread that long
                src = self._buffer(ini, "src", j, Access.REMOTE_READ)
                src.write(0, data)
                msg = AllocStore(request_id=rid, handle=h, flags=RequestFlags.SEAL, data=ini.descriptor(src, len(data)))
            else:
                msg = AllocStore.with_inline(data, flags=RequestFlags.SEAL, request_id=rid, handle=h)
            ini.send(ini.enc(msg))
            # a FREE of another initiator outstanding while this allocation is: the only way the frees of a run in
            # quota reach an allocation is the deferred free of the text's example
            sent.append((rid, h, self._others(self.freeing, ini.name)))
        self.allocating[ini.name] = len(sent)
        for rid, h, overlapped in sent:
            overlapped = overlapped or self._others(self.freeing, ini.name)
            wrapped = self.allocations >= 2 * self.slots  # the ring has worked across two wraps
            r = yield from ini.receive(
                req=self.reqs.overlapped_stall if overlapped and wrapped else self.reqs.stall, timeout=CHURN_WAIT_S,
                what=f"COMPLETION of ALLOC_STORE {rid} (handle {h:#x}, within quota, every block in circulation, "
                     f"after {self.allocations} allocations answered{OVERLAPPED if overlapped else ''})")
            self.allocating[ini.name] -= 1
            expect.status_is(r, Status.OK, req=self.reqs.stall, what=f"{ini.name}'s ALLOC_STORE {rid} within quota")
            check(r.request_id == rid, f"{ini.name}: the COMPLETION of request {r.request_id} came where ALLOC_STORE "
                  f"{rid}'s was due", req=self.reqs.stall, seen=r.request_id, expected=rid)
            block = r.block_offset
            holder = self.bound.get(block)
            check(holder is None, f"{ini.name}'s ALLOC_STORE {rid} (handle {h:#x}) got Block Offset {block:#x}, which "
                  f"{holder[0] if holder else ''}'s handle {holder[1] if holder else 0:#x} still holds (bound, not "
                  "freed): a block handed out twice", req=self.reqs.twice, seen=f"{block:#x}")
            self.bound[block] = (ini.name, h)
            self.blocks[(ini.name, h)] = block
            self.allocations += 1

    def _buffer(self, ini: HarnessInitiator, kind: str, j: int,
                access: Access = Access.LOCAL_WRITE | Access.REMOTE_WRITE) -> Region:
        """One registered buffer per initiator, use and unit, reused every cycle (each use's answer came before
        the next)."""
        key = (ini.name, kind, j)
        if key not in self.buffers:
            self.buffers[key] = ini.buffer(len(churn_pattern(0, 0, 0)), access)
        return self.buffers[key]

    def _load_own(self, ini: HarnessInitiator, k: int, c: int, handles: list[int]) -> Gen:
        length = len(churn_pattern(0, 0, 0))
        bufs = []
        for j, h in enumerate(handles):
            buf = self._buffer(ini, "own", j)
            ini.send(ini.enc(Load(request_id=ini.next_id(), handle=h, data=ini.descriptor(buf, length))))
            bufs.append(buf)
        for j, (h, buf) in enumerate(zip(handles, bufs, strict=True)):
            r = yield from ini.receive(req=self.reqs.load, timeout=CHURN_WAIT_S,
                                       what=f"COMPLETION of a LOAD of its own handle {h:#x}")
            expect.status_is(r, Status.OK, req=self.reqs.load, what=f"{ini.name}'s LOAD of its bound handle {h:#x}")
            got = buf.read(0, min(length, r.data_length))
            expect.equal(f"{ini.name}'s handle {h:#x} (Block Offset {r.block_offset:#x}) loaded in cycle {c}", got,
                         churn_pattern(k, c, j), req=self.reqs.intact)

    def _load_neighbour(self, ini: HarnessInitiator, nxt: HarnessInitiator, k: int) -> Gen:
        """LOADs of the neighbour's handles, which it may be freeing right now: an OK answer must carry what the
        neighbour stored under that binding (a block of its pattern); a refusal is right once the FREE updated the
        entry. A block returned to the ring, cleared or given to another allocation while the entry still binds it
        shows here."""
        length = len(churn_pattern(0, 0, 0))
        bufs = []
        for j in range(self.quota):
            buf = self._buffer(ini, "cross", j)
            buf.write(0, bytes(length))  # a LOAD answered OK with nothing written shows as zeros, not stale data
            ini.send(ini.enc(Load(request_id=ini.next_id(), handle=nxt.handle(j), data=ini.descriptor(buf, length))))
            bufs.append(buf)
        for j, buf in enumerate(bufs):
            h = nxt.handle(j)
            r = yield from ini.receive(req=self.reqs.load, timeout=CHURN_WAIT_S,
                                       what=f"COMPLETION of a LOAD of {nxt.name}'s handle {h:#x}")
            if r.status != Status.OK:
                continue
            self.cross_loads += 1
            got = buf.read(0, min(length, r.data_length))
            ok = len(got) == length and got[0] == CHURN_MARK and got[1] == k & 0xFF and got[3] == j and \
                got == got[:4] * 8
            check(ok, f"{ini.name}'s LOAD of {nxt.name}'s handle {h:#x} (racing its FREE) was answered OK with "
                  f"Generation {r.generation}, Block Offset {r.block_offset:#x}, but returned {got[:8].hex()}..., no "
                  f"block {nxt.name} stored there: the block went back (cleared, or to another allocation) while the "
                  "entry still bound it", req=self.reqs.cross, seen=got[:8].hex(),
                  expected=f"{bytes([CHURN_MARK, k & 0xFF]).hex()}xx{j:02x} repeated")

    def _free_all(self, ini: HarnessInitiator, handles: list[int]) -> Gen:
        sent = []
        for h in handles:
            block = self.blocks.pop((ini.name, h))
            self.bound.pop(block, None)  # from the FREE on, the target may hand the block out again
            rid = ini.next_id()
            ini.send(ini.enc(Free(request_id=rid, handle=h)))
            sent.append((rid, h))
        self.freeing[ini.name] = len(sent)
        for rid, h in sent:
            r = yield from ini.receive(req=self.reqs.free, timeout=CHURN_WAIT_S,
                                       what=f"COMPLETION of FREE {rid} (handle {h:#x})")
            self.freeing[ini.name] -= 1
            expect.status_is(r, Status.OK, req=self.reqs.free, what=f"{ini.name}'s FREE {rid} of handle {h:#x}")
            if self._others(self.allocating, ini.name):
                self.overlaps += 1

    def summary(self, shared: int, slots: int | str) -> str:
        flicking = len(self.inis) // 2
        return (f"black box without DIRECT_ALLOC, window not observable: {self.cycles} cycles (an initiator's whole "
                f"quota out and back) of {len(self.inis)} initiators ({len(self.inis) - flicking} holding, {flicking} "
                f"flicking) x quota {self.quota} on the shared ring (F {shared}, N {slots}), "
                f"{self.overlaps} FREEs answered while another initiator's ALLOC_STORE was outstanding, "
                f"{self.cross_loads} LOADs racing a neighbour's FREE checked; invariants intact")

    def judge(self, summary: str, rule: str) -> None:
        """Inconclusive when the budget allowed too few cycles; else a pass only if the churn was shown to catch a
        served target that breaks ``rule`` (`CHURN_CATCHES`), naming every measured rate (those it does not catch
        too); inconclusive saying so if it never caught one: a check never passes on what it could not see."""
        evidence.note(summary)
        need = CHURN_MIN_CYCLES * max(1, len(self.inis))
        if self.cycles < need:
            inconclusive(f"{summary}; {self.cycles} cycles within kbtp.target.race_budget_s {self.budget_s:g} s, fewer "
                         f"than the {need} a judgement needs: the race was not exercised often enough to judge it")
        rates = CHURN_CATCHES.get(rule, {})
        measured = ", ".join(f"{name} in {caught} of {runs} runs" for name, (caught, runs) in rates.items())
        measured = (f"this stress caught targets served without DIRECT_ALLOC breaking {rule}: {measured or 'none'} "
                    "(docs/kbtp-wire.md)")
        if not any(caught for caught, _ in rates.values()):
            inconclusive(f"{summary}; but {measured}: the race is not observable from outside a target that "
                         "executes every allocation itself, so intact invariants are no basis for a pass")
        missed = [name for name, (caught, _) in rates.items() if not caught]
        if missed:
            measured += (f"; not caught: {', '.join(missed)}, whose window is one step of the target's own loop (it "
                         "answers as a correct target does)")
        pass_basis(f"{summary}; {measured}")
