"""kbtp-initiator: the direct modes as the initiator performs them — the DIRECT_LOAD double read and its
validity rule, DIRECT_ALLOC's FetchAdd, slot re-read and confirmation, write, then BIND, never a write to
the ring, frees by FREE (KBTP "Direct Modes", "Free-Block Ring").

The direct allocations run once per module (``alloc_run``); each check judges one rule from what the
harness target saw (its step trace and the messages it received)."""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from functools import partial
from typing import Any

import pytest

from kvconform import evidence
from kvconform.conformance.kbtp import expect
from kvconform.fixtures.kbtp import InitiatorUnderTest
from kvconform.kbtp.constants import RING_SLOT_SIZE, TABLE_ENTRY_SIZE, Features, Opcode, Status
from kvconform.kbtp.messages import Bind, DirectAlloc, Free, Hello, HelloAck
from kvconform.kbtp.ring import TICKET_MODULUS
from kvconform.rdma import masked_add, pause, wait_until
from kvconform.rdma.scheduler import PctScheduler
from kvconform.targets.kbtp_client import Gen
from kvconform.targets.kbtp_observer import InitiatorBed, RemoteOp
from kvconform.verdicts import HarnessBug, check, inconclusive, not_applicable, pass_basis, violation

DL, DA = Features.DIRECT_LOAD, Features.DIRECT_ALLOC


def _hello(bed: InitiatorBed, feature: Features) -> Gen:
    granted = yield from bed.op(bed.endpoint.hello())
    check(granted is not None, "the initiator's HELLO was refused by the harness target (or it sent none)",
          req="KBTP-HELLO-FIRST")
    if not granted & feature:
        hellos = [rec.message for rec in bed.messages() if isinstance(rec.message, Hello)]
        asked = bool(hellos) and bool(hellos[0].requested_features & feature)
        if asked and not bed.target_params.sure_grants & feature:  # the harness target's declared geometry
            not_applicable(f"the initiator requested {feature.name}, and the harness target's declared geometry does "
                           f"not surely grant it ({bed.target_params.describe_capacity()})")
        inconclusive(f"the initiator did not obtain {feature.name} (granted {granted!r}), which PICS declares it "
                     "uses: " + (f"it requested it and the harness target did not grant it "
                                 f"({bed.target_params.describe_capacity()})" if asked else "it did not request it"))
    return granted


def _granted(bed: InitiatorBed, req: str) -> HelloAck:
    """The HELLO_ACK the harness target gave the initiator under test (``req`` fails when there was none)."""
    ack = bed.ack
    if ack is None:
        violation("the initiator never obtained a session from the harness target", req=req)
    return ack


def _reads_in_order(bed: InitiatorBed, ops: list[RemoteOp], req: str) -> None:
    """Each read was posted only after the previous one had completed (all its response samples ran): on the
    emulated fabric from its steps, over a userspace wire from what the harness target's end saw (`_wire_order`)."""
    if not getattr(bed.fabric, "owns_races", True):
        _wire_order(bed, ops, req)
        return
    for prev, nxt in itertools.pairwise(ops):
        samples = bed.steps_of(prev.wr, "read-sample")
        posted = bed.post_step(nxt.wr)
        check(bool(samples) and posted is not None and posted > max(samples),
              f"read {nxt.wr} (to {nxt.to:#x}) was posted at step {posted}, before read {prev.wr} completed "
              f"(its data arrived at steps {samples})", req=req)


