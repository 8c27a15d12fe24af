"""The free-block ring at the reference target: the text's FetchAdd table for N = 4, its four-block
deferred-free example replayed step by step, and seeded interleavings that must lose no block.

KBTP "Free-Block Ring" and "Examples".
"""

from __future__ import annotations

from typing import Any

import pytest

from kvconform.kbtp.config import TargetConfig
from kvconform.kbtp.constants import EMPTY_BLOCK_OFFSET, Features, Opcode, Status
from kvconform.kbtp.harness import build, initiator_ids
from kvconform.kbtp.initiator import ReferenceInitiator
from kvconform.kbtp.ring import RingSlot
from kvconform.kbtp.target import ReferenceTarget
from kvconform.rdma.fabric import wait_until
from kvconform.rdma.profiles import IB_RC, RDMAP_7306
from kvconform.rdma.scheduler import PctScheduler, RandomScheduler, ScriptScheduler

# The text's table: (returned ticket, returned offset) and the new counter value, from zero.
FETCH_ADD_N4 = [((0, 0), 0x0000000100000010), ((1, 16), 0x0000000200000020), ((2, 32), 0x0000000300000030),
                ((3, 48), 0x0000000400000000), ((4, 0), 0x0000000500000010)]


def test_fetch_add_sequence_n4_on_the_shared_head() -> None:
    """The target's own FetchAdd on Head (target-executed allocation) walks the text's N = 4 table."""
    h = build(0, config=TargetConfig(pool_blocks=4, block_size=64))
    ring = h.target.shared_ring
    assert ring is not None and ring.slots == 4
    assert ring.layout.add_mask == 0x8000000080000020
    for (ticket, offset), counter in FETCH_ADD_N4:
        taken = ring.fetch_add_head()
        assert (taken.ticket, taken.slot_offset) == (ticket, offset)
        assert ring.head_value() == counter, f"Head after ticket {ticket}: {ring.head_value():#018x}"


def test_fetch_add_sequence_n4_by_an_initiator_on_its_partition_head() -> None:
    """A DIRECT_ALLOC initiator's masked FetchAdds (RFC 7306, through the fabric) on a 4-slot partition ring."""
    h = build(1, config=TargetConfig(pool_blocks=4, block_size=64, shared_blocks=0, quota=4, ticket_timeout_ms=10_000))
    x = h.initiators[0]

    def scenario() -> Any:
        ack = yield from x.hello()
        assert ack.direct_alloc is not None and ack.direct_alloc.ring.count == 4
        ring = h.target.records[x.initiator_id].partition.ring  # type: ignore[union-attr]
        seen = []
        for _ in FETCH_ADD_N4:
            got = yield from x.take_ticket()
            seen.append((got, ring.head_value()))
        return seen

    assert h.run(x=scenario())["x"] == FETCH_ADD_N4


def test_unmasked_ib_counter_keeps_zero_low_bits() -> None:
    """InfiniBand unmasked Fetch and Add: Ticket in the high 32 bits, zero below, slot = 16 * (ticket mod N)."""
    h = build(1, config=TargetConfig(pool_blocks=4, block_size=64, shared_blocks=0, quota=4, ticket_timeout_ms=10_000),
              profile=IB_RC)
    x = h.initiators[0]

    def scenario() -> Any:
        yield from x.hello()
        ring = h.target.records[x.initiator_id].partition.ring  # type: ignore[union-attr]
        out = []
        for _ in range(5):
            got = yield from x.take_ticket()
            out.append((got, ring.head_value()))
        return out

    assert h.run(x=scenario())["x"] == [((t, 16 * (t % 4)), (t + 1) << 32) for t in range(5)]


def _four_blocks() -> tuple[Any, ReferenceInitiator, ReferenceInitiator, dict[int, int], list[tuple[Any, ...]]]:
    x_id, y_id = initiator_ids(2, 11)
    script = [
        "target@c1.T:tail.shared",  # Y's free takes Tail ticket 4 (slot 0) while X holds ticket 0 unread
        "obs:deferred",
        "target@c0.T:read-slot.shared.0",  # X's delayed chain reads slot 0 and consumes it
        "obs:consumed",
        "target@c0.T:slot-seq.shared.4",  # the deferred free writes Sequence 4 after Block Offset 101
        "obs:written",
    ]
    h = build(2, config=TargetConfig(pool_blocks=4, block_size=64, quotas={x_id: 1, y_id: 3}),
              seed=11, scheduler=ScriptScheduler(script), requested=Features(0))
    x, y = h.initiators
    ring = h.target.shared_ring
    assert ring is not None
    block = {100 + i: h.target.pool.offset_of(i) for i in range(4)}  # the text's blocks 100..103
    notes: list[tuple[Any, ...]] = []
    return h, x, y, block, notes


