"""Runs written as data (no suite runs): a check and a run of one implementation and inputs, for the gate's and
the history's tests."""

from __future__ import annotations

from dataclasses import replace

from kvconform.store import CheckRecord, RunRecord

__all__ = ["check", "history_runs", "run"]


def check(nodeid: str, verdict: str, level: str = "MUST", reqs: tuple[str, ...] = ("X-ONE",),
          blamed: str | None = None) -> CheckRecord:
    return CheckRecord(nodeid=nodeid, suite="tlkv-reader", reqs=reqs, level=level, verdict=verdict,
                       message=f"{nodeid} | {verdict}", evidence=None, blamed=blamed, duration=0.0)


def run(*checks: CheckRecord, sha: str = "0" * 64, strict: bool = False) -> RunRecord:
    return RunRecord(report_dir="/r", coverage_sha256=sha, implementation="impl", implementation_version="1",
                     implementation_vendor=None, implementation_build=None, image_digest=None, target_name="t",
                     target_kind="cmd", target_value="cmd:x", harness_version="0.1.0", harness_commit="unknown",
                     testbed_name="tb", testbed_sha256="1" * 64, catalogs={"tlkv.yaml": "2" * 64}, pics={},
                     seed=1, binding=None, draft=None, suites=("tlkv-reader",), strict=strict, exit_code=0,
                     started="s", finished="f", checks=tuple(checks))


def history_runs(more: bool = False) -> list[RunRecord]:
    """Runs for the history pages, in the order they are recorded: four of implementation 1 whose X-ONE flips
    (pass, fail, pass, and with ``more`` fail again) and whose X-TWO turns inconclusive in the third run, beside
    a stable requirement and a check citing none; one run of implementation 2 (another identity) fourth."""
    stable = (check("t::stable", "pass", reqs=("X-STABLE",)), check("cell:a<b>", "pass", reqs=()))
    one = [run(check("t::a", "pass"), check("t::b", "pass", reqs=("X-TWO",)), *stable, sha="1" * 64),
           run(check("t::a", "fail", blamed="X-ONE"), check("t::b", "pass", reqs=("X-TWO",)), *stable, sha="2" * 64),
           run(check("t::a", "pass"), check("t::b", "inconclusive", reqs=("X-TWO",)), *stable, sha="3" * 64)]
    other = replace(run(check("t::a", "pass"), sha="4" * 64), implementation="other", implementation_version="2")
    out = [*one, other]
    if more:
        out.append(run(check("t::a", "fail", blamed="X-ONE"), check("t::b", "inconclusive", reqs=("X-TWO",)),
                       *stable, sha="5" * 64))
    return out
