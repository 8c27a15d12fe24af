"""kbtp-target: the direct modes, checked through the STags the target exposes (KBTP "Direct Modes",
"Block Table", "Free-Block Ring", the HELLO_ACK descriptors, "Examples" ring counter)."""

from __future__ import annotations

import pytest

from kvconform.conformance.kbtp import expect
from kvconform.conformance.kbtp.client import Gen, HarnessInitiator, add_mask
from kvconform.fixtures.kbtp import TargetUnderTest
from kvconform.kbtp.constants import EMPTY_BLOCK_OFFSET, RING_SLOT_SIZE, EntryFlags, Features, RequestFlags, Status

DL, DA = Features.DIRECT_LOAD, Features.DIRECT_ALLOC
SEAL = int(RequestFlags.SEAL)


def _open(ini: HarnessInitiator, features: Features) -> Gen:
    ack = yield from ini.hello(features)
    expect.status_is(ini.replies[-1], Status.OK, req="KBTP-HELLO-FIRST", what="HELLO_ACK")
    expect.holds(bool(Features(ack.features) & features == features),
                 f"HELLO_ACK Features {Features(ack.features)!r} lacks {features!r}, which PICS declares",
                 req="KBTP-ACK-FEATURES")
    return ack


@pytest.mark.req("KBTP-ACK-DLOAD-DESC", "KBTP-TABLE-LAYOUT", "KBTP-TABLE-ADDRESS", "KBTP-TABLE-FLAGS",
                 "KBTP-POOL-BLOCKS", "KBTP-ADDRLE-MEMORY", "KBTP-DLOAD-VALIDITY", "KBTP-ALLOC-ENTRY-ORDER")
def test_direct_load_reads(kbtp_target: TargetUnderTest, seed: int) -> None:
    """Through the Table and Pool STags: the entry of a handle is where the table address rule puts it,
    with VALID|SEALED, the completion's Generation, Data Length and Block Offset (little-endian under
    ADDR_LE), and the block holds the data; an unbound entry is not VALID."""
    kbtp_target.require(DL)
    p = kbtp_target.params
    bed = kbtp_target.bed(seed, label="direct-load")
    a = bed.initiator("A")
    data = b"direct-load!" * 10

    def scenario() -> Gen:
        ack = yield from _open(a, DL)
        dl = ack.direct_load
        assert dl is not None and a.session is not None
        expect.equal("Pool descriptor Count", dl.pool.count, p.blocks, req="KBTP-ACK-DLOAD-DESC")
        expect.holds(dl.table_base_handle <= ack.handle_base and
                     ack.handle_base + ack.handle_count <= dl.table_base_handle + dl.table.count,
                     f"Table [{dl.table_base_handle:#x}, +{dl.table.count}) does not cover the handle range "
                     f"[{ack.handle_base:#x}, +{ack.handle_count})", req="KBTP-ACK-DLOAD-DESC")
        h = a.session.handle(5)
        r = yield from a.alloc_store(h, data)
        expect.status_is(r, Status.OK, req="KBTP-ALLOC-COMPLETE", what="ALLOC_STORE")
        entry = yield from a.read_entry(h)
        expect.holds(entry is not None, "RDMA Read of the table entry failed", req="KBTP-ACK-DLOAD-DESC")
        flags, gen, length, offset = entry
        expect.equal("entry Flags", flags, EntryFlags.VALID | EntryFlags.SEALED, req="KBTP-TABLE-FLAGS")
        expect.equal("entry Generation (completion's)", gen, r.generation, req="KBTP-TABLE-LAYOUT")
        expect.equal("entry Data Length", length, len(data), req="KBTP-TABLE-LAYOUT")
        expect.equal("entry Block Offset (completion's; little-endian under ADDR_LE)", offset,
                     r.message.block_offset, req="KBTP-ADDRLE-MEMORY" if a.addr_le else "KBTP-TABLE-LAYOUT")
        first = dl.pool.tagged_offset
        expect.holds(first <= offset < first + p.blocks * p.block_size and (offset - first) % p.block_size == 0,
                     f"Block Offset {offset:#x} is not a block of the pool [{first:#x}, +{p.blocks} x "
                     f"{p.block_size})", req="KBTP-POOL-BLOCKS")
        wc, block = yield from a.rdma_read(dl.pool.stag, offset, len(data))
        expect.holds(wc.ok, f"RDMA Read of the block through the Pool STag failed: {wc.status.name}",
                     req="KBTP-POOL-BLOCKS")
        expect.equal("block read through the Pool STag", block, data, req="KBTP-DLOAD-VALIDITY")
        again = yield from a.read_entry(h)
        expect.equal("second entry read", again, entry, req="KBTP-DLOAD-VALIDITY")
        unbound = yield from a.read_entry(a.session.handle(6))
        expect.holds(unbound is not None and not unbound[0] & EntryFlags.VALID,
                     f"entry of an unbound handle reads {unbound}", req="KBTP-TABLE-FLAGS")

    bed.run_one(scenario())


