"""The RoCEv2 Invariant CRC (rdma-bindings §4.8).

CRC-32 (``zlib.crc32``) over 8 octets of 0xFF (the masked pseudo-LRH) ‖ IP header ‖ UDP header ‖ BTH ‖
the rest of the packet through the pad, with the variant fields set to all ones: IPv4 TOS, TTL and
header checksum; IPv6 traffic class, flow label and hop limit; the UDP checksum; BTH octet 4. It is
appended little-endian. A UDP socket shows neither IP header, so both ends rebuild it from the
addresses and ports they know: the sender sends with DF and IP Identification 0 (rdma-vm-testbed).
"""

from __future__ import annotations

import functools
import ipaddress
import struct
import zlib

ICRC_LEN = 4
UDP_LEN = 8
_PSEUDO_LRH = b"\xff" * 8
_IP_DF = 0x4000
_FF = b"\xff"
_LE32 = struct.Struct("<I")


def ipv4_header(src: str, dst: str, payload_len: int, *, ttl: int = 64, tos: int = 0, ident: int = 0,
                masked: bool = False) -> bytes:
    """The 20-octet IPv4 header a RoCEv2 sender puts before ``payload_len`` octets of UDP (DF set)."""
    total = 20 + payload_len
    s, d = ipaddress.IPv4Address(src).packed, ipaddress.IPv4Address(dst).packed
    if masked:
        return struct.pack(">BBHHHBBH4s4s", 0x45, 0xFF, total, ident, _IP_DF, 0xFF, 17, 0xFFFF, s, d)
    hdr = struct.pack(">BBHHHBBH4s4s", 0x45, tos, total, ident, _IP_DF, ttl, 17, 0, s, d)
    return hdr[:10] + struct.pack(">H", _ip_checksum(hdr)) + hdr[12:]


def ipv6_header(src: str, dst: str, payload_len: int, *, hop_limit: int = 64, masked: bool = False) -> bytes:
    """The 40-octet IPv6 header before ``payload_len`` octets of UDP."""
    s, d = ipaddress.IPv6Address(src).packed, ipaddress.IPv6Address(dst).packed
    first = 0x6FFFFFFF if masked else 0x60000000
    return struct.pack(">IHBB16s16s", first, payload_len, 17, 0xFF if masked else hop_limit, s, d)


def _ip_checksum(hdr: bytes) -> int:
    total = int(sum(struct.unpack(f">{len(hdr) // 2}H", hdr)))
    while total > 0xFFFF:
        total = (total & 0xFFFF) + (total >> 16)
    return ~total & 0xFFFF


@functools.lru_cache(maxsize=1024)
def _masked_ip(src: str, dst: str, udp_len: int, ident: int = 0) -> bytes:
    """The masked IP header (the same for every packet of a size on a connection: cached)."""
    if ipaddress.ip_address(src).version == 6:
        return ipv6_header(src, dst, udp_len, masked=True)
    return ipv4_header(src, dst, udp_len, masked=True, ident=ident)


def icrc(src: str, sport: int, dst: str, dport: int, packet: bytes, ident: int = 0) -> bytes:
    """The 4 ICRC octets (wire order) of ``packet`` (BTH through pad) sent from ``src:sport`` to ``dst:dport``;
    ``ident`` is the IPv4 Identification of the packet's header (the ICRC covers it; 0 from a DF UDP socket,
    anything from a kernel RoCE device: rxe numbers its packets)."""
    n = len(packet)
    crc = _prefix_crc(src, sport, dst, dport, UDP_LEN + n + ICRC_LEN, ident)
    # the rest chained onto it, without copying the payload: BTH octets 0-3, octet 4 masked, then octet 5 on
    crc = zlib.crc32(_FF, zlib.crc32(packet[:4], crc))
    return _LE32.pack(zlib.crc32(memoryview(packet)[5:], crc) if n > 5 else crc)


@functools.lru_cache(maxsize=4096)
def _prefix_crc(src: str, sport: int, dst: str, dport: int, udp_len: int, ident: int) -> int:
    """The CRC-32 state after the pseudo-LRH, the masked IP header and the masked UDP header: the same for every
    packet of a size between two endpoints (cached)."""
    udp = struct.pack(">HHHH", sport, dport, udp_len, 0xFFFF)
    return zlib.crc32(_PSEUDO_LRH + _masked_ip(src, dst, udp_len, ident) + udp)


def prefix_crc(src: str, sport: int, dst: str, dport: int, udp_len: int, ident: int = 0) -> int:
    """The CRC-32 state before the BTH of a packet whose UDP length is ``udp_len`` (a sender caches it per size)."""
    return _prefix_crc(src, sport, dst, dport, udp_len, ident)


def seal(prefix: int, head: bytes, ext: bytes, payload: bytes, pad: bytes) -> bytes:
    """BTH ‖ extension headers ‖ payload ‖ pad ‖ ICRC in one join, the CRC chained over the parts (``prefix``:
    `prefix_crc` of the packet's size), BTH octet 4 masked: the same octets as `append_icrc` of the joined packet,
    with one copy of the payload instead of three."""
    crc = zlib.crc32(head[5:], zlib.crc32(_FF, zlib.crc32(head[:4], prefix)))
    if ext:
        crc = zlib.crc32(ext, crc)
    crc = zlib.crc32(payload, crc)
    if pad:
        crc = zlib.crc32(pad, crc)
    return b"".join((head, ext, payload, pad, _LE32.pack(crc)))


def unseal(prefix: int, payload: bytes) -> bytes | None:
    """`check_icrc` with the CRC state before the BTH given (``prefix``: `prefix_crc` for a UDP length of
    ``8 + len(payload)``, which a receiver caches per sender and size)."""
    if len(payload) < ICRC_LEN:
        return None
    body = payload[:-ICRC_LEN]
    crc = zlib.crc32(_FF, zlib.crc32(body[:4], prefix))
    if len(body) > 5:
        crc = zlib.crc32(memoryview(body)[5:], crc)
    return body if _LE32.pack(crc) == payload[-ICRC_LEN:] else None


def append_icrc(src: str, sport: int, dst: str, dport: int, packet: bytes, ident: int = 0) -> bytes:
    """``packet`` with its ICRC: the UDP payload to send."""
    return packet + icrc(src, sport, dst, dport, packet, ident)


def check_icrc(src: str, sport: int, dst: str, dport: int, payload: bytes, ident: int = 0) -> bytes | None:
    """The packet without its ICRC when the ICRC of the UDP ``payload`` is right, else None."""
    if len(payload) < ICRC_LEN:
        return None
    body = payload[:-ICRC_LEN]
    return body if icrc(src, sport, dst, dport, body, ident) == payload[-ICRC_LEN:] else None
