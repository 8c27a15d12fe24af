"""Ring and free-path mutants (issue 23, "Blame from observed state"): targets that each break one rule of the
text's "Free-Block Ring" or "Block Free" in a way the harness sees only through the ring's state, written from the
rule (not from the reference's code paths). Each is the reference target with one method or ring class changed;
the checks that observe the ring (conformance/kbtp/diagnose.py) must name the rule, not KBTP-RING-NO-LOSS or
KBTP-QUOTA-ALLOC-BOUNDED. They also serve in their own process (``kvconform serve kbtp-target --target-class``)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from kvconform.kbtp.constants import RING_SLOT_SIZE
from kvconform.kbtp.freering import FreeRing, TakenTicket
from kvconform.kbtp.ring import TICKET_MODULUS
from kvconform.kbtp.target import ReferenceTarget
from kvconform.targets.kbtp import ReferenceTargetDriver

ZERO = 0  # the empty marker of _ZeroEmptyRing: no Block Offset of the pool (blocks sit at the region's address)


class _ZeroEmptyRing(FreeRing):
    """A ring whose empty slots carry Block Offset 0, not all ones, in its memory and in its own reading of it."""

    def __init__(self, node: Any, name: str, block_offsets: Sequence[int], **kw: Any) -> None:
        super().__init__(node, name, block_offsets, **kw)
        for s in range(len(block_offsets), self.slots):
            self.write_slot_block(s * RING_SLOT_SIZE, ZERO)

    def mark_consumed(self, slot_offset: int) -> None:
        self.write_slot_block(slot_offset, ZERO)

    def is_consumed(self, slot_offset: int) -> bool:
        return self.read_slot(slot_offset).block_offset == ZERO

    def slot_holds(self, taken: TakenTicket) -> int | None:
        slot = self.read_slot(taken.slot_offset)
        if slot.sequence == taken.ticket % TICKET_MODULUS and slot.block_offset != ZERO:
            return slot.block_offset
        return None

    def held_blocks(self) -> list[int]:
        slots = (self.read_slot(i * RING_SLOT_SIZE) for i in range(self.slots))
        return [s.block_offset for s in slots if s.block_offset != ZERO]


class _ZeroEmpty(ReferenceTarget):
    ring_class = _ZeroEmptyRing


class EmptySlotsMarkedZero(ReferenceTargetDriver):
    """KBTP-RING-EMPTY: the target marks an empty (consumed) slot with Block Offset 0 instead of all ones, in the
    slots F..N-1 it initialises and in every slot it consumes, and reads its ring the same way."""

    target_class = _ZeroEmpty


class _BigEndianRings(ReferenceTarget):
    def new_ring(self, name: str, blocks: list[int], n: int | None = None) -> FreeRing:
        ring = self.ring_class(self.node, name, blocks, n=n, masked=self.masked, addr_le=False)
        for b in blocks:
            self._ring_of_block[b] = ring
        return ring


class BigEndianRingUnderAddrLe(ReferenceTargetDriver):
    """KBTP-ADDRLE-MEMORY: under ADDR_LE the ring slots' Block Offsets are written in network byte order (the
    table's are little-endian, as the text says)."""

    target_class = _BigEndianRings


class _FreesToShared(ReferenceTarget):
    def ring_of_block(self, block_offset: int) -> FreeRing:
        return self.shared_ring or super().ring_of_block(block_offset)


class FreeReturnsToSharedRing(ReferenceTargetDriver):
    """KBTP-FREE-RETURN: every freed block goes back to the shared ring, also a block allocated from an initiator's
    DIRECT_ALLOC partition ring."""

    target_class = _FreesToShared


class _LateWrapRing(FreeRing):
    def fetch_add_tail(self) -> TakenTicket:
        taken = super().fetch_add_tail()  # the counter itself is right; the slot derived from it wraps at 2N
        return TakenTicket(taken.ticket, RING_SLOT_SIZE * (taken.ticket % (2 * self.slots)))


class _LateWrap(ReferenceTarget):
    ring_class = _LateWrapRing


class TailWrapsLate(ReferenceTargetDriver):
    """KBTP-RING-WRAP: the Slot Offset of a free wraps at twice the end of the ring (16 * (u mod 2N)), so the first
    free whose Tail ticket reaches N writes past the last slot."""

    target_class = _LateWrap
