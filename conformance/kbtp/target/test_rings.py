"""kbtp-target: the free-block rings at the geometries where wrong rings differ (KBTP "Free-Block Ring":
"N = 2^n is a power of two not smaller than F"; the initialisation of slots F..N-1 as empty; "With these
rules no block is ever lost or handed out twice").

The check holds a whole ring (every block of it bound), then frees and rebinds one handle at a time until more
tickets than 2N have gone through the ring (Tail tickets land on the empty slots F..N-1, then wrap). Every
allocation completes within a bounded wait naming the ring rule, and no Block Offset is handed out while another
bound handle holds it. The shared ring (target-executed allocations) is observed through what the completions
carry; a DIRECT_ALLOC partition ring through the slots the harness reads itself.

The points: F < N (empty slots to initialise and land on), F == N (no empty slot: the Tail starts on slot 0) and
the smallest masked ring (n = 1), from ``kvconform.sweep.pick``, and the geometry the target declares. A target
the harness reconfigures per check (in-process) takes every point on its shared ring. A target that serves one
geometry (over a wire, on a device) reaches a point only where its declared shared ring (PICS kbtp.target.pool:
shared_blocks, ring_slots), or its DIRECT_ALLOC partition ring (F = the Allocation Quota, N announced in
HELLO_ACK), is that point; any other point is not-applicable, with the geometries it does serve. Each pass names
the geometry it reached.
"""

from __future__ import annotations

from typing import Any

import pytest

from kvconform import sweep
from kvconform.conformance.kbtp import diagnose, expect, hangs
from kvconform.conformance.kbtp.blackbox import TICKETS, Partition, Reqs, open_partition
from kvconform.fixtures.kbtp import TargetUnderTest
from kvconform.kbtp.constants import EMPTY_BLOCK_OFFSET, Features, Status
from kvconform.targets.kbtp_bed import Bed
from kvconform.targets.kbtp_client import Ended, Gen, HarnessInitiator
from kvconform.verdicts import Violation, check, inconclusive, not_applicable, pass_basis, violation

R_RING = "KBTP-RING-NO-LOSS"
# (F, N): F < N (empty slots to initialise and land on), F == N (no empty slot: the Tail starts on slot 0),
# and the smallest masked ring (n = 1).
GEOMETRIES: list[tuple[int, int] | None] = [None, *sweep.pick([(3, 4), (4, 4), (2, 2)],
                                                                [(5, 8), (8, 8), (1, 2), (9, 16)])]
DECLARED = "declared"  # the id of the point at the target's declared shared ring


def boundary(f: int, n: int) -> str:
    """Which boundary a ring of F blocks and N slots sits on."""
    kinds = ["F < N" if f < n else "F == N"]
    if n == 2:
        kinds.append("n = 1")
    return ", ".join(kinds)


# A point the harness reconfigures to holds every ticket of a fresh ring, so what an allocation gets names the
# initialisation and wrap rules (diagnose.shared_rule); the declared ring of an in-process target (fresh in each bed)
# may blame them too, without claiming to pass them (@pytest.mark.blames); of a served target, only the empty marker
# and the invariant.
POINT_RULES = (diagnose.INIT, diagnose.WRAP)


@pytest.mark.parametrize("geometry", [
    pytest.param(g, id=DECLARED if g is None else f"F{g[0]}-N{g[1]}",
                 marks=pytest.mark.blames(*POINT_RULES) if g is None else pytest.mark.req(*POINT_RULES))
    for g in GEOMETRIES])
@pytest.mark.req("KBTP-RING-NO-LOSS", "KBTP-RING-EMPTY", "KBTP-HELLO-FIRST")
@hangs.diagnosed_ring
def test_shared_ring_geometries(geometry: tuple[int, int] | None, kbtp_target: TargetUnderTest, seed: int) -> None:
    """A ring of F blocks and N slots, all of it held at once: every block bound, then one handle freed and
    rebound until more than 2N tickets went round; every allocation completes, and never with a Block Offset
    another bound handle holds."""
    p = kbtp_target.params
    declared = (p.shared_count, p.ring_slots)
    if geometry is None or (kbtp_target.fixed_geometry and geometry == declared):
        _declared_shared_ring(kbtp_target, seed)
        return
    f, n = geometry
    if not kbtp_target.fixed_geometry:
        _shared_ring(kbtp_target, seed, f, n, reconfigure=True)
        return
    serves = f"shared ring F {declared[0]}, N {declared[1]} (PICS kbtp.target.pool)"
    if not p.sure_grants & Features.DIRECT_ALLOC:
        not_applicable(f"the target serves one geometry, declared: {serves}, and no DIRECT_ALLOC partition; the "
                       f"point F {f}, N {n} ({boundary(f, n)}) is not it")
    if p.quota != f:
        not_applicable(f"the target serves one geometry, declared: {serves}, and DIRECT_ALLOC partitions of F = the "
                       f"quota {p.quota} (PICS kbtp.target.quota); the point F {f}, N {n} ({boundary(f, n)}) is "
                       "neither")
    _partition_ring(kbtp_target, seed, f, n, serves)


