"""DecodeServer + KvTransferClient over real HTTP/2 on 127.0.0.1: statuses, limits, raw bytes."""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np
import pytest

from kvconform.checksum import crc32c
from kvconform.tlkv.chunk import MAX_CHUNK_PAYLOAD, Chunk
from kvconform.tlkv.decode import DecodeSide, Status
from kvconform.tlkv.envelope import DTYPE_F16, Block, encode_envelope, encode_raw
from kvconform.tlkv.geometry import Geometry
from kvconform.tlkv.grpc_client import KvTransferClient
from kvconform.tlkv.grpc_decode import DecodeServer
from kvconform.tlkv.pool import PoolStats
from tests.tlkv.helpers import GEOMETRY, Kit

Serve = Callable[..., DecodeServer]
TIMEOUT = 10.0


@pytest.fixture
def server(serve: Serve, side: DecodeSide) -> DecodeServer:
    return serve(side)


@pytest.fixture
def client(server: DecodeServer) -> Iterator[KvTransferClient]:
    with KvTransferClient(server.address, TIMEOUT) as c:
        yield c


def test_binds_loopback_only_by_default(server: DecodeServer) -> None:
    assert server.host == "127.0.0.1" and server.address == f"127.0.0.1:{server.port}" and server.port > 0


def test_push_then_reuse(kit: Kit, side: DecodeSide, client: KvTransferClient) -> None:
    assert client.has_blocks(kit.hashes[:2]) == [False, False]
    first = client.push(kit.chunks(request_id="a"))
    assert first.ok, first.details
    assert first.response is not None
    assert (first.response.blocks_stored, first.response.blocks_reused) == (3, 0)
    assert first.response.payload_bytes == sum(len(kit.envelope(i)) for i in range(3))
    assert client.has_blocks([kit.hashes[0], 0, kit.hashes[1]]) == [True, False, True]
    second = client.push([kit.chunk(0, request_id="b", empty=True), kit.chunk(1, request_id="b", empty=True),
                          kit.chunk(2, request_id="b")])
    assert second.response is not None
    assert (second.response.blocks_stored, second.response.blocks_reused) == (1, 2)
    assert side.pool.request_refs("b") == {kit.hashes[0]: 1, kit.hashes[1]: 1}


@pytest.mark.parametrize(("mutate", "status", "requirement"), [
    (lambda c: dataclasses.replace(c, kv_format=0), "FAILED_PRECONDITION", "TLKV-XFER-FORMAT"),
    (lambda c: dataclasses.replace(c, crc32c=c.crc32c ^ 0x80), "DATA_LOSS", "TLKV-XFER-CRC"),
    (lambda c: dataclasses.replace(c, block_hash=c.block_hash ^ 1), "INVALID_ARGUMENT", "TLKV-XFER-CHUNK-HASH"),
    (lambda c: Chunk.for_payload(c.request_id, 0, c.block_hash, 1, b""), "NOT_FOUND", "TLKV-XFER-EMPTY-HELD"),
])
def test_a_bad_chunk_fails_the_stream_atomically(kit: Kit, side: DecodeSide, client: KvTransferClient,
                                                 mutate: Callable[[Chunk], Chunk], status: str,
                                                 requirement: str) -> None:
    outcome = client.push([kit.chunk(2), kit.chunk(1), mutate(kit.chunk(0))])
    assert outcome.status_name == status and outcome.response is None
    # the details name the field, the value seen, the value expected and the requirement id
    assert requirement in outcome.details and "expected" in outcome.details and "got" in outcome.details
    assert side.pool.stats() == PoolStats(0, 0, 0, 0, 0)


def test_unread_version_is_failed_precondition(serve: Serve, kit: Kit) -> None:
    server = serve(DecodeSide(GEOMETRY, frozenset({1})))
    with KvTransferClient(server.address, TIMEOUT) as client:
        outcome = client.push([kit.chunk(0, version=2)])
    assert outcome.status_name == "FAILED_PRECONDITION" and "TLKV-XFER-FORMAT" in outcome.details


