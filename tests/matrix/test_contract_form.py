"""The registry's ``image:`` run form: a participant run by the container contract (docs/docker-contract.md), as
``--target docker:IMAGE`` runs it. No docker here: the registry, the TargetSpec and labels a cell and a suite give
the contract driver, and what a cell makes of an image that declares it does not play its role (exit 127 with
``kvconform-unsupported``): inconclusive, naming the participant, never a pass. The containers themselves run in
``test_docker_cells.py`` and the shipped matrix (``-m interop``)."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import yaml

from kvconform.matrix import cell as cell_module
from kvconform.matrix.context import CellContext, Participant
from kvconform.matrix.participants import CELL_LABEL, RUN_LABEL, target_spec
from kvconform.matrix.registry import RegistryError, RunForm, load_registry
from kvconform.targets import docker as dk
from kvconform.targets.process import ProcessResult

from .helpers import SHIPPED, write_registry

IMAGE = "vendor/kv-decode:1.2"
DECODE_PICS = {"tlkv": {"decode": {"versions": [1, 2],
                                   "geometry": {"block_tokens": 16, "n_layers": 4, "n_kv_heads": 2, "head_dim": 16}}}}


def _registry(decode: dict[str, Any]) -> dict[str, Any]:
    return {"name": "t", "implementations": {
        "ref": {"reference": True, "roles": {"tlkv": {"prefill": {"versions": [1, 2], "reference": True},
                                                      "decode": {"versions": [1, 2], "reference": True}}}},
        "vendor": {"roles": {"tlkv": {"decode": decode}}}}}


def _image_decode(**extra: Any) -> dict[str, Any]:
    return {"versions": [1, 2], "image": IMAGE, "pics": DECODE_PICS, **extra}


def test_an_image_entry_is_the_contract_form(tmp_path: Path) -> None:
    contract = {"build": {"context": "images/decode", "dockerfile": "Dockerfile"}, "ready_timeout_s": 12,
                "environment": {"VENDOR_LOG": "debug"}}
    registry = load_registry(write_registry(tmp_path, _registry(_image_decode(contract=contract))))
    entry = registry.implementations["vendor"].roles["tlkv-decode"]
    assert entry.run == RunForm("image", IMAGE, contract=contract)
    assert entry.suite_run == entry.run
    assert entry.run.in_docker and entry.run.docker is None
    assert entry.run.describe() == f"image (container contract): {IMAGE}"
    assert RunForm.from_dict(entry.run.as_dict()) == entry.run, "a cell's request carries the form whole"
    assert not registry.implementations["ref"].roles["tlkv-decode"].run.in_docker


def test_the_shipped_registry_runs_aiomoqt_and_the_reference_image_by_the_contract() -> None:
    registry = load_registry(SHIPPED)
    relay = registry.implementations["aiomoqt"].roles["kvcs-relay"].run
    assert (relay.kind, relay.value, relay.docker) == ("image", "kvconform/aiomoqt:0.13.3", None)
    assert relay.contract == {"build": {"context": "docker/aiomoqt", "dockerfile": "Dockerfile"},
                              "ready_timeout_s": 30}
    # the image's entrypoint plays the relay role under the contract (and declares the rest unsupported)
    entrypoint = (SHIPPED.parent / "docker" / "aiomoqt" / "kvconform-entrypoint.sh").read_text("utf-8")
    assert "moqt-relay|kvcs-relay)" in entrypoint and '--port "$KVCONFORM_PORT"' in entrypoint
    image = registry.implementations["kvconform-image"]
    assert set(image.roles) == {"tlkv-decode"} and not image.reference
    decode = image.roles["tlkv-decode"].run
    assert (decode.kind, decode.value) == ("image", "kvconform/reference:dev")
    assert image.roles["tlkv-decode"].pics == registry.implementations["kvconform"].roles["tlkv-decode"].pics


@pytest.mark.parametrize(("decode", "expected"), [
    ({"versions": [1], "image": IMAGE, "cmd": "decode --port {port}"}, "is valid under each of"),
    ({"versions": [1], "cmd": "decode --port {port}", "contract": {"user": "image"}},
     "'image' is a dependency of 'contract'"),
    ({"versions": [1], "image": IMAGE, "ready": {"probe": "tcp"}}, "'cmd' is a dependency of 'ready'"),
    ({"versions": [1], "image": IMAGE, "contract": {"ports": [1]}}, "Additional properties are not allowed"),
    ({"versions": [1], "image": "vendor/kv decode"}, "does not match"),
])
def test_an_image_entry_that_is_off_is_refused(tmp_path: Path, decode: dict[str, Any], expected: str) -> None:
    with pytest.raises(RegistryError) as err:
        load_registry(write_registry(tmp_path, _registry(decode)))
    assert expected in str(err.value), str(err.value)


def test_a_kbtp_role_cannot_be_an_image(tmp_path: Path) -> None:
    doc = _registry(_image_decode())
    doc["implementations"]["vendor"]["roles"] = {"kbtp": {"target": {"versions": ["rdmap-7306"], "image": IMAGE}}}
    with pytest.raises(RegistryError) as err:
        load_registry(write_registry(tmp_path, doc))
    message = str(err.value)
    assert "implementations.vendor.roles.kbtp.target.image" in message and "cannot play kbtp-target" in message
    # why (the role table's word), and the forms that do reach a target
    assert "dials a running KBTP target" in message and "url: kbtp+roce://host:port" in message, message


def test_a_cell_gives_the_contract_driver_its_labels_and_parameters(tmp_path: Path) -> None:
    contract = {"build": {"context": "images/decode"}, "stop_timeout_s": 1}
    form = RunForm("image", IMAGE, contract=copy.deepcopy(contract))
    spec = target_spec("vendor", "tlkv-decode", form, DECODE_PICS, cell="tlkv-transfer--ref--vendor",
                       registry_dir=tmp_path, run="0123456789abcdef")
    assert (spec.kind, spec.value, spec.roles) == ("docker", IMAGE, {"tlkv-decode"})
    params = dk.docker_params(spec)
    assert params["labels"] == {CELL_LABEL: "tlkv-transfer--ref--vendor", RUN_LABEL: "0123456789abcdef"}
    assert params["build"]["context"] == str(tmp_path / "images" / "decode"), "relative to the registry file"
    assert form.contract == contract, "the registry's form is left as it was"
    # what the contract driver then asks the daemon for: the role, the matrix's labels, the harness's own
    container = dk.contract_spec(IMAGE, "tlkv-decode", {"port": "5050"}, params)
    assert container.command[:1] == ["tlkv-decode"] and container.environment["KVCONFORM_PORT"] == "5050"
    assert container.labels == {CELL_LABEL: "tlkv-transfer--ref--vendor", RUN_LABEL: "0123456789abcdef",
                                dk.ROLE_LABEL: "tlkv-decode"}
    kwargs = dk._run_kwargs(container)
    assert kwargs["network_mode"] == "host"
    assert kwargs["labels"][RUN_LABEL] == "0123456789abcdef" and kwargs["labels"][dk.HARNESS_LABEL] == "1"
    assert container.build is not None and container.build.context == tmp_path / "images" / "decode"
    assert container.stop_timeout_s == 1


def test_a_suite_of_an_image_runs_against_a_docker_target_with_the_labels(tmp_path: Path) -> None:
    from kvconform.matrix.suites import _testbed_target
    from kvconform.targets.spec import parse_target
    from kvconform.targets.testbed import load_testbed

    registry = load_registry(write_registry(tmp_path, _registry(_image_decode(contract={"user": "image"}))))
    entry = registry.implementations["vendor"].roles["tlkv-decode"]
    spec = target_spec("vendor", entry.suite, entry.suite_run, entry.pics, cell="suite-vendor-tlkv-decode",
                       registry_dir=tmp_path, run="fedcba9876543210")
    testbed = tmp_path / "testbed.yaml"
    testbed.write_text(yaml.safe_dump({"name": "s", "targets": {
        "vendor": _testbed_target(entry, spec.kind, spec.value, spec.params)}}), "utf-8")
    target = parse_target("vendor", load_testbed(testbed))  # the testbed schema takes params.docker.labels
    assert (target.kind, target.value) == ("docker", IMAGE)
    assert dk.docker_params(target)["labels"] == {CELL_LABEL: "suite-vendor-tlkv-decode", RUN_LABEL: "fedcba9876543210"}
    assert dk.docker_params(target)["user"] == "image"


@pytest.mark.parametrize("code", [125, 126, 127])
def test_an_image_participant_that_did_not_start_is_not_started(tmp_path: Path, code: int) -> None:
    boxed = Participant("tlkv-decode", "vendor", RunForm("image", IMAGE, contract={}), {}, [1], False)
    ctx = CellContext("c", tmp_path, 1, {"tlkv-decode": boxed}, tmp_path, 30.0, "0" * 16)
    assert ctx.not_started("tlkv-decode", code)
    assert not ctx.not_started("tlkv-decode", 1)


def _declaring_exchange(ctx: CellContext) -> None:
    """A decode side whose image answers the contract with exit 127 and its declaration, read by the contract's
    own ContainerRun (what a cell's decode driver runs), then an exchange that would have passed."""
    spec = dk.contract_spec(IMAGE, "tlkv-decode", {"port": "5050"}, dk.docker_params(ctx.spec("tlkv-decode")))
    run = dk.ContainerRun(spec, "tlkv-decode", "decode side")
    run._judge(ProcessResult(("docker", "run", IMAGE), 127, b"kvconform-unsupported role=tlkv-decode\n", b"", 0.2))
    ctx.step("verified")  # never reached


def _inconclusive_exchange(ctx: CellContext) -> None:
    from kvconform.verdicts import inconclusive

    inconclusive("the relay's counters cannot be read")


@pytest.mark.parametrize(("exchange", "unavailable", "said"), [
    ("_declaring_exchange", "tlkv-decode", "the image declares it does not play tlkv-decode"),
    ("_inconclusive_exchange", None, "a driver ended the exchange inconclusive: the relay's counters cannot be read"),
])
def test_a_declared_unsupported_role_makes_the_cell_inconclusive(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                 exchange: str, unavailable: str | None,
                                                                 said: str) -> None:
    monkeypatch.setitem(cell_module.EXCHANGES, "test", f"{__name__}:{exchange}")
    monkeypatch.setattr(dk, "_UNSUPPORTED", {})
    monkeypatch.setattr("kvconform.matrix.participants.remove_containers", lambda run, cell=None: [])
    boxed = RunForm("image", IMAGE, contract={})
    request = {"id": "tlkv-transfer--ref--vendor", "kind": "test", "dir": str(tmp_path / "cell"), "seed": 3,
               "run": "0" * 16, "registry_dir": str(tmp_path), "participants": {
                   "tlkv-prefill": {"implementation": "ref", "run": RunForm("reference", "reference").as_dict(),
                                    "versions": [1, 2], "reference": True},
                   "tlkv-decode": {"implementation": "vendor", "run": boxed.as_dict(), "versions": [1, 2],
                                   "pics": DECODE_PICS}}}
    doc = cell_module.run_cell(request)
    assert doc["outcome"] == "inconclusive", doc
    assert doc["unavailable"] == unavailable and doc["suspects"] == []
    assert said in doc["message"], doc["message"]
    assert doc["traceback"] is None, "not a harness error"
    assert not any(step["what"] == "verified" for step in doc["steps"])


def test_without_docker_an_image_participant_is_unavailable(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The real transfer exchange, its decode side an image: no daemon makes the cell inconclusive naming it."""
    def no_daemon(timeout_s: float = 60.0) -> Any:
        raise dk.DockerUnavailable("the docker daemon is not reachable: (test)")

    monkeypatch.setattr(dk, "docker_client", no_daemon)
    request = {"id": "tlkv-transfer--ref--vendor", "kind": "tlkv-transfer", "dir": str(tmp_path / "cell"), "seed": 5,
               "run": "0" * 16, "registry_dir": str(tmp_path), "participants": {
                   "tlkv-prefill": {"implementation": "ref", "run": RunForm("reference", "reference").as_dict(),
                                    "versions": [1, 2], "reference": True},
                   "tlkv-decode": {"implementation": "vendor", "run": RunForm("image", IMAGE, contract={}).as_dict(),
                                   "versions": [1, 2], "pics": DECODE_PICS}}}
    doc = cell_module.run_cell(request)
    assert (doc["outcome"], doc["unavailable"], doc["suspects"]) == ("inconclusive", "tlkv-decode", []), doc
    assert "the docker daemon is not reachable" in doc["message"], doc["message"]
