"""Remote access errors end in error completions and a Terminate, never in exceptions (rdma-bindings §2.2-2.6).

Keys are (Layer, EType, Code) of the Terminate: DDP tagged-buffer errors for RDMA Write, RDMAP Remote
Protection / Remote Operation errors for Read Requests, atomics and invalidation, DDP untagged-buffer
errors for Sends.
"""

from __future__ import annotations

import pytest

from kvconform.rdma import (
    IB_RC,
    Access,
    ActorGen,
    Completion,
    ConnState,
    FabricUsageError,
    Op,
    Status,
    wait_completion,
)
from tests.rdma.helpers import Pair, pair

DDP_INVALID_STAG = (1, 1, 0)
DDP_BOUNDS = (1, 1, 1)
DDP_NOT_ASSOCIATED = (1, 1, 2)
RDMAP_INVALID_STAG = (0, 1, 0x00)
RDMAP_BOUNDS = (0, 1, 0x01)
RDMAP_ACCESS = (0, 1, 0x02)
RDMAP_CANNOT_INVALIDATE = (0, 2, 0x09)
DDP_NO_BUFFER = (1, 2, 2)
DDP_TOO_LONG = (1, 2, 5)


def _completions(p: Pair) -> tuple[list[Completion], list[Completion]]:
    return p.ic.cq.poll(100), p.tc.cq.poll(100)


def _expect_terminated(p: Pair, status: Status, key: tuple[int, int, int], culprit_wr: int = 1) -> list[Completion]:
    """Run; the culprit completes with ``status`` and the Terminate ``key``; everything after it is flushed."""
    result = p.fab.run()
    assert result.reason == "quiescent"
    ini, _ = _completions(p)
    culprit = next(w for w in ini if w.wr_id == culprit_wr)
    assert culprit.status is status, culprit
    assert culprit.terminate is not None and culprit.terminate.key() == key, culprit.terminate
    assert p.ic.state is ConnState.ERROR and p.tc.state is ConnState.ERROR
    assert p.ic.terminate == p.tc.terminate == culprit.terminate
    after = [w for w in ini if w.wr_id > culprit_wr]
    assert after and all(w.status is Status.WR_FLUSH_ERR for w in after), after
    return ini


def test_write_with_unknown_stag() -> None:
    p = pair()
    p.ic.post_write(b"x" * 8, p.mem.stag ^ 0xFF, p.mem.to(0), wr_id=1)
    p.ic.post_send(b"later", wr_id=2)
    _expect_terminated(p, Status.REM_ACCESS_ERR, DDP_INVALID_STAG)
    assert p.mem.read(0, 8) == bytes(8)


def test_read_with_invalidated_stag() -> None:
    p = pair()
    p.t.invalidate(p.mem.stag)
    assert not p.t.is_valid(p.mem.stag)
    p.ic.post_read(p.local.sge(0, 16), p.mem.stag, p.mem.to(0), wr_id=1)
    p.ic.post_read(p.local.sge(16, 16), p.mem.stag, p.mem.to(0), wr_id=2)
    _expect_terminated(p, Status.REM_ACCESS_ERR, RDMAP_INVALID_STAG)


@pytest.mark.parametrize(("op", "key"), [("write", DDP_BOUNDS), ("read", RDMAP_BOUNDS), ("atomic", RDMAP_BOUNDS)])
def test_out_of_bounds(op: str, key: tuple[int, int, int]) -> None:
    p = pair()
    end = p.mem.to(p.mem.length)
    if op == "write":
        p.ic.post_write(b"y" * 16, p.mem.stag, end - 8, wr_id=1)  # last 8 octets fit, the rest do not
    elif op == "read":
        p.ic.post_read(p.local.sge(0, 16), p.mem.stag, end - 8, wr_id=1)
    else:
        p.ic.post_fetch_add(p.local.sge(0, 8), p.mem.stag, end, 1, wr_id=1)
    p.ic.post_write(b"z", p.mem.stag, p.mem.to(0), wr_id=2)
    _expect_terminated(p, Status.REM_ACCESS_ERR, key)
    assert p.mem.read(0, p.mem.length) == bytes(p.mem.length)


