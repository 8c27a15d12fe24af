"""What each side of an RC connection tells the other out of band (rdma-bindings §5.1, §5.4 step 1)."""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass

ROCE_UDP_PORT = 4791  # IANA RoCEv2 port (§4.1)
PSN_MASK = (1 << 24) - 1


@dataclass(frozen=True, slots=True)
class QpInfo:
    """One RC QP's addressing: QPN, starting PSN, IPv4/IPv6 address (the GID) and UDP port; optionally the
    rkey and VA of a buffer the peer may access (perftest's exchange, §5.1)."""

    qpn: int
    psn: int
    ip: str
    port: int = ROCE_UDP_PORT
    rkey: int | None = None
    va: int | None = None

    def __post_init__(self) -> None:
        if not 1 < self.qpn <= PSN_MASK:
            raise ValueError(f"QpInfo.qpn {self.qpn:#x}: a 24-bit QPN other than 0 and 1 is expected (§5.4)")
        if not 0 <= self.psn <= PSN_MASK:
            raise ValueError(f"QpInfo.psn {self.psn:#x}: a 24-bit PSN is expected (§4.6)")
        if not 0 < self.port < 1 << 16:
            raise ValueError(f"QpInfo.port {self.port}: a UDP port 1..65535 is expected")
        ipaddress.ip_address(self.ip)  # raises ValueError naming the bad address
        if self.rkey is not None and not 0 <= self.rkey < 1 << 32:
            raise ValueError(f"QpInfo.rkey {self.rkey:#x}: a 32-bit R_Key is expected")
        if self.va is not None and not 0 <= self.va < 1 << 64:
            raise ValueError(f"QpInfo.va {self.va:#x}: a 64-bit VA is expected")
