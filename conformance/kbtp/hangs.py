"""Why an allocation within quota hung (issue 23, item 3, "Blame from observed state", at the sites that are not
ring checks): a check whose ALLOC_STORE (or a COMPLETION after it) never came within its bounded wait fails on
KBTP-QUOTA-ALLOC-BOUNDED ("an allocation waits at most for an in-progress free to finish writing its slot") unless
what the harness can observe of the target's rings names the rule that made the block go missing.

``diagnosed`` wraps such a check. When its failure is a bounded wait of KBTP-QUOTA-ALLOC-BOUNDED that ended, it
looks, in this order, and blames the first rule an observation breaks:

1. a DIRECT_ALLOC partition ring, where the target offers one: the harness binds every block of its partition
   (each slot must read consumed after its BIND: KBTP-RING-CONSUME, KBTP-RING-EMPTY; on a fresh ring slots F..N-1
   must still read as initialised, empty: KBTP-RING-INIT, ``diagnose.initial_empty_rule``), then frees and rebinds one
   at a time past twice the ring's length, reading the whole ring after each FREE; where the freed block landed
   names the rule (``diagnose.landing_rule``: byte order, KBTP-FREE-RETURN, KBTP-RING-WRAP), a
   slot's Block Offset before that (``diagnose.block_rule``);
2. a fresh shared ring the harness configures (an in-process target): held whole by one initiator, at F < N and
   then F == N, each free must come back to the allocation right after it (``diagnose.shared_rule``: KBTP-RING-INIT,
   KBTP-RING-WRAP, KBTP-RING-EMPTY); a block that never comes back though nothing else could explain it is
   KBTP-RING-NO-LOSS (which slot the free wrote, where the Tail started, cannot be read on a shared ring);
3. nothing points further: the generic KBTP-QUOTA-ALLOC-BOUNDED, its message saying what could not be observed;
   unless the target runs in another process (it keeps its rings from check to check) and an earlier check's hang
   stayed with its refused request (KBTP-VAL-NO-EFFECT) or its deferred free (KBTP-FREE-DEFER), or an earlier check
   saw the target lose a block some other way (``lost_block``: a BIND accepted for a reclaimed ticket): the block
   lost there is still missing, and that rule is blamed where the later check may blame it. A later check whose
   HELLO that target refuses is inconclusive naming the earlier check (``open_session``): a target may keep a session
   whose allocation hangs, and with it the room the HELLO needs, so the refusal says nothing of the later check.

The probes run outside the check's own assertions (their steps claim nothing for the check) and once per target:
the finding is kept for the other checks of the run. A correct target never reaches them (its allocations do not
hang), and a probe of a correct target finds nothing. ``diagnosed`` cites the rules it may blame with
``@pytest.mark.blames``: a check that passes passes none of them.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

import pytest

from kvconform import evidence
from kvconform.conformance.kbtp import diagnose
from kvconform.conformance.kbtp.blackbox import Partition, Reqs, open_partition
from kvconform.fixtures.kbtp import TargetUnderTest
from kvconform.kbtp.constants import EMPTY_BLOCK_OFFSET, RING_SLOT_SIZE, Features, Status
from kvconform.targets.kbtp import NO_FEATURES
from kvconform.targets.kbtp_bed import Bed
from kvconform.targets.kbtp_client import Ended, Gen, HarnessInitiator
from kvconform.verdicts import (
    INCONCLUSIVE_PREFIX,
    Inconclusive,
    NotApplicable,
    TargetUnavailable,
    Violation,
    activate_check,
    current_check,
    inconclusive,
    violation,
)

BOUNDED = "KBTP-QUOTA-ALLOC-BOUNDED"
DEFER = "KBTP-FREE-DEFER"
NO_EFFECT = "KBTP-VAL-NO-EFFECT"
WAIT_ENDED = "nothing arrived within"  # the message of a bounded wait that ended (kvconform.targets.kbtp_client)
# why a later check's refused HELLO is inconclusive (open_session; the served mutants' lane reads it)
HELD_BY_EARLIER = "a target whose allocation hangs may keep that session, and with it the room the HELLO needs"
# What a diagnosis may blame (beside the generic requirement, which every wrapped check cites).
RULES = (diagnose.ADDRLE, diagnose.SLOT_LAYOUT, diagnose.EMPTY, diagnose.CONSUME, diagnose.INIT, diagnose.FREE_RETURN,
         diagnose.WRAP, diagnose.NO_LOSS)
FRESH_SLOTS = 4  # the fresh shared rings' N: F = 3 < N (empty slots to land on), then F = N (the Tail on slot 0)
DA = Features.DIRECT_ALLOC

C = TypeVar("C", bound=Callable[..., Any])


@dataclass(frozen=True)
class Finding:
    """What the probes saw: the rule to blame (None: nothing points further) and the evidence, or what could not
    be observed."""

    rule: str | None
    text: str


@dataclass(frozen=True)
class Lost:
    """A block an earlier check saw a target in another process lose: the rule that lost it, that check, and what
    it saw (a clause: "an allocation of this target process hung after a refused request")."""

    rule: str
    where: str
    what: str


_found: dict[int, Finding] = {}  # id(TargetUnderTest) -> its finding: the probes run once per target
_found_readable: dict[tuple[int, str], Finding] = {}  # the partition probe alone (diagnosed_ring)
# id(a target in another process) -> the first block an earlier check saw it lose: such a target keeps its rings from
# check to check, so a block lost there is still missing when a later check allocates
_lost: dict[int, Lost] = {}


def diagnosed(check: C) -> C:
    """Wrap a check whose allocations are bounded by KBTP-QUOTA-ALLOC-BOUNDED: a hang is blamed on the ring rule
    the target's observable state breaks (see the module docstring). The check takes ``kbtp_target`` and ``seed``
    (or ``session_seed``)."""
    return _wrap(check, (BOUNDED,))


def diagnosed_deferral(check: C) -> C:
    """``diagnosed``, and a hang of the allocation that waits for a deferred free (KBTP-FREE-DEFER) is blamed on
    the rule the probes name when a free that is not deferred loses its block too: then the deferral is not what
    lost it. When the probes find nothing the hang stays the deferral's."""
    return _wrap(check, (BOUNDED, DEFER))


