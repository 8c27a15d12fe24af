"""kbtp-target: session establishment, the Target Descriptor and session lifetime (KBTP "Session
Establishment", "Allocation Quotas", "Security Considerations")."""

from __future__ import annotations

import itertools

import pytest

from kvconform.conformance.kbtp import expect
from kvconform.conformance.kbtp.client import RECV_DEPTH, Gen, HarnessError, HarnessInitiator
from kvconform.fixtures.kbtp import TargetUnderTest
from kvconform.kbtp.constants import (
    DIRECT_ALLOC_SIZE,
    DIRECT_LOAD_SIZE,
    HEADER_SIZE,
    HELLO_ACK_FIXED_SIZE,
    Features,
    Status,
)
from kvconform.kbtp.messages import HelloAck
from kvconform.rdma import Binding, wait_until
from kvconform.verdicts import not_applicable

ALL = Features(0xF)


def _ack(ini: HarnessInitiator) -> HelloAck:
    assert ini.session is not None, f"{ini.name}: no session"
    return ini.session.ack


@pytest.mark.req("KBTP-HELLO-FIRST", "KBTP-HELLO-HEADER-ZERO", "KBTP-HELLO-LAYOUT", "KBTP-ACK-LAYOUT",
                 "KBTP-ACK-FEATURES", "KBTP-DIRECT-OPTIONAL", "KBTP-COMP-NO-RECORD-RDMAP", "KBTP-RDMAP-SEND")
def test_hello_ack_descriptor(kbtp_target: TargetUnderTest, seed: int) -> None:
    """HELLO requesting every feature: HELLO_ACK as a Send, zero header fields, the declared features
    (never RECORD_COMPLETION on RDMAP), and exactly the descriptors those features announce."""
    bed = kbtp_target.bed(seed, label="hello")
    ini = bed.initiator()

    def scenario() -> Gen:
        ack = yield from ini.hello(ALL)
        return ack

    ack = bed.run_one(scenario())
    raw = ini.replies[-1].raw
    expect.status_is(ini.replies[-1], Status.OK, req="KBTP-HELLO-FIRST", what="HELLO_ACK")
    for name, off in (("Request ID", 4), ("Block Handle", 12), ("Generation", 20)):
        width = 2 if name == "Generation" else 8
        expect.equal(name, int.from_bytes(raw[off:off + width], "big"), 0, req="KBTP-HELLO-HEADER-ZERO", offset=off)
    declared = kbtp_target.params.features
    if kbtp_target.params.profile.binding is Binding.RDMAP:
        expect.holds(not ack.features & Features.RECORD_COMPLETION,
                     "HELLO_ACK Features at offset 24 has RECORD_COMPLETION on the RDMAP binding",
                     req="KBTP-COMP-NO-RECORD-RDMAP")
        declared &= ~Features.RECORD_COMPLETION
    expect.equal("HELLO_ACK Features (offset 24) vs PICS kbtp.target.features", Features(ack.features),
                 Features(declared), req="KBTP-ACK-FEATURES")
    size = HEADER_SIZE + HELLO_ACK_FIXED_SIZE
    size += DIRECT_LOAD_SIZE if ack.features & Features.DIRECT_LOAD else 0
    size += DIRECT_ALLOC_SIZE if ack.features & Features.DIRECT_ALLOC else 0
    expect.equal("HELLO_ACK length", len(raw), size, req="KBTP-ACK-LAYOUT")
    expect.holds(ack.block_size == kbtp_target.params.block_size,
                 f"Block Size {ack.block_size} differs from the declared {kbtp_target.params.block_size}",
                 req="KBTP-ACK-LAYOUT")
    expect.holds(ack.request_credits > 0, "Request Credits is 0: the initiator could send nothing",
                 req="KBTP-ACK-LAYOUT")


