"""The reference KBTP target driven by reference initiators on the emulated fabric.

KBTP "Session Establishment", "Operations", "Allocation Quotas", "Completion", "Direct Modes",
"Operational Considerations".
"""

from __future__ import annotations

from typing import Any

import pytest

from kvconform.kbtp.config import ALL_FEATURES, ConfigError, TargetConfig
from kvconform.kbtp.constants import HEADER_SIZE, EntryFlags, Features, Opcode, Status
from kvconform.kbtp.harness import Harness, build, initiator_ids
from kvconform.kbtp.initiator import InitiatorError
from kvconform.kbtp.messages import AllocStore, DataDescriptor, Load, Store, TableEntry
from kvconform.kbtp.pool import PoolError
from kvconform.kbtp.table import next_generation
from kvconform.kbtp.target import ReferenceTarget, RequestContext
from kvconform.rdma.fabric import sleep, wait_until
from kvconform.rdma.profiles import IB_RC_MASKED, RDMAP_7306
from kvconform.rdma.scheduler import ScriptScheduler

SMALL = TargetConfig(pool_blocks=8, block_size=64, shared_blocks=4, quota=2, max_inline=32, ticket_timeout_ms=50,
                     retention_ms=5_000)


def run1(h: Harness, gen: Any) -> Any:
    return h.run(x=gen)["x"]


def memory(t: ReferenceTarget) -> tuple[bytes, ...]:
    """Every octet a remote peer could observe: table, pool, and each ring's slots and counters."""
    rings = {r.name: r for r in t._ring_of_block.values()}
    return (t.table_region.read(0, t.table_region.length), t.pool_region.read(0, t.pool_region.length),
            *(r.buffer.read(0, r.buffer.length) for _, r in sorted(rings.items())))


# ---- configuration -------------------------------------------------------------------------------


def test_config_refuses_what_the_text_forbids() -> None:
    with pytest.raises(ConfigError, match="power of two"):
        TargetConfig(pool_blocks=8, shared_ring_slots=6)
    with pytest.raises(ConfigError, match="not smaller"):
        TargetConfig(pool_blocks=8, shared_ring_slots=4)
    with pytest.raises(ConfigError, match="bits"):
        TargetConfig(features=Features(0x10))


def test_pool_offsets_and_carving() -> None:
    h = build(0, config=TargetConfig(pool_blocks=8, block_size=64, shared_blocks=3))
    pool = h.target.pool
    assert pool.offset_of(2) == pool.base + 128 and pool.index_of(pool.base + 128) == 2
    for bad in (pool.base + 1, pool.base - 64, pool.base + 8 * 64):
        with pytest.raises(PoolError, match="names no block"):
            pool.index_of(bad)
    a, b = pool.carve(2), pool.carve(3)  # the shared ring took the first 3
    assert (a.first, b.first) == (3, 5)
    with pytest.raises(PoolError, match="no run of 1"):
        pool.carve(1)


def test_generation_skips_zero() -> None:
    assert next_generation(1) == 2
    assert next_generation(0xFFFE) == 0xFFFF
    assert next_generation(0xFFFF) == 1


def test_sum_of_quotas_never_exceeds_the_shared_ring() -> None:
    """A HELLO that would push the sum of quotas above F is refused with NO_SPACE."""
    h = build(3, config=TargetConfig(pool_blocks=4, block_size=64, quota=2), requested=Features(0))
    acks = h.run_actors({f"i{k}": ini.hello() for k, ini in enumerate(h.initiators)})
    statuses = sorted(int(a.status) for a in acks.values())
    assert statuses == [Status.OK, Status.OK, Status.NO_SPACE]
    assert h.target.shared_reserved == 4


# ---- session establishment and features -------------------------------------------------------------