def diagnosed_refusal(check: C) -> C:
    """``diagnosed``, and a hang of an allocation after a refused request (KBTP-VAL-NO-EFFECT: the ring and the
    quota as before) is blamed on the rule the probes name when the ring loses blocks with no refusal at all; when
    they find nothing the hang stays the refusal's."""
    return _wrap(check, (BOUNDED, NO_EFFECT))


def diagnosed_sharing(check: C) -> C:
    """``diagnosed``, and a block handed out twice (KBTP-RING-NO-LOSS) is blamed on the rule the probes name when
    the ring hands out a bound block with no race at all; when they find nothing the finding stays the invariant's."""
    return _wrap(check, (BOUNDED,), (diagnose.NO_LOSS,))


def diagnosed_ring(check: C) -> C:
    """For the shared-ring checks themselves: a hang they blame on KBTP-RING-WRAP or KBTP-RING-NO-LOSS, or a block
    handed out twice (KBTP-RING-NO-LOSS: what the completions of a ring held whole show), is blamed on the rule a
    DIRECT_ALLOC partition ring shows when that is another (a slot never consumed after its BIND looks like a wrong
    wrap from the completions alone; a slot F..N-1 not initialised empty hands out a bound block); otherwise it
    stays."""
    return _wrap(check, (diagnose.WRAP, diagnose.NO_LOSS), (diagnose.NO_LOSS,), readable_only=True)


def _wrap(check: C, waits: tuple[str, ...], outcomes: tuple[str, ...] = (), *, readable_only: bool = False) -> C:
    """``waits``: the requirements whose ended bounded wait is diagnosed; ``outcomes``: those whose every failure is;
    ``readable_only``: only the ring the harness can read may name another rule."""

    @functools.wraps(check)
    def run(*args: Any, **kwargs: Any) -> Any:
        try:
            return check(*args, **kwargs)
        except Violation as v:
            target = kwargs.get("kbtp_target")
            hang = v.requirement in waits and WAIT_ENDED in str(v)
            if not (hang or v.requirement in outcomes) or not isinstance(target, TargetUnderTest):
                raise
            seed = int(kwargs.get("seed", kwargs.get("session_seed", 0)))
            if readable_only:
                _blame_from_partition(target, seed, v)
            blame(target, seed, v)
            raise  # blame always raises; kept for the type checker

    marked: C = pytest.mark.blames(*RULES)(run)
    return marked