def test_four_block_deferred_free_example_step_by_step() -> None:
    """KBTP "Examples": N = F = 4, ticket 0 delayed before reading slot 0, the free of 101 deferred on slot 0."""
    h, x, y, block, notes = _four_blocks()
    target: ReferenceTarget = h.target
    ring = target.shared_ring
    assert ring is not None
    assert [ring.read_slot(16 * s) for s in range(4)] == [RingSlot(s, block[100 + s]) for s in range(4)]

    def x_actor() -> Any:
        yield from x.hello()
        return (yield from x.alloc_store(x.handle(0), b"X" * 8))

    def y_actor() -> Any:
        yield from y.hello()
        # X's ALLOC_STORE takes ticket 0 first; its chain then stalls before reading slot 0 (the script).
        yield from wait_until(lambda: ring.head_ticket() == 1, name="after-x-ticket")
        got = []
        for i in range(3):
            got.append((yield from y.alloc_store(y.handle(i), bytes([i]) * 8)))
        freed = yield from y.free(y.handle(0))
        again = yield from y.alloc_store(y.handle(3), b"again!!!")
        return got, freed, again

    def observer() -> Any:
        yield from wait_until(lambda: target.counters.deferred_frees == 1, name="deferred")
        notes.append(("deferred", ring.read_slot(0), ring.tail_value(), {k: list(v) for k, v in ring.deferred.items()}))
        yield from wait_until(lambda: target.counters.deferred_flushed == 1, name="consumed")
        notes.append(("consumed", ring.read_slot(0)))
        yield from wait_until(lambda: ring.read_slot(0).sequence == 4, name="written")
        notes.append(("written", ring.read_slot(0)))

    out = h.run(x=x_actor(), y=y_actor(), obs=observer())
    assert h.fabric.scheduler.remaining == []  # type: ignore[attr-defined]
    got, freed, again = out["y"]
    # Y's tickets 1, 2, 3 get blocks 101, 102, 103.
    assert [r.block_offset for r in got] == [block[101], block[102], block[103]]
    assert freed.status == Status.OK
    # While the free waits, slot 0 still holds X's ticket-0 block 100: the free did not overwrite it.
    assert notes[0][0] == "deferred" and notes[0][1] == RingSlot(0, block[100])
    assert notes[0][2] == 0x0000000500000010  # Tail took ticket 4, offset 0 (F = 4 -> Tail started at (4, 0))
    assert notes[0][3] == {0: [(4, block[101])]}
    # X's delayed chain obtains block 100 and consumes slot 0; the deferred write puts 101 there,
    # Block Offset first (Sequence still 0) and then Sequence 4.
    assert out["x"].status == Status.OK and out["x"].block_offset == block[100]
    assert notes[1] == ("consumed", RingSlot(0, block[101]))
    assert notes[2] == ("written", RingSlot(4, block[101]))
    # The next allocation (ticket 4) obtains block 101.
    assert again.status == Status.OK and again.block_offset == block[101]
    assert ring.head_ticket() == 5 and ring.read_slot(0) == RingSlot(4, EMPTY_BLOCK_OFFSET)
    assert target.census_problems() == []
    assert sorted(e.block_offset for e in target.table.bound().values()) == sorted(block.values())


def test_free_without_a_race_writes_the_slot_directly() -> None:
    """The same geometry without the delay: no deferral, the free's slot is written at once."""
    h = build(1, config=TargetConfig(pool_blocks=4, block_size=64), seed=3)
    x = h.initiators[0]

    def scenario() -> Any:
        yield from x.hello()
        for i in range(4):
            yield from x.alloc_store(x.handle(i), b"data")
        yield from x.free(x.handle(2))

    h.run(x=scenario())
    assert h.target.counters.deferred_frees == 0
    ring = h.target.shared_ring
    assert ring is not None and ring.read_slot(0) == RingSlot(4, h.target.pool.offset_of(2))


def _churn(x: ReferenceInitiator, rounds: int, tag: int, quota: int = 2) -> Any:
    """Keep usage at the quota (the ring nearly empty): free a handle, store it again, in turn."""
    yield from x.hello()
    for i in range(quota):
        res = yield from x.alloc_store(x.handle(i), bytes([tag, i]) * 4)
        assert res.status == Status.OK, res
    for r in range(rounds):
        h = x.handle(r % quota)
        res = yield from x.free(h)
        assert res.status == Status.OK, res
        res = yield from x.alloc_store(h, bytes([tag, r]) * 4)
        assert res.status == Status.OK, res  # within quota, so the ring always holds a block for the ticket
    return [x.handle(i) for i in range(quota)]


