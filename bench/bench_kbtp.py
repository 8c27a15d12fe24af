"""KBTP reference target on the emulated RDMA fabric, against the bare fabric and memcpy, in the same run (issue 3).

    python bench/bench_kbtp.py [--quick] [--ops N] [--repeat R] [--chunks 8,32768] [--seeds S]
                               [--kbtp-seeds K] [--kbtp-rounds M] [--json FILE]

Operations/s of one reference initiator against the reference target (`kvconform.kbtp.harness.build`,
profile RDMAP_7306, FIFO scheduler, no direct modes) for blocks of ``--block-size`` (32 KiB):
- LOAD: the target copies the block into its staging buffer and RDMA Writes it into the single-use
  window of the request's Data Descriptor, then a COMPLETION by Send with Invalidate of that window;
- ALLOC_STORE (inline=False, so the Data Descriptor path): the target takes a ticket on the shared ring,
  RDMA Reads the initiator's window straight into the block, binds the table entry, Send with Invalidate;
- FREE: no data; unbind with the next Generation, FetchAdd Tail, slot write, COMPLETION.
Each figure includes the initiator's side (window bind/revoke, request encode, completion decode).

Baselines in the same run: ``memcpy`` = a ``bytearray`` slice copy of one block (what a process pays to
move the bytes at all), and the bare fabric's RDMA Write / RDMA Read of one block (post + wait for the
completion, no KBTP). ``x Write`` / ``x Read`` / ``x memcpy`` are ops/s ratios to those, so
1 / ratio is the slowdown. Every RDMA figure is given per ``chunk_bytes`` of the profile: 8 (the
default, each 8 octets a separately schedulable placement step, as the race suites run) and the block
size (one step per message, leaving the per-message cost of KBTP processing). Each figure is the best
of R batches of N operations.

Race engine (`kvconform.rdma.explore`): interleavings/s of (a) the fabric ``tickets`` scenario of the
fabric tests (two initiators, masked FetchAdds and 16-octet reads racing the target CPU) under the
seeded random scheduler, and (b) KBTP deferred free: three initiators with quotas 1, 1, 2 on F = N = 4
(the text's example geometry) churning FREE + ALLOC_STORE, under PCT (which starves an allocation long
enough for frees to be deferred; the JSON counts the deferred frees), each run checked for lost or
doubly-held blocks. Interleavings/s include building the fabric, target and sessions of every run.

Not a test: nothing about speed is asserted; a correctness failure (bad data, a lost block) is
reported and makes the exit status 1. The machine is shared, so run it more than once.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # `tests.rdma` when run as a script

from kvconform.kbtp.config import TargetConfig
from kvconform.kbtp.constants import Features, Status
from kvconform.kbtp.harness import Harness, build, initiator_ids
from kvconform.kbtp.initiator import OpResult, ReferenceInitiator
from kvconform.kbtp.target import ReferenceTarget
from kvconform.rdma.emulated import EmuFabric
from kvconform.rdma.explore import ExploreReport, explore
from kvconform.rdma.fabric import Access, ActorGen, wait_completion
from kvconform.rdma.profiles import RDMAP_7306, Profile
from kvconform.rdma.scheduler import PctScheduler
from tests.rdma.scenarios import tickets

BLOCK = 32 * 1024
DEFAULTS = {"ops": 8, "repeat": 3, "seeds": 2000, "kbtp_seeds": 300, "kbtp_rounds": 6}
QUICK = {"ops": 3, "repeat": 2, "seeds": 300, "kbtp_seeds": 40, "kbtp_rounds": 4}
DEFERRED_FREE_QUOTAS = (1, 1, 2)  # sum = F = N = 4


class BenchError(Exception):
    """An operation of the bench did not do what it must (wrong status, wrong data): numbers are void."""


@dataclass
class Measure:
    """Best of R batches: operations per second and fabric steps per operation."""

    ops_per_second: float
    steps_per_op: float


def payload(size: int) -> bytes:
    return (bytes(range(256)) * (size // 256 + 1))[:size]


def memcpy_rate(block: int, ops: int, repeat: int) -> float:
    src, dst = bytearray(payload(block)), bytearray(block)
    n = max(ops, 1000)  # one copy is ~1 us: time many so the clock's resolution does not matter
    best = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        for _ in range(n):
            dst[:] = src
        best = min(best, time.perf_counter() - t0)
    if dst != src:
        raise BenchError("memcpy baseline: destination differs from source")
    return n / best


def best(samples: list[tuple[float, int]], ops: int) -> Measure:
    """The fastest batch of (seconds, fabric steps) samples."""
    seconds, steps = min(samples)
    return Measure(ops / seconds, steps / ops)


def timed_run(fab: EmuFabric, run: Callable[[], object]) -> tuple[float, int]:
    """Seconds and fabric steps one run to quiescence took."""
    s0 = fab.steps
    t0 = time.perf_counter()
    run()
    return time.perf_counter() - t0, fab.steps - s0


def fabric_rates(profile: Profile, block: int, ops: int, repeat: int) -> dict[str, Measure]:
    """RDMA Write and RDMA Read of one block on the bare emulated fabric, one outstanding at a time."""
    fab = EmuFabric(profile)
    t, i = fab.node("T"), fab.node("I")
    _, conn = fab.connect(t, i)
    remote = t.register(t.alloc(block), Access.LOCAL_WRITE | Access.REMOTE_WRITE | Access.REMOTE_READ)
    local = i.register(i.alloc(block), Access.LOCAL_WRITE)
    data = payload(block)

    def batch(write: bool) -> ActorGen:
        for _ in range(ops):
            if write:
                conn.post_write(local.sge(0, block), remote.stag, remote.to(0))
            else:
                conn.post_read(local.sge(0, block), remote.stag, remote.to(0))
            wc = yield from wait_completion(conn.cq)
            if not wc.ok:
                raise BenchError(f"fabric {'Write' if write else 'Read'}: completion status {wc.status.name}")

    def batches(write: bool) -> Measure:
        samples = []
        for r in range(repeat):
            fab.spawn(f"{'write' if write else 'read'}{r}", batch(write))
            samples.append(timed_run(fab, fab.run))
        return best(samples, ops)

    local.write(0, data)
    out = {"fabric_write": batches(True)}
    if remote.read(0, block) != data:
        raise BenchError("fabric Write: the remote block differs from the source")
    local.write(0, bytes(block))
    out["fabric_read"] = batches(False)
    if local.read(0, block) != data:
        raise BenchError("fabric Read: the local block differs from the remote one")
    return out


def _check(what: str, results: list[OpResult], data: bytes | None = None) -> None:
    for k, res in enumerate(results):
        if res.status != Status.OK:
            raise BenchError(f"{what} #{k}: status {Status(res.status).name}, expected OK")
        if data is not None and res.data != data:
            raise BenchError(f"{what} #{k}: loaded data differs from the stored block")


def kbtp_rates(profile: Profile, block: int, ops: int, repeat: int,
               fabric: EmuFabric | None = None) -> dict[str, Measure]:
    """LOAD, ALLOC_STORE and FREE of ``ops`` blocks by one initiator; each repeat stores, loads, frees them all.
    ``fabric``: where (default a new emulated fabric; bench_kbtp_wire.py passes a WireFabric)."""
    h = build(1, config=TargetConfig(block_size=block, pool_blocks=ops, quota=ops, handle_count=max(64, ops)),
              profile=profile, requested=Features(0), fabric=fabric)
    x = h.initiators[0]
    data = payload(block)
    h.run(hello=x.hello())

    def run_batch(name: str, actor: ActorGen) -> tuple[float, int]:
        return timed_run(h.fabric, lambda: h.run(**{name: actor}))

    rates = phase_rates(x, ops, repeat, data, run_batch, "KBTP")
    if h.target.census_problems():
        raise BenchError(f"KBTP: block census after the run: {h.target.census_problems()}")
    return rates


def phase_rates(x: ReferenceInitiator, ops: int, repeat: int, data: bytes,
                run_batch: Callable[[str, ActorGen], tuple[float, int]], what: str) -> dict[str, Measure]:
    """ALLOC_STORE all ``ops`` blocks, LOAD them all, FREE them all, ``repeat`` times; ``run_batch(name, actor)``
    runs each batch on its fabric and gives (seconds, steps). A batch counts up to its last completion: a wire
    fabric's run then waits for the wire to stay quiet (SETTLE_S), which is no part of the operations."""
    results: dict[str, list[OpResult]] = {}
    ended: dict[str, float] = {}  # when each batch's last operation completed

    def phase(kind: str) -> ActorGen:
        out = results[kind] = []
        for k in range(ops):
            if kind == "alloc_store":
                res = yield from x.alloc_store(x.handle(k), data, seal=True, inline=False)
            elif kind == "load":
                res = yield from x.load(x.handle(k))
            else:
                res = yield from x.free(x.handle(k))
            out.append(res)
        ended[kind] = time.perf_counter()

    samples: dict[str, list[tuple[float, int]]] = {"alloc_store": [], "load": [], "free": []}
    for r in range(repeat):
        for kind, batch in samples.items():  # store all, load all, free all
            ended.pop(kind, None)
            start = time.perf_counter()
            seconds, steps = run_batch(f"{kind}{r}", phase(kind))
            if len(results[kind]) != ops:
                raise BenchError(f"{what} {kind.upper()}: {len(results[kind])} of {ops} operations ended")
            batch.append((min(seconds, ended.get(kind, start + seconds) - start), steps))
            _check(f"{what} {kind.upper()}", results[kind], data if kind == "load" else None)
    return {kind: best(batch, ops) for kind, batch in samples.items()}


