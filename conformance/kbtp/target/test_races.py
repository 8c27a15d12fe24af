"""kbtp-target: races on the free-block ring and the table (KBTP "Free-Block Ring", "Allocation Quotas",
"Block Free", "Direct Modes", "Examples").

The text's four-block deferred-free scenario is replayed step by step with a schedule script; then
seeded interleavings of many initiators allocating, loading and freeing check that no block is lost or
handed out twice and that allocations never stall; then DIRECT_LOAD readers race stores and frees.
Every failure names the fabric seed and the schedule; ``kvconform run kbtp-target --seed S`` replays it
(the per-check seeds derive from the session seed), and the schedule file in the evidence replays it
with a ScriptScheduler even after the code changed. The scripted checks hold the reference target at its
named race points; a target without them cannot be forced into the interleaving and is inconclusive.

A target the harness cannot schedule (over a wire, on a device: ``TargetUnderTest.black_box``) gets the same three
named races opened from outside instead (conformance/kbtp/blackbox.py): the harness, a DIRECT_ALLOC initiator on its
own partition, is the delayed allocation of the text's example, and reads the ring and the table back to back
around the target's writes; each such check passes only when its window opened at least PICS
kbtp.target.race_windows times (within kbtp.target.race_budget_s), and says "black box: window opened n of N
attempts". `test_entry_written_after_data` against a black box holds the writer's end of the wire instead
(targets/kbtp_order.py): while the target's RDMA Read of the ALLOC_STORE's data is unanswered the target cannot have
the data, so the entry must not read VALID|SEALED yet. A black box without DIRECT_ALLOC exposes no ring:
`test_deferred_free_example` and `test_free_updates_entry_before_ring` churn its shared ring from outside instead
(blackbox.py ``Churn``), check the invariants the rules guarantee as they happen, and pass only on a stress measured
to catch a served target breaking the rule (``CHURN_CATCHES``, docs/kbtp-wire.md), saying which it does not catch.

The number of seeded interleavings comes from PICS kbtp.target.interleavings (or --kvconform-kbtp-interleavings).
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass, field
from typing import Any

import pytest

from kvconform import evidence
from kvconform.conformance.kbtp import expect, hangs
from kvconform.conformance.kbtp.blackbox import (
    TICKETS,
    Churn,
    ChurnReqs,
    Crowd,
    Held,
    Partition,
    Probe,
    Reqs,
    Windows,
    open_partition,
    repetitions,
)
from kvconform.fixtures.kbtp import TargetUnderTest
from kvconform.kbtp.constants import EMPTY_BLOCK_OFFSET, EntryFlags, Features, RequestFlags, Status
from kvconform.rdma import Access, pause, wait_until
from kvconform.rdma.scheduler import PctScheduler, RandomScheduler, ScheduleError, ScriptScheduler
from kvconform.targets.kbtp_bed import Bed
from kvconform.targets.kbtp_client import RING_SLOT_SIZE, Gen, HarnessInitiator
from kvconform.targets.kbtp_order import install as order_witness
from kvconform.verdicts import check, inconclusive, not_applicable

SEAL = int(RequestFlags.SEAL)
ENTRY_POLLS = 20_000  # R's entry reads per black-box attempt, at most (the attempt ends when the ALLOC_STORE does)
DL, DA = Features.DIRECT_LOAD, Features.DIRECT_ALLOC


def _ran_after(bed: Bed, delivered: str, actor: str) -> bool:
    """Whether a step of ``actor`` (a label prefix) ran after the last delivery of a ``delivered...`` Send."""
    sched = bed.schedule()
    last = max((i for i, lab in enumerate(sched) if lab.startswith(delivered) and lab.endswith(":deliver")),
               default=None)
    return last is not None and any(lab.startswith(actor) for lab in sched[last + 1:])


def _scripted(bed: Bed, script: ScriptScheduler, **actors: Gen) -> dict[str, Any]:
    """Run a scripted scenario; inconclusive when the target cannot be held where the script says."""
    try:
        out = bed.run(**actors)
    except ScheduleError as exc:
        inconclusive(f"the target does not expose the race points this interleaving needs ({exc}); the seeded "
                     "interleavings still exercise the race")
    if script.remaining:
        inconclusive(f"the schedule script was not followed to its end (left: {script.remaining})")
    return out


# ---- the text's scenario -----------------------------------------------------------------------------


@pytest.mark.req("KBTP-EX-DEFER", "KBTP-FREE-DEFER", "KBTP-FREE-NO-OVERWRITE", "KBTP-ALLOC-RING", "KBTP-RING-NO-LOSS",
                 "KBTP-HELLO-FIRST", "KBTP-LOAD-COMPLETE", "KBTP-FREE-RETURN", "KBTP-QUOTA-ALLOC-BOUNDED")
@hangs.diagnosed_deferral
def test_deferred_free_example(kbtp_target: TargetUnderTest, seed: int) -> None:
    """N = F = 4, blocks handed out in ring order: X's allocation takes ticket 0 and is held before it
    reads slot 0; Y takes tickets 1-3 and frees its first block, whose Tail ticket 4 lands on the
    unconsumed slot 0 and must wait; X then gets slot 0's block, and Y's next allocation (ticket 4) gets
    exactly the block Y freed. No block is lost or handed out twice. A black box: `_deferred_free_black_box`."""
    if kbtp_target.black_box:
        if not kbtp_target.has(DA):
            _churn_without_ring(kbtp_target, seed, "deferred-free-churn", ChurnReqs.cited("KBTP-RING-NO-LOSS"),
                                "KBTP-FREE-NO-OVERWRITE")
            return
        _deferred_free_black_box(kbtp_target, seed)
        return
    if kbtp_target.params.max_initiators < 2:
        not_applicable("PICS kbtp.target.max_initiators is 1: the example needs initiators X and Y at once")
    x_id, y_id = secrets.token_bytes(16), secrets.token_bytes(16)
    # Hold X's slot read until Y's free has run its Tail FetchAdd (the race points of the reference target).
    script = ScriptScheduler(["target@Y-conn.target:tail.shared", "target@X-conn.target:read-slot.shared.0"])
    bed = kbtp_target.bed(seed, scheduler=script, label="deferred-free-example", blocks=4, shared_blocks=4,
                          ring_slots=4, quota=1, quotas=((x_id, 1), (y_id, 3)),
                          features=kbtp_target.params.features & ~DA)
    x, y = bed.initiator("X", x_id), bed.initiator("Y", y_id)

    def hellos() -> Gen:
        yield from bed.open(x)
        yield from bed.open(y)

    bed.run_one(hellos())
    got: dict[str, int] = {}

    def run_x() -> Gen:
        # The free of Tail ticket 4 must not overwrite slot 0 before this allocation consumed it.
        r = yield from x.alloc_store(x.handle(0), b"X" * 16, req="KBTP-FREE-NO-OVERWRITE")
        expect.status_is(r, Status.OK, req="KBTP-FREE-NO-OVERWRITE", what="X's ALLOC_STORE (ticket 0)")
        got["x"] = r.block_offset

    def run_y() -> Gen:
        # Start once X's request reached the target and its actor ran (X holds ticket 0).
        started = yield from wait_until(lambda: _ran_after(bed, "X-conn.X/send", "target@X-conn.target"),
                                        name="Y-start", timeout=1.0)
        if not started:
            inconclusive("X's ALLOC_STORE never reached the target's actor: the example cannot be set up")
        for i in range(3):
            # within Y's quota of 3 and before any free: only the bound of the text keeps it from waiting
            r = yield from y.alloc_store(y.handle(i), bytes([0x30 + i]) * 16, req="KBTP-QUOTA-ALLOC-BOUNDED")
            expect.status_is(r, Status.OK, req="KBTP-ALLOC-RING", what=f"Y's ALLOC_STORE {i + 1} (ticket {i + 1})")
            got[f"y{i}"] = r.block_offset
        f = yield from y.free(y.handle(0))
        expect.status_is(f, Status.OK, req="KBTP-FREE-RETURN", what="Y's FREE of its first block (Tail ticket 4)")
        x_done = yield from wait_until(lambda: "x" in got, name="Y-after-X", timeout=1.0)
        check(x_done, "X's allocation of ticket 0 did not complete after Y's free", req="KBTP-FREE-NO-OVERWRITE")
        check(got["x"] != got["y0"], "X's allocation of ticket 0 got the block Y freed: the free of Tail ticket 4 "
              "wrote slot 0 before X had consumed it", req="KBTP-FREE-NO-OVERWRITE", seen=got["x"])
        # Ticket 4's block is the one the deferred free writes into slot 0 once X consumed it.
        r = yield from y.alloc_store(y.handle(3), b"Y4" * 8, req="KBTP-FREE-DEFER")
        expect.status_is(r, Status.OK, req="KBTP-FREE-DEFER", what="Y's ALLOC_STORE of ticket 4")
        got["y3"] = r.block_offset
        for h, data in ((1, bytes([0x31]) * 16), (2, bytes([0x32]) * 16), (3, b"Y4" * 8)):
            _, d = yield from y.load(y.handle(h), 16)
            expect.equal(f"Y's handle {h} data at the end", d, data, req="KBTP-RING-NO-LOSS")
        _, d = yield from x.load(x.handle(0), 16)
        expect.equal("X's data at the end", d, b"X" * 16, req="KBTP-RING-NO-LOSS")

    _scripted(bed, script, X=run_x(), Y=run_y())
    evidence.record("note", "kbtp-deferred-free", {k: hex(v) for k, v in got.items()})
    four = [got["x"], got["y0"], got["y1"], got["y2"]]
    expect.equal("distinct blocks of tickets 0-3 (X's and Y's three)", len(set(four)), 4, req="KBTP-EX-DEFER")
    expect.equal("block of ticket 4 (the block Y freed, written into slot 0 after X consumed it)", got["y3"],
                 got["y0"], req="KBTP-FREE-DEFER")


@pytest.mark.req("KBTP-FREE-TABLE-FIRST", "KBTP-HELLO-FIRST", "KBTP-QUOTA-ALLOC-BOUNDED", "KBTP-FREE-RETURN")
@hangs.diagnosed
def test_free_updates_entry_before_ring(kbtp_target: TargetUnderTest, seed: int) -> None:
    """A FREE held just before its Tail FetchAdd (the reference's ``tail.<ring>`` race point): a direct
    read of the entry at that moment already shows it unbound with a new Generation. A black box:
    `_entry_first_black_box`."""
    kbtp_target.require(DL)
    if kbtp_target.black_box:
        if not kbtp_target.has(DA):
            _churn_without_ring(kbtp_target, seed, "free-entry-first-churn",
                                ChurnReqs.cited("KBTP-QUOTA-ALLOC-BOUNDED", cross="KBTP-FREE-TABLE-FIRST"),
                                "KBTP-FREE-TABLE-FIRST")
            return
        _entry_first_black_box(kbtp_target, seed)
        return
    plan = kbtp_target.sessions(2, need="a writer and a DIRECT_LOAD reader")
    script = ScriptScheduler(["R:entry-read", "target@W-conn.target:tail.*"])
    bed = kbtp_target.bed(seed, scheduler=script, label="free-entry-first")
    w, r = bed.initiator("W"), bed.initiator("R")
    seen: dict[str, Any] = {}

    def writer() -> Gen:
        yield from bed.open(w, plan[0])
        a = yield from w.alloc_store(w.handle(0), (b"free me" * 4)[:kbtp_target.params.block_size])
        expect.status_is(a, Status.OK, req="KBTP-QUOTA-ALLOC-BOUNDED", what="ALLOC_STORE")
        seen["gen"] = a.generation
        f = yield from w.free(w.handle(0))
        expect.status_is(f, Status.OK, req="KBTP-FREE-RETURN", what="FREE")

    def reader() -> Gen:
        ack = yield from bed.open(r, Features(plan[1] | DL))
        if not ack.features & DL:
            inconclusive("the reader was not granted DIRECT_LOAD, which PICS declares")
        ready = yield from wait_until(
            lambda: "gen" in seen and _ran_after(bed, "W-conn.W/send", "target@W-conn.target"),
            name="R-wait-free", timeout=1.0)
        if not ready:
            inconclusive("the writer's FREE never reached the target's actor")
        seen["entry"] = yield from r.read_entry(w.handle(0), req="KBTP-FREE-TABLE-FIRST")
        yield from pause("entry-read")

    _scripted(bed, script, W=writer(), R=reader())
    entry = seen.get("entry")
    if entry is None:
        inconclusive("the RDMA Read of the entry failed, so the order could not be observed")
    flags, gen = entry[0], entry[1]
    check(not flags & EntryFlags.VALID and gen != seen["gen"],
          f"when the FREE reached its Tail FetchAdd the entry still read Flags {flags!r}, Generation {gen} "
          f"(bound with {seen['gen']}) [{bed.replay_hint()}]", req="KBTP-FREE-TABLE-FIRST")


@pytest.mark.req("KBTP-FREE-SLOT-ORDER", "KBTP-HELLO-FIRST", "KBTP-RDMAP-ATOMICS", "KBTP-RING-ALLOC-WAIT",
                 "KBTP-BIND-VERIFY", "KBTP-FREE-RETURN")
def test_free_writes_block_before_sequence(kbtp_target: TargetUnderTest, seed: int) -> None:
    """A FREE held between its two slot writes (the reference's ``slot-seq.<ring>.<ticket>`` race point):
    a read of the Tail slot at that moment never shows the new Sequence with the old Block Offset. A black
    box: `_slot_order_black_box`."""
    kbtp_target.require(DA)
    if kbtp_target.black_box:
        _slot_order_black_box(kbtp_target, seed)
        return
    script = ScriptScheduler(["R:slot-read", "R:slot-seen", "target@A-conn.target:slot-seq.*"])
    bed = kbtp_target.bed(seed, scheduler=script, label="slot-order")
    a = bed.initiator("A")
    seen: dict[str, Any] = {}

    def owner() -> Gen:
        ack = yield from bed.open(a, DA)
        if not ack.features & DA:
            inconclusive("DIRECT_ALLOC, which PICS declares, was not granted")
        da = ack.direct_alloc
        ticket, slot = yield from a.take_ticket()
        block = yield from a.await_slot(ticket, slot, req="KBTP-RING-ALLOC-WAIT")
        yield from a.write_block(block, b"S" * 16, req="KBTP-BIND-VERIFY")
        r = yield from a.bind(a.handle(0), ticket, 16, block)
        expect.status_is(r, Status.OK, req="KBTP-BIND-VERIFY", what="BIND")
        u = ack.allocation_quota  # the Tail ticket of the first free
        seen.update(block=block, u=u, slot=RING_SLOT_SIZE * (u % da.ring.count))
        f = yield from a.free(a.handle(0))
        expect.status_is(f, Status.OK, req="KBTP-FREE-RETURN", what="FREE")

    def reader() -> Gen:
        ready = yield from wait_until(lambda: "u" in seen and _ran_after(bed, "A-conn.A/send",
                                                                         "target@A-conn.target:tail."),
                                      name="R-wait", timeout=1.0)
        if not ready:
            inconclusive("the FREE never reached its Tail FetchAdd")
        yield from pause("slot-read")
        da = a.ack.direct_alloc
        seen["read"] = yield from a.read_slot(da.ring.stag, da.ring.tagged_offset, seen["slot"],
                                              req="KBTP-FREE-SLOT-ORDER")
        yield from pause("slot-seen")

    _scripted(bed, script, A=owner(), R=reader())
    slot = seen.get("read")
    if slot is None:
        inconclusive("the RDMA Read of the slot failed, so the order could not be observed")
    seq, offset = slot
    check(not (seq == seen["u"] and offset == EMPTY_BLOCK_OFFSET),
          f"between the FREE's two slot writes the slot read Sequence {seq} (the new one) with Block Offset all ones "
          f"[{bed.replay_hint()}]", req="KBTP-FREE-SLOT-ORDER", seen=slot, expected=(seen["u"], seen["block"]))


# ---- the same three races judged from outside (a black box) ---------------------------------------------------

SLOT_POLLS = 50  # reads of a slot after the BIND that consumed it, for the deferred free's write
PROBE_ROUNDS = 200  # rounds of back-to-back reads around one FREE


def _crowd(kbtp_target: TargetUnderTest, bed: Bed, req: str) -> Gen:
    """Sessions on the shared ring that keep the target busy around a watched FREE (as many as the declared
    geometry serves beside the watching partition session, at most 3)."""
    p = kbtp_target.params
    shared, _ = p.capacity()
    crowd = yield from Crowd.join(bed, max(0, min(3, shared, p.max_initiators - 1)), p.block_size, req=req)
    return crowd


def _watched_free(part: Partition, crowd: Crowd, held: Held, *, with_entry: bool, spread: bool, req: str) -> Gen:
    """FREE of ``held``'s handle (with the crowd's burst) while a probe reads its Tail slot, after the entry when
    ``with_entry`` (entry, then slot: each round, sent together, is a snapshot of both in the order that shows the
    window; the slot of one round and the entry of the next, read in that order, show a violation); returns the
    Tail ticket, its slot, the slot's final state and the probe's rounds (the slot last in each)."""
    u = part.next_tail
    slot = part.slot_of(u)
    final = (u, held.block)
    where = [Probe.entry(part.ini, held.handle)] if with_entry else []

    def kick() -> None:
        crowd.burst()
        part.send_free(held.handle)

    probe = Probe(part.ini, [*where, Probe.slot(part, slot)], spread=spread)
    rounds = yield from probe.run(lambda rs: bool(rs[-1][-1] == final), PROBE_ROUNDS, req=req, kick=kick)
    yield from part.finish_free(held.handle, u)
    yield from crowd.drain()
    return u, slot, final, rounds


def _runs(states: list[Any]) -> list[str]:
    """What a probe saw, as runs of equal states ("before x7", ...), for the evidence."""
    out: list[str] = []
    for st in states:
        label = str(st)
        if out and out[-1].rsplit(" x", 1)[0] == label:
            head, _, n = out[-1].rpartition(" x")
            out[-1] = f"{head} x{int(n) + 1}"
        else:
            out.append(f"{label} x1")
    return out


def _churn_without_ring(kbtp_target: TargetUnderTest, seed: int, label: str, reqs: ChurnReqs, rule: str) -> None:
    """A black box without DIRECT_ALLOC: the shared ring churned at full circulation by every initiator it serves
    (`Churn`), its invariants checked as they happen; judged by `Churn.judge` (the window itself is not observable)."""
    p = kbtp_target.params
    shared, _ = p.capacity()
    if p.quota <= 0 or shared < 1:
        not_applicable(f"the declared geometry serves no initiator on the shared ring ({p.describe_capacity()})")
    bed = kbtp_target.bed(seed, label=label)
    churn: dict[str, Churn] = {}

    def setup() -> Gen:
        churn["c"] = yield from Churn.join(bed, shared, p.quota, p.ring_slots or p.shared_count, p.race_budget_s, reqs)
        yield from churn["c"].warm_up()

    bed.run_one(setup())
    c = churn["c"]
    circulating = shared * p.quota
    evidence.note(f"{shared} initiators x quota {p.quota} = {circulating} of the shared ring's {p.shared_count} blocks "
                  "in circulation")
    bed.run(**c.actors())
    summary = c.summary(p.shared_count, p.ring_slots if p.ring_slots else "declared")
    if circulating < p.shared_count:
        summary += (f" (only {circulating} of {p.shared_count} blocks in circulation: the declared quota leaves the "
                    "rest)")
    c.judge(summary, rule)


def _need_ring(kbtp_target: TargetUnderTest) -> None:
    """A black box shows its ring only through DIRECT_ALLOC (the partition ring the initiator allocates from)."""
    if not kbtp_target.has(DA):
        inconclusive("the target is a black box (the harness cannot schedule it) and does not declare DIRECT_ALLOC: "
                     "it executes every allocation itself and exposes no ring, so the harness can neither hold an "
                     "allocation between its ticket and its slot nor see the ring's slots")
    kbtp_target.require(DA)


def _deferred_free_black_box(kbtp_target: TargetUnderTest, seed: int) -> None:
    """The text's example with the harness as the delayed allocation X: on its own DIRECT_ALLOC partition (F
    blocks, N slots) it takes ticket t with its own FetchAdd and withholds the BIND (the target consumes a slot
    only when it processes BIND), while as Y it allocates and frees blocks of the same ring until a FREE's Tail
    ticket is t + N, whose slot is t's: that free must be deferred (slot t still shows ticket t and X's block),
    and once X's BIND consumed the slot, the deferred write fills it with Sequence t + N and the freed block,
    which the allocation of ticket t + N gets. The window opened when that write is seen after the BIND."""
    _need_ring(kbtp_target)
    windows = Windows.of(kbtp_target.params, "a FREE whose Tail ticket lands on the slot of a ticket taken and not "
                                             "yet bound")
    bed = kbtp_target.bed(seed, label="deferred-free-black-box")
    timeout_s = 0.0

    def attempt(part: Partition) -> Gen:
        tag = windows.attempts
        t, slot_t = yield from part.take()  # X: the ticket is taken ...
        started = bed.fabric.now
        block_t = yield from part.await_block(t, slot_t)  # ... and the BIND withheld: slot t stays unconsumed
        target_u = (t + part.slots) % TICKETS
        u, window_block = None, None
        for _ in range(2 * part.slots):  # Y: allocate and free until a FREE gets Tail ticket t + N
            y = yield from part.alloc(bytes([0x59, tag & 0xFF, 0]) * 6)
            check(y.block != block_t, f"ticket {y.ticket} got Block Offset {y.block:#x}, which ticket {t} (taken, not "
                  "yet bound) holds in its slot", req="KBTP-EX-DEFER", seen=f"{y.block:#x}")
            u = yield from part.free(y.handle)
            if u == target_u:
                window_block = y.block
                break
        seq, blk = yield from part.read_slot(slot_t, "KBTP-FREE-NO-OVERWRITE")
        if bed.fabric.now - started >= timeout_s:
            # a target may hold a deferred FREE's completion until the slot is consumed, reclaiming the ticket
            windows.attempt(False, ticket=t, why=f"ticket {t}'s Ticket Timeout ({timeout_s:g} s) passed before the "
                                                 "slot was read: the target may have reclaimed the ticket")
            return False
        check((seq, blk) == (t % TICKETS, block_t),
              f"a FREE with Tail ticket {u} (slot {slot_t}) completed while ticket {t}, which owns that slot, was "
              f"taken and not yet bound (within its Ticket Timeout); the slot then read Sequence {seq}, Block Offset "
              f"{blk:#x}: the free overwrote a slot not yet consumed instead of deferring its write",
              req="KBTP-FREE-NO-OVERWRITE", seen=(seq, hex(blk)), expected=(t, hex(block_t)))
        data_x = bytes([0x58, tag & 0xFF, 1]) * 6
        held_x = yield from part.bind(part.free_handle(), t, block_t, data_x, abandoned_after=timeout_s,
                                      started=started)
        if held_x is None:
            windows.attempt(False, ticket=t, why=f"the Ticket Timeout ({timeout_s:g} s) ran out while the ticket "
                                                 "was held")
            return False
        opened = False
        for _ in range(SLOT_POLLS):
            seq, blk = yield from part.read_slot(slot_t, "KBTP-FREE-DEFER")
            if seq == target_u:
                opened = True
                break
        if not opened or window_block is None:
            windows.attempt(False, ticket=t, tail_ticket=u, slot=slot_t,
                            why=f"no deferred write of Tail ticket {target_u} seen in slot {slot_t} after the BIND "
                                f"consumed it (last read: Sequence {seq}, Block Offset {blk:#x})")
            yield from part.free_all()
            return True
        check(blk == window_block, f"the deferred free of Tail ticket {target_u} wrote Block Offset {blk:#x} into slot "
              f"{slot_t}, not the block it freed", req="KBTP-FREE-DEFER", seen=hex(blk), expected=hex(window_block))
        for _ in range(part.slots + 1):  # the allocation of ticket t + N gets exactly the freed block
            ticket, slot = yield from part.take()
            block = yield from part.await_block(ticket, slot)
            data = bytes([0x5A, tag & 0xFF, ticket & 0xFF]) * 6
            if ticket == target_u:
                check(block == window_block, f"the allocation of ticket {ticket} got Block Offset {block:#x}, not the "
                      f"block {window_block:#x} whose free was deferred onto its slot", req="KBTP-FREE-DEFER",
                      seen=hex(block), expected=hex(window_block))
                held = yield from part.bind(part.free_handle(), ticket, block, data)
                break
            other = yield from part.bind(part.free_handle(), ticket, block, data)
            yield from part.free(other.handle)
        else:
            inconclusive(f"the Head never gave ticket {target_u} within {part.slots + 1} allocations after ticket {t}: "
                         "the harness's ticket bookkeeping does not match the target's ring")
        for h in (held_x, held):
            # a BIND leaves the block unsealed: loaded with ALLOW_UNSEALED
            r, got = yield from part.ini.load(h.handle, len(h.data), flags=RequestFlags.ALLOW_UNSEALED,
                                              req="KBTP-LOAD-COMPLETE")
            expect.status_is(r, Status.OK, req="KBTP-LOAD-COMPLETE", what=f"LOAD of handle {h.handle:#x}")
            expect.equal(f"data of handle {h.handle:#x} (ticket {h.ticket})", got, h.data, req="KBTP-RING-NO-LOSS")
        windows.attempt(True, ticket=t, slot=slot_t, tail_ticket=target_u, held_block=hex(block_t),
                        deferred_block=hex(window_block))
        yield from part.free_all()
        return True

    def scenario() -> Gen:
        nonlocal timeout_s
        part = yield from open_partition(bed, "X", DA, Reqs.cited("KBTP-ALLOC-RING"))
        timeout_s = part.ini.ack.ticket_timeout_ms / 1000
        while windows.more():
            go_on = yield from attempt(part)
            if not go_on:
                break

    bed.run_one(scenario())
    windows.judge()


def _slot_order_black_box(kbtp_target: TargetUnderTest, seed: int) -> None:
    """As the allocations of its own partition, the harness binds a block and frees it while it reads the FREE's
    Tail slot in a steady stream: no read shows the new Sequence with any Block Offset but the freed block's (the
    consumed slot's all ones). The window opened when a read fell between the two writes: it shows the freed
    block with the slot's old Sequence (a target that writes both at once never opens it: inconclusive)."""
    _need_ring(kbtp_target)
    windows = Windows.of(kbtp_target.params, "a read of a FREE's Tail slot between its Block Offset and its Sequence "
                                             "write")
    bed = kbtp_target.bed(seed, label="slot-order-black-box")

    def scenario() -> Gen:
        part = yield from open_partition(bed, "A", DA, Reqs.cited("KBTP-FREE-SLOT-ORDER"))
        crowd = yield from _crowd(kbtp_target, bed, "KBTP-FREE-SLOT-ORDER")
        while windows.more():
            held = yield from part.alloc(bytes([0x53, windows.attempts & 0xFF]) * 8)
            u, slot, final, rounds = yield from _watched_free(
                part, crowd, held, with_entry=False,
                spread=kbtp_target.fixed_geometry, req="KBTP-FREE-SLOT-ORDER")
            states = [r[0] for r in rounds]
            torn = [s for s in states if s[0] == u and s[1] != held.block]
            check(not torn, f"a read of slot {slot} while the FREE of Tail ticket {u} wrote it showed Sequence {u} "
                  f"(the new one) with Block Offset {torn[0][1] if torn else 0:#x}, not the freed block: the Sequence "
                  "was written before the block", req="KBTP-FREE-SLOT-ORDER", seen=[(q, hex(b)) for q, b in torn[:3]],
                  expected=f"Sequence {u} only with Block Offset {held.block:#x}")
            between = [s for s in states[1:] if s[0] != u and s[1] == held.block]
            windows.attempt(bool(between) and states[-1] == final, tail_ticket=u, slot=slot, reads=len(states),
                            seen=_runs(["before" if st == states[0] else "returned" if st == final else "block only"
                                        if st in between else f"Sequence {st[0]}, Block Offset {st[1]:#x}"
                                        for st in states]))

    bed.run_one(scenario())
    windows.judge()


