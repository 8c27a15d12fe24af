"""HELLO's Completion Credits judged from the harness target's end of a userspace wire (an initiator in another
process, whose posted receives the harness cannot count).

KBTP "Session Establishment": Completion Credits "is the number of receive buffers the initiator has posted for
COMPLETION messages" (KBTP-HELLO-LAYOUT). A Send that finds no receive posted is answered by the responder's
transport, whatever the initiator's software does with it: an RNR NAK on IB RC over RoCEv2, a DDP untagged
Terminate "invalid MSN, no buffer" that ends the stream on iWARP (rdma-bindings.md). So when HELLO arrives
claiming C buffers, the harness target sends C Sends at once, back to back in one flush: its HELLO_ACK and C - 1
unsolicited COMPLETIONs naming Request ID 0 (no request has it). An initiator that posted C buffers before its
HELLO takes them all; one that claimed more than it posted makes the transport refuse one.

Why not C requests of the initiator in flight, their COMPLETIONs held and released together: an initiator that
keeps one request outstanding (the reference does) never opens that window, so its claim would never be judged.
The fillers are outside the protocol's exchange, so the probe ends the check: the initiator's software may take
them for answers later; its transport must have taken them first.

Delivery is shown, never assumed: on RoCEv2 by the acknowledgement of the last Send (RC acknowledges in order,
cumulatively), on iWARP by a zero-length RDMA Read behind the Sends (answered without an STag check, RFC 6581's
Read RTR; the responder processes its stream in order, so its Read Response comes after every Send before it was
placed, or the Terminate of one that was not)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from kvconform.kbtp.constants import Status
from kvconform.kbtp.messages import Completion
from kvconform.rdma.fabric import DdpEType, Layer

PROBE_CAP = 256  # Sends of one probe at most: a claim beyond it is judged only as far as this (inconclusive)
PROBE_WAIT_S = 5.0  # bound on the wait for the acknowledgement (or refusal) of the probe's Sends
EVIDENCE_WR = (1 << 41) + 7  # wr_id of the probe's last Send (RoCEv2) or of its zero-length Read (iWARP)
NO_BUFFER_KEY = [1, 2, 2]  # Terminate (Layer DDP, EType untagged buffer, Code invalid MSN / no buffer)


@dataclass
class CreditProbe:
    """The harness target's Sends behind the HELLO_ACK on one connection, and what came of them."""

    binding: str  # "roce" or "iwarp": the harness's userspace binding
    conn: Any = None
    claimed: int | None = None  # Completion Credits of the HELLO the probe answered
    sent: int = 0  # Sends released at once, the HELLO_ACK included
    overrun: list[str] = field(default_factory=list)  # what the transport said of a Send that found no buffer
    delivered: bool = False

    def fire(self, session: Any, claimed: int) -> None:
        """Behind the HELLO_ACK just posted on ``session``'s connection: the other ``claimed - 1`` Sends (capped)."""
        if self.conn is not None:
            return  # one probe per bed: the initiator under test's first HELLO
        self.conn, self.claimed = session.conn, claimed
        n = min(claimed, PROBE_CAP)
        filler = Completion(request_id=0, status=Status.OK).encode_raw()
        for i in range(1, n):
            last = i == n - 1 and self.binding == "roce"
            self.conn.post_send(filler, wr_id=EVIDENCE_WR if last else 0, signaled=last)
        self.sent = max(n, 1)
        if self.binding == "iwarp" and n > 1:
            self.conn.post_read(session.recv.sge(0, 0), 0, 0, wr_id=EVIDENCE_WR, signaled=True, tag="credit-fence")

    def judge(self, trace: list[dict[str, Any]], conn_name: str) -> bool:
        """Look once more at the trace and the CQ; whether the outcome is known (an overrun, or delivery)."""
        if self.conn is None:
            return False
        self.overrun = [f"RNR NAK (PSN {e.get('psn', 0):#x})" if e["do"] == "rnr-nak"
                        else f"Terminate {e.get('key')}: {e.get('reason', '')}"
                        for rec in trace for e in rec["effects"] if e.get("who") == conn_name
                        and (e.get("do") == "rnr-nak" or (e.get("do") == "terminate" and
                                                         list(e.get("key", ())) == NO_BUFFER_KEY))]
        # ... and the connection's end, should the trace have missed the arrival: the Terminate that ended it
        ended = getattr(getattr(self.conn, "engine", None), "terminate", None)
        if ended is not None and not self.overrun and (list(ended.key()) == NO_BUFFER_KEY
                                                       or "RNR retries exhausted" in ended.reason):
            self.overrun.append(f"the connection ended: Terminate {list(ended.key())}: {ended.reason}")
        if self.sent <= 1:
            self.delivered = True  # the HELLO_ACK alone: the initiator's HELLO exchange finishing shows it
        elif not self.delivered:
            wc = self.conn.cq.take(lambda c: c.wr_id == EVIDENCE_WR)
            # a peer that refuses the zero-length Read itself (a device may check its STag) answers it in stream
            # order too: its Terminate about a tagged access shows every Send before it was placed
            tagged = ended is not None and (ended.layer is Layer.RDMAP or (
                ended.layer is Layer.DDP and ended.etype == DdpEType.TAGGED_BUFFER))
            self.delivered = (wc is not None and wc.ok) or (
                self.binding == "iwarp" and tagged and ended.sender != getattr(self.conn, "name", ""))  # type: ignore[union-attr]
        return bool(self.overrun) or self.delivered
