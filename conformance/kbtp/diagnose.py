"""Blame from observed state (issue 23, item 3): when a ring or pool invariant breaks, name the ring rule whose
violation explains what the harness saw, before the generic requirement (KBTP-RING-NO-LOSS,
KBTP-QUOTA-ALLOC-BOUNDED).

What a check can observe of a target's rings: on a DIRECT_ALLOC partition the slots themselves (the Ring STag) and
the Head (FetchAdd); on the shared ring only the Block Offsets its completions carry, and the tickets when the
harness holds the whole ring of a target it configured (every ticket is then the harness's own). The rules, in the
order a diagnosis tries them (KBTP "Free-Block Ring", "Session Establishment", "Block Free"):

- KBTP-ADDRLE-MEMORY: a Block Offset read from a slot that is a block of the pool only with its octets reversed
  (under ADDR_LE; without it the same observation breaks the slot layout's network byte order);
- KBTP-RING-EMPTY: a slot or completion whose Block Offset is all ones taken for a block, or a slot "marked
  consumed" with something other than all ones;
- KBTP-RING-INIT: slot s < F not {s, a block of the ring}, slot F <= s < N not {s - N mod 2^32, all ones}; on the
  shared ring, a first-lap ticket F <= t < N handed a block still bound (its slot was not initialised empty), or,
  with F == N, the first free not reaching ticket F (the Tail starts at Slot Offset 16 * (F mod N) = 0) while on
  a fresh ring of F - 1 < N blocks it does (test_rings tells the two apart);
- KBTP-FREE-RETURN: a freed block that is in no slot of the ring it was allocated from;
- KBTP-RING-WRAP: a freed block in another slot of its ring than the one of its Tail ticket, 16 * (u mod N); on
  the shared ring, the ticket at which the counters' Slot Offsets wrap to 0 (N, 2N) not getting the block its free
  returned, though every earlier free came back. A block with Sequence u in another slot from the first free on
  looks the same as a free that writes another slot than the one its Tail FetchAdd returned
  (KBTP-FREE-SLOT-ORDER): the Tail is never readable, so the message names both.

Each ``judge_*`` function asserts its rules in that order through the assertion API, so a failing check names the
first rule the observation breaks and quotes it (slot index, seen and expected values, byte order); when none of
them explains the observation it falls back to the generic requirement the caller names. A correct target passes
every assertion at every geometry. The pure ``*_rule`` functions decide, the harness's own tests call them.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass

from kvconform.kbtp.constants import EMPTY_BLOCK_OFFSET
from kvconform.verdicts import HarnessBug, Violation, check, violation

ADDRLE = "KBTP-ADDRLE-MEMORY"
SLOT_LAYOUT = "KBTP-RING-SLOT-LAYOUT"
EMPTY = "KBTP-RING-EMPTY"
INIT = "KBTP-RING-INIT"
WRAP = "KBTP-RING-WRAP"
FREE_RETURN = "KBTP-FREE-RETURN"
FREE_SLOT = "KBTP-FREE-SLOT-ORDER"  # named in evidence only: where a free writes cannot be told from the Tail's offset
CONSUME = "KBTP-RING-CONSUME"
NO_LOSS = "KBTP-RING-NO-LOSS"
TICKETS = 1 << 32

Slot = tuple[int, int]  # (Sequence, Block Offset) as read under the session's byte order


def swapped(value: int) -> int:
    """``value`` with its 8 octets reversed: a Block Offset written in the other byte order."""
    return int.from_bytes(value.to_bytes(8, "little"), "big")


def byte_order_rule(addr_le: bool) -> str:
    """Which rule a Block Offset in the wrong byte order breaks: ADDR_LE's little-endian, or the slot layout's
    network byte order."""
    return ADDRLE if addr_le else SLOT_LAYOUT


def order_name(addr_le: bool) -> str:
    return "little-endian (ADDR_LE)" if addr_le else "network byte order"


@dataclass(frozen=True)
class Blame:
    """A rule the observation breaks and what was observed."""

    rule: str
    evidence: str


# ---- decisions (pure) -------------------------------------------------------------------------------------


def block_rule(block: int, blocks: Collection[int], *, addr_le: bool, where: str) -> Blame | None:
    """A Block Offset read from a slot (or a completion) that should be one of ``blocks``: the rule it breaks
    when it is not, or None when it is (or when no ring rule explains it)."""
    if block in blocks:
        return None
    if block == EMPTY_BLOCK_OFFSET:
        return Blame(EMPTY, f"{where} reads Block Offset all ones, which marks a slot empty (consumed), taken "
                            "for a block")
    if swapped(block) in blocks:
        return Blame(byte_order_rule(addr_le), f"{where} reads Block Offset {block:#018x}, which is the block "
                     f"{swapped(block):#x} with its octets reversed: not {order_name(addr_le)}")
    return None


def landing_rule(ring: Sequence[Slot | None], block: int, u: int, *, addr_le: bool, landed: int = 0) -> Blame | None:
    """Where a freed ``block`` (Tail ticket ``u``) landed in the ``ring`` read after its FREE completed, when not
    in slot u mod N with Sequence u: the specific rule, or the generic KBTP-RING-NO-LOSS. ``landed``: how many
    earlier frees of the same ring landed in their slots (then a block lost where the Slot Offset wraps to 0 is the
    wrap's fault, not a return to another ring)."""
    n = len(ring)
    at = u % n
    if ring[at] == (u % TICKETS, block):
        return None
    where = [s for s, v in enumerate(ring) if v is not None and v[1] == block]
    reversed_at = [s for s, v in enumerate(ring) if v is not None and v[1] == swapped(block) and v[1] != block]
    if not where and reversed_at:
        return Blame(byte_order_rule(addr_le), f"the block {block:#x} freed with Tail ticket {u} is in slot(s) "
                     f"{reversed_at} with its octets reversed ({swapped(block):#018x}): not {order_name(addr_le)}")
    if not where and landed and at == 0:
        return Blame(WRAP, f"the block {block:#x} freed with Tail ticket {u} is in no slot of its ring, though the "
                     f"{landed} free(s) before it landed in theirs: at ticket {u} the Slot Offset wraps to 0 "
                     f"(16 * ({u} mod {n})), and slot 0 reads {_slot(ring[at])}")
    if not where:
        return Blame(FREE_RETURN, f"the block {block:#x} freed with Tail ticket {u} is in no slot of the ring it was "
                     f"allocated from; slot {at} (16 * ({u} mod {n})) reads {_slot(ring[at])}")
    if at not in where:
        return Blame(WRAP, f"the block {block:#x} freed with Tail ticket {u} is in slot(s) {where}, not slot {at}: the "
                     f"Slot Offset the Tail gave ticket {u} is not 16 * ({u} mod {n}) = {16 * at} (or the free wrote "
                     f"another slot than the one its Tail FetchAdd returned, {FREE_SLOT}: the Tail cannot be read, "
                     "the two look the same)")
    return Blame(NO_LOSS, f"slot {at} of Tail ticket {u} reads {_slot(ring[at])}, expected Sequence {u} with block "
                 f"{block:#x}")


def initial_empty_rule(slot: int, got: Slot | None, f: int, n: int) -> Blame | None:
    """Slot ``slot`` (F <= slot < N) of a fresh ring, read before any FREE wrote it: it starts as
    {Sequence slot - N mod 2^32, all ones} (KBTP-RING-INIT; its marker KBTP-RING-EMPTY), or the rule it breaks."""
    if got is None:
        return None
    expected = ((slot - n) % TICKETS, EMPTY_BLOCK_OFFSET)
    if got == expected:
        return None
    if got[0] != expected[0]:
        return Blame(INIT, f"slot {slot} (F {f} <= {slot} < N {n}) of the fresh ring, before any free, reads "
                     f"{_slot(got)}, not {_slot(expected)}: the allocation of ticket {slot} "
                     f"{'takes it before any free returns a block' if got[0] == slot else 'does not wait on it'}")
    return Blame(EMPTY, f"slot {slot} (F {f} <= {slot} < N {n}) of the fresh ring, before any free, reads "
                 f"{_slot(got)}: its Sequence is right, but an empty slot's Block Offset is all ones")


def consumed_rule(after: Slot | None, ticket: int, block: int, blocks: Collection[int]) -> Blame | None:
    """The slot of ``ticket`` read after its BIND (or allocation): consumed means Block Offset all ones."""
    if after is not None and after[1] == EMPTY_BLOCK_OFFSET:
        return None
    if after is not None and after[1] != block and after[1] not in blocks:
        return Blame(EMPTY, f"the slot of ticket {ticket} after its BIND reads Block Offset {after[1]:#x}: marked "
                     "with a value that is no block of the ring, but a slot is empty (consumed) only when its Block "
                     "Offset is all ones")
    return Blame(CONSUME, f"the slot of ticket {ticket} after its BIND reads {_slot(after)}: not consumed")


def shared_rule(kind: str, t: int, f: int, n: int) -> str:
    """The rule a shared ring of F blocks and N slots, held whole from fresh (every ticket the harness's), breaks
    when the allocation of ticket ``t`` (>= F, right after one free) does not get the block that free returned:
    ``kind`` "held" (it got a block still bound), "hang" (nothing came) or "other" (some other block)."""
    if kind == "held" and t < n:
        return INIT  # slot t still held its initial content: slots F..N-1 start empty
    if kind == "hang" and t == f == n:
        return INIT  # the first free, Tail (Ticket F, Slot Offset 16 * (F mod N) = 0), never reached slot 0
    if t in (n, 2 * n):
        return WRAP  # every earlier free came back; at this ticket the Slot Offsets wrap to 0, and it went wrong
    return NO_LOSS


def _slot(v: Slot | None) -> str:
    return "nothing (the read failed)" if v is None else f"{{Sequence {v[0]}, Block Offset {v[1]:#x}}}"


# ---- assertions --------------------------------------------------------------------------------------------


def judge(blame: Blame | None, rules: Sequence[str], *, what: str, seen: object = None,
          expected: object = None) -> None:
    """Assert each of ``rules`` in order (the check cites them all): the one ``blame`` names fails with its
    evidence, the others hold. ``blame`` None: every rule holds. The byte order is asserted under both rules
    (ADDR_LE's little-endian, the layout's network order): the session's selects which one a reversed value breaks."""
    if blame is not None and blame.rule not in rules:
        raise HarnessBug(f"diagnose: {blame.rule} is not among the rules asserted here ({rules})")
    for rule in rules:
        broken = blame is not None and blame.rule == rule
        text = what
        if blame is not None and broken:
            text = blame.evidence if blame.evidence.startswith(what) else f"{what}: {blame.evidence}"
        check(not broken, text, req=rule, seen=seen, expected=expected)


def judge_block(block: int, blocks: Collection[int], *, addr_le: bool, where: str) -> None:
    """A Block Offset read from a slot is a block of the ring: byte order and the empty marker first."""
    blame = block_rule(block, blocks, addr_le=addr_le, where=where)
    judge(blame, (ADDRLE, SLOT_LAYOUT, EMPTY), what=where, seen=f"{block:#x}",
          expected=f"one of the ring's blocks, {order_name(addr_le)}")


def judge_landing(ring: Sequence[Slot | None], block: int, u: int, *, addr_le: bool, landed: int = 0) -> None:
    """The block of a FREE (Tail ticket ``u``) is in slot u mod N with Sequence u, and in no other slot."""
    blame = landing_rule(ring, block, u, addr_le=addr_le, landed=landed)
    what = f"after the FREE of Tail ticket {u}, block {block:#x} in slot {u % len(ring)}"
    seen = [_slot(v) for v in ring]
    judge(blame, (ADDRLE, SLOT_LAYOUT, FREE_RETURN, WRAP, NO_LOSS), what=what, seen=seen,
          expected=f"slot {u % len(ring)} = {{Sequence {u}, Block Offset {block:#x}}}")
    others = [s for s, v in enumerate(ring) if v is not None and v[1] == block and s != u % len(ring)]
    check(not others, f"{what}: the block is also in slot(s) {others}", req=NO_LOSS, seen=seen)


def judge_consumed(after: Slot | None, ticket: int, block: int, blocks: Collection[int]) -> None:
    blame = consumed_rule(after, ticket, block, blocks)
    judge(blame, (EMPTY, CONSUME), what=f"slot of ticket {ticket} after its BIND", seen=_slot(after),
          expected="Block Offset all ones")


def reraise_as(v: Violation, rule: str, evidence: str) -> None:
    """Re-raise the generic ``v`` (a bounded wait that ended, a double hand-out) as a violation of ``rule`` with
    ``evidence``, when the diagnosis names a specific rule; else ``v`` itself."""
    if rule == v.requirement:
        raise v
    violation(f"{evidence} ({v})", req=rule)
