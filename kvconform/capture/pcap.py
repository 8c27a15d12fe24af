"""pcap files: read tcpdump's stream, find a frame's ports, synthesise Ethernet/IP/TCP and UDP frames, write files.

Sans-I/O except ``write_pcap``. Frames are classic pcap, link type Ethernet (1), which is what ``tcpdump -i lo -y
EN10MB`` writes, so tcpdump's records and the harness's synthesised ones go into one file. A ``TcpFlow`` turns what
a relay saw of one TCP connection (bytes each way, a close, a reset) into the segments a capture of that connection
would hold (handshake, data with consistent sequence and acknowledgement numbers, FIN or RST), so Wireshark
reassembles the stream (HTTP/2, gRPC) as if it had been on the wire; scapy builds the headers and checksums.
"""

from __future__ import annotations

import ipaddress
import struct
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO, NamedTuple

__all__ = ["LINKTYPE_ETHERNET", "Datagram", "Frame", "PcapFormatError", "Segment", "TcpFlow", "datagram_frame",
           "frame_ports", "read_pcap", "read_pcap_stream", "segment_frame", "udp_payload", "write_pcap"]

LINKTYPE_ETHERNET = 1
SNAPLEN = 262144
MAGIC_US = 0xA1B2C3D4
MAGIC_NS = 0xA1B23C4D
# Payload per synthesised TCP segment: below the IPv4 limit of 65495, and what loopback's MTU allows.
MSS = 32768
_ETH_IPV4, _ETH_IPV6 = 0x0800, 0x86DD
_TCP, _UDP = 6, 17
_ISN_CLIENT, _ISN_SERVER = 0x1000_0000, 0x2000_0000


class PcapFormatError(ValueError):
    """A pcap stream that is not classic pcap of link type Ethernet."""


class Frame(NamedTuple):
    """One captured frame: wall-clock time (seconds since the epoch) and the Ethernet frame."""

    ts: float
    data: bytes


Address = tuple[str, int]


class Segment(NamedTuple):
    """One TCP segment of a ``TcpFlow``: addresses, flags ("S", "SA", "A", "PA", "FA", "RA"), numbers, payload."""

    src: Address
    dst: Address
    flags: str
    seq: int
    ack: int
    payload: bytes


class Datagram(NamedTuple):
    """One UDP datagram as a socket saw it."""

    src: Address
    dst: Address
    payload: bytes


# ------------------------------------------------------------------------------------------------ reading


def _header(head: bytes) -> tuple[str, float]:
    if len(head) < 24:
        raise PcapFormatError(f"pcap header: got {len(head)} bytes, expected 24")
    for order in ("<", ">"):
        magic, _, _, _, _, _, linktype = struct.unpack(order + "IHHiIII", head)
        if magic in (MAGIC_US, MAGIC_NS):
            if linktype != LINKTYPE_ETHERNET:
                raise PcapFormatError(f"pcap link type: got {linktype}, expected {LINKTYPE_ETHERNET} (Ethernet)")
            return order, 1e-6 if magic == MAGIC_US else 1e-9
    raise PcapFormatError(f"pcap magic: got {head[:4].hex()}, expected a1b2c3d4 or a1b23c4d (either order)")


def read_pcap_stream(stream: BinaryIO) -> Iterator[Frame]:
    """The frames of a classic pcap stream (a file or tcpdump's ``-w -``), as they arrive; stops at its end."""
    order, unit = _header(stream.read(24))
    record = struct.Struct(order + "IIII")
    while True:
        head = stream.read(16)
        if len(head) < 16:
            return
        sec, frac, caplen, _ = record.unpack(head)
        data = stream.read(caplen)
        if len(data) < caplen:
            return
        yield Frame(sec + frac * unit, data)


def read_pcap(path: str | Path) -> list[Frame]:
    """Every frame of a pcap file."""
    with open(path, "rb") as stream:
        return list(read_pcap_stream(stream))


def frame_ports(data: bytes) -> tuple[int, int, int] | None:
    """(IP protocol, source port, destination port) of a TCP or UDP frame over IPv4 or IPv6; None otherwise.

    IPv6 extension headers are not followed (loopback traffic carries none)."""
    if len(data) < 14:
        return None
    ethertype = int.from_bytes(data[12:14], "big")
    if ethertype == _ETH_IPV4 and len(data) >= 34:
        ihl = (data[14] & 0x0F) * 4
        proto, off = data[23], 14 + ihl
    elif ethertype == _ETH_IPV6 and len(data) >= 54:
        proto, off = data[20], 54
    else:
        return None
    if proto not in (_TCP, _UDP) or len(data) < off + 4:
        return None
    sport, dport = struct.unpack_from("!HH", data, off)
    return proto, sport, dport


def udp_payload(data: bytes) -> bytes | None:
    """The payload of a UDP frame (IPv4 or IPv6), None for anything else."""
    ports = frame_ports(data)
    if ports is None or ports[0] != _UDP:
        return None
    off = 14 + ((data[14] & 0x0F) * 4 if int.from_bytes(data[12:14], "big") == _ETH_IPV4 else 40)
    return data[off + 8:]


