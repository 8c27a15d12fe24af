"""One report from two paths to one device (kvconform.reports.facing, issue 23 item 7): a check inconclusive on
one path and judged on the other takes the judged verdict; a fail on either path is a fail; every merged check
names the path that judged it; a facing wire that could not be reached judged nothing (inconclusive, naming it),
never a pass; the certification verdict is the merged one."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from kvconform.catalog import Catalog, load_catalogs
from kvconform.cli import main
from kvconform.reports.certification import certify
from kvconform.reports.coverage import build_coverage, write_coverage_json
from kvconform.reports.facing import (
    RunPath,
    facing_keyword,
    facing_nodeids,
    merge_paths,
    merged_report,
    read_path,
    run_facing,
)
from kvconform.results import TestResult
from tests.served import served

CATALOG = """\
protocol: demo
title: Demo
source: demo.txt
roles: [target, initiator]
suites: {demo-target: target, demo-initiator: initiator}
requirements:
  - {id: DEMO-OPS, section: S, level: MUST, roles: [target], text: operations}
  - {id: DEMO-WIRE, section: S, level: MUST, roles: [target], text: a wire attack}
  - {id: DEMO-RACE, section: S, level: MUST, roles: [target], text: a race}
  - {id: DEMO-ONE-SIDED, section: S, level: MUST, roles: [initiator], text: one-sided operations}
