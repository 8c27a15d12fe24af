"""tlkv-reader: what an accepted envelope yields (TLKV "Payload, format v1/v2", "Reader rules").

Hashes, fills and values must be exactly those written: v1 values bit for bit, v2 values as
e4m3_to_f32(byte) * scale of their slab.
"""

from __future__ import annotations

import numpy as np
import pytest

from kvconform.conformance.tlkv.malformations import full_block
from kvconform.fixtures import evidence
from kvconform.fixtures.tlkv import ReaderUnderTest
from kvconform.targets.spec import Pics
from kvconform.tlkv.envelope import encode_envelope
from kvconform.tlkv.reader import read_envelope
from kvconform.verdicts import inconclusive


@pytest.mark.parametrize("version", [1, 2])
@pytest.mark.req("TLKV-READ-VALUES", "TLKV-V1-LAYOUT", "TLKV-V2-LAYOUT", "TLKV-V2-DECODE")
def test_values_round_trip(version: int, tlkv_reader: ReaderUnderTest, pics: Pics, rng: np.random.Generator) -> None:
    pics.require("tlkv.reader.versions", version)
    g = tlkv_reader.geometry
    blocks = [full_block(rng, g), full_block(rng, g), full_block(rng, g, max(1, g.block_tokens // 2))]
    data = encode_envelope(g, version, blocks)
    evidence.record("sent", "envelope", {"version": version, "n_blocks": len(blocks)}, raw=data)
    session = tlkv_reader.open()
    before = session.allocated()
    outcome = session.import_envelope(data)
    assert outcome.status == "ok", f"valid v{version} envelope refused: {outcome.message}"
    seen = [(b.block_hash, b.n_tokens) for b in outcome.blocks]
    assert seen == [(b.block_hash, b.n_tokens) for b in blocks], "block hashes and fills differ from the envelope's"
    after = session.allocated()
    if before is not None and after is not None:
        assert after - before == len(blocks), f"allocated {after - before} blocks for a {len(blocks)}-block envelope"
    want = read_envelope(data, geometry=g, versions={version})
    if any(b.kv is None for b in outcome.blocks):
        inconclusive("the reader under test does not expose decoded values")
    for i, block in enumerate(outcome.blocks):
        assert block.kv is not None
        fill = block.n_tokens
        exp = np.asarray(want.kv(i), np.float32)[:, :, :, :fill, :]
        got = np.asarray(block.kv, np.float32)[:, :, :, :fill, :]
        bad = np.argwhere(got.view(np.uint32) != exp.view(np.uint32))
        assert not len(bad), (f"block {i}: value at [layer, k/v, head, token, dim] = {bad[0].tolist()} is "
                              f"{got[tuple(bad[0])]!r}, expected {exp[tuple(bad[0])]!r}")
