"""``kvconform serve tlkv-decode``: the tl.kv.v1 decode side as a gRPC service."""

from __future__ import annotations

import sys
import threading

from kvconform.argtypes import OneLineParser, port_or_zero, positive_int
from kvconform.components import STATS_INTERVAL, SUMMARIES, until_stopped
from kvconform.tlkv.decode import DecodeSide
from kvconform.tlkv.grpc_decode import DecodeServer, format_address
from kvconform.tlkv.tool import parse_geometry, parse_versions

__all__ = ["serve_tlkv_decode"]


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

    with until_stopped(stop) as stop:
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
