"""kbtp-initiator: the direct modes as the initiator performs them — the DIRECT_LOAD double read and its
validity rule, DIRECT_ALLOC's FetchAdd, slot re-read and confirmation, write, then BIND, never a write to
the ring, frees by FREE (KBTP "Direct Modes", "Free-Block Ring")."""

from __future__ import annotations

import itertools
from typing import Any

import pytest

from kvconform.conformance.kbtp import expect
from kvconform.conformance.kbtp.client import Gen
from kvconform.conformance.kbtp.observer import InitiatorBed, RemoteOp
from kvconform.fixtures.kbtp import InitiatorUnderTest
from kvconform.kbtp.constants import RING_SLOT_SIZE, TABLE_ENTRY_SIZE, Features, Opcode, Status
from kvconform.kbtp.messages import Bind, Free
from kvconform.rdma import masked_add, pause
from kvconform.rdma.scheduler import PctScheduler

DL, DA = Features.DIRECT_LOAD, Features.DIRECT_ALLOC


def _hello(bed: InitiatorBed, feature: Features) -> Gen:
    granted = yield from bed.endpoint.hello()
    expect.holds(granted is not None and bool(granted & feature),
                 f"the initiator did not obtain {feature.name} (granted {granted!r})", req="KBTP-HELLO-FIRST")
    return granted


def _reads_in_order(bed: InitiatorBed, ops: list[RemoteOp], req: str) -> None:
    """Each read was posted only after the previous one had completed (all its response samples ran)."""
    for prev, nxt in itertools.pairwise(ops):
        samples = bed.steps_of(prev.wr, "read-sample")
        posted = bed.post_step(nxt.wr)
        expect.holds(bool(samples) and posted is not None and posted > max(samples),
                     f"read {nxt.wr} (to {nxt.to:#x}) was posted at step {posted}, before read {prev.wr} completed "
                     f"(its data arrived at steps {samples})", req=req)


@pytest.mark.req("KBTP-DLOAD-SEQUENCE", "KBTP-TABLE-ADDRESS", "KBTP-RING-COUNTER-NO-READ")
def test_direct_load_sequence(kbtp_initiator: InitiatorUnderTest, seed: int) -> None:
    """A direct load reads the handle's entry (at the table address rule's offset), then the block at the
    entry's Block Offset, then the entry again, each read issued after the previous one completed."""
    kbtp_initiator.require(DL)
    bed = kbtp_initiator.bed(seed, label="direct-load-sequence")
    ep = bed.endpoint
    data = b"direct" * 20

    def scenario() -> Gen:
        yield from _hello(bed, DL)
        r = yield from ep.alloc_store(ep.handle_base + 3, data, seal=True)
        expect.status_is(r, Status.OK, req="KBTP-DLOAD-SEQUENCE", what="ALLOC_STORE")
        d = yield from ep.direct_load(ep.handle_base + 3, 4096)
        expect.status_is(d, Status.OK, req="KBTP-DLOAD-SEQUENCE", what="direct load of a sealed block")
        expect.equal("direct-loaded data", d.data, data, req="KBTP-DLOAD-SEQUENCE")
        return r

    r = bed.run_one(scenario())
    ack = bed.ack
    assert ack is not None and ack.direct_load is not None
    dl = ack.direct_load
    entry_to = dl.table.tagged_offset + TABLE_ENTRY_SIZE * (ack.handle_base + 3 - dl.table_base_handle)
    reads = [op for op in bed.remote_ops() if op.kind == "rdma_read"]
    shape = [("table" if op.stag == dl.table.stag else "pool" if op.stag == dl.pool.stag else hex(op.stag), op.to)
             for op in reads]
    want = [("table", entry_to), ("pool", r.block_offset), ("table", entry_to)]
    expect.equal("RDMA Reads of the direct load (STag, Tagged Offset)", shape, want, req="KBTP-DLOAD-SEQUENCE")
    _reads_in_order(bed, reads, "KBTP-DLOAD-SEQUENCE")


@pytest.mark.req("KBTP-DLOAD-VALIDITY", "KBTP-FREE-DETECT", "KBTP-LOAD-ANY")
def test_direct_load_detects_free(kbtp_initiator: InitiatorUnderTest, session_seed: int) -> None:
    """The initiator direct-loads a handle another party frees and re-allocates with other data, under
    seeded interleavings: data it accepts is exactly what was stored under the Generation it reports."""
    kbtp_initiator.require(DL)
    runs = 40
    accepted = sum(_direct_load_race(kbtp_initiator, session_seed * 1000 + i, i) for i in range(runs))
    expect.holds(accepted > 0, f"no direct load was accepted in {runs} interleavings: the check saw nothing",
                 req="KBTP-DLOAD-VALIDITY")


