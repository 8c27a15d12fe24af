"""The KBTP suites inside the testbed VM, on the kernel's own devices (issue 13 §2's "Done when"):

    kvconform run kbtp --testbed testbeds/rdma-vm.yaml --target rxe-ref     (and siw-ref)

(`kbtp`: the kbtp-target and kbtp-initiator suites in one run.) One boot runs both
(testbeds/rdma-vm/suites.sh); each test judges one suite of a report as a user reads it: no check
fails, and the only inconclusives are those the binding makes unobservable, each saying why
(tests/clean_runs.py; docs/interop-rdma.md lists them). The reports and logs are kept under the lane's
``--basetemp`` for the evidence.
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path
from typing import Any

import pytest

from kvconform.testbeds.rdma_vm.build import Artefacts
from kvconform.testbeds.rdma_vm.vm import VM
from tests.clean_runs import VERBS, WIRE, unexpected

pytestmark = [pytest.mark.rdma_vm, pytest.mark.timeout(4000)]  # a VM boot and a suite run per test

RUNS = [(t, s) for t in ("rxe-ref", "siw-ref") for s in ("kbtp-target", "kbtp-initiator")]
BOUND_S = 3000.0  # the two runs take about 7 min on one TCG vCPU; each is bounded inside (1200 s)
_RAN = re.compile(r"^SUITE-RAN (\S+) (\d+) (\d+)$")


@pytest.fixture(scope="module")
def in_vm(vm_image: Artefacts, tmp_path_factory: pytest.TempPathFactory) -> dict[tuple[str, str], Any]:
    """Boot once, run both targets' suites, bring back each run's exit status, seconds and coverage.json."""
    keep = tmp_path_factory.mktemp("in-vm")
    with VM(vm_image) as machine:
        try:
            res = machine.run("sh testbeds/rdma-vm/suites.sh", timeout=BOUND_S,
                              on_line=lambda s: print(f"vm| {s}", flush=True) if s.startswith("SUITE-") else None)
            shutil.copytree(res.run_dir / "results", keep, dirs_exist_ok=True)
        finally:
            machine.cleanup()
    assert not res.timed_out, f"the in-VM suites did not end within {BOUND_S:g} s:\n" + "\n".join(res.lines[-30:])
    out: dict[tuple[str, str], Any] = {}
    for line in res.lines:
        m = _RAN.match(line)
        if m:
            cov = keep / m[1] / "coverage.json"
            doc = json.loads(cov.read_text()) if cov.is_file() else {}
            for suite in ("kbtp-target", "kbtp-initiator"):  # the suite's checks live under kbtp/<role>/
                role = suite.removeprefix("kbtp-")
                tests = [t for t in doc.get("tests", []) if t["nodeid"].startswith(f"kbtp/{role}/")]
                verdicts: dict[str, int] = {}
                for t in tests:
                    verdicts[t["verdict"]] = verdicts.get(t["verdict"], 0) + 1
                out[(m[1], suite)] = {"code": int(m[2]), "seconds": int(m[3]), "log": keep / f"{m[1]}.log",
                                      "coverage": {"tests": tests, "summary": {"verdicts": verdicts}} if tests else {}}
    return out


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
