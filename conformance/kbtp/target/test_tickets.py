"""kbtp-target: DIRECT_ALLOC tickets that are not bound in time (KBTP "Allocation Quotas": Ticket Timeout,
reclaim, TICKET_ABANDONED, quota release), including BINDs that race the timeout.

The target may fence an abandoned ticket by invalidating the Partition STag or by terminating the
connection; both are accepted, and after a termination the same initiator reconnects (its bindings are
retained) to look at the rest."""

from __future__ import annotations

import pytest

from kvconform import evidence
from kvconform.conformance.kbtp import expect, hangs
from kvconform.conformance.kbtp.blackbox import repetitions
from kvconform.fixtures.kbtp import TargetUnderTest
from kvconform.kbtp.constants import Features, RequestFlags, Status
from kvconform.kbtp.messages import HelloAck
from kvconform.kbtp.ring import TICKET_MODULUS
from kvconform.rdma import sleep
from kvconform.targets.kbtp_bed import Bed
from kvconform.targets.kbtp_client import RING_SLOT_SIZE, Ended, Gen, HarnessInitiator, pattern
from kvconform.verdicts import check, check_one_of, inconclusive, not_applicable

DA = Features.DIRECT_ALLOC
UNSEALED_OK = int(RequestFlags.ALLOW_UNSEALED)
R_SLOT = "KBTP-RING-ALLOC-WAIT"  # the ticket's slot shows its block
R_ABANDONED = "KBTP-TICKET-ABANDONED"
# what a BIND accepted for an abandoned ticket leaves in a target that keeps its rings between checks (hangs.lost_block)
BOUND_AND_RECLAIMED = ("this target process accepted a BIND for a ticket withheld past the Ticket Timeout, whose block "
                       "the reclaim returns to the ring")


def _open(bed: Bed, ini: HarnessInitiator) -> Gen:
    ack = yield from bed.open(ini, DA)
    if not Features(ack.features) & DA:
        inconclusive(f"HELLO_ACK Features {Features(ack.features)!r} lack DIRECT_ALLOC, which PICS declares "
                     "(test_ack_features_match_pics judges that); this check needs it")
    return ack


def _fill_quota(ini: HarnessInitiator, first: int, count: int, req: str, what: str, *, wait: str = "") -> Gen:
    """``count`` target-executed allocations that must all succeed (``req``; ``wait``: what says they complete,
    ``req`` too unless given)."""
    for i in range(count):
        r = yield from ini.alloc_store(ini.handle(first + i), pattern(first + i, 24), req=wait or req)
        expect.status_is(r, Status.OK, req=req, what=f"{what}: ALLOC_STORE {i + 1} of {count}")


def _bound_in_time(ini: HarnessInitiator, ack: HelloAck) -> Gen:
    """Take a ticket, write its block and BIND it at half the Ticket Timeout; the BIND's reply."""
    t0, s0 = yield from ini.take_ticket()
    b0 = yield from ini.await_slot(t0, s0, req=R_SLOT)
    yield from sleep(ack.ticket_timeout_ms / 1000.0 * 0.5)
    # Within the Ticket Timeout the ticket is not abandoned, so the partition still takes the write.
    wc = yield from ini.write_block(b0, b"on time!" * 3, req="KBTP-TICKET-TIMEOUT")
    check(wc.ok, f"RDMA Write into the partition at half the Ticket Timeout failed: {wc.status.name}",
          req="KBTP-TICKET-TIMEOUT")
    reply = yield from ini.bind(ini.handle(0), t0, 24, b0, req="KBTP-TICKET-TIMEOUT")
    return reply


@pytest.mark.req("KBTP-TICKET-TIMEOUT", "KBTP-HELLO-FIRST", "KBTP-RDMAP-ATOMICS", "KBTP-RING-ALLOC-WAIT",
                 "KBTP-LOAD-COMPLETE")
