"""Configuration of the reference target (KBTP "Session Establishment", "Allocation Quotas", "Transport Bindings").

Everything a deployment chooses is here, so a test varies one knob: the block pool geometry, the offered
features, the binding profile (which decides RECORD_COMPLETION and how completion records travel), the
per-initiator quota and handle range, the ticket timeout and the retention time (both in milliseconds of
the logical clock the fabric scheduler or the test drives), and whether freed blocks are cleared.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from kvconform.kbtp.constants import Features
from kvconform.rdma.profiles import Binding


def allows_records(binding: Binding) -> bool:
    """RDMAP does not order an RDMA Write after earlier Writes' data (rules 3 and 5); IB RC does."""
    return binding is Binding.IB


class ConfigError(ValueError):
    """A configuration the text forbids (e.g. sum of quotas above F) or that cannot be laid out."""


ALL_FEATURES = Features.DIRECT_LOAD | Features.DIRECT_ALLOC | Features.RECORD_COMPLETION | Features.ADDR_LE


def next_pow2(n: int) -> int:
    return 1 << max(0, (n - 1).bit_length())


@dataclass(frozen=True)
class TargetConfig:
    """What the reference target serves.

    - ``pool_blocks`` (F) blocks of ``block_size`` octets; ``shared_blocks`` of them form the shared ring
      (target-executed allocations), the rest is carved into DIRECT_ALLOC partitions of quota size.
      ``shared_blocks=None`` gives the whole pool to the shared ring (no room for partitions).
    - ``shared_ring_slots`` (N) defaults to the smallest power of two not below ``shared_blocks`` (and 2).
    - ``quota`` per initiator; the target refuses a HELLO (NO_SPACE) that would push the sum of the
      active and retained quotas above the blocks their rings hold.
    - ``handle_count`` handles per initiator, ranges laid out from ``table_base_handle`` up, one per
      ``max_initiators`` initiator slot; the table has ``max_initiators * handle_count`` entries.
    - ``features`` offered; RECORD_COMPLETION is dropped from the offer on RDMAP (never advertised).
    - ``binding`` and ``masked_atomics`` default to the fabric profile's (None); set them to run, say, the
      unmasked InfiniBand ring variant (Ticket in the high 32 bits, slot = 16 * (ticket mod N)) on a fabric
      that could do masked FetchAdd.
    - ``clear_freed``: zero freed blocks before they return to a ring other trust domains allocate from
      (None: only when more than one trust domain is configured).
    - ``untrusted_initiators``: Initiator IDs the target does not trust with its structures: they are served in
      the default mode only, never offered DIRECT_LOAD or DIRECT_ALLOC (KBTP-DIRECT-TRUST); every other
      initiator of the trust domain is trusted for all its blocks.
    """

    block_size: int = 4096
    pool_blocks: int = 16
    shared_blocks: int | None = None
    shared_ring_slots: int | None = None
    quota: int = 4
    quotas: dict[bytes, int] = field(default_factory=dict)  # per Initiator ID, overriding ``quota``
    handle_count: int = 64
    max_initiators: int = 4
    table_base_handle: int = 0x4000
    max_inline: int = 256
    request_credits: int = 8
    ticket_timeout_ms: int = 1000
    retention_ms: int = 60_000
    features: Features = ALL_FEATURES
    binding: Binding | None = None
    masked_atomics: bool | None = None
    clear_freed: bool | None = None
    # Initiator ID -> trust domain; an ID not listed is in ``default_domain``.
    trust_domains: dict[bytes, str] = field(default_factory=dict)
    default_domain: str = "default"
    untrusted_initiators: frozenset[bytes] = frozenset()

    def __post_init__(self) -> None:
        if self.block_size <= 0 or self.pool_blocks <= 0:
            raise ConfigError(f"block_size={self.block_size}, pool_blocks={self.pool_blocks} must be positive")
        shared = self.shared_count
        if not 0 <= shared <= self.pool_blocks:
            raise ConfigError(f"shared_blocks={shared} outside 0..pool_blocks={self.pool_blocks}")
        n = self.shared_slots
        if shared and (n & (n - 1) or n < shared or n < 2):
            raise ConfigError(f"shared_ring_slots={n} must be a power of two not smaller than F={shared} "
                              "(KBTP-RING-SIZE), and at least 2 (the masked Add Data needs n >= 1)")
        if self.quota < 0 or self.handle_count <= 0 or self.max_initiators <= 0:
            raise ConfigError("quota must be >= 0, handle_count and max_initiators > 0")
        if self.max_inline < 0 or self.request_credits <= 0:
            raise ConfigError("max_inline must be >= 0 and request_credits > 0")
        bad = sorted(i.hex() for i in self.untrusted_initiators if len(i) != 16)
        if bad:
            raise ConfigError(f"untrusted_initiators {bad}: an Initiator ID is 128 bits (16 octets)")
        if int(self.features) & ~int(ALL_FEATURES):
            raise ConfigError(f"features {int(self.features):#06x} has bits the text does not define")

    @property
    def shared_count(self) -> int:
        return self.pool_blocks if self.shared_blocks is None else self.shared_blocks

    @property
    def shared_slots(self) -> int:
        if self.shared_ring_slots is not None:
            return self.shared_ring_slots
        return next_pow2(max(2, self.shared_count))

    @property
    def table_entries(self) -> int:
        return self.max_initiators * self.handle_count

    def offered_features(self, binding: Binding) -> Features:
        """The features the target may grant; RECORD_COMPLETION never on RDMAP (KBTP "Completion")."""
        offered = self.features
        if not allows_records(binding):
            offered &= ~Features.RECORD_COMPLETION
        return Features(offered)

    def domain_of(self, initiator_id: bytes) -> str:
        return self.trust_domains.get(initiator_id, self.default_domain)

    @property
    def multi_domain(self) -> bool:
        """More than one trust domain is configured (direct modes are then not offered)."""
        return len({self.default_domain, *self.trust_domains.values()}) > 1

    @property
    def clears_freed(self) -> bool:
        return self.multi_domain if self.clear_freed is None else self.clear_freed
