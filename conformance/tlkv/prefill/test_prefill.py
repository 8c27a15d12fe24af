"""tlkv-prefill: what a prefill side sends to a decode side (TLKV "Transfer (tl.kv.v1)").

The harness is the decode side: the reference decode side on 127.0.0.1, instrumented to record every
HasBlocks and KvChunk, pre-loaded with the scenario's held blocks.  Each scenario runs the prefill side
once; the checks read the recording.  Scenarios hold nothing, a prefix, a block in the middle (held
blocks need not be a prefix), every full block of a sequence without a tail, and use B = 1.
"""

from __future__ import annotations

import tempfile
import threading
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from kvconform.checksum import crc32c
from kvconform.conformance.tlkv.scenarios import case_seed, make_contents, make_tokens
from kvconform.fixtures import evidence
from kvconform.targets.drivers import DriverError, TargetUnavailable
from kvconform.targets.spec import Pics
from kvconform.targets.tlkv import Prefill
from kvconform.tlkv.blockhash import block_fills, chain_hashes
from kvconform.tlkv.chunk import MAX_CHUNK_PAYLOAD, Chunk
from kvconform.tlkv.content import write_sequence
from kvconform.tlkv.decode import DecodeSide
from kvconform.tlkv.envelope import Block, encode_envelope
from kvconform.tlkv.geometry import Geometry
from kvconform.tlkv.grpc_client import KvTransferClient
from kvconform.tlkv.grpc_decode import DecodeServer
from kvconform.tlkv.reader import EnvelopeError, read_envelope
from kvconform.tlkv.vectors import ZERO_HASH_TOKENS

PREFILL_TIMEOUT = 60.0


@dataclass(frozen=True)
class Scenario:
    name: str
    geometry: Geometry
    n_tokens: int
    held: frozenset[int]  # indices of full blocks the decode side holds before the transfer
    version: int
    first_tokens: tuple[int, ...] = ()  # fixed leading tokens; the rest are random


SCENARIOS = [
    Scenario("cold-tail", Geometry(16, 2, 2, 8), 3 * 16 + 5, frozenset(), 1),
    Scenario("prefix-held", Geometry(16, 2, 2, 8), 4 * 16 + 9, frozenset({0, 1}), 1),
    Scenario("middle-held", Geometry(16, 2, 2, 8), 4 * 16 + 1, frozenset({2}), 1),
    Scenario("all-held-no-tail", Geometry(16, 2, 2, 8), 3 * 16, frozenset({0, 1, 2}), 1),
    Scenario("v2-prefix-held", Geometry(16, 3, 1, 8), 3 * 16 + 15, frozenset({0}), 2),
    Scenario("b1-prefix-held", Geometry(1, 2, 2, 4), 5, frozenset({0, 1}), 1),
    # Block 0's fnv1a64 is 0: the decode side holds it under hash 1, the replacement.
    Scenario("zero-hash-held", Geometry(16, 2, 2, 4), 2 * 16 + 3, frozenset({0}), 1, ZERO_HASH_TOKENS),
]


@dataclass
class Recording:
    """What the instrumented decode side saw, in order."""

    scenario: Scenario
    tokens: list[int]
    kv: np.ndarray
    events: list[tuple[str, Any]] = field(default_factory=list)
    error: str | None = None
    lock: threading.Lock = field(default_factory=threading.Lock)

    def observe(self, kind: str, *args: object) -> None:
        with self.lock:
            self.events.append((kind, args))

    @property
    def has_blocks(self) -> list[list[int]]:
        return [list(args[0].block_hashes) for kind, args in self.events if kind == "HasBlocks"]  # type: ignore[attr-defined]

    @property
    def chunks(self) -> list[Chunk]:
        return [args[0] for kind, args in self.events if kind == "KvChunk"]  # type: ignore[misc]

    @property
    def push_ends(self) -> list[str]:
        return [args[0].name for kind, args in self.events if kind == "PushKvEnd"]  # type: ignore[attr-defined]


