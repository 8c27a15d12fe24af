"""The pure-Python fuzz engine's parent side: drives a worker process, watches it, collects findings.

The worker (``kvconform.fuzz.worker``) enforces the per-input time bound and the memory bound itself;
this side adds what a process cannot do for itself: when the worker dies (a signal, an abort in C code)
or stops making progress where no timer reaches, it is killed, the input it was on is read back from
the shared file and reported (``died`` or ``hang``), and a fresh worker carries on with the rest of the
budget under a derived seed.  Every wait here is bounded.
"""

from __future__ import annotations

import contextlib
import json
import os
import selectors
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from kvconform.fuzz.corpus import load_corpus
from kvconform.fuzz.finding import Finding
from kvconform.fuzz.target import FuzzTarget
from kvconform.fuzz.worker import SHM_HEADER

__all__ = ["Engine", "FuzzConfig", "ParserReport", "WorkerProcess"]

_MAX_RESTARTS = 25
_STARTUP_S = 60.0  # a worker imports every parser module before it says ready


@dataclass(frozen=True)
class FuzzConfig:
    """One run's bounds and sources: time and input budget per parser, per-input time and memory bounds."""

    seconds: float = 10.0
    seed: int = 0
    max_inputs: int | None = None
    timeout: float = 2.0
    memory_mb: int = 1024
    progress: float = 2.0
    mutate: bool = True
    keep: int = 0  # inputs with new answers to bring back (``--save-corpus``)
    corpus_dirs: tuple[Path, ...] = ()
    with_committed: bool = True
    watchdog: float | None = None  # None: 2 * timeout + 5 s
    stop_on_finding: bool = False  # end a parser's mutations at its first finding (as libFuzzer does)

    @property
    def hard_timeout(self) -> float:
        """No progress for this long: the worker is stuck where its own timer does not reach."""
        return self.watchdog if self.watchdog is not None else 2 * self.timeout + 5.0


@dataclass
class ParserReport:
    """What fuzzing one parser found: inputs run, time, distinct findings and how often each was hit."""

    parser: str
    engine: str
    seed: int
    inputs: int = 0
    elapsed: float = 0.0
    findings: list[Finding] = field(default_factory=list)
    hits: Counter[str] = field(default_factory=Counter)
    saved: dict[str, Path] = field(default_factory=dict)
    peak_rss_kb: int = 0
    slowest: float = 0.0  # seconds, the slowest input that finished
    restarts: int = 0
    interesting: list[bytes] = field(default_factory=list)

    def count(self, kind: str) -> int:
        """Distinct findings of one kind (crash, hang, memory, died)."""
        return sum(1 for f in self.findings if f.kind == kind)

    @property
    def failed(self) -> bool:
        return bool(self.findings)

    @property
    def rate(self) -> float:
        return self.inputs / self.elapsed if self.elapsed > 0 else 0.0


class WorkerProcess:
    """One ``python -m kvconform.fuzz.worker`` child with its event pipe and shared input file."""

    def __init__(self, memory_mb: int, log: IO[bytes] | int, shm_size: int) -> None:
        fd, shm_path = tempfile.mkstemp(prefix="kvconform-fuzz-", suffix=".shm")
        os.ftruncate(fd, SHM_HEADER.size + shm_size)
        os.close(fd)
        self.shm_path = Path(shm_path)
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "kvconform.fuzz.worker", "--memory-mb", str(memory_mb), "--shm", shm_path],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log)
        assert self.proc.stdout is not None and self.proc.stdin is not None
        self._sel = selectors.DefaultSelector()
        self._sel.register(self.proc.stdout, selectors.EVENT_READ)
        self._buf = b""
        self.eof = False
        ready = self.events_until(lambda e: e["event"] == "ready", _STARTUP_S)
        if not ready:
            self.kill()
            raise RuntimeError(f"fuzz worker did not start within {_STARTUP_S} s (see its log)")

    def send(self, job: dict[str, Any]) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write((json.dumps(job) + "\n").encode())
        self.proc.stdin.flush()

    def poll_events(self, wait: float) -> list[dict[str, Any]]:
        """Events that arrived within ``wait`` seconds (at least one read attempt)."""
        events: list[dict[str, Any]] = []
        if self.eof:
            return events
        assert self.proc.stdout is not None
        for _ in self._sel.select(timeout=wait):
            chunk = os.read(self.proc.stdout.fileno(), 1 << 16)
            if not chunk:
                self.eof = True
                break
            self._buf += chunk
        *lines, self._buf = self._buf.split(b"\n")
        for line in lines:
            if line.strip():
                events.append(json.loads(line))
        return events

    def events_until(self, stop: Callable[[dict[str, Any]], bool], limit: float) -> list[dict[str, Any]]:
        """Events up to the first ``stop`` matches; empty when it did not arrive within ``limit`` s."""
        deadline = time.monotonic() + limit
        got: list[dict[str, Any]] = []
        while time.monotonic() < deadline and not self.eof:
            for e in self.poll_events(min(0.25, max(0.0, deadline - time.monotonic()))):
                got.append(e)
                if stop(e):
                    return got
        return []

    def marked(self) -> tuple[int, bytes] | None:
        """(index, bytes) of the input the worker marked last, or None before its first."""
        raw = self.shm_path.read_bytes()
        seq, n = SHM_HEADER.unpack_from(raw, 0)
        return None if seq == 0 else (seq - 1, raw[SHM_HEADER.size : SHM_HEADER.size + n])

    def clear_mark(self) -> None:
        """Forget the last job's input, so a worker lost before its next one is not blamed on it."""
        with open(self.shm_path, "r+b") as f:
            f.write(SHM_HEADER.pack(0, 0))

    def marked_seq(self) -> int:
        with open(self.shm_path, "rb") as f:
            return int(SHM_HEADER.unpack(f.read(SHM_HEADER.size))[0])

    def alive(self) -> bool:
        return self.proc.poll() is None and not self.eof

    def exit_description(self) -> str:
        code = self.proc.wait(timeout=10)
        return f"killed by signal {-code}" if code < 0 else f"exited with status {code}"

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        with contextlib.suppress(subprocess.TimeoutExpired):  # SIGKILL is not ignorable: this is a bound only
            self.proc.wait(timeout=10)

    def close(self) -> None:
        if self.proc.poll() is None and self.proc.stdin is not None:
            try:
                self.proc.stdin.close()
                self.proc.wait(timeout=5)
            except (OSError, subprocess.TimeoutExpired):
                pass
        self.kill()
        self._sel.close()
        self.shm_path.unlink(missing_ok=True)


