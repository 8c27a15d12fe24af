"""The moqt-relay conformance suite against aiomoqt's relay: our publisher and subscriber (the suite's
sessions) through a third-party relay, every scenario the suite has.

    kvconform run moqt-relay --testbed testbeds/aiomoqt.yaml --target moqt://127.0.0.1:<port>

The testbed's default PICS declare what aiomoqt's relay supports (no authorization: those checks are
not-applicable). Every check the suite fails there must be a known aiomoqt disagreement
(``disagreements.SUITE_FAILS_ON_AIOMOQT``, evidence in docs/interop-aiomoqt.md); any other failure is
either a new aiomoqt finding or a bug of the suite, and fails this test with the suite's message.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from kvconform.fixtures import evidence

from .disagreements import SUITE_FAILS_ON_AIOMOQT
from .peers import TESTBED_FILE, RelayEndpoint

pytestmark = pytest.mark.interop

SUITE_TIMEOUT_S = 600.0


def _report_dir(config: pytest.Config, tmp_path: Path) -> Path:
    base = config.getoption("report_dir", None)
    return Path(base) / "moqt-relay-on-aiomoqt" if base else tmp_path / "report"


@pytest.mark.timeout(SUITE_TIMEOUT_S + 60)
def test_moqt_relay_suite_against_aiomoqt_relay(aiomoqt_relay_endpoint: RelayEndpoint,
                                                request: pytest.FixtureRequest, tmp_path: Path) -> None:
    report = _report_dir(request.config, tmp_path)
    argv = [sys.executable, "-m", "kvconform", "run", "moqt-relay", "--testbed", str(TESTBED_FILE),
            "--target", aiomoqt_relay_endpoint.url, "--report-dir", str(report), "-q"]
    evidence.record("sent", "spawn", {"argv": argv})
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=SUITE_TIMEOUT_S, stdin=subprocess.DEVNULL)
    evidence.record("received", "suite-exit", {"code": proc.returncode, "stdout": proc.stdout[-4000:],
                                               "stderr": proc.stderr[-2000:]})
    coverage = report / "coverage.json"
    assert coverage.is_file(), \
        f"the suite wrote no report (exit {proc.returncode}): {proc.stdout[-2000:]}{proc.stderr[-2000:]}"
    tests = json.loads(coverage.read_text("utf-8"))["tests"]
    verdicts = {t["nodeid"].rsplit("::", 1)[-1].split("[", 1)[0]: t for t in tests}
    failed = {name: t for name, t in verdicts.items() if t["verdict"] == "fail"}
    passed = sorted(name for name, t in verdicts.items() if t["verdict"] == "pass")
    evidence.record("note", "suite-verdicts", {name: t["verdict"] for name, t in sorted(verdicts.items())})

    unexpected = {name: t.get("message", "") for name, t in failed.items() if name not in SUITE_FAILS_ON_AIOMOQT}
    assert not unexpected, ("moqt-relay checks failing on aiomoqt's relay that are not known disagreements "
                            f"(triage them into disagreements.SUITE_FAILS_ON_AIOMOQT or fix the suite); report "
                            f"{report}:\n" + "\n".join(f"  {n}: {m}" for n, m in sorted(unexpected.items())))
    now_passing = sorted(set(SUITE_FAILS_ON_AIOMOQT) & set(passed))
    if now_passing:
        evidence.note(f"known aiomoqt disagreements that passed this time: {now_passing}")
    # The scenarios both sides support: aiomoqt's relay passes the rest of the suite.
    assert passed, f"no moqt-relay check passed against aiomoqt's relay (exit {proc.returncode})"