def _preload(address: str, sc: Scenario, tokens: list[int], kv: np.ndarray) -> None:
    """Store the scenario's held blocks through our own client, before the prefill side runs."""
    hashes = chain_hashes(tokens, sc.geometry.block_tokens)
    rid = f"preload-{uuid.uuid4().hex[:8]}"
    chunks = [Chunk.for_payload(rid, i, hashes[i], sc.version,
                                encode_envelope(sc.geometry, sc.version,
                                                [Block(hashes[i], sc.geometry.block_tokens, kv[i])]))
              for i in sorted(sc.held)]
    if chunks:
        with KvTransferClient(address, 30.0) as client:
            outcome = client.push(chunks)
        assert outcome.ok, f"harness preload failed: {outcome.status_name} {outcome.details}"


@pytest.fixture(scope="module", params=SCENARIOS, ids=[s.name for s in SCENARIOS])
def recording(request: pytest.FixtureRequest, tlkv_prefill: Prefill, pics: Pics,
              session_seed: int) -> Iterator[Recording]:
    sc: Scenario = request.param
    pics.require("tlkv.prefill.versions", sc.version)
    rng = np.random.default_rng(case_seed(session_seed, "prefill", sc.name))
    tokens = [*sc.first_tokens, *make_tokens(rng, sc.n_tokens - len(sc.first_tokens))]
    kv = make_contents(rng, sc.geometry, sc.n_tokens)
    rec = Recording(sc, tokens, kv)
    server = DecodeServer(DecodeSide(sc.geometry, frozenset({1, 2})), host="127.0.0.1", port=0,
                          observer=rec.observe)
    port = server.start()
    try:
        address = f"127.0.0.1:{port}"
        _preload(address, sc, tokens, kv)
        rec.events.clear()
        with tempfile.TemporaryDirectory(prefix="kvconform-prefill-") as tmp:
            seq = write_sequence(Path(tmp) / "sequence.json", sc.geometry, sc.version, tokens,
                                 f"kvconform-{uuid.uuid4().hex[:12]}", kv)
            try:
                tlkv_prefill.prefill(address, seq, PREFILL_TIMEOUT)
            except TargetUnavailable:
                raise  # a setup problem: every check of the scenario is inconclusive, and gates
            except DriverError as exc:
                rec.error = str(exc)
        yield rec
    finally:
        server.stop(0)


@pytest.fixture(autouse=True)
def _evidence(recording: Recording) -> None:
    sc = recording.scenario
    evidence.record("note", "scenario", {"name": sc.name, "geometry": sc.geometry.as_dict(), "held": sorted(sc.held),
                                         "version": sc.version, "n_tokens": sc.n_tokens, "error": recording.error})
    for kind, args in recording.events:
        if kind == "KvChunk":
            c: Chunk = args[0]  # type: ignore[assignment]
            evidence.record("received", "KvChunk", {"block_index": c.block_index,
                                                    "block_hash": f"0x{c.block_hash:016X}",
                                                    "kv_format": c.kv_format, "payload_len": len(c.payload),
                                                    "crc32c": f"0x{c.crc32c:08X}"})
        elif kind == "HasBlocks":
            evidence.record("received", "HasBlocks", {"block_hashes": [f"0x{h:016X}" for h in args[0].block_hashes]})  # type: ignore[attr-defined]
        else:
            evidence.record("received", kind, {"args": [str(a) for a in args]})


def _expected_hashes(rec: Recording) -> list[int]:
    return chain_hashes(rec.tokens, rec.scenario.geometry.block_tokens)


@pytest.mark.req("TLKV-XFER-HASBLOCKS-FIRST", "TLKV-HASH-CHAIN", "TLKV-HASH-H", "TLKV-HASH-FNV", "TLKV-HASH-BLOCKS",
                 "TLKV-HASH-FULL-ONLY", "TLKV-HASH-ZERO-IS-ONE")
def test_has_blocks_first(recording: Recording) -> None:
    assert recording.events, f"the prefill side sent nothing ({recording.error or 'no error reported'})"
    first = recording.events[0][0]
    assert first == "HasBlocks", f"first call: got {first}, expected HasBlocks before any KvChunk"
    want = _expected_hashes(recording)
    got = recording.has_blocks[0]
    assert got == want, ("HasBlocks block_hashes: got " + str([f"0x{h:016X}" for h in got]) + ", expected the "
                         "prompt's full-block chain hashes " + str([f"0x{h:016X}" for h in want]))


