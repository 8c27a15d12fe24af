"""The contract between a fabric's connection endpoint and a binding's engine (beside `kvconform.rdma.fabric`).

`Engine` is what every binding's engine provides (the emulated fabric's NIC, the iWARP, RoCEv2 and verbs
engines); `WireEngine` adds the sans-I/O wire part. A wire engine is one endpoint of one reliable
connection (an RDMAP stream over MPA/TCP, or an RC QP over RoCEv2). It never touches a socket or a clock:
the wire fabric hands it what arrived (`receive`) and the time (`poll_timers`), and takes what it must
send (`take_output`) and the work completions it produced (`take_completions`). That keeps every engine
testable byte for byte, and lets the same engine run over an asyncio socket, a selector loop, a pcap
replay or a scapy attack script.

Semantics every engine keeps (the same as `kvconform.rdma.emulated`, so the suites see one behaviour):

- Requester completions are produced in post order; a successful unsignaled WR produces none; an error
  always does; failure and close flush what is outstanding (one rule for every engine:
  `kvconform.rdma.completion`). RDMA Read / atomic responses land in the WR's ``dst`` SGE before its
  completion.
- The responder side checks every remote access with `kvconform.rdma.memory` through `LocalMemory`
  (which already knows this connection, so a window of another stream is refused), writes RDMA Write
  data into the resolved buffer, answers Reads from it, executes atomics on the 64-bit word in the
  buffer's byte order (``masked_add`` / ``masked_cmp_swap``; the original value travels big-endian),
  and delivers Sends into posted Recvs (Send with Invalidate invalidates through
  `LocalMemory.remote_invalidate` before the completion).
- An error the responder detects: it sends the binding's error (RDMAP Terminate; IB NAK), moves to
  ``ERROR`` and flushes its own outstanding WRs and Recvs with ``WR_FLUSH_ERR``. The requester that
  receives it completes the culprit WR with REM_ACCESS_ERR (protection / tagged-buffer errors),
  REM_INV_REQ_ERR (remote operation errors, misaligned atomics) or REM_OP_ERR, with the `Terminate`
  attached (an IB binding builds one from the syndrome, Layer RDMAP, so reasons read alike), then
  flushes the rest and moves to ``ERROR``. A Send with no posted Recv is DDP untagged NO_BUFFER on
  RDMAP and an RNR NAK on IB (retried, then RNR_RETRY_EXC_ERR).
- `disconnect` closes in order (``CLOSED``) and flushes; `transport_closed` is the peer's FIN / reset
  (``CLOSED`` when nothing was outstanding, else ``ERROR`` with flushes).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

from kvconform.rdma.fabric import U64, Access, Buffer, Completion, ConnState, Op, Sge, Terminate


@dataclass(frozen=True, slots=True)
class Source:
    """Where a datagram came from, as far as its receiver's ICRC needs (RoCEv2 §4.8 covers all three)."""

    address: str
    port: int
    ip_ident: int = 0  # IPv4 Identification: 0 from a DF UDP socket; a kernel RoCE device numbers its packets


@dataclass(slots=True)
class WorkRequest:
    """A send-queue work request, already checked locally by the fabric (SGEs valid, profile allows it)."""

    op: Op  # SEND, RDMA_WRITE, RDMA_READ, FETCH_ADD or COMP_SWAP
    wr_id: int
    tag: str = ""  # the name in traces and captures
    signaled: bool = True
    fence: bool = False
    data: bytes = b""  # SEND / RDMA_WRITE payload, gathered from the source SGEs at post time
    src: list[Sge] | None = None  # ... and those SGEs (a verbs device reads registered memory itself)
    dst: Sge | None = None  # RDMA_READ / atomics: where the response lands
    stag: int = 0  # remote STag (rkey) and Tagged Offset (VA) of RDMA_WRITE / RDMA_READ / atomics
    to: int = 0
    imm: bytes | None = None  # RDMA_WRITE with Immediate (8 octets RDMAP, 4 IB); SEND with Immediate (IB only)
    invalidate: int | None = None  # Send with Invalidate: the remote STag
    solicited: bool = False
    add: int = 0
    mask: int = 0  # RFC 7306 Add Mask (0: the plain 64-bit add)
    compare: int = 0
    swap: int = 0
    compare_mask: int = U64
    swap_mask: int = U64


class LocalMemory(Protocol):
    """The local node's registered memory, as the responder side of one connection sees it."""

    def resolve(
        self, stag: int, to: int, length: int, right: Access, *, tagged: bool
    ) -> tuple[Buffer, int] | Terminate:
        """`kvconform.rdma.memory.resolve` bound to this node and connection."""
        ...

    def atomic_misaligned(self, to: int) -> Terminate | None: ...

    def remote_invalidate(self, stag: int) -> Terminate | None:
        """Invalidate ``stag`` for a Send with Invalidate and return None, or the Terminate that refuses it."""
        ...

    def note(self, what: str, **args: Any) -> None:
        """Record an effect in the fabric's trace (``write``, ``read``, ``fetch_add``/``comp_swap`` with
        ``addr``, ``orig``, ``new``; ``deliver``; ``terminate`` with ``key`` and ``reason``)."""
        ...


class Engine(Protocol):
    """What every binding's engine provides to a connection endpoint (the emulated, iWARP, RoCEv2 and verbs
    engines): one endpoint of a reliable connection that takes checked work requests and produces their
    completions by the rule of `kvconform.rdma.completion` (see the module docstring)."""

    @property
    def name(self) -> str: ...
    @property
    def state(self) -> ConnState: ...
    @property
    def terminate(self) -> Terminate | None: ...

    def post(self, wr: WorkRequest) -> None:
        """Queue a send-queue WR (checked locally by the endpoint already); its completion comes in post order."""
        ...

    def post_recv(self, wr_id: int, sge: Sge | None) -> None: ...
    def take_completions(self) -> list[Completion]:
        """The completions produced since the last call, in order. An engine built with a completion sink (the
        emulated one: a completion wakes actors within the step that produced it) hands them there at once and
        returns none."""
        ...

    def disconnect(self) -> None:
        """Orderly close (``CLOSED``); what is outstanding is flushed."""
        ...


class WireEngine(Engine, Protocol):
    """An `Engine` over a wire format, sans I/O: the wire fabric feeds it bytes and time, and sends what it
    produced (iWARP, RoCEv2; the verbs engine, whose device does the wire, answers the same calls)."""

    @property
    def established(self) -> bool:
        """Connection setup (MPA start frames; nothing for RoCE, set up out of band) is complete."""
        ...

    def start(self, now: float) -> None:
        """Begin connection setup (the MPA initiator queues its Request frame here)."""
        ...

    def receive(self, data: bytes, now: float, source: Source | None = None) -> None:
        """Bytes that arrived: a piece of the TCP stream (iWARP) or one UDP payload (RoCEv2, ``source`` its
        sender's address and port)."""
        ...

    def poll_timers(self, now: float) -> None:
        """Run what is due at ``now`` (retransmission, ACK coalescing, RNR retry)."""
        ...

    def next_deadline(self) -> float | None: ...
    def take_output(self) -> list[bytes]:
        """What to send, in order: stream bytes (iWARP) or UDP payloads (RoCEv2)."""
        ...

    def transport_closed(self) -> None: ...
