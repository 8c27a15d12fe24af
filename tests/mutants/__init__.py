"""Deliberately broken implementations: each breaks one requirement, and the suite citing it must fail."""

from dataclasses import dataclass


@dataclass(frozen=True)
class Mutant:
    """What a mutant must make fail: its suite, the requirement it breaks, the check functions that must
    report it, and PICS overrides it runs with (what it declares)."""

    suite: str
    requirement: str
    checks: tuple[str, ...]
    pics: tuple[str, ...] = ()
