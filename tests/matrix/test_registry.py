"""The implementations registry and the plan: validation names what is off; only compatible combinations are cells."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest

from kvconform.matrix.plan import make_plan, selected_suites
from kvconform.matrix.registry import RegistryError, load_registry

from .helpers import SHIPPED, shipped, write_registry


def _minimal() -> dict[str, Any]:
    return {"name": "t", "implementations": {"a": {"reference": True, "roles": {"kvcs": {
        "publisher": {"versions": [22], "reference": True},
        "relay": {"versions": [22], "cmd": "kvconform serve moqt-relay --port {port} --policy open"},
        "consumer": {"versions": [22], "reference": True}}}}}}


def test_shipped_registry_lists_the_reference_and_the_third_party_relays() -> None:
    registry = load_registry(SHIPPED)
    assert registry.implementations["kvconform"].reference
    assert set(registry.implementations["kvconform"].roles) == set(selected_suites(None))
    aiomoqt = registry.implementations["aiomoqt"]
    assert set(aiomoqt.roles) == {"kvcs-relay"}, "only aiomoqt's relay can play a KVCS role"
    assert aiomoqt.roles["kvcs-relay"].run.kind == "image", "by the container contract (test_contract_form.py)"
    assert {"moqt-client", "moqt-publisher", "moqt-subscriber"} <= set(aiomoqt.info_roles)
    assert all(v.get("notes") for v in aiomoqt.info_roles.values()), "each client says why it plays no KVCS role"
    moqrs = registry.implementations["moqrs"]
    assert set(moqrs.roles) == {"kvcs-relay"}, "only moq-rs's relay can play a KVCS role"
    assert moqrs.roles["kvcs-relay"].run.kind == "cmd", "a host process of .venv-moqrs (tests/interop/moqrs_peers.py)"
    assert {"moqt-publisher", "moqt-subscriber"} <= set(moqrs.info_roles)
    assert all(v.get("notes") for v in moqrs.info_roles.values()), "each client says why it plays no KVCS role"
    plan = make_plan(registry, selected_suites(None))
    relays = {t.fixed.get("kvcs-relay") for t in plan.tables if t.kind.name == "kvcs"}
    assert relays == {"kvconform", "aiomoqt", "moqrs"}, "one KVCS table per relay"
    assert {"kvcs--kvconform--aiomoqt--kvconform", "kvcs--kvconform--moqrs--kvconform"} <= set(plan.cells)


@pytest.mark.parametrize(("change", "expected"), [
    (lambda d: d["implementations"]["a"]["roles"]["kvcs"]["publisher"].pop("versions"),
     "'versions' is a required property"),
    (lambda d: d["implementations"]["a"]["roles"]["kvcs"]["publisher"].update(cmd="x {relay} {cache}"),
     "is valid under each of"),
    (lambda d: d["implementations"]["a"]["roles"]["kvcs"]["consumer"].update(
        {"reference": None, "url": "moqt://127.0.0.1:1"}) or d["implementations"]["a"]["roles"]["kvcs"][
        "consumer"].pop("reference"),
     "kvcs-consumer is started by the harness for each cell"),
    (lambda d: d["implementations"]["a"]["roles"]["kvcs"]["relay"].update(cmd="my-relay --listen 4443"),
     "has no {port}"),
    (lambda d: d["implementations"]["a"]["roles"]["kvcs"]["publisher"].update(
        {"cmd": "pub --relay {relay}"}) or d["implementations"]["a"]["roles"]["kvcs"]["publisher"].pop("reference"),
     "missing ['cache']"),
    (lambda d: d["implementations"]["a"]["roles"]["kvcs"]["publisher"].update(
        {"pics": {"kvcs": {"publisher": {"signing": "yes"}}}}),
     "'yes' is not of type 'boolean'"),
    (lambda d: d["implementations"].update(b=copy.deepcopy(d["implementations"]["a"])),
     "a is already the reference kvcs-publisher"),
])
def test_a_registry_that_is_off_is_refused_naming_what(tmp_path: Path, change: Any, expected: str) -> None:
    doc = _minimal()
    change(doc)
    with pytest.raises(RegistryError) as err:
        load_registry(write_registry(tmp_path, doc))
    assert expected in str(err.value), str(err.value)


def test_kbtp_roles_take_the_forms_their_suites_take(tmp_path: Path) -> None:
    """A target at a wire URL and a cmd: initiator (targets/registry.py ROLES; once refused as "emulated only")."""
    kbtp: dict[str, Any] = {
        "target": {"versions": ["ib-rc"], "url": "kbtp+roce://127.0.0.1:4791"},
        "initiator": {"versions": ["ib-rc"], "cmd": "ini --target {target} --initiator-id {initiator_id}"}}
    doc = {"name": "t", "implementations": {"vendor": {"roles": {"kbtp": kbtp}}}}
    vendor = load_registry(write_registry(tmp_path, doc)).implementations["vendor"]
    assert (vendor.roles["kbtp-target"].run.kind, vendor.roles["kbtp-target"].run.value) == (
        "url", "kbtp+roce://127.0.0.1:4791")
    assert vendor.roles["kbtp-initiator"].run.kind == "cmd"
    for url in ("kbtp+iwarp://127.0.0.1:1", "kbtp+verbs://127.0.0.1:1?device=rxe0"):
        kbtp["target"]["url"] = url
        vendor = load_registry(write_registry(tmp_path, doc)).implementations["vendor"]
        assert vendor.roles["kbtp-target"].run.value == url


@pytest.mark.parametrize(("role", "entry", "expected"), [
    (("kbtp", "target"), {"cmd": "tgt --port {port}"},
     "kbtp-target has no command-line form; expected url: kbtp+iwarp://host:port"),
    (("kbtp", "target"), {"url": "grpc://127.0.0.1:1"},
     "expected kbtp+iwarp://host:port or kbtp+roce://host:port or kbtp+verbs://host:port"),
    (("kbtp", "initiator"), {"cmd": "ini --id {initiator_id}"}, "missing ['target']"),
    # a decode side's or relay's template is checked against the role's placeholders when the registry is loaded,
    # not when its first cell fills it in
    (("tlkv", "decode"), {"cmd": "dec --port {port} --geometry {geometry}"}, "unknown ['geometry']"),
    (("kvcs", "relay"), {"cmd": "relay --port {port} --key {key}"}, "unknown ['key']"),
])
def test_a_form_the_role_table_does_not_give_a_role_is_refused(tmp_path: Path, role: tuple[str, str],
                                                               entry: dict[str, Any], expected: str) -> None:
    doc = {"name": "t", "implementations": {"v": {"roles": {role[0]: {role[1]: {"versions": [1], **entry}}}}}}
    with pytest.raises(RegistryError) as err:
        load_registry(write_registry(tmp_path, doc))
    assert expected in str(err.value), str(err.value)


def test_informational_roles_are_any_role_of_a_protocol_without_cells(tmp_path: Path) -> None:
    doc = _minimal()
    doc["implementations"]["a"]["roles"]["moqt"] = {"bench": {"versions": [22], "notes": "a load generator"}}
    assert set(load_registry(write_registry(tmp_path, doc)).implementations["a"].info_roles) == {"moqt-bench"}


def test_a_combination_without_a_common_version_is_not_a_cell(tmp_path: Path) -> None:
    doc = _minimal()
    doc["implementations"]["old"] = {"roles": {"kvcs": {"consumer": {"versions": [20], "reference": True}}}}
    plan = make_plan(load_registry(write_registry(tmp_path, doc)), selected_suites(["kvcs"]))
    (table,) = plan.tables
    assert table.columns == ["a", "old"]
    assert ("a", "old") not in table.cells
    assert "no version in common" in table.not_cells[("a", "old")]
    assert "consumer old [20]" in table.not_cells[("a", "old")]
    assert list(plan.cells) == ["kvcs--a--a--a"]


def test_roles_select_whole_tables() -> None:
    registry = load_registry(SHIPPED)
    plan = make_plan(registry, selected_suites(["tlkv-prefill", "tlkv-decode", "kbtp"]))
    assert sorted(t.kind.name for t in plan.tables) == ["kbtp", "tlkv-transfer"]
    assert "not selected" in plan.skipped_kinds["kvcs"]
    with pytest.raises(ValueError, match="--roles 'kvcs-sender'"):
        selected_suites(["kvcs-sender"])


def test_shipped_registry_without_its_images_is_valid(tmp_path: Path) -> None:
    registry = load_registry(write_registry(tmp_path, shipped("aiomoqt", "kvconform-image", "moqrs")))
    assert list(registry.implementations) == ["kvconform"]
    assert not any(entry.run.in_docker for entry in registry.all_entries()), "what test_matrix.py runs without docker"
