"""The KBTP suites inside the testbed VM, on the kernel's own devices (issue 13 §2's "Done when"):

    kvconform run kbtp --testbed testbeds/rdma-vm.yaml --target rxe-ref     (and siw-ref)

(`kbtp`: the kbtp-target and kbtp-initiator suites in one run.) One boot runs both
(testbeds/rdma-vm/suites.sh); each test judges one suite of a report as a user reads it: no check
fails, and the only inconclusives are those the binding makes unobservable, each saying why
(tests/clean_runs.py; docs/interop-rdma.md lists them). The reports and logs are kept under the lane's
``--basetemp`` for the evidence. The runs are made once a session (tests/rdma_vm/lane.py): test_certified.py
merges them with the wire facing each device into the certification.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.clean_runs import VERBS, WIRE, unexpected

pytestmark = [pytest.mark.rdma_vm, pytest.mark.timeout(4000)]  # a VM boot and a suite run per test

RUNS = [(t, s) for t in ("rxe-ref", "siw-ref") for s in ("kbtp-target", "kbtp-initiator")]


@pytest.mark.parametrize(("target", "suite"), RUNS, ids=[f"{t}-{s}" for t, s in RUNS])
def test_suite_on_the_kernel_device(in_vm: dict[tuple[str, str], Any], target: str, suite: str) -> None:
    run = in_vm.get((target, suite))
    assert run is not None, f"{suite} on {target} did not run in the VM (see the lane's console)"
    doc, log = run["coverage"], Path(run["log"])
    tail = log.read_text(errors="replace")[-3000:] if log.is_file() else "(no log)"
    assert doc, f"{suite} on {target}: no coverage.json (exit {run['code']})\n{tail}"
    bad = unexpected(doc, WIRE + VERBS)
    assert run["code"] in (0, 1) and not bad, f"{suite} on {target} ({run['seconds']} s): {bad}\n{tail}"
    verdicts = doc["summary"]["verdicts"]
    assert verdicts.get("pass", 0) >= 10, verdicts
    print(f"{target} {suite}: {verdicts} in {run['seconds']} s")
