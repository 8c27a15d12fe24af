"""The container contract without docker (docs/docker-contract.md): ``docker:`` targets, the arguments,
environment and mounts a role is asked with, the readiness and unsupported lines, what an exit 127 means and the
reference image's entrypoint. The same contract against a real daemon: tests/interop/test_docker_contract.py."""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any, ClassVar

import pytest

from kvconform.targets import contract
from kvconform.targets import docker as dk
from kvconform.targets import reference_image as ri
from kvconform.targets.drivers import driver_for
from kvconform.targets.process import CommandLauncher, ProcessResult
from kvconform.targets.registry import ROLES, suite_roles
from kvconform.targets.spec import TargetError, parse_target
from kvconform.targets.testbed import TestbedError, load_testbed
from kvconform.verdicts import INCONCLUSIVE_PREFIX, NOT_APPLICABLE_PREFIX, TargetUnavailable

ROOT = Path(__file__).parents[1]
IMAGE = "kvconform/reference:dev"


# ---- docker: targets -----------------------------------------------------------------------------------


def test_docker_target_plays_every_contract_role_but_kbtp() -> None:
    target = parse_target(f"docker:{IMAGE}", load_testbed())
    assert (target.kind, target.value, target.name) == ("docker", IMAGE, f"docker:{IMAGE}")
    assert target.roles == set(suite_roles()) - {"kbtp-target", "kbtp-initiator"}
    assert target.defaulted and "testbed defaults" in target.source  # ad hoc: the testbed's PICS, marked


@pytest.mark.parametrize(("text", "why"), [("docker:", "expected an image"), ("docker:Upper/Case", "not a docker"),
                                           ("docker:a b", "not a docker"), ("docker:img:", "not a docker")])
def test_bad_docker_targets_are_usage_errors(text: str, why: str) -> None:
    with pytest.raises(TargetError, match=why):
        parse_target(text, load_testbed())


@pytest.mark.parametrize("ref", ["img", "kvconform/reference:dev", "registry.example:5000/a/b:1.2-rc",
                                 "a/b@sha256:" + "0" * 64])
def test_image_references_docker_accepts(ref: str) -> None:
    assert parse_target(f"docker:{ref}", load_testbed()).value == ref


def _testbed(tmp_path: Path, body: str) -> Path:
    path = tmp_path / "bed.yaml"
    path.write_text(body, "utf-8")
    return path


def test_testbed_docker_entry_takes_the_image_recipe_and_run_settings(tmp_path: Path) -> None:
    path = _testbed(tmp_path, """name: t
defaults:
  params:
    docker:
      images:
        vendor/kv:1: {context: images/kv}
      ready_timeout_s: 5
targets:
  kv:
    driver: docker
    docker: vendor/kv:1
    roles: [tlkv-decode]
    params: {docker: {environment: {MODE: fast}, user: image}}
""")
    target = parse_target("kv", load_testbed(path))
    assert (target.kind, target.value, target.roles) == ("docker", "vendor/kv:1", {"tlkv-decode"})
    docker = target.params["docker"]
    assert docker["build"] == {"context": str(tmp_path / "images/kv")}  # absolute: the target stands alone
    assert (docker["ready_timeout_s"], docker["environment"], docker["user"]) == (5, {"MODE": "fast"}, "image")
    adhoc = parse_target("docker:vendor/kv:1", load_testbed(path))
    assert adhoc.params["docker"]["build"] == docker["build"], "an ad-hoc target of the image finds its recipe"
    spec = dk.contract_spec(target.value, "tlkv-decode", {"port": "5"}, docker)
    assert spec.user is None and spec.environment["MODE"] == "fast" and spec.ready.timeout_s == 5


