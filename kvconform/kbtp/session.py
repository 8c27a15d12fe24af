"""What the target keeps per initiator (KBTP "Session Establishment", "Allocation Quotas").

An :class:`InitiatorRecord` is keyed by Initiator ID and outlives connections: the handle range, the quota,
the DIRECT_ALLOC partition and its ring, the outstanding tickets, and (in the table) the bindings.  It is
attached to at most one live connection at a time; without one it is *retained* until its retention
deadline on the logical clock, then released.

Usage (the quota rule) = handles bound + tickets taken and not yet bound or reclaimed.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from kvconform.kbtp.constants import Features
from kvconform.kbtp.pool import Extent

if TYPE_CHECKING:
    from kvconform.kbtp.freering import FreeRing


@dataclass
class Partition:
    """A DIRECT_ALLOC partition: quota blocks of the pool and the ring dedicated to one initiator."""

    extent: Extent
    ring: FreeRing
    # Tickets the initiator took on this ring's Head and has neither bound nor had reclaimed, with the
    # logical time (ms) the target first saw each; the target's own tickets are never listed.
    seen: dict[int, float] = field(default_factory=dict)
    next_unseen: int = 0  # the ticket after the last one the target has observed
    abandoned: set[int] = field(default_factory=set)
    reclaiming: int = 0  # abandoned tickets whose block is not yet back in the ring (still in usage)


@dataclass
class InitiatorRecord:
    """Per Initiator ID state, retained across reconnects (KBTP "Session Establishment")."""

    initiator_id: bytes
    slot: int  # which handle range: base + slot * handle_count
    handle_base: int
    handle_count: int
    quota: int
    domain: str
    bound: set[int] = field(default_factory=set)  # handles this initiator has bound
    pending_tickets: int = 0  # target-executed tickets taken, not yet bound (counted in usage)
    partition: Partition | None = None
    connection: object | None = None  # the live connection, None while retained
    retained_until: float | None = None  # logical ms; set when the connection goes away without RELEASE
    granted: Features = field(default_factory=lambda: Features(0))

    @property
    def active(self) -> bool:
        return self.connection is not None

    def owns(self, handle: int) -> bool:
        return self.handle_base <= handle < self.handle_base + self.handle_count

    @property
    def outstanding_direct(self) -> int:
        """DIRECT_ALLOC tickets taken (as observed on the Head) and neither bound nor reclaimed."""
        return 0 if self.partition is None else len(self.partition.seen) + self.partition.reclaiming

    @property
    def usage(self) -> int:
        return len(self.bound) + self.pending_tickets + self.outstanding_direct
