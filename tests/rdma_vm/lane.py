"""The rdma lane's runs, each made once a session and shared by the tests that judge them (one VM at a time):

- ``in_vm_runs``: one boot, `kvconform run kbtp` (both roles) against the reference on rxe0 and siw0, the harness
  on the same device through verbs (testbeds/rdma-vm/suites.sh): the primary path of each certification;
- ``facing_runs``: one boot serving the reference on rxe1 and siw1 (testbeds/rdma-vm/interop-serve.sh), and the
  host's harness running the kbtp-target suite at them over its userspace RoCEv2 link and userspace iWARP: the
  wire facing the device, which judges what verbs cannot see or craft (the wire attacks, the impairment checks);
  in the same boot the reference initiator on rxe1 and siw1 (forked per bed by the bridge's agent,
  testbeds/rdma_vm/bridge.py) runs the kbtp-initiator suite's direct checks against the harness's userspace target
  on the host: the wire facing the initiator, which sees the one-sided operations the device executes.

tests/rdma_vm/test_certified.py merges the two into one report per device and role (kvconform.reports.facing).
"""

from __future__ import annotations

import json
import re
import shutil
import socket
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kvconform.testbeds.rdma_vm.build import Artefacts
from kvconform.testbeds.rdma_vm.netem import META_ENV, Netem, vm_env
from kvconform.testbeds.rdma_vm.vm import VM, Links
from tests.mutants.runner import ROOT, run_suite
from tests.spawn import spawn_env

VM_TESTBED = ROOT / "testbeds" / "rdma-vm.yaml"
HOST_ADDRESS = "10.78.0.1"  # the host's end of the RoCEv2 segment (links.sh gives the VM 10.78.0.2)
# siw drops the FPDUs that arrive while it moves an accepted QP to RTS, and the stream hangs (interop-rdma #10):
# the userspace initiator sends its RTR this long after the MPA Reply
SIW_RTR_DELAY_MS = 200
READY_S = 300.0  # two servers starting in the VM (Python imports on one TCG vCPU)
SUITE_S = 1500.0
IN_VM_BOUND_S = 3000.0  # the two in-VM runs take about 11 min on one TCG vCPU; each is bounded inside (1200 s)
ROCE_FEATURES = "DIRECT_LOAD,DIRECT_ALLOC,RECORD_COMPLETION,ADDR_LE"  # rxe: atomics, windows (testbeds/rdma-vm.yaml)
IWARP_FEATURES = "DIRECT_LOAD,ADDR_LE"  # siw: no atomics, no memory windows
# The black-box race windows on the facing wire: the FREE's two slot writes are one turn of the served target's
# loop apart, so a Read lands between them a few times a minute when CI loads both cores (2 of 43 attempts in 20 s
# measured): the facing run, which is the path that can see it, gets a minute for each window ...
FACING_RACE_BUDGET_S = 60
# ... and the in-VM runs, whose harness shares the target's one loop (its Reads are posted only when the target's
# turn is over, so those two windows never open there: 0 of 33 and 0 of 39 measured) spend less on them
IN_VM_RACE_BUDGET_S = 8
_RAN = re.compile(r"^SUITE-RAN (\S+) (\d+) (\d+)$")


def _pics(profile: str, features: str) -> tuple[str, ...]:
    """The served reference's PICS, and a lane's budgets: the Generation drive cannot reach the 16-bit wrap across
    the VM in its 150 s (about 14,000 of 32,768 cycles; the in-VM runs reach it), so it is not spent here, and
    the black-box race checks repeat 8 times, not 20 (issue 13: the lane must fit CI's time)."""
    return (f"kbtp.target.binding={profile}", f"kbtp.target.features=[{features.replace(',', ', ')}]",
            "kbtp.target.generation_cycles=64", "kbtp.target.interleavings=8")


ROCE_PICS = _pics("ib-rc", ROCE_FEATURES)
IWARP_PICS = _pics("rdmap-5040", IWARP_FEATURES)
BRIDGE_GUEST_PORT = 18516  # the bridge's agent in the VM (testbeds/rdma-vm/interop-serve.sh)
# The initiator's facing runs: the checks the in-VM run leaves inconclusive (the initiator's one-sided operations,
# which the device executes unseen); the rest of the suite is judged there already. All of test_direct.py on both
# (siw1 has no DIRECT_ALLOC: its allocation checks are not applicable): its direct-load race, inconclusive on verbs,
# opens its window deterministically over the facing wire (3 of 7 direct loads an interleaving, on rxe1 and siw1
# alike: 120 of 280 in 40 interleavings, about 1.2 s each through the bridge), so it repeats as often as the target
# runs' races (INITIATOR_INTERLEAVINGS)
ROCE_INITIATOR_CHECKS = ("test_direct",)
IWARP_INITIATOR_CHECKS = ("test_direct",)
INITIATOR_INTERLEAVINGS = 8
INITIATOR_SUITE_S = 600.0


