"""Wire attacks, second part (issue 23): what the RFCs the text defers to say an RNIC must answer to atomics and
RDMA Writes that leave the buffer their STag names, misaligned atomics, PSN gaps and duplicate requests (RoCEv2),
bad MPA start frames, DDP MSN and MO errors and RFC 7306 masked atomics (iWARP). Catalog section "Wire bindings"
(sources: rdma-bindings.md §1-§4 and the RFCs it cites).

Each attack opens a victim session that stores a block, then an attacker session whose connection carries the
crafted request: through the harness's own binding engine where the request is well formed but aimed outside its
buffer, as raw frames past the engine otherwise (a PSN it did not assign, a duplicate, an MSN or MO it would never
send, a start frame with a bad Key). It judges the answer the RFCs require: a NAK of the right syndrome, a
Terminate of the right Layer/EType/Code, an ACK without a second execution, a refused start frame. Afterwards the
victim's block loads as stored and a fresh session stores, loads and frees one (KBTP-WIRE-INTACT). A Terminate that
names the expected error with Layer and EType in each other's nibble is that error (the pass says so); its header
layout is one rule, KBTP-WIRE-TERMINATE-HEADER, judged by test_iwarp_terminate_header alone
(kvconform.conformance.kbtp.terminate). An answer the harness could not see (the connection already gone, a
listener that refuses even a valid start frame) is inconclusive with the reason, never a pass.
"""

from __future__ import annotations

import contextlib
import errno
import socket
import struct
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest

from kvconform.conformance.kbtp.terminate import Named, accepted, layout_faults, names
from kvconform.fixtures.kbtp import TargetUnderTest
from kvconform.kbtp.constants import Features, Status
from kvconform.kbtp.messages import Free
from kvconform.rdma import U64, Access, ConnState, Op, Terminate, wait_completion_for, wait_until
from kvconform.rdma import Completion as WorkCompletion
from kvconform.rdma import Status as WcStatus
from kvconform.rdma.iwarp import ddp, mpa
from kvconform.rdma.iwarp.rdmap import SEND_OPCODES
from kvconform.rdma.iwarp.rdmap import Opcode as RdmapOpcode
from kvconform.rdma.roce.headers import SEND_OPS, AethType, AtomicEth, Bth, HeaderError, NakCode, Opcode, Packet
from kvconform.rdma.roce.icrc import append_icrc
from kvconform.targets.kbtp_bed import Bed
from kvconform.targets.kbtp_client import Gen, HarnessInitiator, add_mask
from kvconform.verdicts import check, check_equal, inconclusive, not_applicable, violation

ANSWER_S = 3.0  # how long the harness waits for the target's answer to an attack (real time)
SILENCE_S = 1.0  # ... and how long a request that must not be executed stays without its COMPLETION
VICTIM_DATA = b"victim block, stored before the attack" * 4
DA = Features.DIRECT_ALLOC
DL = Features.DIRECT_LOAD
NO_FEATURES = Features(0)
ATTACK_REQUEST_ID = 0xA77AC5
TICKET = 0x0000_0001_0000_0000  # the IB binding's unmasked FetchAdd: one ticket

R_ALIGN = "KBTP-WIRE-ATOMIC-ALIGN"
R_ATOMIC_BOUNDS = "KBTP-WIRE-ATOMIC-BOUNDS"
R_WRITE_BOUNDS = "KBTP-WIRE-WRITE-BOUNDS"
R_READ_BOUNDS = "KBTP-WIRE-READ-BOUNDS"
R_PSN_GAP = "KBTP-WIRE-IB-PSN-GAP"
R_DUPLICATE = "KBTP-WIRE-IB-DUPLICATE"
R_MPA_START = "KBTP-WIRE-MPA-START"
R_UNTAGGED = "KBTP-WIRE-DDP-UNTAGGED"
R_MASKED = "KBTP-WIRE-RDMAP-MASKED"
R_INTACT = "KBTP-WIRE-INTACT"
R_TERMINATE_HEADER = "KBTP-WIRE-TERMINATE-HEADER"

# RoCEv2: the NAK syndromes (rdma-bindings §4.5); iWARP: Terminate Layer/EType (§2.6)
NAK_INVALID_REQUEST = 0x60 | NakCode.INVALID_REQUEST
NAK_REMOTE_ACCESS = 0x60 | NakCode.REMOTE_ACCESS_ERROR
NAK_PSN_SEQUENCE = 0x60 | NakCode.PSN_SEQUENCE_ERROR


# ---- shared ---------------------------------------------------------------------------------------------


def _wire(bed: Bed, binding: str | None = None) -> Any:
    fabric = bed.fabric
    if getattr(fabric, "binding", None) is None:
        not_applicable("the wire attacks need a target reached over a wire binding (kbtp+iwarp://, kbtp+roce:// or "
                       "--kbtp-wire); on the emulated fabric there is no wire")
    if binding is not None and fabric.binding != binding:
        not_applicable(f"an attack on the {binding} wire; this target is reached over {fabric.binding}")
    if not getattr(fabric, "crafts_frames", True):
        inconclusive(f"the harness's initiators are on {fabric!r}, whose device builds every packet itself, so "
                     "no crafted frame can be sent: run the attacks from the userspace binding (kbtp+iwarp:// or "
                     "kbtp+roce:// from a host without the device)")
    unimpaired = getattr(fabric, "impair", None)
    if unimpaired is not None:
        # each attack judges one answer (a NAK, a Terminate) that RC and TCP never send twice: a wire impaired by
        # --impair would lose it and blame the target, so the attacks run on unimpaired links (the impairment
        # checks, test_wire_faults.py, judge the target under faults)
        unimpaired(None)
    return fabric