@pytest.mark.parametrize("which", ["table", "pool"])
@pytest.mark.req("KBTP-DLOAD-READONLY", "KBTP-TABLE-TARGET-ONLY")
def test_direct_load_stags_are_read_only(which: str, kbtp_target: TargetUnderTest, seed: int) -> None:
    """An RDMA Write through the Table or Pool STag fails and changes nothing."""
    kbtp_target.require(DL)
    bed = kbtp_target.bed(seed, label=f"readonly-{which}")
    a, b = bed.initiator("A"), bed.initiator("B")
    data = b"protected" * 4

    def scenario() -> Gen:
        ack = yield from _open(a, DL)
        yield from _open(b, DL)
        assert a.session is not None and ack.direct_load is not None
        h = a.session.handle(1)
        r = yield from a.alloc_store(h, data)
        expect.status_is(r, Status.OK, req="KBTP-ALLOC-COMPLETE", what="ALLOC_STORE")
        dl = ack.direct_load
        if which == "table":
            stag, to = dl.table.stag, dl.table.tagged_offset + 16 * (h - dl.table_base_handle)
        else:
            stag, to = dl.pool.stag, r.message.block_offset
        wc = yield from b.rdma_write(stag, to, b"\x00" * 16)
        expect.holds(not wc.ok, f"an RDMA Write through the {which} STag succeeded", req="KBTP-DLOAD-READONLY")
        lr, got = yield from a.load(h, 64)
        expect.status_is(lr, Status.OK, req="KBTP-TABLE-TARGET-ONLY", what=f"LOAD after the {which} write attempt")
        expect.equal(f"data after the {which} write attempt", got, data, req="KBTP-DLOAD-READONLY")

    bed.run_one(scenario())


@pytest.mark.req("KBTP-EX-RING", "KBTP-RING-WRAP", "KBTP-RING-FETCHADD", "KBTP-RING-COUNTER-FIELDS",
                 "KBTP-RING-COUNTER-BYTEORDER", "KBTP-RING-INIT", "KBTP-RING-SIZE", "KBTP-RING-SLOT-LAYOUT",
                 "KBTP-RING-EMPTY", "KBTP-RING-CONSUME", "KBTP-RING-COUNTERS", "KBTP-ACK-DALLOC-DESC",
                 "KBTP-ACK-HEAD-ALIGN", "KBTP-QUOTA-DIRECT-PARTITION", "KBTP-RDMAP-ATOMICS", "KBTP-BIND-VERIFY",
                 "KBTP-BIND-LAYOUT", "KBTP-FREE-RETURN", "KBTP-FREE-SLOT-ORDER", "KBTP-IB-UNMASKED",
                 "KBTP-RING-ALLOC-WAIT")
