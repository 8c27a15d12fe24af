"""What the decode suite sends: fresh blocks, chunks and pushes, each recorded as evidence."""

from __future__ import annotations

import uuid
from collections.abc import Sequence

import numpy as np

from kvconform.conformance.tlkv.malformations import ANY_REJECTION, full_block
from kvconform.fixtures import evidence
from kvconform.fixtures.tlkv import DecodeUnderTest
from kvconform.tlkv.chunk import Chunk
from kvconform.tlkv.envelope import Block, encode_envelope
from kvconform.tlkv.grpc_client import KvTransferClient, PushOutcome

CALL_TIMEOUT = 30.0


def request_id() -> str:
    """A fresh request id per stream (DESIGN.md principle 7)."""
    return f"kvconform-{uuid.uuid4().hex[:12]}"


def fresh_blocks(rng: np.random.Generator, dut: DecodeUnderTest, n_full: int, tail: bool = True) -> list[Block]:
    """n_full full blocks with fresh non-zero hashes, then optionally a partial tail (hash 0)."""
    g = dut.geometry
    blocks = [full_block(rng, g) for _ in range(n_full)]
    if tail:
        blocks.append(full_block(rng, g, max(1, g.block_tokens - 1)) if g.block_tokens > 1
                      else Block(0, 1, full_block(rng, g).kv))
    return blocks


def chunk_for(rid: str, index: int, block: Block, version: int, dut: DecodeUnderTest) -> Chunk:
    return Chunk.for_payload(rid, index, block.block_hash, version, encode_envelope(dut.geometry, version, [block]))


def push(client: KvTransferClient, chunks: Sequence[Chunk | bytes]) -> PushOutcome:
    """PushKv with evidence of every chunk and of the outcome."""
    for c in chunks:
        if isinstance(c, bytes):
            evidence.record("sent", "KvChunk(raw)", {"len": len(c)}, raw=c)
        else:
            evidence.record("sent", "KvChunk", {"request_id": c.request_id, "block_index": c.block_index,
                                                "block_hash": f"0x{c.block_hash:016X}", "kv_format": c.kv_format,
                                                "payload_len": len(c.payload), "crc32c": f"0x{c.crc32c:08X}"},
                            raw=c.payload[:64])
    outcome = client.push(chunks)
    resp = outcome.response
    evidence.record("received", "PushKv", {
        "status": outcome.status_name, "details": outcome.details,
        "response": None if resp is None else {"blocks_stored": resp.blocks_stored,
                                               "blocks_reused": resp.blocks_reused,
                                               "payload_bytes": resp.payload_bytes}})
    return outcome


def has_blocks(client: KvTransferClient, hashes: Sequence[int]) -> list[bool]:
    evidence.record("sent", "HasBlocks", {"block_hashes": [f"0x{h:016X}" for h in hashes]})
    held = client.has_blocks(list(hashes))
    evidence.record("received", "HasBlocksResponse", {"held": held})
    return held


def expect_status(outcome: PushOutcome, acceptable: Sequence[str] | str, what: str, requirement: str) -> None:
    """The push ended with an acceptable status: a list of names, or any-rejection (anything but OK)."""
    if acceptable == ANY_REJECTION:
        assert not outcome.ok, f"{what}: got OK, expected a clean rejection (any status but OK) ({requirement})"
        return
    assert outcome.status_name in acceptable, (
        f"{what}: got {outcome.status_name} ({outcome.details!r}), expected one of {list(acceptable)} ({requirement})")


def assert_nothing_stored(client: KvTransferClient, blocks: Sequence[Block], why: str) -> None:
    """None of the full blocks of a failed stream is held (TLKV-XFER-ATOMIC)."""
    hashes = [b.block_hash for b in blocks if b.block_hash]
    if not hashes:
        return
    held = has_blocks(client, hashes)
    kept = [f"0x{h:016X}" for h, k in zip(hashes, held, strict=True) if k]
    assert not kept, (f"{why}: the decode side holds {len(kept)} block(s) of the failed stream: {kept} "
                      f"(TLKV-XFER-ATOMIC)")