def test_below_base_is_a_bounds_violation() -> None:
    p = pair()
    p.ic.post_read(p.local.sge(0, 8), p.mem.stag, p.mem.to(0) - 8, wr_id=1)
    p.ic.post_send(b"x", wr_id=2)
    _expect_terminated(p, Status.REM_ACCESS_ERR, RDMAP_BOUNDS)


@pytest.mark.parametrize(
    ("granted", "op"),
    [
        (Access.LOCAL_WRITE | Access.REMOTE_READ | Access.REMOTE_ATOMIC, "write"),
        (Access.LOCAL_WRITE | Access.REMOTE_WRITE | Access.REMOTE_ATOMIC, "read"),
        (Access.LOCAL_WRITE | Access.REMOTE_READ | Access.REMOTE_WRITE, "atomic"),
    ],
)
def test_missing_access_right(granted: Access, op: str) -> None:
    p = pair(mem_access=granted)
    if op == "write":
        p.ic.post_write(b"w" * 8, p.mem.stag, p.mem.to(0), wr_id=1)
    elif op == "read":
        p.ic.post_read(p.local.sge(0, 8), p.mem.stag, p.mem.to(0), wr_id=1)
    else:
        p.ic.post_fetch_add(p.local.sge(0, 8), p.mem.stag, p.mem.to(0), 1, wr_id=1)
    p.ic.post_send(b"x", wr_id=2)
    _expect_terminated(p, Status.REM_ACCESS_ERR, RDMAP_ACCESS)
    assert p.mem.read_u64(0) == 0


def test_unaligned_atomic_is_an_invalid_request() -> None:
    p = pair()
    p.ic.post_fetch_add(p.local.sge(0, 8), p.mem.stag, p.mem.to(4), 1, wr_id=1)
    p.ic.post_send(b"x", wr_id=2)
    ini = _expect_terminated(p, Status.REM_INV_REQ_ERR, (0, 2, 0xFF))
    assert ini[0].terminate is not None and "aligned" in ini[0].terminate.reason


def test_window_is_bound_to_one_connection() -> None:
    """A type-2 window (DIRECT_ALLOC partition STag) works on its connection only (§2.4)."""
    p = pair()
    t_mw = p.t.register(p.t.alloc(64), Access.LOCAL_WRITE | Access.MW_BIND)
    win = p.t.bind_window(t_mw, 16, 32, Access.REMOTE_WRITE | Access.REMOTE_READ, p.tc)
    x = p.fab.node("X")
    tx, xc = p.fab.connect(p.t, x)
    x_local = x.register(x.alloc(16), Access.LOCAL_WRITE)
    p.ic.post_write(b"ok", win.stag, win.to(0), wr_id=1)
    xc.post_write(b"no", win.stag, win.to(0), wr_id=7)
    xc.post_read(x_local.sge(0, 8), win.stag, win.to(0), wr_id=8)
    p.fab.run()
    assert [w.status for w in p.ic.cq.poll(5)] == [Status.SUCCESS]
    assert t_mw.read(16, 2) == b"ok"
    x_wcs = xc.cq.poll(5)
    assert [(w.wr_id, w.status) for w in x_wcs] == [(7, Status.REM_ACCESS_ERR), (8, Status.WR_FLUSH_ERR)]
    assert x_wcs[0].terminate is not None and x_wcs[0].terminate.key() == DDP_NOT_ASSOCIATED
    assert tx.state is ConnState.ERROR and p.tc.state is ConnState.CONNECTED


