"""kbtp-target: the direct modes, checked through the STags the target exposes (KBTP "Direct Modes",
"Block Table", "Free-Block Ring", the HELLO_ACK descriptors, "Examples" ring counter)."""

from __future__ import annotations

import struct

import pytest

from kvconform.conformance.kbtp import diagnose, expect, hangs
from kvconform.fixtures.kbtp import TargetUnderTest
from kvconform.kbtp.constants import EMPTY_BLOCK_OFFSET, RING_SLOT_SIZE, EntryFlags, Features, RequestFlags, Status
from kvconform.kbtp.messages import HelloAck
from kvconform.kbtp.ring import TICKET_MODULUS
from kvconform.targets.kbtp_bed import Bed
from kvconform.targets.kbtp_client import Gen, HarnessInitiator, add_mask, pattern
from kvconform.verdicts import check, check_equal, inconclusive, not_applicable, violation

DL, DA = Features.DIRECT_LOAD, Features.DIRECT_ALLOC
SEAL = int(RequestFlags.SEAL)
UNSEALED_OK = int(RequestFlags.ALLOW_UNSEALED)
MASKED_ADD = 0x0000_0001_0000_0010
UNMASKED_ADD = 0x0000_0001_0000_0000
R_SLOT = "KBTP-RING-ALLOC-WAIT"
R_TABLE_ONLY = "KBTP-TABLE-TARGET-ONLY"  # cited by the "table" case only
ORDER_TRIES = 3  # re-bindings of a handle whose Block Offset reads the same in both byte orders


def _open(bed: Bed, ini: HarnessInitiator, features: Features) -> Gen:
    ack = yield from bed.open(ini, features)
    if Features(ack.features) & features != features:
        inconclusive(f"HELLO_ACK Features {Features(ack.features)!r} lack {features!r}, which PICS declares "
                     "(test_ack_features_match_pics judges that); this check needs it")
    return ack


# ---- DIRECT_LOAD ----------------------------------------------------------------------------------------


@pytest.mark.req("KBTP-ACK-DLOAD-DESC", "KBTP-HELLO-FIRST")
def test_direct_load_descriptors(kbtp_target: TargetUnderTest, seed: int) -> None:
    """The DIRECT_LOAD descriptors: a Table whose entries cover the initiator's handle range from the Table
    Base Handle, and a Pool descriptor whose Count is F."""
    kbtp_target.require(DL)
    bed = kbtp_target.bed(seed, label="direct-load-desc")
    a = bed.initiator("A")
    ack: HelloAck = bed.run_one(_open(bed, a, DL))
    dl = ack.direct_load
    if dl is None:
        violation("HELLO_ACK announces DIRECT_LOAD without its descriptors", req="KBTP-ACK-DLOAD-DESC")
    expect.equal("Pool descriptor Count", dl.pool.count, kbtp_target.params.blocks, req="KBTP-ACK-DLOAD-DESC")
    check(dl.table_base_handle <= ack.handle_base and
          ack.handle_base + ack.handle_count <= dl.table_base_handle + dl.table.count,
          f"Table [{dl.table_base_handle:#x}, +{dl.table.count}) does not cover the handle range "
          f"[{ack.handle_base:#x}, +{ack.handle_count})", req="KBTP-ACK-DLOAD-DESC")


@pytest.mark.req("KBTP-TABLE-ADDRESS", "KBTP-TABLE-FLAGS", "KBTP-TABLE-LAYOUT", "KBTP-ADDRLE-MEMORY",
                 "KBTP-HELLO-FIRST", "KBTP-QUOTA-ALLOC-BOUNDED")
