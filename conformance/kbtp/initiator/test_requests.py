"""kbtp-initiator: what the initiator sends — HELLO, requests inside its own handle range and quota, the
Generation it expects, its byte order, single-use STags (KBTP "Session Establishment", "Common Header",
"Descriptors", "Allocation Quotas", "Security Considerations").

The harness plays the target (the reference, observing every message); what the initiator under test did
is judged afterwards from what the target received. An initiator that fails an operation it was asked to
do (it raised, or never finished) fails the check on the requirement that says it does that."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pytest

from kvconform.conformance.kbtp import expect
from kvconform.conformance.kbtp.client import Gen, precise
from kvconform.conformance.kbtp.observer import InitiatorBed
from kvconform.fixtures.kbtp import InitiatorUnderTest
from kvconform.kbtp.constants import FLAGS_OF_OPCODE, Features, Opcode, RequestFlags, Status
from kvconform.kbtp.messages import AllocStore, Free, Goodbye, Hello, HelloAck, Load, Store
from kvconform.verdicts import check, not_applicable


def _hello(bed: InitiatorBed, req: str = "KBTP-HELLO-FIRST") -> Gen:
    granted = yield from bed.op(bed.endpoint.hello())
    check(granted is not None, "the initiator's HELLO was refused by the harness target (or it sent none)", req=req)
    return granted


def _ack(bed: InitiatorBed, req: str) -> HelloAck:
    ack = bed.ack
    check(ack is not None, "the initiator never obtained a session from the harness target", req=req)
    return ack  # type: ignore[return-value]


@pytest.mark.req("KBTP-HELLO-FIRST", "KBTP-RDMAP-SEND", "KBTP-HDR-LAYOUT", "KBTP-HDR-VERSION", "KBTP-HELLO-HEADER-ZERO",
                 "KBTP-HELLO-LAYOUT")
def test_hello(kbtp_initiator: InitiatorUnderTest, seed: int) -> None:
    """The first message, sent as a Send, is a well-formed HELLO: Version 1, zero Request ID, Block Handle,
    Generation and Status, and Completion Credits > 0 (judged from its octets first, so a HELLO the harness
    target refused is blamed on the field that made it refuse)."""
    bed = kbtp_initiator.bed(seed, label="hello")
    granted = bed.run_one(bed.op(bed.endpoint.hello()))
    messages = bed.messages()
    check(bool(messages), "no message of the initiator arrived as a Send", req="KBTP-RDMAP-SEND")
    first = messages[0]
    raw = first.raw
    check(len(raw) >= 24 and raw[1] == Opcode.HELLO, "the first message is not a HELLO", req="KBTP-HELLO-FIRST",
          seen=raw[:2])
    expect.equal("HELLO Version", raw[0], 1, req="KBTP-HDR-VERSION", offset=0)
    for name, off, width in (("Request ID", 4, 8), ("Block Handle", 12, 8), ("Generation", 20, 2), ("Status", 22, 2)):
        expect.equal(f"HELLO {name}", int.from_bytes(raw[off:off + width], "big"), 0, req="KBTP-HELLO-HEADER-ZERO",
                     offset=off)
    msg = first.message
    check(isinstance(msg, Hello), f"the first message does not decode: {first.error}", req=precise(
          first.error_requirement, "KBTP-HDR-LAYOUT"), seen=raw[:48])
    check(msg.completion_credits > 0, "HELLO Completion Credits is 0", req="KBTP-HELLO-LAYOUT",  # type: ignore[union-attr]
          seen=msg.completion_credits)  # type: ignore[union-attr]
    check(granted is not None, "the harness target refused the initiator's HELLO", req="KBTP-HELLO-FIRST")
    bed.settle(req="KBTP-HELLO-FIRST")


@pytest.mark.req("KBTP-HELLO-ID-ENTROPY", "KBTP-HELLO-FIRST")
def test_initiator_id_entropy(kbtp_initiator: InitiatorUnderTest, seed: int) -> None:
    """Fresh initiators send Initiator IDs that differ from one another and are not low-entropy patterns."""
    ids = []
    for k in range(3):
        bed = kbtp_initiator.bed(seed * 10 + k, label=f"hello-{k}")
        bed.run_one(_hello(bed))
        bed.settle(req="KBTP-HELLO-FIRST")
        msg = bed.messages()[0].message
        check(isinstance(msg, Hello), "the first message is not a HELLO", req="KBTP-HELLO-FIRST")
        iid = bytes(msg.initiator_id)
        check(len(set(iid)) >= 8, f"Initiator ID {iid.hex()} has only {len(set(iid))} distinct octets",
              req="KBTP-HELLO-ID-ENTROPY")
        ids.append(iid)
    expect.equal("distinct Initiator IDs of 3 fresh initiators", len(set(ids)), 3, req="KBTP-HELLO-ID-ENTROPY")


# ---- one session of stores, loads and frees, judged by several checks ----------------------------------------


@dataclass
class RequestRun:
    """What the initiator sent when asked to store, store again, load and free (see ``_requests``)."""

    bed: InitiatorBed
    gens: dict[int, int]
    statuses: list[tuple[str, int]]

    def requests(self, req: str, precise: frozenset[str] = frozenset()) -> list[Any]:
        """The decoded requests after HELLO. One that does not decode violates ``req``, or the requirement the
        codec names for it when that is one of ``precise`` (ids the calling check cites)."""
        ack = _ack(self.bed, "KBTP-HELLO-FIRST")
        addr_le = bool(ack.features & Features.ADDR_LE)
        out = []
        for rec in self.bed.messages()[1:]:
            check(rec.message is not None, f"a request does not decode under ADDR_LE={addr_le}: {rec.error} "
                  f"(octets {rec.raw[:40].hex(' ')})", req=rec.error_requirement if rec.error_requirement in precise
                  else req)
            out.append(rec.message)
        return out


def _requests(kbtp_initiator: InitiatorUnderTest, seed: int) -> RequestRun:
    """ALLOC_STORE of handle 0 (sealed, inline) and 1 (by RDMA Read when larger than Max Inline), a STORE to
    1 and LOADs of both with their Generations, a FREE of 0 (freed before 1 is bound when the quota is 1),
    then GOODBYE; nothing is judged here, only run."""
    bed = kbtp_initiator.bed(seed, label="requests")
    ep = bed.endpoint
    big = bytes(range(256)) * 4
    data = {0: b"first", 1: big[:300]}
    gens: dict[int, int] = {}
    statuses: list[tuple[str, int]] = []

    def note(what: str, r: Any) -> Any:
        statuses.append((what, int(r.status)))
        return r

    def scenario() -> Gen:
        granted = yield from bed.op(ep.hello())
        if granted is None:
            return
        h0, h1 = ep.handle_base, ep.handle_base + 1
        r = note("ALLOC_STORE 0", (yield from bed.op(ep.alloc_store(h0, data[0], seal=True))))
        gens[0] = r.generation
        note("LOAD 0", (yield from bed.op(ep.load(h0, 1024, generation=gens[0]))))
        freed = ep.quota < 2  # with a quota of 1, handle 0 goes before handle 1 is bound
        if freed:
            note("FREE 0", (yield from bed.op(ep.free(h0, generation=gens[0]))))
        r = note("ALLOC_STORE 1", (yield from bed.op(ep.alloc_store(h1, data[1], seal=False))))
        gens[1] = r.generation
        note("LOAD 1", (yield from bed.op(ep.load(h1, 1024, allow_unsealed=True, generation=gens[1]))))
        note("STORE 1", (yield from bed.op(ep.store(h1, b"second, again", seal=True, generation=gens[1]))))
        if not freed:
            note("FREE 0", (yield from bed.op(ep.free(h0, generation=gens[0]))))
        yield from bed.op(ep.goodbye(False))

    bed.run_one(scenario())
    return RequestRun(bed, gens, statuses)


@pytest.fixture(scope="module")
def request_run(kbtp_initiator: InitiatorUnderTest, session_seed: int) -> RequestRun:
    if kbtp_initiator.target_params.quota < 1:
        not_applicable("PICS kbtp.target.quota is 0: the initiator can bind nothing")
    return _requests(kbtp_initiator, session_seed)


@pytest.mark.req("KBTP-BODY-LAYOUT", "KBTP-DESC-INLINE", "KBTP-DESC-DATA", "KBTP-FLAGS", "KBTP-HELLO-FIRST")
def test_request_bodies(request_run: RequestRun) -> None:
    """Every request the initiator sent decodes under the session's byte order; inline data has a descriptor
    with zero STag and Tagged Offset and the inline length, other data a descriptor naming a buffer (an STag,
    a non-zero Length); only flags the text defines are set."""
    for m in request_run.requests("KBTP-BODY-LAYOUT", frozenset({"KBTP-DESC-INLINE", "KBTP-FLAGS"})):
        if isinstance(m, AllocStore | Store) and m.inline is not None:
            expect.equal(f"{type(m).__name__} inline Data Descriptor (STag, Tagged Offset, Length)",
                         (m.data.stag, m.data.tagged_offset, m.data.length), (0, 0, len(m.inline)),
                         req="KBTP-DESC-INLINE")
        elif isinstance(m, AllocStore | Store | Load):
            check(m.data.stag != 0 and m.data.length > 0, f"{type(m).__name__} Data Descriptor names no buffer",
                  req="KBTP-DESC-DATA", seen=(m.data.stag, m.data.tagged_offset, m.data.length))
        defined = FLAGS_OF_OPCODE.get(Opcode(m.OPCODE), 0)
        check(not m.flags & ~defined, f"{type(m).__name__} sets Flags {m.flags:#06x} the text does not define for it",
              req="KBTP-FLAGS", seen=m.flags, expected=f"within {defined:#06x}")
    request_run.bed.settle(req="KBTP-HELLO-FIRST")


@pytest.mark.req("KBTP-HANDLE-OWN-RANGE", "KBTP-HELLO-FIRST")
def test_requests_in_own_range(request_run: RequestRun) -> None:
    """Every store, load and free names a handle of the initiator's own range."""
    ack = _ack(request_run.bed, "KBTP-HELLO-FIRST")
    lo, hi = ack.handle_base, ack.handle_base + ack.handle_count
    for m in request_run.requests("KBTP-HELLO-FIRST"):
        if isinstance(m, AllocStore | Store | Free | Load):
            check(lo <= m.handle < hi, f"{type(m).__name__} names handle {m.handle:#x}, outside the range "
                  f"[{lo:#x}, {hi:#x})", req="KBTP-HANDLE-OWN-RANGE")
    request_run.bed.settle(req="KBTP-HELLO-FIRST")


