"""Find token ids whose TLKV block hash input has fnv1a64 == 0 (the value H must replace by 1).

FNV-1a is h <- (h XOR byte) * P mod 2^64. XOR with a byte changes only h's low byte, so it equals adding
d = (L XOR byte) - L, L = h & 0xFF, a small integer in [-L, 255 - L]. Over n free bytes after a fixed
prefix of state S, the final hash is S*P^n + sum_k d_k * P^(n-k) mod 2^64: a knapsack mod 2^64 with small
unknowns, which lattice reduction (LLL, Kannan's embedding) solves; a solution is usable when every
step's L + d_k stays within 0..255, which a short one usually does.

    python tools/zero_hash_search.py      # about two minutes in pure Python (exact rational LLL)

It found the last four tokens of kvconform/tlkv/blockhash.py ZERO_HASH_TOKENS (prefix: parent 0 and
tokens 1..12, B = 16).  Run once; the suites use the constant.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from fractions import Fraction

from kvconform.tlkv.blockhash import FNV_PRIME, fnv1a64

M64 = 1 << 64


def lll(rows: list[list[int]], delta: Fraction = Fraction(99, 100)) -> list[list[int]]:
    """Textbook LLL over exact rationals (small dimensions only)."""
    b = [list(r) for r in rows]
    n = len(b)

    def dot(x: Sequence[int | Fraction], y: Sequence[int | Fraction]) -> Fraction:
        return Fraction(sum((Fraction(p) * q for p, q in zip(x, y, strict=True)), Fraction(0)))

    def gram_schmidt() -> tuple[list[list[Fraction]], list[list[Fraction]]]:
        bs: list[list[Fraction]] = []
        mu = [[Fraction(0)] * n for _ in range(n)]
        for i in range(n):
            v = [Fraction(x) for x in b[i]]
            for j in range(i):
                mu[i][j] = dot(b[i], bs[j]) / dot(bs[j], bs[j])
                v = [p - mu[i][j] * q for p, q in zip(v, bs[j], strict=True)]
            bs.append(v)
        return bs, mu

    bs, mu = gram_schmidt()
    k = 1
    while k < n:
        for j in range(k - 1, -1, -1):
            q = round(mu[k][j])
            if q:
                b[k] = [p - q * r for p, r in zip(b[k], b[j], strict=True)]
                bs, mu = gram_schmidt()
        if dot(bs[k], bs[k]) >= (delta - mu[k][k - 1] ** 2) * dot(bs[k - 1], bs[k - 1]):
            k += 1
        else:
            b[k], b[k - 1] = b[k - 1], b[k]
            bs, mu = gram_schmidt()
            k = max(k - 1, 1)
    return b


def search(prefix: bytes, n: int = 16) -> bytes | None:
    """n bytes that, appended to `prefix`, make fnv1a64 zero; None when the short vectors do not realise."""
    s = fnv1a64(prefix)
    weights = [pow(FNV_PRIME, n - k, M64) for k in range(n)]
    target = (-s * pow(FNV_PRIME, n, M64)) % M64
    big, marker = 1 << 80, 64
    rows = [[int(i == k) for i in range(n)] + [big * weights[k], 0] for k in range(n)]
    rows.append([0] * n + [big * M64, 0])
    rows.append([0] * n + [-big * target, marker])
    for r in lll(rows):
        if r[n] != 0 or abs(r[n + 1]) != marker:
            continue
        d = r[:n] if r[n + 1] == marker else [-x for x in r[:n]]
        h, out = s, bytearray()
        for dk in d:
            low = h & 0xFF
            if not 0 <= low + dk <= 255:
                break
            out.append((low + dk) ^ low)
            h = ((h ^ out[-1]) * FNV_PRIME) % M64
        else:
            if h == 0:
                return bytes(out)
    return None


def main() -> None:
    prefix_tokens = list(range(1, 13))
    tail = search(struct.pack("<Q12I", 0, *prefix_tokens))
    if tail is None:
        raise SystemExit("no realisable short vector; change the prefix")
    tokens = prefix_tokens + list(struct.unpack("<4I", tail))
    print(tokens, hex(fnv1a64(struct.pack("<Q16I", 0, *tokens))))


if __name__ == "__main__":
    main()
