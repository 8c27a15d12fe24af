"""Running the relay as a process (``kvconform serve moqt-relay``) and loading a ``Relay`` subclass by name."""

from __future__ import annotations

import asyncio
import logging
import sys
import threading
from typing import TextIO

from kvconform.loading import load_subclass
from kvconform.moqt.relay.adapter import Relay

__all__ = ["load_relay_class", "run_relay"]

log = logging.getLogger("kvconform.moqt.relay")


def load_relay_class(spec: str) -> type[Relay]:
    """``module:Class`` or ``path/to/file.py:Class`` naming a ``Relay`` subclass (the mutant runner starts
    mutants this way)."""

    return load_subclass(spec, Relay, "--relay-class")


def run_relay(relay: Relay, stop: threading.Event, *, interval: float = 5.0,
              show_counters: bool = False, verbose: bool = False, out: TextIO | None = None) -> int:
    """Serve until ``stop`` is set: print ``listening on HOST:PORT`` (flushed) once ready, the counter
    lines every ``interval`` seconds when ``show_counters``; 1 if the port cannot be bound. ``verbose``
    logs the relay's refusals and session closes to stderr."""
    stream = out if out is not None else sys.stdout
    if verbose and not log.handlers:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("%(asctime)s relay %(message)s"))
        log.addHandler(handler)
        log.setLevel(logging.INFO)

    async def main() -> int:
        try:
            await relay.start()
        except OSError as exc:
            print(f"kvconform serve moqt-relay: {exc}", file=sys.stderr)
            return 1
        host = relay.host
        print(f"listening on {f'[{host}]' if ':' in host else host}:{relay.port}", file=stream, flush=True)
        loop = asyncio.get_running_loop()
        try:
            # stop.wait runs in a worker thread so signal handlers and other threads can end the wait
            while not await loop.run_in_executor(None, stop.wait, interval):
                if show_counters:
                    print("\n".join(relay.status_lines()), file=stream, flush=True)
        finally:
            await relay.close()
        return 0

    return asyncio.run(main())