@pytest.mark.req("KBTP-HDR-VERSION", "KBTP-HDR-STATUS-ZERO", "KBTP-HELLO-FIRST")
def test_request_headers(request_run: RequestRun) -> None:
    """Every request has Version 1 and Status 0 (read from the octets: a request the codec refuses for them
    is judged here too)."""
    _ack(request_run.bed, "KBTP-HELLO-FIRST")
    for rec in request_run.bed.messages()[1:]:
        check(len(rec.raw) >= 24, f"a message of {len(rec.raw)} octets has no common header", req="KBTP-HDR-VERSION")
        opcode = rec.raw[1]
        expect.equal(f"Version of a message with Opcode {opcode:#04x}", rec.raw[0], 1, req="KBTP-HDR-VERSION", offset=0)
        expect.equal(f"Status of a request with Opcode {opcode:#04x}", int.from_bytes(rec.raw[22:24], "big"), 0,
                     req="KBTP-HDR-STATUS-ZERO", offset=22)
    request_run.bed.settle(req="KBTP-HELLO-FIRST")


@pytest.mark.req("KBTP-HDR-GEN-REQUEST", "KBTP-HELLO-FIRST")
def test_request_generations(request_run: RequestRun) -> None:
    """Asked to STORE, LOAD and FREE with the Generation the caller expects, the initiator puts exactly that
    Generation in each request (and the harness target served them OK)."""
    gens = request_run.gens
    expected = {Opcode.STORE: [gens.get(1)], Opcode.LOAD: [gens.get(0), gens.get(1)], Opcode.FREE: [gens.get(0)]}
    for m in request_run.requests("KBTP-HELLO-FIRST"):
        if isinstance(m, Store | Free | Load):
            op = Opcode(m.OPCODE)
            check(bool(expected[op]), f"more {op.name} requests than the caller asked for", req="KBTP-HDR-GEN-REQUEST")
            expect.equal(f"{op.name} Generation", m.generation, expected[op].pop(0), req="KBTP-HDR-GEN-REQUEST",
                         offset=20)
    for what, status in request_run.statuses:
        expect.equal(f"Status of the initiator's {what}", expect.status_name(status), "OK", req="KBTP-HDR-GEN-REQUEST")
    request_run.bed.settle(req="KBTP-HDR-GEN-REQUEST")