def _direct_load_race(kbtp_initiator: InitiatorUnderTest, seed: int, i: int) -> int:
    """One interleaving: harness party H binds, re-binds and frees a handle while the initiator under test
    direct-loads it; returns how many direct loads it accepted (each checked against H's data)."""
    bed = kbtp_initiator.bed(seed, label=f"direct-load-race-{i}", scheduler=PctScheduler(seed, depth=4, horizon=600))
    ep = bed.endpoint
    owner = bed.harness_client("H")
    stored: dict[int, bytes] = {}
    results: list[Any] = []
    state = {"handle": 0, "done": False}

    def churn() -> Gen:
        yield from owner.hello(Features(0))
        assert owner.session is not None
        h = owner.session.handle(0)
        state["handle"] = h
        for k in range(6):
            data = bytes([0x40 + k]) * (64 + 16 * k)
            a = yield from owner.alloc_store(h, data)
            expect.status_is(a, Status.OK, req="KBTP-LOAD-ANY", what=f"harness ALLOC_STORE {k}")
            stored[a.generation] = data
            yield from pause("H-bound")
            yield from owner.free(h)
        state["done"] = True

    def reader() -> Gen:
        yield from _hello(bed, DL)
        while not state["handle"]:
            yield from pause("wait-handle")
        while not state["done"]:
            d = yield from ep.direct_load(state["handle"], 4096)
            results.append(d)

    bed.run(H=churn(), R=reader())
    accepted = [d for d in results if d.status == Status.OK]
    for d in accepted:
        want = stored.get(d.generation)
        shown = d.data[:6].hex() if d.data else None
        expect.holds(d.data == want, f"interleaving {i}: the initiator accepted {shown}... as Generation "
                     f"{d.generation}, whose data is {want[:6].hex() if want else None}... [{bed.hint()}]",
                     req="KBTP-DLOAD-VALIDITY")
    return len(accepted)


@pytest.mark.req("KBTP-DALLOC-FETCHADD", "KBTP-DALLOC-SLOT-READ", "KBTP-DALLOC-WRITE-THEN-BIND",
                 "KBTP-DALLOC-NO-SLOT-WRITE", "KBTP-DALLOC-FREE", "KBTP-BIND-LAYOUT", "KBTP-RING-WRAP",
                 "KBTP-RING-FETCHADD", "KBTP-RING-COUNTER-FIELDS", "KBTP-RING-SLOT-LAYOUT", "KBTP-RING-EMPTY",
                 "KBTP-ACK-DALLOC-DESC", "KBTP-IB-UNMASKED", "KBTP-RING-ALLOC-WAIT", "KBTP-QUOTA-USAGE")
