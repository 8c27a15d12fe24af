"""A KBTP target written from the text alone (spec/seeds/003_a48f4321884951de.txt), for the harness's own tests.

It shares no code with the reference target (kvconform.kbtp.target) nor with the codec (kvconform.kbtp.messages):
its parsing and encoding are the text's field lists, written again with ``struct``. It runs on the harness's
emulated fabric through the semantic interface (kvconform.rdma) like any other ``python:`` target, and in a process
of its own over a wire (``ServedIndependentTarget``).

A software target serving one shared free-block ring, and a ring of its own to each DIRECT_ALLOC initiator. Of the
optional features it offers those PICS kbtp.target.features declares among DIRECT_LOAD, DIRECT_ALLOC and ADDR_LE
(none when none is declared: HELLO_ACK Features 0):
- DIRECT_LOAD: the block table lives in a registered memory region the initiator may RDMA-read (16-octet entries
  {Flags, Generation, Data Length, Block Offset}, the entry of handle h at Table Offset + 16 * (h - Table Base
  Handle)), and so does the pool; HELLO_ACK carries the Table descriptor, the Table Base Handle, 8 reserved octets
  and the Pool descriptor only when the initiator requested DIRECT_LOAD and is trusted (not listed in PICS
  kbtp.target.untrusted_initiators: "A target MUST offer them only to initiators it trusts");
- DIRECT_ALLOC (on a binding with atomics and memory windows): a new trusted initiator that requests it gets a
  partition of the pool of its quota (Allocation Quotas), while blocks are left for one (PICS pool: the blocks
  beyond shared_blocks), else it is served on the shared ring without it. The partition has its own ring of N slots
  and Head in registered memory; HELLO_ACK carries the Partition descriptor (a window bound to the connection,
  write access, covering the partition only), the Ring descriptor (read access) and the Head descriptor (atomics).
  Its ALLOC_STOREs are served from that ring too. BIND checks the ticket (not abandoned: TICKET_ABANDONED; taken and
  not bound, its slot holding that Block Offset: NOT_VALID), then the handle, Data Length, entry and Generation as
  every request, then the quota; it then consumes the slot and writes the entry VALID (not SEALED: BIND has no
  flags) and completes. A ticket not bound within the Ticket Timeout of the target first seeing it on the Head is
  abandoned; before its block is reclaimed (slot consumed, block back with a new Tail ticket, unit of usage
  released) the target ends the connection of a session that holds a Partition STag;
- ADDR_LE: set in every HELLO_ACK (the text makes it the target's choice, not the initiator's); the Block Offset of
  table entries and ring slots is then little-endian, and the Block Handle and the descriptors' STag, Tagged Offset
  and Length of every later request are decoded little-endian.
The table is kept in memory in the order the text gives: ALLOC_STORE writes Data Length and Block Offset, then
Flags and the next Generation (in one step of its actor: the seeded interleavings of the blame tests stay those they
were written for); a mapped store its Data Length, then SEALED; FREE clears VALID and SEALED and increments the
Generation before the Tail FetchAdd.

Where the text leaves a choice open it chooses differently from the reference, so a suite that reads the reference's
choices as the rules fails it:
- ALLOC_STORE checks the quota first, then the handle range, the entry, the Generation and the length; STORE
  checks the entry (VALID, SEALED) before the handle's owner; LOAD the Generation before VALID;
- a HELLO carrying the Initiator ID of an active session ends that connection (no HELLO_ACK);
- a request whose Status is not zero is served all the same (the rule binds the initiator);
- handle ranges start at 0x10000 and entries at Generation 1; the retention time is unbounded;
- BIND without a partition completes MALFORMED; a BIND whose ticket was never taken, is bound already or whose slot
  holds another Block Offset completes NOT_VALID, checked before the handle;
- without DIRECT_ALLOC the pool is registered zero-based: the first block's Block Offset is 0 (with it, the Pool STag
  and the Partition windows share Tagged Offsets, which windows take from addresses);
- partitions are carved from the pool's first block on, the shared ring gets the last blocks;
- a partition ring has N = max(4, 2^ceil(log2 F)) slots (F < N at the default quota 2); its slots are exposed through
  a zero-based Ring STag, its Head (at octet 40 of the ring's buffer) through a non-zero-based Head STag of 8 octets,
  both plain registrations kept across the initiator's reconnections (a released partition is initialized again, with
  new STags, for the next initiator of its size);
- of the two ways to fence an abandoned ticket it ends the connection (not the Partition STag alone): a reconnected
  initiator finds its bindings, and DIRECT_ALLOC again on a fresh Partition STag;
- Ticket Timeouts run from the moment the target sees the ticket on the Head (within one step of the FetchAdd);
- the table does not start its region: a Table descriptor's Tagged Offset is 48 octets into a region that is
  not zero-based (the first 48 octets are zero);
- the table has an entry for exactly the handles of the ranges it hands out (Count = max_initiators * Handle
  Count), every one starting at Generation 1, Flags 0.

For the harness's scripted race checks it follows the race-point convention the harness documents: the actor
serving connection C is ``target@C``; an allocation pauses at ``read-slot.<ring>.<ticket>`` after its Head
FetchAdd, a free at ``tail.<ring>`` before its Tail FetchAdd, and a slot write of a partition ring at
``slot-seq.<ring>.<ticket>`` between its Block Offset and its Sequence (the shared ring writes both in one step, so
the seeded interleavings of the blame tests stay those they were written for). ``<ring>`` is ``shared`` or
``part<k>``, the k-th partition carved.

The variants at the end break one rule each, for the blame tests (tests/kbtp/test_verdicts.py,
tests/kbtp/test_ring_blame.py, tests/kbtp/test_independent_target.py).
"""

from __future__ import annotations

import struct
from collections import deque
from collections.abc import Generator
from dataclasses import dataclass, field
from typing import Any, Literal

from kvconform.rdma import (
    Access,
    Command,
    Connection,
    ConnState,
    Fabric,
    Node,
    Op,
    Region,
    Window,
    pause,
    wait_completion,
    wait_until,
)
from kvconform.targets.kbtp import ReferenceTargetDriver, TargetParams

