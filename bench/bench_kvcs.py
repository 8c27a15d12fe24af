"""A KVCS cache published -> relay -> consumed on loopback, through kvconform's relay and aiomoqt's (issue 5).

    python bench/bench_kvcs.py [--quick] [--variants live,completed] [--repeat R] [--budget S]
                               [--layer-interval S] [--json FILE] [--ours-only]

The cache: 32 layers of 64 blocks (B=16 tokens, Hkv=8, D=128, f16: 32 KiB k and 32 KiB v Objects, 4096
Objects, 128 MiB of KV data), built by ``kvconform.kvcs.content.example_spec`` at that geometry (the
test-content convention). ``--quick``: 4 layers of 8 blocks, Hkv=2, D=64 (4 KiB Objects), for the smoke
test. The reference publisher (``kvconform.kvcs.publisher.KvcsPublisher``, its payloads computed before
it connects, so content generation is not timed) runs in a child process; the reference consumer
(``kvconform.kvcs.consumer.Consumer``) runs in this one; the relay is a third process: ours
(``kvconform serve moqt-relay --policy open``) or aiomoqt's (``moq-interop-relay`` in the aiomoqt docker
image, host networking), both on 127.0.0.1 and both running for the whole run.

Two variants (``tests/interop/kvcs_transfer.py`` says exactly what each does and times): ``live``, where the
consumer is subscribed before the publisher produces its first layer and everything flows on the relay's
live path (times from the publisher's first data Object), and ``completed``, where the publisher has
published everything before the consumer starts and FETCHes the layer range through the relay (times from
the consumer's start).

Reported per relay and variant: total time (until the last layer is ready), time until the first layer is
usable (the consumer's per-layer ready event, ``on_ready``), MB/s (10^6 bytes of k+v data / total), and
the ratio kvconform / aiomoqt of the totals and of time-to-first-layer within the run. Every layer's
digest is compared with the test-content convention's: a run whose cache did not arrive intact is
listed under ``failures`` (exit status 1) and its numbers mean nothing. With ``--repeat`` each
configuration runs R times (relays alternating) and the fastest intact run counts.

aiomoqt's half is skipped, with the reason, when docker, its daemon or the image
``kvconform/aiomoqt:0.13.3`` (testbeds/aiomoqt.yaml; .ci/interop makes it) is missing, or with
``--ours-only``. Not a test: nothing about speed is asserted. All three processes share the machine's two
cores, so compare within one run only.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import signal
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import asdict
from pathlib import Path
from types import FrameType

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # `tests.interop` when run as a script

from kvconform.targets import docker as dk
from kvconform.targets.spec import parse_target
from kvconform.targets.testbed import Testbed
from kvconform.verdicts import TargetUnavailable
from tests.interop.kvcs_transfer import VARIANTS, Transfer, cache_spec, data_bytes, transfer
from tests.interop.peers import RELAY_TARGET, RelayEndpoint, aiomoqt_relay, aiomoqt_testbed, our_relay

GEOMETRY = {"layers": 32, "blocks": 64, "block_tokens": 16, "kv_heads": 8, "head_dim": 128}
QUICK = {"layers": 4, "blocks": 8, "block_tokens": 16, "kv_heads": 2, "head_dim": 64}


# ---- the relays ---------------------------------------------------------------------------------------


def aiomoqt_problem(testbed: Testbed) -> str | None:
    """Why aiomoqt's relay cannot run here (no docker SDK, no daemon, no image), or None. Never builds."""
    problem = dk.docker_problem()
    if problem:
        return problem
    image = parse_target(RELAY_TARGET, testbed).value
    client = dk.docker_client(timeout_s=10.0)
    try:
        client.images.get(image)
    except Exception as exc:  # ImageNotFound or the daemon going away: either way, no relay
        return f"image {image} is not present ({type(exc).__name__}); .ci/interop makes it"
    finally:
        client.close()
    return None


@contextlib.contextmanager
def relays(ours_only: bool, skipped: list[str]) -> Iterator[list[RelayEndpoint]]:
    """Our relay and (unless ``ours_only`` or unavailable, with the reason in ``skipped``) aiomoqt's."""
    testbed = aiomoqt_testbed()
    with contextlib.ExitStack() as stack:
        running: list[RelayEndpoint] = []
        try:
            running.append(stack.enter_context(our_relay(testbed)))
        except TargetUnavailable as exc:
            skipped.append(f"kvconform relay not measured: {exc}")
        problem = "--ours-only" if ours_only else aiomoqt_problem(testbed)
        if problem is None:
            try:
                running.append(stack.enter_context(aiomoqt_relay(testbed)))
            except TargetUnavailable as exc:
                problem = str(exc)
        if problem is not None:
            skipped.append(f"aiomoqt relay not measured: {problem}")
        for line in skipped:
            print(line, file=sys.stderr, flush=True)
        yield running


# ---- report -------------------------------------------------------------------------------------------


def best_runs(runs: Sequence[Transfer]) -> dict[tuple[str, str], Transfer]:
    """Per (relay, variant): the fastest intact run, else the last one."""
    out: dict[tuple[str, str], Transfer] = {}
    for run in runs:
        key = (run.relay, run.variant)
        old = out.get(key)
        if old is None or (run.total_s is not None and (old.total_s is None or run.total_s < old.total_s)):
            out[key] = run
    return out


