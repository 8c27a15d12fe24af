"""tlkv-decode: concurrent PushKv streams over shared blocks (TLKV "Transfer (tl.kv.v1)").

A race against a black box is driven many times with its invariants checked (DESIGN.md principle 5):
several streams at once push overlapping blocks (the same hash always carries the same envelope),
some end with a corrupt chunk, some send empty payloads for blocks another stream may still be storing.
Afterwards a block is held iff at least one successful stream carried its payload or reused it; a block
only failed streams carried is not held. A stream's answer must be a protocol answer (a transport failure
never is), and what is held is asked one hash at a time. Every attempt is kept in the evidence.
"""

from __future__ import annotations

from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

from kvconform import evidence
from kvconform.conformance.tlkv.decode.transfer import (
    ACCEPT,
    ATOMIC,
    CALL_TIMEOUT,
    held_each,
    request_id,
    valid_version,
)
from kvconform.conformance.tlkv.malformations import full_block, statuses
from kvconform.fixtures.tlkv import DecodeUnderTest
from kvconform.tlkv.chunk import Chunk
from kvconform.tlkv.envelope import encode_envelope
from kvconform.tlkv.grpc_client import KvTransferClient, PushOutcome
from kvconform.verdicts import Findings

pytestmark = pytest.mark.usefixtures("tlkv_decode_sanity")

ROUNDS = 6
STREAMS = 8
SHARED = 6  # distinct blocks per round, shared by every stream of the round
TOTAL_BYTES = 256 * 1024 * 1024  # payload the rounds may move at most: a geometry near 4 MiB gets fewer rounds


@pytest.fixture
def client(tlkv_decode: DecodeUnderTest) -> Iterator[KvTransferClient]:
    with tlkv_decode.client(CALL_TIMEOUT) as c:
        yield c


@pytest.mark.req(ATOMIC, "TLKV-XFER-DEDUP", "TLKV-XFER-EMPTY-HELD", "TLKV-XFER-CRC", ACCEPT)
def test_concurrent_streams_keep_exactly_what_succeeded(tlkv_decode: DecodeUnderTest, client: KvTransferClient,
                                                        rng: np.random.Generator) -> None:
    g, v = tlkv_decode.geometry, valid_version(tlkv_decode)
    size = g.envelope_size(1, v)
    rounds = max(1, min(ROUNDS, TOTAL_BYTES // (STREAMS * SHARED * size)))
    race, crc_refusals = statuses("race"), set(statuses("race")) | set(statuses("chunk-crc"))
    findings = Findings(f"{rounds} rounds of {STREAMS} concurrent streams")
    for rnd in range(rounds):
        blocks = [full_block(rng, g) for _ in range(SHARED)]
        payloads = {b.block_hash: encode_envelope(g, v, [b]) for b in blocks}
        plans: list[tuple[list[Chunk], bool]] = []
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
            plans.append((chunks, corrupt))
        with ThreadPoolExecutor(STREAMS) as pool:
            outcomes: list[PushOutcome] = list(pool.map(lambda p: client.push(p[0]), plans))
        stored: set[int] = set()  # full blocks whose payload a successful stream carried
        reused: set[int] = set()  # ... whose empty payload a successful stream carried
        for s_no, ((chunks, corrupt), outcome) in enumerate(zip(plans, outcomes, strict=True)):
            evidence.record("received", "PushKv", {"round": rnd, "stream": s_no, "chunks": len(chunks),
                                                   "corrupt": corrupt, "status": outcome.status_name,
                                                   "details": outcome.details})
            where = f"round {rnd} stream {s_no}"
            if corrupt:
                findings.expect(not outcome.ok, "TLKV-XFER-CRC", f"{where}: ending in a chunk with a wrong crc32c, "
                                                                "it was answered OK")
                findings.expect(outcome.ok or outcome.status_name in crc_refusals, "TLKV-XFER-CRC",
                                f"{where}: ending in a chunk with a wrong crc32c, it ended {outcome.status_name} "
                                f"({outcome.details!r}): not a protocol answer")
            elif all(c.payload for c in chunks):
                findings.expect(outcome.ok, ACCEPT, f"{where}: a valid stream ended {outcome.status_name} "
                                                    f"({outcome.details!r})")
            else:
                findings.expect(outcome.ok or outcome.status_name in race, ACCEPT,
                                f"{where}: a valid stream whose empty payloads may race ended {outcome.status_name} "
                                f"({outcome.details!r}), which is not a protocol answer (one of {race})")
            if outcome.ok:
                stored |= {c.block_hash for c in chunks if c.payload}
                reused |= {c.block_hash for c in chunks if not c.payload}
        held = held_each(client, [b.block_hash for b in blocks])
        for b, is_held in zip(blocks, held, strict=True):
            h = b.block_hash
            name = f"round {rnd}: block 0x{h:016X}"
            findings.expect(not is_held or h in stored or h in reused, ATOMIC,
                            f"{name} is held, but only failed streams carried it")
            findings.expect(is_held or h not in stored, "TLKV-XFER-DEDUP",
                            f"{name} is not held, but a successful stream stored its payload")
            findings.expect(is_held or h not in reused or h in stored, "TLKV-XFER-EMPTY-HELD",
                            f"{name} is not held, but a successful stream carried it as an empty payload (it "
                            "accepted a reference to a block it did not hold)")
        if findings.problems:
            break  # the round already shows the failure; more rounds would only cost time (a hanging target)
    findings.judge()
