"""The free-block ring's arithmetic (KBTP "Free-Block Ring", "InfiniBand and RoCEv2"; RFC 7306 masked FetchAdd).

Invariants of the masked layout (N = 2^n slots of 16 octets):
- a counter is Ticket (bits 63-32) | Slot Offset (low n+4 bits, 16 * slot number); bits 31..n+4 are zero;
- one FetchAdd with Add Data 0x0000000100000010 and Add Mask bit 63 | bit 31 | bit (n+3) returns the
  current (Ticket, Slot Offset) and advances both, each field discarding its own carry, so the Slot Offset
  of ticket t is always 16 * (t mod N), across the 32-bit ticket wrap too (2^32 is a multiple of N);
- n >= 1: with n = 0 the Add Data's 0x10 falls outside the n+4 = 4 offset bits and lands in bits 31..4,
  which must stay zero, so the text's formula has no one-slot ring;
- n <= 28: the offset field must fit the low 32 bits.
The unmasked (InfiniBand) variant keeps the Ticket in the high 32 bits and zero below (Add Data 1 << 32);
the slot is computed as 16 * (ticket mod N).

`RingModel` executes the text's rules on an in-memory ring (initialisation, allocation, free with
deferral) and is the oracle for the ring vectors and for property tests; it performs no I/O.
"""

from __future__ import annotations

import struct
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import ClassVar

from kvconform.kbtp.constants import EMPTY_BLOCK_OFFSET, RING_SLOT_SIZE

__all__ = [
    "ADD_DATA",
    "IB_ADD_DATA",
    "TICKET_MODULUS",
    "FreeOutcome",
    "RingError",
    "RingLayout",
    "RingModel",
    "RingSlot",
    "masked_fetch_add",
]

ADD_DATA = 0x0000_0001_0000_0010
IB_ADD_DATA = 0x0000_0001_0000_0000
TICKET_MODULUS = 1 << 32
_U64 = (1 << 64) - 1

R_SIZE = "KBTP-RING-SIZE"
R_SLOT = "KBTP-RING-SLOT-LAYOUT"
R_COUNTER = "KBTP-RING-COUNTER-FIELDS"
R_INIT = "KBTP-RING-INIT"
R_NO_OVERWRITE = "KBTP-FREE-NO-OVERWRITE"
R_ALLOC = "KBTP-RING-ALLOC-WAIT"


class RingError(ValueError):
    """A ring layout or counter the text does not allow, or a rule of the ring broken: names the requirement."""

    def __init__(self, what: str, requirement: str, detail: str) -> None:
        super().__init__(f"{what}: {detail} ({requirement})")
        self.what = what
        self.requirement = requirement


def masked_fetch_add(orig: int, add: int, mask: int) -> int:
    """RFC 7306 FetchAdd with Add Mask: the new 64-bit value (the operation returns `orig`).

    A set mask bit marks the most significant bit of a field; the carry out of it is discarded.
    """
    result, start = 0, 0
    for bit in range(64):
        if mask >> bit & 1 or bit == 63:
            width = bit - start + 1
            fmask = (1 << width) - 1
            result |= (((orig >> start) & fmask) + ((add >> start) & fmask) & fmask) << start
            start = bit + 1
    return result & _U64