Steps = Generator[Command, Any, Any]

# The text's registries.
HELLO, HELLO_ACK, LOAD, STORE, ALLOC_STORE, FREE, BIND, COMPLETION, GOODBYE = (
    0x01, 0x02, 0x10, 0x11, 0x12, 0x13, 0x14, 0x20, 0x30)
OK, INVALID_HANDLE, STALE_GENERATION, NOT_VALID, ALREADY_BOUND, NO_SPACE, SEALED, NOT_SEALED, TOO_LARGE, MALFORMED = (
    range(10))
TICKET_ABANDONED = 11
INLINE, SEAL, RECORD, INVALIDATE, ALLOW_UNSEALED = 0x01, 0x02, 0x04, 0x08, 0x10
F_VALID, F_SEALED = 0x0001, 0x0002
RELEASE = 0x0001
DIRECT_LOAD, DIRECT_ALLOC, ADDR_LE = 0x0001, 0x0002, 0x0008
ONES = (1 << 64) - 1
HEADER = struct.Struct(">BBHQQHH")  # Version, Opcode, Flags, Request ID, Block Handle, Generation, Status
DESC = struct.Struct(">IQI")  # STag, Tagged Offset, Length (the Completion Descriptor's last field is reserved)
DESC_LE = struct.Struct("<IQI")  # the same, as an initiator encodes it under ADDR_LE
ENTRY_STATE = struct.Struct(">HH")  # a table entry's Flags, Generation (octets 0..3)
ENTRY_LENGTH = struct.Struct(">I")  # its Data Length (octets 4..7); the Block Offset (8..15) follows per ADDR_LE
ENTRY_SIZE = 16
TABLE_LEAD = 48  # octets of the table's region before its first entry (this target's choice)
HANDLE_BASE = 0x10000
CREDITS = 8
TAIL_AT, HEAD_AT, RING_SLOTS_AT, RING_SLOT = 8, 40, 64, 16  # a ring's buffer: Tail, Head, then the N slots
BIND_BODY = struct.Struct(">IIQ")  # Ticket, Data Length, Block Offset
TICKETS = 1 << 32


def next_generation(generation: int) -> int:
    """Incremented by one, skipping zero (Generation never takes the value zero)."""
    return generation % 0xFFFF + 1


def masked_add(value: int, add: int, mask: int) -> int:
    """FetchAdd with an Add Mask: each field, ending at a set mask bit (or bit 63), adds on its own and drops
    its carry (the text's Free-Block Ring; RFC 7306)."""
    out, start = 0, 0
    for bit in range(64):
        if mask >> bit & 1 or bit == 63:
            width = bit - start + 1
            field_mask = (1 << width) - 1
            out |= (((value >> start) & field_mask) + ((add >> start) & field_mask) & field_mask) << start
            start = bit + 1
    return out


@dataclass
class Entry:
    flags: int = 0
    generation: int = 1
    length: int = 0
    block: int = 0


@dataclass
class Initiator:
    iid: bytes
    base: int
    quota: int
    conn: Connection | None = None
    bound: set[int] = field(default_factory=set)
    pending: int = 0
    partition: Partition | None = None  # DIRECT_ALLOC: its own blocks and ring (else the shared ring)
    window: Window | None = None  # the Partition STag of its current session, when DIRECT_ALLOC was granted

    def owns(self, handle: int, count: int) -> bool:
        return self.base <= handle < self.base + count

    @property
    def usage(self) -> int:
        """Handles bound, target-executed allocations under way, and tickets taken and not bound (those abandoned
        count until their reclaim)."""
        tickets = len(self.partition.seen) + self.partition.reclaiming if self.partition else 0
        return len(self.bound) + self.pending + tickets