def _session(bed: Bed, name: str, features: Features = NO_FEATURES) -> Gen:
    ini = bed.initiator(name)
    ack = yield from bed.open(ini, bed.room(features))
    if Features(ack.features) & features != features:
        inconclusive(f"HELLO_ACK Features {Features(ack.features)!r} lack {features!r}, which PICS declares "
                     "(test_ack_features_match_pics judges that); this attack needs it")
    return ini


def _victim(bed: Bed) -> Gen:
    v = yield from _session(bed, "V")
    r = yield from v.alloc_store(v.handle(0), VICTIM_DATA, req=R_INTACT)
    check(r.status == Status.OK, f"the victim's ALLOC_STORE before the attack failed: {r}", req=R_INTACT)
    return v


def _intact(bed: Bed, victim: HarnessInitiator) -> Gen:
    """After the attack: the victim's block loads as stored, and a fresh session stores, loads and frees one."""
    r, got = yield from victim.load(victim.handle(0), len(VICTIM_DATA), req=R_INTACT)
    check(r.status == Status.OK, f"after the attack the victim's LOAD failed: {r}", req=R_INTACT)
    check_equal("the victim's block after the attack", got, VICTIM_DATA, req=R_INTACT)
    fresh = yield from _session(bed, "C")
    data = b"fresh session after the attack"
    r = yield from fresh.alloc_store(fresh.handle(0), data, req=R_INTACT)
    check(r.status == Status.OK, f"a fresh session's ALLOC_STORE after the attack failed: {r}", req=R_INTACT)
    r, got = yield from fresh.load(fresh.handle(0), len(data), req=R_INTACT)
    check(r.status == Status.OK and got == data, f"a fresh session's LOAD after the attack: {r}, {got!r}",
          req=R_INTACT)
    r = yield from fresh.free(fresh.handle(0), req=R_INTACT)
    check(r.status == Status.OK, f"a fresh session's FREE after the attack failed: {r}", req=R_INTACT)


def _free_raw(a: HarnessInitiator, request_id: int = ATTACK_REQUEST_ID) -> bytes:
    """A valid request of the attacker's session (FREE of its own unbound handle): harmless, answered with a
    COMPLETION if a target processes the frame that carries it."""
    raw: bytes = a.enc(Free(request_id=request_id, handle=a.handle(1), generation=0))
    return raw


def _wc(a: HarnessInitiator, op: Op, req: str) -> Gen:
    """The work completion of the attacker's one-sided request (bounded); inconclusive when none comes: an
    RDMA requester always completes, with an error at the latest when its retries are exhausted."""
    wc = yield from wait_completion_for(a.conn.cq, ANSWER_S * 4, lambda c: c.op is op or not c.ok)
    if wc is None:
        inconclusive(f"{a.name}: the {op.name} neither completed nor failed within {ANSWER_S * 4:g} s, so the "
                     f"target's answer was not seen ({req})")
    return wc


def _refusal(wc: WorkCompletion, what: str, *, nak: set[int], term: tuple[set[int], set[int], set[int]],
             binding: str, req: str, terminate: Terminate | None = None) -> None:
    """Judge the answer to a one-sided request the target must refuse: on RoCEv2 the NAK ``nak`` (the requester's
    completion status follows the NAK code 1:1, §4.5), on iWARP a Terminate of (Layer, EType, one of Codes)
    (``terminate``: the connection's, when the failed completion is a Read behind the refused Write). An octet 0
    that is the nibble swap of the expected one, with the expected Code, is the same error (its layout is
    KBTP-WIRE-TERMINATE-HEADER's, judged by test_iwarp_terminate_header) where the octet as read names no error."""
    names = {NAK_INVALID_REQUEST: "NAK invalid request (0x61)", NAK_REMOTE_ACCESS: "NAK remote access error (0x62)"}
    layer, etype, codes = term
    refusal = " or ".join(names[n] for n in sorted(nak)) if binding == "roce" else \
        f"a Terminate (Layer, EType, Code) ({_alt(layer)}, {_alt(etype)}, {_alt(codes)})"
    if wc.ok:
        violation(f"{what}: the target executed it (the request completed successfully) instead of refusing it "
                  f"with {refusal}", req=req)
    t = terminate or wc.terminate
    if wc.status is WcStatus.WR_FLUSH_ERR and t is None:
        inconclusive(f"{what}: the connection ended before the target's answer was seen ({wc.status.name})")
    if binding == "roce":
        status = {NAK_INVALID_REQUEST: WcStatus.REM_INV_REQ_ERR, NAK_REMOTE_ACCESS: WcStatus.REM_ACCESS_ERR}
        want = {status[n] for n in nak}
        got = {WcStatus.REM_INV_REQ_ERR: "NAK invalid request (0x61)",
               WcStatus.REM_ACCESS_ERR: "NAK remote access error (0x62)",
               WcStatus.REM_OP_ERR: "NAK remote operational error (0x63)",
               WcStatus.RETRY_EXC_ERR: "no answer (the requester's retries ran out)"}.get(wc.status, wc.status.name)
        check(wc.status in want, f"{what}: the target answered with {got}, the rule requires {refusal}", req=req)
        return
    if t is None:
        violation(f"{what}: the request failed ({wc.status.name}) without a Terminate from the target", req=req)
    # the expected error read with Layer and EType swapped is the same error (terminate.py says when)
    check(accepted(t, layer, etype, codes, what),
          f"{what}: Terminate (Layer, EType, Code) {t.key()}, the rule requires {refusal} ({t.reason})", req=req)


def _alt(values: set[int]) -> str:
    return " or ".join(f"{v:#x}" if v > 9 else str(v) for v in sorted(values))


# ---- atomics and RDMA Writes outside their buffer (both bindings) ----------------------------------------