@pytest.mark.req("TLKV-XFER-CHUNK-FIELDS", "TLKV-HASH-FULL-ONLY", "TLKV-HASH-RESERVED-ZERO")
def test_one_chunk_per_block_in_order(recording: Recording) -> None:
    sc = recording.scenario
    chunks = recording.chunks
    n_blocks = len(block_fills(sc.n_tokens, sc.geometry.block_tokens))
    assert [c.block_index for c in chunks] == list(range(n_blocks)), (
        f"block_index of the chunks: got {[c.block_index for c in chunks]}, expected 0..{n_blocks - 1} in order")
    want = _expected_hashes(recording) + [0] * (n_blocks - len(_expected_hashes(recording)))
    for c, h in zip(chunks, want, strict=True):
        assert c.block_hash == h, f"chunk {c.block_index}: block_hash 0x{c.block_hash:016X}, expected 0x{h:016X}"
    assert len({c.request_id for c in chunks}) == 1, "one request_id per PushKv stream"
    assert recording.push_ends == ["OK"], f"the stream ended {recording.push_ends} at the reference decode side"


@pytest.mark.req("TLKV-XFER-EMPTY-HELD", "TLKV-XFER-PAYLOAD-MISSING")
def test_empty_payload_exactly_for_held(recording: Recording) -> None:
    sc = recording.scenario
    for c in recording.chunks:
        held = c.block_index in sc.held
        if held:
            assert c.payload == b"", (f"chunk {c.block_index}: the decode side holds this block, expected an empty "
                                      f"payload, got {len(c.payload)} bytes (TLKV-XFER-EMPTY-HELD)")
        else:
            kind = "the partial tail" if c.block_hash == 0 else "a block the decode side does not hold"
            assert c.payload, f"chunk {c.block_index}: {kind}, expected its payload, got an empty one"


@pytest.mark.req("TLKV-XFER-ONE-BLOCK", "TLKV-XFER-CRC", "TLKV-XFER-MAX-PAYLOAD", "TLKV-XFER-FORMAT")
def test_payloads(recording: Recording) -> None:
    sc = recording.scenario
    fills = block_fills(sc.n_tokens, sc.geometry.block_tokens)
    assert recording.chunks, "no chunk was sent"
    for c in recording.chunks:
        assert c.kv_format == sc.version, f"chunk {c.block_index}: kv_format {c.kv_format}, expected {sc.version}"
        assert c.crc32c == crc32c(c.payload), (f"chunk {c.block_index}: crc32c 0x{c.crc32c:08X}, expected "
                                               f"0x{crc32c(c.payload):08X} (CRC-32C of the payload)")
        if not c.payload:
            continue
        assert len(c.payload) <= MAX_CHUNK_PAYLOAD
        try:
            env = read_envelope(c.payload, geometry=sc.geometry, versions={sc.version})
        except EnvelopeError as exc:
            pytest.fail(f"chunk {c.block_index}: payload is not a valid envelope: {exc}")
        assert len(env.records) == 1, f"chunk {c.block_index}: n_blocks {len(env.records)}, expected 1"
        assert env.records[0].n_tokens == fills[c.block_index]
        want = encode_envelope(sc.geometry, sc.version,
                               [Block(c.block_hash, fills[c.block_index], recording.kv[c.block_index])])
        if sc.version == 1:
            assert c.payload == want, f"chunk {c.block_index}: envelope differs from the block's canonical v1 bytes"


@pytest.mark.req("TLKV-XFER-BYTES")
def test_bytes_moved(recording: Recording) -> None:
    sc = recording.scenario
    n_full = sc.n_tokens // sc.geometry.block_tokens
    tail = 1 if sc.n_tokens % sc.geometry.block_tokens else 0
    missing = n_full - len(sc.held)
    want = (missing + tail) * sc.geometry.envelope_size(1, sc.version)
    got = sum(len(c.payload) for c in recording.chunks)
    assert got == want, (f"payload bytes moved: got {got}, expected (missing {missing} + tail {tail}) * envelope "
                         f"{sc.geometry.envelope_size(1, sc.version)} = {want}")
