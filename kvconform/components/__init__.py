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

import importlib
import signal
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from types import FrameType
from typing import Any

# One line per component: `kvconform serve --help` lists them, and each component's --help starts with its own.
SUMMARIES: dict[str, str] = {
    "tlkv-decode": "tl.kv.v1 decode side (KvTransfer gRPC server)",
    "moqt-relay": "caching MOQT draft-22 relay (ALPN moqt-22, native QUIC)",
    "kvcs-publisher": "KVCS Original Publisher (MOQT draft-22 client of a relay)",
    "kbtp-target": "KBTP target (the reference pool owner) over userspace iWARP or RoCEv2",
    "kbtp-initiator": "KBTP reference initiator as a cmd: process (operations on stdin)",
}
STATS_INTERVAL = 5.0  # seconds between counter lines on a terminal
# component -> module:function, imported only when that component is served (each pulls its own protocol stack:
# grpc, aioquic, the RDMA bindings)
COMPONENTS: dict[str, str] = {
    "tlkv-decode": "kvconform.components.tlkv:serve_tlkv_decode",
    "moqt-relay": "kvconform.components.moqt:serve_moqt_relay",
    "kvcs-publisher": "kvconform.components.kvcs:serve_kvcs_publisher",
    "kbtp-target": "kvconform.components.kbtp:serve_kbtp_target",
    "kbtp-initiator": "kvconform.components.kbtp:serve_kbtp_initiator",
}
Component = Callable[[list[str], "threading.Event | None"], int]


@contextmanager
def until_stopped(stop: threading.Event | None) -> Iterator[threading.Event]:
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



def component(name: str) -> Component:
    """The serve function of component ``name`` (a KeyError for an unknown one)."""
    module, _, attr = COMPONENTS[name].partition(":")
    serve: Component = getattr(importlib.import_module(module), attr)
    return serve


def main(argv: list[str] | None = None) -> int:
    """``python -m kvconform.components <component> [...]``: the same as ``kvconform serve``."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] not in COMPONENTS:
        print(f"usage: serve {{{','.join(COMPONENTS)}}} [...]", file=sys.stderr)
        return 2
    return component(argv[0])(argv[1:], None)
