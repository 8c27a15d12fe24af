"""kbtp-initiator: what the initiator sends — HELLO, requests inside its own handle range and quota, the
Generation it expects, its byte order, single-use STags (KBTP "Session Establishment", "Common Header",
"Descriptors", "Allocation Quotas", "Security Considerations")."""

from __future__ import annotations

import pytest

from kvconform.conformance.kbtp import expect
from kvconform.conformance.kbtp.client import Gen
from kvconform.fixtures.kbtp import InitiatorUnderTest
from kvconform.kbtp.constants import Features, Opcode, RequestFlags, Status
from kvconform.kbtp.messages import AllocStore, Free, Hello, Load, Store
from kvconform.verdicts import not_applicable


def _hello(bed: object) -> Gen:
    granted = yield from bed.endpoint.hello()  # type: ignore[attr-defined]
    expect.holds(granted is not None, "the initiator's HELLO was refused by the harness target",
                 req="KBTP-HELLO-FIRST")
    return granted


@pytest.mark.req("KBTP-HELLO-FIRST", "KBTP-HELLO-LAYOUT", "KBTP-HELLO-HEADER-ZERO", "KBTP-HDR-LAYOUT",
                 "KBTP-HDR-VERSION", "KBTP-HELLO-ID-ENTROPY", "KBTP-RDMAP-SEND", "KBTP-BYTE-ORDER")
def test_hello(kbtp_initiator: InitiatorUnderTest, seed: int) -> None:
    """The first message is a well-formed HELLO with zero Request ID, Block Handle, Generation and
    Status, Completion Credits > 0, and an Initiator ID that differs between fresh initiators and is
    not a low-entropy pattern."""
    ids = []
    for k in range(3):
        bed = kbtp_initiator.bed(seed * 10 + k, label=f"hello-{k}")
        bed.run_one(_hello(bed))
        first = bed.messages()[0]
        expect.holds(first.message is not None, f"the first message does not decode: {first.error}",
                     req="KBTP-HDR-LAYOUT")
        msg = first.message
        expect.holds(isinstance(msg, Hello), f"the first message is {type(msg).__name__}, not HELLO",
                     req="KBTP-HELLO-FIRST")
        assert isinstance(msg, Hello)
        for name in ("request_id", "handle", "generation", "status"):
            expect.equal(f"HELLO {name}", getattr(msg, name), 0, req="KBTP-HELLO-HEADER-ZERO")
        expect.holds(msg.completion_credits > 0, "HELLO Completion Credits is 0", req="KBTP-HELLO-LAYOUT")
        iid = bytes(msg.initiator_id)
        expect.holds(len(set(iid)) >= 8, f"Initiator ID {iid.hex()} has only {len(set(iid))} distinct octets",
                     req="KBTP-HELLO-ID-ENTROPY")
        ids.append(iid)
    expect.equal("distinct Initiator IDs of 3 fresh initiators", len(set(ids)), 3, req="KBTP-HELLO-ID-ENTROPY")


@pytest.mark.req("KBTP-HANDLE-OWN-RANGE", "KBTP-HDR-STATUS-ZERO", "KBTP-HDR-GEN-REQUEST", "KBTP-ADDRLE-INITIATOR",
                 "KBTP-DESC-DATA", "KBTP-DESC-INLINE", "KBTP-FLAGS", "KBTP-BODY-LAYOUT", "KBTP-OPCODES",
                 "KBTP-STATUS-CODES", "KBTP-GOODBYE")
def test_requests(kbtp_initiator: InitiatorUnderTest, seed: int) -> None:
    """Stores, loads and frees driven through the initiator: every request decodes under the session's
    byte order (little-endian Block Handle and descriptors under ADDR_LE), names a handle of the
    initiator's own range, has Status 0, and carries the Generation the caller expects."""
    bed = kbtp_initiator.bed(seed, label="requests")
    ep = bed.endpoint
    if kbtp_initiator.target_params.quota < 2:
        not_applicable("PICS kbtp.target.quota < 2: the check binds two handles")
    big = bytes(range(256)) * 4  # larger than Max Inline if the target's is small: by RDMA Read
    data = {0: b"first", 1: big[:300]}  # within the smallest useful quota (2)

    def scenario() -> Gen:
        yield from _hello(bed)
        gens = {}
        for i, d in data.items():
            r = yield from ep.alloc_store(ep.handle_base + i, d, seal=(i == 0))
            expect.status_is(r, Status.OK, req="KBTP-BODY-LAYOUT", what=f"ALLOC_STORE {i} through the initiator")
            gens[i] = r.generation
        r = yield from ep.store(ep.handle_base + 1, b"second, again", seal=True, generation=gens[1])
        expect.status_is(r, Status.OK, req="KBTP-HDR-GEN-REQUEST", what="STORE with the expected Generation")
        for i in data:
            r = yield from ep.load(ep.handle_base + i, 1024, generation=gens[i])
            expect.status_is(r, Status.OK, req="KBTP-HDR-GEN-REQUEST", what=f"LOAD {i} with the expected Generation")
        r = yield from ep.free(ep.handle_base + 0, generation=gens[0])
        expect.status_is(r, Status.OK, req="KBTP-HDR-GEN-REQUEST", what="FREE with the expected Generation")
        yield from ep.goodbye(False)
        return gens

    gens = bed.run_one(scenario())
    ack = bed.ack
    assert ack is not None
    lo, hi = ack.handle_base, ack.handle_base + ack.handle_count
    addr_le = bool(ack.features & Features.ADDR_LE)
    seen_goodbye = False
    expected_gen = {Opcode.STORE: [gens[1]], Opcode.LOAD: [gens[0], gens[1]], Opcode.FREE: [gens[0]]}
    for rec in bed.messages()[1:]:
        expect.holds(rec.message is not None, f"a request does not decode under ADDR_LE={addr_le}: {rec.error} "
                     f"(octets {rec.raw[:40].hex(' ')})",
                     req="KBTP-ADDRLE-INITIATOR" if addr_le else "KBTP-BODY-LAYOUT")
        m = rec.message
        if m is None:
            continue
        expect.equal(f"{type(m).__name__} Version", m.version, 1, req="KBTP-HDR-VERSION")
        expect.equal(f"{type(m).__name__} Status", m.status, 0, req="KBTP-HDR-STATUS-ZERO")
        if isinstance(m, AllocStore | Store | Free | Load):
            expect.holds(lo <= m.handle < hi, f"{type(m).__name__} names handle {m.handle:#x}, outside the range "
                         f"[{lo:#x}, {hi:#x}) (ADDR_LE={addr_le})",
                         req="KBTP-ADDRLE-INITIATOR" if addr_le else "KBTP-HANDLE-OWN-RANGE")
        if isinstance(m, Store | Free | Load):
            op = Opcode(m.OPCODE)
            want = expected_gen[op].pop(0)
            expect.equal(f"{op.name} Generation", m.generation, want, req="KBTP-HDR-GEN-REQUEST")
        seen_goodbye |= m.OPCODE == Opcode.GOODBYE
    expect.holds(seen_goodbye, "no GOODBYE reached the target", req="KBTP-GOODBYE")


