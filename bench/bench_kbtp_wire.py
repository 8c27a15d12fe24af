"""KBTP over the wire bindings, against the emulated fabric in the same run (issue 12).

    python bench/bench_kbtp_wire.py [--quick] [--ops N] [--repeat R] [--blocks 4096,32768] [--json FILE]
        [--only roce,roce-served] [--verbs rxe0,siw0 [--verbs-address 10.77.0.1]]

Operations/s and MB/s of LOAD, ALLOC_STORE (Data Descriptor path: the target RDMA Reads the block) and FREE by
one reference initiator against the reference target (`bench_kbtp.kbtp_rates`, the same workload) on:

- ``emulated``: the in-process emulated fabric (profile rdmap-7306, one placement step per message);
- ``iwarp``: `WireFabric` over a loopback TCP socket pair, MPA/DDP/RDMAP with CRC-32C (rdmap-7306);
- ``roce``: `WireFabric` over loopback UDP, IB RC over RoCEv2 with ICRC, PMTU 1024 segmentation (ib-rc);
- ``roce-pmtu4096``: the same at the largest PMTU IB allows (§4.7), which the binding lets two ends agree on:
  a 4 KiB block is one packet instead of four, and each datagram costs the kernel's loopback about the same
  whatever its size (``--gso``: runs of equal-sized datagrams in one UDP GSO send);
- ``verbs:DEV`` (``--verbs``): `VerbsFabric` on a kernel RDMA device, the device doing the wire (rxe: ib-rc;
  an iWARP device such as siw: rdmap-5040 over rdma_cm at ``--verbs-address``). Inside the testbed VM (TCG)
  only the ratios mean anything: ``.ci/rdma`` runs it there with ``--verbs rxe0,siw0``.

Target and initiator run in this one process, so each figure is the whole cost of both ends plus the
kernel's loopback; ``x emulated`` is the ops/s ratio to the emulated fabric at the same block size.
``--served`` adds ``roce-served`` and ``iwarp-served``: the target as ``kvconform serve kbtp-target`` in a
process of its own (the other core, when the machine has one free), the initiator here dialing it, as a
black-box run has it. ``cpu us/op`` is the CPU time of the binding's whole measurement (setup and every
batch, both processes when served: ``initiator+target``) over its operations; on a shared machine it is
less noisy than ops/s. A batch
is timed to its last completion (a wire run then waits for the wire to stay quiet, which is not counted). The
issue's goal for a software target: >= 10^4 ops/s of 4 KiB blocks over RoCEv2 on loopback.

Race windows (``--windows N``, 0 to skip): the black-box race checks of conformance/kbtp/target/test_races.py
(the harness drives the race from outside and counts an attempt as opened only on what it observes;
`conformance.kbtp.blackbox.Windows`) run against the reference target, in-process, on each fabric until
their window opened N times (or ``--window-budget`` seconds): openings per second, the ratio to the emulated
fabric. ``deferred-free``: the text's deferred-free example with the harness as the delayed allocation
(deterministic: every attempt opens it); ``slot-order``: a steady stream of RDMA Reads of a FREE's Tail slot
(`Probe`, posted as work-request lists) catching the slot between its two writes.

Not a test: nothing about speed is asserted; a correctness failure (bad data, a lost block) makes the exit
status 1. The machine is shared, so run it more than once.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import selectors
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # `bench.bench_kbtp` when run as a script

import pytest

from bench.bench_kbtp import BenchError, Measure, kbtp_rates, payload, phase_rates, timed_run
from kvconform import evidence
from kvconform.conformance.kbtp.target.test_races import _deferred_free_black_box, _slot_order_black_box
from kvconform.fixtures.kbtp import TargetUnderTest
from kvconform.kbtp.constants import Features
from kvconform.kbtp.harness import initiator_ids
from kvconform.kbtp.initiator import ReferenceInitiator
from kvconform.rdma.fabric import ActorGen
from kvconform.rdma.profiles import IB_RC, RDMAP_7306, RDMAP_NO_ATOMICS
from kvconform.targets.kbtp import ReferenceTargetDriver, TargetParams
from kvconform.targets.spec import Pics
from kvconform.verdicts import Inconclusive, NotApplicable

WINDOW_FEATURES = ("DIRECT_LOAD", "DIRECT_ALLOC", "ADDR_LE")  # what the black-box ring checks need declared

BINDINGS = ("emulated", "iwarp", "roce", "roce-pmtu4096")
SERVED = ("roce-served", "iwarp-served")  # --served: the target in a process of its own
SERVE_TIMEOUT_S = 30.0  # the served target's start (imports, listening)
ROOT = Path(__file__).resolve().parents[1]
WINDOW_BINDINGS = {"emulated": "ib-rc", "iwarp": "rdmap-7306", "roce": "ib-rc"}  # fabric: the PICS binding
WINDOWS = {"deferred-free": _deferred_free_black_box, "slot-order": _slot_order_black_box}
DEFAULTS = {"ops": 64, "repeat": 3, "windows": 20}
QUICK = {"ops": 16, "repeat": 2, "windows": 5}


@dataclass
class WindowRate:
    """One black-box race check run until its window opened ``needed`` times (or the budget ran out)."""

    attempts: int
    opened: int
    seconds: float
    openings_per_second: float
    outcome: str  # "pass", or why the check did not pass (inconclusive: too few openings)


def window_rate(window: str, fabric: str, needed: int, budget_s: float) -> WindowRate:
    """Run the black-box check ``window`` against the reference target on ``fabric`` (emulated, iwarp, roce)
    and count the attempts it records (`Windows.attempt` notes in the evidence)."""
    params = TargetParams.from_pics({"binding": WINDOW_BINDINGS[fabric], "features": list(WINDOW_FEATURES),
                                     "race_windows": needed, "race_budget_s": budget_s})
    tut = TargetUnderTest(ReferenceTargetDriver(), params, Pics({}), None, 1, wire=fabric)
    transcript = evidence.Transcript()
    previous = evidence.activate(transcript)
    outcome = "pass"
    start = time.perf_counter()
    try:
        WINDOWS[window](tut, 1)
    except (AssertionError, Inconclusive, NotApplicable, pytest.skip.Exception) as exc:  # a violation, too few openings
        outcome = f"{type(exc).__name__}: {str(exc)[:300]}"
    finally:
        seconds = time.perf_counter() - start
        evidence.activate(previous)
        tut.close_beds()
    notes = [e for e in transcript.events if e.kind == "kbtp-race-window"]
    opened = sum(1 for e in notes if e.fields.get("opened"))
    return WindowRate(len(notes), opened, seconds, opened / seconds if seconds > 0 else 0.0, outcome)


def _proc_cpu(pid: int) -> float:
    """User + system CPU seconds of process ``pid`` so far (Linux /proc; NaN elsewhere)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return float("nan")
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class ServedTarget:
    """``kvconform serve kbtp-target`` in a child process, sized like `kbtp_rates`'s in-process target."""

    def __init__(self, binding: str, block: int, ops: int) -> None:
        cmd = [sys.executable, "-m", "kvconform", "serve", "kbtp-target", "--binding", binding, "--port", "0",
               "--udp-port", "0", "--features", "", "--pool", f"{block},{ops}", "--quota", str(ops),
               "--handle-count", str(max(64, ops)), "--max-initiators", "1"]
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
        self.port = 0
        assert self.proc.stdout is not None
        with selectors.DefaultSelector() as sel:
            sel.register(self.proc.stdout, selectors.EVENT_READ)
            end = time.monotonic() + SERVE_TIMEOUT_S
            while not self.port and time.monotonic() < end and sel.select(end - time.monotonic()):
                line = self.proc.stdout.readline()
                if not line:
                    break
                if line.startswith("listening on "):
                    self.port = int(line.rsplit(":", 1)[1])
        if not self.port:
            self.close()
            raise BenchError(f"served {binding} target did not start: {self.proc.stderr.read()[-500:]}"
                             if self.proc.stderr else "served target did not start")

    def cpu(self) -> float:
        return _proc_cpu(self.proc.pid)

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)
        for f in (self.proc.stdout, self.proc.stderr):
            if f is not None:
                f.close()


