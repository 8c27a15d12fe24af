"""Checks that need what a verbs device hides end inconclusive with the reason, never pass (a false pass found on
rxe: with no one-sided operation visible, "the initiator never writes the ring" held vacuously).

The reference runs over `tests.rdma.blind`'s fabric, blind exactly where `VerbsFabric` is; the checks that judge
messages only still pass there."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.clean_runs import VERBS
from tests.mutants.runner import run_suite
from tests.spawn import covering

ONE_SIDED = ("test_direct_load_sequence", "test_direct_alloc_fetchadd", "test_direct_alloc_slot_reads",
             "test_direct_alloc_write_then_bind", "test_direct_alloc_leaves_the_ring_alone",
             "test_direct_alloc_ticket_wrap")
BY_MESSAGES = ("test_direct_alloc_frees", "test_direct_alloc_binds_in_own_range")
ATTACKS = ("test_roce_packet_dropped",)


def _verdicts(doc: dict[str, object]) -> dict[str, tuple[str, str]]:
    return {t["nodeid"].split("::")[-1]: (t["verdict"], str(t.get("message", "")))  # type: ignore[index]
            for t in doc["tests"]}  # type: ignore[attr-defined]


@pytest.mark.slow
@covering(600)
def test_initiator_checks_of_one_sided_operations_are_inconclusive_when_unseen(tmp_path: Path) -> None:
    pics = ("kbtp.initiator.binding=ib-rc", "kbtp.initiator.features=[DIRECT_LOAD, DIRECT_ALLOC]")
    run = run_suite("kbtp-initiator", "python:tests.rdma.blind:BlindInitiator", tmp_path, pics=pics,
                    checks=ONE_SIDED + BY_MESSAGES, timeout=600)
    got = _verdicts(run.coverage)
    assert set(got) == set(ONE_SIDED + BY_MESSAGES), (sorted(got), run.output)
    for name in ONE_SIDED:
        verdict, why = got[name]
        assert verdict == "inconclusive" and VERBS[0] in why and "blind roce fabric" in why, (name, verdict, why)
    for name in BY_MESSAGES:
        assert got[name][0] == "pass", (name, got[name])


@pytest.mark.slow
@covering(600)
def test_wire_attacks_are_inconclusive_where_no_frame_can_be_crafted(tmp_path: Path) -> None:
    pics = ("kbtp.target.binding=ib-rc",)
    run = run_suite("kbtp-target", "python:tests.rdma.blind:BlindTarget", tmp_path, pics=pics, checks=ATTACKS,
                    timeout=600)
    got = _verdicts(run.coverage)
    assert len(got) == 3, (got, run.output)
    for name, (verdict, why) in got.items():
        assert verdict == "inconclusive" and VERBS[1] in why, (name, verdict, why)