def _wire_order(bed: InitiatorBed, ops: list[RemoteOp], req: str) -> None:
    """Over a wire the target holds each answer a while (targets/kbtp_order.py): a read whose request reached it
    while the previous read's answer was still held was issued before that read completed."""
    witness = bed.order_witness
    if witness is None:
        inconclusive(f"the check orders the initiator's reads, and the harness's target is on {bed.fabric!r}, whose "
                     "send path the harness does not own: it cannot hold its answers to see what the initiator "
                     "issues before they arrive")
    unseen = []
    for prev, nxt in itertools.pairwise(ops):
        after = bed.answered_before(prev, nxt)
        if after is None:
            unseen.append(f"step {nxt.step}")
            continue
        check(after, f"the read of {nxt.to:#x} (STag {nxt.stag:#x}) reached the harness target while its answer to "
              f"the previous read ({prev.to:#x}) was still held back ({witness.hold_s * 1000:g} ms): the initiator "
              "issued it before that read completed", req=req)
    if unseen:
        inconclusive(f"the harness target did not see the initiator's read requests at {unseen} enter the wire: "
                     "their order against the previous reads' completions is not observable")
    evidence.note(f"{req}: judged over the wire: each of {len(ops)} reads reached the harness target only after "
                  f"its answer to the previous one had left, each answer held back {witness.hold_s * 1000:g} ms")


@pytest.mark.req("KBTP-DLOAD-SEQUENCE", "KBTP-TABLE-ADDRESS", "KBTP-HELLO-FIRST")
def test_direct_load_sequence(kbtp_initiator: InitiatorUnderTest, seed: int) -> None:
    """A direct load reads the handle's entry (at the table address rule's offset), then the block at the
    entry's Block Offset, then the entry again, each read issued after the previous one completed, and
    returns the block's data."""
    kbtp_initiator.require(DL)
    bed = kbtp_initiator.bed(seed, label="direct-load-sequence")
    bed.witness_order()  # over a wire: the order of its reads is judged from the target's end
    ep = bed.endpoint
    data = bed.fit(b"direct" * 20)
    bed.allocates()

    def scenario() -> Gen:
        yield from _hello(bed, DL)
        r = yield from bed.op(ep.alloc_store(ep.handle_base + 3, data, seal=True))
        expect.status_is(r, Status.OK, req="KBTP-DLOAD-SEQUENCE", what="ALLOC_STORE")
        d = yield from bed.op(ep.direct_load(ep.handle_base + 3, 4096))
        expect.status_is(d, Status.OK, req="KBTP-DLOAD-SEQUENCE", what="direct load of a sealed block")
        expect.equal("direct-loaded data", d.data, data, req="KBTP-DLOAD-SEQUENCE")
        return r

    r = bed.run_one(scenario())
    bed.settle(req="KBTP-DLOAD-SEQUENCE")
    ack = _granted(bed, "KBTP-DLOAD-SEQUENCE")
    dl = ack.direct_load
    if dl is None:
        raise HarnessBug("the harness target granted DIRECT_LOAD without its descriptors")
    entry_to = dl.table.tagged_offset + TABLE_ENTRY_SIZE * (ack.handle_base + 3 - dl.table_base_handle)
    reads = [op for op in bed.remote_ops() if op.kind == "rdma_read"]
    check(bool(reads) and (reads[0].stag, reads[0].to) == (dl.table.stag, entry_to),
          "the first read of the direct load is not of the entry the table address rule names",
          req="KBTP-TABLE-ADDRESS", seen=[(hex(op.stag), hex(op.to)) for op in reads[:1]],
          expected=(hex(dl.table.stag), hex(entry_to)))
    shape = [("table" if op.stag == dl.table.stag else "pool" if op.stag == dl.pool.stag else hex(op.stag), op.to)
             for op in reads]
    want = [("table", entry_to), ("pool", r.block_offset), ("table", entry_to)]
    expect.equal("RDMA Reads of the direct load (STag, Tagged Offset)", shape, want, req="KBTP-DLOAD-SEQUENCE")
    _reads_in_order(bed, reads, "KBTP-DLOAD-SEQUENCE")


RACE_WINDOWS_NEEDED = 1  # direct loads that a free really raced, for the race to count as exercised
ENTRY_READ_WAIT_S = 5.0  # over a wire, H waits this long at most for the initiator's next entry read


@dataclass
class RaceRun:
    """One interleaving of the direct-load race: loads accepted, and how many of its direct loads a free and the
    next re-allocation landed within (between the initiator's first entry read and its second, as the harness
    target executed them: the two reads show the handle bound under different Generations)."""

    accepted: int = 0
    loads: int = 0
    opened: int = 0