class SharedRing:
    """N slots {Sequence, Reserved, Block Offset} and the Head and Tail counters in the target's memory, worked by
    its CPU. Layout of its buffer (this target's choice): Tail at octet 8, Head at octet 40, the slots from octet 64;
    the Block Offset of a slot in the session byte order (little-endian under ADDR_LE), the counters in the node's."""

    def __init__(self, node: Node, name: str, blocks: list[int], slots: int, masked: bool, addr_le: bool) -> None:
        self.name, self.n, self.masked, self.addr_le = name, slots, masked, addr_le
        order = slots.bit_length() - 1
        self.add = 0x0000_0001_0000_0010 if masked else 0x0000_0001_0000_0000
        self.mask = (1 << 63) | (1 << 31) | (1 << (order + 3)) if masked else 0
        self.mem = node.alloc(RING_SLOTS_AT + RING_SLOT * slots)
        self.deferred: dict[int, deque[tuple[int, int]]] = {}
        self.initialize(blocks)

    def initialize(self, blocks: list[int]) -> None:
        """The text's Initialization: slot s < F {s, the s-th block}, s >= F {s - N, all ones}; Head {0, 0}, Tail
        {F, 16 * (F mod N)}."""
        f = len(blocks)
        for s in range(self.n):
            self.put(s, *((s, blocks[s]) if s < f else ((s - self.n) % (1 << 32), ONES)))
        self.mem.write_u64(HEAD_AT, 0)
        self.mem.write_u64(TAIL_AT, (f << 32) | (16 * (f % self.n) if self.masked else 0))
        self.deferred.clear()

    def slot(self, index: int) -> tuple[int, int]:
        """(Sequence, Block Offset) of slot ``index``."""
        (seq,) = struct.unpack_from(">I", self.mem.read(RING_SLOTS_AT + RING_SLOT * index, 4))
        block = int.from_bytes(self.mem.read(RING_SLOTS_AT + RING_SLOT * index + 8, 8), self.order)
        return seq, block

    def put(self, index: int, seq: int | None = None, block: int | None = None) -> None:
        at = RING_SLOTS_AT + RING_SLOT * index
        if block is not None:
            self.mem.write(at + 8, block.to_bytes(8, self.order))
        if seq is not None:
            self.mem.write(at, struct.pack(">I", seq % (1 << 32)))

    @property
    def order(self) -> Literal["little", "big"]:
        return "little" if self.addr_le else "big"

    def head_ticket(self) -> int:
        return self.mem.read_u64(HEAD_AT) >> 32

    def fetch_add(self, which: str) -> tuple[int, int]:
        """(ticket, slot index) from one FetchAdd on ``which`` ("head" or "tail") by the CPU, in one step."""
        at = HEAD_AT if which == "head" else TAIL_AT
        old = self.mem.read_u64(at)
        self.mem.write_u64(at, masked_add(old, self.add, self.mask))
        ticket = old >> 32
        index = (old & 0xFFFF_FFFF) // 16 if self.masked else ticket % self.n
        return ticket, index

    def free_slot(self, ticket: int, index: int) -> int:
        """The slot a free of Tail ``ticket`` writes (``index``, the one its FetchAdd returned)."""
        return index

    def index_of(self, ticket: int) -> int:
        return ticket % self.n

    def holds(self, ticket: int, index: int) -> bool:
        seq, block = self.slot(index)
        return seq == ticket % (1 << 32) and block != ONES

    def consume(self, index: int) -> Steps:
        """Take the slot's block, mark it consumed, then write a free that waited on it."""
        _, block = self.slot(index)
        self.put(index, block=ONES)
        waiting = self.deferred.get(index)
        if waiting:
            u, freed = waiting.popleft()
            yield from self.flush(index, u, freed)
        return block

    def flush(self, index: int, ticket: int, block: int) -> Steps:
        self.put(index, block=block)  # the Block Offset first, then the Sequence
        yield from self.between_writes(ticket)
        self.put(index, seq=ticket)

    def between_writes(self, ticket: int) -> Steps:
        """Nothing between a slot's two writes: nobody reads the shared ring (and its seeded interleavings stay
        those the blame tests were written for)."""
        yield from ()

    def give_back(self, ticket: int, index: int, block: int) -> Steps:
        index = self.free_slot(ticket, index)
        if self.slot(index)[1] != ONES or self.deferred.get(index):
            self.deferred.setdefault(index, deque()).append((ticket, block))
        else:
            yield from self.flush(index, ticket, block)


class PartitionRing(SharedRing):
    """A DIRECT_ALLOC initiator's ring: the slots exposed read-only through a zero-based Ring STag, the Head through
    an 8-octet non-zero-based Head STag that takes atomics (plain registrations of the initiator, kept across its
    reconnections, replaced when the partition passes to another initiator); a race point between a slot's two
    writes."""

    def __init__(self, node: Node, name: str, blocks: list[int], slots: int, masked: bool, addr_le: bool) -> None:
        super().__init__(node, name, blocks, slots, masked, addr_le)
        self.node = node
        self.ring_region, self.head_region = self.expose()

    def expose(self) -> tuple[Region, Region]:
        ring = self.node.register(self.mem, Access.LOCAL_WRITE | Access.REMOTE_READ, zero_based=True,
                                  offset=RING_SLOTS_AT, length=RING_SLOT * self.n)
        head = self.node.register(self.mem, Access.LOCAL_WRITE | Access.REMOTE_ATOMIC, offset=HEAD_AT, length=8)
        return ring, head

    def renew(self, blocks: list[int]) -> None:
        """For another initiator: fresh STags over a ring initialized again (every block is back)."""
        self.node.deregister(self.ring_region)
        self.node.deregister(self.head_region)
        self.initialize(blocks)
        self.ring_region, self.head_region = self.expose()

    def between_writes(self, ticket: int) -> Steps:
        yield from pause(f"slot-seq.{self.name}.{ticket}")


@dataclass
class Partition:
    """A DIRECT_ALLOC initiator's blocks and their ring; the tickets its initiator took on the Head and has not
    bound (with the fabric time this target first saw each), those abandoned, the reclaims under way."""

    blocks: list[int]
    ring: PartitionRing
    owner: Initiator | None = None
    seen: dict[int, float] = field(default_factory=dict)
    abandoned: set[int] = field(default_factory=set)
    reclaiming: int = 0
    next_unseen: int = 0

    def observe(self, now: float) -> None:
        """Note every ticket taken on the Head since the last look (the target's own are skipped as it takes
        them)."""
        head = self.ring.head_ticket()
        while self.next_unseen != head:
            self.seen.setdefault(self.next_unseen, now)
            self.next_unseen = (self.next_unseen + 1) % TICKETS

    def unseen(self) -> bool:
        """Whether a ticket was taken on the Head since the last look."""
        return self.ring.head_ticket() != self.next_unseen

    @property
    def idle(self) -> bool:
        """No owner, nothing outstanding: every block is back in the ring."""
        return self.owner is None and not self.seen and not self.reclaiming and not self.ring.deferred


