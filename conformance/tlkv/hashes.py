"""Which block-hash rule a wrong hash breaks (TLKV "Block hash"): the writer and prefill suites blame one.

A wrong chain hash is compared with what the usual mistakes give — parent 0 instead of the previous block's
hash (TLKV-HASH-CHAIN), a computed 0 kept (TLKV-HASH-ZERO-IS-ONE), FNV-1 or another offset basis
(TLKV-HASH-FNV), tokens or parent not little-endian u32/u64 (TLKV-HASH-H), the wrong window of tokens
(TLKV-HASH-BLOCKS) — and blamed on the rule that mistake breaks; a hash none explains is blamed on H itself.
Only the first wrong hash of a chain is diagnosed: the later ones follow from it.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence

from kvconform.conformance.tlkv.judging import cites
from kvconform.tlkv.blockhash import FNV_OFFSET, FNV_PRIME, block_hash, chain_hashes, fnv1a64, hash_input
from kvconform.verdicts import Findings

CHAIN, H, FNV, BLOCKS = "TLKV-HASH-CHAIN", "TLKV-HASH-H", "TLKV-HASH-FNV", "TLKV-HASH-BLOCKS"
FULL_ONLY, ZERO_IS_ONE, RESERVED_ZERO = "TLKV-HASH-FULL-ONLY", "TLKV-HASH-ZERO-IS-ONE", "TLKV-HASH-RESERVED-ZERO"
# What a check of full-block hashes cites (the tail's rule and the zero replacement only where they apply).
FULL_BLOCK_RULES = (CHAIN, H, FNV, BLOCKS, RESERVED_ZERO)
_MASK = (1 << 64) - 1


def _fnv1(data: bytes) -> int:
    h = FNV_OFFSET
    for byte in data:
        h = ((h * FNV_PRIME) & _MASK) ^ byte
    return h or 1


def _variants(parent: int, toks: Sequence[int], tokens: Sequence[int], i: int, b: int) -> list[tuple[str, int, str]]:
    """(requirement, hash, the mistake) for the usual ways of getting block i's hash wrong."""
    out: list[tuple[str, int, str]] = []
    if i > 0:
        out.append((CHAIN, block_hash(0, toks), f"hashed with parent 0, not block {i - 1}'s hash"))
    raw = fnv1a64(hash_input(parent, toks))
    if raw == 0:
        out.append((ZERO_IS_ONE, 0, "H computed 0 and kept it (0 is replaced by 1)"))
    data = hash_input(parent, toks)
    out.append((FNV, _fnv1(data), "FNV-1 (multiply, then XOR) instead of FNV-1a"))
    out.append((FNV, fnv1a64(data, 0) or 1, "fnv1a64 started at 0, not 0xCBF29CE484222325"))
    be = struct.pack(">Q", parent) + b"".join(struct.pack(">I", t) for t in toks)
    out.append((H, fnv1a64(be) or 1, "parent and tokens hashed big-endian"))
    out.append((H, fnv1a64(b"".join(struct.pack("<I", t) for t in toks)) or 1, "the parent left out of H"))
    out.append((H, fnv1a64(struct.pack("<Q", parent) + b"".join(struct.pack("<Q", t) for t in toks)) or 1,
                "tokens hashed as u64"))
    for lo, hi, what in ((i * b + 1, (i + 1) * b + 1, "tokens shifted by one"),
                         (i * b, (i + 1) * b - 1, f"{b - 1} tokens, not B = {b}"),
                         (i * b, (i + 1) * b + 1, f"{b + 1} tokens, not B = {b}")):
        if 0 <= lo < hi <= len(tokens):
            out.append((BLOCKS, block_hash(parent, tokens[lo:hi]), what))
    return out


def diagnose(seen: int, tokens: Sequence[int], b: int, i: int, parent: int) -> tuple[str, str]:
    """(requirement, why) for full block i whose hash is `seen`, not the chain hash after `parent`."""
    toks = tokens[i * b : (i + 1) * b]
    for req, value, what in _variants(parent, toks, tokens, i, b):
        if value == seen and cites(req):
            return req, what
    if seen == 0 and cites(RESERVED_ZERO):
        return RESERVED_ZERO, "a full block given hash 0, which means \"no hash\""
    return H, "not H(parent, tokens) for any known mistake"


def judge_hashes(findings: Findings, where: str, seen: Sequence[int], tokens: Sequence[int], b: int,
                 n_blocks: int) -> None:
    """Record in `findings` whether `seen` (one hash per block, the partial tail's last) are the chain hashes of
    `tokens` cut into blocks of `b`, and 0 for a partial tail. `where` names the field, e.g. "records[{i}]"."""
    want = chain_hashes(tokens, b)
    n_full = len(want)
    parent = 0
    for i in range(min(n_blocks, len(seen))):
        got = seen[i]
        field = where.format(i=i)
        if i >= n_full:
            findings.expect(got == 0, FULL_ONLY, f"{field}.block_hash: got 0x{got:016X} for the partial block "
                                                 f"(fill {len(tokens) - i * b} of {b}), expected 0 (no hash)")
            continue
        if got != want[i]:
            req, why = diagnose(got, tokens, b, i, parent)
            later = sum(1 for j in range(i + 1, min(n_full, len(seen))) if seen[j] != want[j])
            findings.add(req, f"{field}.block_hash: got 0x{got:016X}, expected 0x{want[i]:016X} = "
                              f"H(0x{parent:016X}, tokens[{i * b}..{(i + 1) * b})): {why}"
                              + (f"; {later} later hash(es) differ too, chained from it" if later else ""))
            return
        for req in (H, FNV, BLOCKS, RESERVED_ZERO) + ((CHAIN,) if i > 0 else ()):
            if cites(req):
                findings.expect(True, req, "")
        if fnv1a64(hash_input(parent, tokens[i * b : (i + 1) * b])) == 0 and cites(ZERO_IS_ONE):
            findings.expect(True, ZERO_IS_ONE, "")
        parent = want[i]
