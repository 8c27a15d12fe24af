"""The one process driver every ``cmd:`` role uses: spawn, bound, capture, and leave nothing behind.

A spawned implementation runs in its own session (so its process group is its own), with stdout and stderr
written to files, not pipes: a child that keeps a pipe open (a daemon, a forgotten background job) can never
stall the harness waiting for end-of-file. Output is kept as bytes and decoded with replacement only for the
evidence, so one non-UTF-8 byte never fails a check. Every process is marked with an environment variable
naming its run; on timeout and at the end the whole group is sent SIGTERM, then SIGKILL after a grace period,
and any process still carrying the mark (one that escaped the group with setsid, a double-forked daemon) is
killed too. Waits are bounded everywhere.

The ``cmd:`` drivers of every lane reach their implementation through a :class:`Launcher`: the values of the
role's placeholders in, a started-on-demand handle with this module's ``Process`` API out. A ``cmd:`` template
is a :class:`CommandLauncher`; a ``docker:`` image is ``kvconform.targets.docker.ContainerLauncher`` (the same
roles, run as containers under the contract of docs/docker-contract.md).
"""

from __future__ import annotations

import contextlib
import os
import select
import shlex
import signal
import subprocess
import tempfile
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import IO, Protocol, runtime_checkable

from kvconform.verdicts import DriverError, TargetUnavailable

__all__ = ["MARK_ENV", "TAIL", "CommandLauncher", "Handle", "Launcher", "Process", "ProcessResult", "as_launcher",
           "fill_template", "marked_pids", "run_handle", "run_process"]

MARK_ENV = "KVCONFORM_PROCESS_MARK"  # every process the harness spawns carries it, with its run's value
TERM_GRACE = 3.0  # seconds between SIGTERM and SIGKILL
TAIL = 8000  # octets of stdout/stderr kept in a result's text (the files hold everything)


def fill_template(template: str, values: Mapping[str, str]) -> list[str]:
    """Split ``template`` like a shell and fill ``{name}`` placeholders per argument (values are never
    re-split, so a path with spaces stays one argument); DriverError naming an unknown placeholder."""
    try:
        return [arg.format(**values) for arg in shlex.split(template)]
    except (KeyError, IndexError) as exc:
        raise DriverError(f"cmd template {template!r}: placeholder {exc} has no value here "
                          f"(known: {', '.join('{' + k + '}' for k in sorted(values))})") from None
    except ValueError as exc:
        raise DriverError(f"cmd template {template!r}: {exc}") from None


def _decode(data: bytes) -> str:
    return data.decode("utf-8", "replace")


@dataclass(frozen=True)
class ProcessResult:
    """How a spawned process ended: exit status (None: killed by the harness after its bound), output."""

    argv: tuple[str, ...]
    returncode: int | None
    stdout: bytes
    stderr: bytes
    elapsed: float
    timed_out: bool = False
    note: str = ""  # what the harness had to do (killed after SIGTERM was ignored, leftovers killed)

    @property
    def stdout_text(self) -> str:
        return _decode(self.stdout[-TAIL:])

    @property
    def stderr_text(self) -> str:
        return _decode(self.stderr[-TAIL:]) + (f"\n[kvconform] {self.note}" if self.note else "")

    def evidence(self) -> dict[str, object]:
        """What the evidence keeps of the run: the tails as text (decoded with replacement) and, when the output
        is longer than the tail, all of it as bytes (the evidence's side file keeps them whole)."""
        out: dict[str, object] = {"argv": list(self.argv), "returncode": self.returncode,
                                  "elapsed_s": round(self.elapsed, 3), "timed_out": self.timed_out,
                                  "stdout": self.stdout_text, "stderr": self.stderr_text}
        for name, data in (("stdout_bytes", self.stdout), ("stderr_bytes", self.stderr)):
            if len(data) > TAIL:
                out[name] = data
        return out


