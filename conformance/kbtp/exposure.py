"""Judging an initiator's descriptors and exposure from outside (kbtp-initiator over a wire, a ``cmd:`` process):
the harness target holds every descriptor the initiator sent, so it reads and writes through them.

- KBTP-ADDRLE-INITIATOR: a descriptor read little-endian names the initiator's buffer when the harness target's
  RDMA Read through it returns exactly the data the harness asked the initiator to store, and when the data the
  harness target RDMA-Wrote through a LOAD's descriptor is what the initiator's LOAD returned.
- KBTP-SEC-EXPOSE-DESCRIBED: one octet just outside each described span (before its Tagged Offset, past its end),
  read with the same STag while the request is outstanding, must be refused by the initiator's RNIC. STags no
  descriptor named cannot be enumerated from outside: the pass says so.
- KBTP-SEC-SINGLE-USE-STAG: the STag of each described span, read at the span's start once the initiator's GOODBYE
  arrived (every request completed), must be refused. An STag still valid then reaches only the buffer its
  descriptor named, which the exposure rule allows: it is this rule that the STag outlived its request breaks.
A refused Read moves the connection to error (RDMAP Terminate, IB NAK), so each probe has a bed of its own: its
scenario does not go on after it."""

from __future__ import annotations

from collections.abc import Generator
from dataclasses import dataclass, field
from typing import Any

from kvconform import evidence
from kvconform.kbtp.constants import Opcode
from kvconform.kbtp.messages import AllocStore, Goodbye, Load, Message, Store
from kvconform.rdma.fabric import Access, Status, wait_completion_for
from kvconform.verdicts import check, inconclusive, pass_basis

PROBE_WAIT_S = 5.0  # fabric time for the initiator's RNIC to answer one probe Read
PROBE_BEDS = 12  # at most this many probe beds (spans x ends); the scenario names 2 to 4 spans
AFTER_SESSION = "after the session"
SPAN_ENDS = ("before", "past")  # the exposure probes; AFTER_SESSION is the single-use probe's
# how the initiator's RNIC refuses an access (RDMAP Terminate, IB NAK: rdma-bindings.md), as the requester sees it
REFUSALS = (Status.REM_ACCESS_ERR, Status.REM_INV_REQ_ERR, Status.REM_OP_ERR)


def spans_of(m: Message | None) -> list[tuple[str, int, int, int]]:
    """(what, STag, Tagged Offset, Length) of every buffer the message's descriptors name (a completion record
    slot is 24 octets)."""
    out = []
    if isinstance(m, Load) or (isinstance(m, AllocStore | Store) and m.inline is None):
        out.append((f"{type(m).__name__} data", m.data.stag, m.data.tagged_offset, m.data.length))
    completion = getattr(m, "completion", None)
    if completion is not None:
        out.append((f"{type(m).__name__} completion record", completion.stag, completion.tagged_offset, 24))
    return out


