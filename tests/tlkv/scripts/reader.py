"""An independent v1-only TLKV reader, written from the seed text alone (it imports nothing of kvconform), in the
harness's cmd: reader contract (targets/tlkv.py CmdReaderSession):

    python reader.py --envelope ENVELOPE --pool B,L,Hkv,D --out RESULT.json [--silent-allocations]

It reads version 1 only, whatever --versions says; every rule is checked before anything is allocated, and it
reports "allocated" (the blocks its pool holds when it exits) unless --silent-allocations.
"""

from __future__ import annotations

import argparse
import json
import struct
import sys
from pathlib import Path
from typing import Any

import crc32c


class Refused(Exception):
    def __init__(self, kind: str, requirement: str, message: str) -> None:
        super().__init__(message)
        self.kind, self.requirement = kind, requirement


def read(data: bytes, pool: tuple[int, int, int, int]) -> list[tuple[int, int, bytes]]:
    """The records of a valid v1 envelope for `pool`; Refused naming the rule otherwise."""
    if len(data) < 32:
        raise Refused("format", "TLKV-READ-LENGTH", f"length {len(data)} < 32")
    magic, version, dtype, n, b, layers, hkv, d = struct.unpack_from("<4sHHIIIII", data)
    if magic != b"TLKV":
        raise Refused("format", "TLKV-READ-MAGIC", f"magic {magic!r}")
    if struct.unpack_from("<I", data, len(data) - 4)[0] != crc32c.crc32c(data[:-4]):
        raise Refused("format", "TLKV-READ-CRC", "crc32c does not match")
    if version != 1:
        raise Refused("version", "TLKV-READ-VERSION", f"version {version}: this reader reads version 1 only")
    if dtype != 1:
        raise Refused("format", "TLKV-READ-DTYPE", f"dtype {dtype} with version 1")
    p = layers * 2 * hkv * b * d * 2
    if len(data) != 28 + n * (12 + p) + 4:
        raise Refused("format", "TLKV-READ-LENGTH", f"length {len(data)} != 28 + {n} * (12 + {p}) + 4")
    if (b, layers, hkv, d) != pool:
        raise Refused("shape", "TLKV-READ-SHAPE", f"geometry {(b, layers, hkv, d)} != the pool's {pool}")
    records = []
    off = 28
    for i in range(n):
        block_hash, n_tokens = struct.unpack_from("<QI", data, off)
        if not 1 <= n_tokens <= b:
            raise Refused("format", "TLKV-READ-NTOKENS", f"records[{i}].n_tokens {n_tokens} not in 1..{b}")
        if block_hash and n_tokens != b:
            raise Refused("format", "TLKV-READ-HASH-FULL", f"records[{i}] hashed with n_tokens {n_tokens} < {b}")
        records.append((block_hash, n_tokens, data[off + 12 : off + 12 + p]))
        off += 12 + p
    return records


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--envelope", required=True, type=Path)
    parser.add_argument("--pool", required=True)
    parser.add_argument("--versions", default="1")
    parser.add_argument("--out", required=True, type=Path)
    parser.add_argument("--silent-allocations", action="store_true")
    args = parser.parse_args()
    pool = tuple(int(x) for x in args.pool.split(","))
    result: dict[str, Any] = {"status": "ok", "requirement": None, "message": "", "blocks": []}
    pool_blocks: list[tuple[int, int, bytes]] = []
    try:
        pool_blocks = read(args.envelope.read_bytes(), pool)  # type: ignore[arg-type]
    except Refused as exc:
        result.update(status=exc.kind, requirement=exc.requirement, message=str(exc))
    else:
        kv = args.out.with_name(args.out.stem + ".kv.f32")
        with kv.open("wb") as f:
            for _, _, payload in pool_blocks:
                halves = struct.unpack(f"<{len(payload) // 2}e", payload)
                f.write(struct.pack(f"<{len(halves)}f", *halves))
        result.update(kv_file=kv.name, blocks=[{"block_hash": h, "n_tokens": n} for h, n, _ in pool_blocks])
    if not args.silent_allocations:
        result["allocated"] = len(pool_blocks)
    args.out.write_text(json.dumps(result))
    return 0 if result["status"] == "ok" else 1


if __name__ == "__main__":
    sys.exit(main())
