"""The fuzz worker: a child process that runs inputs through one target at a time, under bounds.

Bounds: every input runs under an interval timer (``signal.setitimer``: a parser still busy after
``timeout`` seconds is interrupted with a hang), and the whole process under ``RLIMIT_AS`` set to its
address space after start-up plus ``--memory-mb`` (a parser that allocates past it gets MemoryError: a
memory finding).  Before each input the worker writes its number and bytes into a shared file, so the
parent still knows the input when the worker dies or hangs where no signal reaches (C code, signals
blocked) and has to be killed.

Protocol: one JSON job per line on stdin, JSON events per line on the original stdout (fd 1 itself is
pointed at stderr, so a parser that prints cannot corrupt it).  Events: ``progress``, ``finding``,
``outcome`` (verbose jobs: one per corpus input), ``done``.
"""

from __future__ import annotations

import argparse
import json
import mmap
import os
import random
import re
import resource
import signal
import struct
import sys
import time
import traceback
from collections.abc import Sequence
from typing import IO, Any

from kvconform.fuzz.finding import signature_of
from kvconform.fuzz.mutate import Mutator
from kvconform.fuzz.registry import all_targets, resolve
from kvconform.fuzz.target import FuzzTarget

__all__ = ["SHM_HEADER", "main"]

SHM_HEADER = struct.Struct("<QQ")  # 1 + the input's number in its job (0: none yet), its length
_POOL_CAP = 4096
_SMALL = 1024  # octets: the largest input offered for the committed corpus
_DIGITS = re.compile(r"\d+")


class _Hang(BaseException):
    """Raised by the interval timer inside a parser that ran past the per-input bound (a BaseException
    so that a parser's ``except Exception`` cannot swallow it)."""


def _on_alarm(signum: int, frame: object) -> None:
    raise _Hang()


def _status_kb(field: str) -> int:
    try:
        with open("/proc/self/status", encoding="ascii") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


def _reset_peak() -> None:
    try:  # "5" resets the peak RSS (VmHWM) so each job reports its own (Linux)
        with open("/proc/self/clear_refs", "w", encoding="ascii") as f:
            f.write("5")
    except OSError:
        pass


def _peak_kb() -> int:
    return _status_kb("VmHWM") or resource.getrusage(resource.RUSAGE_SELF).ru_maxrss


def _limit_memory(extra_mb: int) -> None:
    """RLIMIT_AS = what the process maps now (interpreter, imported libraries, their threads) + extra_mb."""
    now = _status_kb("VmSize") * 1024
    if now and extra_mb > 0:
        _, hard = resource.getrlimit(resource.RLIMIT_AS)
        limit = now + extra_mb * 1024 * 1024
        if hard != resource.RLIM_INFINITY:
            limit = min(limit, hard)
        resource.setrlimit(resource.RLIMIT_AS, (limit, hard))


def _outcome_signature(kind: str, value: object) -> tuple[object, ...]:
    """What distinguishes one answer from another, for keeping inputs that reach new ones (the error's
    field or requirement, digits dropped; a result's type and small size)."""
    if kind == "accepted":
        assert isinstance(value, BaseException)
        what = getattr(value, "field", None) or getattr(value, "requirement", None) or str(value)
        # Cut: a field name can quote the input (a track name), and the set of answers seen must stay small.
        return kind, type(value).__name__, _DIGITS.sub("#", str(what)[:80])
    size = len(value) if isinstance(value, list | tuple | dict | bytes) else -1
    return kind, type(value).__name__, min(size, 8)