@pytest.mark.req(R_ALIGN, R_INTACT, "KBTP-HELLO-FIRST")
def test_misaligned_atomic(kbtp_target: TargetUnderTest, seed: int) -> None:
    """A FetchAdd on the Head whose Tagged Offset is not a multiple of 8 is refused, not executed (nor executed
    on the aligned word below it, as an RNIC that ignores the low three bits would): on RoCEv2 a NAK invalid
    request, on iWARP a Terminate of RDMAP Remote Operation (RFC 7306 §1.2: an 8-octet aligned target;
    rdma-bindings §1.2, §1.6, §4.5). The Head STag names one 8-octet counter, so the misaligned word also leaves
    it: the answer to a bounds violation (NAK remote access error; RDMAP Remote Protection) is accepted too."""
    kbtp_target.require(DA)
    bed = kbtp_target.bed(seed, label="wire-misaligned-atomic")
    fabric = _wire(bed)

    def scenario() -> Gen:
        victim = yield from _victim(bed)
        a = yield from _session(bed, "A", DA)
        head = a.da.head
        dst = a.buffer(8, Access.LOCAL_WRITE)
        a.conn.post_fetch_add(dst.sge(0, 8), head.stag, head.tagged_offset + 4, 0, tag="misaligned")
        wc = yield from _wc(a, Op.FETCH_ADD, R_ALIGN)
        # swapped, (0, 1 or 2, c) reads (1 or 2, 0, c): accepted only where that names no error (terminate.py)
        _refusal(wc, f"a FetchAdd at the Head's Tagged Offset + 4 ({head.tagged_offset + 4:#x})",
                 nak={NAK_INVALID_REQUEST, NAK_REMOTE_ACCESS}, term=({0}, {1, 2}, set(range(256))),
                 binding=fabric.binding, req=R_ALIGN)
        yield from _intact(bed, victim)

    bed.run_one(scenario())


@pytest.mark.req(R_ATOMIC_BOUNDS, R_INTACT, "KBTP-HELLO-FIRST")
def test_atomic_out_of_bounds(kbtp_target: TargetUnderTest, seed: int) -> None:
    """A FetchAdd through the Head STag on the 8 octets past the one counter the Head descriptor names (Count 1)
    is refused: on RoCEv2 a NAK remote access error, on iWARP a Terminate of RDMAP Remote Protection, base or
    bounds violation (rdma-bindings §2.2, §2.6, §4.5)."""
    kbtp_target.require(DA)
    bed = kbtp_target.bed(seed, label="wire-atomic-bounds")
    fabric = _wire(bed)

    def scenario() -> Gen:
        victim = yield from _victim(bed)
        a = yield from _session(bed, "A", DA)
        head = a.da.head
        dst = a.buffer(8, Access.LOCAL_WRITE)
        a.conn.post_fetch_add(dst.sge(0, 8), head.stag, head.tagged_offset + 8, 0, tag="past-head")
        wc = yield from _wc(a, Op.FETCH_ADD, R_ATOMIC_BOUNDS)
        # (0, 1, 1) read swapped is (1, 0, 1): DDP local catastrophic has the one Code 0, so it names nothing
        _refusal(wc, f"a FetchAdd past the Head counter (Tagged Offset {head.tagged_offset + 8:#x})",
                 nak={NAK_REMOTE_ACCESS}, term=({0}, {1}, {0x01}), binding=fabric.binding, req=R_ATOMIC_BOUNDS)
        yield from _intact(bed, victim)

    bed.run_one(scenario())


WRITE_CASES = {
    "straddling-the-partition-end": -8,  # starts in the partition's last block, ends 8 octets past it
    "past-the-partition-end": 0,  # the first octet after the partition (a neighbour's block, if unchecked)
}


@pytest.mark.req(R_WRITE_BOUNDS, R_INTACT, "KBTP-HELLO-FIRST")
@pytest.mark.parametrize("case", sorted(WRITE_CASES))
def test_write_outside_partition(kbtp_target: TargetUnderTest, seed: int, case: str) -> None:
    """An RDMA Write through the Partition STag whose octets leave the partition is refused whole: on RoCEv2 a
    NAK remote access error, on iWARP a Terminate of DDP tagged buffer, base or bounds violation (RFC 5041 §7;
    rdma-bindings §2.2, §2.6, §4.5). test_partition_scope judges only that such a Write fails; this judges
    the answer, and a Write that starts inside and runs past the end."""
    kbtp_target.require(DA)
    p = kbtp_target.params
    bed = kbtp_target.bed(seed, label=f"wire-write-{case}")
    fabric = _wire(bed)

    def scenario() -> Gen:
        victim = yield from _victim(bed)
        a = yield from _session(bed, "A", DA)
        part = a.da.partition
        if part.count == 0:
            not_applicable("Allocation Quota 0: an empty partition")
        to = part.tagged_offset + part.count * p.block_size + WRITE_CASES[case]
        src = a.buffer(16, Access.LOCAL_WRITE, b"\xa5" * 16)
        a.conn.post_write(src.sge(0, 16), part.stag, to, tag=case)
        if fabric.binding == "iwarp":  # an RDMAP Write completes once sent: a zero-length Read behind it
            probe = a.buffer(1, Access.LOCAL_WRITE)  # is answered after the Write is placed or refused
            a.conn.post_read(probe.sge(0, 0), 0, 0, tag="probe")
        wc = yield from _wc(a, Op.RDMA_WRITE, R_WRITE_BOUNDS)
        if wc.ok and fabric.binding == "iwarp":
            wc = yield from _wc(a, Op.RDMA_READ, R_WRITE_BOUNDS)
            if wc.ok:
                violation(f"an RDMA Write of 16 octets at Tagged Offset {to:#x} ({case}) was placed: no Terminate "
                          "came before the answer to the Read behind it", req=R_WRITE_BOUNDS)
        # (1, 1, 1): Layer and EType are equal, so a nibble swap reads the same octet
        _refusal(wc, f"an RDMA Write of 16 octets at Tagged Offset {to:#x} ({case}; the partition is "
                 f"[{part.tagged_offset:#x}, +{part.count * p.block_size:#x}))", nak={NAK_REMOTE_ACCESS},
                 term=({1}, {1}, {0x01}), binding=fabric.binding, req=R_WRITE_BOUNDS, terminate=a.conn.terminate)
        yield from _intact(bed, victim)

    bed.run_one(scenario())