def test_window_bounds_and_rights_are_its_own() -> None:
    p = pair()
    t_mw = p.t.register(p.t.alloc(64), Access.LOCAL_WRITE | Access.MW_BIND | Access.REMOTE_WRITE)
    win = p.t.bind_window(t_mw, 16, 16, Access.REMOTE_READ, p.tc)
    p.ic.post_write(b"w", win.stag, win.to(0), wr_id=1)  # the region allows it, the window does not
    p.ic.post_send(b"x", wr_id=2)
    _expect_terminated(p, Status.REM_ACCESS_ERR, RDMAP_ACCESS)
    q = pair()
    q_mw = q.t.register(q.t.alloc(64), Access.LOCAL_WRITE | Access.MW_BIND)
    qwin = q.t.bind_window(q_mw, 16, 16, Access.REMOTE_READ, q.tc)
    q.ic.post_read(q.local.sge(0, 8), qwin.stag, qwin.to(12), wr_id=1)  # inside the region, past the window
    q.ic.post_send(b"x", wr_id=2)
    _expect_terminated(q, Status.REM_ACCESS_ERR, RDMAP_BOUNDS)


def _send_with_invalidate(p: Pair, stag: int) -> None:
    p.ic.post_recv(p.rx_i.sge(0, 64), wr_id=50)
    p.tc.post_send(b"COMPLETION", wr_id=1, invalidate=stag)
    p.tc.post_send(b"next", wr_id=2)


def test_send_with_invalidate_revokes_the_window() -> None:
    p = pair()
    win = p.i.bind_window(p.local, 0, 64, Access.REMOTE_WRITE, p.ic)
    _send_with_invalidate(p, win.stag)
    p.ic.post_recv(p.rx_i.sge(64, 64), wr_id=51)
    p.fab.run()
    recv = p.ic.cq.poll(5)
    assert [(w.wr_id, w.op, w.status) for w in recv] == [(50, Op.RECV, Status.SUCCESS), (51, Op.RECV, Status.SUCCESS)]
    assert recv[0].invalidated_stag == win.stag and recv[1].invalidated_stag is None
    assert p.rx_i.read(0, 10) == b"COMPLETION"
    assert not p.i.is_valid(win.stag)
    # the revoked STag no longer admits the target's RDMA Write
    p.tc.post_write(b"late", win.stag, win.to(0), wr_id=3)
    p.fab.run()
    late = [w for w in p.tc.cq.poll(10) if w.wr_id == 3]
    assert late[0].status is Status.REM_ACCESS_ERR
    assert late[0].terminate is not None and late[0].terminate.key() == DDP_INVALID_STAG
    assert p.local.read(0, 4) == bytes(4)


def test_send_with_invalidate_of_fast_registered_region() -> None:
    p = pair()
    frmr = p.i.register(p.i.alloc(32), Access.LOCAL_WRITE | Access.REMOTE_WRITE, remote_invalidate=True)
    _send_with_invalidate(p, frmr.stag)
    p.ic.post_recv(p.rx_i.sge(64, 64), wr_id=51)
    p.fab.run()
    assert p.ic.cq.poll(1)[0].invalidated_stag == frmr.stag
    assert not p.i.is_valid(frmr.stag)


def test_plain_region_cannot_be_remotely_invalidated() -> None:
    p = pair()
    plain = p.i.register(p.i.alloc(32), Access.LOCAL_WRITE | Access.REMOTE_WRITE)
    _send_with_invalidate(p, plain.stag)
    p.fab.run()
    t_wcs = p.tc.cq.poll(5)
    assert [(w.wr_id, w.status) for w in t_wcs] == [(1, Status.REM_OP_ERR), (2, Status.WR_FLUSH_ERR)]
    assert t_wcs[0].terminate is not None and t_wcs[0].terminate.key() == RDMAP_CANNOT_INVALIDATE
    assert p.i.is_valid(plain.stag)
    assert [(w.wr_id, w.status) for w in p.ic.cq.poll(5)] == [(50, Status.WR_FLUSH_ERR)]


