"""kbtp-initiator: what the initiator sends — HELLO, requests inside its own handle range and quota, the
Generation it expects, its byte order, single-use STags (KBTP "Session Establishment", "Common Header",
"Descriptors", "Allocation Quotas", "Security Considerations").

The harness plays the target (the reference, observing every message); what the initiator under test did
is judged afterwards from what the target received. An initiator that fails an operation it was asked to
do (it raised, or never finished) fails the check on the requirement that says it does that."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pytest

from kvconform import evidence, sweep
from kvconform.conformance.kbtp import expect, exposure
from kvconform.fixtures.kbtp import InitiatorUnderTest
from kvconform.kbtp.constants import FLAGS_OF_OPCODE, Features, Opcode, RequestFlags, Status
from kvconform.kbtp.messages import AllocStore, Free, Goodbye, Hello, HelloAck, Load, Store
from kvconform.targets.kbtp import TargetParams
from kvconform.targets.kbtp_client import Gen, precise
from kvconform.targets.kbtp_observer import Exposed, InitiatorBed, exposed_stags, stags_observable
from kvconform.verdicts import HarnessBug, check, inconclusive, not_applicable


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
    Generation and Status, and Completion Credits > 0 (judged from its octets first, so a HELLO the harness target
    refused is blamed on the field that made it refuse; the receive buffers behind the credits:
    test_hello_credits_posted)."""
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


@pytest.mark.req("KBTP-HELLO-LAYOUT")
def test_hello_credits_posted(kbtp_initiator: InitiatorUnderTest, seed: int) -> None:
    """HELLO's Completion Credits claims no more receive buffers than the initiator had posted when it arrived.
    In this process the harness counts them; an initiator in another process is probed over the harness's
    userspace wire: as many Sends as it claims, at once, behind the HELLO_ACK, and its transport either takes them
    all or refuses one (RNR NAK, no-buffer Terminate; targets/kbtp_credits.py). Only KBTP-HELLO-LAYOUT is cited:
    a HELLO that is not one, or not sent as a Send, is test_hello's to blame."""
    bed = kbtp_initiator.bed(seed, label="hello-credits", credit_probe=True)
    bed.run_one(bed.op(bed.endpoint.hello()))
    messages = bed.messages()
    first = messages[0] if messages else None
    if first is None or not isinstance(first.message, Hello):  # test_hello blames the field that makes it so
        inconclusive("the first message of the initiator is not a HELLO that decodes, so it claims no credits"
                     + (f": {first.error}" if first is not None else " (none arrived)"))
    claimed = first.message.completion_credits
    if first.posted is not None:
        check(first.posted >= claimed, f"HELLO Completion Credits at offset 26 claims {claimed} receive buffers, "
              f"and the initiator had posted {first.posted} when it arrived", req="KBTP-HELLO-LAYOUT", seen=claimed,
              expected=f"at most {first.posted}")
        return
    probe = bed.probe_credits()
    if probe is None:
        inconclusive(f"the initiator's HELLO claims {claimed} Completion Credits, and the harness can neither count "
                     f"its receive buffers (its own memory) nor probe them on {bed.fabric!r}: the device answers a "
                     "Send that finds no buffer without the harness seeing them (run the initiator against the "
                     "harness's userspace binding to judge it)")
    if probe.claimed is None:
        inconclusive("the harness target opened no session for the initiator's HELLO, so it sent nothing to probe "
                     f"its {claimed} Completion Credits with")
    check(not probe.overrun, f"HELLO Completion Credits at offset 26 claims {claimed} receive buffers, and of the "
          f"{probe.sent} Sends the harness target released at once behind the HELLO (its HELLO_ACK and "
          f"{probe.sent - 1} COMPLETIONs) the initiator's transport refused one for want of a posted receive: "
          f"{'; '.join(probe.overrun[:2])}", req="KBTP-HELLO-LAYOUT", seen=claimed,
          expected=f"receive buffers for {probe.sent} Sends")
    if probe.sent <= 1 and bed.failure is not None:  # its HELLO_ACK alone: delivered if its HELLO exchange ended
        inconclusive(f"the initiator's HELLO claims {claimed} Completion Credit, and whether the HELLO_ACK reached it "
                     f"was not seen: {bed.failure}")
    if not probe.delivered:
        inconclusive(f"of the {probe.sent} Sends behind the HELLO (its {claimed} Completion Credits), neither their "
                     "acknowledgement nor a refusal came back within the probe's bound: their delivery was not seen")
    if probe.sent < claimed:
        inconclusive(f"black box: {probe.sent} Sends released together were all received, fewer than the {claimed} "
                     "Completion Credits claimed (the probe's cap): the rest were not judged")
    evidence.note(f"black box: {probe.sent} Sends (HELLO_ACK and {probe.sent - 1} COMPLETIONs) released together "
                  f"behind the HELLO, all received: its {claimed} Completion Credits hold")