@pytest.mark.parametrize(("body", "where"), [
    ("targets: {x: {driver: docker}}", r"\$.targets.x: 'docker' is a required property"),
    ("targets: {x: {driver: docker, docker: i, params: {docker: {mounts: {}}}}}", "mounts"),
    ("targets: {x: {driver: docker, docker: i, params: {docker: {build: {dockerfile: D}}}}}", "build"),
])
def test_testbed_docker_entries_are_validated(tmp_path: Path, body: str, where: str) -> None:
    with pytest.raises(TestbedError, match=where):
        load_testbed(_testbed(tmp_path, "name: t\n" + body + "\n"))


def test_docker_drivers_of_every_role() -> None:
    target = parse_target(f"docker:{IMAGE}", load_testbed())
    for suite in sorted(target.roles or ()):
        driver = driver_for(suite, target)
        launcher = getattr(driver, "launcher", None)
        assert isinstance(launcher, dk.ContainerLauncher) and launcher.role == suite, suite
    assert isinstance(driver_for("moqt-relay", target), dk.ContainerRelay)
    for suite in ("kbtp-target", "kbtp-initiator"):  # the role table says why
        with pytest.raises(TargetUnavailable, match=re.escape(f"cannot play {suite}: {ROLES[suite].no_container}")):
            driver_for(suite, target)


# ---- invocation --------------------------------------------------------------------------------------


def test_a_one_shot_role_gets_arguments_environment_and_its_folder(tmp_path: Path) -> None:
    call = contract.invocation("tlkv-writer", {"sequence": str(tmp_path / "seq.json"), "out": str(tmp_path / "e")})
    assert call.command == ["tlkv-writer", "--out", "/kvconform/0/e", "--sequence", "/kvconform/0/seq.json"]
    assert call.environment == {"KVCONFORM_CONTRACT": "1", "KVCONFORM_ROLE": "tlkv-writer",
                                "KVCONFORM_HOST": "127.0.0.1", "KVCONFORM_OUT": "/kvconform/0/e",
                                "KVCONFORM_SEQUENCE": "/kvconform/0/seq.json"}
    assert call.mounts == {str(tmp_path): "/kvconform/0"}  # one folder, one mount


def test_files_in_several_folders_lists_and_folders(tmp_path: Path) -> None:
    a, b = tmp_path / "a", tmp_path / "b"
    call = contract.invocation("kvcs-consumer", {
        "relay": "moqt://127.0.0.1:1", "cache": str(a / "cache.json"), "out": str(b / "result.json"),
        "producer_key": f"p1={a / 'p1.pem'},p2={b / 'p2.pem'}", "token": ""})
    assert call.mounts == {str(a): "/kvconform/0", str(b): "/kvconform/1"}
    assert call.environment["KVCONFORM_PRODUCER_KEY"] == "p1=/kvconform/0/p1.pem,p2=/kvconform/1/p2.pem"
    assert call.environment["KVCONFORM_TOKEN"] == "" and call.environment["KVCONFORM_RELAY"] == "moqt://127.0.0.1:1"
    relay = contract.invocation("kvcs-relay", {"port": "9", "policy": str(a / "p.yaml"), "certs": str(a)})
    assert relay.mounts == {str(a): "/kvconform/0"}
    assert relay.environment["KVCONFORM_CERTS"] == "/kvconform/0"
    assert relay.environment["KVCONFORM_POLICY"] == "/kvconform/0/p.yaml"


@pytest.mark.parametrize(("role", "values", "why"), [
    ("tlkv-writer", {"sequence": "/s"}, "no value for out"),
    ("tlkv-decode", {"port": "1", "relay": "x"}, "relay not among its placeholders"),
    ("tlkv-writer", {"sequence": "s", "out": "/o"}, "absolute host path"),
    ("kbtp-target", {}, "not in the container contract"),
])
def test_invocations_the_contract_does_not_allow(role: str, values: dict[str, str], why: str) -> None:
    with pytest.raises((ValueError, KeyError), match=why):
        contract.invocation(role, values)


def test_decode_names_a_multi_word_placeholder_in_both_forms() -> None:
    call = contract.invocation("tlkv-prefill", {"decode_addr": "127.0.0.1:5", "sequence": "/t/s.json"})
    assert call.command[1:3] == ["--decode-addr", "127.0.0.1:5"]
    assert call.environment["KVCONFORM_DECODE_ADDR"] == "127.0.0.1:5"


