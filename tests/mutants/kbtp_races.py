"""Race targets for the black-box churn of a target without DIRECT_ALLOC (conformance/kbtp/blackbox.py, `Churn`;
issue 23 item 1): what the churn can and cannot see from outside, measured by tools/race_catch_rates.py.

The race mutants of tests/mutants/kbtp.py break their rule inside a window the reference's own loop keeps one step
wide (a ticket taken and its slot read in consecutive steps; a freed block unchanged until its FREE completes, since
quotas keep every other allocation off it): served without DIRECT_ALLOC nothing the harness receives differs from the
reference's answers. These targets widen the window the way a real target may, and break the rule inside it:

- ``StagedAllocation`` (correct): an allocation takes its ticket, then fetches the data into a staging buffer (an RDMA
  Read of the initiator's buffer when the data is not inline) and only then reads and consumes its slot: frees of
  other sessions reach the slot of a ticket taken and not yet read, and must be deferred. The churn's invariants hold.
- ``StagedOverwritesUnconsumedSlot`` (KBTP-FREE-NO-OVERWRITE): the same, and a free writes its slot even when the
  allocation owning it has not read it; that allocation then waits for ever (its Sequence never comes).
- ``ClearsBeforeEntryUpdate`` (KBTP-FREE-TABLE-FIRST): a free clears the block and returns it to the ring before it
  updates the entry (clearing freed blocks is what a multi-domain target SHOULD do); a LOAD between the two reads a
  cleared block under the old binding.
"""

from __future__ import annotations

from collections.abc import Generator
from typing import Any

from kvconform.kbtp.constants import RequestFlags, Status
from kvconform.kbtp.freering import FreeRing, TakenTicket
from kvconform.kbtp.messages import AllocStore
from kvconform.kbtp.target import ReferenceTarget
from kvconform.rdma import Command, wait_completion
from kvconform.targets.kbtp import ReferenceTargetDriver
from tests.mutants.kbtp import _ReturnsBeforeUnbind

Steps = Generator[Command, Any, Any]


class _Staged(ReferenceTarget):
    def exec_alloc_store(self, ctx: Any) -> Steps:
        """Ticket first, then the data into the session's staging slot, then the slot, the block and the entry."""
        assert isinstance(ctx.msg, AllocStore)
        ring = self.ring_for(ctx.record)
        assert ring is not None
        ctx.record.pending_tickets += 1
        taken = self.take_ticket(ring, ctx.record)
        s, msg = ctx.session, ctx.msg
        base = s.slot * self.config.block_size
        ok = True
        if msg.inline is not None:
            s.staging.write(base, msg.inline)
        elif msg.data.length:
            wr = self._next_wr()
            s.conn.post_read(s.staging.sge(base, msg.data.length), msg.data.stag, msg.data.tagged_offset, wr_id=wr,
                             tag=f"stage{msg.request_id}")
            wc = yield from wait_completion(s.conn.cq, lambda c: c.wr_id == wr)
            ok = wc.ok
        block = yield from self.wait_for_slot(ring, taken)
        yield from self.consume_slot(ring, taken)
        ctx.record.pending_tickets -= 1
        if not ok:  # as the reference does when its RDMA Read of the data fails: the block goes back
            yield from self.return_block(ring, block, ctx.record)
            return
        if msg.data.length:
            self.pool.write(block, s.staging.read(base, msg.data.length))
        yield from self.bind_entry(ctx, block, msg.data.length, bool(ctx.flags & RequestFlags.SEAL))
        self.complete(ctx, Status.OK, self.table.entry(msg.handle))


class StagedAllocation(ReferenceTargetDriver):
    """Correct (no rule broken): the ticket is taken before the data is fetched, so the window of the text's deferred
    free spans an RDMA Read; the calibration of the churn against a correct target with a wide window."""

    target_class = _Staged


class _StagedOverwrites(_Staged):
    def can_write_slot(self, ring: FreeRing, taken: TakenTicket) -> bool:
        return True


class StagedOverwritesUnconsumedSlot(ReferenceTargetDriver):
    """KBTP-FREE-NO-OVERWRITE: with the ticket taken before the data is fetched, a free writes its slot even when the
    allocation owning it has not read it."""

    target_class = _StagedOverwrites


class _ClearsBeforeEntry(_ReturnsBeforeUnbind):
    def should_clear(self, ring: FreeRing, record: Any) -> bool:
        return True


class ClearsBeforeEntryUpdate(ReferenceTargetDriver):
    """KBTP-FREE-TABLE-FIRST: a free clears the block and returns it to the ring before clearing the entry."""

    target_class = _ClearsBeforeEntry


# name -> (the rule it breaks, or None for a correct target; the check of conformance/kbtp/target/test_races.py whose
# churn judges it), for tools/race_catch_rates.py and tests/kbtp/test_race_churn.py; the race mutants of
# tests/mutants/kbtp.py are measured beside them
CHURN_TARGETS: dict[str, tuple[str | None, str]] = {
    "OverwritesUnconsumedSlot": ("KBTP-FREE-NO-OVERWRITE", "test_deferred_free_example"),
    "FreeReturnsBeforeEntryUpdate": ("KBTP-FREE-TABLE-FIRST", "test_free_updates_entry_before_ring"),
    "SequenceBeforeBlock": ("KBTP-FREE-SLOT-ORDER", "test_free_writes_block_before_sequence"),
    "StagedAllocation": (None, "test_deferred_free_example"),
    "StagedOverwritesUnconsumedSlot": ("KBTP-FREE-NO-OVERWRITE", "test_deferred_free_example"),
    "ClearsBeforeEntryUpdate": ("KBTP-FREE-TABLE-FIRST", "test_free_updates_entry_before_ring"),
}