@pytest.mark.parametrize("policy", ["random", "pct"])
@pytest.mark.parametrize("seed", range(6))
def test_seeded_interleavings_lose_no_block(policy: str, seed: int) -> None:
    """More frees than slots, several initiators, F < N and F == N: at quiescence each block is in one place."""
    n_init = 3 if seed % 2 else 4  # F = 6 < N = 8, and F == N = 8 (the sum of quotas is F)
    sched = RandomScheduler(seed) if policy == "random" else PctScheduler(seed, depth=4, horizon=3000)
    h = build(n_init, config=TargetConfig(pool_blocks=2 * n_init, block_size=32, quota=2), scheduler=sched,
              requested=Features(0), profile=RDMAP_7306)
    out = h.run_actors({f"i{k}": _churn(ini, 10, k) for k, ini in enumerate(h.initiators)})
    assert h.target.census_problems() == []
    bound = h.target.table.bound()
    for k, ini in enumerate(h.initiators):
        assert sorted(out[f"i{k}"]) == sorted(hd for hd in bound if ini.ack and ini.ack.handle_base <= hd
                                              < ini.ack.handle_base + ini.ack.handle_count)
    assert h.target.counters.count(Opcode.FREE, Status.OK) == 10 * n_init


def test_some_seeded_interleaving_defers_a_free() -> None:
    """The seeded runs are not vacuous: PCT priorities starve one allocation long enough for a deferral."""
    deferred = 0
    for seed in range(12):
        x_id, y_id = initiator_ids(2, seed)
        # The text's geometry: F = N = 4, X holds one block and Y three.
        h = build(2, config=TargetConfig(pool_blocks=4, block_size=32, quotas={x_id: 1, y_id: 3}), seed=seed,
                  scheduler=PctScheduler(seed, depth=3, horizon=600), requested=Features(0))
        x, y = h.initiators
        h.run(x=_churn(x, 10, 0, quota=1), y=_churn(y, 10, 1, quota=3))
        assert h.target.census_problems() == []
        assert h.target.counters.deferred_flushed == h.target.counters.deferred_frees
        deferred += h.target.counters.deferred_frees
    assert deferred > 0


class _OverwritesUnconsumedSlot(ReferenceTarget):
    """Broken: a free writes its slot even when the slot's allocation has not consumed it yet."""

    def can_write_slot(self, ring: Any, taken: Any) -> bool:
        return True


def test_the_example_catches_a_free_that_overwrites() -> None:
    """Replaying the example against a target that does not defer: X takes 101 from under the free and
    block 100 is lost."""
    x_id, y_id = initiator_ids(2, 11)
    h = build(2, config=TargetConfig(pool_blocks=4, block_size=64, quotas={x_id: 1, y_id: 3}), seed=11,
              scheduler=ScriptScheduler(["target@c1.T:tail.shared", "target@c0.T:read-slot.shared.0"]),
              requested=Features(0), target_cls=_OverwritesUnconsumedSlot)
    x, y = h.initiators
    ring = h.target.shared_ring
    assert ring is not None

    def x_actor() -> Any:
        yield from x.hello()
        return (yield from x.alloc_store(x.handle(0), b"X" * 8))

    def y_actor() -> Any:
        yield from y.hello()
        yield from wait_until(lambda: ring.head_ticket() == 1, name="after-x-ticket")
        for i in range(3):
            yield from y.alloc_store(y.handle(i), bytes([i]) * 8)
        yield from y.free(y.handle(0))

    out = h.run(x=x_actor(), y=y_actor())
    assert out["x"].block_offset == h.target.pool.offset_of(1)  # X got block 101, which Y had just freed
    problems = h.target.census_problems()
    assert any("lost" in p for p in problems)


def test_a_seeded_run_replays_exactly() -> None:
    """Same seed, same schedule; the recorded schedule as a script replays the same outcome."""
    def once(**kw: Any) -> tuple[list[str], list[str]]:
        h = build(2, config=TargetConfig(pool_blocks=4, block_size=32, quota=2), requested=Features(0), **kw)
        h.run_actors({f"i{k}": _churn(ini, 4, k) for k, ini in enumerate(h.initiators)})
        return list(h.fabric.schedule), h.target.census_problems()

    first, problems = once(seed=21)
    assert problems == [] and once(seed=21)[0] == first
    assert once(seed=22)[0] != first
    assert once(seed=21, scheduler=ScriptScheduler(first))[0] == first
