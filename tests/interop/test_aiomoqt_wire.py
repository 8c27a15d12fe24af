"""How aiomoqt 0.13.3 frames draft-22, byte for byte, checked against spec/moqt-d22-profile.md.

A raw QUIC endpoint (``wiretap``) records what aiomoqt's relay and client put on each stream, and
kvconform's codec decodes it: a decode error is a disagreement between aiomoqt's encoder and our decoder,
and every assertion names the profile section it holds aiomoqt to. Findings: docs/interop-aiomoqt.md.
"""

from __future__ import annotations

import asyncio

import pytest

from kvconform import evidence
from kvconform.moqt.messages import PublishNamespace, Setup, Subscribe
from kvconform.moqt.structures import ParamType, SetupOption
from kvconform.targets import docker as dk
from kvconform.targets.testbed import Testbed

from .peers import RelayEndpoint, run_aiomoqt_client
from .tap import TapPoint
from .wiretap import StreamLog, Tap, dial, listen

pytestmark = pytest.mark.interop

TIMEOUT_S = 10.0
SETUP_TYPE = b"\xaf\x00"  # 0x2F00 as vi64: the SETUP message type is also the control stream's type


def _server_control(streams: dict[int, StreamLog]) -> list[int]:
    return [sid for sid in streams if sid % 4 == 3]  # server-initiated unidirectional


def test_relay_negotiates_moqt_22_and_sends_setup_first(aiomoqt_relay_endpoint: RelayEndpoint) -> None:
    """Profile §1 (ALPN moqt-22 only; QUIC DATAGRAM negotiated), §4.1 (control = one uni stream each,
    starting with SETUP), §5 (SETUP: Type 0x2F00, 16-bit Length, KVP options; a server sends neither PATH
    nor AUTHORITY)."""

    async def run() -> Setup:
        async with dial(aiomoqt_relay_endpoint.port, ["moqt-22"]) as tap:
            assert tap.alpn == "moqt-22", f"ALPN: got {tap.alpn!r}, expected 'moqt-22' (profile §1)"
            datagram = tap.remote_max_datagram_frame_size()
            assert datagram, f"relay did not negotiate QUIC DATAGRAM (max_datagram_frame_size {datagram}, §1)"
            tap.send_setup()
            await tap.wait_for(lambda: any(tap.first_message(s) for s in _server_control(tap.streams)),
                               TIMEOUT_S, "the relay's SETUP on a server-initiated unidirectional stream")
            (sid,) = _server_control(tap.streams)
            data = bytes(tap.streams[sid].data)
            assert data[:2] == SETUP_TYPE, f"control stream {sid} starts {data[:2].hex()}, expected af00 (§4.1)"
            length = int.from_bytes(data[2:4], "big")
            setup = Setup.decode(data[: 4 + length])
            evidence.record("note", "aiomoqt-relay-setup", {"hex": data[: 4 + length].hex(),
                                                            "options": [(kv.type, kv.value) for kv in setup.options]})
            return setup

    setup = asyncio.run(run())
    types = {kv.type for kv in setup.options}
    assert SetupOption.PATH not in types and SetupOption.AUTHORITY not in types, \
        f"server SETUP carries PATH/AUTHORITY (profile §5: client only): {setup.options}"
    assert setup.implementation == b"aiomoqt/0.13.3", f"MOQT_IMPLEMENTATION: got {setup.implementation!r}"
    # Declared in testbeds/aiomoqt.yaml PICS moqt.max_filter_ranges: cross-checked against the wire.
    assert setup.max_filter_ranges == 16, f"MAX_FILTER_RANGES: got {setup.max_filter_ranges}, PICS says 16"


@pytest.mark.parametrize("alpn", [["moqt-20"], ["moqt"], ["moq-00"]])
def test_relay_pinned_to_22_refuses_other_alpn(alpn: list[str], aiomoqt_relay_endpoint: RelayEndpoint) -> None:
    """Profile §1: negotiation is only by ALPN; a relay pinned to draft-22 must not accept another."""

    async def run() -> str | None:
        try:
            async with dial(aiomoqt_relay_endpoint.port, alpn, timeout_s=TIMEOUT_S) as tap:
                return tap.alpn
        except (ConnectionError, TimeoutError) as exc:  # refused with an alert, or never answered
            evidence.note(f"handshake offering {alpn} not completed: {exc!r}")
            return None

    chosen = asyncio.run(run())
    assert chosen is None, f"relay pinned to draft-22 accepted ALPN {chosen!r} when offered {alpn}"


