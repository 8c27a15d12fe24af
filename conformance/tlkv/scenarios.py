"""Geometries, token sequences and contents the TLKV suites use (DESIGN.md principle 8).

Each geometry is there because some wrong implementation differs from a right one on it:
B = 1 (every block full, never a tail), a partial tail of B-1 and of 1, Hkv and L > 1 with distinct
values (an axis swapped in [L][2][Hkv][B][D] moves values), odd D, a multi-block envelope.
Token ids include 0 and 0xFFFFFFFF (le_u32 and sign mistakes).
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from kvconform import sweep
from kvconform.tlkv.blockhash import block_fills
from kvconform.tlkv.content import make_kv
from kvconform.tlkv.geometry import Geometry


@dataclass(frozen=True)
class Case:
    """A writer/prefill scenario: a geometry and a sequence length (tokens and values come from a seed)."""

    name: str
    geometry: Geometry
    n_tokens: int

    @property
    def n_blocks(self) -> int:
        return -(-self.n_tokens // self.geometry.block_tokens)


WRITER_CASES = sweep.pick([
    Case("B16-tail15", Geometry(16, 3, 2, 8), 3 * 16 + 15),
    Case("B16-exact", Geometry(16, 3, 2, 8), 2 * 16),
    Case("B16-tail1", Geometry(16, 2, 3, 5), 16 + 1),
    Case("B1-never-tail", Geometry(1, 2, 2, 3), 5),
    Case("B2-spec-shape", Geometry(2, 1, 1, 2), 5),
    Case("B7-only-partial", Geometry(7, 4, 1, 9), 6),
], [
    # --sweep wide: the engine's own geometry (2 MiB v1 blocks), D = 1 (an axis of one element), odd L with Hkv 1.
    Case("B16-engine", Geometry(16, 32, 8, 128), 16 + 7),
    Case("B3-D1", Geometry(3, 2, 5, 1), 3 * 4 + 2),
    Case("B2-L7", Geometry(2, 7, 1, 16), 2 * 3 + 1),
])


def case_seed(base: int, *key: object) -> int:
    """A stable seed for (session seed, key): the same run replays the same contents."""
    digest = hashlib.sha256(repr((base, *key)).encode()).digest()
    return int.from_bytes(digest[:8], "little")


def make_tokens(rng: np.random.Generator, n: int) -> list[int]:
    """n token ids with the extremes 0 and 0xFFFFFFFF among them."""
    tokens = [int(t) for t in rng.integers(0, 1 << 32, size=n, dtype=np.uint64)]
    if n >= 2:
        tokens[0], tokens[-1] = 0xFFFFFFFF, 0
    return tokens


def make_contents(rng: np.random.Generator, geometry: Geometry, n_tokens: int,
                  zero_slab: bool = True) -> npt.NDArray[np.float16]:
    """Values for every block, non-zero garbage past the fill; with `zero_slab`, the last block's
    (layer 0, K, head 0) slab is zero over its filled positions only, so its v2 scale must be 1.0
    while a writer that takes amax over every position gets another scale."""
    n_blocks = -(-n_tokens // geometry.block_tokens)
    kv = make_kv(rng, geometry, n_blocks, garbage_tail=True)
    if zero_slab and n_blocks:
        fill = block_fills(n_tokens, geometry.block_tokens)[-1]
        kv[-1, 0, 0, 0, :fill, :] = 0
    return kv


def fills_of(case: Case) -> Sequence[int]:
    return block_fills(case.n_tokens, case.geometry.block_tokens)
