"""Verdicts the decode suite gives misbehaving tl.kv.v1 servers (issue 10): transport failures are never an
acceptable answer, a hang is a bounded failure blamed on the check's requirement, and a server killed mid-run
fails the check during which it died while every later check is inconclusive, none passes.

Each runs `kvconform run tlkv-decode` against a target of tests/tlkv/ (targets.py, scripts/), with the mutant
testbed's small geometry (16,3,2,8) and versions [1, 2].
"""

from __future__ import annotations

from pathlib import Path

import pytest

from kvconform.fixtures.tlkv import CALL_TIMEOUT
from tests.spawn import covering
from tests.tlkv.harness import PY, RUN_BOUND, SCRIPTS, kvconform_run

TARGETS = "python:tests.tlkv.targets"
STARTUP = 40.0  # seconds a `kvconform run` may spend starting and reporting on a loaded machine

# Checks that passed against a server answering every PushKv UNAVAILABLE before issue 10 (any-rejection). The
# unparseable-chunk check still passes, rightly: grpcio itself refuses bytes that are not a KvChunk with INTERNAL,
# the framework's clean refusal, before the handler runs (and the server stores nothing).
UNAVAILABLE_FALSE_PASSES = ("test_two_block_envelope", "test_empty_payload_for_unheld_block",
                            "test_payload_over_4mib", "test_chunk_hash_differs_from_record",
                            "test_kv_format_not_envelope_version")


@pytest.mark.slow
@covering(RUN_BOUND)
def test_unavailable_is_not_a_rejection(tmp_path: Path) -> None:
    run = kvconform_run("tlkv-decode", f"{TARGETS}:UnavailableDecode", tmp_path)
    assert run.code == 1, run.describe()
    assert run.with_verdict("pass") == ["test_unparseable_chunk"], run.describe()
    for name in UNAVAILABLE_FALSE_PASSES:
        assert name in run.with_verdict("fail"), run.describe()
    atomicity = [t for t in run.tests if t["nodeid"].endswith("test_concurrent_streams_keep_exactly_what_succeeded")]
    assert atomicity and atomicity[0]["verdict"] == "fail", run.describe()
    blamed = {t["nodeid"].split("::")[-1]: t["blamed"] for t in run.tests}
    assert blamed["test_empty_payload_for_unheld_block"] == "TLKV-XFER-EMPTY-HELD"
    assert blamed["test_reader_rule_in_chunk[crc-field-v1]"] == "TLKV-READ-STATUS"
    assert blamed["test_has_blocks_order"] == "TLKV-XFER-ACCEPT", "a valid stream answered UNAVAILABLE"


@pytest.mark.slow
@covering(3 * CALL_TIMEOUT + 2 * STARTUP)
def test_hanging_push_fails_each_check_within_its_deadline(tmp_path: Path) -> None:
    checks = ("test_chunk_crc_mismatch", "test_empty_payload_for_unheld_block", "test_has_blocks_order")
    run = kvconform_run("tlkv-decode", f"{TARGETS}:HangingPushDecode", tmp_path, "-k", " or ".join(checks),
                        timeout=3 * CALL_TIMEOUT + 2 * STARTUP)
    assert run.code == 1, run.describe()
    assert {t["nodeid"].split("::")[-1]: t["blamed"] for t in run.tests} == {
        "test_chunk_crc_mismatch": "TLKV-XFER-CRC",
        "test_empty_payload_for_unheld_block": "TLKV-XFER-EMPTY-HELD",
        "test_has_blocks_order": "TLKV-XFER-ACCEPT",
    }, run.describe()
    assert all("DEADLINE_EXCEEDED" in t["message"] for t in run.tests), run.describe()
    assert run.elapsed < 3 * CALL_TIMEOUT + STARTUP, run.describe()


@pytest.mark.slow
@covering(150)
def test_hanging_suite_ends_within_its_budget(tmp_path: Path) -> None:
    budget = 30.0
    run = kvconform_run("tlkv-decode", f"{TARGETS}:HangingPushDecode", tmp_path, "--suite-budget", str(budget),
                        timeout=150)
    assert run.code == 1, run.describe()
    assert "pass" not in run.verdicts and run.verdicts["fail"] >= 2, run.describe()
    assert any("budget" in t["message"] for t in run.tests if t["verdict"] == "inconclusive"), run.describe()
    assert run.elapsed < budget + CALL_TIMEOUT + STARTUP, run.describe()


@pytest.mark.slow
@covering(2 * 2 * CALL_TIMEOUT + 2 * STARTUP)
def test_server_that_never_answers_fails_rather_than_inconclusive(tmp_path: Path) -> None:
    run = kvconform_run("tlkv-decode", f"{TARGETS}:HangingDecode", tmp_path, "-k",
                        "test_chunk_crc_mismatch or test_has_blocks_order", timeout=2 * 2 * CALL_TIMEOUT + 2 * STARTUP)
    assert run.code == 1, run.describe()
    assert dict(run.verdicts) == {"fail": 2}, run.describe()
    assert {t["blamed"] for t in run.tests} == {"TLKV-XFER-CRC", "TLKV-XFER-HAS-ORDER"}, run.describe()
    assert all("hangs or answers wrongly" in t["message"] for t in run.tests), run.describe()


@pytest.mark.slow
@covering(240)
def test_server_killed_mid_run(tmp_path: Path) -> None:
    template = f"cmd:{PY} {SCRIPTS / 'dying_decode.py'} --port {{port}} --pool 16,3,2,8 --after 60"
    run = kvconform_run("tlkv-decode", template, tmp_path, timeout=240)
    assert run.code == 1, run.describe()
    order = [t for t in run.tests if t["verdict"] != "not-applicable"]
    first_bad = next(i for i, t in enumerate(order) if t["verdict"] != "pass")
    assert first_bad > 0 and order[first_bad]["verdict"] == "fail", run.describe()
    later = {t["verdict"] for t in order[first_bad + 1 :]}
    assert later == {"inconclusive"}, f"after the server died no check may pass or fail: {later}\n{run.describe()}"
    assert all("does not answer" in t["message"] for t in order[first_bad + 1 :]), run.describe()