def test_a_4_mib_payload_reaches_the_reader(kit: Kit, client: KvTransferClient) -> None:
    # Exactly 4 MiB with a valid header and CRC but the wrong length for the pool: grpc must let it
    # through (max_receive_message_length) so the answer is the reader's DATA_LOSS.
    g = GEOMETRY
    payload = encode_raw(version=1, dtype=DTYPE_F16, block_tokens=g.block_tokens, n_layers=g.n_layers,
                         n_kv_heads=g.n_kv_heads, head_dim=g.head_dim,
                         records=[(kit.hashes[0], 4, bytes(MAX_CHUNK_PAYLOAD - 44))])
    assert len(payload) == MAX_CHUNK_PAYLOAD
    outcome = client.push([Chunk.for_payload("r", 0, kit.hashes[0], 1, payload)])
    assert outcome.status_name == "DATA_LOSS", outcome.details
    assert "TLKV-READ-LENGTH" in outcome.details


def test_a_legal_4_mib_envelope_is_stored(serve: Serve) -> None:
    # 28 + 12 + P + 4 = 4 MiB with P = 1*2*5*1*209713*2 (v1): the largest legal chunk.
    geometry = Geometry(block_tokens=1, n_layers=1, n_kv_heads=5, head_dim=209713)
    assert geometry.envelope_size(1, 1) == MAX_CHUNK_PAYLOAD
    side = DecodeSide(geometry, frozenset({1}))
    server = serve(side)
    kv = np.random.default_rng(7).standard_normal(geometry.kv_shape).astype(np.float16)
    payload = encode_envelope(geometry, 1, [Block(0, 1, kv)])
    with KvTransferClient(server.address, TIMEOUT) as client:
        outcome = client.push([Chunk.for_payload("big", 0, 0, 1, payload)])
    assert outcome.ok, outcome.details
    assert outcome.response is not None and outcome.response.payload_bytes == MAX_CHUNK_PAYLOAD
    assert side.pool.partial_blocks("big")[0].size == MAX_CHUNK_PAYLOAD


@pytest.mark.parametrize("extra", [1, 1024])
def test_over_4_mib_is_refused_by_the_decode_side(kit: Kit, client: KvTransferClient, extra: int) -> None:
    outcome = client.push([Chunk.for_payload("r", 0, kit.hashes[0], 1, bytes(MAX_CHUNK_PAYLOAD + extra))])
    assert outcome.status_name == "RESOURCE_EXHAUSTED"
    assert "TLKV-XFER-MAX-PAYLOAD" in outcome.details  # the core's answer, not grpc's transport limit


@pytest.mark.parametrize("raw", [b"\xff\xff\xff\xff", b"\x0a\x05ab", b"\x0a\x02\xff\xfe", b"\x2a\x80\x80\x80\x80\x10"])
def test_malformed_protobuf_is_answered_cleanly(kit: Kit, side: DecodeSide, client: KvTransferClient,
                                                raw: bytes) -> None:
    outcome = client.push([kit.chunk(0), raw])
    assert outcome.status_name == "INVALID_ARGUMENT" and "TLKV-XFER-PROTO" in outcome.details
    assert side.pool.stats() == PoolStats(0, 0, 0, 0, 0)
    sanity = client.push(kit.chunks())
    assert sanity.ok, sanity.details


def test_raw_bytes_of_a_valid_chunk_are_accepted(kit: Kit, client: KvTransferClient) -> None:
    outcome = client.push([kit.chunk(0).encode(), kit.chunk(1)])
    assert outcome.ok and outcome.response is not None and outcome.response.blocks_stored == 2


def test_malformed_has_blocks_request(client: KvTransferClient) -> None:
    outcome = client.has_blocks_call(b"\x09\x01\x02")  # fixed64 field cut short
    assert outcome.status_name == "INVALID_ARGUMENT" and outcome.held is None
    assert client.has_blocks_call([1, 2]).held == [False, False]