def _drive_client(testbed: Testbed, testcase: str) -> tuple[TapPoint, list[Tap]]:
    """aiomoqt's client runs ``testcase`` against a wiretap server; returns its TAP point and the taps."""

    async def run() -> tuple[TapPoint, list[Tap]]:
        port = dk.free_port("udp")
        async with listen(port, ["moqt-22"]) as taps:
            point = await asyncio.to_thread(run_aiomoqt_client, testbed, testcase, f"moqt://127.0.0.1:{port}")
            return point, list(taps)

    return asyncio.run(run())


def test_client_setup_carries_path_authority_implementation(docker_images: list[str],
                                                            interop_testbed: Testbed) -> None:
    """Profile §1: ALPN moqt-22 and QUIC DATAGRAM; §5: a native-QUIC client SETUP carries AUTHORITY
    (host:port) and PATH; §13 #21: aiomoqt sends an empty PATH when the URI has none (legal)."""
    point, taps = _drive_client(interop_testbed, "setup-only")
    assert point.ok, point.describe()
    (tap,) = taps
    assert tap.alpn == "moqt-22", f"ALPN: got {tap.alpn!r}, expected 'moqt-22' (profile §1)"
    assert tap.remote_max_datagram_frame_size(), "client did not negotiate QUIC DATAGRAM (profile §1)"
    client_control = [s for s in tap.streams.values() if s.stream_id % 4 == 2]
    assert len(client_control) == 1, f"client opened {len(client_control)} unidirectional streams, expected 1"
    data = bytes(client_control[0].data)
    assert data[:2] == SETUP_TYPE, f"client control stream starts {data[:2].hex()}, expected af00"
    setup = Setup.decode(data[: 4 + int.from_bytes(data[2:4], "big")])
    evidence.record("note", "aiomoqt-client-setup", {"hex": data.hex(),
                                                     "options": [(kv.type, kv.value) for kv in setup.options]})
    assert setup.path == b"", f"PATH: got {setup.path!r}, expected b'' (URI without a path)"
    assert setup.authority is not None and setup.authority.startswith(b"127.0.0.1:"), \
        f"AUTHORITY: got {setup.authority!r}, expected b'127.0.0.1:<port>'"
    assert setup.implementation == b"aiomoqt/0.13.3"


def test_client_requests_decode_with_our_codec(docker_images: list[str], interop_testbed: Testbed) -> None:
    """Profile §4.1-4.3, §6.2, §7.3: PUBLISH_NAMESPACE and SUBSCRIBE each open their own client bidi
    stream, carry an even Request ID and no response Request ID is expected; SUBSCRIBE's filter is the
    d22 typed LOCATION_FILTER (Next Object = ``21 05``)."""
    point, taps = _drive_client(interop_testbed, "announce-only")
    assert point.ok, point.describe()
    (tap,) = taps
    first = tap.first_message(0)
    assert isinstance(first, PublishNamespace), f"stream 0 carries {first!r}, expected PUBLISH_NAMESPACE"
    assert first.request_id % 2 == 0, f"client Request ID {first.request_id} is odd (profile §4.3)"
    assert len(first.track_namespace) >= 1

    point, taps = _drive_client(interop_testbed, "subscribe-error")
    assert point.ok, point.describe()  # it expects the DOES_NOT_EXIST our wiretap sends
    (tap,) = taps
    sub = tap.first_message(0)
    assert isinstance(sub, Subscribe), f"stream 0 carries {sub!r}, expected SUBSCRIBE"
    raw = bytes(tap.streams[0].data)
    evidence.record("note", "aiomoqt-client-subscribe", {"hex": raw.hex(), "parameters": repr(sub.parameters)})
    assert raw.endswith(b"\x01\x21\x05"), \
        f"SUBSCRIBE parameters end {raw[-3:].hex()}, expected 01 21 05 (one parameter: LOCATION_FILTER Next Object)"
    assert sub.parameters.get(ParamType.LOCATION_FILTER) is not None