def _declared_shared_ring(kbtp_target: TargetUnderTest, seed: int) -> None:
    """The declared shared ring, held whole by as many initiators as the declared geometry serves at once;
    not-applicable when their quotas cannot hold all of it."""
    p = kbtp_target.params
    if p.ring_slots is None:
        inconclusive("PICS kbtp.target.pool declares no ring_slots: the shared ring's N is not known")
    sessions = p.capacity()[0] if p.quota else 0
    if sessions * p.quota < p.shared_count:
        not_applicable(f"the declared geometry cannot hold its shared ring whole: {sessions} initiator(s) at once x "
                       f"quota {p.quota} < F {p.shared_count} ({p.describe_capacity()})")
    _shared_ring(kbtp_target, seed, p.shared_count, int(p.ring_slots), reconfigure=False)


def _shared_ring(kbtp_target: TargetUnderTest, seed: int, f: int, n: int, *, reconfigure: bool) -> None:
    """The shared ring of F blocks and N slots, held whole: reconfigured to it as one initiator's quota (a target
    the harness configures per check), or at the declared geometry by as many initiators as it serves."""
    p = kbtp_target.params
    features = p.features & ~Features.DIRECT_ALLOC  # the whole pool is the shared ring
    if reconfigure:
        bed = kbtp_target.bed(seed, label=f"ring-F{f}-N{n}", blocks=f, shared_blocks=f, ring_slots=n, quota=f,
                              max_initiators=1, features=features)
        count = 1
    else:
        bed = kbtp_target.bed(seed, label=f"ring-declared-F{f}-N{n}")
        count = max(1, p.capacity()[0])
    inis = [bed.initiator(f"A{k}") for k in range(count)]

    def scenario() -> Gen:
        quotas = []
        for ini in inis:
            ack = yield from bed.open(ini)
            quotas.append(ack.allocation_quota)
        if reconfigure and quotas[0] != f:
            inconclusive(f"the target set Allocation Quota {quotas[0]} for a pool of {f} blocks with one initiator; "
                         f"the check needs the whole ring ({f}) as its quota")
        total = sum(quotas)
        if total < f:
            inconclusive(f"the quotas granted ({quotas}) hold {total} of the shared ring's {f} blocks: the ring "
                         "cannot be held whole")
        # An in-process target is fresh in each bed: at its declared geometry too every ticket is the harness's,
        # so what an allocation gets may name the ring rule (cited there only as a blame: a pass claims neither)
        fresh = reconfigure or not kbtp_target.fixed_geometry
        yield from _cycle(bed, [(ini, q) for ini, q in zip(inis, quotas, strict=True) if q], f, n, fresh=fresh)

    try:
        bed.run_one(scenario())
    except Violation as v:
        if reconfigure and f == n > 1 and v.requirement == diagnose.INIT and "Tail starts" in v.what:
            _tail_start_or_tail_slots(kbtp_target, seed, f, n, features, v)
        raise
    how = "reconfigured for the check" if reconfigure else f"declared, held by {count} initiator(s)"
    pass_basis(f"geometry reached: shared ring F {f}, N {n} ({boundary(f, n)}), {how}")


def _tail_start_or_tail_slots(kbtp_target: TargetUnderTest, seed: int, f: int, n: int, features: Features,
                              v: Violation) -> None:
    """The first free of a fresh ring of F == N blocks did not reach ticket F: either the Tail did not start at
    Slot Offset 16 * (F mod N) = 0 (KBTP-RING-INIT), or the Tail's Slot Offset does not follow its ticket. The same
    cycle on a fresh ring of F - 1 < N blocks, where both rules give the Tail's first slot F - 1, tells them apart:
    it goes round (KBTP-RING-INIT it was), it fails at the wrap (KBTP-RING-WRAP), or it fails before (no rule of
    its own: KBTP-RING-NO-LOSS)."""
    probe = kbtp_target.bed(seed, label=f"ring-probe-F{f - 1}-N{n}", blocks=f - 1, shared_blocks=f - 1, ring_slots=n,
                            quota=f - 1, max_initiators=1, features=features)
    a = probe.initiator("P")

    def scenario() -> Gen:
        ack = yield from probe.open(a)
        if ack.allocation_quota != f - 1:
            return False
        yield from _cycle(probe, [(a, f - 1)], f - 1, n, fresh=True)
        return True

    where = f"the same cycle on a fresh ring of F {f - 1} < N {n}"
    try:
        went_round = probe.run_one(scenario())
    except Violation as pv:
        rule = diagnose.WRAP if pv.requirement == diagnose.WRAP else R_RING
        violation(f"{v.what}; {where} fails too ({pv.what})", req=rule, seen=v.seen, expected=v.expected)
    if went_round:
        violation(f"{v.what}; {where} goes round: the Tail's slots follow its tickets, only its start is wrong",
                  req=diagnose.INIT, seen=v.seen, expected=v.expected)


