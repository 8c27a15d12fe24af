"""The handles the kbtp-target refusal checks bind before their request: one sealed, one not."""

from __future__ import annotations

from kvconform.conformance.kbtp import expect
from kvconform.kbtp.constants import RequestFlags, Status
from kvconform.targets.kbtp_client import Gen, HarnessInitiator

__all__ = ["PREPARED", "prepare_handles"]

# Handles the refusal checks bind before their request (handle index: data, flags): one sealed, one not.
PREPARED: dict[int, tuple[bytes, int]] = {0: (b"0" * 16, int(RequestFlags.SEAL)), 1: (b"1" * 16, 0)}


def prepare_handles(a: HarnessInitiator, needs: tuple[int, ...] | list[int]) -> Gen:
    """Bind the PREPARED handles a case needs (each within quota, so a stuck one is KBTP-QUOTA-ALLOC-BOUNDED's);
    their Generations by handle index."""
    gens: dict[int, int] = {}
    for h in needs:
        data, flags = PREPARED[h]
        r = yield from a.alloc_store(a.handle(h), data, flags=flags)
        expect.status_is(r, Status.OK, req="KBTP-QUOTA-ALLOC-BOUNDED", what=f"ALLOC_STORE of prepared handle {h}")
        gens[h] = r.generation
    return gens
