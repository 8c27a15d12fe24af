"""kbtp-target: the four operations, their validation rules and status codes, the text's example
vectors, completions, and malformed requests crafted with scapy (KBTP "Operations", "Block Load",
"Block Mapped Store", "Block Unmapped Store", "Block Free", "Completion", "Status Codes", "Examples")."""

from __future__ import annotations

import itertools
import struct
from collections.abc import Callable
from dataclasses import dataclass

import pytest

from kvconform.conformance.kbtp import expect
from kvconform.conformance.kbtp.client import Gen, HarnessError, HarnessInitiator, header_only
from kvconform.fixtures import evidence
from kvconform.fixtures.kbtp import TargetUnderTest
from kvconform.kbtp.constants import Features, Opcode, RequestFlags, Status
from kvconform.kbtp.layers import KBTP, KBTPLoad, craft
from kvconform.kbtp.messages import AllocStore, DataDescriptor, Load
from kvconform.rdma import Access
from kvconform.verdicts import check_one_of

# KBTP "Examples": ALLOC_STORE of "KVBLOCK!" inline to handle 0x4001, Request ID 7, flags INLINE.
EXAMPLE_ALLOC_STORE = bytes.fromhex(
    "01 12 00 01 00 00 00 00 00 00 00 07 00 00 00 00 00 00 40 01 00 00 00 00"
    "00 00 00 00 00 00 00 00 00 00 00 00 00 00 00 08 4b 56 42 4c 4f 43 4b 21")
# Its COMPLETION (Generation 5, Data Length 8, Block Offset 0x150000).
EXAMPLE_COMPLETION = bytes.fromhex(
    "01 20 00 00 00 00 00 00 00 00 00 07 00 00 00 00 00 00 40 01 00 05 00 00"
    "00 00 00 08 00 00 00 00 00 00 00 00 00 15 00 00")
SEAL = int(RequestFlags.SEAL)


@pytest.mark.req("KBTP-EX-ALLOC-STORE", "KBTP-EX-COMPLETION", "KBTP-HDR-LAYOUT", "KBTP-HDR-REQID-ECHO",
                 "KBTP-COMPLETION-LAYOUT", "KBTP-BYTE-ORDER", "KBTP-DESC-INLINE", "KBTP-ALLOC-COMPLETE",
                 "KBTP-POOL-OFFSETS", "KBTP-FLAGS", "KBTP-BODY-LAYOUT", "KBTP-OPCODES", "KBTP-STATUS-CODES")
def test_example_alloc_store(kbtp_target: TargetUnderTest, seed: int) -> None:
    """The text's 48 octets, sent as they are (handle 0x4001 rebased into the harness's range when the
    target's range does not hold it), answer with the 40-octet COMPLETION of the example's shape."""
    bed = kbtp_target.bed(seed, label="example")
    a = bed.initiator("A")

    def scenario() -> Gen:
        ack = yield from a.hello(Features(0))
        request = EXAMPLE_ALLOC_STORE
        handle = 0x4001
        if not ack.handle_base <= handle < ack.handle_base + ack.handle_count:
            handle = ack.handle_base + 1
            request = request[:12] + struct.pack(">Q", handle) + request[20:]
        if ack.features & Features.ADDR_LE:
            # The example is for a session without ADDR_LE; under it the Block Handle and descriptor are
            # little-endian (KBTP-ADDRLE-INITIATOR), everything else is the text's octets.
            evidence.note("target set ADDR_LE: the example's Block Handle and Data Descriptor re-encoded little-endian")
            request = (request[:12] + struct.pack("<Q", handle) + request[20:24]
                       + struct.pack("<IQI", 0, 0, 8) + request[40:])
        reply = yield from a.call(request)
        raw = reply.raw
        expect.equal("COMPLETION length", len(raw), 40, req="KBTP-EX-COMPLETION")
        want = EXAMPLE_COMPLETION[:12] + struct.pack(">Q", handle)
        expect.equal("COMPLETION Version..Block Handle (octets 0-19)", raw[:20], want, req="KBTP-HDR-REQID-ECHO")
        expect.equal("Status", struct.unpack_from(">H", raw, 22)[0], 0, req="KBTP-STATUS-CODES", offset=22)
        gen = struct.unpack_from(">H", raw, 20)[0]
        expect.holds(gen != 0, "COMPLETION Generation at offset 20 is 0", req="KBTP-ALLOC-COMPLETE")
        expect.equal("Data Length", struct.unpack_from(">I", raw, 24)[0], 8, req="KBTP-EX-COMPLETION", offset=24)
        expect.equal("Reserved", struct.unpack_from(">I", raw, 28)[0], 0, req="KBTP-COMPLETION-LAYOUT", offset=28)
        offset = struct.unpack_from(">Q", raw, 32)[0]  # the pool's base is not visible here (see test_direct)
        got_reply, got = yield from a.load(handle, 8, flags=RequestFlags.ALLOW_UNSEALED)
        expect.status_is(got_reply, Status.OK, req="KBTP-EX-ALLOC-STORE", what="LOAD of the example block")
        expect.equal("loaded data", got, b"KVBLOCK!", req="KBTP-EX-ALLOC-STORE")
        expect.equal("LOAD Block Offset", got_reply.message.block_offset, offset, req="KBTP-POOL-OFFSETS")

    bed.run_one(scenario())


