"""tlkv-decode: storing, holding and deduplicating blocks (TLKV "Transfer (tl.kv.v1)").

Each check pushes blocks with fresh hashes, so checks never see each other's blocks.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pytest

from kvconform.conformance.tlkv.decode.transfer import (
    CALL_TIMEOUT,
    chunk_for,
    fresh_blocks,
    has_blocks,
    push,
    request_id,
)
from kvconform.fixtures.tlkv import DecodeUnderTest
from kvconform.targets.spec import Pics
from kvconform.tlkv.chunk import Chunk
from kvconform.tlkv.grpc_client import KvTransferClient, PushOutcome

pytestmark = pytest.mark.usefixtures("tlkv_decode_sanity")


@pytest.fixture
def client(tlkv_decode: DecodeUnderTest) -> Iterator[KvTransferClient]:
    with tlkv_decode.client(CALL_TIMEOUT) as c:
        yield c


@pytest.mark.parametrize("version", [1, 2])
@pytest.mark.req("TLKV-XFER-DEDUP", "TLKV-HASH-FULL-ONLY", "TLKV-HASH-RESERVED-ZERO", "TLKV-READ-V2-BOTH")
def test_stored_blocks_are_held(version: int, tlkv_decode: DecodeUnderTest, client: KvTransferClient, pics: Pics,
                                rng: np.random.Generator) -> None:
    pics.require("tlkv.decode.versions", version)
    blocks = fresh_blocks(rng, tlkv_decode, 3)
    rid = request_id()
    outcome = push(client, [chunk_for(rid, i, b, version, tlkv_decode) for i, b in enumerate(blocks)])
    assert outcome.ok, (f"a valid v{version} stream was refused although PICS tlkv.decode.versions declares "
                        f"v{version} (source: {pics.source}): {outcome.status_name} {outcome.details}")
    held = has_blocks(client, [b.block_hash for b in blocks[:3]] + [0])
    assert held[:3] == [True] * 3, f"full blocks of a successful stream not held: {held[:3]} (TLKV-XFER-DEDUP)"
    assert held[3] is False, "HasBlocks(0) answered held: 0 means no hash; a partial tail is never registered"


@pytest.mark.req("TLKV-XFER-HAS-ORDER")
def test_has_blocks_order(tlkv_decode: DecodeUnderTest, client: KvTransferClient, rng: np.random.Generator) -> None:
    stored = fresh_blocks(rng, tlkv_decode, 2, tail=False)
    rid = request_id()
    assert push(client, [chunk_for(rid, i, b, min(tlkv_decode.versions), tlkv_decode)
                         for i, b in enumerate(stored)]).ok
    unknown = [int(h) for h in rng.integers(1, 1 << 63, size=3)]
    query = [unknown[0], stored[1].block_hash, unknown[1], stored[0].block_hash, unknown[2], stored[1].block_hash]
    held = has_blocks(client, query)
    assert held == [False, True, False, True, False, True], f"held flags not one per hash in order: {held}"


def _push_then_reuse(client: KvTransferClient, dut: DecodeUnderTest,
                     rng: np.random.Generator) -> tuple[list[Chunk], PushOutcome, list[Chunk], PushOutcome]:
    """Push 3 full blocks and a tail; then 3 empty payloads for them plus 1 new full block and a tail."""
    v = min(dut.versions)
    blocks = fresh_blocks(rng, dut, 3)
    rid0 = request_id()
    first_chunks = [chunk_for(rid0, i, b, v, dut) for i, b in enumerate(blocks)]
    first = push(client, first_chunks)
    rid = request_id()
    chunks = [Chunk.for_payload(rid, i, b.block_hash, v, b"") for i, b in enumerate(blocks[:3])]
    chunks += [chunk_for(rid, 3 + i, b, v, dut) for i, b in enumerate(fresh_blocks(rng, dut, 1))]
    return first_chunks, first, chunks, push(client, chunks)


@pytest.mark.req("TLKV-XFER-EMPTY-HELD")
def test_empty_payload_reuses_held_block(tlkv_decode: DecodeUnderTest, client: KvTransferClient,
                                         rng: np.random.Generator) -> None:
    _, first, chunks, second = _push_then_reuse(client, tlkv_decode, rng)
    assert first.ok, f"first stream refused: {first.status_name} {first.details}"
    assert second.ok, f"empty payloads for held blocks refused: {second.status_name} {second.details}"
    held = has_blocks(client, [c.block_hash for c in chunks[:4]])
    assert held == [True] * 4, f"after the reuse stream, held flags {held}, expected all held"


@pytest.mark.req("TLKV-XFER-RESPONSE")
def test_response_counts(tlkv_decode: DecodeUnderTest, client: KvTransferClient, rng: np.random.Generator) -> None:
    first_chunks, first, chunks, second = _push_then_reuse(client, tlkv_decode, rng)
    for what, sent, outcome in (("first push", first_chunks, first), ("reuse push", chunks, second)):
        assert outcome.ok and outcome.response is not None, f"{what}: {outcome.status_name} {outcome.details}"
        r = outcome.response
        want = (sum(1 for c in sent if c.payload), sum(1 for c in sent if not c.payload),
                sum(len(c.payload) for c in sent))
        seen = (r.blocks_stored, r.blocks_reused, r.payload_bytes)
        assert seen == want, (f"{what}: PushKvResponse (blocks_stored, blocks_reused, payload_bytes): got {seen}, "
                              f"expected {want}")
