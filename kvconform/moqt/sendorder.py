"""The order in which a peer *sent* stream frames, read from the QUIC packet numbers the harness received.

Arrival order across QUIC streams is the network's (loss, retransmission, reordering); the order a sender put
frames on the wire is not: packet numbers increase strictly with each packet a sender sends in a packet number
space (RFC 9000 section 12.3), and a retransmission travels in a new, higher-numbered packet. So for two frames
A and B the harness received, "B was sent before A" is *proven* when B's packet number is lower than the packet
number A was first seen in, and no 1-RTT packet numbered at or below B's is missing (a missing one could have
carried A's original transmission, before B). Without that proof the order is undecided, never a violation.

``PacketTap.attach(quic)`` hooks an aioquic ``QuicConnection``'s qlog trace (the one the capture runs, or a
private one) and keeps, per received 1-RTT packet, its number and the STREAM / RESET_STREAM frames it carried
(stream id, offset, length, FIN). ``SendOrder`` is what the checks read: plain data.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from aioquic.quic.logger import QuicLogger, QuicLoggerTrace

if TYPE_CHECKING:
    from aioquic.quic.connection import QuicConnection

__all__ = ["PacketTap", "SendOrder", "StreamFrame"]


@dataclass(frozen=True)
class StreamFrame:
    """One STREAM (or RESET_STREAM: ``reset``) frame of one received packet."""

    packet: int
    stream_id: int
    offset: int
    length: int
    fin: bool
    reset: bool = False


@dataclass
class SendOrder:
    """Packet numbers and stream frames of the 1-RTT packets received from one peer."""

    packets: set[int] = field(default_factory=set)
    frames: list[StreamFrame] = field(default_factory=list)

    def ended_in(self, stream_id: int) -> int | None:
        """The lowest packet number that carried the stream's FIN or a RESET_STREAM for it."""
        found = [f.packet for f in self.frames if f.stream_id == stream_id and (f.fin or f.reset)]
        return min(found, default=None)

    def last_byte_in(self, stream_id: int) -> int | None:
        """The lowest packet number that carried the highest-offset octet the stream delivered (its last
        message's end)."""
        data = [f for f in self.frames if f.stream_id == stream_id and not f.reset and f.length > 0]
        if not data:
            return None
        end = max(f.offset + f.length for f in data)
        return min(f.packet for f in data if f.offset < end <= f.offset + f.length)

    def gap_at_or_below(self, packet: int) -> int | None:
        """A 1-RTT packet number at or below ``packet`` (and above the lowest one seen) that never arrived."""
        if not self.packets:
            return None
        low = min(self.packets)
        return next((n for n in range(low, packet + 1) if n not in self.packets), None)

    def sent_before(self, first: int, then: int) -> bool | None:
        """Was the frame first seen in packet ``then`` sent after the one seen in packet ``first``? True: proven
        (``first`` < ``then`` and nothing at or below ``first`` is missing); False: ``then`` <= ``first`` does
        not show it; None: undecided (a packet at or below ``first`` is missing)."""
        if then <= first:
            return False
        return True if self.gap_at_or_below(first) is None else None


class PacketTap:
    """Records ``SendOrder`` from an aioquic connection's received packets (see the module docstring)."""

    def __init__(self) -> None:
        self.order = SendOrder()
        self._pending: list[tuple[int, list[dict[str, Any]]]] = []  # frame lists aioquic fills after logging

    def attach(self, quic: QuicConnection) -> None:
        """Hook ``quic``'s qlog trace; a connection without one gets a private trace nobody writes out."""
        trace: QuicLoggerTrace | None = getattr(quic, "_quic_logger", None)
        if trace is None:
            trace = QuicLoggerTrace(is_client=quic.configuration.is_client, odcid=b"")
            trace.log_event = lambda **_: None  # type: ignore[method-assign]  # keep nothing of its own
            holder = _Holder()
            holder._traces.append(trace)
            quic._configuration = dataclasses.replace(quic.configuration, quic_logger=holder)
            quic._quic_logger = trace
        inner: Callable[..., None] = trace.log_event

        def log_event(*, category: str, event: str, data: dict[str, Any]) -> None:
            inner(category=category, event=event, data=data)
            if event == "packet_received" and data.get("header", {}).get("packet_type") == "1RTT":
                self._pending.append((int(data["header"]["packet_number"]), data["frames"]))

        trace.log_event = log_event  # type: ignore[method-assign]

    def snapshot(self) -> SendOrder:
        """What was received so far (the frame lists of earlier packets are complete by now)."""
        for number, frames in self._pending:
            self.order.packets.add(number)
            for f in frames:
                kind = f.get("frame_type")
                if kind == "stream":
                    self.order.frames.append(StreamFrame(number, int(f["stream_id"]), int(f["offset"]),
                                                         int(f["length"]), bool(f.get("fin"))))
                elif kind == "reset_stream":
                    self.order.frames.append(StreamFrame(number, int(f["stream_id"]), int(f["final_size"]), 0,
                                                         False, reset=True))
        self._pending.clear()
        return SendOrder(set(self.order.packets), list(self.order.frames))


class _Holder(QuicLogger):
    """The ``quic_logger`` of a connection given a private trace: its end is nobody's business."""

    def end_trace(self, trace: QuicLoggerTrace) -> None:
        pass
