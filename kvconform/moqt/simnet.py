"""An in-memory UDP network for QUIC endpoints on a `VirtualClockLoop`; the harness moves every datagram (issue 24).

Each datagram a transport sends becomes one *step* (`kvconform.rdma.scheduler.Step`) labelled
``<src>><dst>#<n>`` (the n-th datagram on that direction; a duplicate adds ``+dup``). Faults are decided when the
datagram is sent, from the seeded `Faults` plan: dropped (loss), sent twice (duplication), and delayed by a base
delay plus a whole number of jitter quanta. Datagrams that arrive at the same virtual time are enabled together, and
the scheduler (FIFO, seeded random, PCT, script: the RDMA fabric's own policies) picks which one the receiver gets
next, one per loop turn, so the receiving endpoint runs between deliveries. The labels chosen form the run's
*schedule*; with the same fault seed, a `ScriptScheduler` over a schedule replays the run.

Servers get `tls.fixed_size_certificate` (handshakes of the same length every run: packet sizes drive aioquic's
pacing, so a signature a byte longer would move every later timer). Endpoints are named by address:
``name(addr, "relay")`` before binding gives a port a readable label, otherwise
``udp<port>``. Ports are handed out from 40000 up in binding order, so they too are a function of the run.
"""

from __future__ import annotations

import asyncio
import contextvars
import random
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

from kvconform.argtypes import sim_fault_fields
from kvconform.moqt import tls
from kvconform.rdma.scheduler import FifoScheduler, ScheduleError, Scheduler, Step

__all__ = ["Faults", "SimNetwork", "SimTransport"]

Addr = tuple[str, int]
FIRST_PORT = 40000


@dataclass(frozen=True, slots=True)
class Faults:
    """The seeded fault plan: probabilities per datagram and the delay model (seconds of virtual time)."""

    seed: int = 0
    loss: float = 0.0
    duplicate: float = 0.0
    delay: float = 0.005  # one-way base delay
    jitter_quantum: float = 0.001  # delays are delay + k * quantum, k uniform in [0, jitter_steps]
    jitter_steps: int = 0
    handshake_loss: bool = False  # whether the first datagrams of a link (its handshake) may be lost too
    reliable_first: int = 4  # without handshake_loss: this many first datagrams per direction are never dropped
    # Stream interleaving: an endpoint with data pending on several streams serves those of one send priority in
    # an order drawn from the seed, instead of aioquic's round-robin (which a correct peer must not rely on).
    interleave: bool = False

    @classmethod
    def from_spec(cls, spec: str, seed: int, base: Faults | None = None) -> Faults:
        """``loss=P,dup=P,jitter=K,delay=MS,interleave=0|1`` (``kvconform run --sim-faults``, parsed by
        `kvconform.argtypes.sim_fault_fields`) over ``base``; a wrong key or value raises ValueError naming it."""
        return replace(base if base is not None else cls(), seed=seed, **sim_fault_fields(spec))

    def describe(self) -> dict[str, object]:
        return {"seed": self.seed, "loss": self.loss, "duplicate": self.duplicate, "delay": self.delay,
                "jitter": f"{self.jitter_steps}x{self.jitter_quantum}", "interleave": self.interleave}


@dataclass(slots=True)
class _Stats:
    sent: int = 0
    delivered: int = 0
    dropped: int = 0
    duplicated: int = 0
    reordered: int = 0  # deliveries the scheduler took out of arrival order
    interleaved: int = 0  # sends whose stream order the seed drew (Faults.interleave)


