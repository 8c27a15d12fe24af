"""kbtp-target: every validation rule on every path it applies to, each field's value classes, and "no other
effect" checked through everything a black box can reach (KBTP "Operations": "It validates every request
before touching memory ... A failed check completes the request with the corresponding status and has no
other effect"; "Block Load", "Block Mapped Store", "Block Unmapped Store", "Direct Modes" BIND).

Paths: a STORE or ALLOC_STORE obtains its data inline or by RDMA Read of the Data Descriptor; a rule the text
states for the operation holds on both. A LOAD writes by RDMA Write into a buffer that may be larger than its
descriptor: guard octets past the descriptor stay untouched when the LOAD is refused.

After each refusal the check looks at everything the text says is untouched and a black box can observe:
the prepared handles' data and Generation (LOAD), the refused handle still unbound, the guard octets, then
the pool: the initiator's whole quota is allocated and freed round after round until more tickets than the
shared ring has slots have gone through it (a ring slot or block stranded by the refusal stops an
allocation), and one allocation over the refilled quota is refused (the refusal released no usage).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest

from kvconform import evidence, sweep
from kvconform.conformance.kbtp import expect, hangs
from kvconform.conformance.kbtp.prepared import KEPT_BINDING, PREPARED, prepare_handles
from kvconform.fixtures.kbtp import TargetUnderTest
from kvconform.kbtp.constants import Features, RequestFlags, Status
from kvconform.kbtp.messages import AllocStore, Bind, Free, Load, Store
from kvconform.rdma import Access
from kvconform.targets.kbtp_client import Ended, Gen, HarnessInitiator
from kvconform.verdicts import check, inconclusive, not_applicable

SEAL = int(RequestFlags.SEAL)
UNSEALED_OK = int(RequestFlags.ALLOW_UNSEALED)
R_EFFECT = "KBTP-VAL-NO-EFFECT"
GUARD = b"\xa5"  # octets of a LOAD buffer the target must not write
OUTSIDE = 0x7FFF_0000_0000_0000  # a handle no initiator is authorised for (unless the range holds it)
CASE_HANDLES = 7  # the cases use handles 0..6 of the range (own(), needs, refused_handle); the drain its top


@dataclass(frozen=True)
class Ctx:
    """What a case's request is built from: the initiator, Block Size, Max Inline, the Generation of the first
    prepared handle (0 when none) and the handle range."""

    a: HarnessInitiator
    block_size: int
    max_inline: int
    generation: int


Build = Callable[[Ctx], Any]


@dataclass(frozen=True)
class Case:
    """One request that breaks one rule (or, ``expected`` OK, sits on the rule's legal boundary): the
    requirement, the status, how to build it, the prepared handles it needs, and for a LOAD the size of the
    guarded buffer its descriptor names the start of."""

    id: str
    req: str
    expected: Status
    build: Build | tuple[Callable[[Ctx], int], ...]  # a request builder, or a LOAD's (handle, length)
    needs: tuple[int, ...] = ()
    allocates: bool = False
    refused_handle: int | None = None  # a handle index the refusal must leave unbound
    guarded: int = 0  # a LOAD buffer of this many octets, filled with GUARD


def _src(c: Ctx, data: bytes, room: int = 0) -> Any:
    return c.a.buffer(max(len(data), room), Access.REMOTE_READ, data)


def _store(op: str, path: str, handle: Callable[[Ctx], int], *, generation: Callable[[Ctx], int] | None = None,
           length: Callable[[Ctx], int] | None = None, data: bytes = b"s" * 8, room: int = 0) -> Build:
    """STORE or ALLOC_STORE of ``data``, inline or by RDMA Read (its descriptor Length ``length``)."""
    def build(c: Ctx) -> Any:
        cls = Store if op == "STORE" else AllocStore
        gen = generation(c) if generation else 0
        rid = c.a.next_id()
        if path == "inline":
            if len(data) > c.max_inline:
                not_applicable(f"Max Inline {c.max_inline}: no inline path for {len(data)} octets")
            return cls.with_inline(data, flags=SEAL, request_id=rid, handle=handle(c), generation=gen)
        n = length(c) if length else len(data)
        src = _src(c, data, room=min(n, max(room, c.block_size)) if room else 0)  # a legal length reads it all
        return cls(request_id=rid, handle=handle(c), generation=gen, flags=SEAL, data=c.a.descriptor(src, n))
    return build


def _load(handle: Callable[[Ctx], int], length: Callable[[Ctx], int]) -> tuple[Callable[[Ctx], int], ...]:
    """A LOAD of ``handle`` with descriptor Length ``length``, into the case's guarded buffer."""
    return (handle, length)


def _free(handle: Callable[[Ctx], int], generation: Callable[[Ctx], int]) -> Build:
    """FREE of ``handle`` with Request Generation ``generation``."""
    return lambda c: Free(request_id=c.a.next_id(), handle=handle(c), generation=generation(c))


def own(i: int) -> Callable[[Ctx], int]:
    """Handle ``i`` (< CASE_HANDLES) of the range."""
    return lambda c: c.a.handle(i)


def outside(c: Ctx) -> int:
    return OUTSIDE


def stale(c: Ctx) -> int:
    return c.generation % 0xFFFF + 1  # the entry's + 1, skipping zero: never the entry's


# ---- one path per rule --------------------------------------------------------------------------------

BLOCK_PLUS_1: Callable[[Ctx], int] = lambda c: c.block_size + 1  # noqa: E731

PATH_CASES = [
    Case("store-sealed-inline", "KBTP-STORE-UNSEALED", Status.SEALED, _store("STORE", "inline", own(0)), needs=(0,)),
    Case("store-sealed-rdma-read", "KBTP-STORE-UNSEALED", Status.SEALED, _store("STORE", "rdma", own(0)), needs=(0,)),
    Case("store-stale-rdma-read", "KBTP-VAL-GENERATION", Status.STALE_GENERATION,
         _store("STORE", "rdma", own(1), generation=stale), needs=(1,)),
    Case("store-unbound-rdma-read", "KBTP-STORE-VALID", Status.NOT_VALID, _store("STORE", "rdma", own(5)),
         refused_handle=5),
    Case("store-outside-rdma-read", "KBTP-STORE-OWN-RANGE", Status.INVALID_HANDLE, _store("STORE", "rdma", outside)),
    Case("alloc-outside-rdma-read", "KBTP-ALLOC-OWN-RANGE", Status.INVALID_HANDLE,
         _store("ALLOC_STORE", "rdma", outside), allocates=True),
    Case("alloc-bound-rdma-read", "KBTP-ALLOC-NOT-BOUND", Status.ALREADY_BOUND, _store("ALLOC_STORE", "rdma", own(0)),
         needs=(0,), allocates=True),
    Case("store-over-block-rdma-read", "KBTP-VAL-LENGTH", Status.TOO_LARGE,
         _store("STORE", "rdma", own(1), length=BLOCK_PLUS_1, room=1 << 20), needs=(1,)),
    Case("alloc-over-block-rdma-read", "KBTP-VAL-LENGTH", Status.TOO_LARGE,
         _store("ALLOC_STORE", "rdma", own(6), length=BLOCK_PLUS_1, room=1 << 20), allocates=True, refused_handle=6),
    Case("free-stale", "KBTP-VAL-GENERATION", Status.STALE_GENERATION, _free(own(0), stale), needs=(0,)),
    Case("load-short-descriptor-guarded", "KBTP-LOAD-FITS", Status.TOO_LARGE, _load(own(0), lambda c: 15),
         needs=(0,), guarded=64),
]

# ---- one kind of malformation per field: value classes ----------------------------------------------------


def _handle_classes() -> list[Case]:
    """Block Handle of an inline ALLOC_STORE: off by one at both ends, zero, all ones, and values whose low 32
    bits (or whose bits but the top one) are the range's first handle: a target that compares a narrowed
    handle sees its own range."""
    values: list[tuple[str, Callable[[Ctx], int]]] = [
        ("base-minus-1", lambda c: (c.a.ack.handle_base - 1) % (1 << 64)),
        ("base-plus-count", lambda c: c.a.ack.handle_base + c.a.ack.handle_count),
        ("all-ones", lambda c: (1 << 64) - 1),
        ("base-plus-2^32", lambda c: (c.a.ack.handle_base + (1 << 32)) % (1 << 64)),
    ]
    wide: list[tuple[str, Callable[[Ctx], int]]] = [
        ("zero", lambda c: 0),
        ("base-xor-bit63", lambda c: c.a.ack.handle_base ^ (1 << 63)),
        ("base-plus-2^16", lambda c: c.a.ack.handle_base + (1 << 16)),
    ]
    def outside_of_range(name: str, fn: Callable[[Ctx], int]) -> Callable[[Ctx], int]:
        def handle(c: Ctx) -> int:
            h = fn(c)
            if c.a.ack.handle_base <= h < c.a.ack.handle_base + c.a.ack.handle_count:
                not_applicable(f"the {name} handle {h:#x} lies in this initiator's range")
            return h
        return handle
    return [Case(f"handle-{name}", "KBTP-ALLOC-OWN-RANGE", Status.INVALID_HANDLE,
                 _store("ALLOC_STORE", "inline", outside_of_range(name, fn)), allocates=True)
            for name, fn in sweep.pick(values, wide)]


def _generation_classes() -> list[Case]:
    """Generation of an inline STORE to a bound unsealed handle: the entry's +1 and -1 (skipping zero), all
    ones, and values equal to the entry's in their low or high octet only."""
    def other(fn: Callable[[int], int]) -> Callable[[Ctx], int]:
        def gen(c: Ctx) -> int:
            g = fn(c.generation) & 0xFFFF
            return g if g not in (0, c.generation) else (c.generation % 0xFFFF) + 1
        return gen
    values = [("next", other(lambda g: g % 0xFFFF + 1)), ("previous", other(lambda g: (g - 2) % 0xFFFF + 1)),
              ("all-ones", other(lambda g: 0xFFFF if g != 0xFFFF else 0xFFFE)),
              ("high-octet", other(lambda g: g ^ 0x0100)), ("low-octet", other(lambda g: g ^ 0x0001))]
    wide = [("top-bit", other(lambda g: g ^ 0x8000))]
    return [Case(f"generation-{name}", "KBTP-VAL-GENERATION", Status.STALE_GENERATION,
                 _store("STORE", "inline", own(1), generation=fn), needs=(1,))
            for name, fn in sweep.pick(values, wide)]


def _length_classes() -> list[Case]:
    """Data Descriptor Length of an ALLOC_STORE by RDMA Read: Block Size (legal), one more, Block Size plus
    2^16 (the same low 16 bits), all ones."""
    over: list[tuple[str, Callable[[Ctx], int]]] = [
        ("block-plus-1", BLOCK_PLUS_1),
        ("block-plus-2^16", lambda c: c.block_size + (1 << 16)),
        ("all-ones", lambda c: 0xFFFF_FFFF),
    ]
    wide: list[tuple[str, Callable[[Ctx], int]]] = [("block-plus-2^31", lambda c: (c.block_size + (1 << 31)))]
    cases = [Case("length-block-size", "KBTP-VAL-LENGTH", Status.OK,
                  _store("ALLOC_STORE", "rdma", own(6), length=lambda c: c.block_size, room=1 << 20),
                  allocates=True)]
    cases += [Case(f"length-{name}", "KBTP-VAL-LENGTH", Status.TOO_LARGE,
                   _store("ALLOC_STORE", "rdma", own(6), length=fn, room=(1 << 16) + 8192), allocates=True,
                   refused_handle=6)
              for name, fn in sweep.pick(over, wide)]
    return cases


def _load_length_classes() -> list[Case]:
    """LOAD descriptor Length against a 16-octet block: zero (not "absent"), one short, exactly it (legal)."""
    return [
        Case("load-length-zero", "KBTP-LOAD-FITS", Status.TOO_LARGE, _load(own(0), lambda c: 0), needs=(0,),
             guarded=64),
        Case("load-length-data-minus-1", "KBTP-LOAD-FITS", Status.TOO_LARGE, _load(own(0), lambda c: 15),
             needs=(0,), guarded=16),
        Case("load-length-exact", "KBTP-LOAD-FITS", Status.OK, _load(own(0), lambda c: 16), needs=(0,), guarded=64),
    ]


VALUE_CASES = _handle_classes() + _generation_classes() + _length_classes() + _load_length_classes()


def _ring_slots(kbtp_target: TargetUnderTest) -> int:
    """N of the shared ring as declared (PICS pool.ring_slots), else the smallest power of two >= its blocks."""
    p = kbtp_target.params
    if p.ring_slots:
        return int(p.ring_slots)
    return 1 << max(0, (p.shared_count - 1).bit_length())


def _rounds(a: HarnessInitiator, handles: list[int], slots: int, after: str, req: str = R_EFFECT) -> Gen:
    """``handles`` allocated and freed round after round until more than ``slots`` tickets went through the
    ring: a slot or block the refusal stranded stops an allocation (a bounded wait naming ``req``)."""
    rounds = (slots + len(handles)) // len(handles)
    for r in range(rounds):
        for i, h in enumerate(handles):
            got = yield from a.alloc_store(h, bytes([r, i]) * 4, req=req)
            expect.status_is(got, Status.OK, req=req,
                             what=f"ALLOC_STORE {i + 1} of {len(handles)}, round {r + 1} of {rounds} after {after}")
        for i, h in enumerate(handles):
            got = yield from a.free(h, req=req)
            expect.status_is(got, Status.OK, req=req, what=f"FREE {i + 1}, round {r + 1} after {after}")


def _over_quota(a: HarnessInitiator, h: int, quota: int, after: str) -> Gen:
    """One ALLOC_STORE over a full quota: NO_SPACE (or the session ended: the text lets the target end it), so
    the refusal released no usage. True when the session goes on."""
    over = yield from a.alloc_store(h, b"one too many"[:a.ack.block_size], req=R_EFFECT, allow_end=True, refused=True)
    outcome = "connection ended" if isinstance(over, Ended) else expect.status_name(over.status)
    check(outcome in ("NO_SPACE", "connection ended"), f"an ALLOC_STORE over the full quota of {quota} after "
          f"{after} (the refusal must not have released usage)", req=R_EFFECT, seen=outcome,
          expected="NO_SPACE (or the session terminated)")
    return not isinstance(over, Ended)


def _drain(a: HarnessInitiator, quota: int, bound: list[int], slots: int, after: str) -> Gen:
    """With the prepared ``bound`` handles still bound: the rest of the quota cycles the ring and then, filled,
    leaves no room for one more; then the prepared handles are freed (and, when they held the whole quota, the
    whole quota cycles the ring)."""
    count = a.ack.handle_count
    spare = [a.handle(count - 1 - i) for i in range(quota - len(bound) + 1)]
    fill, probe = spare[:-1], spare[-1]
    if fill:
        yield from _rounds(a, fill, slots, after)
        for i, h in enumerate(fill):
            got = yield from a.alloc_store(h, b"refill", req=R_EFFECT)
            expect.status_is(got, Status.OK, req=R_EFFECT, what=f"ALLOC_STORE {i + 1} refilling quota after {after}")
    going = yield from _over_quota(a, probe, quota, after)
    if not going:
        evidence.note(f"the session ended at the allocation over quota after {after}: the ring is not cycled further")
        return
    for h in [*bound, *fill]:
        f = yield from a.free(h, req=R_EFFECT)
        expect.status_is(f, Status.OK, req=R_EFFECT, what=f"FREE of handle {h:#x} after {after}")
    if not fill and quota:
        yield from _rounds(a, [a.handle(count - 1 - i) for i in range(quota)], slots, after)


def _judge(case: Case, kbtp_target: TargetUnderTest, seed: int) -> None:
    bed = kbtp_target.bed(seed, label=case.id)
    a = bed.initiator("A")
    bs = kbtp_target.params.block_size

    def scenario() -> Gen:
        ack = yield from hangs.open_session(bed, a, kbtp_target)
        q = ack.allocation_quota
        if len(case.needs) > q or (case.allocates and q < 1):
            not_applicable(f"Allocation Quota {q}: the case needs {len(case.needs)} bound handle(s)")
        if ack.handle_count < CASE_HANDLES + q + 1:
            not_applicable(f"Handle Count {ack.handle_count}: the cases' handles (the first {CASE_HANDLES} of the "
                           f"range) and the {q + 1} the quota drain takes from its top would overlap")
        control = [a.handle(ack.handle_count - 1 - i) for i in range(q)] if case.expected != Status.OK else []
        if control:
            # Control: the whole quota cycles the ring before any refusal. A ring that loses blocks by itself
            # fails here, blamed on the allocation bound, so the drain after the refusal blames R_EFFECT only
            # for what the refusal did.
            yield from _rounds(a, control, _ring_slots(kbtp_target),
                               "nothing yet (the control round before the refusal)", req="KBTP-QUOTA-ALLOC-BOUNDED")
        gens = yield from prepare_handles(kbtp_target, a, case.needs)
        c = Ctx(a, bs, ack.max_inline, gens[case.needs[0]] if case.needs else 0)
        dst = None
        if isinstance(case.build, tuple):
            handle, length = case.build
            dst = a.buffer(case.guarded, Access.REMOTE_WRITE, GUARD * case.guarded)
            msg: Any = Load(request_id=a.next_id(), handle=handle(c), flags=UNSEALED_OK,
                            data=a.descriptor(dst, length(c)))
        else:
            msg = case.build(c)
        reply = yield from a.call(a.enc(msg), req=case.req, what=f"COMPLETION of the {case.id} request")
        acceptable = {case.expected}
        if case.allocates and case.expected != Status.OK and len(case.needs) >= q:
            acceptable.add(Status.NO_SPACE)  # the quota rule is broken too; the text orders neither first
        expect.status_is(reply, acceptable, req=case.req, what=case.id)
        if case.expected == Status.OK:
            return
        if dst is not None:
            expect.equal(f"the {case.guarded}-octet LOAD buffer after the refused {case.id}", dst.read(0, case.guarded),
                         GUARD * case.guarded, req=R_EFFECT)
        for h in case.needs:
            data, _ = PREPARED[h]
            again, got = yield from a.load(a.handle(h), 64, flags=UNSEALED_OK, req=R_EFFECT)
            expect.status_is(again, Status.OK, req=R_EFFECT, what=f"LOAD of handle {h} after {case.id}")
            expect.equal(f"Generation of handle {h} after {case.id}", again.generation, gens[h], req=R_EFFECT)
            expect.equal(f"data of handle {h} after {case.id}", got, data, req=R_EFFECT)
        if case.refused_handle is not None:
            lr, _ = yield from a.load(a.handle(case.refused_handle), 16, flags=UNSEALED_OK, req=R_EFFECT)
            expect.status_is(lr, Status.NOT_VALID, req=R_EFFECT, what=f"LOAD of the refused handle after {case.id}")
        yield from _drain(a, q, [a.handle(h) for h in case.needs], _ring_slots(kbtp_target), case.id)

    bed.run_one(scenario())


def _params(cases: list[Case]) -> list[Any]:
    """Each case cites its rule, the no-effect rule when it is a refusal, and the allocation bound when it
    prepares handles (what its assertions evaluate)."""
    def reqs(c: Case) -> tuple[str, ...]:
        return (c.req, *((R_EFFECT,) if c.expected != Status.OK else ()), "KBTP-HELLO-FIRST",
                *(("KBTP-QUOTA-ALLOC-BOUNDED",) if c.needs or c.expected != Status.OK else ()))
    return [pytest.param(c, marks=pytest.mark.req(*reqs(c)), id=c.id) for c in cases]


@pytest.mark.parametrize("case", _params(PATH_CASES))
@hangs.diagnosed_refusal
@pytest.mark.blames(KEPT_BINDING)
def test_rule_on_every_path(case: Case, kbtp_target: TargetUnderTest, seed: int) -> None:
    """A rule broken on each path it applies to (inline and RDMA Read for stores, a guarded larger buffer for
    loads) completes with the rule's Status and has no other effect: prepared handles, guard octets, the
    refused handle, the ring and the quota all as before."""
    _judge(case, kbtp_target, seed)


@pytest.mark.parametrize("case", _params(VALUE_CASES))
@hangs.diagnosed_refusal
@pytest.mark.blames(KEPT_BINDING)
def test_field_value_classes(case: Case, kbtp_target: TargetUnderTest, seed: int) -> None:
    """Each request field through its value classes (off by one, zero, all ones, values a narrowed comparison
    confuses with a legal one, the legal boundary itself): the Status the text gives that value, and no
    other effect."""
    _judge(case, kbtp_target, seed)


# ---- BIND (Direct Modes): the validation every request gets -------------------------------------------------

DA = Features.DIRECT_ALLOC
BIND_ALSO = ("KBTP-VAL-NO-EFFECT", "KBTP-HELLO-FIRST", "KBTP-RDMAP-ATOMICS", "KBTP-RING-ALLOC-WAIT")


@pytest.mark.parametrize("rule", [
    pytest.param(rule, marks=pytest.mark.req(req, *BIND_ALSO), id=rule)
    for rule, req in (("handle-outside-range", "KBTP-VAL-HANDLE"), ("handle-past-range", "KBTP-VAL-HANDLE"),
                      ("length-over-block", "KBTP-VAL-LENGTH"))
])
def test_bind_refusals(rule: str, kbtp_target: TargetUnderTest, seed: int) -> None:
    """A BIND with the right ticket and Block Offset but a handle outside the initiator's range (or one past
    its end), or a Data Length over Block Size, is refused with INVALID_HANDLE / TOO_LARGE, binds nothing and
    leaves the ticket's slot to the right BIND, which then succeeds."""
    kbtp_target.require(DA)
    bs = kbtp_target.params.block_size
    bed = kbtp_target.bed(seed, label=f"bind-{rule}")
    a = bed.initiator("A")
    req = "KBTP-VAL-LENGTH" if rule.startswith("length") else "KBTP-VAL-HANDLE"
    expected = Status.TOO_LARGE if rule.startswith("length") else Status.INVALID_HANDLE

    def scenario() -> Gen:
        ack = yield from bed.open(a, DA)
        if not Features(ack.features) & DA:
            inconclusive("HELLO_ACK did not grant DIRECT_ALLOC, which PICS declares (test_ack_features_match_pics "
                         "judges that); this check needs it")
        ticket, slot = yield from a.take_ticket()
        block = yield from a.await_slot(ticket, slot, req="KBTP-RING-ALLOC-WAIT")
        h = a.handle(0)
        wc = yield from a.write_block(block, b"B" * 16, req="KBTP-RING-ALLOC-WAIT")
        check(wc.ok, "RDMA Write into the partition block of a taken ticket failed", req="KBTP-RING-ALLOC-WAIT")
        if rule == "handle-outside-range":
            bad = Bind(request_id=a.next_id(), handle=OUTSIDE, ticket=ticket, data_length=16, block_offset=block)
        elif rule == "handle-past-range":
            bad = Bind(request_id=a.next_id(), handle=ack.handle_base + ack.handle_count, ticket=ticket,
                       data_length=16, block_offset=block)
        else:
            bad = Bind(request_id=a.next_id(), handle=h, ticket=ticket, data_length=bs + 1, block_offset=block)
        r = yield from a.call(a.enc(bad), req=req, what=f"COMPLETION of the BIND with {rule}")
        expect.status_is(r, expected, req=req, what=f"BIND with {rule}")
        lr, _ = yield from a.load(h, 16, flags=UNSEALED_OK, req=R_EFFECT)
        expect.status_is(lr, Status.NOT_VALID, req=R_EFFECT, what=f"LOAD of the handle after the BIND with {rule}")
        r = yield from a.bind(h, ticket, 16, block, req=R_EFFECT)
        expect.status_is(r, Status.OK, req=R_EFFECT, what=f"the right BIND after the one with {rule}")
        lr, got = yield from a.load(h, 16, flags=UNSEALED_OK, req=R_EFFECT)
        expect.equal(f"data bound by the right BIND after the one with {rule}", got, b"B" * 16, req=R_EFFECT)

    bed.run_one(scenario())