@pytest.mark.req("KBTP-SEC-NO-STAG", "KBTP-ACK-FEATURES")
def test_default_mode_exposes_no_stag(kbtp_target: TargetUnderTest, seed: int) -> None:
    """A HELLO that requests no feature gets no direct mode and no descriptor: no target STag is exposed
    (ADDR_LE is the target's own choice and may be set regardless)."""
    bed = kbtp_target.bed(seed, label="default-mode")
    ini = bed.initiator()
    ack = bed.run_one(ini.hello(Features(0)))
    expect.equal("HELLO_ACK Features other than ADDR_LE (none requested)", int(ack.features & ~Features.ADDR_LE), 0,
                 req="KBTP-ACK-FEATURES")
    expect.equal("HELLO_ACK length", len(ini.replies[-1].raw), HEADER_SIZE + HELLO_ACK_FIXED_SIZE,
                 req="KBTP-SEC-NO-STAG")


@pytest.mark.req("KBTP-HANDLE-DISJOINT", "KBTP-QUOTA-SUM", "KBTP-OPS-SESSION-FIXED")
def test_handle_ranges_and_quotas(kbtp_target: TargetUnderTest, seed: int) -> None:
    """Every initiator the target serves at once gets a handle range disjoint from the others', and the
    quotas it grants add up to no more than the pool's blocks."""
    p = kbtp_target.params
    bed = kbtp_target.bed(seed, label="ranges")
    inis = [bed.initiator() for _ in range(p.max_initiators)]
    bed.run(**{i.name: i.hello(Features(0)) for i in inis})
    granted = [i for i in inis if i.session is not None]
    expect.holds(len(granted) >= 1, "no initiator got a session", req="KBTP-QUOTA-SUM")
    ranges = sorted((_ack(i).handle_base, _ack(i).handle_base + _ack(i).handle_count, i.name) for i in granted)
    for (lo1, hi1, n1), (lo2, hi2, n2) in itertools.pairwise(ranges):
        expect.holds(hi1 <= lo2, f"handle ranges of {n1} [{lo1:#x}, {hi1:#x}) and {n2} [{lo2:#x}, {hi2:#x}) overlap",
                     req="KBTP-HANDLE-DISJOINT")
    total = sum(_ack(i).allocation_quota for i in granted)
    expect.holds(total <= p.blocks, f"sum of Allocation Quotas {total} exceeds F = {p.blocks}", req="KBTP-QUOTA-SUM")
    for i in granted:
        expect.equal(f"{i.name} Allocation Quota", _ack(i).allocation_quota, p.quota, req="KBTP-OPS-SESSION-FIXED")
        expect.equal(f"{i.name} Handle Count", _ack(i).handle_count, p.handle_count, req="KBTP-OPS-SESSION-FIXED")


@pytest.mark.req("KBTP-HELLO-ID-ACTIVE")
def test_active_initiator_id_rejected(kbtp_target: TargetUnderTest, seed: int) -> None:
    """A second HELLO with the Initiator ID of a still active session is rejected (a non-OK HELLO_ACK, or
    the connection is torn down); the first session keeps working."""
    bed = kbtp_target.bed(seed, label="id-active")
    first = bed.initiator("A")
    second = bed.initiator("B", initiator_id=first.initiator_id)

    def scenario() -> Gen:
        yield from first.hello(Features(0))
        try:
            ack = yield from second.hello(Features(0))
        except HarnessError:
            ack = None  # no HELLO_ACK: the target tore the connection down, which also rejects it
        expect.holds(ack is None or ack.status != Status.OK,
                     "a HELLO carrying the Initiator ID of an active session got HELLO_ACK Status OK",
                     req="KBTP-HELLO-ID-ACTIVE")
        h = first.session.handle(1) if first.session else 0
        reply = yield from first.alloc_store(h, b"still-alive")
        expect.status_is(reply, Status.OK, req="KBTP-HELLO-ID-ACTIVE", what="the first session after the rejection")

    bed.run_one(scenario())