def _streams_hash_by_id() -> None:
    """aioquic moves the streams a packet served to the end of its service queue in the iteration order of a set of
    ``QuicStream`` objects (``QuicConnection._write_application``): by their addresses, which differ between
    processes, so which stream's data the next packet carries first did too (seen as two fill streams' ends arriving
    in either order). Hashing a stream by its id (unique in its connection; equality stays identity) makes that
    order a function of the run. Harmless on sockets too; set once a SimNetwork exists."""
    from aioquic.quic.stream import QuicStream  # lazy: aioquic's TLS stack, as kvconform.moqt.quic imports it

    if QuicStream.__hash__ is not _stream_hash:
        QuicStream.__hash__ = _stream_hash  # type: ignore[method-assign,assignment]


def _stream_hash(stream: Any) -> int:
    return int(stream.stream_id)


@dataclass(slots=True)
class SimNetwork:
    """The links between `SimTransport`s of one loop; ``loop.network = SimNetwork(loop, ...)`` attaches it."""

    loop: asyncio.AbstractEventLoop
    scheduler: Scheduler = field(default_factory=FifoScheduler)
    faults: Faults = field(default_factory=Faults)
    schedule: list[str] = field(default_factory=list)  # the labels of the datagrams delivered, in order
    stats: _Stats = field(default_factory=_Stats)
    on_deliver: Callable[[str, bytes], None] | None = None
    error: ScheduleError | None = None  # the schedule script could not be followed (the run is not the script's)
    _bound: dict[Addr, SimTransport] = field(default_factory=dict)
    _names: dict[Addr, str] = field(default_factory=dict)
    _next_port: int = FIRST_PORT
    _counts: dict[str, int] = field(default_factory=dict)
    _enabled: list[Step] = field(default_factory=list)
    _turn_scheduled: bool = False
    _rng: random.Random = field(init=False)

    def __post_init__(self) -> None:
        self._rng = random.Random(self.faults.seed)
        _streams_hash_by_id()

    def name(self, addr: Addr, label: str) -> None:
        """Call the endpoint that will be bound at ``addr`` ``label`` in step labels."""
        self._names[addr] = label

    def label_of(self, addr: Addr) -> str:
        return self._names.get(addr) or f"udp{addr[1]}"

    def create_endpoint(self, protocol: asyncio.DatagramProtocol, local_addr: Addr | None,
                        remote_addr: Addr | None) -> SimTransport:
        host = local_addr[0] if local_addr is not None else "127.0.0.1"
        port = local_addr[1] if local_addr is not None else 0
        if port == 0:
            while (host, self._next_port) in self._bound:
                self._next_port += 1
            port = self._next_port
            self._next_port += 1
        addr = (host, port)
        if addr in self._bound:
            raise OSError(f"simnet: {addr} is already bound")
        transport = SimTransport(self, protocol, addr, remote_addr)
        self._bound[addr] = transport
        configuration = getattr(protocol, "_configuration", None)  # an aioquic QuicServer's
        if configuration is not None and not configuration.is_client:
            # handshakes of one length every run (see tls.fixed_size_certificate)
            tls.install_server_certificate(configuration, tls.fixed_size_certificate())
        protocol.connection_made(transport)
        return transport

    def unbind(self, transport: SimTransport) -> None:
        if self._bound.get(transport.local) is transport:
            del self._bound[transport.local]

    def send(self, src: Addr, dst: Addr, data: bytes) -> None:
        """One datagram from ``src`` to ``dst``: faults decided now, delivery scheduled at its arrival time."""
        link = f"{self.label_of(src)}>{self.label_of(dst)}"
        n = self._counts.get(link, 0)
        self._counts[link] = n + 1
        self.stats.sent += 1
        faults = self.faults
        rng = self._rng
        may_lose = faults.handshake_loss or n >= faults.reliable_first
        if faults.loss and rng.random() < faults.loss and may_lose:
            self.stats.dropped += 1
            return
        copies = [f"{link}#{n}"]
        if faults.duplicate and rng.random() < faults.duplicate:
            copies.append(f"{link}#{n}+dup")
            self.stats.duplicated += 1
        for label in copies:
            delay = faults.delay + faults.jitter_quantum * (rng.randint(0, faults.jitter_steps)
                                                            if faults.jitter_steps else 0)
            step = Step(label, link, _Delivery(self, src, dst, bytes(data), label))
            self.loop.call_at(self.loop.time() + delay, self._arrive, step)

    def order_streams(self, streams: list[Any]) -> None:
        """Reorder an endpoint's streams with pending data (aioquic's service queue, in place) when the plan
        interleaves; the adapter's stable sort by send priority comes after, so priorities still hold."""
        if self.faults.interleave:
            self._rng.shuffle(streams)
            self.stats.interleaved += 1

    def _arrive(self, step: Step) -> None:
        self._enabled.append(step)
        if not self._turn_scheduled:
            self._turn_scheduled = True
            self.loop.call_soon(self._turn)

    def _turn(self) -> None:
        """Deliver one enabled datagram (the scheduler's pick), then yield to the endpoints before the next."""
        self._turn_scheduled = False
        enabled = self._enabled
        if not enabled:
            return
        try:
            index = self.scheduler.choose(enabled)  # with one enabled too: a script advances on it
        except ScheduleError as exc:  # raised in a loop callback it would only be logged: kept, and FIFO goes on
            if self.error is None:
                self.error = exc
            self.scheduler = FifoScheduler()
            index = 0
        if index:
            self.stats.reordered += 1
        step = enabled.pop(index)
        self.schedule.append(step.label)
        step.fn()
        if enabled:
            self._turn_scheduled = True
            self.loop.call_soon(self._turn)