def test_direct_alloc(kbtp_initiator: InitiatorUnderTest, seed: int) -> None:
    """Direct allocations past the ring's wrap (each bound, then freed by FREE): FetchAdd on the Head with
    the ring's Add Data and Mask, reads of the slot the returned offset names until it shows the ticket,
    one more read to confirm, the data written into that block, then BIND with the ticket, length and
    Block Offset; no write to the ring, no read of the Head."""
    kbtp_initiator.require(DA)
    bed = kbtp_initiator.bed(seed, label="direct-alloc")
    ep = bed.endpoint
    results = []

    def scenario() -> Gen:
        yield from _hello(bed, DA)
        ack = bed.ack
        assert ack is not None and ack.direct_alloc is not None
        for i in range(ack.direct_alloc.ring.count + 2):
            data = bytes([0x60 + i]) * (40 + i)
            r = yield from ep.direct_alloc(ep.handle_base + i, data)
            expect.status_is(r, Status.OK, req="KBTP-DALLOC-WRITE-THEN-BIND", what=f"direct allocation {i}")
            ld = yield from ep.load(ep.handle_base + i, 4096, allow_unsealed=True)
            expect.equal(f"data of direct allocation {i}", ld.data, data, req="KBTP-DALLOC-WRITE-THEN-BIND")
            f = yield from ep.free(ep.handle_base + i)
            expect.status_is(f, Status.OK, req="KBTP-DALLOC-FREE", what=f"FREE of direct allocation {i}")
            results.append(r)

    bed.run_one(scenario())
    ack = bed.ack
    assert ack is not None and ack.direct_alloc is not None
    da = ack.direct_alloc
    n = da.ring.count
    masked = kbtp_initiator.target_params.profile.masked_atomics
    ops = bed.remote_ops()
    binds = [(rec.step, rec.message) for rec in bed.messages() if isinstance(rec.message, Bind)]
    frees = [rec.message for rec in bed.messages() if isinstance(rec.message, Free)]
    expect.equal("BIND messages", len(binds), n + 2, req="KBTP-DALLOC-WRITE-THEN-BIND")
    expect.equal("FREE messages for direct-allocated handles", len(frees), n + 2, req="KBTP-DALLOC-FREE")
    for op in ops:
        expect.holds(not (op.kind == "write" and op.stag == da.ring.stag),
                     f"RDMA Write to the ring at {op.to:#x}", req="KBTP-DALLOC-NO-SLOT-WRITE")
        expect.holds(not (op.kind == "rdma_read" and op.stag == da.head.stag), "RDMA Read of the Head counter",
                     req="KBTP-RING-COUNTER-NO-READ")
    for reason in bed.terminations():
        expect.holds(False, f"the initiator's connection was terminated: {reason}", req="KBTP-DALLOC-NO-SLOT-WRITE")
    atomics = [rec for rec in bed.fabric.trace for eff in rec["effects"] if eff.get("do") == "fetch_add"]
    expect.equal("FetchAdds on the Head", len(atomics), n + 2, req="KBTP-DALLOC-FETCHADD")
    add = 0x0000_0001_0000_0010 if masked else 0x0000_0001_0000_0000
    mask = ((1 << 63) | (1 << 31) | (1 << (n.bit_length() - 1 + 3))) if masked else 0
    for k, rec in enumerate(atomics):
        eff = next(e for e in rec["effects"] if e.get("do") == "fetch_add")
        expect.equal(f"Head after FetchAdd {k} (from {int(eff['orig']):#x})", int(eff["new"]),
                     masked_add(int(eff["orig"]), add, mask), req="KBTP-DALLOC-FETCHADD")
    # Per allocation: FetchAdd, slot reads (>= 2, the last two of the ticket's slot), write, then BIND.
    cursor = 0
    for k, (bind_step, bind) in enumerate(binds):
        ticket = k
        slot_to = da.ring.tagged_offset + RING_SLOT_SIZE * (ticket % n)
        mine = [op for op in ops[cursor:] if op.step < bind_step]
        cursor += len(mine)
        fas = [op for op in mine if op.kind == "fetch_add"]
        expect.equal(f"allocation {k}: FetchAdds before its BIND", len(fas), 1, req="KBTP-DALLOC-FETCHADD")
        expect.equal(f"allocation {k}: FetchAdd target", (fas[0].stag, fas[0].to),
                     (da.head.stag, da.head.tagged_offset), req="KBTP-DALLOC-FETCHADD")
        slot_reads = [op for op in mine if op.kind == "rdma_read" and op.stag == da.ring.stag]
        expect.holds(len(slot_reads) >= 2 and all(op.to == slot_to for op in slot_reads),
                     f"allocation {k} (ticket {ticket}): slot reads at {[hex(op.to) for op in slot_reads]}, "
                     f"expected at least two, all at {slot_to:#x} (slot {ticket % n}, wrapping after N = {n})",
                     req="KBTP-DALLOC-SLOT-READ" if len(slot_reads) < 2 else
                     ("KBTP-RING-WRAP" if masked else "KBTP-IB-UNMASKED"))
        _reads_in_order(bed, slot_reads, "KBTP-DALLOC-SLOT-READ")
        writes = [op for op in mine if op.kind == "write" and op.stag == da.partition.stag]
        expect.holds(len(writes) == 1 and writes[0].step > max(op.step for op in slot_reads),
                     f"allocation {k}: partition writes {[(hex(w.to), w.step) for w in writes]} are not one write "
                     "after the slot reads", req="KBTP-DALLOC-WRITE-THEN-BIND")
        expect.equal(f"allocation {k}: BIND Ticket", bind.ticket, ticket, req="KBTP-BIND-LAYOUT")
        expect.equal(f"allocation {k}: BIND Block Offset (the written block)", bind.block_offset, writes[0].to,
                     req="KBTP-BIND-LAYOUT")
        expect.equal(f"allocation {k}: BIND Data Length", bind.data_length, 40 + k, req="KBTP-BIND-LAYOUT")
        expect.equal(f"allocation {k}: BIND Opcode", bind.OPCODE, Opcode.BIND, req="KBTP-BIND-LAYOUT")