@pytest.mark.blames("KBTP-FREE-RETURN")  # the FREE before a re-binding: it claims nothing when it completes
@hangs.diagnosed
def test_direct_load_entry(kbtp_target: TargetUnderTest, seed: int) -> None:
    """Through the Table STag, the entry the table address rule names for a bound handle holds VALID|SEALED,
    the completion's Generation, Data Length and Block Offset (little-endian under ADDR_LE); an unbound
    handle's entry is not VALID. A Block Offset whose octets read the same both ways (block 0 of a zero-based
    pool) shows no byte order: the handle is freed and bound again until it gets another block."""
    kbtp_target.require(DL)
    bed = kbtp_target.bed(seed, label="direct-load-entry")
    a = bed.initiator("A")
    data = (b"direct-load!" * 10)[:kbtp_target.params.block_size]  # within any declared Block Size

    def scenario() -> Gen:
        yield from _open(bed, a, DL)
        h = a.handle(5)
        r = yield from a.alloc_store(h, data)
        expect.status_is(r, Status.OK, req="KBTP-QUOTA-ALLOC-BOUNDED", what="ALLOC_STORE")
        for _ in range(ORDER_TRIES):
            if diagnose.swapped(r.block_offset) != r.block_offset:
                break
            f = yield from a.free(h)
            expect.status_is(f, Status.OK, req="KBTP-FREE-RETURN", what="FREE of a block that shows no byte order")
            r = yield from a.alloc_store(h, data)
            expect.status_is(r, Status.OK, req="KBTP-QUOTA-ALLOC-BOUNDED", what="ALLOC_STORE after that FREE")
        entry = yield from a.read_entry(h, req="KBTP-TABLE-ADDRESS")
        unbound = yield from a.read_entry(a.handle(6), req="KBTP-TABLE-ADDRESS")
        return r, entry, unbound

    r, entry, unbound = bed.run_one(scenario())
    check(entry is not None, "RDMA Read of the table entry at the address rule's offset failed",
          req="KBTP-TABLE-ADDRESS")
    flags, gen, length, offset = entry
    check(bool(flags & EntryFlags.VALID) and gen == r.generation, "the entry at Table Offset + 16 * (h - Table Base "
          "Handle) is not the bound handle's (VALID with the completion's Generation)", req="KBTP-TABLE-ADDRESS",
          seen=(flags, gen), expected=(EntryFlags.VALID | EntryFlags.SEALED, r.generation))
    expect.equal("entry Flags", flags, EntryFlags.VALID | EntryFlags.SEALED, req="KBTP-TABLE-FLAGS", offset=0)
    expect.equal("entry Data Length", length, len(data), req="KBTP-TABLE-LAYOUT", offset=4)
    check(unbound is not None and not unbound[0] & EntryFlags.VALID, f"entry of an unbound handle reads {unbound}",
          req="KBTP-TABLE-FLAGS")
    shows_order = diagnose.swapped(r.block_offset) != r.block_offset
    if a.addr_le and shows_order:
        expect.equal("entry Block Offset (little-endian under ADDR_LE)", offset, r.block_offset,
                     req="KBTP-ADDRLE-MEMORY", offset=8)
    else:
        expect.equal(f"entry Block Offset{' (network byte order)' if shows_order else ''}", offset, r.block_offset,
                     req="KBTP-TABLE-LAYOUT", offset=8)
    if not shows_order:
        inconclusive(f"{ORDER_TRIES + 1} bindings of the handle all got Block Offset {r.block_offset:#x}, whose "
                     "octets read the same in both byte orders: the entry's byte order was not observable")


@pytest.mark.req("KBTP-POOL-BLOCKS", "KBTP-DLOAD-VALIDITY", "KBTP-HELLO-FIRST", "KBTP-QUOTA-ALLOC-BOUNDED",
                 "KBTP-ADDRLE-MEMORY", "KBTP-TABLE-LAYOUT")
