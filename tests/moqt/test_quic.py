"""The aioquic adapter on 127.0.0.1 (OS-picked port): ALPN moqt-22, DATAGRAM negotiated, SETUP options
from the URL, certificate pinning, and a protocol violation seen on the wire as the exact close code."""

from __future__ import annotations

import asyncio
import socket
import ssl
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from cryptography import x509

from kvconform import evidence
from kvconform.moqt import quic, tls
from kvconform.moqt.errors import SessionError
from kvconform.moqt.messages import Goaway
from kvconform.moqt.session import Role, SessionClosed, SessionConfig, SetupReceived
from kvconform.moqt.url import DEFAULT_PORT, MoqtUrl, parse_url

TIMEOUT = 5.0


@pytest.fixture
def loop() -> Iterator[quic.LoopThread]:
    thread = quic.LoopThread()
    yield thread
    thread.close()


@pytest.fixture
def server(loop: quic.LoopThread) -> Iterator[tuple[quic.MoqtServer, asyncio.Queue[quic.MoqtConnection]]]:
    """A MOQT server whose handler hands each connection to the test and keeps it open until closed."""
    accepted: asyncio.Queue[quic.MoqtConnection] = asyncio.Queue()

    async def handler(connection: quic.MoqtConnection) -> None:
        accepted.put_nowait(connection)
        await connection.wait_closed(timeout=30.0)

    async def start() -> quic.MoqtServer:
        return await quic.serve("127.0.0.1", 0, handler)

    srv = loop.run(start())
    yield srv, accepted
    loop.run(srv.close())


# ---------------------------------------------------------------------------------------------------
# URL and TLS


def test_url_parsing() -> None:
    url = parse_url("moqt://relay.example:4443/kvcs?x=1")
    assert url == MoqtUrl("relay.example", 4443, "/kvcs", "x=1")
    assert url.authority == "relay.example:4443" and url.path_option == "/kvcs?x=1"
    assert str(url) == "moqt://relay.example:4443/kvcs?x=1"
    assert parse_url("moqt://h").port == DEFAULT_PORT and parse_url("moqt://h").path_option == ""
    assert parse_url("moqt://[::1]:5/").authority == "[::1]:5"
    for bad, part in [("https://h:1", "scheme"), ("moqt://:1", "host"), ("moqt://h:99999", "port"),
                      ("moqt://u@h", "userinfo"), ("moqt://h/#f", "fragment")]:
        with pytest.raises(ValueError, match=part):
            parse_url(bad)


def test_test_certificate_is_cached_and_names_loopback() -> None:
    cert = tls.test_certificate()
    assert tls.test_certificate() is cert  # generated once per process
    names = cert.certificate.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert "localhost" in names.get_values_for_type(x509.DNSName)
    assert {str(a) for a in names.get_values_for_type(x509.IPAddress)} == {"127.0.0.1", "::1"}
    assert len(cert.sha256) == 64 and cert.certificate_pem.startswith(b"-----BEGIN CERTIFICATE-----")


def test_client_configuration_defaults() -> None:
    conf = quic.quic_configuration(is_client=True)
    assert conf.alpn_protocols == ["moqt-22"] and conf.max_datagram_frame_size
    assert conf.verify_mode == ssl.CERT_NONE
    pinned = quic.quic_configuration(is_client=True, verify=True)
    assert pinned.verify_mode == ssl.CERT_REQUIRED and pinned.cadata == tls.test_certificate().certificate_pem


# ---------------------------------------------------------------------------------------------------
# Live QUIC


def test_connect_negotiates_alpn_datagram_and_exchanges_setup(
    loop: quic.LoopThread, server: tuple[quic.MoqtServer, asyncio.Queue[quic.MoqtConnection]]
) -> None:
    srv, accepted = server

    async def scenario() -> None:
        conn = await quic.connect(f"{srv.url}/kvcs?v=1", timeout=TIMEOUT)
        try:
            assert conn.alpn == "moqt-22"
            assert conn._protocol._quic._remote_max_datagram_frame_size  # DATAGRAM negotiated (profile §1)
            event = await conn.next_event(TIMEOUT)
            assert isinstance(event, SetupReceived)
            peer = await asyncio.wait_for(accepted.get(), TIMEOUT)
            setup_event = await peer.next_event(TIMEOUT)
            assert isinstance(setup_event, SetupReceived)
            assert setup_event.setup.path == b"/kvcs?v=1"
            assert setup_event.setup.authority == f"127.0.0.1:{srv.port}".encode()
        finally:
            await conn.close(timeout=TIMEOUT)

    loop.run(scenario(), timeout=15.0)