def served_rates(binding: str, block: int, ops: int, repeat: int) -> tuple[dict[str, Measure], float]:
    """`kbtp_rates`' workload by an initiator here against a `ServedTarget`; the measures and the target
    process's CPU seconds over them."""
    # lazy: as in rates(), the wire fabric is imported where a wire row is measured
    from kvconform.rdma.wire.fabric import WireFabric

    wire = binding.removesuffix("-served")
    profile = RDMAP_7306 if wire == "iwarp" else IB_RC
    served = ServedTarget(wire, block, ops)
    fab: Any = WireFabric(profile, binding="iwarp" if wire == "iwarp" else "roce")  # (timed_run takes any fabric)
    try:
        node = fab.node("I")
        conn = fab.dial(fab.remote("target", "127.0.0.1", served.port), node, name="I-conn")
        x = ReferenceInitiator(fab, node, conn, initiator_id=initiator_ids(1, None)[0], requested=Features(0))
        data = payload(block)
        fab.spawn("hello", x.hello())
        fab.run()
        cpu0 = served.cpu()

        def run_batch(name: str, actor: ActorGen) -> tuple[float, int]:
            fab.spawn(name, actor)
            return timed_run(fab, fab.run)

        return phase_rates(x, ops, repeat, data, run_batch, "served KBTP"), served.cpu() - cpu0
    finally:
        fab.close()
        served.close()


