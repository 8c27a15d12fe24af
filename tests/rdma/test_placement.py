"""Placement and visibility: RFC 5040 rules 3 and 5 (rdma-bindings §2.3), non-atomic reads (§8 item 4),
zero-based vs VA Tagged Offsets (§2.2), Immediate Data after a Write (§1.1).
"""

from __future__ import annotations

from collections.abc import Callable

import pytest

from kvconform.rdma import (
    IB_RC,
    RDMAP_7306,
    STRICT,
    Access,
    ActorGen,
    ConnState,
    EmuFabric,
    Op,
    Profile,
    Status,
    explore,
    pause,
    wait_completion,
)
from kvconform.rdma.emulated import MAX_CHUNKS
from tests.rdma.helpers import ALL_REMOTE, pair

OLD_NEW = b"A" * 8 + b"B" * 8


def watch_write_then_send(fab: EmuFabric) -> Callable[[], object]:
    """I writes 16 octets into T's memory then Sends; T's CPU peeks at the memory until the Send arrives.

    Outcome: (the partial states T saw before delivery, the contents at delivery).
    """
    t, i = fab.node("T"), fab.node("I")
    tc, ic = fab.connect(t, i)
    mem = t.register(t.alloc(16), ALL_REMOTE)
    rx = t.register(t.alloc(16), Access.LOCAL_WRITE)
    seen: set[bytes] = set()
    at_delivery: list[bytes] = []

    tc.post_recv(rx.sge(0, 16))  # before any actor runs: a Send with no Recv posted would terminate

    def target() -> ActorGen:
        for _ in range(10_000):
            seen.add(mem.read(0, 16))
            if len(tc.cq):
                break
            yield from pause("peek")
        wc = tc.cq.poll(1)[0]
        assert wc.ok and wc.op is Op.RECV
        at_delivery.append(mem.read(0, 16))

    def initiator() -> ActorGen:
        ic.post_write(OLD_NEW, mem.stag, mem.to(0), signaled=False)
        ic.post_send(b"ready")
        yield from wait_completion(ic.cq)

    fab.spawn("T", target())
    fab.spawn("I", initiator())
    return lambda: (frozenset(seen), at_delivery[0])


def partial_states(profile: Profile, seeds: int = 400) -> set[bytes]:
    report = explore(watch_write_then_send, range(seeds), profile=profile)
    assert not report.failures, report.failures[0].explain()
    seen: set[bytes] = set()
    for value in report.values.values():
        assert isinstance(value, tuple)
        states, final = value
        assert final == OLD_NEW, f"{profile.name}: Send delivered before the earlier Write was placed (rule 5)"
        seen |= states
    return seen


def test_rdmap_places_a_later_chunk_before_an_earlier_one() -> None:
    """Rule 3: a racing reader can see the second half of the Write without the first, before the Send."""
    seen = partial_states(RDMAP_7306)
    assert bytes(8) + b"B" * 8 in seen, seen
    assert b"A" * 8 + bytes(8) in seen, seen


def test_ib_places_in_order_but_a_prefix_is_visible() -> None:
    seen = partial_states(IB_RC)
    assert bytes(8) + b"B" * 8 not in seen
    assert b"A" * 8 + bytes(8) in seen


def test_strict_places_whole_messages() -> None:
    assert partial_states(STRICT, seeds=100) <= {bytes(16), OLD_NEW}


def torn_read(fab: EmuFabric) -> Callable[[], object]:
    """T's CPU replaces a 16-octet slot (seq, value) whole; I reads it once with RDMA Read."""
    t, i = fab.node("T"), fab.node("I")
    _, ic = fab.connect(t, i)
    slot = t.register(t.alloc(16), ALL_REMOTE)
    dst = i.register(i.alloc(16), Access.LOCAL_WRITE)
    slot.write(0, (1).to_bytes(8, "big") * 2)

    def writer() -> ActorGen:
        for version in (2, 3):
            yield from pause("update")
            slot.write(0, version.to_bytes(8, "big") * 2)  # one CPU step: the update itself is atomic

    def reader() -> ActorGen:
        ic.post_read(dst.sge(0, 16), slot.stag, slot.to(0))
        wc = yield from wait_completion(ic.cq)
        assert wc.ok

    fab.spawn("W", writer())
    fab.spawn("R", reader())
    return lambda: (int.from_bytes(dst.read(0, 8), "big"), int.from_bytes(dst.read(8, 8), "big"))


def test_sixteen_octet_read_can_tear() -> None:
    """§8 item 4 / KBTP DIRECT_ALLOC: 'a 16-octet read is not guaranteed to be atomic'."""
    report = explore(torn_read, range(300))
    assert not report.failures
    torn = {v for v in report.values.values() if isinstance(v, tuple) and v[0] != v[1]}
    assert torn, report.outcomes
    strict = explore(torn_read, range(300), profile=STRICT)
    assert all(isinstance(v, tuple) and v[0] == v[1] for v in strict.values.values()), strict.outcomes


