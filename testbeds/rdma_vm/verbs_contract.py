"""The verbs binding's contract on the VM's devices (run inside the VM by smoke.sh): the fabric interface's
semantics on rxe0 and siw0, checked op by op, plus the device behaviours the binding works around, re-measured
each run so docs/interop-rdma.md stays true.

Prints ``VERBS-PASS``/``VERBS-FAIL <device> <what>`` per step and ``FINDING <device> <what>: <seen>`` for the
device facts; exits 1 when a step failed.
"""

from __future__ import annotations

import struct
import sys
from collections.abc import Callable
from typing import Any

from kvconform.rdma import IB_RC, RDMAP_NO_ATOMICS, Access, Op, Profile, wait_completion
from kvconform.rdma.verbs.fabric import VerbsFabric

failed = 0


def step(dev: str, what: str, ok: bool, seen: object = "") -> None:
    global failed
    print(f"VERBS-{'PASS' if ok else 'FAIL'} {dev} {what}" + ("" if ok else f": seen {seen!r}"), flush=True)
    failed += not ok


def run(fab: VerbsFabric, actor: Callable[[], Any]) -> Any:
    handle = fab.spawn(actor.__name__, actor())
    fab.run()
    if handle.error is not None:
        raise handle.error
    return handle.result


def contract(dev: str, profile: Profile, host: str | None) -> None:
    fab = VerbsFabric(profile, device=dev, host=host, run_timeout=30.0, trace=True)
    try:
        tgt, ini = fab.node("T"), fab.node("I")
        t_conn, i_conn = fab.connect(tgt, ini)
        pool = tgt.register(tgt.alloc(4096), Access.LOCAL_WRITE | Access.REMOTE_READ
                            | (Access.REMOTE_ATOMIC if profile.atomics else Access.NONE))
        pool.write(0, b"0123456789abcdef")
        t_rx = tgt.register(tgt.alloc(64), Access.LOCAL_WRITE)
        dst = ini.register(ini.alloc(64), Access.LOCAL_WRITE | Access.MW_BIND)
        i_rx = ini.register(ini.alloc(64), Access.LOCAL_WRITE)
        scratch = ini.register(ini.alloc(64), Access.LOCAL_WRITE)
        win = ini.bind_window(dst, 0, 16, Access.REMOTE_WRITE, i_conn)
        t_conn.post_recv(t_rx.sge(0, 64), wr_id=1)
        i_conn.post_recv(i_rx.sge(0, 64), wr_id=2)

        def target() -> Any:
            wc = yield from wait_completion(t_conn.cq, lambda c: c.op is Op.RECV)
            stag, to = struct.unpack_from(">IQ", t_rx.read(0, 12))
            t_conn.post_write(pool.sge(0, 16), stag, to, signaled=False)
            t_conn.post_send(b"done", invalidate=stag, signaled=False)
            return wc

        def initiator() -> Any:
            i_conn.post_send(struct.pack(">IQ", win.stag, win.to(0)), signaled=False)
            recv = yield from wait_completion(i_conn.cq, lambda c: c.op is Op.RECV)
            i_conn.post_read(scratch.sge(0, 16), pool.stag, pool.to(0), wr_id=5)
            read = yield from wait_completion(i_conn.cq, lambda c: c.wr_id == 5)
            add = None
            if profile.atomics:
                pool.write_u64(32, 40)
                i_conn.post_fetch_add(scratch.sge(32, 8), pool.stag, pool.to(32), 2, wr_id=6)
                add = yield from wait_completion(i_conn.cq, lambda c: c.wr_id == 6)
            i_conn.post_read(scratch.sge(0, 8), pool.stag ^ 0x5500, pool.to(0), wr_id=7)
            bad = yield from wait_completion(i_conn.cq, lambda c: c.wr_id == 7)
            return recv, read, add, bad

        fab.spawn("target", target())
        recv, read, add, bad = run(fab, initiator)
        step(dev, "Send delivers into the posted Recv", recv.ok and recv.byte_len == 4, recv)
        step(dev, "RDMA Write placed before the Send that follows it", dst.read(0, 16) == b"0123456789abcdef",
             dst.read(0, 16))
        flags = [e.get("wc_flags") for r in fab.trace for e in r["effects"] if e.get("do") == "deliver"
                 and e.get("who") == i_conn.name]
        print(f"FINDING {dev} wc_flags of the receive completion of a Send with Invalidate: "
              f"{', '.join(hex(f) for f in flags if f is not None) or 'none'} (libibverbs IBV_WC_WITH_INV = 0x8)",
              flush=True)
        if fab.sees_remote_invalidation:
            step(dev, "Send with Invalidate names the window", recv.invalidated_stag == win.stag, recv)
            step(dev, "the window is gone after it", not ini.is_valid(win.stag))
        else:
            print(f"FINDING {dev} Send with Invalidate in the receive completion: not reported "
                  f"(wc_flags and invalidated_rkey 0)", flush=True)
        step(dev, "RDMA Read", read.ok and scratch.read(0, 16) == b"0123456789abcdef", read)
        if add is not None:
            step(dev, "FetchAdd returns the original and adds (host order)",
                 add.ok and scratch.read_u64(32) == 40 and pool.read_u64(32) == 42, (add, pool.read_u64(32)))
        step(dev, "a Read with an unknown STag fails", not bad.ok, bad)
        print(f"FINDING {dev} the requester's completion of a Read with an unknown STag: {bad.status.name}",
              flush=True)
        step(dev, "and the connection is in error after it", i_conn.state.value == "error", i_conn.state)
        if fab.profile.mw_type2:
            finding_window_bounds(fab, dev)
    finally:
        fab.close()


def finding_window_bounds(fab: VerbsFabric, dev: str) -> None:
    """Whether the device bounds an access through a window by the window (the binding does not rely on it)."""
    import pyverbs.enums as e  # optional: pyverbs ships with rdma-core, on RDMA hosts only
    from pyverbs.mr import MW

    a, b = fab.node("wa"), fab.node("wb")
    ca, cb = fab.connect(a, b)
    buf = a.alloc(8192)
    big = a.register(buf, Access.LOCAL_WRITE | Access.MW_BIND)
    mw = MW(a.pd, e.IBV_MW_TYPE_2)
    assert ca.engine is not None
    stag = ca.engine.bind_window(mw, a.memory_region(big.stag), buf.addr, 4096, int(Access.REMOTE_WRITE))  # type: ignore[attr-defined]
    src = b.register(b.alloc(64), Access.LOCAL_WRITE)

    def past() -> Any:
        cb.post_write(src.sge(0, 8), stag, buf.addr + 4096, wr_id=1)
        return (yield from wait_completion(cb.cq))

    wc = run(fab, past)
    mw.close()
    print(f"FINDING {dev} RDMA Write past a type-2 window over a larger region: {wc.status.name} "
          f"({'bounded by the region, not the window' if wc.ok else 'refused: the window bounds it'})", flush=True)


def main() -> int:
    for dev, profile, host in (("rxe0", IB_RC, None), ("siw0", RDMAP_NO_ATOMICS, sys.argv[1] if sys.argv[1:] else
                                                          "10.77.0.1")):
        try:
            contract(dev, profile, host)
        except Exception as exc:  # a crash is a failed step, with what raised
            step(dev, "contract ran", False, exc)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
