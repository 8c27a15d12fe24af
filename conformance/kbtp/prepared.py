"""The handles the kbtp-target refusal checks bind before their request: one sealed, one not."""

from __future__ import annotations

from kvconform.conformance.kbtp import expect
from kvconform.fixtures.kbtp import TargetUnderTest
from kvconform.kbtp.constants import RequestFlags, Status
from kvconform.targets.kbtp_client import Ended, Gen, HarnessInitiator
from kvconform.verdicts import current_check, violation

__all__ = ["KEPT_BINDING", "PREPARED", "prepare_handles"]

# Handles the refusal checks bind before their request (handle index: data, flags): one sealed, one not.
PREPARED: dict[int, tuple[bytes, int]] = {0: (b"0" * 16, int(RequestFlags.SEAL)), 1: (b"1" * 16, 0)}
# What a binding found at the start of a session on a remote target breaks, when the harness released the range
# it lies in (conformance checks that prepare handles may blame it: @pytest.mark.blames)
KEPT_BINDING = "KBTP-GOODBYE-RELEASE"


def prepare_handles(kbtp_target: TargetUnderTest, a: HarnessInitiator, needs: tuple[int, ...] | list[int]) -> Gen:
    """Bind the PREPARED handles a case needs (each within quota, so a stuck one is KBTP-QUOTA-ALLOC-BOUNDED's);
    their Generations by handle index. The session has named none of them before (the callers' other handles lie
    elsewhere in the range), so an ALREADY_BOUND shows a binding the target kept from an earlier session
    (``_kept_binding``)."""
    gens: dict[int, int] = {}
    for h in needs:
        data, flags = PREPARED[h]
        r = yield from a.alloc_store(a.handle(h), data, flags=flags)
        if not isinstance(r, Ended) and r.status == Status.ALREADY_BOUND:
            _kept_binding(kbtp_target, a, h)
        expect.status_is(r, Status.OK, req="KBTP-QUOTA-ALLOC-BOUNDED", what=f"ALLOC_STORE of prepared handle {h}")
        gens[h] = r.generation
    return gens


def _kept_binding(kbtp_target: TargetUnderTest, a: HarnessInitiator, h: int) -> None:
    """A target in another process keeps its state between checks, and after each check the harness ends every
    session it opened with GOODBYE RELEASE (targets/kbtp_remote.py). A handle of a new session found bound before
    the session bound it, in a range such a session held, is a binding the RELEASE left: KBTP-GOODBYE-RELEASE, not
    the check's own rule (an in-process target is fresh for each check and has released nothing)."""
    handle = a.handle(h)
    held = [r for r in getattr(kbtp_target.driver, "released", ()) if r.holds(handle)
            and r.initiator_id != a.initiator_id]
    context = current_check()
    if not held or context is None or not context.allows(KEPT_BINDING):
        return
    last = held[-1]
    violation(f"ALLOC_STORE of prepared handle {h} ({handle:#x}), the session's first request naming it, was refused "
              f"ALREADY_BOUND: it lies in the handle range [{last.handle_base:#x}, "
              f"{last.handle_base + last.handle_count:#x}) that Initiator ID {last.initiator_id.hex()} held in "
              f"{last.check}, whose session the harness then ended with GOODBYE RELEASE ({len(held)} such "
              "release(s) of this range in the run); the target kept a binding the release should have freed",
              req=KEPT_BINDING, seen="ALREADY_BOUND", expected="OK: no binding left in a released range")
