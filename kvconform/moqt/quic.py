"""asyncio + aioquic adapter for the sans-I/O MOQT session (profile §1: native QUIC, ALPN `moqt-22`).

The adapter only moves bytes: QUIC events go into `Session.receive_*`, the session's commands
(`WriteStream`, `ResetStream`, `StopSending`, `SendDatagram`, `CloseConnection`) go to the
`QuicConnection`, and the session's events come out of `MoqtConnection.next_event(timeout)`.
QUIC DATAGRAM (RFC 9221) is always offered and required from the peer (profile §1).
Every wait has a bound: each async method takes `timeout` and raises `TimeoutError` past it.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import functools
import ipaddress
import socket
import struct
import sys
import threading
from collections.abc import Awaitable, Callable, Coroutine, Iterator, Sequence
from contextvars import ContextVar
from typing import TYPE_CHECKING, Any, TextIO, TypeVar, cast

from aioquic._buffer import Buffer, BufferReadError  # aioquic.buffer re-exports these implicitly
from aioquic.quic import events as qe
from aioquic.quic.logger import QuicFileLogger
from aioquic.quic.packet import QuicTransportParameters, pull_quic_transport_parameters  # the qlog's import anyway

from kvconform import evidence
from kvconform.capture import hooks as capture
from kvconform.capture.qlog import TraceLogger
from kvconform.moqt import tls
from kvconform.moqt.errors import SessionError
from kvconform.moqt.session import (
    CloseConnection,
    Event,
    ResetStream,
    Role,
    SendDatagram,
    Session,
    SessionClosed,
    SessionConfig,
    StopSending,
    WriteStream,
)
from kvconform.moqt.url import MoqtUrl, parse_url

# aioquic's connection, configuration and asyncio layers import its TLS stack (cryptography's x509 among it): about
# 0.1 s of every start of a run, a third of it. They are imported where a connection is made or served; the
# protocol class is put together then too (``_protocol_class``).
if TYPE_CHECKING:
    from aioquic.asyncio.protocol import QuicConnectionProtocol
    from aioquic.asyncio.server import QuicServer
    from aioquic.quic.configuration import QuicConfiguration
    from aioquic.quic.connection import QuicConnection

    _ProtocolBase = QuicConnectionProtocol
else:
    _ProtocolBase = object

__all__ = ["ALPN", "AlpnRefused", "LoopThread", "MoqtConnection", "MoqtServer", "connect", "granting_stream_data_uni",
           "granting_streams_uni",
           "peer_transport_parameters", "quic_configuration", "serve", "tapping"]

T = TypeVar("T")

ALPN = "moqt-22"  # profile §1: the only version negotiation there is

# Large enough for any object datagram on loopback; the value only has to be non-zero to negotiate DATAGRAM.
MAX_DATAGRAM_FRAME_SIZE = 65536
DEFAULT_TIMEOUT = 5.0
# Datagram size once the handshake is done, when the peer is on loopback (every harness endpoint is): at
# most this and at most the peer's max_udp_payload_size (RFC 9000 §18.2; absent = 65527). aioquic's cost
# is per packet, so 1200-byte datagrams cap a bulk transfer at a few MB/s per core; picoquic peers
# advertise 1440, aioquic peers nothing. Other paths keep aioquic's 1200 (no PMTU discovery there).
LOOPBACK_MAX_DATAGRAM_SIZE = 16384
HANDSHAKE_TIMEOUT = 10.0  # a server waits this long for a new connection's handshake
# Batched I/O (bench/bench_moqt_relay.py, docs/interop-aiomoqt.md "Benchmark"): a server socket's readiness reads
# up to READ_BATCH datagrams, and each connection they reached sends once after them, not once per datagram;
# a send pass hands runs of equal-sized datagrams to one address to the kernel in one sendmsg with UDP GSO
# (Linux UDP_SEGMENT; at most GSO_MAX_SEGMENTS and GSO_MAX_BYTES per call), falling back to one sendto each
# where GSO is refused, the transport has a backlog, or the harness records the datagrams.
READ_BATCH = 64
# A server socket's receive and send buffers (the kernel caps them at net.core.rmem_max / wmem_max): with the
# default ~208 KiB a publisher's burst overflowed the receive buffer while the relay was busy (every drop cost
# the publisher a loss recovery), and a relay's GSO runs to several subscribers filled the send buffer, after
# which asyncio queued every datagram and sent them one by one.
SERVER_SOCKET_BUFFER = 4 * 1024 * 1024
GSO_MAX_SEGMENTS = 64
GSO_MAX_BYTES = 65000  # below IPv4's 65507-byte UDP payload (the kernel's limit for the whole GSO send)
_UDP_SEGMENT = 103  # linux/udp.h; socket.UDP_SEGMENT only from Python 3.12
_SOL_UDP = getattr(socket, "SOL_UDP", 17)
# QUIC CRYPTO_ERROR carrying TLS alert 120 no_application_protocol: no ALPN in common (RFC 9001 §4.8, RFC 7301 §3.2)
NO_APPLICATION_PROTOCOL = 0x100 + 120


class AlpnRefused(ConnectionError):
    """The peer selected another ALPN than ours, or none of those offered: it speaks another draft (profile §1:
    the ALPN is the only version negotiation). One line names both, the same for every session that meets it."""

    def __init__(self, peer: str, offered: Sequence[str], selected: str | None) -> None:
        choice = f"it selected {selected!r}" if selected else "it selected none of them (TLS no_application_protocol)"
        super().__init__(f"ALPN: offered {', '.join(map(repr, offered))} to {peer}; {choice}; this harness speaks "
                         f"{ALPN!r} only (MOQT-SETUP-ALPN, profile §1)")
        self.offered = tuple(offered)
        self.selected = selected

Handler = Callable[["MoqtConnection"], Awaitable[None]]


def quic_configuration(
    *,
    is_client: bool,
    alpn: Sequence[str] = (ALPN,),
    verify: bool | bytes = False,
    certificate: tls.TestCertificate | None = None,
    idle_timeout: float = 30.0,
    server_name: str | None = None,
    qlog_dir: str | None = None,
    secrets_log: TextIO | None = None,
) -> QuicConfiguration:
    """A QuicConfiguration for MOQT: ALPN list, DATAGRAM negotiated, TLS as `tls` describes.

    `verify`: False = accept any server certificate (client default); True = pin the process test
    certificate; bytes = pin that PEM. Servers get `certificate` (default: the process test certificate).
    Evidence (DESIGN principle 6): `qlog_dir` gets one qlog per connection, `secrets_log` the TLS key log
    (SSLKEYLOGFILE format) so a pcap of the test decrypts in Wireshark; without them, the running capture's
    (``kvconform.capture``: per check, beside the evidence), if any.
    """
    from aioquic.quic.configuration import QuicConfiguration  # lazy: aioquic's TLS stack (see above)

    quic_logger, keylog = capture.quic_logging(TraceLogger)
    configuration = QuicConfiguration(
        is_client=is_client,
        alpn_protocols=list(alpn),
        max_datagram_frame_size=MAX_DATAGRAM_FRAME_SIZE,
        idle_timeout=idle_timeout,
        server_name=server_name,
        quic_logger=QuicFileLogger(qlog_dir) if qlog_dir is not None else quic_logger,
        secrets_log_file=secrets_log if secrets_log is not None else keylog,
    )
    if is_client:
        if verify is False:
            tls.skip_verification(configuration)
        else:
            tls.pin_certificate(configuration, None if verify is True else verify)
    else:
        tls.install_server_certificate(configuration, certificate)
    return configuration


class MoqtProtocol(_ProtocolBase):
    """One QUIC connection carrying one MOQT session; owned by a `MoqtConnection`. Made by ``new_protocol``:
    the class that runs is this one on aioquic's ``QuicConnectionProtocol``, joined when QUIC is first used."""

    def __init__(self, quic: QuicConnection, *, session: Session, transcript: bool = False, **kwargs: Any) -> None:
        super().__init__(quic, **kwargs)
        self.session = session
        # Record every command and event in the running test's evidence (DESIGN principle 6).
        self.transcript = transcript
        self.events: asyncio.Queue[Event] = asyncio.Queue()
        self.established = asyncio.Event()
        self.terminated = asyncio.Event()
        self.alpn: str | None = None
        self.refused: OSError | None = None  # the peer's host said nothing listens there (client side)
        self.alpn_refusal: str | None = None  # a client offered no ALPN of ours (server side): one line saying so
        self._pump_scheduled = False
        # when_sent: (streams, callback) waiting until those streams' data and FIN have left once
        self._sent_waiters: list[tuple[tuple[int, ...], Callable[[], None]]] = []
        self.tap = _TAP.get()  # the deterministic transport's transcript (kvconform.moqt.simrun), if one runs
        session.on_pending = self._schedule_pump

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # The capture (if one runs) records the datagrams of this socket or watches its ports.
        super().connection_made(capture.udp_transport(transport))

    def datagram_received(self, data: bytes | str, addr: Any) -> None:
        if isinstance(data, bytes):
            capture.udp_received(self._transport, data, addr)
        batch = _READ_BATCH.pending
        if batch is None:
            super().datagram_received(data, addr)
            return
        # Inside a batched read (`_batch_reads`): take the datagram and its events now, send once after the batch.
        self._quic.receive_datagram(cast(bytes, data), addr, now=self._loop.time())
        self._process_events()
        batch[self] = None

    def quic_event_received(self, event: qe.QuicEvent) -> None:
        session = self.session
        if isinstance(event, qe.HandshakeCompleted):
            self.alpn = event.alpn_protocol
            if event.alpn_protocol != ALPN:
                refused = AlpnRefused("the peer", self._quic.configuration.alpn_protocols or (), event.alpn_protocol)
                session.close(SessionError.PROTOCOL_VIOLATION, str(refused))
            elif not getattr(self._quic, "_remote_max_datagram_frame_size", None):
                # profile §1: QUIC DATAGRAM MUST be negotiated even if no datagrams are sent.
                session.close(SessionError.PROTOCOL_VIOLATION, "peer did not negotiate QUIC DATAGRAM (RFC 9221)")
            else:
                session.start()
            _tune_after_handshake(self._quic)
            self.established.set()
        elif isinstance(event, qe.StreamDataReceived):
            session.receive_stream_data(event.stream_id, event.data, event.end_stream)
        elif isinstance(event, qe.StreamReset):
            session.receive_stream_reset(event.stream_id, event.error_code)
        elif isinstance(event, qe.StopSendingReceived):
            session.receive_stop_sending(event.stream_id, event.error_code)
        elif isinstance(event, qe.DatagramFrameReceived):
            session.receive_datagram(event.data)
        elif isinstance(event, qe.ConnectionTerminated):
            # aioquic gives an application CONNECTION_CLOSE (0x1d, a MOQT session close) no frame type; a
            # transport close (0x1c), an idle timeout and a lost path carry one.
            session.connection_terminated(event.error_code, event.reason_phrase,
                                          transport=event.frame_type is not None)
            if event.error_code == NO_APPLICATION_PROTOCOL and self.alpn is None and not self._quic._is_client:
                # A client whose ALPNs are none of ours: aioquic's TLS refused its ClientHello (server side).
                paths = getattr(self._quic, "_network_paths", None) or []
                peer = f"{paths[0].addr[0]}:{paths[0].addr[1]}" if paths else "a client"
                self.alpn_refusal = (f"ALPN: {peer} offered none of {ALPN!r}: the handshake ended with TLS alert "
                                     f"120 no_application_protocol; this harness speaks {ALPN!r} only "
                                     "(MOQT-SETUP-ALPN, profile §1)")
            self.established.set()  # wake a waiter for a handshake that will never complete
            self.terminated.set()
        # No transmit here: aioquic calls `transmit()` right after handing over a datagram's (or a
        # timer's) events, and `transmit()` applies the session's commands first, so a datagram
        # costs one send pass instead of one per QUIC event.

    def error_received(self, exc: Exception) -> None:
        """An ICMP error on the client's connected socket: port unreachable before the handshake completes
        means nothing listens at the peer's address (the connect fails at once instead of timing out)."""
        if isinstance(exc, ConnectionRefusedError) and not self.established.is_set():
            self.refused = exc
            self.established.set()

    def transmit(self) -> None:
        """Apply the session's commands, send in its priority order (profile §11.1; aioquic itself
        only round-robins), then queue its events."""
        self._apply_commands()
        queue = getattr(self._quic, "_streams_queue", None)
        if isinstance(queue, list) and len(queue) > 1 and _several_pending(queue):
            order_streams = getattr(self._transport, "order_streams", None)  # the simulated network's (simnet)
            if order_streams is not None:
                order_streams(queue)
            queue.sort(key=lambda stream: self.session.send_priority(stream.stream_id))  # stable: keeps RR order
        if _gso_transport(self._transport) is None:
            super().transmit()
        else:
            self._transmit_batched()
        if self._sent_waiters:
            self._fire_sent_waiters()
        self._deliver_events()

    def _transmit_batched(self) -> None:
        """aioquic's ``transmit`` (send what QUIC has, re-arm its timer) with the datagrams handed to the kernel
        in GSO runs (`_send_batched`) instead of one ``sendto`` each."""
        self._transmit_task = None
        _send_batched(self._transport, self._quic.datagrams_to_send(now=self._loop.time()))
        timer_at = self._quic.get_timer()
        if self._timer is not None and self._timer_at != timer_at:
            self._timer.cancel()
            self._timer = None
        if self._timer is None and timer_at is not None:
            self._timer = self._loop.call_at(timer_at, self._handle_timer)
        self._timer_at = timer_at

    def when_sent(self, stream_ids: Sequence[int], callback: Callable[[], None], timeout: float) -> None:
        """Call ``callback`` (once) when every stream of ``stream_ids`` has sent all its data and its FIN at
        least once (or was reset or is gone), or after ``timeout`` seconds, whichever comes first."""
        entry = (tuple(stream_ids), callback)
        self._sent_waiters.append(entry)

        def expire() -> None:
            if entry in self._sent_waiters:
                self._sent_waiters.remove(entry)
                callback()

        self._loop.call_later(timeout, expire)
        self._schedule_pump()
        self._loop.call_soon(self._fire_sent_waiters)  # nothing left to send: no transmit would check

    def _fire_sent_waiters(self) -> None:
        ready = [w for w in self._sent_waiters if all(self._stream_sent(sid) for sid in w[0])]
        for entry in ready:
            self._sent_waiters.remove(entry)
            entry[1]()

    def _stream_sent(self, stream_id: int) -> bool:
        """aioquic keeps what a stream still has to send privately: read it where it exists (an aioquic
        without these attributes counts the stream as sent, i.e. the caller is not delayed)."""
        stream = getattr(self._quic, "_streams", {}).get(stream_id)
        sender = getattr(stream, "sender", None)
        if sender is None or getattr(sender, "_reset_error_code", None) is not None:
            return True
        if getattr(sender, "_buffer_fin", 0) is None:
            return False  # the FIN is not even written yet
        pending = getattr(sender, "_pending", None)  # a RangeSet: its truth value raises, its len() does not
        return (pending is None or len(pending) == 0) and not getattr(sender, "_pending_eof", False)

    def _schedule_pump(self) -> None:
        if not self._pump_scheduled:
            self._pump_scheduled = True
            self._loop.call_soon(self._pump)

    def _pump(self) -> None:
        """Apply the session's commands to QUIC, send, and queue its events (once per event-loop turn
        however many writes the application made; nothing to send, no send pass)."""
        self._pump_scheduled = False
        if self.session.has_pending():
            self.transmit()

    def _apply_commands(self) -> None:
        quic = self._quic
        for command in self.session.commands():
            if self.transcript:
                _record_command(command)
            if self.tap is not None:
                self.tap(self, "sent", command)
            try:
                if isinstance(command, WriteStream):
                    quic.send_stream_data(command.stream_id, command.data, command.end_stream)
                elif isinstance(command, ResetStream):
                    quic.reset_stream(command.stream_id, command.code)
                elif isinstance(command, StopSending):
                    quic.stop_stream(command.stream_id, command.code)
                elif isinstance(command, SendDatagram):
                    quic.send_datagram_frame(command.data)
                elif isinstance(command, CloseConnection):
                    quic.close(error_code=command.code, reason_phrase=command.reason)
            except (ValueError, AssertionError):
                # The stream is already gone on the QUIC side (peer reset/stop, or both sides finished).
                continue

    def _deliver_events(self) -> None:
        for event in self.session.events():
            if self.transcript:
                evidence.record("received", f"moqt.{type(event).__name__}", {"event": repr(event)[:2000]})
            if self.tap is not None:
                self.tap(self, "received", event)
            self.events.put_nowait(event)