@pytest.mark.req("KBTP-DLOAD-VALIDITY", "KBTP-FREE-DETECT", "KBTP-HELLO-FIRST")
def test_direct_load_detects_free(kbtp_initiator: InitiatorUnderTest, session_seed: int) -> None:
    """The initiator direct-loads a handle another party frees and re-allocates with other data, under
    seeded interleavings: data it accepts is exactly what was stored under the Generation it reports, a direct
    load whose entry reads a free and a re-allocation landed between is not accepted, and a direct load started
    after the last free (the entry unbound) is not accepted. The race counts only where it happened: a direct
    load whose Generation changed between its entry reads (black box: window opened n of N direct loads), else
    inconclusive."""
    kbtp_initiator.require(DL)
    runs = [_direct_load_race(kbtp_initiator, session_seed * 1000 + i, i) for i in range(kbtp_initiator.interleavings)]
    accepted = sum(r.accepted for r in runs)
    opened, loads = sum(r.opened for r in runs), sum(r.loads for r in runs)
    summary = (f"black box: window opened {opened} of {loads} direct loads (a free and a re-allocation landed between "
               f"the initiator's two entry reads) in {len(runs)} interleavings")
    evidence.note(summary)
    if opened < RACE_WINDOWS_NEEDED:
        inconclusive(f"{summary}: the validity rule was not exercised ({RACE_WINDOWS_NEEDED} needed)")
    if not accepted:
        inconclusive(f"no direct load was accepted in {len(runs)} interleavings: the validity rule was not exercised")
    pass_basis(summary)


def _at_least(seen: list[Any], n: int) -> bool:
    return len(seen) >= n


def _read_groups(bed: InitiatorBed) -> list[tuple[int, int | None]] | None:
    """The initiator's direct loads as the harness target executed their reads: (step of the first entry read,
    step of the second or None where it stopped after the first), in order; None when its reads are not entry,
    block, entry (test_direct_load_sequence judges that) and cannot be matched to its direct loads."""
    ack = bed.ack
    dl = ack.direct_load if ack is not None else None
    if dl is None:
        return None
    reads = [op for op in bed.remote_ops() if op.kind == "rdma_read"]
    groups: list[tuple[int, int | None]] = []
    i = 0
    while i < len(reads):
        if reads[i].stag != dl.table.stag:
            return None
        if i + 1 < len(reads) and reads[i + 1].stag == dl.pool.stag:
            if i + 2 >= len(reads) or reads[i + 2].stag != dl.table.stag:
                return None
            groups.append((reads[i].step, reads[i + 2].step))
            i += 3
        else:
            groups.append((reads[i].step, None))
            i += 1
    return groups


