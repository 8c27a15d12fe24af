"""`WireFabric`: the fabric interface over real sockets, with a binding's sans-I/O engine per connection.

The same actors (the reference target and initiator, the harness's clients, the suites) that run on the
emulated fabric run here unchanged, in real time (`kvconform.rdma.runtime.realtime.RealTimeLoop`, which the
fabric holds): an actor's step runs when the completion, predicate or timer it waits for is there, and
between steps the loop polls the fabric's sockets (bounded by the next timer, an engine's retransmission
deadline, or the run's wall-clock bound). There is no scheduler to
own: races happen as the kernel and the peer make them, which is why checks that replay a named
interleaving stay with the emulated fabric (``owns_races`` is False here).

Bindings (``binding=``):

- ``iwarp``: RDMAP/DDP/MPA over one TCP connection (`kvconform.rdma.iwarp.IwarpEngine`).
- ``roce``: IB RC over RoCEv2: a TCP side channel carries the out-of-band QP exchange of rdma-bindings
  §5.1 (and its end is the connection's end); packets go over one UDP socket per fabric, demultiplexed by
  Destination QP (`kvconform.rdma.roce.RoceEngine`).

A node is local memory (the emulated fabric's buffers, regions, windows and STag checks, reused); a node in
another process is a `RemoteNode`, only an address, which ``dial(remote, local)`` connects to.
``listen(node, host, port, on_accept)`` serves connections. Both ends in one process (``connect(a, b)``
of two local nodes) go through a real loopback socket pair too, which is how the harness's own tests run
the reference and its mutants over the wire.

A verbs fabric (`kvconform.rdma.verbs.fabric.VerbsFabric`) holds a wire fabric as its connection layer: its
listeners, dialing and the RoCE out-of-band exchange, with the QPs made by the device (``device=``, a `QpDevice`)
instead of an engine here, and one loop for both.

Every connection can write a pcap of its wire (``capture_dir``), built from the bytes the engine sent
and received with synthesized Ethernet/IPv4/TCP or UDP headers, so captures need no privileges and
Wireshark / tshark dissect them as iWARP or InfiniBand (RoCEv2, UDP port 4791).
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import itertools
import os
import selectors
import socket
import struct
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any, Literal, Protocol

from kvconform.rdma.completion import flushed
from kvconform.rdma.engine import Source, WireEngine, WorkRequest
from kvconform.rdma.fabric import (
    Access,
    Buffer,
    ConnState,
    FabricUsageError,
    Node,
    Op,
    RunResult,
    SendWr,
    Sge,
    Terminate,
)
from kvconform.rdma.iwarp.engine import IwarpEngine
from kvconform.rdma.memory import atomic_misaligned, remote_invalidate_refusal, resolve
from kvconform.rdma.profiles import Binding, Profile
from kvconform.rdma.roce import oob
from kvconform.rdma.roce.engine import RoceEngine
from kvconform.rdma.roce.ethernet import LinkSpec, QemuSocketLink, datagram_socket
from kvconform.rdma.roce.qp import QpInfo
from kvconform.rdma.runtime import EmuCQ, EmuNode, PostingEndpoint, RealTimeLoop, RuntimeFabric, gather
from kvconform.rdma.scheduler import FifoScheduler
from kvconform.rdma.wire.capture import WireTap
from kvconform.rdma.wire.impair import Impairer, Impairment

WireBindingName = Literal["iwarp", "roce"]
ROCE_PORT = 4791  # IANA RoCEv2 UDP port (rdma-bindings §4.1)
CONNECT_TIMEOUT_S = 10.0  # TCP connect plus MPA / out-of-band exchange
RUN_TIMEOUT_S = 120.0  # wall-clock bound of one run(): a peer that never answers ends the run, not the suite
# RoceEngine ack_delay_s: a positive ACK waits this long for the next operation's requests to replace it (one ACK
# fewer per exchange while operations follow each other); far inside any ACK timeout the engines use
ROCE_ACK_DELAY_S = 0.002
_RECV = 1 << 16
# UDP GSO (Linux >= 4.18): one sendmsg, several datagrams of one size (the last may be shorter)
_UDP_SEGMENT = getattr(socket, "UDP_SEGMENT", 103)
_GSO_OK = sys.platform == "linux"
_GSO_MAX_SEGMENTS = 64  # UDP_MAX_SEGMENTS
_GSO_MAX_BYTES = 60000  # a UDP datagram's 65507 octets, with room to spare
_GSO_SIZE = struct.Struct("=H")
# QPNs distinct per process (readable captures) and never reused by a later fabric of it: a peer's late
# retransmission for an old connection must not land on a new QP of the same number
_QPNS = itertools.count(0x12 + (os.getpid() % 0x1000) * 0x100)


class WireSetupError(ConnectionError):
    """A connection could not be set up (refused, reset, MPA or QP exchange failed): never a verdict."""


@dataclass(frozen=True)
class RemoteNode:
    """A node in another process: only its address (the target under test behind a driver URL)."""

    name: str
    host: str
    port: int
    profile: Profile


class QpDevice(Protocol):
    """A device that makes a RoCE connection's QP and does its wire (a verbs device): the wire fabric then carries
    only the out-of-band exchange (rdma-bindings §5.1), announcing the device's address and QP."""

    @property
    def roce_address(self) -> str: ...

    def register_qpn(self, conn: WireConnection) -> int:
        """A new QP for ``conn``: its number (what the exchange announces)."""

    def make_roce_engine(self, conn: WireConnection, local: QpInfo, remote: QpInfo) -> WireEngine:
        """The QP of ``local.qpn``, connected to ``remote`` (what the exchange gave), as ``conn``'s engine."""