@functools.cache
def _protocol_class() -> type[MoqtProtocol]:
    from aioquic.asyncio.protocol import QuicConnectionProtocol  # lazy: aioquic's TLS stack (see above)

    return cast(type[MoqtProtocol], type("MoqtProtocol", (MoqtProtocol, QuicConnectionProtocol), {}))


def new_protocol(quic: QuicConnection, *, session: Session, transcript: bool = False, **kwargs: Any) -> MoqtProtocol:
    """A `MoqtProtocol` over aioquic's asyncio protocol for ``quic``."""
    return _protocol_class()(quic, session=session, transcript=transcript, **kwargs)


def _tune_after_handshake(quic: QuicConnection) -> None:
    """On loopback, the datagram size for bulk transfer (see LOOPBACK_MAX_DATAGRAM_SIZE). aioquic has no
    public knob for it after the handshake, so its private attributes are set only where they exist.
    (aioquic's 1 ms ACK delay stays: longer delays measured slower, the peer's sending is ACK-clocked.)"""
    addr = quic.get_peer_address()
    if addr is None or not _is_loopback(str(addr[0])):
        return
    loss = getattr(quic, "_loss", None)
    pacer = getattr(loss, "_pacer", None)
    if pacer is not None and hasattr(pacer, "next_send_time"):
        # No pacing on loopback: aioquic's pacer lets out at most 16 datagrams and then waits for a timer,
        # which the event loop fires a millisecond or more later (epoll's resolution, more on a loaded
        # machine); with the 1440-byte datagrams of picoquic peers that capped a sender at ~3 MB/s while its
        # congestion window allowed over 1 MB in flight (bench/bench_moqt_relay.py). The congestion window
        # still bounds what is in flight.
        pacer.next_send_time = _never_paced
    size = min(LOOPBACK_MAX_DATAGRAM_SIZE, _peer_max_udp_payload_size(quic))
    if size <= getattr(quic, "_max_datagram_size", size):
        return
    quic._max_datagram_size = size
    for part in (getattr(loss, "_cc", None), getattr(loss, "_pacer", None)):
        if part is not None and hasattr(part, "_max_datagram_size"):
            part._max_datagram_size = size  # congestion window steps and pacing per packet


