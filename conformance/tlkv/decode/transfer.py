"""What the decode suite sends and how it judges the answers: fresh blocks, chunks, pushes, each recorded as
evidence, and the assertions every decode check shares.

- A refusal is judged against an acceptable set of gRPC statuses (outcomes.yaml): protocol-level answers only. A
  transport failure (UNAVAILABLE, DEADLINE_EXCEEDED, CANCELLED) or a crash (UNKNOWN) is never in a set, so a
  check that gets one fails, blaming the requirement whose answer it was waiting for.
- A valid stream must be answered OK (TLKV-XFER-ACCEPT); one refused is blamed on what makes it special when the
  check cites that (v2 chunks: TLKV-READ-V2-BOTH; empty payloads for held blocks answered NOT_FOUND:
  TLKV-XFER-EMPTY-HELD).
- Validity comes from the declared geometry, never the reference's: a block is sent as valid only in a version
  whose one-block envelope fits in a 4 MiB chunk; when no declared version fits, a check that needs a valid block
  is not applicable (the declared pool cannot receive any block over tl.kv.v1).
- HasBlocks is asked one hash per call where a check judges what is held, so a decode side that answers HasBlocks
  out of order (TLKV-XFER-HAS-ORDER, its own check) cannot make another requirement look broken.
"""

from __future__ import annotations

import uuid
from collections.abc import Collection, Sequence

import numpy as np

from kvconform import evidence
from kvconform.conformance.tlkv.judging import cites, held
from kvconform.conformance.tlkv.malformations import full_block
from kvconform.fixtures.tlkv import CALL_TIMEOUT, DecodeUnderTest
from kvconform.tlkv.chunk import MAX_CHUNK_PAYLOAD, Chunk
from kvconform.tlkv.envelope import Block, encode_envelope
from kvconform.tlkv.grpc_client import KvTransferClient, PushOutcome
from kvconform.verdicts import DriverError, check, check_one_of, not_applicable, violation

__all__ = [
    "ACCEPT",
    "ATOMIC",
    "CALL_TIMEOUT",
    "chunk_for",
    "expect_accepted",
    "expect_nothing_stored",
    "expect_refusal",
    "fits",
    "fresh_blocks",
    "has_blocks",
    "held_each",
    "push",
    "request_id",
    "valid_version",
]

ACCEPT, ATOMIC, EMPTY_HELD = "TLKV-XFER-ACCEPT", "TLKV-XFER-ATOMIC", "TLKV-XFER-EMPTY-HELD"
V2_BOTH, HAS_ORDER = "TLKV-READ-V2-BOTH", "TLKV-XFER-HAS-ORDER"
TRANSPORT = frozenset({"UNAVAILABLE", "DEADLINE_EXCEEDED", "CANCELLED", "UNKNOWN"})


def request_id() -> str:
    """A fresh request id per stream (DESIGN.md principle 7)."""
    return f"kvconform-{uuid.uuid4().hex[:12]}"


def fits(dut: DecodeUnderTest, version: int, n_blocks: int = 1) -> bool:
    """An envelope of `n_blocks` blocks of the declared geometry in `version` fits in one chunk (4 MiB)."""
    return dut.geometry.envelope_size(n_blocks, version) <= MAX_CHUNK_PAYLOAD


def valid_version(dut: DecodeUnderTest, *, among: Collection[int] | None = None) -> int:
    """A version the decode side reads (v1 first) whose one-block envelope fits in a chunk; not applicable when
    none does at the declared geometry."""
    for v in sorted(among if among is not None else dut.versions):
        if v in dut.versions and fits(dut, v):
            return v
    sizes = ", ".join(f"v{v} {dut.geometry.envelope_size(1, v)} bytes" for v in sorted(dut.versions))
    not_applicable(f"at the declared pool geometry {dut.geometry} no one-block envelope of a version it reads fits "
                   f"in a {MAX_CHUNK_PAYLOAD}-byte chunk ({sizes}): no valid block can be transferred")


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
                            raw=c.payload)
    outcome = client.push(chunks)
    resp = outcome.response
    evidence.record("received", "PushKv", {
        "status": outcome.status_name, "details": outcome.details,
        "response": None if resp is None else {"blocks_stored": resp.blocks_stored,
                                               "blocks_reused": resp.blocks_reused,
                                               "payload_bytes": resp.payload_bytes}})
    return outcome


