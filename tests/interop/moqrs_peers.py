"""moq-rs 0.5.1 (testbeds/moqrs.yaml) as the interop lane's second MOQT peer: its relay, publisher and subscriber
(testbeds/moqrs/moqrs_peer.py) as host processes of the dedicated environment ``.venv-moqrs`` on 127.0.0.1.

A host process, not a container: moq-rs is one pure-Python wheel over one self-contained manylinux wheel
(moq-ffi) with no system dependency, so a venv isolates it as well as an image would (its own interpreter and
packages, nothing of kvconform) and ``.ci/interop prepare`` makes it in seconds, where an image needs the
debootstrap base and minutes. Each peer is its own process, started and stopped here with bounds.
"""

from __future__ import annotations

import contextlib
import hashlib
import queue
import signal
import subprocess
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from kvconform import evidence
from kvconform.targets import docker as dk
from kvconform.targets.process import fill_template
from kvconform.targets.spec import parse_target
from kvconform.targets.testbed import Testbed, default_testbed_path, load_testbed
from kvconform.verdicts import TargetUnavailable

from .peers import RelayEndpoint, spawned_relay

__all__ = ["ENV_DIR", "ROOT", "TESTBED_FILE", "MoqrsObject", "expected_object", "moqrs_problem", "moqrs_publisher",
           "moqrs_relay", "moqrs_subscriber", "moqrs_testbed"]

TESTBED_FILE = Path(default_testbed_path()).parent / "moqrs.yaml"
ROOT = TESTBED_FILE.parent.parent
ENV_DIR = ROOT / ".venv-moqrs"  # made by .ci/interop prepare: `pip install moq-rs==0.5.1`, nothing else
RELAY_TARGET = "moqrs-relay"
PUBLISHER_TARGET = "moqrs-publisher"
SUBSCRIBER_TARGET = "moqrs-subscriber"
READY_TIMEOUT_S = 20.0
SUBSCRIBER_TIMEOUT_S = 30.0
OBJECT_SIZE = 100  # moqrs_peer.py's default --size


def moqrs_testbed() -> Testbed:
    """The moq-rs testbed (validated)."""
    return load_testbed(TESTBED_FILE)


def moqrs_problem() -> str | None:
    """Why moq-rs cannot run here (its environment is missing or does not import), or None."""
    python = ENV_DIR / "bin" / "python"
    if not python.is_file():
        return f"{python} is missing: `.ci/interop prepare` makes the moq-rs environment"
    try:
        proc = subprocess.run([str(python), "-c", "import moq, moq_ffi"], capture_output=True, text=True,
                              timeout=60, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        return f"{python} -c 'import moq' did not finish within 60 s"
    if proc.returncode != 0:
        return f"{python} cannot import moq-rs: {proc.stderr[-500:]}"
    return None


def _argv(testbed: Testbed, target: str, values: dict[str, str], *extra: str) -> list[str]:
    """The target's ``cmd:`` with its placeholders filled; run with the checkout as working directory."""
    return fill_template(parse_target(target, testbed).value, values) + list(extra)


@contextlib.contextmanager
def moqrs_relay(testbed: Testbed) -> Iterator[RelayEndpoint]:
    """moq-rs's relay (moq.Server, generated self-signed certificate) on a free UDP port of 127.0.0.1, ready."""
    port = dk.free_port("udp")
    with spawned_relay(_argv(testbed, RELAY_TARGET, {"port": str(port)}), "moq-rs", port, cwd=ROOT) as endpoint:
        yield endpoint


@dataclass(frozen=True)
class MoqrsObject:
    """One frame moq-rs's subscriber printed: ``object <group> <index> <len> <sha256 prefix>``."""

    group: int
    index: int
    size: int
    digest: str


def expected_object(group: int, index: int, size: int = OBJECT_SIZE) -> MoqrsObject:
    """What moq-rs's publisher sends as frame ``index`` of group ``group`` (moqrs_peer._payload)."""
    head = f"g{group}o{index}".encode()
    payload = head + b"." * max(size - len(head), 0)
    return MoqrsObject(group, index, len(payload), hashlib.sha256(payload).hexdigest()[:16])


def _reader(proc: subprocess.Popen[str], lines: queue.Queue[str | None], who: str) -> None:
    assert proc.stdout is not None
    for line in proc.stdout:
        evidence.record("received", "peer-output", {"peer": who, "line": line.rstrip()})
        lines.put(line.rstrip())
    lines.put(None)


def _stop(proc: subprocess.Popen[str], who: str) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=5)
    evidence.record("note", "peer-exit", {"peer": who, "returncode": proc.returncode})


@contextlib.contextmanager
def moqrs_publisher(testbed: Testbed, relay_url: str, *extra: str) -> Iterator[None]:
    """moq-rs's publisher at ``relay_url`` (``extra``: moqrs_peer.py options), ready once its first group went
    out (it prints ``group 0``); stopped on exit."""
    argv = _argv(testbed, PUBLISHER_TARGET, {"relay_url": relay_url}, *extra)
    evidence.record("sent", "spawn", {"argv": argv})
    proc = subprocess.Popen(argv, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1,
                            stdin=subprocess.DEVNULL)
    lines: queue.Queue[str | None] = queue.Queue()
    reader = threading.Thread(target=_reader, args=(proc, lines, "moq-rs publisher"), daemon=True)
    reader.start()
    try:
        deadline = time.monotonic() + READY_TIMEOUT_S
        seen: list[str] = []
        while True:
            try:
                line = lines.get(timeout=max(deadline - time.monotonic(), 0.001))
            except queue.Empty:
                raise TargetUnavailable(f"moq-rs publisher: no first group within {READY_TIMEOUT_S} s; {seen}") \
                    from None
            if line is None:
                raise TargetUnavailable(f"moq-rs publisher exited {proc.wait(5)} before publishing: {seen}")
            seen.append(line)
            if line.startswith("group "):
                break
        yield
    finally:
        _stop(proc, "moq-rs publisher")
        reader.join(timeout=5)


def moqrs_subscriber(testbed: Testbed, relay_url: str, *extra: str, timeout: float = SUBSCRIBER_TIMEOUT_S,
                     ) -> tuple[list[MoqrsObject], subprocess.CompletedProcess[str]]:
    """Run moq-rs's subscriber at ``relay_url`` to its end (bounded): the objects it printed, and how it ended."""
    argv = _argv(testbed, SUBSCRIBER_TARGET, {"relay_url": relay_url}, *extra)
    evidence.record("sent", "spawn", {"argv": argv})
    proc = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL)
    evidence.record("received", "peer-exit", {"peer": "moq-rs subscriber", "code": proc.returncode,
                                              "stdout": proc.stdout[-4000:], "stderr": proc.stderr[-2000:]})
    objects = []
    for line in proc.stdout.splitlines():
        if line.startswith("object "):
            _, group, index, size, digest = line.split()
            objects.append(MoqrsObject(int(group), int(index), int(size), digest))
    return objects, proc
