"""The reference prefill side: the sans-I/O planner and a run over gRPC."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest

from kvconform.checksum import crc32c
from kvconform.tlkv.blockhash import block_hash
from kvconform.tlkv.content import make_kv
from kvconform.tlkv.decode import DecodeSide
from kvconform.tlkv.geometry import Geometry
from kvconform.tlkv.grpc_decode import DecodeServer
from kvconform.tlkv.prefill import bytes_moved, full_block_hashes, plan_push, run_prefill
from kvconform.tlkv.reader import read_envelope
from tests.tlkv.helpers import GEOMETRY, TOKENS, Kit

Serve = Callable[..., DecodeServer]


def test_full_block_hashes_is_the_chain_without_the_tail() -> None:
    # the worked example of the text: B = 2, tokens [1, 2, 3, 4, 5]
    assert full_block_hashes([1, 2, 3, 4, 5], 2) == [0xA91AB0C1027B9366, 0x03DF829571605C60]
    assert full_block_hashes([1, 2, 3, 4], 2) == [0xA91AB0C1027B9366, 0x03DF829571605C60]
    assert full_block_hashes([1], 2) == []
    assert full_block_hashes(TOKENS, 4)[1] == block_hash(block_hash(0, TOKENS[:4]), TOKENS[4:8])


@pytest.mark.parametrize("held", [[False, False], [True, False], [False, True], [True, True]])
@pytest.mark.parametrize("version", [1, 2])
def test_plan_sends_empty_payloads_exactly_for_held_blocks(kit: Kit, held: list[bool], version: int) -> None:
    chunks = plan_push(TOKENS, kit.kv, GEOMETRY, version, held, "r")
    assert [c.block_index for c in chunks] == [0, 1, 2]
    assert [c.block_hash for c in chunks] == kit.hashes
    assert [c.payload == b"" for c in chunks] == [*held, False]
    assert all(c.kv_format == version and c.request_id == "r" for c in chunks)
    assert all(c.crc32c == crc32c(c.payload) for c in chunks)
    for i, c in enumerate(chunks):
        if c.payload:
            env = read_envelope(c.payload, geometry=GEOMETRY, versions={version})
            assert [(r.block_hash, r.n_tokens) for r in env.records] == [(kit.hashes[i], kit.fills[i])]
            assert c.payload == kit.envelope(i, version)
    envelope = GEOMETRY.envelope_size(1, version)
    assert bytes_moved(chunks) == (held.count(False) + 1) * envelope


def test_no_tail_when_tokens_fill_whole_blocks(kit: Kit) -> None:
    tokens = TOKENS[:8]
    chunks = plan_push(tokens, kit.kv[:2], GEOMETRY, 1, [True, False], "r")
    assert len(chunks) == 2 and all(c.block_hash != 0 for c in chunks)
    assert bytes_moved(chunks) == 1 * GEOMETRY.envelope_size(1, 1)


def test_plan_checks_its_inputs(kit: Kit) -> None:
    with pytest.raises(ValueError, match="held"):
        plan_push(TOKENS, kit.kv, GEOMETRY, 1, [True], "r")
    with pytest.raises(ValueError, match=r"kv\.shape"):
        plan_push(TOKENS, kit.kv[:2], GEOMETRY, 1, [True, True], "r")


def test_plan_refuses_a_block_over_4_mib() -> None:
    geometry = Geometry(1, 1, 5, 209714)  # one f16 row more than the largest legal v1 chunk
    kv = np.zeros((1, *geometry.kv_shape), np.float16)
    with pytest.raises(ValueError, match="TLKV-XFER-MAX-PAYLOAD"):
        plan_push([1], kv, geometry, 1, [False], "r")


def test_end_to_end_over_grpc(serve: Serve, side: DecodeSide) -> None:
    server = serve(side)
    rng = np.random.default_rng(3)
    tokens = list(range(100, 114))  # 3 full blocks + a tail of 2
    kv = make_kv(rng, GEOMETRY, 4, garbage_tail=True)
    first = run_prefill(server.address, tokens, kv, GEOMETRY, 1, "first", timeout=10.0)
    assert first.ok and first.held == [False, False, False]
    envelope = GEOMETRY.envelope_size(1, 1)
    assert first.bytes_moved == 4 * envelope
    assert first.response is not None and first.response.payload_bytes == first.bytes_moved
    # a second prompt sharing the first two blocks, then diverging
    tokens2 = [*tokens[:8], 900, 901, 902, 903, 904]
    kv2 = make_kv(rng, GEOMETRY, 4, garbage_tail=True)
    second = run_prefill(server.address, tokens2, kv2, GEOMETRY, 1, "second", timeout=10.0)
    assert second.held == [True, True, False]
    assert second.bytes_moved == (1 + 1) * envelope
    assert second.response is not None
    assert (second.response.blocks_stored, second.response.blocks_reused) == (2, 2)
    # the reused block is the first request's copy, values intact
    stored = side.pool.get(full_block_hashes(tokens, 4)[0])
    assert stored is not None and stored.refs == 2
    np.testing.assert_array_equal(stored.kv(), kv[0])
    tail = side.pool.partial_blocks("second")[0].kv()
    np.testing.assert_array_equal(tail[:, :, :, :1, :], kv2[3][:, :, :, :1, :])
    assert not tail[:, :, :, 1:, :].any()  # zero padding past the fill, though the source held garbage