@hangs.diagnosed
def test_direct_load_block(kbtp_target: TargetUnderTest, seed: int) -> None:
    """A direct load of a sealed block: the entry's Block Offset is a block of the pool the Pool descriptor
    names (one only with its octets reversed breaks the entry's byte order, not the pool), the block read through
    the Pool STag holds the data, and the entry reads the same again."""
    kbtp_target.require(DL)
    p = kbtp_target.params
    bed = kbtp_target.bed(seed, label="direct-load-block")
    a = bed.initiator("A")
    data = (b"direct-block" * 10)[:p.block_size]

    def scenario() -> Gen:
        yield from _open(bed, a, DL)
        dl = a.dl
        h = a.handle(5)
        r = yield from a.alloc_store(h, data)
        expect.status_is(r, Status.OK, req="KBTP-QUOTA-ALLOC-BOUNDED", what="ALLOC_STORE")
        entry = yield from a.read_entry(h, req="KBTP-DLOAD-VALIDITY")
        check(entry is not None, "RDMA Read of the table entry failed", req="KBTP-DLOAD-VALIDITY")
        offset = entry[3]
        first = dl.pool.tagged_offset
        blocks = range(first, first + p.blocks * p.block_size, p.block_size)
        reversed_block = offset not in blocks and diagnose.swapped(offset) in blocks
        # the byte order under both rules, as diagnose.judge does: the session's (ADDR_LE or not) is the one broken
        for rule in ("KBTP-ADDRLE-MEMORY", "KBTP-TABLE-LAYOUT"):
            check(not (reversed_block and rule == ("KBTP-ADDRLE-MEMORY" if a.addr_le else "KBTP-TABLE-LAYOUT")),
                  f"entry Block Offset {offset:#018x} is the block {diagnose.swapped(offset):#x} with its octets "
                  f"reversed: not {diagnose.order_name(a.addr_le)}", req=rule, seen=f"{offset:#x}",
                  expected=f"{diagnose.swapped(offset):#x}")
        check(offset in blocks,
              f"Block Offset {offset:#x} is not a block of the pool [{first:#x}, +{p.blocks} x {p.block_size})",
              req="KBTP-POOL-BLOCKS")
        wc, block = yield from a.rdma_read(dl.pool.stag, offset, len(data), req="KBTP-POOL-BLOCKS")
        check(wc.ok, f"RDMA Read of the block through the Pool STag failed: {wc.status.name}", req="KBTP-POOL-BLOCKS")
        again = yield from a.read_entry(h, req="KBTP-DLOAD-VALIDITY")
        expect.equal("block read through the Pool STag", block, data, req="KBTP-DLOAD-VALIDITY")
        expect.equal("second entry read", again, entry, req="KBTP-DLOAD-VALIDITY")

    bed.run_one(scenario())


@pytest.mark.parametrize("which", ["pool", pytest.param("table", marks=pytest.mark.req(R_TABLE_ONLY))])
@pytest.mark.req("KBTP-DLOAD-READONLY", "KBTP-HELLO-FIRST", "KBTP-QUOTA-ALLOC-BOUNDED", "KBTP-LOAD-COMPLETE")
@hangs.diagnosed
def test_direct_load_stags_are_read_only(which: str, kbtp_target: TargetUnderTest, seed: int) -> None:
    """An RDMA Write through the Table or Pool STag fails (from the connection the STags were granted on, so
    only the STag's access rights can refuse it) and changes nothing: the block keeps its data, the entry
    (written only by the target) its Generation."""
    kbtp_target.require(DL)
    bed = kbtp_target.bed(seed, label=f"readonly-{which}")
    a = bed.initiator("A")
    data = (b"protected" * 4)[:kbtp_target.params.block_size]

    def scenario() -> Gen:
        yield from _open(bed, a, DL)
        h = a.handle(1)
        r = yield from a.alloc_store(h, data)
        expect.status_is(r, Status.OK, req="KBTP-QUOTA-ALLOC-BOUNDED", what="ALLOC_STORE")
        dl = a.dl
        if which == "table":
            stag, to = dl.table.stag, dl.table.tagged_offset + 16 * (h - dl.table_base_handle)
        else:
            stag, to = dl.pool.stag, r.block_offset
        wc = yield from a.rdma_write(stag, to, b"\x00" * 16, req="KBTP-DLOAD-READONLY")
        check(not wc.ok, f"an RDMA Write through the {which} STag succeeded", req="KBTP-DLOAD-READONLY")
        user = (yield from bed.reconnect(a, DL)) if a.broken else a  # the refused Write ended the connection
        lr, got = yield from user.load(h, 64)
        expect.status_is(lr, Status.OK, req="KBTP-DLOAD-READONLY", what=f"LOAD after the {which} write attempt")
        expect.equal(f"data after the {which} write attempt", got, data, req="KBTP-DLOAD-READONLY")
        if which == "table":
            expect.equal("Generation after the table write attempt", lr.generation, r.generation, req=R_TABLE_ONLY)

    bed.run_one(scenario())


