"""The lane's own parts that need no docker: TAP parsing, testbed -> container spec, readiness probes, the moq-rs
peer program's shape (it runs in .venv-moqrs, which the default suite does not have).

Not marked ``interop``: these run in the default suite, on machines without docker too.
"""

from __future__ import annotations

import ast
import hashlib
import socket
from collections.abc import Callable
from pathlib import Path
from typing import cast

import pytest

from kvconform.targets import docker as dk
from kvconform.targets.spec import parse_target

from .moqrs_peers import ROOT, expected_object, moqrs_testbed
from .peers import CLIENT_TARGET, OUR_RELAY_TARGET, RELAY_TARGET, aiomoqt_testbed, aiomoqt_testcases
from .tap import TapError, parse_tap

PUBLISHER_TARGET = "aiomoqt-publisher"

TAP = """TAP version 14
# date: 2026-11-29T15:29:19Z
1..2
ok 1 - data-subgroup-basic
  ---
  duration_ms: 71
  sessions:
    publisher:
      alpn: "moqt-22"
  message: "15 objects received"
  ...
not ok 2 - rendezvous-timeout
  ---
  message: "REQUEST_ERROR code=0x10, expected TIMEOUT"
  expected: "REQUEST_ERROR TIMEOUT"
  ...
"""


def test_tap_points_and_diagnostics() -> None:
    ok, bad = parse_tap(TAP)
    assert (ok.name, ok.ok, ok.diagnostics["sessions"]["publisher"]["alpn"]) == ("data-subgroup-basic", True,
                                                                                 "moqt-22")
    assert (bad.name, bad.ok, bad.skipped, bad.compat) == ("rendezvous-timeout", False, False, False)
    assert "expected='REQUEST_ERROR TIMEOUT'" in bad.describe()


def test_tap_directives() -> None:
    text = "TAP version 14\n1..2\nnot ok 1 - x # SKIP unsupported test case\nok 2 - y # COMPAT\n"
    skipped, compat = parse_tap(text)
    assert skipped.skipped and skipped.directive == "SKIP unsupported test case" and not compat.skipped
    assert compat.compat and compat.ok


@pytest.mark.parametrize("text", ["ok 1 - x\n", "TAP version 14\nok 1 - x\n"])
def test_tap_without_header_or_plan_is_refused(text: str) -> None:
    with pytest.raises(TapError):
        parse_tap(text)


def test_relay_target_becomes_a_contract_container(tmp_path: Path) -> None:
    bed = aiomoqt_testbed()
    target = parse_target(RELAY_TARGET, bed)
    assert (target.kind, target.value, target.roles) == ("docker", "kvconform/aiomoqt:0.13.3",
                                                          {"moqt-relay", "kvcs-relay"})
    policy = tmp_path / "policy.yaml"
    spec = dk.contract_spec(target.value, "moqt-relay", {"port": "4433", "certs": str(tmp_path / "certs"),
                                                         "policy": str(policy)}, dk.docker_params(target))
    assert spec.image == "kvconform/aiomoqt:0.13.3"
    # The contract: the role and its values as arguments and KVCONFORM_* variables, files under /kvconform.
    assert spec.command == ["moqt-relay", "--certs", "/kvconform/0", "--policy", "/kvconform/1/policy.yaml",
                            "--port", "4433"]
    assert spec.environment["KVCONFORM_ROLE"] == "moqt-relay" and spec.environment["KVCONFORM_PORT"] == "4433"
    assert spec.writable == {str(tmp_path / "certs"): "/kvconform/0", str(tmp_path): "/kvconform/1"}
    assert spec.ready.probe == "udp-bound" and spec.ready.probe_port == 4433 and spec.ready.any_of
    assert spec.build is not None and (spec.build.context / spec.build.dockerfile).is_file()
    kwargs = dk._run_kwargs(spec)
    assert kwargs["network_mode"] == "host" and "ports" not in kwargs
    assert kwargs["volumes"][str(tmp_path)] == {"bind": "/kvconform/1", "mode": "rw"}