def test_bind_within_timeout(kbtp_target: TargetUnderTest, seed: int) -> None:
    """A ticket bound within the Ticket Timeout (at half of it) is not abandoned: its BIND completes OK and
    the handle loads the data written into the block."""
    kbtp_target.require(DA)
    bed = kbtp_target.bed(seed, label="bind-in-time")
    a = bed.initiator("A")

    def scenario() -> Gen:
        ack = yield from _open(bed, a)
        reply = yield from _bound_in_time(a, ack)
        expect.status_is(reply, Status.OK, req="KBTP-TICKET-TIMEOUT", what="BIND at half the Ticket Timeout")
        lr, got = yield from a.load(a.handle(0), 24, flags=UNSEALED_OK)
        expect.status_is(lr, Status.OK, req="KBTP-TICKET-TIMEOUT", what="LOAD of the handle bound in time")
        expect.equal("data of the handle bound in time", got, b"on time!" * 3, req="KBTP-TICKET-TIMEOUT")

    bed.run_one(scenario())


@pytest.mark.req("KBTP-TICKET-ABANDONED", "KBTP-TICKET-RECLAIM-FENCE", "KBTP-HELLO-FIRST", "KBTP-RDMAP-ATOMICS",
                 "KBTP-RING-ALLOC-WAIT")
def test_late_bind_refused(kbtp_target: TargetUnderTest, seed: int) -> None:
    """A ticket withheld past the Ticket Timeout is abandoned: a late BIND gets TICKET_ABANDONED, and no RDMA
    Write of the initiator reaches its block any more (the Partition STag is invalidated, or the connection
    is gone). When the fence ended the connection, the late BIND comes on the initiator's next session (same
    Initiator ID, its tickets' ring kept), where nothing but TICKET_ABANDONED answers it."""
    kbtp_target.require(DA)
    bed = kbtp_target.bed(seed, label="late-bind")
    a = bed.initiator("A")

    def scenario() -> Gen:
        ack = yield from _open(bed, a)
        t1, s1 = yield from a.take_ticket()
        b1 = yield from a.await_slot(t1, s1, req=R_SLOT)
        yield from sleep(ack.ticket_timeout_ms / 1000.0 * 1.5)
        # The late BIND first: the connection may not survive the write attempt below. After a fence that ended the
        # connection it comes on the next session, where the connection has no reason to end.
        late, accepted, where = a, {"TICKET_ABANDONED", "connection ended"}, "BIND after the Ticket Timeout"
        if a.broken:
            late, accepted = (yield from bed.reconnect(a, DA)), {"TICKET_ABANDONED"}
            where += " (on the next session: the fence ended the connection)"
        if not Features(late.ack.features) & DA:  # KBTP-TICKET-ABANDONED stays not-reached
            evidence.note("the session after the fence was not granted DIRECT_ALLOC: no BIND was sent")
        else:
            r = yield from late.bind(late.handle(1), t1, 24, b1, req="KBTP-TICKET-ABANDONED", allow_end=True)
            outcome = "connection ended" if isinstance(r, Ended) else expect.status_name(r.status)
            if outcome == "OK":
                hangs.lost_block(kbtp_target, R_ABANDONED, BOUND_AND_RECLAIMED)
            check_one_of(outcome, accepted, what=where, req="KBTP-TICKET-ABANDONED")
        reached = False
        if not a.broken:
            wc = yield from a.write_block(b1, b"too late" * 3, req="KBTP-TICKET-RECLAIM-FENCE")
            reached = wc.ok
        check(not reached, f"after the Ticket Timeout an RDMA Write through the Partition STag still reached block "
              f"{b1:#x}", req="KBTP-TICKET-RECLAIM-FENCE")

    bed.run_one(scenario())


@pytest.mark.req("KBTP-TICKET-RECLAIM", "KBTP-QUOTA-RELEASE", "KBTP-HELLO-FIRST", "KBTP-RDMAP-ATOMICS",
                 "KBTP-RING-ALLOC-WAIT")