def _direct_load_race(kbtp_initiator: InitiatorUnderTest, seed: int, i: int) -> RaceRun:
    """One interleaving: harness party H binds, re-binds and frees a handle while the initiator under test
    direct-loads it; each accepted direct load is checked against H's data, and each a free and a re-allocation
    landed within must not have been accepted."""
    # The harness's own target: with room for its second party H whatever the declared geometry.
    t = kbtp_initiator.target_params
    shared = max(t.shared_count, 2 * max(1, t.quota))
    bed = kbtp_initiator.bed(seed, label=f"direct-load-race-{i}", scheduler=PctScheduler(seed, depth=4, horizon=600),
                             max_initiators=max(2, t.max_initiators), shared_blocks=shared, ring_slots=None,
                             blocks=max(t.blocks, shared + 2 * max(1, t.quota)))
    # Over a wire each answer to the initiator is held a while (targets/kbtp_order.py), and H frees and re-allocates
    # as soon as one of its entry reads reaches the harness target: the free lands while that read's answer is held,
    # before the read that follows. On the emulated fabric the scheduler's interleavings place it instead.
    witness = bed.witness_order()
    ep = bed.endpoint
    owner = bed.harness_client("H")
    stored: dict[int, bytes] = {}
    results: list[Any] = []
    state = {"handle": 0, "done": False}
    # the fabric's step count just before H sent each FREE (ALLOC_STORE) and just after its COMPLETION came: the
    # harness target applied it in between, so a read executed at a step <= the first came before it, and one at a
    # step > the second after it
    frees: list[tuple[int, int]] = []
    binds: list[tuple[int, int]] = []

    def entry_reads() -> Gen:
        """Stamps of the initiator's entry reads as they reach the harness target (None: not watchable here)."""
        if witness is None:
            return None
        yield from wait_until(lambda: bed.ack is not None, "R-session", timeout=ENTRY_READ_WAIT_S)
        dl = bed.ack.direct_load if bed.ack is not None else None
        if dl is None:
            return None
        return witness.watch_reads(bed.tnode.connection(bed.target_conn), dl.table.stag)

    def churn() -> Gen:
        yield from owner.hello(Features(0))
        h = owner.handle(0)
        state["handle"] = h
        arrived = yield from entry_reads()
        for k in range(6):
            data = bytes([0x40 + k]) * (64 + 16 * k)
            before = bed.fabric.steps
            a = yield from owner.alloc_store(h, data)
            binds.append((before, bed.fabric.steps))
            stored[a.generation] = data
            if arrived is None:
                yield from pause("H-bound")
            else:
                # odd cycles race: the free and the next ALLOC_STORE land behind one entry read; even ones stay
                # bound for three, of which two are the entry reads of one whole direct load (it may accept it)
                n = len(arrived) + (1 if k % 2 else 3)
                # (bounded: an initiator that stops reading only ends the churn sooner)
                yield from wait_until(partial(_at_least, arrived, n), "R-entry-read", timeout=ENTRY_READ_WAIT_S)
            before = bed.fabric.steps
            yield from owner.free(h)
            frees.append((before, bed.fabric.steps))
        state["done"] = True

    def reader() -> Gen:
        yield from _hello(bed, DL)
        while not state["handle"]:
            yield from pause("wait-handle")
        while not state["done"]:
            d = yield from bed.op(ep.direct_load(state["handle"], 4096))
            results.append(d)
        last = yield from bed.op(ep.direct_load(state["handle"], 4096))
        results.append(last)
        check(last.status != Status.OK, "a direct load after the handle was freed was accepted",
              req="KBTP-FREE-DETECT", seen=expect.status_name(last.status), expected="not OK")

    bed.run(H=churn(), R=reader())
    bed.settle(req="KBTP-DLOAD-VALIDITY")
    accepted = [d for d in results if d.status == Status.OK]
    for d in accepted:
        want = stored.get(d.generation)
        shown = d.data[:6].hex() if d.data else None
        check(d.data == want, f"interleaving {i}: the initiator accepted {shown}... as Generation "
              f"{d.generation}, whose data is {want[:6].hex() if want else None}... [{bed.hint()}]",
              req="KBTP-DLOAD-VALIDITY")
    run = RaceRun(len(accepted), len(results))
    groups = _read_groups(bed)
    if groups is None or len(groups) != len(results):
        return run  # its loads cannot be matched to their reads: no window counted
    for n, ((first, second), d) in enumerate(zip(groups, results, strict=True)):
        if second is None:
            continue
        raced = [k for k, (before, after) in enumerate(frees) if first <= before and after < second]
        # a free and the next ALLOC_STORE both between the entry reads: the two reads show different Generations
        rebound = [k for k in raced if k + 1 < len(binds) and binds[k + 1][1] < second]
        run.opened += bool(rebound)
        check(not rebound or d.status != Status.OK,
              f"interleaving {i}: direct load {n} was accepted although the handle was freed and re-allocated "
              f"between its two entry reads (steps {first} and {second}): its Generation changed [{bed.hint()}]",
              req="KBTP-DLOAD-VALIDITY", seen=expect.status_name(d.status), expected="not OK")
    return run


