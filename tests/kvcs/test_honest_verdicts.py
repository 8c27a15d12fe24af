"""Issue 10's KVCS cases, each against a target of its own (tests/kvcs/cmd_*.py, tests/kvcs/hostile_publishers.py),
run through `kvconform run` as a vendor would (tests/mutants/runner.py `run_suite`, loopback testbed defaults):

- a correct `cmd:` publisher that does not sign passes kvcs-publisher: the signed case is not-applicable, and the
  report lists kvcs.publisher.signing as defaulted (it was declared `signing: true` by the defaults once);
- a consumer whose result file the harness cannot read fails each check that needed the result, naming the
  field, blamed on the check's first requirement: no crash, no harness error;
- a publisher whose manifest is deeply nested or carries a huge integer fails the manifest requirement
  (KVCS-MANIFEST-JSON) once per case; the checks that need the manifest's content are inconclusive naming why;
  everything else is judged as usual.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvconform.kvcs.consumer import ConsumeResult
from kvconform.kvcs.errors import KvcsError
from kvconform.targets.kvcs.consumer import _read_result
from tests.mutants.runner import ROOT, RUN_BOUND, Run, run_suite
from tests.spawn import covering

HERE = Path(__file__).resolve().parent
HARNESS_ERROR = "harness error"
MANIFEST_CHECK = "test_manifest_is_consistent_with_the_namespace_and_the_cache"
# the checks that read a manifest's content (they cannot judge an unreadable one)
NEED_MANIFEST = {"test_a_new_manifest_version_at_least_every_8_layers",
                 "test_a_new_manifest_version_when_a_segment_is_added_or_completes",
                 "test_manifest_lists_the_object_digests", "test_a_deterministic_claim_holds_across_productions"}


def _function(test: dict[str, Any]) -> str:
    return str(test["nodeid"]).split("::")[-1].split("[", 1)[0]


def _by_verdict(run: Run) -> dict[str, list[dict[str, Any]]]:
    out: dict[str, list[dict[str, Any]]] = {}
    for t in run.coverage["tests"]:
        out.setdefault(t["verdict"], []).append(t)
    return out


def _no_harness_errors(run: Run) -> None:
    errors = [t["nodeid"] for t in run.coverage["tests"] if HARNESS_ERROR in t["message"] or "harness bug" in
              t["message"]]
    assert not errors, f"harness errors (a bug of kvconform, not a verdict): {errors}\n{run.output}"


@pytest.mark.slow
@covering(RUN_BOUND)
@pytest.mark.idle_bound
def test_a_correct_non_signing_cmd_publisher_passes(tmp_path: Path) -> None:
    """The testbed's defaults claim only mandatory behaviour (kvcs.publisher.signing false): a publisher without a
    producer key is green, the signed case not-applicable, and the report says signing was defaulted."""
    cmd = (f"cmd:{sys.executable} {HERE / 'cmd_nonsigning_publisher.py'} --relay {{relay}} --cache {{cache}} "
           "--token {token}")
    run = run_suite("kvcs-publisher", cmd, tmp_path, testbed=None)
    assert run.coverage, run.output
    verdicts = _by_verdict(run)
    assert run.code == 0 and not verdicts.get("fail") and not verdicts.get("inconclusive"), run.output
    signed = [t for t in run.coverage["tests"] if "[signed]" in t["nodeid"] or "signed_manifest" in t["nodeid"]]
    assert signed and all(t["verdict"] == "not-applicable" for t in signed), [(t["nodeid"], t["verdict"])
                                                                            for t in signed]
    assert all("kvcs.publisher.signing" in t["message"] for t in signed)
    assert "kvcs.publisher.signing" in run.coverage["meta"]["pics_defaulted"]
    assert len(verdicts.get("pass", [])) >= 40, run.output


# -- a consumer result the harness cannot read -------------------------------------------------------------

# what each bad result file names in the failure message
BAD_RESULTS = {"segments": "consumer result segments[0]", "digest": "consumer result layers[0]: 'zz'",
               "layers": "consumer result layers", "nested": "nested 1001 deep", "not-json": "not JSON",
               "bigint": "consumer result layers: key '777"}
# a few checks that need the result, for the kinds other than the issue's own (which runs the whole suite)
SOME_CHECKS = ("test_completed_cache_is_discovered_and_assembled", "test_nonzero_flags_are_ignored",
               "test_object_failing_a_check_is_discarded")


@pytest.mark.slow
@pytest.mark.parametrize("kind", sorted(BAD_RESULTS))
@covering(RUN_BOUND)
@pytest.mark.idle_bound
def test_an_unreadable_consumer_result_fails_each_check_naming_the_field(kind: str, tmp_path: Path) -> None:
    """Every check that needed the consumer's result fails (a DriverError): the message names the field, the
    blame is the check's first requirement; no check crashes into a harness error."""
    cmd = (f"cmd:{sys.executable} {HERE / 'cmd_bad_result_consumer.py'} --kind {kind} --relay {{relay}} "
           "--cache {cache} --out {out}")
    run = run_suite("kvcs-consumer", cmd, tmp_path, testbed=None, checks=() if kind == "segments" else SOME_CHECKS)
    assert run.coverage, run.output
    _no_harness_errors(run)
    verdicts = _by_verdict(run)
    failed = verdicts.get("fail", [])
    assert failed and run.code == 1, run.output
    for t in failed:
        assert t["blamed"] == t["reqs"][0], (t["nodeid"], t["blamed"], t["reqs"])
        assert BAD_RESULTS[kind] in t["message"] and "the consumer produced no result" in t["message"], t["message"]
    # the only checks left are those not applicable (capabilities a bare template lacks) and the one that needs
    # no result (the consumer opened no session to read its transport parameters from)
    others = {t["nodeid"].split("::")[-1]: t["verdict"] for t in run.coverage["tests"] if t["verdict"] != "fail"}
    assert set(others.values()) <= {"not-applicable", "inconclusive"}, others
    assert [n for n, v in others.items() if v == "inconclusive"] in ([], ["test_enough_unidirectional_streams_are_"
                                                                          "granted"]), others


