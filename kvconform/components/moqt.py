"""``kvconform serve moqt-relay``: the caching MOQT draft-22 relay."""

from __future__ import annotations

import sys
import threading
from importlib import resources
from pathlib import Path

from kvconform.argtypes import OneLineParser, port_or_zero
from kvconform.components import STATS_INTERVAL, SUMMARIES, until_stopped
from kvconform.moqt.policy import PolicyError, load_policy
from kvconform.moqt.relay import DEFAULT_FILL_TIMEOUT_MS, load_relay_class, run_relay

__all__ = ["EXAMPLE_POLICY", "serve_moqt_relay"]

EXAMPLE_POLICY = "example"  # serve moqt-relay --policy: the packaged policy the loopback PICS describe


def serve_moqt_relay(argv: list[str], stop: threading.Event | None = None) -> int:
    """The caching MOQT draft-22 relay (moqt-d22-profile section 12, ``kvconform.moqt.relay``).

    ``--relay-class module:Class`` runs a subclass instead (how the mutant runner starts broken relays).
    Without ``stop`` it runs until SIGINT/SIGTERM; with one it runs until the event is set.
    """
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

    with until_stopped(stop) as stop:
        relay = relay_class(policy=policy, host=args.host, port=args.port, fill_timeout_ms=args.fill_timeout,
                            cache_bytes=args.cache_mb * 2**20)
        return run_relay(relay, stop, interval=STATS_INTERVAL, show_counters=sys.stdout.isatty(),
                         verbose=args.verbose)
