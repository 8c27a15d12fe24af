"""RoCEv2 on an Ethernet segment (kvconform.rdma.roce.ethernet): the userspace host on the testbed VM's NIC.

scapy is the independent oracle: it builds the frames a peer (rxe, the VM's kernel) sends and dissects the
ones the host sends, so ARP, IPv4 and UDP are checked against a codec the project did not write. The ICRC over
a header with a nonzero IPv4 Identification (rxe numbers its packets) is checked against scapy.contrib.roce.
"""

from __future__ import annotations

import re
import selectors
import socket

import pytest
from scapy.all import ARP, IP, UDP, Ether, Raw, load_contrib

from kvconform.rdma.roce.ethernet import (
    BROADCAST,
    EthernetHost,
    LinkError,
    LinkSpec,
    QemuSocketLink,
    mac_for,
)
from kvconform.rdma.roce.headers import Bth, Opcode, Packet
from kvconform.rdma.roce.icrc import check_icrc, icrc

HOST_IP, PEER_IP = "10.78.0.1", "10.78.0.2"
PEER_MAC = "52:54:00:4b:00:02"


def _mac(raw: bytes) -> str:
    return ":".join(f"{b:02x}" for b in raw)


def _resolved(host: EthernetHost) -> None:
    """The peer asked for the host's address: the host answers and learns the peer."""
    host.frame_in(bytes(Ether(dst="ff:ff:ff:ff:ff:ff", src=PEER_MAC) /
                        ARP(op=1, hwsrc=PEER_MAC, psrc=PEER_IP, pdst=HOST_IP)))


def test_answers_arp_for_its_address_only() -> None:
    host = EthernetHost(HOST_IP)
    _resolved(host)
    (frame,) = host.take_frames()
    reply = Ether(frame)
    assert reply.dst == PEER_MAC and reply.src == _mac(mac_for(HOST_IP))
    assert (reply[ARP].op, reply[ARP].psrc, reply[ARP].hwsrc) == (2, HOST_IP, _mac(host.mac))
    assert (reply[ARP].pdst, reply[ARP].hwdst) == (PEER_IP, PEER_MAC)
    assert len(frame) == 60  # padded to Ethernet's minimum
    host.frame_in(bytes(Ether(dst="ff:ff:ff:ff:ff:ff", src=PEER_MAC) /
                        ARP(op=1, hwsrc=PEER_MAC, psrc=PEER_IP, pdst="10.78.0.9")))
    assert host.take_frames() == []


def test_a_datagram_waits_for_arp_then_leaves_as_a_roce_sender_builds_it() -> None:
    host = EthernetHost(HOST_IP)
    host.send(b"payload-1", 4791, (PEER_IP, 4791))
    (ask,) = host.take_frames()
    ask_arp = Ether(ask)
    assert ask_arp.dst == "ff:ff:ff:ff:ff:ff" and (ask_arp[ARP].op, ask_arp[ARP].pdst) == (1, PEER_IP)
    host.send(b"payload-2", 4791, (PEER_IP, 4791))
    assert host.take_frames() == []  # held: one ARP request per burst
    host.frame_in(bytes(Ether(dst=_mac(host.mac), src=PEER_MAC) /
                        ARP(op=2, hwsrc=PEER_MAC, psrc=PEER_IP, hwdst=_mac(host.mac), pdst=HOST_IP)))
    sent = [Ether(f) for f in host.take_frames()]
    assert [f[Raw].load for f in sent] == [b"payload-1", b"payload-2"]
    ip = sent[0][IP]
    assert (ip.src, ip.dst, ip.id, str(ip.flags), ip.ttl, ip.ihl) == (HOST_IP, PEER_IP, 0, "DF", 64, 5)
    rebuilt = IP(bytes(ip))  # the header checksum as scapy computes it
    del rebuilt.chksum
    assert IP(bytes(rebuilt)).chksum == ip.chksum
    assert (sent[0][UDP].sport, sent[0][UDP].dport, sent[0][UDP].chksum) == (4791, 4791, 0)
    assert sent[0].dst == PEER_MAC


