"""RoCEv2 connection setup for the wire fabric: the out-of-band QP exchange over the TCP side channel
(rdma-bindings §5.1: QPN, starting PSN, address and UDP port), then the RC engine over the fabric's UDP
socket. The side channel stays open for the connection's life; its end is the connection's end."""

from __future__ import annotations

import hashlib
from typing import TYPE_CHECKING

from kvconform.rdma.roce import oob
from kvconform.rdma.roce.qp import QpInfo

if TYPE_CHECKING:
    from kvconform.rdma.wire.fabric import WireConnection, WireFabric


class RoceSetup:
    """One connection's QP exchange and datagram path."""

    def __init__(self, fabric: WireFabric, conn: WireConnection, *, initiator: bool) -> None:
        self.fabric = fabric
        self.conn = conn
        self.initiator = initiator
        self.inbox = bytearray()
        self.local: QpInfo | None = None
        self.remote: QpInfo | None = None

    def begin(self) -> None:
        qpn = self.fabric._register_qpn(self.conn)
        self.fabric._ensure_udp()
        # a starting PSN that differs per connection but replays for the same names (readable captures)
        psn = int.from_bytes(hashlib.sha256(self.conn.name.encode()).digest()[:3], "big")
        self.local = QpInfo(qpn=qpn, psn=psn, ip=self.fabric.roce_address, port=self.fabric.udp_port)
        if self.initiator:
            self._send_side(oob.encode(self.local))

    def _send_side(self, data: bytes) -> None:
        if self.conn.tap is not None:
            self.conn.tap.stream(True, data)
        self.conn.out += data
        self.fabric._write(self.conn)

    def side_channel(self, data: bytes) -> None:
        """Bytes on the side channel: the peer's QP information (anything after it is ignored)."""
        if self.conn.tap is not None:
            self.conn.tap.stream(False, data)
        if self.remote is not None:
            return
        self.inbox += data
        try:
            got = oob.decode(bytes(self.inbox))
        except oob.OobError as exc:
            self.fabric._lost(self.conn, f"out-of-band QP exchange: {exc}")
            return
        if got is None:
            return  # incomplete
        self.remote, _used = got
        assert self.local is not None
        engine = self.fabric.make_roce_engine(self.conn, self.local, self.remote)
        self.fabric._set_engine(self.conn, engine)
        engine.start(self.fabric.now)
        self.fabric._flush(self.conn)  # the endpoint attaches (posts its receives) here ...
        if not self.initiator:  # ... before the initiator learns it may send: no RNR NAK for its first Send
            self._send_side(oob.encode(self.local))

    def send(self, payloads: list[bytes]) -> None:
        udp = self.fabric._ensure_udp()
        assert self.remote is not None
        dst = (self.remote.ip, self.remote.port)
        for p in payloads:
            try:
                udp.sendto(p, dst)
            except BlockingIOError:
                continue  # a full socket buffer drops the datagram: RC retransmits it
            if self.conn.tap is not None:
                self.conn.tap.datagram((self.fabric.roce_address, self.fabric.udp_port), dst, p, received=False)
