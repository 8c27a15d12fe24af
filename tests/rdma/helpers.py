"""A two-node fabric with the usual buffers, for the fabric tests."""

from __future__ import annotations

from dataclasses import dataclass

from kvconform.rdma import RDMAP_7306, Access, EmuFabric, EmuNode, Profile, Region, Scheduler
from kvconform.rdma.runtime import PostingEndpoint, RuntimeFabric

ALL_REMOTE = Access.LOCAL_WRITE | Access.REMOTE_READ | Access.REMOTE_WRITE | Access.REMOTE_ATOMIC


@dataclass
class Pair:
    """Target T and initiator I joined by one connection; ``mem`` on T is remotely accessible."""

    fab: RuntimeFabric  # an EmuFabric, or a WireFabric
    t: EmuNode
    i: EmuNode
    tc: PostingEndpoint  # T's endpoint
    ic: PostingEndpoint  # I's endpoint
    mem: Region  # T: 256 octets, all remote rights, VA-based
    rx_t: Region  # T: receive buffers
    rx_i: Region  # I: receive buffers
    local: Region  # I: a scratch region (read destination, atomic results, write sources)


def pair(
    profile: Profile = RDMAP_7306,
    *,
    seed: int | None = None,
    scheduler: Scheduler | None = None,
    trace: bool = False,
    mem_access: Access = ALL_REMOTE,
    zero_based: bool = False,
    wire: str | None = None,
) -> Pair:
    """``wire`` iwarp / roce: the same pair over a `WireFabric` (real sockets on loopback, real wire format)."""
    fab: RuntimeFabric
    if wire is not None:
        from kvconform.rdma.wire.fabric import WireFabric

        fab = WireFabric(profile, binding=wire, trace=trace)  # type: ignore[arg-type]
    else:
        fab = EmuFabric(profile, seed=seed, scheduler=scheduler, trace=trace)
    t, i = fab.node("T"), fab.node("I")
    tc, ic = fab.connect(t, i)
    mem = t.register(t.alloc(256), mem_access, zero_based=zero_based)
    rx_t = t.register(t.alloc(256), Access.LOCAL_WRITE)
    rx_i = i.register(i.alloc(256), Access.LOCAL_WRITE)
    local = i.register(i.alloc(256), Access.LOCAL_WRITE | Access.MW_BIND)
    return Pair(fab, t, i, tc, ic, mem, rx_t, rx_i, local)