def test_hello_ack_describes_the_session() -> None:
    h = build(2, config=SMALL, profile=IB_RC_MASKED)
    x, y = h.initiators
    acks = h.run(x=x.hello(), y=y.hello())
    ax, ay = acks["x"], acks["y"]
    assert ax.status == Status.OK and ax.block_size == 64 and ax.max_inline == 32
    assert ax.allocation_quota == 2 and ax.ticket_timeout_ms == 50 and ax.request_credits == SMALL.request_credits
    assert ax.features == ALL_FEATURES
    # Handle ranges of different initiators never overlap.
    assert ax.handle_count == ay.handle_count == SMALL.handle_count
    assert abs(ax.handle_base - ay.handle_base) >= SMALL.handle_count
    assert ax.direct_load is not None and ax.direct_load.table_base_handle == SMALL.table_base_handle
    assert ax.direct_load.pool.count == SMALL.pool_blocks
    assert ax.direct_alloc is not None and ax.direct_alloc.partition.count == 2 and ax.direct_alloc.head.count == 1
    assert ax.direct_alloc.head.tagged_offset % 8 == 0


def test_rdmap_never_advertises_record_completion() -> None:
    h = build(1, config=SMALL, profile=RDMAP_7306)
    ack = run1(h, h.initiators[0].hello())
    assert not ack.features & Features.RECORD_COMPLETION


@pytest.mark.parametrize("off", [None, *Features], ids=lambda f: "all-on" if f is None else f"no-{f.name}")
def test_each_feature_off(off: Features | None) -> None:
    """Features are configuration: with one off, it is not granted and its descriptors are absent; the
    default mode (target-executed operations) works either way."""
    features = ALL_FEATURES if off is None else ALL_FEATURES & ~off
    cfg = TargetConfig(pool_blocks=8, block_size=64, shared_blocks=4, quota=2, features=features)
    h = build(1, config=cfg, profile=IB_RC_MASKED)
    x = h.initiators[0]

    def scenario() -> Any:
        ack = yield from x.hello()
        stored = yield from x.alloc_store(x.handle(0), b"KVBLOCK!", seal=True, record=True)
        loaded = yield from x.load(x.handle(0))
        direct = (yield from x.direct_load(x.handle(0))) if ack.direct_load is not None else None
        da = (yield from x.direct_alloc(x.handle(1), b"direct")) if ack.direct_alloc is not None else None
        return ack, stored, loaded, direct, da

    ack, stored, loaded, direct, da = run1(h, scenario())
    assert ack.features == features
    assert (ack.direct_load is not None) == bool(features & Features.DIRECT_LOAD)
    assert (ack.direct_alloc is not None) == bool(features & Features.DIRECT_ALLOC)
    assert stored.ok and loaded.data == b"KVBLOCK!"
    assert (stored.record is not None) == bool(features & Features.RECORD_COMPLETION)
    if direct is not None:
        assert direct.ok and direct.data == b"KVBLOCK!"
    if da is not None:
        assert da.bind is not None and da.bind.ok
    # ADDR_LE decides the byte order of Block Offsets in the table.
    raw = h.target.table_region.read(16 * (x.handle(0) - cfg.table_base_handle), 16)
    le = bool(features & Features.ADDR_LE)
    assert TableEntry.unpack(raw, 0, addr_le=le).block_offset == stored.block_offset
    assert TableEntry.unpack(raw, 0, addr_le=not le).block_offset != stored.block_offset


# ---- every status -------------------------------------------------------------------------------------


class _FailingTarget(ReferenceTarget):
    """Fault injection: the data step of a store fails inside the target (INTERNAL)."""

    def obtain_data(self, ctx: RequestContext, block: int) -> Any:
        if ctx.msg.handle & 0xF == 0xF:
            raise PoolError("injected target failure")
        return (yield from super().obtain_data(ctx, block))


