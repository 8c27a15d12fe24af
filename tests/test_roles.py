"""One role table (targets/registry.py ROLES): every role, URL scheme and ``cmd:`` placeholder that the command line,
the plugfest matrix and the container contract accept resolves through it, and each of them accepts exactly what
the table gives it: a role, scheme or placeholder one of them knows and the table does not (or the other way round)
fails here."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from kvconform import cli
from kvconform.catalog import load_catalogs
from kvconform.matrix.plan import KINDS, selected_suites
from kvconform.matrix.registry import (
    INFO_PROTOCOLS,
    MATRIX_ROLES,
    SERVER_ROLES,
    RegistryError,
    load_registry,
    registry_schema,
)
from kvconform.targets import contract
from kvconform.targets import reference_image as ri
from kvconform.targets.registry import ROLES, Container, Role, RoleError, cmd_roles, suite_roles, url_roles, url_schemes
from kvconform.targets.spec import parse_target
from kvconform.targets.testbed import load_testbed

SUITES = suite_roles()
PLACEHOLDER = re.compile(r"\{([a-z_0-9]+)\}")


def _template(names: tuple[str, ...] | frozenset[str]) -> str:
    return "impl " + " ".join(f"--{n} {{{n}}}" for n in sorted(names))


# ---- the table itself ------------------------------------------------------------------------------------


def test_every_suite_is_a_role_of_the_table_and_every_suite_role_has_a_suite_and_a_catalog_role() -> None:
    assert set(cli.discover_suites()) == set(SUITES), "conformance/<protocol>/<role>/ folders vs ROLES' suites"
    catalog = load_catalogs()
    for name in SUITES:
        assert catalog.role_of_suite(name), f"{name}: conformance/requirements/*.yaml suites: names no role for it"
    peers = set(ROLES) - set(SUITES)
    assert peers == set(contract.LANE_ROLES), "a role without a suite is a peer of the interop lane"


@pytest.mark.parametrize(("fields", "expected"), [
    ({"url_schemes": ("grpc",)}, "url and url_schemes together"),
    ({"cmd": "m:Cmd"}, "a cmd: driver with its required placeholders"),
    ({"no_container": ""}, "why no image plays it"),
    ({"placeholders": ("port",), "server": True, "container": Container("one-shot")}, "exactly for a server role"),
    ({"placeholders": ("out",)}, "placeholders only with a template form"),
])
def test_the_table_refuses_a_role_that_contradicts_itself(fields: dict[str, Any], expected: str) -> None:
    with pytest.raises(ValueError, match=re.escape(expected)):
        Role("tlkv-writer", "m:P", "m:f", **{"no_container": "none", **fields})
    with pytest.raises(ValueError, match="a peer role"):
        Role("moqt-peer", url="m:f", url_schemes=("moqt",), container=Container("client", placeholders=()))


# ---- the command line: --target, kvconform run --help, kvconform suites ----------------------------------------


@pytest.mark.parametrize("scheme", url_schemes())
def test_every_url_scheme_is_a_target_of_the_suites_the_table_gives_it(scheme: str) -> None:
    target = parse_target(f"{scheme}://127.0.0.1:1", load_testbed())
    assert target.roles == url_roles(scheme) == {n for n, r in ROLES.items() if scheme in r.url_schemes}
    assert target.roles


@pytest.mark.parametrize("name", sorted(n for n, r in SUITES.items() if r.cmd))
def test_a_template_with_a_roles_placeholders_plays_it(name: str) -> None:
    role = ROLES[name]
    assert name in cmd_roles(_template(tuple(role.placeholders)))
    assert name in cmd_roles(_template(role.allowed))
    assert parse_target("cmd:" + _template(role.allowed), load_testbed()).plays(name)
    for missing in role.placeholders:
        assert name not in _plays(_template(role.allowed - {missing})), missing
    assert name not in _plays(_template((*role.placeholders, "not_a_placeholder")))


def _plays(template: str) -> set[str]:
    try:
        return cmd_roles(template)
    except RoleError:
        return set()


def _forms(line: str) -> dict[str, Any]:
    """What a suite's line of ``kvconform run --help`` offers: its URL schemes, cmd placeholders, docker."""
    schemes = set(re.findall(r"([a-z][a-z0-9+]*)://host:port", line))
    cmd = re.search(r"cmd:<template with ([^>]*)>", line)
    may = re.search(r"\(the template may add ([^)]*)\)", line)
    return {"schemes": schemes, "cmd": set(PLACEHOLDER.findall(cmd.group(1))) if cmd else None,
            "optional": set(PLACEHOLDER.findall(may.group(1))) if may else set(), "docker": "docker:IMAGE" in line}


def test_the_command_line_offers_each_suite_exactly_the_forms_of_the_table(capsys: pytest.CaptureFixture[str]) -> None:
    epilog = cli.run_epilog()
    lines = {line.split(":", 1)[0].strip(): line for line in epilog.splitlines() if line.startswith("  ")
             and line.split(":", 1)[0].strip() in SUITES}
    assert set(lines) == set(SUITES)
    rows = {row["suite"]: " ".join(row["targets"]).replace(" (may add", " (the template may add")
            for row in cli.suite_table()}
    assert set(rows) == set(SUITES)
    for name, role in SUITES.items():
        for shown in (lines[name], rows[name]):
            forms = _forms(shown)
            assert forms["schemes"] == set(role.url_schemes), (name, shown)
            assert forms["cmd"] == (set(role.placeholders) if role.cmd else None), (name, shown)
            assert forms["optional"] == (set(role.optional) if role.cmd else set()), (name, shown)
            assert forms["docker"] == (role.container is not None), (name, shown)
    listed = epilog.split("SCHEME://host:port", 1)[1].split("cmd:<template>", 1)[0]
    assert set(re.findall(r"[a-z][a-z0-9+]+(?=[,\s])", listed)) >= set(url_schemes())
    assert "docker:IMAGE[:TAG]" in cli.target_forms()