class _ReadBatch(threading.local):
    """The connections a batched read reached and that have not sent since (one per loop thread)."""

    pending: dict[MoqtProtocol, None] | None = None


_READ_BATCH = _ReadBatch()


def _batch_reads(transport: asyncio.DatagramTransport, protocol: asyncio.DatagramProtocol) -> None:
    """Make ``transport`` (asyncio's selector datagram transport of a server socket) read up to READ_BATCH
    datagrams per readiness and let each connection reached send once after them (aioquic's protocol sends
    after every datagram). An event loop or transport without the private attributes this needs keeps
    asyncio's one read per readiness."""
    loop = getattr(transport, "_loop", None)
    sock = getattr(transport, "_sock", None)
    add, remove = getattr(loop, "_add_reader", None), getattr(loop, "_remove_reader", None)
    if sock is None or add is None or remove is None or not hasattr(transport, "_conn_lost"):
        return
    max_size = getattr(transport, "max_size", 256 * 1024)
    fd = sock.fileno()
    with contextlib.suppress(OSError):
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, SERVER_SOCKET_BUFFER)
    with contextlib.suppress(OSError):
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, SERVER_SOCKET_BUFFER)

    def read_ready() -> None:
        if transport._conn_lost:  # type: ignore[attr-defined]
            return
        pending: dict[MoqtProtocol, None] = {}
        _READ_BATCH.pending = pending
        try:
            for _ in range(READ_BATCH):
                try:
                    data, addr = sock.recvfrom(max_size)
                except (BlockingIOError, InterruptedError):
                    break
                except OSError as exc:
                    protocol.error_received(exc)
                    break
                protocol.datagram_received(data, addr)
        finally:
            _READ_BATCH.pending = None
            for reached in pending:
                reached.transmit()

    remove(fd)
    add(fd, read_ready)