def _initiator_pics(profile: str, features: str) -> tuple[str, ...]:
    """The in-VM entries' kbtp.initiator PICS (testbeds/rdma-vm.yaml rxe-ref, siw-ref), for the facing run, and its
    budget: the direct-load race repeats INITIATOR_INTERLEAVINGS times, not 40 (issue 13: the lane must fit CI's
    time)."""
    return (f"kbtp.initiator.binding={profile}", f"kbtp.initiator.features=[{features.replace(',', ', ')}]",
            f"kbtp.initiator.interleavings={INITIATOR_INTERLEAVINGS}")


def bridge_command(port: int, profile: str) -> str:
    """The kbtp-initiator `cmd:` target of the reference initiator in the VM, through the bridge on ``port``."""
    return (f"cmd:{sys.executable} -m kvconform.testbeds.rdma_vm.bridge relay --port {port} --target {{target}} "
            f"--initiator-id {{initiator_id}} --features={{features}} --profile {profile}")


def _free_port(kind: int) -> int:
    with socket.socket(socket.AF_INET, kind) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass(frozen=True)
class Ports:
    """The host's 127.0.0.1 ports of one VM's links."""

    link_host: int  # the RoCEv2 segment: this end's UDP port ...
    link_qemu: int  # ... and qemu's
    rxe: int  # forwarded to the target on rxe1's out-of-band exchange (guest 10.0.2.15:18515)
    siw: int  # forwarded to the target on siw1's rdma_cm listener (guest 10.0.2.15:7471)
    bridge: int  # forwarded to the bridge's agent (guest 10.0.2.15:BRIDGE_GUEST_PORT)

    @classmethod
    def pick(cls) -> Ports:
        return cls(_free_port(socket.SOCK_DGRAM), _free_port(socket.SOCK_DGRAM), _free_port(socket.SOCK_STREAM),
                   _free_port(socket.SOCK_STREAM), _free_port(socket.SOCK_STREAM))

    @property
    def links(self) -> Links:
        return Links(roce=(self.link_host, self.link_qemu),
                     forwards=((self.rxe, 18515), (self.siw, 7471), (self.bridge, BRIDGE_GUEST_PORT)))

    @property
    def ether(self) -> str:
        return f"127.0.0.1:{self.link_host},127.0.0.1:{self.link_qemu}"


def console(line: str) -> None:
    if line.startswith(("INTEROP", "LINKS", "SUITE", "NETEM")):
        print(f"vm| {line}", flush=True)


def keep_results(results: Path, into: Path) -> None:
    if results.is_dir():
        shutil.copytree(results, into, dirs_exist_ok=True)


def in_vm_runs(image: Artefacts, keep: Path, *, netem: Netem | None = None, targets: tuple[str, ...] = (),
               checks: tuple[str, ...] = ()) -> dict[tuple[str, str], Any]:
    """Boot once, run both targets' suites; per (target, suite): the exit status, seconds, log, the suite's part
    of coverage.json (``coverage``), the whole document (``doc``) and the report folder (``dir``). ``netem``: on
    the VM's lo first (testbeds/rdma-vm/netem.sh; its counters in ``keep``/netem-stats.txt); ``targets`` (default
    both) and ``checks`` (-k) narrow the runs."""
    select = f"KVCONFORM_VM_SUITE_K='{' or '.join(checks)}' " if checks else ""
    with VM(image) as machine:
        try:
            res = machine.run(f"{vm_env(netem)}{select}"
                              f"KVCONFORM_VM_SUITE_ARGS='--pics-set kbtp.target.race_budget_s={IN_VM_RACE_BUDGET_S}' "
                              f"sh testbeds/rdma-vm/suites.sh {' '.join(targets)}", timeout=IN_VM_BOUND_S,
                              on_line=console)
            shutil.copytree(res.run_dir / "results", keep, dirs_exist_ok=True)
        finally:
            machine.cleanup()
    assert not res.timed_out, f"the in-VM suites did not end within {IN_VM_BOUND_S:g} s:\n" + "\n".join(res.lines[-30:])
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
                                      "coverage": {"tests": tests, "summary": {"verdicts": verdicts}} if tests else {},
                                      "doc": doc, "dir": keep / m[1]}
    return out