class _Memory:
    """`LocalMemory` of one connection endpoint: the node's STags as its RNIC checks them."""

    def __init__(self, fabric: WireFabric, node: EmuNode, conn: str, endpoint: WireConnection | None = None) -> None:
        self._fabric = fabric
        self._node = node
        self._conn = conn
        self._endpoint = endpoint

    def resolve(
        self, stag: int, to: int, length: int, right: Access, *, tagged: bool
    ) -> tuple[Buffer, int] | Terminate:
        return resolve(self._node.stags, self._conn, stag, to, length, right, tagged=tagged)

    def atomic_misaligned(self, to: int) -> Terminate | None:
        return atomic_misaligned(to, self._conn)

    def remote_invalidate(self, stag: int) -> Terminate | None:
        refusal = remote_invalidate_refusal(self._node.stags, self._conn, stag)
        if refusal is None:
            del self._node.stags[stag]
        return refusal

    def note(self, what: str, **args: Any) -> None:
        rt = self._fabric.runtime
        if rt.tracing:  # (a few per packet: the arguments are passed on only when something records them)
            rt.note(self._conn, what, **args)
        if what == "deliver" and self._endpoint is not None and self._endpoint.on_deliver is not None:
            self._endpoint.on_deliver()  # the engine delivers a receive now, before the next arrival is placed


class WireConnection(PostingEndpoint):
    """One endpoint: the runtime's local checks of what is posted, a binding engine for everything remote."""

    def __init__(self, fabric: WireFabric, node: EmuNode, name: str, cq: EmuCQ) -> None:
        super().__init__(node, name, cq)
        self._wire = fabric
        self.engine: WireEngine | None = None
        self.sock: socket.socket | None = None  # the TCP stream (iWARP) or side channel (RoCE)
        self.out = bytearray()  # stream bytes not yet accepted by the kernel
        self.ready = False  # setup (MPA start frames / QP exchange) done
        self.failed: str = ""  # why setup failed
        self.pending: list[Callable[[WireEngine], None]] = []  # posts before the engine exists
        self.tap: WireTap | None = None
        self.local_addr: tuple[str, int] = ("127.0.0.1", 0)
        self.peer_addr: tuple[str, int] = ("127.0.0.1", 0)
        self.setup: Any = None  # binding-specific setup state (the RoCE QP exchange)
        self.closing = False
        self.watched: list[bytes] | None = None  # what arrives for it, once watched (WireFabric.watch)
        self.batching = False  # inside post_list: posts reach the engine, the flush waits for the last
        self.peer_conn: WireConnection | None = None  # the other end, when it is in this fabric too (connect)
        self.unimpaired = False  # left alone by the impairment stage (a watched connection: WireFabric.watch)

    @property
    def state(self) -> ConnState:
        if self.engine is None:
            return ConnState.ERROR if self.failed else ConnState.CONNECTED
        return self.engine.state

    @property
    def terminate(self) -> Terminate | None:
        return None if self.engine is None else self.engine.terminate

    def __repr__(self) -> str:
        return f"WireConnection({self.name!r}, {self.state})"

    def _with_engine(self, fn: Callable[[WireEngine], None]) -> None:
        if self.engine is None:
            self.pending.append(fn)
        else:
            fn(self.engine)
            if not self.batching:
                self._wire.flush(self)

    def post_list(self, wrs: Sequence[SendWr]) -> list[int]:
        """Post ``wrs`` in one call: the engine takes them all before anything is sent, then what they produced
        leaves together (one `WireFabric.flush`: a batch of datagrams, runs of equal size in one GSO send)."""
        if self.batching:
            return super().post_list(wrs)
        self.batching = True
        try:
            return super().post_list(wrs)
        finally:
            self.batching = False
            self._wire.flush(self)

    def _recv_posted(self, wr_id: int, sge: Sge | None) -> None:
        self._with_engine(lambda e: e.post_recv(wr_id, sge))

    def _post(self, wr: WorkRequest) -> int:
        if self.state is not ConnState.CONNECTED:
            self.cq.push(flushed(wr.wr_id, wr.op, self.name))
            return wr.wr_id
        rt = self._wire.runtime
        if rt.tracing:
            rt.note(self.name, "post", wr=wr.tag, op=wr.op.name, wr_id=wr.wr_id,
                    **({"imm": True} if wr.imm is not None else {}))  # as the emulated fabric notes it
        if wr.src is not None:
            wr.data = gather(wr.src)  # a wire engine sends what the SGEs hold at post time
        self._with_engine(lambda e: e.post(wr))
        return wr.wr_id

    def disconnect(self) -> None:
        if self.engine is not None and self.engine.state is ConnState.CONNECTED:
            self.engine.disconnect()
            self._wire.flush(self)
        self.closing = True
        self._wire._maybe_close(self)


@dataclass
class _Listener:
    node: EmuNode
    sock: socket.socket
    on_accept: Callable[[WireConnection], None]
    names: itertools.count[int] = field(default_factory=lambda: itertools.count(1))


# ---- RoCEv2 connection setup: the out-of-band QP exchange over the TCP side channel (rdma-bindings §5.1: QPN,
# starting PSN, address and UDP port), then the RC engine over the fabric's UDP socket. The side channel stays open
# for the connection's life; its end is the connection's end.


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
            self.fabric.lost(self.conn, f"out-of-band QP exchange: {exc}")
            return
        if got is None:
            return  # incomplete
        self.remote, _used = got
        assert self.local is not None
        engine = self.fabric.make_roce_engine(self.conn, self.local, self.remote)
        self.fabric.set_engine(self.conn, engine)
        engine.start(self.fabric.now)
        self.fabric.flush(self.conn)  # the endpoint attaches (posts its receives) here ...
        if not self.initiator:  # ... before the initiator learns it may send: no RNR NAK for its first Send
            self._send_side(oob.encode(self.local))

    def send(self, payloads: list[bytes]) -> None:
        udp = self.fabric._ensure_udp()
        assert self.remote is not None
        dst = (self.remote.ip, self.remote.port)
        impairer = self.fabric.impairer_for(self.conn)
        if impairer is not None:
            for p in payloads:
                impairer.datagram(f"{self.conn.name}>", p, partial(self._sendto, udp, dst), self.fabric.now)
            return
        sent = self.fabric._send_datagrams(udp, payloads, dst)
        tap = self.conn.tap
        if tap is not None and tap.wants_datagrams:
            src = (self.fabric.roce_address, self.fabric.udp_port)
            for p in sent:
                tap.datagram(src, dst, p, received=False)

    def _sendto(self, udp: socket.socket | QemuSocketLink, dst: tuple[str, int], p: bytes) -> None:
        """One datagram the impairment stage lets go (at once, late or twice)."""
        if self.fabric._udp is not udp:
            return  # the fabric closed while the datagram was held
        try:
            udp.sendto(p, dst)
        except BlockingIOError:
            return  # a full socket buffer drops the datagram: RC retransmits it
        self.fabric._sent_to(dst, 1)
        tap = self.conn.tap
        if tap is not None and tap.wants_datagrams:
            tap.datagram((self.fabric.roce_address, self.fabric.udp_port), dst, p, received=False)