_GSO_OK = [sys.platform == "linux"]  # cleared for the process when the kernel refuses UDP_SEGMENT


def _gso_transport(transport: Any) -> Any:
    """The socket to send GSO runs on for ``transport``, or None: only asyncio's own selector transport
    (not a recording one: the harness's capture sees each datagram) on Linux."""
    if not _GSO_OK[0] or getattr(transport, "records", False):
        return None
    return getattr(transport, "_sock", None)




def _send_batched(transport: Any, datagrams: Sequence[tuple[bytes, Any]]) -> None:
    """Send ``datagrams`` (in order) on ``transport``: each run of datagrams to one address whose sizes are
    equal (the run's last may be shorter) in one ``sendmsg`` with UDP_SEGMENT; one ``sendto`` each where
    the transport already buffers (its order must hold), for a lone datagram, and once GSO was refused."""
    sock = _gso_transport(transport)
    connected = transport.get_extra_info("peername") is not None
    i, n = 0, len(datagrams)
    while i < n:
        data, addr = datagrams[i]
        size = len(data)
        j = i + 1
        total = size
        while (j < n and j - i < GSO_MAX_SEGMENTS and datagrams[j][1] == addr and len(datagrams[j][0]) <= size
               and total + len(datagrams[j][0]) <= GSO_MAX_BYTES):
            total += len(datagrams[j][0])
            j += 1
            if len(datagrams[j - 1][0]) < size:
                break  # a shorter one ends a GSO run
        if j - i == 1 or sock is None or getattr(transport, "_buffer", None) or transport.is_closing():
            for k in range(i, j):
                transport.sendto(*datagrams[k])
            i = j
            continue
        payload = b"".join(d for d, _ in datagrams[i:j])
        cmsg = [(_SOL_UDP, _UDP_SEGMENT, struct.pack("@H", size))]
        try:
            if connected:
                sock.sendmsg([payload], cmsg)
            else:
                sock.sendmsg([payload], cmsg, 0, addr)
        except (BlockingIOError, InterruptedError):
            for k in range(i, j):
                transport.sendto(*datagrams[k])  # asyncio buffers them and sends when writable
        except OSError as exc:
            if exc.errno in (errno.EIO, errno.EINVAL, errno.ENOPROTOOPT, errno.EOPNOTSUPP):
                _GSO_OK[0] = False  # this kernel or path does not do UDP GSO: one sendto each from now on
                sock = None
            for k in range(i, j):
                transport.sendto(*datagrams[k])
        i = j


