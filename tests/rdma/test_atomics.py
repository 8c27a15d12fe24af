"""FetchAdd (masked per RFC 7306, unmasked per IB) and CmpSwap semantics, pure and through the fabric.

rdma-bindings.md §1.4 (masked add, KBTP ring check), §1.5 (responder memory byte order).
"""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kvconform.rdma import (
    IB_RC,
    IB_RC_MASKED,
    RDMAP_7306,
    RDMAP_NO_ATOMICS,
    U64,
    Access,
    EmuFabric,
    FabricUsageError,
    Op,
    Status,
    masked_add,
    masked_cmp_swap,
)
from kvconform.rdma.fabric import ByteOrder
from kvconform.rdma.profiles import Profile
from tests.rdma.helpers import ALL_REMOTE, pair

RING_ADD = 0x0000000100000010
RING_MASK_N4 = (1 << 63) | (1 << 31) | (1 << (2 + 3))  # bit 63 | bit 31 | bit (n+3), n = 2


def bit_serial(orig: int, add: int, mask: int) -> int:
    """The bit-serial definition of §1.4: the carry out of a set mask bit is dropped."""
    new = carry = 0
    for i in range(64):
        s = ((orig >> i) & 1) + ((add >> i) & 1) + carry
        new |= (s & 1) << i
        carry = 0 if (mask >> i) & 1 else s >> 1
    return new


u64 = st.integers(min_value=0, max_value=U64)


@given(u64, u64, u64)
def test_masked_add_matches_bit_serial_definition(orig: int, add: int, mask: int) -> None:
    assert masked_add(orig, add, mask) == bit_serial(orig, add, mask)


@given(u64, u64)
def test_zero_mask_is_plain_64_bit_add(orig: int, add: int) -> None:
    assert masked_add(orig, add, 0) == (orig + add) & U64


def test_kbtp_ring_vector_n4() -> None:
    """The table of §1.4 / the seed's Examples: the slot offset wraps after four slots, the ticket goes on."""
    expected = [
        (0, 0, 0x0000000100000010),
        (1, 16, 0x0000000200000020),
        (2, 32, 0x0000000300000030),
        (3, 48, 0x0000000400000000),
        (4, 0, 0x0000000500000010),
    ]
    counter = 0
    for ticket, offset, new in expected:
        assert (counter >> 32, counter & 0xFFFFFFFF) == (ticket, offset)
        counter = masked_add(counter, RING_ADD, RING_MASK_N4)
        assert counter == new, f"after ticket {ticket}: {counter:#018x} != {new:#018x}"
    # an unmasked add lets the slot-offset carry run on: 0x30 + 0x10 = 0x40 at step 4
    assert masked_add(0x0000000300000030, RING_ADD, 0) == 0x0000000400000040


@pytest.mark.parametrize("mask", [RING_MASK_N4, 0x8000000080000000])
def test_ticket_field_wraps_without_touching_low_field(mask: int) -> None:
    assert masked_add(0xFFFFFFFF00000000, 0x0000000100000000, mask) == 0
    # the carry out of bit 31 never reaches the ticket when bit 31 is a field boundary
    assert masked_add(0x00000005_80000000, 0x00000000_80000000, 0x8000000080000000) == 0x00000005_00000000


def test_masked_cmp_swap() -> None:
    assert masked_cmp_swap(0x1234, 0x1234, 0xFFFF) == 0xFFFF
    assert masked_cmp_swap(0x1234, 0x1235, 0xFFFF) == 0x1234
    # only the compared bits matter; only the swap-mask bits change
    assert masked_cmp_swap(0xAB00, 0x0000, 0x00CD, compare_mask=0x00FF, swap_mask=0x00FF) == 0xABCD