def judge_addr_le(run: Any, lo: int) -> None:
    """KBTP-ADDRLE-INITIATOR from outside: every descriptor (decoded little-endian) carried the data asked for."""
    reads = {r.request_id: r for r in run.bed.target.reads if r.conn == run.bed.target_conn}
    named = 0
    for rec in run.bed.messages()[1:]:
        m = rec.message
        if not (isinstance(m, Load) or (isinstance(m, AllocStore | Store) and m.inline is None)):
            continue
        named += 1
        what = f"{Opcode(m.OPCODE).name} {m.handle - lo}"
        d = m.data
        desc = (f"{type(m).__name__} Data Descriptor read little-endian (STag {d.stag:#x}, Tagged Offset "
                f"{d.tagged_offset:#x}, Length {d.length})")
        want = run.asked.get(what)
        if want is None:
            inconclusive(f"{desc}: the harness did not ask for a {what} and cannot tell what it should carry")
        if isinstance(m, Load):
            got = run.loaded.get(what)
            check(got is not None and bytes(got)[:len(want)] == want,
                  f"{desc}: the harness target wrote {len(want)} octets of handle {m.handle:#x} through it, and the "
                  f"initiator's {what} returned {'nothing' if got is None else bytes(got)[:16].hex()}: does it name "
                  "the initiator's buffer? is it big-endian?", req="KBTP-ADDRLE-INITIATOR")
            continue
        read = reads.get(m.request_id)
        check(read is not None and read.ok, f"{desc}: the harness target's RDMA Read through it was refused by the "
              f"initiator ({read.status if read else 'never completed'}): is it big-endian?",
              req="KBTP-ADDRLE-INITIATOR")
        check(read.data == want, f"{desc}: the harness target's RDMA Read through it returned {read.data[:16].hex()}, "  # type: ignore[union-attr]
              f"not the {len(want)} octets the initiator was asked to store: is it big-endian?",
              req="KBTP-ADDRLE-INITIATOR")
    check(named > 0, "no request named a buffer by STag: the descriptors' byte order was not exercised",
          req="KBTP-ADDRLE-INITIATOR")
    pass_basis(f"black box: {named} descriptors read little-endian carried exactly the data asked for (the harness "
               "target's RDMA Reads through them, the initiator's LOADs of what it wrote through them)")


@dataclass
class Probe:
    """One probe: the ``index``-th described span of the scenario, at ``end`` (SPAN_ENDS or AFTER_SESSION)."""

    index: int
    end: str
    seen: int = 0  # spans described so far
    span: tuple[str, int, int, int] | None = None
    status: Status | None = None  # the probe Read's completion; None: not made
    done: bool = False
    ended: bool = False  # the initiator's GOODBYE arrived (``spans`` then holds every span the scenario described)
    spans: list[tuple[str, int, int, int]] = field(default_factory=list)

    def octet(self) -> int | None:
        _what, _stag, to, length = self.span  # type: ignore[misc]
        if self.end == "before":
            return to - 1 if to > 0 else None  # nothing lies before offset 0 of a zero-based STag
        return to + length if self.end == "past" else to

    def hook(self, target: Any) -> Any:
        def probe(s: Any, msg: Message | None) -> Generator[Any, Any, None]:
            if self.done:
                return
            if self.end == AFTER_SESSION:
                self.spans.extend(spans_of(msg))
                self.ended = isinstance(msg, Goodbye)
                if not self.ended or len(self.spans) <= self.index:
                    return
                self.span = self.spans[self.index]
            else:
                here = spans_of(msg)
                if self.seen + len(here) <= self.index:
                    self.seen += len(here)
                    return
                self.span = here[self.index - self.seen]
            self.done = True
            at = self.octet()
            if at is None:
                return
            buf = target.node.register(target.node.alloc(8), Access.LOCAL_WRITE)
            wr = target._next_wr()
            s.conn.post_read(buf.sge(0, 1), self.span[1], at, wr_id=wr, tag="exposure-probe")
            wc = yield from wait_completion_for(s.conn.cq, PROBE_WAIT_S, lambda c: c.wr_id == wr)
            self.status = wc.status if wc is not None else None
        return probe


