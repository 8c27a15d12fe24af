"""The target's block pool (KBTP "Block Pool", "Allocation Quotas", "Block Free").

Invariants:
- the pool is F blocks of Block Size octets in one buffer registered under the Pool STag; a block is
  named by its Block Offset, the Tagged Offset of its first octet (``base + index * block_size``);
- the pool is carved into disjoint extents: one for the shared ring (target-executed allocations) and
  one partition per DIRECT_ALLOC initiator, whose size equals that initiator's quota;
- carving never hands out a block twice: an extent is taken from the free extents, first fit (a forgotten
  initiator's partition is reused whole by the target, never split);
- clearing zeroes a block's octets; the target does it before a freed block can reach another trust domain.
"""

from __future__ import annotations

from dataclasses import dataclass

from kvconform.rdma.fabric import Region


class PoolError(ValueError):
    """A Block Offset that names no block of the pool, or a partition the pool cannot carve."""


@dataclass(frozen=True)
class Extent:
    """A run of consecutive blocks: ``count`` blocks starting at block index ``first``."""

    first: int
    count: int

    @property
    def end(self) -> int:
        return self.first + self.count


class BlockPool:
    """F equally sized blocks in ``region`` (KBTP "Block Pool").

    ``region`` is the Pool STag's registration: its Tagged Offsets are the Block Offsets (``base``).
    """

    def __init__(self, region: Region, blocks: int, block_size: int) -> None:
        if blocks <= 0 or block_size <= 0:
            raise PoolError(f"pool: blocks={blocks} and block_size={block_size} must be positive")
        if region.length < blocks * block_size:
            raise PoolError(f"pool: region of {region.length} octets is smaller than {blocks} x {block_size}")
        self.region = region
        self.blocks = blocks
        self.block_size = block_size
        self.base = region.to_base
        self._free_extents: list[Extent] = [Extent(0, blocks)]

    # ---- addressing --------------------------------------------------------------------------

    def offset_of(self, index: int) -> int:
        """Block Offset of block ``index``."""
        if not 0 <= index < self.blocks:
            raise PoolError(f"pool: block index {index} outside 0..{self.blocks - 1}")
        return self.base + index * self.block_size

    def index_of(self, block_offset: int) -> int:
        """Block index of a Block Offset; refuses offsets that are not the first octet of a block."""
        rel = block_offset - self.base
        index, rest = divmod(rel, self.block_size)
        if rel < 0 or rest != 0 or index >= self.blocks:
            raise PoolError(f"pool: Block Offset {block_offset:#x} names no block (base {self.base:#x}, "
                            f"block size {self.block_size}, {self.blocks} blocks)")
        return index

    def position(self, block_offset: int) -> int:
        """Byte offset of the block within the pool region (for SGEs)."""
        return self.index_of(block_offset) * self.block_size

    def extent_offsets(self, extent: Extent) -> list[int]:
        return [self.offset_of(i) for i in range(extent.first, extent.end)]

    # ---- contents ----------------------------------------------------------------------------

    def read(self, block_offset: int, length: int) -> bytes:
        index = self.index_of(block_offset)
        if not 0 <= length <= self.block_size:
            raise PoolError(f"pool: read length {length} exceeds Block Size {self.block_size}")
        return self.region.read(index * self.block_size, length)

    def write(self, block_offset: int, data: bytes, at: int = 0) -> None:
        index = self.index_of(block_offset)
        if at < 0 or at + len(data) > self.block_size:
            raise PoolError(f"pool: write of {len(data)} octets at {at} exceeds Block Size {self.block_size}")
        self.region.write(index * self.block_size + at, data)

    def clear(self, block_offset: int) -> None:
        """Zero the block, so no data derived from one trust domain's prompts reaches another."""
        index = self.index_of(block_offset)
        self.region.write(index * self.block_size, bytes(self.block_size))

    # ---- carving -----------------------------------------------------------------------------

    def carve(self, count: int) -> Extent:
        """Take ``count`` consecutive blocks (first fit); PoolError when no free extent is large enough."""
        if count <= 0:
            raise PoolError(f"pool: cannot carve {count} blocks")
        for i, free in enumerate(self._free_extents):
            if free.count >= count:
                taken = Extent(free.first, count)
                rest = Extent(free.first + count, free.count - count)
                self._free_extents[i:i + 1] = [rest] if rest.count else []
                return taken
        raise PoolError(f"pool: no run of {count} free blocks (free extents {self._free_extents})")
