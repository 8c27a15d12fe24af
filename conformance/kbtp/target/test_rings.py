"""kbtp-target: the shared free-block ring at the geometries where wrong rings differ (KBTP "Free-Block Ring":
"N = 2^n is a power of two not smaller than F"; the initialisation of slots F..N-1 as empty; "With these
rules no block is ever lost or handed out twice").

A black box does not expose the shared ring (target-executed allocations), so the check observes it through
what the completions carry: one initiator holding the whole ring as its quota binds every block, then frees
and rebinds one handle at a time until more tickets than 2N have gone through the ring (Tail tickets land on
the empty slots F..N-1, then wrap). Every allocation completes within a bounded wait naming the ring rule, and
no Block Offset is handed out while another bound handle holds it. The geometries (F < N, F == N, the
smallest ring) come from ``kvconform.sweep.pick``; a target that cannot take one is inconclusive.
"""

from __future__ import annotations

import pytest

from kvconform import sweep
from kvconform.conformance.kbtp import expect
from kvconform.fixtures.kbtp import TargetUnderTest
from kvconform.kbtp.constants import Features, Status
from kvconform.targets.kbtp_client import Gen
from kvconform.verdicts import check, inconclusive

R_RING = "KBTP-RING-NO-LOSS"
# (F, N): F < N (empty slots to initialise and land on), F == N (no empty slot: the Tail starts on slot 0),
# and the smallest masked ring (n = 1).
GEOMETRIES = sweep.pick([(3, 4), (4, 4), (2, 2)], [(5, 8), (8, 8), (1, 2), (9, 16)])


@pytest.mark.parametrize("geometry", [pytest.param(g, id=f"F{g[0]}-N{g[1]}") for g in GEOMETRIES])
@pytest.mark.req("KBTP-RING-NO-LOSS", "KBTP-HELLO-FIRST")
def test_shared_ring_geometries(geometry: tuple[int, int], kbtp_target: TargetUnderTest, seed: int) -> None:
    """A shared ring of F blocks and N slots, all of it one initiator's quota: every block bound, then one
    handle freed and rebound until more than 2N tickets went round; every allocation completes, and never with
    a Block Offset another bound handle holds."""
    f, n = geometry
    features = kbtp_target.params.features & ~Features.DIRECT_ALLOC  # the whole pool is the shared ring
    bed = kbtp_target.bed(seed, label=f"ring-F{f}-N{n}", blocks=f, shared_blocks=f, ring_slots=n, quota=f,
                          max_initiators=1, features=features)
    a = bed.initiator("A")

    def scenario() -> Gen:
        ack = yield from bed.open(a)
        if ack.allocation_quota != f:
            inconclusive(f"the target set Allocation Quota {ack.allocation_quota} for a pool of {f} blocks with one "
                         f"initiator; the check needs the whole ring ({f}) as its quota")
        held: dict[int, int] = {}  # handle -> Block Offset while bound
        tickets = 0

        def take(h: int) -> Gen:
            nonlocal tickets
            r = yield from a.alloc_store(h, b"ring", req=R_RING)
            tickets += 1
            expect.status_is(r, Status.OK, req=R_RING, what=f"ALLOC_STORE of ticket {tickets - 1} (F {f}, N {n})")
            other = [k for k, off in held.items() if off == r.block_offset]
            check(not other, f"ALLOC_STORE of ticket {tickets - 1} (F {f}, N {n}) completed with Block Offset "
                  f"{r.block_offset:#x}, which bound handle {other[0] if other else 0:#x} holds", req=R_RING,
                  seen=f"{r.block_offset:#x}", expected=f"none of {sorted(hex(x) for x in held.values())}")
            held[h] = r.block_offset

        for i in range(f):
            yield from take(a.handle(i))
        i = 0
        while tickets <= 2 * n:
            h = a.handle(i % f)
            fr = yield from a.free(h, req=R_RING)
            expect.status_is(fr, Status.OK, req=R_RING, what=f"FREE of handle {h:#x} (F {f}, N {n})")
            del held[h]
            yield from take(h)
            i += 1

    bed.run_one(scenario())
