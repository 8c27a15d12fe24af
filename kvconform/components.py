"""Reference implementations runnable as network services: ``kvconform serve <component> ...``.

    kvconform serve tlkv-decode [--host 127.0.0.1] [--port 50051] [--pool 16,32,8,128] [--versions 1,2]
    kvconform serve moqt-relay [--host 127.0.0.1] [--port 4443] [--policy FILE] [--relay-class module:Class]
    kvconform serve kvcs-publisher --relay URL --cache SPEC [--token T] [--kv] [--deterministic] [...]
    kvconform serve kbtp-target --binding iwarp|roce [--port 0] [--features ...] [--pool ...] [...]

prints ``listening on HOST:PORT`` (flushed) once it accepts connections (``--port 0`` picks a free
port), shows per-status counters every few seconds when stdout is a terminal, and stops cleanly on
SIGINT or SIGTERM (exit 0).
"""

from __future__ import annotations

import signal
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from importlib import resources
from pathlib import Path
from types import FrameType
from typing import Any

from kvconform.argtypes import OneLineParser, port_or_zero, positive_int
from kvconform.tlkv.decode import DecodeSide
from kvconform.tlkv.grpc_decode import DecodeServer, format_address
from kvconform.tlkv.tool import parse_geometry, parse_versions

# One line per component: `kvconform serve --help` lists them, and each component's --help starts with its own.
SUMMARIES: dict[str, str] = {
    "tlkv-decode": "tl.kv.v1 decode side (KvTransfer gRPC server)",
    "moqt-relay": "caching MOQT draft-22 relay (ALPN moqt-22, native QUIC)",
    "kvcs-publisher": "KVCS Original Publisher (MOQT draft-22 client of a relay)",
    "kbtp-target": "KBTP target (the reference pool owner) over userspace iWARP or RoCEv2",
    "kbtp-initiator": "KBTP reference initiator as a cmd: process (operations on stdin)",
}
STATS_INTERVAL = 5.0  # seconds between counter lines on a terminal
EXAMPLE_POLICY = "example"  # serve moqt-relay --policy: the packaged policy the loopback PICS describe


def serve_tlkv_decode(argv: list[str], stop: threading.Event | None = None) -> int:
    """The tl.kv.v1 decode side (TLKV "Transfer (tl.kv.v1)").

    Without ``stop`` it runs until SIGINT/SIGTERM; with one (in-process callers) it runs until the
    event is set and leaves signal handling alone.
    """
    parser = OneLineParser(prog="kvconform serve tlkv-decode",
                                     description=SUMMARIES["tlkv-decode"])
    parser.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1 only)")
    parser.add_argument("--port", type=port_or_zero, default=50051, help="port to bind; 0 picks a free one")
    parser.add_argument("--pool", type=parse_geometry, default=parse_geometry("16,32,8,128"),
                        help="B,L,Hkv,D of the receiving pool")
    parser.add_argument("--versions", "--formats", dest="versions", type=parse_versions,
                        default=frozenset({1, 2}), help="envelope versions / kv formats read, e.g. 1,2")
    parser.add_argument("--workers", type=positive_int, default=4, help="server threads")
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:
        return exc.code if isinstance(exc.code, int) else 2

    with _until_stopped(stop) as stop:
        server = DecodeServer(DecodeSide(args.pool, args.versions), args.host, args.port, args.workers)
        try:
            port = server.start()
        except OSError as exc:
            print(f"kvconform serve tlkv-decode: {exc}", file=sys.stderr)
            return 1
        print(f"listening on {format_address(args.host, port)}", flush=True)
        interactive = sys.stdout.isatty()
        try:
            while not stop.wait(STATS_INTERVAL):
                if interactive:
                    counts = server.status_counts()
                    pool = server.side.pool.stats()
                    line = " ".join(f"{k}={v}" for k, v in sorted(counts.items())) or "no RPCs yet"
                    print(f"{line} | pool blocks={pool.blocks} refs={pool.refs} bytes={pool.bytes}", flush=True)
        finally:
            server.stop(grace=1.0)
    return 0