@pytest.mark.parametrize("zero_based", [False, True])
def test_tagged_offset_base(zero_based: bool) -> None:
    p = pair(zero_based=zero_based)
    base = 0 if zero_based else p.mem.buffer.addr
    assert p.mem.to(8) == base + 8
    p.ic.post_write(b"hello", p.mem.stag, base + 8, wr_id=1)
    p.fab.run()
    assert p.ic.cq.poll(1)[0].status is Status.SUCCESS
    assert p.mem.read(8, 5) == b"hello"
    # the other convention's address misses the region
    q = pair(zero_based=zero_based)
    wrong = q.mem.buffer.addr + 8 if zero_based else 8
    q.ic.post_write(b"hello", q.mem.stag, wrong, wr_id=1)
    q.fab.run()
    (wc,) = q.ic.cq.poll(5)
    assert wc.status is Status.REM_ACCESS_ERR and q.ic.state is ConnState.ERROR


def test_region_and_window_offsets_within_a_buffer() -> None:
    p = pair()
    buf = p.t.alloc(128)
    region = p.t.register(buf, Access.LOCAL_WRITE | Access.MW_BIND, offset=32, length=64)
    assert region.to(0) == buf.addr + 32
    zwin = p.t.bind_window(region, 16, 16, Access.REMOTE_WRITE, p.tc, zero_based=True)
    vwin = p.t.bind_window(region, 40, 8, Access.REMOTE_WRITE, p.tc)
    assert (zwin.to(0), vwin.to(0)) == (0, buf.addr + 32 + 40)
    p.ic.post_write(b"zz", zwin.stag, 2)
    p.ic.post_write(b"vv", vwin.stag, vwin.to(6))
    p.fab.run()
    assert buf.read(32 + 16 + 2, 2) == b"zz" and buf.read(32 + 40 + 6, 2) == b"vv"


@pytest.mark.parametrize("profile", [RDMAP_7306, IB_RC], ids=lambda p: p.name)
def test_write_with_immediate(profile: Profile) -> None:
    """The Immediate Data consumes a Recv and is delivered only after the Write's data is placed."""
    p = pair(profile, seed=3)
    p.tc.post_recv(None, wr_id=77)
    imm = bytes(range(profile.immediate_bytes))
    p.ic.post_write(OLD_NEW, p.mem.stag, p.mem.to(0), imm=imm, wr_id=1)
    p.fab.run()
    (wc,) = p.tc.cq.poll(5)
    assert (wc.wr_id, wc.op, wc.status, wc.imm, wc.byte_len) == (77, Op.RECV_RDMA_WITH_IMM, Status.SUCCESS, imm, 16)
    assert p.mem.read(0, 16) == OLD_NEW
    assert [(w.wr_id, w.op, w.status) for w in p.ic.cq.poll(5)] == [(1, Op.RDMA_WRITE, Status.SUCCESS)]


def test_requester_completions_in_post_order() -> None:
    """Send-queue completions come in post order even when a later Write is done before an earlier Read."""
    for seed in range(50):
        p = pair(seed=seed)
        p.ic.post_read(p.local.sge(0, 64), p.mem.stag, p.mem.to(0), wr_id=1)
        p.ic.post_write(b"w" * 32, p.mem.stag, p.mem.to(128), wr_id=2)
        p.ic.post_fetch_add(p.local.sge(64, 8), p.mem.stag, p.mem.to(200), 1, wr_id=3)
        p.fab.run()
        assert [w.wr_id for w in p.ic.cq.poll(5)] == [1, 2, 3], seed


def test_read_after_write_on_one_connection_sees_the_write() -> None:
    """Reads are processed after the earlier Writes of the same connection are placed."""
    for seed in range(100):
        p = pair(seed=seed)
        p.ic.post_write(OLD_NEW, p.mem.stag, p.mem.to(0))
        p.ic.post_read(p.local.sge(0, 16), p.mem.stag, p.mem.to(0))
        p.fab.run()
        assert p.local.read(0, 16) == OLD_NEW, seed


@pytest.mark.parametrize("profile", [RDMAP_7306, IB_RC], ids=["rdmap", "ib"])
def test_a_kv_block_of_2_mib_moves_in_a_bounded_number_of_steps(profile: Profile) -> None:
    """A 2 MiB Write and Read (one KV block) take at most MAX_CHUNKS placement and read steps each, not 2^18 chunks
    of 8 octets (which once ran a KBTP check past its whole step budget), and arrive whole."""
    size = 2 << 20
    p = pair(profile, seed=1)
    data = bytes(range(256)) * (size // 256)
    far = p.t.register(p.t.alloc(size), ALL_REMOTE)
    back = p.i.register(p.i.alloc(size), Access.LOCAL_WRITE)
    p.ic.post_write(data, far.stag, far.to(0))
    p.ic.post_read(back.sge(0, size), far.stag, far.to(0))
    result = p.fab.run(max_steps=4 * MAX_CHUNKS + 100)
    assert result.reason == "quiescent" and far.read(0, size) == data and back.read(0, size) == data


def test_fence_holds_a_send_until_the_read_completes() -> None:
    for seed in range(50):
        p = pair(seed=seed, trace=True)
        p.ic.post_recv(p.rx_i.sge(0, 8))
        p.tc.post_recv(p.rx_t.sge(0, 8))
        p.ic.post_read(p.local.sge(0, 16), p.mem.stag, p.mem.to(0), wr_id=1)
        p.ic.post_send(b"after", wr_id=2, fence=True)
        p.fab.run()
        labels = p.fab.schedule
        assert labels.index("T-I.I/send2:arrive") > labels.index("T-I.I/rdma_read1:read@8"), seed
