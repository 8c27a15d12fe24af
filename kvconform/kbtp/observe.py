"""What observers of the reference target see (KBTP "Operational Considerations": "counters per operation
and status, ring occupancy, and quota use per initiator") and the block census behind the text's promise
"No block is ever lost or handed out twice".

Plain frozen views, computed on demand from the target's rings, table and initiator records; the
target's ``snapshot_rings`` / ``snapshot_initiators`` / ``block_census`` call these.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from kvconform.kbtp.freering import FreeRing, TakenTicket
from kvconform.kbtp.session import InitiatorRecord
from kvconform.kbtp.table import BlockTable


@dataclass(frozen=True)
class RingView:
    """Observed state of one free-block ring."""

    name: str
    slots: int
    free_blocks: int
    head_ticket: int
    tail_ticket: int
    held: tuple[int, ...]
    deferred: tuple[tuple[int, int, int], ...]  # (slot index, ticket, block offset)


@dataclass(frozen=True)
class InitiatorView:
    """Observed per-initiator state (KBTP "Operational Considerations": quota use per initiator)."""

    initiator_id: bytes
    handle_base: int
    handle_count: int
    quota: int
    usage: int
    bound: tuple[int, ...]
    active: bool
    partition: RingView | None
    outstanding_tickets: tuple[int, ...]
    abandoned_tickets: tuple[int, ...]


def ring_view(ring: FreeRing) -> RingView:
    return RingView(ring.name, ring.slots, ring.free_blocks, ring.head_ticket(),
                    ring.layout.split(ring.tail_value())[0], tuple(ring.held_blocks()),
                    tuple((i, u, b) for i, q in sorted(ring.deferred.items()) for u, b in q))


def initiator_view(r: InitiatorRecord) -> InitiatorView:
    p = r.partition
    return InitiatorView(r.initiator_id, r.handle_base, r.handle_count, r.quota, r.usage, tuple(sorted(r.bound)),
                         r.active, ring_view(p.ring) if p else None,
                         tuple(sorted(p.seen)) if p else (), tuple(sorted(p.abandoned)) if p else ())


def block_census(table: BlockTable, rings: Iterable[FreeRing],
                 records: Iterable[InitiatorRecord]) -> dict[int, list[str]]:
    """Where each block of every ring is: bound to a handle, in a ring slot, in a deferred free, or held
    by a DIRECT_ALLOC ticket that is neither bound nor reclaimed yet."""
    ring_list = list(rings)
    where: dict[int, list[str]] = {b: [] for ring in ring_list for b in ring.blocks}
    for h, e in table.bound().items():
        where.setdefault(e.block_offset, []).append(f"handle {h:#x}")
    for ring in ring_list:
        for b in ring.held_blocks():
            where.setdefault(b, []).append(f"ring {ring.name}")
        for b in ring.deferred_blocks():
            where.setdefault(b, []).append(f"deferred {ring.name}")
    for r in records:
        p = r.partition
        if p is None:
            continue
        for t in p.seen:
            held = p.ring.slot_holds(TakenTicket(t, p.ring.slot_offset_of(t)))
            if held is not None:
                # Taken by the initiator, still in its slot until BIND or reclaim consumes it.
                where[held] = [x for x in where[held] if x != f"ring {p.ring.name}"] + [f"ticket {t}"]
    return where


def census_problems(census: dict[int, list[str]]) -> list[str]:
    """Blocks lost (nowhere) or handed out twice (in more than one place)."""
    return [f"block {b:#x}: {places or 'lost'}" for b, places in sorted(census.items()) if len(places) != 1]
