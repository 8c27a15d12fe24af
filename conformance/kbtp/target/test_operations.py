"""kbtp-target: the four operations, their validation rules and status codes, the text's example
vectors, completions, and malformed requests crafted with scapy (KBTP "Operations", "Block Load",
"Block Mapped Store", "Block Unmapped Store", "Block Free", "Completion", "Status Codes", "Examples").

Where a request breaks two rules whose order the text leaves open, every status those rules name is
acceptable (the Case tables below are data): the suite sends requests that break one rule where it can,
and widens the acceptable set where it cannot (an allocation by an initiator whose quota is full)."""

from __future__ import annotations

import itertools
import struct
from collections.abc import Callable
from dataclasses import dataclass

import pytest

from kvconform import evidence
from kvconform.conformance.kbtp import diagnose, expect, hangs
from kvconform.conformance.kbtp.prepared import KEPT_BINDING, PREPARED, prepare_handles
from kvconform.fixtures.kbtp import TargetUnderTest
from kvconform.kbtp.constants import Opcode, RequestFlags, Status
from kvconform.kbtp.layers import KBTP, KBTPLoad, craft
from kvconform.kbtp.messages import AllocStore, DataDescriptor, Load
from kvconform.rdma import Access, Region, Window
from kvconform.targets.kbtp_bed import Bed
from kvconform.targets.kbtp_client import Ended, Gen, HarnessInitiator, header_only, pattern
from kvconform.verdicts import check, check_one_of, inconclusive, not_applicable

# KBTP "Examples": ALLOC_STORE of "KVBLOCK!" inline to handle 0x4001, Request ID 7, flags INLINE.
EXAMPLE_ALLOC_STORE = bytes.fromhex(
    "01 12 00 01 00 00 00 00 00 00 00 07 00 00 00 00 00 00 40 01 00 00 00 00"
    "00 00 00 00 00 00 00 00 00 00 00 00 00 00 00 08 4b 56 42 4c 4f 43 4b 21")
# Its COMPLETION (Generation 5, Data Length 8, Block Offset 0x150000).
EXAMPLE_COMPLETION = bytes.fromhex(
    "01 20 00 00 00 00 00 00 00 00 00 07 00 00 00 00 00 00 40 01 00 05 00 00"
    "00 00 00 08 00 00 00 00 00 00 00 00 00 15 00 00")
SEAL = int(RequestFlags.SEAL)
UNSEALED_OK = int(RequestFlags.ALLOW_UNSEALED)
DEFINED_STATUS = {int(s) for s in Status}
PRIVATE_STATUS = range(0xC000, 0x10000)


def _example_request(a: HarnessInitiator) -> tuple[bytes, int]:
    """The text's 48 octets, with handle 0x4001 rebased into the session's range when it does not hold it,
    and (under ADDR_LE, which the example predates) the Block Handle and descriptor little-endian. Its 8 octets of
    inline data need a Max Inline of at least 8, a quota and a Block Size that take them (not applicable below)."""
    ack = a.ack
    a.holds(8)
    if ack.max_inline < 8:
        not_applicable(f"the target's Max Inline is {ack.max_inline}: the example's 8 octets of inline data exceed it")
    request, handle = EXAMPLE_ALLOC_STORE, 0x4001
    if not ack.handle_base <= handle < ack.handle_base + ack.handle_count:
        handle = ack.handle_base + min(1, ack.handle_count - 1)
        request = request[:12] + struct.pack(">Q", handle) + request[20:]
    if a.addr_le:
        evidence.note("target set ADDR_LE: the example's Block Handle and Data Descriptor re-encoded little-endian")
        request = (request[:12] + struct.pack("<Q", handle) + request[20:24] + struct.pack("<IQI", 0, 0, 8)
                   + request[40:])
    return request, handle


@pytest.mark.req("KBTP-EX-ALLOC-STORE", "KBTP-HELLO-FIRST", "KBTP-LOAD-COMPLETE")
def test_example_alloc_store(kbtp_target: TargetUnderTest, seed: int) -> None:
    """The text's ALLOC_STORE octets, sent as they are, complete OK and bind "KVBLOCK!" to the handle."""
    bed = kbtp_target.bed(seed, label="example")
    a = bed.initiator("A")

    def scenario() -> Gen:
        yield from bed.open(a)
        request, handle = _example_request(a)
        reply = yield from a.call(request, req="KBTP-EX-ALLOC-STORE", what="COMPLETION of the example ALLOC_STORE")
        expect.status_is(reply, Status.OK, req="KBTP-EX-ALLOC-STORE", what="the example ALLOC_STORE")
        lr, got = yield from a.load(handle, 8, flags=UNSEALED_OK)
        expect.status_is(lr, Status.OK, req="KBTP-EX-ALLOC-STORE", what="LOAD of the example block")
        expect.equal("data of the example block", got, b"KVBLOCK!", req="KBTP-EX-ALLOC-STORE")

    bed.run_one(scenario())