def test_every_status_code_is_reachable() -> None:
    ids = initiator_ids(2, 5)
    cfg = TargetConfig(pool_blocks=8, block_size=64, shared_blocks=4, quota=2, ticket_timeout_ms=20,
                       quotas={ids[0]: 2, ids[1]: 2})
    h = build(2, config=cfg, seed=5, target_cls=_FailingTarget, requested=[Features.DIRECT_LOAD, ALL_FEATURES])
    x, y = h.initiators
    seen: dict[str, int] = {}

    def note(name: str, status: int) -> None:
        seen[name] = int(status)

    def x_actor() -> Any:
        yield from x.hello()
        note("OK", (yield from x.alloc_store(x.handle(0), b"sealed", seal=True)).status)
        yield from x.alloc_store(x.handle(1), b"open")
        note("INVALID_HANDLE", (yield from x.alloc_store(x.handle(0) + 10_000, b"far")).status)
        note("STALE_GENERATION", (yield from x.load(x.handle(0), generation=77)).status)
        note("NOT_VALID", (yield from x.load(x.handle(5))).status)
        note("ALREADY_BOUND", (yield from x.alloc_store(x.handle(0), b"again")).status)
        note("NO_SPACE", (yield from x.alloc_store(x.handle(2), b"over quota")).status)
        note("SEALED", (yield from x.store(x.handle(0), b"overwrite")).status)
        note("NOT_SEALED", (yield from x.load(x.handle(1))).status)
        note("TOO_LARGE", (yield from x.load(x.handle(0), length=2)).status)
        x.send_raw(b"\x02" + Load(request_id=99, handle=x.handle(0)).encode()[1:])  # Version 2
        msg, _, _, _ = yield from x.next_answer()
        note("MALFORMED", msg.status)  # type: ignore[union-attr]
        yield from x.free(x.handle(1))
        note("INTERNAL", (yield from x.alloc_store(x.handle(0xF), b"boom")).status)

    def y_actor() -> Any:
        yield from y.hello()
        ticket, offset = yield from y.take_ticket()
        block, _ = yield from y.await_slot(ticket, offset)
        assert block is not None
        yield from sleep(0.1)  # twice the Ticket Timeout of logical time
        note("TICKET_ABANDONED", (yield from y.bind(y.handle(0), ticket, 4, block)).status)

    h.run(x=x_actor(), y=y_actor())
    assert seen == {s.name: int(s) for s in Status}
    counted = {st for (_, st) in h.target.counters.completions}
    assert counted == {s.name for s in Status}
    assert h.target.failures and "injected" in h.target.failures[0]


def test_malformed_requests_are_answered_with_their_request_id() -> None:
    h = build(1, config=SMALL)
    x = h.initiators[0]

    def scenario() -> Any:
        yield from x.hello()
        raw = AllocStore(request_id=42, handle=x.handle(0), flags=0x0001, data=DataDescriptor(0, 0, 8),
                         inline=b"12345678").encode_raw(addr_le=x.addr_le)
        x.send_raw(raw[:-1])  # inline data one octet short of the descriptor Length
        msg, _, _, _ = yield from x.next_answer()
        return msg

    msg = run1(h, scenario())
    assert msg.status == Status.MALFORMED and msg.request_id == 42
    assert h.target.table.bound() == {}


# ---- validation has no other effect -----------------------------------------------------------------------


def test_a_failed_check_touches_no_memory() -> None:
    h = build(1, config=SMALL, requested=Features.DIRECT_LOAD)
    x = h.initiators[0]
    before: list[tuple[bytes, ...]] = []
    after: list[tuple[bytes, ...]] = []

    def scenario() -> Any:
        yield from x.hello()
        yield from x.alloc_store(x.handle(0), b"a", seal=True)
        yield from x.alloc_store(x.handle(1), b"b")
        before.append(memory(h.target))
        statuses = []
        for gen in (x.alloc_store(x.handle(0), b"bound"),  # ALREADY_BOUND
                    x.alloc_store(x.handle(2), b"quota"),  # NO_SPACE
                    x.store(x.handle(0), b"sealed"),  # SEALED
                    x.request(Store(request_id=50, handle=x.handle(1), data=DataDescriptor(7, 0, 100))),  # TOO_LARGE
                    x.store(x.handle(1), b"stale", generation=9),  # STALE_GENERATION
                    x.free(x.handle(3)),  # NOT_VALID
                    x.free(x.handle(0) + 5000)):  # INVALID_HANDLE
            statuses.append((yield from gen).status)
        after.append(memory(h.target))
        return statuses

    statuses = run1(h, scenario())
    assert statuses == [Status.ALREADY_BOUND, Status.NO_SPACE, Status.SEALED, Status.TOO_LARGE,
                        Status.STALE_GENERATION, Status.NOT_VALID, Status.INVALID_HANDLE]
    assert before == after


# ---- operations ----------------------------------------------------------------------------------------