def test_pinned_certificate_is_accepted(
    loop: quic.LoopThread, server: tuple[quic.MoqtServer, asyncio.Queue[quic.MoqtConnection]]
) -> None:
    srv, _ = server

    async def scenario() -> str | None:
        conn = await quic.connect(f"moqt://localhost:{srv.port}", verify=True, timeout=TIMEOUT)
        await conn.close(timeout=TIMEOUT)
        return conn.alpn

    assert loop.run(scenario(), timeout=15.0) == "moqt-22"


def test_wrong_pin_fails_the_handshake(
    loop: quic.LoopThread, server: tuple[quic.MoqtServer, asyncio.Queue[quic.MoqtConnection]]
) -> None:
    srv, _ = server
    other = tls.test_certificate.__wrapped__()  # a fresh certificate: not the server's

    async def scenario() -> None:
        with pytest.raises(ConnectionError, match="handshake"):
            await quic.connect(srv.url, verify=other.certificate_pem, timeout=TIMEOUT)

    loop.run(scenario(), timeout=15.0)


def test_alpn_mismatch_fails_the_handshake(
    loop: quic.LoopThread, server: tuple[quic.MoqtServer, asyncio.Queue[quic.MoqtConnection]]
) -> None:
    srv, _ = server

    async def scenario() -> None:
        with pytest.raises(quic.AlpnRefused, match=r"offered 'moqt-20' to .*; it selected none of them") as info:
            await quic.connect(srv.url, alpn=("moqt-20",), timeout=TIMEOUT)
        assert info.value.selected is None and info.value.offered == ("moqt-20",)

    loop.run(scenario(), timeout=15.0)


def test_a_peer_selecting_another_draft_is_refused_in_one_line(loop: quic.LoopThread) -> None:
    """Offered moqt-22 and moqt-20, the server chose moqt-20: connect raises (no closed session handed back)
    naming both, and the session was closed PROTOCOL_VIOLATION with the same line (MOQT-SETUP-ALPN)."""

    async def handler(connection: quic.MoqtConnection) -> None:
        await connection.wait_closed(timeout=30.0)

    async def scenario() -> None:
        srv = await quic.serve("127.0.0.1", 0, handler, alpn=("moqt-20",))
        try:
            with pytest.raises(quic.AlpnRefused) as info:
                await quic.connect(srv.url, alpn=("moqt-22", "moqt-20"), timeout=TIMEOUT)
            assert info.value.selected == "moqt-20"
            assert "offered 'moqt-22', 'moqt-20'" in str(info.value) and "it selected 'moqt-20'" in str(info.value)
        finally:
            await srv.close()

    loop.run(scenario(), timeout=15.0)


def test_violation_closes_with_the_termination_code_on_the_wire(
    loop: quic.LoopThread, server: tuple[quic.MoqtServer, asyncio.Queue[quic.MoqtConnection]]
) -> None:
    """Two GOAWAYs on the control stream -> the server closes PROTOCOL_VIOLATION (profile §6.2)."""
    srv, accepted = server

    async def scenario() -> tuple[SessionClosed, SessionClosed]:
        conn = await quic.connect(srv.url, timeout=TIMEOUT)
        peer = await asyncio.wait_for(accepted.get(), TIMEOUT)
        control = conn.session.control_stream_id
        assert control is not None
        conn.session.send_raw(control, Goaway().encode() + Goaway().encode())
        closed = await conn.wait_closed(TIMEOUT)
        return closed, await peer.wait_closed(TIMEOUT)

    client_view, server_view = loop.run(scenario(), timeout=15.0)
    assert client_view.by_peer and client_view.code == SessionError.PROTOCOL_VIOLATION
    assert "second GOAWAY" in client_view.reason
    assert not server_view.by_peer and server_view.code == SessionError.PROTOCOL_VIOLATION


