"""Every registered fuzz target by name, the engine self-test toys, and the parsers left to other work.

The parser modules are imported on first use (not at import of this module) so the atheris engine can
instrument them as they load.
"""

from __future__ import annotations

import functools
import importlib

from kvconform.fuzz.target import FuzzTarget

__all__ = ["KNOWN_FAILING", "PROTOCOL_MODULES", "UnknownTarget", "all_targets", "resolve", "select"]

PROTOCOL_MODULES = ("kvconform.fuzz.parsers.tlkv", "kvconform.fuzz.parsers.kbtp", "kvconform.fuzz.parsers.moqt",
                    "kvconform.fuzz.parsers.kvcs")
TOYS_MODULE = "kvconform.fuzz.toys"

# Parsers with crash classes a pending change is fixing: the CI test skips them with this reason, and
# `kvconform fuzz all --skip-known` leaves them out. Remove an entry once its parser fuzzes clean (the KVCS
# manifest, COSE and track-name crashes the lane found first are fixed: none is listed).
KNOWN_FAILING: dict[str, str] = {}


class UnknownTarget(KeyError):
    """A fuzz target name that is not registered."""


@functools.cache
def all_targets() -> dict[str, FuzzTarget]:
    """Every registered parser, in protocol order."""
    out: dict[str, FuzzTarget] = {}
    for module in PROTOCOL_MODULES:
        for target in importlib.import_module(module).TARGETS:
            if target.name in out:
                raise ValueError(f"fuzz target {target.name!r} registered twice")
            out[target.name] = target
    return out


@functools.cache
def _toys() -> dict[str, FuzzTarget]:
    return {t.name: t for t in importlib.import_module(TOYS_MODULE).TOYS}


def resolve(name: str) -> FuzzTarget:
    """A registered parser or an engine self-test toy by name."""
    if name.startswith("toy-"):
        toys = _toys()
        if name in toys:
            return toys[name]
    targets = all_targets()
    if name not in targets:
        raise UnknownTarget(f"unknown fuzz target {name!r}: expected 'all' or one of {', '.join(targets)}")
    return targets[name]


def select(name: str, *, skip_known: bool = False) -> list[FuzzTarget]:
    """``all`` or a protocol's parsers (less the known-failing ones with ``skip_known``), or one target."""
    group = [t for t in all_targets().values() if name in ("all", t.protocol)]
    if group:
        return [t for t in group if not (skip_known and t.name in KNOWN_FAILING)]
    return [resolve(name)]