def _reconnect(bed: object, old: HarnessInitiator, name: str) -> Gen:
    """Wait for the target to close ``old``'s connection after GOODBYE, then connect again with its ID.

    Everything stays inside one run: between runs the emulated fabric jumps its clock to the next timer,
    which would let the retention time expire."""
    closed = yield from wait_until(lambda: old.broken, name=f"{name}-closed", timeout=1.0)
    expect.holds(closed, f"the target did not end {old.name}'s connection within 1 s after GOODBYE",
                 req="KBTP-GOODBYE")
    again: HarnessInitiator = bed.initiator(name, initiator_id=old.initiator_id)  # type: ignore[attr-defined]
    ack = yield from again.hello(Features(0))
    return again, ack


@pytest.mark.req("KBTP-GOODBYE", "KBTP-RETENTION", "KBTP-HELLO-LAYOUT")
def test_goodbye_keeps_bindings(kbtp_target: TargetUnderTest, seed: int) -> None:
    """GOODBYE without RELEASE ends the session; reconnecting with the same Initiator ID gives the same
    handle range with the bindings intact."""
    bed = kbtp_target.bed(seed, label="retention")
    a = bed.initiator("A")
    data = b"retained block " * 5

    def scenario() -> Gen:
        ack1 = yield from a.hello(Features(0), credits=RECV_DEPTH)
        assert a.session is not None
        reply = yield from a.alloc_store(a.session.handle(3), data)
        expect.status_is(reply, Status.OK, req="KBTP-RETENTION", what="ALLOC_STORE before GOODBYE")
        a.goodbye(release=False)
        again, ack2 = yield from _reconnect(bed, a, "A2")
        expect.equal("HELLO_ACK Status after GOODBYE (same Initiator ID)", ack2.status, 0, req="KBTP-GOODBYE")
        expect.equal("Handle Base after reconnecting", ack2.handle_base, ack1.handle_base, req="KBTP-RETENTION")
        lr, got = yield from again.load(ack1.handle_base + 3, len(data))
        expect.status_is(lr, Status.OK, req="KBTP-RETENTION", what="LOAD of a binding made before GOODBYE")
        expect.equal("Generation of the retained binding", lr.generation, reply.generation, req="KBTP-RETENTION")
        expect.equal("retained block data", got, data, req="KBTP-RETENTION")

    bed.run_one(scenario())


@pytest.mark.req("KBTP-GOODBYE-RELEASE", "KBTP-QUOTA-RELEASE")
def test_goodbye_release_frees_everything(kbtp_target: TargetUnderTest, seed: int) -> None:
    """GOODBYE with RELEASE frees every handle the initiator bound: after reconnecting they are not
    bound, and the whole quota can be allocated again."""
    bed = kbtp_target.bed(seed, label="release")
    a = bed.initiator("A")
    q = kbtp_target.params.quota
    if q == 0:
        not_applicable("PICS kbtp.target.quota is 0: nothing can be bound")

    def scenario() -> Gen:
        ack1 = yield from a.hello(Features(0))
        assert a.session is not None
        for i in range(q):
            reply = yield from a.alloc_store(a.session.handle(i), bytes([i]) * 32)
            expect.status_is(reply, Status.OK, req="KBTP-GOODBYE-RELEASE", what=f"ALLOC_STORE {i + 1} of {q}")
        a.goodbye(release=True)
        again, _ = yield from _reconnect(bed, a, "A2")
        lr, _ = yield from again.load(ack1.handle_base, 32)
        expect.status_is(lr, Status.NOT_VALID, req="KBTP-GOODBYE-RELEASE", what="LOAD after GOODBYE RELEASE")
        for i in range(q):
            reply = yield from again.alloc_store(again.session.handle(10 + i), b"x" * 16)
            expect.status_is(reply, Status.OK, req="KBTP-QUOTA-RELEASE",
                             what=f"ALLOC_STORE {i + 1} of {q} after RELEASE")

    bed.run_one(scenario())