# ---- per-binding strategies: what differs between the wire formats, chosen once per fabric (`WireFabric.wire`)


class IwarpWire:
    """iWARP: RDMAP/DDP/MPA over one TCP byte stream per connection, its engine there from the first byte."""

    name: WireBindingName = "iwarp"
    family = Binding.RDMAP
    writes_acknowledged = False  # an RDMAP Write completes once TCP took it (no acknowledgements, §3.5)
    carries_link = False

    def __init__(self, fabric: WireFabric) -> None:
        self.fabric = fabric

    def listening(self) -> None:
        """A listener is up (the stream is the connection: nothing more to open)."""

    def attach(self, conn: WireConnection, initiator: bool) -> None:
        """The connection's socket is up: the engine starts (the MPA initiator sends its Request)."""
        fab = self.fabric
        engine = fab.make_iwarp_engine(conn, initiator)
        fab.set_engine(conn, engine)
        engine.start(fab.now)
        fab.flush(conn)

    def send(self, conn: WireConnection, out: list[bytes]) -> None:
        """What the engine produced goes on the stream (through the impairment stage, when there is one)."""
        fab = self.fabric
        impairer = fab.impairer_for(conn)
        if impairer is not None:
            for chunk in out:
                impairer.stream(f"{conn.name}>", chunk, partial(fab._stream_out, conn), fab.now)
        else:
            for chunk in out:
                fab._stream_out(conn, chunk, write=False)
            fab._write(conn)

    def inject(self, conn: WireConnection, raw: bytes) -> None:
        fab = self.fabric
        if conn.tap is not None:
            conn.tap.stream(True, raw)
        conn.out += raw
        fab._write(conn)

    def holds_close(self, conn: WireConnection) -> bool:
        """The stream's last bytes (a Terminate) are still held by the impairment stage."""
        impairer = self.fabric.impairer
        return impairer is not None and impairer.held(f"{conn.name}>") and not conn.failed

    def received(self, conn: WireConnection, data: bytes) -> None:
        """Bytes of the stream arrived; from a peer in another process they are impaired here, on the way in."""
        fab = self.fabric
        assert conn.engine is not None
        inbound = fab.impairer_for(conn) if conn.peer_conn is None else None
        if inbound is not None:
            inbound.stream(f"{conn.name}<", data, partial(fab._stream_in, conn), fab.now)
        else:
            fab._stream_in(conn, data)


class RoceWire:
    """RoCEv2: the TCP side channel carries the QP exchange (`RoceSetup`), the packets go over UDP."""

    name: WireBindingName = "roce"
    family = Binding.IB
    writes_acknowledged = True  # IB RC acknowledges every Write before its completion
    carries_link = True  # RoCEv2 frames can go on an Ethernet segment of their own

    def __init__(self, fabric: WireFabric) -> None:
        self.fabric = fabric

    def listening(self) -> None:
        if self.fabric.device is None:  # a device owns UDP 4791 itself
            self.fabric._ensure_udp()

    def attach(self, conn: WireConnection, initiator: bool) -> None:
        conn.setup = RoceSetup(self.fabric, conn, initiator=initiator)
        conn.setup.begin()

    def send(self, conn: WireConnection, out: list[bytes]) -> None:
        conn.setup.send(out)

    def inject(self, conn: WireConnection, raw: bytes) -> None:
        conn.setup.send([raw])

    def holds_close(self, conn: WireConnection) -> bool:
        return False  # the side channel carries no protocol traffic to wait for

    def received(self, conn: WireConnection, data: bytes) -> None:
        conn.setup.side_channel(data)


WireBinding = IwarpWire | RoceWire
_WIRES: dict[str, type[IwarpWire] | type[RoceWire]] = {"iwarp": IwarpWire, "roce": RoceWire}


