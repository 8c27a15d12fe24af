"""The pcap of a wire connection, built from the bytes its engine sent and received (no privileges needed).

Two sinks, both through `kvconform.capture` (the project's pcap writer and synthesised TCP/UDP frames):

- the plugin's per-check capture (``--kvconform-capture``): the connection's ports are watched (tcpdump on
  loopback keeps their frames), and when the harness writes the capture itself the frames are recorded here;
- a file of its own (``WireFabric(capture_dir=...)``, ``kvconform serve kbtp-target --pcap``), written when the
  connection closes.

iWARP is one TCP flow (handshake, the MPA stream both ways with coherent sequence numbers, FIN): Wireshark's
iWARP-MPA/DDP/RDMAP dissectors find it by the MPA start frames. RoCEv2 is the side channel's TCP flow plus the
datagrams, ICRC included; UDP port 4791 decodes as InfiniBand (``-d udp.port==P,...`` for other ports).
"""

from __future__ import annotations

import time
from pathlib import Path

from kvconform.capture import hooks
from kvconform.capture.pcap import Datagram, Frame, Segment, TcpFlow, datagram_frame, segment_frame, write_pcap

Address = tuple[str, int]


class WireTap:
    """One connection's capture: TCP stream bytes each way, datagrams, and the close."""

    def __init__(self, local: Address, peer: Address, *, initiator: bool, path: Path | None = None) -> None:
        self.local = local
        self.path = path
        self.session = hooks.active()
        client, server = (local, peer) if initiator else (peer, local)
        self.flow = TcpFlow(client, server)
        self.initiator = initiator
        self.frames: list[Frame] = []
        # the plugin's session keeps what tcpdump sees of these ports; the harness records only what tcpdump
        # cannot see (or everything, when it writes the capture itself)
        self.record = self.session is not None and self.session.in_python(local[0])
        if self.session is not None:
            self.session.watch("tcp", server[1])
        self._segments(self.flow.open())

    @property
    def active(self) -> bool:
        return self.record or self.path is not None

    def _segments(self, segments: list[Segment]) -> None:
        if self.record and self.session is not None:
            self.session.record_segments(segments)
        if self.path is not None:
            now = time.time()
            self.frames += [Frame(now, segment_frame(s)) for s in segments]

    def stream(self, sent: bool, data: bytes) -> None:
        """Stream bytes this end sent (``sent``) or received."""
        if self.active and data:
            self._segments(self.flow.data(sent == self.initiator, data))

    @property
    def wants_datagrams(self) -> bool:
        """Whether `datagram` does anything: a capture session watches or a file is written (the hot path skips
        it otherwise)."""
        return self.session is not None or self.path is not None

    def datagram(self, src: Address, dst: Address, payload: bytes, *, received: bool) -> None:
        if self.session is not None:
            self.session.watch("udp", dst[1] if not received else src[1])
        d = Datagram(src, dst, payload)
        if self.record and self.session is not None:
            self.session.record_datagram(d, received=False)
        if self.path is not None:
            self.frames.append(Frame(time.time(), datagram_frame(d)))

    def close(self) -> None:
        """The connection ended: this end's FIN, and the file written."""
        if self.active and not self.flow.closed[self.initiator]:
            self._segments(self.flow.fin(self.initiator))
        if self.path is not None and self.frames:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            write_pcap(self.path, sorted(self.frames, key=lambda f: f.ts))
            self.frames = []
