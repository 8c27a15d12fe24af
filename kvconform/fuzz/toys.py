"""Deliberately broken toy parsers: the engines must find each flaw, or they cannot be trusted to fail.

Each toy accepts ``ValueError`` as its typed error and answers most inputs with it; one input class
makes it crash, hang (interruptible, or with SIGALRM blocked so only the parent's watchdog can stop it),
blow the memory bound, or kill its process.  The trigger (any octet >= 0x80) is one bit flip away from
the ASCII seeds, so a short seeded run finds it.
"""

from __future__ import annotations

import os
import signal

from kvconform.fuzz.target import FuzzTarget

__all__ = ["TOYS", "triggered"]


def triggered(data: bytes) -> bool:
    """The flawed path runs for an input holding a non-ASCII octet."""
    return any(b >= 0x80 for b in data)


def _well_formed(data: bytes) -> None:
    if data[:2] != b"ok":
        raise ValueError(f"toy: got {data[:2]!r}, expected b'ok'")


def crashy(data: bytes) -> object:
    """IndexError when triggered."""
    _well_formed(data)
    if triggered(data):
        return data[len(data) + 10]
    return len(data)


def hangs(data: bytes) -> object:
    """Loops forever (in Python: the per-input timer interrupts it) when triggered."""
    _well_formed(data)
    while triggered(data):
        pass
    return len(data)


def hangs_hard(data: bytes) -> object:
    """Loops forever with SIGALRM blocked when triggered: only the parent's watchdog stops it."""
    _well_formed(data)
    if triggered(data):
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGALRM})
        while True:
            pass
    return len(data)


def greedy(data: bytes) -> object:
    """Allocates 4 GiB when triggered: fine on a big machine, past any sane per-input memory bound."""
    _well_formed(data)
    if triggered(data):
        return len(bytearray(4 << 30))
    return len(data)


def aborts(data: bytes) -> object:
    """Kills its own process when triggered (as a C extension's abort would)."""
    _well_formed(data)
    if triggered(data):
        os.abort()
    return len(data)


def _seeds() -> list[bytes]:
    return [b"ok hello", b"ok"]


TOYS = [
    FuzzTarget(name=name, protocol="toy", description=str(fn.__doc__), parse=fn, accepts=(ValueError,), seeds=_seeds)
    for name, fn in (("toy-crash", crashy), ("toy-hang", hangs), ("toy-hard-hang", hangs_hard),
                     ("toy-memory", greedy), ("toy-abort", aborts))
]
