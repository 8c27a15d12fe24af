"""``--target docker:...`` against real containers: the reference image plays the roles, and a deliberately broken
contract image (tests/interop/contract-broken.yaml) gets the honest verdict for each way it breaks the contract.
After every run no container of it is left, including one that ignores SIGTERM and one whose run is interrupted.

The contract's parts that need no daemon: tests/test_docker_contract.py.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from kvconform.targets import docker as dk
from kvconform.targets.spec import parse_target
from kvconform.targets.testbed import Testbed, load_testbed
from kvconform.verdicts import TargetUnavailable, inconclusive

pytestmark = pytest.mark.interop

HERE = Path(__file__).parent
BROKEN_TESTBED = HERE / "contract-broken.yaml"
REFERENCE_IMAGE = "kvconform/reference:dev"
REFERENCE_BUILD = HERE.parents[1] / "testbeds/docker/reference/build.sh"
RUN_TIMEOUT_S = 300.0
WRITER_SUBSET = "B16-tail15 or reserved_zero_hash"  # 17 checks: enough to see the contract end to end
ONE_WRITER_CHECK = "test_block_hashes and B16-tail15-v1"


@pytest.fixture(scope="module")
def broken_testbed(docker_images: list[str]) -> Testbed:
    """The broken contract image exists (built here from its recipe when missing, bounded)."""
    bed = load_testbed(BROKEN_TESTBED)
    try:
        dk.prepare_images(bed, 600.0)
    except TargetUnavailable as exc:
        inconclusive(f"the broken contract image cannot be made: {exc}")
    return bed


@pytest.fixture(scope="module")
def reference_image(docker_images: list[str]) -> str:
    """kvconform/reference:dev exists (.ci/interop builds it from this checkout; built here when missing)."""
    client = dk.docker_client()
    try:
        dk.ensure_image(client, REFERENCE_IMAGE, dk.BuildSpec(REFERENCE_BUILD.parent, script=REFERENCE_BUILD,
                                                              timeout_s=900.0))
    except TargetUnavailable as exc:
        inconclusive(f"the reference image cannot be made: {exc}")
    finally:
        client.close()
    return REFERENCE_IMAGE


BROKEN_IMAGE = "kvconform/contract-broken:test"


def _containers_of(pid: int, image: str | None = None) -> list[str]:
    """Names of the containers (running or not) that process ``pid`` started, of ``image`` when given."""
    filters: dict[str, Any] = {"label": f"{dk.OWNER_LABEL}={pid}"}
    if image is not None:
        filters["ancestor"] = image
    client = dk.docker_client()
    try:
        return [str(c.name) for c in client.containers.list(all=True, filters=filters)]
    finally:
        client.close()


def run_suite(tmp_path: Path, suite: str, target: str, *extra: str) -> tuple[int, dict[str, Any], float]:
    """``kvconform run`` in a process of its own (its pid labels its containers): exit status, coverage, seconds;
    asserts that it left no container behind."""
    report = _report(tmp_path, suite, target)
    argv = [sys.executable, "-m", "kvconform", "run", suite, "--target", target, "--report-dir", str(report), "-q",
            *extra]
    started = time.monotonic()
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    try:
        out, _ = proc.communicate(timeout=RUN_TIMEOUT_S)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
    elapsed = time.monotonic() - started
    assert _containers_of(proc.pid) == [], f"{suite} against {target}: containers left behind"
    coverage = report / "coverage.json"
    assert coverage.is_file(), f"no report (exit {proc.returncode}): {out.decode('utf-8', 'replace')[-3000:]}"
    return proc.returncode, json.loads(coverage.read_text("utf-8")), elapsed


def _verdicts(doc: dict[str, Any]) -> dict[str, int]:
    return dict(doc["summary"]["verdicts"])


def _messages(doc: dict[str, Any]) -> set[str]:
    return {str(t.get("message", "")) for t in doc["tests"]}


def _events(report: Path) -> list[dict[str, Any]]:
    """Every evidence event of a run's report directory."""
    events: list[dict[str, Any]] = []
    for path in sorted((report / "evidence").glob("*.json")):
        events += json.loads(path.read_text("utf-8"))["events"]
    return events


def _report(tmp_path: Path, suite: str, target: str) -> Path:
    return tmp_path / f"report-{suite}-{target.replace('/', '_').replace(':', '_')}"


# ---- the reference image --------------------------------------------------------------------------------


