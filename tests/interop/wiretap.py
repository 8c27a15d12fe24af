"""A byte-recording QUIC endpoint for looking at a peer's MOQT framing (the evidence behind
docs/interop-aiomoqt.md): raw aioquic, no MOQT session of ours in between, so what a test asserts on is
exactly what the peer put on each stream.

As a client it dials a relay and writes the SETUP it is given; as a server it answers a client's SETUP
with its own and each request stream with a fixed reply (REQUEST_OK to namespace requests,
REQUEST_ERROR DOES_NOT_EXIST to track requests), enough to drive a peer's client through its first
exchanges. Every wait is bounded.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

from aioquic.asyncio.client import connect
from aioquic.asyncio.protocol import QuicConnectionProtocol
from aioquic.asyncio.server import serve
from aioquic.quic import events as qe
from aioquic.quic.configuration import QuicConfiguration

from kvconform import evidence
from kvconform.moqt import tls
from kvconform.moqt.errors import MoqtDecodeError, NeedMoreData, RequestErrorCode
from kvconform.moqt.messages import (
    ControlMessage,
    MessageType,
    RequestError,
    RequestOk,
    Setup,
    parse_control_message,
)

__all__ = ["TAP_SETUP", "StreamLog", "Tap", "dial", "listen"]

# Our side's SETUP: implementation name only (a server sends neither PATH nor AUTHORITY, profile §5).
TAP_SETUP = Setup.build(implementation=b"kvconform-wiretap")
MAX_DATAGRAM_FRAME_SIZE = 65536


def _configuration(is_client: bool, alpn: list[str]) -> QuicConfiguration:
    config = QuicConfiguration(is_client=is_client, alpn_protocols=alpn,
                               max_datagram_frame_size=MAX_DATAGRAM_FRAME_SIZE, idle_timeout=10.0)
    if is_client:
        tls.skip_verification(config)
    else:
        tls.install_server_certificate(config)
    return config


@dataclass
class StreamLog:
    """What arrived on one stream, in order, and whether it ended (FIN) or was reset."""

    stream_id: int
    data: bytearray = field(default_factory=bytearray)
    fin: bool = False
    reset_code: int | None = None
    answered: bool = False

    @property
    def peer_initiated_uni(self) -> bool:
        return bool(self.stream_id & 0x2)

    def messages(self, skip: int = 0) -> list[ControlMessage]:
        """The complete control messages in ``data[skip:]`` decoded by kvconform's codec (a decode error
        propagates: it is a disagreement between the peer's encoder and our decoder)."""
        out: list[ControlMessage] = []
        offset = skip
        while offset < len(self.data):
            try:
                msg, used = parse_control_message(bytes(self.data), offset)
            except NeedMoreData:
                break
            out.append(msg)
            offset += used
        return out


