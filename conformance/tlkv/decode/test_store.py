"""tlkv-decode: storing, holding and deduplicating blocks (TLKV "Transfer (tl.kv.v1)").

Each check pushes blocks with fresh hashes, so checks never see each other's blocks. tl.kv.v1 shows what a decode
side holds (HasBlocks), not the references it takes on a held copy: no check claims to see those.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pytest

from kvconform.conformance.tlkv.decode.transfer import (
    ACCEPT,
    CALL_TIMEOUT,
    TRANSPORT,
    chunk_for,
    expect_accepted,
    expect_refusal,
    fits,
    fresh_blocks,
    has_blocks,
    held_each,
    push,
    request_id,
    valid_version,
)
from kvconform.conformance.tlkv.malformations import full_block, statuses
from kvconform.fixtures.tlkv import DecodeUnderTest
from kvconform.targets.spec import Pics
from kvconform.tlkv.chunk import MAX_CHUNK_PAYLOAD, Chunk
from kvconform.tlkv.envelope import Block
from kvconform.tlkv.grpc_client import KvTransferClient, PushOutcome
from kvconform.verdicts import check, check_equal, not_applicable

pytestmark = pytest.mark.usefixtures("tlkv_decode_sanity")


@pytest.fixture
def client(tlkv_decode: DecodeUnderTest) -> Iterator[KvTransferClient]:
    with tlkv_decode.client(CALL_TIMEOUT) as c:
        yield c


@pytest.mark.parametrize("version", [pytest.param(1, marks=pytest.mark.req(ACCEPT)),
                                     pytest.param(2, marks=pytest.mark.req("TLKV-READ-V2-BOTH"))])
@pytest.mark.req("TLKV-XFER-DEDUP", "TLKV-HASH-RESERVED-ZERO")
def test_stored_blocks_are_held(version: int, tlkv_decode: DecodeUnderTest, client: KvTransferClient, pics: Pics,
                                rng: np.random.Generator) -> None:
    pics.require("tlkv.decode.versions", version)
    if not fits(tlkv_decode, version):
        not_applicable(f"a one-block v{version} envelope of the declared geometry {tlkv_decode.geometry} is "
                       f"{tlkv_decode.geometry.envelope_size(1, version)} bytes, over the {MAX_CHUNK_PAYLOAD}-byte "
                       "chunk limit: no such block can be transferred")
    blocks = fresh_blocks(rng, tlkv_decode, 3)
    rid = request_id()
    chunks = [chunk_for(rid, i, b, version, tlkv_decode) for i, b in enumerate(blocks)]
    expect_accepted(push(client, chunks), chunks, tlkv_decode, what=f"a valid v{version} stream of 3 full blocks "
                    "and a partial tail")
    held = held_each(client, [b.block_hash for b in blocks[:3]])
    check(all(held), "full blocks of a successful stream, held afterwards (HasBlocks)", req="TLKV-XFER-DEDUP",
          seen=held, expected=[True] * 3)
    zero = has_blocks(client, [0])
    check_equal("HasBlocks(0): 0 means no hash, and the partial tail is never registered", zero[0], False,
                req="TLKV-HASH-RESERVED-ZERO")


@pytest.mark.req("TLKV-HASH-FULL-ONLY", ACCEPT, "TLKV-XFER-EMPTY-HELD")
def test_partial_tail_is_never_deduplicated(tlkv_decode: DecodeUnderTest, client: KvTransferClient,
                                            rng: np.random.Generator) -> None:
    """After a stream stored a partial tail, an empty payload "for" it (block_hash 0) is refused: a partial block
    is never registered, so it can never be deduplicated."""
    v = valid_version(tlkv_decode)
    blocks = fresh_blocks(rng, tlkv_decode, 1)
    rid = request_id()
    chunks = [chunk_for(rid, i, b, v, tlkv_decode) for i, b in enumerate(blocks)]
    expect_accepted(push(client, chunks), chunks, tlkv_decode, what="a valid stream of a full block and a tail")
    outcome = push(client, [Chunk.for_payload(request_id(), 0, 0, v, b"")])
    # Is it the tail it reuses, or does it take an empty payload for any block it does not hold? Asked whatever
    # the answer above, so the id this check cites for it is always asserted.
    unheld = int(rng.integers(1, 1 << 63))
    check(not push(client, [Chunk.for_payload(request_id(), 0, unheld, v, b"")]).ok,
          "an empty payload for a block never stored was answered OK", req="TLKV-XFER-EMPTY-HELD", seen="OK",
          expected="a refusal")
    expect_refusal(outcome, statuses("unheld-empty"), what="an empty payload with block_hash 0 (the partial tail "
                   "just stored)", rule="TLKV-HASH-FULL-ONLY", status_req="TLKV-HASH-FULL-ONLY")


@pytest.mark.req("TLKV-XFER-HAS-ORDER", ACCEPT)
def test_has_blocks_order(tlkv_decode: DecodeUnderTest, client: KvTransferClient, rng: np.random.Generator) -> None:
    stored = fresh_blocks(rng, tlkv_decode, 2, tail=False)
    v = valid_version(tlkv_decode)
    rid = request_id()
    chunks = [chunk_for(rid, i, b, v, tlkv_decode) for i, b in enumerate(stored)]
    expect_accepted(push(client, chunks), chunks, tlkv_decode, what="a valid stream of 2 full blocks")
    unknown = [int(h) for h in rng.integers(1, 1 << 63, size=3)]
    query = [unknown[0], stored[1].block_hash, unknown[1], stored[0].block_hash, unknown[2], stored[1].block_hash]
    held = has_blocks(client, query)
    check_equal("HasBlocksResponse.held for [unknown, stored 1, unknown, stored 0, unknown, stored 1]: one entry "
                "per requested hash, in the same order", held, [False, True, False, True, False, True],
                req="TLKV-XFER-HAS-ORDER")


def _push_then_reuse(client: KvTransferClient, dut: DecodeUnderTest, rng: np.random.Generator,
                     ) -> tuple[list[Chunk], PushOutcome, list[Chunk]]:
    """Push 3 full blocks and a tail (it must be accepted); return those chunks, the outcome, and a stream of
    empty payloads for the 3 full blocks, one new full block and a tail."""
    v = valid_version(dut)
    blocks = fresh_blocks(rng, dut, 3)
    rid0 = request_id()
    first = [chunk_for(rid0, i, b, v, dut) for i, b in enumerate(blocks)]
    outcome = push(client, first)
    expect_accepted(outcome, first, dut, what="a valid stream of 3 full blocks and a partial tail")
    rid = request_id()
    reuse = [Chunk.for_payload(rid, i, b.block_hash, v, b"") for i, b in enumerate(blocks[:3])]
    reuse += [chunk_for(rid, 3 + i, b, v, dut) for i, b in enumerate(fresh_blocks(rng, dut, 1))]
    return first, outcome, reuse


@pytest.mark.req("TLKV-XFER-EMPTY-HELD", ACCEPT)
def test_empty_payload_reuses_held_block(tlkv_decode: DecodeUnderTest, client: KvTransferClient,
                                         rng: np.random.Generator) -> None:
    _, _, reuse = _push_then_reuse(client, tlkv_decode, rng)
    empties = [c for c in reuse if not c.payload]
    expect_accepted(push(client, empties), empties, tlkv_decode, what="empty payloads for 3 held blocks")
    held = held_each(client, [c.block_hash for c in empties])
    check(all(held), "the reused blocks, held afterwards (HasBlocks)", req="TLKV-XFER-EMPTY-HELD", seen=held,
          expected=[True] * len(held))


@pytest.mark.req("TLKV-XFER-RESPONSE", ACCEPT, "TLKV-XFER-EMPTY-HELD")
def test_response_counts(tlkv_decode: DecodeUnderTest, client: KvTransferClient, rng: np.random.Generator) -> None:
    first, first_outcome, reuse = _push_then_reuse(client, tlkv_decode, rng)
    second = push(client, reuse)
    expect_accepted(second, reuse, tlkv_decode, what="3 empty payloads for held blocks, a new block and a tail")
    for what, sent, outcome in (("first push", first, first_outcome), ("reuse push", reuse, second)):
        r = outcome.response
        want = (sum(1 for c in sent if c.payload), sum(1 for c in sent if not c.payload),
                sum(len(c.payload) for c in sent))
        seen = (r.blocks_stored, r.blocks_reused, r.payload_bytes) if r is not None else None
        check_equal(f"{what}: PushKvResponse (blocks_stored, blocks_reused, payload_bytes)", seen, want,
                    req="TLKV-XFER-RESPONSE")


# Full-block hashes at their boundaries (DESIGN.md principle 8): 1, the value a computed 0 becomes; 2^63, negative in
# a signed 64-bit integer; 2^64 - 1, all ones, the "empty slot" of many hash tables. Each is a legal hash.
BOUNDARY_HASHES = (1, 1 << 63, (1 << 64) - 1)
RESERVED_ZERO = "TLKV-HASH-RESERVED-ZERO"


@pytest.mark.req("TLKV-XFER-DEDUP", RESERVED_ZERO, ACCEPT)
def test_boundary_hashes(tlkv_decode: DecodeUnderTest, client: KvTransferClient, rng: np.random.Generator) -> None:
    """Full blocks whose hashes are 1, 2^63 and 2^64 - 1 are stored and held afterwards; a full block whose record
    carries block_hash 0 ("0 for an unregistered block") is never registered under 0, the value reserved for "no
    hash", whether the decode side stores it or refuses it. A boundary hash is one value, not a fresh one: a decode side
    that already holds it (an earlier run against it) is only asked about it."""
    v = valid_version(tlkv_decode)
    g = tlkv_decode.geometry
    held_before = held_each(client, list(BOUNDARY_HASHES))
    fresh = [h for h, k in zip(BOUNDARY_HASHES, held_before, strict=True) if not k]
    blocks = [Block(h, g.block_tokens, full_block(rng, g).kv) for h in fresh]
    rid = request_id()
    chunks = [chunk_for(rid, i, b, v, tlkv_decode) for i, b in enumerate(blocks)]
    if chunks:
        expect_accepted(push(client, chunks), chunks, tlkv_decode, what="a valid stream of full blocks with hashes "
                        + ", ".join(f"0x{h:016X}" for h in fresh))
    held = held_each(client, list(BOUNDARY_HASHES))
    check(all(held), "full blocks with hashes 1, 2^63 and 2^64 - 1, held after a successful stream (HasBlocks)",
          req="TLKV-XFER-DEDUP", seen=held, expected=[True] * len(held))
    unhashed = Block(0, g.block_tokens, full_block(rng, g).kv)
    chunk = chunk_for(request_id(), 0, unhashed, v, tlkv_decode)
    outcome = push(client, [chunk])
    check(outcome.ok or outcome.status_name not in TRANSPORT, "a full block whose record carries block_hash 0: "
          f"the answer ({outcome.status_name}: {outcome.details!r})", req=RESERVED_ZERO,
          seen=outcome.status_name, expected="OK or a protocol refusal")
    check_equal("HasBlocks(0) after a full block with block_hash 0 was pushed: 0 means no hash",
                has_blocks(client, [0])[0], False, req=RESERVED_ZERO)
