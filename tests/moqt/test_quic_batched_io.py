"""The adapter's batched send (``_send_batched``): runs of equal-sized datagrams to one address go to the kernel
in one UDP GSO ``sendmsg`` and still arrive as the same datagrams in the same order; where GSO is refused (or
off) every datagram goes with its own ``sendto``; a transport that records datagrams (the harness's capture)
is never given GSO runs. And on loopback aioquic's pacer holds nothing back (``_tune_after_handshake``)."""

from __future__ import annotations

import asyncio
import socket
from types import SimpleNamespace
from typing import Any

import pytest

from kvconform.moqt import quic

RECEIVE_TIMEOUT_S = 5.0


def _datagrams(addr: Any) -> list[tuple[bytes, Any]]:
    """Full-size runs, a short one inside, a lone one and a run longer than GSO_MAX_BYTES allows in one send."""
    sizes = [1440] * 50 + [100] + [1440] * 3 + [700] + [1200] * 60
    return [(bytes([i % 251]) * size, addr) for i, size in enumerate(sizes)]


def _send_and_receive(gso: bool) -> tuple[list[bytes], list[bytes]]:
    receiver = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    receiver.bind(("127.0.0.1", 0))
    receiver.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1 << 20)
    receiver.settimeout(RECEIVE_TIMEOUT_S)
    addr = receiver.getsockname()
    sent = _datagrams(addr)

    async def send() -> None:
        loop = asyncio.get_running_loop()
        transport, _ = await loop.create_datagram_endpoint(asyncio.DatagramProtocol, local_addr=("127.0.0.1", 0))
        try:
            quic._send_batched(transport, sent)
        finally:
            transport.close()

    saved = quic._GSO_OK[0]
    quic._GSO_OK[0] = gso and saved
    try:
        asyncio.run(send())
        got = [receiver.recv(65536) for _ in sent]
    finally:
        quic._GSO_OK[0] = saved
        receiver.close()
    return [d for d, _ in sent], got


@pytest.mark.parametrize("gso", [True, False], ids=["gso", "one sendto each"])
def test_batched_sends_arrive_as_the_same_datagrams_in_order(gso: bool) -> None:
    sent, got = _send_and_receive(gso)
    assert [len(d) for d in got] == [len(d) for d in sent]
    assert got == sent


def test_a_recording_transport_gets_no_gso_runs() -> None:
    """The capture's transport has no socket to send on and sets ``records``: every datagram goes to its sendto."""
    seen: list[bytes] = []
    transport = SimpleNamespace(records=True, sendto=lambda data, addr=None: seen.append(data),
                                get_extra_info=lambda name, default=None: None, is_closing=lambda: False)
    assert quic._gso_transport(transport) is None
    sent = _datagrams(("127.0.0.1", 9))
    quic._send_batched(transport, sent)
    assert seen == [d for d, _ in sent]


def test_loopback_connections_are_not_paced() -> None:
    pacer = SimpleNamespace(next_send_time=lambda now: now + 1.0)
    loss = SimpleNamespace(_pacer=pacer, _cc=None)
    conn = SimpleNamespace(get_peer_address=lambda: ("127.0.0.1", 4433), _loss=loss, _max_datagram_size=1200,
                           tls=SimpleNamespace(received_extensions=None))
    quic._tune_after_handshake(conn)  # type: ignore[arg-type]
    assert pacer.next_send_time(0.0) is None
    remote = SimpleNamespace(next_send_time=lambda now: now + 1.0)
    other = SimpleNamespace(get_peer_address=lambda: ("192.0.2.1", 4433), _loss=SimpleNamespace(_pacer=remote))
    quic._tune_after_handshake(other)  # type: ignore[arg-type]
    assert remote.next_send_time(0.0) == 1.0