class _Running:
    """One started target: its pool, table and ring, serving every attached connection."""

    def __init__(self, fabric: Fabric, node: Node, p: TargetParams, ring_class: type[SharedRing]) -> None:
        self.fabric, self.node, self.p = fabric, node, p
        self.offered = int(p.features) & (DIRECT_LOAD | DIRECT_ALLOC | ADDR_LE)
        if not (fabric.profile.atomics and fabric.profile.mw_type2):  # FetchAdd on a Head; a window per connection
            self.offered &= ~DIRECT_ALLOC
        self.addr_le = bool(self.offered & ADDR_LE)
        # Initiators may read the pool and the table only through the STags DIRECT_LOAD hands out.
        remote = Access.REMOTE_READ if self.offered & DIRECT_LOAD else Access.NONE
        # A Partition STag is a window, whose Tagged Offsets are addresses, and a Block Offset is the same Tagged
        # Offset through it as through the Pool STag: the pool is zero-based only without DIRECT_ALLOC.
        direct = bool(self.offered & DIRECT_ALLOC)
        access = Access.LOCAL_WRITE | remote | (Access.MW_BIND if direct else Access.NONE)
        self.pool = node.register(node.alloc(p.blocks * p.block_size), access, zero_based=not direct)
        # Partitions are carved from the pool's first block on; the shared ring's blocks are the last ones.
        self.spare = p.blocks - p.shared_count if direct else 0
        shared = p.shared_count
        slots = p.ring_slots or max(2, 1 << max(0, (shared - 1).bit_length()))
        blocks = [self.block(self.spare + i) for i in range(shared)]
        self.ring = ring_class(node, "shared", blocks, slots, fabric.profile.masked_atomics, self.addr_le)
        self.ring_of: dict[int, SharedRing] = dict.fromkeys(blocks, self.ring)  # where each block returns to
        self.partitions: list[Partition] = []
        self.reclaims = 0
        self.entries = p.max_initiators * p.handle_count
        self.table = {HANDLE_BASE + i: Entry() for i in range(self.entries)}
        self.table_mem = node.register(node.alloc(TABLE_LEAD + ENTRY_SIZE * self.entries), Access.LOCAL_WRITE | remote)
        for h in self.table:
            self._write_state(h)
            self._write_location(h)
        self.initiators: dict[bytes, Initiator] = {}
        self.quotas = dict(p.quotas)
        self.wr = 1 << 40

    # ---- connections ------------------------------------------------------------------------------

    def attach(self, conn: Connection) -> None:
        size = 24 + 32 + self.p.max_inline + 64
        recv = self.node.register(self.node.alloc(CREDITS * size), Access.LOCAL_WRITE)
        stage = self.node.register(self.node.alloc(self.p.block_size), Access.LOCAL_WRITE)
        for i in range(CREDITS):
            conn.post_recv(recv.sge(i * size, size), wr_id=i)
        self.fabric.spawn(f"target@{conn.name}", self._serve(conn, recv, stage, size), daemon=True)

    def _serve(self, conn: Connection, recv: Any, stage: Any, size: int) -> Steps:
        me: Initiator | None = None
        while True:
            wc = yield from wait_completion(conn.cq, lambda c: c.op is Op.RECV or not c.ok)
            if not wc.ok or conn.state is not ConnState.CONNECTED:
                break
            raw = recv.read(wc.wr_id * size, wc.byte_len)
            conn.post_recv(recv.sge(wc.wr_id * size, size), wr_id=wc.wr_id)
            me, done = yield from self._message(conn, me, raw, stage)
            if done:
                break
        if me is not None:
            self._end_session(me, conn)  # retained (for ever: a retention time of this target's choosing)

    def _end_session(self, me: Initiator, conn: Connection) -> None:
        """The session on ``conn`` is over: its Partition STag goes with it."""
        if me.conn is not conn:
            return
        me.conn = None
        if me.window is not None:
            self.node.invalidate(me.window.stag)
            me.window = None

    def _message(self, conn: Connection, me: Initiator | None, raw: bytes, stage: Any) -> Steps:
        if len(raw) < 24:
            self._complete(conn, 0, 0, MALFORMED)
            return me, False
        version, opcode, flags, rid, handle, gen, _status = HEADER.unpack_from(raw)
        if self.addr_le:  # the Block Handle of every message an initiator sends (zero in HELLO either way)
            (handle,) = struct.unpack_from("<Q", raw, 12)
        if version != 1:
            self._complete(conn, rid, handle, MALFORMED)
            return me, False
        if opcode == HELLO:
            return (yield from self._hello(conn, me, raw))
        if me is None or opcode not in (LOAD, STORE, ALLOC_STORE, FREE, BIND, GOODBYE):
            self._complete(conn, rid, handle, MALFORMED)
            return me, False
        if opcode == GOODBYE:
            self._end_session(me, conn)
            if flags & RELEASE:
                for h in sorted(me.bound):
                    yield from self._unbind(me, h)
                self._release(me)
            conn.disconnect()
            return None, True
        if opcode == BIND:
            yield from self._bind(conn, me, rid, handle, gen, raw)
            return me, False
        body = self._body(raw, opcode, flags)
        if body is None:
            self._complete(conn, rid, handle, MALFORMED)
            return me, False
        desc, inline = body
        req = Request(conn, me, opcode, flags, rid, handle, gen, desc, inline)
        status = self._validate(req)
        if status != OK:
            self._complete(conn, rid, handle, status, self.table.get(handle))
            return me, False
        ok = yield from {LOAD: self._load, STORE: self._store, ALLOC_STORE: self._alloc, FREE: self._free}[opcode](
            req, stage)
        return me, not ok

    # ---- messages -------------------------------------------------------------------------------------

    def _hello(self, conn: Connection, me: Initiator | None, raw: bytes) -> Steps:
        if len(raw) != 24 + 20 or me is not None:
            self._send(conn, HEADER.pack(1, HELLO_ACK, 0, 0, 0, 0, MALFORMED) + bytes(32))
            return me, False
        iid = raw[28:44]
        known = self.initiators.get(iid)
        if known is not None and known.conn is not None:
            conn.disconnect()  # this target's way of rejecting an active Initiator ID
            return None, True
        (requested,) = struct.unpack_from(">H", raw, 24)
        trusted = iid not in self.p.untrusted_initiators  # direct modes only to initiators it trusts
        if known is None:
            known = self._admit(iid, trusted and bool(requested & self.offered & DIRECT_ALLOC))
            if known is None:
                self._send(conn, HEADER.pack(1, HELLO_ACK, 0, 0, 0, 0, NO_SPACE) + bytes(32))
                return None, False
        known.conn = conn
        granted = self.offered & ADDR_LE  # the target's choice, whatever was requested
        if trusted:
            granted |= requested & self.offered & (DIRECT_LOAD | DIRECT_ALLOC)
        if known.partition is None:
            granted &= ~DIRECT_ALLOC
        body = struct.pack(">HHIIIQII", granted, CREDITS, self.p.block_size, self.p.max_inline, known.quota,
                           known.base, self.p.handle_count, self.p.ticket_timeout_ms)
        if granted & DIRECT_LOAD:  # Table descriptor, Table Base Handle, 8 reserved octets, Pool descriptor
            body += DESC.pack(self.table_mem.stag, self.table_mem.to(TABLE_LEAD), self.entries)
            body += struct.pack(">Q8x", HANDLE_BASE)
            body += DESC.pack(self.pool.stag, self.pool.to(0), self.p.blocks)
        if granted & DIRECT_ALLOC:  # Partition (a window of this connection), Ring and Head descriptors
            part = known.partition
            assert part is not None
            first = self.pool_position(part.blocks[0])
            known.window = self.node.bind_window(self.pool, first, len(part.blocks) * self.p.block_size,
                                                 Access.REMOTE_WRITE, conn)
            body += DESC.pack(known.window.stag, known.window.to(0), len(part.blocks))
            body += DESC.pack(part.ring.ring_region.stag, part.ring.ring_region.to(0), part.ring.n)
            body += DESC.pack(part.ring.head_region.stag, part.ring.head_region.to(0), 1)
        self._send(conn, HEADER.pack(1, HELLO_ACK, 0, 0, 0, 0, OK) + body)
        yield from ()
        return known, False

    def _admit(self, iid: bytes, direct: bool) -> Initiator | None:
        """A new initiator: a free handle range and its quota, on a partition of its own when it asks for
        DIRECT_ALLOC and one is left, else on the shared ring (whose quotas never add up past its blocks)."""
        quota = self.quotas.get(iid, self.p.quota)
        used = {i.base for i in self.initiators.values()}
        free = [b for b in (HANDLE_BASE + k * self.p.handle_count for k in range(self.p.max_initiators))
                if b not in used]
        if not free:
            return None
        part = self._partition_for(quota) if direct and quota > 0 else None
        if part is None:
            shared = sum(i.quota for i in self.initiators.values() if i.partition is None)
            if shared + quota > self.p.shared_count:
                return None
        known = self.initiators[iid] = Initiator(iid, free[0], quota, partition=part)
        if part is not None:
            part.owner = known
        return known

    def _partition_for(self, quota: int) -> Partition | None:
        """An idle partition of ``quota`` blocks (its ring initialized again, behind new STags), else one carved
        from the blocks no partition has yet, else None."""
        for part in self.partitions:
            if part.idle and len(part.blocks) == quota:
                part.ring.renew(part.blocks)
                part.abandoned.clear()
                part.next_unseen = 0
                return part
        carved = sum(len(part.blocks) for part in self.partitions)
        if carved + quota > self.spare:
            return None
        blocks = [self.block(carved + i) for i in range(quota)]
        n = max(4, 1 << (quota - 1).bit_length())  # N = 2^n >= F: at least 4 (this target's choice)
        ring = PartitionRing(self.node, f"part{len(self.partitions)}", blocks, n, self.fabric.profile.masked_atomics,
                             self.addr_le)
        part = Partition(blocks, ring)
        self.partitions.append(part)
        self.ring_of.update(dict.fromkeys(blocks, ring))
        self.fabric.spawn(f"tickets@{ring.name}", self._watch(part), daemon=True)
        return part

    def _release(self, me: Initiator) -> None:
        """GOODBYE with RELEASE, its handles unbound: its tickets are abandoned, its partition and range free."""
        del self.initiators[me.iid]
        part = me.partition
        if part is not None:
            part.observe(self.fabric.now)
            for t in sorted(part.seen):
                self._abandon(part, t)
            part.owner = None

    def _body(self, raw: bytes, opcode: int, flags: int) -> tuple[tuple[int, int, int] | None, bytes | None] | None:
        """(Data Descriptor, inline data) after the header, or None when the body cannot be parsed."""
        off, desc, inline = 24, None, None
        if opcode != FREE:
            if len(raw) < off + 16:
                return None
            desc = (DESC_LE if self.addr_le else DESC).unpack_from(raw, off)
            off += 16
        if flags & RECORD:
            if len(raw) < off + 16:
                return None
            off += 16  # a Completion Descriptor: RECORD_COMPLETION is not offered, so it is not used
        if opcode in (STORE, ALLOC_STORE) and flags & INLINE:
            assert desc is not None
            if desc[0] or desc[1] or len(raw) != off + desc[2]:
                return None
            inline = raw[off:]
        elif len(raw) != off or (flags & INLINE):
            return None
        return desc, inline

    def _send(self, conn: Connection, data: bytes, invalidate: int | None = None) -> None:
        conn.post_send(data, invalidate=invalidate, signaled=False)

    def _complete(self, conn: Connection, rid: int, handle: int, status: int, entry: Entry | None = None,
                  length: int = 0, block: int = 0, invalidate: int | None = None) -> None:
        gen = entry.generation if entry is not None else 0
        body = struct.pack(">IIQ", length, 0, block)  # Data Length, Reserved, Block Offset
        self._send(conn, HEADER.pack(1, COMPLETION, 0, rid, handle, gen, status) + body, invalidate)

    # ---- validation -----------------------------------------------------------------------------------

    def _validate(self, r: Request) -> int:
        e = self.table.get(r.handle)
        mine = e is not None and r.me.owns(r.handle, self.p.handle_count)
        stale = r.gen != 0 and e is not None and r.gen != e.generation
        length = r.desc[2] if r.desc else 0
        too_large = length > self.p.block_size or (r.inline is not None and len(r.inline) > self.p.max_inline)
        if r.opcode == LOAD:
            checks = [(e is None, INVALID_HANDLE), (stale, STALE_GENERATION),
                      (e is not None and not e.flags & F_VALID, NOT_VALID),
                      (e is not None and not e.flags & F_SEALED and not r.flags & ALLOW_UNSEALED, NOT_SEALED),
                      (e is not None and e.length > length, TOO_LARGE)]
        elif r.opcode == STORE:
            checks = [(e is None, INVALID_HANDLE), (e is not None and not e.flags & F_VALID, NOT_VALID),
                      (e is not None and bool(e.flags & F_SEALED), SEALED), (not mine, INVALID_HANDLE),
                      (stale, STALE_GENERATION), (too_large, TOO_LARGE)]
        elif r.opcode == ALLOC_STORE:
            if r.me.partition is not None:  # tickets taken on its Head count in its usage
                r.me.partition.observe(self.fabric.now)
            checks = [(r.me.usage >= r.me.quota, NO_SPACE), (not mine, INVALID_HANDLE),
                      (e is not None and bool(e.flags & F_VALID), ALREADY_BOUND), (stale, STALE_GENERATION),
                      (too_large, TOO_LARGE)]
        else:  # FREE
            checks = [(not mine, INVALID_HANDLE), (e is not None and not e.flags & F_VALID, NOT_VALID),
                      (stale, STALE_GENERATION)]
        return next((status for failed, status in checks if failed), OK)

    # ---- operations -----------------------------------------------------------------------------------

    def _load(self, r: Request, stage: Any) -> Steps:
        e = self.table[r.handle]
        assert r.desc is not None
        if e.length:
            stage.write(0, self.pool.read(self.pool_position(e.block), e.length))
            r.conn.post_write(stage.sge(0, e.length), r.desc[0], r.desc[1], signaled=False)
        self._complete(r.conn, r.rid, r.handle, OK, e, e.length, e.block, self._invalidate(r))
        yield from ()
        return True

    def _data(self, r: Request, block: int) -> Steps:
        """The request's data into ``block``: inline, or by RDMA Read; False when the read failed."""
        assert r.desc is not None
        if r.inline is not None:
            self.pool.write(self.pool_position(block), r.inline)
            return True
        if r.desc[2] == 0:
            return True
        self.wr += 1
        wr = self.wr
        r.conn.post_read(self.pool.sge(self.pool_position(block), r.desc[2]), r.desc[0], r.desc[1], wr_id=wr)
        wc = yield from wait_completion(r.conn.cq, lambda c: c.wr_id == wr)
        return bool(wc.ok)

    def _store(self, r: Request, stage: Any) -> Steps:
        e = self.table[r.handle]
        ok = yield from self._data(r, e.block)
        if not ok:
            return False
        e.length = r.desc[2] if r.desc else 0
        self.table_mem.write(self._entry_at(r.handle) + 4, ENTRY_LENGTH.pack(e.length))
        if r.flags & SEAL:  # after the Data Length: a reader that sees SEALED sees the final length
            e.flags |= F_SEALED
            self._write_state(r.handle)
        self._complete(r.conn, r.rid, r.handle, OK, e, e.length, e.block, self._invalidate(r))
        return True

    def _alloc(self, r: Request, stage: Any) -> Steps:
        r.me.pending += 1
        part = r.me.partition
        ring = part.ring if part is not None else self.ring  # a DIRECT_ALLOC initiator's quota is its partition
        if part is not None:  # the initiator's tickets so far are noted, this one is the target's
            part.observe(self.fabric.now)
        ticket, index = ring.fetch_add("head")
        if part is not None:
            part.next_unseen = (ticket + 1) % TICKETS
        yield from pause(f"read-slot.{ring.name}.{ticket}")
        yield from wait_until(lambda: ring.holds(ticket, index), name=f"slot-wait.{ring.name}.{ticket}")
        block = yield from ring.consume(index)
        ok = yield from self._data(r, block)
        if not ok:
            r.me.pending -= 1
            yield from self._give_back(block)
            return False
        yield from self._bind_entry(r.handle, r.desc[2] if r.desc else 0, block,
                                    F_VALID | (F_SEALED if r.flags & SEAL else 0))
        e = self.table[r.handle]
        r.me.pending -= 1
        r.me.bound.add(r.handle)
        self._complete(r.conn, r.rid, r.handle, OK, e, e.length, block, self._invalidate(r))
        return True

    def _free(self, r: Request, stage: Any) -> Steps:
        yield from self._unbind(r.me, r.handle)
        self._complete(r.conn, r.rid, r.handle, OK, self.table[r.handle])
        return True

    def _unbind(self, me: Initiator, handle: int) -> Steps:
        e = self.table[handle]
        e.flags, e.generation = 0, next_generation(e.generation)  # the entry first, then the ring
        self._write_state(handle)
        me.bound.discard(handle)
        yield from self._give_back(e.block)

    def _give_back(self, block: int) -> Steps:
        """The block into the ring it was allocated from, with the next Tail ticket."""
        ring = self.ring_of[block]
        yield from pause(f"tail.{ring.name}")
        ticket, index = ring.fetch_add("tail")
        yield from ring.give_back(ticket, index, block)

    # ---- DIRECT_ALLOC: BIND and the Ticket Timeout ------------------------------------------------------

    def _bind(self, conn: Connection, me: Initiator, rid: int, handle: int, gen: int, raw: bytes) -> Steps:
        """Verify the ticket (not abandoned, taken and not bound, its slot holding that Block Offset) before the
        handle, its entry and the quota; then consume the slot and write the entry."""
        part = me.partition
        e = self.table.get(handle)
        if len(raw) != 24 + BIND_BODY.size or part is None:  # (a session without a partition has no tickets)
            self._complete(conn, rid, handle, MALFORMED, e)
            return
        ticket, length, block = BIND_BODY.unpack_from(raw, 24)
        part.observe(self.fabric.now)
        index = part.ring.index_of(ticket)
        checks = [(ticket in part.abandoned, TICKET_ABANDONED),
                  (ticket not in part.seen or not self.slot_holds(part.ring, ticket, index, block), NOT_VALID),
                  (e is None or not me.owns(handle, self.p.handle_count), INVALID_HANDLE),
                  (length > self.p.block_size, TOO_LARGE),
                  (e is not None and bool(e.flags & F_VALID), ALREADY_BOUND),
                  (gen != 0 and e is not None and gen != e.generation, STALE_GENERATION),
                  (len(me.bound) + me.pending >= me.quota, NO_SPACE)]
        status = next((status for failed, status in checks if failed), OK)
        if status != OK:
            self._complete(conn, rid, handle, status, e)
            return
        del part.seen[ticket]  # bound: no timeout can abandon it any more
        me.bound.add(handle)
        yield from part.ring.consume(index)
        yield from self._bind_entry(handle, length, block, F_VALID)
        self._complete(conn, rid, handle, OK, self.table[handle], length, block)

    def slot_holds(self, ring: SharedRing, ticket: int, index: int, block: int) -> bool:
        """Whether the slot of ``ticket`` holds ``block`` for it (KBTP-BIND-VERIFY)."""
        return ring.holds(ticket, index) and ring.slot(index)[1] == block

    def _watch(self, part: Partition) -> Steps:
        """Abandon every ticket of the partition not bound within the Ticket Timeout of this target first seeing
        it (within one step of its FetchAdd: this actor wakes whenever the Head shows a ticket it has not noted)."""
        timeout = self.p.ticket_timeout_ms / 1000.0
        while True:
            part.observe(self.fabric.now)
            for t, seen in sorted(part.seen.items()):
                if self.fabric.now - seen >= timeout - 1e-9:
                    self._abandon(part, t)
            due = min(part.seen.values(), default=None)
            # (against the live count, not a copy: a renewed ring's Head starts again from 0)
            yield from wait_until(part.unseen, name=f"timeout.{part.ring.name}",
                                  timeout=None if due is None else max(0.0, due + timeout - self.fabric.now))

    def _abandon(self, part: Partition, ticket: int) -> None:
        """A ticket not bound in time: first no RDMA Write of its initiator can reach the partition any more (this
        target ends the connection of a session that holds a Partition STag), then its block is reclaimed."""
        if part.owner is not None:
            self._fence(part.owner)
        del part.seen[ticket]
        part.abandoned.add(ticket)
        part.reclaiming += 1
        self.reclaims += 1  # (actor names are unique for the fabric's life; a renewed ring counts from 0 again)
        self.fabric.spawn(f"reclaim@{part.ring.name}.{ticket}.{self.reclaims}", self._reclaim(part, ticket),
                          daemon=True)

    def _fence(self, owner: Initiator) -> None:
        """End the connection of a session that holds a Partition STag (its session ends with it)."""
        if owner.conn is not None and owner.window is not None:
            conn = owner.conn
            self._end_session(owner, conn)
            conn.disconnect()

    def _reclaim(self, part: Partition, ticket: int) -> Steps:
        """Consume the abandoned ticket's slot (once it holds its block), return the block with a new ticket, and
        release the unit of usage."""
        ring, index = part.ring, part.ring.index_of(ticket)
        yield from wait_until(lambda: ring.holds(ticket, index), name=f"slot-wait.{ring.name}.{ticket}")
        block = yield from ring.consume(index)
        yield from self._give_back(block)
        part.reclaiming -= 1

    def _invalidate(self, r: Request) -> int | None:
        return r.desc[0] if r.flags & INVALIDATE and r.desc is not None and r.desc[0] else None

    def pool_position(self, block: int) -> int:
        return block - self.pool.to(0)

    def block(self, i: int) -> int:
        """The Block Offset of the pool's ``i``-th block."""
        return self.pool.to(i * self.p.block_size)

    # ---- the table in memory (what DIRECT_LOAD readers see) -------------------------------------------------

    def _entry_at(self, handle: int) -> int:
        return TABLE_LEAD + ENTRY_SIZE * (handle - HANDLE_BASE)

    def _bind_entry(self, handle: int, length: int, block: int, flags: int) -> Steps:
        """Data Length and Block Offset, then Flags and the next Generation (one step of this actor)."""
        e = self.table[handle]
        e.length, e.block = length, block
        self._write_location(handle)
        e.flags, e.generation = flags, next_generation(e.generation)
        self._write_state(handle)
        yield from ()

    def _write_state(self, handle: int) -> None:
        """Flags and Generation of the entry (octets 0..3)."""
        e = self.table[handle]
        self.table_mem.write(self._entry_at(handle), ENTRY_STATE.pack(e.flags, e.generation))

    def _write_location(self, handle: int) -> None:
        """Data Length and Block Offset of the entry (octets 4..15)."""
        e = self.table[handle]
        self.table_mem.write(self._entry_at(handle) + 4, ENTRY_LENGTH.pack(e.length) + self.offset_octets(e.block))

    def offset_octets(self, block: int) -> bytes:
        """A Block Offset as table entries hold it: little-endian under ADDR_LE, else network byte order."""
        return block.to_bytes(8, "little" if self.addr_le else "big")


