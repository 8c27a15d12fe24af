"""Real reports against their published schema (reports/schema/report.schema.json), and what they must hold: the
Identity block, the headline, the failed assertion, the evidence (whole bytes, readable first), the manifest, and
a recorded command that replays the run."""

from __future__ import annotations

import copy
import hashlib
import json
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from kvconform import __version__
from kvconform.evidence import raw_of
from kvconform.reports.certification import validate_report
from kvconform.reports.identity import file_sha256
from kvconform.reports.signature import verify
from kvconform.targets.testbed import default_testbed_path
from tests.mutants.runner import ROOT, RUN_BOUND, SEED
from tests.report_runs import (
    BROKEN_REQUIREMENT,
    BROKEN_TARGET,
    ReportRun,
    given_report_dirs,
    load_given,
)
from tests.spawn import covering, kvconform


def _head_commit() -> str | None:
    if not (ROOT / ".git").exists():
        return None
    proc = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True, text=True, timeout=10)
    return proc.stdout.strip() if proc.returncode == 0 else None


def test_reports_validate_against_the_schema(reference: ReportRun, broken: ReportRun) -> None:
    for run in (reference, broken):
        problems = validate_report(run.doc)
        assert not problems, f"{run.report_dir}/coverage.json breaks the schema:\n  " + "\n  ".join(problems[:20])


def test_the_schema_has_teeth(broken: ReportRun) -> None:
    """A report that says PASSED over a failed requirement, misses its Identity or names an unknown verdict is
    refused: the schema is a contract, not a formality."""
    lying = copy.deepcopy(broken.doc)
    lying["verdict"]["status"] = "PASSED"
    lying["verdict"]["text"] = "PASSED: every mandatory requirement exercised passed"
    assert any("failed" in p or "exit_code" in p for p in validate_report(lying))
    anonymous = copy.deepcopy(broken.doc)
    del anonymous["identity"]["pics"]
    assert any("pics" in p for p in validate_report(anonymous))
    odd = copy.deepcopy(broken.doc)
    odd["protocols"]["tlkv"]["roles"]["reader"]["requirements"][0]["verdict"] = "passed-ish"
    assert any("passed-ish" in p for p in validate_report(odd))


def test_identity_of_the_reference_run(reference: ReportRun) -> None:
    ident = reference.doc["identity"]
    assert ident["implementation"] == {"declared": True, "name": "kvconform reference implementations",
                                       "vendor": "kvconform project", "version": __version__}
    assert ident["testbed"] == {"name": "loopback", "file": str(default_testbed_path()),
                                "sha256": file_sha256(default_testbed_path())}
    assert ident["target"]["name"] == "reference" and ident["target"]["kind"] == "reference"
    values = {v["path"]: v for v in ident["pics"]["values"]}
    assert values["tlkv.reader.versions"] == {"path": "tlkv.reader.versions", "value": [1, 2], "defaulted": False,
                                              "overridden": False}
    assert ident["pics"]["defaulted"] == 0, "a named testbed entry declares its own PICS"
    (spec,) = ident["specs"]
    assert spec["catalog"]["name"] == "tlkv.yaml" and spec["catalog"]["sha256"] == file_sha256(spec["catalog"]["path"])
    text = spec["text"]
    assert text["name"] == "spec/seeds/002_886df638f1c32f75.txt"
    # a checkout with shared/ beside it (or beside a folder above it, as a git worktree's), as here and in CI
    shared = next((s for s in (a / "shared" / text["name"] for a in ROOT.parents) if s.is_file()), None)
    if shared is not None:
        assert text["available"] and text["sha256"] == file_sha256(shared)
    else:
        assert not text["available"] and text["sha256"] is None and "not available" in text["note"]
    head = _head_commit()
    commit = ident["harness"]["commit"]
    assert commit.split("+")[0] == head if head else commit == "unknown"
    assert ident["harness"]["version"] == __version__
    run = ident["run"]
    assert run["replayable"] and run["seed"] == int(SEED) and run["suites"] == ["tlkv-reader"]
    assert run["command"] == shlex.join(["kvconform", "run", "tlkv-reader", "--target", "reference",
                                         "--report-dir", str(reference.report_dir), "--seed", SEED, "-q"])
    assert run["started"] <= run["finished"] and run["exit_code"] == 0
    assert ident["host"]["name"] and ident["host"]["python"] == sys.version.split()[0]


def test_identity_of_an_ad_hoc_target_marks_every_default(broken: ReportRun) -> None:
    ident = broken.doc["identity"]
    assert ident["implementation"]["declared"] is False and "implementation:" in ident["implementation"]["note"]
    assert ident["target"]["name"] == BROKEN_TARGET
    values = ident["pics"]["values"]
    assert values and all(v["defaulted"] for v in values), "an ad-hoc target declares nothing itself"
    assert ident["pics"]["defaulted"] == len(values)


def test_headlines(reference: ReportRun, broken: ReportRun) -> None:
    ok = reference.doc["verdict"]
    assert ok["status"] == "PASSED" and reference.code == 0
    assert ok["text"].startswith("PASSED: every mandatory requirement exercised passed")
    bad = broken.doc["verdict"]
    assert bad["status"] == "FAILED" and bad["failed"] == [BROKEN_REQUIREMENT] and broken.code == 1
    assert bad["text"].startswith("FAILED: 1 mandatory requirement failed")
    (reader,) = [r for r in broken.doc["roles_summary"] if r["role"] == "reader"]
    assert reader["tested"] and reader["counts"]["fail"] == 1
    untested = [r for r in broken.doc["roles_summary"] if not r["tested"]]
    assert {r["role"] for r in untested} == {"writer", "prefill-side", "decode-side"}


