"""The TLKV block hash chain (TLKV "Block hash").

hash(block 0) = H(0, tokens[0..B)); hash(block i) = H(hash(block i-1), tokens[i*B..(i+1)*B));
H(parent, toks) = fnv1a64(le_u64(parent) || le_u32(toks[0]) || ...), a result of 0 replaced by 1.
Only full blocks have a hash; 0 is reserved for the partial tail ("no hash").
"""

from __future__ import annotations

import struct
from collections.abc import Sequence

FNV_OFFSET = 0xCBF29CE484222325
FNV_PRIME = 0x100000001B3
NO_HASH = 0
_MASK = (1 << 64) - 1
# Block 0 of these 16 tokens has fnv1a64(le_u64(0) || tokens) == 0, so its hash is the replacement 1
# (TLKV-HASH-ZERO-IS-ONE). Found by lattice reduction: tools/zero_hash_search.py.
ZERO_HASH_TOKENS = (1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 17629698, 318840583, 327949, 83949826)


def fnv1a64(data: bytes, h: int = FNV_OFFSET) -> int:
    """FNV-1a, 64-bit: for each byte h = (h XOR byte) * prime mod 2^64."""
    for byte in data:
        h = ((h ^ byte) * FNV_PRIME) & _MASK
    return h


def hash_input(parent: int, tokens: Sequence[int]) -> bytes:
    """The bytes H hashes: le_u64(parent) followed by le_u32 of each token."""
    return struct.pack(f"<Q{len(tokens)}I", parent, *tokens)


def block_hash(parent: int, tokens: Sequence[int]) -> int:
    """H(parent, toks), with a computed 0 replaced by 1 because 0 means "no hash"."""
    h = fnv1a64(hash_input(parent, tokens))
    return h if h != NO_HASH else 1


def chain_hashes(tokens: Sequence[int], block_tokens: int) -> list[int]:
    """Hashes of the full blocks of a sequence, in order (a partial tail has none)."""
    hashes: list[int] = []
    parent = 0
    for start in range(0, len(tokens) - block_tokens + 1, block_tokens):
        parent = block_hash(parent, tokens[start : start + block_tokens])
        hashes.append(parent)
    return hashes


def block_hashes(tokens: Sequence[int], block_tokens: int) -> list[int]:
    """One entry per block of the sequence: the chain hash, or NO_HASH for a partial tail."""
    hashes = chain_hashes(tokens, block_tokens)
    if len(tokens) % block_tokens:
        hashes.append(NO_HASH)
    return hashes


def block_fills(n_tokens_total: int, block_tokens: int) -> list[int]:
    """n_tokens of each block of a sequence of `n_tokens_total` tokens."""
    full, tail = divmod(n_tokens_total, block_tokens)
    return [block_tokens] * full + ([tail] if tail else [])