def serve_moqt_relay(argv: list[str], stop: threading.Event | None = None) -> int:
    """The caching MOQT draft-22 relay (moqt-d22-profile section 12, ``kvconform.moqt.relay``).

    ``--relay-class module:Class`` runs a subclass instead (how the mutant runner starts broken relays).
    Without ``stop`` it runs until SIGINT/SIGTERM; with one it runs until the event is set.
    """
    from kvconform.moqt.policy import PolicyError, load_policy  # MOQT (aioquic) only when asked for
    from kvconform.moqt.relay import DEFAULT_FILL_TIMEOUT_MS, load_relay_class, run_relay

    parser = OneLineParser(prog="kvconform serve moqt-relay",
                                     description=SUMMARIES["moqt-relay"])
    parser.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1 only)")
    parser.add_argument("--port", type=port_or_zero, default=4443, help="UDP port to bind; 0 picks a free one")
    parser.add_argument("--policy", default=EXAMPLE_POLICY,
                        help="authorization policy YAML; default: the packaged testbeds/moqt-relay-policy.yaml, "
                             "which the loopback testbed's PICS describe; 'open' authorizes every request")
    parser.add_argument("--relay-class", default="kvconform.moqt.relay:Relay",
                        help="module:Class of the relay to run (a kvconform.moqt.relay.Relay subclass)")
    parser.add_argument("--fill-timeout", type=int, default=DEFAULT_FILL_TIMEOUT_MS,
                        help="ms spent fetching missing objects upstream when a request names no FILL_TIMEOUT")
    parser.add_argument("--cache-mb", type=int, default=256,
                        help="MiB of object payload cached over all tracks before the oldest are evicted")
    parser.add_argument("--verbose", action="store_true", help="log every refusal and session close to stderr")
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:
        return exc.code if isinstance(exc.code, int) else 2
    try:
        if args.policy == "open":
            policy = None
        elif args.policy == EXAMPLE_POLICY:
            policy = load_policy(Path(str(resources.files("kvconform.testbeds"))) / "moqt-relay-policy.yaml")
        else:
            policy = load_policy(args.policy)
        relay_class = load_relay_class(args.relay_class)
    except (PolicyError, ValueError, ImportError) as exc:
        print(f"kvconform serve moqt-relay: {exc}", file=sys.stderr)
        return 2

    with _until_stopped(stop) as stop:
        relay = relay_class(policy=policy, host=args.host, port=args.port, fill_timeout_ms=args.fill_timeout,
                            cache_bytes=args.cache_mb * 2**20)
        return run_relay(relay, stop, interval=STATS_INTERVAL, show_counters=sys.stdout.isatty(),
                         verbose=args.verbose)


def serve_kvcs_publisher(argv: list[str], stop: threading.Event | None = None) -> int:
    """The reference KVCS Original Publisher (``kvconform.kvcs.publisher``): publishes the cache a cache
    spec describes to the relay, prints ``published ...`` (flushed) once everything is published, and keeps
    serving the tracks (the relay fetches fills from it) until SIGINT/SIGTERM or ``stop``."""
    from kvconform.kvcs.content import CacheSpec  # KVCS (aioquic) only when asked for
    from kvconform.kvcs.errors import KvcsError
    from kvconform.kvcs.publisher import (
        DEFAULT_CACHE_DURATION_MS,
        MANIFEST_EVERY,
        load_publisher_class,
        serve_publisher,
    )

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
    with _until_stopped(stop) as stop:
        return serve_publisher(args.relay, spec, token, stop, publisher=publisher)


def serve_kbtp_target(argv: list[str], stop: threading.Event | None = None) -> int:
    """The KBTP reference target over a wire binding (``kvconform.kbtp.serve``)."""
    from kvconform.kbtp.serve import serve_kbtp_target as serve

    return serve(argv, stop)


def serve_kbtp_initiator(argv: list[str], stop: threading.Event | None = None) -> int:
    """The KBTP reference initiator as a ``cmd:`` process (``kvconform.kbtp.serve``)."""
    from kvconform.kbtp.serve import serve_kbtp_initiator as serve

    return serve(argv, stop)


@contextmanager
def _until_stopped(stop: threading.Event | None) -> Iterator[threading.Event]:
    """The event a component runs until: the caller's, or one SIGINT/SIGTERM set (handlers restored after;
    only the main thread may install them, so in-process callers pass their own)."""
    if stop is not None:
        yield stop
        return
    event = threading.Event()
    previous: dict[signal.Signals, Any] = {}
    if threading.current_thread() is threading.main_thread():

        def on_signal(signum: int, frame: FrameType | None) -> None:
            event.set()

        for sig in (signal.SIGINT, signal.SIGTERM):
            previous[sig] = signal.signal(sig, on_signal)
    try:
        yield event
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


COMPONENTS: dict[str, Callable[[list[str]], int]] = {
    "tlkv-decode": serve_tlkv_decode,
    "moqt-relay": serve_moqt_relay,
    "kvcs-publisher": serve_kvcs_publisher,
    "kbtp-target": serve_kbtp_target,
    "kbtp-initiator": serve_kbtp_initiator,
}


def main(argv: list[str] | None = None) -> int:
    """``python -m kvconform.components <component> [...]``: the same as ``kvconform serve``."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] not in COMPONENTS:
        print(f"usage: serve {{{','.join(COMPONENTS)}}} [...]", file=sys.stderr)
        return 2
    return COMPONENTS[argv[0]](argv[1:])


if __name__ == "__main__":
    sys.exit(main())