@pytest.mark.req("KBTP-ADDRLE-INITIATOR", "KBTP-HELLO-FIRST")
def test_addr_le_requests(kbtp_initiator: InitiatorUnderTest, request_run: RequestRun) -> None:
    """Under ADDR_LE the Block Handle and the descriptors are little-endian: every request decodes that way
    and names a handle of the initiator's range."""
    kbtp_initiator.require(Features.ADDR_LE)
    ack = _ack(request_run.bed, "KBTP-HELLO-FIRST")
    check(bool(ack.features & Features.ADDR_LE), "the harness target did not set ADDR_LE", req="KBTP-HELLO-FIRST")
    lo, hi = ack.handle_base, ack.handle_base + ack.handle_count
    for m in request_run.requests("KBTP-ADDRLE-INITIATOR"):
        if isinstance(m, AllocStore | Store | Free | Load):
            check(lo <= m.handle < hi, f"{type(m).__name__} names handle {m.handle:#x} read little-endian, outside "
                  f"[{lo:#x}, {hi:#x}): is it big-endian?", req="KBTP-ADDRLE-INITIATOR")
    request_run.bed.settle(req="KBTP-HELLO-FIRST")


@pytest.mark.req("KBTP-GOODBYE", "KBTP-HELLO-FIRST")
def test_goodbye(request_run: RequestRun) -> None:
    """Asked to end its session, the initiator sends GOODBYE (without RELEASE when asked to keep its
    bindings)."""
    byes = [m for m in request_run.requests("KBTP-HELLO-FIRST") if isinstance(m, Goodbye)]
    check(bool(byes), "no GOODBYE reached the target", req="KBTP-GOODBYE")
    expect.equal("GOODBYE Flags (RELEASE not asked for)", byes[-1].flags, 0, req="KBTP-GOODBYE")
    request_run.bed.settle(req="KBTP-HELLO-FIRST")


