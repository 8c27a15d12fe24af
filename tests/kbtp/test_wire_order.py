"""Issue 23, item 7: the order of an initiator's one-sided reads judged from the harness target's end of a userspace
wire (targets/kbtp_order.py). The reference initiator, a `cmd:` process over RoCEv2 and over iWARP, passes
test_direct_load_sequence and test_direct_alloc_slot_reads there (they were inconclusive over any wire before), and
the mutants that issue a read before the previous one completed (tests/mutants/kbtp_overlap.py) fail them naming
the rule, as processes and in-process over loopback sockets (its own path: the witness ties a request to the
initiator's post); and an initiator whose device hides its one-sided operations is certified PASSED once that
facing wire judges them (`kvconform run --facing cmd:...`). A sample of the grid, ~25 s in all."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from tests.mutants.runner import Run, run_suite
from tests.spawn import covering

RUN_TIMEOUT_S = 120  # one process-started initiator, two checks: ~6 s here
ORDER_CHECKS = ("test_direct_load_sequence", "test_direct_alloc_slot_reads")
MUTANTS = {"ReReadWithBlock": ("KBTP-DLOAD-SEQUENCE", "test_direct_load_sequence"),
           "SlotReadsInPairs": ("KBTP-DALLOC-SLOT-READ", "test_direct_alloc_slot_reads")}


def _profile(wire: str) -> str:
    return "rdmap-7306" if wire == "iwarp" else "ib-rc"


def _pics(wire: str) -> tuple[str, ...]:
    features = "DIRECT_LOAD, DIRECT_ALLOC, ADDR_LE" + ("" if wire == "iwarp" else ", RECORD_COMPLETION")
    return f"kbtp.initiator.binding={_profile(wire)}", f"kbtp.initiator.features=[{features}]"


def _process(wire: str, initiator_class: str = "") -> str:
    """The `cmd:` template of `kvconform serve kbtp-initiator` (the reference, or ``initiator_class``)."""
    cls = f" --initiator-class {initiator_class}" if initiator_class else ""
    return (f"cmd:{sys.executable} -m kvconform serve kbtp-initiator --target {{target}} --profile {_profile(wire)} "
            f"--initiator-id {{initiator_id}} --features={{features}}{cls}")


def _verdicts(run: Run) -> dict[str, tuple[str, str, str]]:
    tests = run.coverage.get("tests", [])
    assert tests, run.output
    return {t["nodeid"].split("::")[-1]: (t["verdict"], str(t.get("blamed")), str(t.get("message", ""))) for t in tests}


def _judged_over_the_wire(evidence_dir: Path) -> None:
    for check in ORDER_CHECKS:  # judged from the wire, not skipped: the check's evidence says how
        evidence = (evidence_dir / f"kbtp_initiator_test_direct.py_{check}.json").read_text()
        assert "judged over the wire" in evidence and "held back 30 ms" in evidence, (check, evidence[:2000])


@covering(RUN_TIMEOUT_S)
def test_reference_initiator_process_passes_the_order_checks_over_iwarp(tmp_path: Path) -> None:
    run = run_suite("kbtp-initiator", _process("iwarp"), tmp_path, pics=_pics("iwarp"), checks=ORDER_CHECKS,
                    timeout=RUN_TIMEOUT_S)
    verdicts = _verdicts(run)
    for check in ORDER_CHECKS:
        assert verdicts[check][0] == "pass", (check, verdicts[check], run.output)
    _judged_over_the_wire(tmp_path / "evidence")


@covering(RUN_TIMEOUT_S)
def test_an_initiator_on_a_blind_device_is_certified_with_its_facing_wire(tmp_path: Path) -> None:
    """The certification's merge for the initiator role (docs/interop-rdma.md, "Certifying a device"): the primary
    path is blind where a verbs device is (tests/rdma/blind.py), the facing path the reference initiator as a
    `cmd:` process over RoCEv2 against the harness's userspace target; every direct check is judged, the order
    checks on the facing wire, and the merged certification is PASSED (the lane's rxe0 and siw0 initiator rows,
    once the initiator's facing wire reaches into the VM)."""
    run = run_suite("kbtp-initiator", "python:tests.rdma.blind:BlindInitiator", tmp_path,
                    # a process per interleaving of the direct-load race: 16, as in tests/kbtp/test_wire_suites.py
                    pics=("kbtp.initiator.binding=ib-rc", "kbtp.initiator.features=[DIRECT_LOAD, DIRECT_ALLOC]",
                          "kbtp.initiator.interleavings=16"),
                    checks=("test_direct",), timeout=RUN_TIMEOUT_S, extra=("--facing", _process("roce")))
    doc = run.coverage
    assert doc.get("verdict", {}).get("status") == "PASSED", (doc.get("verdict"), run.output)
    tests = {t["nodeid"].split("::")[-1]: t for t in doc["tests"]}
    facing = f"[judged on {_process('roce')}]"
    for check in ORDER_CHECKS:
        assert tests[check]["verdict"] == "pass" and tests[check]["message"].startswith(facing), tests[check]
    _judged_over_the_wire(tmp_path / "facing-1" / "evidence")


@covering(RUN_TIMEOUT_S)
@pytest.mark.parametrize(("name", "wire"), [("ReReadWithBlock", "roce"), ("SlotReadsInPairs", "iwarp")])
def test_overlapping_initiator_process_fails_naming_the_rule(name: str, wire: str, tmp_path: Path) -> None:
    requirement, check = MUTANTS[name]
    run = run_suite("kbtp-initiator", _process(wire, f"tests.mutants.kbtp_overlap:_{name}"), tmp_path,
                    pics=_pics(wire), checks=(check,), timeout=RUN_TIMEOUT_S)
    verdict, blamed, message = _verdicts(run)[check]
    assert (verdict, blamed) == ("fail", requirement), (name, wire, verdict, blamed, message, run.output)
    assert "still held back" in message, message


@covering(RUN_TIMEOUT_S)
def test_overlapping_initiator_in_process_fails_over_loopback_sockets(tmp_path: Path) -> None:
    name, wire = "SlotReadsInPairs", "roce"
    requirement, check = MUTANTS[name]
    run = run_suite("kbtp-initiator", f"python:tests.mutants.kbtp:{name}", tmp_path, pics=_pics(wire),
                    checks=(check,), timeout=RUN_TIMEOUT_S, extra=("--kbtp-wire", wire))
    verdict, blamed, message = _verdicts(run)[check]
    assert (verdict, blamed) == ("fail", requirement), (name, wire, verdict, blamed, message, run.output)
