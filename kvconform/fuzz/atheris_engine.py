"""The coverage-guided engine: libFuzzer through atheris, in a child process, read back as a ParserReport.

The child (``kvconform.fuzz.atheris_run``) runs in ``<out>/<parser>/atheris/``: its working corpus starts
as the target's corpus (seeds, committed corpus, ``--corpus``) and grows with what libFuzzer finds; its
artifacts (``crash-*``, ``timeout-*``, ``oom-*``) are replayed through the pure-Python engine's worker to
get the same finding records (signature, traceback, input hex) as the mutate engine.  libFuzzer stops
at its first finding.  The child's wall clock is bounded (budget + 60 s), then it is killed.
"""

from __future__ import annotations

import math
import re
import selectors
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

from kvconform.fuzz.corpus import load_corpus, save_inputs
from kvconform.fuzz.engine import Engine, FuzzConfig, ParserReport
from kvconform.fuzz.finding import Finding
from kvconform.fuzz.target import FuzzTarget

__all__ = ["run_atheris"]

_STATUS = re.compile(rb"^#(\d+)\s+[A-Za-z]+ ")
_RATE = re.compile(rb"exec/s: (\d+)")
_RSS = re.compile(rb"rss: (\d+)Mb")
_STAT = re.compile(rb"^stat::(\w+):\s+(\d+)")
_ARTIFACT_KINDS = {"crash": "crash", "timeout": "hang", "oom": "memory", "leak": "memory"}
_GRACE_S = 60.0


def run_atheris(target: FuzzTarget, config: FuzzConfig, out_dir: Path,
                report: Callable[[str], None] = print) -> ParserReport:
    """Fuzz ``target`` for ``config.seconds`` with libFuzzer; findings saved under ``out_dir/<parser>/``."""
    emit = report
    work = out_dir / target.name / "atheris"
    corpus_dir = work / "corpus"
    save_inputs(corpus_dir, [d for _, d in load_corpus(target, config.corpus_dirs,
                                                       with_committed=config.with_committed)])
    before = {p.name for p in work.iterdir() if p.is_file()}
    cmd = [sys.executable, "-m", "kvconform.fuzz.atheris_run", target.name, f"-seed={config.seed}",
           f"-max_total_time={max(1, math.ceil(config.seconds))}", f"-timeout={max(1, math.ceil(config.timeout))}",
           f"-rss_limit_mb={config.memory_mb + 512}", f"-malloc_limit_mb={config.memory_mb}",
           f"-max_len={target.max_len}", f"-artifact_prefix={work}/", "-print_final_stats=1"]
    if config.max_inputs is not None:
        cmd.append(f"-runs={config.max_inputs}")
    cmd.append(str(corpus_dir))
    result = ParserReport(target.name, "atheris", config.seed)
    start = time.monotonic()
    with open(work / "atheris.log", "wb") as log:
        proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        assert proc.stderr is not None
        sel = selectors.DefaultSelector()
        sel.register(proc.stderr, selectors.EVENT_READ)
        buf, next_progress, rate = b"", start + config.progress, 0
        deadline = start + config.seconds + _GRACE_S
        while time.monotonic() < deadline:
            if not sel.select(timeout=0.5):
                if proc.poll() is not None:
                    break
                continue
            chunk = proc.stderr.read1(1 << 16)  # type: ignore[attr-defined]
            if not chunk:
                break
            log.write(chunk)
            buf += chunk
            *lines, buf = buf.split(b"\n")
            for line in lines:
                if m := _STATUS.match(line):
                    result.inputs = int(m[1])
                    if r := _RATE.search(line):
                        rate = int(r[1])
                    if r := _RSS.search(line):
                        result.peak_rss_kb = max(result.peak_rss_kb, int(r[1]) * 1024)
                elif m := _STAT.match(line):
                    if m[1] == b"number_of_executed_units":
                        result.inputs = int(m[2])
                    elif m[1] == b"slowest_unit_time_sec":
                        result.slowest = float(m[2])
                    elif m[1] == b"peak_rss_mb":
                        result.peak_rss_kb = max(result.peak_rss_kb, int(m[2]) * 1024)
            if time.monotonic() >= next_progress:
                emit(f"fuzz {target.name}: {result.inputs} inputs ({rate}/s, atheris), "
                     f"{time.monotonic() - start:.0f} s")
                next_progress = time.monotonic() + config.progress
        if proc.poll() is None:
            proc.kill()
        proc.wait(timeout=10)
        sel.close()
    result.elapsed = time.monotonic() - start
    artifacts = sorted(p for p in work.iterdir() if p.is_file() and p.name not in before
                       and p.name.split("-", 1)[0] in _ARTIFACT_KINDS)
    for path in artifacts:
        _record_artifact(target, config, out_dir, path, result, emit)
    emit(f"fuzz {target.name}: {result.inputs} inputs ({result.rate:.0f}/s, atheris), "
         f"{len(result.findings)} findings, done, {result.elapsed:.0f} s")
    return result


def _record_artifact(target: FuzzTarget, config: FuzzConfig, out_dir: Path, path: Path, result: ParserReport,
                     emit: Callable[[str], None]) -> None:
    """Replay a libFuzzer artifact through the worker for a full finding record; keep the artifact's kind
    when the replay does not reproduce it (libFuzzer's bounds are not the worker's)."""
    kind = _ARTIFACT_KINDS[path.name.split("-", 1)[0]]
    data = path.read_bytes()
    with Engine(FuzzConfig(seconds=0.0, timeout=config.timeout, memory_mb=config.memory_mb, mutate=False,
                           with_committed=False), None, lambda line: None) as engine:
        replayed = engine.run(target, corpus=[(str(path), data)])
    if replayed.findings:
        f = replayed.findings[0]
        finding = Finding(target.name, f.kind, f.input_hex, f.signature, f.error, f.traceback, "atheris", config.seed,
                          None, str(path))
    else:
        finding = Finding(target.name, kind, data.hex(), f"{kind} (atheris) in {target.name}",
                          f"libFuzzer reported {path.name}; the worker's replay under the same bounds did not",
                          "", "atheris", config.seed, None, str(path))
    result.findings.append(finding)
    result.hits[finding.signature] += 1
    saved = finding.save(out_dir)
    result.saved[finding.signature] = saved
    emit(f"  {finding.kind}: {finding.signature}\n    saved: {saved}\n    replay: {finding.replay_command(saved)}")
