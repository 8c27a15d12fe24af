"""TLKV codec throughput against memcpy on the same machine, in the same run (issue 2's benchmark).

    python bench/bench_tlkv.py [--blocks N] [--repeat R] [--json FILE]

Block geometry B=16, L=32, Hkv=8, D=128 (2 MiB of f16 KV per block). Throughput counts the block's f16
KV bytes (the data an engine moves) for every format, so v1 and v2 compare directly; the baseline is
numpy copyto of the same bytes into a pre-allocated destination. Encode = the checked encoder
(encode_envelope_into: zero padding, hashes, CRC) writing the envelope into a pre-allocated buffer, as
tl_kv_export writes into the caller's buffer of tl_kv_export_bytes (encode_envelope, which returns
`bytes`, adds one allocation and copy on top). Decode = the reader's every rule (incl. CRC) plus
materialising the values into a pre-allocated pool buffer (f16 for v1, f32 for v2, as tl_kv_import
hands them to the engine; decode_v1_into / decode_v2_into). v2_import_fp8 is the other reading of a v2
import: an engine with an FP8 KV pool keeps the e4m3 bytes and scales as they are (validate + copy); the
v2 target is judged on the f32 materialisation (v2_roundtrip) first. Both buffers are written once before
timing, so page faults of a fresh allocation are not counted, as they are not for memcpy. Each
figure is the best of R runs; the machine is shared, so run it more than once.
"""

from __future__ import annotations

import argparse
import json
import platform
import time
from collections.abc import Callable

import numpy as np

from kvconform.checksum import crc32c
from kvconform.tlkv.envelope import Block, encode_envelope, encode_envelope_into
from kvconform.tlkv.geometry import Geometry
from kvconform.tlkv.payload import decode_v1_into, decode_v2_into
from kvconform.tlkv.reader import read_envelope

GEOMETRY = Geometry(16, 32, 8, 128)


def best_of(repeat: int, fn: Callable[[], object]) -> float:
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--blocks", type=int, default=16, help="blocks per envelope (default 16 = 32 MiB of KV)")
    ap.add_argument("--repeat", type=int, default=7)
    ap.add_argument("--json", help="also write the results as JSON here")
    args = ap.parse_args()

    g, n = GEOMETRY, args.blocks
    rng = np.random.default_rng(1)
    kv = rng.standard_normal((n, *g.kv_shape), dtype=np.float32).astype(np.float16)
    blocks = [Block(i + 1, g.block_tokens, kv[i]) for i in range(n)]
    kv_bytes = kv.nbytes
    mib = kv_bytes / 2**20

    dst = np.empty_like(kv)
    memcpy = best_of(args.repeat, lambda: np.copyto(dst, kv))
    results: dict[str, float] = {"memcpy": kv_bytes / memcpy}
    payload = kv.tobytes()
    results["crc32c"] = kv_bytes / best_of(args.repeat, lambda: crc32c(payload))

    for version, pool_dtype in ((1, np.float16), (2, np.float32)):
        data = encode_envelope(g, version, blocks)
        out = np.zeros(g.envelope_size(n, version), np.uint8)
        pool = np.zeros((n, *g.kv_shape), pool_dtype)
        decode_into = decode_v1_into if version == 1 else decode_v2_into

        def encode(version: int = version, out: np.ndarray = out) -> None:
            encode_envelope_into(out, g, version, blocks)

        def decode(data: bytes = data, version: int = version, pool: np.ndarray = pool,
                   decode_into: Callable[..., None] = decode_into) -> None:
            env = read_envelope(data, geometry=g, versions={version})
            for i, record in enumerate(env.records):
                decode_into(record.payload, g, pool[i])

        encode()
        assert out.tobytes() == data, "encode_envelope_into and encode_envelope differ"
        decode()
        t_enc = best_of(args.repeat, encode)
        t_dec = best_of(args.repeat, decode)
        results[f"v{version}_encode"] = kv_bytes / t_enc
        results[f"v{version}_decode"] = kv_bytes / t_dec
        results[f"v{version}_roundtrip"] = kv_bytes / (t_enc + t_dec)
        if version == 2:
            # An FP8 pool keeps the e4m3 bytes and scales as they are; decoding is then validate + copy.
            pool8 = np.zeros((n, g.payload_size(2)), np.uint8)

            def import_fp8(data: bytes = data, pool8: np.ndarray = pool8) -> None:
                env = read_envelope(data, geometry=g, versions={2})
                for i, record in enumerate(env.records):
                    pool8[i] = np.frombuffer(record.payload, np.uint8)

            t_fp8 = best_of(args.repeat, import_fp8)
            results["v2_import_fp8"] = kv_bytes / t_fp8
            results["v2_roundtrip_fp8"] = kv_bytes / (t_enc + t_fp8)

    base = results["memcpy"]
    print(f"TLKV codec, {n} blocks of B={g.block_tokens} L={g.n_layers} Hkv={g.n_kv_heads} D={g.head_dim} "
          f"({mib:.0f} MiB of f16 KV), best of {args.repeat}; {platform.processor() or platform.machine()}")
    print(f"{'measure':<16}{'GB/s':>9}{'x memcpy':>10}")
    for name, rate in results.items():
        print(f"{name:<16}{rate / 1e9:>9.2f}{rate / base:>10.2f}")
    targets = {"v1_roundtrip": 0.30, "v2_roundtrip": 0.10, "v2_roundtrip_fp8": 0.10}
    for name, target in targets.items():
        ratio = results[name] / base
        print(f"target {name} >= {target:.0%} of memcpy: {ratio:.0%} -> {'met' if ratio >= target else 'NOT met'}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"geometry": g.as_dict(), "blocks": n, "bytes_per_second": results,
                       "ratio_to_memcpy": {k: v / base for k, v in results.items()}}, f, indent=1)


if __name__ == "__main__":
    main()
