"""The out-of-band QP exchange over the TCP side channel (rdma-bindings §5.1, §5.4 step 1), as bytes.

Like rc_pingpong's ``LID:QPN:PSN:GID`` line, but binary, versioned and length-prefixed::

    Length(16)  octets that follow
    Version(8)  = 1
    Flags(8)    bit 0: R_Key and VA present
    QPN(24) PSN(24) UDP port(16)
    GID(128)    the IPv6 address, or IPv4-mapped ::ffff:a.b.c.d (§5.1)
    [R_Key(32) VA(64)]

Big-endian throughout. The socket part is the wire fabric's (`kvconform.rdma.wire.fabric`, RoceSetup).
"""

from __future__ import annotations

import ipaddress
import struct

from kvconform.rdma.roce.qp import QpInfo

VERSION = 1
_FLAG_RKEY = 0x01
_BASE = 1 + 1 + 3 + 3 + 2 + 16
_WITH_RKEY = _BASE + 4 + 8


class OobError(ValueError):
    """An exchange message that cannot be decoded: names the field, the value seen and the value expected."""


def encode(info: QpInfo) -> bytes:
    """The message announcing ``info`` to the peer."""
    ip = ipaddress.ip_address(info.ip)
    gid = ip.packed if ip.version == 6 else ipaddress.IPv6Address(b"\0" * 10 + b"\xff\xff" + ip.packed).packed
    has_rkey = info.rkey is not None or info.va is not None
    body = struct.pack(">BB3s3sH16s", VERSION, _FLAG_RKEY if has_rkey else 0, info.qpn.to_bytes(3, "big"),
                       info.psn.to_bytes(3, "big"), info.port, gid)
    if has_rkey:
        body += struct.pack(">IQ", info.rkey or 0, info.va or 0)
    return struct.pack(">H", len(body)) + body


def decode(data: bytes) -> tuple[QpInfo, int] | None:
    """The peer's QP information and the octets it took, or None while ``data`` is still incomplete."""
    if len(data) < 2:
        return None
    (length,) = struct.unpack_from(">H", data)
    if length < _BASE:
        raise OobError(f"Length {length}: at least {_BASE} octets expected (version {VERSION})")
    if len(data) < 2 + length:
        return None
    body = data[2:2 + length]
    version, flags, qpn, psn, port, gid = struct.unpack_from(">BB3s3sH16s", body)
    if version != VERSION:
        raise OobError(f"Version {version}: {VERSION} expected")
    if flags & ~_FLAG_RKEY:
        raise OobError(f"Flags {flags:#04x}: only bit 0 (R_Key and VA present) is defined")
    want = _WITH_RKEY if flags & _FLAG_RKEY else _BASE
    if length != want:
        raise OobError(f"Length {length}: {want} expected for Flags {flags:#04x}")
    addr = ipaddress.IPv6Address(gid)
    ip = str(addr.ipv4_mapped) if addr.ipv4_mapped is not None else str(addr)
    rkey = va = None
    if flags & _FLAG_RKEY:
        rkey, va = struct.unpack_from(">IQ", body, _BASE)
    q, p = int.from_bytes(qpn, "big"), int.from_bytes(psn, "big")
    if q in (0, 1):
        raise OobError(f"QPN {q:#x}: a QPN other than 0 and 1 expected (§5.4)")
    if port == 0:
        raise OobError("UDP port 0: a port 1..65535 expected")
    return QpInfo(qpn=q, psn=p, ip=ip, port=port, rkey=rkey, va=va), 2 + length
