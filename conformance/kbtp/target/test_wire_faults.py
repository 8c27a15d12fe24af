"""Faults on the wire (issue 23, item 5): a target behind a link that loses, reorders, duplicates and delays packets
still executes every KBTP request once and completes it. Catalog section "Wire bindings" (rdma-bindings.md §3.5,
§4.5, §4.6).

Each check puts the seeded impairment stage of the harness's own links (kvconform.rdma.wire.impair) on its bed,
in both directions, with the check's seed, so a failure replays (the decisions are in the evidence):

- RoCEv2, every datagram duplicated: the DIRECT_ALLOC Head moves exactly once per FetchAdd and every KBTP request
  is answered exactly once (a duplicate answered from the responder's resources, never executed again).
- RoCEv2, datagrams lost (and reordered) at a rate the harness's own requester recovers from within its retry
  count (7, the largest 3-bit count, §4.6), so a failure is the target's: every KBTP operation completes with the
  data it stored; a target that does not answer a retransmitted request, or does not NAK the gap a lost packet
  leaves, exhausts the requester's retries.
- iWARP: TCP recovers loss, duplication and reordering below MPA, so an RNIC sees only what TCP makes of them:
  the byte stream stalls and arrives cut anywhere ("TCP may split or merge FPDUs arbitrarily", §3.5). Under
  stalls and re-segmentation every KBTP operation completes.

Without a wire the harness builds (the emulated fabric, a verbs device) the checks are not applicable /
inconclusive with the reason. A run of the whole suite under ``--impair`` is the impairment grid (tox -e impair).
"""

from __future__ import annotations

import pytest

from kvconform.fixtures.kbtp import TargetUnderTest
from kvconform.kbtp.constants import Features, Status
from kvconform.kbtp.messages import Completion
from kvconform.rdma import U64, ConnState, Op, wait_completion_for
from kvconform.rdma.wire.impair import Impairment
from kvconform.targets.kbtp_bed import Bed
from kvconform.targets.kbtp_client import Gen, HarnessInitiator
from kvconform.verdicts import check, check_equal, inconclusive, not_applicable, violation

R_DUPLICATE = "KBTP-WIRE-IB-DUPLICATE"
R_RETRANSMIT = "KBTP-WIRE-IB-RETRANSMIT"
R_STREAM = "KBTP-WIRE-MPA-STREAM"
DA = Features.DIRECT_ALLOC
TICKET = 0x0000_0001_0000_0000  # the IB binding's unmasked FetchAdd on the Head: one ticket
SILENCE_S = 1.0  # how long no second COMPLETION must come for a request answered once
ROUNDS = 6  # ALLOC_STORE / LOAD / FREE rounds of the workload
READS = 10  # one-sided requests per round, where the target offers a direct path

# The checks' own impairments: heavy enough that every round meets faults, light enough that the harness's requester
# (retry count 7, reset on progress) never exhausts its retries on a correct target: at 10 % loss each way a
# message's round trip fails with p = 0.19, eight times in a row with p < 2e-6.
DUPLICATION = "dup=1,delay=1ms"
LOSS = "loss=0.1,reorder=0.05,delay=1ms"
STREAM = "loss=0.1,reorder=0.1,delay=1ms,split=0.5,rto=50ms,hold=5ms"


def _wire(bed: Bed, binding: str, spec: str, seed: int) -> Impairment:
    fabric = bed.fabric
    if getattr(fabric, "binding", None) is None:
        not_applicable("faults on the wire need a target reached over a wire binding (kbtp+iwarp://, kbtp+roce:// or "
                       "--kbtp-wire); on the emulated fabric there is no wire to impair")
    if fabric.binding != binding:
        not_applicable(f"faults on the {binding} wire; this target is reached over {fabric.binding}")
    impairment = Impairment.parse(f"{spec},seed={seed}")
    bed.impair_links(impairment)
    return impairment


def _session(bed: Bed, name: str, features: Features, req: str) -> Gen:
    """A session over the impaired link: its HELLO is the first request the faults meet, judged by ``req``."""
    ini = bed.initiator(name)
    ack = yield from ini.hello(features, req=req)
    if ack.status != Status.OK:
        inconclusive(f"{name}: HELLO (requesting {features!r}) was refused with Status {ack.status}; the check "
                     "needs the session")
    if Features(ack.features) & features != features:
        inconclusive(f"HELLO_ACK Features {Features(ack.features)!r} lack {features!r}, which PICS declares "
                     "(test_ack_features_match_pics judges that); this check needs it")
    return ini


def _direct(kbtp_target: TargetUnderTest) -> Features:
    """The direct paths the target declares: the one-sided requests it answers as a responder."""
    want = Features(0)
    if kbtp_target.has(Features.DIRECT_LOAD):
        want |= Features.DIRECT_LOAD
    if kbtp_target.has(DA) and kbtp_target.params.partition_count >= max(1, kbtp_target.params.quota):
        want |= DA
    return want


