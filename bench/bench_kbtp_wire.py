"""KBTP over the wire bindings, against the emulated fabric in the same run (issue 12).

    python bench/bench_kbtp_wire.py [--quick] [--ops N] [--repeat R] [--blocks 4096,32768] [--json FILE]
        [--verbs rxe0,siw0 [--verbs-address 10.77.0.1]]

Operations/s and MB/s of LOAD, ALLOC_STORE (Data Descriptor path: the target RDMA Reads the block) and FREE by
one reference initiator against the reference target (`bench_kbtp.kbtp_rates`, the same workload) on:

- ``emulated``: the in-process emulated fabric (profile rdmap-7306, one placement step per message);
- ``iwarp``: `WireFabric` over a loopback TCP socket pair, MPA/DDP/RDMAP with CRC-32C (rdmap-7306);
- ``roce``: `WireFabric` over loopback UDP, IB RC over RoCEv2 with ICRC, PMTU 1024 segmentation (ib-rc);
- ``verbs:DEV`` (``--verbs``): `VerbsFabric` on a kernel RDMA device, the device doing the wire (rxe: ib-rc;
  an iWARP device such as siw: rdmap-5040 over rdma_cm at ``--verbs-address``). Inside the testbed VM (TCG)
  only the ratios mean anything: ``.ci/rdma`` runs it there with ``--verbs rxe0,siw0``.

Target and initiator run in this one process, so each figure is the whole cost of both ends plus the
kernel's loopback; ``x emulated`` is the ops/s ratio to the emulated fabric at the same block size. The
issue's goal for a software target: >= 10^4 ops/s of 4 KiB blocks over RoCEv2 on loopback.

Not a test: nothing about speed is asserted; a correctness failure (bad data, a lost block) makes the exit
status 1. The machine is shared, so run it more than once.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # `bench.bench_kbtp` when run as a script

from bench.bench_kbtp import BenchError, Measure, kbtp_rates
from kvconform.rdma.profiles import IB_RC, RDMAP_7306, RDMAP_NO_ATOMICS

BINDINGS = ("emulated", "iwarp", "roce")
DEFAULTS = {"ops": 64, "repeat": 3}
QUICK = {"ops": 16, "repeat": 2}


def rates(binding: str, block: int, ops: int, repeat: int, verbs_address: str | None = None) -> dict[str, Measure]:
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

        profile = RDMAP_7306 if binding == "iwarp" else IB_RC
        fab = WireFabric(profile, binding=binding)  # type: ignore[arg-type]
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
    p.add_argument("--verbs", default="", help="verbs devices to add (e.g. rxe0,siw0): a kernel RDMA stack needed")
    p.add_argument("--verbs-address", default=None, help="an address of the iWARP devices' netdev (rdma_cm)")
    args = p.parse_args(argv)
    base = QUICK if args.quick else DEFAULTS
    args.ops = args.ops or base["ops"]
    args.repeat = args.repeat or base["repeat"]
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse(argv)
    failures: list[str] = []
    table: dict[str, dict[str, dict[str, Measure]]] = {}
    for block in (int(b) for b in args.blocks.split(",")):
        for binding in (*BINDINGS, *(f"verbs:{d}" for d in filter(None, args.verbs.split(",")))):
            try:
                table.setdefault(str(block), {})[binding] = rates(binding, block, args.ops, args.repeat,
                                                                  args.verbs_address)
            except (BenchError, RuntimeError) as exc:  # RuntimeError: a verbs device that cannot be used
                failures.append(f"{binding}, {block} octets: {exc}")
    print(f"KBTP reference target and initiator in one process, best of {args.repeat} batches of {args.ops}; "
          f"{platform.processor() or platform.machine()}, Python {platform.python_version()}")
    print(f"{'block':>7} {'binding':<12}{'op':<13}{'ops/s':>10}{'MB/s':>9}{'x emulated':>12}")
    doc: dict[str, Any] = {"ops": args.ops, "repeat": args.repeat, "blocks": {}}
    for size, row in table.items():
        base = row.get("emulated", {})
        for binding, measures in row.items():
            for op, m in measures.items():
                ref = base.get(op)
                ratio = m.ops_per_second / ref.ops_per_second if ref else float("nan")
                mbs = m.ops_per_second * int(size) / 1e6 if op != "free" else 0.0
                print(f"{size:>7} {binding:<12}{op:<13}{m.ops_per_second:>10.0f}{mbs:>9.1f}{ratio:>12.3f}")
                doc["blocks"].setdefault(size, {}).setdefault(binding, {})[op] = {
                    **asdict(m), "mb_per_second": mbs, "ratio_to_emulated": ratio}
    for f in failures:
        print(f"FAILURE: {f}")
    if args.json:
        Path(args.json).write_text(json.dumps({**doc, "failures": failures}, indent=2))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
