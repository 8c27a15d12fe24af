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
from kvconform.conformance.kbtp import expect
from kvconform.conformance.kbtp.blackbox import Partition, Reqs, open_partition
from kvconform.fixtures.kbtp import TargetUnderTest
from kvconform.kbtp.constants import Features, Status
from kvconform.targets.kbtp_bed import Bed
from kvconform.targets.kbtp_client import Gen, HarnessInitiator
from kvconform.verdicts import check, inconclusive, not_applicable, pass_basis

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


@pytest.mark.parametrize("geometry", [pytest.param(g, id=DECLARED if g is None else f"F{g[0]}-N{g[1]}")
                                      for g in GEOMETRIES])
@pytest.mark.req("KBTP-RING-NO-LOSS", "KBTP-HELLO-FIRST")
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
    if not kbtp_target.has(Features.DIRECT_ALLOC) or p.partition_count < max(1, p.quota):
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
        yield from _cycle(bed, [(ini, q) for ini, q in zip(inis, quotas, strict=True) if q], f, n)

    bed.run_one(scenario())
    how = "reconfigured for the check" if reconfigure else f"declared, held by {count} initiator(s)"
    pass_basis(f"geometry reached: shared ring F {f}, N {n} ({boundary(f, n)}), {how}")


def _cycle(bed: Bed, holders: list[tuple[HarnessInitiator, int]], f: int, n: int) -> Gen:
    """Bind every block (each holder its quota), then free and rebind one handle at a time, round the holders,
    until more than 2N tickets went through the ring."""
    held: dict[tuple[str, int], int] = {}  # (initiator, handle) -> Block Offset while bound
    tickets = 0

    def take(ini: HarnessInitiator, h: int) -> Gen:
        nonlocal tickets
        r = yield from ini.alloc_store(h, b"ring", req=R_RING)
        tickets += 1
        expect.status_is(r, Status.OK, req=R_RING, what=f"{ini.name}'s ALLOC_STORE of ticket {tickets - 1} (F {f}, "
                         f"N {n})")
        other = [k for k, off in held.items() if off == r.block_offset]
        check(not other, f"{ini.name}'s ALLOC_STORE of ticket {tickets - 1} (F {f}, N {n}) completed with Block "
              f"Offset {r.block_offset:#x}, which bound handle {other[0][1] if other else 0:#x} of "
              f"{other[0][0] if other else ''} holds", req=R_RING, seen=f"{r.block_offset:#x}",
              expected=f"none of {sorted(hex(x) for x in held.values())}")
        held[(ini.name, h)] = r.block_offset

    slots = [(ini, ini.handle(i)) for ini, q in holders for i in range(q)]
    for ini, h in slots:
        yield from take(ini, h)
    i = 0
    while tickets <= 2 * n:
        ini, h = slots[i % len(slots)]
        fr = yield from ini.free(h, req=R_RING)
        expect.status_is(fr, Status.OK, req=R_RING, what=f"{ini.name}'s FREE of handle {h:#x} (F {f}, N {n})")
        del held[(ini.name, h)]
        yield from take(ini, h)
        i += 1


def _partition_ring(kbtp_target: TargetUnderTest, seed: int, f: int, n: int, serves: str) -> None:
    """The point on the DIRECT_ALLOC partition ring, whose F is the quota and whose N HELLO_ACK announces."""
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
        tickets, i = f, 0
        while tickets <= 2 * n:
            h = sorted(part.bound)[i % f]
            yield from part.free(h)
            yield from part.alloc(bytes([0x51, tickets & 0xFF]) * 4)
            tickets += 1
            i += 1

    bed.run_one(scenario())
    if (seen["f"], seen["n"]) != (f, n):
        not_applicable(f"the target serves one geometry, declared: {serves}, and DIRECT_ALLOC partitions of F "
                       f"{seen['f']}, N {seen['n']} (HELLO_ACK); the point F {f}, N {n} ({boundary(f, n)}) is neither")
    pass_basis(f"geometry reached: DIRECT_ALLOC partition ring F {f}, N {n} ({boundary(f, n)}), announced in "
               "HELLO_ACK")
