"""The wire fabric: the fabric interface over real loopback sockets in the iWARP and RoCEv2 wire formats.

The engines' own byte-level tests are tests/rdma/test_iwarp.py and test_roce.py; these check what the suites
rely on across a real socket pair: every operation, the Terminate / NAK a bad access ends in, the refusal of a
broken MPA start frame, setup failures as `WireSetupError` (never a verdict), and that the pcaps the bindings
write decode in tshark as iWARP and InfiniBand without malformed packets (an independent check of the format).
"""

from __future__ import annotations

import shutil
import socket
import subprocess
from pathlib import Path

import pytest

from kvconform.rdma import IB_RC, RDMAP_7306, Access, ConnState, EmuFabric, Op, Profile, SendWr, Status
from kvconform.rdma.iwarp import mpa
from kvconform.rdma.iwarp.ddp import Segment
from kvconform.rdma.iwarp.rdmap import Opcode
from kvconform.rdma.wire.fabric import WireFabric, WireSetupError
from tests.rdma.helpers import ALL_REMOTE, Pair, pair

WIRES: dict[str, Profile] = {"iwarp": RDMAP_7306, "roce": IB_RC}
RING_ADD, RING_MASK = 0x0000000100000010, 0x8000000080000020


def _wire_pair(wire: str, **kw: object) -> Pair:
    return pair(WIRES[wire], wire=wire, **kw)  # type: ignore[arg-type]


def test_fpdu_vectors_of_rdma_bindings() -> None:
    """§3.5: the RDMA Write of "KVBLOCK!" and the MPA rev 1 Request, byte for byte."""
    write = Segment(True, True, Opcode.WRITE, b"KVBLOCK!", stag=0x11223344, to=0x1000).encode()
    assert mpa.encode_fpdu(write).hex() == "0016c140112233440000000000001000" "4b56424c4f434b21f8ac0509"
    req = mpa.encode_start(mpa.StartFrame(True, revision=1, crc=False))
    assert req.hex() == "4d504120494420526571204672616d65" "00010000"
    reasm = mpa.Reassembler()
    framed = mpa.encode_fpdu(write)
    for i in range(len(framed)):  # any TCP chunking
        reasm.feed(framed[i:i + 1])
    assert reasm.next() == write
    reasm.feed(framed[:-1] + bytes([framed[-1] ^ 1]))
    with pytest.raises(mpa.MpaError) as bad:
        reasm.next()
    assert (bad.value.field, bad.value.code) == ("CRC", 2)


@pytest.mark.parametrize("wire", WIRES)
def test_every_operation_over_the_wire(wire: str) -> None:
    p = _wire_pair(wire)
    try:
        p.tc.post_recv(p.rx_t.sge(0, 64), wr_id=10)
        p.mem.write(0, b"R" * 64)
        p.mem.write_u64(248, 5)
        p.ic.post_send(b"hello", wr_id=1)
        p.ic.post_write(b"W" * 64, p.mem.stag, p.mem.to(64), wr_id=2)
        p.ic.post_read(p.local.sge(0, 64), p.mem.stag, p.mem.to(0), wr_id=3)
        mask = RING_MASK if WIRES[wire].masked_atomics else 0
        p.ic.post_fetch_add(p.local.sge(64, 8), p.mem.stag, p.mem.to(248), RING_ADD, mask, wr_id=4)
        p.ic.post_cmp_swap(p.local.sge(72, 8), p.mem.stag, p.mem.to(240), 0, 7, wr_id=5)
        assert p.fab.run().reason == "quiescent"
        assert [(w.wr_id, w.status) for w in p.ic.cq.poll(10)] == [(i, Status.SUCCESS) for i in range(1, 6)]
        (recv,) = p.tc.cq.poll(5)
        assert (recv.wr_id, recv.op, recv.byte_len, p.rx_t.read(0, 5)) == (10, Op.RECV, 5, b"hello")
        assert p.mem.read(64, 64) == b"W" * 64 and p.local.read(0, 64) == b"R" * 64
        assert p.local.read_u64(64) == 5 and p.mem.read_u64(248) == 5 + RING_ADD
        assert p.local.read_u64(72) == 0 and p.mem.read_u64(240) == 7
    finally:
        p.fab.close()  # type: ignore[attr-defined]


