"""Memory a verbs device reaches: anonymous ``mmap`` pages at their real address (what a memory region
registers), for the fabric's node buffers and the engine's staging areas."""

from __future__ import annotations

import ctypes
import mmap

from kvconform.rdma.fabric import ByteOrder
from kvconform.rdma.runtime import EmuBuffer

__all__ = ["VerbsBuffer", "address_of"]


def address_of(mem: mmap.mmap) -> int:
    """The virtual address of an anonymous mapping (what a memory region registers)."""
    return ctypes.addressof(ctypes.c_char.from_buffer(mem))


class VerbsBuffer(EmuBuffer):
    """Node memory the device can reach: anonymous pages at their real address."""

    __slots__ = ("mem",)

    def __init__(self, length: int, byteorder: ByteOrder) -> None:
        self.mem = mmap.mmap(-1, max(length, 1))
        super().__init__(address_of(self.mem), length, byteorder)
        self.data = self.mem  # type: ignore[assignment]  # read/write go to the mapped pages
