"""Host <-> VM interop (issue 13 §3): the userspace bindings on the host against the kernel's rxe and siw.

The VM gets two NICs (testbeds/rdma_vm/vm.py Links, testbeds/rdma-vm/links.sh): a RoCEv2 segment whose frames
qemu's socket netdev carries to the host's userspace binding over loopback (rxe1 in the VM at 10.78.0.2, the
host's `kvconform.rdma.roce.ethernet` link at 10.78.0.1), and qemu's user-mode network, whose TCP ports are
forwarded from 127.0.0.1 (the out-of-band QP exchange, and siw1's iWARP streams).

- The host's harness (userspace RoCEv2 and iWARP) runs the kbtp-target suite, wire attacks included, against the
  reference target served on rxe1 and siw1: every packet the target sends and every check of what it receives
  is the kernel's.
- The VM's harness on rxe1 and siw1 (verbs) runs the kbtp-target suite against the reference target served by
  the host's userspace bindings: every packet the harness sends is the kernel's.

A failing check is either a bug of ours (fixed) or a kernel disagreement recorded in `disagreements.py` with its
evidence (docs/interop-rdma.md); a recorded one that stops failing fails the test, so the record stays true.
"""

from __future__ import annotations

import json
import os
from typing import Any

import pytest

from kvconform.testbeds.rdma_vm.build import Artefacts
from kvconform.testbeds.rdma_vm.vm import HOST_FROM_GUEST, VM
from tests.clean_runs import SLOW_TARGET, VERBS, WIRE, unexpected
from tests.served import served

from .disagreements import KNOWN, still_failing
from .lane import (
    HOST_ADDRESS,
    IWARP_FEATURES,
    IWARP_PICS,
    READY_S,
    ROCE_FEATURES,
    ROCE_PICS,
    Ports,
    console,
    keep_results,
)

pytestmark = [pytest.mark.rdma_vm, pytest.mark.timeout(4000)]  # a VM boot and a suite run per test


# ---- the host's harness against the targets served in the VM (tests/rdma_vm/lane.py facing_runs) -------------


def test_host_roce_harness_against_the_target_on_rxe(facing: dict[str, Any]) -> None:
    """Userspace RoCEv2 (frames on the segment) -> rxe1; the RoCEv2 wire attacks aim at the kernel's rxe."""
    run = facing["host-roce-to-rxe1"]["run"]
    _judge(run.coverage, run.code, run.output, "host-roce-to-rxe1", reasons=WIRE + SLOW_TARGET)


def test_host_iwarp_harness_against_the_target_on_siw(facing: dict[str, Any]) -> None:
    """Userspace iWARP (MPA/DDP/RDMAP over TCP) -> siw1; the iWARP wire attacks aim at the kernel's siw."""
    run = facing["host-iwarp-to-siw1"]["run"]
    _judge(run.coverage, run.code, run.output, "host-iwarp-to-siw1", reasons=WIRE + SLOW_TARGET)


# ---- the VM's harness (verbs) against the targets served by the host's userspace bindings -------------------


# CI's lane takes siw1's run (~3 min); rxe1's (~6 min on one TCG vCPU) only with KVCONFORM_RDMA_LANE_FULL=1 (`tox -e
# rdma`): the lane is CI's longest path, and CI still has the verbs harness on rxe (the in-VM rxe0 run) and rxe
# against the host's RoCEv2 binding both ways (the facing runs).
VM_HARNESS_RUNS = ("rxe1-to-host-roce", "siw1-to-host-iwarp")
VM_HARNESS_SAMPLE = VM_HARNESS_RUNS if os.environ.get("KVCONFORM_RDMA_LANE_FULL") == "1" else ("siw1-to-host-iwarp",)


