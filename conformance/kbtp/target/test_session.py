"""kbtp-target: session establishment, the Target Descriptor and session lifetime (KBTP "Session
Establishment", "Allocation Quotas", "Security Considerations").

Every wait for the target names the requirement that says the awaited answer must come (the client's R_*
defaults: HELLO_ACK, an allocation within quota, a LOAD's or FREE's completion), so those ids are cited by
the checks that wait for them."""

from __future__ import annotations

import itertools

import pytest

from kvconform.conformance.kbtp import expect, hangs
from kvconform.fixtures.kbtp import TargetUnderTest
from kvconform.kbtp.constants import (
    DIRECT_ALLOC_SIZE,
    DIRECT_LOAD_SIZE,
    HEADER_SIZE,
    HELLO_ACK_FIXED_SIZE,
    Features,
    RequestFlags,
    Status,
)
from kvconform.kbtp.messages import HelloAck
from kvconform.rdma import Binding, wait_until
from kvconform.targets.kbtp_bed import Bed
from kvconform.targets.kbtp_client import Ended, Gen, HarnessInitiator, pattern
from kvconform.verdicts import check, check_equal, check_one_of, not_applicable

ALL = Features(0xF)
DEFINED_FEATURES = int(ALL)


def _hello_all(kbtp_target: TargetUnderTest, seed: int, label: str) -> tuple[HelloAck, bytes]:
    """One fresh initiator's HELLO requesting every feature: its HELLO_ACK and the octets that carried it."""
    bed = kbtp_target.bed(seed, label=label)
    ini = bed.initiator()
    ack = bed.run_one(ini.hello(ALL))
    return ack, ini.replies[-1].raw


@pytest.mark.req("KBTP-HELLO-FIRST", "KBTP-HELLO-HEADER-ZERO", "KBTP-ACK-LAYOUT")
def test_hello_ack(kbtp_target: TargetUnderTest, seed: int) -> None:
    """A lone fresh initiator's HELLO is answered by HELLO_ACK Status OK, whose header has zero Request ID,
    Block Handle and Generation, and whose body is the fixed Target Descriptor plus exactly the descriptors
    its Features announce, with the declared Block Size and some Request Credits."""
    ack, raw = _hello_all(kbtp_target, seed, "hello")
    check_equal("HELLO_ACK Status of a lone fresh initiator", expect.status_name(ack.status), "OK",
                req="KBTP-HELLO-FIRST")
    for name, off, width in (("Request ID", 4, 8), ("Block Handle", 12, 8), ("Generation", 20, 2)):
        expect.equal(f"HELLO_ACK {name}", int.from_bytes(raw[off:off + width], "big"), 0,
                     req="KBTP-HELLO-HEADER-ZERO", offset=off)
    size = HEADER_SIZE + HELLO_ACK_FIXED_SIZE
    size += DIRECT_LOAD_SIZE if ack.features & Features.DIRECT_LOAD else 0
    size += DIRECT_ALLOC_SIZE if ack.features & Features.DIRECT_ALLOC else 0
    expect.equal("HELLO_ACK length (fixed descriptor + announced direct-mode descriptors)", len(raw), size,
                 req="KBTP-ACK-LAYOUT")
    expect.equal("HELLO_ACK Block Size vs PICS kbtp.target.pool.block_size", ack.block_size,
                 kbtp_target.params.block_size, req="KBTP-ACK-LAYOUT", offset=28)
    check(ack.request_credits > 0, "HELLO_ACK Request Credits at offset 26 is 0: the initiator could send nothing",
          req="KBTP-ACK-LAYOUT", seen=ack.request_credits)


@pytest.mark.req("KBTP-ACK-FEATURES", "KBTP-HELLO-FIRST")
def test_ack_features_match_pics(kbtp_target: TargetUnderTest, seed: int) -> None:
    """Asked for every feature, HELLO_ACK sets only bits the text defines and, when PICS declares the
    features, exactly the declared ones (RECORD_COMPLETION never on RDMAP, see the next check): a direct
    mode not declared is not offered. Undeclared (defaulted) features are no claim: then only the bits."""
    ack, _ = _hello_all(kbtp_target, seed, "features")
    got = int(ack.features)
    check(not got & ~DEFINED_FEATURES, "HELLO_ACK Features at offset 24 has bits the text does not define",
          req="KBTP-ACK-FEATURES", seen=got, expected=f"a subset of {DEFINED_FEATURES:#x}")
    if not kbtp_target.features_declared:
        return
    p = kbtp_target.params
    either = ~p.grant_optional  # a bit the declared geometry leaves to the target is compared on neither side
    what = " (DIRECT_ALLOC either way at a quota of 0)" if p.grant_optional else ""
    check_equal(f"HELLO_ACK Features (offset 24) vs PICS kbtp.target.features{what}", Features(got & either),
                Features(p.grants & either), req="KBTP-ACK-FEATURES")


