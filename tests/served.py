"""`kvconform serve <component>` as a child process for a test: started, its address read, always stopped."""

from __future__ import annotations

import subprocess
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager

START_TIMEOUT = 60  # a server that never says it listens is killed


@contextmanager
def served(*args: str) -> Iterator[str]:
    """Run ``kvconform serve ARGS``; yields the HOST:PORT of its ``listening on`` line; stopped at the end."""
    proc = subprocess.Popen([sys.executable, "-m", "kvconform", "serve", *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True)
    watchdog = threading.Timer(START_TIMEOUT, proc.kill)
    watchdog.start()
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline().strip()
        watchdog.cancel()
        assert line.startswith("listening on 127.0.0.1:"), f"serve printed {line!r}"
        yield line.removeprefix("listening on ")
    finally:
        watchdog.cancel()
        proc.terminate()
        try:
            proc.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.communicate(timeout=30)