# ---- validation rules and status codes ------------------------------------------------------------


@dataclass(frozen=True)
class Case:
    """One invalid request against a prepared initiator: what to send, the status it must get, and the
    requirements it checks. ``prep`` binds handle 0 (sealed, 16 octets) and handle 1 (unsealed)."""

    id: str
    reqs: tuple[str, ...]
    expected: Status
    send: Callable[[HarnessInitiator, int], Gen]


def _load(h: int, *, flags: int = 0, gen: int = 0, length: int = 64) -> Callable[[HarnessInitiator, int], Gen]:
    def go(a: HarnessInitiator, base: int) -> Gen:
        reply, _ = yield from a.load(base + h if h >= 0 else -h, length, flags=flags, generation=gen)
        return reply
    return go


def _store(h: int, *, gen: int = 0, length: int = 8, flags: int = SEAL) -> Callable[[HarnessInitiator, int], Gen]:
    def go(a: HarnessInitiator, base: int) -> Gen:
        reply = yield from a.store(base + h if h >= 0 else -h, b"s" * length, generation=gen, flags=flags)
        return reply
    return go


def _alloc(h: int, *, length: int = 8) -> Callable[[HarnessInitiator, int], Gen]:
    def go(a: HarnessInitiator, base: int) -> Gen:
        reply = yield from a.alloc_store(base + h if h >= 0 else -h, b"a" * length)
        return reply
    return go


def _free(h: int, *, gen: int = 0) -> Callable[[HarnessInitiator, int], Gen]:
    def go(a: HarnessInitiator, base: int) -> Gen:
        reply = yield from a.free(base + h if h >= 0 else -h, generation=gen)
        return reply
    return go


def _alloc_rdma(h: int, length: int) -> Callable[[HarnessInitiator, int], Gen]:
    def go(a: HarnessInitiator, base: int) -> Gen:
        src = a.buffer(length, Access.REMOTE_READ, b"r" * length)
        reply = yield from a.alloc_store(base + h, b"r" * length, source=src)
        return reply
    return go


OUTSIDE = -0x7FFF_0000_0000_0000  # a handle no initiator is authorised for
BIG = 1 << 20