def _shared_free_completes(kbtp_target: TargetUnderTest, seed: int) -> bool:
    """Whether an ALLOC_STORE and a FREE on the target's shared ring (a session without DIRECT_ALLOC) complete OK."""
    bed = kbtp_target.bed(seed, label="ring-free-control")
    a = bed.initiator("C")

    def control() -> Gen:
        ack = yield from a.hello(Features(0), allow_end=True)
        if isinstance(ack, Ended) or ack.status != Status.OK or not ack.allocation_quota:
            return False
        r = yield from a.alloc_store(a.handle(0), b"free-control", req=R_RING, allow_end=True)
        if isinstance(r, Ended) or r.status != Status.OK:
            return False
        freed = yield from a.free(a.handle(0), req=R_RING)
        return not isinstance(freed, Ended) and freed.status == Status.OK

    try:
        return bool(bed.run_one(control()))
    except Violation:
        return False


def _cycle(bed: Bed, holders: list[tuple[HarnessInitiator, int]], f: int, n: int, *, fresh: bool) -> Gen:
    """Bind every block (each holder its quota), then free and rebind one handle at a time, round the holders,
    until more than 2N tickets went through the ring. With the whole ring held, each free leaves exactly one block
    in the ring, so the allocation after it must get that block. ``fresh``: the ring was made for the check, so
    ticket t is the t-th allocation and a wrong block or a hang names the ring rule at that ticket
    (diagnose.shared_rule)."""
    held: dict[tuple[str, int], int] = {}  # (initiator, handle) -> Block Offset while bound
    tickets = 0

    def take(ini: HarnessInitiator, h: int, freed: int | None) -> Gen:
        nonlocal tickets
        t = tickets
        if len(held) != f - 1:
            freed = None  # the ring does not hold exactly the one block just freed (quotas not filling it)
        what = f"{ini.name}'s ALLOC_STORE of ticket {t} (F {f}, N {n})"
        try:
            r = yield from ini.alloc_store(h, b"ring", req=R_RING)
        except Violation as v:
            if fresh and freed is not None:
                rule = diagnose.shared_rule("hang", t, f, n)
                diagnose.reraise_as(v, rule, f"{what}: the block {freed:#x} its free returned (Tail ticket {t}) never "
                                    f"reached it; {_why(rule, t, f, n)}")
            raise
        tickets += 1
        expect.status_is(r, Status.OK, req=R_RING, what=what)
        got = r.block_offset
        check(got != EMPTY_BLOCK_OFFSET, f"{what} completed with Block Offset all ones: an empty slot taken for a "
              "block", req=diagnose.EMPTY, seen=f"{got:#x}")
        other = [k for k, off in held.items() if off == got]
        if fresh and freed is not None:
            kind = "held" if other else "other"
            for rule in POINT_RULES:
                if rule in _rules_at(t, f, n):
                    broken = got != freed and diagnose.shared_rule(kind, t, f, n) == rule
                    check(not broken, f"{what} completed with Block Offset {got:#x}, not the block {freed:#x} the "
                          f"free of Tail ticket {t} returned{' (bound to another handle)' if other else ''}; "
                          f"{_why(rule, t, f, n)}", req=rule, seen=f"{got:#x}", expected=f"{freed:#x}")
        check(not other, f"{what} completed with Block Offset {got:#x}, which bound handle "
              f"{other[0][1] if other else 0:#x} of {other[0][0] if other else ''} holds", req=R_RING,
              seen=f"{got:#x}", expected=f"none of {sorted(hex(x) for x in held.values())}")
        if freed is not None:
            check(got == freed, f"{what} completed with Block Offset {got:#x}; the ring held only the block {freed:#x} "
                  "the free before it returned", req=R_RING, seen=f"{got:#x}", expected=f"{freed:#x}")
        held[(ini.name, h)] = got

    def free(ini: HarnessInitiator, h: int) -> Gen:
        u = tickets  # on a fresh ring held whole, the Tail ticket of this free is the next allocation's ticket
        what = f"{ini.name}'s FREE of handle {h:#x} (F {f}, N {n})"
        try:
            fr = yield from ini.free(h, req=R_RING)
        except Violation as v:
            if fresh:
                rule = diagnose.shared_rule("hang", u, f, n)
                diagnose.reraise_as(v, rule, f"{what}, Tail ticket {u}, did not complete; {_why(rule, u, f, n)}")
            raise
        if fresh and (isinstance(fr, Ended) or fr.status != Status.OK):
            rule = diagnose.shared_rule("hang", u, f, n)
            outcome = f"ended ({fr.reason})" if isinstance(fr, Ended) else expect.status_name(fr.status)
            check(rule == R_RING, f"{what}, Tail ticket {u}: {outcome}; {_why(rule, u, f, n)}", req=rule,
                  seen=outcome, expected="OK")
        expect.status_is(fr, Status.OK, req=R_RING, what=what)

    slots = [(ini, ini.handle(i)) for ini, q in holders for i in range(q)]
    for ini, h in slots:
        yield from take(ini, h, None)
    i = 0
    while tickets <= 2 * n:
        # the last bound first: a slot whose stale content is the first block hands out a block still bound
        ini, h = slots[-1 - i % len(slots)]
        yield from free(ini, h)
        freed = held.pop((ini.name, h))
        yield from take(ini, h, freed)
        i += 1


