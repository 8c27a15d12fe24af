"""The decode side's block pool (TLKV "Block hash" and "Transfer (tl.kv.v1)").

Invariants:
- a full block is registered once under its non-zero hash and deduplicated: storing a hash that is
  already held takes a reference on the held copy instead of keeping a second one;
- a partial (hash 0) block is never registered, never deduplicated: it is kept per request;
- every reference belongs to a request id, so a request can give back exactly what it took;
- changes go through a :class:`PoolTransaction`: nothing is visible before ``commit()``, and
  ``abort()`` leaves the pool exactly as it was (TLKV-XFER-ATOMIC).
"""

from __future__ import annotations

import threading
from collections import Counter
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from kvconform.tlkv.blockhash import NO_HASH
from kvconform.tlkv.geometry import Geometry
from kvconform.tlkv.reader import read_envelope


@dataclass(eq=False)
class StoredBlock:
    """One block the pool holds (TLKV "Export envelope"): its one-block envelope bytes, decoded on first use."""

    block_hash: int
    n_tokens: int
    version: int
    envelope: bytes
    geometry: Geometry
    refs: int = 0
    _kv: npt.NDArray[np.floating] | None = field(default=None, repr=False)

    @property
    def size(self) -> int:
        return len(self.envelope)

    def kv(self) -> npt.NDArray[np.floating]:
        """Decoded values [L][2][Hkv][B][D] (f16 for v1, f32 for v2), computed once."""
        if self._kv is None:
            env = read_envelope(self.envelope, geometry=self.geometry, versions=frozenset({self.version}))
            self._kv = env.kv(0)
        return self._kv


@dataclass(frozen=True)
class PoolStats:
    """Pool counters (TLKV "Block hash": registered vs partial): distinct blocks held, references,
    envelope bytes held."""

    blocks: int
    refs: int
    bytes: int
    registered: int
    partial: int


class PoolConflict(KeyError):
    """A staged reference names a block the pool no longer holds at commit time (TLKV-XFER-EMPTY-HELD)."""


class BlockPool:
    """Blocks keyed by hash with reference counts, for one fixed geometry (TLKV "Block hash").

    Thread-safe: every read and every commit holds the pool's lock.
    """

    def __init__(self, geometry: Geometry) -> None:
        self.geometry = geometry
        self._lock = threading.RLock()
        self._by_hash: dict[int, StoredBlock] = {}
        self._partial: dict[str, list[StoredBlock]] = {}
        self._request_refs: dict[str, Counter[int]] = {}

    def holds(self, block_hash: int) -> bool:
        """Whether a registered block has this hash (never true for 0, the partial tail's)."""
        with self._lock:
            return block_hash != NO_HASH and block_hash in self._by_hash

    def holds_all(self, hashes: list[int]) -> list[bool]:
        with self._lock:
            return [h != NO_HASH and h in self._by_hash for h in hashes]

    def get(self, block_hash: int) -> StoredBlock | None:
        with self._lock:
            return self._by_hash.get(block_hash)

    def partial_blocks(self, request_id: str) -> list[StoredBlock]:
        """The unregistered (hash 0) blocks stored for a request, in arrival order."""
        with self._lock:
            return list(self._partial.get(request_id, ()))

    def request_refs(self, request_id: str) -> dict[int, int]:
        """Hash -> references a request holds on registered blocks."""
        with self._lock:
            return dict(self._request_refs.get(request_id, {}))

    def stats(self) -> PoolStats:
        with self._lock:
            partial = [b for blocks in self._partial.values() for b in blocks]
            registered = list(self._by_hash.values())
            return PoolStats(
                blocks=len(registered) + len(partial),
                refs=sum(b.refs for b in registered) + sum(b.refs for b in partial),
                bytes=sum(b.size for b in registered) + sum(b.size for b in partial),
                registered=len(registered),
                partial=len(partial),
            )

    def release(self, request_id: str) -> None:
        """Give back every reference and partial block of a request; blocks left with no reference go."""
        with self._lock:
            self._partial.pop(request_id, None)
            for block_hash, count in self._request_refs.pop(request_id, Counter()).items():
                block = self._by_hash[block_hash]
                block.refs -= count
                if block.refs <= 0:
                    del self._by_hash[block_hash]

    def transaction(self) -> PoolTransaction:
        return PoolTransaction(self)

    def _apply(self, staged: list[tuple[str, StoredBlock | int]]) -> None:
        """Apply staged operations in order, all or nothing (called by PoolTransaction.commit)."""
        with self._lock:
            # Validate first: a ref must name a block held now or stored earlier in this transaction.
            known = set(self._by_hash)
            for _request_id, item in staged:
                if isinstance(item, StoredBlock):
                    if item.block_hash != NO_HASH:
                        known.add(item.block_hash)
                elif item not in known:
                    raise PoolConflict(item)
            for request_id, item in staged:
                if isinstance(item, StoredBlock) and item.block_hash == NO_HASH:
                    item.refs = 1
                    self._partial.setdefault(request_id, []).append(item)
                    continue
                if isinstance(item, StoredBlock):
                    held = self._by_hash.setdefault(item.block_hash, item)
                    if held is item:
                        item.refs = 0
                    block_hash = item.block_hash
                else:
                    held, block_hash = self._by_hash[item], item
                held.refs += 1
                self._request_refs.setdefault(request_id, Counter())[block_hash] += 1


class PoolTransaction:
    """Staged inserts and reference takes on a :class:`BlockPool` (TLKV-XFER-ATOMIC).

    The pool is untouched until :meth:`commit`; :meth:`abort` discards everything staged.
    """

    def __init__(self, pool: BlockPool) -> None:
        self._pool = pool
        self._staged: list[tuple[str, StoredBlock | int]] = []
        self._staged_hashes: set[int] = set()
        self.state = "open"

    def _check_open(self) -> None:
        if self.state != "open":
            raise RuntimeError(f"pool transaction: state is {self.state!r}, expected 'open'")

    def holds(self, block_hash: int) -> bool:
        """Held by the pool or stored earlier in this transaction (never true for hash 0)."""
        return block_hash != NO_HASH and (block_hash in self._staged_hashes or self._pool.holds(block_hash))

    def store(self, request_id: str, block: StoredBlock) -> None:
        """Stage a block: registered (or deduplicated) under its hash, or kept for the request if hash 0."""
        self._check_open()
        if block.geometry != self._pool.geometry:
            raise ValueError(f"block geometry: got {block.geometry}, expected {self._pool.geometry} (the pool's)")
        self._staged.append((request_id, block))
        if block.block_hash != NO_HASH:
            self._staged_hashes.add(block.block_hash)

    def take_ref(self, request_id: str, block_hash: int) -> None:
        """Stage a reference on a held block; KeyError when neither the pool nor this transaction has it."""
        self._check_open()
        if not self.holds(block_hash):
            raise KeyError(block_hash)
        self._staged.append((request_id, block_hash))

    @property
    def staged(self) -> int:
        return len(self._staged)

    def commit(self) -> None:
        """Apply everything staged at once; raises :class:`PoolConflict` (and applies nothing) when a
        referenced block disappeared since it was staged."""
        self._check_open()
        try:
            self._pool._apply(self._staged)
        except PoolConflict:
            self.abort()
            raise
        self.state = "committed"

    def abort(self) -> None:
        """Discard everything staged; the pool is exactly as before.  Idempotent after abort/commit."""
        if self.state == "open":
            self._staged.clear()
            self._staged_hashes.clear()
            self.state = "aborted"
