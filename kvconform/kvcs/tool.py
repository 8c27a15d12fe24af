"""``kvconform kvcs ...``: the KVCS protocol tools.

``kvconform kvcs fetch --relay URL [--relay URL2] --cache SPEC --out RESULT.json [--layers a-b]
[--blocks n] [--budget S] [--token T] [--producer-key kid=PEM-FILE] [--mode auto|live|fetch]``
runs the reference consumer (``kvconform.kvcs.consumer``): it discovers the publications of the cache
SPEC names (the consumer uses only its identity: profile, scope key, descriptor, tokens), retrieves and
verifies them, prints one progress line per ready layer on stderr and writes the result JSON to
RESULT.json. Exit status 0 when every wanted layer was assembled, 1 when some failed, 2 on a usage error.
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
from kvconform.kvcs.content import CacheSpec
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
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
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
                              producer_keys=keys, mode=args.mode)

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
