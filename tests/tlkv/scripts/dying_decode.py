"""A decode side that dies mid-run: kvconform's reference decode side on 127.0.0.1:PORT, which exits abruptly
(os._exit, no goodbye) on the first KvChunk it receives after AFTER PushKv streams have ended: in the middle of
a stream. Stopped early by SIGTERM.

    python dying_decode.py --port PORT --pool B,L,Hkv,D --after N
"""

from __future__ import annotations

import argparse
import os
import signal
import threading

from kvconform.tlkv.decode import DecodeSide
from kvconform.tlkv.geometry import Geometry
from kvconform.tlkv.grpc_decode import DecodeServer


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--pool", type=Geometry.parse, required=True)
    parser.add_argument("--after", type=int, required=True)
    args = parser.parse_args()
    seen = 0
    lock = threading.Lock()

    def observe(kind: str, *_: object) -> None:
        nonlocal seen
        with lock:
            if kind == "PushKvEnd":
                seen += 1
            elif kind == "KvChunk" and seen >= args.after:
                os._exit(3)  # killed in the middle of a stream

    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    server = DecodeServer(DecodeSide(args.pool, frozenset({1, 2})), port=args.port, observer=observe)
    server.start()
    stop.wait()
    server.stop(0)


if __name__ == "__main__":
    main()