def run_probes(kbtp_initiator: Any, seed: int, scenario: Any, ends: tuple[str, ...], label: str) -> list[Probe]:
    """One bed per (described span, end), in the order the scenario describes its spans, until it describes no
    more; ``scenario(bed)`` drives the initiator. The probes that found their span, in that order."""
    made: list[Probe] = []
    described: int | None = None  # spans the whole scenario described (learnt from a bed that reached GOODBYE)
    for k in range(PROBE_BEDS):
        probe = Probe(k // len(ends), ends[k % len(ends)])
        if described is not None and probe.index >= described:
            break
        bed = kbtp_initiator.bed(seed * 100 + k, label=f"{label}-{k}")
        bed.target.probe = probe.hook(bed.target)
        bed.run_one(scenario(bed))
        if probe.ended:
            described = len(probe.spans)
        if probe.span is None:
            if probe.end == ends[0]:
                break  # the scenario described no more spans
            continue
        made.append(probe)
    return made


def probe_exposure(kbtp_initiator: Any, seed: int, scenario: Any) -> None:
    """KBTP-SEC-EXPOSE-DESCRIBED from outside: one octet before and one past each described span, while its request
    is outstanding."""
    refused, unprobed, unanswered = 0, 0, []
    made = run_probes(kbtp_initiator, seed, scenario, SPAN_ENDS, "expose-probe")
    for probe in made:
        what, stag, to, length = probe.span  # type: ignore[misc]
        at = probe.octet()
        if at is None:
            unprobed += 1
            continue
        if probe.status is None:
            evidence.note(f"exposure probe of {what} {probe.end}: no answer within {PROBE_WAIT_S:g} s")
            unanswered.append(f"{what} {probe.end}")
            continue
        where = (f"octet {at:#x} of STag {stag:#x}, {probe.end} the span [{to:#x}, +{length}) the {what} "
                 "descriptor names, while the request was outstanding")
        evidence.note(f"exposure probe: RDMA Read of {where}: {probe.status.name}")
        check(probe.status != Status.SUCCESS, f"the harness target's RDMA Read of {where} was answered with data: "
              "the STag reaches beyond the buffers the descriptors name", req="KBTP-SEC-EXPOSE-DESCRIBED")
        if probe.status not in REFUSALS:  # flushed (the connection had ended), a local error: no evidence
            unanswered.append(f"{what} {probe.end} ({probe.status.name})")
            continue
        refused += 1
    spans = len({p.index for p in made})
    check(spans > 0, "the initiator sent no descriptor naming a buffer: nothing was exposed or probed",
          req="KBTP-SEC-EXPOSE-DESCRIBED")
    if unanswered and not refused:
        inconclusive(f"no probe through the initiator's STags was answered ({', '.join(unanswered)})")
    pass_basis(f"black box: {spans} described spans probed one octet before and past each while outstanding: "
               f"{refused} refused, none answered with data"
               f"{f', {unprobed} zero-based starts with nothing before them' if unprobed else ''}"
               f"{f', not answered: {unanswered}' if unanswered else ''}; STags no descriptor named cannot be "
               "enumerated from outside")


def probe_single_use(kbtp_initiator: Any, seed: int, scenario: Any) -> None:
    """KBTP-SEC-SINGLE-USE-STAG from outside: the STag of each described span, read at the span's start once the
    initiator's GOODBYE arrived (``scenario`` ends with it), is refused."""
    refused, unanswered = 0, []
    made = run_probes(kbtp_initiator, seed, scenario, (AFTER_SESSION,), "single-use-probe")
    for probe in made:
        what, stag, to, length = probe.span  # type: ignore[misc]
        where = (f"octet {to:#x} of STag {stag:#x} (the start of the span [{to:#x}, +{length}) the {what} "
                 "descriptor named) when the initiator's GOODBYE arrived, its request completed")
        if probe.status is None:
            evidence.note(f"single-use probe of {what}: no answer within {PROBE_WAIT_S:g} s")
            unanswered.append(what)
            continue
        evidence.note(f"single-use probe: RDMA Read of {where}: {probe.status.name}")
        check(probe.status != Status.SUCCESS, f"the harness target's RDMA Read of {where} was answered with data: "
              "the STag outlived its request", req="KBTP-SEC-SINGLE-USE-STAG")
        if probe.status not in REFUSALS:
            unanswered.append(f"{what} ({probe.status.name})")
            continue
        refused += 1
    check(bool(made), "no descriptor the initiator sent named a buffer: no STag to probe",
          req="KBTP-SEC-SINGLE-USE-STAG")
    if not refused:
        inconclusive(f"no probe through the initiator's STags was answered ({', '.join(unanswered)})")
    pass_basis(f"black box: the STags of {len(made)} described spans read once the session had ended: {refused} "
               f"refused, none answered with data{f', not answered: {unanswered}' if unanswered else ''}")