@pytest.mark.req("KBTP-COMP-NO-RECORD-RDMAP", "KBTP-HELLO-FIRST")
def test_no_record_completion_on_rdmap(kbtp_target: TargetUnderTest, seed: int) -> None:
    """On the RDMAP binding HELLO_ACK never advertises RECORD_COMPLETION, even when asked for it."""
    if kbtp_target.params.profile.binding is not Binding.RDMAP:
        not_applicable(f"PICS kbtp.target.binding {kbtp_target.params.binding} is not RDMAP")
    ack, _ = _hello_all(kbtp_target, seed, "no-record")
    check(not ack.features & Features.RECORD_COMPLETION,
          "HELLO_ACK Features at offset 24 has RECORD_COMPLETION on the RDMAP binding",
          req="KBTP-COMP-NO-RECORD-RDMAP", seen=Features(ack.features))


@pytest.mark.req("KBTP-SEC-NO-STAG", "KBTP-ACK-FEATURES", "KBTP-HELLO-FIRST")
def test_default_mode_exposes_no_stag(kbtp_target: TargetUnderTest, seed: int) -> None:
    """A HELLO that requests no feature gets no direct mode and no descriptor: no target STag is exposed
    (ADDR_LE is the target's own choice and may be set regardless)."""
    bed = kbtp_target.bed(seed, label="default-mode")
    ini = bed.initiator()
    ack = bed.run_one(ini.hello(Features(0)))
    expect.equal("HELLO_ACK Features other than ADDR_LE (none requested)", int(ack.features & ~Features.ADDR_LE), 0,
                 req="KBTP-ACK-FEATURES")
    expect.equal("HELLO_ACK length (no direct-mode descriptor)", len(ini.replies[-1].raw),
                 HEADER_SIZE + HELLO_ACK_FIXED_SIZE, req="KBTP-SEC-NO-STAG")


def _all_admitted(kbtp_target: TargetUnderTest, seed: int, label: str) -> list[HelloAck]:
    """HELLO_ACKs of as many initiators as PICS says the target serves at once (those it admitted: it may
    refuse some, keeping the sum of quotas within the pool). Those the shared ring has no room for ask for
    DIRECT_ALLOC, whose partitions serve them (a quota over the shared ring's blocks leaves it no session)."""
    p = kbtp_target.params
    shared, partitions = p.capacity()
    asks = kbtp_target.sessions(min(p.max_initiators, shared + partitions), need="the sessions served at once")
    asks += [Features(0)] * (p.max_initiators - len(asks))
    bed = kbtp_target.bed(seed, label=label)
    inis = [bed.initiator() for _ in asks]
    bed.run(**{i.name: i.hello(ask) for i, ask in zip(inis, asks, strict=True)})
    return [i.session.ack for i in inis if i.session is not None]


@pytest.mark.req("KBTP-HANDLE-DISJOINT", "KBTP-HELLO-FIRST")
def test_handle_ranges_disjoint(kbtp_target: TargetUnderTest, seed: int) -> None:
    """Every initiator the target serves at once gets a handle range disjoint from the others'."""
    acks = _all_admitted(kbtp_target, seed, "ranges")
    ranges = sorted((a.handle_base, a.handle_base + a.handle_count) for a in acks)
    for (lo1, hi1), (lo2, hi2) in itertools.pairwise(ranges):
        check(hi1 <= lo2, f"handle ranges [{lo1:#x}, {hi1:#x}) and [{lo2:#x}, {hi2:#x}) of two initiators overlap",
              req="KBTP-HANDLE-DISJOINT")