def test_send_without_posted_recv() -> None:
    p = pair()
    p.tc.post_send(b"hello", wr_id=1)
    p.tc.post_send(b"again", wr_id=2)
    p.fab.run()
    wcs = p.tc.cq.poll(5)
    assert [(w.wr_id, w.status) for w in wcs] == [(1, Status.REM_OP_ERR), (2, Status.WR_FLUSH_ERR)]
    assert wcs[0].terminate is not None and wcs[0].terminate.key() == DDP_NO_BUFFER
    q = pair(IB_RC)
    q.tc.post_send(b"hello", wr_id=1)
    q.fab.run()
    assert q.tc.cq.poll(1)[0].status is Status.RNR_RETRY_EXC_ERR


def test_send_longer_than_recv_buffer() -> None:
    p = pair()
    p.ic.post_recv(p.rx_i.sge(0, 4), wr_id=50)
    p.ic.post_recv(p.rx_i.sge(4, 64), wr_id=51)
    p.tc.post_send(b"too long", wr_id=1)
    p.fab.run()
    (t_wc,) = p.tc.cq.poll(5)
    assert (t_wc.status, t_wc.terminate and t_wc.terminate.key()) == (Status.REM_INV_REQ_ERR, DDP_TOO_LONG)
    assert [(w.wr_id, w.status) for w in p.ic.cq.poll(5)] == [(50, Status.LOC_LEN_ERR), (51, Status.WR_FLUSH_ERR)]


def test_post_after_error_completes_flushed() -> None:
    p = pair()
    p.ic.post_write(b"x", 0xDEAD00, 0, wr_id=1)
    p.fab.run()
    p.ic.cq.poll(10)
    assert p.ic.post_send(b"x", wr_id=9) == 9
    assert p.ic.post_recv(p.rx_i.sge(0, 8), wr_id=10) == 10
    assert [(w.wr_id, w.status) for w in p.ic.cq.poll(5)] == [(9, Status.WR_FLUSH_ERR), (10, Status.WR_FLUSH_ERR)]


def test_error_reaches_an_actor_as_a_completion() -> None:
    """An actor waiting for its Read sees the error completion; nothing raises out of the run."""
    p = pair()
    seen: list[Status] = []

    def reader() -> ActorGen:
        p.ic.post_read(p.local.sge(0, 8), 0x123400, 0, wr_id=1)
        wc = yield from wait_completion(p.ic.cq)
        seen.append(wc.status)

    p.fab.spawn("reader", reader())
    assert p.fab.run().blocked == ()
    assert seen == [Status.REM_ACCESS_ERR]


def test_local_misuse_raises() -> None:
    p = pair()
    with pytest.raises(FabricUsageError, match="outside region"):
        p.ic.post_read(p.local.sge(250, 16), p.mem.stag, p.mem.to(0))
    with pytest.raises(FabricUsageError, match="LOCAL_WRITE"):
        ro = p.i.register(p.i.alloc(8), Access.REMOTE_READ)
        p.ic.post_recv(ro.sge(0, 8))
    with pytest.raises(FabricUsageError, match="MW_BIND"):
        p.t.bind_window(p.mem, 0, 8, Access.REMOTE_READ, p.tc)
    with pytest.raises(FabricUsageError, match="immediate"):
        p.ic.post_write(b"x", p.mem.stag, p.mem.to(0), imm=b"1234")  # RDMAP immediate data is 8 octets


def test_disconnect_flushes_both_ends() -> None:
    p = pair()
    p.tc.post_recv(p.rx_t.sge(0, 8), wr_id=60)
    p.ic.post_write(b"x" * 8, p.mem.stag, p.mem.to(0), wr_id=1)
    p.ic.disconnect()
    p.fab.run()
    assert p.ic.state is ConnState.CLOSED and p.tc.state is ConnState.CLOSED and p.ic.terminate is None
    assert [(w.wr_id, w.status) for w in p.ic.cq.poll(5)] == [(1, Status.WR_FLUSH_ERR)]
    assert [(w.wr_id, w.status) for w in p.tc.cq.poll(5)] == [(60, Status.WR_FLUSH_ERR)]
    assert p.mem.read(0, 8) == bytes(8)