def test_a_retransmitting_sender_asks_again() -> None:
    host = EthernetHost(HOST_IP)
    asks = 0
    for n in range(17):
        host.send(b"x%d" % n, 4791, (PEER_IP, 4791))
        asks += sum(1 for f in host.take_frames() if Ether(f).haslayer(ARP))
    assert asks == 3  # the 1st, 9th and 17th held packet


def test_a_lost_arp_reply_costs_a_retransmission_not_the_connection() -> None:
    """RC retransmits a held packet every 134 ms, 1 + 7 sends: each must ask again, so one lost ARP reply (tc
    netem's 1 % loss on the VM's NIC) does not exhaust the retry count (docs/interop-rdma.md, under netem)."""
    host = EthernetHost(HOST_IP)
    host.send(b"hello", 4791, (PEER_IP, 4791), now=0.0)
    host.send(b"more", 4791, (PEER_IP, 4791), now=0.001)  # a burst asks once
    assert sum(1 for f in host.take_frames() if Ether(f).haslayer(ARP)) == 1
    asked = []
    for n in range(1, 8):  # the HELLO's 7 retransmissions at the ACK timeout, the first reply lost
        host.send(b"hello", 4791, (PEER_IP, 4791), now=n * 0.134)
        asked += [n for f in host.take_frames() if Ether(f).haslayer(ARP)]
    assert asked == list(range(1, 8))
    host.frame_in(bytes(Ether(dst=_mac(host.mac), src=PEER_MAC) /
                        ARP(op=2, hwsrc=PEER_MAC, psrc=PEER_IP, hwdst=_mac(host.mac), pdst=HOST_IP)))
    assert len(host.take_frames()) == 9  # everything held leaves once the reply comes


def test_takes_udp_for_its_address_with_the_sender_and_ip_identification() -> None:
    host = EthernetHost(HOST_IP)
    frame = bytes(Ether(dst=_mac(host.mac), src=PEER_MAC) /
                  IP(src=PEER_IP, dst=HOST_IP, id=0xF626, flags="DF", ttl=64) /
                  UDP(sport=0xC10E, dport=4791, chksum=0) / Raw(b"rocev2 packet"))
    (d,) = host.frame_in(frame)
    assert (d.payload, d.src, d.dst, d.ip_ident) == (b"rocev2 packet", (PEER_IP, 0xC10E), (HOST_IP, 4791), 0xF626)
    assert host.dropped == 0


@pytest.mark.parametrize(("frame", "dropped"), [
    (Ether(dst="02:00:0a:4e:00:07", src=PEER_MAC) / IP(src=PEER_IP, dst=HOST_IP) / UDP(dport=4791), 0),
    (Ether(dst=BROADCAST, src=PEER_MAC, type=0x86DD) / Raw(b"\0" * 40), 1),
    (Ether(src=PEER_MAC) / IP(src=PEER_IP, dst=HOST_IP, flags="MF") / UDP(dport=4791), 1),
    (Ether(src=PEER_MAC) / IP(src=PEER_IP, dst=HOST_IP, options=b"\x01\x01\x01\x00") / UDP(dport=4791), 1),
    (Ether(src=PEER_MAC) / IP(src=PEER_IP, dst=HOST_IP, proto=6) / Raw(b"\0" * 20), 1),
    (Ether(src=PEER_MAC) / IP(src=PEER_IP, dst="10.78.0.9") / UDP(dport=4791), 1),
], ids=["another-mac", "ipv6", "fragment", "ip-options", "tcp", "another-address"])
def test_drops_what_is_not_a_udp_datagram_for_it(frame: Ether, dropped: int) -> None:
    host = EthernetHost(HOST_IP)
    if frame.dst != "02:00:0a:4e:00:07":
        frame.dst = _mac(host.mac)
    assert host.frame_in(bytes(frame)) == []
    assert host.dropped == dropped
    if dropped:  # cut short, it is dropped too
        assert host.frame_in(bytes(frame)[:20]) == [] and host.dropped == 2