@pytest.mark.req("KBTP-EX-COMPLETION", "KBTP-COMPLETION-LAYOUT", "KBTP-HELLO-FIRST")
def test_example_completion(kbtp_target: TargetUnderTest, seed: int) -> None:
    """The example ALLOC_STORE's COMPLETION has the example's shape: 40 octets, Version 1, Opcode 0x20, no
    Flags, Status OK, Data Length 8, Reserved 0 (Generation and Block Offset are the target's own)."""
    bed = kbtp_target.bed(seed, label="example-completion")
    a = bed.initiator("A")

    def scenario() -> Gen:
        yield from bed.open(a)
        request, _ = _example_request(a)
        reply = yield from a.call(request, req="KBTP-EX-COMPLETION", what="COMPLETION of the example ALLOC_STORE")
        return reply.raw

    raw = bed.run_one(scenario())
    expect.equal("COMPLETION length", len(raw), len(EXAMPLE_COMPLETION), req="KBTP-EX-COMPLETION")
    expect.equal("COMPLETION Version, Opcode, Flags (octets 0-3)", raw[:4], EXAMPLE_COMPLETION[:4],
                 req="KBTP-EX-COMPLETION", offset=0)
    expect.equal("Status", struct.unpack_from(">H", raw, 22)[0], 0, req="KBTP-EX-COMPLETION", offset=22)
    expect.equal("Data Length", struct.unpack_from(">I", raw, 24)[0], 8, req="KBTP-EX-COMPLETION", offset=24)
    expect.equal("Reserved", struct.unpack_from(">I", raw, 28)[0], 0, req="KBTP-COMPLETION-LAYOUT", offset=28)


@pytest.mark.req("KBTP-HDR-REQID-ECHO", "KBTP-HELLO-FIRST")
def test_request_id_echoed(kbtp_target: TargetUnderTest, seed: int) -> None:
    """Completions echo the Request ID the initiator chose, all 64 bits of it, for requests that succeed
    and for requests that are refused."""
    bed = kbtp_target.bed(seed, label="request-ids")
    a = bed.initiator("A")
    ids = (7, 0x8000_0000_0000_0005, 0xFFFF_FFFF_FFFF_FFFE)

    def scenario() -> Gen:
        yield from bed.open(a)
        out = []
        for rid in ids:  # LOADs of an unbound handle: refused (NOT_VALID), which the check does not judge
            msg = Load(request_id=rid, handle=a.handle(5), flags=UNSEALED_OK,
                       data=a.descriptor(a.buffer(16), 16))
            reply = yield from a.call(a.enc(msg), req="KBTP-HDR-REQID-ECHO", what=f"COMPLETION of LOAD {rid:#x}")
            out.append(reply.request_id)
        alloc = AllocStore.with_inline(b"echo", flags=SEAL, request_id=ids[1] + 1, handle=a.handle(6))
        reply = yield from a.call(a.enc(alloc), req="KBTP-HDR-REQID-ECHO", what="COMPLETION of an ALLOC_STORE")
        out.append(reply.request_id)
        return out

    got = bed.run_one(scenario())
    for sent, echoed in zip((*ids, ids[1] + 1), got, strict=True):
        expect.equal(f"Request ID echoed for request {sent:#x}", echoed, sent, req="KBTP-HDR-REQID-ECHO", offset=4)


@pytest.mark.req("KBTP-POOL-OFFSETS", "KBTP-ALLOC-COMPLETE", "KBTP-HELLO-FIRST", "KBTP-QUOTA-ALLOC-BOUNDED")
@hangs.diagnosed
def test_allocations_complete_with_block_offsets(kbtp_target: TargetUnderTest, seed: int) -> None:
    """ALLOC_STORE completes with the block's Block Offset and a non-zero Generation; two blocks bound at
    once have Block Offsets that differ by a non-zero multiple of Block Size (offsets, not block numbers)."""
    bed = kbtp_target.bed(seed, label="block-offsets")
    a = bed.initiator("A")
    bs = kbtp_target.params.block_size

    def scenario() -> Gen:
        ack = yield from bed.open(a)
        if ack.allocation_quota < 2:
            not_applicable(f"Allocation Quota {ack.allocation_quota}: the check binds two blocks at once")
        replies = []
        for i in range(2):
            r = yield from a.alloc_store(a.handle(i), bytes([i]) * 8)
            expect.status_is(r, Status.OK, req="KBTP-QUOTA-ALLOC-BOUNDED", what=f"ALLOC_STORE {i}")
            check(r.generation != 0, f"ALLOC_STORE {i} completed with Generation 0", req="KBTP-ALLOC-COMPLETE",
                  seen=r.generation, expected="the entry's (non-zero) Generation")
            replies.append(r)
        return replies

    r0, r1 = bed.run_one(scenario())
    delta = abs(r0.block_offset - r1.block_offset)
    check(delta != 0 and delta % bs == 0, f"Block Offsets {r0.block_offset:#x} and {r1.block_offset:#x} of two "
          f"blocks bound at once do not differ by a non-zero multiple of Block Size {bs}",
          req="KBTP-POOL-OFFSETS", seen=delta, expected=f"a non-zero multiple of {bs}")


# ---- validation rules and status codes ------------------------------------------------------------