@pytest.mark.req("KBTP-QUOTA-SUM", "KBTP-OPS-SESSION-FIXED", "KBTP-HELLO-FIRST")
def test_quotas_within_pool(kbtp_target: TargetUnderTest, seed: int) -> None:
    """The quotas of the initiators served at once add up to no more than the pool's F blocks, and (when PICS
    declares the quota) each session is set up with the declared Allocation Quota."""
    p = kbtp_target.params
    acks = _all_admitted(kbtp_target, seed, "quotas")
    check(bool(acks), "no initiator was admitted", req="KBTP-QUOTA-SUM", expected="at least one session")
    total = sum(a.allocation_quota for a in acks)
    check(total <= p.blocks, f"the {len(acks)} sessions' Allocation Quotas add up to more than the pool",
          req="KBTP-QUOTA-SUM", seen=total, expected=f"<= F = {p.blocks}")
    if kbtp_target.pics.is_defaulted("kbtp.target.quota"):
        return  # an undeclared quota is the harness's guess, not the target's claim
    for a in acks:
        expect.equal("Allocation Quota vs PICS kbtp.target.quota", a.allocation_quota, p.quota,
                     req="KBTP-OPS-SESSION-FIXED", offset=36)


@pytest.mark.req("KBTP-HELLO-ID-ACTIVE", "KBTP-HELLO-FIRST", "KBTP-QUOTA-ALLOC-BOUNDED")
@hangs.diagnosed
def test_active_initiator_id_rejected(kbtp_target: TargetUnderTest, seed: int) -> None:
    """A second HELLO with the Initiator ID of a still active session is rejected (a non-OK HELLO_ACK, or
    the connection is torn down); the first session keeps working."""
    bed = kbtp_target.bed(seed, label="id-active")
    first = bed.initiator("A")
    second = bed.initiator("B", initiator_id=first.initiator_id)

    def scenario() -> Gen:
        yield from bed.open(first)
        ack = yield from second.hello(Features(0), req="KBTP-HELLO-ID-ACTIVE", allow_end=True)
        outcome = "connection ended" if isinstance(ack, Ended) else expect.status_name(ack.status)
        check(outcome != "OK", "a HELLO carrying the Initiator ID of an active session got HELLO_ACK Status OK",
              req="KBTP-HELLO-ID-ACTIVE", seen=outcome, expected="a refusal (non-OK Status or the connection ended)")
        reply = yield from first.alloc_store(first.handle(1), b"still-alive")
        expect.status_is(reply, Status.OK, req="KBTP-HELLO-ID-ACTIVE", what="the first session after the rejection")

    bed.run_one(scenario())


def _reconnect(bed: Bed, old: HarnessInitiator, name: str) -> Gen:
    """Wait for the target to close ``old``'s connection after GOODBYE, then connect again with its ID.

    Everything stays inside one run: between runs the emulated fabric jumps its clock to the next timer,
    which would let the retention time expire."""
    closed = yield from wait_until(lambda: old.broken, name=f"{name}-closed", timeout=1.0)
    check(closed, f"the target did not end {old.name}'s connection within 1 s after GOODBYE", req="KBTP-GOODBYE")
    again = bed.initiator(name, initiator_id=old.initiator_id)
    ack = yield from again.hello(Features(0))
    return again, ack


@pytest.mark.req("KBTP-GOODBYE", "KBTP-RETENTION", "KBTP-HELLO-FIRST", "KBTP-QUOTA-ALLOC-BOUNDED",
                 "KBTP-LOAD-COMPLETE")
@hangs.diagnosed
def test_goodbye_keeps_bindings(kbtp_target: TargetUnderTest, seed: int) -> None:
    """GOODBYE without RELEASE ends the session; reconnecting with the same Initiator ID gives the same
    handle range with the bindings intact."""
    bed = kbtp_target.bed(seed, label="retention")
    a = bed.initiator("A")
    data = (b"retained block " * 5)[:kbtp_target.params.block_size]  # within any declared Block Size

    def scenario() -> Gen:
        ack1 = yield from bed.open(a)
        reply = yield from a.alloc_store(a.handle(3), data)
        expect.status_is(reply, Status.OK, req="KBTP-QUOTA-ALLOC-BOUNDED", what="ALLOC_STORE before GOODBYE")
        a.goodbye(release=False)
        again, ack2 = yield from _reconnect(bed, a, "A2")
        expect.status_is(ack2, Status.OK, req="KBTP-RETENTION", what="HELLO_ACK after GOODBYE (same Initiator ID)")
        expect.equal("Handle Base after reconnecting", ack2.handle_base, ack1.handle_base, req="KBTP-RETENTION")
        lr, got = yield from again.load(ack1.handle_base + 3, len(data))
        expect.status_is(lr, Status.OK, req="KBTP-RETENTION", what="LOAD of a binding made before GOODBYE")
        expect.equal("Generation of the retained binding", lr.generation, reply.generation, req="KBTP-RETENTION")
        expect.equal("retained block data", got, data, req="KBTP-RETENTION")

    bed.run_one(scenario())


