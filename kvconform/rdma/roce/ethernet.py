"""RoCEv2 on an Ethernet segment the harness reaches as raw frames (rdma-bindings §4.1, §5.4; rdma-vm-testbed).

The userspace RoCEv2 binding normally hands its packets to the host kernel as UDP payloads. To meet a kernel
RoCE device (rxe) or a NIC on a segment of its own, such as the testbed VM's NIC, whose Ethernet frames qemu's
socket netdev carries in UDP datagrams between two ports of 127.0.0.1, the harness has to be a host on that
segment: answer ARP for its address, resolve the peer's, and put Ethernet II, IPv4 and UDP around every RoCEv2
packet itself.

- `EthernetHost` is that host, sans-I/O: frames in, RoCEv2 payloads with their source address out, and the
  reverse.
- `QemuSocketLink` carries its frames over the loopback socket pair of a qemu ``-netdev socket,udp=...``. It
  offers the part of a UDP socket's interface the wire fabric uses (``sendto``, ``recvfrom``, ``fileno``,
  ``getsockname``), so the fabric runs unchanged over it.

The IPv4 header is built the way the RoCEv2 ICRC expects it, and the way rxe builds its own: DF set,
Identification 0, TTL 64, no options, UDP checksum 0. The ICRC covers these fields (`kvconform.rdma.roce.icrc`).
Addresses on the segment exist only inside the frames. On the host, the link's sockets are on loopback.
"""

from __future__ import annotations

import ipaddress
import socket
import struct
import time
from collections import deque
from dataclasses import dataclass

from kvconform.rdma.roce.icrc import ipv4_header
from kvconform.rdma.roce.qp import ROCE_UDP_PORT

ETH_IPV4, ETH_ARP = 0x0800, 0x0806
BROADCAST = b"\xff" * 6
ARP_REQUEST, ARP_REPLY = 1, 2
MAX_HELD = 256  # packets held for an address ARP has not resolved yet (RC retransmits what is dropped)
# A held packet asks again once this long has passed since the last request: below RC's ACK timeout (134 ms,
# kvconform.rdma.roce.engine), so each retransmission asks again and one lost ARP reply costs a retransmission,
# not the connection. Asking only every 8th held packet, a lost reply outlived RC's 1 + 7 sends: under tc netem's
# 1 % loss on the VM's NIC a check's connection failed "retry count 7 exceeded" (docs/interop-rdma.md, netem).
ARP_RETRY_S = 0.1
_ETH = struct.Struct(">6s6sH")
_ARP = struct.Struct(">HHBBH6s4s6s4s")
_UDP = struct.Struct(">HHHH")
_MIN_FRAME = 60  # Ethernet frames are padded to 60 octets before the FCS


class LinkError(ValueError):
    """A link specification that cannot be used: names the field, the value seen and the value expected."""


def mac_for(ip: str) -> bytes:
    """A locally administered unicast MAC derived from the host's address, so that every link a process opens
    for the same address answers to the MAC the peer's neighbour cache already holds."""
    return b"\x02\x00" + ipaddress.IPv4Address(ip).packed


def ethernet(dst: bytes, src: bytes, ethertype: int, payload: bytes) -> bytes:
    frame = _ETH.pack(dst, src, ethertype) + payload
    return frame + b"\0" * (_MIN_FRAME - len(frame)) if len(frame) < _MIN_FRAME else frame


@dataclass(frozen=True, slots=True)
class Datagram:
    """A UDP datagram to or from the host: payload, both addresses and its IPv4 Identification."""

    payload: bytes
    src: tuple[str, int]
    dst: tuple[str, int]
    ip_ident: int = 0