# ---- the plugfest matrix ---------------------------------------------------------------------------------


def test_the_matrix_roles_are_those_the_table_says_make_cells() -> None:
    matrix = {n for n, r in ROLES.items() if r.matrix}
    assert selected_suites(None) == matrix == {f"{p}-{r}" for p, roles in MATRIX_ROLES.items() for r in roles}
    assert {s for kind in KINDS for s in kind.suites} == matrix, "every matrix role has a table, every table's roles"
    assert {n for n in matrix if ROLES[n].server} == SERVER_ROLES
    assert set(INFO_PROTOCOLS) == {r.protocol for r in ROLES.values()} - set(MATRIX_ROLES)
    properties = registry_schema()["$defs"]["implementation"]["properties"]["roles"]["properties"]
    assert {f"{p}-{r}" for p in MATRIX_ROLES for r in properties[p]["properties"]} == matrix
    assert set(properties) == set(MATRIX_ROLES) | set(INFO_PROTOCOLS)


def _load(tmp_path: Path, name: str, form: dict[str, Any]) -> Any:
    role = ROLES[name]
    doc = {"name": "walk", "implementations": {"x": {"roles": {role.protocol: {role.role: {"versions": [1], **form}}}}}}
    path = tmp_path / "registry.yaml"  # (tests/matrix/helpers.py is another package of this session: not imported)
    path.write_text(yaml.safe_dump(doc), "utf-8")
    return load_registry(path)


MATRIX = sorted(n for n, r in ROLES.items() if r.matrix)


def test_the_matrix_refuses_a_protocol_or_role_the_table_does_not_know(tmp_path: Path) -> None:
    path = tmp_path / "registry.yaml"
    for roles in ({"rdma": {"target": {"versions": [1], "reference": True}}},
                  {"tlkv": {"encoder": {"versions": [1], "reference": True}}}):
        path.write_text(yaml.safe_dump({"name": "walk", "implementations": {"x": {"roles": roles}}}), "utf-8")
        with pytest.raises(RegistryError, match=r"(were|was) unexpected"):
            load_registry(path)


@pytest.mark.parametrize("name", MATRIX)
def test_the_matrix_takes_the_run_forms_the_table_gives_a_role_and_no_other(tmp_path: Path, name: str) -> None:
    role = ROLES[name]
    for scheme in url_schemes():
        form = {"url": f"{scheme}://127.0.0.1:1"}
        if scheme in role.url_schemes:
            assert _load(tmp_path, name, form).entries(name)[0].run.kind == "url"
        else:
            with pytest.raises(RegistryError, match=r"\.url: "):
                _load(tmp_path, name, form)
    if role.placeholders:
        for names in (tuple(role.placeholders), role.allowed):
            assert _load(tmp_path, name, {"cmd": _template(names)}).entries(name)[0].run.kind == "cmd"
        for missing in role.placeholders:
            with pytest.raises(RegistryError, match=r"missing|has no"):
                _load(tmp_path, name, {"cmd": _template(role.allowed - {missing})})
        with pytest.raises(RegistryError, match=r"unknown \['not_a_placeholder'\]"):
            _load(tmp_path, name, {"cmd": _template((*role.placeholders, "not_a_placeholder"))})
    else:
        with pytest.raises(RegistryError, match="has no command-line form"):
            _load(tmp_path, name, {"cmd": "impl --port {port}"})
    if role.container is not None:
        assert _load(tmp_path, name, {"image": "vendor/impl:1"}).entries(name)[0].run.kind == "image"
    else:
        with pytest.raises(RegistryError, match=re.escape(role.no_container)):
            _load(tmp_path, name, {"image": "vendor/impl:1"})


# ---- the container contract ------------------------------------------------------------------------------


def test_the_contract_plays_the_roles_the_table_gives_a_container_with_their_placeholders() -> None:
    contained = {n for n, r in ROLES.items() if r.container is not None}
    assert set(contract.container_roles()) | set(contract.LANE_ROLES) == contained
    assert set(contract.container_roles()) == contained & set(SUITES)
    assert parse_target("docker:vendor/impl:1", load_testbed()).roles == contained & set(SUITES)
    for name in contained:
        spec, role = contract.container_role(name), ROLES[name]
        assert (spec.placeholders, spec.optional) == role.contract_placeholders, name
        assert role.container is not None and (spec.kind, spec.probe) == (role.container.kind, role.container.probe)
    known = {p for r in ROLES.values() for p in (*r.allowed, *(n for part in r.contract_placeholders for n in part))}
    assert set(contract.FILES) <= known, "a file placeholder no role has"
    for name, optional in ri.OPTIONAL.items():  # the reference image's label: optional placeholders of the table
        assert set(optional) <= set(ROLES[name].contract_placeholders[1]), name
