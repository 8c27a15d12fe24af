"""BlockPool: dedup by hash, partial blocks per request, reference counts, transactions."""

from __future__ import annotations

import numpy as np
import pytest

from kvconform.tlkv.geometry import Geometry
from kvconform.tlkv.pool import BlockPool, PoolConflict, PoolStats, StoredBlock
from tests.tlkv.helpers import GEOMETRY, Kit


def stored(kit: Kit, i: int, version: int = 1) -> StoredBlock:
    return StoredBlock(kit.hashes[i], kit.fills[i], version, kit.envelope(i, version), GEOMETRY)


def snapshot(pool: BlockPool, request_ids: list[str]) -> tuple[PoolStats, list[object]]:
    return pool.stats(), [(pool.request_refs(r), [id(b) for b in pool.partial_blocks(r)]) for r in request_ids]


def test_commit_registers_full_blocks_and_keeps_partials_per_request(kit: Kit) -> None:
    pool = BlockPool(GEOMETRY)
    txn = pool.transaction()
    for i in range(3):
        txn.store("a", stored(kit, i))
    assert pool.stats().blocks == 0  # nothing visible before commit
    txn.commit()
    assert pool.holds(kit.hashes[0]) and pool.holds(kit.hashes[1])
    assert not pool.holds(0)
    size = len(kit.envelope(0))
    assert pool.stats() == PoolStats(blocks=3, refs=3, bytes=size + size + len(kit.envelope(2)),
                                     registered=2, partial=1)
    assert [b.n_tokens for b in pool.partial_blocks("a")] == [2]
    assert pool.request_refs("a") == {kit.hashes[0]: 1, kit.hashes[1]: 1}


def test_full_blocks_are_deduplicated_partials_never(kit: Kit) -> None:
    pool = BlockPool(GEOMETRY)
    for request_id in ("a", "b"):
        txn = pool.transaction()
        for i in range(3):
            txn.store(request_id, stored(kit, i))
        txn.commit()
    stats = pool.stats()
    assert stats.registered == 2 and stats.partial == 2
    assert pool.get(kit.hashes[0]) is not None
    assert pool.get(kit.hashes[0]).refs == 2  # type: ignore[union-attr]
    assert len(pool.partial_blocks("a")) == 1 and len(pool.partial_blocks("b")) == 1


def test_dedup_keeps_the_first_copy(kit: Kit) -> None:
    pool = BlockPool(GEOMETRY)
    first = stored(kit, 0, version=1)
    txn = pool.transaction()
    txn.store("a", first)
    txn.store("b", stored(kit, 0, version=2))
    txn.commit()
    assert pool.get(kit.hashes[0]) is first
    assert first.refs == 2
    assert pool.stats().bytes == len(first.envelope)


def test_take_ref_needs_a_held_or_staged_block(kit: Kit) -> None:
    pool = BlockPool(GEOMETRY)
    txn = pool.transaction()
    with pytest.raises(KeyError):
        txn.take_ref("a", kit.hashes[0])
    with pytest.raises(KeyError):
        txn.take_ref("a", 0)
    txn.store("a", stored(kit, 0))
    txn.take_ref("a", kit.hashes[0])  # staged earlier in the same transaction counts
    txn.commit()
    assert pool.get(kit.hashes[0]).refs == 2  # type: ignore[union-attr]
    assert pool.request_refs("a") == {kit.hashes[0]: 2}


def test_abort_leaves_the_pool_exactly_as_before(kit: Kit) -> None:
    pool = BlockPool(GEOMETRY)
    txn = pool.transaction()
    txn.store("a", stored(kit, 0))
    txn.store("a", stored(kit, 2))
    txn.commit()
    before = snapshot(pool, ["a", "b"])
    held_refs = pool.get(kit.hashes[0]).refs  # type: ignore[union-attr]
    txn = pool.transaction()
    txn.take_ref("b", kit.hashes[0])
    txn.store("b", stored(kit, 1))
    txn.store("b", stored(kit, 2))
    txn.abort()
    assert snapshot(pool, ["a", "b"]) == before
    assert pool.get(kit.hashes[0]).refs == held_refs  # type: ignore[union-attr]
    assert not pool.holds(kit.hashes[1])
    with pytest.raises(RuntimeError):
        txn.commit()


def test_commit_fails_whole_when_a_referenced_block_was_released(kit: Kit) -> None:
    pool = BlockPool(GEOMETRY)
    txn = pool.transaction()
    txn.store("a", stored(kit, 0))
    txn.commit()
    txn = pool.transaction()
    txn.store("b", stored(kit, 1))
    txn.take_ref("b", kit.hashes[0])
    pool.release("a")  # another request gives the block back while b's stream is open
    with pytest.raises(PoolConflict):
        txn.commit()
    assert pool.stats() == PoolStats(0, 0, 0, 0, 0)
    assert txn.state == "aborted"


def test_release_frees_blocks_at_zero_refs(kit: Kit) -> None:
    pool = BlockPool(GEOMETRY)
    for request_id in ("a", "b"):
        txn = pool.transaction()
        txn.store(request_id, stored(kit, 0))
        txn.store(request_id, stored(kit, 2))
        txn.commit()
    pool.release("a")
    assert pool.holds(kit.hashes[0]) and pool.get(kit.hashes[0]).refs == 1  # type: ignore[union-attr]
    assert pool.partial_blocks("a") == []
    pool.release("b")
    assert pool.stats() == PoolStats(0, 0, 0, 0, 0)


def test_geometry_is_fixed(kit: Kit) -> None:
    pool = BlockPool(GEOMETRY)
    other = Geometry(4, 2, 2, 16)
    with pytest.raises(ValueError, match="geometry"):
        pool.transaction().store("a", StoredBlock(kit.hashes[0], 4, 1, b"", other))


@pytest.mark.parametrize("version", [1, 2])
def test_kv_is_decoded_lazily_and_once(kit: Kit, version: int) -> None:
    block = stored(kit, 2, version)
    assert block._kv is None
    kv = block.kv()
    assert block.kv() is kv
    assert kv.shape == GEOMETRY.kv_shape
    # positions past the fill are zero in the envelope even though the source held garbage there
    assert not np.any(kv[:, :, :, 2:, :])
    if version == 1:
        np.testing.assert_array_equal(kv[:, :, :, :2, :], kit.kv[2][:, :, :, :2, :])