def test_store_load_seal_and_free() -> None:
    h = build(1, config=SMALL, requested=Features(0))
    x = h.initiators[0]

    def scenario() -> Any:
        yield from x.hello()
        a = yield from x.alloc_store(x.handle(0), b"first")
        unsealed = yield from x.load(x.handle(0))
        allowed = yield from x.load(x.handle(0), allow_unsealed=True)
        s = yield from x.store(x.handle(0), b"second, longer", seal=True, inline=False)
        loaded = yield from x.load(x.handle(0), generation=a.generation)
        f = yield from x.free(x.handle(0), generation=a.generation)
        gone = yield from x.load(x.handle(0))
        return a, unsealed, allowed, s, loaded, f, gone

    a, unsealed, allowed, s, loaded, f, gone = run1(h, scenario())
    assert a.ok and a.generation == 2 and a.data_length == 5
    assert unsealed.status == Status.NOT_SEALED
    assert allowed.ok and allowed.data == b"first"
    assert s.ok and s.data_length == len(b"second, longer") and s.generation == a.generation
    assert loaded.data == b"second, longer" and loaded.block_offset == a.block_offset
    assert f.ok and f.generation == 3 and gone.status == Status.NOT_VALID
    ring = h.target.shared_ring
    assert ring is not None and a.block_offset in ring.held_blocks()
    assert h.target.census_problems() == []


def test_generation_wraps_past_zero_in_the_table() -> None:
    h = build(1, config=SMALL, requested=Features(0))
    x = h.initiators[0]

    def scenario() -> Any:
        yield from x.hello()
        h.target.table.write_state(x.handle(0), EntryFlags(0), 0xFFFE)
        a = yield from x.alloc_store(x.handle(0), b"wrap")
        f = yield from x.free(x.handle(0))
        return a.generation, f.generation

    assert run1(h, scenario()) == (0xFFFF, 1)


@pytest.mark.parametrize("domains", [False, True], ids=["one-domain", "two-domains"])
def test_handle_ranges_and_trust_domains(domains: bool) -> None:
    """Another initiator's handles: never stored or freed; loaded only within one trust domain, and freed
    blocks are cleared when the ring is shared across domains."""
    ids = initiator_ids(2, 9)
    cfg = TargetConfig(pool_blocks=4, block_size=64, quota=2,
                       trust_domains={ids[0]: "a", ids[1]: "b"} if domains else {})
    h = build(2, config=cfg, seed=9, requested=Features(0))
    x, y = h.initiators
    out: dict[str, Any] = {}

    def x_actor() -> Any:
        yield from x.hello()
        out["stored"] = yield from x.alloc_store(x.handle(0), b"secret", seal=True)
        yield from wait_until(lambda: "y" in out, name="y-done")
        out["freed"] = yield from x.free(x.handle(0))

    def y_actor() -> Any:
        yield from y.hello()
        yield from wait_until(lambda: "stored" in out, name="x-stored")
        target = x.handle(0)
        out["load"] = yield from y.load(target)
        out["store"] = yield from y.store(target, b"mine")
        out["free"] = yield from y.free(target)
        out["y"] = True

    h.run(x=x_actor(), y=y_actor())
    assert out["store"].status == out["free"].status == Status.INVALID_HANDLE
    assert out["load"].status == (Status.INVALID_HANDLE if domains else Status.OK)
    assert out["freed"].ok
    block = out["stored"].block_offset
    assert h.target.pool.read(block, 6) == (bytes(6) if domains else b"secret")
    assert h.target.counters.blocks_cleared == int(domains)


def test_counters_per_operation_and_status() -> None:
    h = build(1, config=SMALL, requested=Features(0))
    x = h.initiators[0]

    def scenario() -> Any:
        yield from x.hello()
        yield from x.alloc_store(x.handle(0), b"a", seal=True)
        yield from x.load(x.handle(0))
        yield from x.load(x.handle(1))
        yield from x.free(x.handle(0))
        yield from x.goodbye()

    run1(h, scenario())
    assert h.target.counters.by_operation() == {
        "ALLOC_STORE": {"OK": 1}, "FREE": {"OK": 1}, "GOODBYE": {"OK": 1}, "HELLO": {"OK": 1},
        "LOAD": {"NOT_VALID": 1, "OK": 1}}
    assert h.target.counters.count(Opcode.LOAD) == 2


# ---- completions ----------------------------------------------------------------------------------------