@pytest.mark.parametrize("wire", WIRES)
def test_a_bad_read_fails_it_and_flushes_the_rest(wire: str) -> None:
    p = _wire_pair(wire)
    try:
        p.t.invalidate(p.mem.stag)
        p.ic.post_read(p.local.sge(0, 16), p.mem.stag, p.mem.to(0), wr_id=1)
        p.ic.post_read(p.local.sge(16, 16), p.mem.stag, p.mem.to(0), wr_id=2)
        p.fab.run()
        wcs = p.ic.cq.poll(5)
        assert [(w.wr_id, w.status) for w in wcs] == [(1, Status.REM_ACCESS_ERR), (2, Status.WR_FLUSH_ERR)]
        assert wcs[0].terminate is not None and p.ic.state is ConnState.ERROR
        if wire == "iwarp":  # RDMAP Remote Protection / invalid STag, as the target's RNIC sent it
            assert wcs[0].terminate.key() == (0, 1, 0) == p.tc.terminate.key()  # type: ignore[union-attr]
    finally:
        p.fab.close()  # type: ignore[attr-defined]


def test_an_iwarp_write_refusal_arrives_after_its_completion() -> None:
    """iWARP has no acknowledgements: the Write completes once sent, the Terminate fails what follows it (the
    harness's clients confirm a Write with a zero-length Read for that reason)."""
    p = _wire_pair("iwarp")
    try:
        p.ic.post_write(b"x" * 8, p.mem.stag ^ 0xFF, p.mem.to(0), wr_id=1)
        p.ic.post_read(p.local.sge(0, 0), 0, 0, wr_id=2)
        p.fab.run()
        wcs = p.ic.cq.poll(5)
        assert [(w.wr_id, w.status) for w in wcs] == [(1, Status.SUCCESS), (2, Status.WR_FLUSH_ERR)]
        assert wcs[1].terminate is not None and wcs[1].terminate.key() == (1, 1, 0)  # DDP tagged, invalid STag
        assert p.mem.read(0, 8) == bytes(8)
    finally:
        p.fab.close()  # type: ignore[attr-defined]


def test_a_roce_write_refusal_fails_the_write() -> None:
    p = _wire_pair("roce")
    try:
        p.ic.post_write(b"x" * 8, p.mem.stag ^ 0xFF, p.mem.to(0), wr_id=1)
        p.fab.run()
        (wc,) = p.ic.cq.poll(5)[:1]
        assert wc.status is Status.REM_ACCESS_ERR and p.mem.read(0, 8) == bytes(8)
    finally:
        p.fab.close()  # type: ignore[attr-defined]


def test_a_broken_mpa_request_is_refused_without_processing() -> None:
    fab = WireFabric(RDMAP_7306, binding="iwarp")
    node = fab.node("T")
    accepted: list[object] = []
    listener = fab.listen(node, "127.0.0.1", 0, accepted.append)
    try:
        with socket.create_connection(("127.0.0.1", fab.port_of(listener)), timeout=5) as raw:
            raw.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
            assert fab.await_event(lambda: bool(fab.events), 5.0)
            raw.settimeout(5)
            assert raw.recv(100) == b""  # closed without an MPA Reply or an FPDU
        assert not accepted
        (_, term), = fab.events
        assert term is not None and "Key" in term.reason and term.key() == (2, 0, 4), term  # LLP: invalid Request
    finally:
        fab.close()


@pytest.mark.parametrize("wire", WIRES)
def test_nobody_listening_is_a_setup_error(wire: str) -> None:
    fab = WireFabric(WIRES[wire], binding=wire)  # type: ignore[arg-type]
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # bound, not listening: the connection is refused
        try:
            with pytest.raises(WireSetupError, match="refused"):
                fab.dial(fab.remote("target", "127.0.0.1", port), fab.node("I"))
        finally:
            fab.close()


