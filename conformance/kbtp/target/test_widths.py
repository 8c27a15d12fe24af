"""kbtp-target: integer widths driven through their wrap (KBTP "Block Table": "Generation never takes the
value zero"; "Block Unmapped Store" 4 and "Block Free" 2: "incremented by one, skipping zero").

The Generation is a 16-bit counter of a table entry. A target that keeps it in a wider integer and masks it,
or that wraps it to zero, differs from a correct one only at 0xFFFF -> next; the check drives one handle
through that step from whatever Generation the target hands out (no preset), with the fastest legal
sequence the text offers: a pipelined 1-octet inline ALLOC_STORE and FREE of one handle, whose completions
each carry the entry's current Generation ("in a completion it is the entry's current generation").

It is budgeted: PICS ``kbtp.target.generation_cycles`` (default 32768, enough to pass 0xFFFF from any
start) and a wall-clock bound; a target that does not reach the wrap within them is inconclusive with the
count reached, never pass.
"""

from __future__ import annotations

import time

import pytest

from kvconform import evidence
from kvconform.conformance.kbtp import expect, hangs
from kvconform.fixtures.kbtp import TargetUnderTest
from kvconform.kbtp.constants import Status
from kvconform.kbtp.messages import AllocStore, Free
from kvconform.targets.kbtp_client import RECV_DEPTH, Ended, Gen, HarnessInitiator
from kvconform.verdicts import check, inconclusive, not_applicable

GEN_MAX = 0xFFFF
WRAP_WALL_S = 150.0  # wall-clock seconds the wrap check may spend driving the target (well inside --timeout)
BATCH = 512  # cycles per fabric run (each run stays far below the bed's step bound)
AFTER_WRAP = 2  # cycles checked past the wrap (1 -> 2 -> 3 ...)


def _successor(g: int) -> int:
    return g % GEN_MAX + 1


def _batch(a: HarnessInitiator, h: int, cycles: int, depth: int) -> Gen:
    """``cycles`` ALLOC_STORE + FREE pairs of handle ``h``, ``depth`` requests in flight (in order on one
    connection, so each FREE follows its ALLOC_STORE); the Generations their completions carry, in order."""
    seen: list[int] = []
    # inline when Max Inline allows one octet, else by RDMA Read from one buffer
    source = None if a.ack.max_inline >= 1 else a.buffer(1, data=b"g")
    sent = 0
    total = 2 * cycles
    outstanding = 0
    while len(seen) < total:
        while sent < total and outstanding < depth:
            rid = a.next_id()
            if sent % 2 == 0:
                msg: AllocStore | Free = a.alloc_store_msg(h, b"g", request_id=rid, source=source)
            else:
                msg = Free(request_id=rid, handle=h)
            a.send(a.enc(msg), signaled=False)
            sent += 1
            outstanding += 1
        what = "ALLOC_STORE" if len(seen) % 2 == 0 else "FREE"
        # An allocation within quota that never completes is a ring fault (blamed on what says it completes),
        # not a Generation one; only the values the completions carry are judged against the Generation rules.
        req = "KBTP-QUOTA-ALLOC-BOUNDED" if what == "ALLOC_STORE" else "KBTP-COMP-SEND"
        reply = yield from a.receive(req=req, what=f"COMPLETION of a pipelined {what} of the wrap drive")
        outstanding -= 1
        if isinstance(reply, Ended) or reply.status != Status.OK:  # (each OK is not recorded: tens of thousands)
            expect.status_is(reply, Status.OK, req=req,
                             what=f"pipelined {what} {len(seen) // 2} of a batch of the Generation drive")
        seen.append(reply.generation)
    return seen


@pytest.mark.req("KBTP-GEN-NONZERO", "KBTP-GEN-NEXT", "KBTP-HELLO-FIRST", "KBTP-QUOTA-ALLOC-BOUNDED", "KBTP-COMP-SEND")
@hangs.diagnosed
def test_generation_wrap(kbtp_target: TargetUnderTest, seed: int) -> None:
    """One handle bound and freed until its Generation passes 0xFFFF, starting from the Generation the target
    hands out: every step is +1, the step after 0xFFFF is 1 (never 0). Bounded by PICS
    kbtp.target.generation_cycles and a wall-clock budget (inconclusive, with the count, when the wrap is not
    reached)."""
    bed = kbtp_target.bed(seed, label="generation-wrap")
    a = bed.initiator("A")
    budget = kbtp_target.params.generation_cycles
    deadline = time.monotonic() + WRAP_WALL_S

    def hello() -> Gen:
        ack = yield from bed.open(a)
        return ack

    ack = bed.run_one(hello())
    a.quiet = True
    if ack.allocation_quota < 1:
        not_applicable("Allocation Quota 0: the check binds a handle")
    depth = max(2, min(ack.request_credits or 2, RECV_DEPTH) // 2 * 2)
    h = a.handle(ack.handle_count - 1)  # the last handle of the range: its width is the range's widest
    history: list[int] = []
    wrapped_at: int | None = None
    done = 0
    while True:
        n = min(BATCH, budget - done)
        if wrapped_at is not None:
            n = min(n, AFTER_WRAP)
        if n <= 0 or time.monotonic() > deadline:
            break
        gens = bed.run_one(_batch(a, h, n, depth))
        done += n
        for g in gens:
            prev = history[-1] if history else None
            history.append(g)
            step = len(history) - 1
            check(g != 0, f"Generation at offset 20 of completion {step} of the drive (after "
                  f"{'none' if prev is None else hex(prev)})", req="KBTP-GEN-NONZERO", seen=g,
                  expected=f"{_successor(prev):#x}" if prev is not None else "non-zero")
            if prev is None:
                continue
            expect.equal(f"Generation after {prev:#x} (completion {step} of the drive)", g, _successor(prev),
                         req="KBTP-GEN-NEXT", offset=20)
            if prev == GEN_MAX and wrapped_at is None:
                wrapped_at = step
        if wrapped_at is not None and len(history) - 1 >= wrapped_at + AFTER_WRAP:
            break
    evidence.record("note", "kbtp-generation-wrap", {"cycles": done, "first": history[0] if history else None,
                                                     "last": history[-1] if history else None,
                                                     "wrapped_at_step": wrapped_at, "budget_cycles": budget})
    if wrapped_at is None:
        inconclusive(f"the Generation of handle {h:#x} went from {history[0]:#x} to {history[-1]:#x} in {done} "
                     f"bind/free cycles without passing 0xFFFF (budget: kbtp.target.generation_cycles = {budget}, "
                     f"{WRAP_WALL_S:g} s); the wrap was not observed")