def test_a_bad_result_file_is_a_reason_naming_the_field(tmp_path: Path) -> None:
    """The driver's reading of a result file: each bad kind gives no result and a reason naming what is off."""
    from tests.kvcs.cmd_bad_result_consumer import RESULTS

    for kind, text in RESULTS.items():
        out = tmp_path / f"{kind}.json"
        out.write_text(text, "utf-8")
        result, reason = _read_result(out)
        assert result is None and reason is not None and BAD_RESULTS[kind] in reason, (kind, reason)
    out = tmp_path / "binary.json"
    out.write_bytes(b"\xff\xfe{")
    assert _read_result(out)[1] is not None


JSON = st.recursive(st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=70),
                    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
                    max_leaves=20)
RESULT_LIKE = st.fixed_dictionaries({}, optional={"publication": JSON, "layers": JSON, "rejected": JSON,
                                                  "segments": JSON, "publications": JSON, "elapsed": JSON,
                                                  "gave_up": JSON, "mode": JSON})


@settings(max_examples=300, deadline=None)
@given(st.one_of(JSON, RESULT_LIKE))
def test_a_result_document_either_reads_or_names_its_field(doc: Any) -> None:
    """ConsumeResult.from_obj on any JSON document: a result, or a KvcsError naming the field; nothing else."""
    try:
        ConsumeResult.from_obj(doc)
    except KvcsError as exc:
        assert str(exc).startswith("consumer result"), exc


