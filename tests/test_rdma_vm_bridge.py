"""The `cmd:` bridge into the RDMA testbed VM (testbeds/rdma_vm/bridge.py), tried on the host: the agent serving
the userspace wire instead of a device, the relay as the kbtp-initiator run's `cmd:` process. The reference
initiator forked per bed passes the order checks judged over RoCEv2 from the harness target's end of the wire,
as it does on rxe1 in the rdma lane (tests/rdma_vm/lane.py facing_runs); and the pieces that say no: the agent's
header, the relay's rewrite, `serve kbtp-initiator --binding verbs` without a device. ~10 s."""

from __future__ import annotations

import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from kvconform.targets.kbtp_wire import harness_link
from kvconform.testbeds.rdma_vm.bridge import guest_url, initiator_argv, read_header
from kvconform.verdicts import TargetUnavailable
from tests.mutants.runner import run_suite
from tests.spawn import covering, kvconform

RUN_TIMEOUT_S = 120
START_S = 60
ORDER_CHECKS = ("test_direct_load_sequence", "test_direct_alloc_slot_reads")
PICS = ("kbtp.initiator.binding=ib-rc", "kbtp.initiator.features=[DIRECT_LOAD, DIRECT_ALLOC, ADDR_LE]")


@contextmanager
def agent(*devices: str) -> Iterator[int]:
    """The bridge's agent on 127.0.0.1 (a free port); yields its port; stopped at the end."""
    argv = [sys.executable, "-m", "kvconform.testbeds.rdma_vm.bridge_agent", "--host", "127.0.0.1", "--port", "0"]
    proc = subprocess.Popen([*argv, *(a for d in devices for a in ("--device", d))], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True)
    watchdog = threading.Timer(START_S, proc.kill)
    watchdog.start()
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline().strip()
        watchdog.cancel()
        assert line.startswith("listening on 127.0.0.1:"), f"the agent printed {line!r}"
        yield int(line.removeprefix("listening on 127.0.0.1:").split()[0])
    finally:
        watchdog.cancel()
        proc.terminate()
        proc.communicate(timeout=30)


def _relay(port: int) -> str:
    return (f"cmd:{sys.executable} -m kvconform.testbeds.rdma_vm.bridge relay --port {port} --host-from-guest "
            "127.0.0.1 --target {target} --initiator-id {initiator_id} --features={features} --profile ib-rc")


@covering(RUN_TIMEOUT_S)
def test_the_reference_initiator_forked_by_the_agent_passes_the_order_checks(tmp_path: Path) -> None:
    with agent("roce=wire", "iwarp=wire") as port:
        run = run_suite("kbtp-initiator", _relay(port), tmp_path, pics=PICS, checks=ORDER_CHECKS,
                        timeout=RUN_TIMEOUT_S)
    verdicts = {t["nodeid"].split("::")[-1]: t for t in run.coverage.get("tests", [])}
    assert set(ORDER_CHECKS) <= set(verdicts), run.output
    for check in ORDER_CHECKS:
        assert verdicts[check]["verdict"] == "pass", (verdicts[check], run.output)
        evidence = (tmp_path / "evidence" / f"kbtp_initiator_test_direct.py_{check}.json").read_text()
        assert "judged over the wire" in evidence, evidence[:2000]


def test_the_agent_refuses_a_wire_it_serves_no_device_for() -> None:
    with agent("iwarp=wire") as port, socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
        sock.sendall(b'{"target": "kbtp+roce://10.0.2.2:1"}\n')
        sock.settimeout(30)
        answer = sock.makefile("rb").readline()
    assert b"bridge: header: target 'kbtp+roce://10.0.2.2:1': this agent serves iwarp" in answer, answer


def test_the_header_and_the_arguments_it_makes() -> None:
    devices = {"roce": "rxe1", "iwarp": "siw1"}
    assert initiator_argv({"target": "kbtp+iwarp://10.0.2.2:5", "features": "", "initiator_id": "ab"}, devices) == [
        "--target", "kbtp+iwarp://10.0.2.2:5", "--binding", "verbs", "--device", "siw1", "--initiator-id=ab",
        "--features="]
    for bad in ({}, {"target": "cmd:x"}, {"target": "kbtp+roce://h:1", "profile": 3}):
        with pytest.raises(ValueError, match="header"):
            initiator_argv(bad, devices)
    a, b = socket.socketpair()
    with a, b:
        b.sendall(b'[1]\n{"op": "hello"}\n')
        with pytest.raises(ValueError, match="JSON object"):
            read_header(a)
        assert a.recv(64) == b'{"op": "hello"}\n'  # the header is read up to its newline, not beyond


def test_the_relay_rewrites_only_the_host_of_a_loopback_target() -> None:
    assert guest_url("kbtp+roce://127.0.0.1:4567") == "kbtp+roce://10.0.2.2:4567"
    with pytest.raises(ValueError, match=r"127\.0\.0\.1:PORT"):
        guest_url("kbtp+roce://192.0.2.1:4567")


def test_the_harness_link_is_the_query_of_kbtp_roce() -> None:
    link = harness_link("ether=127.0.0.1:1000,127.0.0.1:1001&address=10.78.0.1")
    assert link is not None and link.address == "10.78.0.1" and link.peer == ("127.0.0.1", 1001)
    assert harness_link("") is None
    with pytest.raises(TargetUnavailable, match="--kbtp-harness-link"):
        harness_link("ether=127.0.0.1:1000")


@covering(60, 60)
def test_the_harness_link_is_refused_where_it_cannot_apply(tmp_path: Path) -> None:
    """`kvconform run --kbtp-harness-link` names itself when the initiator under test is not a cmd: process over
    RoCEv2, and when its text is no link."""
    link = ("--kbtp-harness-link", "ether=127.0.0.1:1000,127.0.0.1:1001&address=10.78.0.1")
    run = run_suite("kbtp-initiator", "reference", tmp_path / "ref", extra=link, timeout=60)
    assert run.code == 2 and "--kbtp-harness-link: the initiator reference is not a cmd: process" in run.output, \
        run.output
    run = run_suite("kbtp-initiator", f"cmd:{sys.executable} -c pass {{target}}", tmp_path / "bad",
                    extra=("--kbtp-harness-link", "ether=127.0.0.1:1000"), timeout=60)
    assert run.code == 2 and "--kbtp-harness-link 'ether=127.0.0.1:1000'" in run.output, run.output


@covering(30, 30, 30)
def test_serve_kbtp_initiator_on_a_device_says_why_it_cannot() -> None:
    base = ["serve", "kbtp-initiator", "--target", "kbtp+roce://127.0.0.1:1"]
    proc = kvconform([*base, "--binding", "verbs"], timeout=30)
    assert proc.returncode == 2 and "--binding verbs needs --device" in proc.stderr, proc.stderr
    proc = kvconform([*base, "--device", "rxe1"], timeout=30)
    assert proc.returncode == 2 and "--device and --local go with --binding verbs" in proc.stderr, proc.stderr
    proc = kvconform([*base, "--binding", "verbs", "--device", "nosuch9"], timeout=30)
    assert proc.returncode == 2 and ("pyverbs is not importable" in proc.stderr or "no verbs device" in proc.stderr), \
        proc.stderr
