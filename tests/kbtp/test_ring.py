"""Free-block ring arithmetic: RFC 7306 masked FetchAdd, the counter layout for every n, initialisation,
allocation and free with deferral, on the masked and the unmasked (InfiniBand) layouts."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvconform.kbtp.constants import EMPTY_BLOCK_OFFSET
from kvconform.kbtp.ring import (
    ADD_DATA,
    IB_ADD_DATA,
    TICKET_MODULUS,
    RingError,
    RingLayout,
    RingModel,
    RingSlot,
    masked_fetch_add,
)

u64 = st.integers(0, (1 << 64) - 1)


def bit_serial(orig: int, add: int, mask: int) -> int:
    """rdma-bindings.md §1.4: c=0; for i in 0..63: s=o_i+a_i+c; n_i=s&1; c=s>>1; if m_i: c=0."""
    carry, out = 0, 0
    for i in range(64):
        s = (orig >> i & 1) + (add >> i & 1) + carry
        out |= (s & 1) << i
        carry = 0 if mask >> i & 1 else s >> 1
    return out


@settings(max_examples=500)
@given(u64, u64, u64)
def test_masked_fetch_add_is_the_bit_serial_definition(orig: int, add: int, mask: int) -> None:
    assert masked_fetch_add(orig, add, mask) == bit_serial(orig, add, mask)


def test_mask_zero_is_a_plain_add() -> None:
    assert masked_fetch_add((1 << 64) - 1, 1, 0) == 0
    assert masked_fetch_add(0x30, 0x10, 0) == 0x40


def test_spec_example_n4() -> None:
    layout = RingLayout(2)
    assert (layout.add_data, layout.add_mask) == (0x0000000100000010, 0x8000000080000020)
    counter, seen = 0, []
    for _ in range(5):
        ticket, offset, counter = layout.fetch_add(counter)
        seen.append((ticket, offset, counter))
    assert seen == [(0, 0, 0x0000000100000010), (1, 16, 0x0000000200000020), (2, 32, 0x0000000300000030),
                    (3, 48, 0x0000000400000000), (4, 0, 0x0000000500000010)]
    # an unmasked add would carry the offset into bit 6 at the fourth step (rdma-bindings.md §1.4)
    assert masked_fetch_add(0x0000000300000030, ADD_DATA, 0) == 0x0000000400000040


@pytest.mark.parametrize("n", range(1, 29))
def test_add_mask_and_offset_width_for_every_n(n: int) -> None:
    layout = RingLayout(n)
    assert layout.slots == 2**n
    assert layout.add_mask == (1 << 63) | (1 << 31) | (1 << (n + 3))
    last = layout.counter(layout.slots - 1)
    assert last == ((layout.slots - 1) << 32) | (16 * (layout.slots - 1))
    ticket, offset, new = layout.fetch_add(last)
    assert (ticket, offset) == (layout.slots - 1, 16 * (layout.slots - 1))
    assert new == layout.slots << 32  # the offset wrapped to slot 0, its carry discarded


@pytest.mark.parametrize("n", [0, 29, 64, -1])
def test_ring_sizes_the_formula_cannot_serve(n: int) -> None:
    with pytest.raises(RingError) as info:
        RingLayout(n)
    assert info.value.requirement == "KBTP-RING-SIZE"


@settings(max_examples=300, deadline=None)
@given(st.integers(1, 28), st.integers(0, TICKET_MODULUS - 1), st.integers(1, 40), st.booleans())
def test_fetch_add_sequence(n: int, start: int, steps: int, masked: bool) -> None:
    """From any ticket, each FetchAdd returns (t, 16 * (t mod N)) and leaves bits 31..n+4 zero, across the wrap."""
    layout = RingLayout(n, masked)
    counter = layout.counter(start)
    for i in range(steps):
        ticket, offset, counter = layout.fetch_add(counter)
        expected = (start + i) % TICKET_MODULUS
        assert (ticket, offset) == (expected, 16 * (expected % layout.slots))
        low = counter & 0xFFFF_FFFF
        assert low >> (n + 4) == 0 if masked else low == 0
        assert layout.split(counter)[0] == (expected + 1) % TICKET_MODULUS


@pytest.mark.parametrize("masked", [True, False])
def test_ticket_wraps_at_2_to_32(masked: bool) -> None:
    layout = RingLayout(3, masked)
    counter = layout.counter(TICKET_MODULUS - 1)
    ticket, offset, counter = layout.fetch_add(counter)
    assert (ticket, offset) == (TICKET_MODULUS - 1, 16 * 7)
    assert layout.split(counter) == (0, 0)
    assert counter == 0


def test_unmasked_layout() -> None:
    layout = RingLayout(2, masked=False)
    assert (layout.add_data, layout.add_mask) == (IB_ADD_DATA, 0)
    assert layout.counter(5) == 5 << 32 and layout.split(5 << 32) == (5, 16)
    with pytest.raises(RingError) as info:
        layout.split(5 << 32 | 16)
    assert info.value.requirement == "KBTP-RING-COUNTER-FIELDS"


def test_split_rejects_bits_between_the_fields() -> None:
    with pytest.raises(RingError) as info:
        RingLayout(2).split(0x0000000100000040)
    assert info.value.requirement == "KBTP-RING-COUNTER-FIELDS"
    with pytest.raises(RingError):
        RingLayout(2).counter(1, slot_offset=8)


@pytest.mark.parametrize(("n", "blocks"), [(2, [100, 101, 102, 103]), (3, [0x8000, 0x10000, 0x18000]), (1, [])])
def test_initialisation(n: int, blocks: list[int]) -> None:
    layout = RingLayout(n)
    slots = layout.initial_slots(blocks)
    f, big_n = len(blocks), layout.slots
    for s in range(big_n):
        if s < f:
            assert slots[s] == RingSlot(s, blocks[s])
        else:
            assert slots[s] == RingSlot((s - big_n) % TICKET_MODULUS, EMPTY_BLOCK_OFFSET) and slots[s].consumed
    assert layout.initial_head() == 0
    assert layout.initial_tail(f) == (f << 32) | (16 * (f % big_n))
    with pytest.raises(RingError) as info:
        layout.initial_slots(list(range(big_n + 1)))
    assert info.value.requirement == "KBTP-RING-INIT"


@given(st.integers(0, (1 << 32) - 1), st.integers(0, (1 << 64) - 1), st.booleans())
def test_slot_layout(sequence: int, block: int, addr_le: bool) -> None:
    slot = RingSlot(sequence, block)
    data = slot.pack(addr_le)
    assert len(data) == 16 and data[:4] == sequence.to_bytes(4, "big") and data[4:8] == bytes(4)
    assert data[8:] == block.to_bytes(8, "little" if addr_le else "big")
    assert RingSlot.unpack(data, 0, addr_le) == slot


@pytest.mark.parametrize("length", [0, 7, 8, 15])
def test_short_slot_is_a_ring_error(length: int) -> None:
    # Found by the fuzz lane (vectors/fuzz/kbtp-ring-slot): struct.error escaped for a short read.
    with pytest.raises(RingError) as info:
        RingSlot.unpack(bytes(length + 4), 4)
    assert info.value.requirement == "KBTP-RING-SLOT-LAYOUT" and info.value.what == "slot"
    assert f"got {length} octets at offset 4, expected 16" in str(info.value)


def test_spec_deferred_free_scenario() -> None:
    """KBTP "Examples": four blocks 100..103, N = F = 4, X's ticket 0 delayed, Y frees 101 onto slot 0."""
    ring = RingModel.initialised(RingLayout(2), [100, 101, 102, 103])
    x_ticket, x_offset = ring.take()
    assert (x_ticket, x_offset) == (0, 0)
    assert [ring.allocate() for _ in range(3)] == [(1, 101), (2, 102), (3, 103)]
    outcome = ring.free(101)
    assert (outcome.ticket, outcome.slot_offset, outcome.deferred) == (4, 0, True)
    assert ring.slots[0] == RingSlot(0, 100)  # not overwritten
    assert ring.consume(x_ticket, x_offset) == 100
    assert ring.slots[0] == RingSlot(4, 101)  # the deferred free wrote Sequence 4 and block 101
    assert ring.allocate() == (4, 101)


