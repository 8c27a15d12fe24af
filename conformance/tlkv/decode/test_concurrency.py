"""tlkv-decode: concurrent PushKv streams over shared blocks (TLKV "Transfer (tl.kv.v1)").

A race against a black box is driven many times with its invariants checked (DESIGN.md principle 5):
several streams at once push overlapping blocks (the same hash always carries the same envelope),
some end with a corrupt chunk, some send empty payloads for blocks another stream may still be storing.
Afterwards a block is held iff at least one successful stream carried its payload or reused it; a block
only failed streams carried is not held. Every attempt is kept in the evidence.
"""

from __future__ import annotations

from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

from kvconform.conformance.tlkv.decode.transfer import CALL_TIMEOUT, has_blocks, request_id
from kvconform.conformance.tlkv.malformations import full_block
from kvconform.fixtures import evidence
from kvconform.fixtures.tlkv import DecodeUnderTest
from kvconform.tlkv.chunk import Chunk
from kvconform.tlkv.envelope import encode_envelope
from kvconform.tlkv.grpc_client import KvTransferClient, PushOutcome

pytestmark = pytest.mark.usefixtures("tlkv_decode_sanity")

ROUNDS = 6
STREAMS = 8
SHARED = 6  # distinct blocks per round, shared by every stream of the round


@pytest.fixture
def client(tlkv_decode: DecodeUnderTest) -> Iterator[KvTransferClient]:
    with tlkv_decode.client(CALL_TIMEOUT) as c:
        yield c


@pytest.mark.req("TLKV-XFER-ATOMIC", "TLKV-XFER-DEDUP", "TLKV-XFER-EMPTY-HELD")
def test_concurrent_streams_keep_exactly_what_succeeded(tlkv_decode: DecodeUnderTest, client: KvTransferClient,
                                                        rng: np.random.Generator) -> None:
    g, v = tlkv_decode.geometry, min(tlkv_decode.versions)
    violations: list[str] = []
    for rnd in range(ROUNDS):
        blocks = [full_block(rng, g) for _ in range(SHARED)]
        payloads = {b.block_hash: encode_envelope(g, v, [b]) for b in blocks}
        plans: list[tuple[list[Chunk], bool, set[int]]] = []
        for _ in range(STREAMS):
            rid = request_id()
            picks = rng.choice(SHARED, size=int(rng.integers(1, SHARED + 1)), replace=False)
            chunks = []
            for i, k in enumerate(picks):
                h = blocks[int(k)].block_hash
                empty = rng.random() < 0.3  # "use the copy you hold": may race with the stream storing it
                chunks.append(Chunk.for_payload(rid, i, h, v, b"" if empty else payloads[h]))
            corrupt = rng.random() < 0.35
            if corrupt:
                bad = payloads[blocks[0].block_hash]
                chunks.append(Chunk(rid, len(chunks), blocks[0].block_hash, v, bad, 0xDEADBEEF))
            plans.append((chunks, corrupt, {c.block_hash for c in chunks}))
        with ThreadPoolExecutor(STREAMS) as pool:
            outcomes: list[PushOutcome] = list(pool.map(lambda p: client.push(p[0]), plans))
        kept: set[int] = set()
        for (chunks, corrupt, hashes), outcome in zip(plans, outcomes, strict=True):
            evidence.record("received", "PushKv", {"round": rnd, "chunks": len(chunks), "corrupt": corrupt,
                                                   "status": outcome.status_name, "details": outcome.details})
            if corrupt and outcome.ok:
                violations.append(f"round {rnd}: a stream ending in a chunk with a wrong crc32c was accepted")
            if outcome.ok:
                kept |= hashes
        held = has_blocks(client, [b.block_hash for b in blocks])
        for b, is_held in zip(blocks, held, strict=True):
            if is_held != (b.block_hash in kept):
                why = "no successful stream carried it" if is_held else "a successful stream stored or reused it"
                violations.append(f"round {rnd}: block 0x{b.block_hash:016X} held={is_held}, but {why}")
    assert not violations, f"{len(violations)} invariant violations in {ROUNDS} rounds of {STREAMS} streams:\n" + \
        "\n".join(violations[:10])
