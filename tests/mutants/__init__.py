"""Deliberately broken implementations: each breaks one requirement, and the suite citing it must fail."""

from dataclasses import dataclass


@dataclass(frozen=True)
class Mutant:
    """What a mutant must make fail: its suite, the requirement it breaks, the check functions that must
    report it (each with a failing assertion naming that requirement), the PICS overrides it runs with (what
    it declares), and ``collateral``: other requirements it really breaks too (each with the reason, as a
    comment), the only ones any failing check of the run may blame besides ``requirement``."""

    suite: str
    requirement: str
    checks: tuple[str, ...]
    pics: tuple[str, ...] = ()
    collateral: tuple[str, ...] = ()