def test_container_spec_of_a_server_role(tmp_path: Path) -> None:
    spec = dk.contract_spec(IMAGE, "tlkv-decode", {"port": "4711", "pool": "1,2,3,4"})
    assert spec.ready == dk.Readiness(log_pattern=r"^kvconform-ready\b", probe="tcp", probe_port=4711,
                                      timeout_s=dk.READY_TIMEOUT_S, any_of=True)
    assert spec.user == f"{os.getuid()}:{os.getgid()}" and spec.labels == {dk.ROLE_LABEL: "tlkv-decode"}
    assert spec.log_events and spec.stop_timeout_s == dk.STOP_TIMEOUT_S
    kwargs = dk._run_kwargs(spec)
    assert kwargs["network_mode"] == "host" and "ports" not in kwargs and kwargs["name"] == spec.name
    assert kwargs["labels"][dk.OWNER_LABEL] == str(os.getpid())
    one_shot = dk.contract_spec(IMAGE, "tlkv-writer", {"sequence": str(tmp_path / "s"), "out": str(tmp_path / "o")})
    assert one_shot.ready == dk.Readiness(timeout_s=dk.READY_TIMEOUT_S, any_of=True) and not one_shot.log_events
    assert dk._run_kwargs(one_shot)["volumes"] == {str(tmp_path): {"bind": "/kvconform/0", "mode": "rw"}}


# ---- what a container says -----------------------------------------------------------------------------


@pytest.mark.parametrize(("line", "port"), [("kvconform-ready", None), ("kvconform-ready port=4433", 4433),
                                            ("  kvconform-ready   port=1 ", 1)])
def test_ready_lines(line: str, port: int | None) -> None:
    said = contract.parse_ready(line)
    assert said is not None and said.port == port


@pytest.mark.parametrize("line", ["xkvconform-ready", "kvconform-ready port=", "kvconform-ready now", "ready"])
def test_not_ready_lines(line: str) -> None:
    assert contract.parse_ready(line) is None


@pytest.mark.parametrize(("code", "lines", "meaning"), [
    (127, ["kvconform-unsupported role=tlkv-writer"], "unsupported"),
    (127, ["noise", "kvconform-unsupported"], "unsupported"),
    (127, ["sh: 1: tlkv-writer: not found"], "undeclared-127"),
    (127, ["kvconform-unsupported role=tlkv-reader"], "undeclared-127"),  # a declaration for another role
    (0, ["kvconform-unsupported role=tlkv-writer"], "exit"),
    (3, [], "exit"), (None, [], "exit"),
])
def test_exit_meanings(code: int | None, lines: list[str], meaning: str) -> None:
    assert contract.exit_meaning(code, lines, "tlkv-writer") == meaning


def test_optional_placeholders_from_labels() -> None:
    labels = {contract.OPTIONAL_LABEL: "kvcs-consumer:relay2 kvcs-consumer:budget tlkv-reader:pool junk"}
    assert contract.optional_from_labels(labels, "kvcs-consumer") == {"relay2", "budget"}
    assert contract.optional_from_labels(None, "kvcs-consumer") == frozenset()


# ---- exit 127 and readiness, with a stand-in for the daemon ----------------------------------------------


class FakeContainer:
    """What ContainerRun uses of DockerContainer, scripted: how it gets ready (or not) and how it exits."""

    script: ClassVar[dict[str, Any]] = {}
    started: ClassVar[list[FakeContainer]] = []

    def __init__(self, spec: dk.ContainerSpec, client: object = None) -> None:
        self.spec = spec
        self.exit_code: int | None = None
        self.stdout, self.stderr, self.note = b"", b"", ""
        self.id = "f" * 64
        self.closed = False
        self.lines: list[str] = list(self.script.get("lines", []))

    def start(self, *, wait: bool = True) -> FakeContainer:
        FakeContainer.started.append(self)
        return self

    def await_ready(self) -> str:
        return str(self.script.get("ready", "ready"))

    def wait_for(self, matches: Any, timeout_s: float) -> str | None:
        return next((line for line in self.lines if matches(line)), None)

    def wait_exit(self, timeout_s: float) -> int | None:
        return self.script.get("code")

    def status(self) -> str:
        return "exited" if "code" in self.script else "running"

    def close(self) -> None:
        self.closed = True
        self.exit_code = self.script.get("code")
        self.stdout = "\n".join(self.lines).encode()