@pytest.mark.req("KBTP-GOODBYE-RELEASE", "KBTP-QUOTA-RELEASE", "KBTP-GOODBYE", "KBTP-HELLO-FIRST",
                 "KBTP-QUOTA-ALLOC-BOUNDED", "KBTP-LOAD-COMPLETE")
@hangs.diagnosed
def test_goodbye_release_frees_everything(kbtp_target: TargetUnderTest, seed: int) -> None:
    """GOODBYE with RELEASE frees every handle the initiator bound: after reconnecting they are not
    bound, and the whole quota can be allocated again."""
    bed = kbtp_target.bed(seed, label="release")
    a = bed.initiator("A")

    def scenario() -> Gen:
        ack1 = yield from bed.open(a)
        q = ack1.allocation_quota
        if q == 0:
            not_applicable("Allocation Quota 0: nothing can be bound")
        for i in range(q):
            reply = yield from a.alloc_store(a.handle(i), pattern(i, min(32, kbtp_target.params.block_size)))
            expect.status_is(reply, Status.OK, req="KBTP-QUOTA-ALLOC-BOUNDED", what=f"ALLOC_STORE {i + 1} of {q}")
        a.goodbye(release=True)
        again, ack2 = yield from _reconnect(bed, a, "A2")
        expect.status_is(ack2, Status.OK, req="KBTP-GOODBYE",
                         what="HELLO_ACK after GOODBYE RELEASE (same Initiator ID)")
        lr, _ = yield from again.load(ack1.handle_base, 32, flags=RequestFlags.ALLOW_UNSEALED)
        expect.status_is(lr, Status.NOT_VALID, req="KBTP-GOODBYE-RELEASE", what="LOAD after GOODBYE RELEASE")
        for i in range(ack2.allocation_quota):
            reply = yield from again.alloc_store(again.handle(10 + i), b"x" * min(16, kbtp_target.params.block_size))
            expect.status_is(reply, Status.OK, req="KBTP-QUOTA-RELEASE",
                             what=f"ALLOC_STORE {i + 1} of {ack2.allocation_quota} after RELEASE")

    bed.run_one(scenario())


def _fill(a: HarnessInitiator, q: int) -> Gen:
    for i in range(q):
        reply = yield from a.alloc_store(a.handle(i), b"q" * 8)
        expect.status_is(reply, Status.OK, req="KBTP-QUOTA-ALLOC-BOUNDED", what=f"ALLOC_STORE {i + 1} within quota {q}")


@pytest.mark.req("KBTP-QUOTA-NO-SPACE", "KBTP-HELLO-FIRST", "KBTP-QUOTA-ALLOC-BOUNDED")
@hangs.diagnosed
def test_quota_exhaustion(kbtp_target: TargetUnderTest, seed: int) -> None:
    """With the whole Allocation Quota bound, one more ALLOC_STORE completes NO_SPACE (or the target
    terminates the session, which it MAY: KBTP-QUOTA-TERMINATE)."""
    bed = kbtp_target.bed(seed, label="quota")
    a = bed.initiator("A")

    def scenario() -> Gen:
        ack = yield from bed.open(a)
        q = ack.allocation_quota
        yield from _fill(a, q)
        over = yield from a.alloc_store(a.handle(q), b"over"[:ack.block_size], req="KBTP-QUOTA-NO-SPACE",
                                        allow_end=True, refused=True)
        outcome = "connection ended" if isinstance(over, Ended) else expect.status_name(over.status)
        check_one_of(outcome, {"NO_SPACE", "connection ended"}, what=f"ALLOC_STORE over quota {q}",
                     req="KBTP-QUOTA-NO-SPACE")

    bed.run_one(scenario())


@pytest.mark.req("KBTP-QUOTA-RELEASE", "KBTP-HELLO-FIRST", "KBTP-QUOTA-ALLOC-BOUNDED", "KBTP-FREE-RETURN")
@hangs.diagnosed
def test_free_releases_quota(kbtp_target: TargetUnderTest, seed: int) -> None:
    """With the whole quota bound, a FREE gives one unit back: the next ALLOC_STORE succeeds, and (the
    quota full again) the one after it does not."""
    bed = kbtp_target.bed(seed, label="quota-release")
    a = bed.initiator("A")

    def scenario() -> Gen:
        ack = yield from bed.open(a)
        q = ack.allocation_quota
        if q == 0:
            not_applicable("Allocation Quota 0: nothing can be bound or freed")
        yield from _fill(a, q)
        reply = yield from a.free(a.handle(0))
        expect.status_is(reply, Status.OK, req="KBTP-FREE-RETURN", what="FREE of a bound handle")
        reply = yield from a.alloc_store(a.handle(q), b"after free", req="KBTP-QUOTA-RELEASE")
        expect.status_is(reply, Status.OK, req="KBTP-QUOTA-RELEASE", what="ALLOC_STORE after a FREE completed")

    bed.run_one(scenario())