@dataclass
class Request:
    conn: Connection
    me: Initiator
    opcode: int
    flags: int
    rid: int
    handle: int
    gen: int
    desc: tuple[int, int, int] | None
    inline: bytes | None


class IndependentTarget:
    """kbtp-target driver (``python:tests.kbtp.independent_target:IndependentTarget``)."""

    ring_class: type[SharedRing] = SharedRing
    running_class: type[_Running] = _Running

    def start(self, fabric: Fabric, node: Node, params: TargetParams) -> _Running:
        return self.running_class(fabric, node, params, self.ring_class)


class ServedIndependentTarget(ReferenceTargetDriver):
    """The same target in a process of its own (``kvconform serve kbtp-target --driver-class
    tests.kbtp.independent_target:ServedIndependentTarget``, which takes a subclass of the reference's driver): only
    ``start`` is used, and it is this module's, so the harness judges it as a black box over a wire."""

    def start(self, fabric: Fabric, node: Node, params: TargetParams) -> _Running:  # type: ignore[override]
        return IndependentTarget().start(fabric, node, params)


# ---- one ring bug each (the blame tests) --------------------------------------------------------------------


class _SkippingRing(SharedRing):
    def free_slot(self, ticket: int, index: int) -> int:
        return (index + 1) % self.n  # one slot past the one the Tail's FetchAdd returned