"""
VERBS = "verbs:rxe0"
WIRE = "kbtp+roce://127.0.0.1:4791"
CRAFT = "the harness's initiators are on verbs:rxe0 (roce), whose device builds every packet itself"


@pytest.fixture
def catalog(tmp_path: Path) -> Catalog:
    (tmp_path / "demo.yaml").write_text(CATALOG)
    return load_catalogs(tmp_path)


def _r(name: str, verdict: str, req: str, message: str = "", *, suite: str = "demo-target",
       evidence: str | None = None) -> TestResult:
    blamed = req if verdict == "fail" else None
    return TestResult(f"conformance/demo/target/test_x.py::{name}", suite, (req,), "MUST", verdict,
                      message or f"{name}: {verdict}", 0.1, evidence, 1, blamed, (req,))


def _primary() -> list[TestResult]:
    return [_r("test_ops", "pass", "DEMO-OPS"), _r("test_attack", "inconclusive", "DEMO-WIRE", CRAFT),
            _r("test_race", "pass", "DEMO-RACE")]


def _doc(catalog: Catalog, results: list[TestResult]) -> dict[str, Any]:
    return certify(build_coverage(catalog, results, {"exit_code": 1}), {"target": {"name": "rxe-ref"}},
                   strict=False, exit_code=1)


def _by_name(results: list[TestResult]) -> dict[str, TestResult]:
    return {r.nodeid.split("::")[-1]: r for r in results}


def test_inconclusive_on_verbs_judged_on_the_facing_wire_takes_the_judged_verdict() -> None:
    facing = RunPath(WIRE, (_r("test_attack", "pass", "DEMO-WIRE", "the NAK came"),))
    merged = _by_name(merge_paths(RunPath(VERBS, tuple(_primary())), [facing]))
    assert merged["test_attack"].verdict == "pass"
    assert merged["test_attack"].message.startswith(f"[judged on {WIRE}] the NAK came")
    assert f"(inconclusive on {VERBS})" in merged["test_attack"].message
    assert merged["test_ops"].verdict == "pass" and merged["test_ops"].message.startswith(f"[judged on {VERBS}]")


def test_judged_on_verbs_inconclusive_on_the_wire_keeps_the_verbs_verdict() -> None:
    facing = RunPath(WIRE, (_r("test_race", "inconclusive", "DEMO-RACE", "window opened 0 of 9"),))
    merged = _by_name(merge_paths(RunPath(VERBS, tuple(_primary())), [facing]))
    assert merged["test_race"].verdict == "pass"
    assert merged["test_race"].message.startswith(f"[judged on {VERBS}]")


@pytest.mark.parametrize("failing", ["primary", "facing"])
def test_a_fail_on_either_path_is_a_fail(failing: str) -> None:
    bad = _r("test_race", "fail", "DEMO-RACE", "DEMO-RACE: torn slot")
    primary = [bad if r.nodeid == bad.nodeid and failing == "primary" else r for r in _primary()]
    facing = RunPath(WIRE, (bad if failing == "facing" else _r("test_race", "pass", "DEMO-RACE"),))
    merged = _by_name(merge_paths(RunPath(VERBS, tuple(primary)), [facing]))["test_race"]
    assert merged.verdict == "fail" and merged.blamed == "DEMO-RACE"
    assert merged.message.startswith(f"[judged on {VERBS if failing == 'primary' else WIRE}] DEMO-RACE: torn slot")


def test_a_fail_on_both_paths_names_both() -> None:
    bad = _r("test_race", "fail", "DEMO-RACE", "DEMO-RACE: torn slot")
    primary = [bad if r.nodeid == bad.nodeid else r for r in _primary()]
    merged = _by_name(merge_paths(RunPath(VERBS, tuple(primary)), [RunPath(WIRE, (bad,))]))["test_race"]
    assert merged.verdict == "fail" and f"it fails on {WIRE} too" in merged.message


def test_inconclusive_on_every_path_names_every_reason() -> None:
    facing = RunPath(WIRE, (_r("test_attack", "inconclusive", "DEMO-WIRE", "the target hung up"),))
    merged = _by_name(merge_paths(RunPath(VERBS, tuple(_primary())), [facing]))["test_attack"]
    assert merged.verdict == "inconclusive"
    assert merged.message.startswith(f"[inconclusive on {VERBS}, {WIRE}]")
    assert f"on {VERBS}: {CRAFT}" in merged.message and f"on {WIRE}: the target hung up" in merged.message


def test_an_unreachable_facing_wire_is_inconclusive_naming_it_never_a_pass(catalog: Catalog) -> None:
    down = RunPath(WIRE, (), "facing", "connection refused")
    merged = _by_name(merge_paths(RunPath(VERBS, tuple(_primary())), [down]))
    assert merged["test_attack"].verdict == "inconclusive"
    assert merged["test_attack"].message.startswith(f"[inconclusive on {VERBS}, {WIRE}]")
    assert f"the facing wire {WIRE} could not be reached (connection refused)" in merged["test_attack"].message
    doc = merged_report(catalog, _doc(catalog, _primary()), RunPath(VERBS, tuple(_primary())), [down])
    assert doc["verdict"]["status"] == "NOT CERTIFIABLE" and doc["verdict"]["inconclusive"] == ["DEMO-WIRE"]


def test_the_certification_is_the_merged_verdict(catalog: Catalog) -> None:
    primary_doc = _doc(catalog, _primary())
    assert primary_doc["verdict"]["status"] == "NOT CERTIFIABLE"  # verbs alone cannot craft the attack
    judged = RunPath(WIRE, (_r("test_attack", "pass", "DEMO-WIRE"),))
    doc = merged_report(catalog, primary_doc, RunPath(VERBS, tuple(_primary())), [judged])
    assert doc["verdict"]["status"] == "PASSED", doc["verdict"]["text"]
    assert doc["meta"]["exit_code"] == 0 and doc["meta"]["facing"]["primary"] == VERBS
    broken = RunPath(WIRE, (_r("test_attack", "fail", "DEMO-WIRE", "DEMO-WIRE: no NAK"),))
    doc = merged_report(catalog, primary_doc, RunPath(VERBS, tuple(_primary())), [broken])
    assert doc["verdict"]["status"] == "FAILED" and doc["verdict"]["failed"] == ["DEMO-WIRE"]


def test_one_role_is_certified_alone(catalog: Catalog) -> None:
    results = [*_primary(), _r("test_direct", "inconclusive", "DEMO-ONE-SIDED",
                               "the device executes the initiator's one-sided operations without the harness seeing "
                               "them", suite="demo-initiator")]
    judged = RunPath(WIRE, (_r("test_attack", "pass", "DEMO-WIRE"),))
    primary = RunPath(VERBS, tuple(results))
    whole = merged_report(catalog, _doc(catalog, results), primary, [judged])
    assert whole["verdict"]["status"] == "NOT CERTIFIABLE"
    target = merged_report(catalog, _doc(catalog, results), primary, [judged], suites=["demo-target"])
    assert target["verdict"]["status"] == "PASSED", target["verdict"]["text"]


def test_the_checks_a_facing_wire_should_judge() -> None:
    results = [*_primary(), _r("test_race", "inconclusive", "DEMO-RACE", "the race was not observed often enough"),
               _r("test_unseen", "inconclusive", "DEMO-ONE-SIDED", "executes them without the harness seeing them")]
    wanted = facing_nodeids(results)
    assert [n.split("::")[-1] for n in wanted] == ["test_attack", "test_unseen"]
    assert facing_keyword([*wanted, "x/test_y.py::test_attack[bad-icrc]"]) == "test_attack or test_unseen"


def test_evidence_is_rebased_onto_the_merged_report_and_a_missing_report_is_unreachable(tmp_path: Path,
                                                                                        catalog: Catalog) -> None:
    run = tmp_path / "wire-run"
    write_coverage_json(run / "coverage.json",
                        _doc(catalog, [_r("test_attack", "pass", "DEMO-WIRE", evidence="evidence/a.json")]))
    path = read_path(WIRE, run, tmp_path / "merged")
    assert path.unreachable is None and path.evidence_dir == "../wire-run"
    merged = _by_name(merge_paths(RunPath(VERBS, tuple(_primary())), [path]))
    assert merged["test_attack"].evidence == "../wire-run/evidence/a.json"
    gone = read_path(WIRE, tmp_path / "nothing", tmp_path / "merged")
    assert gone.results == () and gone.unreachable and "left no report" in gone.unreachable


def test_kvconform_report_facing_writes_the_merged_certification(tmp_path: Path, catalog: Catalog,
                                                                 capsys: pytest.CaptureFixture[str]) -> None:
    # the demo catalog is not the packaged one: the command merges the packaged catalog's KBTP ids
    prim, wire, out = tmp_path / "verbs", tmp_path / "wire", tmp_path / "merged"
    real = load_catalogs()
    rid = "KBTP-WIRE-ATOMIC-ALIGN"
    assert rid in real
    attack = TestResult("kbtp/target/test_wire_attacks.py::test_misaligned_atomic", "kbtp-target", (rid,), "MUST",
                        "inconclusive", CRAFT, 0.1, None, 1, None, (rid,))
    write_coverage_json(prim / "coverage.json", certify(build_coverage(real, [attack], {"exit_code": 1}), {},
                                                        strict=False, exit_code=1))
    code = main(["report", "facing", "--primary", str(prim), "--primary-name", VERBS, "--facing",
                 f"{WIRE}={tmp_path / 'absent'}", "--out", str(out)])
    assert code == 1
    doc = json.loads((out / "coverage.json").read_text())
    assert doc["verdict"]["status"] == "NOT CERTIFIABLE"
    assert "could not be reached" in doc["tests"][0]["message"]
    passed = attack.__class__(**{**attack.as_dict(), "reqs": (rid,), "reached": (rid,), "verdict": "pass",
                                 "message": "the NAK came"})
    write_coverage_json(wire / "coverage.json", certify(build_coverage(real, [passed], {"exit_code": 0}), {},
                                                        strict=False, exit_code=0))
    code = main(["report", "facing", "--primary", str(prim), "--primary-name", VERBS, "--facing", f"{WIRE}={wire}",
                 "--out", str(out)])
    said = capsys.readouterr().out
    assert code == 0 and "PASSED" in said, said
    doc = json.loads((out / "coverage.json").read_text())
    assert doc["tests"][0]["message"].startswith(f"[judged on {WIRE}]") and (out / "coverage.html").is_file()


@pytest.mark.slow  # two `kvconform run` processes and a served target: about 9 s
def test_kvconform_run_facing_judges_what_verbs_left_over_the_served_wire(tmp_path: Path) -> None:
    """run_facing (kvconform run --facing URL, after its run through verbs): the attack the primary could not craft
    runs over the wire to the served reference and passes; a facing URL nothing listens at judges nothing."""
    real = load_catalogs()
    rid = "KBTP-WIRE-ATOMIC-ALIGN"
    attack = TestResult("kbtp/target/test_wire_attacks.py::test_misaligned_atomic", "kbtp-target", (rid,), "MUST",
                        "inconclusive", CRAFT, 0.1, None, 1, None, (rid,))
    pics = {"kbtp": {"target": {"binding": "ib-rc", "features": ["DIRECT_LOAD", "DIRECT_ALLOC", "ADDR_LE"]}}}
    meta = {"exit_code": 1, "seed": 7, "pics": pics, "target": {"name": "rxe-ref"}, "strict": False}
    write_coverage_json(tmp_path / "coverage.json", certify(build_coverage(real, [attack], meta), {}, strict=False,
                                                            exit_code=1))
    with served("kbtp-target", "--binding", "roce", "--port", "0", "--profile", "ib-rc",
                "--features", "DIRECT_LOAD,DIRECT_ALLOC,ADDR_LE") as where:
        code = run_facing(real, tmp_path, [f"kbtp+roce://{where}", "kbtp+iwarp://127.0.0.1:1"], ["--timeout", "60"],
                          bound_s=120)
    doc = json.loads((tmp_path / "coverage.json").read_text())
    (check,) = doc["tests"]
    assert check["verdict"] == "pass", check["message"]
    assert check["message"].startswith(f"[judged on kbtp+roce://{where}]")
    assert code == 0 and doc["verdict"]["status"] == "PASSED"
    assert (tmp_path / "coverage-primary.json").is_file() and (tmp_path / "facing-1" / "coverage.json").is_file()
    assert [p["name"] for p in doc["meta"]["facing"]["paths"]] == [f"kbtp+roce://{where}", "kbtp+iwarp://127.0.0.1:1"]


def test_a_facing_url_must_serve_a_suite_of_the_run(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["run", "kbtp-target", "--facing", "http://127.0.0.1:1", "--report-dir", "/nonexistent/x"]) == 2
    assert "--facing 'http://127.0.0.1:1'" in capsys.readouterr().err