READ_CASES = {
    "straddling-the-pool-end": (-8, 16),  # the pool's last 8 octets and 8 past them
    "past-the-pool-end": (0, 8),  # the first 8 octets after the F blocks the Pool descriptor names
}


@pytest.mark.req(R_READ_BOUNDS, R_INTACT, "KBTP-HELLO-FIRST")
@pytest.mark.parametrize("case", sorted(READ_CASES))
def test_read_past_the_pool(kbtp_target: TargetUnderTest, seed: int, case: str) -> None:
    """An RDMA Read Request through the Pool STag beyond the F blocks the Pool descriptor advertises is refused,
    not answered: on RoCEv2 a NAK remote access error, on iWARP a Terminate of RDMAP Remote Protection, base or
    bounds violation (rdma-bindings §2.2, §2.6, §4.5)."""
    kbtp_target.require(DL)
    p = kbtp_target.params
    bed = kbtp_target.bed(seed, label=f"wire-read-{case}")
    fabric = _wire(bed)

    def scenario() -> Gen:
        victim = yield from _victim(bed)
        a = yield from _session(bed, "A", DL)
        pool = a.dl.pool
        delta, length = READ_CASES[case]
        to = pool.tagged_offset + pool.count * p.block_size + delta
        dst = a.buffer(length, Access.LOCAL_WRITE)
        a.conn.post_read(dst.sge(0, length), pool.stag, to, tag=case)
        wc = yield from _wc(a, Op.RDMA_READ, R_READ_BOUNDS)
        # (0, 1, 1) read swapped is (1, 0, 1): DDP local catastrophic has the one Code 0, so it names nothing
        _refusal(wc, f"an RDMA Read of {length} octets at Tagged Offset {to:#x} ({case}; the pool is "
                 f"[{pool.tagged_offset:#x}, +{pool.count * p.block_size:#x}))", nak={NAK_REMOTE_ACCESS},
                 term=({0}, {1}, {0x01}), binding=fabric.binding, req=R_READ_BOUNDS)
        yield from _intact(bed, victim)

    bed.run_one(scenario())


# ---- RoCEv2: PSN gaps and duplicate requests ---------------------------------------------------------------


def _packets(watched: list[bytes], seen: int) -> list[Packet]:
    out = []
    for raw in watched[seen:]:
        with contextlib.suppress(HeaderError, ValueError):
            out.append(Packet.decode(raw[:-4]))  # the ICRC stripped (the engine has checked it)
    return out


def _craft(a: HarnessInitiator, opcode: Opcode, psn: int, *, payload: bytes = b"", **ext: Any) -> bytes:
    e = a.conn.engine  # type: ignore[attr-defined]
    bth = Bth(opcode, e.remote.qpn, psn & 0xFFFFFF, ack_req=True, p_key=e.p_key)
    return append_icrc(e.local.ip, e.local.port, e.remote.ip, e.remote.port,
                       Packet(bth, payload=payload, **ext).encode())


def _answer(a: HarnessInitiator, watched: list[bytes], match: Callable[[Packet], bool], what: str,
            req: str) -> Gen:
    """The first packet from the target that ``match``es, within ANSWER_S; None when none came while the
    connection stayed up; inconclusive when the connection ended first (nothing more could be seen)."""
    found: list[Packet] = []

    def seen() -> bool:
        found[:] = [p for p in _packets(watched, 0) if match(p)]
        return bool(found) or a.conn.state is not ConnState.CONNECTED

    yield from wait_until(seen, name=what, timeout=ANSWER_S)
    if found:
        return found[0]
    if a.conn.state is not ConnState.CONNECTED:
        inconclusive(f"{what}: the connection ended ({a.conn.state}, {a.conn.terminate}) before the target's "
                     f"answer was seen ({req})")
    return None


def _no_completion(a: HarnessInitiator, request_id: int) -> Gen:
    """True when no KBTP message with ``request_id`` arrives within SILENCE_S (the request was not executed)."""
    wc = yield from wait_completion_for(a.conn.cq, SILENCE_S, lambda c: c.op is Op.RECV or not c.ok,
                                        name="silence")
    if wc is None:
        return True
    if not wc.ok:
        inconclusive(f"{a.name}: the connection failed ({wc.status.name}, {wc.terminate}) while the harness "
                     "watched for a COMPLETION that must not come")
    reply = a._message(wc, R_PSN_GAP, "a COMPLETION")
    return reply.request_id != request_id