def _failed_entries(doc: dict[str, Any], rid: str) -> list[dict[str, Any]]:
    reqs = [r for p in doc["protocols"].values() for role in p["roles"].values() for r in role["requirements"]
            if r["id"] == rid]
    return [t for r in reqs for t in r["tests"] if t["verdict"] == "fail"]


def test_a_failed_check_carries_its_assertion_and_evidence(broken: ReportRun) -> None:
    entries = _failed_entries(broken.doc, BROKEN_REQUIREMENT)
    rule = next(t for t in entries if t["nodeid"].endswith("test_rule[crc-field-v1]"))
    assert rule["assertion"] == {"requirement": BROKEN_REQUIREMENT,
                                 "what": "an envelope breaking TLKV-READ-CRC (crc-field, v1): the reader accepted it",
                                 "seen": "'ok'", "expected": "a refusal (format)"}
    assert rule["message"].endswith("seen 'ok', expected a refusal (format)")
    assert (broken.report_dir / rule["evidence"]).is_file() and (broken.report_dir / rule["evidence_html"]).is_file()
    bundle = broken.evidence("test_rule[crc-field-v1]")
    # Readable first: verdict, message, assertion and transcript come before the context and the raw events.
    keys = list(bundle)
    assert keys.index("transcript") < keys.index("pics") < keys.index("events")
    assert keys.index("message") < keys.index("transcript")
    assert bundle["assertion"] == rule["assertion"]
    assert "→ envelope: malformation=crc-field" in bundle["transcript"][0]
    assert "← import-outcome" in bundle["transcript"][1]
    # The PICS as a short summary of the role's own values, not the whole tree.
    assert set(bundle["pics"]["values"]) == {p for p in bundle["pics"]["values"] if p.startswith("tlkv.reader.")}
    assert "tlkv.reader.versions" in bundle["pics"]["defaulted"]
    # The whole envelope sent, not its first 256 bytes.
    raw = bundle["events"][0]["raw"]
    data = raw_of(raw, None)
    assert data is not None and len(data) == raw["len"] > 256
    assert data[:4] == b"TLKV" and hashlib.sha256(data).hexdigest() == raw["sha256"]


def test_large_bytes_go_whole_to_the_side_file(broken: ReportRun) -> None:
    bundle = broken.evidence("test_differential_fuzz")
    side = broken.report_dir / "evidence" / bundle["side_file"]
    data = side.read_bytes()
    large = [e["raw"] for e in bundle["events"] if e.get("raw") and "offset" in e["raw"]]
    assert large, "the fuzz check sends envelopes over the inline limit"
    for raw in large:
        whole = raw_of(raw, data)
        assert whole is not None and hashlib.sha256(whole).hexdigest() == raw["sha256"]


def test_the_run_writes_a_manifest_that_verifies(reference: ReportRun, broken: ReportRun) -> None:
    for run in (reference, broken):
        listed = (run.report_dir / "manifest.sha256").read_text().splitlines()
        names = [line.split("  ", 1)[1] for line in listed]
        assert names == sorted(names) and "coverage.json" in names and "junit.xml" in names
        assert any(n.startswith("evidence/") and n.endswith(".html") for n in names)
        result = verify(run.report_dir)
        assert result.ok, result.lines()


@covering(RUN_BOUND, RUN_BOUND)
def test_the_recorded_command_replays_the_run(tmp_path: Path) -> None:
    """`kvconform run` records the command as typed; run again, it gives the same checks, seeds and verdicts."""
    first = tmp_path / "first"
    argv = [sys.executable, "-m", "kvconform", "run", "tlkv-reader", "--target", BROKEN_TARGET, "--testbed",
            "tests/mutants/testbed.yaml", "--report-dir", str(first), "--seed", "7", "-k", "test_rule and crc", "-q"]
    kvconform(argv[3:], timeout=RUN_BOUND)
    doc = json.loads((first / "coverage.json").read_text())
    command = doc["identity"]["run"]["command"]
    assert command == shlex.join(["kvconform", *argv[3:]])
    replay = shlex.split(command)
    assert replay[0] == "kvconform"
    moved = [str(tmp_path / "again") if a == str(first) else a for a in replay[1:]]
    kvconform(moved, cwd=doc["identity"]["run"]["cwd"], timeout=RUN_BOUND)
    again = json.loads((tmp_path / "again" / "coverage.json").read_text())

    def outcome(d: dict[str, Any]) -> list[tuple[str, str, int]]:
        return sorted((t["nodeid"], t["verdict"], t["seed"]) for t in d["tests"])

    assert outcome(again) == outcome(doc) and len(outcome(doc)) >= 2
    assert again["verdict"]["text"] == doc["verdict"]["text"]


@pytest.mark.parametrize("report_dir", given_report_dirs() or [pytest.param(None, marks=pytest.mark.skip(
    reason="no report folder given ($KVCONFORM_CHECK_REPORT_DIRS); .ci/run gives the main job's"))])
def test_given_report_validates(report_dir: Path) -> None:
    run = load_given(report_dir)
    problems = validate_report(run.doc)
    assert not problems, f"{report_dir}/coverage.json breaks the schema:\n  " + "\n  ".join(problems[:20])
    assert verify(report_dir).ok, verify(report_dir).lines()
