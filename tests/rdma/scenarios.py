"""Small generic race scenarios for the scheduler and race-engine tests (no KBTP knowledge)."""

from __future__ import annotations

from collections.abc import Callable

from kvconform.rdma import Access, ActorGen, EmuFabric, pause, wait_completion
from tests.rdma.helpers import ALL_REMOTE

RING_ADD = 0x0000000100000010
RING_MASK_N4 = 0x8000000080000020


def tickets(fab: EmuFabric) -> Callable[[], object]:
    """Two initiators take three tickets each with masked FetchAdd on T's Head and read a 16-octet slot
    after each; T's CPU rewrites the slots meanwhile. Invariant: the six tickets are 0..5, each once."""
    t = fab.node("T")
    head = t.register(t.alloc(8), ALL_REMOTE)
    slots = t.register(t.alloc(64), ALL_REMOTE)
    got: dict[str, list[int]] = {}

    def initiator(name: str) -> ActorGen:
        n = fab.node(name)
        _, conn = fab.connect(t, n)
        res = n.register(n.alloc(32), Access.LOCAL_WRITE)
        got[name] = []
        for _ in range(3):
            conn.post_fetch_add(res.sge(0, 8), head.stag, head.to(0), RING_ADD, RING_MASK_N4)
            yield from wait_completion(conn.cq)
            orig = res.read_u64(0)
            got[name].append(orig >> 32)
            conn.post_read(res.sge(16, 16), slots.stag, slots.to(orig & 0x3F))
            yield from wait_completion(conn.cq)

    def cpu() -> ActorGen:
        for version in range(1, 4):
            yield from pause("rewrite")
            slots.write(0, version.to_bytes(8, "big") * 8)

    fab.spawn("A", initiator("A"))
    fab.spawn("B", initiator("B"))
    fab.spawn("T", cpu())

    def check() -> object:
        taken = sorted(got["A"] + got["B"])
        assert taken == list(range(6)), f"tickets handed out {taken}"
        return tuple(got["A"])

    return check


def lost_update(fab: EmuFabric) -> Callable[[], object]:
    """T's CPU increments a counter with a plain read-modify-write while I FetchAdds it through the NIC:
    with ATOMIC_HCA semantics the CPU's update can be lost. The check expects both increments."""
    t, i = fab.node("T"), fab.node("I")
    _, ic = fab.connect(t, i)
    counter = t.register(t.alloc(8), ALL_REMOTE)
    res = i.register(i.alloc(8), Access.LOCAL_WRITE)

    def cpu() -> ActorGen:
        value = counter.read_u64(0)
        yield from pause("rmw")
        counter.write_u64(0, value + 1)

    def initiator() -> ActorGen:
        ic.post_fetch_add(res.sge(0, 8), counter.stag, counter.to(0), 1)
        wc = yield from wait_completion(ic.cq)
        assert wc.ok

    fab.spawn("T", cpu())
    fab.spawn("I", initiator())

    def check() -> object:
        final = counter.read_u64(0)
        assert final == 2, f"counter is {final}, expected 2: an increment was lost"
        return final

    return check