@pytest.mark.req("KBTP-LOAD-ANY", "KBTP-HELLO-FIRST", "KBTP-QUOTA-ALLOC-BOUNDED", "KBTP-LOAD-COMPLETE")
@hangs.diagnosed
def test_load_of_another_initiators_handle(kbtp_target: TargetUnderTest, seed: int) -> None:
    """Another initiator's handle loads OK with its data when the target declares cross-initiator loads,
    INVALID_HANDLE when it declares it refuses them; undeclared, either answer is the target's decision."""
    plan = kbtp_target.sessions(2, need="an owner and another initiator")
    bed = kbtp_target.bed(seed, label="cross-load")
    a, b = bed.initiator("A"), bed.initiator("B")
    data = b"shared"
    declared = not kbtp_target.pics.is_defaulted("kbtp.target.cross_initiator_load")
    allowed = kbtp_target.params.cross_initiator_load
    acceptable = ({"OK"} if allowed else {"INVALID_HANDLE"}) if declared else {"OK", "INVALID_HANDLE"}

    def scenario() -> Gen:
        yield from bed.open(a, plan[0])
        yield from bed.open(b, plan[1])
        h = a.handle(2)
        reply = yield from a.alloc_store(h, data)
        expect.status_is(reply, Status.OK, req="KBTP-QUOTA-ALLOC-BOUNDED", what="ALLOC_STORE by the owner")
        reply, got = yield from b.load(h, 64)
        status = expect.status_name(reply.status)
        check_one_of(status, acceptable, what="Status of a LOAD of another initiator's handle (PICS "
                     f"cross_initiator_load {'declared ' + str(allowed) if declared else 'not declared'})",
                     req="KBTP-LOAD-ANY")
        if status == "OK":
            expect.equal("data loaded from another initiator's handle", got, data, req="KBTP-LOAD-ANY")

    bed.run_one(scenario())


@pytest.mark.req("KBTP-VAL-HANDLE", "KBTP-HELLO-FIRST", "KBTP-QUOTA-ALLOC-BOUNDED", "KBTP-LOAD-COMPLETE")
@hangs.diagnosed
def test_store_and_free_of_another_initiators_handle(kbtp_target: TargetUnderTest, seed: int) -> None:
    """A STORE or FREE of another initiator's (bound, unsealed) handle is INVALID_HANDLE, its own range
    only, and changes nothing: the owner still loads its data."""
    plan = kbtp_target.sessions(2, need="an owner and another initiator")
    bed = kbtp_target.bed(seed, label="cross-store")
    a, b = bed.initiator("A"), bed.initiator("B")
    data = b"owned"

    def scenario() -> Gen:
        yield from bed.open(a, plan[0])
        yield from bed.open(b, plan[1])
        h = a.handle(2)
        # Unsealed and with the right Generation 0 (any): the handle range is the only rule these break.
        reply = yield from a.alloc_store(h, data, flags=0)
        expect.status_is(reply, Status.OK, req="KBTP-QUOTA-ALLOC-BOUNDED", what="unsealed ALLOC_STORE by the owner")
        reply = yield from b.store(h, b"overwrite", flags=0, req="KBTP-VAL-HANDLE", refused=True)
        expect.status_is(reply, Status.INVALID_HANDLE, req="KBTP-VAL-HANDLE", what="STORE to another's handle")
        reply = yield from b.free(h, req="KBTP-VAL-HANDLE")
        expect.status_is(reply, Status.INVALID_HANDLE, req="KBTP-VAL-HANDLE", what="FREE of another's handle")
        reply, got = yield from a.load(h, 64, flags=RequestFlags.ALLOW_UNSEALED)
        expect.status_is(reply, Status.OK, req="KBTP-VAL-HANDLE", what="the owner's LOAD after the refused STORE/FREE")
        expect.equal("the owner's data after the refused STORE/FREE", got, data, req="KBTP-VAL-HANDLE")

    bed.run_one(scenario())
