"""Initiator mutants that read in the right places in the right order, but issue a read before the previous one
completed (KBTP "Direct Modes": each read is issued only after the previous one completed). Their reads' targets
and order are the reference's, so only the ordering judgement of conformance/kbtp/initiator/test_direct.py catches
them: on the emulated fabric from its steps, over a userspace wire from the harness target's end
(targets/kbtp_order.py). Run in-process (``python:tests.mutants.kbtp:<name>``) or as a process
(`kvconform serve kbtp-initiator --initiator-class tests.mutants.kbtp_overlap:_ReReadWithBlock`)."""

from __future__ import annotations

from collections.abc import Generator
from typing import Any

from kvconform.kbtp.constants import TABLE_ENTRY_SIZE, Status
from kvconform.kbtp.initiator import DirectLoadResult, ReferenceInitiator
from kvconform.kbtp.messages import TableEntry
from kvconform.kbtp.ring import RingSlot
from kvconform.rdma import Command
from kvconform.targets.kbtp import ReferenceInitiatorDriver

Gen = Generator[Command, Any, Any]


class _ReReadWithBlock(ReferenceInitiator):
    """Posts the entry's re-read together with the block read: the re-read does not wait for the block."""

    def direct_load(self, handle: int, generation: int = 0, *, allow_unsealed: bool = False) -> Gen:
        first = yield from self.read_entry(handle)
        if not first.flags & 0x0001:
            return DirectLoadResult(Status.NOT_VALID, first, None, None)
        if not first.flags & 0x0002 and not allow_unsealed:
            return DirectLoadResult(Status.NOT_SEALED, first, None, None)
        ack = self.ack
        assert ack is not None and ack.direct_load is not None
        dl, region, length = ack.direct_load, self._data_region(), first.data_length
        entry_to = dl.table.tagged_offset + TABLE_ENTRY_SIZE * (handle - dl.table_base_handle)
        block_wr, entry_wr = 1 << 40 | self.request_id(), 1 << 40 | self.request_id()

        def both() -> int:
            self.conn.post_read(region.sge(0, length), dl.pool.stag, first.block_offset, wr_id=block_wr)
            self.conn.post_read(self.scratch.sge(8, TABLE_ENTRY_SIZE), dl.table.stag, entry_to, wr_id=entry_wr)
            return block_wr

        yield from self._rdma(both)
        yield from self._rdma(lambda: entry_wr)  # posted already: its completion
        second = TableEntry.unpack(self.scratch.read(8, TABLE_ENTRY_SIZE), 0, self.addr_le)
        if not self.usable(first, second):
            return DirectLoadResult(Status.STALE_GENERATION, first, second, None)
        return DirectLoadResult(Status.OK, first, second, region.read(0, length))


class ReReadWithBlock(ReferenceInitiatorDriver):
    """KBTP-DLOAD-SEQUENCE: the entry's re-read is issued before the block read completed."""

    initiator_class = _ReReadWithBlock


class _SlotReadsInPairs(ReferenceInitiator):
    """Reads the slot twice at once and takes two equal answers showing the ticket as the confirmation."""

    def await_slot(self, ticket: int, slot_offset: int) -> Gen:
        ack = self.ack
        assert ack is not None and ack.direct_alloc is not None
        ring = ack.direct_alloc.ring
        polls = 0
        while polls < self.max_polls:
            wrs = (1 << 40 | self.request_id(), 1 << 40 | self.request_id())

            def pair(wrs: tuple[int, int] = wrs) -> int:
                for i, wr in enumerate(wrs):
                    self.conn.post_read(self.scratch.sge(32 + 16 * i, 16), ring.stag, ring.tagged_offset + slot_offset,
                                        wr_id=wr)
                return wrs[0]

            yield from self._rdma(pair)
            yield from self._rdma(lambda wrs=wrs: wrs[1])  # type: ignore[misc]
            polls += 2
            a, b = (RingSlot.unpack(self.scratch.read(32 + 16 * i, 16), 0, self.addr_le) for i in range(2))
            if a.sequence == ticket and not a.consumed and (b.sequence, b.block_offset) == (a.sequence, a.block_offset):
                return a.block_offset, polls
        return None, polls


class SlotReadsInPairs(ReferenceInitiatorDriver):
    """KBTP-DALLOC-SLOT-READ: the confirming slot read is issued before the first one completed."""

    initiator_class = _SlotReadsInPairs