def marked_pids(mark: str) -> list[int]:
    """Live processes whose environment carries ``MARK_ENV=mark`` (Linux /proc; empty elsewhere)."""
    needle = f"{MARK_ENV}={mark}".encode() + b"\0"
    found: list[int] = []
    proc = Path("/proc")
    if not proc.is_dir():
        return found
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if (entry / "environ").read_bytes().find(needle) < 0:
                continue
            state = (entry / "stat").read_text().rpartition(")")[2].split()[0]
        except OSError:
            continue
        if state != "Z":  # a zombie is dead already; its parent (or init) reaps it
            found.append(int(entry.name))
    return found


class Process:
    """One spawned implementation: ``start()``, ``running()``, ``wait(timeout)``, ``stop()``; a context manager
    that always stops it. Its stdout and stderr go to files in its own temporary folder."""

    def __init__(self, argv: list[str], *, cwd: str | os.PathLike[str] | None = None,
                 env: Mapping[str, str] | None = None, what: str = "target", pipes: bool = False) -> None:
        self.argv = argv
        # pipes: stdin and stdout are the implementation's control channel (kbtp-initiator's cmd: contract);
        # nothing ever waits for their end, so a child holding them open cannot stall the harness
        self.pipes = pipes
        self.cwd = cwd
        self.what = what
        self.mark = uuid.uuid4().hex
        self._env = {**(os.environ if env is None else env), MARK_ENV: self.mark}
        self._proc: subprocess.Popen[bytes] | None = None
        self._tmp: tempfile.TemporaryDirectory[str] | None = None
        self._started = 0.0
        self._result: ProcessResult | None = None
        self._notes: list[str] = []

    def __enter__(self) -> Process:
        self.start()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()

    @property
    def stdin(self) -> IO[bytes] | None:
        return self._proc.stdin if self._proc is not None else None

    @property
    def stdout(self) -> IO[bytes] | None:
        """With ``pipes``: the control channel's read end (the stdout file then stays empty)."""
        return self._proc.stdout if self._proc is not None else None

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    def start(self) -> None:
        """Spawn it; TargetUnavailable when it cannot be started at all (nothing was exchanged)."""
        self._tmp = tempfile.TemporaryDirectory(prefix="kvconform-proc-")
        out = Path(self._tmp.name)
        self._started = time.monotonic()
        try:
            with open(out / "stdout", "wb") as stdout, open(out / "stderr", "wb") as stderr:
                stdin = subprocess.PIPE if self.pipes else subprocess.DEVNULL
                self._proc = subprocess.Popen(self.argv, stdout=subprocess.PIPE if self.pipes else stdout,
                                              stderr=stderr, stdin=stdin, cwd=self.cwd, env=self._env,
                                              start_new_session=True)
        except OSError as exc:
            self._tmp.cleanup()
            self._tmp = None
            raise TargetUnavailable(f"cannot start the {self.what} {shlex.join(self.argv)}: {exc}") from exc

    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def wait(self, timeout: float) -> int | None:
        """Wait up to ``timeout`` s for it to exit; its exit status, or None while it still runs."""
        if self._proc is None:
            return None
        with contextlib.suppress(subprocess.TimeoutExpired):
            return self._proc.wait(max(0.0, timeout))
        return None

    def output(self) -> tuple[bytes, bytes]:
        """What it wrote so far (stdout, stderr)."""
        if self._tmp is None:
            return (self._result.stdout, self._result.stderr) if self._result else (b"", b"")
        out = Path(self._tmp.name)
        return (out / "stdout").read_bytes(), (out / "stderr").read_bytes()

    def _signal_group(self, sig: signal.Signals) -> None:
        assert self._proc is not None
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self._proc.pid, sig)  # the session this driver created for it, by its id

    def _kill_leftovers(self) -> None:
        # Processes that left the group (setsid, double fork) but still carry the mark: SIGKILL each and wait
        # (bounded) on its pidfd, which becomes readable when it has exited; a new generation it forked before
        # dying is found by the next pass.
        deadline = time.monotonic() + TERM_GRACE
        killed = 0
        while time.monotonic() < deadline:
            left = [p for p in marked_pids(self.mark) if p != os.getpid()]
            if not left:
                break
            poller = select.poll()
            fds = []
            for pid in left:
                with contextlib.suppress(OSError):
                    fd = os.pidfd_open(pid)
                    fds.append(fd)
                    poller.register(fd, select.POLLIN)
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, signal.SIGKILL)
                    killed += 1
            try:
                pending = len(fds)
                while pending and time.monotonic() < deadline:
                    pending -= len(poller.poll(max(1, int((deadline - time.monotonic()) * 1000))))
            finally:
                for fd in fds:
                    os.close(fd)
        if killed:
            self._notes.append(f"killed {killed} leftover process(es) that had left its process group")

    def stop(self, *, timed_out: bool = False) -> ProcessResult:
        """Stop it and every process it started (bounded), collect its output; idempotent."""
        if self._result is not None:
            return self._result
        if self._proc is None:
            self._result = ProcessResult(tuple(self.argv), None, b"", b"", 0.0, timed_out)
            return self._result
        if self._proc.poll() is None:
            self._signal_group(signal.SIGTERM)
            if self.wait(TERM_GRACE) is None:
                self._notes.append(f"ignored SIGTERM for {TERM_GRACE:g} s; killed")
                self._signal_group(signal.SIGKILL)
                self.wait(TERM_GRACE)
        # Whatever is left in its group (a child of an exited parent), then what escaped the group.
        self._signal_group(signal.SIGKILL)
        self._kill_leftovers()
        code = self._proc.poll()
        for pipe in (self._proc.stdin, self._proc.stdout):
            if pipe is not None:
                with contextlib.suppress(OSError):
                    pipe.close()
        stdout, stderr = self.output()
        elapsed = time.monotonic() - self._started
        if self._tmp is not None:
            self._tmp.cleanup()
            self._tmp = None
        self._result = ProcessResult(tuple(self.argv), None if timed_out else code, stdout, stderr, elapsed,
                                     timed_out, "; ".join(self._notes))
        return self._result