def facing_runs(image: Artefacts, keep: Path, *, roles: tuple[str, ...] = ("target", "initiator"),
                netem: Netem | None = None, checks: tuple[str, ...] = ()) -> dict[str, Any]:
    """The VM serving the reference on rxe1 and siw1; the host's harness runs the kbtp-target suite at each over
    its userspace binding (every packet the target sends and every check of what it receives is the kernel's),
    and the kbtp-initiator suite's direct checks with the reference initiator on each (through the bridge) facing
    its userspace target. Per run (``host-roce-to-rxe1``, ``host-iwarp-to-siw1``, ``rxe1-to-host-roce``,
    ``siw1-to-host-iwarp``; ``roles`` limits them): the tests.mutants.runner Run, its URL (the cmd: template) and
    its report folder, and ``seconds``. The VM is stopped before this returns. ``netem``: on the VM's two NICs
    facing the host (what the VM sends), recorded in each report's meta; ``checks`` (-k) narrows the target runs."""
    ports = Ports.pick()
    # the host's runs record what the link did in their coverage.json (the in-VM script exports it for its own)
    noted = None if netem is None else {**spawn_env(), META_ENV: netem.describe("the VM's NICs facing the host "
                                                                                 "(what the VM sends)")}
    runs: dict[str, tuple[str, str, tuple[str, ...], tuple[str, ...], float, tuple[str, ...]]] = {}
    if "target" in roles:
        runs["host-roce-to-rxe1"] = ("kbtp-target", f"kbtp+roce://127.0.0.1:{ports.rxe}?ether={ports.ether}&"
                                     f"address={HOST_ADDRESS}", ROCE_PICS, checks, SUITE_S, ())
        runs["host-iwarp-to-siw1"] = ("kbtp-target", f"kbtp+iwarp://127.0.0.1:{ports.siw}?rtr_delay_ms="
                                      f"{SIW_RTR_DELAY_MS}", IWARP_PICS, checks, SUITE_S, ())
    if "initiator" in roles:
        # rxe1 reaches the harness target's RoCEv2 packets on the segment (its out-of-band exchange and siw1's
        # rdma_cm stream go through qemu's user-mode network to the host's 127.0.0.1)
        link = ("--kbtp-harness-link", f"ether={ports.ether}&address={HOST_ADDRESS}")
        runs["rxe1-to-host-roce"] = ("kbtp-initiator", bridge_command(ports.bridge, "ib-rc"),
                                     _initiator_pics("ib-rc", ROCE_FEATURES), ROCE_INITIATOR_CHECKS, INITIATOR_SUITE_S,
                                     link)
        runs["siw1-to-host-iwarp"] = ("kbtp-initiator", bridge_command(ports.bridge, "rdmap-5040"),
                                      _initiator_pics("rdmap-5040", IWARP_FEATURES), IWARP_INITIATOR_CHECKS,
                                      INITIATOR_SUITE_S, ())
    out: dict[str, Any] = {}
    with VM(image, links=ports.links) as machine:
        try:
            machine.start(f"{vm_env(netem)}sh testbeds/rdma-vm/interop-serve.sh 3000", on_line=console)
            ready = machine.wait_for(r"INTEROP-(SERVING|FAIL)", READY_S)
            assert ready[1] == "SERVING", "\n".join(machine.lines[-40:])
            for name, (suite, url, pics, checks, bound, extra) in runs.items():
                rdir = keep / name
                budget = (f"kbtp.target.race_budget_s={FACING_RACE_BUDGET_S}",) if suite == "kbtp-target" else ()
                start = time.monotonic()
                run = run_suite(suite, url, rdir, pics=(*pics, *budget), checks=checks, testbed=VM_TESTBED,
                                timeout=bound, env=noted, extra=extra)
                seconds = time.monotonic() - start
                print(f"facing run {name}: exit {run.code} in {seconds:.0f} s", flush=True)
                out[name] = {"run": run, "url": url, "dir": rdir, "seconds": seconds}
        finally:
            machine.stop()
            keep_results(machine.run_dir / "results", keep / "vm")
            machine.cleanup()
    return out