class Engine:
    """Runs targets through a worker (started on first use, replaced when it dies); ``report`` gets one
    line per progress tick and per finding."""

    def __init__(self, config: FuzzConfig, out_dir: Path | None, report: Callable[[str], None] = print) -> None:
        self.config = config
        self.out_dir = out_dir
        self.report = report
        self._worker: WorkerProcess | None = None
        self._shm_size = 1 << 20
        self._log: IO[bytes] | int = subprocess.DEVNULL
        if out_dir is not None:
            out_dir.mkdir(parents=True, exist_ok=True)
            self._log = open(out_dir / "worker.log", "ab")  # noqa: SIM115 - closed in close()

    def __enter__(self) -> Engine:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        if self._worker is not None:
            self._worker.close()
            self._worker = None
        if not isinstance(self._log, int):
            self._log.close()
            self._log = subprocess.DEVNULL

    def _worker_for(self, max_len: int) -> WorkerProcess:
        if self._worker is not None and (not self._worker.alive() or max_len > self._shm_size):
            self._worker.close()
            self._worker = None
        if self._worker is None:
            self._shm_size = max(self._shm_size, max_len)
            self._worker = WorkerProcess(self.config.memory_mb, self._log, self._shm_size)
        return self._worker

    # ---- one parser ------------------------------------------------------------------------------

    def run(self, target: FuzzTarget, *, corpus: Sequence[tuple[str, bytes]] | None = None,
            verbose: bool = False) -> ParserReport:
        """The target's corpus, then seeded mutations until the time or input budget is spent (none when
        the config says ``mutate=False``); ``verbose`` reports the outcome of each corpus input."""
        cfg = self.config
        if corpus is None:
            corpus = load_corpus(target, cfg.corpus_dirs, with_committed=cfg.with_committed)
        max_len = max([target.max_len, *(len(d) for _, d in corpus)])
        result = ParserReport(target.name, "mutate", cfg.seed)
        start = time.monotonic()
        seed, offset, pending = cfg.seed, 0, list(corpus)
        while True:
            remaining = cfg.seconds - (time.monotonic() - start)
            budget = None if cfg.max_inputs is None else cfg.max_inputs - result.inputs
            job = {"parser": target.name, "seed": seed, "seconds": max(0.0, remaining), "max_inputs": budget,
                   "timeout": cfg.timeout, "progress": cfg.progress, "mutate": cfg.mutate, "keep": cfg.keep,
                   "verbose": verbose, "stop_on_finding": cfg.stop_on_finding,
                   "max_len": max_len, "index_offset": offset,
                   "corpus": [[label, data.hex()] for label, data in pending]}
            stopped = self._drive(target, job, result, start)
            if stopped is None:
                break
            # The worker died or was killed on input `stopped`: carry on after it with a fresh worker.
            result.restarts += 1
            done_in_corpus = stopped - offset + 1
            pending = pending[done_in_corpus:] if done_in_corpus <= len(pending) else []
            offset = stopped + 1
            seed = cfg.seed + 1_000_003 * result.restarts
            out_of_budget = (time.monotonic() - start >= cfg.seconds and not pending) or (
                cfg.max_inputs is not None and result.inputs >= cfg.max_inputs) or cfg.stop_on_finding
            if out_of_budget or result.restarts > _MAX_RESTARTS:
                break
        result.elapsed = time.monotonic() - start
        self._progress(result, start, -1)
        return result

    def _drive(self, target: FuzzTarget, job: dict[str, Any], result: ParserReport, start: float) -> int | None:
        """Run one job to its end; the input number the worker was lost on, or None when it finished."""
        worker = self._worker_for(int(job["max_len"]))
        worker.clear_mark()
        worker.send(job)
        last_seq, last_change = -1, time.monotonic()
        base_inputs = result.inputs
        while True:
            for event in worker.poll_events(0.25):
                kind = event["event"]
                if kind == "progress":
                    result.inputs = base_inputs + int(event["inputs"])
                    self._progress(result, start, int(event.get("pool", 0)))
                elif kind == "finding":
                    self._record(result, Finding(
                        parser=target.name, kind=event["kind"], input_hex=event["input_hex"],
                        signature=event["signature"], error=event["error"], traceback=event["traceback"],
                        engine="mutate", seed=job["seed"] if event["source"] == "mutate" else None,
                        index=event["index"], source=event["source"]))
                elif kind == "outcome":
                    self.report(f"  {event['source']}: {event['kind']}: {event['detail']}")
                elif kind == "done":
                    result.inputs = base_inputs + int(event["inputs"])
                    result.peak_rss_kb = max(result.peak_rss_kb, int(event["peak_rss_kb"]))
                    result.slowest = max(result.slowest, float(event["slowest"]))
                    for sig, n in event["counts"].items():
                        result.hits[sig] += n - 1  # the first of each was counted with its finding
                    result.interesting += [bytes.fromhex(h) for h in event["interesting"]]
                    return None
            if not worker.alive():
                return self._lost(target, job, result, base_inputs, "died",
                                  f"the worker {worker.exit_description()}")
            seq = worker.marked_seq()
            now = time.monotonic()
            if seq != last_seq:
                last_seq, last_change = seq, now
            elif now - last_change > self.config.hard_timeout:
                worker.kill()
                return self._lost(target, job, result, base_inputs, "hang",
                                  f"no progress for {self.config.hard_timeout:.0f} s where the per-input timer "
                                  "could not interrupt it (C code or signals blocked); the worker was killed")

    def _lost(self, target: FuzzTarget, job: dict[str, Any], result: ParserReport, base_inputs: int, kind: str,
              error: str) -> int:
        """Report the input the worker was lost on (read back from the shared file); returns its number."""
        assert self._worker is not None
        marked = self._worker.marked()
        self._worker.close()
        self._worker = None
        offset = int(job["index_offset"])
        index, data = marked if marked is not None else (offset - 1, b"")
        from_corpus = 0 <= index - offset < len(job["corpus"])
        source = job["corpus"][index - offset][0] if from_corpus else "mutate" if marked else "before its first input"
        result.inputs = base_inputs + index - offset + 1  # a lost worker's own count never arrived
        self._record(result, Finding(
            parser=target.name, kind=kind, input_hex=data.hex(), signature=f"{kind} (worker lost) in {target.name}",
            error=error, traceback="", engine="mutate", seed=None if from_corpus else job["seed"], index=index,
            source=source))
        return index

    def _record(self, result: ParserReport, finding: Finding) -> None:
        result.hits[finding.signature] += 1
        if any(f.signature == finding.signature for f in result.findings):
            return
        result.findings.append(finding)
        where = ""
        if self.out_dir is not None:
            path = finding.save(self.out_dir)
            result.saved[finding.signature] = path
            where = f"\n    saved: {path}\n    replay: {finding.replay_command(path)}"
        self.report(f"  {finding.kind}: {finding.signature}: {finding.error.splitlines()[-1] if finding.error else ''}"
                    f"{where}")

    def _progress(self, result: ParserReport, start: float, pool: int) -> None:
        """One progress line; ``pool`` -1 marks the parser's last line."""
        elapsed = time.monotonic() - start
        rate = result.inputs / elapsed if elapsed > 0 else 0.0
        where = "done" if pool < 0 else f"pool {pool}"
        self.report(f"fuzz {result.parser}: {result.inputs} inputs ({rate:.0f}/s), {result.count('crash')} crashes, "
                    f"{result.count('hang')} hangs, {result.count('memory')} memory, {result.count('died')} died, "
                    f"{where}, {elapsed:.0f} s")

    # ---- replay --------------------------------------------------------------------------------

    def replay(self, target: FuzzTarget, data: bytes, source: str = "replay") -> ParserReport:
        """Run one input under the same bounds (no mutations); its outcome is reported, a finding recorded."""
        replay = Engine(FuzzConfig(seconds=0.0, timeout=self.config.timeout, memory_mb=self.config.memory_mb,
                                   mutate=False, with_committed=False), self.out_dir, self.report)
        with replay:
            return replay.run(target, corpus=[(source, data)], verbose=True)