def _churn(x: ReferenceInitiator, rounds: int, tag: int, quota: int) -> ActorGen:
    """Fill the quota, then free and store again in turn (the ring stays nearly empty), then GOODBYE."""
    yield from x.hello()
    for k in range(quota):
        res = yield from x.alloc_store(x.handle(k), bytes([tag, k]) * 4)
        assert res.status == Status.OK, f"initial ALLOC_STORE #{k}: {res}"
    for r in range(rounds):
        handle = x.handle(r % quota)
        res = yield from x.free(handle)
        assert res.status == Status.OK, f"FREE round {r}: {res}"
        res = yield from x.alloc_store(handle, bytes([tag, r]) * 4)
        assert res.status == Status.OK, f"ALLOC_STORE round {r}: {res}"  # within quota: a block is always there
    yield from x.goodbye()  # ends the target's session actor, so the run is quiescent without a deadlock


def deferred_free_scenario(rounds: int) -> Callable[[EmuFabric], Callable[[], object]]:
    """Several initiators churning on F = N = 4; the check: no block lost or held twice, every deferral flushed."""

    def scenario(fab: EmuFabric) -> Callable[[], object]:
        ids = initiator_ids(len(DEFERRED_FREE_QUOTAS), 3)
        cfg = TargetConfig(pool_blocks=sum(DEFERRED_FREE_QUOTAS), block_size=64,
                           quotas=dict(zip(ids, DEFERRED_FREE_QUOTAS, strict=True)))
        h = Harness(fab, ReferenceTarget(fab, fab.node("T"), cfg), [])
        for k, (iid, quota) in enumerate(zip(ids, DEFERRED_FREE_QUOTAS, strict=True)):
            x = h.connect(f"I{k}", initiator_id=iid, requested=Features(0))
            fab.spawn(f"i{k}", _churn(x, rounds, k, quota))

        def check() -> object:
            problems = h.target.census_problems()
            assert not problems, f"block census: {problems}"
            c = h.target.counters
            assert c.deferred_flushed == c.deferred_frees, f"{c.deferred_frees} deferred, {c.deferred_flushed} flushed"
            return c.deferred_frees

        return check

    return scenario


