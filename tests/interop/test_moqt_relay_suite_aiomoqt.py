"""The moqt-relay conformance suite against aiomoqt's relay: our publisher and subscriber (the suite's
sessions) through a third-party relay, every scenario the suite has.

    kvconform run moqt-relay --testbed testbeds/aiomoqt.yaml --target moqt://127.0.0.1:<port>

The testbed's default PICS declare what aiomoqt's relay supports (no authorization: those checks are
not-applicable). Every check the suite fails there must be a known aiomoqt disagreement
(``disagreements.SUITE_FAILS_ON_AIOMOQT``, evidence in docs/interop-aiomoqt.md); any other failure is
either a new aiomoqt finding or a bug of the suite, and fails this test with the suite's message.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from kvconform import evidence

from .disagreements import SUITE_FAILS_ON_AIOMOQT
from .peers import RelayEndpoint, suite_report_dir, suite_verdicts

pytestmark = pytest.mark.interop

SUITE_TIMEOUT_S = 600.0


@pytest.mark.timeout(SUITE_TIMEOUT_S + 60)
def test_moqt_relay_suite_against_aiomoqt_relay(aiomoqt_relay_endpoint: RelayEndpoint,
                                                request: pytest.FixtureRequest, tmp_path: Path) -> None:
    report = suite_report_dir(request.config.getoption("kvconform_report_dir", None), "moqt-relay-on-aiomoqt", tmp_path)
    verdicts = suite_verdicts("moqt-relay", aiomoqt_relay_endpoint.url, report, SUITE_TIMEOUT_S)
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
    assert passed, f"no moqt-relay check passed against aiomoqt's relay (report {report})"