class SkipsASlot(IndependentTarget):
    """A free writes the slot after the one its Tail ticket names (KBTP-FREE-SLOT-ORDER: "the target writes the
    Block Offset and then Sequence u" into the Tail slot): from the first free on, no freed block reaches an
    allocation. The shared ring is not readable, so the harness sees only the lost block (KBTP-RING-NO-LOSS)."""

    ring_class = _SkippingRing


class _ForgettingRing(SharedRing):
    def consume(self, index: int) -> Steps:
        _, block = self.slot(index)
        self.put(index, block=ONES)
        self.deferred.pop(index, None)  # a free that waited on this slot is dropped: its block is lost
        yield from ()
        return block


class DropsDeferredFrees(IndependentTarget):
    """A free deferred on an unconsumed slot is dropped when the slot is consumed (KBTP-FREE-DEFER): its block
    is lost, and the allocation of its ticket waits for ever."""

    ring_class = _ForgettingRing


class _LateWrappingRing(SharedRing):
    def fetch_add(self, which: str) -> tuple[int, int]:
        ticket, index = super().fetch_add(which)
        if which == "tail":
            index = ticket % (2 * self.n)  # the Tail's Slot Offset wraps at twice the end of the ring
        return ticket, index

    def give_back(self, ticket: int, index: int, block: int) -> Steps:
        if index >= self.n:
            return  # written past the last slot, outside the ring: the block is lost
        yield from super().give_back(ticket, index, block)