class Runner:
    """Runs inputs through one target under the time bound; reports findings once per signature."""

    def __init__(self, target: FuzzTarget, job: dict[str, Any], out: IO[str], shm: mmap.mmap | None) -> None:
        self.target = target
        self.job = job
        self.out = out
        self.shm = shm
        self.timeout = float(job.get("timeout", 2.0))
        self.inputs = 0
        self.findings = 0
        self.counts: dict[str, int] = {}
        self.seen: set[tuple[object, ...]] = set()
        self.interesting: list[bytes] = []
        self.keep = int(job.get("keep", 0))
        self.slowest = 0.0  # seconds: how close the slowest input came to the time bound

    def emit(self, event: dict[str, Any]) -> None:
        self.out.write(json.dumps(event) + "\n")
        self.out.flush()

    def _mark(self, index: int, data: bytes) -> None:
        if self.shm is not None:
            n = min(len(data), len(self.shm) - SHM_HEADER.size)
            self.shm[SHM_HEADER.size : SHM_HEADER.size + n] = data[:n]
            SHM_HEADER.pack_into(self.shm, 0, index + 1, n)

    def run(self, index: int, data: bytes, source: str) -> tuple[str, object]:
        """(kind, result or exception): kind is ok, accepted, crash, hang or memory."""
        self._mark(index, data)
        self.inputs += 1
        kind: str
        value: object
        began = time.perf_counter()
        try:
            signal.setitimer(signal.ITIMER_REAL, self.timeout)
            try:
                value = self.target.parse(data)
                kind = "ok"
            finally:
                signal.setitimer(signal.ITIMER_REAL, 0)
                self.slowest = max(self.slowest, time.perf_counter() - began)
        except _Hang as exc:
            kind, value = "hang", exc
        except self.target.accepts as exc:
            kind, value = "accepted", exc
        except MemoryError as exc:
            kind, value = "memory", exc
        except KeyboardInterrupt:
            raise
        except BaseException as exc:  # anything else a parser raises is a finding, SystemExit included
            kind, value = "crash", exc
        if kind in ("crash", "hang", "memory"):
            assert isinstance(value, BaseException)
            self._finding(kind, value, index, data, source)
        return kind, value

    def _finding(self, kind: str, exc: BaseException, index: int, data: bytes, source: str) -> None:
        sig = signature_of(kind, exc)
        self.counts[sig] = self.counts.get(sig, 0) + 1
        if self.counts[sig] > 1:
            return  # one report per distinct bug; the count says how many inputs reached it
        self.findings += 1
        if kind == "hang":
            error = f"no answer within {self.timeout} s (interrupted)"
        elif kind == "memory":
            error = f"MemoryError: allocation past the memory bound ({exc})"
        else:
            error = "".join(traceback.format_exception_only(type(exc), exc)).strip()
        event = {"event": "finding", "kind": kind, "signature": sig, "error": error[:2000], "traceback": "",
                 "input_hex": data.hex(), "index": index, "source": source}
        try:
            event["traceback"] = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))[-8000:]
        except MemoryError:  # near the memory bound the finding still goes out, without its traceback
            event["traceback"] = "(not formatted: MemoryError)"
        self.emit(event)

    def learn(self, kind: str, value: object, data: bytes, pool: list[bytes], *, mutated: bool = True) -> None:
        """Keep an input whose answer is new (pseudo-coverage for the pure-Python engine); a mutated one
        is also a candidate for ``--save-corpus``."""
        if kind not in ("ok", "accepted"):
            return  # a finding's input would only find the same finding again
        sig = _outcome_signature(kind, value)
        if sig in self.seen:
            return
        self.seen.add(sig)
        if len(pool) < _POOL_CAP:
            pool.append(data)
        if mutated and self.keep and len(self.interesting) < _POOL_CAP:
            self.interesting.append(data)

    def chosen(self) -> list[bytes]:
        """``keep`` of the small inputs that reached new answers, spread over the run (later finds are
        deeper; small ones keep the committed corpus small)."""
        small = [d for d in self.interesting if len(d) <= _SMALL]
        n = len(small)
        if n <= self.keep:
            return small
        return [small[i * n // self.keep] for i in range(self.keep)]


def run_job(job: dict[str, Any], out: IO[str], shm: mmap.mmap | None) -> None:
    target = resolve(str(job["parser"]))
    runner = Runner(target, job, out, shm)
    _reset_peak()
    if shm is not None:
        SHM_HEADER.pack_into(shm, 0, 0, 0)
    start = time.monotonic()
    progress_every = float(job.get("progress", 2.0))
    next_progress = start + progress_every
    max_inputs = job.get("max_inputs")
    verbose = bool(job.get("verbose"))
    stop_on_finding = bool(job.get("stop_on_finding"))
    corpus: Sequence[tuple[str, str]] = job.get("corpus", [])
    offset = int(job.get("index_offset", 0))
    pool: list[bytes] = []

    def progress(now: float) -> None:
        runner.emit({"event": "progress", "inputs": runner.inputs, "elapsed": now - start,
                     "findings": runner.findings, "pool": len(pool)})

    for i, (source, hex_data) in enumerate(corpus):
        data = bytes.fromhex(hex_data)
        kind, value = runner.run(offset + i, data, source)
        runner.learn(kind, value, data, pool, mutated=False)
        if verbose:
            detail = value if not isinstance(value, BaseException) else (
                "".join(traceback.format_exception_only(type(value), value)).strip())
            runner.emit({"event": "outcome", "index": offset + i, "source": source, "kind": kind,
                         "detail": str(detail)[:2000]})
    if job.get("mutate") and not pool:
        pool.append(b"")
    if job.get("mutate"):
        rng = random.Random(int(job["seed"]))
        mutator = Mutator(target, rng, int(job.get("max_len", target.max_len)))
        deadline = start + float(job.get("seconds", 0.0))
        index = offset + len(corpus)
        while True:
            now = time.monotonic()
            if now >= deadline or (max_inputs is not None and runner.inputs >= int(max_inputs)) or (
                    stop_on_finding and runner.findings):
                break
            if now >= next_progress:
                progress(now)
                next_progress = now + progress_every
            data = mutator.mutate(rng.choice(pool), pool)
            kind, value = runner.run(index, data, "mutate")
            runner.learn(kind, value, data, pool)
            index += 1
    runner.emit({"event": "done", "inputs": runner.inputs, "elapsed": time.monotonic() - start,
                 "peak_rss_kb": _peak_kb(), "slowest": runner.slowest, "counts": runner.counts, "pool": len(pool),
                 "interesting": [d.hex() for d in runner.chosen()]})


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m kvconform.fuzz.worker")
    p.add_argument("--memory-mb", type=int, default=1024)
    p.add_argument("--shm", default=None, help="file the worker marks each input in (parent-created)")
    args = p.parse_args(argv)
    # Protocol on a private copy of stdout; fd 1 and sys.stdout go to stderr from now on.
    out = os.fdopen(os.dup(1), "w", encoding="utf-8")
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    all_targets()  # import every parser module before the memory bound is measured
    signal.signal(signal.SIGALRM, _on_alarm)
    shm = None
    if args.shm:
        with open(args.shm, "r+b") as f:
            shm = mmap.mmap(f.fileno(), 0)
    _limit_memory(args.memory_mb)
    out.write(json.dumps({"event": "ready", "pid": os.getpid()}) + "\n")
    out.flush()
    for line in sys.stdin:
        if line.strip():
            run_job(json.loads(line), out, shm)
    return 0


if __name__ == "__main__":
    sys.exit(main())