@pytest.mark.skipif(shutil.which("tshark") is None, reason="tshark is not installed (.ci/run installs it)")
@pytest.mark.parametrize("wire", WIRES)
def test_captures_decode_in_tshark(wire: str, tmp_path: Path) -> None:
    fab = WireFabric(WIRES[wire], binding=wire, capture_dir=tmp_path)  # type: ignore[arg-type]
    t, i = fab.node("T"), fab.node("I")
    tc, ic = fab.connect(t, i)
    mem = t.register(t.alloc(4096), ALL_REMOTE)
    rx = t.register(t.alloc(256), Access.LOCAL_WRITE)
    local = i.register(i.alloc(4096), Access.LOCAL_WRITE)
    tc.post_recv(rx.sge(0, 256), wr_id=1)
    ic.post_send(b"HELLO", wr_id=2)
    ic.post_write(b"W" * 3000, mem.stag, mem.to(0), wr_id=3)
    ic.post_read(local.sge(0, 2000), mem.stag, mem.to(0), wr_id=4)
    ic.post_fetch_add(local.sge(2048, 8), mem.stag, mem.to(4088), 1, wr_id=5)
    # a last Send: the Read Response and Atomic ACK acknowledge what came before them (an RC responder's ACKs
    # coalesce), so the plain ACK on the wire is this one's
    tc.post_recv(rx.sge(0, 256), wr_id=6)
    ic.post_send(b"BYE", wr_id=7)
    fab.run()
    assert all(w.ok for w in ic.cq.poll(10))
    port = fab.udp_port
    fab.close()
    pcap = tmp_path / f"T-I.I.{wire}.pcap"
    # KBTP payloads are no RPC-over-RDMA: Wireshark's heuristic for it would call a Send's payload malformed
    cmd = ["tshark", "-r", str(pcap), "-V", "--disable-protocol", "rpcordma"]
    if wire == "roce":
        cmd += ["-d", f"udp.port=={port},infiniband"]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=60, check=True).stdout
    cmd.remove("-V")  # the summary lines name each packet; -V shows every PDU of a segment
    out += subprocess.run(cmd, capture_output=True, text=True, timeout=60, check=True).stdout
    assert "Malformed" not in out and "Bad CRC" not in out, out
    iwarp = [f"OpCode: {op}" for op in ("Send", "Write", "Read Request", "Read Response", "Atomic Request",
                                        "Atomic Response")] + ["MPA Request Frame", "MPA Reply Frame", "Good CRC32"]
    roce = ["RC Send Only", "RC RDMA Write First", "RC RDMA Write Last", "RC RDMA Read Request",
            "RC RDMA Read Response", "RC Fetch Add", "RC Atomic Acknowledge", "RC Acknowledge"]
    want = iwarp if wire == "iwarp" else roce
    missing = [w for w in want if w not in out]
    assert not missing, f"tshark did not see {missing}:\n{out}"


class _NoMemory:
    """LocalMemory of an endpoint nobody accesses remotely in the test."""

    def resolve(self, *args: object, **kwargs: object) -> object:
        raise AssertionError("no remote access expected")

    atomic_misaligned = remote_invalidate = resolve

    def note(self, what: str, **args: object) -> None:
        pass