# ---- DIRECT_ALLOC ---------------------------------------------------------------------------------------


@pytest.mark.req("KBTP-ACK-DALLOC-DESC", "KBTP-QUOTA-DIRECT-PARTITION", "KBTP-RING-SIZE", "KBTP-ACK-HEAD-ALIGN",
                 "KBTP-HELLO-FIRST")
def test_direct_alloc_descriptors(kbtp_target: TargetUnderTest, seed: int) -> None:
    """The DIRECT_ALLOC descriptors: a Partition of the initiator's quota, a Ring of N = 2^n >= quota slots,
    and one Head counter at an 8-octet aligned Tagged Offset."""
    kbtp_target.require(DA)
    bed = kbtp_target.bed(seed, label="direct-alloc-desc")
    a = bed.initiator("A")
    ack: HelloAck = bed.run_one(_open(bed, a, DA))
    da = ack.direct_alloc
    if da is None:
        violation("HELLO_ACK announces DIRECT_ALLOC without its descriptors", req="KBTP-ACK-DALLOC-DESC")
    q, n = ack.allocation_quota, da.ring.count
    expect.equal("Partition descriptor Count", da.partition.count, q, req="KBTP-QUOTA-DIRECT-PARTITION")
    check(n >= q and n > 0 and n & (n - 1) == 0, f"Ring Count N = {n} is not a power of two >= quota {q}",
          req="KBTP-RING-SIZE", seen=n)
    expect.equal("Head descriptor Count", da.head.count, 1, req="KBTP-ACK-DALLOC-DESC")
    expect.equal("Head Tagged Offset mod 8", da.head.tagged_offset % 8, 0, req="KBTP-ACK-HEAD-ALIGN")


def partition_blocks(ack: HelloAck) -> frozenset[int]:
    """The Block Offsets of the initiator's DIRECT_ALLOC partition: Count blocks from its Tagged Offset."""
    da = ack.direct_alloc
    if da is None:
        return frozenset()
    return frozenset(da.partition.tagged_offset + i * ack.block_size for i in range(da.partition.count))


@pytest.mark.req("KBTP-RING-INIT", "KBTP-RING-EMPTY", "KBTP-RING-SLOT-LAYOUT", "KBTP-ADDRLE-MEMORY",
                 "KBTP-HELLO-FIRST")
def test_direct_alloc_ring_init(kbtp_target: TargetUnderTest, seed: int) -> None:
    """The initiator's ring as initialised: slot s < F holds {Sequence s, a distinct block of the partition} (its
    Block Offset in the session's byte order), slot s >= F {Sequence s - N mod 2^32, all ones} (empty); every
    slot's Reserved field is zero."""
    kbtp_target.require(DA)
    bed = kbtp_target.bed(seed, label="ring-init")
    a = bed.initiator("A")

    def scenario() -> Gen:
        ack = yield from _open(bed, a, DA)
        da = a.da
        slots = []
        for s in range(da.ring.count):
            wc, raw = yield from a.rdma_read(da.ring.stag, da.ring.tagged_offset + RING_SLOT_SIZE * s,
                                             RING_SLOT_SIZE, req="KBTP-RING-INIT")
            check(wc.ok, f"RDMA Read of slot {s} through the Ring STag failed: {wc.status.name}", req="KBTP-RING-INIT")
            slots.append(raw)
        return ack, da.ring.count, slots

    ack, n, slots = bed.run_one(scenario())
    q, partition = ack.allocation_quota, partition_blocks(ack)
    order = "<" if a.addr_le else ">"
    blocks = []
    for s, raw in enumerate(slots):
        seq, reserved = struct.unpack_from(">II", raw)
        (off,) = struct.unpack_from(order + "Q", raw, 8)
        expect.equal(f"slot {s} Reserved", reserved, 0, req="KBTP-RING-SLOT-LAYOUT", offset=4)
        if s < q:
            expect.equal(f"slot {s} Sequence", seq, s, req="KBTP-RING-INIT", offset=0)
            # byte order and the empty marker first: each explains a Block Offset that is no block of the partition
            diagnose.judge_block(off, partition, addr_le=a.addr_le, where=f"slot {s} < F (offset 8)")
            check(off in partition, f"slot {s} < F holds Block Offset {off:#x}, no block of the partition "
                  f"[{min(partition, default=0):#x}, +{q} blocks)", req="KBTP-RING-INIT", seen=f"{off:#x}")
            blocks.append(off)
        else:
            expect.equal(f"slot {s} Sequence", seq, (s - n) % (1 << 32), req="KBTP-RING-INIT", offset=0)
            expect.equal(f"slot {s} Block Offset", off, EMPTY_BLOCK_OFFSET, req="KBTP-RING-EMPTY", offset=8)
    expect.equal("distinct blocks of the initial slots", len(set(blocks)), q, req="KBTP-RING-INIT")


