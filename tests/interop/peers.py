"""The two relays and the third-party client of the interop lane, each started and stopped with a bound.

- aiomoqt's relay: ``testbeds/aiomoqt.yaml`` target ``aiomoqt-relay``, the image asked for role ``moqt-relay``
  under the container contract (docs/docker-contract.md) by the same driver ``--target aiomoqt-relay`` uses
  (host network, 127.0.0.1);
- our relay: ``kvconform serve moqt-relay`` as a subprocess on 127.0.0.1;
- aiomoqt's moq-interop-runner client: target ``aiomoqt-client``, role ``moqt-interop-client``, one container
  per test case.

Used by the lane's fixtures (``conftest.py``) and by ``bench/bench_moqt_relay.py``.
"""

from __future__ import annotations

import contextlib
import json
import queue
import shlex
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kvconform import evidence
from kvconform.targets import docker as dk
from kvconform.targets.drivers import driver_for
from kvconform.targets.spec import TargetSpec, parse_target
from kvconform.targets.testbed import Testbed, default_testbed_path, load_testbed
from kvconform.verdicts import DriverError, TargetUnavailable

from .tap import TapError, TapPoint, parse_tap

__all__ = [
    "CLIENT_TARGET",
    "OUR_RELAY_TARGET",
    "RELAY_TARGET",
    "TESTBED_FILE",
    "RelayEndpoint",
    "aiomoqt_relay",
    "aiomoqt_testbed",
    "aiomoqt_testcases",
    "our_relay",
    "run_aiomoqt_client",
    "spawned_relay",
    "suite_report_dir",
    "suite_verdicts",
]

TESTBED_FILE = Path(default_testbed_path()).parent / "aiomoqt.yaml"
RELAY_TARGET = "aiomoqt-relay"
CLIENT_TARGET = "aiomoqt-client"
OUR_RELAY_TARGET = "kvconform-relay"
READY_TIMEOUT_S = 20.0
CLIENT_TIMEOUT_S = 60.0


def suite_report_dir(base: str | None, name: str, tmp_path: Path) -> Path:
    """Where a suite run inside an interop test reports: under the session's --kvconform-report-dir when given."""
    return Path(base) / name if base else tmp_path / "report"


def suite_verdicts(suite: str, url: str, report: Path, timeout: float,
                   testbed_file: Path = TESTBED_FILE) -> dict[str, dict[str, Any]]:
    """Run ``kvconform run <suite>`` against ``url`` in a testbed (default: aiomoqt's), bounded: check function ->
    its coverage entry (the spawn and the suite's output go into the evidence)."""
    argv = [sys.executable, "-m", "kvconform", "run", suite, "--testbed", str(testbed_file), "--target", url,
            "--report-dir", str(report), "-q"]
    evidence.record("sent", "spawn", {"argv": argv})
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL)
    evidence.record("received", "suite-exit", {"code": proc.returncode, "stdout": proc.stdout[-4000:],
                                               "stderr": proc.stderr[-2000:]})
    coverage = report / "coverage.json"
    assert coverage.is_file(), \
        f"the suite wrote no report (exit {proc.returncode}): {proc.stdout[-2000:]}{proc.stderr[-2000:]}"
    tests = json.loads(coverage.read_text("utf-8"))["tests"]
    return {t["nodeid"].rsplit("::", 1)[-1].split("[", 1)[0]: t for t in tests}


@dataclass(frozen=True)
class RelayEndpoint:
    """A running relay: who it is and where (always 127.0.0.1)."""

    name: str
    port: int

    @property
    def url(self) -> str:
        return f"moqt://127.0.0.1:{self.port}"


def aiomoqt_testbed() -> Testbed:
    """The aiomoqt testbed (validated)."""
    return load_testbed(TESTBED_FILE)


def aiomoqt_testcases(testbed: Testbed | None = None) -> list[str]:
    """The moq-interop-runner test cases the aiomoqt client target declares."""
    bed = testbed or aiomoqt_testbed()
    return list(bed.targets[CLIENT_TARGET]["params"]["testcases"])


def _target(testbed: Testbed, name: str) -> TargetSpec:
    return parse_target(name, testbed)


@contextlib.contextmanager
def aiomoqt_relay(testbed: Testbed) -> Iterator[RelayEndpoint]:
    """aiomoqt's relay in docker on a free UDP port of 127.0.0.1, ready (port bound), with the harness's test
    certificate; it authorizes nothing, so the policy it is given allows all."""
    relay = driver_for("moqt-relay", _target(testbed, RELAY_TARGET))
    url = relay.start({"version": 1, "allow_all": True})
    try:
        yield RelayEndpoint("aiomoqt", int(url.rpartition(":")[2]))
    finally:
        relay.stop()


