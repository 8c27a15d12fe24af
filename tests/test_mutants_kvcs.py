"""Every KVCS mutant (broken publishers, relays and consumers) is caught, and every check of the three KVCS
suites catches a mutant (tests/mutants/runner.py says how); the references pass in-process and through the
drivers a vendor uses: `cmd:` for the publisher and the consumer, `moqt://` for a relay.

A mutant's run is limited (-k) to the checks it names. The PICS are the loopback testbed's defaults.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.mutants import kvcs
from tests.mutants.runner import ROOT, Lane, Run
from tests.report_runs import ReportRun
from tests.spawn import covering, spawn_env

LANE = Lane(kvcs, select_checks=True, testbed=None, idle_bound=True)

(test_mutant_is_caught, test_every_mutant_is_listed_with_a_real_requirement,
 test_every_check_has_a_mutant_it_catches) = LANE.tests()


def _green(run: Run) -> None:
    verdicts = run.coverage.get("summary", {}).get("verdicts", {})
    assert run.code == 0 and verdicts.get("fail", 0) == 0 and verdicts.get("pass", 0) > 0, run.output


@pytest.mark.slow
def test_every_reference_passes_in_process(main_job: ReportRun) -> None:
    """The KVCS suites of the main job (all three roles against the references) are green, so the mutants fail
    for what they break."""
    run = main_job.part("kvcs-publisher", "kvcs-relay", "kvcs-consumer")
    _green(run)
    suites = {t["suite"] for t in run.coverage["tests"]}
    assert suites == {"kvcs-publisher", "kvcs-relay", "kvcs-consumer"}, suites


@pytest.mark.slow
@covering(LANE.timeout)
@pytest.mark.idle_bound
def test_the_reference_publisher_passes_as_a_command(tmp_path: Path) -> None:
    """`kvconform serve kvcs-publisher` driven as a vendor's publisher would be (cmd: with placeholders)."""
    cmd = (f"cmd:{sys.executable} -m kvconform serve kvcs-publisher --relay {{relay}} --cache {{cache}} "
           "--token {token}")
    _green(LANE.run("kvcs-publisher", cmd, tmp_path))


@pytest.mark.slow
@covering(LANE.timeout)
@pytest.mark.idle_bound
def test_the_reference_consumer_passes_as_a_command(tmp_path: Path) -> None:
    """`kvconform kvcs fetch` driven as a vendor's consumer would be (cmd: with placeholders)."""
    cmd = f"cmd:{sys.executable} -m kvconform kvcs fetch --relay {{relay}} --cache {{cache}} --out {{out}}"
    _green(LANE.run("kvcs-consumer", cmd, tmp_path))


@pytest.mark.slow
@covering(LANE.timeout)
@pytest.mark.idle_bound
def test_the_reference_relay_passes_over_a_url(tmp_path: Path) -> None:
    """`kvconform serve moqt-relay` with its packaged default policy passes kvcs-relay as moqt://127.0.0.1:PORT."""
    proc = subprocess.Popen([sys.executable, "-m", "kvconform", "serve", "moqt-relay", "--port", "0"],
                            cwd=ROOT, env=spawn_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            stdin=subprocess.DEVNULL)
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()  # "listening on 127.0.0.1:PORT", flushed once bound
        assert line.startswith("listening on "), f"serve moqt-relay printed {line!r}"
        _green(LANE.run("kvcs-relay", "moqt://" + line.split()[-1], tmp_path))
    finally:
        proc.terminate()
        proc.wait(10)
