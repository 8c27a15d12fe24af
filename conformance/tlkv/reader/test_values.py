"""tlkv-reader: what an accepted envelope yields (TLKV "Payload, format v1/v2", "Reader rules").

Hashes, fills and values must be exactly those written: v1 values bit for bit, v2 values as
e4m3_to_f32(byte) * scale of their slab. A v2 reader reads both versions.
"""

from __future__ import annotations

import numpy as np
import pytest

from kvconform import evidence
from kvconform.conformance.tlkv.malformations import full_block
from kvconform.conformance.tlkv.reader.judge import (
    REFUSAL_BLAME,
    V2_BOTH,
    VALUES,
    imported,
    judge_accepted,
    judge_blocks,
    judge_values,
)
from kvconform.fixtures.tlkv import ReaderUnderTest
from kvconform.targets.spec import Pics
from kvconform.tlkv.envelope import encode_envelope
from kvconform.tlkv.reader import read_envelope
from kvconform.verdicts import check, inconclusive

VALUE_RULES = {1: ("TLKV-V1-LAYOUT",), 2: ("TLKV-V2-LAYOUT", "TLKV-V2-DECODE", V2_BOTH)}


@pytest.mark.parametrize("version", [pytest.param(v, marks=pytest.mark.req(VALUES, *VALUE_RULES[v], *REFUSAL_BLAME))
                                     for v in (1, 2)])
def test_values_round_trip(version: int, tlkv_reader: ReaderUnderTest, pics: Pics, rng: np.random.Generator) -> None:
    pics.require("tlkv.reader.versions", version)
    g = tlkv_reader.geometry
    blocks = [full_block(rng, g), full_block(rng, g), full_block(rng, g, max(1, g.block_tokens // 2))]
    data = encode_envelope(g, version, blocks)
    what = f"a valid v{version} envelope of {len(blocks)} blocks"
    evidence.record("sent", "envelope", {"version": version, "n_blocks": len(blocks)}, raw=data)
    outcome, _ = imported(tlkv_reader.open(), data, what)
    judge_accepted(outcome, data=data, versions=tlkv_reader.versions, what=what)
    judge_blocks(outcome, [(b.block_hash, b.n_tokens) for b in blocks], what)
    if any(b.kv is None for b in outcome.blocks):
        inconclusive("the reader under test does not expose decoded values (a cmd: reader's kv_file)")
    want = read_envelope(data, geometry=g, versions={version})
    for i, block in enumerate(outcome.blocks):
        if block.kv is not None:
            judge_values(block.kv, want, i, block.n_tokens, what)


@pytest.mark.parametrize("version", [1, 2])
@pytest.mark.req(V2_BOTH, VALUES)
def test_v2_reader_reads_both(version: int, tlkv_reader: ReaderUnderTest, pics: Pics,
                              rng: np.random.Generator) -> None:
    pics.require("tlkv.reader.versions", 2)
    g = tlkv_reader.geometry
    blocks = [full_block(rng, g), full_block(rng, g, max(1, g.block_tokens - 1))]
    data = encode_envelope(g, version, blocks)
    what = f"a valid v{version} envelope given to a v2 reader"
    outcome, _ = imported(tlkv_reader.open(), data, what)
    check(outcome.status == "ok", f"{what}: refused ({outcome.message}); a v2 reader reads both versions",
          req=V2_BOTH, seen=outcome.status, expected="ok")
    judge_blocks(outcome, [(b.block_hash, b.n_tokens) for b in blocks], what)