def test_a_stream_cut_by_the_deadline_stores_nothing(kit: Kit, side: DecodeSide, server: DecodeServer) -> None:
    release = threading.Event()

    def stalled() -> Iterator[Chunk]:
        yield kit.chunk(0)
        release.wait(TIMEOUT)  # bounded: the deadline below ends the call long before

    try:
        with KvTransferClient(server.address, timeout=0.5) as client:
            outcome = client.push(stalled())
    finally:
        release.set()
    assert outcome.status_name == "DEADLINE_EXCEEDED"
    assert side.has_blocks([kit.hashes[0]]) == [False]


def test_unreachable_server_is_a_status_not_an_exception() -> None:
    with KvTransferClient("127.0.0.1:1", timeout=2.0) as client:
        outcome = client.push([])
    assert outcome.status_name in {"UNAVAILABLE", "DEADLINE_EXCEEDED"}


def test_observer_sees_every_event(serve: Serve, side: DecodeSide, kit: Kit) -> None:
    events: list[tuple[object, ...]] = []
    server = serve(side, observer=lambda *e: events.append(e))
    with KvTransferClient(server.address, TIMEOUT) as client:
        client.has_blocks([kit.hashes[0]])
        client.push([kit.chunk(0)])
        client.push([dataclasses.replace(kit.chunk(1), crc32c=0)])
    kinds = [e[0] for e in events]
    assert kinds == ["HasBlocks", "KvChunk", "PushKvEnd", "KvChunk", "PushKvEnd"]
    assert list(events[0][2].held) == [False]  # type: ignore[attr-defined]
    assert events[1][1] == kit.chunk(0)
    assert events[2][1] is Status.OK and events[2][2].blocks_stored == 1  # type: ignore[attr-defined]
    assert events[4][1:] == (Status.DATA_LOSS, None)
    assert server.status_counts() == {"HasBlocks OK": 1, "PushKv OK": 1, "PushKv DATA_LOSS": 1}


def test_an_explicit_busy_port_is_refused(serve: Serve, side: DecodeSide) -> None:
    first = serve(side)
    second = DecodeServer(side, "127.0.0.1", first.port)
    with pytest.raises(OSError, match="bind"):
        second.start()
    second.stop(0)


def test_context_manager_stops(side: DecodeSide, kit: Kit) -> None:
    with DecodeServer(side) as server:
        address = server.address
        with KvTransferClient(address, TIMEOUT) as client:
            assert client.push([kit.chunk(0)]).ok
    with KvTransferClient(address, timeout=2.0) as client:
        assert client.has_blocks_call([1]).status_name in {"UNAVAILABLE", "DEADLINE_EXCEEDED"}


def test_crc_of_the_payload_not_of_the_message(kit: Kit, client: KvTransferClient) -> None:
    chunk = kit.chunk(0)
    assert chunk.crc32c == crc32c(chunk.payload)
    assert client.push([chunk]).ok


def test_concurrent_streams_deduplicate(kit: Kit, side: DecodeSide, server: DecodeServer) -> None:
    n = 8

    def one(i: int) -> bool:
        with KvTransferClient(server.address, TIMEOUT) as client:
            return client.push(kit.chunks(request_id=f"c{i}")).ok

    with ThreadPoolExecutor(max_workers=n) as pool:
        assert all(pool.map(one, range(n), timeout=TIMEOUT * 2))
    stats = side.pool.stats()
    assert (stats.registered, stats.partial, stats.refs) == (2, n, 3 * n)
    assert side.pool.get(kit.hashes[0]).refs == n  # type: ignore[union-attr]