def _never_paced(now: float) -> float | None:
    """A pacer's ``next_send_time`` that never holds a datagram back (see `_tune_after_handshake`)."""
    return None


def _is_loopback(host: str) -> bool:
    try:
        address = ipaddress.ip_address(host.split("%", 1)[0])
    except ValueError:
        return False
    mapped = getattr(address, "ipv4_mapped", None)
    return bool((mapped or address).is_loopback)


def _peer_max_udp_payload_size(quic: QuicConnection) -> int:
    """The peer's max_udp_payload_size transport parameter (65527 when absent), from the TLS
    extensions aioquic received; 1200 (no change) when they cannot be read."""
    params = peer_transport_parameters(quic)
    if params is None:
        return 1200
    return params.max_udp_payload_size if params.max_udp_payload_size is not None else 65527


def peer_transport_parameters(quic: QuicConnection) -> QuicTransportParameters | None:
    """The QUIC transport parameters the peer sent in its handshake (RFC 9000 §18.2), as aioquic received
    them (the TLS quic_transport_parameters extension); None before the handshake or when unreadable.
    Their initial_max_streams_uni is what the peer granted at first: MAX_STREAMS frames may raise it later."""
    for ext_type, data in getattr(quic.tls, "received_extensions", None) or ():
        if ext_type in (0x39, 0xFFA5):  # quic_transport_parameters (RFC 9001 §8.2, and draft-29's)
            try:
                return pull_quic_transport_parameters(Buffer(data=data))
            except (BufferReadError, ValueError):
                return None
    return None


# initial_max_streams_uni the endpoints connected or served inside `granting_streams_uni` grant their
# peers; None: aioquic's own (128). aioquic has no configuration knob for it.
_GRANTED_STREAMS_UNI: ContextVar[int | None] = ContextVar("kvconform_granted_streams_uni", default=None)


@contextlib.contextmanager
def granting_streams_uni(count: int) -> Iterator[None]:
    """Connections made (`connect`) and servers started (`serve`) inside this block grant their peers
    `count` concurrent unidirectional streams in initial_max_streams_uni, instead of aioquic's 128 (how a
    mutant under-grants). aioquic still raises the limit with MAX_STREAMS as streams are used."""
    reset = _GRANTED_STREAMS_UNI.set(count)
    try:
        yield
    finally:
        _GRANTED_STREAMS_UNI.reset(reset)


