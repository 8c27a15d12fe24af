"""kbtp-target: DIRECT_ALLOC tickets that are not bound in time (KBTP "Allocation Quotas": Ticket Timeout,
reclaim, TICKET_ABANDONED, quota release), including BINDs that race the timeout."""

from __future__ import annotations

import pytest

from kvconform.conformance.kbtp import expect
from kvconform.conformance.kbtp.client import Gen, HarnessError, HarnessInitiator
from kvconform.fixtures import evidence
from kvconform.fixtures.kbtp import TargetUnderTest
from kvconform.kbtp.constants import Features, RequestFlags, Status
from kvconform.rdma import sleep
from kvconform.verdicts import not_applicable

DA = Features.DIRECT_ALLOC


def _open(ini: HarnessInitiator) -> Gen:
    ack = yield from ini.hello(DA)
    expect.holds(bool(Features(ack.features) & DA), "HELLO_ACK lacks DIRECT_ALLOC, which PICS declares",
                 req="KBTP-ACK-FEATURES")
    return ack


def _fill_quota(ini: HarnessInitiator, first: int, count: int, req: str, what: str) -> Gen:
    """``count`` target-executed allocations that must all succeed (the ring holds their blocks)."""
    assert ini.session is not None
    for i in range(count):
        r = yield from ini.alloc_store(ini.session.handle(first + i), bytes([first + i]) * 24)
        expect.status_is(r, Status.OK, req=req, what=f"{what}: ALLOC_STORE {i + 1} of {count}")
        _, got = yield from ini.load(ini.session.handle(first + i), 24)
        expect.equal(f"{what}: data of allocation {i + 1}", got, bytes([first + i]) * 24, req="KBTP-RING-NO-LOSS")


@pytest.mark.req("KBTP-TICKET-TIMEOUT", "KBTP-TICKET-RECLAIM-FENCE", "KBTP-TICKET-ABANDONED", "KBTP-TICKET-RECLAIM",
                 "KBTP-QUOTA-RELEASE", "KBTP-RING-NO-LOSS")
def test_withheld_bind_is_reclaimed(kbtp_target: TargetUnderTest, seed: int) -> None:
    """A ticket bound within the Ticket Timeout binds; a ticket withheld past it is reclaimed: the
    Partition STag no longer reaches the block (or the connection is gone), a late BIND gets
    TICKET_ABANDONED, and the block and the quota unit come back (the whole quota allocates again)."""
    kbtp_target.require(DA)
    bed = kbtp_target.bed(seed, label="withheld-bind")
    a = bed.initiator("A")

    def scenario() -> Gen:
        ack = yield from _open(a)
        assert a.session is not None and ack.direct_alloc is not None
        timeout_s = ack.ticket_timeout_ms / 1000.0
        q = ack.allocation_quota
        if q < 2:
            not_applicable(f"Allocation Quota {q}: the check needs one ticket bound and one withheld")
        t0, s0 = yield from a.take_ticket()
        b0 = yield from a.await_slot(t0, s0)
        yield from sleep(timeout_s * 0.5)
        wc = yield from a.write_block(b0, b"on time!" * 3)
        expect.holds(wc.ok, "write to the partition before the timeout failed", req="KBTP-TICKET-TIMEOUT")
        r = yield from a.bind(a.session.handle(0), t0, 24, b0)
        expect.status_is(r, Status.OK, req="KBTP-TICKET-TIMEOUT", what="BIND at half the Ticket Timeout")
        t1, s1 = yield from a.take_ticket()
        b1 = yield from a.await_slot(t1, s1)
        yield from sleep(timeout_s * 1.5)
        if not a.broken:
            # The late BIND first (the connection may not survive the write attempt below).
            r = yield from a.bind(a.session.handle(1), t1, 24, b1)
            expect.status_is(r, Status.TICKET_ABANDONED, req="KBTP-TICKET-ABANDONED", what="BIND after the timeout")
        if not a.broken:
            try:
                wc = yield from a.write_block(b1, b"too late" * 3)
                reached = wc.ok
            except HarnessError:
                reached = False
            expect.holds(not reached, f"after the Ticket Timeout an RDMA Write through the Partition STag still "
                         f"reached block {b1:#x}", req="KBTP-TICKET-RECLAIM-FENCE")
        user = a
        if a.broken:  # the target terminated the connection (allowed): the retained session continues anew
            user = yield from bed.reconnect(a)
        lr, _ = yield from user.load(ack.handle_base, 24, flags=RequestFlags.ALLOW_UNSEALED)
        expect.status_is(lr, Status.OK, req="KBTP-TICKET-TIMEOUT", what="LOAD of the handle bound in time")
        yield from _fill_quota(user, 10, q - 1, "KBTP-QUOTA-RELEASE", "after the reclaim")

    bed.run_one(scenario())


