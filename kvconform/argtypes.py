"""Command-line value types and the parser every kvconform command uses: a bad value is one line, exit 2.

A usage error names the option, the value seen and what was expected, on one line, before anything runs
(no usage dump a CI log has to be scrolled through; ``--help`` still prints the full usage).
"""

from __future__ import annotations

import argparse
import sys
from typing import Any, NoReturn

__all__ = ["USAGE_ERROR", "OneLineParser", "name_values", "port", "port_or_zero", "positive_float", "positive_int",
           "sim_fault_fields", "sim_faults"]

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


def sim_fault_fields(spec: str) -> dict[str, Any]:
    """``loss=P,dup=P,jitter=K,delay=MS,interleave=0|1`` as `kvconform.moqt.simnet.Faults` fields (jitter: K quanta
    of 1 ms); ValueError naming the key and what it takes."""
    fields: dict[str, Any] = {}
    for item in (p.strip() for p in spec.split(",") if p.strip()):
        key, _, text = (part.strip() for part in item.partition("="))
        try:
            if key in ("loss", "dup"):
                value = float(text)
                if not 0.0 <= value < 1.0:
                    raise ValueError("a probability in [0, 1)")
                fields["loss" if key == "loss" else "duplicate"] = value
            elif key == "jitter":
                fields["jitter_steps"], fields["jitter_quantum"] = int(text), 0.001
                if fields["jitter_steps"] < 0:
                    raise ValueError("a count of 1 ms quanta, 0 or more")
            elif key == "delay":
                fields["delay"] = float(text.removesuffix("ms")) / 1000.0
                if fields["delay"] < 0:
                    raise ValueError("milliseconds, 0 or more")
            elif key == "interleave":
                if text not in ("0", "1"):
                    raise ValueError("0 or 1")
                fields["interleave"] = text == "1"
            else:
                raise ValueError("not one of loss, dup, jitter, delay, interleave")
        except ValueError as exc:
            raise ValueError(f"{spec!r}: {key}={text}: {exc}") from None
    return fields


def sim_faults(text: str) -> str:
    """``--sim-faults``: checked here, used by the simulated network."""
    try:
        sim_fault_fields(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return text
