"""tlkv-decode: what a decode side refuses, with which status, and that a failed stream stores nothing.

Every bad chunk comes last, after good chunks of fresh blocks: a decode side that stores as it goes is caught by
HasBlocks afterwards (TLKV-XFER-ATOMIC). Acceptable statuses are data (outcomes.yaml), protocol answers only. A
bad chunk whose payload is over 4 MiB at the declared geometry may also be refused for its size.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pytest

from kvconform import sweep
from kvconform.checksum import crc32c
from kvconform.conformance.tlkv.decode.transfer import (
    ACCEPT,
    ATOMIC,
    CALL_TIMEOUT,
    chunk_for,
    expect_accepted,
    expect_nothing_stored,
    expect_refusal,
    fits,
    fresh_blocks,
    push,
    request_id,
    valid_version,
)
from kvconform.conformance.tlkv.judging import cites
from kvconform.conformance.tlkv.malformations import (
    HAND_WRITTEN,
    MALFORMATIONS,
    Malformation,
    acceptable,
    applicable,
    full_block,
    in_version,
    record_hash,
    statuses,
)
from kvconform.conformance.tlkv.reader.judge import envelope_version
from kvconform.fixtures.tlkv import DecodeUnderTest
from kvconform.targets.spec import Pics
from kvconform.tlkv.chunk import MAX_CHUNK_PAYLOAD, Chunk
from kvconform.tlkv.envelope import Block, encode_envelope
from kvconform.tlkv.grpc_client import KvTransferClient, PushOutcome
from kvconform.verdicts import check, not_applicable, violation

pytestmark = pytest.mark.usefixtures("tlkv_decode_sanity")

CHUNKABLE = [m for m in MALFORMATIONS if m.chunkable]
STATUS = "TLKV-READ-STATUS"


@pytest.fixture
def client(tlkv_decode: DecodeUnderTest) -> Iterator[KvTransferClient]:
    with tlkv_decode.client(CALL_TIMEOUT) as c:
        yield c


def _sized(statuses_: list[str], payload: bytes) -> list[str]:
    """`statuses_`, and the over-limit answers when the payload is over 4 MiB (TLKV-XFER-MAX-PAYLOAD)."""
    return sorted(set(statuses_) | set(statuses("over-limit"))) if len(payload) > MAX_CHUNK_PAYLOAD else statuses_


def _version(dut: DecodeUnderTest) -> int:
    """The version bad chunks are built in: one whose valid block fits in a chunk (v1 first), else the lowest
    declared (then the bad chunk may be over 4 MiB too, and a refusal for its size is acceptable)."""
    fitting = [v for v in sorted(dut.versions) if fits(dut, v)]
    return fitting[0] if fitting else min(dut.versions)


def _push_with_bad_last(client: KvTransferClient, dut: DecodeUnderTest, rng: np.random.Generator,
                        bad: Chunk | bytes | None = None, bad_payload: bytes = b"",
                        bad_hash: int | None = None, bad_format: int | None = None,
                        n_good: int = 2) -> tuple[list[Block], PushOutcome]:
    """`n_good` good chunks of fresh full blocks, then the bad one (a chunk, raw bytes, or a payload to wrap). At a
    declared geometry where no block fits in a chunk there are no good chunks: the bad one goes alone."""
    v = _version(dut)
    good = fresh_blocks(rng, dut, n_good, tail=False) if fits(dut, v) else []
    rid = request_id()
    chunks: list[Chunk | bytes] = [chunk_for(rid, i, b, v, dut) for i, b in enumerate(good)]
    if bad is None:
        h = bad_hash if bad_hash is not None else int(rng.integers(1, 1 << 63))
        bad = Chunk.for_payload(rid, len(good), h, v if bad_format is None else bad_format, bad_payload)
    chunks.append(bad)
    return good, push(client, chunks)


def _rule_cases() -> list[tuple[Malformation, int]]:
    """Every chunkable malformation in v1, the version every decode side reads, and the hand-written ones (one
    per reader rule) in v2 too: a decode side may read each version on a path of its own, and every rule must hold
    on both. Under --sweep wide every malformation in both versions."""
    v1 = [(m, 1) for m in CHUNKABLE if in_version(m, 1)]
    v2 = [(m, 2) for m in CHUNKABLE if in_version(m, 2)]
    return v1 + sweep.pick([c for c in v2 if c[0] in HAND_WRITTEN], [c for c in v2 if c[0] not in HAND_WRITTEN])


def _rule_params() -> list[object]:
    return [pytest.param((m, v), marks=pytest.mark.req(m.decode_rule, STATUS, ATOMIC), id=f"{m.id}-v{v}")
            for m, v in _rule_cases()]


@pytest.mark.parametrize("case", _rule_params())
def test_reader_rule_in_chunk(case: tuple[Malformation, int], tlkv_decode: DecodeUnderTest, pics: Pics,
                              client: KvTransferClient, rng: np.random.Generator) -> None:
    m, v = case
    pics.require("tlkv.decode.versions", v)
    g = tlkv_decode.geometry
    if not applicable(m, g, v):
        not_applicable(f"{m.id} does not exist at the declared pool geometry {g} in v{v} (it needs block_tokens "
                       f">= {m.min_block_tokens}, and a value that is not the valid one or an earlier class's)")
    block = full_block(rng, g)
    payload = m.build(g, v, [block])
    # The chunk names the hash its envelope record carries, and (a malformed version) the kv_format of the version
    # its envelope says, so only the one rule is broken. A generated value class goes after one good chunk (it tests
    # how a field is read; the hand-written case of its rule goes after two): at a pool near 4 MiB it moves less.
    good, outcome = _push_with_bad_last(client, tlkv_decode, rng, bad_payload=payload,
                                        bad_hash=record_hash(payload, block.block_hash),
                                        bad_format=envelope_version(payload) if m.kv_format_follows else v,
                                        n_good=2 if m in HAND_WRITTEN else 1)
    expect_refusal(outcome, _sized(acceptable("decode", m), payload), what=f"a v{v} chunk whose envelope breaks "
                   f"{m.decode_rule} ({m.id})", rule=m.decode_rule, status_req=STATUS)
    expect_nothing_stored(client, [*good, block], f"stream ending in a {m.id} chunk")


@pytest.mark.req("TLKV-XFER-CRC", ATOMIC)
def test_chunk_crc_mismatch(tlkv_decode: DecodeUnderTest, client: KvTransferClient, rng: np.random.Generator) -> None:
    g, v = tlkv_decode.geometry, _version(tlkv_decode)
    block = full_block(rng, g)
    payload = encode_envelope(g, v, [block])
    bad = Chunk(request_id(), 2, block.block_hash, v, payload, crc32c(payload) ^ 0x80000000)
    good, outcome = _push_with_bad_last(client, tlkv_decode, rng, bad=bad)
    expect_refusal(outcome, _sized(statuses("chunk-crc"), payload),
                   what="a chunk whose crc32c does not match its payload", rule="TLKV-XFER-CRC",
                   status_req="TLKV-XFER-CRC")
    expect_nothing_stored(client, [*good, block], "stream ending in a chunk with a wrong crc32c")


@pytest.mark.parametrize("kv_format", [0, 3, 255])
@pytest.mark.req("TLKV-XFER-FORMAT", ATOMIC)
def test_unread_kv_format(kv_format: int, tlkv_decode: DecodeUnderTest, client: KvTransferClient,
                          rng: np.random.Generator) -> None:
    g, v = tlkv_decode.geometry, _version(tlkv_decode)
    block = full_block(rng, g)
    payload = encode_envelope(g, v, [block])
    bad = Chunk.for_payload(request_id(), 2, block.block_hash, kv_format, payload)
    good, outcome = _push_with_bad_last(client, tlkv_decode, rng, bad=bad)
    expect_refusal(outcome, _sized(statuses("unread-kv-format"), payload), what=f"a chunk with kv_format {kv_format}",
                   rule="TLKV-XFER-FORMAT", status_req="TLKV-XFER-FORMAT")
    expect_nothing_stored(client, [*good, block], f"stream ending in a kv_format {kv_format} chunk")


@pytest.mark.req("TLKV-READ-V1-ONLY", "TLKV-XFER-FORMAT", ATOMIC)
def test_v1_only_refuses_v2(tlkv_decode: DecodeUnderTest, client: KvTransferClient,
                            rng: np.random.Generator) -> None:
    if not tlkv_decode.v1_only:
        not_applicable("the decode side does not declare that it is v1-only (PICS tlkv.decode.versions: [1], "
                       "written for it, not the testbed's default, which claims only that it reads v1)")
    g = tlkv_decode.geometry
    block = full_block(rng, g)
    payload = encode_envelope(g, 2, [block])
    bad = Chunk.for_payload(request_id(), 2, block.block_hash, 2, payload)
    good, outcome = _push_with_bad_last(client, tlkv_decode, rng, bad=bad)
    expect_refusal(outcome, _sized(statuses("unread-kv-format"), payload), what="a v2 chunk to a v1-only decode "
                   "side", rule="TLKV-READ-V1-ONLY", status_req="TLKV-XFER-FORMAT")
    expect_nothing_stored(client, [*good, block], "stream ending in a v2 chunk")


@pytest.mark.req("TLKV-XFER-FORMAT", ATOMIC)
def test_kv_format_not_envelope_version(tlkv_decode: DecodeUnderTest, client: KvTransferClient, pics: Pics,
                                        rng: np.random.Generator) -> None:
    pics.require("tlkv.decode.versions", 2)
    g = tlkv_decode.geometry
    block = full_block(rng, g)
    payload = encode_envelope(g, 2, [block])
    bad = Chunk.for_payload(request_id(), 2, block.block_hash, 1, payload)
    good, outcome = _push_with_bad_last(client, tlkv_decode, rng, bad=bad)
    expect_refusal(outcome, _sized(statuses("refusal"), payload), what="a KV_FORMAT_V1 chunk carrying a v2 "
                   "envelope", rule="TLKV-XFER-FORMAT", status_req="TLKV-XFER-FORMAT")
    expect_nothing_stored(client, [*good, block], "stream ending in a chunk whose kv_format lies")


@pytest.mark.req("TLKV-XFER-ONE-BLOCK", ATOMIC)
def test_two_block_envelope(tlkv_decode: DecodeUnderTest, client: KvTransferClient, rng: np.random.Generator) -> None:
    g, v = tlkv_decode.geometry, _version(tlkv_decode)
    pair = [full_block(rng, g), full_block(rng, g)]
    payload = encode_envelope(g, v, pair)
    bad = Chunk.for_payload(request_id(), 2, pair[0].block_hash, v, payload)
    good, outcome = _push_with_bad_last(client, tlkv_decode, rng, bad=bad)
    expect_refusal(outcome, _sized(statuses("refusal"), payload), what="a chunk whose envelope has n_blocks = 2",
                   rule="TLKV-XFER-ONE-BLOCK", status_req="TLKV-XFER-ONE-BLOCK")
    expect_nothing_stored(client, [*good, *pair], "stream ending in a two-block chunk")


@pytest.mark.req("TLKV-XFER-EMPTY-HELD", ATOMIC)
def test_empty_payload_for_unheld_block(tlkv_decode: DecodeUnderTest, client: KvTransferClient,
                                        rng: np.random.Generator) -> None:
    unheld = int(rng.integers(1, 1 << 63))
    good, outcome = _push_with_bad_last(client, tlkv_decode, rng, bad_payload=b"", bad_hash=unheld)
    expect_refusal(outcome, statuses("unheld-empty"), what="an empty payload for a block the decode side does not "
                   "hold", rule="TLKV-XFER-EMPTY-HELD", status_req="TLKV-XFER-EMPTY-HELD")
    expect_nothing_stored(client, good, "stream ending in an empty payload for an unheld block")


@pytest.mark.req("TLKV-XFER-MAX-PAYLOAD", ATOMIC)
def test_payload_over_4mib(tlkv_decode: DecodeUnderTest, client: KvTransferClient, rng: np.random.Generator) -> None:
    """Over 4 MiB: at a geometry whose one-block envelope is larger, that valid envelope itself; otherwise a
    valid envelope repeated past the limit."""
    g = tlkv_decode.geometry
    block = full_block(rng, g)
    too_big = [v for v in sorted(tlkv_decode.versions) if not fits(tlkv_decode, v)]
    if too_big:
        v = too_big[0]
        payload = encode_envelope(g, v, [block])
    else:
        v = valid_version(tlkv_decode)
        env = encode_envelope(g, v, [block])
        payload = (env * (MAX_CHUNK_PAYLOAD // len(env) + 1))[: MAX_CHUNK_PAYLOAD + 1]
    rid = request_id()
    good: list[Block] = []
    chunks: list[Chunk] = []
    if any(fits(tlkv_decode, w) for w in tlkv_decode.versions):
        w = valid_version(tlkv_decode)
        good = fresh_blocks(rng, tlkv_decode, 2, tail=False)
        chunks = [chunk_for(rid, i, b, w, tlkv_decode) for i, b in enumerate(good)]
    chunks.append(Chunk.for_payload(rid, len(chunks), block.block_hash, v, payload))
    outcome = push(client, chunks)
    expect_refusal(outcome, statuses("over-limit"), what=f"a chunk with a {len(payload)}-byte payload (over "
                   f"{MAX_CHUNK_PAYLOAD})", rule="TLKV-XFER-MAX-PAYLOAD", status_req="TLKV-XFER-MAX-PAYLOAD")
    expect_nothing_stored(client, [*good, block], "stream ending in an oversized chunk")


@pytest.mark.req("TLKV-XFER-MAX-PAYLOAD", "TLKV-READ-LENGTH", STATUS)
def test_payload_of_exactly_4mib_reaches_the_reader(tlkv_decode: DecodeUnderTest, client: KvTransferClient,
                                                    rng: np.random.Generator) -> None:
    """A 4 MiB payload is within the transfer's limit, so the reader rules judge it: this one breaks the
    length rule and must get DATA_LOSS. A server still at gRPC's default 4 MiB message limit answers
    RESOURCE_EXHAUSTED instead, refusing every legal chunk near the limit."""
    g = tlkv_decode.geometry
    v = min(tlkv_decode.versions)
    block = full_block(rng, g)
    env = encode_envelope(g, v, [block])
    if len(env) == MAX_CHUNK_PAYLOAD:
        not_applicable("the declared geometry's envelope is exactly 4 MiB: a 4 MiB payload is valid")
    body = (env[:-4] * (MAX_CHUNK_PAYLOAD // (len(env) - 4) + 1))[: MAX_CHUNK_PAYLOAD - 4]
    payload = body + crc32c(body).to_bytes(4, "little")
    rid = request_id()
    outcome = push(client, [Chunk.for_payload(rid, 0, block.block_hash, v, payload)])
    what = f"a {len(payload)}-byte chunk (exactly 4 MiB) whose envelope breaks the length rule"
    check(outcome.status_name != "RESOURCE_EXHAUSTED", f"{what}: refused for its size, although a decode side "
          "receives every chunk up to 4 MiB", req="TLKV-XFER-MAX-PAYLOAD", seen=outcome.status_name,
          expected="DATA_LOSS (the length rule)")
    expect_refusal(outcome, statuses("reader-rule"), what=what, rule="TLKV-READ-LENGTH", status_req=STATUS)


@pytest.mark.req("TLKV-XFER-CHUNK-HASH")
def test_chunk_hash_differs_from_record(tlkv_decode: DecodeUnderTest, client: KvTransferClient,
                                        rng: np.random.Generator) -> None:
    g, v = tlkv_decode.geometry, _version(tlkv_decode)
    block = full_block(rng, g)
    other = int(rng.integers(1, 1 << 63))
    payload = encode_envelope(g, v, [block])
    bad = Chunk.for_payload(request_id(), 2, other, v, payload)
    _, outcome = _push_with_bad_last(client, tlkv_decode, rng, bad=bad)
    expect_refusal(outcome, _sized(statuses("refusal"), payload),
                   what="a chunk whose block_hash differs from its envelope record's", rule="TLKV-XFER-CHUNK-HASH",
                   status_req="TLKV-XFER-CHUNK-HASH")


@pytest.mark.req("TLKV-XFER-PROTO", ATOMIC)
def test_unparseable_chunk(tlkv_decode: DecodeUnderTest, client: KvTransferClient, rng: np.random.Generator) -> None:
    garbage = b"\x0a\xff\xff\xff\xff\x0f" + rng.bytes(32)  # field 1 claims a 4 GiB string
    good, outcome = _push_with_bad_last(client, tlkv_decode, rng, bad=garbage)
    expect_refusal(outcome, statuses("unparseable"), what="bytes that are not a KvChunk", rule="TLKV-XFER-PROTO",
                   status_req="TLKV-XFER-PROTO")
    expect_nothing_stored(client, good, "stream ending in an unparseable message")


# The chunk rules on the other path of a chunk: an empty payload ("use the copy you hold"). (rule, its status set,
# the chunk's kv_format and crc32c: an unread kv_format, or a crc32c that is not the CRC-32C of no bytes, 0.)
EMPTY_HELD = "TLKV-XFER-EMPTY-HELD"
EMPTY_PAYLOAD_RULES = {
    "kv-format-255": ("TLKV-XFER-FORMAT", "unread-kv-format", 255, 0),
    "crc-all-ones": ("TLKV-XFER-CRC", "chunk-crc", None, 0xFFFFFFFF),
}


@pytest.mark.parametrize("rule", [pytest.param(k, marks=pytest.mark.req(r[0], ATOMIC, ACCEPT, EMPTY_HELD), id=k)
                                  for k, r in EMPTY_PAYLOAD_RULES.items()])
def test_rule_on_empty_payload(rule: str, tlkv_decode: DecodeUnderTest, client: KvTransferClient,
                               rng: np.random.Generator) -> None:
    """ "A chunk whose kv_format the decode side does not read fails the stream" and "KvChunk.crc32c is the CRC-32C
    of the payload bytes" hold for a chunk with an empty payload too: one for a block the decode side holds, with
    kv_format 255 or a crc32c other than 0 (the CRC-32C of no bytes), fails its stream, which stores nothing."""
    req, outcomes, kv_format, crc = EMPTY_PAYLOAD_RULES[rule]
    v = valid_version(tlkv_decode)
    held_block, fresh = fresh_blocks(rng, tlkv_decode, 2, tail=False)
    first = [chunk_for(request_id(), 0, held_block, v, tlkv_decode)]
    expect_accepted(push(client, first), first, tlkv_decode, what="a valid stream of one full block")
    rid = request_id()
    empty = Chunk(rid, 1, held_block.block_hash, v if kv_format is None else kv_format, b"", crc)
    outcome = push(client, [chunk_for(rid, 0, fresh, v, tlkv_decode), empty])
    if outcome.status_name == "NOT_FOUND" and cites(EMPTY_HELD):
        violation(f"an empty payload for a held block (with {rule}) was refused NOT_FOUND: the block is held, and "
                  "the rule it breaks has its own status", req=EMPTY_HELD, seen=outcome.status_name,
                  expected=", ".join(statuses(outcomes)))
    expect_refusal(outcome, statuses(outcomes), what=f"an empty payload for a held block with kv_format "
                   f"{empty.kv_format} and crc32c 0x{crc:08X}", rule=req, status_req=req)
    expect_nothing_stored(client, [fresh], f"stream ending in an empty payload with {rule}")
