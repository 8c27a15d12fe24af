"""Wire mutants of issue 23's faults on the wire (conformance/kbtp/target/test_wire_faults.py): targets whose RNIC
(the wire binding's engine, on the target's side only) mishandles what a lossy, duplicating or re-segmenting link
brings. Like tests/mutants/kbtp_wire.py, each is the reference target over loopback sockets in its binding's wire
format, run by `kvconform run` in a process of its own; the checks impair the harness's links themselves."""

from __future__ import annotations

from kvconform.rdma.engine import Source
from kvconform.rdma.fabric import ConnState, Layer, Terminate
from kvconform.rdma.iwarp.engine import IwarpEngine
from kvconform.rdma.roce.headers import Packet
from tests.mutants.kbtp_wire import _WireDriver
from tests.mutants.kbtp_wire_attacks import _DuplicateAtomicExecuted


class _DuplicateIgnored(_DuplicateAtomicExecuted):
    def _duplicate(self, pkt: Packet) -> None:
        return  # a request on a PSN it has seen is dropped: no ACK again, no READ re-executed, no saved result


class _PartialFpduRefused(IwarpEngine):
    def receive(self, data: bytes, now: float, source: Source | None = None) -> None:
        super().receive(data, now, source)
        if self.setup.phase == "open" and self.reasm.buf and self.state is ConnState.CONNECTED:
            # each read taken for whole FPDUs: an FPDU TCP cut in two ends the stream
            self._fail_local(Terminate(Layer.LLP, 0, 2, f"an FPDU cut across two TCP reads at {self.name}",
                                       self.name))


class WireDuplicatedLinkAtomicTwice(_WireDriver):
    """KBTP-WIRE-IB-DUPLICATE: the target's RNIC executes a duplicated atomic again; over a link that duplicates
    datagrams the DIRECT_ALLOC Head moves twice for one FetchAdd (a ticket lost)."""

    roce_class = _DuplicateAtomicExecuted


class WireDuplicateNotAnswered(_WireDriver):
    """KBTP-WIRE-IB-RETRANSMIT: the target's RNIC drops a request on a PSN it has already seen without answering
    it again, so a requester whose answer was lost retransmits in vain until its retries run out."""

    roce_class = _DuplicateIgnored


class WirePartialFpduRefused(_WireDriver):
    """KBTP-WIRE-MPA-STREAM: the target's RNIC takes every TCP read for whole FPDUs and ends the stream when one
    is cut across two reads, as TCP may cut it."""

    iwarp_class = _PartialFpduRefused


__all__ = ["WireDuplicateNotAnswered", "WireDuplicatedLinkAtomicTwice", "WirePartialFpduRefused"]