def test_completion_records_by_write_with_immediate_on_ib() -> None:
    h = build(1, config=SMALL, profile=IB_RC_MASKED)
    x = h.initiators[0]

    def scenario() -> Any:
        yield from x.hello()
        rec = yield from x.alloc_store(x.handle(0), b"rec", seal=True, record=True)
        plain = yield from x.load(x.handle(0))
        return rec, plain

    rec, plain = run1(h, scenario())
    assert rec.record is not None and rec.completion is None and rec.record.request_id == rec.request_id
    assert rec.record.generation == 2 and rec.record.data_length == 3
    assert plain.completion is not None and plain.record is None


def test_record_flag_on_rdmap_still_gets_a_completion_message() -> None:
    h = build(1, config=SMALL, profile=RDMAP_7306)
    x = h.initiators[0]

    def scenario() -> Any:
        yield from x.hello()
        return (yield from x.alloc_store(x.handle(0), b"rec", record=True))

    res = run1(h, scenario())
    assert res.completion is not None and res.record is None and res.ok


def test_invalidate_uses_send_with_invalidate() -> None:
    h = build(1, config=SMALL, requested=Features(0))
    x = h.initiators[0]

    def scenario() -> Any:
        yield from x.hello()
        yield from x.alloc_store(x.handle(0), b"data", seal=True)
        return (yield from x.load(x.handle(0)))

    res = run1(h, scenario())
    assert res.window_stag is not None and res.invalidated_stag == res.window_stag
    assert not x.node.is_valid(res.window_stag)


# ---- sessions: active IDs, GOODBYE, retention ------------------------------------------------------------


def test_hello_with_an_active_initiator_id_is_rejected() -> None:
    h = build(1, config=SMALL, requested=Features(0))
    x = h.initiators[0]
    twin = h.connect("twin", initiator_id=x.initiator_id, requested=Features(0))

    def scenario() -> Any:
        first = yield from x.hello()
        second = yield from twin.hello()
        still = yield from x.alloc_store(x.handle(0), b"ok")
        return first, second, still

    first, second, still = run1(h, scenario())
    assert first.status == Status.OK
    assert second.status != Status.OK and second.status == ReferenceTarget.HELLO_ACTIVE_STATUS
    assert still.ok and h.target.counters.hellos_rejected == 1


@pytest.mark.parametrize("how", ["goodbye", "connection-lost"])
def test_bindings_are_retained_across_a_reconnect(how: str) -> None:
    h = build(1, config=SMALL, requested=Features(0))
    x = h.initiators[0]

    def scenario() -> Any:
        first = yield from x.hello()
        stored = yield from x.alloc_store(x.handle(0), b"keep me", seal=True)
        if how == "goodbye":
            yield from x.goodbye(release=False)
        else:
            x.conn.disconnect()
        yield from sleep(1.0)  # well within the 5 s retention
        again = h.connect("I0", initiator_id=x.initiator_id, requested=Features(0))
        second = yield from again.hello()
        loaded = yield from again.load(again.handle(0), generation=stored.generation)
        return first, second, loaded

    first, second, loaded = run1(h, scenario())
    assert second.status == Status.OK and second.handle_base == first.handle_base
    assert loaded.ok and loaded.data == b"keep me"


def test_goodbye_with_release_frees_every_handle() -> None:
    h = build(1, config=SMALL, requested=Features(0))
    x = h.initiators[0]

    def scenario() -> Any:
        yield from x.hello()
        for i in range(2):
            yield from x.alloc_store(x.handle(i), b"bye")
        yield from x.goodbye(release=True)
        again = h.connect("I0", initiator_id=x.initiator_id, requested=Features(0))
        yield from again.hello()
        return (yield from again.load(again.handle(0)))

    assert run1(h, scenario()).status == Status.NOT_VALID
    ring = h.target.shared_ring
    assert ring is not None and len(ring.held_blocks()) == 4
    assert h.target.counters.count(Opcode.GOODBYE) == 1


def test_retention_expires_on_the_logical_clock() -> None:
    h = build(1, config=SMALL, requested=Features(0))
    x = h.initiators[0]

    def scenario() -> Any:
        yield from x.hello()
        yield from x.alloc_store(x.handle(0), b"old")
        yield from x.goodbye()
        yield from sleep(6.0)  # past the 5 s retention
        again = h.connect("I0", initiator_id=x.initiator_id, requested=Features(0))
        yield from again.hello()
        return (yield from again.load(again.handle(0), allow_unsealed=True))

    assert run1(h, scenario()).status == Status.NOT_VALID
    assert h.target.counters.sessions_expired == 1
    assert h.target.census_problems() == []