@pytest.mark.req("KBTP-QUOTA-NO-SPACE", "KBTP-QUOTA-USAGE", "KBTP-QUOTA-RELEASE", "KBTP-QUOTA-TERMINATE")
def test_quota_exhaustion(kbtp_target: TargetUnderTest, seed: int) -> None:
    """ALLOC_STORE beyond the quota completes NO_SPACE (or the target terminates the session, which it
    MAY); after a FREE completes, one more allocation succeeds."""
    bed = kbtp_target.bed(seed, label="quota")
    a = bed.initiator("A")
    q = kbtp_target.params.quota

    def scenario() -> Gen:
        yield from a.hello(Features(0))
        assert a.session is not None
        expect.equal("Allocation Quota", a.session.ack.allocation_quota, q, req="KBTP-QUOTA-USAGE")
        for i in range(q):
            reply = yield from a.alloc_store(a.session.handle(i), b"q" * 8)
            expect.status_is(reply, Status.OK, req="KBTP-QUOTA-USAGE", what=f"ALLOC_STORE {i + 1} within quota {q}")
        try:
            over = yield from a.alloc_store(a.session.handle(q), b"over")
        except HarnessError:
            expect.holds(a.broken, "no completion for the ALLOC_STORE over quota and the connection is still up",
                         req="KBTP-QUOTA-NO-SPACE")
            return "terminated"
        expect.status_is(over, Status.NO_SPACE, req="KBTP-QUOTA-NO-SPACE", what="ALLOC_STORE over quota")
        if q:
            reply = yield from a.free(a.session.handle(0))
            expect.status_is(reply, Status.OK, req="KBTP-QUOTA-RELEASE", what="FREE")
            reply = yield from a.alloc_store(a.session.handle(q), b"after free")
            expect.status_is(reply, Status.OK, req="KBTP-QUOTA-RELEASE", what="ALLOC_STORE after a FREE completed")
        return "no-space"

    outcome = bed.run_one(scenario())
    assert outcome in {"no-space", "terminated"}


@pytest.mark.req("KBTP-LOAD-ANY", "KBTP-VAL-HANDLE")
def test_load_of_another_initiators_handle(kbtp_target: TargetUnderTest, seed: int) -> None:
    """Another initiator's handle loads OK when the target declares cross-initiator loads, else
    INVALID_HANDLE; a STORE or FREE of it is always INVALID_HANDLE (its own range only)."""
    bed = kbtp_target.bed(seed, label="cross-load")
    a, b = bed.initiator("A"), bed.initiator("B")
    data = b"shared"

    def scenario() -> Gen:
        yield from a.hello(Features(0))
        yield from b.hello(Features(0))
        assert a.session and b.session
        h = a.session.handle(2)
        reply = yield from a.alloc_store(h, data)
        expect.status_is(reply, Status.OK, req="KBTP-LOAD-ANY", what="ALLOC_STORE by the owner")
        reply, got = yield from b.load(h, 64)
        if kbtp_target.params.cross_initiator_load:
            expect.status_is(reply, Status.OK, req="KBTP-LOAD-ANY", what="LOAD of another initiator's handle")
            expect.equal("loaded data", got, data, req="KBTP-LOAD-ANY")
        else:
            expect.status_is(reply, Status.INVALID_HANDLE, req="KBTP-VAL-HANDLE",
                             what="LOAD of another initiator's handle (PICS: cross_initiator_load false)")
        reply = yield from b.store(h, b"overwrite", flags=0)
        expect.status_is(reply, Status.INVALID_HANDLE, req="KBTP-VAL-HANDLE", what="STORE to another's handle")
        reply = yield from b.free(h)
        expect.status_is(reply, Status.INVALID_HANDLE, req="KBTP-VAL-HANDLE", what="FREE of another's handle")
        reply, got = yield from a.load(h, 64)
        expect.equal("owner's data after the refused STORE/FREE", got, data, req="KBTP-VAL-HANDLE")

    bed.run_one(scenario())