CASES = [
    Case("load-outside-range", ("KBTP-VAL-HANDLE",), Status.INVALID_HANDLE, _load(OUTSIDE)),
    Case("store-outside-range", ("KBTP-STORE-OWN-RANGE", "KBTP-VAL-HANDLE"), Status.INVALID_HANDLE, _store(OUTSIDE)),
    Case("alloc-outside-range", ("KBTP-ALLOC-OWN-RANGE", "KBTP-VAL-HANDLE"), Status.INVALID_HANDLE, _alloc(OUTSIDE)),
    Case("free-outside-range", ("KBTP-FREE-OWN-RANGE", "KBTP-VAL-HANDLE"), Status.INVALID_HANDLE, _free(OUTSIDE)),
    Case("load-stale-generation", ("KBTP-VAL-GENERATION",), Status.STALE_GENERATION, _load(0, gen=-1)),
    Case("store-stale-generation", ("KBTP-VAL-GENERATION",), Status.STALE_GENERATION, _store(1, gen=-1)),
    Case("free-stale-generation", ("KBTP-VAL-GENERATION",), Status.STALE_GENERATION, _free(0, gen=-1)),
    Case("load-unbound", ("KBTP-LOAD-VALID",), Status.NOT_VALID, _load(5)),
    Case("store-unbound", ("KBTP-STORE-VALID",), Status.NOT_VALID, _store(5)),
    Case("free-unbound", ("KBTP-FREE-VALID",), Status.NOT_VALID, _free(5)),
    Case("alloc-bound", ("KBTP-ALLOC-NOT-BOUND",), Status.ALREADY_BOUND, _alloc(0)),
    Case("store-sealed", ("KBTP-STORE-UNSEALED",), Status.SEALED, _store(0)),
    Case("load-unsealed", ("KBTP-LOAD-SEALED",), Status.NOT_SEALED, _load(1)),
    Case("load-into-short-buffer", ("KBTP-LOAD-FITS", "KBTP-VAL-LENGTH"), Status.TOO_LARGE, _load(0, length=15)),
    Case("alloc-over-block-size", ("KBTP-VAL-LENGTH",), Status.TOO_LARGE, _alloc_rdma(6, BIG)),
]


def _prepare(a: HarnessInitiator) -> Gen:
    ack = yield from a.hello(Features(0))
    assert a.session is not None
    r0 = yield from a.alloc_store(a.session.handle(0), b"0" * 16)
    r1 = yield from a.alloc_store(a.session.handle(1), b"1" * 16, flags=0)
    for r, what in ((r0, "sealed ALLOC_STORE of handle 0"), (r1, "unsealed ALLOC_STORE of handle 1")):
        expect.status_is(r, Status.OK, req="KBTP-ALLOC-COMPLETE", what=what)
    return ack.handle_base, r0.generation, r1.generation


@pytest.mark.parametrize("case", [pytest.param(c, marks=pytest.mark.req(*c.reqs), id=c.id) for c in CASES])
@pytest.mark.req("KBTP-VAL-NO-EFFECT", "KBTP-STATUS-CODES")
def test_validation(case: Case, kbtp_target: TargetUnderTest, seed: int) -> None:
    """A request that fails one validation rule completes with its status and has no other effect:
    handles 0 and 1 keep their data, Generation and Data Length."""
    bed = kbtp_target.bed(seed, label=case.id)
    a = bed.initiator("A")

    def scenario() -> Gen:
        base, g0, g1 = yield from _prepare(a)
        send = case.send
        if "stale" in case.id:  # a non-zero Generation other than the entry's
            gen = {0: g0, 1: g1}[1 if "store" in case.id else 0]
            wrong = gen % 0xFFFF + 1
            send = {"load": _load(0, gen=wrong), "store": _store(1, gen=wrong), "free": _free(0, gen=wrong)}[
                case.id.split("-")[0]]
        reply = yield from send(a, base)
        expect.status_is(reply, case.expected, req=case.reqs[0], what=case.id)
        for h, gen, data, flags in ((0, g0, b"0" * 16, 0), (1, g1, b"1" * 16, RequestFlags.ALLOW_UNSEALED)):
            again, got = yield from a.load(base + h, 64, flags=flags)
            expect.status_is(again, Status.OK, req="KBTP-VAL-NO-EFFECT", what=f"LOAD of handle {h} after {case.id}")
            expect.equal(f"Generation of handle {h} after {case.id}", again.generation, gen, req="KBTP-VAL-NO-EFFECT")
            expect.equal(f"data of handle {h} after {case.id}", got, data, req="KBTP-VAL-NO-EFFECT")

    bed.run_one(scenario())


