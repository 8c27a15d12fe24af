"""Misbehaving relays for the harness's own tests of the relay suites' verdicts (tests/moqt/test_verdicts.py):
each misbehaves the way a real relay can fail outside any one requirement (it dies, it speaks something that is
not MOQT, it answers with a transport failure where the text names a protocol answer), so the tests can show
what verdict the harness gives it. Targets: ``python:tests.moqt.relays:<Name>``.

They are the reference relay with one behaviour replaced, started by the harness like the reference.
"""

from __future__ import annotations

import random
from typing import Any

from kvconform.moqt import quic
from kvconform.moqt.errors import SessionError, StreamResetCode
from kvconform.moqt.relay import FetchJob, Peer, Relay
from kvconform.moqt.session import Request, SessionConfig

GARBAGE_SEED = 0x5E7


class CrashOnFetchRelay(Relay):
    """Serves its first FETCH, then dies: from then on it answers no new connection (every datagram of a new
    peer is dropped, as from a crashed process), until its supervisor restarts it, after ``ATTEMPTS`` connection
    attempts. The sessions already open finish what they were doing, so the check that sent the FETCH completes
    its own exchange: only the sanity probe after it can see that the relay died."""

    ATTEMPTS = 2  # connection attempts (new peers) ignored while dead

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.dead = False
        self.crashed = False
        self.known: set[Any] = set()  # peer addresses that connected before the crash
        self.ignored: set[Any] = set()  # peer addresses ignored while dead

    async def start(self) -> Relay:
        relay = await super().start()
        assert self._server is not None
        server: Any = self._server._server  # aioquic's QuicServer: the socket's datagrams arrive here
        receive = server.datagram_received

        def gate(data: bytes, addr: Any) -> None:
            if self.dead and addr not in self.known:
                self.ignored.add(addr)
                if len(self.ignored) <= self.ATTEMPTS:
                    return
                self.dead = False  # restarted: this attempt and every later one is served
            self.known.add(addr)
            receive(data, addr)

        server.datagram_received = gate
        return relay

    def fetch_served(self, job: FetchJob) -> None:
        super().fetch_served(job)
        if not self.crashed:
            self.crashed = self.dead = True


class GarbageSetupRelay(Relay):
    """Answers the client's SETUP with seeded random bytes on its unidirectional control stream."""

    def session_config(self) -> SessionConfig:
        config = super().session_config()
        config.send_setup = False
        return config

    async def _serve_peer(self, conn: quic.MoqtConnection) -> None:
        conn.session.open_raw_stream(random.Random(GARBAGE_SEED).randbytes(48), unidirectional=True,
                                     track_request=False)
        await super()._serve_peer(conn)


class ClosingRelay(Relay):
    """Closes every session with PROTOCOL_VIOLATION at its first request, valid as it is."""

    def _on_request(self, peer: Peer, req: Request) -> None:
        peer.session.close(SessionError.PROTOCOL_VIOLATION, "kvconform test relay: no request is welcome")


class ResetRefusalRelay(Relay):
    """Where the reference refuses a request with REQUEST_ERROR, resets the request stream without an answer."""

    def _refuse(self, peer: Peer, req: Request, code: int, reason: str) -> None:
        peer.session.reset_raw(req.stream_id, StreamResetCode.INTERNAL_ERROR)


class SilentRefusalRelay(Relay):
    """Where the reference refuses a request with REQUEST_ERROR, never answers it."""

    def _refuse(self, peer: Peer, req: Request, code: int, reason: str) -> None:
        return None


class TransportCloseRelay(Relay):
    """Where the reference closes a session with a Session Termination code, ends the QUIC connection with a
    transport CONNECTION_CLOSE (frame 0x1c) carrying the same number: no MOQT session close at all."""

    async def _serve_peer(self, conn: quic.MoqtConnection) -> None:
        protocol: Any = conn._protocol
        session = conn.session
        close = session.close

        def transport_close(code: int = SessionError.NO_ERROR, reason: str = "") -> None:
            if code != SessionError.NO_ERROR and session.closed is None:
                protocol._quic.close(error_code=int(code), frame_type=0, reason_phrase=reason)
                protocol.transmit()  # aioquic keeps the first close: the session's own one is not sent
            close(code, reason)

        session.close = transport_close  # type: ignore[method-assign]
        await super()._serve_peer(conn)