def _entry_first_black_box(kbtp_target: TargetUnderTest, seed: int) -> None:
    """As the allocations of its own partition (DIRECT_ALLOC) that may read the table (DIRECT_LOAD), the harness
    binds a block and frees it while it reads the FREE's Tail slot and the entry, alternately, in a steady stream:
    no entry read that follows a slot read showing the slot written (changed since before the FREE) shows the
    handle still bound. The window opened when a read fell between the two: an entry read shows the handle unbound
    and the slot read after it the slot as before the FREE."""
    _need_ring(kbtp_target)
    windows = Windows.of(kbtp_target.params, "reads between a FREE's entry update and its write of the Tail slot")
    bed = kbtp_target.bed(seed, label="free-entry-first-black-box")

    def scenario() -> Gen:
        part = yield from open_partition(bed, "W", Features(DA | DL), Reqs.cited("KBTP-QUOTA-ALLOC-BOUNDED"))
        crowd = yield from _crowd(kbtp_target, bed, "KBTP-FREE-TABLE-FIRST")
        while windows.more():
            held = yield from part.alloc(bytes([0x57, windows.attempts & 0xFF]) * 8)
            u, slot, final, rounds = yield from _watched_free(
                part, crowd, held, with_entry=True,
                spread=kbtp_target.fixed_geometry, req="KBTP-FREE-TABLE-FIRST")
            before = rounds[0][1]
            reads = [(kind, value) for r in rounds for kind, value in zip(("entry", "slot"), r, strict=True)]
            written = None  # the first slot read that shows the slot changed since before the FREE
            opened = False
            for i, (kind, value) in enumerate(reads):
                if kind == "slot":
                    written = written or (value if value != before else None)
                    continue
                flags, gen = value[0], value[1]
                bound = bool(flags & EntryFlags.VALID) and gen == held.generation
                check(written is None or not bound,
                      f"slot {slot} (the FREE's Tail ticket {u}) already read Sequence {written[0] if written else 0}, "
                      f"Block Offset {written[1] if written else 0:#x}, but the entry of handle {held.handle:#x}, read "
                      f"after it, still showed Flags {flags!r}, Generation {gen} (bound): the slot was written (the "
                      "FREE's Tail FetchAdd had run, the block was going back to the ring) before the entry was "
                      "updated", req="KBTP-FREE-TABLE-FIRST", seen=(repr(flags), gen),
                      expected=f"not VALID, Generation != {held.generation}")
                if not bound and i + 1 < len(reads) and reads[i + 1][1] == before:
                    opened = True
            windows.attempt(opened and rounds[-1][1] == final, tail_ticket=u, slot=slot, rounds=len(rounds),
                            seen=_runs([("bound" if e[0] & EntryFlags.VALID else "unbound",
                                         "before" if sl == before else "returned" if sl == final else "written")
                                        for e, sl in rounds]))

    bed.run_one(scenario())
    windows.judge()