class WrapsAtTwiceTheRing(IndependentTarget):
    """The Tail's Slot Offset wraps at twice the end of the ring (KBTP-RING-WRAP: "advances ... the Slot Offset by
    one slot, wrapping at the end of the ring"): the frees of the first lap land, the first one whose Tail ticket
    reaches N writes past the last slot and its block is lost."""

    ring_class = _LateWrappingRing


class _ForwardFilledRing(SharedRing):
    def initialize(self, blocks: list[int]) -> None:
        super().initialize(blocks)
        for s in range(len(blocks), self.n):  # the first lap's slots as if they held blocks again, from block 0
            self.put(s, s, blocks[s % len(blocks)])


class FillsEmptySlots(IndependentTarget):
    """Slots F..N-1 start as {Sequence s, the (s mod F)-th block}, not {Sequence s - N, all ones} (KBTP-RING-INIT):
    the allocation of first-lap ticket s >= F is handed a block still bound."""

    ring_class = _ForwardFilledRing


class _CrashingOnLoad(_Running):
    def _load(self, r: Request, stage: Any) -> Steps:
        raise RuntimeError("the LOAD path of this target is broken")
        yield from ()


class CrashesOnLoad(IndependentTarget):
    """The actor serving a connection raises on every LOAD (a crash while driven): checks waiting for a LOAD's
    completion fail on what says it completes (KBTP-LOAD-COMPLETE), not on a default requirement."""

    running_class = _CrashingOnLoad