def _fetch_adds(bed: Bed, a: HarnessInitiator, count: int, masked: bool) -> Gen:
    """``count`` FetchAdds on the Head with the binding's Add Data and Mask; the values they returned."""
    da = a.da
    add, mask = (MASKED_ADD, add_mask(da.ring.count)) if masked else (UNMASKED_ADD, 0)
    values = []
    for i in range(count):
        wc, old = yield from a.fetch_add(da.head.stag, da.head.tagged_offset, add, mask)
        check(wc.ok, f"FetchAdd {i} on the Head failed: {wc.status.name} {wc.terminate}", req="KBTP-RDMAP-ATOMICS")
        values.append(old)
    return values


@pytest.mark.req("KBTP-RING-WRAP", "KBTP-RING-INIT", "KBTP-RING-COUNTER-FIELDS", "KBTP-RDMAP-ATOMICS",
                 "KBTP-HELLO-FIRST")
def test_direct_alloc_head(kbtp_target: TargetUnderTest, seed: int) -> None:
    """Masked FetchAdd (RFC 7306) on the initiator's Head, N + 1 times: it starts at Ticket 0, Slot Offset 0,
    returns (ticket i, slot offset 16 * (i mod N)) with bits 31..n+4 zero, the offset wrapping after N."""
    kbtp_target.require(DA)
    if not kbtp_target.params.profile.masked_atomics:
        not_applicable(f"binding {kbtp_target.params.binding} has unmasked Fetch and Add (see the _unmasked check)")
    bed = kbtp_target.bed(seed, label="head")
    a = bed.initiator("A")

    def scenario() -> Gen:
        yield from _open(bed, a, DA)
        n = a.da.ring.count
        values = yield from _fetch_adds(bed, a, n + 1, masked=True)
        return n, values

    n, values = bed.run_one(scenario())
    bits = n.bit_length() - 1 + 4
    expect.equal("Head before the first FetchAdd (Ticket 0, Slot Offset 0)", values[0], 0, req="KBTP-RING-INIT")
    for i, v in enumerate(values):
        check(not v & (((1 << 32) - 1) & ~((1 << bits) - 1)), f"Head value {v:#x} returned by FetchAdd {i} has "
              f"bits 31..{bits} set", req="KBTP-RING-COUNTER-FIELDS", seen=v)
        expect.equal(f"Head value returned by FetchAdd {i} (Ticket << 32 | Slot Offset)", v,
                     (i << 32) | (RING_SLOT_SIZE * (i % n)), req="KBTP-RING-WRAP")