# ---- DIRECT_ALLOC tickets --------------------------------------------------------------------------------


def test_abandoned_ticket_is_reclaimed_only_after_the_partition_stag_is_invalidated() -> None:
    h = build(1, config=SMALL)
    x = h.initiators[0]
    t = h.target
    notes: dict[str, Any] = {}
    partition_stag: list[int] = []

    def scenario() -> Any:
        ack = yield from x.hello()
        assert ack.direct_alloc is not None
        stag = ack.direct_alloc.partition.stag
        partition_stag.append(stag)
        ticket, offset = yield from x.take_ticket()
        block, _ = yield from x.await_slot(ticket, offset)
        assert block is not None
        notes["usage_taken"] = t.snapshot_initiators()[x.initiator_id].usage
        yield from sleep(0.2)  # the 50 ms Ticket Timeout passes
        notes["stag_valid"] = t.node.is_valid(stag)
        late = yield from x.bind(x.handle(0), ticket, 4, block)
        fresh = yield from x.alloc_store(x.handle(1), b"after")  # target-executed, from the same partition
        return ticket, block, late, fresh

    def observer() -> Any:
        ring = None

        def consumed() -> bool:
            nonlocal ring
            rec = t.records.get(x.initiator_id)
            if rec is None or rec.partition is None or not t.counters.tickets_abandoned:
                return False
            ring = rec.partition.ring
            return ring.is_consumed(0)

        yield from wait_until(consumed, name="reclaim-consumes")
        notes["stag_valid_at_consume"] = t.node.is_valid(partition_stag[0])
        notes["invalidated_at_consume"] = t.counters.stags_invalidated

    out = h.run(x=scenario(), obs=observer())
    ticket, block, late, fresh = out["x"]
    assert notes["usage_taken"] == 1
    assert notes["invalidated_at_consume"] == 1 and not notes["stag_valid_at_consume"]
    assert notes["stag_valid"] is False
    assert late.status == Status.TICKET_ABANDONED
    view = t.snapshot_initiators()[x.initiator_id]
    assert view.abandoned_tickets == (ticket,) and view.outstanding_tickets == ()
    assert fresh.ok and view.usage == 1  # the reclaimed ticket's unit came back
    assert block in (view.partition.held if view.partition else ())
    assert t.census_problems() == []


def test_bind_within_the_timeout_and_its_checks() -> None:
    ids = initiator_ids(1, 4)
    h = build(1, config=TargetConfig(pool_blocks=8, block_size=64, shared_blocks=4, quota=2,
                                     ticket_timeout_ms=10_000), seed=4)
    x = h.initiators[0]
    assert x.initiator_id == ids[0]

    def scenario() -> Any:
        yield from x.hello()
        t0, o0 = yield from x.take_ticket()
        b0, _ = yield from x.await_slot(t0, o0)
        assert b0 is not None
        wrong = yield from x.bind(x.handle(0), t0, 4, b0 + 64)
        t1, _ = yield from x.take_ticket()
        t2, _ = yield from x.take_ticket()  # three tickets on a quota of two
        over = yield from x.bind(x.handle(0), t0, 4, b0)
        return wrong, over, (t0, t1, t2)

    wrong, over, tickets = run1(h, scenario())
    assert wrong.status == ReferenceTarget.BIND_MISMATCH_STATUS
    assert over.status == Status.NO_SPACE
    assert tickets == (0, 1, 2)


def test_bind_writes_the_entry_after_the_data() -> None:
    h = build(1, config=TargetConfig(pool_blocks=8, block_size=64, shared_blocks=4, quota=2,
                                     ticket_timeout_ms=10_000), seed=2)
    x = h.initiators[0]

    def scenario() -> Any:
        yield from x.hello()
        da = yield from x.direct_alloc(x.handle(0), b"direct!!")
        loaded = yield from x.load(x.handle(0), allow_unsealed=True)
        return da, loaded

    da, loaded = run1(h, scenario())
    assert da.bind.ok and da.bind.block_offset == da.block_offset and loaded.data == b"direct!!"
    rec = h.target.records[x.initiator_id]
    assert rec.partition is not None and rec.partition.ring.is_consumed(da.slot_offset)
    assert rec.usage == 1 and rec.bound == {x.handle(0)}


