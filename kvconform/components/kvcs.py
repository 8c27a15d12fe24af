"""``kvconform serve kvcs-publisher``: the reference KVCS Original Publisher, a client of a relay."""

from __future__ import annotations

import sys
import threading

from kvconform.argtypes import OneLineParser
from kvconform.components import SUMMARIES, until_stopped
from kvconform.kvcs.content import CacheSpec
from kvconform.kvcs.errors import KvcsError
from kvconform.kvcs.publisher import DEFAULT_CACHE_DURATION_MS, MANIFEST_EVERY, load_publisher_class, serve_publisher

__all__ = ["serve_kvcs_publisher"]


def serve_kvcs_publisher(argv: list[str], stop: threading.Event | None = None) -> int:
    """The reference KVCS Original Publisher (``kvconform.kvcs.publisher``): publishes the cache a cache
    spec describes to the relay, prints ``published ...`` (flushed) once everything is published, and keeps
    serving the tracks (the relay fetches fills from it) until SIGINT/SIGTERM or ``stop``."""
    parser = OneLineParser(prog="kvconform serve kvcs-publisher",
                                     description=SUMMARIES["kvcs-publisher"])
    parser.add_argument("--relay", required=True, help="moqt://host:port of the relay to publish to")
    parser.add_argument("--cache", required=True, help="cache spec JSON (the test-content convention)")
    parser.add_argument("--token", default=None,
                        help="the scope's authorization token (sent as USE_VALUE, Token Type 0, UTF-8 octets)")
    parser.add_argument("--kv", action="store_true", help="also publish a jointly encoded kv track per segment")
    parser.add_argument("--deterministic", action="store_true", help='say "deterministic": true in the manifest')
    parser.add_argument("--pub-id", default=None, help="Publication ID (32 hex digits); default random")
    parser.add_argument("--cache-duration", type=int, default=DEFAULT_CACHE_DURATION_MS,
                        help="MAX_CACHE_DURATION track property in ms (the scope's retention)")
    parser.add_argument("--manifest-every", type=int, default=MANIFEST_EVERY,
                        help="completed layers between manifest versions (at most 8)")
    parser.add_argument("--layer-interval", type=float, default=0.0,
                        help="seconds of simulated computation per layer (live production)")
    parser.add_argument("--fetch-limit", type=int, default=None, metavar="N",
                        help="serve at most N FETCHes of the session at once (declare kvcs.publisher.fetch_limit: N)")
    parser.add_argument("--publisher-class", default="kvconform.kvcs.publisher:KvcsPublisher",
                        help="module:Class of the publisher to run (a KvcsPublisher subclass)")
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:
        return exc.code if isinstance(exc.code, int) else 2
    try:
        spec = CacheSpec.load(args.cache)
        publisher_class = load_publisher_class(args.publisher_class)
        pub_id = bytes.fromhex(args.pub_id) if args.pub_id is not None else None
        publisher = publisher_class(spec, pub_id=pub_id, kv_track=args.kv, deterministic=args.deterministic,
                                    cache_duration_ms=args.cache_duration, manifest_every=args.manifest_every,
                                    layer_interval=args.layer_interval, fetch_limit=args.fetch_limit)
    except (KvcsError, ValueError, ImportError) as exc:
        print(f"kvconform serve kvcs-publisher: {exc}", file=sys.stderr)
        return 2
    token = args.token.encode("utf-8") if args.token is not None else None
    with until_stopped(stop) as stop:
        return serve_publisher(args.relay, spec, token, stop, publisher=publisher)