# ---- seeded interleavings of many initiators ------------------------------------------------------------


@dataclass
class Ledger:
    """Blocks currently held by each initiator (from an OK allocation until it sends FREE)."""

    held: dict[int, str] = field(default_factory=dict)
    allocations: int = 0

    def take(self, who: str, block: int) -> None:
        owner = self.held.get(block)
        check(owner is None, f"block {block:#x} handed to {who} while {owner} still holds it", req="KBTP-RING-NO-LOSS")
        self.held[block] = who
        self.allocations += 1

    def give(self, block: int) -> None:
        self.held.pop(block, None)


def _churn(ini: HarnessInitiator, ledger: Ledger, cycles: int, quota: int, tag: int) -> Gen:
    """Allocate the whole quota, verify, free it; ``cycles`` times; then allocate the quota once more."""
    for c in range(cycles + 1):
        blocks = []
        for j in range(quota):
            h = ini.handle(j)
            data = bytes([tag, c, j]) * 5
            r = yield from ini.alloc_store(h, data)
            expect.status_is(r, Status.OK, req="KBTP-QUOTA-ALLOC-BOUNDED",
                             what=f"{ini.name} ALLOC_STORE (cycle {c}, unit {j}) within its quota")
            ledger.take(ini.name, r.block_offset)
            blocks.append((h, r.block_offset, data))
            yield from pause(f"{ini.name}-after-alloc")
        for h, _, data in blocks:
            _, got = yield from ini.load(h, len(data))
            expect.equal(f"{ini.name} data of handle {h:#x} (cycle {c})", got, data, req="KBTP-RING-NO-LOSS")
        if c == cycles:
            return
        for h, block, _ in blocks:
            ledger.give(block)
            f = yield from ini.free(h)
            expect.status_is(f, Status.OK, req="KBTP-FREE-RETURN", what=f"{ini.name} FREE (cycle {c})")