@pytest.mark.req("KBTP-IB-UNMASKED", "KBTP-RING-INIT", "KBTP-RDMAP-ATOMICS", "KBTP-HELLO-FIRST")
def test_direct_alloc_head_unmasked(kbtp_target: TargetUnderTest, seed: int) -> None:
    """Unmasked Fetch and Add (InfiniBand/RoCEv2) on the Head: the Ticket in the high 32 bits, zero in the low
    32, starting at 0 and advancing by one per FetchAdd of 0x0000000100000000."""
    kbtp_target.require(DA)
    if kbtp_target.params.profile.masked_atomics:
        not_applicable(f"binding {kbtp_target.params.binding} has masked FetchAdd (see test_direct_alloc_head)")
    bed = kbtp_target.bed(seed, label="head-unmasked")
    a = bed.initiator("A")

    def scenario() -> Gen:
        yield from _open(bed, a, DA)
        values = yield from _fetch_adds(bed, a, a.da.ring.count + 1, masked=False)
        return values

    values = bed.run_one(scenario())
    for i, v in enumerate(values):
        expect.equal(f"low 32 bits of the Head value returned by FetchAdd {i}", v & 0xFFFF_FFFF, 0,
                     req="KBTP-IB-UNMASKED")
    expect.equal("Head before the first FetchAdd (Ticket 0)", values[0], 0, req="KBTP-RING-INIT")
    for i, v in enumerate(values):
        expect.equal(f"Head value returned by FetchAdd {i} (Ticket << 32)", v, i << 32, req="KBTP-IB-UNMASKED")


@pytest.mark.req("KBTP-EX-RING", "KBTP-RING-INIT", "KBTP-RDMAP-ATOMICS", "KBTP-HELLO-FIRST")
def test_ring_counter_example(kbtp_target: TargetUnderTest, seed: int) -> None:
    """The text's ring counter example (N = 4): from zero, FetchAdds with Add Data 0x0000000100000010 and Add
    Mask 0x8000000080000020 return (0, 0), (1, 16), (2, 32), (3, 48), (4, 0). Run on a partition of quota 4
    (N = 4); a target that cannot serve that quota is inconclusive."""
    kbtp_target.require(DA)
    if not kbtp_target.params.profile.masked_atomics:
        not_applicable(f"binding {kbtp_target.params.binding} has unmasked Fetch and Add")
    if kbtp_target.params.partition_count < 4:
        not_applicable(f"the declared pool leaves {kbtp_target.params.partition_count} blocks for partitions, "
                       "fewer than the example's 4")
    bed = kbtp_target.bed(seed, label="ring-example", quota=4)
    a = bed.initiator("A")

    def scenario() -> Gen:
        yield from _open(bed, a, DA)
        if a.da.ring.count != 4:
            not_applicable(f"the partition ring has N = {a.da.ring.count}, not the example's 4")
        values = yield from _fetch_adds(bed, a, 5, masked=True)
        return values

    values = bed.run_one(scenario())
    expect.equal("Head before the first FetchAdd (Ticket 0, Slot Offset 0)", values[0], 0, req="KBTP-RING-INIT")
    check_equal("Add Mask for N = 4", add_mask(4), 0x8000_0000_8000_0020, req="KBTP-EX-RING")
    expect.equal("(ticket, slot offset) returned by five FetchAdds from zero",
                 [(v >> 32, v & 0xFFFF_FFFF) for v in values], [(0, 0), (1, 16), (2, 32), (3, 48), (4, 0)],
                 req="KBTP-EX-RING")


@pytest.mark.req("KBTP-RING-CONSUME", "KBTP-BIND-VERIFY", "KBTP-FREE-RETURN", "KBTP-RING-NO-LOSS",
                 "KBTP-HELLO-FIRST", "KBTP-RDMAP-ATOMICS", "KBTP-RING-ALLOC-WAIT", "KBTP-ACK-PARTITION-SCOPE",
                 "KBTP-LOAD-COMPLETE", "KBTP-RING-WRAP", "KBTP-RING-EMPTY", "KBTP-ADDRLE-MEMORY",
                 "KBTP-RING-SLOT-LAYOUT")
