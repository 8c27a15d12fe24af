"""A KBTP target written from the text alone (spec/seeds/003_a48f4321884951de.txt), for the harness's own tests.

It shares no code with the reference target (kvconform.kbtp.target) nor with the codec (kvconform.kbtp.messages):
its parsing and encoding are the text's field lists, written again with ``struct``. It runs on the harness's
emulated fabric through the semantic interface (kvconform.rdma) like any other ``python:`` target, and in a process
of its own over a wire (``ServedIndependentTarget``).

A software target serving one shared free-block ring. Of the optional features it offers those PICS
kbtp.target.features declares among DIRECT_LOAD and ADDR_LE (none when none is declared: HELLO_ACK Features 0):
- DIRECT_LOAD: the block table lives in a registered memory region the initiator may RDMA-read (16-octet entries
  {Flags, Generation, Data Length, Block Offset}, the entry of handle h at Table Offset + 16 * (h - Table Base
  Handle)), and so does the pool; HELLO_ACK carries the Table descriptor, the Table Base Handle, 8 reserved octets
  and the Pool descriptor only when the initiator requested DIRECT_LOAD and is trusted (not listed in PICS
  kbtp.target.untrusted_initiators: "A target MUST offer them only to initiators it trusts");
- ADDR_LE: set in every HELLO_ACK (the text makes it the target's choice, not the initiator's); the Block Offset of
  table entries is then little-endian, and the Block Handle and the descriptors' STag, Tagged Offset and Length of
  every later request are decoded little-endian.
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
- BIND (no DIRECT_ALLOC is offered) completes MALFORMED;
- the pool is registered zero-based: the first block's Block Offset is 0;
- the table does not start its region: a Table descriptor's Tagged Offset is 48 octets into a region that is
  not zero-based (the first 48 octets are zero);
- the table has an entry for exactly the handles of the ranges it hands out (Count = max_initiators * Handle
  Count), every one starting at Generation 1, Flags 0.

For the harness's scripted race checks it follows the race-point convention the harness documents: the actor
serving connection C is ``target@C``; an allocation pauses at ``read-slot.shared.<ticket>`` after its Head
FetchAdd, a free at ``tail.shared`` before its Tail FetchAdd.

The variants at the end break one rule each, for the blame tests (tests/kbtp/test_verdicts.py,
tests/kbtp/test_ring_blame.py, tests/kbtp/test_independent_target.py).
"""

from __future__ import annotations

import struct
from collections import deque
from collections.abc import Generator
from dataclasses import dataclass, field
from typing import Any

from kvconform.rdma import Access, Command, Connection, ConnState, Fabric, Node, Op, pause, wait_completion, wait_until
from kvconform.targets.kbtp import ReferenceTargetDriver, TargetParams

Steps = Generator[Command, Any, Any]

# The text's registries.
HELLO, HELLO_ACK, LOAD, STORE, ALLOC_STORE, FREE, BIND, COMPLETION, GOODBYE = (
    0x01, 0x02, 0x10, 0x11, 0x12, 0x13, 0x14, 0x20, 0x30)
OK, INVALID_HANDLE, STALE_GENERATION, NOT_VALID, ALREADY_BOUND, NO_SPACE, SEALED, NOT_SEALED, TOO_LARGE, MALFORMED = (
    range(10))
INLINE, SEAL, RECORD, INVALIDATE, ALLOW_UNSEALED = 0x01, 0x02, 0x04, 0x08, 0x10
F_VALID, F_SEALED = 0x0001, 0x0002
RELEASE = 0x0001
DIRECT_LOAD, ADDR_LE = 0x0001, 0x0008
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

    def owns(self, handle: int, count: int) -> bool:
        return self.base <= handle < self.base + count

    @property
    def usage(self) -> int:
        return len(self.bound) + self.pending


class SharedRing:
    """N slots {Sequence, Block Offset} and the Head and Tail counters, worked by the target's CPU."""

    def __init__(self, blocks: list[int], slots: int, masked: bool) -> None:
        self.n, self.masked = slots, masked
        order = slots.bit_length() - 1
        self.add = 0x0000_0001_0000_0010 if masked else 0x0000_0001_0000_0000
        self.mask = (1 << 63) | (1 << 31) | (1 << (order + 3)) if masked else 0
        f = len(blocks)
        self.slots = [[s, blocks[s]] if s < f else [(s - slots) % (1 << 32), ONES] for s in range(slots)]
        self.head = 0
        self.tail = (f << 32) | (16 * (f % slots) if masked else 0)
        self.deferred: dict[int, deque[tuple[int, int]]] = {}

    def fetch_add(self, which: str) -> tuple[int, int]:
        """(ticket, slot index) from one FetchAdd on ``which`` ("head" or "tail")."""
        old = getattr(self, which)
        setattr(self, which, masked_add(old, self.add, self.mask))
        ticket = old >> 32
        index = (old & 0xFFFF_FFFF) // 16 if self.masked else ticket % self.n
        return ticket, index

    def free_slot(self, ticket: int, index: int) -> int:
        """The slot a free of Tail ``ticket`` writes (``index``, the one its FetchAdd returned)."""
        return index

    def holds(self, ticket: int, index: int) -> bool:
        seq, block = self.slots[index]
        return seq == ticket % (1 << 32) and block != ONES

    def consume(self, index: int) -> int:
        """Take the slot's block, mark it consumed, then write a free that waited on it."""
        block = self.slots[index][1]
        self.slots[index][1] = ONES
        waiting = self.deferred.get(index)
        if waiting:
            u, freed = waiting.popleft()
            self.flush(index, u, freed)
        return block

    def flush(self, index: int, ticket: int, block: int) -> None:
        self.slots[index][1] = block  # the Block Offset first, then the Sequence
        self.slots[index][0] = ticket % (1 << 32)

    def give_back(self, ticket: int, index: int, block: int) -> None:
        index = self.free_slot(ticket, index)
        if self.slots[index][1] != ONES or self.deferred.get(index):
            self.deferred.setdefault(index, deque()).append((ticket, block))
        else:
            self.flush(index, ticket, block)


