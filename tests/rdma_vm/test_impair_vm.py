"""The impairment grid on the kernel's devices (issue 23 item 5, the VM half; `tox -e impair-vm`): the reference
KBTP target gets no failure, and no inconclusive but those tests/clean_runs.py accepts, with `tc netem` on the
testbed VM's interfaces (kvconform.testbeds.rdma_vm.netem) at 1 % loss, 1 % reordering, 1 % duplication and
5 ms delay, each alone and together - as tests/kbtp/test_impair_grid.py judges the userspace half.

Per grid point, two boots, each test one, each holding the machine's VM lock for itself only (`vm_lock`).

- ``facing``: the reference served on rxe1 and siw1, netem on the VM's NICs facing the host (what the kernel
  device sends), the host's userspace harness running the kbtp-target suite at each (tests/rdma_vm/lane.py
  facing_runs);
- ``in-vm``: `kvconform run kbtp` (target and initiator) on siw0, netem on the VM's lo, which siw0's TCP streams
  cross both ways. rxe0 loops its packets back inside rdma_rxe, under no qdisc: it gets no run here (the
  counters in netem-stats.txt of a run show it; docs/interop-rdma.md "Under netem").

netem has no seed: a rerun replays the statistics of the link, not each packet's fate. By default each run takes
the session, operation and direct-access checks (GRID_CHECKS); KVCONFORM_IMPAIR_VM_FULL=1 runs the whole suites.
Each report's coverage.json records the qdisc in meta.netem; the VM's qdisc counters are kept beside it.
"""

from __future__ import annotations

import fcntl
import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from kvconform.rdma.wire.impair import GRID
from kvconform.testbeds.rdma_vm.build import Artefacts
from kvconform.testbeds.rdma_vm.netem import Netem
from tests.clean_runs import SLOW_TARGET, VERBS, WIRE, unexpected

from .disagreements import KNOWN
from .lane import facing_runs, in_vm_runs

pytestmark = [pytest.mark.rdma_vm, pytest.mark.timeout(4000)]  # a VM boot and suite runs per test

ENABLED = os.environ.get("KVCONFORM_IMPAIR_VM") == "1"
FULL = os.environ.get("KVCONFORM_IMPAIR_VM_FULL") == "1"
GRID_CHECKS = () if FULL else tuple(os.environ.get("KVCONFORM_IMPAIR_VM_CHECKS", "test_session,test_operations,"
                                                                      "test_direct").split(","))
REASONS = (*WIRE, *VERBS, *SLOW_TARGET)
LOCK = os.environ.get("KVCONFORM_RDMA_VM_LOCK", "/tmp/kvconform-vm.lock")  # empty: the caller holds it
LOCK_WAIT_S = 3600.0  # another engineer's VM run ahead of this one
skip_unless_enabled = pytest.mark.skipif(not ENABLED, reason="the VM grid: KVCONFORM_IMPAIR_VM=1 (tox -e impair-vm)")


@pytest.fixture
def vm_lock() -> Iterator[None]:
    """One VM on the machine at a time: flock on LOCK for this test's boot only, waiting at most LOCK_WAIT_S."""
    if not LOCK:
        yield
        return
    with open(LOCK, "a") as fh:
        taken = threading.Event()

        def take() -> None:
            fcntl.flock(fh, fcntl.LOCK_EX)
            taken.set()

        # flock has no timeout: it blocks in a daemon thread, this test waits for it bounded
        threading.Thread(target=take, daemon=True).start()
        assert taken.wait(LOCK_WAIT_S), f"{LOCK} was held for more than {LOCK_WAIT_S:g} s"
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def _clean(doc: dict[str, Any], code: int | None, what: str, output: str, known: dict[str, str],
           least: int = 5) -> str:
    """The verdict counts; asserts the run is clean but for the accepted inconclusives and recorded failures."""
    assert doc, f"{what}: no coverage.json (exit {code})\n{output}"
    assert doc.get("meta", {}).get("netem"), f"{what}: the report does not record the netem applied"
    bad = unexpected(doc, REASONS, known)
    assert code in (0, 1) and not bad, f"{what}: {bad}\n{output}"
    verdicts = doc["summary"]["verdicts"]
    assert verdicts.get("pass", 0) >= least, verdicts
    return str(verdicts)


@skip_unless_enabled
@pytest.mark.parametrize("point", list(GRID))
def test_facing_runs_under_netem(vm_image: Artefacts, vm_lock: None, point: str, tmp_path: Path) -> None:
    """The host's userspace RoCEv2 and iWARP harness against the reference on rxe1 and siw1, netem on their NICs."""
    netem = Netem.parse(GRID[point])
    runs = facing_runs(vm_image, tmp_path, roles=("target",), netem=netem, checks=GRID_CHECKS)
    stats = tmp_path / "vm" / "netem-now.txt"
    lines = []
    for name, run in sorted(runs.items()):
        r = run["run"]
        verdicts = _clean(r.coverage, r.code, f"{name} under netem {point}", r.output, KNOWN.get(name, {}))
        lines.append(f"{name} netem {point}: {verdicts} in {run['seconds']:.0f} s")
    print("\n".join(lines), f"\nqdisc counters: {stats}" if stats.is_file() else "")
    assert len(runs) == 2, sorted(runs)


@skip_unless_enabled
@pytest.mark.parametrize("point", list(GRID))
def test_in_vm_siw_under_netem(vm_image: Artefacts, vm_lock: None, point: str, tmp_path: Path) -> None:
    """`kvconform run kbtp` on siw0 inside the VM, netem on lo (siw0's TCP streams)."""
    netem = Netem.parse(GRID[point])
    start = time.monotonic()
    runs = in_vm_runs(vm_image, tmp_path, netem=netem, targets=("siw-ref",), checks=GRID_CHECKS)
    lines = []
    for suite in ("kbtp-target", "kbtp-initiator"):
        run = runs.get(("siw-ref", suite))
        assert run is not None, f"{suite} on siw0 did not run in the VM under netem {point}"
        log = Path(run["log"])
        tail = log.read_text(errors="replace")[-3000:] if log.is_file() else "(no log)"
        doc = run["coverage"]
        if doc:
            doc = {**doc, "meta": run["doc"].get("meta", {})}
        verdicts = _clean(doc, run["code"], f"{suite} on siw0 under netem {point}", tail, {},
                          least=5 if suite == "kbtp-target" else 1)
        lines.append(f"siw0 {suite} netem {point}: {verdicts}")
    print("\n".join(lines), f"\nboot and runs: {time.monotonic() - start:.0f} s; qdisc counters: "
          f"{tmp_path / 'netem-stats.txt'}")