@pytest.mark.req(R_PSN_GAP, R_INTACT, "KBTP-HELLO-FIRST")
def test_roce_psn_gap(kbtp_target: TargetUnderTest, seed: int) -> None:
    """A request packet ahead of the expected PSN is not executed: the responder answers one NAK PSN sequence
    error carrying the expected PSN, and the connection goes on (rdma-bindings §4.6 "Responder")."""
    bed = kbtp_target.bed(seed, label="wire-psn-gap")
    _wire(bed, "roce")

    def scenario() -> Gen:
        victim = yield from _victim(bed)
        a = yield from _session(bed, "A")
        epsn = a.conn.engine._next_psn  # type: ignore[attr-defined]
        watched = bed.fabric.watch(a.conn)
        bed.fabric.inject(a.conn, _craft(a, Opcode.SEND_ONLY, epsn + 4, payload=_free_raw(a)))

        def nak_or_executed(p: Packet) -> bool:  # the NAK, or a SEND of the target's: the request was executed
            return (p.opcode is Opcode.ACKNOWLEDGE and p.aeth is not None and p.aeth.kind is AethType.NAK) or \
                p.opcode in SEND_OPS

        got = yield from _answer(a, watched, nak_or_executed, "the NAK of a packet 4 PSNs ahead", R_PSN_GAP)
        if got is not None and got.opcode in SEND_OPS:
            violation(f"a SEND 4 PSNs ahead of the expected PSN {epsn:#x} was executed: the target answered the "
                      f"request it carries ({got.opcode.name} PSN {got.bth.psn:#x}) instead of a NAK PSN sequence "
                      "error", req=R_PSN_GAP)
        if got is None or got.aeth is None:
            violation(f"a SEND 4 PSNs ahead of the expected PSN {epsn:#x} got no NAK within {ANSWER_S:g} s "
                      f"(answers seen: {[(p.opcode.name, p.bth.psn) for p in _packets(watched, 0)]})", req=R_PSN_GAP)
        check(got.aeth.syndrome == NAK_PSN_SEQUENCE and got.bth.psn == epsn,
              f"the NAK of a packet 4 PSNs ahead: syndrome {got.aeth.syndrome:#04x} PSN {got.bth.psn:#x}, the rule "
              f"requires syndrome {NAK_PSN_SEQUENCE:#04x} (PSN sequence error) carrying the expected PSN "
              f"{epsn:#x}", req=R_PSN_GAP)
        quiet = yield from _no_completion(a, ATTACK_REQUEST_ID)
        check(quiet, "the request in the packet 4 PSNs ahead was executed: its COMPLETION arrived", req=R_PSN_GAP)
        r = yield from a.free(a.handle(2), req=R_PSN_GAP)
        check(a.conn.state is ConnState.CONNECTED and r.request_id != ATTACK_REQUEST_ID,
              f"after the NAK the connection's next request (at the expected PSN) was not served: {r}",
              req=R_PSN_GAP)
        yield from _intact(bed, victim)

    bed.run_one(scenario())


@pytest.mark.req(R_DUPLICATE, R_INTACT, "KBTP-HELLO-FIRST")
def test_roce_duplicate_atomic(kbtp_target: TargetUnderTest, seed: int) -> None:
    """A duplicate FetchAdd (the PSN of one already executed) is answered from the responder's saved result and
    not executed again: its Atomic Acknowledge returns the first execution's original value, and the counter
    moved once (rdma-bindings §4.6: "answer a duplicate atomic from a saved-result cache, never re-executing it";
    double-applying a ring FetchAdd loses a ticket). The FetchAdd takes one ticket (Add Data 0x0000000100000000,
    the IB binding's), which the target reclaims after the Ticket Timeout like any ticket not bound."""
    kbtp_target.require(DA)
    bed = kbtp_target.bed(seed, label="wire-duplicate-atomic")
    _wire(bed, "roce")

    def scenario() -> Gen:
        victim = yield from _victim(bed)
        a = yield from _session(bed, "A", DA)
        head = a.da.head
        psn = a.conn.engine._next_psn  # type: ignore[attr-defined]
        wc, first = yield from a.fetch_add(head.stag, head.tagged_offset, TICKET, 0, req=R_DUPLICATE, tag="once")
        if not wc.ok or first is None:
            inconclusive(f"the FetchAdd the duplicate repeats failed ({wc.status.name}, {wc.terminate}): "
                         "test_direct_alloc_head judges that")
        watched = bed.fabric.watch(a.conn)
        bed.fabric.inject(a.conn, _craft(a, Opcode.FETCH_ADD, psn,
                                         atomic=AtomicEth(head.tagged_offset, head.stag, TICKET, 0)))

        def acked(p: Packet) -> bool:
            return p.bth.psn == psn and p.opcode in (Opcode.ATOMIC_ACKNOWLEDGE, Opcode.ACKNOWLEDGE)

        got = yield from _answer(a, watched, acked, "the answer to a duplicate FetchAdd", R_DUPLICATE)
        if got is None:
            violation(f"a duplicate FetchAdd (PSN {psn:#x}) got no Atomic Acknowledge within {ANSWER_S:g} s",
                      req=R_DUPLICATE)
        check(got.opcode is Opcode.ATOMIC_ACKNOWLEDGE and got.aeth is not None and got.aeth.kind is AethType.ACK,
              f"a duplicate FetchAdd was answered with {got.opcode.name} (AETH {got.aeth}), the rule requires an "
              "Atomic Acknowledge from the saved result", req=R_DUPLICATE)
        check_equal("the original value in the Atomic Acknowledge of the duplicate FetchAdd (the first "
                    "execution's)", got.atomic_ack, first, req=R_DUPLICATE)
        wc, now = yield from a.fetch_add(head.stag, head.tagged_offset, 0, 0, req=R_DUPLICATE, tag="read")
        if not wc.ok or now is None:
            inconclusive(f"the FetchAdd of 0 that reads the Head after the duplicate failed ({wc.status.name}, "
                         f"{wc.terminate})")
        once = (first + TICKET) & U64
        check(now == once, f"the Head after one FetchAdd of {TICKET:#x} and its duplicate is {now:#018x}, not "
              f"{once:#018x}: the duplicate was executed again"
              + (" (a ticket lost)" if now == (first + 2 * TICKET) & U64 else ""), req=R_DUPLICATE)
        yield from _intact(bed, victim)

    bed.run_one(scenario())