def run_process(argv: list[str], timeout: float, *, cwd: str | os.PathLike[str] | None = None,
                env: Mapping[str, str] | None = None, what: str = "target") -> ProcessResult:
    """Run ``argv`` to completion within ``timeout`` s (then it is stopped: ``timed_out``); never raises for
    how it ended, only TargetUnavailable when it cannot be started."""
    return run_handle(Process(argv, cwd=cwd, env=env, what=what), timeout)


def run_handle(handle: Handle, timeout: float) -> ProcessResult:
    """Start ``handle`` and run it to its end within ``timeout`` s (then it is stopped: ``timed_out``)."""
    handle.start()
    code: int | None = None
    try:
        code = handle.wait(timeout)
    finally:  # also when the check's own bound interrupts the wait: the group never outlives it
        result = handle.stop(timed_out=code is None)
    return result


# ---- launchers: how a cmd-style driver reaches its implementation -------------------------------------


@runtime_checkable
class Handle(Protocol):
    """One run of an implementation (a ``Process``, a container): started, watched, always stopped."""

    def start(self) -> None: ...

    def running(self) -> bool: ...

    def wait(self, timeout: float) -> int | None: ...

    def stop(self, *, timed_out: bool = False) -> ProcessResult: ...

    def __enter__(self) -> Handle: ...

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None: ...


@runtime_checkable
class Launcher(Protocol):
    """Runs the implementation of one role with the values of its placeholders."""

    def launch(self, values: Mapping[str, str], what: str) -> Handle:
        """A handle of one run with these placeholder values (not started yet)."""
        ...

    def takes(self, placeholder: str) -> bool:
        """Whether the implementation is given ``{placeholder}`` (an optional one a role may leave out)."""
        ...


@dataclass(frozen=True)
class CommandLauncher:
    """A ``cmd:`` template: each run is a ``Process`` of the template with its placeholders filled."""

    template: str

    def launch(self, values: Mapping[str, str], what: str) -> Process:
        return Process(fill_template(self.template, values), what=what)

    def takes(self, placeholder: str) -> bool:
        return "{" + placeholder + "}" in self.template


def as_launcher(target: str | Launcher) -> Launcher:
    """A launcher from a ``cmd:`` template (the form the drivers have always taken) or a launcher itself."""
    return CommandLauncher(target) if isinstance(target, str) else target
