"""A `cmd:` KVCS publisher that does not sign (issue 10): it publishes the cache spec it is given with a plain
"manifest" track, ignoring any producer key in it, and serves until SIGTERM.

    python tests/kvcs/cmd_nonsigning_publisher.py --relay {relay} --cache {cache} --token {token}

Signing is optional in KVCS (a publisher without a producer key uses "manifest"); the point of this target is
the harness's PICS defaults, so it publishes through kvconform's publisher library with the key removed.
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
import tempfile
import threading
from pathlib import Path
from types import FrameType


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--relay", required=True)
    parser.add_argument("--cache", required=True, type=Path)
    parser.add_argument("--token", default="")
    args = parser.parse_args(argv)

    from kvconform.kvcs.content import CacheSpec
    from kvconform.kvcs.publisher import serve_publisher

    doc = json.loads(args.cache.read_text("utf-8"))
    doc.pop("signing", None)  # this publisher has no producer key, whatever the spec offers
    stop = threading.Event()

    def on_term(signum: int, frame: FrameType | None) -> None:
        stop.set()

    signal.signal(signal.SIGTERM, on_term)
    with tempfile.TemporaryDirectory(prefix="nonsigning-publisher-") as tmp:
        path = Path(tmp) / "cache.json"
        path.write_text(json.dumps(doc), "utf-8")
        spec = CacheSpec.load(path)
        return serve_publisher(args.relay, spec, args.token.encode() or None, stop)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