def _status(outcome: PushOutcome) -> str:
    kind = " (a transport failure, not an answer)" if outcome.status_name in TRANSPORT else ""
    return f"{outcome.status_name}{kind}: {outcome.details!r}"


def has_blocks(client: KvTransferClient, hashes: Sequence[int]) -> list[bool]:
    """HasBlocks of `hashes`: one held flag per hash. A decode side that answers anything else misbehaves."""
    evidence.record("sent", "HasBlocks", {"block_hashes": [f"0x{h:016X}" for h in hashes]})
    outcome = client.has_blocks_call(list(hashes))
    evidence.record("received", "HasBlocksResponse", {"status": outcome.status_name, "details": outcome.details,
                                                      "held": outcome.held})
    blame = HAS_ORDER if cites(HAS_ORDER) else None
    if outcome.held is None:
        kind = "a transport failure" if outcome.status_name in TRANSPORT else "a refusal"
        raise DriverError(f"HasBlocks of {len(hashes)} hash(es) ended {outcome.status_name} ({kind}): "
                          f"{outcome.details!r}; expected one held flag per hash", requirement=blame)
    if len(outcome.held) != len(hashes):
        raise DriverError(f"HasBlocksResponse.held: got {len(outcome.held)} entries for {len(hashes)} hash(es), "
                          f"expected one per hash ({HAS_ORDER})", requirement=blame)
    return outcome.held


def held_each(client: KvTransferClient, hashes: Sequence[int]) -> list[bool]:
    """Whether each hash is held, asked one hash per HasBlocks (no answer order to get wrong)."""
    return [has_blocks(client, [h])[0] for h in hashes]


def expect_refusal(outcome: PushOutcome, acceptable: Collection[str], *, what: str, rule: str,
                   status_req: str) -> None:
    """A stream ending in a chunk that breaks `rule` is refused with a status of `acceptable` (`status_req` is
    the requirement naming that status)."""
    check(not outcome.ok, f"{what}: the stream was answered OK", req=rule, seen="OK",
          expected="one of " + ", ".join(sorted(acceptable)))
    check_one_of(outcome.status_name, acceptable, what=f"{what}: status ({_status(outcome)})", req=status_req)


def expect_accepted(outcome: PushOutcome, chunks: Sequence[Chunk], dut: DecodeUnderTest, *, what: str) -> None:
    """A stream of valid chunks is answered OK (TLKV-XFER-ACCEPT)."""
    v2 = any(c.kv_format == 2 and c.payload for c in chunks)
    empties = any(not c.payload for c in chunks)
    if outcome.ok:
        held(ACCEPT, what)
        if v2:
            held(V2_BOTH, what)
        if empties:
            held(EMPTY_HELD, what)
        return
    refused = f"{what}: refused, {_status(outcome)}"
    if v2 and 2 in dut.versions and cites(V2_BOTH):
        violation(f"{refused}; the decode side declares v2, and a v2 reader reads both versions", req=V2_BOTH,
                  seen=outcome.status_name, expected="OK")
    if empties and outcome.status_name == "NOT_FOUND" and cites(EMPTY_HELD):
        violation(f"{refused}; its empty payloads are for blocks the decode side holds", req=EMPTY_HELD,
                  seen=outcome.status_name, expected="OK")
    sizes = sorted({len(c.payload) for c in chunks})
    violation(f"{refused}; every chunk is valid for the declared pool {dut.geometry} (payloads of {sizes} "
              f"bytes, at most {MAX_CHUNK_PAYLOAD})", req=ACCEPT, seen=outcome.status_name, expected="OK")


def expect_nothing_stored(client: KvTransferClient, blocks: Sequence[Block], why: str) -> None:
    """None of the full blocks of a failed stream is held (TLKV-XFER-ATOMIC)."""
    hashes = [b.block_hash for b in blocks if b.block_hash]
    flags = held_each(client, hashes)
    kept = [f"0x{h:016X}" for h, k in zip(hashes, flags, strict=True) if k]
    check(not kept, f"{why}: blocks of the failed stream held afterwards (HasBlocks)", req=ATOMIC, seen=kept,
          expected="none")