def _rules_at(t: int, f: int, n: int) -> tuple[str, ...]:
    """The ring rules the allocation of ticket t (right after a free, fresh ring) bears on."""
    rules = []
    if t < n or t == f == n:
        rules.append(diagnose.INIT)
    if t in (n, 2 * n):
        rules.append(diagnose.WRAP)
    return tuple(rules)


def _why(rule: str, t: int, f: int, n: int) -> str:
    if rule == diagnose.INIT and t == f == n:
        return (f"on a ring with F == N the Tail starts at Ticket F and Slot Offset 16 * (F mod N) = 0, where ticket "
                f"{t} reads")
    if rule == diagnose.INIT:
        return f"slot {t} (F <= {t} < N) starts as {{Sequence {t} - N, all ones}}: empty until the free of ticket {t}"
    if rule == diagnose.WRAP:
        return (f"every earlier free came back; at ticket {t} the Slot Offset of Head and Tail wraps to 0 at the end "
                f"of the ring (16 * ({t} mod {n}))")
    return "the ring lost the block or handed it to another ticket"


def _partition_ring(kbtp_target: TargetUnderTest, seed: int, f: int, n: int, serves: str) -> None:
    """The point on the DIRECT_ALLOC partition ring, whose F is the quota and whose N HELLO_ACK announces."""
    # before the partition's frees (a target may not survive a first free that goes wrong): whether a FREE
    # completes on the shared ring, which tells a wrong Tail start from a broken free path
    free_works = _shared_free_completes(kbtp_target, seed)
    bed = kbtp_target.bed(seed, label=f"ring-partition-F{f}-N{n}")
    seen: dict[str, Any] = {}

    def scenario() -> Gen:
        part: Partition = yield from open_partition(bed, "P", Features.DIRECT_ALLOC,
                                                    Reqs.cited(R_RING),
                                                    hold=False)
        seen.update(f=part.quota, n=part.slots)
        if (part.quota, part.slots) != (f, n):
            return
        for k in range(f):
            yield from part.alloc(bytes([0x50, k]) * 4)
        # the first FetchAdd on the Head returned Ticket 0: the ring was at its initialisation
        seen["initial"] = part.tail == part.quota % TICKETS
        tickets, i = f, 0
        while tickets <= 2 * n:
            h = sorted(part.bound)[i % f]
            yield from part.free(h)
            seen["freed"] = True
            yield from part.alloc(bytes([0x51, tickets & 0xFF]) * 4)
            tickets += 1
            i += 1

    try:
        bed.run_one(scenario())
    except Violation as v:
        if v.requirement == R_RING and seen.get("initial") and not seen.get("freed") and free_works:
            # No FetchAdd has advanced the Tail yet: the Slot Offset the first free gets is the Tail's initial one
            # (KBTP-RING-INIT); the wrap (KBTP-RING-WRAP) has not come into play
            violation(f"{v.what}; the first FREE on the partition ring (F {f}, N {n}), observed at its "
                      "initialisation (the Head's first FetchAdd returned Ticket 0), failed, while a FREE on the "
                      "target's shared ring completes: before any FetchAdd advanced it, the Tail's Slot Offset must "
                      f"be 16 * (F mod N) = {16 * (f % n)}", req=diagnose.INIT, seen=v.seen, expected=v.expected)
        raise
    if (seen["f"], seen["n"]) != (f, n):
        not_applicable(f"the target serves one geometry, declared: {serves}, and DIRECT_ALLOC partitions of F "
                       f"{seen['f']}, N {seen['n']} (HELLO_ACK); the point F {f}, N {n} ({boundary(f, n)}) is neither")
    pass_basis(f"geometry reached: DIRECT_ALLOC partition ring F {f}, N {n} ({boundary(f, n)}), announced in "
               "HELLO_ACK")