# ---- direct allocations, run once and judged by each check ------------------------------------------------


# The harness target's Head starts one lap (N tickets) below the 32-bit wrap, so the N + 2 allocations cross
# it (..., 2^32 - 1, 0, 1): an initiator that keeps tickets narrower or signed fails there (principle 8).
TICKETS_BEFORE_WRAP = 1  # rounded up to a whole lap of the ring


@dataclass
class AllocRun:
    """N + 2 direct allocations of the initiator under test, each loaded and freed, the first ticket N below the
    32-bit wrap."""

    bed: InitiatorBed
    ack: HelloAck
    da: DirectAlloc
    count: int
    binds: list[tuple[int, Bind]]
    masked: bool
    first_ticket: int
    statuses: list[int]  # of each direct allocation, as the initiator reported it

    @property
    def ops(self) -> list[RemoteOp]:
        """The initiator's one-sided operations (inconclusive where the harness's target cannot see them)."""
        return self.bed.remote_ops()

    def ticket(self, k: int) -> int:
        """The ticket of allocation k (they are consecutive modulo 2^32 from the Head's first one)."""
        return (self.first_ticket + k) % TICKET_MODULUS

    def session(self) -> None:
        """The initiator had its session (a check's own assertion of it, wherever the run happened)."""
        check(self.bed.ack is not None, "the initiator never obtained a session", req="KBTP-HELLO-FIRST")

    def per_allocation(self) -> list[tuple[int, Bind, list[RemoteOp]]]:
        """For each BIND (in order), its ticket and the one-sided operations since the previous BIND."""
        out, cursor, ops = [], 0, self.ops
        for k, (step, bind) in enumerate(self.binds):
            mine = [op for op in ops[cursor:] if op.step < step]
            cursor += len(mine)
            out.append((k, bind, mine))
        return out


@pytest.fixture(scope="module")
def alloc_run(kbtp_initiator: InitiatorUnderTest, session_seed: int) -> AllocRun:
    kbtp_initiator.require(DA)
    bed = kbtp_initiator.bed(session_seed, label="direct-alloc", tickets_before_wrap=TICKETS_BEFORE_WRAP)
    bed.witness_order()  # over a wire: the order of its slot reads is judged from the target's end
    ep = bed.endpoint
    count = {"n": 0}
    statuses: list[int] = []

    def scenario() -> Gen:
        yield from _hello(bed, DA)
        ack: HelloAck = bed.ack  # type: ignore[assignment]
        count["n"] = ack.direct_alloc.ring.count + 2  # type: ignore[union-attr]
        for i in range(count["n"]):
            data = bed.fit(bytes([0x60 + i]) * (40 + i))
            r = yield from bed.op(ep.direct_alloc(ep.handle_base + i, data))
            statuses.append(int(r.status))
            yield from bed.op(ep.load(ep.handle_base + i, 4096, allow_unsealed=True))
            yield from bed.op(ep.free(ep.handle_base + i))

    bed.run_one(scenario())
    ack: HelloAck = bed.ack  # type: ignore[assignment]
    binds = [(rec.step, rec.message) for rec in bed.messages() if isinstance(rec.message, Bind)]
    return AllocRun(bed, ack, ack.direct_alloc, count["n"], binds,  # type: ignore[arg-type]
                    kbtp_initiator.target_params.profile.masked_atomics, bed.target.first_ticket,
                    statuses)