@dataclass(frozen=True)
class Case:
    """One invalid request against a prepared initiator: what to send, the status it must get, the
    requirements it checks, and the handles it needs bound first (0: sealed, 16 octets; 1: unsealed).
    An ALLOC_STORE sent while the quota is full also breaks the quota rule, whose order relative to the
    other checks the text leaves open: then NO_SPACE is acceptable too."""

    id: str
    reqs: tuple[str, ...]
    expected: Status
    send: Callable[[HarnessInitiator, int, str], Gen]
    needs: tuple[int, ...] = (0,)  # a bound handle whose state the no-effect rule watches
    allocates: bool = False


def _load(h: int, *, flags: int = 0, length: int = 64) -> Callable[[HarnessInitiator, int, str], Gen]:
    def go(a: HarnessInitiator, gen: int, req: str) -> Gen:
        reply, _ = yield from a.load(a.handle(h) if h >= 0 else -h, length, flags=flags, generation=gen, req=req)
        return reply
    return go


def _store(h: int, *, length: int = 8) -> Callable[[HarnessInitiator, int, str], Gen]:
    def go(a: HarnessInitiator, gen: int, req: str) -> Gen:
        reply = yield from a.store(a.handle(h) if h >= 0 else -h, b"s" * length, generation=gen, flags=SEAL, req=req,
                                   refused=True)
        return reply
    return go


def _alloc(h: int, *, length: int = 8) -> Callable[[HarnessInitiator, int, str], Gen]:
    def go(a: HarnessInitiator, gen: int, req: str) -> Gen:
        reply = yield from a.alloc_store(a.handle(h) if h >= 0 else -h, b"a" * length, req=req, refused=True)
        return reply
    return go


def _free(h: int) -> Callable[[HarnessInitiator, int, str], Gen]:
    def go(a: HarnessInitiator, gen: int, req: str) -> Gen:
        reply = yield from a.free(a.handle(h) if h >= 0 else -h, generation=gen, req=req)
        return reply
    return go


def _alloc_rdma(h: int, length: int) -> Callable[[HarnessInitiator, int, str], Gen]:
    """ALLOC_STORE by RDMA Read of ``length`` octets, or of one more than the Block Size where that is longer (a
    KV block of 2 MiB takes 1 MiB)."""
    def go(a: HarnessInitiator, gen: int, req: str) -> Gen:
        n = max(length, a.ack.block_size + 1)
        src = a.buffer(n, Access.REMOTE_READ, b"r" * n)
        reply = yield from a.alloc_store(a.handle(h), b"r" * n, source=src, req=req, refused=True)
        return reply
    return go


OUTSIDE = -0x7FFF_0000_0000_0000  # a handle no initiator is authorised for
BIG = 1 << 20
STALE = -1  # the Case's Generation: a non-zero one other than the entry's

CASES = [
    Case("load-outside-range", ("KBTP-VAL-HANDLE",), Status.INVALID_HANDLE, _load(OUTSIDE, flags=UNSEALED_OK)),
    Case("store-outside-range", ("KBTP-STORE-OWN-RANGE",), Status.INVALID_HANDLE, _store(OUTSIDE)),
    Case("alloc-outside-range", ("KBTP-ALLOC-OWN-RANGE",), Status.INVALID_HANDLE, _alloc(OUTSIDE), allocates=True),
    Case("free-outside-range", ("KBTP-FREE-OWN-RANGE",), Status.INVALID_HANDLE, _free(OUTSIDE)),
    Case("load-stale-generation", ("KBTP-VAL-GENERATION",), Status.STALE_GENERATION, _load(0), needs=(0,)),
    Case("store-stale-generation", ("KBTP-VAL-GENERATION",), Status.STALE_GENERATION, _store(1), needs=(1,)),
    Case("free-stale-generation", ("KBTP-VAL-GENERATION",), Status.STALE_GENERATION, _free(0), needs=(0,)),
    Case("load-unbound", ("KBTP-LOAD-VALID",), Status.NOT_VALID, _load(5, flags=UNSEALED_OK)),
    Case("store-unbound", ("KBTP-STORE-VALID",), Status.NOT_VALID, _store(5)),
    Case("free-unbound", ("KBTP-FREE-VALID",), Status.NOT_VALID, _free(5)),
    Case("alloc-bound", ("KBTP-ALLOC-NOT-BOUND",), Status.ALREADY_BOUND, _alloc(0), needs=(0,), allocates=True),
    Case("store-sealed", ("KBTP-STORE-UNSEALED",), Status.SEALED, _store(0), needs=(0,)),
    Case("load-unsealed", ("KBTP-LOAD-SEALED",), Status.NOT_SEALED, _load(1), needs=(1,)),
    Case("load-into-short-buffer", ("KBTP-LOAD-FITS",), Status.TOO_LARGE, _load(0, length=15), needs=(0,)),
    Case("alloc-over-block-size", ("KBTP-VAL-LENGTH",), Status.TOO_LARGE, _alloc_rdma(6, BIG), allocates=True),
]


@pytest.mark.parametrize("case", [pytest.param(c, marks=pytest.mark.req(*c.reqs), id=c.id) for c in CASES])
@pytest.mark.req("KBTP-VAL-NO-EFFECT", "KBTP-STATUS-CODES", "KBTP-HELLO-FIRST", "KBTP-QUOTA-ALLOC-BOUNDED",
                 "KBTP-LOAD-COMPLETE")
