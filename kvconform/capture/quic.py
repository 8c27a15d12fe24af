"""What the capture takes from the harness's QUIC connections besides their qlog (capture.qlog): TLS secrets, datagrams.

- ``KeyLog``: the ``secrets_log_file`` of every configuration, in SSLKEYLOGFILE format; every line is kept for
  the process (a few hundred bytes a connection) and a check's key log holds all of them, so a connection opened
  in an earlier check still decrypts.
- ``RecordingTransport``: wraps a datagram transport to record what it sends, when tcpdump cannot see the socket.

Neither needs aioquic: a capture session of a run without QUIC does not import it.
"""

from __future__ import annotations

import asyncio
import io
import threading
from collections.abc import Callable
from typing import Any

from kvconform.capture.pcap import Address, Datagram

__all__ = ["KeyLog", "RecordingTransport"]


class KeyLog(io.TextIOBase):
    """An SSLKEYLOGFILE sink for aioquic's ``secrets_log_file`` (write and flush are all it calls)."""

    def __init__(self) -> None:
        super().__init__()
        self._lock = threading.Lock()
        self._lines: dict[str, None] = {}  # ordered set: the two ends of an in-process connection log alike
        self._partial = ""

    def writable(self) -> bool:
        return True

    def write(self, text: str) -> int:
        with self._lock:
            data = self._partial + text
            *lines, self._partial = data.split("\n")
            for line in lines:
                if line.strip():
                    self._lines[line] = None
        return len(text)

    def flush(self) -> None:
        pass

    def lines(self) -> list[str]:
        """Every secret line logged so far in this process."""
        with self._lock:
            return list(self._lines)


class RecordingTransport(asyncio.DatagramTransport):
    """A datagram transport that reports each datagram it sends to ``record`` before sending it."""

    records = True  # what hooks.udp_received looks for (it does not import this module)

    def __init__(self, inner: asyncio.DatagramTransport, record: Callable[[Datagram], None]) -> None:
        super().__init__()
        self.inner = inner
        self.record = record
        sockname = inner.get_extra_info("sockname")
        self.local: Address = (str(sockname[0]), int(sockname[1]))

    def sendto(self, data: Any, addr: Any = None) -> None:
        to = addr if addr is not None else self.inner.get_extra_info("peername")
        if to is not None:
            self.record(Datagram(self.local, (str(to[0]), int(to[1])), bytes(data)))
        self.inner.sendto(data, addr)

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return self.inner.get_extra_info(name, default)

    def close(self) -> None:
        self.inner.close()

    def is_closing(self) -> bool:
        return self.inner.is_closing()

    def abort(self) -> None:
        self.inner.abort()

    def get_protocol(self) -> asyncio.BaseProtocol:
        return self.inner.get_protocol()

    def set_protocol(self, protocol: asyncio.BaseProtocol) -> None:
        self.inner.set_protocol(protocol)
