"""The reference KBTP initiator against the reference target on the emulated fabric.

KBTP "Operations", "Direct Modes", "Security Considerations" (single-use STags with INVALIDATE).
"""

from __future__ import annotations

from typing import Any

import pytest

from kvconform.kbtp.config import TargetConfig
from kvconform.kbtp.constants import EMPTY_BLOCK_OFFSET, Features, Status
from kvconform.kbtp.harness import build
from kvconform.kbtp.initiator import ReferenceInitiator
from kvconform.rdma.fabric import wait_until
from kvconform.rdma.profiles import IB_RC, IB_RC_MASKED, RDMAP_7306
from kvconform.rdma.scheduler import RandomScheduler

CFG = TargetConfig(pool_blocks=8, block_size=64, shared_blocks=4, quota=2, max_inline=16, ticket_timeout_ms=10_000)


def test_initiator_id_has_128_random_bits() -> None:
    h = build(1, config=CFG)
    a = ReferenceInitiator(h.fabric, h.initiators[0].node, h.initiators[0].conn)  # type: ignore[arg-type]
    b = ReferenceInitiator(h.fabric, h.initiators[0].node, h.initiators[0].conn)  # type: ignore[arg-type]
    assert len(a.initiator_id) == 16 and a.initiator_id != b.initiator_id


def test_every_operation() -> None:
    h = build(1, config=CFG)
    x = h.initiators[0]

    def scenario() -> Any:
        ack = yield from x.hello()
        inline = yield from x.alloc_store(x.handle(0), b"inline")  # fits Max Inline 16
        read = yield from x.alloc_store(x.handle(1), b"R" * 40, seal=True)  # target's RDMA Read
        mapped = yield from x.store(x.handle(0), b"M" * 30, seal=True)
        loaded = []
        for i in range(2):
            loaded.append((yield from x.load(x.handle(i))))
        freed = yield from x.free(x.handle(0))
        direct = yield from x.direct_alloc(x.handle(2), b"D" * 20)
        dl = yield from x.direct_load(x.handle(1))
        yield from x.goodbye(release=True)
        return ack, inline, read, mapped, loaded, freed, direct, dl

    ack, inline, read, mapped, loaded, freed, direct, dl = h.run(x=scenario())["x"]
    assert ack.status == Status.OK
    assert inline.ok and read.ok and mapped.ok and freed.ok
    assert [r.data for r in loaded] == [b"M" * 30, b"R" * 40]
    assert direct.bind is not None and direct.bind.ok and direct.block_offset == direct.bind.block_offset
    assert dl.ok and dl.data == b"R" * 40
    assert h.target.counters.count() == 9 and h.target.records == {}  # direct loads cost the target nothing


@pytest.mark.parametrize("invalidate", [True, False])
def test_stags_are_single_use(invalidate: bool) -> None:
    """Each exposed buffer gets its own window; it is revoked after the completion, by the target's Send with
    Invalidate when INVALIDATE is requested, by the initiator otherwise."""
    h = build(1, config=CFG, requested=Features(0))
    x = h.initiators[0]

    def scenario() -> Any:
        yield from x.hello()
        s = yield from x.alloc_store(x.handle(0), b"S" * 40, seal=True, invalidate=invalidate)
        out = [s]
        for _ in range(2):
            out.append((yield from x.load(x.handle(0), invalidate=invalidate)))
        return out

    results = h.run(x=scenario())["x"]
    stags = [r.window_stag for r in results]
    assert None not in stags and len(set(stags)) == 3
    for r in results:
        assert r.ok and not x.node.is_valid(r.window_stag)
        assert r.invalidated_stag == (r.window_stag if invalidate else None)


def test_direct_load_reads_entry_block_entry() -> None:
    h = build(1, config=CFG, trace=True)
    x = h.initiators[0]

    def scenario() -> Any:
        yield from x.hello()
        yield from x.alloc_store(x.handle(0), b"sealed block", seal=True)
        yield from x.alloc_store(x.handle(1), b"open block")
        ok = yield from x.direct_load(x.handle(0))
        unsealed = yield from x.direct_load(x.handle(1))
        allowed = yield from x.direct_load(x.handle(1), allow_unsealed=True)
        unbound = yield from x.direct_load(x.handle(2))
        stale = yield from x.direct_load(x.handle(0), generation=99)
        return ok, unsealed, allowed, unbound, stale

    ok, unsealed, allowed, unbound, stale = h.run(x=scenario())["x"]
    assert ok.ok and ok.data == b"sealed block" and ok.first == ok.second
    assert unsealed.status == Status.NOT_SEALED and unbound.status == Status.NOT_VALID
    # allow_unsealed gets past the first check, but data is only "valid" with SEALED in both reads.
    assert allowed.status == Status.STALE_GENERATION and allowed.data is None
    assert stale.status == Status.STALE_GENERATION
    # Three reads for the good load, each posted only after the previous one completed.
    reads = [e for rec in h.fabric.trace for e in rec["effects"] if e.get("do") == "post" and e["op"] == "RDMA_READ"]
    assert len(reads) == 3 + 1 + 3 + 1 + 1