# Called with (protocol, "sent" | "received", command or event) for every session command and event of the
# protocols made inside `tapping` (the deterministic transport's transcript); None: nothing is called.
Tap = Callable[["MoqtProtocol", str, object], None]
_TAP: ContextVar[Tap | None] = ContextVar("kvconform_moqt_tap", default=None)


@contextlib.contextmanager
def tapping(tap: Tap) -> Iterator[None]:
    """Connections made or accepted inside this block (and the tasks it starts) report to ``tap`` (see `Tap`)."""
    reset = _TAP.set(tap)
    try:
        yield
    finally:
        _TAP.reset(reset)


# initial_max_stream_data_uni the servers started inside `granting_stream_data_uni` grant their peers; None:
# aioquic's own (1 MiB).
_GRANTED_STREAM_DATA_UNI: ContextVar[int | None] = ContextVar("kvconform_granted_stream_data_uni", default=None)


@contextlib.contextmanager
def granting_stream_data_uni(octets: int) -> Iterator[None]:
    """Servers started (`serve`) inside this block grant each peer-opened unidirectional stream `octets` of
    flow-control credit in initial_max_stream_data_uni instead of aioquic's 1 MiB (how the kvcs-publisher
    harness holds a fetch stream open: aioquic doubles the credit as data arrives, unless the connection's
    owner withholds it)."""
    reset = _GRANTED_STREAM_DATA_UNI.set(octets)
    try:
        yield
    finally:
        _GRANTED_STREAM_DATA_UNI.reset(reset)


def _grant_stream_data_uni(quic: QuicConnection, octets: int | None) -> None:
    """Set the per-stream credit `quic` announces for peer-opened uni streams (before its handshake)."""
    if octets is not None and hasattr(quic, "_local_max_stream_data_uni"):
        quic._local_max_stream_data_uni = octets


def _grant_streams_uni(quic: QuicConnection, count: int | None) -> None:
    """Set the uni-stream limit `quic` announces in its transport parameters (before its handshake)."""
    limit = getattr(quic, "_local_max_streams_uni", None)
    if count is not None and limit is not None:
        limit.value = limit.sent = count  # `sent` too: no MAX_STREAMS frame for the unchanged value


def _several_pending(queue: list[Any]) -> bool:
    """Whether two or more streams of aioquic's send queue have something to send: with at most one
    the order cannot change what goes out, so the (per-send-pass) priority sort is skipped."""
    pending = 0
    for stream in queue:
        sender = stream.sender
        if sender.reset_pending or stream.receiver.stop_pending or not sender.buffer_is_empty:
            pending += 1
            if pending > 1:
                return True
    return False


def _record_command(command: Any) -> None:
    if isinstance(command, WriteStream):
        evidence.record("sent", "moqt.WriteStream", {"stream": command.stream_id, "fin": command.end_stream},
                        raw=command.data)
    elif isinstance(command, SendDatagram):
        evidence.record("sent", "moqt.SendDatagram", None, raw=command.data)
    else:
        evidence.record("sent", f"moqt.{type(command).__name__}", {"command": repr(command)})


class MoqtConnection:
    """A MOQT session over an aioquic connection: `session` to act, `next_event` to observe.

    Call `session` methods directly (they schedule the I/O themselves); every wait is bounded.
    """

    def __init__(self, protocol: MoqtProtocol, transport: asyncio.DatagramTransport | None, url: MoqtUrl | None):
        self._protocol = protocol
        self._transport = transport  # owned (client side) or None (shared server socket)
        self.url = url

    @property
    def session(self) -> Session:
        return self._protocol.session

    @property
    def alpn(self) -> str | None:
        return self._protocol.alpn

    @property
    def closed(self) -> SessionClosed | None:
        """How the session ended, or None while it is open."""
        return self._protocol.session.closed

    @property
    def peer_transport_parameters(self) -> QuicTransportParameters | None:
        """The QUIC transport parameters the peer sent in its handshake (see `peer_transport_parameters`)."""
        return peer_transport_parameters(self._protocol._quic)

    async def next_event(self, timeout: float = DEFAULT_TIMEOUT) -> Event:
        """The next session event; TimeoutError after `timeout` seconds. The last event is SessionClosed."""
        return await asyncio.wait_for(self._protocol.events.get(), timeout)

    def next_event_nowait(self, kind: type | None = None) -> Event | None:
        """The next session event if one is queued (and, with ``kind``, is of that type), else None."""
        queue = self._protocol.events
        if kind is not None:
            waiting = getattr(queue, "_queue", None)  # asyncio.Queue's deque: peek without taking
            if not waiting or not isinstance(waiting[0], kind):
                return None
        try:
            return queue.get_nowait()
        except asyncio.QueueEmpty:
            return None

    def when_sent(self, stream_ids: Sequence[int], callback: Callable[[], None], timeout: float) -> None:
        """``callback`` once those streams' data and FIN have been sent (see `MoqtProtocol.when_sent`)."""
        self._protocol.when_sent(stream_ids, callback, timeout)

    def send_datagram(self, data: bytes) -> None:
        """Raw QUIC DATAGRAM (the session's `send_datagram` is the checked path)."""
        self._protocol._quic.send_datagram_frame(data)
        self._protocol.transmit()

    async def close(
        self, code: int = SessionError.NO_ERROR, reason: str = "", timeout: float = DEFAULT_TIMEOUT
    ) -> None:
        """Close the session with a Session Termination code and wait (bounded) until QUIC is done."""
        if self.session.closed is None:
            self.session.close(code, reason)
            self._protocol._pump()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._protocol.terminated.wait(), timeout)
        if self._transport is not None:
            self._transport.close()

    async def wait_closed(self, timeout: float = DEFAULT_TIMEOUT) -> SessionClosed:
        """Wait until the QUIC connection has terminated; returns how the session ended."""
        await asyncio.wait_for(self._protocol.terminated.wait(), timeout)
        closed = self.session.closed
        assert closed is not None  # connection_terminated always records it
        return closed

    async def __aenter__(self) -> MoqtConnection:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