def test_a_session_close_and_a_transport_close_are_told_apart(
    loop: quic.LoopThread, server: tuple[quic.MoqtServer, asyncio.Queue[quic.MoqtConnection]]
) -> None:
    """An application CONNECTION_CLOSE is a MOQT session close; a transport CONNECTION_CLOSE with the same
    number (0x3 is FLOW_CONTROL_ERROR there) is not one (profile section 1)."""
    srv, accepted = server

    async def close(transport: bool) -> SessionClosed:
        conn = await quic.connect(srv.url, timeout=TIMEOUT)
        peer = await asyncio.wait_for(accepted.get(), TIMEOUT)
        if transport:
            peer._protocol._quic.close(error_code=0x3, frame_type=0, reason_phrase="transport")
            peer._protocol.transmit()
        else:
            peer.session.close(SessionError.PROTOCOL_VIOLATION, "session")
        return await conn.wait_closed(TIMEOUT)

    session_close = loop.run(close(False), timeout=15.0)
    transport_close = loop.run(close(True), timeout=15.0)
    assert session_close == SessionClosed(SessionError.PROTOCOL_VIOLATION, "session", by_peer=True, transport=False)
    assert transport_close == SessionClosed(0x3, "transport", by_peer=True, transport=True)


def test_nothing_listening_is_a_refusal_at_once(loop: quic.LoopThread) -> None:
    """An ICMP port unreachable ends the connect at once (not after its timeout), as ConnectionRefusedError."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]

    async def scenario() -> float:
        started = time.monotonic()
        with pytest.raises(ConnectionRefusedError, match="nothing listens there"):
            await quic.connect(f"moqt://127.0.0.1:{port}", timeout=TIMEOUT)
        return time.monotonic() - started

    assert loop.run(scenario(), timeout=15.0) < TIMEOUT / 2


def test_server_config_factory_applies_per_session(loop: quic.LoopThread) -> None:
    async def scenario() -> int:
        srv = await quic.serve("127.0.0.1", 0, lambda c: c.wait_closed(30.0),  # type: ignore[arg-type,return-value]
                               config_factory=lambda: SessionConfig(Role.SERVER, max_filter_ranges=3))
        try:
            conn = await quic.connect(srv.url, timeout=TIMEOUT)
            event = await conn.next_event(TIMEOUT)
            await conn.close(timeout=TIMEOUT)
            assert isinstance(event, SetupReceived)
            return event.setup.max_filter_ranges
        finally:
            await srv.close()

    assert loop.run(scenario(), timeout=15.0) == 3


def test_qlog_and_key_log_evidence(
    loop: quic.LoopThread, server: tuple[quic.MoqtServer, asyncio.Queue[quic.MoqtConnection]], tmp_path: Path
) -> None:
    srv, _ = server
    keylog = tmp_path / "keys.log"

    async def scenario() -> None:
        with keylog.open("w") as secrets:
            conn = await quic.connect(srv.url, qlog_dir=str(tmp_path), secrets_log=secrets, timeout=TIMEOUT)
            await conn.next_event(TIMEOUT)  # the server's SETUP
            await conn.close(timeout=TIMEOUT)

    loop.run(scenario(), timeout=15.0)
    (qlog,) = tmp_path.glob("*.qlog")
    assert '"qlog_version"' in qlog.read_text()
    assert "CLIENT_HANDSHAKE_TRAFFIC_SECRET" in keylog.read_text()


def test_transcript_records_writes_and_events(
    loop: quic.LoopThread, server: tuple[quic.MoqtServer, asyncio.Queue[quic.MoqtConnection]]
) -> None:
    srv, _ = server
    transcript = evidence.Transcript()
    previous = evidence.activate(transcript)
    try:
        async def scenario() -> None:
            conn = await quic.connect(srv.url, transcript=True, timeout=TIMEOUT)
            await conn.next_event(TIMEOUT)
            await conn.close(timeout=TIMEOUT)

        loop.run(scenario(), timeout=15.0)
    finally:
        evidence.activate(previous)
    kinds = [(e["direction"], e["kind"]) for e in transcript.as_list()]
    assert kinds[0] == ("sent", "moqt.WriteStream") and ("received", "moqt.SetupReceived") in kinds
    setup = transcript.as_list()[0]
    assert setup["fields"] == {"stream": 2, "fin": False} and setup["raw"]["head_hex"].startswith("af00")