def test_direct_alloc_bind_and_free(kbtp_target: TargetUnderTest, seed: int) -> None:
    """N + 1 direct allocations, each bound and freed (so the ring wraps within the quota): the slot shows a block
    of the partition, BIND marks the ticket's slot consumed (all ones) and binds the data written, FREE writes the
    block back into the slot of the next Tail ticket, and into no other slot. What the ring shows names the rule
    broken (conformance/kbtp/diagnose.py): byte order, the empty marker, the ring the block returns to, the wrap
    of the Tail's Slot Offset, before the invariant itself."""
    kbtp_target.require(DA)
    bed = kbtp_target.bed(seed, label="bind-and-free")
    a = bed.initiator("A")

    def scenario() -> Gen:
        ack = yield from _open(bed, a, DA)
        da = a.da
        q, n = ack.allocation_quota, da.ring.count
        partition = partition_blocks(ack)
        if q == 0:
            not_applicable("Allocation Quota 0")
        first = None
        # A freed block in no slot of the ring is a FREE-RETURN only if it stays away: a Tail slot off by one that
        # lands on a slot not yet consumed defers the write until the next BIND consumes it (then KBTP-RING-WRAP).
        pending: tuple[int, int] | None = None  # (block, Tail ticket) not in the ring yet
        landed = 0  # frees that landed in their slots

        def read_ring() -> Gen:
            ring = []
            for s in range(n):
                got_slot = yield from a.read_slot(da.ring.stag, da.ring.tagged_offset, RING_SLOT_SIZE * s,
                                                  req="KBTP-FREE-RETURN")
                ring.append(got_slot)
            return ring

        for i in range(n + 1):
            if pending is not None and i >= q:  # this ticket needs a freed block: the pending one must be back
                ring = yield from read_ring()
                diagnose.judge_landing(ring, *pending, addr_le=a.addr_le)
                pending = None
            ticket, slot = yield from a.take_ticket()
            first = ticket if first is None else first
            block = yield from a.await_slot(ticket, slot, req=R_SLOT)
            diagnose.judge_block(block, partition, addr_le=a.addr_le, where=f"slot {slot} of ticket {ticket}")
            wc = yield from a.write_block(block, pattern(i, 32), req="KBTP-ACK-PARTITION-SCOPE")
            check(wc.ok, f"RDMA Write through the Partition STag failed: {wc.status.name}",
                  req="KBTP-ACK-PARTITION-SCOPE")
            h = a.handle(i)
            r = yield from a.bind(h, ticket, 32, block)
            expect.status_is(r, Status.OK, req="KBTP-BIND-VERIFY", what=f"BIND of ticket {ticket}")
            after = yield from a.read_slot(da.ring.stag, da.ring.tagged_offset, slot, req="KBTP-RING-CONSUME")
            if pending is not None:  # (first: a deferred write lands in the slot this BIND consumed)
                ring = yield from read_ring()
                diagnose.judge_landing(ring, *pending, addr_le=a.addr_le)
                pending = None
            diagnose.judge_consumed(after, ticket, block, partition)
            lr, got = yield from a.load(h, 32, flags=UNSEALED_OK)
            expect.status_is(lr, Status.OK, req="KBTP-BIND-VERIFY", what="LOAD of the bound handle")
            expect.equal("data written before BIND", got, pattern(i, 32), req="KBTP-BIND-VERIFY")
            # The Tail ticket of this free: a new session's partition holds its q free blocks, so Tail starts q
            # above the first Head ticket (q itself on a fresh target; a partition reused by a long-running
            # target starts wherever its counters are); nothing else was freed.
            u = (first + q + i) % TICKET_MODULUS
            f = yield from a.free(h)
            wrapped = landed > 0 and u % n == 0  # every free before it landed; this one's Slot Offset wraps to 0
            outcome = expect.status_name(f.status)
            check(f.status == Status.OK or not wrapped, f"FREE of Tail ticket {u} completed {outcome}; the {landed} "
                  f"free(s) before it landed in their slots, and at ticket {u} the Slot Offset wraps to 0 "
                  f"(16 * ({u} mod {n}))", req="KBTP-RING-WRAP", seen=outcome, expected="OK")
            expect.status_is(f, Status.OK, req="KBTP-FREE-RETURN", what="FREE")
            ring = yield from read_ring()
            # Slot u mod N was consumed (its last ticket, u - N, was bound above), so the free writes it at once.
            blame = diagnose.landing_rule(ring, block, u, addr_le=a.addr_le, landed=landed)
            if blame is not None and blame.rule == diagnose.FREE_RETURN and i < n:
                pending = (block, u)
                continue
            diagnose.judge_landing(ring, block, u, addr_le=a.addr_le, landed=landed)
            landed += 1
        if pending is not None:
            ring = yield from read_ring()
            diagnose.judge_landing(ring, *pending, addr_le=a.addr_le)

    bed.run_one(scenario())