class EthernetHost:
    """An IPv4 host on one Ethernet segment, sans-I/O: ARP both ways, and IPv4/UDP around the RoCEv2 packets.

    ``frame_in`` takes a frame off the segment and returns the UDP datagrams it carried for this host;
    ``send`` queues a datagram (held until ARP resolves the next hop); ``take_frames`` returns what to put on
    the segment. Frames for other hosts, fragments, IP options and other protocols are dropped and counted.
    """

    def __init__(self, ip: str, mac: bytes | None = None) -> None:
        self.ip = str(ipaddress.IPv4Address(ip))
        self._ip = ipaddress.IPv4Address(ip).packed
        self.mac = mac or mac_for(ip)
        self.neighbours: dict[str, bytes] = {}
        self._held: dict[str, deque[bytes]] = {}
        self._asked: dict[str, float] = {}  # when each held address was last asked for (send's ``now``)
        self._out: list[bytes] = []
        self.dropped = 0

    # ---- what the segment brings ---------------------------------------------------------------------

    def frame_in(self, frame: bytes) -> list[Datagram]:
        if len(frame) < _ETH.size:
            self.dropped += 1
            return []
        dst, _src, ethertype = _ETH.unpack_from(frame)
        if dst not in (self.mac, BROADCAST):
            return []  # another host's
        if ethertype == ETH_ARP:
            self._arp(frame[_ETH.size:])
            return []
        if ethertype != ETH_IPV4:
            self.dropped += 1
            return []
        got = self._udp(frame[_ETH.size:])
        if got is None:
            self.dropped += 1
            return []
        return [got]

    def _arp(self, body: bytes) -> None:
        if len(body) < _ARP.size:
            self.dropped += 1
            return
        htype, ptype, hlen, plen, op, sha, spa, _tha, tpa = _ARP.unpack_from(body)
        if (htype, ptype, hlen, plen) != (1, ETH_IPV4, 6, 4):
            self.dropped += 1
            return
        sender = str(ipaddress.IPv4Address(spa))
        if tpa == self._ip or sender in self.neighbours:
            self._learn(sender, sha)
        if op == ARP_REQUEST and tpa == self._ip:
            reply = _ARP.pack(1, ETH_IPV4, 6, 4, ARP_REPLY, self.mac, self._ip, sha, spa)
            self._out.append(ethernet(sha, self.mac, ETH_ARP, reply))

    def _learn(self, ip: str, mac: bytes) -> None:
        self.neighbours[ip] = mac
        self._asked.pop(ip, None)
        for payload in self._held.pop(ip, ()):
            self._out.append(ethernet(mac, self.mac, ETH_IPV4, payload))

    def _udp(self, packet: bytes) -> Datagram | None:
        if len(packet) < 20 + _UDP.size or packet[0] != 0x45:
            return None  # not IPv4, or with options (a RoCEv2 sender puts none)
        total, ident, flags_frag, proto = struct.unpack_from(">HHHxB", packet, 2)
        if proto != 17 or flags_frag & 0x3FFF or packet[16:20] != self._ip or not 28 <= total <= len(packet):
            return None  # not UDP, a fragment, another address, or cut short
        sport, dport, length, _csum = _UDP.unpack_from(packet, 20)
        if length < _UDP.size or 20 + length > total:
            return None
        src = str(ipaddress.IPv4Address(packet[12:16]))
        return Datagram(bytes(packet[28:20 + length]), (src, sport), (self.ip, dport), ident)

    # ---- what the host sends -------------------------------------------------------------------------

    def send(self, payload: bytes, sport: int, dst: tuple[str, int], now: float | None = None) -> None:
        """Queue ``payload`` as a UDP datagram from ``sport`` to ``dst`` (ARP first when the MAC is unknown; with
        ``now``, a monotonic clock's seconds, again when ARP_RETRY_S passed since the last request)."""
        packet = ipv4_header(self.ip, dst[0], _UDP.size + len(payload)) + _UDP.pack(
            sport, dst[1], _UDP.size + len(payload), 0) + payload
        mac = self.neighbours.get(dst[0])
        if mac is not None:
            self._out.append(ethernet(mac, self.mac, ETH_IPV4, packet))
            return
        held = self._held.setdefault(dst[0], deque(maxlen=MAX_HELD))
        last = self._asked.get(dst[0])
        # the first packet asks, and a retransmitting sender asks again: after ARP_RETRY_S, or every 8th packet
        if len(held) % 8 == 0 or (now is not None and (last is None or now - last >= ARP_RETRY_S)):
            self._out.append(self.arp_request(dst[0]))
            if now is not None:
                self._asked[dst[0]] = now
        held.append(packet)

    def arp_request(self, ip: str) -> bytes:
        target = ipaddress.IPv4Address(ip).packed
        return ethernet(BROADCAST, self.mac, ETH_ARP,
                        _ARP.pack(1, ETH_IPV4, 6, 4, ARP_REQUEST, self.mac, self._ip, b"\0" * 6, target))

    def take_frames(self) -> list[bytes]:
        out, self._out = self._out, []
        return out


def _loopback(field: str, value: str) -> tuple[str, int]:
    host, _, port = value.rpartition(":")
    try:
        addr = ipaddress.ip_address(host)
    except ValueError:
        raise LinkError(f"{field} {value!r}: HOST:PORT with a loopback IP address expected") from None
    if not addr.is_loopback or not port.isdigit() or not 0 < int(port) < 1 << 16:
        raise LinkError(f"{field} {value!r}: a loopback HOST:PORT expected (the frames never leave this host)")
    return host, int(port)