def test_a_delayed_rtr_goes_first_at_its_time_and_holds_the_sends() -> None:
    """``rtr_delay_s`` (siw drops what arrives while it moves its QP to RTS: docs/interop-rdma.md #10): after the
    MPA Reply nothing leaves until the clock passes the delay; then the Read RTR, then what was posted meanwhile."""
    from kvconform.rdma.engine import WorkRequest
    from kvconform.rdma.iwarp.ddp import parse
    from kvconform.rdma.iwarp.engine import IwarpEngine
    from kvconform.rdma.iwarp.mpa import Enhanced, StartFrame, encode_start

    ini = IwarpEngine("I", _NoMemory(), initiator=True, rtr_delay_s=0.5)  # type: ignore[arg-type]
    ini.start(0.0)
    assert ini.take_output()[0].startswith(b"MPA ID Req Frame")
    ini.receive(encode_start(StartFrame(False, 2, private=Enhanced(16, 16, p2p=True, read0=True).encode())), 1.0)
    ini.post(WorkRequest(op=Op.SEND, wr_id=1, data=b"hello"))
    assert ini.take_output() == [] and not ini.established and ini.next_deadline() == 1.5
    ini.poll_timers(1.4)
    assert ini.take_output() == []
    ini.poll_timers(1.5)
    reasm = mpa.Reassembler()
    for chunk in ini.take_output():
        reasm.feed(chunk)
    rtr, send = parse(reasm.next() or b""), parse(reasm.next() or b"")
    assert (rtr.opcode, rtr.tagged) == (Opcode.READ_REQUEST, False)
    assert (send.opcode, send.payload) == (Opcode.SEND, b"hello")
    assert ini.established and ini.next_deadline() is None


@pytest.mark.parametrize(("wire", "gso"), [("emulated", False), ("iwarp", False), ("roce", False), ("roce", True)])
def test_a_work_request_list_posts_in_order_in_one_call(wire: str, gso: bool) -> None:
    """`Connection.post_list`: a multi-packet Write, eight small Reads and a Read of the whole block posted in one
    call complete in order with the data; over RoCEv2 with ``gso`` the Write's Middle packets and the Read
    Requests leave as UDP GSO sends (equal-sized runs) and arrive as the same datagrams."""
    profile = WIRES.get(wire, RDMAP_7306)
    fab = EmuFabric(profile) if wire == "emulated" else WireFabric(profile, binding=wire, gso=gso)  # type: ignore[arg-type]
    try:
        t, i = fab.node("T"), fab.node("I")
        _, ic = fab.connect(t, i)
        size = 8 * 1024 + 100  # at PMTU 1024: First, seven Middle, a short Last
        mem = t.register(t.alloc(size), ALL_REMOTE)
        local = i.register(i.alloc(2 * size), Access.LOCAL_WRITE)
        data = (bytes(range(256)) * (size // 256 + 1))[:size]
        wrs = [SendWr.write(data, mem.stag, mem.to(0), 1),
               *(SendWr.read(local.sge(size + 16 * k, 16), mem.stag, mem.to(16 * k), 2 + k, tag=f"r{k}")
                 for k in range(8)),
               SendWr.read(local.sge(0, size), mem.stag, mem.to(0), 10)]
        assert ic.post_list(wrs) == list(range(1, 11))
        assert fab.run().reason == "quiescent"
        assert [(w.wr_id, w.status) for w in ic.cq.poll(20)] == [(k, Status.SUCCESS) for k in range(1, 11)]
        assert local.read(0, size) == data and local.read(size, 128) == data[:128]
        if isinstance(fab, WireFabric):
            assert fab._gso is (gso and wire == "roce")  # GSO was used throughout, not refused and dropped
    finally:
        if isinstance(fab, WireFabric):
            fab.close()


def test_what_a_reset_peer_sent_before_is_processed_before_the_stream_ends() -> None:
    """A write that fails (the peer reset the stream) ends the connection only after the bytes the peer sent before
    it are processed: its Terminate is why the connection ended, not a clean close."""
    fab = WireFabric(RDMAP_7306, binding="iwarp")
    got: list[tuple[str, bytes | str]] = []
    fab.wire.received = lambda conn, data: got.append(("data", data))  # type: ignore[method-assign]
    fab.lost = lambda conn, why: got.append(("lost", why))  # type: ignore[method-assign]
    a, b = socket.socketpair()
    try:
        b.sendall(b"a Terminate")
        b.close()

        class Conn:
            sock, watched, peer_conn, name = a, None, None, "c"

        fab._read_to_end(Conn(), "send failed: reset")  # type: ignore[arg-type]
        assert got == [("data", b"a Terminate"), ("lost", "send failed: reset")]
    finally:
        a.close()
        fab.close()