@pytest.mark.req(R_DUPLICATE, R_INTACT, "KBTP-HELLO-FIRST")
def test_roce_duplicate_send(kbtp_target: TargetUnderTest, seed: int) -> None:
    """A duplicate SEND (the PSN of a request already delivered) is acknowledged again, not delivered again: the
    KBTP request it carries gets no second COMPLETION (rdma-bindings §4.6: "re-ACK a write or send without
    re-executing it")."""
    bed = kbtp_target.bed(seed, label="wire-duplicate-send")
    _wire(bed, "roce")

    def scenario() -> Gen:
        victim = yield from _victim(bed)
        a = yield from _session(bed, "A")
        raw = _free_raw(a)
        psn = a.conn.engine._next_psn  # type: ignore[attr-defined]
        r = yield from a.call(raw, req=R_DUPLICATE, what="the FREE the duplicate repeats")
        check(r.request_id == ATTACK_REQUEST_ID, f"the FREE the duplicate repeats was answered with {r}",
              req=R_DUPLICATE)
        watched = bed.fabric.watch(a.conn)
        bed.fabric.inject(a.conn, _craft(a, Opcode.SEND_ONLY, psn, payload=raw))

        def acked(p: Packet) -> bool:
            return p.opcode is Opcode.ACKNOWLEDGE

        got = yield from _answer(a, watched, acked, "the acknowledgement of a duplicate SEND", R_DUPLICATE)
        check(got is not None and got.aeth is not None and got.aeth.kind is AethType.ACK,
              f"a duplicate SEND (PSN {psn:#x}, AckReq) was answered with "
              f"{'nothing' if got is None else f'AETH {got.aeth}'} within {ANSWER_S:g} s; the rule requires an "
              "ACK", req=R_DUPLICATE)
        quiet = yield from _no_completion(a, ATTACK_REQUEST_ID)
        check(quiet, "the duplicate SEND was delivered again: the FREE it carries was answered a second time",
              req=R_DUPLICATE)
        yield from _intact(bed, victim)

    bed.run_one(scenario())


# ---- iWARP: MPA start frames, DDP untagged errors, RFC 7306 masked atomics --------------------------------


class _RawStream:
    """A TCP connection of the harness's own to the target's listener, outside any engine, read by the fabric's
    loop (never a blocking read: an in-process target runs on the same loop)."""

    def __init__(self, fabric: Any, address: tuple[str, int]) -> None:
        self.fabric = fabric
        self.data = bytearray()
        self.closed = ""
        try:
            self.sock = socket.create_connection(address, timeout=ANSWER_S)
        except OSError as exc:
            inconclusive(f"the target's listener at {address[0]}:{address[1]} refused a TCP connection ({exc}): "
                         "the start frame could not be sent, nothing was seen")
        self.sock.setblocking(False)
        fabric.add_reader(self.sock.fileno(), self._readable)

    def _readable(self) -> None:
        try:
            chunk = self.sock.recv(65536)
        except (BlockingIOError, InterruptedError):
            return
        except OSError as exc:
            self._end(f"reset ({errno.errorcode.get(exc.errno or 0, exc)})")
            return
        if not chunk:
            self._end("closed by the target")
            return
        self.data += chunk

    def _end(self, why: str) -> None:
        self.closed = why
        self.fabric.remove_reader(self.sock.fileno())

    def send(self, raw: bytes) -> None:
        self.sock.sendall(raw)

    def close(self) -> None:
        if not self.closed:
            self._end("closed by the harness")
        self.sock.close()


def _listening(bed: Bed) -> tuple[str, int]:
    """Where the target accepts connections: a remote target's address, or a listener of the in-process one."""
    driver = getattr(bed.endpoint, "driver", None)
    if driver is not None and getattr(driver, "port", None):
        return str(driver.host), int(driver.port)
    listener = bed.fabric.listen(bed.target_node, "127.0.0.1", 0, bed.endpoint.attach)
    return "127.0.0.1", int(bed.fabric.port_of(listener))


@dataclass(frozen=True)
class _Reply:
    reject: bool
    revision: int


def _reply(stream: _RawStream) -> _Reply | None:
    """The MPA Reply at the head of what arrived (read by its Key, flags and Rev whatever the revision), or None."""
    data = bytes(stream.data)
    if len(data) < 20 or data[:16] != mpa.REP_KEY:
        return None
    return _Reply(bool(data[16] & mpa.FLAG_R), data[17])


def _request(key: bytes = mpa.REQ_KEY, rev: int = 2) -> bytes:
    """An MPA Request as the harness's engine sends it (CRC, markers off, rev 2 peer-to-peer with a Read RTR),
    with ``key`` and ``rev`` in place of the right ones."""
    private = mpa.Enhanced(16, 16, p2p=True, read0=True).encode()
    return key + struct.pack(">BBH", mpa.FLAG_C | (mpa.FLAG_E if rev == 2 else 0), rev, len(private)) + private


# Revision 0 is no attack: RFC 5044 §7.1.2 lets a receiver accept a revision it can interoperate with, and Linux
# siw accepts the pre-RFC revision 0 ("allow for 0, 1, and 2")
MPA_CASES = {
    "key": _request(key=b"MPA ID Req Frxme"),
    "revision3": _request(rev=3),
}


@pytest.mark.req(R_MPA_START, R_INTACT, "KBTP-HELLO-FIRST")
@pytest.mark.parametrize("case", sorted(MPA_CASES))
def test_iwarp_bad_mpa_request(kbtp_target: TargetUnderTest, seed: int, case: str) -> None:
    """An MPA Request with a wrong Key or an unknown Revision is refused: the target closes the stream, or
    answers with a Reply whose R (reject) flag is set, and never accepts it nor sends an FPDU (RFC 5044 §7.1;
    RFC 6581; rdma-bindings §3.2, §3.4). A closed stream counts as the refusal only because a fresh session
    through the same listener is served afterwards (KBTP-WIRE-INTACT): a listener that accepts nothing is no
    rejection."""
    bed = kbtp_target.bed(seed, label=f"wire-mpa-{case}")
    fabric = _wire(bed, "iwarp")

    def scenario() -> Gen:
        victim = yield from _victim(bed)
        address = _listening(bed)
        bad = _RawStream(fabric, address)
        try:
            bad.send(MPA_CASES[case])
            yield from wait_until(lambda: bool(bad.closed) or _reply(bad) is not None, name="mpa-refusal",
                                  timeout=ANSWER_S)
            reply = _reply(bad)
            check(reply is None or reply.reject, f"an MPA Request with a bad {case} was accepted: the target answered "
                  f"a Reply without the R flag (Rev {reply and reply.revision})", req=R_MPA_START)
            check(bool(bad.closed) or reply is not None, f"an MPA Request with a bad {case} was neither rejected nor "
                  f"closed within {ANSWER_S:g} s: the target holds the stream open", req=R_MPA_START)
            if reply is not None and not bad.closed:
                yield from wait_until(lambda: bool(bad.closed), name="mpa-close", timeout=ANSWER_S)
                check(bool(bad.closed), f"after rejecting an MPA Request with a bad {case} (R flag) the target kept "
                      f"the stream open for {ANSWER_S:g} s", req=R_MPA_START)
        finally:
            bad.close()
        yield from _intact(bed, victim)

    bed.run_one(scenario())


