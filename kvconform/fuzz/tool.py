"""``kvconform fuzz ...``: list the parsers, fuzz them, replay a finding.

    kvconform fuzz list
    kvconform fuzz <parser>|<protocol>|all [--seconds S] [--seed N] [--engine mutate|atheris]
                   [--corpus DIR] [--out DIR] [--timeout S] [--memory-mb M] [--max-inputs N]
                   [--skip-known] [--save-corpus DIR]
    kvconform fuzz <parser> --replay FILE

``--seconds`` is per parser.  Progress (inputs, inputs/s, findings) is printed every ``--progress``
seconds, a summary at the end; every finding is saved under ``--out`` with the seed and the input as
hex.  Exit status: 0 when nothing was found, 1 on any crash, hang, memory blow-up or dead worker, 2 on
bad usage.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import sys
from collections.abc import Sequence
from pathlib import Path

from kvconform.fuzz.atheris_engine import run_atheris
from kvconform.fuzz.corpus import save_inputs
from kvconform.fuzz.engine import Engine, FuzzConfig, ParserReport
from kvconform.fuzz.finding import load_input
from kvconform.fuzz.registry import KNOWN_FAILING, UnknownTarget, all_targets, resolve, select
from kvconform.fuzz.target import FuzzTarget

__all__ = ["main"]

USAGE_ERROR = 2
ENGINES = ("mutate", "atheris")


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="kvconform fuzz", description="Fuzz the parsers a target can reach.",
                                epilog="'kvconform fuzz list' names the parsers and their accepted errors.")
    p.add_argument("target", help="a parser, a protocol (tlkv, kbtp, moqt, kvcs) or 'all'")
    p.add_argument("--seconds", type=float, default=10.0, help="time budget per parser (default 10)")
    p.add_argument("--seed", type=int, default=None, help="seed of the mutations (default: random, printed)")
    p.add_argument("--engine", choices=ENGINES, default="mutate",
                   help="mutate: the pure-Python engine (always there); atheris: coverage-guided libFuzzer")
    p.add_argument("--corpus", action="append", default=[], type=Path, metavar="DIR",
                   help="more inputs: DIR/<parser>/ if it exists, else DIR (repeatable)")
    p.add_argument("--out", type=Path, default=Path("out") / "fuzz", metavar="DIR",
                   help="findings go to DIR/<parser>/ (default out/fuzz)")
    p.add_argument("--timeout", type=float, default=2.0, help="per-input time bound in seconds (default 2)")
    p.add_argument("--memory-mb", type=int, default=1024, help="memory bound above start-up, MB (default 1024)")
    p.add_argument("--max-inputs", type=int, default=None, help="stop a parser after this many inputs")
    p.add_argument("--progress", type=float, default=2.0, help="seconds between progress lines (default 2)")
    p.add_argument("--skip-known", action="store_true",
                   help="leave out the parsers whose known crashes another change is fixing")
    p.add_argument("--save-corpus", type=Path, default=None, metavar="DIR",
                   help="write inputs that reached new answers to DIR/<parser>/ (at most 24 per parser)")
    p.add_argument("--replay", type=Path, default=None, metavar="FILE",
                   help="run one finding (JSON) or raw input file and report its outcome")
    return p


def _list() -> int:
    for t in all_targets().values():
        known = f"  [known failing: {KNOWN_FAILING[t.name]}]" if t.name in KNOWN_FAILING else ""
        print(f"{t.name:26} {t.description}\n{'':26} accepts: {', '.join(t.accepted_names())}{known}")
    return 0


def _summary(reports: Sequence[ParserReport], seed: int) -> None:
    print(f"\n{'parser':26} {'engine':8} {'inputs':>10} {'inputs/s':>9} {'crash':>5} {'hang':>4} {'mem':>4} "
          f"{'died':>4} {'peak MB':>7} {'slowest ms':>10} {'seconds':>7}")
    for r in reports:
        print(f"{r.parser:26} {r.engine:8} {r.inputs:>10} {r.rate:>9.0f} {r.count('crash'):>5} {r.count('hang'):>4} "
              f"{r.count('memory'):>4} {r.count('died'):>4} {r.peak_rss_kb / 1024:>7.0f} {r.slowest * 1e3:>10.1f} "
              f"{r.elapsed:>7.1f}")
    for r in reports:
        for f in r.findings:
            path = r.saved.get(f.signature)
            known = " (known failing parser)" if r.parser in KNOWN_FAILING else ""
            print(f"{r.parser}: {f.signature} x{r.hits[f.signature]}{known}"
                  + (f"\n    replay: {f.replay_command(path)}" if path else ""))
    total = sum(len(r.findings) for r in reports)
    print(f"\n{len(reports)} parsers, {sum(r.inputs for r in reports)} inputs, {total} distinct findings; "
          f"seed {seed} (replay the run with --seed {seed})")


def _replay(target: FuzzTarget, args: argparse.Namespace) -> int:
    named, data = load_input(args.replay)
    if named is not None and named != target.name:
        print(f"kvconform fuzz: note: {args.replay} was found in {named!r}, replaying it in {target.name!r}",
              file=sys.stderr)
    config = FuzzConfig(seconds=0.0, timeout=args.timeout, memory_mb=args.memory_mb, mutate=False)
    print(f"replay {args.replay} ({len(data)} octets) in {target.name}")
    with Engine(config, args.out) as engine:
        report = engine.replay(target, data, source=str(args.replay))
    for f in report.findings:
        print(f"{f.kind}: {f.signature}\n{f.traceback or f.error}")
    return 1 if report.failed else 0


def _run_one(target: FuzzTarget, args: argparse.Namespace, config: FuzzConfig, engine: Engine | None) -> ParserReport:
    if args.engine == "atheris":

        return run_atheris(target, config, args.out)
    assert engine is not None
    return engine.run(target)


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["list"]:
        return _list()
    args = _parser().parse_args(argv)
    try:
        targets = [resolve(args.target)] if args.replay else select(args.target, skip_known=args.skip_known)
    except UnknownTarget as exc:
        print(f"kvconform fuzz: {exc.args[0]}", file=sys.stderr)
        return USAGE_ERROR
    if args.replay:
        return _replay(targets[0], args)
    if args.engine == "atheris" and importlib.util.find_spec("atheris") is None:
        print("kvconform fuzz: --engine atheris needs atheris (pip install 'kvconform[fuzz]')", file=sys.stderr)
        return USAGE_ERROR
    seed = args.seed if args.seed is not None else int.from_bytes(os.urandom(4), "big")
    config = FuzzConfig(seconds=args.seconds, seed=seed, max_inputs=args.max_inputs, timeout=args.timeout,
                        memory_mb=args.memory_mb, progress=args.progress, keep=24 if args.save_corpus else 0,
                        corpus_dirs=tuple(args.corpus))
    print(f"kvconform fuzz: {len(targets)} parser(s), {args.engine} engine, seed {seed}, {args.seconds:g} s each, "
          f"per input {args.timeout:g} s and {args.memory_mb} MB")
    reports = []
    engine = Engine(config, args.out) if args.engine == "mutate" else None
    try:
        for target in targets:
            report = _run_one(target, args, config, engine)
            reports.append(report)
            if args.save_corpus is not None:
                written = save_inputs(args.save_corpus / target.name, report.interesting)
                print(f"  {len(written)} new corpus input(s) in {args.save_corpus / target.name}")
    finally:
        if engine is not None:
            engine.close()
    _summary(reports, seed)
    return 1 if any(r.failed for r in reports) else 0
