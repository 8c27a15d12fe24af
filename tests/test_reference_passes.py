"""The reference passes every suite: the main job (`kvconform run all` against the reference, README's first
command; tests/report_runs.py says where its report comes from) ran every installed suite, every check passed, was
not applicable or an expected failure, none failed or was inconclusive, and it exited 0 with a PASSED headline.

The suites are not collected by the test command (pyproject's testpaths): this is where it judges them, once.
"""

from __future__ import annotations

from collections import Counter

import pytest

from kvconform.cli import discover_suites
from tests.report_runs import ReportRun

GREEN = {"pass", "not-applicable", "xfail"}


@pytest.mark.slow
def test_the_reference_passes_every_suite(main_job: ReportRun) -> None:
    doc = main_job.doc
    assert doc["identity"]["target"]["kind"] == "reference", doc["identity"]["target"]
    assert set(doc["summary"]["suites"]) == set(discover_suites()), "every installed suite ran"
    ran = Counter(t["suite"] for t in doc["tests"])
    assert all(ran[s] > 0 for s in discover_suites()), ran
    bad = [(t["nodeid"], t["verdict"], str(t.get("message", ""))[:300]) for t in doc["tests"]
           if t["verdict"] not in GREEN]
    assert not bad, f"the reference does not pass: {bad}\n{main_job.output}"
    assert main_job.code == 0 and doc["verdict"]["status"] == "PASSED", (doc["verdict"], main_job.output)
    assert Counter(t["verdict"] for t in doc["tests"])["pass"] > 500, doc["summary"]["verdicts"]
