"""The userspace RoCEv2 RC engine (kvconform.rdma.roce): headers, ICRC, and two engines back to back.

Vectors are rdma-bindings §4.8's; scapy.contrib.roce (§4.9) is the independent ICRC oracle. Time is a
fake clock handed to `poll_timers`, so loss and retry tests run in microseconds of real time.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from typing import Any

import pytest

from kvconform.rdma.emulated import EmuBuffer
from kvconform.rdma.engine import WorkRequest
from kvconform.rdma.fabric import (
    Access,
    Buffer,
    Completion,
    ConnState,
    Layer,
    Op,
    RdmapEType,
    Region,
    Status,
    Terminate,
)
from kvconform.rdma.memory import atomic_misaligned, remote_invalidate_refusal, resolve
from kvconform.rdma.roce import oob
from kvconform.rdma.roce.engine import RoceEngine, psn_diff
from kvconform.rdma.roce.headers import (
    Aeth,
    AethType,
    AtomicEth,
    Bth,
    HeaderError,
    NakCode,
    Opcode,
    Packet,
    Reth,
)
from kvconform.rdma.roce.icrc import append_icrc, check_icrc, icrc, ipv4_header
from kvconform.rdma.roce.qp import QpInfo

ALL = Access.LOCAL_WRITE | Access.REMOTE_READ | Access.REMOTE_WRITE | Access.REMOTE_ATOMIC
FETCH_ADD_VECTOR = bytes.fromhex(
    "1400ffff0000001180000101" "0000000000002000" "00000055" "0000000100000000" "0000000000000000" "8792eba1")


# ---- headers ---------------------------------------------------------------------------------------------


def test_bth_and_atomic_eth_vector() -> None:
    bth = Bth(Opcode.FETCH_ADD, 0x11, 0x101, ack_req=True)
    pkt = Packet(bth, atomic=AtomicEth(0x2000, 0x55, 0x0000000100000000, 0))
    assert pkt.encode() == FETCH_ADD_VECTOR[:-4]
    back = Packet.decode(FETCH_ADD_VECTOR[:-4])
    assert back.bth == bth and back.atomic == AtomicEth(0x2000, 0x55, 1 << 32, 0) and back.payload == b""


def test_bth_every_field_round_trips() -> None:
    bth = Bth(0x0B, 0xABCDEF, 0xFFFFFF, ack_req=True, se=True, mig_req=True, pad=3, tver=0, p_key=0x8001,
              fecn=True, becn=True)
    raw = bth.encode()
    assert raw == bytes.fromhex("0bf08001c0abcdef80ffffff")
    assert Bth.decode(raw) == bth
    with pytest.raises(HeaderError, match="12 expected"):
        Bth.decode(raw[:11])


def test_padding_and_extension_headers() -> None:
    pkt = Packet(Bth(Opcode.WRITE_ONLY_IMM, 7, 9), reth=Reth(0x1000, 0x42, 5), imm=b"\x01\x02\x03\x04",
                 payload=b"hello")
    raw = pkt.encode()
    assert len(raw) == 12 + 16 + 4 + 8 and raw[1] >> 4 & 3 == 3 and raw[-3:] == b"\0\0\0"
    assert raw[12:28] == struct.pack(">QII", 0x1000, 0x42, 5) and raw[28:32] == b"\x01\x02\x03\x04"
    back = Packet.decode(raw)
    assert back.payload == b"hello" and back.reth == Reth(0x1000, 0x42, 5) and back.imm == b"\x01\x02\x03\x04"
    inv = Packet.decode(Packet(Bth(Opcode.SEND_ONLY_INV, 7, 9), ieth=0xDEAD, payload=b"x").encode())
    assert inv.ieth == 0xDEAD and inv.payload == b"x"
    ack = Packet.decode(Packet(Bth(Opcode.ATOMIC_ACKNOWLEDGE, 7, 9), aeth=Aeth.ack(5),
                               atomic_ack=0x1122334455667788).encode())
    assert ack.aeth == Aeth(0x1F, 5) and ack.atomic_ack == 0x1122334455667788
    with pytest.raises(HeaderError, match="reth header"):
        Packet.decode(Bth(Opcode.WRITE_FIRST, 7, 9).encode() + b"\0" * 8)
    with pytest.raises(HeaderError, match="not an RC opcode"):
        Packet.decode(Bth(0x15, 7, 9).encode())


def test_aeth_syndromes() -> None:
    assert Aeth.ack(3).encode() == bytes.fromhex("1f000003")
    assert Aeth.rnr_nak(0, 14).encode()[0] == 0x2E and Aeth.rnr_nak(0, 14).kind is AethType.RNR_NAK
    for code in NakCode:
        a = Aeth.nak(1, code)
        assert a.syndrome == 0x60 + code and a.kind is AethType.NAK and a.value == code
    assert Aeth(0x40, 0).kind is None  # 10b is reserved


def test_psn_window() -> None:
    assert psn_diff(0, 0xFFFFFF) == 1 and psn_diff(0xFFFFFF, 0) == -1 and psn_diff(5, 3) == 2


# ---- ICRC ------------------------------------------------------------------------------------------------


def test_icrc_fetch_add_vector() -> None:
    got = icrc("192.0.2.1", 0xC000, "192.0.2.2", 4791, FETCH_ADD_VECTOR[:-4])
    assert got == bytes.fromhex("8792eba1")
    assert check_icrc("192.0.2.1", 0xC000, "192.0.2.2", 4791, FETCH_ADD_VECTOR) == FETCH_ADD_VECTOR[:-4]
    bad = FETCH_ADD_VECTOR[:-1] + b"\0"
    assert check_icrc("192.0.2.1", 0xC000, "192.0.2.2", 4791, bad) is None
    # the masked fields do not matter: FECN/BECN in BTH octet 4
    fecn = FETCH_ADD_VECTOR[:4] + b"\xc0" + FETCH_ADD_VECTOR[5:]
    assert check_icrc("192.0.2.1", 0xC000, "192.0.2.2", 4791, fecn) is not None
    # the addresses do
    assert check_icrc("192.0.2.9", 0xC000, "192.0.2.2", 4791, FETCH_ADD_VECTOR) is None


def test_ipv4_header_vector() -> None:
    # §4.8 ALLOC_STORE vector: 0x5c octets, IP ID 0, DF, TTL 64, 192.0.2.1 -> 192.0.2.2
    assert ipv4_header("192.0.2.1", "192.0.2.2", 0x5C - 20).hex() == "4500005c000040004011b68dc0000201c0000202"


@pytest.mark.parametrize(("src", "dst"), [("192.0.2.1", "192.0.2.2"), ("2001:db8::1", "2001:db8::2")])
def test_icrc_agrees_with_scapy(src: str, dst: str) -> None:
    from scapy.all import IP, UDP, IPv6, Raw, load_contrib

    load_contrib("roce")
    from scapy.contrib.roce import BTH

    body = Packet(Bth(Opcode.SEND_ONLY, 0x11, 0x100, ack_req=True), payload=b"kv-cache!" * 5).encode()
    rest = body[12:]
    ip = IP(src=src, dst=dst, id=0, flags="DF", ttl=64, tos=0x10) if ":" not in src else \
        IPv6(src=src, dst=dst, hlim=17, tc=3, fl=0x12345)
    pkt = ip / UDP(sport=0xC123, dport=4791, chksum=0) / BTH(opcode=4, dqpn=0x11, ackreq=1, psn=0x100,
                                                               padcount=body[1] >> 4 & 3) / Raw(rest)
    wire = bytes(pkt)
    assert wire[-4 - len(body):-4] == body
    assert wire[-4:] == icrc(src, 0xC123, dst, 4791, body)


# ---- two engines back to back ------------------------------------------------------------------------------


class Mem:
    """A LocalMemory over EmuBuffers and kvconform.rdma.memory, for one connection endpoint."""

    def __init__(self, conn: str) -> None:
        self.conn = conn
        self.stags: dict[int, Region] = {}
        self.notes: list[tuple[str, dict[str, Any]]] = []
        self._addr = 0x10000

    def region(self, length: int, access: Access = ALL, *, invalidatable: bool = False) -> Region:
        buf = EmuBuffer(self._addr, length, "little")
        stag = 0x100 + len(self.stags)
        r = Region(stag, buf, 0, length, access, False, invalidatable, self.conn)
        self._addr += 0x10000
        self.stags[stag] = r
        return r

    def resolve(
        self, stag: int, to: int, length: int, right: Access, *, tagged: bool
    ) -> tuple[Buffer, int] | Terminate:
        return resolve(self.stags, self.conn, stag, to, length, right, tagged=tagged)

    def atomic_misaligned(self, to: int) -> Terminate | None:
        return atomic_misaligned(to, self.conn)

    def remote_invalidate(self, stag: int) -> Terminate | None:
        refusal = remote_invalidate_refusal(self.stags, self.conn, stag)
        if refusal is None:
            del self.stags[stag]
        return refusal

    def note(self, what: str, **args: Any) -> None:
        self.notes.append((what, args))

    def kinds(self) -> list[str]:
        return [w for w, _ in self.notes]


A = QpInfo(qpn=0x11, psn=0xFFFFFE, ip="127.0.0.1", port=40001)  # the PSN wraps during the tests
B = QpInfo(qpn=0x22, psn=0x100, ip="127.0.0.2", port=40002)
Filter = Callable[[str, int, Packet], bool]  # (direction "ab"/"ba", index of the packet in it, packet) -> drop


class Wire:
    """Requester ``a`` and responder ``b`` joined in memory; ``drop`` loses chosen packets; fake time."""

    def __init__(self, drop: Filter | None = None, **opts: Any) -> None:
        self.ma, self.mb = Mem("a"), Mem("b")
        self.a = RoceEngine("a", self.ma, local=A, remote=B, **opts)
        self.b = RoceEngine("b", self.mb, local=B, remote=A, **opts)
        self.now = 0.0
        self.drop = drop
        self.sent: dict[str, list[Packet]] = {"ab": [], "ba": []}
        self.wcs: dict[str, list[Completion]] = {"a": [], "b": []}
        self.order: list[tuple[str, Packet]] = []  # both directions, in the order they were sent
        self.a.start(0.0)
        self.b.start(0.0)

    def run(self, max_time: float = 60.0) -> None:
        for _ in range(100_000):
            moved = False
            for src, dst, d in ((self.a, self.b, "ab"), (self.b, self.a, "ba")):
                for raw in src.take_output():
                    moved = True
                    pkt = Packet.decode(raw[:-4])
                    idx = len(self.sent[d])
                    self.sent[d].append(pkt)
                    self.order.append((d, pkt))
                    if self.drop is None or not self.drop(d, idx, pkt):
                        dst.receive(raw, self.now)
            for e in (self.a, self.b):
                self.wcs[e.name] += e.take_completions()
            if moved:
                continue
            times = [t for t in (self.a.next_deadline(), self.b.next_deadline()) if t is not None]
            if not times:
                return
            self.now = max(self.now, min(times))
            assert self.now <= max_time, "fake time bound exceeded"
            self.a.poll_timers(self.now)
            self.b.poll_timers(self.now)
        raise AssertionError("no quiescence")

    def ops(self, d: str) -> list[Opcode]:
        return [p.opcode for p in self.sent[d]]


def wr(op: Op, wr_id: int, **kw: Any) -> WorkRequest:
    return WorkRequest(op=op, wr_id=wr_id, tag=f"w{wr_id}", **kw)


def test_every_operation_back_to_back() -> None:
    w = Wire()
    mem = w.mb.region(8192)
    rx = w.mb.region(4096)
    inv = w.mb.region(64, invalidatable=True)
    dst = w.ma.region(8192)
    big = bytes(range(256)) * 12  # 3072 octets: First/Middle/Last at PMTU 1024
    for i in range(4):
        w.b.post_recv(10 + i, rx.sge(i * 1024, 1024 if i else 4096 - 3072))
    mem.write_u64(4096, 41)
    w.a.post(wr(Op.RDMA_WRITE, 1, data=big, stag=mem.stag, to=mem.to(0)))
    w.a.post(wr(Op.RDMA_READ, 2, dst=dst.sge(0, 3000), stag=mem.stag, to=mem.to(10)))
    w.a.post(wr(Op.SEND, 3, data=b"only"))
    w.a.post(wr(Op.SEND, 4, data=b"imm!", imm=b"\xaa\xbb\xcc\xdd", solicited=True))
    w.a.post(wr(Op.SEND, 5, data=b"inv", invalidate=inv.stag))
    w.a.post(wr(Op.RDMA_WRITE, 6, data=b"tail", stag=mem.stag, to=mem.to(5000), imm=b"\x00\x00\x00\x07"))
    w.a.post(wr(Op.FETCH_ADD, 7, dst=dst.sge(4000, 8), stag=mem.stag, to=mem.to(4096), add=1 << 32))
    w.a.post(wr(Op.COMP_SWAP, 8, dst=dst.sge(4008, 8), stag=mem.stag, to=mem.to(4096), compare=41 + (1 << 32),
                swap=99))
    w.a.post(wr(Op.RDMA_WRITE, 9, data=b"quiet", stag=mem.stag, to=mem.to(6000), signaled=False))
    w.a.post(wr(Op.RDMA_READ, 10, dst=dst.sge(5000, 0), stag=mem.stag, to=mem.to(0)))
    w.run()
    a = w.wcs["a"]
    assert [(c.wr_id, c.op, c.status) for c in a] == [
        (1, Op.RDMA_WRITE, Status.SUCCESS), (2, Op.RDMA_READ, Status.SUCCESS), (3, Op.SEND, Status.SUCCESS),
        (4, Op.SEND, Status.SUCCESS), (5, Op.SEND, Status.SUCCESS), (6, Op.RDMA_WRITE, Status.SUCCESS),
        (7, Op.FETCH_ADD, Status.SUCCESS), (8, Op.COMP_SWAP, Status.SUCCESS), (10, Op.RDMA_READ, Status.SUCCESS)]
    assert [c.byte_len for c in a] == [3072, 3000, 4, 4, 3, 4, 8, 8, 0]
    assert mem.read(0, 3072) == big and dst.read(0, 3000) == big[10:3010] and mem.read(6000, 5) == b"quiet"
    assert dst.read_u64(4000) == 41 and dst.read_u64(4008) == 41 + (1 << 32) and mem.read_u64(4096) == 99
    b = w.wcs["b"]
    assert [(c.wr_id, c.op, c.byte_len, c.imm, c.invalidated_stag, c.solicited) for c in b] == [
        (10, Op.RECV, 4, None, None, False), (11, Op.RECV, 4, b"\xaa\xbb\xcc\xdd", None, True),
        (12, Op.RECV, 3, None, inv.stag, False), (13, Op.RECV_RDMA_WITH_IMM, 4, b"\x00\x00\x00\x07", None, False)]
    assert rx.read(0, 4) == b"only" and inv.stag not in w.mb.stags
    assert w.ops("ab")[:4] == [Opcode.WRITE_FIRST, Opcode.WRITE_MIDDLE, Opcode.WRITE_LAST, Opcode.READ_REQUEST]
    assert w.ops("ba").count(Opcode.READ_RESPONSE_MIDDLE) == 1 and Opcode.READ_RESPONSE_ONLY in w.ops("ba")
    assert Opcode.SEND_ONLY_INV in w.ops("ab") and Opcode.WRITE_ONLY_IMM in w.ops("ab")
    # AckReq on each message's last packet only; PSNs consecutive across the 24-bit wrap
    ab = w.sent["ab"]
    assert [p.bth.ack_req for p in ab[:3]] == [False, False, True]
    assert [p.bth.psn for p in ab[:5]] == [0xFFFFFE, 0xFFFFFF, 0, 1, 4]  # the READ took 3 PSNs
    assert {"write-arrive", "read-sample", "rdma_read-arrive", "fetch_add-arrive",
            "fetch_add", "comp_swap", "deliver"} <= set(w.mb.kinds())
    assert ("fetch_add", {"addr": mem.buffer.addr + 4096, "orig": 41, "new": 41 + (1 << 32)}) in w.mb.notes
    assert w.a.state is w.b.state is ConnState.CONNECTED and w.a.next_deadline() is None


def test_multi_packet_send_into_one_recv() -> None:
    w = Wire(pmtu=256)
    rx = w.mb.region(1000)
    w.b.post_recv(1, rx.sge(0, 1000))
    msg = bytes(range(250)) * 4
    w.a.post(wr(Op.SEND, 1, data=msg))
    w.run()
    assert w.ops("ab") == [Opcode.SEND_FIRST, Opcode.SEND_MIDDLE, Opcode.SEND_MIDDLE, Opcode.SEND_LAST]
    assert rx.read(0, 1000) == msg and w.wcs["b"][0].byte_len == 1000 and w.wcs["a"][0].ok
    mem = w.mb.region(1024)
    w.b.post_recv(2, rx.sge(0, 1000))
    w.b.post_recv(3, None)
    w.a.post(wr(Op.SEND, 2, data=msg[:600], imm=b"\x01\x02\x03\x04"))
    w.a.post(wr(Op.RDMA_WRITE, 3, data=msg[:600], stag=mem.stag, to=mem.to(0), imm=b"\x05\x06\x07\x08"))
    w.run()
    assert w.ops("ab")[4:] == [Opcode.SEND_FIRST, Opcode.SEND_MIDDLE, Opcode.SEND_LAST_IMM, Opcode.WRITE_FIRST,
                               Opcode.WRITE_MIDDLE, Opcode.WRITE_LAST_IMM]
    assert [(c.wr_id, c.op, c.byte_len, c.imm) for c in w.wcs["b"][1:]] == [
        (2, Op.RECV, 600, b"\x01\x02\x03\x04"), (3, Op.RECV_RDMA_WITH_IMM, 600, b"\x05\x06\x07\x08")]
    assert mem.read(0, 600) == msg[:600] and [c.wr_id for c in w.wcs["a"]] == [1, 2, 3]


def test_lost_packet_recovers_by_go_back_n() -> None:
    w = Wire(drop=lambda d, i, p: d == "ab" and i == 1)  # the first WRITE Middle
    mem = w.mb.region(4096)
    data = bytes(range(256)) * 16
    w.a.post(wr(Op.RDMA_WRITE, 1, data=data, stag=mem.stag, to=mem.to(0)))
    w.run()
    assert w.wcs["a"][0].ok and mem.read(0, 4096) == data
    naks = [p for p in w.sent["ba"] if p.aeth and p.aeth.kind is AethType.NAK]
    assert len(naks) == 1 and naks[0].aeth is not None and naks[0].aeth.value == NakCode.PSN_SEQUENCE_ERROR
    assert naks[0].bth.psn == (A.psn + 1) & 0xFFFFFF  # carries the ePSN
    assert w.ops("ab") == [Opcode.WRITE_FIRST, Opcode.WRITE_MIDDLE, Opcode.WRITE_MIDDLE, Opcode.WRITE_LAST,
                           Opcode.WRITE_MIDDLE, Opcode.WRITE_MIDDLE, Opcode.WRITE_LAST]
    assert w.now == 0.0  # the NAK, not the timer, recovered


def test_a_long_write_through_a_lossy_receiver_completes_by_partial_progress() -> None:
    """Every fifth packet lost: each go-back-N round of a 40-packet Write gets four or five packets further, about
    nine rounds with retry_count 3. A NAK's implied ACK inside the one message is progress, which reloads the retry
    count (once RETRY_EXC_ERR after three rounds: a 2 MiB KV block through a receive queue that overflowed)."""
    w = Wire(drop=lambda d, i, p: d == "ab" and i % 5 == 4, pmtu=256, retry_count=3)
    mem = w.mb.region(40 * 256)
    data = bytes(range(256)) * 40
    w.a.post(wr(Op.RDMA_WRITE, 1, data=data, stag=mem.stag, to=mem.to(0)))
    w.run()
    assert [(c.wr_id, c.status) for c in w.wcs["a"]] == [(1, Status.SUCCESS)] and mem.read(0, len(data)) == data
    naks = [p for p in w.sent["ba"] if p.aeth and p.aeth.kind is AethType.NAK]
    assert len(naks) > 3  # more rounds than the retry count


def test_lost_read_response_recovers_on_timeout() -> None:
    w = Wire(drop=lambda d, i, p: d == "ba" and i == 1, pmtu=256)  # the second READ response
    mem = w.mb.region(1024)
    mem.write(0, bytes(range(256)) * 4)
    dst = w.ma.region(1024)
    w.a.post(wr(Op.RDMA_READ, 1, dst=dst.sge(0, 1024), stag=mem.stag, to=mem.to(0)))
    w.run()
    assert w.wcs["a"][0].ok and dst.read(0, 1024) == mem.read(0, 1024)
    again = [p for p in w.sent["ab"] if p.opcode is Opcode.READ_REQUEST][1]
    assert again.reth == Reth(mem.to(256), mem.stag, 768)  # resumed at the first missing response
    assert w.now == pytest.approx(0.134)


def test_everything_lost_is_retry_exc_err_in_bounded_time() -> None:
    w = Wire(drop=lambda d, i, p: d == "ab", retry_count=3, ack_timeout_s=0.01)
    mem = w.mb.region(64)
    w.a.post(wr(Op.RDMA_WRITE, 1, data=b"x" * 8, stag=mem.stag, to=mem.to(0)))
    w.a.post(wr(Op.SEND, 2, data=b"y", signaled=False))
    w.b.post_recv(5, None)
    w.run(max_time=1.0)
    assert [(c.wr_id, c.status) for c in w.wcs["a"]] == [(1, Status.RETRY_EXC_ERR), (2, Status.WR_FLUSH_ERR)]
    assert w.wcs["a"][0].terminate is not None and "retry count 3" in w.wcs["a"][0].terminate.reason
    assert len(w.sent["ab"]) == 2 * 4 and w.now == pytest.approx(0.04)
    assert w.a.state is ConnState.ERROR and w.a.next_deadline() is None


def test_duplicate_atomic_executes_once() -> None:
    w = Wire(drop=lambda d, i, p: d == "ba" and i == 0)  # the Atomic ACK
    mem = w.mb.region(64)
    dst = w.ma.region(16)
    mem.write_u64(8, 5)
    w.a.post(wr(Op.FETCH_ADD, 1, dst=dst.sge(0, 8), stag=mem.stag, to=mem.to(8), add=1 << 32))
    w.run()
    assert w.wcs["a"][0].ok and dst.read_u64(0) == 5 and mem.read_u64(8) == 5 + (1 << 32)
    assert w.ops("ab") == [Opcode.FETCH_ADD, Opcode.FETCH_ADD]
    assert w.ops("ba") == [Opcode.ATOMIC_ACKNOWLEDGE, Opcode.ATOMIC_ACKNOWLEDGE]
    assert w.mb.kinds().count("fetch_add") == 1


def test_duplicate_send_is_reacked_not_redelivered() -> None:
    w = Wire(drop=lambda d, i, p: d == "ba" and i == 0)  # the ACK
    rx = w.mb.region(64)
    w.b.post_recv(1, rx.sge(0, 64))
    w.b.post_recv(2, rx.sge(0, 64))
    w.a.post(wr(Op.SEND, 1, data=b"once"))
    w.run()
    assert w.wcs["a"][0].ok and [c.wr_id for c in w.wcs["b"]] == [1]
    assert w.ops("ba") == [Opcode.ACKNOWLEDGE, Opcode.ACKNOWLEDGE]


def test_acks_coalesce_and_a_delayed_ack_goes_out_by_its_deadline() -> None:
    """Requests that arrive together get one ACK of the newest PSN (rdma-bindings §4.6, coalesced ACKs); with
    ack_delay_s it waits that long for more, and a lost coalesced ACK is recovered by go-back-N as any ACK."""
    for delay in (0.0, 0.002):
        w = Wire(ack_delay_s=delay)
        rx = w.mb.region(64)
        for i in range(3):
            w.b.post_recv(i, rx.sge(i * 16, 16))
            w.a.post(wr(Op.SEND, i, data=b"s%d" % i))
        w.run()
        assert [(c.wr_id, c.ok) for c in w.wcs["a"]] == [(0, True), (1, True), (2, True)]
        assert w.ops("ba") == [Opcode.ACKNOWLEDGE] and w.sent["ba"][0].bth.psn == w.sent["ab"][-1].bth.psn
        assert w.sent["ba"][0].aeth is not None and w.sent["ba"][0].aeth.msn == 3
        assert w.now == delay  # (fake time moves only to a deadline: the delayed ACK's)
    w = Wire(drop=lambda d, i, p: d == "ba" and i == 0, ack_delay_s=0.002)  # the coalesced ACK lost
    rx = w.mb.region(64)
    for i in range(2):
        w.b.post_recv(i, rx.sge(i * 16, 16))
        w.a.post(wr(Op.SEND, i, data=b"once"))
    w.run()
    assert [c.ok for c in w.wcs["a"]] == [True, True] and [c.wr_id for c in w.wcs["b"]] == [0, 1]
    assert w.ops("ab") == [Opcode.SEND_ONLY] * 4 and w.ops("ba") == [Opcode.ACKNOWLEDGE] * 2


def test_a_read_response_or_atomic_ack_stands_for_a_delayed_ack() -> None:
    """READ responses and Atomic ACKs are implicit ACKs (rdma-bindings §4.6): a delayed ACK they cover is not
    sent, and the requests before them complete."""
    w = Wire(ack_delay_s=0.002)
    mem = w.mb.region(64)
    dst = w.ma.region(64)
    w.b.post_recv(1, w.mb.region(16).sge(0, 16))
    w.a.post(wr(Op.SEND, 1, data=b"req"))
    w.a.post(wr(Op.RDMA_WRITE, 2, data=b"w" * 8, stag=mem.stag, to=mem.to(0)))
    w.a.post(wr(Op.RDMA_READ, 3, dst=dst.sge(0, 8), stag=mem.stag, to=mem.to(0)))
    w.a.post(wr(Op.RDMA_WRITE, 4, data=b"x" * 8, stag=mem.stag, to=mem.to(16)))
    w.a.post(wr(Op.FETCH_ADD, 5, dst=dst.sge(32, 8), stag=mem.stag, to=mem.to(40), add=1))
    w.run()
    assert [(c.wr_id, c.ok) for c in w.wcs["a"]] == [(1, True), (2, True), (3, True), (4, True), (5, True)]
    assert w.ops("ba") == [Opcode.READ_RESPONSE_ONLY, Opcode.ATOMIC_ACKNOWLEDGE]
    assert dst.read(0, 8) == b"w" * 8 and w.now == 0.0


def test_psn_gap_naks_once() -> None:
    w = Wire(drop=lambda d, i, p: d == "ab" and i == 0, pmtu=256)
    mem = w.mb.region(2048)
    w.a.post(wr(Op.RDMA_WRITE, 1, data=b"z" * 2048, stag=mem.stag, to=mem.to(0)))
    w.run()
    naks = [p for p in w.sent["ba"] if p.aeth and p.aeth.kind is AethType.NAK]
    assert len(naks) == 1 and naks[0].bth.psn == A.psn  # 7 packets ahead of the ePSN, one NAK
    assert w.wcs["a"][0].ok and mem.read(0, 2048) == b"z" * 2048


@pytest.mark.parametrize(("case", "status", "syndrome"), [
    ("write-bad-stag", Status.REM_ACCESS_ERR, 0x62),
    ("read-no-right", Status.REM_ACCESS_ERR, 0x62),
    ("atomic-misaligned", Status.REM_INV_REQ_ERR, 0x61),
    ("send-too-long", Status.REM_INV_REQ_ERR, 0x61),
    ("invalidate-plain-mr", Status.REM_OP_ERR, 0x63),
])
def test_remote_errors_nak_and_flush_both_sides(case: str, status: Status, syndrome: int) -> None:
    w = Wire()
    mem = w.mb.region(64)
    ro = w.mb.region(64, Access.REMOTE_WRITE)
    rx = w.mb.region(64)
    dst = w.ma.region(64)
    w.b.post_recv(1, rx.sge(0, 4))
    w.b.post_recv(2, rx.sge(0, 4))
    w.a.post(wr(Op.SEND, 5, data=b"ok"))
    culprit = {
        "write-bad-stag": wr(Op.RDMA_WRITE, 6, data=b"x", stag=0xBAD, to=0),
        "read-no-right": wr(Op.RDMA_READ, 6, dst=dst.sge(0, 8), stag=ro.stag, to=ro.to(0)),
        "atomic-misaligned": wr(Op.FETCH_ADD, 6, dst=dst.sge(0, 8), stag=mem.stag, to=mem.to(4), add=1),
        "send-too-long": wr(Op.SEND, 6, data=b"too long"),
        "invalidate-plain-mr": wr(Op.SEND, 6, data=b"i", invalidate=mem.stag),
    }[case]
    w.a.post(culprit)
    w.a.post(wr(Op.SEND, 7, data=b"later"))
    w.run()
    assert [(c.wr_id, c.status) for c in w.wcs["a"]] == [(5, Status.SUCCESS), (6, status), (7, Status.WR_FLUSH_ERR)]
    term = w.wcs["a"][1].terminate
    assert term is not None and term.layer is Layer.RDMAP and f"{syndrome:#04x}" in term.reason
    assert w.sent["ba"][-1].aeth == Aeth(syndrome, 1)
    assert w.a.state is ConnState.ERROR and w.b.state is ConnState.ERROR
    assert w.b.terminate is not None and w.b.terminate.sender == "b" and "terminate" in w.mb.kinds()
    b = [(c.wr_id, c.status) for c in w.wcs["b"]]
    if case == "send-too-long":
        assert b == [(1, Status.SUCCESS), (2, Status.LOC_LEN_ERR)]
    else:
        assert b == [(1, Status.SUCCESS), (2, Status.WR_FLUSH_ERR)]
    if case == "read-no-right":
        assert w.b.terminate.etype == RdmapEType.REMOTE_PROTECTION and "access rights" in w.b.terminate.reason


def test_send_without_recv_is_rnr_then_rnr_retry_exc_err() -> None:
    w = Wire(rnr_retry=2)
    w.a.post(wr(Op.SEND, 1, data=b"nobody"))
    w.a.post(wr(Op.SEND, 2, data=b"behind"))
    w.run(max_time=1.0)
    assert [(c.wr_id, c.status) for c in w.wcs["a"]] == [(1, Status.RNR_RETRY_EXC_ERR), (2, Status.WR_FLUSH_ERR)]
    rnrs = [p for p in w.sent["ba"] if p.aeth and p.aeth.kind is AethType.RNR_NAK]
    assert len(rnrs) == 3 and w.now == pytest.approx(2 * 1.28e-3)
    assert not [p for p in w.sent["ba"] if p.aeth and p.aeth.kind is AethType.NAK]  # no PSN NAK for the one behind


def test_rnr_then_recv_posted_succeeds() -> None:
    w = Wire()
    rx = w.mb.region(16)
    w.a.post(wr(Op.SEND, 1, data=b"wait"))
    for raw in w.a.take_output():
        w.b.receive(raw, 0.0)
    assert Packet.decode(w.b.take_output()[0][:-4]).aeth == Aeth.rnr_nak(0, 14)
    w.b.post_recv(9, rx.sge(0, 16))
    w.run()
    assert w.wcs["a"][0].ok and rx.read(0, 4) == b"wait" and w.wcs["b"][0].wr_id == 9


def _raw(bth: Bth, src: QpInfo = A, dst: QpInfo = B) -> bytes:
    return append_icrc(src.ip, src.port, dst.ip, dst.port, Packet(bth, payload=b"hi").encode())


def test_bad_icrc_pkey_qpn_are_dropped_and_counted() -> None:
    w = Wire()
    rx = w.mb.region(16)
    w.b.post_recv(1, rx.sge(0, 16))
    good = _raw(Bth(Opcode.SEND_ONLY, B.qpn, A.psn, ack_req=True))
    w.b.receive(good[:-1] + bytes([good[-1] ^ 1]), 0.0)
    w.b.receive(_raw(Bth(Opcode.SEND_ONLY, B.qpn, A.psn, p_key=0x7FFF)), 0.0)
    w.b.receive(_raw(Bth(Opcode.SEND_ONLY, 0x33, A.psn)), 0.0)
    w.b.receive(_raw(Bth(Opcode.SEND_ONLY, B.qpn, A.psn), src=QpInfo(A.qpn, A.psn, "127.0.0.9", A.port)), 0.0)
    assert (w.b.dropped_icrc, w.b.dropped_pkey, w.b.dropped_qpn) == (2, 1, 1)
    assert w.b.take_output() == [] and w.b.take_completions() == []
    w.b.receive(good, 0.0)
    assert [c.wr_id for c in w.b.take_completions()] == [1] and len(w.b.take_output()) == 1


def test_malformed_request_is_invalid_request_nak() -> None:
    w = Wire()
    w.b.receive(_raw(Bth(Opcode.WRITE_MIDDLE, B.qpn, A.psn)), 0.0)  # no First before it
    out = [Packet.decode(r[:-4]) for r in w.b.take_output()]
    assert out[0].aeth == Aeth.nak(0, NakCode.INVALID_REQUEST) and w.b.state is ConnState.ERROR


def test_disconnect_and_transport_closed_flush() -> None:
    w = Wire(drop=lambda d, i, p: True)
    w.a.post(wr(Op.SEND, 1, data=b"a", signaled=False))
    w.a.post_recv(3, None)
    w.a.disconnect()
    assert [(c.wr_id, c.op, c.status) for c in w.a.take_completions()] == [
        (1, Op.SEND, Status.WR_FLUSH_ERR), (3, Op.RECV, Status.WR_FLUSH_ERR)]
    assert w.a.state is ConnState.CLOSED
    w.a.post(wr(Op.SEND, 2, data=b"b"))
    assert [c.status for c in w.a.take_completions()] == [Status.WR_FLUSH_ERR]
    w.b.transport_closed()
    assert w.b.state is ConnState.CLOSED
    w2 = Wire(drop=lambda d, i, p: True)
    w2.a.post(wr(Op.SEND, 1, data=b"a"))
    w2.a.transport_closed()
    assert w2.a.state is ConnState.ERROR and w2.a.take_completions()[0].status is Status.WR_FLUSH_ERR


def test_masked_fetch_add_when_both_ends_agree() -> None:
    w = Wire(masked_atomics=True)
    mem = w.mb.region(16)
    dst = w.ma.region(16)
    mem.write_u64(0, 0x0000000300000030)
    w.a.post(wr(Op.FETCH_ADD, 1, dst=dst.sge(0, 8), stag=mem.stag, to=mem.to(0), add=0x0000000100000010,
                mask=0x8000000080000020))
    w.a.post(wr(Op.COMP_SWAP, 2, dst=dst.sge(8, 8), stag=mem.stag, to=mem.to(8), compare=0, swap=0xFF,
                swap_mask=0x0F, compare_mask=0))
    w.run()
    assert mem.read_u64(0) == 0x0000000400000000  # the carry out of bit 5 is dropped (§1.4)
    assert mem.read_u64(8) == 0x0F and dst.read_u64(0) == 0x0000000300000030
    plain = Wire()
    with pytest.raises(Exception, match="masked_atomics"):
        plain.a.post(wr(Op.FETCH_ADD, 1, dst=dst.sge(0, 8), stag=1, to=0, add=1, mask=1))


# ---- out-of-band exchange ----------------------------------------------------------------------------------


def test_oob_round_trip_and_errors() -> None:
    info = QpInfo(qpn=0x123456, psn=0xABCDEF, ip="192.0.2.1", port=4791)
    raw = oob.encode(info)
    assert raw.hex() == "001a" "01" "00" "123456" "abcdef" "12b7" "00000000000000000000ffffc0000201"
    assert oob.decode(raw + b"extra") == (info, len(raw))
    assert oob.decode(raw[:-1]) is None and oob.decode(b"\x00") is None
    six = QpInfo(qpn=2, psn=0, ip="2001:db8::7", port=1, rkey=0xDEADBEEF, va=0x7F0000001000)
    assert oob.decode(oob.encode(six)) == (six, 2 + 38)
    with pytest.raises(oob.OobError, match="Version 2"):
        oob.decode(raw[:2] + b"\x02" + raw[3:])
    with pytest.raises(oob.OobError, match="QPN 0x1"):
        oob.decode(raw[:4] + b"\x00\x00\x01" + raw[7:])
    with pytest.raises(oob.OobError, match="Length 3"):
        oob.decode(b"\x00\x03abc")
    with pytest.raises(oob.OobError, match="Flags 0x01"):
        oob.decode(raw[:3] + b"\x01" + raw[4:])
    with pytest.raises(ValueError, match="qpn"):
        QpInfo(qpn=1, psn=0, ip="127.0.0.1")


def test_ack_timer_is_armed_from_the_next_real_time_after_post() -> None:
    w = Wire()
    mem = w.mb.region(64)
    w.a.poll_timers(10.0)
    w.a.post(wr(Op.RDMA_WRITE, 1, data=b"late", stag=mem.stag, to=mem.to(0)))  # post() sees no clock
    assert len(w.a.take_output()) == 1 and w.a.next_deadline() == 10.0
    w.a.poll_timers(50.0)  # the fabric's next call: the real time, long after the last one
    assert w.a.take_output() == [] and w.a.next_deadline() == pytest.approx(50.134)


def test_fence_and_max_rd_atomic_hold_requests_back() -> None:
    w = Wire(max_rd_atomic=1)
    mem = w.mb.region(64)
    dst = w.ma.region(64)
    w.a.post(wr(Op.RDMA_READ, 1, dst=dst.sge(0, 8), stag=mem.stag, to=mem.to(0)))
    w.a.post(wr(Op.FETCH_ADD, 2, dst=dst.sge(8, 8), stag=mem.stag, to=mem.to(8), add=1))
    w.a.post(wr(Op.RDMA_WRITE, 3, data=b"f", stag=mem.stag, to=mem.to(16), fence=True))
    w.run()
    assert [c.wr_id for c in w.wcs["a"]] == [1, 2, 3] and mem.read(16, 1) == b"f"
    # one Read/atomic at a time, and the fenced Write only after both answers
    assert [(d, p.opcode) for d, p in w.order] == [
        ("ab", Opcode.READ_REQUEST), ("ba", Opcode.READ_RESPONSE_ONLY), ("ab", Opcode.FETCH_ADD),
        ("ba", Opcode.ATOMIC_ACKNOWLEDGE), ("ab", Opcode.WRITE_ONLY), ("ba", Opcode.ACKNOWLEDGE)]