def test_reference_image_plays_a_one_shot_and_a_server_role(reference_image: str, tmp_path: Path) -> None:
    code, doc, _ = run_suite(tmp_path, "tlkv-writer", f"docker:{reference_image}",
                             "--pics-set", "tlkv.writer.versions=[1, 2]", "-k", WRITER_SUBSET)
    assert (code, _verdicts(doc)) == (0, {"pass": 17}), doc["summary"]
    # The evidence holds each container's run (image id, the contract's arguments) and its whole output.
    events = _events(_report(tmp_path, "tlkv-writer", f"docker:{reference_image}"))
    runs = [e["fields"] for e in events if e["kind"] == "docker-run"]
    assert runs and all(r["network"] == "host" and r["command"][0] == "tlkv-writer" and r["image_id"] for r in runs)
    assert all(r["environment"]["KVCONFORM_ROLE"] == "tlkv-writer" for r in runs)
    records = [e["fields"] for e in events if e["kind"] == "writer process"]
    assert len(records) == len(runs) and all(r["returncode"] == 0 and "stderr" in r for r in records)
    assert len([e for e in events if e["kind"] == "docker-stopped"]) == len(runs)
    code, doc, _ = run_suite(tmp_path, "tlkv-decode", f"docker:{reference_image}",
                             "--pics-set", "tlkv.decode.versions=[1, 2]")
    assert code == 0 and _verdicts(doc).get("pass", 0) >= 35, doc["summary"]
    assert set(_verdicts(doc)) <= {"pass", "not-applicable"}, doc["summary"]
    events = _events(_report(tmp_path, "tlkv-decode", f"docker:{reference_image}"))
    logs = [e["fields"]["line"] for e in events if e["kind"] == "docker-log"]
    assert any("listening on 127.0.0.1:" in line for line in logs), logs  # the server's log, as it came
    (server,) = [e["fields"] for e in events if e["kind"] == "decode side process"]
    assert "listening on 127.0.0.1:" in server["stdout"] + server["stderr"], server


@pytest.mark.parametrize(("suite", "passes"), [("tlkv-prefill", 30), ("kvcs-publisher", 50), ("kvcs-consumer", 25)])
def test_reference_image_plays_the_client_roles(reference_image: str, tmp_path: Path, suite: str,
                                                passes: int) -> None:
    """A client that reaches the harness's own server, relay or publisher on 127.0.0.1 from the host network."""
    code, doc, _ = run_suite(tmp_path, suite, f"docker:{reference_image}")
    verdicts = _verdicts(doc)
    assert code == 0 and verdicts.get("pass", 0) >= passes, doc["summary"]
    assert set(verdicts) <= {"pass", "not-applicable"}, doc["summary"]
    runs = [e["fields"] for e in _events(_report(tmp_path, suite, f"docker:{reference_image}"))
            if e["kind"] == "docker-run"]
    assert runs and all(r["command"][0] == suite and r["network"] == "host" for r in runs), runs[:1]


def test_reference_image_declares_kbtp_unreachable(reference_image: str, tmp_path: Path) -> None:
    proc = subprocess.run([sys.executable, "-m", "kvconform", "run", "kbtp-target", "--target",
                           f"docker:{reference_image}", "--report-dir", str(tmp_path / "r")],
                          capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL)
    assert proc.returncode == 2 and "does not play suite 'kbtp-target'" in proc.stderr, proc.stderr


# ---- the broken image: one honest verdict per way of breaking the contract ---------------------------------


def test_a_role_the_image_declares_unsupported_is_inconclusive(broken_testbed: Testbed, tmp_path: Path) -> None:
    for suite in ("tlkv-writer", "tlkv-decode"):
        code, doc, _ = run_suite(tmp_path, suite, "broken-unsupported", "--testbed", str(BROKEN_TESTBED))
        # Never a pass, never not-applicable (that comes only from declared PICS): a gate against it exits 1.
        assert code == 1, doc["summary"]
        verdicts = _verdicts(doc)
        assert verdicts.get("inconclusive", 0) > 0 and set(verdicts) <= {"inconclusive", "not-applicable"}, verdicts
        declared = (f"the image declares it does not play {suite} ({BROKEN_IMAGE} exited 127 with "
                    f"kvconform-unsupported; contract item 'unsupported' (docs/docker-contract.md#unsupported))")
        inconclusive_msgs = {str(t["message"]) for t in doc["tests"] if t["verdict"] == "inconclusive"}
        assert inconclusive_msgs and all(declared in m for m in inconclusive_msgs), inconclusive_msgs
        # Only checks of an undeclared version end not-applicable, by the PICS, before the image is asked anything.
        assert all(str(t["message"]).startswith("PICS tlkv.") for t in doc["tests"]
                   if t["verdict"] == "not-applicable"), _messages(doc)
        unsupported = [e for e in _events(_report(tmp_path, suite, "broken-unsupported"))
                       if e["kind"].endswith("container") and "kvconform-unsupported" in e["fields"]["stdout"]]
        assert unsupported, "the declaration is in the evidence"


def test_an_exit_127_without_the_declaration_is_inconclusive(broken_testbed: Testbed, tmp_path: Path) -> None:
    code, doc, _ = run_suite(tmp_path, "tlkv-writer", "broken-exit127", "--testbed", str(BROKEN_TESTBED),
                             "-k", ONE_WRITER_CHECK)
    assert code == 1 and _verdicts(doc) == {"inconclusive": 1}, doc["summary"]
    message = doc["tests"][0]["message"]
    assert "exited 127 as tlkv-writer without printing 'kvconform-unsupported role=tlkv-writer' (contract item " \
           "'unsupported'" in message and "vendor-kv-tool: not found" in message, message