@pytest.mark.req("KBTP-BIND-VERIFY", "KBTP-HELLO-FIRST", "KBTP-RDMAP-ATOMICS", "KBTP-RING-ALLOC-WAIT",
                 "KBTP-LOAD-COMPLETE")
def test_bind_is_verified(kbtp_target: TargetUnderTest, seed: int) -> None:
    """BIND with a Block Offset other than the ticket's slot's, or for a ticket never taken, is refused
    and binds nothing; the right BIND afterwards succeeds."""
    kbtp_target.require(DA)
    p = kbtp_target.params
    bed = kbtp_target.bed(seed, label="bind-verify")
    a = bed.initiator("A")

    def scenario() -> Gen:
        yield from _open(bed, a, DA)
        ticket, slot = yield from a.take_ticket()
        block = yield from a.await_slot(ticket, slot, req=R_SLOT)
        h = a.handle(0)
        r = yield from a.bind(h, ticket, 16, block + p.block_size * 1000)
        check(r.status != Status.OK, "BIND with a Block Offset its slot does not hold completed OK",
              req="KBTP-BIND-VERIFY")
        r = yield from a.bind(a.handle(1), ticket + 5, 16, block)
        check(r.status != Status.OK, "BIND for a ticket never taken completed OK", req="KBTP-BIND-VERIFY")
        lr, _ = yield from a.load(h, 16, flags=UNSEALED_OK)
        expect.status_is(lr, Status.NOT_VALID, req="KBTP-BIND-VERIFY", what="LOAD after the refused BIND")
        r = yield from a.bind(h, ticket, 16, block)
        expect.status_is(r, Status.OK, req="KBTP-BIND-VERIFY", what="the right BIND after the refused ones")

    bed.run_one(scenario())


@pytest.mark.req("KBTP-ACK-PARTITION-SCOPE", "KBTP-HELLO-FIRST", "KBTP-RDMAP-ATOMICS", "KBTP-RING-ALLOC-WAIT")
def test_partition_scope(kbtp_target: TargetUnderTest, seed: int) -> None:
    """The Partition STag reaches only the partition, and only from its own connection: an RDMA Write to a
    block of it from another connection, or past its end from its own, fails."""
    kbtp_target.require(DA)
    p = kbtp_target.params
    bed = kbtp_target.bed(seed, label="partition-scope")
    a, b = bed.initiator("A"), bed.initiator("B")  # B: a second connection to the target, no session needed

    def scenario() -> Gen:
        yield from _open(bed, a, DA)
        da = a.da
        ticket, slot = yield from a.take_ticket()
        block = yield from a.await_slot(ticket, slot, req=R_SLOT)
        wc = yield from b.rdma_write(da.partition.stag, block, b"x" * 8, req="KBTP-ACK-PARTITION-SCOPE")
        check(not wc.ok, "another connection wrote through this connection's Partition STag",
              req="KBTP-ACK-PARTITION-SCOPE")
        end = da.partition.tagged_offset + da.partition.count * p.block_size
        wc = yield from a.rdma_write(da.partition.stag, end, b"x" * 8, req="KBTP-ACK-PARTITION-SCOPE")
        check(not wc.ok, f"an RDMA Write past the partition (Tagged Offset {end:#x}) succeeded",
              req="KBTP-ACK-PARTITION-SCOPE")

    bed.run_one(scenario())