# ---- one table bug each (tests/kbtp/test_independent_target.py; DIRECT_LOAD shows the table) -----------------------


class _BigEndianOffsets(_Running):
    def offset_octets(self, block: int) -> bytes:
        return block.to_bytes(8, "big")  # network byte order even when HELLO_ACK set ADDR_LE


class BigEndianTableOffsets(IndependentTarget):
    """Table entries hold their Block Offset in network byte order while HELLO_ACK sets ADDR_LE (KBTP-ADDRLE-MEMORY:
    "the Block Offset fields of table entries and ring slots are in little-endian byte order")."""

    running_class = _BigEndianOffsets


class _StateBeforeLocation(_Running):
    def _bind_entry(self, handle: int, length: int, block: int, flags: int) -> Steps:
        e = self.table[handle]
        e.flags, e.generation = flags, next_generation(e.generation)
        self._write_state(handle)
        yield from pause("entry-location")  # a reader may see VALID with the entry's old location
        e.length, e.block = length, block
        self._write_location(handle)


class StateBeforeLocation(IndependentTarget):
    """A bind writes Flags and Generation before Data Length and Block Offset (KBTP-TABLE-BIND-ORDER: "when it binds
    an entry, the target writes Data Length and Block Offset before Flags and Generation")."""

    running_class = _StateBeforeLocation


# ---- one DIRECT_ALLOC bug each (tests/kbtp/test_independent_target.py) ----------------------------------------------


class _BindsAnyOffset(_Running):
    def slot_holds(self, ring: SharedRing, ticket: int, index: int, block: int) -> bool:
        return ring.holds(ticket, index)  # the ticket's slot holds a block: not necessarily the one BIND names


class BindsAnyOffset(IndependentTarget):
    """BIND checks that the ticket's slot holds a block, not that it holds the Block Offset the BIND names
    (KBTP-BIND-VERIFY: "the target verifies ... that the slot of the ticket holds that Block Offset"): a BIND
    naming another Block Offset binds it."""

    running_class = _BindsAnyOffset


class _ReclaimsUnfenced(_Running):
    def _fence(self, owner: Initiator) -> None:
        pass  # the session keeps its connection and its Partition STag


class ReclaimsUnfenced(IndependentTarget):
    """An abandoned ticket's block is reclaimed while the session keeps its Partition STag and its connection
    (KBTP-TICKET-RECLAIM-FENCE: "Before reclaiming its block, the target MUST ensure that no RDMA Write of the
    initiator can still reach the block"): a late RDMA Write of the initiator still lands in the block."""

    running_class = _ReclaimsUnfenced


class _ForgetsAbandonedTickets(_Running):
    def _bind(self, conn: Connection, me: Initiator, rid: int, handle: int, gen: int, raw: bytes) -> Steps:
        if me.partition is not None:
            me.partition.abandoned.clear()  # a later BIND of an abandoned ticket is refused as never taken
        yield from super()._bind(conn, me, rid, handle, gen, raw)


class ForgetsAbandonedTickets(IndependentTarget):
    """A later BIND of an abandoned ticket is refused NOT_VALID, as a ticket never taken, not TICKET_ABANDONED
    (KBTP-TICKET-ABANDONED: "rejects a later BIND for that ticket with status TICKET_ABANDONED"). The fence ended the
    connection, so that BIND comes on the initiator's next session."""

    running_class = _ForgetsAbandonedTickets
