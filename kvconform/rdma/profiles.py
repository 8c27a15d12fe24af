"""Capability profiles of the RDMA bindings (rdma-bindings.md §8 item 2).

A profile is what a KBTP endpoint may rely on from its transport: whether FetchAdd takes an Add Mask
(RFC 7306, §1.4), the immediate data size (8 octets RDMAP, 4 octets InfiniBand/RoCE, §1.1), remote
invalidation (§2.4), type-2 memory windows, and the placement model that says when RDMA Write data
becomes visible at the Data Sink (§2.3):

- ``rdmap``: rules 3 and 5 of RFC 5040 §5.5. Write chunks are placed in any order, within a message
  and across messages, until a later Send-type message is delivered.
- ``ib_psn_order``: data is placed in packet (PSN) order; a racing reader can still see a prefix.
- ``strict``: every RDMA Write and Read Response is placed in one indivisible step (a reference mode
  that hides races, for differential runs against the adversarial modes).

KBTP derives its choices from these: masked vs. unmasked ring counters, whether RECORD_COMPLETION may
be advertised (never on ``rdmap``).
"""

from __future__ import annotations

import dataclasses
import enum


class PlacementModel(enum.StrEnum):
    """When RDMA Write / Read Response data becomes visible at the Data Sink (rdma-bindings §2.3)."""

    RDMAP = "rdmap"
    IB_PSN_ORDER = "ib_psn_order"
    STRICT = "strict"


class AtomicScope(enum.StrEnum):
    """Whether remote atomics are atomic with respect to the target CPU (verbs ATOMIC_HCA / ATOMIC_GLOB)."""

    HCA = "hca"
    GLOB = "glob"


class Binding(enum.StrEnum):
    """The transport family a profile describes; selects the error mapping (Terminate vs NAK)."""

    RDMAP = "rdmap"  # iWARP: RDMAP/DDP/MPA with RFC 7306
    IB = "ib"  # InfiniBand RC and RoCEv2


@dataclasses.dataclass(frozen=True, slots=True)
class Profile:
    """Capabilities one binding declares; KBTP endpoints read these, never the binding's class."""

    name: str
    binding: Binding
    masked_atomics: bool
    immediate_bytes: int
    placement_model: PlacementModel
    atomics: bool = True  # FetchAdd / CmpSwap at all (siw: atomic_cap = 0)
    send_with_invalidate: bool = True
    mw_type2: bool = True
    atomic_scope: AtomicScope = AtomicScope.HCA
    max_inline: int = 256
    ord: int = 16  # outstanding RDMA Read / Atomic requests as requester
    ird: int = 16  # ... and as responder
    pmtu: int = 1024
    chunk_bytes: int = 8  # emulated placement / read-sampling granularity (a 16-octet read is 2 chunks)

    def with_(self, **changes: object) -> Profile:
        """A copy with some fields changed (e.g. ``RDMAP_7306.with_(chunk_bytes=1)``)."""
        return dataclasses.replace(self, **changes)  # type: ignore[arg-type]


# KBTP's normative binding: RDMAP with RFC 7306 masked FetchAdd and 8-octet Immediate Data.
RDMAP_7306 = Profile(
    name="rdmap-7306",
    binding=Binding.RDMAP,
    masked_atomics=True,
    immediate_bytes=8,
    placement_model=PlacementModel.RDMAP,
)

# Plain iWARP without RFC 7306 (e.g. Linux siw: atomic_cap = 0, §1.6): no atomics at all.
RDMAP_NO_ATOMICS = Profile(
    name="rdmap-5040",
    binding=Binding.RDMAP,
    masked_atomics=False,
    immediate_bytes=0,
    placement_model=PlacementModel.RDMAP,
    atomics=False,
)

# InfiniBand RC / RoCEv2: unmasked Fetch and Add, 4-octet immediate, placement in PSN order.
IB_RC = Profile(
    name="ib-rc",
    binding=Binding.IB,
    masked_atomics=False,
    immediate_bytes=4,
    placement_model=PlacementModel.IB_PSN_ORDER,
    pmtu=1024,
)

# NVIDIA/Mellanox masked FetchAdd vendor extension over IB/RoCE (§1.4 "MFetchAdd").
IB_RC_MASKED = IB_RC.with_(name="ib-rc-masked", masked_atomics=True)

# Reference mode: every placement is a single step.
STRICT = RDMAP_7306.with_(name="strict", placement_model=PlacementModel.STRICT)

PROFILES: dict[str, Profile] = {p.name: p for p in (RDMAP_7306, RDMAP_NO_ATOMICS, IB_RC, IB_RC_MASKED, STRICT)}
