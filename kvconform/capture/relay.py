"""A loopback TCP relay in front of a TCP endpoint that records both directions for the capture.

Used when tcpdump cannot see the traffic (not installed or not permitted, or the endpoint is not on loopback): the
harness (or the implementation under test) dials the relay on 127.0.0.1, the relay dials the real endpoint, copies
bytes both ways and tells ``record`` what a capture of the real connection would show (``pcap.TcpFlow``: the
handshake, the data, FIN and RST), addressed from the dialler's address to the endpoint's. A refused upstream
connection is answered by closing the accepted one with a reset, so the dialler sees the connection fail as it
would have without the relay (gRPC: UNAVAILABLE). Each connection has two pump threads; ``stop`` closes everything.
"""

from __future__ import annotations

import contextlib
import socket
import struct
import threading
from collections.abc import Callable

from kvconform.capture.pcap import Address, Segment, TcpFlow

__all__ = ["TcpRelay"]

CONNECT_TIMEOUT = 10.0  # the decode side's own call deadline; a relay must not fail a connect sooner
STOP_TIMEOUT = 5.0
_CHUNK = 256 * 1024


def _linger_reset(sock: socket.socket) -> None:
    # SO_LINGER 0: close() sends RST instead of FIN.
    with contextlib.suppress(OSError):
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))


class TcpRelay:
    """Listens on 127.0.0.1 (an ephemeral port) and relays each connection to ``upstream``."""

    def __init__(self, upstream: Address, record: Callable[[list[Segment]], None]) -> None:
        self.upstream = upstream
        self.record = record
        family = socket.AF_INET6 if ":" in upstream[0] else socket.AF_INET
        self._family = family
        self._listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._listener.bind(("127.0.0.1", 0))
        self._listener.listen(64)
        self.address: Address = ("127.0.0.1", int(self._listener.getsockname()[1]))
        self._sockets: set[socket.socket] = set()
        self._threads: list[threading.Thread] = []
        self._lock = threading.Lock()
        self._stopped = False
        self._accept = threading.Thread(target=self._accept_loop, name=f"capture-relay-{self.address[1]}",
                                        daemon=True)
        self._accept.start()

    def _spawn(self, body: Callable[..., None], *args: object) -> None:
        thread = threading.Thread(target=body, args=args, daemon=True, name="capture-relay-pump")
        with self._lock:
            self._threads = [t for t in self._threads if t.is_alive()]
            self._threads.append(thread)
        thread.start()

    def _accept_loop(self) -> None:
        while True:
            try:
                downstream, peer = self._listener.accept()
            except OSError:
                return  # closed by stop()
            self._spawn(self._connect, downstream, (str(peer[0]), int(peer[1])))

    def _connect(self, downstream: socket.socket, peer: Address) -> None:
        flow = TcpFlow(peer, self.upstream)
        upstream = socket.socket(self._family, socket.SOCK_STREAM)
        with self._lock:
            if self._stopped:
                downstream.close()
                upstream.close()
                return
            self._sockets.update((downstream, upstream))
        upstream.settimeout(CONNECT_TIMEOUT)
        try:
            upstream.connect(self.upstream)
        except OSError:
            self.record(flow.refused())
            _linger_reset(downstream)
            self._close(downstream, upstream)
            return
        upstream.settimeout(None)
        for sock in (downstream, upstream):
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.record(flow.open())
        lock = threading.Lock()  # one flow, two pumps: its sequence numbers move under one lock
        self._spawn(self._pump, downstream, upstream, flow, True, lock)
        self._pump(upstream, downstream, flow, False, lock)

    def _pump(self, src: socket.socket, dst: socket.socket, flow: TcpFlow, from_client: bool,
              lock: threading.Lock) -> None:
        while True:
            try:
                data = src.recv(_CHUNK)
            except OSError:
                with lock:
                    if not (flow.closed[from_client] and flow.closed[not from_client]):
                        self.record(flow.reset(from_client))
                _linger_reset(dst)
                self._close(src, dst)
                return
            if not data:
                with lock:
                    self.record(flow.fin(from_client))
                    both = flow.closed[not from_client]
                with contextlib.suppress(OSError):
                    dst.shutdown(socket.SHUT_WR)
                if both:
                    self._close(src, dst)
                return
            with lock:  # recorded under the flow's lock: the capture's order is the flow's
                self.record(flow.data(from_client, data))
            try:
                dst.sendall(data)
            except OSError:
                with lock:
                    self.record(flow.reset(not from_client))
                _linger_reset(src)
                self._close(src, dst)
                return

    def _close(self, *socks: socket.socket) -> None:
        for sock in socks:
            with self._lock:
                self._sockets.discard(sock)
            with contextlib.suppress(OSError):
                sock.close()

    def stop(self, timeout: float = STOP_TIMEOUT) -> None:
        """Stop accepting, close every relayed connection and join the threads (bounded)."""
        with self._lock:
            self._stopped = True
            sockets = list(self._sockets)
            threads = list(self._threads)
        with contextlib.suppress(OSError):
            self._listener.shutdown(socket.SHUT_RDWR)
        self._listener.close()
        for sock in sockets:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            with contextlib.suppress(OSError):
                sock.close()
        self._accept.join(timeout)
        for thread in threads:
            thread.join(timeout)