def ratios(best: dict[tuple[str, str], Transfer], variants: Sequence[str]) -> dict[str, dict[str, float]]:
    """kvconform / aiomoqt per variant: of the total times and of the times to the first layer (> 1: ours
    is slower), and of MB/s (< 1: ours is slower)."""
    out: dict[str, dict[str, float]] = {}
    for variant in variants:
        ours, theirs = best.get(("kvconform", variant)), best.get(("aiomoqt", variant))
        if ours is None or theirs is None or ours.total_s is None or theirs.total_s is None:
            continue
        assert ours.first_layer_s is not None and theirs.first_layer_s is not None
        assert ours.mb_per_s is not None and theirs.mb_per_s is not None
        out[variant] = {"total_s": round(ours.total_s / theirs.total_s, 2),
                        "first_layer_s": round(ours.first_layer_s / max(theirs.first_layer_s, 1e-6), 2),
                        "mb_per_s": round(ours.mb_per_s / theirs.mb_per_s, 2)}
    return out


def _fmt(x: float | None, width: int) -> str:
    return ("-" if x is None else f"{x:.2f}").rjust(width)


def parse(argv: Sequence[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help=f"a small cache: {QUICK}")
    ap.add_argument("--layers", type=int, help=f"override the number of layers (default {GEOMETRY['layers']})")
    ap.add_argument("--variants", default=",".join(VARIANTS), help="comma list of live, completed")
    ap.add_argument("--repeat", type=int, default=1, help="runs per relay and variant (the fastest intact counts)")
    ap.add_argument("--budget", type=float, default=240.0, help="seconds one transfer may take (consumer budget)")
    ap.add_argument("--layer-interval", type=float, default=0.0,
                    help="seconds the publisher waits after each layer (simulated computation; 0 = full speed)")
    ap.add_argument("--json", help="also write the results as JSON here")
    ap.add_argument("--ours-only", action="store_true", help="measure kvconform's relay only (not aiomoqt's)")
    args = ap.parse_args(argv)
    args.variants = [v for v in args.variants.split(",") if v]
    unknown = set(args.variants) - set(VARIANTS)
    if unknown:
        ap.error(f"--variants: {sorted(unknown)}, expected some of {list(VARIANTS)}")
    if args.repeat < 1 or args.budget <= 0:
        ap.error("--repeat must be >= 1 and --budget > 0")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse(argv)
    geometry = dict(QUICK if args.quick else GEOMETRY)
    if args.layers:
        geometry["layers"] = args.layers
    spec = cache_spec(geometry)
    started = time.monotonic()
    skipped: list[str] = []
    runs: list[Transfer] = []
    with tempfile.TemporaryDirectory(prefix="kvc-bench-") as tmp:
        spec_path = spec.write_json(Path(tmp) / "cache.json")
        with relays(args.ours_only, skipped) as running:
            for variant in args.variants:
                for i in range(args.repeat):
                    # alternate which relay goes first, so neither always follows the other's load
                    for relay in running if i % 2 == 0 else running[::-1]:
                        print(f"kvcs bench: {variant} through {relay.name} ({len(runs) + 1}), "
                              f"{time.monotonic() - started:.0f} s", file=sys.stderr, flush=True)
                        run = transfer(spec, spec_path, relay, variant, args.budget, args.layer_interval)
                        runs.append(run)
                        if run.error:
                            print(f"  {run.error}", file=sys.stderr, flush=True)
    best = best_runs(runs)
    ratio = ratios(best, args.variants)
    failures = [f"{r.relay} {r.variant}: {r.error}" for r in runs if not r.intact]
    mb = data_bytes(spec) / 1e6
    print(f"KVCS cache on loopback: {spec.layers} layers x {spec.segment_layout()[0].blocks} blocks, "
          f"{spec.section_octets} B k and v Objects, {mb:.1f} MB of k+v ({time.monotonic() - started:.0f} s in all)")
    print(f"{'relay':<10} {'variant':<10} {'total s':>8} {'1st layer s':>11} {'MB/s':>7} {'publisher s':>11} "
          f"{'ready':>5} {'tries':>5}  consumer mode")
    for run in best.values():
        print(f"{run.relay:<10} {run.variant:<10} {_fmt(run.total_s, 8)} {_fmt(run.first_layer_s, 11)} "
              f"{_fmt(run.mb_per_s, 7)} {_fmt(run.publisher_s, 11)} {run.layers_ready:>5} {run.attempts:>5}  "
              f"{run.consumer_mode or '-'}"
              f"{'' if run.intact else '  NOT INTACT'}")
    for variant, r in ratio.items():
        print(f"ratio kvconform/aiomoqt, {variant}: total time {r['total_s']:.2f}, first layer "
              f"{r['first_layer_s']:.2f}, MB/s {r['mb_per_s']:.2f}")
    for line in skipped:
        print(line)
    for f in failures:
        print(f"FAILED {f}")
    if args.json:
        doc = {"geometry": geometry, "object_data_bytes": spec.section_octets, "cache_data_bytes": data_bytes(spec),
               "variants": args.variants, "repeat": args.repeat, "runs": [asdict(r) for r in runs],
               "best": [asdict(r) for r in best.values()], "ratio_kvconform_to_aiomoqt": ratio,
               "skipped": skipped, "failures": failures,
               "argv": sys.argv[1:] if argv is None else list(argv)}
        Path(args.json).write_text(json.dumps(doc, indent=1) + "\n")
    return 1 if failures else 0


def _interrupt(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt


if __name__ == "__main__":
    # SIGTERM (e.g. from `timeout`) unwinds like Ctrl-C, so the relays, the child and containers stop.
    signal.signal(signal.SIGTERM, _interrupt)
    raise SystemExit(main())