def run_aiomoqt_client(testbed: Testbed, testcase: str, relay_url: str,
                       timeout_s: float = CLIENT_TIMEOUT_S) -> TapPoint:
    """Run one moq-interop-runner test case of aiomoqt's client against ``relay_url``; its TAP point.
    Exit 127 (the client does not support the case) ends the test not-applicable."""
    from kvconform.verdicts import not_applicable

    target = _target(testbed, CLIENT_TARGET)
    spec = dk.contract_spec(target.value, "moqt-interop-client", {"relay": relay_url, "testcase": testcase},
                            dk.docker_params(target))
    result = dk.run_to_completion(spec, timeout_s)
    if result.exit_code == 127:
        not_applicable(f"aiomoqt client does not support test case {testcase!r}: {result.stdout[-300:]}")
    try:
        points = parse_tap(result.stdout)
    except TapError as exc:
        raise DriverError(f"aiomoqt client, test case {testcase}: exit {result.exit_code}, {exc}; "
                          f"stderr: {result.stderr[-1500:]}") from exc
    if len(points) != 1 or points[0].name != testcase:
        raise DriverError(f"aiomoqt client, test case {testcase}: expected one TAP point named {testcase}, got "
                          f"{[p.name for p in points]}")
    point = points[0]
    if point.ok != (result.exit_code == 0):
        raise DriverError(f"aiomoqt client, test case {testcase}: TAP says ok={point.ok} but exit code is "
                          f"{result.exit_code}")
    evidence.record("received", "tap-point", {"testcase": testcase, "ok": point.ok, "directive": point.directive,
                                              "diagnostics": point.diagnostics})
    return point


# ---- our relay -----------------------------------------------------------------------------------------


def _follow(stream: Iterator[str], lines: queue.Queue[str | None], name: str) -> None:
    for line in stream:
        line = line.rstrip("\n")
        evidence.record("received", "relay-log", {"relay": name, "line": line})
        lines.put(line)
    lines.put(None)


@contextlib.contextmanager
def our_relay(testbed: Testbed, extra_args: tuple[str, ...] = ()) -> Iterator[RelayEndpoint]:
    """The testbed's ``kvconform-relay`` command (``kvconform serve moqt-relay``) on a free UDP port of
    127.0.0.1, run by this interpreter, ready when it prints ``listening on``; SIGTERM (then SIGKILL) on
    exit, every wait bounded."""
    port = dk.free_port("udp")
    argv = shlex.split(_target(testbed, OUR_RELAY_TARGET).value.replace("{port}", str(port)))
    if argv[:1] == ["kvconform"]:
        argv[:1] = [sys.executable, "-m", "kvconform"]  # this checkout's, not whatever is on PATH
    argv += extra_args
    with spawned_relay(argv, "kvconform", port) as endpoint:
        yield endpoint


@contextlib.contextmanager
def spawned_relay(argv: list[str], name: str, port: int, cwd: Path | None = None) -> Iterator[RelayEndpoint]:
    """A relay process on ``port`` of 127.0.0.1, ready when it prints ``listening on``; its output goes into the
    evidence; SIGTERM (then SIGKILL) on exit, every wait bounded."""
    evidence.record("sent", "spawn", {"argv": argv})
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1, cwd=cwd,
                            stdin=subprocess.DEVNULL)
    lines: queue.Queue[str | None] = queue.Queue()
    assert proc.stdout is not None
    reader = threading.Thread(target=_follow, args=(proc.stdout, lines, name), daemon=True)
    reader.start()
    try:
        deadline = time.monotonic() + READY_TIMEOUT_S
        seen: list[str] = []
        while True:
            remaining = deadline - time.monotonic()
            try:
                line = lines.get(timeout=max(remaining, 0.001))
            except queue.Empty:
                raise TargetUnavailable(f"{argv}: no 'listening on' within {READY_TIMEOUT_S} s; output {seen!r}") \
                    from None
            if line is None:
                raise TargetUnavailable(f"{argv}: exited {proc.wait(5)} before listening; output {seen!r}")
            seen.append(line)
            if line.startswith("listening on"):
                break
        yield RelayEndpoint(name, port)
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=5)
        reader.join(timeout=5)
        evidence.record("note", "relay-exit", {"relay": name, "returncode": proc.returncode})
