"""`kvconform serve tlkv-decode`: a spawned process that announces its port and stops on a signal."""

from __future__ import annotations

import signal
import subprocess
import sys
import threading
from collections.abc import Iterator

import pytest

from kvconform.components import component
from kvconform.components.tlkv import serve_tlkv_decode
from kvconform.tlkv.grpc_client import KvTransferClient
from tests.tlkv.helpers import GEOMETRY, Kit

TIMEOUT = 30.0


def read_listening_line(proc: subprocess.Popen[str]) -> str:
    """The first stdout line, read with a bound (a watchdog kills a process that never prints)."""
    watchdog = threading.Timer(TIMEOUT, proc.kill)
    watchdog.start()
    try:
        assert proc.stdout is not None
        return proc.stdout.readline().strip()
    finally:
        watchdog.cancel()


@pytest.fixture
def spawned() -> Iterator[subprocess.Popen[str]]:
    proc = subprocess.Popen(
        [sys.executable, "-m", "kvconform.cli", "serve", "tlkv-decode", "--port", "0",
         "--pool", str(GEOMETRY), "--formats", "1"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True)
    try:
        yield proc
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.communicate(timeout=TIMEOUT)


def test_registered() -> None:
    assert component("tlkv-decode") is serve_tlkv_decode


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_spawned_server_serves_and_stops_on_signal(spawned: subprocess.Popen[str], kit: Kit, signum: int) -> None:
    line = read_listening_line(spawned)
    assert line.startswith("listening on 127.0.0.1:"), line
    address = line.removeprefix("listening on ")
    with KvTransferClient(address, timeout=10.0) as client:
        assert client.push(kit.chunks(version=1)).ok
        assert client.has_blocks(kit.hashes[:2]) == [True, True]
        v2 = client.push([kit.chunk(0, version=2)])  # --formats 1: v2 is not read
        assert v2.status_name == "FAILED_PRECONDITION"
    spawned.send_signal(signum)
    assert spawned.wait(timeout=TIMEOUT) == 0


def test_in_process_stop_event_and_bad_arguments(capsys: pytest.CaptureFixture[str]) -> None:
    assert serve_tlkv_decode(["--pool", "1,2"]) == 2
    assert serve_tlkv_decode(["--versions", "3"]) == 2
    stop = threading.Event()
    stop.set()  # already set: start, announce, stop at once
    handler = signal.getsignal(signal.SIGINT)
    assert serve_tlkv_decode(["--port", "0", "--pool", str(GEOMETRY)], stop=stop) == 0
    assert capsys.readouterr().out.startswith("listening on 127.0.0.1:")
    assert signal.getsignal(signal.SIGINT) is handler  # in-process: the caller's handlers are untouched