# ------------------------------------------------------------------------------------------------ writing


def write_pcap(path: str | Path, frames: Iterable[Frame]) -> int:
    """Write ``frames`` (in the order given) as a classic pcap file of link type Ethernet; returns the count."""
    count = 0
    with open(path, "wb") as out:
        out.write(struct.pack("<IHHiIII", MAGIC_US, 2, 4, 0, 0, SNAPLEN, LINKTYPE_ETHERNET))
        for ts, data in frames:
            sec = int(ts)
            usec = min(round((ts - sec) * 1e6), 999_999)
            caplen = min(len(data), SNAPLEN)
            out.write(struct.pack("<IIII", sec, usec, caplen, len(data)))
            out.write(data[:caplen])
            count += 1
    return count


def _ip_layer(src: str, dst: str) -> object:
    from scapy.layers.inet import IP  # lazy: scapy costs ~0.3 s of start-up; only reading a pcap needs it
    from scapy.layers.inet6 import IPv6

    if ipaddress.ip_address(src).version == 6:
        return IPv6(src=src, dst=dst)
    return IP(src=src, dst=dst)


def segment_frame(segment: Segment) -> bytes:
    """The Ethernet frame of a synthesised TCP segment (checksums computed by scapy)."""
    from scapy.layers.inet import TCP  # lazy: scapy costs ~0.3 s of start-up; only reading a pcap needs it
    from scapy.layers.l2 import Ether

    ip = _ip_layer(segment.src[0], segment.dst[0])
    tcp = TCP(sport=segment.src[1], dport=segment.dst[1], flags=segment.flags, seq=segment.seq,
              ack=segment.ack if "A" in segment.flags else 0, window=65535)
    return bytes(Ether() / ip / tcp / segment.payload)  # type: ignore[operator]


def datagram_frame(datagram: Datagram) -> bytes:
    """The Ethernet frame of a UDP datagram a harness socket sent or received."""
    from scapy.layers.inet import UDP  # lazy: scapy costs ~0.3 s of start-up; only reading a pcap needs it
    from scapy.layers.l2 import Ether

    ip = _ip_layer(datagram.src[0], datagram.dst[0])
    return bytes(Ether() / ip / UDP(sport=datagram.src[1], dport=datagram.dst[1]) / datagram.payload)  # type: ignore[operator]


# ---------------------------------------------------------------------------------------------- TCP flows


@dataclass
class TcpFlow:
    """The segments of one TCP connection between ``client`` and ``server`` as seen by a relay (sans-I/O).

    Each method returns the segments a capture would show for what happened; sequence numbers start at fixed
    ISNs (the real ones are not visible to a socket) and every data segment acknowledges all the peer sent."""

    client: Address
    server: Address
    _next: dict[bool, int] = field(default_factory=lambda: {True: _ISN_CLIENT, False: _ISN_SERVER})
    closed: dict[bool, bool] = field(default_factory=lambda: {True: False, False: False})

    def _ends(self, from_client: bool) -> tuple[Address, Address]:
        return (self.client, self.server) if from_client else (self.server, self.client)

    def _segment(self, from_client: bool, flags: str, payload: bytes = b"") -> Segment:
        src, dst = self._ends(from_client)
        return Segment(src, dst, flags, self._next[from_client], self._next[not from_client], payload)

    def open(self) -> list[Segment]:
        """The three-way handshake."""
        syn = Segment(self.client, self.server, "S", self._next[True], 0, b"")
        self._next[True] += 1
        syn_ack = self._segment(False, "SA")
        self._next[False] += 1
        return [syn, syn_ack, self._segment(True, "A")]

    def refused(self) -> list[Segment]:
        """A SYN answered by a reset: nothing listened at the server's address."""
        syn = Segment(self.client, self.server, "S", self._next[True], 0, b"")
        self._next[True] += 1
        return [syn, self._segment(False, "RA")]

    def data(self, from_client: bool, payload: bytes) -> list[Segment]:
        """``payload`` sent by one side, cut into segments of at most ``MSS`` bytes."""
        out = []
        for start in range(0, len(payload), MSS):
            piece = payload[start:start + MSS]
            out.append(self._segment(from_client, "PA", piece))
            self._next[from_client] += len(piece)
        return out

    def fin(self, from_client: bool) -> list[Segment]:
        """One side shut its sending half (FIN), the other acknowledges it."""
        if self.closed[from_client]:
            return []
        self.closed[from_client] = True
        fin = self._segment(from_client, "FA")
        self._next[from_client] += 1
        return [fin, self._segment(not from_client, "A")]

    def reset(self, from_client: bool) -> list[Segment]:
        """One side reset the connection."""
        self.closed[True] = self.closed[False] = True
        return [self._segment(from_client, "RA")]