@pytest.mark.req("KBTP-DALLOC-FETCHADD", "KBTP-HELLO-FIRST")
def test_direct_alloc_fetchadd(alloc_run: AllocRun) -> None:
    """Each direct allocation performs one FetchAdd on its Head with the ring's Add Data and Add Mask (masked
    per RFC 7306, or the unmasked InfiniBand form), before its BIND."""
    alloc_run.session()
    run, n = alloc_run, alloc_run.da.ring.count
    atomics = [eff for rec in run.bed.observed("the initiator's FetchAdds") for eff in rec["effects"]
               if eff.get("do") == "fetch_add"]
    expect.equal("FetchAdds on the Head", len(atomics), run.count, req="KBTP-DALLOC-FETCHADD")
    add = 0x0000_0001_0000_0010 if run.masked else 0x0000_0001_0000_0000
    mask = ((1 << 63) | (1 << 31) | (1 << (n.bit_length() - 1 + 3))) if run.masked else 0
    for k, eff in enumerate(atomics):
        expect.equal(f"Head after FetchAdd {k} (from {int(eff['orig']):#x})", int(eff["new"]),
                     masked_add(int(eff["orig"]), add, mask), req="KBTP-DALLOC-FETCHADD")
    for k, _, mine in run.per_allocation():
        fas = [op for op in mine if op.kind == "fetch_add"]
        expect.equal(f"allocation {k}: FetchAdds before its BIND", len(fas), 1, req="KBTP-DALLOC-FETCHADD")
        expect.equal(f"allocation {k}: FetchAdd target", (fas[0].stag, fas[0].to),
                     (run.da.head.stag, run.da.head.tagged_offset), req="KBTP-DALLOC-FETCHADD")
    run.bed.settle(req="KBTP-DALLOC-FETCHADD")


@pytest.mark.req("KBTP-DALLOC-SLOT-READ", "KBTP-HELLO-FIRST")
def test_direct_alloc_slot_reads(alloc_run: AllocRun) -> None:
    """Each direct allocation reads the slot of its ticket (16 * (ticket mod N): the ring wraps), until it shows
    the ticket, then once more to confirm, each read after the previous one completed."""
    alloc_run.session()
    run, n = alloc_run, alloc_run.da.ring.count
    for k, _, mine in run.per_allocation():
        slot_to = run.da.ring.tagged_offset + RING_SLOT_SIZE * (k % n)
        reads = [op for op in mine if op.kind == "rdma_read" and op.stag == run.da.ring.stag]
        check(len(reads) >= 2, f"allocation {k} (ticket {run.ticket(k):#x}): {len(reads)} slot read(s), expected at "
              "least two (one showing the ticket, one confirming it)", req="KBTP-DALLOC-SLOT-READ")
        check(all(op.to == slot_to for op in reads), f"allocation {k} (ticket {run.ticket(k):#x}): slot reads at "
              f"{[hex(op.to) for op in reads]}, expected all at {slot_to:#x} (slot {k % n}, wrapping after N = {n})",
              req="KBTP-DALLOC-SLOT-READ")
        _reads_in_order(run.bed, reads, "KBTP-DALLOC-SLOT-READ")
    run.bed.settle(req="KBTP-DALLOC-SLOT-READ")


@pytest.mark.req("KBTP-DALLOC-WRITE-THEN-BIND", "KBTP-BIND-LAYOUT", "KBTP-HELLO-FIRST")
def test_direct_alloc_write_then_bind(alloc_run: AllocRun) -> None:
    """Each direct allocation writes its data into the block once, after the slot reads, then sends BIND
    with its ticket, the written block's offset and the data length."""
    alloc_run.session()
    run = alloc_run
    expect.equal("BIND messages", len(run.binds), run.count, req="KBTP-DALLOC-WRITE-THEN-BIND")
    for k, bind, mine in run.per_allocation():
        slot_reads = [op for op in mine if op.kind == "rdma_read" and op.stag == run.da.ring.stag]
        writes = [op for op in mine if op.kind == "write" and op.stag == run.da.partition.stag]
        check(len(writes) == 1 and all(writes[0].step > op.step for op in slot_reads),
              f"allocation {k}: partition writes {[(hex(w.to), w.step) for w in writes]} are not one write after "
              "the slot reads, before the BIND", req="KBTP-DALLOC-WRITE-THEN-BIND")
        expect.equal(f"allocation {k}: BIND Opcode", bind.OPCODE, Opcode.BIND, req="KBTP-BIND-LAYOUT")
        expect.equal(f"allocation {k}: BIND Ticket", bind.ticket, run.ticket(k), req="KBTP-BIND-LAYOUT")
        expect.equal(f"allocation {k}: BIND Block Offset (the written block)", bind.block_offset, writes[0].to,
                     req="KBTP-BIND-LAYOUT")
        expect.equal(f"allocation {k}: BIND Data Length", bind.data_length,
                     len(run.bed.fit(bytes(40 + k))), req="KBTP-BIND-LAYOUT")
    run.bed.settle(req="KBTP-DALLOC-WRITE-THEN-BIND")