@pytest.mark.req("KBTP-QUOTA-USAGE", "KBTP-QUOTA-NO-SPACE", "KBTP-QUOTA-RELEASE")
def test_unbound_tickets_count_in_usage(kbtp_target: TargetUnderTest, seed: int) -> None:
    """Tickets taken and not bound count in the usage: with the whole quota taken as tickets, an
    ALLOC_STORE completes NO_SPACE; once they are reclaimed the quota is free again."""
    kbtp_target.require(DA)
    bed = kbtp_target.bed(seed, label="ticket-usage")
    a = bed.initiator("A")

    def scenario() -> Gen:
        ack = yield from _open(a)
        assert a.session is not None
        q = ack.allocation_quota
        for _ in range(q):
            t, s = yield from a.take_ticket()
            yield from a.await_slot(t, s)
        r = yield from a.alloc_store(a.session.handle(0), b"over")
        expect.status_is(r, Status.NO_SPACE, req="KBTP-QUOTA-USAGE",
                         what=f"ALLOC_STORE with all {q} quota units held as unbound tickets")
        yield from sleep(ack.ticket_timeout_ms / 1000.0 * 2)
        user = (yield from bed.reconnect(a)) if a.broken else a
        yield from _fill_quota(user, 1, q, "KBTP-QUOTA-RELEASE", "after every ticket was reclaimed")

    bed.run_one(scenario())


@pytest.mark.req("KBTP-TICKET-ABANDONED", "KBTP-TICKET-RECLAIM", "KBTP-RING-NO-LOSS", "KBTP-QUOTA-RELEASE")
def test_bind_racing_the_timeout(kbtp_target: TargetUnderTest, session_seed: int) -> None:
    """A BIND sent around the Ticket Timeout, under seeded interleavings: it binds (OK) or is refused
    TICKET_ABANDONED, never both, and either way no block is lost or handed out twice."""
    kbtp_target.require(DA)
    runs = max(16, kbtp_target.interleavings // 5)
    outcomes: dict[str, int] = {}
    for i in range(runs):
        outcome = _bind_race(kbtp_target, session_seed * 1000 + i, i)
        outcomes[outcome] = outcomes.get(outcome, 0) + 1
    evidence.record("note", "kbtp-bind-race", outcomes)
    assert sum(outcomes.values()) == runs, outcomes


def _bind_race(kbtp_target: TargetUnderTest, seed: int, i: int) -> str:
    """One interleaving of a BIND sent around the Ticket Timeout; returns its outcome."""
    bed = kbtp_target.bed(seed, label=f"bind-race-{i}")
    a = bed.initiator("A")

    def scenario() -> Gen:
        ack = yield from _open(a)
        assert a.session is not None
        q = ack.allocation_quota
        t, s = yield from a.take_ticket()
        block = yield from a.await_slot(t, s)
        # Around the deadline, in steps of 2 us of fabric time (a step is 1 us): the timeout lands before
        # the write, between the write and the BIND, or after the BIND, depending on the run.
        yield from sleep(ack.ticket_timeout_ms / 1000.0 - 2e-6 * (i % 16))
        data = b"raced" * 5
        try:
            yield from a.write_block(block, data)
            r = yield from a.bind(a.session.handle(0), t, len(data), block)
            outcome = Status(r.status).name
        except HarnessError:
            outcome = "connection ended"
        expect.holds(outcome in {"OK", "TICKET_ABANDONED", "connection ended"},
                     f"BIND racing the timeout got {outcome}", req="KBTP-TICKET-ABANDONED")
        user = (yield from bed.reconnect(a)) if a.broken else a
        assert user.session is not None
        lr, got = yield from user.load(ack.handle_base, 64, flags=RequestFlags.ALLOW_UNSEALED)
        if outcome == "OK":
            expect.equal("data of the handle whose BIND completed OK", got, data, req="KBTP-TICKET-RECLAIM")
            free_units = q - 1
        else:
            expect.status_is(lr, Status.NOT_VALID, req="KBTP-TICKET-ABANDONED",
                             what="LOAD of the handle whose BIND was refused")
            free_units = q
        # Cycle the free units through the ring a few times, so a block that is both bound and back in the
        # ring (a BIND accepted for a reclaimed ticket) is handed out again.
        for round_ in range(3):
            yield from _fill_quota(user, 20, free_units, "KBTP-RING-NO-LOSS", f"after the race ({outcome})")
            if round_ < 2:
                for j in range(free_units):
                    f = yield from user.free(user.session.handle(20 + j))
                    expect.status_is(f, Status.OK, req="KBTP-RING-NO-LOSS", what="FREE after the race")
        if outcome == "OK":  # the bound block was not handed out again by the allocations above
            lr, got = yield from user.load(ack.handle_base, 64, flags=RequestFlags.ALLOW_UNSEALED)
            expect.equal("data of the handle bound at the deadline, after the quota was filled", got, data,
                         req="KBTP-TICKET-ABANDONED")
        return outcome

    outcome: str = bed.run_one(scenario())
    return outcome