@dataclass(frozen=True)
class RingLayout:
    """A ring of N = 2^n slots: counter layout, Add Data and Add Mask, initial counters.

    `masked` False is the unmasked InfiniBand Fetch and Add variant (Ticket in the high 32 bits only).
    """

    n: int
    masked: bool = True

    MAX_N: ClassVar[int] = 28

    def __post_init__(self) -> None:
        if not 1 <= self.n <= self.MAX_N:
            raise RingError("n", R_SIZE, f"got {self.n}, expected 1 <= n <= {self.MAX_N}: the Slot Offset "
                                         "field (n+4 bits) must hold the Add Data's 0x10 and fit in 32 bits")

    @property
    def slots(self) -> int:
        """N."""
        return 1 << self.n

    @property
    def add_data(self) -> int:
        return ADD_DATA if self.masked else IB_ADD_DATA

    @property
    def add_mask(self) -> int:
        """bit 63 | bit 31 | bit (n+3); 0 (a plain add) for the unmasked variant."""
        return (1 << 63 | 1 << 31 | 1 << (self.n + 3)) if self.masked else 0

    def slot_offset(self, ticket: int) -> int:
        """The byte offset of ticket's slot, 16 * (ticket mod N)."""
        return RING_SLOT_SIZE * (ticket % self.slots)

    def counter(self, ticket: int, slot_offset: int | None = None) -> int:
        """The counter value holding `ticket` (and its slot offset, in the masked layout)."""
        ticket %= TICKET_MODULUS
        if not self.masked:
            return ticket << 32
        offset = self.slot_offset(ticket) if slot_offset is None else slot_offset
        if offset >> (self.n + 4) or offset % RING_SLOT_SIZE:
            raise RingError("slot_offset", R_COUNTER, f"got 0x{offset:x}, expected a multiple of 16 below "
                                                       f"0x{RING_SLOT_SIZE * self.slots:x}")
        return ticket << 32 | offset

    def split(self, counter: int) -> tuple[int, int]:
        """(Ticket, Slot Offset) of a counter; RingError when the bits that must be zero are not."""
        ticket, low = counter >> 32 & 0xFFFF_FFFF, counter & 0xFFFF_FFFF
        if not self.masked:
            if low:
                raise RingError("counter", R_COUNTER, f"got low 32 bits 0x{low:08x}, expected 0 (unmasked layout)")
            return ticket, self.slot_offset(ticket)
        if low >> (self.n + 4):
            raise RingError("counter", R_COUNTER,
                            f"got 0x{counter:016x}: bits 31 to {self.n + 4} must be zero")
        return ticket, low

    def fetch_add(self, counter: int) -> tuple[int, int, int]:
        """One FetchAdd on Head or Tail: (returned Ticket, returned Slot Offset, new counter value)."""
        ticket, offset = self.split(counter)
        return ticket, offset, masked_fetch_add(counter, self.add_data, self.add_mask)

    def initial_head(self, start: int = 0) -> int:
        """Head after initialisation: Ticket 0 and Slot Offset 0 (`start` shifts the ticket origin, for wrap tests)."""
        return self.counter(start)

    def initial_tail(self, free_blocks: int, start: int = 0) -> int:
        """Tail after initialisation: Ticket F and Slot Offset 16 * (F mod N)."""
        self._check_f(free_blocks)
        return self.counter(start + free_blocks)

    def initial_slots(self, block_offsets: Sequence[int], start: int = 0) -> list[RingSlot]:
        """Slot s < F holds {Sequence s, s-th block}; F <= s < N holds {Sequence s - N mod 2^32, all ones}.

        With `start` the same state as if tickets began at `start`: ticket t of [start, start + N) has slot
        t mod N, holding {t, block} for the first F tickets and {t - N, all ones} for the rest.
        """
        f = len(block_offsets)
        self._check_f(f)
        slots = [RingSlot(0, EMPTY_BLOCK_OFFSET)] * self.slots
        for i in range(self.slots):
            t = start + i
            if i < f:
                slots[t % self.slots] = RingSlot(t % TICKET_MODULUS, block_offsets[i])
            else:
                slots[t % self.slots] = RingSlot((t - self.slots) % TICKET_MODULUS, EMPTY_BLOCK_OFFSET)
        return slots

    def _check_f(self, f: int) -> None:
        if not 0 <= f <= self.slots:
            raise RingError("F", R_INIT, f"got {f} free blocks, expected at most N = {self.slots}")


@dataclass(frozen=True)
class RingSlot:
    """Ring Slot (16 octets): Sequence (Ticket, 32), Reserved (32), Block Offset (64, little-endian with ADDR_LE)."""

    sequence: int
    block_offset: int
    reserved: int = 0

    @property
    def consumed(self) -> bool:
        """A slot whose Block Offset is all ones is empty (consumed)."""
        return self.block_offset == EMPTY_BLOCK_OFFSET

    def pack(self, addr_le: bool = False) -> bytes:
        return struct.pack(">II", self.sequence, self.reserved) + struct.pack(
            "<Q" if addr_le else ">Q", self.block_offset)

    @classmethod
    def unpack(cls, buf: bytes, offset: int = 0, addr_le: bool = False) -> RingSlot:
        """The slot at `offset`; RingError for fewer than 16 octets (a short read of target memory)."""
        if len(buf) - offset < RING_SLOT_SIZE:
            raise RingError("slot", R_SLOT, f"got {max(0, len(buf) - offset)} octets at offset {offset}, "
                                            f"expected {RING_SLOT_SIZE}")
        sequence, reserved = struct.unpack_from(">II", buf, offset)
        (block,) = struct.unpack_from("<Q" if addr_le else ">Q", buf, offset + 8)
        return cls(sequence, block, reserved)