def test_reclaimed_ticket_comes_back(kbtp_target: TargetUnderTest, seed: int) -> None:
    """An abandoned ticket's block goes back to the ring with a new ticket (the Tail's next: it shows in that
    ticket's slot, read on the next session when the fence ended the connection) and its quota unit comes back: the
    whole quota allocates again."""
    kbtp_target.require(DA)
    bed = kbtp_target.bed(seed, label="reclaim")
    a = bed.initiator("A")

    def scenario() -> Gen:
        ack = yield from _open(bed, a)
        da = a.ack.direct_alloc
        if da is None:
            not_applicable("no DIRECT_ALLOC descriptors")
        q, n = ack.allocation_quota, da.ring.count
        t, s = yield from a.take_ticket()
        block = yield from a.await_slot(t, s, req=R_SLOT)
        yield from sleep(ack.ticket_timeout_ms / 1000.0 * 2)
        # A fence that ended the connection leaves the ring to the next session's Ring descriptor (same Initiator ID,
        # same partition: its bindings and tickets are kept).
        user = (yield from bed.reconnect(a, DA)) if a.broken else a
        ring = user.ack.direct_alloc.ring if user.ack.direct_alloc is not None else None
        if ring is None:  # KBTP-TICKET-RECLAIM stays not-reached: nothing of it was observed
            evidence.note("the session after the fence was not granted DIRECT_ALLOC: its ring is not readable")
        else:
            # Nothing was freed, so the reclaim's return takes the Tail ticket: q above the session's first Head
            # ticket (its partition's q blocks were free), q itself on a fresh target.
            u = (t + q) % TICKET_MODULUS
            slot = yield from user.read_slot(ring.stag, ring.tagged_offset, RING_SLOT_SIZE * (u % n),
                                             req="KBTP-TICKET-RECLAIM")
            if slot is not None:  # the Ring STag is gone when the fence invalidated every window
                expect.equal(f"slot {u % n} (Tail ticket {u}) after the reclaim (Sequence, Block Offset)", slot,
                             (u, block), req="KBTP-TICKET-RECLAIM")
        yield from _fill_quota(user, 10, q, "KBTP-QUOTA-RELEASE", "after the reclaim")

    bed.run_one(scenario())


@pytest.mark.req("KBTP-QUOTA-USAGE", "KBTP-QUOTA-RELEASE", "KBTP-HELLO-FIRST", "KBTP-RDMAP-ATOMICS",
                 "KBTP-RING-ALLOC-WAIT")
def test_unbound_tickets_count_in_usage(kbtp_target: TargetUnderTest, seed: int) -> None:
    """Tickets taken and not bound count in the usage: with the whole quota taken as tickets, an
    ALLOC_STORE completes NO_SPACE; once they are reclaimed the quota is free again."""
    kbtp_target.require(DA)
    bed = kbtp_target.bed(seed, label="ticket-usage")
    a = bed.initiator("A")

    def scenario() -> Gen:
        ack = yield from _open(bed, a)
        q = ack.allocation_quota
        for _ in range(q):
            t, s = yield from a.take_ticket()
            yield from a.await_slot(t, s, req=R_SLOT)
        r = yield from a.alloc_store(a.handle(0), b"over"[:ack.block_size], req="KBTP-QUOTA-USAGE", refused=True)
        expect.status_is(r, Status.NO_SPACE, req="KBTP-QUOTA-USAGE",
                         what=f"ALLOC_STORE with all {q} quota units held as unbound tickets")
        yield from sleep(ack.ticket_timeout_ms / 1000.0 * 2)
        user = (yield from bed.reconnect(a)) if a.broken else a
        yield from _fill_quota(user, 1, q, "KBTP-QUOTA-RELEASE", "after every ticket was reclaimed")

    bed.run_one(scenario())


@pytest.mark.req("KBTP-TICKET-ABANDONED", "KBTP-RING-NO-LOSS", "KBTP-QUOTA-RELEASE", "KBTP-HELLO-FIRST",
                 "KBTP-RDMAP-ATOMICS", "KBTP-RING-ALLOC-WAIT", "KBTP-LOAD-COMPLETE", "KBTP-FREE-RETURN")