def test_an_image_without_the_contract_label_is_not_run(docker_images: list[str], tmp_path: Path) -> None:
    code, doc, _ = run_suite(tmp_path, "tlkv-writer", "docker:kvconform/trixie-base:latest", "-k", ONE_WRITER_CHECK)
    assert code == 1 and _verdicts(doc) == {"inconclusive": 1}, doc["summary"]
    message = doc["tests"][0]["message"]
    assert "label org.kvconform.contract is None, expected '1'" in message and "contract item 'label'" in message


def test_an_image_that_exits_3_fails_a_one_shot_role_and_cannot_start_a_server(broken_testbed: Testbed,
                                                                                tmp_path: Path) -> None:
    code, doc, _ = run_suite(tmp_path, "tlkv-writer", "broken-exit3", "--testbed", str(BROKEN_TESTBED),
                             "-k", ONE_WRITER_CHECK)
    assert code == 1 and _verdicts(doc) == {"fail": 1}, doc["summary"]
    assert "writer exited 3 without envelope.bin: broken: exiting 3 as tlkv-writer" in doc["tests"][0]["message"]
    code, doc, _ = run_suite(tmp_path, "tlkv-decode", "broken-exit3", "--testbed", str(BROKEN_TESTBED))
    assert code == 1 and set(_verdicts(doc)) == {"inconclusive"}, doc["summary"]  # nothing was exchanged
    first = next(t for t in doc["tests"] if "a shared setup" not in t["message"])
    assert "exited 3 before it was ready (contract item 'readiness'" in first["message"], first["message"]
    assert "broken: exiting 3 as tlkv-decode" in first["message"], "the container's output is in the message"


def test_a_server_that_hangs_before_ready_is_inconclusive_within_its_bound(broken_testbed: Testbed,
                                                                            tmp_path: Path) -> None:
    code, doc, elapsed = run_suite(tmp_path, "tlkv-decode", "broken-hang", "--testbed", str(BROKEN_TESTBED))
    assert code == 1 and set(_verdicts(doc)) == {"inconclusive"}, doc["summary"]
    first = next(t for t in doc["tests"] if "a shared setup" not in t["message"])
    assert "was not ready within 3 s" in first["message"] and "contract item 'readiness'" in first["message"]
    events = _events(_report(tmp_path, "tlkv-decode", "broken-hang"))
    assert any(e["kind"] == "docker-log" and e["fields"]["line"] == "broken: hanging as tlkv-decode" for e in events)
    # 3 s of readiness, 2 s of ignored SIGTERM, the run's own start-up: bounded, not the 300 s check bound.
    assert elapsed < 60, f"the run took {elapsed:.0f} s"


def test_a_one_shot_role_that_hangs_fails_the_check(broken_testbed: Testbed, tmp_path: Path) -> None:
    code, doc, _ = run_suite(tmp_path, "tlkv-writer", "broken-hang", "--testbed", str(BROKEN_TESTBED),
                             "-k", ONE_WRITER_CHECK)
    assert code == 1 and _verdicts(doc) == {"fail": 1}, doc["summary"]
    assert "did not finish within 30 s" in doc["tests"][0]["message"]


# ---- containers are always removed -----------------------------------------------------------------------


def test_a_container_that_ignores_sigterm_is_killed_and_removed(broken_testbed: Testbed) -> None:
    target = parse_target("broken-ready-ignore-term", broken_testbed)
    launcher = dk.ContainerLauncher(target.value, "tlkv-decode", dk.docker_params(target))
    run = launcher.launch({"port": str(dk.free_port("tcp"))}, "decode side")
    run.start()  # ready by its line
    assert run.running() and _containers_of(os.getpid(), BROKEN_IMAGE)
    started = time.monotonic()
    result = run.stop()
    assert time.monotonic() - started >= 2, "stopped before its SIGTERM grace (stop_timeout_s: 2) ran out"
    assert result.returncode is None and "ignored SIGTERM for 2 s; killed" in result.note
    assert b"kvconform-ready port=" in result.stdout
    assert _containers_of(os.getpid(), BROKEN_IMAGE) == []


def test_an_interrupted_run_leaves_no_container(broken_testbed: Testbed, tmp_path: Path) -> None:
    argv = [sys.executable, "-m", "kvconform", "run", "tlkv-decode", "--testbed", str(BROKEN_TESTBED), "--target",
            "broken-hang-long", "--report-dir", str(tmp_path / "r"), "-q"]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 60
        while not _containers_of(proc.pid):  # the decode side is up, waiting to get ready (120 s)
            assert proc.poll() is None and time.monotonic() < deadline, "the run started no container"
            time.sleep(0.2)  # polling the daemon: there is no event for "a container of this pid exists"
        proc.send_signal(signal.SIGINT)  # Ctrl-C
        proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
    assert _containers_of(proc.pid) == [], "the interrupted run left its container"


@pytest.fixture(autouse=True)
def _nothing_left_by_this_process() -> Iterator[None]:
    yield
    assert _containers_of(os.getpid(), BROKEN_IMAGE) == [], "a test of this module left a container"