# -- a publisher whose manifest is hostile JSON -------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("publisher", ["NestedManifestPublisher", "HugeIntManifestPublisher"])
@covering(RUN_BOUND)
@pytest.mark.idle_bound
def test_a_hostile_manifest_fails_the_manifest_requirement(publisher: str, tmp_path: Path) -> None:
    """The manifest check fails blamed on KVCS-MANIFEST-JSON, once per case; the checks that need the manifest's
    content are inconclusive saying it cannot be read; no harness error; the rest pass."""
    run = run_suite("kvcs-publisher", f"python:tests.kvcs.hostile_publishers:{publisher}", tmp_path, testbed=None)
    assert run.coverage, run.output
    _no_harness_errors(run)
    verdicts = _by_verdict(run)
    failed = verdicts.get("fail", [])
    assert {_function(t) for t in failed} == {MANIFEST_CHECK}, [(t["nodeid"], t["blamed"]) for t in failed]
    assert all(t["blamed"] == "KVCS-MANIFEST-JSON" for t in failed), [t["blamed"] for t in failed]
    assert len(failed) == 2, [t["nodeid"] for t in failed]  # plain and segmented (signed: not declared)
    unsure = verdicts.get("inconclusive", [])
    assert {_function(t) for t in unsure} <= NEED_MANIFEST, [t["nodeid"] for t in unsure]
    assert all("cannot be read" in t["message"] for t in unsure), [t["message"] for t in unsure]
    assert len(verdicts.get("pass", [])) >= 35, run.output


def test_the_hostile_manifests_are_what_they_claim() -> None:
    """The targets' manifests really are 994 nested arrays and a 4301-digit "layers" (so the test above tests
    what it says)."""
    from kvconform.kvcs.content import example_spec
    from tests.kvcs.hostile_publishers import DEPTH, DIGITS, HugeIntManifestPublisher, NestedManifestPublisher

    spec = example_spec(layers=2, blocks=2)
    nested = NestedManifestPublisher(spec)
    body = nested.manifest_payload(nested.build_manifest())
    assert body == b"[" * DEPTH + b"]" * DEPTH
    huge = HugeIntManifestPublisher(spec)
    text = huge.manifest_payload(huge.build_manifest()).decode()
    assert f'"layers":{"9" * DIGITS},' in text
    with pytest.raises(ValueError):  # past CPython's default limit: json.loads itself refuses it
        json.loads(text)
    assert ROOT.is_dir()


@pytest.mark.slow
@covering(RUN_BOUND)
@pytest.mark.idle_bound
def test_a_publisher_that_publishes_nothing_fails_one_requirement(tmp_path: Path) -> None:
    """A publisher that announces and then publishes no object fails the completeness requirement
    (KVCS-TRACK-COMPLETE-OWN) once per case; the checks that judge objects have nothing to judge and say so
    (inconclusive), rather than each failing on its own first requirement."""
    run = run_suite("kvcs-publisher", "python:tests.kvcs.hostile_publishers:SilentPublisher", tmp_path, testbed=None)
    assert run.coverage, run.output
    _no_harness_errors(run)
    verdicts = _by_verdict(run)
    failed = verdicts.get("fail", [])
    assert {t["blamed"] for t in failed} == {"KVCS-TRACK-COMPLETE-OWN"}, [(t["nodeid"], t["blamed"]) for t in failed]
    assert {_function(t) for t in failed} == {"test_every_block_of_every_layer_is_published"}
    unsure = verdicts.get("inconclusive", [])
    assert unsure and all("no object" in t["message"] for t in unsure), {t["message"][:80] for t in unsure}
    assert run.code == 1


@pytest.mark.slow
@covering(RUN_BOUND)
@pytest.mark.idle_bound
def test_a_consumer_of_another_draft_is_named_once_on_the_alpn_rule(tmp_path: Path) -> None:
    """The relays' TLS refuses its ALPN: the first check fails on MOQT-SETUP-ALPN with the one line naming what was
    offered, every later one is inconclusive with that line (no missing layer blamed anywhere)."""
    run = run_suite("kvcs-consumer", "python:tests.kvcs.other_draft:OtherDraftConsumer", tmp_path, testbed=None,
                    checks=SOME_CHECKS)
    assert run.coverage, run.output
    _no_harness_errors(run)
    verdicts = _by_verdict(run)
    failed = verdicts.get("fail", [])
    assert len(failed) == 1 and failed[0]["blamed"] == "MOQT-SETUP-ALPN", failed
    line = "offered none of 'moqt-22': the handshake ended with TLS alert 120 no_application_protocol"
    assert line in failed[0]["message"], failed[0]["message"]
    later = verdicts.get("inconclusive", [])
    assert later and all(line in t["message"] for t in later), later
