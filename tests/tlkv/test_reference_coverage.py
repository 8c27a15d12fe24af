"""The TLKV suites of the main job (`kvconform run all` against the reference, tests/report_runs.py) pass, and every
id a TLKV check cites is asserted somewhere: no TLKV requirement is left "not-reached" (cited by passing checks
none of which evaluated it), in any role.

The one requirement of a suited role no check covers is named here with the reason, so a new gap fails.
"""

from __future__ import annotations

import pytest

from tests.report_runs import ReportRun

# (role, requirement) -> why no check of that role covers it.
UNCOVERED = {
    ("decode-side", "TLKV-READ-NOALLOC"): "tl.kv.v1 shows what a decode side holds (HasBlocks), not what it "
                                          "allocated: a failed stream holding nothing is TLKV-XFER-ATOMIC's check",
}


@pytest.mark.slow
def test_reference_run_of_the_tlkv_suites_reaches_every_cited_requirement(main_job: ReportRun) -> None:
    assert main_job.code == 0, main_job.output
    tlkv = {s for s in main_job.doc["summary"]["suites"] if s.startswith("tlkv-")}
    assert tlkv == {"tlkv-writer", "tlkv-reader", "tlkv-decode", "tlkv-prefill"}
    assert not [t for t in main_job.doc["tests"] if t["suite"] in tlkv and t["verdict"] in ("fail", "inconclusive")]
    statuses: dict[tuple[str, str], str] = {}
    for role, entry in main_job.doc["protocols"]["tlkv"]["roles"].items():
        for req in entry["requirements"]:
            statuses[(role, req["id"])] = req["verdict"]
    not_reached = sorted(k for k, v in statuses.items() if v == "not-reached")
    assert not not_reached, f"cited by checks, asserted by none: {not_reached}"
    uncovered = {k for k, v in statuses.items() if v == "uncovered"}
    assert uncovered == set(UNCOVERED), f"uncovered: {sorted(uncovered)}"
    assert {v for v in statuses.values()} <= {"pass", "not-applicable", "untestable", "uncovered"}, statuses