def test_icrc_covers_the_ip_identification_as_scapy_computes_it() -> None:
    load_contrib("roce")
    from scapy.contrib.roce import BTH

    body = Packet(Bth(Opcode.SEND_ONLY, 0x11, 0x100, ack_req=True), payload=b"kbtp hello!!").encode()
    wire = bytes(IP(src=PEER_IP, dst=HOST_IP, id=0xF626, flags="DF", ttl=64) / UDP(sport=0xC10E, dport=4791, chksum=0)
                 / BTH(opcode=4, dqpn=0x11, ackreq=1, psn=0x100, padcount=body[1] >> 4 & 3) / Raw(body[12:]))
    payload = wire[28:]
    assert payload[-4:] == icrc(PEER_IP, 0xC10E, HOST_IP, 4791, body, 0xF626)
    assert check_icrc(PEER_IP, 0xC10E, HOST_IP, 4791, payload, 0xF626) == body
    assert check_icrc(PEER_IP, 0xC10E, HOST_IP, 4791, payload) is None  # read as ID 0, it is a bad ICRC


@pytest.mark.parametrize(("ether", "address", "names"), [
    ("127.0.0.1:1", "10.78.0.1", "LOCAL_HOST:PORT,PEER_HOST:PORT expected"),
    ("192.0.2.1:4000,127.0.0.1:4001", "10.78.0.1", "ether local '192.0.2.1:4000': a loopback HOST:PORT"),
    ("127.0.0.1:4000,127.0.0.1:x", "10.78.0.1", "ether peer '127.0.0.1:x'"),
    ("127.0.0.1:4000,127.0.0.1:4001", "127.0.0.5", "an address of the segment expected"),
    ("127.0.0.1:4000,127.0.0.1:4001", "fe80::1", "an IPv4 address expected"),
])
def test_link_spec_errors_name_the_field(ether: str, address: str, names: str) -> None:
    with pytest.raises(LinkError, match=names):
        LinkSpec.parse(ether, address)


def test_two_links_back_to_back_resolve_and_carry_datagrams() -> None:
    """Two hosts whose sockets point at each other, as the harness's link and qemu's socket netdev do."""
    ports = [_free_udp_port(), _free_udp_port()]
    a = QemuSocketLink(LinkSpec.parse(f"127.0.0.1:{ports[0]},127.0.0.1:{ports[1]}", HOST_IP))
    b = QemuSocketLink(LinkSpec.parse(f"127.0.0.1:{ports[1]},127.0.0.1:{ports[0]}", PEER_IP))
    try:
        assert a.getsockname() == (HOST_IP, 4791)
        a.sendto(b"over the segment", (PEER_IP, 4791))
        got = _receive(b, a)
        assert got == (b"over the segment", (HOST_IP, 4791, 0))
        b.sendto(b"and back", (HOST_IP, 4791))
        assert _receive(a, b) == (b"and back", (PEER_IP, 4791, 0))
        assert a.host.neighbours[PEER_IP] == b.host.mac and b.host.neighbours[HOST_IP] == a.host.mac
    finally:
        a.close()
        b.close()


def test_a_datagram_for_its_own_address_stays_off_the_segment() -> None:
    """The harness's own QPs on the link's address (its target and its own client, kbtp-initiator's second party)
    reach each other through the link's socket: qemu never sends a frame for this host back."""
    ports = [_free_udp_port(), _free_udp_port()]
    a = QemuSocketLink(LinkSpec.parse(f"127.0.0.1:{ports[0]},127.0.0.1:{ports[1]}", HOST_IP))
    segment = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        segment.bind(("127.0.0.1", ports[1]))
        segment.setblocking(False)
        a.sendto(b"to myself", (HOST_IP, 4791))
        with selectors.DefaultSelector() as sel:
            sel.register(a, selectors.EVENT_READ)
            assert sel.select(5.0), "the datagram for its own address never came back within 5 s"
        assert a.recvfrom(1 << 16) == (b"to myself", (HOST_IP, 4791, 0))
        with pytest.raises(BlockingIOError):  # nothing went to the segment, not even an ARP request
            segment.recv(1 << 16)
    finally:
        a.close()
        segment.close()


def _free_udp_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _receive(link: QemuSocketLink, other: QemuSocketLink) -> tuple[bytes, tuple[str, int, int]]:
    """Pump both links (ARP goes both ways) until ``link`` has a datagram; bounded."""
    with selectors.DefaultSelector() as sel:
        sel.register(link, selectors.EVENT_READ, link)
        sel.register(other, selectors.EVENT_READ, other)
        for _ in range(50):
            for key, _ev in sel.select(0.1):
                try:
                    got: tuple[bytes, tuple[str, int, int]] = key.data.recvfrom(1 << 16)
                except BlockingIOError:
                    continue
                if key.data is link:
                    return got
    raise AssertionError("no datagram within 5 s")


