"""One free-block ring in the target's memory (KBTP "Free-Block Ring"), as the target CPU works it.

The arithmetic (counter layout, masked FetchAdd, slot codec, initial state) is `kvconform.kbtp.ring`'s;
this class only puts it into fabric memory and keeps the target's side bookkeeping:

- memory: N 16-octet slots, then Head and Tail (8 octets each, aligned, in the node's memory byte order
  as RFC 7306 atomics see them); ``slots_region`` and ``head_region`` are registered so a DIRECT_ALLOC
  initiator can read slots and FetchAdd its Head; Tail is never exposed (only the target frees);
- a slot write is two writes, Block Offset first and Sequence second, so the target yields between them;
- ``deferred`` holds, per slot index, the frees whose Tail ticket landed on a slot not yet consumed:
  the text's "MUST defer the write until the slot is consumed; it MUST NOT overwrite the slot".
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass

from kvconform.kbtp.constants import EMPTY_BLOCK_OFFSET, RING_SLOT_SIZE
from kvconform.kbtp.ring import TICKET_MODULUS, RingLayout, RingSlot
from kvconform.rdma.fabric import Access, Node, Region

_COUNTERS = 16  # Head then Tail


@dataclass(frozen=True)
class TakenTicket:
    """What a FetchAdd on Head or Tail returned."""

    ticket: int
    slot_offset: int

    @property
    def index(self) -> int:
        return self.slot_offset // RING_SLOT_SIZE


def ring_order(free_blocks: int) -> int:
    """n for the smallest ring N = 2^n >= F; the text's masked formula needs n >= 1 (ring.RingLayout)."""
    return max(1, (max(free_blocks, 1) - 1).bit_length())


class FreeRing:
    """A ring over ``block_offsets`` (F blocks) with N = 2^n slots, in fresh memory of ``node``."""

    def __init__(self, node: Node, name: str, block_offsets: Sequence[int], *, n: int | None = None,
                 masked: bool = True, addr_le: bool = False) -> None:
        self.name = name
        self.layout = RingLayout(ring_order(len(block_offsets)) if n is None else n, masked)
        self.addr_le = addr_le
        self.free_blocks = len(block_offsets)
        self.blocks = frozenset(block_offsets)
        size = self.layout.slots * RING_SLOT_SIZE
        self.buffer = node.alloc(size + _COUNTERS, align=64)
        rw = Access.LOCAL_WRITE | Access.MW_BIND
        self.slots_region: Region = node.register(self.buffer, rw | Access.REMOTE_READ, length=size)
        self.head_region: Region = node.register(self.buffer, rw | Access.REMOTE_ATOMIC, offset=size, length=8)
        self._tail_at = size + 8
        self.deferred: dict[int, deque[tuple[int, int]]] = {}
        for i, slot in enumerate(self.layout.initial_slots(block_offsets)):
            self.slots_region.write(i * RING_SLOT_SIZE, slot.pack(addr_le))
        self.head_region.write_u64(0, self.layout.initial_head())
        self.buffer.write_u64(self._tail_at, self.layout.initial_tail(len(block_offsets)))

    @property
    def slots(self) -> int:
        return self.layout.slots

    # ---- counters (each call is one CPU step: atomic with respect to other actors) -------------

    def head_value(self) -> int:
        return self.head_region.read_u64(0)

    def tail_value(self) -> int:
        return self.buffer.read_u64(self._tail_at)

    def head_ticket(self) -> int:
        return self.layout.split(self.head_value())[0]

    def fetch_add_head(self) -> TakenTicket:
        """FetchAdd on Head by the target itself (target-executed allocation)."""
        ticket, offset, new = self.layout.fetch_add(self.head_value())
        self.head_region.write_u64(0, new)
        return TakenTicket(ticket, offset)

    def fetch_add_tail(self) -> TakenTicket:
        """FetchAdd on Tail (every free; Tail is the target's alone)."""
        ticket, offset, new = self.layout.fetch_add(self.tail_value())
        self.buffer.write_u64(self._tail_at, new)
        return TakenTicket(ticket, offset)

    # ---- slots --------------------------------------------------------------------------------

    def read_slot(self, slot_offset: int) -> RingSlot:
        return RingSlot.unpack(self.slots_region.read(slot_offset, RING_SLOT_SIZE), 0, self.addr_le)

    def slot_holds(self, taken: TakenTicket) -> int | None:
        """The Block Offset of ``taken`` when its slot holds it (Sequence == ticket, not consumed), else None."""
        slot = self.read_slot(taken.slot_offset)
        if slot.sequence == taken.ticket % TICKET_MODULUS and not slot.consumed:
            return slot.block_offset
        return None

    def is_consumed(self, slot_offset: int) -> bool:
        return self.read_slot(slot_offset).consumed

    def mark_consumed(self, slot_offset: int) -> None:
        """Block Offset := all ones (the Sequence stays)."""
        self.write_slot_block(slot_offset, EMPTY_BLOCK_OFFSET)

    def write_slot_block(self, slot_offset: int, block_offset: int) -> None:
        self.slots_region.write(slot_offset + 8, RingSlot(0, block_offset).pack(self.addr_le)[8:])

    def write_slot_sequence(self, slot_offset: int, ticket: int) -> None:
        self.slots_region.write(slot_offset, RingSlot(ticket % TICKET_MODULUS, 0).pack(self.addr_le)[:4])

    def slot_offset_of(self, ticket: int) -> int:
        return self.layout.slot_offset(ticket)

    # ---- observation ----------------------------------------------------------------------------

    def held_blocks(self) -> list[int]:
        """Block Offsets in unconsumed slots (ready for allocation)."""
        out = []
        for i in range(self.slots):
            slot = self.read_slot(i * RING_SLOT_SIZE)
            if not slot.consumed:
                out.append(slot.block_offset)
        return out

    def deferred_blocks(self) -> list[int]:
        return [b for q in self.deferred.values() for _, b in q]

    def occupancy(self) -> int:
        """Free blocks the ring holds or will hold once deferred writes land."""
        return len(self.held_blocks()) + len(self.deferred_blocks())