def blame(target: TargetUnderTest, seed: int, v: Violation) -> None:
    """Re-raise ``v`` (an allocation within quota that hung) as the rule the probes name, or as itself with what
    could not be observed."""
    finding = _found.get(id(target))
    if finding is None:
        finding = _probe(target, seed)
        _found[id(target)] = finding
    evidence.note(f"hang diagnosis: {finding.rule or 'no ring rule'}: {finding.text}")
    if finding.rule is None and v.requirement != BOUNDED:
        # nothing points past the deferral, the refusal or the race: the finding stays its own (a race's hang on
        # a block an earlier check saw lost is that block's)
        if v.requirement in (DEFER, NO_EFFECT) and WAIT_ENDED in str(v):
            after = "a refused request" if v.requirement == NO_EFFECT else "a deferred free"
            lost_block(target, v.requirement, f"an allocation of this target process hung after {after}")
        elif WAIT_ENDED in str(v):
            _blame_earlier(target, finding, v)
        violation(f"{v.what}; without it the ring was observed: {finding.text}", req=v.requirement,
                  seen=v.seen, expected=v.expected)
    if finding.rule is None:
        _blame_earlier(target, finding, v)
        violation(f"{v.what}; what the harness could observe of the rings names no rule: {finding.text}", req=BOUNDED,
                  seen=v.seen, expected=v.expected)
    text = finding.text
    if v.requirement == DEFER:
        text += "; a free that is not deferred loses its block too, so the deferral is not what lost it"
    if v.requirement == diagnose.NO_LOSS and finding.rule != diagnose.NO_LOSS:
        text += "; the ring breaks it with no race at all"
    if v.requirement == NO_EFFECT:
        text += "; the ring loses it with no request refused, so the refusal is not what lost it"
    diagnose.reraise_as(v, finding.rule, text)


def lost_block(target: TargetUnderTest, rule: str, what: str) -> None:
    """The running check saw ``target`` lose a block (``what``, breaking ``rule``): when the target runs in another
    process a later check's hang there is blamed on it (the first such finding of the run is kept)."""
    if target.fixed_geometry:
        context = current_check()
        _lost.setdefault(id(target), Lost(rule, context.nodeid if context else "an earlier check", what))


def _earlier(target: TargetUnderTest) -> Lost | None:
    """The block an earlier check saw this target (in another process) lose, if any."""
    lost = _lost.get(id(target)) if target.fixed_geometry else None
    context = current_check()
    return None if lost is None or (context is not None and context.nodeid == lost.where) else lost


def _blame_earlier(target: TargetUnderTest, finding: Finding, v: Violation) -> None:
    """No ring rule, but the same process already lost a block in an earlier check: this allocation waits on that
    block, and its rule is blamed where this check may blame it."""
    earlier = _earlier(target)
    context = current_check()
    if earlier is not None and (context is None or context.allows(earlier.rule)):
        violation(f"{v.what}; what the harness could observe of the rings names no rule ({finding.text}), and in an "
                  f"earlier check of this run ({earlier.where}) {earlier.what} ({earlier.rule}): the target keeps its "
                  "rings between checks, so the block lost there is still missing", req=earlier.rule, seen=v.seen,
                  expected=v.expected)


def open_session(bed: Bed, ini: HarnessInitiator, target: TargetUnderTest, requested: Features = NO_FEATURES) -> Gen:
    """``bed.open``; a HELLO refused by a target in another process in which an earlier check saw a block lost is
    inconclusive naming that check: the target may keep the session whose allocation hangs on that block, and with it
    the room this HELLO needs (the text lets a full target refuse), so the refusal says nothing of this check."""
    try:
        ack = yield from bed.open(ini, requested)
    except pytest.skip.Exception as exc:  # how `inconclusive` ends a check under pytest
        earlier = _earlier(target)
        if earlier is None or not str(exc.msg).startswith(INCONCLUSIVE_PREFIX):
            raise
        inconclusive(f"{str(exc.msg).removeprefix(INCONCLUSIVE_PREFIX)}. In an earlier check of this run "
                     f"({earlier.where}) {earlier.what} ({earlier.rule}, failed there): {HELD_BY_EARLIER}, so this "
                     "check could not run")
    return ack


def _blame_from_partition(target: TargetUnderTest, seed: int, v: Violation) -> None:
    key = (id(target), "partition")
    finding = _found_readable.get(key)
    if finding is None:
        finding = _probe(target, seed, (_partition_probe,))
        _found_readable[key] = finding
    evidence.note(f"ring diagnosis on the DIRECT_ALLOC partition ring: {finding.rule or 'no ring rule'}: "
                  f"{finding.text}")
    if finding.rule is None or finding.rule == v.requirement:
        raise v
    diagnose.reraise_as(v, finding.rule, f"{finding.text}; the shared ring's slots cannot be read, and what its "
                        "completions show fits this cause too")