@hangs.diagnosed
@pytest.mark.blames(KEPT_BINDING)
def test_validation(case: Case, kbtp_target: TargetUnderTest, seed: int) -> None:
    """A request that fails one validation rule completes with a Status the text defines, the rule's, and has
    no other effect: the prepared handles keep their data and Generation."""
    bed = kbtp_target.bed(seed, label=case.id)
    a = bed.initiator("A")
    req = case.reqs[0]

    def scenario() -> Gen:
        ack = yield from bed.open(a)
        if len(case.needs) > ack.allocation_quota:
            not_applicable(f"Allocation Quota {ack.allocation_quota}: the case needs {len(case.needs)} bound handle(s)")
        gens = yield from prepare_handles(kbtp_target, a, case.needs)
        gen = gens[case.needs[0]] % 0xFFFF + 1 if "stale" in case.id else 0  # +1 skipping zero: never the entry's
        reply = yield from case.send(a, gen, req)
        acceptable = {case.expected}
        if case.allocates and len(case.needs) >= ack.allocation_quota:
            acceptable.add(Status.NO_SPACE)  # the quota rule is broken too; the text orders neither first
        if not isinstance(reply, Ended):
            check(reply.status in DEFINED_STATUS or reply.status in PRIVATE_STATUS,
                  f"{case.id}: Status at offset 22 is no status the text defines", req="KBTP-STATUS-CODES",
                  seen=reply.status, expected="0..11 (or Private Use)")
        expect.status_is(reply, acceptable, req=req, what=case.id)
        for h in case.needs:
            data, _ = PREPARED[h]
            again, got = yield from a.load(a.handle(h), 64, flags=UNSEALED_OK)
            expect.status_is(again, Status.OK, req="KBTP-VAL-NO-EFFECT", what=f"LOAD of handle {h} after {case.id}")
            expect.equal(f"Generation of handle {h} after {case.id}", again.generation, gens[h],
                         req="KBTP-VAL-NO-EFFECT")
            expect.equal(f"data of handle {h} after {case.id}", got, data, req="KBTP-VAL-NO-EFFECT")

    bed.run_one(scenario())


# ---- the operations ------------------------------------------------------------------------------------


@pytest.mark.req("KBTP-LOAD-WRITE", "KBTP-LOAD-COMPLETE", "KBTP-RDMAP-DATA-OPS", "KBTP-HELLO-FIRST",
                 "KBTP-QUOTA-ALLOC-BOUNDED")
