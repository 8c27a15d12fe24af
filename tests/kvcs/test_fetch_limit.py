"""KVCS-SEC-FETCH-LIMIT against publishers that do not break it: a publisher serving fetches one at a time
(queueing, never refusing) passes with a declared limit, and a publisher that declares no limit is not
applicable, never passed."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.mutants.runner import RUN_BOUND, run_suite
from tests.spawn import covering

# one kvconform run per test, of a KVCS suite: mostly waiting (tests/cpu_slots.py)
pytestmark = [pytest.mark.idle_bound, covering(RUN_BOUND)]
CHECK = "test_the_declared_fetch_limit_holds"
SERIAL = "python:tests.kvcs.serial_fetch_publisher:SerialFetchPublisher"


def _verdicts(run_dir: Path, target: str, pics: tuple[str, ...]) -> list[tuple[str, str]]:
    run = run_suite("kvcs-publisher", target, run_dir, pics=pics, checks=(CHECK,), testbed=None)
    return [(t["verdict"], t["message"][:400]) for t in run.coverage.get("tests", [])]


@pytest.mark.slow
def test_a_publisher_serving_fetches_one_at_a_time_passes(tmp_path: Path) -> None:
    assert _verdicts(tmp_path, SERIAL, ("kvcs.publisher.fetch_limit=2",)) == [("pass", "")]


@pytest.mark.slow
def test_an_undeclared_limit_is_not_applicable(tmp_path: Path) -> None:
    verdicts = _verdicts(tmp_path, SERIAL, ())
    assert [v for v, _ in verdicts] == ["not-applicable"], verdicts