def _probe(target: TargetUnderTest, seed: int, probes: tuple[Callable[[TargetUnderTest, int], Finding], ...] = ()
           ) -> Finding:
    """Run the probes outside the check's assertions (their steps are not the check's claims)."""
    previous = activate_check(None)
    unseen: list[str] = []
    try:
        for probe in probes or (_partition_probe, _fresh_ring_probe):
            try:
                finding = probe(target, seed)
            except (Inconclusive, NotApplicable, TargetUnavailable) as exc:
                finding = Finding(None, f"{probe.__name__.strip('_')}: not observed ({exc})")
            except pytest.skip.Exception as exc:  # `inconclusive` under pytest: the probe's, not the check's verdict
                finding = Finding(None, f"{probe.__name__.strip('_')}: not observed ({exc.msg})")
            except Violation as pv:
                finding = Finding(None, f"{probe.__name__.strip('_')}: the probe itself failed ({pv})")
            if finding.rule is not None:
                return finding
            unseen.append(finding.text)
    finally:
        activate_check(previous)
    return Finding(None, "; ".join(unseen))


def _partition_probe(target: TargetUnderTest, seed: int) -> Finding:
    """Where the frees of a DIRECT_ALLOC partition land (the ring the harness can read)."""
    if not target.has(DA):
        return Finding(None, "the target offers no DIRECT_ALLOC partition ring, so where a FREE writes its block "
                             "cannot be read")
    bed = target.bed(seed, label="hang-diagnosis-partition")
    reqs = Reqs(*([BOUNDED] * 5))

    def scenario() -> Gen:
        part: Partition = yield from open_partition(bed, "D", DA, reqs, hold=False)
        if part.quota < 1:
            return Finding(None, "the DIRECT_ALLOC partition has no block (Allocation Quota 0)")
        da, bs = part.ini.ack.direct_alloc, part.ini.ack.block_size
        partition = {da.partition.tagged_offset + i * bs for i in range(da.partition.count)} if da else set()
        first = None
        for k in range(part.quota):
            ticket, slot = yield from part.take()
            first = ticket if first is None else first
            block = yield from part.await_block(ticket, slot)
            wrong = diagnose.block_rule(block, partition, addr_le=part.ini.addr_le, where=f"slot {slot // 16} of "
                                        f"ticket {ticket}")
            if wrong is not None:
                return Finding(wrong.rule, f"on the DIRECT_ALLOC partition ring: {wrong.evidence}")
            yield from part.bind(part.free_handle(), ticket, block, bytes([0x48, k]) * 4)
            after = yield from part.read_slot(slot, BOUNDED)
            unconsumed = diagnose.consumed_rule(after, ticket, block, partition)
            if unconsumed is not None:
                return Finding(unconsumed.rule, f"on the DIRECT_ALLOC partition ring: {unconsumed.evidence}")
        if first == 0:  # a fresh ring (its Head at ticket 0): slots F..N-1 are as initialised until a FREE
            for s in range(part.quota, part.slots):
                got = yield from part.read_slot(RING_SLOT_SIZE * s, BOUNDED)
                wrong = diagnose.initial_empty_rule(s, got, part.quota, part.slots)
                if wrong is not None:
                    return Finding(wrong.rule, f"on the DIRECT_ALLOC partition ring: {wrong.evidence}")
        for i in range(2 * part.slots + 1):
            h = sorted(part.bound)[i % part.quota]
            block = part.bound[h].block
            u = yield from part.free(h)
            ring = []
            for s in range(part.slots):
                got = yield from part.read_slot(RING_SLOT_SIZE * s, BOUNDED)
                ring.append(got)
            blame = diagnose.landing_rule(ring, block, u, addr_le=part.ini.addr_le, landed=i)
            if blame is not None and blame.rule == diagnose.FREE_RETURN and i == 0 and u % part.slots == 0:
                # the first free's Slot Offset is the wrap's (F == N): lost there, it is the wrap's or the return's
                return Finding(None, f"on the DIRECT_ALLOC partition ring (F {part.quota}, N {part.slots}) the first "
                                     f"free (Tail ticket {u}, where the Slot Offset wraps to 0) is in no slot: a wrong "
                                     "wrap (KBTP-RING-WRAP) and a return to another ring (KBTP-FREE-RETURN) look the "
                                     "same")
            if blame is not None and blame.rule != diagnose.NO_LOSS:
                return Finding(blame.rule, f"on the DIRECT_ALLOC partition ring (F {part.quota}, N {part.slots}), "
                                           f"read after each FREE: {blame.evidence}")
            if blame is not None:
                return Finding(None, f"on the DIRECT_ALLOC partition ring: {blame.evidence}; no ring rule of its own")
            yield from part.alloc(bytes([0x49, i & 0xFF]) * 4)
        return Finding(None, f"the frees of a DIRECT_ALLOC partition ring (F {part.quota}, N {part.slots}) land in "
                             f"their Tail slots over {2 * part.slots + 1} tickets; the shared ring's slots cannot be "
                             "read")

    found: Finding = bed.run_one(scenario())
    return found