def test_server_records_evidence(kit: Kit, client: KvTransferClient) -> None:
    evidence = pytest.importorskip("kvconform.evidence")
    transcript = evidence.Transcript()
    previous = evidence.activate(transcript)
    try:
        client.push([kit.chunk(0), b"\xff"])
    finally:
        evidence.activate(previous)
    recorded = [(e.direction, e.kind) for e in transcript.events]
    assert recorded == [("received", "KvChunk"), ("received", "KvChunk"), ("sent", "PushKvStatus")]
    assert transcript.events[0].fields["block_hash"] == f"0x{kit.hashes[0]:016X}"
    assert transcript.events[2].fields["status"] == "INVALID_ARGUMENT"


class _HeldEndOfStream:
    """Holds grpc's poller thread right after it hands the handler an end of stream (test-only hook).

    grpc's sync server reports a client's cancellation in two completion-queue events: the pending
    receive ends with no message (read by the request iterator exactly like a half-close), then
    RECV_CLOSE_ON_SERVER marks the call cancelled.  One poller thread runs both callbacks, so keeping
    it inside the first until the handler has either finished or asked for another message forces the
    handler through the window between the two events every time, instead of under load only.
    """

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        server_module = pytest.importorskip("grpc._server")
        original = getattr(server_module, "_receive_message", None)
        token = getattr(server_module, "_RECEIVE_MESSAGE_TOKEN", None)
        if original is None or token is None:
            pytest.skip("grpc._server internals changed: cannot hold the poller between the two events")
        self.handler_done = threading.Event()
        self.held = 0
        self._conditions: list[threading.Condition] = []

        def receive_message(state: Any, call: Any, deserializer: Any) -> Callable[[Any], Any]:
            callback = original(state, call, deserializer)
            with state.condition:  # the handler asks for another message: wake a held poller
                state.condition.notify_all()

            def hold_after_end(event: Any) -> Any:
                outcome = callback(event)
                if event.batch_operations[0].message() is None:  # end of stream, whatever the cause
                    self.held += 1
                    with state.condition:
                        self._conditions.append(state.condition)
                        # bounded: a handler that neither finishes nor reads on is a failure below
                        state.condition.wait_for(
                            lambda: self.handler_done.is_set() or token in state.due, timeout=TIMEOUT)
                return outcome

            return hold_after_end

        monkeypatch.setattr(server_module, "_receive_message", receive_message)

    def observe(self, *event: object) -> None:
        if event[0] == "PushKvEnd":
            self.handler_done.set()
            for condition in list(self._conditions):
                with condition:
                    condition.notify_all()


def test_a_deadline_between_the_two_grpc_events_stores_nothing(kit: Kit, side: DecodeSide, serve: Serve,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    # The deterministic form of the CI flake: the handler sees the requests end before grpc has
    # processed the cancellation; it must still not commit (TLKV-XFER-ATOMIC).
    hold = _HeldEndOfStream(monkeypatch)
    server = serve(side, observer=hold.observe)
    release = threading.Event()

    def stalled() -> Iterator[Chunk]:
        yield kit.chunk(0)
        release.wait(TIMEOUT)  # bounded: the deadline below ends the call long before

    try:
        with KvTransferClient(server.address, timeout=0.5) as client:
            outcome = client.push(stalled())
    finally:
        release.set()
    assert outcome.status_name == "DEADLINE_EXCEEDED"
    assert hold.handler_done.wait(TIMEOUT), "the PushKv handler never finished"
    assert hold.held >= 1, "the hook never saw the end of the request stream"
    assert side.has_blocks([kit.hashes[0]]) == [False], "a stream cut by its deadline was committed"
    assert server.status_counts() == {"PushKv CANCELLED": 1}


def test_a_completed_stream_under_the_same_hold_is_stored(kit: Kit, side: DecodeSide, serve: Serve,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    # The control: a real half-close through the same hook must still commit.
    hold = _HeldEndOfStream(monkeypatch)
    server = serve(side, observer=hold.observe)
    with KvTransferClient(server.address, TIMEOUT) as client:
        outcome = client.push([kit.chunk(0)])
    assert outcome.ok, outcome.details
    assert hold.held >= 1 and side.has_blocks([kit.hashes[0]]) == [True]