def rates(binding: str, block: int, ops: int, repeat: int, verbs_address: str | None = None,
          gso: bool = False) -> dict[str, Measure]:
    if binding == "emulated":
        return kbtp_rates(RDMAP_7306.with_(chunk_bytes=block), block, ops, repeat)
    fab: Any
    if binding.startswith("verbs:"):
        from kvconform.rdma.verbs.device import query
        from kvconform.rdma.verbs.fabric import VerbsFabric

        info = query(binding.removeprefix("verbs:"))
        profile = RDMAP_NO_ATOMICS if info.transport == "iwarp" else IB_RC
        fab = VerbsFabric(profile, device=info.name, info=info,
                          host=verbs_address if info.transport == "iwarp" else None)
    else:
        from kvconform.rdma.wire.fabric import WireFabric

        profile = RDMAP_7306 if binding == "iwarp" else IB_RC if binding == "roce" else IB_RC.with_(pmtu=4096)
        fab = WireFabric(profile, binding="iwarp" if binding == "iwarp" else "roce", gso=gso)
    try:
        return kbtp_rates(profile, block, ops, repeat, fabric=fab)
    finally:
        fab.close()


def parse(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help=f"small batches: {QUICK}")
    p.add_argument("--ops", type=int, default=None, help=f"operations per batch (default {DEFAULTS['ops']})")
    p.add_argument("--repeat", type=int, default=None, help=f"batches, best kept (default {DEFAULTS['repeat']})")
    p.add_argument("--blocks", default="4096,32768", help="block sizes in octets")
    p.add_argument("--json", default=None, help="write the figures there")
    p.add_argument("--gso", action="store_true", help="RoCEv2 sends runs of equal-sized datagrams with UDP GSO "
                   "(WireFabric(gso=True); off in the checks: see WireFabric._send_datagrams)")
    p.add_argument("--windows", type=int, default=None,
                   help=f"race-window openings asked of each black-box check (default {DEFAULTS['windows']}; 0: none)")
    p.add_argument("--window-budget", type=float, default=20.0, help="seconds per black-box check and fabric")
    p.add_argument("--served", action="store_true", help="add the target in a process of its own: "
                   + ", ".join(SERVED))
    p.add_argument("--only", default="", help="just these rows and race-window fabrics (comma-separated, of "
                   + ", ".join((*BINDINGS, *SERVED)) + "); emulated always runs: the ratios are to it")
    p.add_argument("--verbs", default="", help="verbs devices to add (e.g. rxe0,siw0): a kernel RDMA stack needed")
    p.add_argument("--verbs-address", default=None, help="an address of the iWARP devices' netdev (rdma_cm)")
    args = p.parse_args(argv)
    unknown = set(filter(None, args.only.split(","))) - {*BINDINGS, *SERVED}
    if unknown:
        p.error(f"--only: unknown bindings {sorted(unknown)}")
    base = QUICK if args.quick else DEFAULTS
    args.ops = args.ops or base["ops"]
    args.repeat = args.repeat or base["repeat"]
    args.windows = base["windows"] if args.windows is None else args.windows
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse(argv)
    failures: list[str] = []
    table: dict[str, dict[str, dict[str, Measure]]] = {}
    cpu: dict[str, dict[str, tuple[float, float]]] = {}  # CPU us/op: (this process, the served target)
    wanted = {"emulated", *args.only.split(",")} if args.only else {*BINDINGS, *(SERVED if args.served else ())}
    verbs = [f"verbs:{d}" for d in filter(None, args.verbs.split(","))]
    for block in (int(b) for b in args.blocks.split(",")):
        for binding in (*(b for b in (*BINDINGS, *SERVED) if b in wanted), *verbs):
            total = 3 * args.ops * args.repeat
            c0 = time.process_time()
            try:
                target_s = 0.0
                if binding in SERVED:
                    table.setdefault(str(block), {})[binding], target_s = served_rates(binding, block, args.ops,
                                                                                       args.repeat)
                else:
                    table.setdefault(str(block), {})[binding] = rates(binding, block, args.ops, args.repeat,
                                                                      args.verbs_address, args.gso)
                cpu.setdefault(str(block), {})[binding] = ((time.process_time() - c0) / total * 1e6,
                                                           target_s / total * 1e6)
            except (BenchError, RuntimeError, OSError) as exc:  # RuntimeError: a verbs device that cannot be used
                failures.append(f"{binding}, {block} octets: {exc}")
    print(f"KBTP reference target and initiator in one process (*-served: the target in its own), best of "
          f"{args.repeat} batches of {args.ops}; {platform.processor() or platform.machine()}, "
          f"Python {platform.python_version()}")
    print(f"{'block':>7} {'binding':<15}{'op':<13}{'ops/s':>10}{'MB/s':>9}{'x emulated':>12}  cpu us/op")
    doc: dict[str, Any] = {"ops": args.ops, "repeat": args.repeat, "blocks": {}}
    for size, row in table.items():
        base = row.get("emulated", {})
        for binding, measures in row.items():
            here, there = cpu.get(size, {}).get(binding, (float("nan"), 0.0))
            for op, m in measures.items():
                ref = base.get(op)
                ratio = m.ops_per_second / ref.ops_per_second if ref else float("nan")
                mbs = m.ops_per_second * int(size) / 1e6 if op != "free" else 0.0
                per_op = f"{here:.0f}" + (f"+{there:.0f}" if binding in SERVED else "")
                print(f"{size:>7} {binding:<15}{op:<13}{m.ops_per_second:>10.0f}{mbs:>9.1f}{ratio:>12.3f}  "
                      + (per_op if op == "alloc_store" else ""))
                doc["blocks"].setdefault(size, {}).setdefault(binding, {})[op] = {
                    **asdict(m), "mb_per_second": mbs, "ratio_to_emulated": ratio,
                    "cpu_us_per_op": here, "served_target_cpu_us_per_op": there}
    windows: dict[str, dict[str, WindowRate]] = {}
    if args.windows > 0:
        print(f"\nrace windows: each black-box check until its window opened {args.windows} times "
              f"(budget {args.window_budget:g} s)")
        print(f"{'window':<15}{'fabric':<10}{'opened':>8}{'attempts':>10}{'seconds':>9}{'opened/s':>10}"
              f"{'x emulated':>12}")
        for window in WINDOWS:
            for fabric in (f for f in WINDOW_BINDINGS if f in wanted):
                w = windows.setdefault(window, {})[fabric] = window_rate(window, fabric, args.windows,
                                                                         args.window_budget)
                emu = windows[window].get("emulated")
                ratio = w.openings_per_second / emu.openings_per_second if emu and emu.openings_per_second else \
                    float("nan")
                print(f"{window:<15}{fabric:<10}{w.opened:>8}{w.attempts:>10}{w.seconds:>9.2f}"
                      f"{w.openings_per_second:>10.1f}{ratio:>12.3f}" + ("" if w.outcome == "pass" else
                                                                         f"  ({w.outcome[:100]})"))
                if w.outcome != "pass" and not w.outcome.startswith("Inconclusive"):
                    failures.append(f"race window {window} on {fabric}: {w.outcome}")
        doc["windows"] = {k: {f: asdict(w) for f, w in v.items()} for k, v in windows.items()}
    for f in failures:
        print(f"FAILURE: {f}")
    if args.json:
        Path(args.json).write_text(json.dumps({**doc, "failures": failures}, indent=2))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