async def connect(
    url: str | MoqtUrl,
    *,
    config: SessionConfig | None = None,
    verify: bool | bytes = False,
    alpn: Sequence[str] = (ALPN,),
    timeout: float = DEFAULT_TIMEOUT,
    idle_timeout: float = 30.0,
    qlog_dir: str | None = None,
    secrets_log: TextIO | None = None,
    transcript: bool = False,
) -> MoqtConnection:
    """Open a MOQT session to `moqt://host:port/path` as client; returns once SETUP has been sent.

    The URL's authority and path go into the AUTHORITY and PATH setup options unless `config` sets them.
    `transcript`: record every stream write and session event in the running test's evidence.
    Raises ConnectionError when the handshake fails and TimeoutError past `timeout`.
    """
    target = url if isinstance(url, MoqtUrl) else parse_url(url)
    if config is None:
        config = SessionConfig(role=Role.CLIENT)
    if config.authority is None:
        config.authority = target.authority
    if config.path is None:
        config.path = target.path_option
    loop = asyncio.get_running_loop()
    configuration = quic_configuration(
        is_client=True, alpn=alpn, verify=verify, idle_timeout=idle_timeout, server_name=target.host,
        qlog_dir=qlog_dir, secrets_log=secrets_log,
    )
    from aioquic.quic.connection import QuicConnection  # lazy: aioquic's TLS stack (see above)

    infos = await asyncio.wait_for(loop.getaddrinfo(target.host, target.port, type=socket.SOCK_DGRAM), timeout)
    _, _, _, _, addr = infos[0]
    quic = QuicConnection(configuration=configuration)
    _grant_streams_uni(quic, _GRANTED_STREAMS_UNI.get())
    session = Session(config)
    # A connected socket (remote_addr): the kernel reports an ICMP port unreachable (error_received), so
    # connecting to a port nothing listens on fails at once (ConnectionRefusedError) instead of timing out.
    transport, protocol = await loop.create_datagram_endpoint(
        lambda: new_protocol(quic, session=session, transcript=transcript),
        remote_addr=cast(tuple[str, int], addr),  # an IPv6 sockaddr has two more fields: asyncio takes it as is
    )
    moqt = protocol
    connection = MoqtConnection(moqt, transport, target)
    moqt.connect(addr)
    try:
        await asyncio.wait_for(moqt.established.wait(), timeout)
    except TimeoutError:
        transport.close()
        raise
    if moqt.refused is not None:
        transport.close()
        raise ConnectionRefusedError(f"MOQT connection to {target}: nothing listens there ({moqt.refused})")
    if moqt.alpn is not None and moqt.alpn != ALPN:  # the session is closed already (quic_event_received)
        await connection.close(timeout=min(timeout, DEFAULT_TIMEOUT))
        raise AlpnRefused(str(target), alpn, moqt.alpn)
    if moqt.terminated.is_set() and not session.started:
        transport.close()
        closed = session.closed
        if closed is not None and closed.transport and closed.code == NO_APPLICATION_PROTOCOL:
            raise AlpnRefused(str(target), alpn, None)
        raise ConnectionError(f"MOQT handshake with {target} failed: {closed.reason if closed else 'no reason'}")
    return connection


class MoqtServer:
    """A listening MOQT endpoint; `port` is the bound UDP port (pass port 0 to let the OS pick)."""

    def __init__(self, server: QuicServer, transport: asyncio.DatagramTransport) -> None:
        self._server = server
        self._transport = transport
        self.connections: list[MoqtConnection] = []
        self.tasks: set[asyncio.Task[None]] = set()
        # One line per client whose handshake ended because it offered no ALPN of ours (profile §1): a peer of
        # another draft, which the suites that wait for it name instead of waiting in vain.
        self.alpn_refusals: list[str] = []

    @property
    def host(self) -> str:
        return cast(str, self._transport.get_extra_info("sockname")[0])

    @property
    def port(self) -> int:
        return cast(int, self._transport.get_extra_info("sockname")[1])

    @property
    def url(self) -> str:
        host = self.host
        return f"moqt://{f'[{host}]' if ':' in host else host}:{self.port}"

    async def close(self, timeout: float = DEFAULT_TIMEOUT) -> None:
        """Stop listening, close every session (NO_ERROR) and wait (bounded) for the handlers to end."""
        for connection in list(self.connections):
            if connection.session.closed is None:
                connection.session.close(SessionError.NO_ERROR, "server shutting down")
        for task in list(self.tasks):
            task.cancel()
        if self.tasks:
            await asyncio.wait(self.tasks, timeout=timeout)
        self._server.close()


