"""Command-line value types and the parser every kvconform command uses: a bad value is one line, exit 2.

A usage error names the option, the value seen and what was expected, on one line, before anything runs
(no usage dump a CI log has to be scrolled through; ``--help`` still prints the full usage).
"""

from __future__ import annotations

import argparse
import sys
from typing import NoReturn

__all__ = ["USAGE_ERROR", "OneLineParser", "name_values", "port", "port_or_zero", "positive_float", "positive_int"]

USAGE_ERROR = 2


class OneLineParser(argparse.ArgumentParser):
    """An ArgumentParser whose errors are one line: ``prog: error: message`` and exit 2."""

    def error(self, message: str) -> NoReturn:
        self.exit(USAGE_ERROR, f"{self.prog}: error: {message}\n")

    def exit(self, status: int = 0, message: str | None = None) -> NoReturn:
        if message:
            sys.stderr.write(message)
        raise SystemExit(status)


def positive_float(text: str) -> float:
    """A number of seconds > 0 (0 or a negative value would remove the bound)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: expected a number of seconds > 0") from None
    if not value > 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"{text!r}: expected a finite number of seconds > 0")
    return value


def positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: expected an integer > 0") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"{text!r}: expected an integer > 0")
    return value


def port_or_zero(text: str) -> int:
    """A port to bind: 1..65535, or 0 for a free one."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: expected a port 0..65535 (0 picks a free one)") from None
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"{value}: expected a port 0..65535 (0 picks a free one)")
    return value


def port(text: str) -> int:
    """A port to connect to: 1..65535."""
    value = port_or_zero(text)
    if value == 0:
        raise argparse.ArgumentTypeError("0: expected a port 1..65535")
    return value


def name_values(text: str) -> str:
    """``NAME=VALUE[,NAME=VALUE...]`` (``--impair``: its values are judged where they are used,
    kvconform.rdma.wire.impair, which a start-up does not import)."""
    items = [p.strip() for p in text.split(",") if p.strip()]
    if not items or any(not n.strip() or not sep or not v.strip() for n, sep, v in (p.partition("=") for p in items)):
        raise argparse.ArgumentTypeError(f"{text!r}: NAME=VALUE[,NAME=VALUE...] is expected")
    return text