@dataclass(frozen=True, slots=True)
class LinkSpec:
    """Where the segment's frames go: this end's loopback socket, the peer's (qemu's), and this host's address."""

    local: tuple[str, int]
    peer: tuple[str, int]
    address: str

    @classmethod
    def parse(cls, ether: str, address: str) -> LinkSpec:
        """``ether`` is ``LOCAL_HOST:PORT,PEER_HOST:PORT`` (both loopback), ``address`` an IPv4 address."""
        local, sep, peer = ether.partition(",")
        if not sep:
            raise LinkError(f"ether {ether!r}: LOCAL_HOST:PORT,PEER_HOST:PORT expected")
        try:
            ip = ipaddress.IPv4Address(address)
        except ValueError:
            raise LinkError(f"ether address {address!r}: an IPv4 address expected") from None
        if ip.is_loopback or ip.is_multicast or ip.is_unspecified:
            raise LinkError(f"ether address {address}: an address of the segment expected, not {address}")
        return cls(_loopback("ether local", local), _loopback("ether peer", peer), str(ip))

    def query(self) -> str:
        return f"ether={self.local[0]}:{self.local[1]},{self.peer[0]}:{self.peer[1]}&address={self.address}"


RECEIVE_BUFFER = 32 << 20  # octets of kernel receive queue a RoCEv2 datagram socket asks for (datagram_socket)
SO_RCVBUFFORCE = 33  # Linux <asm-generic/socket.h>; the socket module does not name it
short_queues: list[int] = []  # receive queues (octets) this process got smaller than asked: reports say so


def datagram_socket() -> socket.socket:
    """A UDP socket for RoCEv2 with a receive queue that holds a whole burst: the peer's 2 MiB Write or Read
    Response (a KV block) is some 2048 datagrams at PMTU 1024, which a NIC sends at line rate and a Python reader
    drains far slower. With the default queue (~200 KiB) most of the burst is dropped, and go-back-N resends it,
    to be dropped again. SO_RCVBUFFORCE needs CAP_NET_ADMIN; without it SO_RCVBUF is capped at net.core.rmem_max."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, SO_RCVBUFFORCE, RECEIVE_BUFFER)
    except OSError:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, RECEIVE_BUFFER)
    got = sock.getsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF) // 2  # Linux reports twice what it grants
    if got < RECEIVE_BUFFER and got not in short_queues:
        short_queues.append(got)
    return sock


class QemuSocketLink:
    """`EthernetHost` over a qemu socket netdev (``-netdev socket,udp=LOCAL,localaddr=PEER``): one frame per
    datagram, no framing. Looks like the wire fabric's UDP socket; ``recvfrom`` raises BlockingIOError when
    no datagram for this host is waiting (the frames it took meanwhile were ARP, or another host's)."""

    def __init__(self, spec: LinkSpec) -> None:
        self.spec = spec
        self.host = EthernetHost(spec.address)
        self.sock = datagram_socket()
        try:
            self.sock.bind(spec.local)
        except OSError as exc:
            self.sock.close()
            raise LinkError(f"ether local {spec.local[0]}:{spec.local[1]}: cannot bind: {exc}") from exc
        self.sock.setblocking(False)
        self._in: deque[Datagram] = deque()
        # the harness's own QPs on this address (a harness target and its own client) reach each other through
        # this socket, not the segment: qemu would never send a frame for this host back
        self.host.neighbours[self.host.ip] = self.host.mac

    def fileno(self) -> int:
        return self.sock.fileno()

    def getsockname(self) -> tuple[str, int]:
        return self.host.ip, ROCE_UDP_PORT

    def setblocking(self, flag: bool) -> None:
        """Always non-blocking (the fabric's selector decides when to read)."""

    def sendto(self, payload: bytes, dst: tuple[str, int]) -> int:
        self.host.send(payload, ROCE_UDP_PORT, dst, time.monotonic())
        self._flush()
        return len(payload)

    def recvfrom(self, size: int) -> tuple[bytes, tuple[str, int, int]]:
        """A datagram for this host and (address, port, IPv4 Identification) of its sender."""
        while not self._in:
            frame = self.sock.recv(1 << 16)  # BlockingIOError when nothing is left: the caller's end of batch
            self._in.extend(d for d in self.host.frame_in(frame) if d.dst[1] == ROCE_UDP_PORT)
            self._flush()
        d = self._in.popleft()
        return d.payload[:size], (d.src[0], d.src[1], d.ip_ident)

    def _flush(self) -> None:
        for frame in self.host.take_frames():
            try:
                self.sock.sendto(frame, self.spec.local if frame[:6] == self.host.mac else self.spec.peer)
            except (BlockingIOError, ConnectionRefusedError):
                continue  # qemu not there yet, or a full buffer: RC retransmits, ARP asks again

    def close(self) -> None:
        self.sock.close()