@pytest.mark.req("KBTP-QUOTA-INITIATOR", "KBTP-QUOTA-USAGE")
def test_quota_respected(kbtp_initiator: InitiatorUnderTest, seed: int) -> None:
    """Asked for one allocation more than its quota, the initiator does not send it: the target never
    answers it NO_SPACE; after a FREE the next allocation goes out and succeeds."""
    bed = kbtp_initiator.bed(seed, label="quota")
    ep = bed.endpoint

    def scenario() -> Gen:
        yield from _hello(bed)
        q = ep.quota
        if q == 0:
            not_applicable("Allocation Quota 0")
        for i in range(q):
            r = yield from ep.alloc_store(ep.handle_base + i, b"q" * 8)
            expect.status_is(r, Status.OK, req="KBTP-QUOTA-USAGE", what=f"allocation {i + 1} of {q}")
        over = yield from ep.alloc_store(ep.handle_base + q, b"over")
        expect.holds(over.status != Status.OK, "an allocation over quota completed OK", req="KBTP-QUOTA-INITIATOR")
        r = yield from ep.free(ep.handle_base)
        expect.status_is(r, Status.OK, req="KBTP-QUOTA-USAGE", what="FREE")
        r = yield from ep.alloc_store(ep.handle_base + q, b"after free")
        expect.status_is(r, Status.OK, req="KBTP-QUOTA-USAGE", what="allocation after a FREE")

    bed.run_one(scenario())
    refused = bed.target.counters.count(Opcode.ALLOC_STORE, Status.NO_SPACE)
    expect.equal("ALLOC_STOREs the target had to refuse NO_SPACE", refused, 0, req="KBTP-QUOTA-INITIATOR")


@pytest.mark.req("KBTP-SEC-SINGLE-USE-STAG", "KBTP-SEC-REQUEST-INVALIDATE")
def test_single_use_stags(kbtp_initiator: InitiatorUnderTest, seed: int) -> None:
    """Every LOAD (and every STORE not sent inline) names a fresh STag that is no longer valid once the
    request completed, and asks for INVALIDATE so the completion revokes it."""
    bed = kbtp_initiator.bed(seed, label="stags")
    ep = bed.endpoint
    big = b"S" * 2000

    def scenario() -> Gen:
        yield from _hello(bed)
        r = yield from ep.alloc_store(ep.handle_base, big, seal=True)
        expect.status_is(r, Status.OK, req="KBTP-SEC-SINGLE-USE-STAG", what="ALLOC_STORE")
        for _ in range(3):
            r = yield from ep.load(ep.handle_base, 4096)
            expect.status_is(r, Status.OK, req="KBTP-SEC-SINGLE-USE-STAG", what="LOAD")

    bed.run_one(scenario())
    stags = []
    for rec in bed.messages():
        m = rec.message
        if isinstance(m, Load) or (isinstance(m, AllocStore | Store) and m.inline is None):
            stags.append(m.data.stag)
            expect.holds(not bed.fabric._nodes["I"].is_valid(m.data.stag),
                         f"STag {m.data.stag:#x} of a completed {type(m).__name__} is still valid",
                         req="KBTP-SEC-SINGLE-USE-STAG")
            if kbtp_initiator.params.requests_invalidate:
                expect.holds(bool(m.flags & RequestFlags.INVALIDATE),
                             f"{type(m).__name__} does not request INVALIDATE", req="KBTP-SEC-REQUEST-INVALIDATE")
    expect.holds(len(stags) >= 3, f"only {len(stags)} requests named an STag", req="KBTP-SEC-SINGLE-USE-STAG")
    expect.equal("distinct STags over the requests", len(set(stags)), len(stags), req="KBTP-SEC-SINGLE-USE-STAG")