@pytest.fixture
def fake_docker(monkeypatch: pytest.MonkeyPatch) -> Iterator[type[FakeContainer]]:
    monkeypatch.setattr(dk, "DockerContainer", FakeContainer)
    monkeypatch.setattr(dk.ContainerLauncher, "labels", lambda self: {contract.CONTRACT_LABEL: "1"})
    FakeContainer.started = []
    monkeypatch.setattr(dk, "_UNSUPPORTED", {})
    yield FakeContainer


def _launch(role: str, tmp_path: Path, image: str = IMAGE) -> dk.ContainerRun:
    values = {"tlkv-writer": {"sequence": str(tmp_path / "s"), "out": str(tmp_path / "o")},
              "tlkv-decode": {"port": "4711"}}[role]
    return dk.ContainerLauncher(image, role).launch(values, role)


def test_exit_127_with_the_declaration_is_inconclusive_once(fake_docker: type[FakeContainer],
                                                            tmp_path: Path) -> None:
    fake_docker.script = {"code": 127, "lines": ["kvconform-unsupported role=tlkv-writer"]}
    run = _launch("tlkv-writer", tmp_path)
    run.start()
    with pytest.raises(pytest.skip.Exception) as info:
        run.wait(5)
    # Inconclusive, never not-applicable (that comes only from declared PICS) and never a pass: a gate run against
    # an image that plays nothing exits non-zero. The message names the contract item.
    msg = str(info.value.msg)
    assert msg.startswith(INCONCLUSIVE_PREFIX + f"the image declares it does not play tlkv-writer ({IMAGE} exited "
                          "127 with kvconform-unsupported; contract item 'unsupported' "
                          "(docs/docker-contract.md#unsupported)): nothing of tlkv-writer was tested"), msg
    assert not msg.startswith(NOT_APPLICABLE_PREFIX)
    assert fake_docker.started[0].closed, "the container is removed before the verdict is raised"
    # The declaration holds for the rest of the run: the next check does not start the image again.
    with pytest.raises(pytest.skip.Exception, match="does not play tlkv-writer"):
        _launch("tlkv-writer", tmp_path).start()
    assert len(fake_docker.started) == 1


def test_exit_127_without_the_declaration_is_unavailable(fake_docker: type[FakeContainer], tmp_path: Path) -> None:
    fake_docker.script = {"code": 127, "lines": ["/entrypoint: 3: tlkv-writer: not found"]}
    run = _launch("tlkv-writer", tmp_path)
    run.start()
    with pytest.raises(TargetUnavailable, match="without printing 'kvconform-unsupported role=tlkv-writer' "
                                                r"\(contract item 'unsupported'"):
        run.wait(5)


def test_other_exits_are_left_to_the_role_driver(fake_docker: type[FakeContainer], tmp_path: Path) -> None:
    fake_docker.script = {"code": 3, "lines": ["boom"]}
    run = _launch("tlkv-writer", tmp_path)
    run.start()
    assert run.wait(5) == 3
    result = run.stop()
    assert (result.returncode, result.stdout, result.argv[:3]) == (3, b"boom", ("docker", "run", IMAGE))


def test_a_server_that_exits_before_ready_is_unavailable(fake_docker: type[FakeContainer], tmp_path: Path) -> None:
    fake_docker.script = {"code": 3, "ready": "exited (tcp probe of 127.0.0.1:4711 failed)", "lines": ["bad"]}
    with pytest.raises(TargetUnavailable, match=r"exited 3 before it was ready \(contract item 'readiness'"):
        _launch("tlkv-decode", tmp_path).start()
    assert fake_docker.started[0].closed