def _untagged(a: HarnessInitiator, *, msn_delta: int = 0, mo: int = 0) -> bytes:
    engine = a.conn.engine  # type: ignore[attr-defined]
    seg = ddp.Segment(False, True, RdmapOpcode.SEND, _free_raw(a), qn=ddp.QN_SEND,
                      msn=(engine.msn_out[ddp.QN_SEND] + msn_delta) & 0xFFFFFFFF, mo=mo)
    return mpa.encode_fpdu(seg.encode())


def _sends(watched: list[bytes], crc: bool) -> bool:
    """Whether the target sent a Send-type message in the stream bytes ``watched`` (a request it executed)."""
    reasm = mpa.Reassembler(crc=crc)
    reasm.feed(b"".join(watched))
    while True:
        try:
            ulpdu = reasm.next()
            if ulpdu is None:
                return False
            seg = ddp.parse(ulpdu)
        except (mpa.MpaError, ddp.DdpError):
            return False
        if not seg.tagged and seg.opcode in SEND_OPCODES:
            return True


UNTAGGED_CASES: dict[str, tuple[Callable[[HarnessInitiator], bytes], set[int]]] = {
    # an MSN no receive window reaches (2^20 ahead): DDP untagged, invalid MSN range (or no buffer)
    "msn-out-of-range": (lambda a: _untagged(a, msn_delta=1 << 20), {2, 3}),
    # the last segment of a Send at Message Offset 16 MiB, past any receive buffer: DDP untagged, invalid MO
    "mo-past-the-buffer": (lambda a: _untagged(a, mo=1 << 24), {4, 5}),
}


@pytest.mark.req(R_UNTAGGED, R_INTACT, "KBTP-HELLO-FIRST")
@pytest.mark.parametrize("case", sorted(UNTAGGED_CASES))
def test_iwarp_untagged_errors(kbtp_target: TargetUnderTest, seed: int, case: str) -> None:
    """An untagged Send segment whose MSN is out of range, or whose Message Offset lies past any receive buffer,
    delivers nothing and ends the stream with the DDP untagged-buffer Terminate of that error (RFC 5041 §7.2;
    rdma-bindings §2.6, §3.1)."""
    bed = kbtp_target.bed(seed, label=f"wire-ddp-{case}")
    fabric = _wire(bed, "iwarp")
    frame, codes = UNTAGGED_CASES[case]

    def scenario() -> Gen:
        victim = yield from _victim(bed)
        a = yield from _session(bed, "A")
        watched = fabric.watch(a.conn)
        crc = bool(a.conn.engine.crc)  # type: ignore[attr-defined]
        fabric.inject(a.conn, frame(a))
        ended = yield from wait_until(lambda: a.conn.state is not ConnState.CONNECTED or _sends(watched, crc),
                                      name="attack-answer", timeout=ANSWER_S)
        term = a.conn.terminate
        if not ended or a.conn.state is ConnState.CONNECTED:
            violation(f"{case}: no Terminate within {ANSWER_S:g} s (state {a.conn.state}): the segment was taken"
                      + (", and the request it carries answered" if _sends(watched, crc) else ""), req=R_UNTAGGED)
        if term is None:
            inconclusive(f"{case}: the stream was closed without a Terminate ({a.conn.state}): a closed stream is not "
                         "the refusal the rule names, and why it closed cannot be seen")
        # (1, 2, c) read swapped is (2, 1, c): LLP has only EType 0 (rdma-bindings §2.6), so it names nothing else
        check(accepted(term, {1}, {2}, codes, case),
              f"{case}: Terminate (Layer, EType, Code) {term.key()}, the rule requires (1, 2, "
              f"{' or '.join(str(c) for c in sorted(codes))}) ({term.reason})", req=R_UNTAGGED)
        yield from _intact(bed, victim)

    bed.run_one(scenario())