def explore_summary(report: ExploreReport) -> dict[str, Any]:
    return {
        "runs": report.runs,
        "interleavings_per_second": report.interleavings_per_second,
        "steps_per_second": report.steps / report.elapsed if report.elapsed > 0 else 0.0,
        "steps_per_run": report.steps / max(report.runs, 1),
        "failures": len(report.failures),
        "outcomes": dict(report.outcomes),
    }


def parse(argv: Sequence[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help=f"about 10 s: {QUICK}")
    ap.add_argument("--ops", type=int, help=f"operations per batch (default {DEFAULTS['ops']})")
    ap.add_argument("--repeat", type=int, help=f"batches, the best counts (default {DEFAULTS['repeat']})")
    ap.add_argument("--block-size", type=int, default=BLOCK)
    ap.add_argument("--chunks", default=f"8,{BLOCK}", help="profile chunk_bytes values to measure (comma list)")
    ap.add_argument("--seeds", type=int, help=f"interleavings of the fabric scenario (default {DEFAULTS['seeds']})")
    ap.add_argument("--kbtp-seeds", type=int, help=f"interleavings of the KBTP scenario ({DEFAULTS['kbtp_seeds']})")
    ap.add_argument("--kbtp-rounds", type=int, help=f"FREE + ALLOC_STORE rounds ({DEFAULTS['kbtp_rounds']})")
    ap.add_argument("--json", help="also write the results as JSON here")
    args = ap.parse_args(argv)
    for key, value in (QUICK if args.quick else DEFAULTS).items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse(argv)
    block, ops, repeat = args.block_size, args.ops, args.repeat
    chunks = [int(c) for c in args.chunks.split(",")]
    failures: list[str] = []
    memcpy = memcpy_rate(block, ops, repeat)
    rates: dict[str, dict[str, Measure]] = {}
    try:
        for chunk in chunks:
            profile = RDMAP_7306.with_(chunk_bytes=chunk)
            rates[f"chunk{chunk}"] = {**fabric_rates(profile, block, ops, repeat),
                                      **kbtp_rates(profile, block, ops, repeat)}
    except BenchError as exc:
        failures.append(str(exc))
    fabric = explore(tickets, range(args.seeds))
    kbtp = explore(deferred_free_scenario(args.kbtp_rounds), range(args.kbtp_seeds),
                   scheduler=lambda seed: PctScheduler(seed, depth=3, horizon=400))
    for name, report in (("fabric tickets", fabric), ("KBTP deferred free", kbtp)):
        failures += [f"{name}: {f.explain()}" for f in report.failures[:3]]

    print(f"KBTP on the emulated fabric ({RDMAP_7306.name}, FIFO), {block} octet blocks, best of {repeat} "
          f"batches of {ops}; {platform.processor() or platform.machine()}, Python {platform.python_version()}")
    print(f"{'measure':<18}{'chunk':>7}{'ops/s':>11}{'steps/op':>10}{'x Write':>9}{'x Read':>8}{'x memcpy':>10}")
    print(f"{'memcpy':<18}{'-':>7}{memcpy:>11.0f}")
    doc_rates: dict[str, dict[str, Any]] = {}
    for key, row in rates.items():
        write, read = row["fabric_write"].ops_per_second, row["fabric_read"].ops_per_second
        doc_rates[key] = {}
        for name, m in row.items():
            r = m.ops_per_second
            print(f"{name:<18}{key[5:]:>7}{r:>11.1f}{m.steps_per_op:>10.1f}{r / write:>9.3f}{r / read:>8.3f}"
                  f"{r / memcpy:>10.2e}")
            doc_rates[key][name] = {**asdict(m), "ratio_to_fabric_write": r / write, "ratio_to_fabric_read": r / read,
                                    "ratio_to_memcpy": r / memcpy}
    explored = {"fabric_tickets": explore_summary(fabric), "kbtp_deferred_free": explore_summary(kbtp)}
    print(f"race engine, fabric tickets (random): {fabric.summary()}")
    print(f"race engine, KBTP deferred free (PCT, {len(DEFERRED_FREE_QUOTAS)} initiators, F = N = 4, "
          f"{args.kbtp_rounds} rounds): {kbtp.summary()}; deferred frees per run: {dict(kbtp.outcomes)}")
    for f in failures:
        print(f"FAILURE: {f}")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump({"block_size": block, "ops": ops, "repeat": repeat, "profile": RDMAP_7306.name,
                       "memcpy_ops_per_second": memcpy, "rdma": doc_rates, "explore": explored,
                       "failures": failures, "argv": sys.argv[1:] if argv is None else list(argv)}, fh, indent=1)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