def test_a_server_that_declares_unsupported_before_ready(fake_docker: type[FakeContainer], tmp_path: Path) -> None:
    fake_docker.script = {"code": 127, "ready": "exited (...)", "lines": ["kvconform-unsupported role=tlkv-decode"]}
    with pytest.raises(pytest.skip.Exception, match=f"^{INCONCLUSIVE_PREFIX}the image declares it does not play "
                                                    "tlkv-decode"):
        _launch("tlkv-decode", tmp_path).start()


def test_a_server_that_hangs_before_ready_is_stopped_and_unavailable(fake_docker: type[FakeContainer],
                                                                     tmp_path: Path) -> None:
    fake_docker.script = {"ready": "no line matching '^kvconform-ready\\\\b' and tcp probe of 127.0.0.1:4711 failed"}
    with pytest.raises(TargetUnavailable, match=r"not ready within 30 s \(no line matching.*stopped; contract "
                                                r"item 'readiness'"):
        _launch("tlkv-decode", tmp_path).start()
    assert fake_docker.started[0].closed


def test_a_ready_line_naming_another_port_is_unavailable(fake_docker: type[FakeContainer], tmp_path: Path) -> None:
    fake_docker.script = {"lines": ["kvconform-ready port=1"]}
    with pytest.raises(TargetUnavailable, match="ready on port 1, but was asked to listen on 4711"):
        _launch("tlkv-decode", tmp_path).start()
    fake_docker.script = {"lines": ["kvconform-ready port=4711"]}
    run = _launch("tlkv-decode", tmp_path)
    run.start()
    assert run.running()
    run.stop()


def test_an_image_without_the_contract_label_is_not_run(monkeypatch: pytest.MonkeyPatch) -> None:
    class Client:
        class images:  # the SDK's attribute name
            @staticmethod
            def get(image: str) -> Any:
                return type("Image", (), {"labels": {"maintainer": "someone"}, "id": "sha256:x"})()

        @staticmethod
        def close() -> None:
            return None

    monkeypatch.setattr(dk, "docker_client", lambda timeout_s=60.0: Client())
    monkeypatch.setattr(dk, "ensure_image", lambda client, image, build=None: "sha256:x")
    monkeypatch.setattr(dk, "_REAPED", True)
    launcher = dk.ContainerLauncher("python:3.12", "kvcs-publisher")
    assert launcher.takes("relay"), "a required placeholder needs no look at the image"
    with pytest.raises(dk.DockerUnavailable, match=r"label org\.kvconform\.contract is None, expected '1'"):
        launcher.takes("token")
    with pytest.raises(dk.DockerUnavailable, match=r"does not declare the kvconform container contract "
                                                   r"\(contract item 'label'"):
        launcher.launch({"relay": "moqt://127.0.0.1:1", "cache": "/c"}, "publisher")


def test_launchers_tell_the_optional_placeholders_they_take() -> None:
    from kvconform.targets.kvcs.consumer import CmdConsumer

    assert CmdConsumer("c {relay} {cache} {out} {budget}").supports("budget")
    assert not CmdConsumer(CommandLauncher("c {relay} {cache} {out}")).supports("relay2")


# ---- the reference image's entrypoint --------------------------------------------------------------------


