"""What the TLKV suites' judging helpers share: asking which ids the running check cites.

A helper that diagnoses which rule a target broke may only blame an id the check cites (the CheckContext turns
anything else into a harness bug); outside a check (the harness's own unit tests) every id is allowed.
"""

from __future__ import annotations

from kvconform.verdicts import check, current_check


def cites(requirement: str) -> bool:
    """The running check cites `requirement` (True outside a check)."""
    context = current_check()
    return context is None or requirement in context.cited


def held(requirement: str, what: str) -> None:
    """`requirement` was asserted and held (a comparison that covers it came out right), when the check cites it."""
    if cites(requirement):
        check(True, what, req=requirement)