def test_consume_of_a_slot_not_ready_is_refused() -> None:
    ring = RingModel.initialised(RingLayout(2), [100])
    ring.allocate()
    ticket, offset = ring.take()  # ticket 1: slot 1 is empty until a free writes it
    assert ring.read(ticket, offset) is None
    with pytest.raises(RingError) as info:
        ring.consume(ticket, offset)
    assert info.value.requirement == "KBTP-RING-ALLOC-WAIT"
    assert not ring.free(100).deferred
    assert ring.consume(ticket, offset) == 100


@settings(max_examples=250, deadline=None)
@given(st.integers(1, 5), st.data(), st.booleans(), st.integers(0, 2**31), st.booleans())
def test_no_block_lost_or_handed_out_twice(n: int, data: st.DataObject, masked: bool, seed: int,
                                           near_wrap: bool) -> None:
    """Random interleavings of take / consume / free within the quota (usage <= F), for F <= N, from ticket 0
    or just below the 32-bit wrap: every block is held, in a slot, or in a deferred free, exactly once."""
    layout = RingLayout(n, masked)
    f = data.draw(st.integers(1, layout.slots))
    blocks = [0x1000 * (i + 1) for i in range(f)]
    start = TICKET_MODULUS - 2 * layout.slots - 1 if near_wrap else 0
    ring = RingModel.initialised(layout, blocks, start)
    rng = random.Random(seed)
    held: list[int] = []
    pending: list[tuple[int, int]] = []
    frees = deferrals = 0
    for _ in range(data.draw(st.integers(1, 120))):
        op = rng.choice(("take", "consume", "free"))
        if op == "take" and len(held) + len(pending) < f:
            pending.append(ring.take())
        elif op == "consume" and pending:
            ticket, offset = pending[rng.randrange(len(pending))]
            block = ring.read(ticket, offset)
            if block is None:
                # only a deferred free, waiting for an older pending ticket on the same slot, delays it
                assert any(t != ticket and o == offset for t, o in pending), (ticket, offset, pending)
                continue
            assert ring.consume(ticket, offset) == block
            pending.remove((ticket, offset))
            held.append(block)
        elif op == "free" and held:
            block = held.pop(rng.randrange(len(held)))
            outcome = ring.free(block)
            frees += 1
            deferrals += outcome.deferred
        assert sorted(held + ring.available()) == blocks
    # drain: consume in ticket order, every pending allocation obtains a block
    for ticket, offset in sorted(pending, key=lambda p: (p[0] - start) % TICKET_MODULUS):
        held.append(ring.consume(ticket, offset))
    assert sorted(held + ring.available()) == blocks and not ring.deferred
    assert deferrals <= frees