def test_requests_before_hello_are_malformed() -> None:
    h = build(1, config=SMALL)
    x = h.initiators[0]

    def scenario() -> Any:
        x.send_raw(Load(request_id=3, handle=0x4000, data=DataDescriptor(0, 0, 8)).encode())
        msg, raw, _, _ = yield from x.next_answer()
        return msg, raw

    msg, raw = run1(h, scenario())
    assert msg.status == Status.MALFORMED and msg.request_id == 3 and len(raw) > HEADER_SIZE



# ---- one-method override points (what the conformance mutants build on) -------------------------------------


class _GenerationWrapsToZero(ReferenceTarget):
    def next_generation(self, generation: int) -> int:
        return (generation + 1) & 0xFFFF


class _EntryBeforeData(ReferenceTarget):
    def fill_and_bind(self, ctx: RequestContext, block: int) -> Any:
        assert isinstance(ctx.msg, AllocStore)
        yield from self.bind_entry(ctx, block, ctx.msg.data.length, seal=True)
        return (yield from self.obtain_data(ctx, block))


class _QuotaKeptOnReclaim(ReferenceTarget):
    def release_ticket(self, record: Any, ticket: int) -> None:
        return None


@pytest.mark.parametrize("target_cls", [ReferenceTarget, _GenerationWrapsToZero], ids=["reference", "mutant"])
def test_override_generation(target_cls: type[ReferenceTarget]) -> None:
    h = build(1, config=SMALL, requested=Features(0), target_cls=target_cls)
    x = h.initiators[0]

    def scenario() -> Any:
        yield from x.hello()
        h.target.table.write_state(x.handle(0), EntryFlags(0), 0xFFFE)
        yield from x.alloc_store(x.handle(0), b"wrap")
        return (yield from x.free(x.handle(0))).generation

    assert run1(h, scenario()) == (1 if target_cls is ReferenceTarget else 0)


@pytest.mark.parametrize("target_cls", [ReferenceTarget, _EntryBeforeData], ids=["reference", "mutant"])
def test_override_entry_order(target_cls: type[ReferenceTarget]) -> None:
    """Whoever sees VALID in the entry must see the data (the target's RDMA Read leaves a window)."""
    h = build(1, config=SMALL, requested=Features(0), target_cls=target_cls)
    x = h.initiators[0]
    seen: list[bytes] = []

    def scenario() -> Any:
        yield from x.hello()
        return (yield from x.alloc_store(x.handle(0), b"D" * 40, seal=True, inline=False))

    def observer() -> Any:
        t = h.target
        yield from wait_until(lambda: x.ack is not None and t.table.entry(x.handle(0)).valid, name="valid")
        e = t.table.entry(x.handle(0))
        seen.append(t.pool.read(e.block_offset, 40))

    h.run(x=scenario(), obs=observer())
    assert (seen == [b"D" * 40]) == (target_cls is ReferenceTarget)


@pytest.mark.parametrize("target_cls", [ReferenceTarget, _QuotaKeptOnReclaim], ids=["reference", "mutant"])
def test_override_quota_release_on_reclaim(target_cls: type[ReferenceTarget]) -> None:
    cfg = TargetConfig(pool_blocks=4, block_size=64, shared_blocks=2, quota=1, ticket_timeout_ms=50)
    h = build(1, config=cfg, target_cls=target_cls)
    x = h.initiators[0]

    def scenario() -> Any:
        yield from x.hello()
        yield from x.take_ticket()
        yield from sleep(0.2)
        return (yield from x.alloc_store(x.handle(0), b"after reclaim")).status

    assert run1(h, scenario()) == (Status.OK if target_cls is ReferenceTarget else Status.NO_SPACE)