@pytest.mark.req("KBTP-HELLO-ID-ENTROPY", "KBTP-HELLO-FIRST")
def test_initiator_id_entropy(kbtp_initiator: InitiatorUnderTest, seed: int) -> None:
    """Fresh initiators send Initiator IDs that differ from one another and are not low-entropy patterns."""
    ids = []
    handed = 0  # initiators that sent the Initiator ID the harness gave them
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
        handed += iid == getattr(bed.endpoint, "handed_initiator_id", None)
    if handed == len(ids):  # their entropy is the harness's: how the initiator generates its own is not seen
        inconclusive("the harness handed each initiator its Initiator ID ({initiator_id} in the cmd: template), "
                     "and it used it: how it generates one of its own is not seen (drop the placeholder to judge it)")
    expect.equal("distinct Initiator IDs of 3 fresh initiators", len(set(ids)), 3, req="KBTP-HELLO-ID-ENTROPY")


# ---- one session of stores, loads and frees, judged by several checks ----------------------------------------


@dataclass
class RequestRun:
    """What the initiator sent when asked to store, store again, load and free (see ``_requests``)."""

    bed: InitiatorBed
    gens: dict[int, int]
    statuses: list[tuple[str, int]]
    asked: dict[str, bytes] = field(default_factory=dict)  # what each store / load should carry ("STORE 1": ...)
    loaded: dict[str, bytes | None] = field(default_factory=dict)  # what the initiator's LOADs returned

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
    then GOODBYE; nothing is judged here, only run. The data fits the declared Block Size (a larger store is
    TOO_LARGE, whoever sends it)."""
    bed = kbtp_initiator.bed(seed, label="requests")
    ep = bed.endpoint
    big = bytes(range(256)) * 4
    fit = bed.target_params.block_size
    data = {0: b"first"[:fit], 1: big[:min(300, fit)]}
    gens: dict[int, int] = {}
    statuses: list[tuple[str, int]] = []
    asked = {"ALLOC_STORE 0": data[0], "LOAD 0": data[0], "ALLOC_STORE 1": data[1], "LOAD 1": data[1],
             "STORE 1": b"second, again"[:fit]}
    loaded: dict[str, bytes | None] = {}

    def note(what: str, r: Any) -> Any:
        statuses.append((what, int(r.status)))
        if what.startswith("LOAD"):
            loaded[what] = r.data
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
        note("STORE 1", (yield from bed.op(ep.store(h1, asked["STORE 1"], seal=True, generation=gens[1]))))
        if not freed:
            note("FREE 0", (yield from bed.op(ep.free(h0, generation=gens[0]))))
        yield from bed.op(ep.goodbye(False))

    bed.run_one(scenario())
    return RequestRun(bed, gens, statuses, asked, loaded)


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
    requests = request_run.requests("KBTP-ADDRLE-INITIATOR")
    for m in requests:
        if isinstance(m, AllocStore | Store | Free | Load):
            check(lo <= m.handle < hi, f"{type(m).__name__} names handle {m.handle:#x} read little-endian, outside "
                  f"[{lo:#x}, {hi:#x}): is it big-endian?", req="KBTP-ADDRLE-INITIATOR")
    if not stags_observable(request_run.bed.initiator_node):  # a black box: read and write through them
        exposure.judge_addr_le(request_run, lo)
        request_run.bed.settle(req="KBTP-HELLO-FIRST")
        return
    named = 0
    for rec in request_run.bed.messages()[1:]:
        m = rec.message
        if isinstance(m, Load) or (isinstance(m, AllocStore | Store) and m.inline is None):
            named += 1
            d = m.data
            check(_within(rec.exposed, d.stag, d.tagged_offset, d.length),
                  f"{type(m).__name__} Data Descriptor read little-endian (STag {d.stag:#x}, Tagged Offset "
                  f"{d.tagged_offset:#x}, Length {d.length}) names no buffer the initiator exposed "
                  f"({_shown(rec.exposed)}): is it big-endian?", req="KBTP-ADDRLE-INITIATOR")
    check(named > 0, "no request named a buffer by STag: the descriptors' byte order was not exercised",
          req="KBTP-ADDRLE-INITIATOR")
    request_run.bed.settle(req="KBTP-HELLO-FIRST")


def _within(exposed: tuple[Exposed, ...], stag: int, to: int, length: int) -> bool:
    """An exposed STag ``stag`` covers [to, to + length)."""
    return any(e.stag == stag and e.to <= to and to + length <= e.to + e.length for e in exposed)


def _shown(exposed: tuple[Exposed, ...] | list[Exposed]) -> str:
    return ", ".join(f"STag {e.stag:#x} [{e.to:#x}, +{e.length})" for e in exposed) or "none"


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
            r = yield from bed.op(ep.alloc_store(ep.handle_base + i, bed.fit(b"q" * 8)))
            expect.status_is(r, Status.OK, req="KBTP-QUOTA-USAGE", what=f"allocation {i + 1} of {q}")
        over = yield from bed.op(ep.alloc_store(ep.handle_base + q, bed.fit(b"over")))
        check(over.status != Status.OK, "an allocation over quota completed OK", req="KBTP-QUOTA-INITIATOR")
        r = yield from bed.op(ep.free(ep.handle_base))
        expect.status_is(r, Status.OK, req="KBTP-QUOTA-USAGE", what="FREE")
        r = yield from bed.op(ep.alloc_store(ep.handle_base + q, bed.fit(b"after free")))
        expect.status_is(r, Status.OK, req="KBTP-QUOTA-USAGE", what="allocation after a FREE")

    bed.run_one(scenario())
    refused = bed.target.counters.count(Opcode.ALLOC_STORE, Status.NO_SPACE)
    expect.equal("ALLOC_STOREs the target had to refuse NO_SPACE", refused, 0, req="KBTP-QUOTA-INITIATOR")
    bed.settle(req="KBTP-QUOTA-USAGE")


# KBTP-HELLO-FIRST only as a blame (its HELLO exchange may fail here): what this check cannot see over a wire (the
# initiator's STags) leaves its own rules inconclusive, not the HELLO rule other checks judge
@pytest.mark.req("KBTP-SEC-SINGLE-USE-STAG", "KBTP-SEC-REQUEST-INVALIDATE")
@pytest.mark.blames("KBTP-HELLO-FIRST")
def test_single_use_stags(kbtp_initiator: InitiatorUnderTest, seed: int) -> None:
    """Every LOAD, and every ALLOC_STORE and STORE not sent inline (both paths the target RDMA-reads), names a
    fresh STag that is no longer valid once the request completed, and asks for INVALIDATE so the completion
    revokes it (when PICS says it does). The stores carry more than Max Inline, so every initiator names an STag
    for them whatever its own inline choice; where Max Inline reaches the Block Size any store may go inline, and
    only the LOADs are sure to name one. A black box (another process): the STags are read off its messages, and
    each is probed once its GOODBYE arrived (conformance/kbtp/exposure.py)."""
    bed = kbtp_initiator.bed(seed, label="stags")
    bed.run_one(_single_use_scenario(bed, goodbye=False))
    bed.settle(req="KBTP-SEC-SINGLE-USE-STAG")
    named = [m for m in (rec.message for rec in bed.messages())
             if isinstance(m, Load) or (isinstance(m, AllocStore | Store) and m.inline is None)]
    stags = [(m.data.stag, type(m).__name__) for m in named]
    sent = {type(rec.message).__name__ for rec in bed.messages() if isinstance(rec.message, Load | AllocStore | Store)}
    expect.equal("operations sent", sorted(sent), ["AllocStore", "Load", "Store"], req="KBTP-SEC-SINGLE-USE-STAG")
    least = 5 if _store_size(bed.target_params) is not None else 3  # else the stores may go inline
    check(len(stags) >= least, f"only {len(stags)} requests named an STag (of the 3 LOADs"
          f"{' and 2 stores larger than Max Inline' if least == 5 else ''})", req="KBTP-SEC-SINGLE-USE-STAG")
    expect.equal("distinct STags over the requests", len({s for s, _ in stags}), len(stags),
                 req="KBTP-SEC-SINGLE-USE-STAG")
    if not stags_observable(bed.initiator_node):  # a black box: whether an STag is still valid, probed
        exposure.probe_single_use(kbtp_initiator, seed, lambda b: _single_use_scenario(b, goodbye=True))
    for stag, what in stags if stags_observable(bed.initiator_node) else ():  # read off the initiator's node
        check(not bed.initiator_node.is_valid(stag), f"STag {stag:#x} of a completed {what} is still valid",
              req="KBTP-SEC-SINGLE-USE-STAG")
    # after the STags' own rule: an initiator that reuses one STag usually requests no INVALIDATE either
    for m in named if kbtp_initiator.params.requests_invalidate else ():
        check(bool(m.flags & RequestFlags.INVALIDATE), f"{type(m).__name__} does not request INVALIDATE",
              req="KBTP-SEC-REQUEST-INVALIDATE")


def _store_size(t: TargetParams) -> int | None:
    """Octets a store must carry to be sent by RDMA Read: 2000, or more than Max Inline, within the Block Size (a
    larger store is TOO_LARGE); None where Max Inline reaches the Block Size (a store may always go inline)."""
    if t.max_inline >= t.block_size:
        return None
    return min(t.block_size, max(2000, t.max_inline + 1))


def _single_use_scenario(bed: InitiatorBed, *, goodbye: bool) -> Gen:
    """An ALLOC_STORE and a STORE larger than Max Inline (RDMA-read, not inline: `_store_size`), three LOADs of
    4096; then GOODBYE for the probes of test_single_use_stags (each refused probe ends its bed)."""
    ep = bed.endpoint
    t = bed.target_params
    big = b"S" * (_store_size(t) or min(2000, t.block_size))
    bed.allocates()
    yield from _hello(bed)
    r = yield from bed.op(ep.alloc_store(ep.handle_base, big, seal=False))
    expect.status_is(r, Status.OK, req="KBTP-SEC-SINGLE-USE-STAG", what="ALLOC_STORE")
    r = yield from bed.op(ep.store(ep.handle_base, big[::-1], seal=True))  # the other RDMA Read path
    expect.status_is(r, Status.OK, req="KBTP-SEC-SINGLE-USE-STAG", what="STORE")
    for _ in range(3):
        r = yield from bed.op(ep.load(ep.handle_base, 4096))
        expect.status_is(r, Status.OK, req="KBTP-SEC-SINGLE-USE-STAG", what="LOAD")
    if goodbye:
        yield from bed.op(ep.goodbye(False))


@pytest.mark.req("KBTP-SEC-EXPOSE-DESCRIBED", "KBTP-HELLO-FIRST")
def test_exposes_only_described_buffers(kbtp_initiator: InitiatorUnderTest, request_run: RequestRun,
                                       seed: int) -> None:
    """Whenever a request arrived, and after the session, every STag of the initiator that grants remote access
    is one a descriptor it sent names, and reaches no octet outside the buffers those descriptors name (a LOAD
    into 1024 octets of a larger buffer exposes 1024 octets, not the buffer). A black box (another process): the
    octets just outside each named span are probed while it is outstanding (an STag still valid after the session
    is test_single_use_stags's to judge)."""
    _ack(request_run.bed, "KBTP-HELLO-FIRST")
    if not stags_observable(request_run.bed.initiator_node):  # a black box: probe through the named STags
        exposure.probe_exposure(kbtp_initiator, seed, _probe_scenario)
        request_run.bed.settle(req="KBTP-HELLO-FIRST")
        return
    named: dict[int, list[tuple[int, int]]] = {}
    snapshots: list[tuple[str, tuple[Exposed, ...]]] = []
    for rec in request_run.bed.messages()[1:]:
        for _what, stag, to, length in exposure.spans_of(rec.message):
            named.setdefault(stag, []).append((to, length))
        snapshots.append((f"when {type(rec.message).__name__ if rec.message else 'a message'} arrived", rec.exposed))
        _judge_exposure(named, snapshots[-1])
    check(len(snapshots) > 1, "the initiator sent no requests: nothing was exposed or judged",
          req="KBTP-SEC-EXPOSE-DESCRIBED")
    _judge_exposure(named, ("after the session", tuple(exposed_stags(request_run.bed.initiator_node))))
    request_run.bed.settle(req="KBTP-HELLO-FIRST")


def _probe_scenario(bed: InitiatorBed) -> Gen:
    """ALLOC_STORE of 300 octets (by RDMA Read when larger than Max Inline), a LOAD of 1024, GOODBYE: each a
    descriptor the probes of test_exposes_only_described_buffers read around (a probe refused ends the bed)."""
    ep = bed.endpoint
    if (yield from bed.op(ep.hello())) is None:
        return
    data = (bytes(range(256)) + bytes(44))[:bed.target_params.block_size]  # a larger store is TOO_LARGE
    r = yield from bed.op(ep.alloc_store(ep.handle_base, data, seal=True))
    yield from bed.op(ep.load(ep.handle_base, 1024, generation=r.generation))
    yield from bed.op(ep.goodbye(False))


def _judge_exposure(named: dict[int, list[tuple[int, int]]], snapshot: tuple[str, tuple[Exposed, ...]]) -> None:
    when, exposed = snapshot
    for e in exposed:
        spans = named.get(e.stag, [])
        check(bool(spans), f"{when}: STag {e.stag:#x} grants remote access (access {e.access:#x}) to "
              f"[{e.to:#x}, +{e.length}), and no descriptor the initiator sent names it",
              req="KBTP-SEC-EXPOSE-DESCRIBED")
        covered = any(to <= e.to and e.to + e.length <= to + length for to, length in spans)
        check(covered, f"{when}: STag {e.stag:#x} reaches [{e.to:#x}, +{e.length}), wider than its descriptors "
              f"name ({', '.join(f'[{to:#x}, +{n})' for to, n in spans)})", req="KBTP-SEC-EXPOSE-DESCRIBED")


@pytest.mark.req("KBTP-INIT-REQUEST-CREDITS", "KBTP-HELLO-FIRST")
@pytest.mark.parametrize("credits", sweep.pick([1], [2, 3]))
def test_request_credits(kbtp_initiator: InitiatorUnderTest, seed: int, credits: int) -> None:
    """Granted ``credits`` Request Credits and asked for several operations at once — ALLOC_STOREs, then LOADs
    and STOREs, then FREEs — the initiator never has more requests outstanding (arrived at the target, their
    completion not yet delivered to it) than it was granted, and completes them all. One credit is the
    boundary: any pipelining exceeds it (the harness target posts spare receive buffers, so an overrun is
    seen, not turned into a terminated connection)."""
    bed = kbtp_initiator.bed(seed, label=f"credits-{credits}", request_credits=credits)
    ep = bed.endpoint
    statuses: list[tuple[str, int]] = []

    def note(what: str, op: Any) -> Gen:
        r = yield from bed.op(op)
        statuses.append((what, int(r.status)))
        return r

    bed.run_one(_hello(bed))
    ack = _ack(bed, "KBTP-INIT-REQUEST-CREDITS")
    if ack.request_credits != credits:
        raise HarnessBug(f"the harness target advertised {ack.request_credits} Request Credits, not {credits}")
    q = min(ep.quota, 2)
    if q == 0:
        not_applicable("Allocation Quota 0: the initiator can bind nothing")
    handles = [ep.handle_base + i for i in range(q)]
    phases: list[dict[str, Gen]] = [
        {f"alloc{i}": note(f"ALLOC_STORE {i}", ep.alloc_store(h, bed.fit(b"credit-%d" % i), seal=False))
         for i, h in enumerate(handles)},
        {**{f"load{i}.{k}": note(f"LOAD {i}", ep.load(h, 64, allow_unsealed=True))
            for i, h in enumerate(handles) for k in range(2)},
         **{f"store{i}": note(f"STORE {i}", ep.store(h, bed.fit(b"again-%d" % i), seal=False))
            for i, h in enumerate(handles)}},
        {f"free{i}": note(f"FREE {i}", ep.free(h)) for i, h in enumerate(handles)},
    ]
    for actors in phases:
        if bed.failure is None:
            bed.run(**actors)
    most, step = _most_outstanding(bed)
    check(most <= credits, f"{most} requests of the initiator were outstanding at step {step} with {credits} "
          f"Request Credits granted [{bed.hint()}]", req="KBTP-INIT-REQUEST-CREDITS", seen=most,
          expected=f"at most {credits}")
    bed.settle(req="KBTP-INIT-REQUEST-CREDITS")
    for what, status in statuses:
        expect.equal(f"Status of the initiator's {what}", expect.status_name(status), "OK",
                     req="KBTP-INIT-REQUEST-CREDITS")
    expect.equal("operations completed", len(statuses), 5 * q, req="KBTP-INIT-REQUEST-CREDITS")


def _most_outstanding(bed: InitiatorBed) -> tuple[int, int]:
    """The most messages of the initiator that had arrived at the target while their answers (COMPLETIONs, or
    completion records written with Immediate Data) had not been delivered to the initiator, and the step it
    happened at (a lower bound of what it had outstanding when it sent the last of them, since messages arrive in
    the order sent)."""
    # An initiator in another process: its deliveries are not visible, the target's answers posted are (each is
    # delivered after it was posted, so counting posts gives a lower bound again: never a false failure).
    answered_at, answered = ((bed.initiator_conn.name, "deliver") if bed.initiator_conn is not None
                             else (bed.target_conn, "post"))
    arrived = delivered = 0
    most, at = 0, -1
    for rec in bed.fabric.trace:
        for eff in rec["effects"]:
            if eff.get("do") == "send-arrive" and eff.get("who") == bed.target_conn:
                arrived += 1
                if arrived - delivered > most:
                    most, at = arrived - delivered, int(rec["step"])
            # an answer is a COMPLETION (a Send) or, for a request with RECORD, a completion record: an RDMA Write
            # with Immediate (KBTP "Completion"; IB binding), whose Immediate Data is delivered like a Send
            elif eff.get("do") == answered and eff.get("who") == answered_at and (
                    eff.get("op", "SEND") == "SEND" or eff.get("imm")):
                delivered += 1
    return most, at