@pytest.mark.req("KBTP-DALLOC-NO-SLOT-WRITE", "KBTP-RING-FETCHADD", "KBTP-RING-COUNTER-NO-READ", "KBTP-HELLO-FIRST")
def test_direct_alloc_leaves_the_ring_alone(alloc_run: AllocRun) -> None:
    """The initiator never writes a ring slot, modifies its Head only with FetchAdd (never an RDMA Write), and
    never reads the Head with RDMA Read."""
    alloc_run.session()
    run = alloc_run
    for reason in run.bed.terminations():
        check(False, f"the initiator's connection was terminated: {reason}", req="KBTP-DALLOC-NO-SLOT-WRITE")
    for op in run.ops:
        check(not (op.kind == "write" and op.stag == run.da.ring.stag), f"RDMA Write to the ring at {op.to:#x}",
              req="KBTP-DALLOC-NO-SLOT-WRITE")
        check(not (op.kind == "write" and op.stag == run.da.head.stag), "RDMA Write to the Head counter",
              req="KBTP-RING-FETCHADD")
        check(not (op.kind == "rdma_read" and op.stag == run.da.head.stag), "RDMA Read of the Head counter",
              req="KBTP-RING-COUNTER-NO-READ")
    run.bed.settle(req="KBTP-DALLOC-NO-SLOT-WRITE")


@pytest.mark.req("KBTP-DALLOC-FREE", "KBTP-HELLO-FIRST")
def test_direct_alloc_frees(alloc_run: AllocRun) -> None:
    """Blocks bound by direct allocation are freed with FREE, one per allocation."""
    alloc_run.session()
    run = alloc_run
    frees = [rec.message for rec in run.bed.messages() if isinstance(rec.message, Free)]
    expect.equal("FREE messages for direct-allocated handles", len(frees), run.count, req="KBTP-DALLOC-FREE")
    run.bed.settle(req="KBTP-DALLOC-FREE")


@pytest.mark.req("KBTP-RING-COUNTER-FIELDS", "KBTP-RING-WRAP", "KBTP-HELLO-FIRST")
def test_direct_alloc_ticket_wrap(alloc_run: AllocRun) -> None:
    """The harness target's Head starts a lap below the 32-bit wrap, so the direct allocations take tickets
    2^32 - N, ..., 2^32 - 1, 0, 1: each BIND carries the whole 32-bit Ticket its FetchAdd returned (bits 63-32,
    its top bit set or not), and the allocations after the wrap are bound like those before it."""
    alloc_run.session()
    run = alloc_run
    taken = [int(eff["orig"]) for rec in run.bed.observed("the Tickets the initiator's FetchAdds took")
             for eff in rec["effects"] if eff.get("do") == "fetch_add"]
    tickets = [orig >> 32 & 0xFFFF_FFFF for orig in taken]
    if not (any(t >= 1 << 31 for t in tickets) and 0 in tickets):
        inconclusive(f"the initiator's tickets {[hex(t) for t in tickets]} did not cross the 32-bit wrap from "
                     f"{run.first_ticket:#x}: the boundary was not reached")
    bound = [bind.ticket for _, bind in run.binds]
    for k, (orig, t) in enumerate(zip(taken, tickets, strict=True)):
        refused = [(j, expect.status_name(st)) for j, st in enumerate(run.statuses[:k]) if st != Status.OK]
        if t not in bound and refused:  # the ring held no block for it: an earlier failure, judged by its own rule
            inconclusive(f"allocation {k} (Ticket {t:#010x}) cannot be judged: earlier allocations failed {refused}")
        check(t in bound, f"allocation {k}: its FetchAdd returned Ticket {t:#010x} (Head {orig:#018x}), and no BIND "
              f"carried it (BIND Tickets: {[hex(b) for b in bound]})", req="KBTP-RING-COUNTER-FIELDS")
    ok = run.bed.target.counters.count(Opcode.BIND, Status.OK)
    expect.equal(f"BINDs completed OK of {run.count} allocations across the wrap", ok, run.count, req="KBTP-RING-WRAP")
    run.bed.settle(req="KBTP-RING-WRAP")