def _fetch_adds(
    profile: Profile, adds: list[tuple[int, int]], byteorder: ByteOrder = "little"
) -> tuple[list[int], int]:
    """Post the FetchAdds back to back on one connection; return the original values and the final word."""
    fab = EmuFabric(profile)
    t = fab.node("T", byteorder=byteorder)
    i = fab.node("I")
    _, ic = fab.connect(t, i)
    mem = t.register(t.alloc(64), ALL_REMOTE)
    res = i.register(i.alloc(8 * len(adds)), Access.LOCAL_WRITE)
    for n, (add, mask) in enumerate(adds):
        ic.post_fetch_add(res.sge(8 * n, 8), mem.stag, mem.to(8), add, mask, wr_id=n)
    fab.run()
    wcs = ic.cq.poll(len(adds) + 1)
    assert [(w.wr_id, w.op, w.status, w.byte_len) for w in wcs] == [
        (n, Op.FETCH_ADD, Status.SUCCESS, 8) for n in range(len(adds))
    ]
    origs = [res.read_u64(8 * n) for n in range(len(adds))]
    return origs, mem.read_u64(8)


def test_masked_fetch_add_over_rdmap_returns_ticket_and_offset() -> None:
    origs, final = _fetch_adds(RDMAP_7306, [(RING_ADD, RING_MASK_N4)] * 5)
    assert [(o >> 32, o & 0xFFFFFFFF) for o in origs] == [(0, 0), (1, 16), (2, 32), (3, 48), (4, 0)]
    assert final == 0x0000000500000010


def test_unmasked_fetch_add_over_ib() -> None:
    origs, final = _fetch_adds(IB_RC, [(0x0000000100000000, 0)] * 3)
    assert [o >> 32 for o in origs] == [0, 1, 2]
    assert final == 0x0000000300000000


def test_masked_fetch_add_via_vendor_extension_profile() -> None:
    origs, _ = _fetch_adds(IB_RC_MASKED, [(RING_ADD, RING_MASK_N4)] * 5)
    assert origs[4] == 0x0000000400000000


def test_counter_is_in_responder_memory_byte_order() -> None:
    """§1.5: the word is interpreted in the responder's byte order (little-endian here, big on a BE node)."""
    orders: tuple[ByteOrder, ...] = ("little", "big")
    for order in orders:
        origs, final = _fetch_adds(RDMAP_7306, [(1, 0), (1, 0)], byteorder=order)
        assert origs == [0, 1] and final == 2, order


def test_le_counter_seeded_by_write_is_read_back_by_fetch_add() -> None:
    """A counter written with RDMA Write in little-endian bytes is the value FetchAdd sees (§1.5, §8 item 10)."""
    p = pair()
    p.ic.post_write((0x0000000700000030).to_bytes(8, "little"), p.mem.stag, p.mem.to(16))
    p.ic.post_fetch_add(p.local.sge(0, 8), p.mem.stag, p.mem.to(16), RING_ADD, RING_MASK_N4)
    p.fab.run()
    assert p.local.read_u64(0) == 0x0000000700000030
    assert p.mem.read_u64(16) == 0x0000000800000000


def test_masked_fetch_add_refused_where_profile_has_no_mask() -> None:
    p = pair(IB_RC)
    with pytest.raises(FabricUsageError, match="Add Mask"):
        p.ic.post_fetch_add(p.local.sge(0, 8), p.mem.stag, p.mem.to(0), RING_ADD, RING_MASK_N4)
    q = pair(RDMAP_NO_ATOMICS)
    with pytest.raises(FabricUsageError, match="no atomic"):
        q.ic.post_fetch_add(q.local.sge(0, 8), q.mem.stag, q.mem.to(0), 1)


def test_cmp_swap_over_fabric() -> None:
    p = pair()
    p.mem.write_u64(0, 5)
    p.ic.post_cmp_swap(p.local.sge(0, 8), p.mem.stag, p.mem.to(0), 5, 9, wr_id=1)
    p.ic.post_cmp_swap(p.local.sge(8, 8), p.mem.stag, p.mem.to(0), 5, 11, wr_id=2)
    p.fab.run()
    assert [w.status for w in p.ic.cq.poll(2)] == [Status.SUCCESS, Status.SUCCESS]
    assert (p.local.read_u64(0), p.local.read_u64(8), p.mem.read_u64(0)) == (5, 9, 9)