@pytest.fixture(scope="module")
def host_serving(vm_image: Artefacts, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The host serves the reference target over userspace RoCEv2 (on the segment) and iWARP; the VM runs the
    kbtp-target suite from rxe1 and from siw1 (VM_HARNESS_SAMPLE) against them. Each run's exit status and
    coverage.json."""
    ports = Ports.pick()
    keep = tmp_path_factory.mktemp("host-serving")
    with served("kbtp-target", "--binding", "roce", "--port", "0", "--profile", "ib-rc", "--features", ROCE_FEATURES,
                "--ether", ports.ether, "--ether-address", HOST_ADDRESS) as roce, \
            served("kbtp-target", "--binding", "iwarp", "--port", "0", "--profile", "rdmap-5040",
                   "--features", IWARP_FEATURES) as iwarp:
        runs = {"rxe1-to-host-roce": (f"kbtp+verbs://{HOST_FROM_GUEST}:{roce.rsplit(':', 1)[1]}?device=rxe1",
                                      ROCE_PICS),
                "siw1-to-host-iwarp": (f"kbtp+verbs://{HOST_FROM_GUEST}:{iwarp.rsplit(':', 1)[1]}?device=siw1"
                                       "&local=10.0.2.15", IWARP_PICS)}
        runs = {name: run for name, run in runs.items() if name in VM_HARNESS_SAMPLE}
        lines = [". testbeds/rdma-vm/links.sh"]
        for name, (url, pics) in runs.items():
            sets = " ".join(f"--pics-set '{p}'" for p in pics)
            lines.append(f"timeout -s KILL 1200 python3 -m kvconform run kbtp-target --testbed testbeds/rdma-vm.yaml "
                         f"--target '{url}' {sets} --report-dir $KVCONFORM_VM_RUN/results/{name} -q "
                         f"> $KVCONFORM_VM_RUN/results/{name}.log 2>&1; echo \"SUITE-RAN {name} $?\"")
        with VM(vm_image, links=ports.links) as machine:
            try:
                res = machine.run("\n".join(lines), timeout=2 * 1200 + READY_S, on_line=console)
            finally:
                keep_results(machine.run_dir / "results", keep)
                machine.cleanup()
    assert not res.timed_out, "\n".join(res.lines[-40:])
    out: dict[str, Any] = {}
    for name in runs:
        cov = keep / name / "coverage.json"
        log = keep / f"{name}.log"
        code = next((int(ln.rsplit(" ", 1)[1]) for ln in res.lines if ln.startswith(f"SUITE-RAN {name} ")), None)
        out[name] = (json.loads(cov.read_text()) if cov.is_file() else {}, code,
                     log.read_text(errors="replace")[-3000:] if log.is_file() else "(no log)")
    return out


_OUTSIDE = pytest.mark.skip(reason="outside CI's sample of the lane: KVCONFORM_RDMA_LANE_FULL=1 (tox -e rdma) runs it")


@pytest.mark.parametrize("name", [pytest.param(n, marks=() if n in VM_HARNESS_SAMPLE else _OUTSIDE)
                                  for n in VM_HARNESS_RUNS])
def test_vm_verbs_harness_against_the_host_target(host_serving: dict[str, Any], name: str) -> None:
    doc, code, tail = host_serving[name]
    _judge(doc, code, tail, name, reasons=WIRE + VERBS + SLOW_TARGET)


def _judge(doc: dict[str, Any], code: int | None, output: str, run: str, reasons: tuple[str, ...] = WIRE) -> None:
    """Clean but for the documented inconclusives and the recorded kernel disagreements, which must still fail."""
    assert doc, f"{run}: no coverage.json (exit {code})\n{output}"
    known = KNOWN.get(run, {})
    bad = unexpected(doc, reasons, known)
    assert code in (0, 1) and not bad, f"{run}: {bad}\n{output}"
    gone = [check for check in known if not still_failing(doc, check)]
    assert not gone, f"{run}: recorded disagreements no longer fail, update disagreements.py and the doc: {gone}"
    assert doc["summary"]["verdicts"].get("pass", 0) >= 10, doc["summary"]
    print(f"{run}: {doc['summary']['verdicts']}")