def _once(seen: set[int], reply: object, req: str, what: str) -> None:
    """A COMPLETION's Request ID is new: one already answered means a request was executed (answered) twice."""
    msg = getattr(reply, "message", None)
    if isinstance(msg, Completion):
        check(msg.request_id not in seen, f"{what}: a second COMPLETION of request {msg.request_id} arrived: a "
              "duplicated request was executed again", req=req)
        seen.add(msg.request_id)


def _workload(bed: Bed, a: HarnessInitiator, req: str, seen: set[int], impairment: Impairment) -> Gen:
    """ALLOC_STORE (by RDMA Read of the harness's buffer: several packets), LOAD (an RDMA Write into it) and FREE,
    ROUNDS times: each completes OK with the data stored; any failure is a violation of ``req``."""
    length = min(3000, bed.params.block_size)
    quota = max(1, min(2, a.ack.allocation_quota))
    for i in range(ROUNDS):
        h = a.handle(i % quota)
        data = bytes((i * 31 + j) & 0xFF for j in range(length))
        where = f"round {i + 1} of {ROUNDS} under {impairment.spec()}"
        r = yield from a.alloc_store(h, data, req=req)
        _once(seen, r, req, f"ALLOC_STORE, {where}")
        check(r.status == Status.OK, f"ALLOC_STORE of {length} octets, {where}: {r}", req=req)
        r, got = yield from a.load(h, length, req=req)
        _once(seen, r, req, f"LOAD, {where}")
        check(r.status == Status.OK, f"LOAD, {where}: {r}", req=req)
        check_equal(f"the block loaded back, {where}", got, data, req=req)
        yield from _one_sided(bed, a, h, req, impairment, where)
        r = yield from a.free(h, req=req)
        _once(seen, r, req, f"FREE, {where}")
        check(r.status == Status.OK, f"FREE, {where}: {r}", req=req)
    check(a.conn.state is ConnState.CONNECTED, f"the connection ended under {impairment.spec()}: "
          f"{a.conn.state.name} ({a.conn.terminate})", req=req)


def _one_sided(bed: Bed, a: HarnessInitiator, h: int, req: str, impairment: Impairment, where: str) -> Gen:
    """READS one-sided requests the target answers as a responder (RDMA Reads of the table entry with DIRECT_LOAD,
    FetchAdds of 0 on the Head with DIRECT_ALLOC): a lost answer makes the harness retransmit the request, which
    the target then sees as a duplicate. Each completes."""
    granted = Features(a.ack.features)
    for _ in range(READS):
        if granted & Features.DIRECT_LOAD:
            got = yield from a.read_entry(h, req=req)
            check(got is not None, f"an RDMA Read of handle {h:#x}'s table entry failed, {where}: "
                  f"{a.conn.state.name} ({a.conn.terminate})", req=req)
        elif granted & DA:
            head = a.da.head
            wc, _ = yield from a.fetch_add(head.stag, head.tagged_offset, 0, 0, req=req, tag="head")
            check(wc.ok, f"a FetchAdd of 0 on the Head failed, {where}: {wc.status.name} ({wc.terminate})", req=req)
        else:
            return


def _quiet(a: HarnessInitiator, seen: set[int], req: str) -> Gen:
    """No further COMPLETION within SILENCE_S (every request was answered exactly once)."""
    wc = yield from wait_completion_for(a.conn.cq, SILENCE_S, lambda c: c.op is Op.RECV or not c.ok,
                                        name="silence")
    if wc is None:
        return
    if not wc.ok:
        violation(f"{a.name}: the connection failed ({wc.status.name}, {wc.terminate}) after the last request was "
                  "answered", req=req)
    reply = a._message(wc, req, "a COMPLETION no request asked for")
    violation(f"{a.name}: a COMPLETION (Request ID {reply.request_id}) arrived after every request was answered: "
              f"a duplicated request was executed again ({len(seen)} answered before)", req=req)


