"""What the harness tests that run a relay suite (kvconform run moqt-relay / kvcs-relay) read from its report."""

from __future__ import annotations

from collections.abc import Collection
from typing import Any

from tests.mutants.runner import Run


def unreached(coverage: dict[str, Any]) -> list[tuple[str, str]]:
    """(requirement, check function) for every requirement a passing check cites but no assertion of it
    evaluated: coverage shows it "not-reached" for that check."""
    return sorted({(r["id"], t["nodeid"].split("::")[-1].split("[")[0]) for proto in coverage["protocols"].values()
                   for role in proto["roles"].values() for r in role["requirements"] for t in r["tests"]
                   if t["check_verdict"] == "pass" and t["verdict"] == "not-reached"})


def assert_green(run: Run, unreachable: Collection[tuple[str, str]] = ()) -> None:
    """The run passed: exit 0, no check failed or inconclusive, some passed, and every requirement a passing
    check cites was asserted by it (but the (requirement, check) pairs ``unreachable`` names)."""
    verdicts = run.coverage.get("summary", {}).get("verdicts", {})
    assert run.code == 0 and verdicts.get("fail", 0) == 0 and verdicts.get("pass", 0) > 0, run.output
    assert verdicts.get("inconclusive", 0) == 0, (verdicts, run.output)
    stray = [u for u in unreached(run.coverage) if u not in unreachable]
    assert not stray, f"requirements cited by passing checks but never asserted: {stray}"