class _Delivery:
    """The action of a delivery step (a class, not a closure: its fields show in a debugger)."""

    __slots__ = ("data", "dst", "label", "net", "src")

    def __init__(self, net: SimNetwork, src: Addr, dst: Addr, data: bytes, label: str) -> None:
        self.net, self.src, self.dst, self.data, self.label = net, src, dst, data, label

    def __call__(self) -> None:
        target = self.net._bound.get(self.dst)
        if target is None or target.closing:
            return  # nothing listens there any more: a real network drops it too
        remote = target.remote
        if remote is not None and remote != self.src:
            return  # a connected socket takes datagrams from its peer only
        self.net.stats.delivered += 1
        if self.net.on_deliver is not None:
            self.net.on_deliver(self.label, self.data)
        # In the receiver's context, as a socket's reader callback runs: what a relay starts on a datagram is the
        # relay's (its tasks outlive the sender's run), not the sender's
        target.context.run(target.protocol.datagram_received, self.data, self.src)


class SimTransport(asyncio.DatagramTransport):
    """A datagram transport bound to an address of a `SimNetwork` (what `create_datagram_endpoint` returns)."""

    def __init__(self, net: SimNetwork, protocol: asyncio.DatagramProtocol, local: Addr, remote: Addr | None) -> None:
        super().__init__()
        self.net = net
        self.protocol = protocol
        self.local = local
        self.remote = remote
        self.closing = False
        self.context = contextvars.copy_context()  # the endpoint's, as asyncio's add_reader keeps it

    def sendto(self, data: bytes | bytearray | memoryview, addr: Any = None) -> None:
        if self.closing:
            return
        dst = self.remote if addr is None else (str(addr[0]), int(addr[1]))
        if dst is None:
            raise OSError("simnet: sendto without an address on an unconnected transport")
        self.net.send(self.local, dst, bytes(data))

    def order_streams(self, streams: list[Any]) -> None:
        self.net.order_streams(streams)

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        if name == "sockname":
            return self.local
        if name == "peername":
            return self.remote if self.remote is not None else default
        return default

    def is_closing(self) -> bool:
        return self.closing

    def close(self) -> None:
        if not self.closing:
            self.closing = True
            self.net.unbind(self)
            self.net.loop.call_soon(self.protocol.connection_lost, None)

    def abort(self) -> None:
        self.close()

    def get_write_buffer_size(self) -> int:
        return 0