async def serve(
    host: str,
    port: int,
    handler: Handler,
    *,
    config_factory: Callable[[], SessionConfig] | None = None,
    certificate: tls.TestCertificate | None = None,
    alpn: Sequence[str] = (ALPN,),
    idle_timeout: float = 30.0,
    qlog_dir: str | None = None,
    secrets_log: TextIO | None = None,
    transcript: bool = False,
) -> MoqtServer:
    """Listen on (host, port) and run `handler(connection)` for each MOQT session after its handshake.

    When the handler returns, its session is closed with NO_ERROR (unless it closed it itself).
    """
    from aioquic.asyncio.server import QuicServer  # lazy: aioquic's TLS stack (see above)

    loop = asyncio.get_running_loop()
    configuration = quic_configuration(is_client=False, alpn=alpn, certificate=certificate, idle_timeout=idle_timeout,
                                       qlog_dir=qlog_dir, secrets_log=secrets_log)
    holder: list[MoqtServer] = []
    streams_uni = _GRANTED_STREAMS_UNI.get()  # read now: create_protocol runs in the socket's callbacks
    stream_data_uni = _GRANTED_STREAM_DATA_UNI.get()

    def create_protocol(quic: QuicConnection, **kwargs: Any) -> MoqtProtocol:
        _grant_streams_uni(quic, streams_uni)  # aioquic answers the ClientHello only after this returns
        _grant_stream_data_uni(quic, stream_data_uni)
        config = config_factory() if config_factory is not None else SessionConfig(role=Role.SERVER)
        protocol = new_protocol(quic, session=Session(config), transcript=transcript, **kwargs)
        connection = MoqtConnection(protocol, None, None)
        server = holder[0]
        server.connections.append(connection)
        task = loop.create_task(_run_handler(server, connection, protocol, handler))
        server.tasks.add(task)
        task.add_done_callback(server.tasks.discard)
        return protocol

    transport, protocol = await loop.create_datagram_endpoint(
        lambda: QuicServer(configuration=configuration, create_protocol=create_protocol),
        local_addr=(host, port),
    )
    capture.udp_bound(transport)
    _batch_reads(transport, protocol)
    server = MoqtServer(protocol, transport)
    holder.append(server)
    return server


async def _run_handler(
    server: MoqtServer, connection: MoqtConnection, protocol: MoqtProtocol, handler: Handler
) -> None:
    try:
        with contextlib.suppress(TimeoutError):  # a handshake that never completes: no session to serve
            await asyncio.wait_for(protocol.established.wait(), HANDSHAKE_TIMEOUT)
        if connection.session.started:
            await handler(connection)
    finally:
        if protocol.alpn_refusal is not None:
            server.alpn_refusals.append(protocol.alpn_refusal)
        if connection.session.closed is None:
            connection.session.close(SessionError.NO_ERROR, "")
            protocol._pump()
        server.connections.remove(connection)


# How long a LoopThread caller waits past its own bound for the loop to report (the loop thread starved, not hung).
LOOP_STALL_S = 10.0


class LoopThread:
    """An asyncio loop in a daemon thread, so synchronous code (pytest fixtures, drivers) can start,
    drive and stop MOQT endpoints with bounded waits: `run(coro, timeout)` returns its result."""

    def __init__(self, name: str = "moqt-loop") -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name=name, daemon=True)
        self._thread.start()

    def run(self, coro: Coroutine[Any, Any, T], timeout: float = DEFAULT_TIMEOUT) -> T:
        """Run `coro` on the loop and wait at most `timeout` seconds (then cancel it, TimeoutError)."""
        future = asyncio.run_coroutine_threadsafe(asyncio.wait_for(coro, timeout), self.loop)
        try:
            # wait_for inside already bounds it; this backstop only catches a loop that never runs again, so it
            # leaves room for a loaded machine keeping the loop's thread from running (a 1 s margin was seen short)
            return future.result(timeout + LOOP_STALL_S)
        except TimeoutError:
            future.cancel()
            raise

    def close(self, timeout: float = DEFAULT_TIMEOUT) -> None:
        """Cancel what is left on the loop, stop it and join the thread (bounded)."""
        async def cancel_all() -> None:
            tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            for task in tasks:
                task.cancel()
            if tasks:
                await asyncio.wait(tasks, timeout=timeout)

        if self.loop.is_running():
            with contextlib.suppress(TimeoutError, RuntimeError):
                asyncio.run_coroutine_threadsafe(cancel_all(), self.loop).result(timeout + 1.0)
            self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(timeout)
        if not self._thread.is_alive():
            self.loop.close()