@dataclass(frozen=True)
class FreeOutcome:
    """What a free did: its Tail ticket and slot offset, and whether the slot write was deferred."""

    ticket: int
    slot_offset: int
    deferred: bool


@dataclass
class RingModel:
    """The text's ring rules on in-memory slots and counters (the oracle; no concurrency of its own).

    An allocation is split into `take` (FetchAdd on Head) and `read`/`consume` so that a test can
    interleave other operations between them, as the text's deferred-free example does.
    """

    layout: RingLayout
    slots: list[RingSlot]
    head: int
    tail: int
    # per slot index, frees waiting for the slot to be consumed: (ticket u, block offset), oldest first
    deferred: dict[int, deque[tuple[int, int]]] = field(default_factory=dict)

    @classmethod
    def initialised(cls, layout: RingLayout, block_offsets: Sequence[int], start: int = 0) -> RingModel:
        return cls(layout, layout.initial_slots(block_offsets, start), layout.initial_head(start),
                   layout.initial_tail(len(block_offsets), start))

    def _index(self, offset: int) -> int:
        return offset // RING_SLOT_SIZE

    def take(self) -> tuple[int, int]:
        """FetchAdd on Head: the (ticket, slot offset) of a new allocation."""
        ticket, offset, self.head = self.layout.fetch_add(self.head)
        return ticket, offset

    def read(self, ticket: int, offset: int) -> int | None:
        """The Block Offset for `ticket` if its slot holds it (Sequence == ticket, not all ones), else None."""
        slot = self.slots[self._index(offset)]
        if slot.sequence == ticket % TICKET_MODULUS and not slot.consumed:
            return slot.block_offset
        return None

    def consume(self, ticket: int, offset: int) -> int:
        """Take the block of `ticket` and mark the slot consumed; then perform a free deferred on this slot."""
        block = self.read(ticket, offset)
        if block is None:
            raise RingError("slot", R_ALLOC, f"ticket {ticket}: slot at offset {offset} holds "
                                             f"{self.slots[self._index(offset)]}, not this ticket's block")
        index = self._index(offset)
        self.slots[index] = RingSlot(self.slots[index].sequence, EMPTY_BLOCK_OFFSET, self.slots[index].reserved)
        waiting = self.deferred.get(index)
        if waiting:
            u, deferred_block = waiting.popleft()
            self._write(index, u, deferred_block)
            if not waiting:
                del self.deferred[index]
        return block

    def allocate(self) -> tuple[int, int]:
        """take + consume in one step: (ticket, block offset); RingError when the slot is not ready."""
        ticket, offset = self.take()
        return ticket, self.consume(ticket, offset)

    def free(self, block_offset: int) -> FreeOutcome:
        """FetchAdd on Tail; write {Sequence u, block} if the slot is consumed, else defer (never overwrite)."""
        ticket, offset, self.tail = self.layout.fetch_add(self.tail)
        index = self._index(offset)
        if self.slots[index].consumed and index not in self.deferred:
            self._write(index, ticket, block_offset)
            return FreeOutcome(ticket, offset, deferred=False)
        self.deferred.setdefault(index, deque()).append((ticket, block_offset))
        return FreeOutcome(ticket, offset, deferred=True)

    def _write(self, index: int, ticket: int, block_offset: int) -> None:
        if not self.slots[index].consumed:
            raise RingError("slot", R_NO_OVERWRITE, f"slot {index} still holds {self.slots[index]}")
        # Block Offset first, then Sequence: a reader that sees the new Sequence sees the new block.
        self.slots[index] = RingSlot(ticket % TICKET_MODULUS, block_offset, self.slots[index].reserved)

    def available(self) -> list[int]:
        """Block offsets held by unconsumed slots plus those waiting in deferred frees."""
        held = [s.block_offset for s in self.slots if not s.consumed]
        return held + [b for q in self.deferred.values() for _, b in q]
