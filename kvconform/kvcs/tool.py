"""``kvconform kvcs ...``: the KVCS protocol tools.

``kvconform kvcs fetch --relay URL [--relay URL2] --cache SPEC --out RESULT.json [--layers a-b]
[--blocks n] [--budget S] [--token T] [--producer-key kid=PEM-FILE] [--mode auto|live|fetch]
[--distrust-relays]``
runs the reference consumer (``kvconform.kvcs.consumer``): it discovers the publications of the cache
SPEC names (the consumer uses only its identity: profile, scope key, descriptor, tokens), retrieves and
verifies them, prints one progress line per ready layer on stderr and writes the result JSON to
RESULT.json. Exit status 0 when every wanted layer was assembled, 1 when some failed, 2 on a usage error.

``kvconform kvcs spec --out SPEC [--layers L] [--blocks N] [--block-tokens B] [--kv-heads H] [--head-dim D]
[--segments N,...] [--seed S] [--sign ES256|EdDSA --kid KID]`` writes a cache spec of the test-content
convention (``kvconform.kvcs.content``) to give a publisher and a consumer; with ``--sign`` it holds a new
producer key and the public key is written next to it (``SPEC.pub.pem``) for ``fetch --producer-key``.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from collections.abc import Sequence
from pathlib import Path

from kvconform.kvcs.consumer import (
    Consumer,
    ConsumeResult,
    ConsumerIdentity,
    ConsumerOptions,
    LayerReady,
    load_producer_keys,
)
from kvconform.kvcs.content import CacheSpec, example_spec
from kvconform.kvcs.cose import ProducerKey
from kvconform.kvcs.errors import KvcsError

__all__ = ["main"]

# A hard stop past the budget: the consumer gives up by itself; this only catches a bug that would hang.
GRACE = 10.0


def _layers(text: str) -> tuple[int, int]:
    first, sep, last = text.partition("-")
    try:
        a = int(first)
        b = int(last) if sep else a
    except ValueError:
        raise argparse.ArgumentTypeError(f"--layers {text!r}: expected a-b (inclusive) or one layer") from None
    if a < 0 or b < a:
        raise argparse.ArgumentTypeError(f"--layers {text!r}: expected 0 <= a <= b")
    return a, b


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="kvconform kvcs", description="KVCS tools")
    sub = parser.add_subparsers(dest="command", required=True)
    fetch = sub.add_parser("fetch", help="retrieve a KV cache through MOQT relays (the reference consumer)")
    fetch.add_argument("--relay", action="append", required=True, metavar="URL",
                       help="moqt://host:port of a relay; repeat for fallbacks, in preference order")
    fetch.add_argument("--cache", required=True, metavar="SPEC", help="cache spec JSON naming the cache")
    fetch.add_argument("--out", required=True, metavar="RESULT.json", help="where the result JSON is written")
    fetch.add_argument("--layers", type=_layers, metavar="a-b", help="only layers a..b (inclusive)")
    fetch.add_argument("--blocks", type=int, metavar="n", help="only the first n blocks of the context")
    fetch.add_argument("--budget", type=float, default=30.0, metavar="S",
                       help="seconds after which the consumer gives up (default 30)")
    fetch.add_argument("--stall", type=float, default=None, metavar="S",
                       help="seconds without progress before a publication is abandoned (default min(5, budget/3))")
    fetch.add_argument("--token", metavar="T", help="authorization token (USE_VALUE, type 0) for every request")
    fetch.add_argument("--producer-key", action="append", default=[], metavar="kid=PEM",
                       help="a producer's public key (PEM file or PEM text); makes authenticity required")
    fetch.add_argument("--mode", choices=("auto", "live", "fetch"), default="auto")
    fetch.add_argument("--distrust-relays", action="store_true",
                       help="relays are not trusted: no shorter-prefix probing, no Data Digest alone")
    spec = sub.add_parser("spec", help="write a cache spec (test-content convention) for a publisher and consumer")
    spec.add_argument("--out", required=True, metavar="SPEC", help="where the cache spec JSON is written")
    spec.add_argument("--layers", type=int, default=32)
    spec.add_argument("--blocks", type=int, default=64, help="complete blocks of segment 0")
    spec.add_argument("--block-tokens", type=int, default=16)
    spec.add_argument("--kv-heads", type=int, default=8)
    spec.add_argument("--head-dim", type=int, default=128)
    spec.add_argument("--segments", default="", metavar="N,...", help="token counts appended after segment 0")
    spec.add_argument("--seed", type=int, default=1, help="derives the scope key, tokens and content seed")
    spec.add_argument("--sign", choices=("ES256", "EdDSA"), default=None, help="sign the manifest (manifest.cose)")
    spec.add_argument("--kid", default="producer-1", help="the producer key's identifier")
    return parser


def _write_spec(args: argparse.Namespace) -> int:
    try:
        segments = [int(n) for n in args.segments.split(",") if n.strip()]
        signing = None
        if args.sign:
            key = ProducerKey.generate(args.sign, args.kid.encode())
            signing = {"alg": args.sign, "kid": args.kid, "private_pem": key.private_pem()}
        spec = example_spec(layers=args.layers, blocks=args.blocks, block_tokens=args.block_tokens,
                            kv_heads=args.kv_heads, head_dim=args.head_dim, segments=segments, seed=args.seed,
                            signing=signing)
    except (KvcsError, ValueError) as exc:
        print(f"kvconform kvcs spec: {exc}", file=sys.stderr)
        return 2
    out = spec.write_json(args.out)
    print(f"kvconform kvcs spec: {out}: {spec.layers} layers, {[s.blocks for s in spec.segment_layout()]} blocks "
          f"per segment, {spec.section_octets} octets per k/v object", file=sys.stderr)
    if signing is not None:
        pub = Path(f"{out}.pub.pem")
        pub.write_text(key.public_pem(), "utf-8")
        print(f"kvconform kvcs spec: producer key {args.kid}: fetch --producer-key {args.kid}={pub}", file=sys.stderr)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.command == "spec":
        return _write_spec(args)
    try:
        spec = CacheSpec.load(args.cache)
        keys = load_producer_keys(args.producer_key)
    except (KvcsError, ValueError, OSError) as exc:
        print(f"kvconform kvcs fetch: {exc}", file=sys.stderr)
        return 2
    if args.budget <= 0 or (args.blocks is not None and args.blocks <= 0):
        print("kvconform kvcs fetch: --budget and --blocks must be positive", file=sys.stderr)
        return 2
    stall = args.stall if args.stall is not None else min(5.0, args.budget / 3)
    options = ConsumerOptions(relays=tuple(args.relay), layers=args.layers, blocks=args.blocks, budget=args.budget,
                              stall_timeout=stall, token=args.token.encode() if args.token else None,
                              producer_keys=keys, mode=args.mode, distrust_relays=args.distrust_relays)

    def progress(ready: LayerReady) -> None:
        print(f"layer {ready.layer} ready: publication {ready.publication.hex()} via {ready.relay} "
              f"sha256 {ready.digest.hex()}", file=sys.stderr, flush=True)

    consumer = Consumer(ConsumerIdentity.from_spec(spec), options, on_ready=progress)

    async def bounded() -> ConsumeResult:
        return await asyncio.wait_for(consumer.run(), args.budget + GRACE)

    try:
        result = asyncio.run(bounded())
    except TimeoutError:
        print(f"kvconform kvcs fetch: no result within {args.budget + GRACE} s", file=sys.stderr)
        return 1
    Path(args.out).write_text(result.to_json(), "utf-8")
    failed = sorted(layer for layer, d in result.layers.items() if d is None)
    summary = (f"publication {result.publication.hex() if result.publication else None}: "
               f"{len(result.layers) - len(failed)}/{len(result.layers)} layers, {len(result.rejected)} objects "
               f"rejected, {result.elapsed:.2f} s" + (f", failed layers {failed}" if failed else ""))
    print(summary, file=sys.stderr, flush=True)
    return 0 if result.layers and not failed else 1