def test_direct_alloc_ring(kbtp_target: TargetUnderTest, seed: int) -> None:
    """The initiator's own ring: initialised as the text says, FetchAdd on its Head returns (ticket,
    slot offset) pairs that wrap after N slots exactly like the N = 4 example (the IB binding: Ticket
    alone, slot 16 * (ticket mod N)), BIND consumes the slot, FREE writes the block back with the next
    Tail ticket."""
    kbtp_target.require(DA)
    p = kbtp_target.params
    masked = p.profile.masked_atomics
    bed = kbtp_target.bed(seed, label="direct-alloc-ring")
    a = bed.initiator("A")

    def scenario() -> Gen:
        ack = yield from _open(a, DA)
        da = ack.direct_alloc
        assert da is not None and a.session is not None
        q, n = ack.allocation_quota, da.ring.count
        expect.equal("Partition descriptor Count", da.partition.count, q, req="KBTP-QUOTA-DIRECT-PARTITION")
        expect.holds(n >= q and n & (n - 1) == 0, f"Ring Count N = {n} is not a power of two >= quota {q}",
                     req="KBTP-RING-SIZE")
        expect.equal("Head descriptor Count", da.head.count, 1, req="KBTP-ACK-DALLOC-DESC")
        expect.equal("Head Tagged Offset mod 8", da.head.tagged_offset % 8, 0, req="KBTP-ACK-HEAD-ALIGN")
        # Initial ring contents.
        blocks = []
        for s in range(n):
            got = yield from a.read_slot(da.ring.stag, da.ring.tagged_offset, RING_SLOT_SIZE * s)
            expect.holds(got is not None, f"RDMA Read of slot {s} failed", req="KBTP-ACK-DALLOC-DESC")
            seq, off = got
            if s < q:
                expect.equal(f"slot {s} Sequence", seq, s, req="KBTP-RING-INIT")
                expect.holds(off != EMPTY_BLOCK_OFFSET, f"slot {s} < F is empty", req="KBTP-RING-INIT")
                blocks.append(off)
            else:
                expect.equal(f"slot {s} Sequence", seq, (s - n) % (1 << 32), req="KBTP-RING-INIT")
                expect.equal(f"slot {s} Block Offset", off, EMPTY_BLOCK_OFFSET, req="KBTP-RING-EMPTY")
        expect.equal("distinct blocks of the initial slots", len(set(blocks)), q, req="KBTP-RING-INIT")
        # n + 1 allocations, each bound and freed, so the Head wraps within the quota.
        mask = add_mask(n)
        for i in range(n + 1):
            wc, old = yield from a.fetch_add(da.head.stag, da.head.tagged_offset,
                                             0x0000_0001_0000_0010 if masked else 0x0000_0001_0000_0000,
                                             mask if masked else 0)
            expect.holds(wc.ok, f"FetchAdd {i} on the Head failed: {wc.status.name} {wc.terminate}",
                         req="KBTP-RDMAP-ATOMICS")
            want = (i << 32) | (RING_SLOT_SIZE * (i % n)) if masked else i << 32
            expect.equal(f"Head value returned by FetchAdd {i} (ticket, slot offset)", old, want,
                         req="KBTP-RING-WRAP" if masked else "KBTP-IB-UNMASKED")
            ticket, slot = i, RING_SLOT_SIZE * (i % n)
            block = yield from a.await_slot(ticket, slot)
            expect.holds(block is not None, f"slot {slot} could not be read", req="KBTP-RING-ALLOC-WAIT")
            wc = yield from a.write_block(block, bytes([i]) * 32)
            expect.holds(wc.ok, f"RDMA Write through the Partition STag failed: {wc.status.name}",
                         req="KBTP-ACK-PARTITION-SCOPE")
            h = a.session.handle(i)
            r = yield from a.bind(h, ticket, 32, block)
            expect.status_is(r, Status.OK, req="KBTP-BIND-VERIFY", what=f"BIND of ticket {ticket}")
            seq_off = yield from a.read_slot(da.ring.stag, da.ring.tagged_offset, slot)
            expect.equal(f"slot {slot} Block Offset after BIND", seq_off[1], EMPTY_BLOCK_OFFSET,
                         req="KBTP-RING-CONSUME")
            lr, got = yield from a.load(h, 32, flags=RequestFlags.ALLOW_UNSEALED)
            expect.status_is(lr, Status.OK, req="KBTP-BIND-VERIFY", what="LOAD of the bound handle")
            expect.equal("data written before BIND", got, bytes([i]) * 32, req="KBTP-BIND-VERIFY")
            f = yield from a.free(h)
            expect.status_is(f, Status.OK, req="KBTP-FREE-RETURN", what="FREE")
            u = q + i  # the Tail ticket of this free
            tail_slot = RING_SLOT_SIZE * (u % n)
            back = yield from a.read_slot(da.ring.stag, da.ring.tagged_offset, tail_slot)
            expect.equal(f"slot {tail_slot} after the FREE (Sequence, Block Offset)", back, (u, block),
                         req="KBTP-FREE-RETURN")

    bed.run_one(scenario())


@pytest.mark.req("KBTP-BIND-VERIFY", "KBTP-ACK-PARTITION-SCOPE")
def test_bind_is_verified(kbtp_target: TargetUnderTest, seed: int) -> None:
    """BIND with a Block Offset other than the ticket's slot's, or for a ticket never taken, is refused
    and binds nothing; the Partition STag reaches only the partition, and only on its own connection."""
    kbtp_target.require(DA)
    p = kbtp_target.params
    bed = kbtp_target.bed(seed, label="bind-verify")
    a, b = bed.initiator("A"), bed.initiator("B")

    def scenario() -> Gen:
        ack = yield from _open(a, DA)
        yield from _open(b, Features(0))
        da = ack.direct_alloc
        assert da is not None and a.session is not None
        ticket, slot = yield from a.take_ticket()
        block = yield from a.await_slot(ticket, slot)
        assert block is not None
        h = a.session.handle(0)
        r = yield from a.bind(h, ticket, 16, block + p.block_size * 1000)
        expect.holds(r.status != Status.OK, "BIND with a Block Offset its slot does not hold completed OK",
                     req="KBTP-BIND-VERIFY")
        r = yield from a.bind(a.session.handle(1), ticket + 5, 16, block)
        expect.holds(r.status != Status.OK, "BIND for a ticket never taken completed OK", req="KBTP-BIND-VERIFY")
        lr, _ = yield from a.load(h, 16, flags=RequestFlags.ALLOW_UNSEALED)
        expect.status_is(lr, Status.NOT_VALID, req="KBTP-BIND-VERIFY", what="LOAD after the refused BIND")
        r = yield from a.bind(h, ticket, 16, block)
        expect.status_is(r, Status.OK, req="KBTP-BIND-VERIFY", what="the right BIND after the refused ones")
        end = da.partition.tagged_offset + da.partition.count * p.block_size
        wc = yield from b.rdma_write(da.partition.stag, block, b"x" * 8)
        expect.holds(not wc.ok, "another connection wrote through this connection's Partition STag",
                     req="KBTP-ACK-PARTITION-SCOPE")
        wc = yield from a.rdma_write(da.partition.stag, end, b"x" * 8)
        expect.holds(not wc.ok, f"an RDMA Write past the partition (Tagged Offset {end:#x}) succeeded",
                     req="KBTP-ACK-PARTITION-SCOPE")

    bed.run_one(scenario())