@hangs.diagnosed_sharing
def test_bind_racing_the_timeout(kbtp_target: TargetUnderTest, session_seed: int) -> None:
    """A BIND sent around the Ticket Timeout, under seeded interleavings: it binds (OK) or is refused
    TICKET_ABANDONED (or the connection ends), never both, and either way no block is lost or handed out
    twice. A block lost or handed out twice is blamed on the ring rule the hang diagnosis names, or, on a target in
    another process, on a BIND an earlier check saw accepted for an abandoned ticket (conformance/kbtp/hangs.py).
    Each run waits one Ticket Timeout in real time against a black box (seconds, for a NIC): ``repetitions``."""
    kbtp_target.require(DA)
    runs = max(4, kbtp_target.interleavings // 5)
    outcomes: dict[str, int] = {}
    for i in repetitions(runs, kbtp_target.params, black_box=kbtp_target.black_box):
        outcome = _bind_race(kbtp_target, session_seed * 1000 + i, i)
        outcomes[outcome] = outcomes.get(outcome, 0) + 1
    evidence.record("note", "kbtp-bind-race", {**outcomes, "runs": sum(outcomes.values()), "of": runs})


def _bind_race(kbtp_target: TargetUnderTest, seed: int, i: int) -> str:
    """One interleaving of a BIND sent around the Ticket Timeout; returns its outcome."""
    bed = kbtp_target.bed(seed, label=f"bind-race-{i}")
    a = bed.initiator("A")

    def scenario() -> Gen:
        ack = yield from _open(bed, a)
        q = ack.allocation_quota
        t, s = yield from a.take_ticket()
        block = yield from a.await_slot(t, s, req=R_SLOT)
        # Around the deadline, in steps of 2 us of fabric time (a step is 1 us): the timeout lands before
        # the write, between the write and the BIND, or after the BIND, depending on the run.
        yield from sleep(ack.ticket_timeout_ms / 1000.0 - 2e-6 * (i % 16))
        data = b"raced" * 5
        outcome = "connection ended"
        if not a.broken:
            yield from a.write_block(block, data, req="KBTP-TICKET-ABANDONED")
        if not a.broken:
            r = yield from a.bind(a.handle(0), t, len(data), block, req="KBTP-TICKET-ABANDONED", allow_end=True)
            outcome = "connection ended" if isinstance(r, Ended) else expect.status_name(r.status)
        check_one_of(outcome, {"OK", "TICKET_ABANDONED", "connection ended"}, what="BIND racing the Ticket Timeout",
                     req="KBTP-TICKET-ABANDONED")
        if outcome == "OK" and not a.broken:
            # A reclaim leaves its mark: the block went back with Tail ticket u = t + q (the partition's q blocks
            # were free when the session took its first Head ticket t, and nothing was freed since; on a fresh
            # target t is 0, on a target in another process the partition may have served earlier sessions), so a
            # slot showing Sequence u means the ticket was reclaimed, and its BIND must not have been accepted.
            da = a.da
            u = (t + q) % TICKET_MODULUS
            mark = yield from a.read_slot(da.ring.stag, da.ring.tagged_offset, RING_SLOT_SIZE * (u % da.ring.count),
                                          req="KBTP-TICKET-ABANDONED")
            reclaimed = mark is not None and mark[0] == u
            if reclaimed:
                hangs.lost_block(kbtp_target, R_ABANDONED, BOUND_AND_RECLAIMED)
            check(not reclaimed, f"the BIND completed OK, but ticket {t} had been reclaimed: slot "
                  f"{u % da.ring.count} shows Tail ticket {u} (the reclaim's return of the block)",
                  req="KBTP-TICKET-ABANDONED", seen=mark)
        user = (yield from bed.reconnect(a)) if a.broken else a
        lr, got = yield from user.load(ack.handle_base, 64, flags=UNSEALED_OK)
        if outcome == "OK":
            expect.equal("data of the handle whose BIND completed OK", got, data, req="KBTP-TICKET-ABANDONED")
            free_units = q - 1
        else:
            expect.status_is(lr, Status.NOT_VALID, req="KBTP-TICKET-ABANDONED",
                             what="LOAD of the handle whose BIND was refused")
            free_units = q
        # Cycle the free units through the ring a few times, so a block that is both bound and back in the
        # ring (a BIND accepted for a reclaimed ticket) is handed out again.
        for round_ in range(3):
            yield from _fill_quota(user, 20, free_units, "KBTP-QUOTA-RELEASE", f"after the race ({outcome})",
                                   wait="KBTP-RING-NO-LOSS")  # a ticket the ring lost never gets its block
            if round_ < 2:
                for j in range(free_units):
                    f = yield from user.free(user.handle(20 + j))
                    expect.status_is(f, Status.OK, req="KBTP-FREE-RETURN", what="FREE after the race")
        if outcome == "OK":  # the bound block was not handed out again by the allocations above
            lr, got = yield from user.load(ack.handle_base, 64, flags=UNSEALED_OK)
            expect.equal("data of the handle bound at the deadline, after the quota was cycled", got, data,
                         req="KBTP-RING-NO-LOSS")
        return outcome

    outcome: str = bed.run_one(scenario())
    return outcome