@pytest.mark.req("KBTP-QUOTA-INITIATOR", "KBTP-QUOTA-USAGE", "KBTP-HELLO-FIRST")
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
            r = yield from bed.op(ep.alloc_store(ep.handle_base + i, b"q" * 8))
            expect.status_is(r, Status.OK, req="KBTP-QUOTA-USAGE", what=f"allocation {i + 1} of {q}")
        over = yield from bed.op(ep.alloc_store(ep.handle_base + q, b"over"))
        check(over.status != Status.OK, "an allocation over quota completed OK", req="KBTP-QUOTA-INITIATOR")
        r = yield from bed.op(ep.free(ep.handle_base))
        expect.status_is(r, Status.OK, req="KBTP-QUOTA-USAGE", what="FREE")
        r = yield from bed.op(ep.alloc_store(ep.handle_base + q, b"after free"))
        expect.status_is(r, Status.OK, req="KBTP-QUOTA-USAGE", what="allocation after a FREE")

    bed.run_one(scenario())
    refused = bed.target.counters.count(Opcode.ALLOC_STORE, Status.NO_SPACE)
    expect.equal("ALLOC_STOREs the target had to refuse NO_SPACE", refused, 0, req="KBTP-QUOTA-INITIATOR")
    bed.settle(req="KBTP-QUOTA-USAGE")


@pytest.mark.req("KBTP-SEC-SINGLE-USE-STAG", "KBTP-SEC-REQUEST-INVALIDATE", "KBTP-HELLO-FIRST")
def test_single_use_stags(kbtp_initiator: InitiatorUnderTest, seed: int) -> None:
    """Every LOAD (and every STORE not sent inline) names a fresh STag that is no longer valid once the
    request completed, and asks for INVALIDATE so the completion revokes it (when PICS says it does)."""
    bed = kbtp_initiator.bed(seed, label="stags")
    ep = bed.endpoint
    big = b"S" * 2000

    def scenario() -> Gen:
        yield from _hello(bed)
        r = yield from bed.op(ep.alloc_store(ep.handle_base, big, seal=True))
        expect.status_is(r, Status.OK, req="KBTP-SEC-SINGLE-USE-STAG", what="ALLOC_STORE")
        for _ in range(3):
            r = yield from bed.op(ep.load(ep.handle_base, 4096))
            expect.status_is(r, Status.OK, req="KBTP-SEC-SINGLE-USE-STAG", what="LOAD")

    bed.run_one(scenario())
    bed.settle(req="KBTP-SEC-SINGLE-USE-STAG")
    stags = []
    for rec in bed.messages():
        m = rec.message
        if isinstance(m, Load) or (isinstance(m, AllocStore | Store) and m.inline is None):
            stags.append(m.data.stag)
            check(not bed.initiator_node.is_valid(m.data.stag),
                  f"STag {m.data.stag:#x} of a completed {type(m).__name__} is still valid",
                  req="KBTP-SEC-SINGLE-USE-STAG")
            if kbtp_initiator.params.requests_invalidate:
                check(bool(m.flags & RequestFlags.INVALIDATE), f"{type(m).__name__} does not request INVALIDATE",
                      req="KBTP-SEC-REQUEST-INVALIDATE")
    check(len(stags) >= 3, f"only {len(stags)} requests named an STag", req="KBTP-SEC-SINGLE-USE-STAG")
    expect.equal("distinct STags over the requests", len(set(stags)), len(stags), req="KBTP-SEC-SINGLE-USE-STAG")
