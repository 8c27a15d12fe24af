"""The one process driver (targets/process.py): bounded, output as bytes, and nothing left behind — against
targets that fork, daemonise, hang, ignore SIGTERM, hold stdout open, or write bytes that are not UTF-8."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import pytest

from kvconform.targets.process import Process, fill_template, marked_pids, run_process
from kvconform.verdicts import DriverError, TargetUnavailable

PY = sys.executable

# Each script is a misbehaving target; "ready" on stdout tells the test its children exist.
FORKS = """
import os, time
for _ in range(3):
    if os.fork() == 0:
        time.sleep(600)
print("ready", flush=True)
time.sleep(600)
"""
DAEMON = """
import os, sys, time
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        sys.stdout.write("daemon up\\n"); sys.stdout.flush()
        time.sleep(600)
    os._exit(0)
os.wait()
print("ready", flush=True)
"""
IGNORES_TERM = """
import signal, time
signal.signal(signal.SIGTERM, signal.SIG_IGN)
print("ready", flush=True)
time.sleep(600)
"""
HOLDS_STDOUT = """
import os, time
if os.fork() == 0:
    time.sleep(600)   # keeps the inherited stdout open long after its parent exited
print("done", flush=True)
"""


@pytest.mark.parametrize("script", [FORKS, DAEMON, IGNORES_TERM], ids=["forks", "daemonises", "ignores-sigterm"])
def test_nothing_is_left_behind(script: str) -> None:
    proc = Process([PY, "-c", script])
    proc.start()
    deadline = time.monotonic() + 20.0
    while b"ready" not in proc.output()[0] and time.monotonic() < deadline:
        proc.wait(0.05)
    assert b"ready" in proc.output()[0], proc.output()
    assert marked_pids(proc.mark), "the target's processes carry the mark"
    started = time.monotonic()
    result = proc.stop()
    assert time.monotonic() - started < 15.0
    assert marked_pids(proc.mark) == [], "processes of the target survived stop()"
    if script is IGNORES_TERM:
        assert "ignored SIGTERM" in result.note
    if script is DAEMON:
        assert "left its process group" in result.note


def test_a_hang_is_stopped_at_its_bound() -> None:
    started = time.monotonic()
    result = run_process([PY, "-c", "import time; print('x', flush=True); time.sleep(600)"], 0.5)
    assert result.timed_out and result.returncode is None and time.monotonic() - started < 10.0
    assert result.stdout == b"x\n"


def test_a_child_holding_stdout_cannot_stall_the_harness() -> None:
    started = time.monotonic()
    result = run_process([PY, "-c", HOLDS_STDOUT], 30.0)
    assert time.monotonic() - started < 10.0, "the driver waited for the child's end of stdout"
    assert result.returncode == 0 and not result.timed_out and result.stdout == b"done\n"


def test_output_is_bytes_and_decoded_with_replacement_only_for_the_evidence() -> None:
    result = run_process([PY, "-c", "import sys; sys.stderr.buffer.write(b'bad \\xff byte'); print('ok')"], 30.0)
    assert result.returncode == 0 and result.stderr == b"bad \xff byte"
    assert result.stderr_text == "bad \ufffd byte" and result.evidence()["stdout"] == "ok\n"


def test_a_missing_program_is_unavailable_and_templates_name_unknown_placeholders(tmp_path: Path) -> None:
    with pytest.raises(TargetUnavailable, match="cannot start"):
        run_process([str(tmp_path / "no-such-program")], 5.0)
    assert fill_template("tool --in '{a} b' {c}", {"a": "x y", "c": "z"}) == ["tool", "--in", "x y b", "z"]
    with pytest.raises(DriverError, match="placeholder 'missing' has no value"):
        fill_template("tool {missing}", {"a": "1"})


def test_an_interrupted_run_still_stops_the_process_group(monkeypatch: pytest.MonkeyPatch) -> None:
    """pytest-timeout interrupts a wait by raising in it: run_process must still stop what it started."""
    import signal as sig

    def interrupt(signum: int, frame: object) -> None:
        raise TimeoutError("the check's bound")

    marks: list[str] = []
    original = Process.start

    def start(self: Process) -> None:
        marks.append(self.mark)
        original(self)

    monkeypatch.setattr(Process, "start", start)
    previous = sig.signal(sig.SIGALRM, interrupt)
    sig.setitimer(sig.ITIMER_REAL, 0.5)
    try:
        with pytest.raises(TimeoutError):
            run_process([PY, "-c", FORKS], 60.0)
    finally:
        sig.setitimer(sig.ITIMER_REAL, 0)
        sig.signal(sig.SIGALRM, previous)
    assert marks and marked_pids(marks[0]) == []
