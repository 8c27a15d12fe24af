"""The legal-PICS grid (issue 10): kvcs-publisher and kvcs-consumer against the reference across legal PICS
values, each run green; and the reference runs leave no requirement of either role "not-reached".

Publisher: kvcs.publisher.{signing, segments, kv_track}, every pair of values covered by four runs (the in-process
reference honours each either way: it signs when the spec carries a key, publishes appended segments, and is
started with a kv track when kv_track is declared). Consumer: the capabilities relay2, producer_key, layers and
blocks, each on and off: in-process by the PICS (kvcs.consumer.fallback_relay, producer_keys, layer_range,
first_blocks, and the declared configuration distrusts_relays), and as a command (`kvconform kvcs fetch`)
whose template carries or lacks each placeholder.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from kvconform.catalog import load_catalogs
from tests.lanes import grid_point
from tests.mutants.runner import RUN_BOUND, Run, run_suite
from tests.report_runs import ReportRun
from tests.spawn import covering

pytestmark = covering(RUN_BOUND)  # one kvconform run per test (but the main job's readers)
# (signing, segments, kv_track): a covering array of strength 2 for three booleans
PUBLISHER_GRID = [(False, True, False), (True, True, True), (False, False, True), (True, False, False)]
CONSUMER_CAPS = ("fallback_relay", "producer_keys", "layer_range", "first_blocks", "distrusts_relays")
PLACEHOLDERS = {"relay2": "--relay {relay2}", "producer_key": "--producer-key {producer_key}",
                "layers": "--layers {layers}", "blocks": "--blocks {blocks}"}
FETCH = f"cmd:{sys.executable} -m kvconform kvcs fetch --relay {{relay}} --cache {{cache}} --out {{out}}"


def _green(run: Run) -> None:
    verdicts = run.coverage.get("summary", {}).get("verdicts", {})
    bad = [(t["nodeid"], t["verdict"], t["message"][:300]) for t in run.coverage.get("tests", [])
           if t["verdict"] not in ("pass", "not-applicable")]
    assert run.code == 0 and verdicts.get("pass", 0) > 0 and not bad, (bad, run.output[-3000:])


def _not_applicable(run: Run) -> set[str]:
    return {t["nodeid"] for t in run.coverage["tests"] if t["verdict"] == "not-applicable"}


def _bool(value: bool) -> str:
    return "true" if value else "false"


@pytest.mark.slow
@pytest.mark.idle_bound
@pytest.mark.parametrize(("signing", "segments", "kv_track"), PUBLISHER_GRID,
                         ids=[f"signing-{s}-segments-{g}-kv-{k}" for s, g, k in PUBLISHER_GRID])
def test_the_reference_publisher_passes_across_legal_pics(signing: bool, segments: bool, kv_track: bool,
                                                          tmp_path: Path) -> None:
    pics = (f"kvcs.publisher.signing={_bool(signing)}", f"kvcs.publisher.segments={_bool(segments)}",
            f"kvcs.publisher.kv_track={_bool(kv_track)}")
    run = run_suite("kvcs-publisher", "reference", tmp_path, pics=pics, testbed=None)
    _green(run)
    skipped = _not_applicable(run)
    assert any("[signed]" in n for n in skipped) is not signing, sorted(skipped)
    assert any("[segmented]" in n for n in skipped) is not segments, sorted(skipped)


@pytest.mark.slow
@pytest.mark.idle_bound
@pytest.mark.parametrize("declared", [True, False], ids=["capabilities-on", "capabilities-off"])
def test_the_reference_consumer_passes_with_each_capability_on_and_off(declared: bool, tmp_path: Path) -> None:
    pics = tuple(f"kvcs.consumer.{cap}={_bool(declared)}" for cap in CONSUMER_CAPS)
    run = run_suite("kvcs-consumer", "reference", tmp_path, pics=pics, testbed=None)
    _green(run)
    assert bool(_not_applicable(run)) is not declared, sorted(_not_applicable(run))


@pytest.mark.slow
@pytest.mark.idle_bound
# the default run's sample: one of the two templates (~75 s each; tox -e grids runs both)
@pytest.mark.parametrize("given", [grid_point(("relay2", "producer_key"), id="relay2-producer_key", sampled=False),
                                   grid_point(("layers", "blocks"), id="layers-blocks", sampled=True)])
def test_the_reference_consumer_command_passes_with_each_placeholder_on_and_off(given: tuple[str, ...],
                                                                               tmp_path: Path) -> None:
    """Two templates, each carrying half of the optional placeholders (the bare template is
    tests/test_mutants_kvcs.py's): what a template lacks is not-applicable, what it carries passes."""
    cmd = " ".join([FETCH, *(PLACEHOLDERS[p] for p in given)])
    run = run_suite("kvcs-consumer", cmd, tmp_path, testbed=None)
    _green(run)
    skipped = _not_applicable(run)
    by_cap = {"relay2": "recovered_through_another_relay", "producer_key": "signed_manifest",
              "layers": "test_layer_range_only", "blocks": "test_first_blocks_only"}
    for placeholder, check in by_cap.items():
        assert any(check in n for n in skipped) is (placeholder not in given), (placeholder, sorted(skipped))


def _roles_not_reached(run: Run, proto: str, roles: tuple[str, ...]) -> dict[str, list[str]]:
    out = {}
    for role in roles:
        entry = run.coverage["protocols"][proto]["roles"].get(role)
        if entry is not None and entry["not_reached"]:
            out[role] = entry["not_reached"]
    return out


@pytest.mark.slow
def test_the_reference_runs_reach_every_requirement_they_cite(main_job: ReportRun) -> None:
    """kvcs-publisher and kvcs-consumer against the reference in the main job (its testbed PICS: every option
    declared) are green, and no KVCS publisher or consumer requirement is "not-reached": every id a check cites
    is evaluated by an assertion of a passing check."""
    catalog = load_catalogs()
    for suite in ("kvcs-publisher", "kvcs-consumer"):
        run = main_job.part(suite)
        _green(run)
        role = str(catalog.role_of_suite(suite))
        assert not _roles_not_reached(run, "kvcs", (role,)), (suite, _roles_not_reached(run, "kvcs", (role,)))
        cited = {rid for t in run.coverage["tests"] for rid in t["reqs"]}
        reached = {rid for t in run.coverage["tests"] if t["verdict"] == "pass" for rid in t["reached"]}
        assert cited <= reached, (suite, sorted(cited - reached))
