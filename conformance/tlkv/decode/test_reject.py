"""tlkv-decode: what a decode side refuses, with which status, and that a failed stream stores nothing.

Every bad chunk comes last, after good chunks of fresh blocks: a decode side that stores as it goes is
caught by HasBlocks afterwards (TLKV-XFER-ATOMIC).  Acceptable statuses are data (outcomes.yaml).
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pytest

from kvconform.checksum import crc32c
from kvconform.conformance.tlkv.decode.transfer import (
    CALL_TIMEOUT,
    assert_nothing_stored,
    chunk_for,
    expect_status,
    fresh_blocks,
    push,
    request_id,
)
from kvconform.conformance.tlkv.malformations import (
    ANY_REJECTION,
    MALFORMATIONS,
    Malformation,
    acceptable,
    applicable,
    full_block,
    record_hash,
)
from kvconform.fixtures.tlkv import DecodeUnderTest
from kvconform.targets.spec import Pics
from kvconform.tlkv.chunk import MAX_CHUNK_PAYLOAD, Chunk
from kvconform.tlkv.envelope import Block, encode_envelope
from kvconform.tlkv.grpc_client import KvTransferClient, PushOutcome
from kvconform.verdicts import not_applicable

pytestmark = pytest.mark.usefixtures("tlkv_decode_sanity")

CHUNKABLE = [m for m in MALFORMATIONS if m.chunkable]


@pytest.fixture
def client(tlkv_decode: DecodeUnderTest) -> Iterator[KvTransferClient]:
    with tlkv_decode.client(CALL_TIMEOUT) as c:
        yield c


def _version(dut: DecodeUnderTest) -> int:
    return 1 if 1 in dut.versions else min(dut.versions)


def _push_with_bad_last(client: KvTransferClient, dut: DecodeUnderTest, rng: np.random.Generator,
                        bad: Chunk | bytes | None = None, bad_payload: bytes | None = None,
                        bad_hash: int | None = None) -> tuple[list[Block], PushOutcome]:
    v = _version(dut)
    good = fresh_blocks(rng, dut, 2, tail=False)
    rid = request_id()
    chunks: list[Chunk | bytes] = [chunk_for(rid, i, b, v, dut) for i, b in enumerate(good)]
    if bad is None:
        assert bad_payload is not None
        h = bad_hash if bad_hash is not None else int(rng.integers(1, 1 << 63))
        bad = Chunk.for_payload(rid, len(good), h, v, bad_payload)
    chunks.append(bad)
    return good, push(client, chunks)


@pytest.mark.parametrize("m", [pytest.param(m, marks=pytest.mark.req(*m.requirements), id=m.id) for m in CHUNKABLE])
@pytest.mark.req("TLKV-READ-STATUS", "TLKV-XFER-ATOMIC", "TLKV-READ-NOALLOC")
def test_reader_rule_in_chunk(m: Malformation, tlkv_decode: DecodeUnderTest, client: KvTransferClient,
                              rng: np.random.Generator) -> None:
    g = tlkv_decode.geometry
    if not applicable(m, g):
        not_applicable(f"{m.id} needs block_tokens >= {m.min_block_tokens}; the declared pool has {g.block_tokens}")
    block = full_block(rng, g)
    payload = m.build(g, _version(tlkv_decode), [block])
    # The chunk names the hash its envelope record carries, so only the one rule is broken.
    good, outcome = _push_with_bad_last(client, tlkv_decode, rng, bad_payload=payload,
                                        bad_hash=record_hash(payload, block.block_hash))
    expect_status(outcome, acceptable("decode", m), f"a chunk whose envelope breaks {m.id}", m.requirements[0])
    assert_nothing_stored(client, [*good, block], f"stream ending in a {m.id} chunk")


@pytest.mark.req("TLKV-XFER-CRC", "TLKV-XFER-ATOMIC")
def test_chunk_crc_mismatch(tlkv_decode: DecodeUnderTest, client: KvTransferClient, rng: np.random.Generator) -> None:
    g, v = tlkv_decode.geometry, _version(tlkv_decode)
    block = full_block(rng, g)
    payload = encode_envelope(g, v, [block])
    bad = Chunk(request_id(), 2, block.block_hash, v, payload, crc32c(payload) ^ 0x80000000)
    good, outcome = _push_with_bad_last(client, tlkv_decode, rng, bad=bad)
    expect_status(outcome, ["DATA_LOSS"], "a chunk whose crc32c does not match its payload", "TLKV-XFER-CRC")
    assert_nothing_stored(client, [*good, block], "stream ending in a chunk with a wrong crc32c")


@pytest.mark.parametrize("kv_format", [0, 3, 255])
@pytest.mark.req("TLKV-XFER-FORMAT", "TLKV-XFER-ATOMIC")
def test_unread_kv_format(kv_format: int, tlkv_decode: DecodeUnderTest, client: KvTransferClient,
                          rng: np.random.Generator) -> None:
    g, v = tlkv_decode.geometry, _version(tlkv_decode)
    block = full_block(rng, g)
    bad = Chunk.for_payload(request_id(), 2, block.block_hash, kv_format, encode_envelope(g, v, [block]))
    good, outcome = _push_with_bad_last(client, tlkv_decode, rng, bad=bad)
    expect_status(outcome, ["FAILED_PRECONDITION"], f"a chunk with kv_format {kv_format}", "TLKV-XFER-FORMAT")
    assert_nothing_stored(client, [*good, block], f"stream ending in a kv_format {kv_format} chunk")


@pytest.mark.req("TLKV-READ-V1-ONLY", "TLKV-XFER-FORMAT", "TLKV-READ-STATUS")
def test_v1_only_refuses_v2(tlkv_decode: DecodeUnderTest, client: KvTransferClient, pics: Pics,
                            rng: np.random.Generator) -> None:
    if 2 in tlkv_decode.versions:
        not_applicable("PICS tlkv.decode.versions declares v2: the decode side is not v1-only")
    g = tlkv_decode.geometry
    block = full_block(rng, g)
    bad = Chunk.for_payload(request_id(), 2, block.block_hash, 2, encode_envelope(g, 2, [block]))
    good, outcome = _push_with_bad_last(client, tlkv_decode, rng, bad=bad)
    expect_status(outcome, ["FAILED_PRECONDITION"], "a v2 chunk to a v1-only decode side", "TLKV-READ-V1-ONLY")
    assert_nothing_stored(client, [*good, block], "stream ending in a v2 chunk")


@pytest.mark.req("TLKV-XFER-FORMAT", "TLKV-XFER-ATOMIC")
def test_kv_format_not_envelope_version(tlkv_decode: DecodeUnderTest, client: KvTransferClient, pics: Pics,
                                        rng: np.random.Generator) -> None:
    pics.require("tlkv.decode.versions", 2)
    g = tlkv_decode.geometry
    block = full_block(rng, g)
    bad = Chunk.for_payload(request_id(), 2, block.block_hash, 1, encode_envelope(g, 2, [block]))
    good, outcome = _push_with_bad_last(client, tlkv_decode, rng, bad=bad)
    expect_status(outcome, ANY_REJECTION, "a KV_FORMAT_V1 chunk carrying a v2 envelope", "TLKV-XFER-FORMAT")
    assert_nothing_stored(client, [*good, block], "stream ending in a chunk whose kv_format lies")


@pytest.mark.req("TLKV-XFER-ONE-BLOCK", "TLKV-XFER-ATOMIC")
def test_two_block_envelope(tlkv_decode: DecodeUnderTest, client: KvTransferClient, rng: np.random.Generator) -> None:
    g, v = tlkv_decode.geometry, _version(tlkv_decode)
    pair = [full_block(rng, g), full_block(rng, g)]
    bad = Chunk.for_payload(request_id(), 2, pair[0].block_hash, v, encode_envelope(g, v, pair))
    good, outcome = _push_with_bad_last(client, tlkv_decode, rng, bad=bad)
    expect_status(outcome, ANY_REJECTION, "a chunk whose envelope has n_blocks = 2", "TLKV-XFER-ONE-BLOCK")
    assert_nothing_stored(client, [*good, *pair], "stream ending in a two-block chunk")


@pytest.mark.req("TLKV-XFER-EMPTY-HELD", "TLKV-XFER-ATOMIC")
def test_empty_payload_for_unheld_block(tlkv_decode: DecodeUnderTest, client: KvTransferClient,
                                        rng: np.random.Generator) -> None:
    unheld = int(rng.integers(1, 1 << 63))
    good, outcome = _push_with_bad_last(client, tlkv_decode, rng, bad_payload=b"", bad_hash=unheld)
    expect_status(outcome, ANY_REJECTION, "an empty payload for a block the decode side does not hold",
                  "TLKV-XFER-EMPTY-HELD")
    assert_nothing_stored(client, good, "stream ending in an empty payload for an unheld block")


@pytest.mark.req("TLKV-XFER-MAX-PAYLOAD", "TLKV-XFER-ATOMIC")
def test_payload_over_4mib(tlkv_decode: DecodeUnderTest, client: KvTransferClient, rng: np.random.Generator) -> None:
    g, v = tlkv_decode.geometry, _version(tlkv_decode)
    block = full_block(rng, g)
    env = encode_envelope(g, v, [block])
    payload = (env * (MAX_CHUNK_PAYLOAD // len(env) + 1))[: MAX_CHUNK_PAYLOAD + 1]
    assert len(payload) == MAX_CHUNK_PAYLOAD + 1
    good, outcome = _push_with_bad_last(client, tlkv_decode, rng, bad_payload=payload, bad_hash=block.block_hash)
    expect_status(outcome, ANY_REJECTION, "a chunk with a 4 MiB + 1 byte payload", "TLKV-XFER-MAX-PAYLOAD")
    assert_nothing_stored(client, good, "stream ending in an oversized chunk")


@pytest.mark.req("TLKV-XFER-MAX-PAYLOAD", "TLKV-READ-LENGTH", "TLKV-READ-STATUS")
def test_payload_of_exactly_4mib_reaches_the_reader(tlkv_decode: DecodeUnderTest, client: KvTransferClient,
                                                    rng: np.random.Generator) -> None:
    """A 4 MiB payload is within the transfer's limit, so the reader rules judge it: this one breaks the
    length rule and must get DATA_LOSS. A server still at gRPC's default 4 MiB message limit answers
    RESOURCE_EXHAUSTED instead, refusing every legal chunk near the limit."""
    g, v = tlkv_decode.geometry, _version(tlkv_decode)
    block = full_block(rng, g)
    env = encode_envelope(g, v, [block])
    if len(env) == MAX_CHUNK_PAYLOAD:
        not_applicable("the declared geometry's envelope is exactly 4 MiB: a 4 MiB payload is valid")
    body = (env[:-4] * (MAX_CHUNK_PAYLOAD // (len(env) - 4) + 1))[: MAX_CHUNK_PAYLOAD - 4]
    payload = body + crc32c(body).to_bytes(4, "little")
    assert len(payload) == MAX_CHUNK_PAYLOAD
    _, outcome = _push_with_bad_last(client, tlkv_decode, rng, bad_payload=payload, bad_hash=block.block_hash)
    expect_status(outcome, ["DATA_LOSS"], "a 4 MiB chunk whose envelope breaks the length rule",
                  "TLKV-XFER-MAX-PAYLOAD")


@pytest.mark.req("TLKV-XFER-CHUNK-HASH")
def test_chunk_hash_differs_from_record(tlkv_decode: DecodeUnderTest, client: KvTransferClient,
                                        rng: np.random.Generator) -> None:
    g, v = tlkv_decode.geometry, _version(tlkv_decode)
    block = full_block(rng, g)
    other = int(rng.integers(1, 1 << 63))
    bad = Chunk.for_payload(request_id(), 2, other, v, encode_envelope(g, v, [block]))
    _, outcome = _push_with_bad_last(client, tlkv_decode, rng, bad=bad)
    expect_status(outcome, ANY_REJECTION, "a chunk whose block_hash differs from its envelope record's",
                  "TLKV-XFER-CHUNK-HASH")


@pytest.mark.req("TLKV-XFER-PROTO", "TLKV-XFER-ATOMIC")
def test_unparseable_chunk(tlkv_decode: DecodeUnderTest, client: KvTransferClient, rng: np.random.Generator) -> None:
    garbage = b"\x0a\xff\xff\xff\xff\x0f" + rng.bytes(32)  # field 1 claims a 4 GiB string
    good, outcome = _push_with_bad_last(client, tlkv_decode, rng, bad=garbage)
    expect_status(outcome, ANY_REJECTION, "bytes that are not a KvChunk", "TLKV-XFER-PROTO")
    assert_nothing_stored(client, good, "stream ending in an unparseable message")