def test_a_roce_url_carries_the_link_and_says_it_back() -> None:
    from kvconform.targets.kbtp_wire import WireTargetDriver, target_from_url

    url = "kbtp+roce://127.0.0.1:18515?ether=127.0.0.1:47000,127.0.0.1:47001&address=10.78.0.1"
    d = target_from_url(url)
    assert isinstance(d, WireTargetDriver) and d.link == LinkSpec(("127.0.0.1", 47000), ("127.0.0.1", 47001),
                                                                  "10.78.0.1")
    assert repr(d) == url
    d = target_from_url("kbtp+iwarp://127.0.0.1:7471?rtr_delay_ms=100")
    assert isinstance(d, WireTargetDriver) and d.rtr_delay_ms == 100 and repr(d).endswith("?rtr_delay_ms=100")


@pytest.mark.parametrize(("url", "names"), [
    ("kbtp+iwarp://127.0.0.1:1?ether=127.0.0.1:2,127.0.0.1:3&address=10.78.0.1",
     "the only query of kbtp+iwarp is ?rtr_delay_ms=N"),
    ("kbtp+iwarp://127.0.0.1:1?rtr_delay_ms=soon", "the only query of kbtp+iwarp is ?rtr_delay_ms=N"),
    ("kbtp+roce://127.0.0.1:1?ether=127.0.0.1:2,127.0.0.1:3", "the only query of kbtp+roce is"),
    ("kbtp+roce://127.0.0.1:1?ether=127.0.0.1:2,127.0.0.1:3&address=10.78.0.1&mtu=9000", "the only query of kbtp+roce"),
    ("kbtp+roce://127.0.0.1:1?ether=10.0.0.1:2,127.0.0.1:3&address=10.78.0.1", "ether local '10.0.0.1:2'"),
])
def test_a_bad_link_in_a_url_is_refused_naming_what(url: str, names: str) -> None:
    from kvconform.targets.kbtp_wire import target_from_url
    from kvconform.verdicts import TargetUnavailable

    with pytest.raises(TargetUnavailable, match=re.escape(names)):
        target_from_url(url)


def test_serve_takes_the_link_only_with_roce(capsys: pytest.CaptureFixture[str]) -> None:
    from kvconform.components.kbtp import serve_kbtp_target

    assert serve_kbtp_target(["--binding", "iwarp", "--ether", "127.0.0.1:2,127.0.0.1:3",
                              "--ether-address", "10.78.0.1"]) == 2
    assert "--ether LOCAL,PEER and --ether-address IP go together, with --binding roce" in capsys.readouterr().err
    assert serve_kbtp_target(["--binding", "roce", "--ether", "127.0.0.1:2"]) == 2
    assert "go together" in capsys.readouterr().err


def test_a_receive_queue_smaller_than_asked_is_recorded_for_the_report(monkeypatch: pytest.MonkeyPatch) -> None:
    """Without CAP_NET_ADMIN (SO_RCVBUFFORCE refused: an option number the kernel does not know) the queue is
    SO_RCVBUF's, capped at net.core.rmem_max; when that is less than asked, the report's meta says so."""
    from kvconform.fixtures.kbtp import pytest_kvconform_report_meta
    from kvconform.rdma.roce import ethernet

    monkeypatch.setattr(ethernet, "SO_RCVBUFFORCE", 0x7FFF)
    monkeypatch.setattr(ethernet, "short_queues", [])
    monkeypatch.setattr("kvconform.fixtures.kbtp.short_queues", ethernet.short_queues)
    monkeypatch.setattr(ethernet, "RECEIVE_BUFFER", 1 << 30)  # more than rmem_max anywhere tests run
    with ethernet.datagram_socket() as sock:
        got = sock.getsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF) // 2
    assert ethernet.short_queues == [got]

    class Config:
        def getoption(self, name: str, default: object = None) -> object:
            return default

    meta = pytest_kvconform_report_meta(Config(), None)  # type: ignore[arg-type]
    assert meta is not None and meta["roce_receive_queue"].startswith(f"{got} octets, not the ")
