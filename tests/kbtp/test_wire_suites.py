"""The KBTP suites over the wire (issue 12's "Done when"): `kvconform run kbtp-target --target kbtp+iwarp://...`
and `kbtp+roce://...` against `kvconform serve kbtp-target`, the kbtp-initiator suite against the reference
initiator as a `cmd:` process over both bindings, and the in-process reference and mutants over loopback sockets
(`--kbtp-wire`), every feature on and each off. Each run goes through the `kvconform` command as a user runs it.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.clean_runs import assert_clean
from tests.lanes import grid_point
from tests.mutants import kbtp as kbtp_mutants
from tests.mutants.runner import run_suite
from tests.served import served
from tests.spawn import covering

WIRES = ("iwarp", "roce")
TICKET_TIMEOUT_MS = 250
WIRE_RUN_TIMEOUT_S = 600  # a suite over a userspace wire binding
SUITE_RUN_TIMEOUT_S = 300  # a whole suite through processes and sockets: ~1 min here, twice that on a loaded 2 cores
FEATURES = ["DIRECT_LOAD", "DIRECT_ALLOC", "ADDR_LE"]
IB_FEATURES = [*FEATURES, "RECORD_COMPLETION"]


def _features(wire: str, without: str | None = None) -> list[str]:
    return [f for f in (FEATURES if wire == "iwarp" else IB_FEATURES) if f != without]


def _profile(wire: str) -> str:
    return "rdmap-7306" if wire == "iwarp" else "ib-rc"


def _pics(role: str, wire: str, features: list[str]) -> tuple[str, ...]:
    pics = [f"kbtp.{role}.binding={_profile(wire)}", f"kbtp.{role}.features=[{', '.join(features)}]"]
    if role == "target":  # a short Ticket Timeout: over the wire the suites wait for it in real time
        pics += ["kbtp.target.interleavings=10", f"kbtp.target.ticket_timeout_ms={TICKET_TIMEOUT_MS}"]
    return tuple(pics)


@pytest.fixture
def served_target(request: pytest.FixtureRequest) -> Iterator[str]:
    """`kvconform serve kbtp-target` on 127.0.0.1 (ephemeral ports) with the features the test names; always
    stopped. Its URL."""
    wire, features = request.param
    with served("kbtp-target", "--binding", wire, "--port", "0", "--udp-port", "0", "--profile", _profile(wire),
                f"--features={','.join(features)}", "--ticket-timeout-ms", str(TICKET_TIMEOUT_MS)) as address:
        yield f"kbtp+{wire}://{address}"


@pytest.mark.slow
@covering(SUITE_RUN_TIMEOUT_S)
@pytest.mark.parametrize("served_target", [(w, _features(w)) for w in WIRES], indirect=True, ids=WIRES)
def test_target_suite_passes_against_the_served_reference(served_target: str, tmp_path: Path) -> None:
    wire = served_target.split("+", 1)[1].split(":", 1)[0]
    run = run_suite("kbtp-target", served_target, tmp_path, pics=_pics("target", wire, _features(wire)),
                    timeout=SUITE_RUN_TIMEOUT_S)
    assert_clean(run, f"kbtp-target against {served_target}")
    _assert_certified(run, f"kbtp-target against {served_target}")


@pytest.mark.slow
@covering(SUITE_RUN_TIMEOUT_S)
@pytest.mark.parametrize("wire", WIRES)
def test_initiator_suite_passes_against_the_reference_as_a_process(wire: str, tmp_path: Path) -> None:
    # no {initiator_id}: the process generates its own, so the entropy check judges the initiator's
    template = (f"cmd:{sys.executable} -m kvconform serve kbtp-initiator --target {{target}} --profile "
                f"{_profile(wire)} --features={{features}}")
    # A process starts per interleaving of the direct-load race: 16, not 40 (each accepts a load with p ~ 0.4)
    pics = (*_pics("initiator", wire, _features(wire)), "kbtp.initiator.interleavings=16")
    run = run_suite("kbtp-initiator", template, tmp_path, pics=pics, timeout=SUITE_RUN_TIMEOUT_S)
    assert_clean(run, f"kbtp-initiator against the reference initiator process over {wire}")
    _assert_certified(run, f"kbtp-initiator against the reference initiator process over {wire}")


KV_BLOCK = 2 << 20  # the KV block a serving engine moves (16 tokens of 32 layers x 8 heads x 128 x fp16, K and V)
# Declared geometries a NIC vendor serves, each once a false verdict of the reference (serve's options, PICS):
VENDOR_GEOMETRIES: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    # a LOAD is ~2048 RoCEv2 packets in one burst: once RETRY_EXC_ERR (the harness's receive queue dropped most, and
    # the sender's retry count ran out though each go-back-N round got further)
    "kv-blocks-of-2MiB": (
        ("--pool", f"{KV_BLOCK},22,6,8"),
        (f"kbtp.target.pool={{block_size: {KV_BLOCK}, blocks: 22, shared_blocks: 6, ring_slots: 8}}",)),
    # hundreds of blocks per quota: once a harness error at quota 256 and 'the target hung' for the harness's own
    # repetitions of test_seeded_interleavings (~5 min)
    "quota-256-of-a-shared-ring-of-1024": (
        ("--pool", "4096,4096,1024,1024", "--quota", "256", "--handle-count", "1024"),
        ("kbtp.target.pool={block_size: 4096, blocks: 4096, shared_blocks: 1024, ring_slots: 1024}",
         "kbtp.target.quota=256", "kbtp.target.handle_count=1024")),
    # each wait for the Ticket Timeout is real time: once 12 runs of the bind race, past the check's bound (~4 min)
    "ticket-timeout-30s": (("--ticket-timeout-ms", "30000"), ("kbtp.target.ticket_timeout_ms=30000",)),
}


@pytest.mark.slow
@covering(3 * SUITE_RUN_TIMEOUT_S)
@pytest.mark.parametrize("wire", [grid_point(w, id=w, sampled=False) for w in WIRES])
@pytest.mark.parametrize("geometry", sorted(VENDOR_GEOMETRIES))
def test_target_suite_passes_at_a_vendors_geometry(geometry: str, wire: str, tmp_path: Path) -> None:
    """The served reference at a geometry a NIC vendor declares passes and is certified."""
    options, pics = VENDOR_GEOMETRIES[geometry]
    with served("kbtp-target", "--binding", wire, "--port", "0", "--udp-port", "0", "--profile", _profile(wire),
                f"--features={','.join(_features(wire))}", "--ticket-timeout-ms", str(TICKET_TIMEOUT_MS),
                *options) as address:
        run = run_suite("kbtp-target", f"kbtp+{wire}://{address}", tmp_path,
                        pics=(*_pics("target", wire, _features(wire)), *pics), timeout=3 * SUITE_RUN_TIMEOUT_S)
    assert_clean(run, f"kbtp-target against the served reference over {wire} at {geometry}")
    _assert_certified(run, f"kbtp-target against the served reference over {wire} at {geometry}")


def _assert_certified(run: object, what: str) -> None:
    """A black box reached only over the wire earns PASSED (issue 23's Done-when): every mandatory requirement its
    checks reached passed, none inconclusive, whatever wire reasons assert_clean accepts for single checks."""
    verdict = run.coverage.get("verdict", {})  # type: ignore[attr-defined]
    assert verdict.get("status") == "PASSED", f"{what}: {verdict}"


# The default run's sample of the loopback grid below: each role on each wire once, each feature off once (every
# feature on is what the served certifications above run); the other 20 points with tox -e grids.
LOOPBACK_SAMPLE = {("target", "iwarp", "DIRECT_ALLOC"), ("target", "roce", "ADDR_LE"),
                   ("initiator", "iwarp", "DIRECT_LOAD"), ("initiator", "roce", "DIRECT_ALLOC")}


@pytest.mark.slow
@pytest.mark.parametrize(("role", "wire", "without"), [
    grid_point(r, w, f, id=f"{r}-{w}-{f}", sampled=(r, w, f) in LOOPBACK_SAMPLE)
    for r in ("target", "initiator") for w in WIRES for f in (None, *FEATURES)])
@covering(WIRE_RUN_TIMEOUT_S)
def test_reference_passes_over_loopback_sockets(role: str, wire: str, without: str | None, tmp_path: Path) -> None:
    """The in-process reference through the wire binding, every feature on and each off."""
    run = _run_wire(f"kbtp-{role}", "reference", tmp_path, wire, _pics(role, wire, _features(wire, without)))
    assert_clean(run, f"kbtp-{role} reference over {wire} without {without}")


# Mutants over the wire, each binding: the suites still catch what they claim when real wire formats carry the
# exchange (tests/test_mutants_kbtp.py catches every mutant on the emulated fabric).
WIRE_MUTANTS = ("NoQuotaCheck", "RequestsWithStatus", "AdvertisesRecordsOnRdmap")


@pytest.mark.slow
@pytest.mark.parametrize("wire", WIRES)
@pytest.mark.parametrize("name", WIRE_MUTANTS)
@covering(WIRE_RUN_TIMEOUT_S)
def test_mutant_is_caught_over_the_wire(name: str, wire: str, tmp_path: Path) -> None:
    m = kbtp_mutants.MUTANTS[name]
    if name == "AdvertisesRecordsOnRdmap" and wire != "iwarp":
        pytest.skip("an RDMAP rule: only the iWARP binding carries it")
    role = m.suite.removeprefix("kbtp-")
    pics = (*m.pics, f"kbtp.{role}.binding={_profile(wire)}")
    run = _run_wire(m.suite, f"python:tests.mutants.kbtp:{name}", tmp_path, wire, pics, m.checks)
    doc = run.coverage  # type: ignore[attr-defined]
    assert doc, run.output  # type: ignore[attr-defined]
    blamed = {t.get("blamed") for t in doc["tests"] if t["verdict"] == "fail"}
    assert m.requirement in blamed, f"{name} over {wire}: failures blame {blamed}\n{run.output}"  # type: ignore


def _run_wire(suite: str, target: str, tmp_path: Path, wire: str, pics: tuple[str, ...],
              checks: tuple[str, ...] = ()) -> object:
    return run_suite(suite, target, tmp_path, pics=pics, checks=checks, timeout=WIRE_RUN_TIMEOUT_S,
                     extra=("--kbtp-wire", wire))


# Issue 23: the named free-path races and the ring geometries judged from outside, against targets served in their
# own process (the entry order by holding the writer's RDMA Read Response, targets/kbtp_order.py). A bounded sample:
# two openings of each window (the certification default is three) within 30 s.
RACE_CHECKS = ("test_deferred_free_example", "test_free_updates_entry_before_ring",
               "test_free_writes_block_before_sequence", "test_entry_written_after_data", "test_shared_ring_geometries")
RACE_PICS = ("kbtp.target.race_windows=2", "kbtp.target.race_budget_s=30")
BLACK_BOX_RUN_TIMEOUT_S = 300
# Served over RoCEv2, each must fail on the rule it breaks (tests/mutants/kbtp.py; its ReferenceTarget subclass is
# what `kvconform serve kbtp-target --target-class` runs)
RACE_MUTANTS = ("OverwritesUnconsumedSlot", "FreeReturnsBeforeEntryUpdate", "SequenceBeforeBlock", "EntryBeforeData")


@pytest.mark.slow
@covering(BLACK_BOX_RUN_TIMEOUT_S)
@pytest.mark.parametrize("served_target", [(w, _features(w)) for w in WIRES], indirect=True, ids=WIRES)
def test_served_reference_passes_the_races_and_rings_from_outside(served_target: str, tmp_path: Path) -> None:
    wire = served_target.split("+", 1)[1].split(":", 1)[0]
    run = run_suite("kbtp-target", served_target, tmp_path, pics=(*_pics("target", wire, _features(wire)), *RACE_PICS),
                    checks=RACE_CHECKS, timeout=BLACK_BOX_RUN_TIMEOUT_S)
    tests = run.coverage.get("tests", [])  # type: ignore[attr-defined]
    assert tests, run.output  # type: ignore[attr-defined]
    verdicts = {t["nodeid"].split("::")[-1]: (t["verdict"], t.get("message", "")) for t in tests}
    bad = {k: v for k, v in verdicts.items() if v[0] in ("fail", "inconclusive")}
    assert not bad, f"{served_target}: {bad}"
    for check in RACE_CHECKS[:4]:
        verdict, message = verdicts[check]
        assert verdict == "pass" and message.startswith("black box: window opened"), (check, verdict, message)
    # the declared geometry: its shared ring (F 6 < N 8) and its partitions (F == N == 2) reached, the rest N/A
    assert verdicts["test_shared_ring_geometries[declared]"][0] == "pass"
    assert verdicts["test_shared_ring_geometries[F2-N2]"] == (
        "pass", "geometry reached: DIRECT_ALLOC partition ring F 2, N 2 (F == N, n = 1), announced in HELLO_ACK")
    assert verdicts["test_shared_ring_geometries[F3-N4]"][0] == "not-applicable"
    assert verdicts["test_shared_ring_geometries[F4-N4]"][0] == "not-applicable"


@pytest.mark.slow
@covering(BLACK_BOX_RUN_TIMEOUT_S)
@pytest.mark.parametrize("name", RACE_MUTANTS)
def test_race_mutant_served_over_roce_fails_on_its_rule(name: str, tmp_path: Path) -> None:
    m = kbtp_mutants.MUTANTS[name]
    cls = getattr(kbtp_mutants, name).target_class
    with served("kbtp-target", "--binding", "roce", "--port", "0", "--udp-port", "0", "--profile", _profile("roce"),
                f"--features={','.join(_features('roce'))}", "--ticket-timeout-ms", str(TICKET_TIMEOUT_MS),
                "--target-class", f"{cls.__module__}:{cls.__name__}") as address:
        run = run_suite(m.suite, f"kbtp+roce://{address}", tmp_path,
                        pics=(*_pics("target", "roce", _features("roce")), "kbtp.target.race_budget_s=20"),
                        checks=m.checks, timeout=BLACK_BOX_RUN_TIMEOUT_S)
    doc = run.coverage  # type: ignore[attr-defined]
    assert doc, run.output  # type: ignore[attr-defined]
    failed = {t["nodeid"].split("::")[-1]: t.get("blamed") for t in doc["tests"] if t["verdict"] == "fail"}
    assert failed == {m.checks[0]: m.requirement}, f"{name} over kbtp+roce://: {failed}\n{run.output}"  # type: ignore
