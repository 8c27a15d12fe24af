"""Target counters (KBTP "Operational Considerations": "counters per operation and status, ring occupancy,
and quota use per initiator").

Counts are plain dictionaries keyed by (opcode name, status name) so a test or the CLI prints them without
knowing the enums; ``snapshot`` is the read-only view observers get.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from kvconform.kbtp.constants import Opcode, Status


@dataclass
class TargetCounters:
    """Everything the reference target counts; mutated only by the target."""

    completions: Counter[tuple[str, str]] = field(default_factory=Counter)
    hellos_rejected: int = 0
    deferred_frees: int = 0  # frees whose slot write waited for the slot to be consumed
    deferred_flushed: int = 0
    tickets_abandoned: int = 0
    stags_invalidated: int = 0
    blocks_cleared: int = 0
    sessions_expired: int = 0

    def complete(self, opcode: Opcode | int, status: Status | int) -> None:
        op = Opcode(opcode).name if opcode in Opcode._value2member_map_ else f"0x{int(opcode):02x}"
        st = Status(status).name if status in Status._value2member_map_ else str(int(status))
        self.completions[(op, st)] += 1

    def count(self, opcode: Opcode | None = None, status: Status | None = None) -> int:
        return sum(n for (op, st), n in self.completions.items()
                   if (opcode is None or op == opcode.name) and (status is None or st == status.name))

    def by_operation(self) -> dict[str, dict[str, int]]:
        out: dict[str, dict[str, int]] = {}
        for (op, st), n in sorted(self.completions.items()):
            out.setdefault(op, {})[st] = n
        return out