def test_client_and_publisher_targets_play_lane_roles() -> None:
    bed = aiomoqt_testbed()
    client = parse_target(CLIENT_TARGET, bed)
    spec = dk.contract_spec(client.value, "moqt-interop-client", {"relay": "moqt://127.0.0.1:1", "testcase": "fetch"})
    assert spec.command == ["moqt-interop-client", "--relay", "moqt://127.0.0.1:1", "--testcase", "fetch"]
    assert spec.ready.log_pattern is None and spec.ready.probe is None  # a one-shot run: no readiness
    with pytest.raises(dk.DockerUnavailable, match="no value for testcase"):
        dk.contract_spec(client.value, "moqt-interop-client", {"relay": "moqt://127.0.0.1:1"})
    publisher = parse_target(PUBLISHER_TARGET, bed)
    assert publisher.roles == {"moqt-publisher"} and publisher.params["prefill_groups"] == 2


def test_aiomoqt_entrypoint_maps_the_contract_roles() -> None:
    """The image's entrypoint declares every contract role it does not play (127 + kvconform-unsupported)."""
    script = (Path(__file__).parents[2] / "testbeds/docker/aiomoqt/kvconform-entrypoint.sh").read_text()
    for role in ("moqt-relay|kvcs-relay", "moqt-interop-client", "moqt-publisher"):
        assert f"  {role})" in script
    assert 'echo "kvconform-unsupported role=$role"' in script and "exit 127" in script


def test_testbed_declares_both_relays_and_the_client_cases() -> None:
    bed = aiomoqt_testbed()
    assert {RELAY_TARGET, CLIENT_TARGET, OUR_RELAY_TARGET} <= set(bed.targets)
    cases = aiomoqt_testcases(bed)
    assert len(cases) == len(set(cases)) == 14 and "data-subgroup-basic" in cases
    for name in (RELAY_TARGET, OUR_RELAY_TARGET):
        assert parse_target(name, bed).pics["moqt"]["alpn"] == ["moqt-22"]


def test_udp_bound_probe_sees_a_bound_port() -> None:
    port = dk.free_port("udp")
    assert not dk._probe("udp-bound", port)
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.bind(("0.0.0.0", port))  # what aiomoqt's relay does: all interfaces
        assert dk._probe("udp-bound", port)


def test_tcp_probe_sees_a_listener() -> None:
    port = dk.free_port("tcp")
    assert not dk._probe("tcp", port)
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", port))
        s.listen(1)
        assert dk._probe("tcp", port)


def test_readiness_needs_probe_and_port_together() -> None:
    with pytest.raises(ValueError, match="probe and probe_port"):
        dk.Readiness(probe="tcp")


def test_the_moqrs_peer_program_needs_only_moq_rs_and_matches_the_lane() -> None:
    """testbeds/moqrs.yaml's commands run testbeds/moqrs/moqrs_peer.py from .venv-moqrs, which holds moq-rs and
    nothing of kvconform: the program imports only moq and the standard library; the frames the lane expects
    (``expected_object``) are those its publisher writes."""
    bed = moqrs_testbed()
    script = ROOT / "testbeds" / "moqrs" / "moqrs_peer.py"
    for name in ("moqrs-relay", "moqrs-publisher", "moqrs-subscriber"):
        argv = parse_target(name, bed).value.split()
        assert argv[:2] == [".venv-moqrs/bin/python", "testbeds/moqrs/moqrs_peer.py"], argv
    tree = ast.parse(script.read_text("utf-8"))
    imported = {alias.name.split(".")[0] for node in ast.walk(tree) if isinstance(node, ast.Import)
                for alias in node.names}
    imported |= {node.module.split(".")[0] for node in ast.walk(tree)
                 if isinstance(node, ast.ImportFrom) and node.module and node.level == 0}
    assert imported - {"__future__", "argparse", "asyncio", "contextlib", "hashlib", "signal", "sys"} == {"moq"}
    payload = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "_payload")
    namespace: dict[str, object] = {}
    exec(compile(ast.Module(body=[payload], type_ignores=[]), str(script), "exec"), namespace)
    make = cast(Callable[[int, int, int], bytes], namespace["_payload"])
    made = make(7, 2, 100)
    assert expected_object(7, 2) == expected_object(7, 2, len(made))
    assert expected_object(7, 2).digest == hashlib.sha256(made).hexdigest()[:16]