class Tap(QuicConnectionProtocol):
    """Records every stream's bytes; as a server, replies just enough to keep the peer talking."""

    def __init__(self, *args: Any, answer: bool = False, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.answer = answer
        self.streams: dict[int, StreamLog] = {}
        self.alpn: str | None = None
        self.terminated: qe.ConnectionTerminated | None = None
        self._changed = asyncio.Event()
        self._setup_sent = False

    def quic_event_received(self, event: qe.QuicEvent) -> None:
        if isinstance(event, qe.HandshakeCompleted):
            self.alpn = event.alpn_protocol
            evidence.record("received", "quic-handshake", {"alpn": event.alpn_protocol})
        elif isinstance(event, qe.StreamDataReceived):
            log = self.streams.setdefault(event.stream_id, StreamLog(event.stream_id))
            log.data += event.data
            log.fin = log.fin or event.end_stream
            evidence.record("received", "stream-data", {"stream": event.stream_id, "fin": event.end_stream},
                            raw=event.data)
            if self.answer:
                self._answer(log)
        elif isinstance(event, qe.StreamReset):
            log = self.streams.setdefault(event.stream_id, StreamLog(event.stream_id))
            log.reset_code = event.error_code
            evidence.record("received", "stream-reset", {"stream": event.stream_id, "code": event.error_code})
        elif isinstance(event, qe.ConnectionTerminated):
            self.terminated = event
            evidence.record("received", "connection-close", {"code": event.error_code,
                                                             "reason": event.reason_phrase})
        self._changed.set()

    def send(self, stream_id: int, data: bytes, fin: bool = False) -> None:
        evidence.record("sent", "stream-data", {"stream": stream_id, "fin": fin}, raw=data)
        self._quic.send_stream_data(stream_id, data, end_stream=fin)
        self.transmit()

    def send_setup(self, setup: Setup = TAP_SETUP) -> int:
        """Open our control stream (unidirectional) and write SETUP on it; its stream id."""
        sid = self._quic.get_next_available_stream_id(is_unidirectional=True)
        self.send(sid, setup.encode())
        self._setup_sent = True
        return sid

    def _answer(self, log: StreamLog) -> None:
        try:
            msgs = log.messages()
        except MoqtDecodeError:
            return  # the test decodes again and reports it
        if not msgs or log.answered:
            return
        first = msgs[0]
        if isinstance(first, Setup) and log.peer_initiated_uni:
            log.answered = True
            if not self._setup_sent:
                self.send_setup()
        elif not log.peer_initiated_uni and first.TYPE in (MessageType.PUBLISH_NAMESPACE,
                                                          MessageType.SUBSCRIBE_NAMESPACE):
            log.answered = True
            self.send(log.stream_id, RequestOk().encode())
        elif not log.peer_initiated_uni:
            log.answered = True
            reply = RequestError(RequestErrorCode.DOES_NOT_EXIST, 0, b"kvconform wiretap serves no track")
            self.send(log.stream_id, reply.encode(), fin=True)

    async def wait_for(self, predicate: Callable[[], bool], timeout_s: float, what: str) -> None:
        """Until ``predicate()`` holds; TimeoutError naming ``what`` after ``timeout_s``."""
        deadline = time.monotonic() + timeout_s
        while not predicate():
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError(f"wiretap: {what} within {timeout_s} s (streams: {sorted(self.streams)})")
            self._changed.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._changed.wait(), remaining)

    def remote_max_datagram_frame_size(self) -> int | None:
        """The peer's max_datagram_frame_size transport parameter (None: DATAGRAM not offered)."""
        value = getattr(self._quic, "_remote_max_datagram_frame_size", None)
        return int(value) if value is not None else None

    def first_message(self, stream_id: int) -> ControlMessage | None:
        log = self.streams.get(stream_id)
        msgs = log.messages() if log else []
        return msgs[0] if msgs else None


@contextlib.asynccontextmanager
async def dial(port: int, alpn: list[str], timeout_s: float = 5.0) -> AsyncIterator[Tap]:
    """A QUIC client connection to 127.0.0.1:``port`` offering ``alpn``; ConnectionError when the peer
    refuses the handshake (e.g. no common ALPN) within ``timeout_s``."""
    config = _configuration(True, alpn)
    async with asyncio.timeout(timeout_s):
        cm = connect("127.0.0.1", port, configuration=config, create_protocol=Tap, wait_connected=True)
        tap = await cm.__aenter__()
    try:
        assert isinstance(tap, Tap)
        yield tap
    finally:
        async with asyncio.timeout(timeout_s):
            await cm.__aexit__(None, None, None)


@contextlib.asynccontextmanager
async def listen(port: int, alpn: list[str]) -> AsyncIterator[list[Tap]]:
    """A QUIC server on 127.0.0.1:``port``; yields the list its connections are appended to."""
    taps: list[Tap] = []

    def factory(*args: Any, **kwargs: Any) -> Tap:
        tap = Tap(*args, answer=True, **kwargs)
        taps.append(tap)
        return tap

    server = await serve("127.0.0.1", port, configuration=_configuration(False, alpn), create_protocol=factory)
    try:
        yield taps
    finally:
        server.close()