def test_reference_entrypoint_plays_each_role_with_the_reference_tool() -> None:
    role, values = ri.parse_arguments(["kvcs-consumer", "--relay", "r", "--relay2", "r2", "--cache", "c", "--out",
                                       "o", "--producer-key", "a=/x,b=/y", "--token", ""])
    argv = ri.reference_argv(role, values)
    assert argv is not None and argv[1:] == ["-m", "kvconform", "kvcs", "fetch", "--relay", "r", "--relay", "r2",
                                             "--cache", "c", "--out", "o", "--producer-key", "a=/x",
                                             "--producer-key", "b=/y"]
    decode = ri.reference_argv("tlkv-decode", {"host": "127.0.0.1", "port": "5", "pool": "1,2,3,4"})
    assert decode is not None and decode[3:] == ["serve", "tlkv-decode", "--host", "127.0.0.1", "--port", "5",
                                                 "--pool", "1,2,3,4"]
    for suite in contract.container_roles():
        values = {name: f"/v/{name}" for name in contract.container_role(suite).allowed}
        assert ri.reference_argv(suite, {"host": "127.0.0.1", **values}) is not None, suite
    assert ri.reference_argv("kbtp-target", {}) is None


def test_reference_entrypoint_declares_what_it_does_not_play(capsys: pytest.CaptureFixture[str]) -> None:
    assert ri.main(["kbtp-target"]) == 127
    assert capsys.readouterr().out == "kvconform-unsupported role=kbtp-target\n"
    assert ri.main(["tlkv-writer", "--out", "/o"]) == 2
    assert "tlkv-writer: missing --sequence" in capsys.readouterr().err
    assert ri.main(["tlkv-writer", "--out"]) == 2


def test_reference_image_declares_what_its_entrypoint_reads() -> None:
    dockerfile = (ROOT / "testbeds/docker/reference/Dockerfile").read_text()
    assert f'org.kvconform.contract.optional="{ri.optional_label()}"' in dockerfile
    assert 'org.kvconform.contract="1"' in dockerfile
    for role, names in ri.OPTIONAL.items():
        assert set(names) <= contract.container_role(role).allowed, role


def test_process_results_of_containers_decode_with_replacement() -> None:
    result = ProcessResult(("docker", "run", IMAGE), 1, b"ok \xff", b"", 0.1)
    assert result.evidence()["stdout"] == "ok \ufffd"


# ---- play_role: the one call for "run IMAGE as ROLE" --------------------------------------------------------


def test_play_role_starts_yields_and_always_removes(fake_docker: type[FakeContainer], tmp_path: Path) -> None:
    fake_docker.script = {"lines": ["kvconform-ready port=4711", "serving"]}
    with dk.play_role(IMAGE, "tlkv-decode", {"port": "4711"}, what="decode side") as run:
        assert run.running() and not fake_docker.started[0].closed
        assert run.spec.command == ["tlkv-decode", "--port", "4711"]
    assert fake_docker.started[0].closed
    assert run.stop().stdout == b"kvconform-ready port=4711\nserving"  # the logs, after the block
    with pytest.raises(RuntimeError, match="the check failed"), \
            dk.play_role(IMAGE, "tlkv-decode", {"port": "4711"}):
        raise RuntimeError("the check failed")
    assert fake_docker.started[1].closed, "removed when the block raised too"


def test_play_role_refuses_values_the_role_does_not_have(fake_docker: type[FakeContainer]) -> None:
    with pytest.raises(dk.DockerUnavailable, match=r"no value for port \(contract item 'invocation'"), \
            dk.play_role(IMAGE, "tlkv-decode", {}):
        pass
    assert fake_docker.started == []


# ---- the contract document -------------------------------------------------------------------------------


def test_every_contract_item_is_a_section_of_the_document() -> None:
    doc = (ROOT / contract.DOC).read_text("utf-8")
    headings = {line.split("`")[1] for line in doc.splitlines() if line.startswith("## `")}
    assert headings == set(contract.ITEMS), "docs/docker-contract.md sections vs contract.ITEMS"
    for suite, role in contract.container_roles().items():
        assert f"`{suite}`" in doc, suite
        for name in role.allowed:
            assert f"`{name}`" in doc, (suite, name)
    for name in contract.LANE_ROLES:
        assert f"`{name}`" in doc, name
    assert f"`{contract.CONTRACT_LABEL}={contract.CONTRACT_VERSION}`" in doc and "127" in doc
    with pytest.raises(KeyError, match="expected one of label"):
        contract.item("ready")