@pytest.mark.req(R_DUPLICATE)
def test_roce_duplicated_link_executes_once(kbtp_target: TargetUnderTest, seed: int) -> None:
    """Every datagram of the link duplicated, both directions: the target answers each duplicate from its responder
    resources and executes nothing twice (rdma-bindings §4.6: "re-ACK a write or send without re-executing it ...
    answer a duplicate atomic from a saved-result cache, never re-executing it. Double-applying a KBTP ring FetchAdd
    would lose a ticket"): the DIRECT_ALLOC Head moves by exactly one ticket per FetchAdd that takes one, and every
    KBTP request gets exactly one COMPLETION."""
    bed = kbtp_target.bed(seed, label="wire-faults-duplication")
    impairment = _wire(bed, "roce", DUPLICATION, seed)
    direct = kbtp_target.has(DA) and kbtp_target.params.partition_count >= max(1, kbtp_target.params.quota)

    def scenario() -> Gen:
        a = yield from _session(bed, "A", DA if direct else Features(0), R_DUPLICATE)
        seen: set[int] = set()
        if direct:
            head = a.da.head
            for n in range(3):
                wc, before = yield from a.fetch_add(head.stag, head.tagged_offset, 0, 0, req=R_DUPLICATE, tag="head")
                if not wc.ok or before is None:
                    violation(f"a FetchAdd of 0 on the Head failed under {impairment.spec()}: {wc.status.name} "
                              f"({wc.terminate})", req=R_DUPLICATE)
                ticket, slot = yield from a.take_ticket(req=R_DUPLICATE)
                wc, after = yield from a.fetch_add(head.stag, head.tagged_offset, 0, 0, req=R_DUPLICATE, tag="head")
                if not wc.ok or after is None:
                    violation(f"a FetchAdd of 0 on the Head failed under {impairment.spec()}: {wc.status.name} "
                              f"({wc.terminate})", req=R_DUPLICATE)
                once = (before + TICKET) & U64
                check(after == once, f"ticket {n + 1}: the Head went from {before:#018x} to {after:#018x} for one "
                      f"FetchAdd of {TICKET:#x} sent over a link that duplicates every datagram, not to {once:#018x}"
                      + (": the duplicate was executed again (a ticket lost)" if after == (before + 2 * TICKET) & U64
                         else ""), req=R_DUPLICATE)
                block = yield from a.await_slot(ticket, slot, req=R_DUPLICATE)
                wc = yield from a.write_block(block, bytes([n + 1]) * 32, req=R_DUPLICATE)
                check(wc.ok, f"the RDMA Write into ticket {ticket}'s block failed under {impairment.spec()}: "
                      f"{wc.status.name} ({wc.terminate})", req=R_DUPLICATE)
                r = yield from a.bind(a.handle(0), ticket, 32, block, req=R_DUPLICATE)
                _once(seen, r, R_DUPLICATE, f"BIND of ticket {ticket}")
                check(r.status == Status.OK, f"BIND of ticket {ticket} under {impairment.spec()}: {r}",
                      req=R_DUPLICATE)
                r = yield from a.free(a.handle(0), req=R_DUPLICATE)
                _once(seen, r, R_DUPLICATE, f"FREE of ticket {ticket}'s handle")
                check(r.status == Status.OK, f"FREE of the handle bound to ticket {ticket}: {r}", req=R_DUPLICATE)
        yield from _workload(bed, a, R_DUPLICATE, seen, impairment)
        yield from _quiet(a, seen, R_DUPLICATE)

    bed.run_one(scenario())


@pytest.mark.req(R_RETRANSMIT)
def test_roce_lossy_link_recovers(kbtp_target: TargetUnderTest, seed: int) -> None:
    """Datagrams lost (10 %) and reordered (5 %) both ways: the target answers each retransmitted request as
    §4.6 prescribes for a duplicate (an ACK again, a READ re-executed, an atomic's saved result) and NAKs the PSN
    gap a lost packet leaves (§4.5: "A PSN sequence error is not a failure: it triggers retransmission"), so the
    harness's go-back-N, within its retry count of 7, recovers every loss: each KBTP operation completes with the
    data it stored and the connection stays up."""
    bed = kbtp_target.bed(seed, label="wire-faults-loss")
    impairment = _wire(bed, "roce", LOSS, seed)

    def scenario() -> Gen:
        a = yield from _session(bed, "A", _direct(kbtp_target), R_RETRANSMIT)
        seen: set[int] = set()
        yield from _workload(bed, a, R_RETRANSMIT, seen, impairment)

    bed.run_one(scenario())


@pytest.mark.req(R_STREAM)
def test_iwarp_stalled_split_stream(kbtp_target: TargetUnderTest, seed: int) -> None:
    """The TCP byte stream of the link stalled (what TCP makes of a lost or reordered segment) and cut at random
    octets, both ways: the target reassembles FPDUs from whatever pieces arrive (rdma-bindings §3.5: "FPDU framing
    with a stream reassembler. TCP may split or merge FPDUs arbitrarily") and completes every KBTP operation."""
    bed = kbtp_target.bed(seed, label="wire-faults-stream")
    impairment = _wire(bed, "iwarp", STREAM, seed)

    def scenario() -> Gen:
        a = yield from _session(bed, "A", Features(0), R_STREAM)
        seen: set[int] = set()
        yield from _workload(bed, a, R_STREAM, seen, impairment)

    bed.run_one(scenario())