def _fresh_ring_probe(target: TargetUnderTest, seed: int) -> Finding:
    """A fresh shared ring held whole at F < N, then F == N: the ticket at which a freed block does not come back."""
    if target.fixed_geometry:
        return Finding(None, "the target serves one geometry (it cannot be given a fresh ring to hold whole), so "
                             "which ticket first misses its block cannot be told")
    for f in (FRESH_SLOTS - 1, FRESH_SLOTS):
        found = _fresh_ring(target, seed, f, FRESH_SLOTS)
        if found is not None:
            return found
    return Finding(None, f"fresh shared rings of F {FRESH_SLOTS - 1} and {FRESH_SLOTS} blocks on N {FRESH_SLOTS} "
                         f"slots, held whole, go round twice: the hang does not show on them, and the declared "
                         "ring's slots cannot be read")


def _fresh_ring(target: TargetUnderTest, seed: int, f: int, n: int) -> Finding | None:
    """One initiator holds the fresh ring whole, then frees and rebinds one handle until 2N tickets went round:
    every allocation right after a free must get the freed block (the only one in the ring)."""
    features = target.params.features & ~DA  # the whole pool is the shared ring
    bed = target.bed(seed, label=f"hang-diagnosis-F{f}-N{n}", blocks=f, shared_blocks=f, ring_slots=n, quota=f,
                     max_initiators=1, features=features)
    a = bed.initiator("R")
    where = f"a fresh shared ring of F {f}, N {n}, held whole"

    def scenario() -> Gen:
        ack = yield from bed.open(a)
        if ack.allocation_quota != f:
            return Finding(None, f"{where}: the target granted quota {ack.allocation_quota}, not the whole ring")
        held: dict[int, int] = {}
        for t in range(f):
            r = yield from a.alloc_store(a.handle(t), b"probe", req=BOUNDED)
            if isinstance(r, Ended) or r.status != Status.OK:
                return Finding(None, f"{where}: the allocation of initial ticket {t} did not complete OK")
            held[a.handle(t)] = r.block_offset
        for t in range(f, 2 * n + 1):
            # the last bound first: a first-lap slot whose stale content is the first block hands out a block bound
            h = a.handle(f - 1 - (t - f) % f)
            freed = held.pop(h)
            fr = yield from a.free(h, req=BOUNDED)
            if isinstance(fr, Ended) or fr.status != Status.OK:
                return Finding(None, f"{where}: the FREE before ticket {t} did not complete OK")
            try:
                r = yield from a.alloc_store(h, b"probe", req=BOUNDED)
            except Violation:
                return _named("hang", t, f, n, f"{where}: the allocation of ticket {t} never got the block {freed:#x} "
                                               "the free before it returned, the only block in the ring")
            got = r.block_offset
            if got == EMPTY_BLOCK_OFFSET:
                return Finding(diagnose.EMPTY, f"{where}: the allocation of ticket {t} completed with Block Offset "
                                               "all ones, which marks a slot empty (consumed)")
            if got != freed:
                kind = "held" if got in held.values() else "other"
                return _named(kind, t, f, n, f"{where}: the allocation of ticket {t} got Block Offset {got:#x}, not "
                                             f"the block {freed:#x} the free before it returned")
            held[h] = got
        return None

    found: Finding | None = bed.run_one(scenario())
    return found


def _named(kind: str, t: int, f: int, n: int, text: str) -> Finding:
    rule = diagnose.shared_rule(kind, t, f, n)
    if rule == diagnose.INIT and kind == "held":
        text += (f", a block another handle still holds: slot {t} (F <= {t} < N) starts as {{Sequence {t} - N, all "
                 "ones}, empty until the free of its ticket")
    elif rule == diagnose.INIT and t == f == n:
        # F == N after F < N went round: the Tail's slots follow its tickets, only its start is wrong
        text += "; on F < N the same cycle went round, so the Tail did not start at Slot Offset 16 * (F mod N) = 0"
    elif rule == diagnose.WRAP:
        text += (f"; every earlier free came back, and at ticket {t} the Slot Offsets wrap to 0 (a slot never "
                 "consumed, KBTP-RING-CONSUME, would look the same on a shared ring, whose slots cannot be read)")
    elif rule == diagnose.NO_LOSS:
        text += (" (the free completed and no later ticket got the block: it is lost; which slot the free wrote "
                 "and where the Tail stands cannot be read on the shared ring)")
    return Finding(rule, text)

