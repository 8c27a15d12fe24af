"""The hooks the lanes call so their sockets are captured; each is a no-op while no capture is installed.

``install(session)`` is the plugin's (one ``CaptureSession`` per harness process, for the run). The lanes call:

- ``tcp_endpoint(address)`` around a tl.kv.v1 endpoint the harness dials or hands to an implementation to dial:
  it yields the address to use instead (a capture relay's when the harness records TCP itself);
- ``quic_logging(TraceLogger)`` when building a QuicConfiguration: the qlog logger and key log to set;
- ``udp_transport(transport)`` / ``udp_received(transport, data, addr)`` / ``udp_bound(transport)`` from the
  aioquic adapter, for the datagrams and ports of its sockets.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any, TextIO, cast

from kvconform.capture.pcap import Datagram
from kvconform.capture.quic import RecordingTransport
from kvconform.capture.relay import TcpRelay

if TYPE_CHECKING:  # the capture's modules load only when one is installed (a lane imports this one always)
    from aioquic.quic.logger import QuicLogger

    from kvconform.capture.qlog import TraceLogger
    from kvconform.capture.session import CaptureSession

__all__ = ["active", "install", "quic_logging", "split_address", "tcp_endpoint", "udp_bound", "udp_received",
           "udp_transport"]

_session: CaptureSession | None = None


def install(session: CaptureSession | None) -> CaptureSession | None:
    """Make ``session`` the process's capture (None: none); returns the previous one."""
    global _session
    previous, _session = _session, session
    return previous


def active() -> CaptureSession | None:
    """The process's capture, or None."""
    return _session


def split_address(address: str) -> tuple[str, int] | None:
    """``host:port`` or ``[v6]:port`` -> (host, port); None for anything else (a gRPC ``dns:///`` target...)."""
    host, sep, port = address.rpartition(":")
    if not sep or not port.isdigit() or not host or "/" in host:
        return None
    return host.strip("[]"), int(port)


@contextlib.contextmanager
def tcp_endpoint(address: str) -> Iterator[str]:
    """Capture the TCP traffic to the endpoint at ``address`` while the block runs; yields the address to dial."""
    session = _session
    parsed = split_address(address) if session is not None else None
    if session is None or parsed is None:
        yield address
        return
    host, port = parsed
    session.watch("tcp", port)  # tcpdump keeps its frames; the pcap's reader decodes the port as HTTP/2
    if not session.in_python(host):
        yield address
        return
    try:
        ip = str(socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0][4][0])
    except OSError:
        yield address  # a name that does not resolve: the lane's own connect reports it
        return

    relay = TcpRelay((ip, port), session.record_segments)
    try:
        yield f"{relay.address[0]}:{relay.address[1]}"
    finally:
        relay.stop()


def quic_logging(logger: Callable[[], TraceLogger]) -> tuple[QuicLogger | None, TextIO | None]:
    """The ``quic_logger`` and ``secrets_log_file`` for a harness QuicConfiguration (None, None: no capture);
    ``logger`` (capture.qlog.TraceLogger) makes the process's qlog logger the first time one is asked for."""
    session = _session
    if session is None:
        return None, None
    return session.quic_logger(logger), cast(TextIO, session.keylog)


def _sockname(transport: asyncio.BaseTransport) -> tuple[str, int] | None:
    name = transport.get_extra_info("sockname")
    return (str(name[0]), int(name[1])) if name else None


def udp_bound(transport: asyncio.BaseTransport) -> None:
    """A harness QUIC socket was bound: tcpdump keeps its port."""
    session = _session
    local = _sockname(transport) if session is not None else None
    if session is not None and local is not None:
        session.watch("udp", local[1])


def udp_transport(transport: Any) -> Any:
    """The transport a QUIC protocol should send on: a recording one when the harness records its datagrams."""
    session = _session
    local = _sockname(transport) if session is not None else None
    if session is None or local is None:
        return transport

    session.watch("udp", local[1])
    peer = transport.get_extra_info("peername")
    if peer:
        session.watch("udp", int(peer[1]))
    if not session.in_python(local[0]) or isinstance(transport, RecordingTransport):
        return transport
    session.local_udp(local)
    return RecordingTransport(transport, session.record_datagram)


def udp_received(transport: Any, data: bytes, addr: Any) -> None:
    """A datagram a QUIC protocol received on ``transport`` (recorded when the transport records)."""
    session = _session
    if session is None or not addr or not getattr(transport, "records", False):
        return

    session.record_datagram(Datagram((str(addr[0]), int(addr[1])), transport.local, bytes(data)), received=True)