def test_a_write_after_the_fence_cannot_reach_the_partition() -> None:
    """After reclaim, the initiator's RDMA Write through the invalidated Partition STag is refused by the
    fabric (invalid STag Terminate); the reclaimed block keeps whatever the ring gave it."""
    h = build(1, config=SMALL)
    x = h.initiators[0]

    def scenario() -> Any:
        yield from x.hello()
        ticket, offset = yield from x.take_ticket()
        block, _ = yield from x.await_slot(ticket, offset)
        assert block is not None
        yield from sleep(0.2)
        yield from x.write_block(block, b"too late")
        try:
            yield from x.bind(x.handle(0), ticket, 8, block)
        except InitiatorError as exc:
            return block, str(exc)
        return block, ""

    block, error = run1(h, scenario())
    assert "invalid STag" in error or "flushed" in error
    assert h.target.pool.read(block, 8) != b"too late"
    assert h.target.counters.tickets_abandoned == 1 and h.target.census_problems() == []


def test_reconnect_before_the_retention_actor_first_runs() -> None:
    """Regression: the initiator is back (HELLO served) before the retention actor of its lost connection
    takes its first step; that actor must leave the restored session alone."""
    script = ["target@c1.T", "target@c1.T", "target.retain.*"]
    h = build(1, config=SMALL, requested=Features(0), scheduler=ScriptScheduler(script))
    x = h.initiators[0]

    def scenario() -> Any:
        yield from x.hello()
        stored = yield from x.alloc_store(x.handle(0), b"kept", seal=True)
        x.conn.disconnect()
        again = h.connect("I0", initiator_id=x.initiator_id, requested=Features(0))
        second = yield from again.hello()
        loaded = yield from again.load(again.handle(0), generation=stored.generation)
        return second, loaded

    second, loaded = run1(h, scenario())
    assert h.fabric.scheduler.remaining == []  # type: ignore[attr-defined]
    assert second.status == Status.OK and loaded.data == b"kept"
    assert h.target.counters.sessions_expired == 0


def test_a_gone_initiator_with_an_outstanding_ticket_does_not_make_the_watcher_spin() -> None:
    """Regression: an initiator takes a DIRECT_ALLOC ticket and its connection ends before the Ticket Timeout;
    the ticket watcher must wait for the timeout (fabric time passes), not re-check without end."""
    h = build(1, config=SMALL)
    x = h.initiators[0]

    def scenario() -> Any:
        ack = yield from x.hello()
        assert ack.direct_alloc is not None
        yield from x.take_ticket()
        x.conn.disconnect()

    run1(h, scenario())  # raised HarnessError (the step budget used up) before the fix
    assert h.fabric.steps < 1000, h.fabric.steps


def test_untrusted_initiators_get_no_direct_mode() -> None:
    """KBTP-DIRECT-TRUST: an Initiator ID configured untrusted is served in the default mode only (no
    DIRECT_LOAD, no DIRECT_ALLOC, no partition); the trusted one next to it gets both."""
    ids = initiator_ids(2, 5)
    cfg = TargetConfig(pool_blocks=12, shared_blocks=4, block_size=64, quota=2,
                       untrusted_initiators=frozenset({ids[1]}))
    h = build(2, config=cfg, seed=5)
    trusted, untrusted = h.initiators

    def scenario() -> Any:
        a = yield from trusted.hello()
        b = yield from untrusted.hello()
        return a, b

    a, b = run1(h, scenario())
    direct = Features.DIRECT_LOAD | Features.DIRECT_ALLOC
    assert a.status == b.status == Status.OK
    assert Features(a.features) & direct == direct and a.direct_alloc is not None
    assert not Features(b.features) & direct and b.direct_load is None and b.direct_alloc is None
    assert h.target.records[ids[1]].partition is None
    with pytest.raises(ConfigError):
        TargetConfig(untrusted_initiators=frozenset({b"short"}))


def test_tickets_taken_count_in_usage_before_the_watcher_sees_them(monkeypatch: pytest.MonkeyPatch) -> None:
    """A NIC executes the initiator's FetchAdds without telling the target: an ALLOC_STORE right behind them
    must count them (KBTP-QUOTA-USAGE) whether or not the target's ticket watcher has woken since (found against
    the reference served on rxe, where the ALLOC_STORE came first)."""
    monkeypatch.setattr(ReferenceTarget, "_watch", lambda self, record: None)  # the watcher never wakes
    h = build(1, config=SMALL)
    x = h.initiators[0]

    def scenario() -> Any:
        ack = yield from x.hello()
        for _ in range(ack.allocation_quota):
            yield from x.take_ticket()
        return (yield from x.alloc_store(x.handle(5), b"over quota"))

    assert run1(h, scenario()).status == Status.NO_SPACE
