"""CPU slots: more xdist workers than cores for the tests that mostly wait, never more busy tests than cores.

A test marked ``idle_bound`` spends most of its time waiting on a `kvconform` run that itself mostly waits (the MOQT
and KVCS suites: aioquic timers, close caps; about 70 % idle). `-n auto` starts two workers per core
(tests/conftest.py); every test that is not idle-bound holds one of ``cores`` slots while it runs, so at most
``cores`` busy tests run at once and the extra workers fill the idle time with idle-bound ones.

The slots are tokens in a FIFO in the session's temporary folder (the jobserver of make): a worker takes one by
reading a byte, gives it back by writing it. A slot is taken before the test's pytest-timeout starts, and a worker
that waited `WAIT` seconds without one runs its test anyway (a lost token slows the session, never stops it).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import select
import shutil
import time
from collections.abc import Iterator
from pathlib import Path

WAIT = 1800.0  # seconds a busy test waits for a slot before it runs without one


class Slots:
    """This worker's handle on the session's slots (created, with ``count`` tokens, by the first worker)."""

    def __init__(self, folder: Path, count: int) -> None:
        self.folder = folder
        fifo = folder / "cpu-slots"
        with open(folder / "cpu-slots.lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            self.created = not fifo.exists()
            if self.created:
                os.mkfifo(fifo)
            # read-write: the FIFO never has no writer (a read would see its end) and keeps its tokens while open
            self.fd = os.open(fifo, os.O_RDWR | os.O_NONBLOCK)
            if self.created:
                os.write(self.fd, b"+" * count)

    @contextlib.contextmanager
    def held(self) -> Iterator[None]:
        token = self._take()
        try:
            yield
        finally:
            if token:
                os.write(self.fd, token)

    def _take(self) -> bytes:
        deadline = time.monotonic() + WAIT
        while (left := deadline - time.monotonic()) > 0:
            if select.select([self.fd], [], [], left)[0]:
                with contextlib.suppress(BlockingIOError):  # another worker took it first
                    return os.read(self.fd, 1)
        return b""

    def close(self) -> None:
        """Close this worker's handle; the worker that made the slots removes their folder (the others, all
        configured before any test ran, keep their open handles)."""
        os.close(self.fd)
        if self.created:
            shutil.rmtree(self.folder, ignore_errors=True)