@hangs.diagnosed
def test_load_writes_data_length(kbtp_target: TargetUnderTest, seed: int) -> None:
    """ALLOC_STORE by RDMA Read of a buffer the target may only read, then LOAD by RDMA Write into a buffer
    it may only write: exactly Data Length octets arrive, and the completion carries the entry's Block
    Offset, Data Length and Generation."""
    bed = kbtp_target.bed(seed, label="load")
    a = bed.initiator("A")
    bs = kbtp_target.params.block_size
    first = (bytes(range(256)) * (bs // 256 + 1))[:bs - 1]  # one octet short of the block

    def scenario() -> Gen:
        yield from bed.open(a)
        h = a.handle(4)
        src = a.buffer(len(first), Access.REMOTE_READ, first)
        r = yield from a.alloc_store(h, first, flags=0, source=src)
        expect.status_is(r, Status.OK, req="KBTP-RDMAP-DATA-OPS", what="ALLOC_STORE by RDMA Read (read-only source)")
        dst = a.buffer(bs + 64, Access.REMOTE_WRITE)
        dst.write(0, b"\xee" * (bs + 64))
        lr, got = yield from a.load(h, bs + 64, flags=UNSEALED_OK, dest=dst)
        expect.status_is(lr, Status.OK, req="KBTP-RDMAP-DATA-OPS", what="LOAD by RDMA Write (write-only destination)")
        expect.equal("loaded block", got, first, req="KBTP-LOAD-WRITE")
        expect.equal("octets past Data Length", dst.read(len(first), 64), b"\xee" * 64, req="KBTP-LOAD-WRITE")
        expect.equal("LOAD completion Data Length", lr.data_length, len(first), req="KBTP-LOAD-COMPLETE", offset=24)
        expect.equal("LOAD completion Block Offset", lr.block_offset, r.block_offset, req="KBTP-LOAD-COMPLETE",
                     offset=32)
        expect.equal("LOAD completion Generation", lr.generation, r.generation, req="KBTP-LOAD-COMPLETE", offset=20)

    bed.run_one(scenario())


@pytest.mark.req("KBTP-STORE-DATA", "KBTP-HDR-GEN-REQUEST", "KBTP-HDR-GEN-COMPLETION", "KBTP-HELLO-FIRST",
                 "KBTP-QUOTA-ALLOC-BOUNDED", "KBTP-LOAD-COMPLETE")
@hangs.diagnosed
def test_mapped_store(kbtp_target: TargetUnderTest, seed: int) -> None:
    """STORE into a bound unsealed block, by RDMA Read and then inline with SEAL, each with the entry's
    Generation: the block holds the new data and Data Length, the second seals it, and each completion
    carries the entry's Generation; LOADs with Generation 0 (any) succeed."""
    bed = kbtp_target.bed(seed, label="mapped-store")
    a = bed.initiator("A")
    bs = kbtp_target.params.block_size
    long_data = (b"by RDMA Read " * (bs // 13 + 1))[:min(bs, 1000)]
    second = b"second version"

    def scenario() -> Gen:
        yield from bed.open(a)
        h = a.handle(4)
        r = yield from a.alloc_store(h, b"first", flags=0)
        expect.status_is(r, Status.OK, req="KBTP-QUOTA-ALLOC-BOUNDED", what="unsealed ALLOC_STORE")
        gen = r.generation
        sr = yield from a.store(h, long_data, flags=0, generation=gen)  # longer than Max Inline: by RDMA Read
        expect.status_is(sr, Status.OK, req="KBTP-HDR-GEN-REQUEST", what="STORE with the entry's Generation")
        expect.equal("STORE completion Generation", sr.generation, gen, req="KBTP-HDR-GEN-COMPLETION", offset=20)
        lr, got = yield from a.load(h, bs, flags=UNSEALED_OK, generation=0)
        expect.status_is(lr, Status.OK, req="KBTP-HDR-GEN-REQUEST", what="LOAD with Generation 0 (any)")
        expect.equal("data after the STORE by RDMA Read", got, long_data, req="KBTP-STORE-DATA")
        sr = yield from a.store(h, second, flags=SEAL, generation=gen)
        expect.status_is(sr, Status.OK, req="KBTP-STORE-DATA", what="inline STORE with SEAL")
        lr, got = yield from a.load(h, bs)  # without ALLOW_UNSEALED: SEAL must have sealed it
        expect.status_is(lr, Status.OK, req="KBTP-STORE-DATA", what="LOAD (no ALLOW_UNSEALED) after STORE with SEAL")
        expect.equal("data after the inline STORE", got, second, req="KBTP-STORE-DATA")
        expect.equal("Data Length after the inline STORE", lr.data_length, len(second), req="KBTP-STORE-DATA")

    bed.run_one(scenario())


@pytest.mark.req("KBTP-SEAL-IMMUTABLE", "KBTP-HELLO-FIRST", "KBTP-QUOTA-ALLOC-BOUNDED", "KBTP-LOAD-COMPLETE")
@hangs.diagnosed
def test_sealed_block_is_immutable(kbtp_target: TargetUnderTest, seed: int) -> None:
    """Whatever is sent to a sealed block short of FREE (STOREs inline and by RDMA Read, with Generation 0
    and with the entry's, an ALLOC_STORE to its handle), its contents do not change."""
    bed = kbtp_target.bed(seed, label="sealed")
    a = bed.initiator("A")
    data = b"sealed for good"

    def scenario() -> Gen:
        yield from bed.open(a)
        h = a.handle(2)
        r = yield from a.alloc_store(h, data, flags=SEAL)
        expect.status_is(r, Status.OK, req="KBTP-QUOTA-ALLOC-BOUNDED", what="sealed ALLOC_STORE")
        for gen in (0, r.generation):
            yield from a.store(h, b"inline overwrite", flags=0, generation=gen, req="KBTP-SEAL-IMMUTABLE", refused=True)
            src = a.buffer(600, Access.REMOTE_READ, b"R" * 600)
            msg = AllocStore(request_id=a.next_id(), handle=h, flags=0, data=a.descriptor(src, 600))
            yield from a.call(a.enc(msg), req="KBTP-SEAL-IMMUTABLE", what="COMPLETION of ALLOC_STORE to a bound handle")
            yield from a.store(h, b"R" * 600, flags=0, generation=gen, req="KBTP-SEAL-IMMUTABLE", refused=True)
        lr, got = yield from a.load(h, 1024)
        expect.status_is(lr, Status.OK, req="KBTP-SEAL-IMMUTABLE", what="LOAD of the sealed block")
        expect.equal("contents of the sealed block after the stores sent to it", got, data, req="KBTP-SEAL-IMMUTABLE")

    bed.run_one(scenario())


@pytest.mark.req("KBTP-GEN-NEXT", "KBTP-GEN-NONZERO", "KBTP-GEN-CHANGES", "KBTP-HELLO-FIRST",
                 "KBTP-QUOTA-ALLOC-BOUNDED", "KBTP-LOAD-COMPLETE", "KBTP-FREE-RETURN")
@hangs.diagnosed
def test_generation_sequence(kbtp_target: TargetUnderTest, seed: int) -> None:
    """Bind / free cycles of one handle: each bind and each free changes the Generation by one, skipping
    zero (through the 16-bit wrap only when the target starts near it, as the reference driver's preset does;
    test_widths.py::test_generation_wrap drives the wrap from any start)."""
    bed = kbtp_target.bed(seed, label="generations")
    a = bed.initiator("A")
    cycles = 40

    def scenario() -> Gen:
        yield from bed.open(a)
        h = a.handle(7)
        seen: list[int] = []
        for i in range(cycles):
            r = yield from a.alloc_store(h, pattern(i, 8))
            expect.status_is(r, Status.OK, req="KBTP-QUOTA-ALLOC-BOUNDED", what=f"ALLOC_STORE of cycle {i}")
            lr, _ = yield from a.load(h, 8)
            f = yield from a.free(h)
            expect.status_is(f, Status.OK, req="KBTP-FREE-RETURN", what=f"FREE of cycle {i}")
            lf, _ = yield from a.load(h, 8, flags=UNSEALED_OK)
            check(lf.generation != lr.generation, f"cycle {i}: Generation {lr.generation} did not change on FREE",
                  req="KBTP-GEN-CHANGES", seen=lf.generation)
            seen += [lr.generation, lf.generation]
        return seen

    seen = bed.run_one(scenario())
    for g in seen:
        check(g != 0, f"a Generation of 0 was reported (sequence {[hex(x) for x in seen]})", req="KBTP-GEN-NONZERO")
    for prev, nxt in itertools.pairwise(seen):
        expect.equal(f"Generation after {prev:#x} (sequence {[hex(x) for x in seen]})", nxt, prev % 0xFFFF + 1,
                     req="KBTP-GEN-NEXT")


@pytest.mark.req("KBTP-FREE-ENTRY", "KBTP-HELLO-FIRST", "KBTP-QUOTA-ALLOC-BOUNDED", "KBTP-LOAD-COMPLETE",
                 "KBTP-FREE-RETURN")
@hangs.diagnosed
def test_free_unbinds(kbtp_target: TargetUnderTest, seed: int) -> None:
    """After FREE completes the handle is not VALID (a LOAD is NOT_VALID even with ALLOW_UNSEALED) and can
    be bound again; a sealed handle is freed just the same."""
    bed = kbtp_target.bed(seed, label="free")
    a = bed.initiator("A")

    def scenario() -> Gen:
        yield from bed.open(a)
        h = a.handle(3)
        for flags in (SEAL, 0, SEAL):
            r = yield from a.alloc_store(h, b"to be freed", flags=flags)
            expect.status_is(r, Status.OK, req="KBTP-QUOTA-ALLOC-BOUNDED", what="ALLOC_STORE")
            f = yield from a.free(h, generation=r.generation)
            expect.status_is(f, Status.OK, req="KBTP-FREE-RETURN", what="FREE with the entry's Generation")
            lr, _ = yield from a.load(h, 64, flags=UNSEALED_OK)
            expect.status_is(lr, Status.NOT_VALID, req="KBTP-FREE-ENTRY", what="LOAD after FREE completed")

    bed.run_one(scenario())


@pytest.mark.req("KBTP-FLAG-INVALIDATE", "KBTP-COMP-SEND", "KBTP-HELLO-FIRST", "KBTP-QUOTA-ALLOC-BOUNDED",
                 "KBTP-LOAD-COMPLETE")
@hangs.diagnosed
def test_invalidate(kbtp_target: TargetUnderTest, seed: int) -> None:
    """Without INVALIDATE the completion is a plain Send; with INVALIDATE it is a Send with Invalidate of
    the Data Descriptor's STag: the harness sees the STag invalidated when the completion arrives."""
    bed = kbtp_target.bed(seed, label="invalidate")
    a = bed.initiator("A")

    def scenario() -> Gen:
        yield from bed.open(a)
        h = a.handle(2)
        src = a.node.register(a.node.alloc(64), Access.LOCAL_WRITE | Access.REMOTE_READ, remote_invalidate=True)
        src.write(0, b"inv" * 4)
        r = yield from a.alloc_store(h, b"inv" * 4, source=src)
        expect.status_is(r, Status.OK, req="KBTP-QUOTA-ALLOC-BOUNDED", what="ALLOC_STORE by RDMA Read")
        expect.equal("STag invalidated by a completion without INVALIDATE", r.invalidated_stag, None,
                     req="KBTP-COMP-SEND")
        dst: Region | Window
        if getattr(bed.fabric, "invalidates_regions", True):
            dst = a.node.register(a.node.alloc(64), Access.LOCAL_WRITE | Access.REMOTE_WRITE, remote_invalidate=True)
        else:  # userspace verbs cannot register a remotely invalidatable region: a window is the STag that is
            region = a.node.register(a.node.alloc(64), Access.LOCAL_WRITE | Access.MW_BIND)
            dst = a.node.bind_window(region, 0, 64, Access.REMOTE_WRITE, a.conn)
        lr, got = yield from a.load(h, 64, flags=RequestFlags.INVALIDATE, dest=dst)
        expect.status_is(lr, Status.OK, req="KBTP-FLAG-INVALIDATE", what="LOAD with INVALIDATE")
        expect.equal("loaded data", got, b"inv" * 4, req="KBTP-FLAG-INVALIDATE")
        if not getattr(bed.fabric, "sees_remote_invalidation", True):
            inconclusive(f"the harness's device ({bed.fabric!r}) does not report a Send with Invalidate in the "
                         "receive completion, so whether the completion invalidated the STag cannot be seen")
        expect.equal("STag invalidated by the completion", lr.invalidated_stag, dst.stag, req="KBTP-FLAG-INVALIDATE")
        check(not a.node.is_valid(dst.stag), "the Data Descriptor's STag is still valid after the completion",
              req="KBTP-FLAG-INVALIDATE")

    bed.run_one(scenario())


@pytest.mark.req("KBTP-COMP-DATA-READY", "KBTP-OP-IN-ORDER", "KBTP-HELLO-FIRST", "KBTP-QUOTA-ALLOC-BOUNDED",
                 "KBTP-LOAD-COMPLETE")
@hangs.diagnosed
def test_completion_after_data(kbtp_target: TargetUnderTest, session_seed: int) -> None:
    """Pipelined requests on one connection complete in order, each LOAD's data already in the buffer
    when its completion arrives, across seeded interleavings (RDMAP placement reorders Write chunks)."""
    runs = max(2, kbtp_target.interleavings // 20)
    bs = kbtp_target.params.block_size
    block = bytes((i * 7 + 3) & 0xFF for i in range(bs))
    for i in range(runs):
        bed = kbtp_target.bed(session_seed * 1000 + i, label=f"data-ready-{i}")
        a = bed.initiator("A")

        def scenario(a: HarnessInitiator = a, bed: Bed = bed) -> Gen:
            yield from bed.open(a)
            h = a.handle(0)
            src = a.buffer(bs, Access.REMOTE_READ, block)
            dst = a.buffer(bs, Access.REMOTE_WRITE)
            # The buffer as it was when each COMPLETION was delivered: over a wire the harness may take the
            # COMPLETION and a Write sent after it in one turn of its loop, so reading it once the actor runs
            # would see data placed after the COMPLETION (a pass it did not see).
            a.holds(bs)
            seen = a.at_delivery(dst, bs)
            # ALLOC_STORE then LOAD of the same handle, sent back to back: in-order processing means
            # the LOAD sees the stored block.
            a.send(a.enc(AllocStore(request_id=1, handle=h, flags=SEAL, data=a.descriptor(src, bs))))
            a.send(a.enc(Load(request_id=2, handle=h, data=a.descriptor(dst, bs))))
            first = yield from a.receive(req="KBTP-QUOTA-ALLOC-BOUNDED", what="COMPLETION of the pipelined ALLOC_STORE")
            second = yield from a.receive(req="KBTP-LOAD-COMPLETE", what="COMPLETION of the pipelined LOAD")
            expect.equal("Request ID of the first completion", first.request_id, 1, req="KBTP-OP-IN-ORDER")
            expect.equal("Request ID of the second completion", second.request_id, 2, req="KBTP-OP-IN-ORDER")
            expect.status_is(second, Status.OK, req="KBTP-OP-IN-ORDER", what="LOAD pipelined after ALLOC_STORE")
            if seen is None or len(seen) < 2:
                # a device whose completions are polled (verbs) places what came after the Send before the
                # harness hears of it: no moment of delivery to read the buffer at. The phrase "without the harness
                # seeing them" makes it a verbs reason a facing wire settles (reports/facing.py FACING_REASONS)
                inconclusive(f"the harness's connection ({bed.fabric!r}) places data and delivers COMPLETIONs without "
                             "the harness seeing them at the moment of delivery, so data placed after a COMPLETION "
                             "cannot be told from data placed before")
            expect.equal("buffer contents when the LOAD completion was delivered", seen[1], block,
                         req="KBTP-COMP-DATA-READY")

        bed.run_one(scenario())


# ---- malformed requests (scapy) ------------------------------------------------------------------------


@dataclass(frozen=True)
class Malformed:
    """A request that cannot be parsed: its octets (for handle h, and whether the session's HELLO_ACK set ADDR_LE:
    the Block Handle and descriptors then little-endian, as the initiator MUST encode them), the requirement that
    says so, and what the target may answer instead of MALFORMED where the text allows another reading."""

    id: str
    req: str
    raw: Callable[[int, bool], bytes]
    also: frozenset[str] = frozenset()


def _good(h: int) -> AllocStore:
    return AllocStore.with_inline(b"malformed?", flags=SEAL, request_id=99, handle=h)


def _load_desc(h: int) -> Load:
    return Load(request_id=99, handle=h, flags=UNSEALED_OK, data=DataDescriptor(0, 0, 8))


def _handle_field(h: int, addr_le: bool) -> int:
    """The value of the (big-endian) header field whose octets are handle ``h`` in the session's byte order."""
    return diagnose.swapped(h) if addr_le else h


MALFORMED = [
    # A header cut short cannot even name its Request ID: MALFORMED (echoing what it can) or the end.
    Malformed("truncated-header", "KBTP-STATUS-MALFORMED",
              lambda h, le: bytes(KBTP(opcode=Opcode.LOAD, request_id=99, handle=_handle_field(h, le)))[:17],
              frozenset({"connection ended"})),
    Malformed("truncated-body", "KBTP-STATUS-MALFORMED",
              lambda h, le: bytes(KBTP(request_id=99, handle=_handle_field(h, le)) / KBTPLoad(data_length=8))[:30]),
    Malformed("wrong-version", "KBTP-HDR-VERSION", lambda h, le: craft(_good(h), addr_le=le, version=2)),
    Malformed("version-zero", "KBTP-HDR-VERSION", lambda h, le: craft(_load_desc(h), addr_le=le, version=0)),
    Malformed("unknown-opcode", "KBTP-OPCODES",
              lambda h, le: header_only(0x7E, request_id=99, handle=_handle_field(h, le))),
    # "Status is zero in requests" binds the initiator; a target may refuse the request or serve it (a LOAD of
    # an unbound handle: NOT_VALID, which it can tell only when the handle is in the session's byte order).
    Malformed("status-in-request", "KBTP-STATUS-MALFORMED", lambda h, le: craft(_load_desc(h), addr_le=le, status=3),
              frozenset({"NOT_VALID"})),
]


@pytest.mark.parametrize("case", [pytest.param(m, marks=pytest.mark.req(m.req), id=m.id) for m in MALFORMED])
@pytest.mark.req("KBTP-VAL-NO-EFFECT", "KBTP-HELLO-FIRST", "KBTP-QUOTA-ALLOC-BOUNDED", "KBTP-LOAD-COMPLETE")
@hangs.diagnosed
def test_malformed_request(case: Malformed, kbtp_target: TargetUnderTest, seed: int) -> None:
    """A request that cannot be parsed completes MALFORMED echoing its Request ID when the header is
    readable, binds nothing, and the target keeps serving: a valid request afterwards succeeds."""
    bed = kbtp_target.bed(seed, label=f"malformed-{case.id}")
    a = bed.initiator("A")

    def scenario() -> Gen:
        yield from bed.open(a)
        h = a.handle(9)
        reply = yield from a.call(case.raw(h, a.addr_le), req=case.req, what=f"answer to the {case.id} request",
                                  allow_end="connection ended" in case.also)
        outcome = "connection ended" if isinstance(reply, Ended) else expect.status_name(reply.status)
        check_one_of(outcome, {"MALFORMED", *case.also}, what=f"answer to the {case.id} request", req=case.req)
        if isinstance(reply, Ended):
            return
        if case.id != "truncated-header":
            expect.equal("Request ID echoed for the malformed request", reply.request_id, 99, req=case.req, offset=4)
        lr, _ = yield from a.load(h, 16, flags=UNSEALED_OK)
        expect.status_is(lr, Status.NOT_VALID, req="KBTP-VAL-NO-EFFECT", what=f"LOAD of the handle after {case.id}")
        r = yield from a.alloc_store(h, b"valid afterwards")
        expect.status_is(r, Status.OK, req="KBTP-VAL-NO-EFFECT", what=f"a valid ALLOC_STORE after {case.id}")

    bed.run_one(scenario())


@pytest.mark.parametrize("where", ["bad-stag", "past-buffer"])
@pytest.mark.req("KBTP-VAL-NO-EFFECT", "KBTP-RING-NO-LOSS", "KBTP-HELLO-FIRST", "KBTP-QUOTA-ALLOC-BOUNDED",
                 "KBTP-LOAD-COMPLETE")
@hangs.diagnosed
def test_descriptor_out_of_range(where: str, kbtp_target: TargetUnderTest, seed: int) -> None:
    """An ALLOC_STORE whose Data Descriptor names a bad STag or runs past the registered buffer cannot be
    read: the handle must not end up bound to a partial block, and the block must not be lost (the
    initiator's whole quota stays allocatable, on this connection or, if the RDMA error ended it, on a new
    one of the same initiator)."""
    bed = kbtp_target.bed(seed, label=f"descriptor-{where}")
    a = bed.initiator("A")

    def scenario() -> Gen:
        ack = yield from bed.open(a)
        q = ack.allocation_quota
        h = a.handle(0)
        src = a.buffer(64, Access.REMOTE_READ, b"d" * 64)
        size = min(64, kbtp_target.params.block_size)
        desc = DataDescriptor(src.stag ^ 0x5A5A00, src.to(0), size) if where == "bad-stag" else \
            DataDescriptor(src.stag, src.to(0), min(64 + 4096 * 64, kbtp_target.params.block_size))
        if where == "past-buffer" and desc.length <= 64:
            not_applicable(f"Block Size {kbtp_target.params.block_size}: no length both fits the block and runs "
                           "past the 64-octet buffer")
        r = yield from a.call(a.enc(AllocStore(request_id=5, handle=h, flags=SEAL, data=desc)), allow_end=True,
                              req="KBTP-VAL-NO-EFFECT",
                              what=f"COMPLETION of the ALLOC_STORE from a {where} source")
        outcome = "connection ended" if isinstance(r, Ended) else expect.status_name(r.status)
        check(outcome != "OK", f"ALLOC_STORE from an unreadable source ({where}) completed OK",
              req="KBTP-VAL-NO-EFFECT", seen=outcome,
              expected="a refusal (any non-OK Status) or the end of the connection")
        # The RDMA error may have ended the connection: the same initiator reconnects (its session is retained).
        user = (yield from bed.reconnect(a)) if a.broken else a
        lr, _ = yield from user.load(h, 64, flags=UNSEALED_OK)
        expect.status_is(lr, Status.NOT_VALID, req="KBTP-VAL-NO-EFFECT",
                         what=f"LOAD of the handle after the failed ALLOC_STORE ({where}, {outcome})")
        for i in range(q):
            r = yield from user.alloc_store(user.handle(20 + i), b"after")  # the whole quota is free
            expect.status_is(r, Status.OK, req="KBTP-RING-NO-LOSS",
                             what=f"ALLOC_STORE {i + 1} of {q} after the failed one ({outcome})")

    bed.run_one(scenario())
