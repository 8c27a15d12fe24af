"""How a suite run against a correct implementation may end: every check passes or is not applicable, except
inconclusives whose reason is one the harness documents as unobservable over that transport (docs/kbtp-wire.md,
docs/interop-rdma.md), and failures that are recorded disagreements of a third-party peer."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

# Unobservable over the wire (docs/kbtp-wire.md): a named interleaving replayed at the target's race points (the
# initiator's own memory is invisible off the emulated fabric, but judged from the target's end of the wire: the order
# of its reads, targets/kbtp_order.py; its STags, probed through its descriptors, conformance/kbtp/exposure.py), a
# geometry of its own a served target cannot take, and a black-box race whose event did not happen in the attempts. (A
# target without DIRECT_ALLOC gets its free-path races churned from outside, conformance/kbtp/blackbox.py `Churn`: no
# longer inconclusive by design.)
# (The receive buffers behind an initiator's Completion Credits are probed from the wire: targets/kbtp_credits.py.)
# An Initiator ID the harness handed a cmd: process ({initiator_id}) shows nothing of how the initiator generates its
# own. (A black-box target's entry order is judged by holding the writer's RDMA Read Response, targets/kbtp_order.py:
# no longer inconclusive by design.)
WIRE = ("race points", "the check needs the whole ring", "the validity rule was not exercised",
        "the harness handed each initiator its Initiator ID")
# ... and on a verbs device (docs/interop-rdma.md): the device executes one-sided operations and builds every
# packet without the process seeing them, and siw reports no remote invalidation in a receive completion.
# A target in the harness's own process on the device writes a FREE's entry, block and slot in one turn of its
# loop while the kernel serves the reads: the black-box race windows never open there.
# The churn of a target without DIRECT_ALLOC likewise reaches too few cycles on a loaded machine.
RARE_WINDOW = ("the race was not observed often enough", "the race was not exercised often enough")
# The impairment stage acts on the harness's own wire links; a verbs device's link is the kernel's (the impairment
# checks run from the host's userspace bindings against rxe1 and siw1 instead).
VERBS = ("without the harness seeing them", "builds every packet itself", "does not report a Send with Invalidate",
         "has none the harness can impair", *RARE_WINDOW)
# ... and across the testbed VM's links (one TCG vCPU on one side): the Generation drive cannot reach the 16-bit wrap
# in its wall-clock budget, so the lane gives it none (the in-VM runs, harness and target in one process, reach it)
# Likewise a black-box race window opens there at the pace of the VM's target: 2 of 25 attempts in the 20 s budget
# when CI's tests load both cores (an honest inconclusive, never a pass; the same checks pass on a quieter host).
SLOW_TARGET = ("the wrap was not observed", *RARE_WINDOW)


def by_design(test: Mapping[str, Any], reasons: Iterable[str] = WIRE) -> bool:
    return test["verdict"] == "inconclusive" and any(why in str(test.get("message", "")) for why in reasons)


def unexpected(doc: Mapping[str, Any], reasons: Iterable[str] = WIRE,
               known_fails: Iterable[str] = ()) -> list[tuple[str, str, str]]:
    """(nodeid, verdict, message) of every check that neither passed, was not applicable, is inconclusive for a
    documented reason, nor fails as a known disagreement (a nodeid ending in one of ``known_fails``)."""
    reasons, known = tuple(reasons), tuple(known_fails)
    return [(t["nodeid"], t["verdict"], str(t.get("message", ""))[:400]) for t in doc["tests"]
            if t["verdict"] in ("fail", "inconclusive") and not by_design(t, reasons)
            and not (t["verdict"] == "fail" and t["nodeid"].endswith(known))]


def assert_clean(run: Any, what: str, reasons: Iterable[str] = WIRE, known_fails: Iterable[str] = (),
                 least_passed: int = 10) -> None:
    """``run`` (tests.mutants.runner.Run) ended clean: see `unexpected`; at least ``least_passed`` checks passed."""
    doc = run.coverage
    assert doc, f"{what}: no coverage.json\n{run.output}"
    bad = unexpected(doc, reasons, known_fails)
    assert run.code in (0, 1) and not bad, f"{what}: {bad}\n{run.output}"
    assert doc["summary"]["verdicts"].get("pass", 0) >= least_passed, doc["summary"]