# ---- the operations ------------------------------------------------------------------------------------


@pytest.mark.req("KBTP-STORE-DATA", "KBTP-RDMAP-DATA-OPS", "KBTP-LOAD-WRITE", "KBTP-LOAD-COMPLETE",
                 "KBTP-HDR-GEN-COMPLETION", "KBTP-HDR-GEN-REQUEST", "KBTP-DESC-DATA", "KBTP-SEAL-IMMUTABLE")
def test_store_and_load_round_trip(kbtp_target: TargetUnderTest, seed: int) -> None:
    """ALLOC_STORE unsealed by RDMA Read, STORE by RDMA Read then inline with SEAL, LOAD by RDMA Write of
    exactly Data Length octets; completions carry the entry's Block Offset, Data Length and Generation."""
    bed = kbtp_target.bed(seed, label="round-trip")
    a = bed.initiator("A")
    bs = kbtp_target.params.block_size
    first = bytes(range(256)) * (bs // 256) + bytes(bs % 256)
    second = b"second version"

    def scenario() -> Gen:
        yield from a.hello(Features(0))
        assert a.session is not None
        h = a.session.handle(4)
        src = a.buffer(len(first), Access.REMOTE_READ, first)  # the target may only read it
        r = yield from a.alloc_store(h, first, flags=0, source=src)
        expect.status_is(r, Status.OK, req="KBTP-RDMAP-DATA-OPS", what="ALLOC_STORE by RDMA Read")
        gen, offset = r.generation, r.message.block_offset
        dst = a.buffer(bs + 64, Access.REMOTE_WRITE)  # the target may only write it
        dst.write(0, b"\xee" * (bs + 64))
        lr, got = yield from a.load(h, bs + 64, flags=RequestFlags.ALLOW_UNSEALED, dest=dst)
        expect.status_is(lr, Status.OK, req="KBTP-RDMAP-DATA-OPS", what="LOAD by RDMA Write")
        expect.equal("loaded block", got, first, req="KBTP-LOAD-WRITE")
        expect.equal("octets past Data Length", dst.read(bs, 64), b"\xee" * 64, req="KBTP-LOAD-WRITE")
        expect.equal("LOAD Data Length", lr.message.data_length, len(first), req="KBTP-LOAD-COMPLETE")
        expect.equal("LOAD Block Offset", lr.message.block_offset, offset, req="KBTP-LOAD-COMPLETE")
        expect.equal("LOAD Generation", lr.generation, gen, req="KBTP-HDR-GEN-COMPLETION")
        sr = yield from a.store(h, second, flags=SEAL, generation=gen)
        expect.status_is(sr, Status.OK, req="KBTP-STORE-DATA", what="inline STORE with SEAL and the right Generation")
        expect.equal("STORE Generation", sr.generation, gen, req="KBTP-HDR-GEN-COMPLETION")
        lr, got = yield from a.load(h, 64, generation=0)
        expect.status_is(lr, Status.OK, req="KBTP-STORE-DATA", what="LOAD (Generation 0 = any) of the sealed block")
        expect.equal("data after STORE", got, second, req="KBTP-STORE-DATA")
        expect.equal("Data Length after STORE", lr.message.data_length, len(second), req="KBTP-STORE-DATA")
        sr = yield from a.store(h, b"third", flags=0)
        expect.status_is(sr, Status.SEALED, req="KBTP-SEAL-IMMUTABLE", what="STORE to the sealed block")
        lr, got = yield from a.load(h, 64)
        expect.equal("data of the sealed block", got, second, req="KBTP-SEAL-IMMUTABLE")

    bed.run_one(scenario())


@pytest.mark.req("KBTP-FREE-ENTRY", "KBTP-GEN-CHANGES", "KBTP-GEN-NEXT", "KBTP-GEN-NONZERO", "KBTP-FREE-RETURN")
def test_generation_sequence(kbtp_target: TargetUnderTest, seed: int) -> None:
    """Bind / free cycles of one handle: each bind and each free changes the Generation by one, skipping
    zero, through the 16-bit wrap when the target starts near it (the reference does: see the driver);
    a freed handle is not VALID and its block is allocatable again."""
    bed = kbtp_target.bed(seed, label="generations")
    a = bed.initiator("A")
    cycles = 40

    def scenario() -> Gen:
        yield from a.hello(Features(0))
        assert a.session is not None
        h = a.session.handle(7)
        seen: list[int] = []
        for i in range(cycles):
            r = yield from a.alloc_store(h, bytes([i]) * 8)
            expect.status_is(r, Status.OK, req="KBTP-FREE-RETURN", what=f"ALLOC_STORE of cycle {i}")
            bound = r.generation
            lr, _ = yield from a.load(h, 8)
            expect.equal(f"Generation after bind {i}", lr.generation, bound, req="KBTP-GEN-CHANGES")
            f = yield from a.free(h, generation=bound)
            expect.status_is(f, Status.OK, req="KBTP-FREE-ENTRY", what=f"FREE of cycle {i}")
            lr, _ = yield from a.load(h, 8)
            expect.status_is(lr, Status.NOT_VALID, req="KBTP-FREE-ENTRY", what=f"LOAD after FREE of cycle {i}")
            expect.holds(lr.generation != bound, f"cycle {i}: Generation {bound} did not change on FREE",
                         req="KBTP-GEN-CHANGES")
            seen += [bound, lr.generation]
        for g in seen:
            expect.holds(g != 0, f"a Generation of 0 was reported (sequence {seen})", req="KBTP-GEN-NONZERO")
        for prev, nxt in itertools.pairwise(seen):
            want = prev % 0xFFFF + 1  # +1, skipping zero
            expect.equal(f"Generation after {prev:#x} (sequence {[hex(x) for x in seen]})", nxt, want,
                         req="KBTP-GEN-NEXT")
        return seen

    seen = bed.run_one(scenario())
    assert len(seen) == 2 * cycles


@pytest.mark.req("KBTP-FLAG-INVALIDATE", "KBTP-COMP-SEND", "KBTP-RDMAP-SEND")
def test_invalidate(kbtp_target: TargetUnderTest, seed: int) -> None:
    """With INVALIDATE the completion is a Send with Invalidate of the Data Descriptor's STag: the
    harness sees the STag invalidated when the completion arrives."""
    bed = kbtp_target.bed(seed, label="invalidate")
    a = bed.initiator("A")

    def scenario() -> Gen:
        yield from a.hello(Features(0))
        assert a.session is not None
        h = a.session.handle(2)
        r = yield from a.alloc_store(h, b"inv" * 4)
        expect.status_is(r, Status.OK, req="KBTP-COMP-SEND", what="ALLOC_STORE")
        expect.equal("completion carried by", r.invalidated_stag, None, req="KBTP-COMP-SEND")
        dst = a.node.register(a.node.alloc(64), Access.LOCAL_WRITE | Access.REMOTE_WRITE, remote_invalidate=True)
        lr, got = yield from a.load(h, 64, flags=RequestFlags.INVALIDATE, dest=dst)
        expect.status_is(lr, Status.OK, req="KBTP-FLAG-INVALIDATE", what="LOAD with INVALIDATE")
        expect.equal("STag invalidated by the completion", lr.invalidated_stag, dst.stag, req="KBTP-FLAG-INVALIDATE")
        expect.holds(not a.node.is_valid(dst.stag), "the Data Descriptor's STag is still valid after the "
                     "completion", req="KBTP-FLAG-INVALIDATE")
        expect.equal("loaded data", got, b"inv" * 4, req="KBTP-FLAG-INVALIDATE")

    bed.run_one(scenario())


@pytest.mark.req("KBTP-COMP-DATA-READY", "KBTP-OP-IN-ORDER")
def test_completion_after_data(kbtp_target: TargetUnderTest, session_seed: int) -> None:
    """Pipelined requests on one connection complete in order, each LOAD's data already in the buffer
    when its completion arrives, across seeded interleavings (RDMAP placement reorders Write chunks)."""
    runs = max(8, kbtp_target.interleavings // 20)
    bs = kbtp_target.params.block_size
    block = bytes((i * 7 + 3) & 0xFF for i in range(bs))
    for i in range(runs):
        bed = kbtp_target.bed(session_seed * 1000 + i, label=f"data-ready-{i}")
        a = bed.initiator("A")

        def scenario(a: HarnessInitiator = a) -> Gen:
            yield from a.hello(Features(0))
            assert a.session is not None
            h = a.session.handle(0)
            src = a.buffer(bs, Access.REMOTE_READ, block)
            dst = a.buffer(bs, Access.REMOTE_WRITE)
            # ALLOC_STORE then LOAD of the same handle, sent back to back: in-order processing means
            # the LOAD sees the stored block.
            a.send(a.enc(AllocStore(request_id=1, handle=h, flags=SEAL, data=a.descriptor(src, bs))))
            a.send(a.enc(Load(request_id=2, handle=h, data=a.descriptor(dst, bs))))
            first = yield from a.receive()
            second = yield from a.receive()
            got = dst.read(0, bs)  # read in the same step the completion was taken: no placement after it
            expect.equal("Request ID of the first completion", first.message.request_id, 1, req="KBTP-OP-IN-ORDER")
            expect.equal("Request ID of the second completion", second.message.request_id, 2, req="KBTP-OP-IN-ORDER")
            expect.status_is(second, Status.OK, req="KBTP-OP-IN-ORDER", what="LOAD pipelined after ALLOC_STORE")
            expect.equal("buffer contents when the LOAD completion arrived", got, block, req="KBTP-COMP-DATA-READY")

        bed.run_one(scenario())


# ---- malformed requests (scapy) ------------------------------------------------------------------------


def _malformed(handle: int) -> dict[str, bytes]:
    good = AllocStore.with_inline(b"malformed?", flags=SEAL, request_id=99, handle=handle)
    load = Load(request_id=99, handle=handle, data=DataDescriptor(0, 0, 8))
    return {
        "truncated-header": bytes(KBTP(opcode=Opcode.LOAD, request_id=99, handle=handle))[:17],
        "truncated-body": bytes(KBTP(request_id=99, handle=handle) / KBTPLoad(data_length=8))[:30],
        "wrong-version": craft(good, version=2),
        "version-zero": craft(load, version=0),
        "unknown-opcode": header_only(0x7E, request_id=99, handle=handle),
        "private-opcode": header_only(0xC1, request_id=99, handle=handle),
        "completion-as-request": header_only(Opcode.COMPLETION, request_id=99, handle=handle) + bytes(16),
        "status-in-request": craft(load, status=3),
        # RECORD set but only the Data Descriptor and the inline octet follow: 16 octets short.
        "record-without-descriptor": header_only(Opcode.ALLOC_STORE, flags=RequestFlags.RECORD | RequestFlags.INLINE,
                                                 request_id=99, handle=handle) + struct.pack(">IQI", 0, 0, 1) + b"x",
    }


MALFORMED = list(_malformed(0))


@pytest.mark.parametrize("kind", MALFORMED)
@pytest.mark.req("KBTP-STATUS-MALFORMED", "KBTP-HDR-VERSION", "KBTP-OPCODES", "KBTP-VAL-NO-EFFECT")
def test_malformed_request(kind: str, kbtp_target: TargetUnderTest, seed: int) -> None:
    """A request that cannot be parsed completes MALFORMED echoing its Request ID when the header is
    readable (a truncated header may instead end the connection), binds nothing, and the target keeps
    serving: a valid request afterwards succeeds."""
    bed = kbtp_target.bed(seed, label=f"malformed-{kind}")
    a = bed.initiator("A")

    def scenario() -> Gen:
        yield from a.hello(Features(0))
        assert a.session is not None
        h = a.session.handle(9)
        raw = _malformed(h)[kind]
        try:
            reply = yield from a.call(raw)
        except HarnessError:
            check_one_of("connection ended", {"connection ended"} if kind == "truncated-header" else set(),
                          what=f"reaction to {kind}", req="KBTP-STATUS-MALFORMED")
            return
        expect.status_is(reply, Status.MALFORMED, req="KBTP-STATUS-MALFORMED", what=kind)
        if kind != "truncated-header":
            expect.equal("Request ID echoed for the malformed request", reply.message.request_id, 99,
                         req="KBTP-STATUS-MALFORMED")
        lr, _ = yield from a.load(h, 16, flags=RequestFlags.ALLOW_UNSEALED)
        expect.status_is(lr, Status.NOT_VALID, req="KBTP-VAL-NO-EFFECT", what=f"LOAD of the handle after {kind}")
        r = yield from a.alloc_store(h, b"valid afterwards")
        expect.status_is(r, Status.OK, req="KBTP-STATUS-MALFORMED", what=f"a valid ALLOC_STORE after {kind}")

    bed.run_one(scenario())


@pytest.mark.parametrize("where", ["bad-stag", "past-buffer"])
@pytest.mark.req("KBTP-RING-NO-LOSS", "KBTP-VAL-NO-EFFECT")
def test_descriptor_out_of_range(where: str, kbtp_target: TargetUnderTest, seed: int) -> None:
    """An ALLOC_STORE whose Data Descriptor names a bad STag or runs past the registered buffer cannot be
    read: the handle must not end up bound to a partial block, and the block must not be lost (the
    initiator's whole quota stays allocatable, on this connection or, if the RDMA error ended it, for
    another initiator of the same target)."""
    bed = kbtp_target.bed(seed, label=f"descriptor-{where}")
    a = bed.initiator("A")
    q = kbtp_target.params.quota

    def scenario() -> Gen:
        yield from a.hello(Features(0))
        assert a.session is not None
        h = a.session.handle(0)
        src = a.buffer(64, Access.REMOTE_READ, b"d" * 64)
        desc = DataDescriptor(src.stag ^ 0x5A5A00, src.to(0), 64) if where == "bad-stag" else \
            DataDescriptor(src.stag, src.to(0), 64 + 4096 * 64)
        size = min(desc.length, kbtp_target.params.block_size)
        desc = DataDescriptor(desc.stag, desc.tagged_offset, size) if where == "bad-stag" else desc
        outcome = "completed"
        try:
            r = yield from a.call(a.enc(AllocStore(request_id=5, handle=h, flags=SEAL, data=desc)))
            expect.holds(r.status != Status.OK, f"ALLOC_STORE from an unreadable source ({where}) completed OK",
                         req="KBTP-VAL-NO-EFFECT")
        except HarnessError:
            outcome = "connection ended"
        # The RDMA error may have ended the connection: the same initiator reconnects (its session is retained).
        user = (yield from bed.reconnect(a)) if a.broken else a
        assert user.session is not None
        lr, _ = yield from user.load(h, 64, flags=RequestFlags.ALLOW_UNSEALED)
        expect.status_is(lr, Status.NOT_VALID, req="KBTP-VAL-NO-EFFECT",
                         what=f"LOAD of the handle after the failed ALLOC_STORE ({where}, {outcome})")
        for i in range(q):
            r = yield from user.alloc_store(user.session.handle(20 + i), b"after")  # the whole quota is free
            expect.status_is(r, Status.OK, req="KBTP-RING-NO-LOSS",
                             what=f"ALLOC_STORE {i + 1} of {q} after the failed one ({outcome})")

    bed.run_one(scenario())