@pytest.mark.req(R_TERMINATE_HEADER, "KBTP-HELLO-FIRST")
def test_iwarp_terminate_header(kbtp_target: TargetUnderTest, seed: int) -> None:
    """The Terminate header is laid out as rdma-bindings §2.5 and RFC 5040 §4.8 require. An untagged Send whose
    MSN is 2^20 ahead provokes a known error, DDP untagged buffer invalid MSN range (or no buffer): octet 0 must
    read 0x12 (Layer DDP in the high 4 bits, EType 2 in the low 4), octets 2-3 carry HdrCt M|D|R in their top
    three bits and zero in the 13 reserved ones, and what follows is exactly what D and R announce. Whether the
    error is the right one is KBTP-WIRE-DDP-UNTAGGED's (test_iwarp_untagged_errors): a Terminate that names
    another error, or none seen, leaves the layout unjudged (inconclusive)."""
    bed = kbtp_target.bed(seed, label="wire-terminate-header")
    fabric = _wire(bed, "iwarp")
    frame, codes = UNTAGGED_CASES["msn-out-of-range"]
    expected = 0x12  # Layer 1 (DDP), EType 2 (untagged buffer)

    def scenario() -> Gen:
        a = yield from _session(bed, "A")
        fabric.inject(a.conn, frame(a))
        yield from wait_until(lambda: a.conn.state is not ConnState.CONNECTED, name="attack-answer",
                              timeout=ANSWER_S)
        term = a.conn.terminate
        if term is None or not term.wire:  # none, or the harness's own: no header of the target's was read
            inconclusive(f"no Terminate from the target was read within {ANSWER_S:g} s (state {a.conn.state}, "
                         f"{term}): there is no header to judge (test_iwarp_untagged_errors judges the answer)")
        if names(term, {1}, {2}, codes) is Named.OTHER:
            inconclusive(f"the target's Terminate {term.wire[:4].hex(' ')} names another error than DDP untagged "
                         f"invalid MSN (Code {' or '.join(str(c) for c in sorted(codes))}), so what its octet 0 "
                         "should read is not known (KBTP-WIRE-DDP-UNTAGGED's failure, test_iwarp_untagged_errors)")
        faults = layout_faults(term, expected, terminated_ddp=ddp.UNTAGGED_LEN)
        check(not faults, f"the Terminate of an MSN out of range (octets {term.wire.hex(' ')}): " + "; ".join(faults),
              req=R_TERMINATE_HEADER)

    bed.run_one(scenario())


def _comp_swap(a: HarnessInitiator, stag: int, to: int, compare: int, swap: int, compare_mask: int,
               swap_mask: int) -> Gen:
    dst = a.buffer(8, Access.LOCAL_WRITE)
    a.conn.post_cmp_swap(dst.sge(0, 8), stag, to, compare, swap, compare_mask=compare_mask, swap_mask=swap_mask,
                         tag="masked-cmp-swap")
    wc = yield from _wc(a, Op.COMP_SWAP, R_MASKED)
    if not wc.ok:
        violation(f"a masked CmpSwap on the Head failed: {wc.status.name} {wc.terminate}", req=R_MASKED)
    return dst.read_u64(0)


def _fetch_add(a: HarnessInitiator, add: int, mask: int, what: str) -> Gen:
    head = a.da.head
    wc, orig = yield from a.fetch_add(head.stag, head.tagged_offset, add, mask, req=R_MASKED, tag=what)
    if not wc.ok:
        violation(f"{what}: a masked FetchAdd on the Head failed: {wc.status.name} {wc.terminate}", req=R_MASKED)
    return orig


@pytest.mark.req(R_MASKED, R_INTACT, "KBTP-HELLO-FIRST")
def test_iwarp_masked_atomics(kbtp_target: TargetUnderTest, seed: int) -> None:
    """RFC 7306 masked atomics on the Head, leaving it as found: a FetchAdd whose add carries out of the Slot
    Offset field drops the carry at the Add Mask bit (rdma-bindings §1.4), and a CmpSwap with Compare Mask 0
    matches whatever the counter holds and swaps only the Swap Mask's bits. Only the Slot Offset field moves
    (the Ticket never does, the bits between them stay zero: KBTP-RING-COUNTER-FIELDS), and it is put back."""
    kbtp_target.require(DA)
    if not kbtp_target.params.profile.masked_atomics:
        not_applicable(f"binding {kbtp_target.params.binding} has no masked atomics (RFC 7306 is RDMAP's)")
    bed = kbtp_target.bed(seed, label="wire-masked-atomics")
    _wire(bed, "iwarp")

    def scenario() -> Gen:
        victim = yield from _victim(bed)
        a = yield from _session(bed, "A", DA)
        n = a.da.ring.count
        mask = add_mask(n)
        field = n * 16  # the Slot Offset field holds 0 .. 16N - 16 (n + 4 bits)
        o = yield from _fetch_add(a, 0, mask, "read the Head")
        off = o & (field - 1)
        head = a.da.head
        if field > 16:  # N > 1: the Slot Offset field has another value to swap in
            moved = (off + 16) % field  # another Slot Offset; the Ticket (outside the Swap Mask) stays
            got = yield from _comp_swap(a, head.stag, head.tagged_offset, ~o & U64, moved, 0, field - 1)
            check_equal("the original value returned by a CmpSwap with Compare Mask 0", got, o, req=R_MASKED)
            got = yield from _comp_swap(a, head.stag, head.tagged_offset, 0, off, 0, field - 1)
            want = (o & ~(field - 1)) | moved
            check(got == want, f"a CmpSwap with Compare Mask 0 (always equal) and Swap Mask {field - 1:#x} (the Slot "
                  f"Offset field) left the Head at {got:#018x}, not {want:#018x}: "
                  + ("it did not swap (the Compare Mask was not applied)" if got == o else
                     "it swapped bits outside the Swap Mask"), req=R_MASKED)
        top = field - 16 - off  # the field to its largest value, then 16 more: it wraps to 0, carry dropped
        yield from _fetch_add(a, top, mask, "Slot Offset to 16N - 16")
        got = yield from _fetch_add(a, 16, mask, "Slot Offset past 16N - 16")
        check_equal("the Head before the add that carries out of the Slot Offset field", got,
                    (o & ~(field - 1)) | (field - 16), req=R_MASKED)
        after = yield from _fetch_add(a, off, mask, "Slot Offset back")
        check(after == o & ~(field - 1), f"after adding 16 to Slot Offset 16N - 16 = {field - 16} under Add Mask "
              f"{mask:#018x} the Head is {after:#018x}, not {o & ~(field - 1):#018x}: the carry out of bit "
              f"{(field - 1).bit_length() - 1} was not dropped (rdma-bindings §1.4)", req=R_MASKED)
        final = yield from _fetch_add(a, 0, mask, "read the Head back")
        check_equal("the Head after the masked atomics undid themselves", final, o, req=R_MASKED)
        yield from _intact(bed, victim)

    bed.run_one(scenario())