class WireFabric(RuntimeFabric):
    """The fabric interface in real time over sockets (see the module docstring)."""

    owns_races = False

    def __init__(
        self,
        profile: Profile,
        *,
        binding: WireBindingName | None = None,
        trace: bool = False,
        capture_dir: str | Path | None = None,
        udp_port: int = 0,
        host: str = "127.0.0.1",
        run_timeout: float = RUN_TIMEOUT_S,
        engine_options: dict[str, Any] | None = None,
        link: LinkSpec | None = None,
        gso: bool = False,
        impair: Impairment | None = None,
        loop: RealTimeLoop | None = None,
        device: QpDevice | None = None,
    ) -> None:
        """``loop``: the loop (and its runtime) of a fabric that holds this one as its connection layer (a verbs
        fabric: one loop polls its device and these sockets); ``device``: where RoCE QPs come from then."""
        super().__init__(profile, FifoScheduler(), trace=trace, max_steps=1_000_000,
                         runtime=None if loop is None else loop.runtime)
        self.loop = RealTimeLoop(self.runtime, self) if loop is None else loop
        self._clock = self.loop.clock  # bound once: every arrival reads it
        self.device = device
        wire = _WIRES[binding] if binding else IwarpWire if profile.binding is Binding.RDMAP else RoceWire
        if wire.family is not profile.binding:
            raise FabricUsageError(f"binding {wire.name} cannot carry profile {profile.name} ({profile.binding})")
        self.wire: WireBinding = wire(self)
        self.binding: WireBindingName = wire.name
        self.host = host
        self.writes_acknowledged = wire.writes_acknowledged
        self.run_timeout = run_timeout
        self.engine_options = dict(engine_options or {})
        self.capture_dir = Path(capture_dir) if capture_dir else None
        self._sel = selectors.DefaultSelector()
        self._conns: list[WireConnection] = []
        self._listeners: list[_Listener] = []
        self._readers = 0
        self._udp: socket.socket | QemuSocketLink | None = None
        self._udp_port_wanted = udp_port
        self._udp_port = 0  # the bound port, once the socket exists (a getsockname per packet is a syscall)
        # UDP GSO for runs of equal-sized datagrams (`_send_datagrams`), asked for and on a kernel socket only. Off by
        # default: the kernel numbers a GSO send's datagrams with IPv4 Identification 0, 1, 2, ... where one
        # datagram per send has 0, which the ICRC covers (icrc.py: a receiver that sees the IP header, rxe or a
        # capture's dissector, checks it with the real one), and tcpdump on loopback sees the unsegmented send
        self._gso_wanted = gso
        self._gso = False
        # RoCEv2 packets as frames on an Ethernet segment of their own (the testbed VM's NIC), not UDP via the kernel
        self.link = link
        if link is not None and not wire.carries_link:
            raise FabricUsageError(f"an Ethernet link carries RoCEv2, not {self.binding}")
        self._qpns: dict[int, WireConnection] = {}
        self._sources: dict[Any, Source] = {}  # per peer address: the datagrams' Source (_datagram_in)
        self._rx_batch: list[WireConnection] | None = None  # inside _udp_read: connections to flush after it
        # datagrams sent to this fabric's own socket (both ends here) and not read back yet: _udp_read reads them at
        # once, and stops reading when they are all in (no recvfrom ending in EAGAIN; epoll reports anything else)
        self._self_queued = 0
        # the impairment stage (kvconform.rdma.wire.impair): loss, reordering, duplication, delay on every link
        self.impairer: Impairer | None = Impairer(impair, self.binding) if impair is not None and impair.active \
            else None

    def impair(self, spec: Impairment | None, *, salt: str = "") -> None:
        """Put the impairment stage ``spec`` on every link from now on (None: take it away)."""
        self.impairer = Impairer(spec, self.binding, salt) if spec is not None and spec.active else None

    def impairer_for(self, conn: WireConnection) -> Impairer | None:
        """The impairment stage for ``conn``'s traffic, None when it goes unimpaired."""
        if self.impairer is None or conn.unimpaired or (conn.peer_conn is not None and conn.peer_conn.unimpaired):
            return None
        return self.impairer

    @property
    def now(self) -> float:
        return self._clock()

    # ---- construction --------------------------------------------------------------------------------

    def remote(self, name: str, host: str, port: int) -> RemoteNode:
        """The target (or peer) in another process at ``host:port``."""
        return RemoteNode(name, host, port, self.profile)

    def dial(self, remote: RemoteNode, local: Node, *, name: str | None = None,
             cq: EmuCQ | None = None) -> WireConnection:
        """A connection from ``local`` to a node in another process; returns once it is set up (bounded),
        `WireSetupError` when it cannot be."""
        if not isinstance(local, EmuNode) or local.name not in self.runtime.nodes:
            raise FabricUsageError("dial: the local node must belong to this fabric")
        conn = self._dial(local, f"{name or f'{remote.name}-{local.name}'}.{local.name}", (remote.host, remote.port),
                          cq)
        self.await_ready([conn])
        return conn

    def connect(
        self, a: Node, b: Node, *, name: str | None = None, cq_a: EmuCQ | None = None, cq_b: EmuCQ | None = None
    ) -> tuple[WireConnection, WireConnection]:
        """Both ends in this process, over a real loopback socket pair; returns once both are set up."""
        base = name or f"{a.name}-{b.name}"
        for n in (a, b):
            if not isinstance(n, EmuNode) or n.name not in self.runtime.nodes:
                raise FabricUsageError("connect: nodes must belong to this fabric (dial() reaches other processes)")
        assert isinstance(a, EmuNode) and isinstance(b, EmuNode)
        accepted: list[WireConnection] = []
        listener = self.listen(a, self.host, 0, accepted.append, name_of=lambda n: f"{base}.{a.name}", cq=cq_a)
        try:
            conn = self._dial(b, f"{base}.{b.name}", listener.sock.getsockname()[:2], cq_b)
            self.await_ready([conn], lambda: bool(accepted) and accepted[0].ready)
        finally:
            self.stop_listening(listener)
        conn.peer_name, accepted[0].peer_name = accepted[0].name, conn.name
        conn.peer_conn, accepted[0].peer_conn = accepted[0], conn
        return accepted[0], conn

    def listen(
        self, node: Node, host: str, port: int, on_accept: Callable[[WireConnection], None], *,
        name_of: Callable[[int], str] | None = None, cq: EmuCQ | None = None,
    ) -> _Listener:
        """Serve connections on ``host:port`` (0: any free port; `port_of` tells which); ``on_accept`` gets
        each connection once it is set up. RoCE also binds the fabric's UDP socket (``udp_port``)."""
        if not isinstance(node, EmuNode):
            raise FabricUsageError("listen: a local node of this fabric")
        sock = socket.create_server((host, port), reuse_port=False)
        sock.setblocking(False)
        listener = _Listener(node, sock, on_accept)
        self._listeners.append(listener)
        self._sel.register(sock, selectors.EVENT_READ, ("accept", listener, name_of, cq))
        self.wire.listening()
        return listener

    def stop_listening(self, listener: _Listener) -> None:
        """Close ``listener`` (its connections stay)."""
        self._sel.unregister(listener.sock)
        listener.sock.close()
        self._listeners.remove(listener)

    def add_reader(self, fd: int, callback: Callable[[], None]) -> None:
        """Call ``callback`` whenever ``fd`` is readable (a process's pipe: the cmd: contract's channel)."""
        self._sel.register(fd, selectors.EVENT_READ, ("reader", callback))
        self._readers += 1

    def remove_reader(self, fd: int) -> None:
        self._sel.unregister(fd)
        self._readers -= 1

    @staticmethod
    def port_of(listener: _Listener) -> int:
        return int(listener.sock.getsockname()[1])

    @property
    def udp_port(self) -> int:
        return ROCE_PORT if self.device is not None else self._udp_port

    @property
    def roce_address(self) -> str:
        """The IP address (GID) this fabric's RoCEv2 QPs announce: the device's, the link's on an Ethernet link, else
        ``host``."""
        if self.device is not None:
            return self.device.roce_address
        return self.link.address if self.link is not None else self.host

    @property
    def connections(self) -> tuple[WireConnection, ...]:
        """The connections whose sockets and engines this fabric serves."""
        return tuple(self._conns)

    def forget(self, conn: WireConnection) -> None:
        """Serve ``conn`` no more: its engine was retired by the fabric that holds this one (a verbs QP)."""
        with contextlib.suppress(ValueError):
            self._conns.remove(conn)

    def new_connection(self, node: EmuNode, ep_name: str, cq: EmuCQ | None) -> WireConnection:
        """An endpoint of ``node`` named ``ep_name``, without a transport yet (a listener, dialing or a device's
        connection manager gives it one)."""
        if node.has_connection(ep_name):
            raise FabricUsageError(f"connect: endpoint {ep_name!r} exists; pass name=")
        conn = WireConnection(self, node, ep_name, cq or self.runtime.new_cq(f"{ep_name}.cq"))
        node.add_connection(conn)
        self._conns.append(conn)
        return conn

    def _dial(self, node: EmuNode, ep_name: str, addr: tuple[str, int], cq: EmuCQ | None) -> WireConnection:
        try:
            sock = socket.create_connection(addr, timeout=CONNECT_TIMEOUT_S)
        except OSError as exc:
            raise WireSetupError(f"{self.binding} connection to {addr[0]}:{addr[1]} failed: {exc}") from exc
        conn = self.new_connection(node, ep_name, cq)
        conn.peer_name = f"{addr[0]}:{addr[1]}"
        self._attach_socket(conn, sock, initiator=True)
        return conn

    def _attach_socket(self, conn: WireConnection, sock: socket.socket, *, initiator: bool) -> None:
        sock.setblocking(False)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        conn.sock = sock
        conn.local_addr = sock.getsockname()[:2]
        conn.peer_addr = sock.getpeername()[:2]
        path = None
        if self.capture_dir is not None:
            path = self.capture_dir / f"{conn.name.replace('/', '_')}.{self.binding}.pcap"
        conn.tap = WireTap(conn.local_addr, conn.peer_addr, initiator=initiator, path=path)
        self._sel.register(sock, selectors.EVENT_READ, ("conn", conn))
        self.wire.attach(conn, initiator)

    def make_iwarp_engine(self, conn: WireConnection, initiator: bool) -> Any:
        """The engine of one iWARP connection (a subclass may give a broken one: the harness's wire mutants)."""

        return IwarpEngine(conn.name, self._memory(conn), initiator=initiator, peer=conn.peer_name,
                           **self.engine_options)

    def make_roce_engine(self, conn: WireConnection, local: Any, remote: Any) -> Any:
        """The engine of one RoCEv2 connection, once the QP exchange gave both ends' QP information."""
        if self.device is not None:
            return self.device.make_roce_engine(conn, local, remote)
        options = {"ack_delay_s": ROCE_ACK_DELAY_S, **self.engine_options}
        return RoceEngine(conn.name, self._memory(conn), local=local, remote=remote, pmtu=self.profile.pmtu,
                          masked_atomics=self.profile.masked_atomics, **options)

    def inject(self, conn: WireConnection, raw: bytes) -> None:
        """Put crafted bytes on ``conn``'s wire, past its engine: stream bytes (iWARP) or one UDP payload (RoCEv2)
        to the peer. The wire attacks' way in; the capture records them like any other traffic."""
        self.wire.inject(conn, raw)

    def watch(self, conn: WireConnection) -> list[bytes]:
        """Everything that arrives for ``conn`` from now on, as it arrived and before its engine sees it: each
        datagram (RoCEv2) or each chunk of the stream (iWARP). The wire attacks read the target's answers here
        (a NAK, an ACK of a duplicate) that the connection's own engine consumes."""
        if conn.watched is None:
            conn.watched = []
        # the attacks judge one answer each: the impairment stage leaves the connection alone (a lost NAK would be a
        # false verdict); the impairment checks (test_wire_faults.py) impair the links they watch themselves
        conn.unimpaired = True
        return conn.watched

    def _memory(self, conn: WireConnection) -> _Memory:
        return _Memory(self, conn.node, conn.name, conn)

    def set_engine(self, conn: WireConnection, engine: WireEngine) -> None:
        """``engine`` carries ``conn`` from now on; what was posted before it existed reaches it now."""
        conn.engine = engine
        for fn in conn.pending:
            fn(engine)
        conn.pending.clear()

    def _ensure_udp(self) -> socket.socket | QemuSocketLink:
        if self._udp is None and self.link is not None:
            self._udp = QemuSocketLink(self.link)
            self._sel.register(self._udp, selectors.EVENT_READ, ("udp",))
        if self._udp is None:
            udp = datagram_socket()
            # DF set, so Linux sends IPv4 Identification 0, which the ICRC covers (rdma-vm-testbed.md)
            udp.setsockopt(socket.IPPROTO_IP, 10, 2)  # IP_MTU_DISCOVER = IP_PMTUDISC_DO
            udp.bind((self.host, self._udp_port_wanted))
            udp.setblocking(False)
            self._sel.register(udp, selectors.EVENT_READ, ("udp",))
            self._udp = udp
            self._gso = self._gso_wanted and _GSO_OK
        if not self._udp_port:
            self._udp_port = int(self._udp.getsockname()[1])
        return self._udp

    def _send_datagrams(self, udp: socket.socket | QemuSocketLink, payloads: list[bytes],
                        dst: tuple[str, int]) -> list[bytes]:
        """Send ``payloads`` to ``dst``, each one UDP datagram; the ones the kernel took. With ``gso=True`` runs of
        equal-sized datagrams (a message's Middle packets, a list of posted Read Requests; the run's last may be
        shorter) go in one ``sendmsg`` with UDP GSO (``UDP_SEGMENT``): the kernel cuts them into the same
        datagrams, and one pass through its network stack instead of one per datagram saves about a sixth of the
        CPU of 32 KiB blocks at PMTU 1024 (bench_kbtp_wire.py). Otherwise (the default, an Ethernet link, a kernel
        that refuses GSO) each goes by ``sendto``."""
        sent: list[bytes] = []
        n, k = len(payloads), 0
        while k < n:
            p = payloads[k]
            size, j = len(p), k + 1
            if self._gso and size:
                while (j < n and j - k < _GSO_MAX_SEGMENTS and len(payloads[j]) <= size
                       and (j - k + 1) * size <= _GSO_MAX_BYTES):
                    last = len(payloads[j]) < size
                    j += 1
                    if last:
                        break  # only a run's last segment may be shorter
            try:
                if j - k == 1:
                    udp.sendto(p, dst)
                else:
                    assert isinstance(udp, socket.socket)  # _gso is set only for a kernel socket
                    udp.sendmsg([b"".join(payloads[k:j])], [(socket.SOL_UDP, _UDP_SEGMENT, _GSO_SIZE.pack(size))],
                                0, dst)
            except BlockingIOError:
                k = j
                continue  # a full socket buffer drops the datagrams: RC retransmits them
            except OSError as exc:
                if j - k == 1 or exc.errno not in (errno.EINVAL, errno.ENOPROTOOPT, errno.EOPNOTSUPP, errno.EIO):
                    raise
                self._gso = False  # no UDP GSO here: one datagram at a time from now on
                continue
            sent += payloads[k:j]
            k = j
        self._sent_to(dst, len(sent))
        return sent

    def _sent_to(self, dst: tuple[str, int], n: int) -> None:
        """``n`` datagrams went to ``dst``: counted when that is this very socket (`_self_queued`)."""
        if dst[1] == self._udp_port and self.link is None and dst[0] == self.host:
            self._self_queued += n

    def _register_qpn(self, conn: WireConnection) -> int:
        if self.device is not None:
            return self.device.register_qpn(conn)  # the device demultiplexes its packets itself
        qpn = next(_QPNS)
        self._qpns[qpn] = conn
        self._ensure_udp()
        return qpn

    def await_event(self, predicate: Callable[[], bool], timeout: float) -> bool:
        """Pump I/O only (no actor steps) until ``predicate()`` or ``timeout`` seconds; whether it held."""
        return self.loop.await_event(predicate, timeout)

    def await_ready(self, conns: list[WireConnection], also: Callable[[], bool] | None = None) -> None:
        """Pump I/O only (no actor steps: this may run inside an actor) until ``conns`` are set up (or failed)."""
        def settled() -> bool:
            return all(c.ready or c.state is not ConnState.CONNECTED for c in conns) and (also is None or also())

        if not self.await_event(settled, CONNECT_TIMEOUT_S):
            raise WireSetupError(f"{self.binding} connection setup did not finish within {CONNECT_TIMEOUT_S} s "
                                 f"({[c.name for c in conns if not c.ready]})")
        for c in conns:
            if not c.ready:
                why = c.failed or getattr(c.engine, "failed", "") or "the connection ended"
                raise WireSetupError(f"{self.binding} connection {c.name} was not set up: {why}")

    # ---- the loop (kvconform.rdma.runtime.realtime), and the I/O it polls -------------------------------

    def run(self, *, max_steps: int | None = None) -> RunResult:
        """Run until every non-daemon actor is done, ``max_steps`` or the wall-clock bound (``deadline``)."""
        return self.loop.run_for(self.run_timeout, self.max_steps if max_steps is None else max_steps)

    def serve_forever(self, stop: Callable[[], bool] | None = None) -> None:
        """Serve listeners and their connections (the `kvconform serve` loop) until ``stop()``."""
        self.loop.serve_forever(stop)

    def _loop(self, stop: Callable[[], bool] | None, deadline: float | None, max_steps: int) -> str:
        return self.loop.run(stop, deadline, max_steps)

    def busy(self) -> list[str]:
        """Why the wire is not quiet, for a run that hit its deadline: connections with bytes to send or an engine
        waiting on a timer (a retry, work at a device)."""
        out = []
        for c in self._conns:
            eng = c.engine
            due = eng.next_deadline() if eng is not None else None
            if not c.out and due is None:
                continue
            detail = getattr(eng, "outstanding", lambda: "")()
            out.append(f"{c.name}: {len(c.out)} sends queued, engine timer {'set' if due is not None else 'none'}"
                       + (f", {detail}" if detail else ""))
        return out + [f"{name} waits on a timer" for name in self.runtime.timed_waiter_names()]

    def settled(self) -> bool:
        """Nothing left to send and no engine waiting on a timer (unacknowledged packets, a retry)."""
        return all(not c.out for c in self._conns) and self.engine_deadline() is None

    def live(self) -> bool:
        """A listener, a reader or a connection open: something could still arrive."""
        if self._listeners or self._readers:
            return True
        return any(c.state is ConnState.CONNECTED and c.sock is not None for c in self._conns)

    def engine_deadline(self) -> float | None:
        """The earliest engine timer (or packet held by the impairment stage); None when none is set."""
        times = [t for c in self._conns if c.engine is not None for t in (c.engine.next_deadline(),) if t is not None]
        if self.impairer is not None and (held := self.impairer.next_deadline()) is not None:
            times.append(held)  # a packet held by the impairment stage: the wire is not quiet
        return min(times) if times else None

    def engine_timers(self) -> None:
        """Run the engine timers (and the impairment stage's held packets) that are due."""
        now = self._clock()
        if self.impairer is not None:
            self.impairer.poll(now)
        due = [c for c in self._conns if c.engine is not None and (t := c.engine.next_deadline()) is not None
               and t <= now]  # (asked on every turn of the loop: mostly none)
        for c in due:
            e = c.engine
            if e is not None:
                self._io(c, partial(e.poll_timers, now), "timer")

    def _io(self, conn: WireConnection, fn: Callable[[], None], what: str, *, flush: bool = True) -> None:
        """Run engine work (arrival, timer) as a trace record, then deliver its output and completions (unless
        ``flush`` is False: the caller flushes later)."""
        rt = self.runtime
        if rt.tracing:
            rt.pending_notes = []
        fn()
        if rt.tracing:
            rt.steps += 1
            self.loop.record(f"{conn.name}:{what}", conn.name)
        if flush:
            self.flush(conn)

    def flush(self, conn: WireConnection) -> None:
        """Send what the engine produced and hand its completions to the CQ (waking actors)."""
        engine = conn.engine
        if engine is None:
            return
        out = engine.take_output()
        if out:
            self.wire.send(conn, out)
        for wc in engine.take_completions():
            if wc.op in (Op.RECV, Op.RECV_RDMA_WITH_IMM) and conn.rq:
                conn.rq.popleft()  # receives complete in the order they were posted (RC)
            conn.cq.push(wc)
        if not conn.ready and engine.established:
            conn.ready = True
            self._accepted(conn)
            # what arrived behind the connection setup is processed now that its receives are posted
            self._io(conn, partial(engine.receive, b"", self._clock()), "rx")
        if engine.state is not ConnState.CONNECTED:
            self.runtime.events.append((conn.name, engine.terminate))
            self._maybe_close(conn)

    def _stream_out(self, conn: WireConnection, chunk: bytes, *, write: bool = True) -> None:
        if conn.sock is None:
            return  # the connection ended while the chunk was held
        if conn.tap is not None:
            conn.tap.stream(True, chunk)
        conn.out += chunk
        if write:
            self._write(conn)

    def _stream_in(self, conn: WireConnection, data: bytes) -> None:
        if conn.engine is None:
            return
        if conn.tap is not None:
            conn.tap.stream(False, data)
        self._io(conn, partial(conn.engine.receive, data, self._clock()), "rx")

    def _accepted(self, conn: WireConnection) -> None:
        cb = getattr(conn, "_on_accept", None)
        if cb is not None:
            conn._on_accept = None  # type: ignore[attr-defined]
            cb(conn)

    def _write(self, conn: WireConnection) -> None:
        sock = conn.sock
        if sock is None or not conn.out:
            return
        try:
            n = sock.send(conn.out)
            del conn.out[:n]
        except BlockingIOError:
            pass
        except OSError as exc:
            conn.out.clear()
            self._read_to_end(conn, f"send failed: {exc}")
            return
        events = selectors.EVENT_READ | (selectors.EVENT_WRITE if conn.out else 0)
        with contextlib.suppress(KeyError):  # (unregistered: the peer's end was read, the stage holds its FIN)
            self._sel.modify(sock, events, ("conn", conn))
        self._maybe_close(conn)

    def _maybe_close(self, conn: WireConnection) -> None:
        """Close the socket once the connection has ended and its last bytes (a Terminate) are out."""
        ended = conn.closing or (conn.engine is not None and conn.engine.state is not ConnState.CONNECTED) \
            or bool(conn.failed)
        if not ended or conn.out or conn.sock is None:
            return
        if self.wire.holds_close(conn):
            return  # its last bytes (a Terminate) are still held by the impairment stage
        sock, conn.sock = conn.sock, None
        with contextlib.suppress(KeyError, ValueError):
            self._sel.unregister(sock)
        with contextlib.suppress(OSError):
            sock.shutdown(socket.SHUT_RDWR)
        sock.close()
        if conn.tap is not None:
            conn.tap.close()
        if conn in self._conns and (conn.engine is None or conn.engine.state is not ConnState.CONNECTED):
            self._conns.remove(conn)  # nothing more can arrive for it (a long-running server must not grow)
            self._qpns = {q: c for q, c in self._qpns.items() if c is not conn}
            if self.impairer is not None:
                self.impairer.forget(conn.name)

    def lost(self, conn: WireConnection, why: str) -> None:
        """The transport ended (FIN, reset): the engine flushes; before setup, the setup failed."""
        if conn.engine is None or not conn.ready:
            conn.failed = conn.failed or why
        if conn.engine is not None:
            conn.engine.transport_closed()
            self.flush(conn)
        conn.closing = True
        conn.out.clear()
        self._maybe_close(conn)

    def poll_io(self, timeout: float) -> int:
        """Handle what is ready within ``timeout`` seconds; the number of ready channels."""
        ready = self._sel.select(timeout)
        for key, events in ready:
            kind = key.data[0]
            if kind == "accept":
                self._accept(*key.data[1:])
            elif kind == "reader":
                key.data[1]()
            elif kind == "udp":
                self._udp_read()
            else:
                conn: WireConnection = key.data[1]
                if events & selectors.EVENT_WRITE:
                    self._write(conn)
                if events & selectors.EVENT_READ and conn.sock is not None:
                    self._read(conn)
        return len(ready)

    def _accept(self, listener: _Listener, name_of: Callable[[int], str] | None, cq: EmuCQ | None) -> None:
        try:
            sock, addr = listener.sock.accept()
        except (BlockingIOError, InterruptedError):
            return
        n = next(listener.names)
        ep_name = name_of(n) if name_of else f"c{n}-{addr[0]}:{addr[1]}.{listener.node.name}"
        conn = self.new_connection(listener.node, ep_name, cq)
        conn.peer_name = f"{addr[0]}:{addr[1]}"
        conn._on_accept = listener.on_accept  # type: ignore[attr-defined]
        self._attach_socket(conn, sock, initiator=False)

    def _read(self, conn: WireConnection) -> None:
        sock = conn.sock
        assert sock is not None
        try:
            data = sock.recv(_RECV)
        except (BlockingIOError, InterruptedError):
            return
        except OSError as exc:
            self.lost(conn, f"receive failed: {exc}")
            return
        if not data:
            self._end_after_held(conn, "the peer closed the connection")
            return
        if conn.watched is not None:
            conn.watched.append(data)
        self.wire.received(conn, data)

    def _end_after_held(self, conn: WireConnection, why: str) -> None:
        """The stream ended: ``lost``, after what the impairment stage still holds for the connection."""
        lost = partial(self.lost, conn, why)
        if self.impairer is None:
            lost()
            return
        if conn.sock is not None:
            with contextlib.suppress(KeyError, ValueError):
                self._sel.unregister(conn.sock)  # (an ended stream stays readable: read it once)
        peer = [] if conn.peer_conn is None else [f"{conn.peer_conn.name}>"]
        self.impairer.after([f"{conn.name}<", *peer], lost, self.now)

    def _read_to_end(self, conn: WireConnection, why: str) -> None:
        """A write failed (the peer reset the stream): what it sent before, still unread (its Terminate), is
        processed first, then the stream ends; processed after, the connection would seem to have ended cleanly."""
        sock = conn.sock
        for _ in range(64):  # bounded: a reset stream has only what arrived before the reset
            if sock is None:
                break
            try:
                data = sock.recv(_RECV)
            except OSError:
                break
            if not data:
                break
            if conn.watched is not None:
                conn.watched.append(data)
            self.wire.received(conn, data)
        self._end_after_held(conn, why)

    def _udp_read(self) -> None:
        udp = self._udp
        assert udp is not None
        # The socket is drained (a bounded batch) before the engines' output and completions are flushed, once per
        # connection: the datagrams that arrived together cost one pass through flush, and an engine answers a
        # run of requests with one coalesced ACK (RoceEngine._ack)
        # arrivals (in one process, the answers to what was just flushed) are read again at once, within one bound
        left = 64  # so actors and timers get their turn
        while left > 0:
            batch = self._rx_batch = []
            try:
                read = self._udp_batch(udp, left)
            finally:
                self._rx_batch = None
                for conn in batch:
                    self.flush(conn)
            if not read or not self._self_queued:
                return  # nothing arrived, or nothing this fabric sent itself waits
            left -= read

    def _udp_batch(self, udp: socket.socket | QemuSocketLink, limit: int) -> int:
        """Read and process up to ``limit`` datagrams, until the socket is empty or the last datagram this fabric sent
        itself is in (`_self_queued`); how many were read."""
        me = (self.host, self._udp_port)
        for n in range(limit):
            try:
                data, addr = udp.recvfrom(_RECV)
            except (BlockingIOError, InterruptedError):
                self._self_queued = 0  # what is missing was dropped (a full buffer) or comes later: epoll tells
                return n
            except OSError as exc:
                if exc.errno in (errno.ECONNREFUSED, errno.EHOSTUNREACH):
                    continue  # an ICMP error for an earlier datagram: RC recovers by retransmission
                raise
            last = False
            if self._self_queued and addr == me:
                self._self_queued -= 1
                last = not self._self_queued
            qpn = int.from_bytes(data[5:8], "big") if len(data) >= 12 else -1
            conn = self._qpns.get(qpn)
            if conn is not None and conn.engine is not None:  # else no such QP: silently dropped, as an RNIC does
                impairer = None if self.impairer is None else self.impairer_for(conn)
                if impairer is not None and tuple(addr[:2]) != (self.roce_address, self.udp_port):
                    # from a peer in another process (what this fabric sent itself was impaired when it was sent)
                    impairer.datagram(f"{conn.name}<", data, partial(self._datagram_in, conn, addr), self.now)
                else:
                    self._datagram_in(conn, addr, data)
            if last:
                return n + 1  # (anything else waiting, from another process, makes the socket readable still)
        return limit

    def _datagram_in(self, conn: WireConnection, addr: Any, data: bytes) -> None:
        if conn.engine is None or self._udp is None:
            return
        if conn.tap is not None and conn.tap.wants_datagrams:
            conn.tap.datagram(addr[:2], (self.roce_address, self.udp_port), data, received=True)
        if conn.watched is not None:
            conn.watched.append(data)
        # a link knows the packet's IPv4 Identification (addr[2]); through a socket it is a DF sender's 0: one Source
        # per peer address then, not one per datagram
        source = Source(addr[0], addr[1], addr[2]) if self.link is not None else self._sources.get(addr)
        if source is None:
            if len(self._sources) >= 256:
                self._sources.clear()  # (peers come and go on a long-running server)
            source = self._sources[addr] = Source(addr[0], addr[1])
        batch = self._rx_batch
        if self.runtime.tracing:
            self._io(conn, partial(conn.engine.receive, data, self._clock(), source), "rx", flush=batch is None)
        else:  # (what _io does when nothing records, without a partial per datagram)
            conn.engine.receive(data, self._clock(), source)
            if batch is None:
                self.flush(conn)
        if batch is not None and conn not in batch:
            batch.append(conn)

    def close(self) -> None:
        """Close every socket (connections end as if the host went away)."""
        for conn in list(self._conns):
            conn.closing = True
            conn.out.clear()
            self._maybe_close(conn)
        for listener in self._listeners:
            self._sel.unregister(listener.sock)
            listener.sock.close()
        self._listeners.clear()
        if self._udp is not None:
            self._sel.unregister(self._udp)
            self._udp.close()
            self._udp = None
            self._udp_port = 0
        self._sel.close()