@pytest.mark.req("KBTP-HANDLE-OWN-RANGE", "KBTP-HELLO-FIRST")
def test_direct_alloc_binds_in_own_range(alloc_run: AllocRun) -> None:
    """Every BIND (the direct allocation's way to bind a handle) names a handle of the initiator's own range,
    like its ALLOC_STOREs (test_requests_in_own_range)."""
    alloc_run.session()
    run = alloc_run
    lo, hi = run.ack.handle_base, run.ack.handle_base + run.ack.handle_count
    if not run.binds:
        inconclusive("the initiator sent no BIND: the rule was not exercised on it")
    for k, (_, bind) in enumerate(run.binds):
        check(lo <= bind.handle < hi, f"BIND {k} names handle {bind.handle:#x}, outside the range [{lo:#x}, {hi:#x})",
              req="KBTP-HANDLE-OWN-RANGE")
    run.bed.settle(req="KBTP-HANDLE-OWN-RANGE")


@pytest.mark.req("KBTP-DLOAD-VALIDITY", "KBTP-HELLO-FIRST")
def test_direct_load_refuses_unsealed(kbtp_initiator: InitiatorUnderTest, seed: int) -> None:
    """The entry classes a direct load can read: VALID without SEALED (an unsealed block) and unbound are not
    accepted; VALID and SEALED is, with the block's data (the Generation change is test_direct_load_detects_free's
    class)."""
    kbtp_initiator.require(DL)
    bed = kbtp_initiator.bed(seed, label="direct-load-unsealed")
    ep = bed.endpoint
    h = {"handle": 0}
    unsealed, sealed = bed.fit(b"unsealed" * 8), bed.fit(b"sealed" * 8)
    bed.allocates()

    def scenario() -> Gen:
        yield from _hello(bed, DL)
        h["handle"] = ep.handle_base + 5
        unbound = yield from bed.op(ep.direct_load(h["handle"], 4096))
        check(unbound.status != Status.OK, "a direct load of an unbound handle (entry not VALID) was accepted",
              req="KBTP-DLOAD-VALIDITY", seen=expect.status_name(unbound.status), expected="not OK")
        r = yield from bed.op(ep.alloc_store(h["handle"], unsealed, seal=False))
        expect.status_is(r, Status.OK, req="KBTP-DLOAD-VALIDITY", what="ALLOC_STORE (unsealed)")
        d = yield from bed.op(ep.direct_load(h["handle"], 4096))
        check(d.status != Status.OK, "a direct load of an unsealed block (entry VALID, not SEALED) was accepted",
              req="KBTP-DLOAD-VALIDITY", seen=expect.status_name(d.status), expected="not OK")
        r = yield from bed.op(ep.store(h["handle"], sealed, seal=True))
        expect.status_is(r, Status.OK, req="KBTP-DLOAD-VALIDITY", what="STORE sealing the block")
        d = yield from bed.op(ep.direct_load(h["handle"], 4096))
        expect.status_is(d, Status.OK, req="KBTP-DLOAD-VALIDITY", what="direct load of the sealed block")
        expect.equal("direct-loaded data of the sealed block", d.data, sealed, req="KBTP-DLOAD-VALIDITY")

    bed.run_one(scenario())
    bed.settle(req="KBTP-DLOAD-VALIDITY")