def test_direct_load_racing_free_is_detected_by_generation() -> None:
    """Y reads the entry; X frees the handle and stores new data under it; Y reads the block and the entry
    again: the Generation changed, so Y discards what it read."""
    h = build(2, config=CFG, seed=1)
    x, y = h.initiators
    step: list[str] = []
    out: dict[str, Any] = {}

    def x_actor() -> Any:
        yield from x.hello()
        out["old"] = yield from x.alloc_store(x.handle(0), b"old data", seal=True)
        yield from wait_until(lambda: "first" in out, name="y-read-entry")
        yield from x.free(x.handle(0))
        out["new"] = yield from x.alloc_store(x.handle(0), b"NEW DATA", seal=True)
        step.append("x-done")

    def y_actor() -> Any:
        yield from y.hello()
        yield from wait_until(lambda: "old" in out, name="x-stored")
        first = yield from y.read_entry(x.handle(0))
        out["first"] = first
        yield from wait_until(lambda: "x-done" in step, name="x-freed")
        data = yield from y.read_block(first.block_offset, first.data_length)
        second = yield from y.read_entry(x.handle(0))
        whole = yield from y.direct_load(x.handle(0))
        return first, data, second, whole

    first, data, second, whole = h.run(x=x_actor(), y=y_actor())["y"]
    assert first.generation == out["old"].generation
    assert second.generation == out["new"].generation != first.generation
    assert not ReferenceInitiator.usable(first, second)
    assert whole.ok and whole.data == b"NEW DATA"
    assert data in (b"old data", b"NEW DATA")  # whatever it was, the generation check rejects it


@pytest.mark.parametrize("seed", range(4))
def test_direct_loads_racing_frees_never_return_mixed_data(seed: int) -> None:
    h = build(2, config=TargetConfig(pool_blocks=4, block_size=32, shared_blocks=2, quota=1, max_inline=32),
              scheduler=RandomScheduler(seed), profile=RDMAP_7306)
    x, y = h.initiators
    written: dict[int, bytes] = {}
    done: list[bool] = []

    def x_actor() -> Any:
        yield from x.hello()
        for r in range(8):
            data = bytes([65 + r]) * 24
            res = yield from x.alloc_store(x.handle(0), data, seal=True)
            written[res.generation] = data
            yield from x.free(x.handle(0))
        done.append(True)

    def y_actor() -> Any:
        yield from y.hello()
        yield from wait_until(lambda: bool(written), name="first-store")
        results = []
        while not done:
            results.append((yield from y.direct_load(x.handle(0))))
        return results

    results = h.run(x=x_actor(), y=y_actor())["y"]
    assert results
    for r in results:
        if r.ok:
            assert r.first is not None and r.data == written[r.first.generation]
        else:
            assert r.status in (Status.NOT_VALID, Status.STALE_GENERATION)


@pytest.mark.parametrize("profile", [RDMAP_7306, IB_RC_MASKED, IB_RC], ids=lambda p: p.name)
def test_direct_alloc_fetch_add_reread_write_bind(profile: Any) -> None:
    h = build(1, config=CFG, profile=profile)
    x = h.initiators[0]

    def scenario() -> Any:
        yield from x.hello()
        da = yield from x.direct_alloc(x.handle(0), b"direct data")
        loaded = yield from x.load(x.handle(0), allow_unsealed=True)
        return da, loaded

    da, loaded = h.run(x=scenario())["x"]
    assert (da.ticket, da.slot_offset) == (0, 0)
    assert da.polls == 2  # the ready slot, then the confirming re-read
    assert da.bind is not None and da.bind.ok and loaded.data == b"direct data"
    ring = h.target.records[x.initiator_id].partition.ring  # type: ignore[union-attr]
    assert ring.read_slot(0).block_offset == EMPTY_BLOCK_OFFSET  # BIND consumed the slot


def test_slot_is_reread_until_a_free_fills_it() -> None:
    """Quota 1 (a two-slot partition ring): the second ticket's slot is empty until the first block is freed."""
    h = build(1, config=TargetConfig(pool_blocks=4, block_size=32, shared_blocks=2, quota=1,
                                     ticket_timeout_ms=10_000))
    x = h.initiators[0]

    def scenario() -> Any:
        yield from x.hello()
        first = yield from x.direct_alloc(x.handle(0), b"one")
        ticket, offset = yield from x.take_ticket()
        before = yield from x.read_slot(offset)
        yield from x.free(x.handle(0))
        block, _ = yield from x.await_slot(ticket, offset)
        assert block is not None
        yield from x.write_block(block, b"two")
        bound = yield from x.bind(x.handle(1), ticket, 3, block)
        return first, ticket, before, block, bound

    first, ticket, before, block, bound = h.run(x=scenario())["x"]
    assert ticket == 1 and before.sequence != ticket and before.consumed
    assert block == first.block_offset and bound.ok


def test_await_slot_is_bounded() -> None:
    h = build(1, config=TargetConfig(pool_blocks=4, block_size=32, shared_blocks=2, quota=1,
                                     ticket_timeout_ms=10_000), max_polls=5)
    x = h.initiators[0]

    def scenario() -> Any:
        yield from x.hello()
        yield from x.direct_alloc(x.handle(0), b"one")
        ticket, offset = yield from x.take_ticket()  # over quota: no block will come
        return (yield from x.await_slot(ticket, offset))

    assert h.run(x=scenario())["x"] == (None, 5)