@pytest.mark.req("KBTP-RING-NO-LOSS", "KBTP-QUOTA-ALLOC-BOUNDED", "KBTP-FREE-RETURN", "KBTP-HELLO-FIRST",
                 "KBTP-LOAD-COMPLETE")
@hangs.diagnosed_sharing
def test_seeded_interleavings(kbtp_target: TargetUnderTest, session_seed: int) -> None:
    """Initiators that together hold every block of the shared ring allocate, check and free under
    seeded random and PCT schedules: every allocation within quota succeeds without stalling, no block
    is held by two initiators at once, stored data stays intact, and at the end the whole ring is
    allocated again (nothing lost). A black box takes no schedule: its runs are repetitions (``repetitions``)."""
    p = kbtp_target.params
    shared = p.shared_count
    if p.quota <= 0 or shared < p.quota:
        not_applicable(f"the declared geometry (shared ring {shared}, quota {p.quota}) leaves no room for the race")
    n_ini = max(1, min(p.max_initiators, shared // p.quota))
    runs = kbtp_target.interleavings
    features = p.features & ~DA
    done = 0
    for i in repetitions(runs, p, black_box=kbtp_target.black_box):
        seed = session_seed * 100_000 + i
        scheduler = RandomScheduler(seed) if i % 2 == 0 else PctScheduler(seed, depth=3, horizon=400)
        bed = kbtp_target.bed(seed, scheduler=scheduler, label=f"interleaving-{i}", features=features)
        inis = [bed.initiator(f"I{k}") for k in range(n_ini)]
        ledger = Ledger()

        def one(ini: HarnessInitiator, k: int, bed: Bed = bed, ledger: Ledger = ledger) -> Gen:
            yield from bed.open(ini)
            yield from _churn(ini, ledger, cycles=2, quota=p.quota, tag=k)

        bed.run(**{ini.name: one(ini, k) for k, ini in enumerate(inis)})
        expect.equal(f"interleaving {i} of {runs} (replay: kvconform run kbtp-target --seed {session_seed} -k "
                     "test_seeded_interleavings): blocks held at the end", len(ledger.held), n_ini * p.quota,
                     req="KBTP-RING-NO-LOSS")
        done += 1
    evidence.note(f"{done} of {runs} interleavings of {n_ini} initiators x quota {p.quota} on a shared ring of {shared}"
                  + (f" (a black box: as many as started within {p.race_budget_s:g} s)" if done < runs else ""))


# ---- DIRECT_LOAD readers racing stores and frees ----------------------------------------------------------


@pytest.mark.req("KBTP-ALLOC-ENTRY-ORDER", "KBTP-TABLE-BIND-ORDER", "KBTP-HELLO-FIRST", "KBTP-QUOTA-ALLOC-BOUNDED")
@hangs.diagnosed
def test_entry_written_after_data(kbtp_target: TargetUnderTest, session_seed: int) -> None:
    """A DIRECT_LOAD reader polls the entry of a handle while the writer binds it by an ALLOC_STORE whose
    data the target RDMA-reads (so writing it takes many steps): whenever two entry reads around a block
    read show the same Generation with VALID and SEALED, the block holds the whole data, and the entry the
    Data Length and Block Offset of the completion (the entry is written after the data, its location before
    its state). A black box: `_entry_order_black_box`."""
    kbtp_target.require(DL)
    plan = kbtp_target.sessions(2, need="a writer and a DIRECT_LOAD reader")
    if kbtp_target.black_box:
        _entry_order_black_box(kbtp_target, session_seed, plan)
        return
    runs = max(2, kbtp_target.interleavings // 20)
    bs = kbtp_target.params.block_size
    data = bytes((i * 13 + 1) & 0xFF for i in range(bs))
    checked = raced = 0
    for i in range(runs):
        seed = session_seed * 100_000 + 70_000 + i
        bed = kbtp_target.bed(seed, scheduler=RandomScheduler(seed), label=f"entry-after-data-{i}")
        w, r = bed.initiator("W"), bed.initiator("R")
        state: dict[str, Any] = {}
        views: list[tuple[Any, bytes, bool]] = []

        def writer(w: HarnessInitiator = w, state: dict[str, Any] = state, bed: Bed = bed) -> Gen:
            yield from bed.open(w, plan[0])
            state["h"] = w.handle(0)
            src = w.buffer(bs, Access.REMOTE_READ, data)
            a = yield from w.alloc_store(state["h"], data, source=src)
            expect.status_is(a, Status.OK, req="KBTP-QUOTA-ALLOC-BOUNDED", what="ALLOC_STORE by RDMA Read")
            state["done"] = a

        def reader(r: HarnessInitiator = r, state: dict[str, Any] = state, views: list[Any] = views,
                   bed: Bed = bed) -> Gen:
            ack = yield from bed.open(r, Features(plan[1] | DL))
            if not ack.features & DL:
                inconclusive("the reader was not granted DIRECT_LOAD, which PICS declares")
            ready = yield from wait_until(lambda: "h" in state, name="R-wait", timeout=1.0)
            if not ready:
                inconclusive("the writer never started")
            for _ in range(4000):
                e1 = yield from r.read_entry(state["h"], req="KBTP-ALLOC-ENTRY-ORDER")
                if e1 is not None and e1[0] & EntryFlags.VALID and e1[0] & EntryFlags.SEALED:
                    racing = "done" not in state  # read before the writer's COMPLETION: inside the window
                    wc, block = yield from r.rdma_read(ack.direct_load.pool.stag, e1[3], min(e1[2], bs),
                                                       req="KBTP-ALLOC-ENTRY-ORDER")
                    e2 = yield from r.read_entry(state["h"], req="KBTP-ALLOC-ENTRY-ORDER")
                    if wc.ok and e2 == e1:
                        views.append((e1, block, racing))
                        return
                if "done" in state and e1 is not None and e1[0] & EntryFlags.VALID:
                    continue  # bound: the next read is consistent
                yield from pause("R-poll")

        bed.run(W=writer(), R=reader())
        done = state["done"]
        for entry, block, racing in views:
            checked += 1
            raced += racing
            expect.equal(f"interleaving {i}: entry (Data Length, Block Offset) read with VALID|SEALED",
                         (entry[2], entry[3]), (len(data), done.block_offset), req="KBTP-TABLE-BIND-ORDER")
            check(block == data, f"interleaving {i}: the entry read VALID|SEALED (Generation {entry[1]}) twice "
                  f"around a block read, but the block held {block[:8].hex()}... not the data "
                  f"{data[:8].hex()}... [{bed.replay_hint()}]", req="KBTP-ALLOC-ENTRY-ORDER")
    evidence.note(f"{checked} consistent direct loads of a fresh binding checked over {runs} interleavings, "
                  f"{raced} of them before the ALLOC_STORE completed")


def _entry_order_black_box(kbtp_target: TargetUnderTest, seed: int, plan: list[Features]) -> None:
    """A target the harness cannot schedule: the harness owns the writer's end of the wire and holds W's output
    (targets/kbtp_order.py), so the target's RDMA Read of the data stays unanswered for the hold while R reads the
    entry. No entry read answered before W's Read Response left may show this ALLOC_STORE's binding VALID|SEALED (the
    target cannot have had the data). The window opened when an entry read was posted after the Read Request reached W
    and answered before the response left; afterwards a direct load (entry, block, entry) must show the data."""
    p = kbtp_target.params
    windows = Windows.of(p, "entry reads while the target's RDMA Read of the ALLOC_STORE's data was held unanswered")
    bed = kbtp_target.bed(seed * 100_000 + 70_000, label="entry-after-data-black-box")
    w, r = bed.initiator("W"), bed.initiator("R")
    witness = order_witness(bed.fabric, str(w.conn.name))
    if witness is None:
        inconclusive(f"black box on {bed.fabric!r}, which builds every packet itself: the harness cannot hold the data "
                     "the target RDMA-Reads from the writer, and no race point holds the target between its entry "
                     "write and the landing of that data: the order is not observable")
    bs = p.block_size
    req = "KBTP-ALLOC-ENTRY-ORDER"

    def opening() -> Gen:
        yield from bed.open(w, plan[0])
        ack = yield from bed.open(r, Features(plan[1] | DL))
        if not ack.features & DL:
            inconclusive("the reader was not granted DIRECT_LOAD, which PICS declares")
        return ack

    ack = bed.run_one(opening())
    h = w.handle(0)
    src = w.buffer(bs, Access.REMOTE_READ)
    arrived = witness.watch_reads(w.conn, src.stag)
    if arrived is None:
        inconclusive("black box: the writer's connection has no engine the harness runs, so the arrival of the "
                     "target's RDMA Read of the data is not observable")
    while windows.more():
        data = bytes((i * 13 + 1 + windows.attempts) & 0xFF for i in range(bs))
        src.write(0, data)
        st: dict[str, Any] = {}
        seen: list[tuple[Any, Any, Any]] = []  # (posted, answered, entry) of R's entry reads

        def writer(st: dict[str, Any] = st, data: bytes = data) -> Gen:
            st["sent"] = witness.stamp()
            a = yield from w.alloc_store(h, data, source=src, req="KBTP-QUOTA-ALLOC-BOUNDED")
            expect.status_is(a, Status.OK, req="KBTP-QUOTA-ALLOC-BOUNDED", what="W's ALLOC_STORE by RDMA Read")
            st["done"] = a
            ready = yield from wait_until(lambda: "loaded" in st, name="W-wait-R", timeout=5.0)
            if not ready:
                inconclusive("the reader did not finish its direct load of the binding")
            f = yield from w.free(h)
            expect.status_is(f, Status.OK, req="KBTP-FREE-RETURN", what="W's FREE of the handle between attempts")

        def reader(st: dict[str, Any] = st, seen: list[Any] = seen, data: bytes = data) -> Gen:
            ready = yield from wait_until(lambda: "sent" in st, name="R-wait-W", timeout=1.0)
            if not ready:
                inconclusive("the writer never started")
            for _ in range(ENTRY_POLLS):  # bounded: the ALLOC_STORE completes within its holds
                if "done" in st:
                    break
                posted = witness.stamp()
                e = yield from r.read_entry(h, req=req)
                seen.append((posted, witness.stamp(), e))
            # the invariant once bound: a consistent direct load shows the data
            e1 = yield from r.read_entry(h, req=req)
            if e1 is not None and e1[0] & EntryFlags.VALID and e1[0] & EntryFlags.SEALED:
                wc, block = yield from r.rdma_read(ack.direct_load.pool.stag, e1[3], min(e1[2], bs), req=req)
                e2 = yield from r.read_entry(h, req=req)
                if wc.ok and e2 == e1:
                    st["load"] = (e1, block)
            st["loaded"] = True

        bed.run(**{f"W{windows.attempts}": writer(), f"R{windows.attempts}": reader()})  # actor names are the bed's
        done = st["done"]
        requests = [q for q in arrived if q.seq > st["sent"].seq]
        asked = requests[0] if requests else None
        left = witness.left_after(asked) if asked is not None else None
        mine = [(pq, an, e) for pq, an, e in seen if pq.seq > st["sent"].seq and e is not None]
        for pq, an, e in mine:
            bound = bool(e[0] & EntryFlags.VALID and e[0] & EntryFlags.SEALED) and e[1] == done.generation
            if not bound or (left is not None and an.seq > left.seq):
                continue
            when = (f"{(an.t - asked.t) * 1000:.1f} ms after the target's RDMA Read Request for the data reached W"
                    if asked is not None and an.seq > asked.seq else "before the target's RDMA Read Request for the "
                    "data reached W")
            until = (f"{(left.t - an.t) * 1000:.1f} ms before W's Read Response (the data) left the harness"
                     if left is not None else "while W's Read Response (the data) had not left the harness")
            check(False, f"black box, attempt {windows.attempts + 1}: R's entry read of handle {h:#x} (posted "
                  f"{(pq.t - st['sent'].t) * 1000:.1f} ms after W sent ALLOC_STORE) was answered VALID|SEALED with "
                  f"this ALLOC_STORE's binding (Generation {e[1]}, Data Length {e[2]}, Block Offset {e[3]:#x}) {when}, "
                  f"{until} (each chunk of W's output held {witness.hold_s * 1000:g} ms): the target made the entry "
                  "valid before it had the data", req=req, seen=(repr(EntryFlags(e[0])), e[1]),
                  expected="not VALID|SEALED until the data is in the block")
        loaded = st.get("load")
        if loaded is not None:
            entry, block = loaded
            expect.equal(f"attempt {windows.attempts + 1}: entry (Data Length, Block Offset) read with VALID|SEALED",
                         (entry[2], entry[3]), (len(data), done.block_offset), req="KBTP-TABLE-BIND-ORDER")
            check(block == data, f"attempt {windows.attempts + 1}: the entry read VALID|SEALED (Generation "
                  f"{entry[1]}) twice around a block read, but the block held {block[:8].hex()}... not the data "
                  f"{data[:8].hex()}...", req=req)
        inside = [an for pq, an, _ in mine if asked is not None and left is not None and pq.seq > asked.seq
                  and an.seq < left.seq]
        windows.attempt(bool(inside) and loaded is not None, entry_reads=len(mine), inside_hold=len(inside),
                        read_request_ms=round((asked.t - st["sent"].t) * 1000, 2) if asked else None,
                        held_ms=round((left.t - asked.t) * 1000, 2) if asked and left else None)
    windows.judge()


@pytest.mark.req("KBTP-DLOAD-VALIDITY", "KBTP-GEN-CHANGES", "KBTP-HELLO-FIRST", "KBTP-QUOTA-ALLOC-BOUNDED",
                 "KBTP-FREE-RETURN", "KBTP-TABLE-BIND-ORDER")
@hangs.diagnosed
def test_direct_load_races_free(kbtp_target: TargetUnderTest, session_seed: int) -> None:
    """A DIRECT_LOAD reader (entry, block, entry) races a writer that frees and re-allocates its handle
    while another initiator (when the declared geometry has room for it) churns the ring: whenever both
    entry reads show the same Generation with VALID and SEALED, the first showed the Data Length and Block Offset
    that Generation's ALLOC_STORE completed with (else the entry's state was written before its location), and the
    block read between them holds exactly the data stored under that Generation."""
    kbtp_target.require(DL)
    runs = max(2, kbtp_target.interleavings // 5)
    consistent = sum(_direct_load_race(kbtp_target, session_seed * 100_000 + 50_000 + i, i) for i in range(runs))
    evidence.note(f"{consistent} consistent direct loads checked over {runs} interleavings")


def _direct_load_race(kbtp_target: TargetUnderTest, seed: int, i: int) -> int:
    """One interleaving of writer W (alloc by RDMA Read / free, 4 times), reader R (direct loads) and, room
    permitting, churner C; returns how many consistent direct loads it checked."""
    p = kbtp_target.params
    shared, partitions = p.capacity()
    plan = kbtp_target.sessions(min(3, shared + partitions), need="a writer and a DIRECT_LOAD reader")
    if len(plan) < 2:
        kbtp_target.sessions(2, need="a writer and a DIRECT_LOAD reader")
    bed = kbtp_target.bed(seed, label=f"direct-load-race-{i}")
    w, r = bed.initiator("W"), bed.initiator("R")
    c = bed.initiator("C") if len(plan) > 2 else None
    stored: dict[int, bytes] = {}  # Generation -> data stored under it (handle of W)
    located: dict[int, tuple[int, int]] = {}  # Generation -> (octets stored, Block Offset of the COMPLETION)
    seen: list[tuple[Any, bytes]] = []  # (first entry read, block octets) of consistent direct loads
    done = {"w": False}

    def writer() -> Gen:
        yield from bed.open(w, plan[0])
        h = w.handle(0)
        for k in range(4):
            data = bytes([0xA0 + k]) * min(48 + 8 * k, p.block_size)  # within any declared Block Size
            # By RDMA Read, so the target's data write takes steps others can interleave with.
            src = w.buffer(len(data), Access.REMOTE_READ, data)
            a = yield from w.alloc_store(h, data, source=src)
            expect.status_is(a, Status.OK, req="KBTP-QUOTA-ALLOC-BOUNDED", what=f"W ALLOC_STORE {k}")
            stored[a.generation] = data
            located[a.generation] = (len(data), a.block_offset)
            for _ in range(20):  # stay bound a while, so direct loads of this binding can complete
                yield from pause("W-bound")
            f = yield from w.free(h)
            expect.status_is(f, Status.OK, req="KBTP-FREE-RETURN", what=f"W FREE {k}")
        done["w"] = True

    def churn(c: HarnessInitiator) -> Gen:
        ack = yield from bed.open(c, plan[2])
        for k in range(4):
            hk = c.handle(k % max(1, ack.allocation_quota))
            a = yield from c.alloc_store(hk, bytes([0xC0 + k]) * 96)
            if a.status == Status.OK:
                yield from c.free(hk)

    def reader() -> Gen:
        ack = yield from bed.open(r, Features(plan[1] | DL))
        if not ack.features & DL:
            inconclusive("the reader was not granted DIRECT_LOAD, which PICS declares")
        ready = yield from wait_until(lambda: w.session is not None, name="R-wait-W", timeout=1.0)
        if not ready:
            inconclusive("the writer never got its session")
        h = w.handle(0)
        for _ in range(400):  # until the writer is done (bounded)
            if done["w"]:
                return
            e1 = yield from r.read_entry(h, req="KBTP-DLOAD-VALIDITY")
            if e1 is None or not (e1[0] & EntryFlags.VALID and e1[0] & EntryFlags.SEALED):
                yield from pause("R-retry")
                continue
            wc, block = yield from r.rdma_read(ack.direct_load.pool.stag, e1[3], e1[2], req="KBTP-DLOAD-VALIDITY")
            e2 = yield from r.read_entry(h, req="KBTP-DLOAD-VALIDITY")
            if wc.ok and e2 is not None and e2[1] == e1[1] and e2[0] & EntryFlags.VALID and \
                    e2[0] & EntryFlags.SEALED:
                seen.append((e1, block))

    actors = {"W": writer(), "R": reader()}
    if c is not None:
        actors["C"] = churn(c)
    bed.run(**actors)
    for entry, block in seen:
        gen, where = entry[1], (entry[2], entry[3])
        want = stored.get(gen)
        check(want is not None, f"interleaving {i}: a consistent direct load showed Generation {gen}, under which "
              f"nothing was stored [{bed.replay_hint()}]", req="KBTP-GEN-CHANGES")
        check(where == located[gen], f"interleaving {i}: a direct load's entry reads both showed Generation {gen} "
              f"VALID|SEALED, the first with Data Length {where[0]}, Block Offset {where[1]:#x}, not the "
              f"{located[gen][0]} octets stored and the Block Offset {located[gen][1]:#x} its ALLOC_STORE completed "
              f"with: the entry's Flags and Generation were written before its location [{bed.replay_hint()}]",
              req="KBTP-TABLE-BIND-ORDER", seen=where, expected=located[gen])
        check(block == want, f"interleaving {i}: a direct load with both entry reads at Generation {gen} "
              f"(VALID, SEALED) read {block[:8].hex()}..., stored was {want[:8].hex() if want else None}"
              f"... [{bed.replay_hint()}]", req="KBTP-DLOAD-VALIDITY")
    return len(seen)