class _Running:
    """One started target: its pool, table and ring, serving every attached connection."""

    def __init__(self, fabric: Fabric, node: Node, p: TargetParams, ring_class: type[SharedRing]) -> None:
        self.fabric, self.node, self.p = fabric, node, p
        self.offered = int(p.features) & (DIRECT_LOAD | ADDR_LE)
        self.addr_le = bool(self.offered & ADDR_LE)
        # Initiators may read the pool and the table only through the STags DIRECT_LOAD hands out.
        remote = Access.REMOTE_READ if self.offered & DIRECT_LOAD else Access.NONE
        self.pool = node.register(node.alloc(p.blocks * p.block_size), Access.LOCAL_WRITE | remote, zero_based=True)
        shared = p.shared_count
        slots = p.ring_slots or max(2, 1 << max(0, (shared - 1).bit_length()))
        blocks = [self.pool.to(i * p.block_size) for i in range(shared)]
        self.ring = ring_class(blocks, slots, fabric.profile.masked_atomics)
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
        if me is not None and me.conn is conn:
            me.conn = None  # retained (for ever: a retention time of this target's choosing)

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
            if flags & RELEASE:
                for h in sorted(me.bound):
                    yield from self._unbind(me, h)
                del self.initiators[me.iid]
            me.conn = None
            conn.disconnect()
            return None, True
        if opcode == BIND:
            self._complete(conn, rid, handle, MALFORMED)
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
        if known is None:
            quota = self.quotas.get(iid, self.p.quota)
            used = {i.base for i in self.initiators.values()}
            free = [HANDLE_BASE + k * self.p.handle_count for k in range(self.p.max_initiators)]
            free = [b for b in free if b not in used]
            total = sum(i.quota for i in self.initiators.values()) + quota
            if not free or total > self.p.shared_count:
                self._send(conn, HEADER.pack(1, HELLO_ACK, 0, 0, 0, 0, NO_SPACE) + bytes(32))
                return None, False
            known = self.initiators[iid] = Initiator(iid, free[0], quota)
        known.conn = conn
        (requested,) = struct.unpack_from(">H", raw, 24)
        granted = self.offered & ADDR_LE  # the target's choice, whatever was requested
        if iid not in self.p.untrusted_initiators:  # direct modes only to initiators it trusts
            granted |= requested & self.offered & DIRECT_LOAD
        body = struct.pack(">HHIIIQII", granted, CREDITS, self.p.block_size, self.p.max_inline, known.quota,
                           known.base, self.p.handle_count, self.p.ticket_timeout_ms)
        if granted & DIRECT_LOAD:  # Table descriptor, Table Base Handle, 8 reserved octets, Pool descriptor
            body += DESC.pack(self.table_mem.stag, self.table_mem.to(TABLE_LEAD), self.entries)
            body += struct.pack(">Q8x", HANDLE_BASE)
            body += DESC.pack(self.pool.stag, self.pool.to(0), self.p.blocks)
        self._send(conn, HEADER.pack(1, HELLO_ACK, 0, 0, 0, 0, OK) + body)
        yield from ()
        return known, False

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
        ticket, index = self.ring.fetch_add("head")
        yield from pause(f"read-slot.shared.{ticket}")
        yield from wait_until(lambda: self.ring.holds(ticket, index), name=f"slot-wait.shared.{ticket}")
        block = self.ring.consume(index)
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
        yield from pause("tail.shared")
        ticket, index = self.ring.fetch_add("tail")
        self.ring.give_back(ticket, index, block)

    def _invalidate(self, r: Request) -> int | None:
        return r.desc[0] if r.flags & INVALIDATE and r.desc is not None and r.desc[0] else None

    def pool_position(self, block: int) -> int:
        return block - self.pool.to(0)

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
    def consume(self, index: int) -> int:
        block = self.slots[index][1]
        self.slots[index][1] = ONES
        self.deferred.pop(index, None)  # a free that waited on this slot is dropped: its block is lost
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

    def give_back(self, ticket: int, index: int, block: int) -> None:
        if index >= self.n:
            return  # written past the last slot, outside the ring: the block is lost
        super().give_back(ticket, index, block)


class WrapsAtTwiceTheRing(IndependentTarget):
    """The Tail's Slot Offset wraps at twice the end of the ring (KBTP-RING-WRAP: "advances ... the Slot Offset by
    one slot, wrapping at the end of the ring"): the frees of the first lap land, the first one whose Tail ticket
    reaches N writes past the last slot and its block is lost."""

    ring_class = _LateWrappingRing


class _ForwardFilledRing(SharedRing):
    def __init__(self, blocks: list[int], slots: int, masked: bool) -> None:
        super().__init__(blocks, slots, masked)
        for s in range(len(blocks), slots):  # the first lap's slots as if they held blocks again, from block 0
            self.slots[s] = [s, blocks[s % len(blocks)]]


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


# ---- one table bug each (tests/kbtp/test_independent_target.py; DIRECT_LOAD shows the table) ---------------------


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
