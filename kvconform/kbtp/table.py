"""The target's block table (KBTP "Block Table").

Invariants:
- one 16-octet entry per handle served, the entry of handle h at ``16 * (h - base_handle)`` in the table
  memory (the Table STag's Tagged Offset of the first entry is the table region's base);
- Generation never takes the value zero: every entry starts at 1 and ``next_generation`` skips zero on
  wrap (the target calls it through an overridable method, so a mutant can break exactly that rule);
- binding writes Data Length and Block Offset before Flags and Generation: two separate writes, so a
  reader that sees VALID also sees the location; the target yields between them;
- the target's own view (``entry``) is what it last wrote; the memory is what remote readers see,
  encoded with `messages.TableEntry` (Block Offset little-endian under ADDR_LE).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from kvconform.kbtp.constants import TABLE_ENTRY_SIZE, EntryFlags
from kvconform.kbtp.messages import TableEntry
from kvconform.rdma.fabric import Region

GENERATION_MODULUS = 1 << 16


def next_generation(generation: int) -> int:
    """The generation after ``generation``: incremented by one, skipping zero (KBTP "Block Unmapped Store" 4)."""
    nxt = (generation + 1) % GENERATION_MODULUS
    return nxt or 1


@dataclass(frozen=True)
class Entry:
    """A Block Table Entry as the target knows it."""

    flags: EntryFlags = field(default_factory=lambda: EntryFlags(0))
    generation: int = 1
    data_length: int = 0
    block_offset: int = 0

    @property
    def valid(self) -> bool:
        return bool(self.flags & EntryFlags.VALID)

    @property
    def sealed(self) -> bool:
        return bool(self.flags & EntryFlags.SEALED)


class BlockTable:
    """Entries for handles ``base_handle .. base_handle + entries - 1`` in ``region`` (KBTP "Block Table")."""

    def __init__(self, region: Region, entries: int, base_handle: int, addr_le: bool) -> None:
        if region.length < entries * TABLE_ENTRY_SIZE:
            raise ValueError(f"table: region of {region.length} octets holds fewer than {entries} entries")
        self.region = region
        self.entries = entries
        self.base_handle = base_handle
        self.addr_le = addr_le
        self._view: list[Entry] = [Entry() for _ in range(entries)]
        for i in range(entries):
            self._publish(i, 0, TABLE_ENTRY_SIZE)

    def contains(self, handle: int) -> bool:
        return self.base_handle <= handle < self.base_handle + self.entries

    def _index(self, handle: int) -> int:
        if not self.contains(handle):
            raise KeyError(f"table: handle {handle:#x} outside {self.base_handle:#x}.."
                           f"{self.base_handle + self.entries - 1:#x}")
        return handle - self.base_handle

    def entry_offset(self, handle: int) -> int:
        """Tagged Offset of the handle's entry within the Table STag."""
        return self.region.to(TABLE_ENTRY_SIZE * self._index(handle))

    def entry(self, handle: int) -> Entry:
        return self._view[self._index(handle)]

    def _publish(self, index: int, start: int, end: int) -> None:
        e = self._view[index]
        raw = TableEntry(int(e.flags), e.generation, e.data_length, e.block_offset).pack(self.addr_le)
        self.region.write(TABLE_ENTRY_SIZE * index + start, raw[start:end])

    def write_location(self, handle: int, data_length: int, block_offset: int) -> None:
        """First write of a bind: Data Length and Block Offset (octets 4..15)."""
        i = self._index(handle)
        self._view[i] = replace(self._view[i], data_length=data_length, block_offset=block_offset)
        self._publish(i, 4, TABLE_ENTRY_SIZE)

    def write_length(self, handle: int, data_length: int) -> None:
        """A mapped store's Data Length update (octets 4..7)."""
        i = self._index(handle)
        self._view[i] = replace(self._view[i], data_length=data_length)
        self._publish(i, 4, 8)

    def write_state(self, handle: int, flags: EntryFlags, generation: int) -> None:
        """Second write of a bind, or the only write of a free or seal: Flags and Generation (octets 0..3).

        Zero is not refused here: the rule lives in `next_generation`, where a mutant can break it visibly.
        """
        if not 0 <= generation < GENERATION_MODULUS:
            raise ValueError(f"table: Generation {generation} of handle {handle:#x} is not a 16-bit value")
        i = self._index(handle)
        self._view[i] = replace(self._view[i], flags=EntryFlags(flags), generation=generation)
        self._publish(i, 0, 4)

    def bound(self) -> dict[int, Entry]:
        """Every VALID entry by handle."""
        return {self.base_handle + i: e for i, e in enumerate(self._view) if e.valid}
