"""Node memory of the in-process runtime: buffers at fake addresses, and the STags a node's RNIC knows.

The emulated and the wire fabrics keep their nodes' memory here (a verbs node refines it with the device's own
regions and windows); what an RNIC checks against these STags is `kvconform.rdma.memory`.
"""

from __future__ import annotations

from typing import Any, Protocol

from kvconform.rdma.fabric import U64, Access, Buffer, ByteOrder, Connection, FabricUsageError, Region, Window
from kvconform.rdma.profiles import Profile
from kvconform.rdma.runtime.actor import Actor
from kvconform.rdma.runtime.cq import EmuCQ

VA_SPAN = 1 << 40  # each node's fake virtual addresses live in their own terabyte


class EmuBuffer:
    """Node memory: a ``bytearray`` at a fake, deterministic virtual address."""

    __slots__ = ("_byteorder", "addr", "data", "length")

    def __init__(self, addr: int, length: int, byteorder: ByteOrder) -> None:
        self.addr = addr
        self.length = length
        self.data = bytearray(length)
        self._byteorder: ByteOrder = byteorder

    @property
    def byteorder(self) -> ByteOrder:
        return self._byteorder

    def read(self, offset: int, length: int) -> bytes:
        if offset < 0 or offset + length > self.length:
            raise FabricUsageError(f"buffer read [{offset}, +{length}) outside 0..{self.length}")
        return bytes(self.data[offset : offset + length])

    def write(self, offset: int, data: bytes) -> None:
        if offset < 0 or offset + len(data) > self.length:
            raise FabricUsageError(f"buffer write [{offset}, +{len(data)}) outside 0..{self.length}")
        self.data[offset : offset + len(data)] = data

    def read_u64(self, offset: int) -> int:
        return int.from_bytes(self.read(offset, 8), self._byteorder)

    def write_u64(self, offset: int, value: int) -> None:
        self.write(offset, (value & U64).to_bytes(8, self._byteorder))


class NodeHost(Protocol):
    """What a node needs of the runtime that holds it (`kvconform.rdma.runtime.core.Runtime`)."""

    profile: Profile
    cqs: list[EmuCQ]

    def note(self, who: str, what: str, **args: Any) -> None: ...
    def wake(self, act: Actor, value: Any) -> None: ...


class EmuNode:
    """A host of an in-process fabric (implements `kvconform.rdma.fabric.Node`): its memory, the STags of its
    regions and windows, and its connection endpoints by name."""

    def __init__(self, runtime: NodeHost, name: str, index: int, byteorder: ByteOrder) -> None:
        self.runtime = runtime
        self.name = name
        self.index = index
        self.profile: Profile = runtime.profile
        self.byteorder: ByteOrder = byteorder
        self._next_va = (index + 1) * VA_SPAN
        self._next_index = 1
        self._stags: dict[int, Region | Window] = {}
        self._connections: dict[str, Connection] = {}

    def __repr__(self) -> str:
        return f"EmuNode({self.name!r})"

    @property
    def stags(self) -> dict[int, Region | Window]:
        """Every valid STag of this node (what its RNIC checks a remote access against)."""
        return self._stags

    def add_connection(self, conn: Connection) -> None:
        if conn.name in self._connections:
            raise FabricUsageError(f"connect: endpoint {conn.name!r} exists; pass name=")
        self._connections[conn.name] = conn

    def has_connection(self, name: str) -> bool:
        return name in self._connections

    def alloc(self, length: int, *, align: int = 64) -> EmuBuffer:
        va = -(-self._next_va // align) * align
        self._next_va = va + length
        return EmuBuffer(va, length, self.byteorder)

    def _stag(self) -> int:
        index = self._next_index
        self._next_index += 1
        key = (index * 0x9D + self.index * 0x1F + 0x5A) & 0xFF  # the consumer key byte (§2.2)
        return ((index & 0xFFFFFF) << 8) | key

    def register(
        self,
        buffer: Buffer,
        access: Access,
        *,
        zero_based: bool = False,
        offset: int = 0,
        length: int | None = None,
        remote_invalidate: bool = False,
    ) -> Region:
        if not isinstance(buffer, EmuBuffer):
            raise FabricUsageError(f"register: {buffer!r} is not memory of this emulated fabric")
        length = buffer.length - offset if length is None else length
        if offset < 0 or length < 0 or offset + length > buffer.length:
            raise FabricUsageError(f"register: [{offset}, +{length}) outside the buffer of {buffer.length} octets")
        if access & (Access.REMOTE_WRITE | Access.REMOTE_ATOMIC) and not access & Access.LOCAL_WRITE:
            raise FabricUsageError("register: REMOTE_WRITE / REMOTE_ATOMIC need LOCAL_WRITE (verbs rule)")
        region = Region(self._stag(), buffer, offset, length, Access(access), zero_based, remote_invalidate, self.name)
        self._stags[region.stag] = region
        self.runtime.note(
            self.name, "register", stag=region.stag, len=length, access=int(access), zero_based=zero_based
        )
        return region

    def deregister(self, region: Region) -> None:
        if self._stags.get(region.stag) is not region:
            raise FabricUsageError(f"deregister: stag {region.stag:#x} is not a registered region of {self.name}")
        del self._stags[region.stag]
        self.runtime.note(self.name, "deregister", stag=region.stag)

    def check_window(self, region: Region, offset: int, length: int, access: Access) -> None:
        """What binding a window over ``region`` asks of its arguments, whatever binds it."""
        if self._stags.get(region.stag) is not region:
            raise FabricUsageError(f"bind_window: stag {region.stag:#x} is not a registered region of {self.name}")
        if not region.access & Access.MW_BIND:
            raise FabricUsageError(f"bind_window: region stag {region.stag:#x} lacks MW_BIND")
        if access & ~(Access.REMOTE_READ | Access.REMOTE_WRITE | Access.REMOTE_ATOMIC):
            raise FabricUsageError(f"bind_window: a window grants remote rights only, got {access!r}")
        if offset < 0 or length < 0 or offset + length > region.length:
            raise FabricUsageError(f"bind_window: [{offset}, +{length}) outside region of {region.length} octets")

    def bind_window(
        self, region: Region, offset: int, length: int, access: Access, conn: Connection, *, zero_based: bool = False
    ) -> Window:
        if not self.profile.mw_type2:
            raise FabricUsageError(f"bind_window: profile {self.profile.name} has no type-2 memory windows")
        self.check_window(region, offset, length, access)
        if self._connections.get(conn.name) is not conn:
            raise FabricUsageError(f"bind_window: {conn!r} is not a connection of {self.name}")
        window = Window(self._stag(), region, offset, length, Access(access), zero_based, conn.name)
        self._stags[window.stag] = window
        self.runtime.note(self.name, "bind_window", stag=window.stag, len=length, access=int(access), conn=conn.name)
        return window

    def invalidate(self, stag: int) -> None:
        """Local invalidate / unbind: later remote accesses with ``stag`` fail with 'invalid STag'."""
        if stag not in self._stags:
            raise FabricUsageError(f"invalidate: stag {stag:#x} is not valid on {self.name}")
        del self._stags[stag]
        self.runtime.note(self.name, "invalidate", stag=stag)

    def is_valid(self, stag: int) -> bool:
        return stag in self._stags

    def create_cq(self, name: str | None = None) -> EmuCQ:
        return EmuCQ(self.runtime, name or f"{self.name}.cq{len(self.runtime.cqs)}")

    def connection(self, name: str) -> Connection:
        return self._connections[name]
