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


def test_shipped_registry_lists_the_reference_and_aiomoqt_relay() -> None:
    registry = load_registry(SHIPPED)
    assert registry.implementations["kvconform"].reference
    assert set(registry.implementations["kvconform"].roles) == set(selected_suites(None))
    aiomoqt = registry.implementations["aiomoqt"]
    assert set(aiomoqt.roles) == {"kvcs-relay"}, "only aiomoqt's relay can play a KVCS role"
    assert aiomoqt.roles["kvcs-relay"].run.kind == "image", "by the container contract (test_contract_form.py)"
    assert {"moqt-client", "moqt-publisher", "moqt-subscriber"} <= set(aiomoqt.info_roles)
    assert all(v.get("notes") for v in aiomoqt.info_roles.values()), "each client says why it plays no KVCS role"
    plan = make_plan(registry, selected_suites(None))
    relays = {t.fixed.get("kvcs-relay") for t in plan.tables if t.kind.name == "kvcs"}
    assert relays == {"kvconform", "aiomoqt"}, "one KVCS table per relay"
    assert "kvcs--kvconform--aiomoqt--kvconform" in plan.cells


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
    registry = load_registry(write_registry(tmp_path, shipped("aiomoqt", "kvconform-image")))
    assert list(registry.implementations) == ["kvconform"]
    assert not any(entry.run.in_docker for entry in registry.all_entries()), "what test_matrix.py runs without docker"
