"""Every MOQT mutant relay is caught, and every moqt-relay check catches a mutant (tests/mutants/runner.py
says how); the reference relay passes in-process and over a URL.

A mutant's run is limited (-k) to the checks it names, which keeps each run short. The PICS are the
loopback testbed's defaults (the harness starts the mutant with the matching policy).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.moqt.suites import assert_green
from tests.mutants import moqt
from tests.mutants.runner import ROOT, Lane
from tests.report_runs import ReportRun
from tests.spawn import covering, spawn_env

LANE = Lane(moqt, select_checks=True, testbed=None, idle_bound=True)

(test_mutant_is_caught, test_every_mutant_is_listed_with_a_real_requirement,
 test_every_check_has_a_mutant_it_catches) = LANE.tests()


@pytest.mark.slow
def test_reference_passes_in_process(main_job: ReportRun) -> None:
    """moqt-relay in the main job (target reference: the relay in-process with the PICS' policy) is green:
    no check fails against the correct relay, so the mutants fail for what they break, and no passing check
    leaves a requirement it cites unasserted."""
    assert_green(main_job.part("moqt-relay"))


@pytest.mark.slow
@covering(LANE.timeout)
@pytest.mark.idle_bound
def test_reference_passes_over_a_url(tmp_path: Path) -> None:
    """`kvconform serve moqt-relay --policy testbeds/moqt-relay-policy.yaml` (the policy the loopback PICS
    describe) passes the suite as `--target moqt://127.0.0.1:PORT`."""
    proc = subprocess.Popen([sys.executable, "-m", "kvconform", "serve", "moqt-relay", "--port", "0", "--policy",
                             str(ROOT / "testbeds" / "moqt-relay-policy.yaml")],
                            cwd=ROOT, env=spawn_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            stdin=subprocess.DEVNULL)
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()  # "listening on 127.0.0.1:PORT", flushed once bound
        assert line.startswith("listening on "), f"serve moqt-relay printed {line!r}"
        # The URL target's PICS are the testbed's defaults: its expired token is no declaration of one, so
        # that check is not applicable; every other passes.
        assert_green(LANE.run("moqt-relay", "moqt://" + line.split()[-1], tmp_path))
    finally:
        proc.terminate()
        proc.wait(10)
