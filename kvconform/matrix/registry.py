"""The implementations registry: who plays which role, in which versions, how to run it, what it declares.

A YAML file validated against ``testbeds/schema/implementations.schema.json`` (its PICS against the testbed's
PICS schemas), whose roles and run forms are those of the role table (``targets/registry.py`` ``ROLES``: the
roles that make cells, the URL schemes, the placeholders of a template, which roles an image can play).
``load_registry(path)`` returns a ``Registry``; every problem is a ``RegistryError`` naming the file, the JSON
path, the value seen and what was expected, before anything runs.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

from kvconform import yamlload
from kvconform.targets.registry import ROLES, Role, RoleError, cmd_placeholders
from kvconform.targets.testbed import schema_dir

__all__ = [
    "INFO_PROTOCOLS",
    "MATRIX_ROLES",
    "SERVER_ROLES",
    "Implementation",
    "Registry",
    "RegistryError",
    "RoleEntry",
    "RunForm",
    "default_registry_path",
    "load_registry",
    "registry_schema",
]

SCHEMA_FILE = "implementations.schema.json"
# The roles that make cells, per protocol (each is the conformance suite <protocol>-<role>), in ROLES' order.
MATRIX_ROLES: dict[str, tuple[str, ...]] = {
    protocol: tuple(r.role for r in ROLES.values() if r.matrix and r.protocol == protocol)
    for protocol in dict.fromkeys(r.protocol for r in ROLES.values() if r.matrix)}
# Protocols of the table none of whose roles makes cells: an implementation lists what it plays of them (no cell).
INFO_PROTOCOLS = tuple(dict.fromkeys(r.protocol for r in ROLES.values() if r.protocol not in MATRIX_ROLES))
# Roles the harness starts and the others connect to: a template of these is launched with {port} and a readiness.
SERVER_ROLES = frozenset(name for name, r in ROLES.items() if r.matrix and r.server)


class RegistryError(ValueError):
    """The registry cannot be used as written; the message names the file, where, what was seen and expected."""


@dataclass(frozen=True)
class RunForm:
    """How the harness reaches a role: exactly one of ``cmd`` (optionally inside ``docker``), ``image`` (an image
    following the container contract, docs/docker-contract.md, with its ``contract`` parameters), ``url``,
    ``python`` or ``reference``."""

    kind: str  # "cmd" | "image" | "url" | "python" | "reference"
    value: str  # the template, IMAGE[:TAG], URL, module:factory, or "reference"
    docker: dict[str, Any] | None = None  # cmd: the image it runs inside ({image, build})
    ready: dict[str, Any] = field(default_factory=dict)
    # image: the contract's parameters, those of a testbed target's params.docker (build, environment, user,
    # ready_timeout_s, stop_timeout_s); build paths relative to the registry file
    contract: dict[str, Any] | None = None

    @classmethod
    def of(cls, entry: dict[str, Any]) -> RunForm:
        if "image" in entry:
            return cls("image", str(entry["image"]), contract=dict(entry.get("contract", {})))
        for kind in ("cmd", "url", "python"):
            if kind in entry:
                return cls(kind, str(entry[kind]), entry.get("docker"), dict(entry.get("ready", {})))
        return cls("reference", "reference")

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> RunForm:
        """The inverse of ``as_dict`` (a cell's request)."""
        contract = data.get("contract")
        return cls(str(data["kind"]), str(data["value"]), data.get("docker"), dict(data.get("ready", {})),
                   dict(contract) if contract is not None else None)

    @property
    def in_docker(self) -> bool:
        """Whether the harness runs this role in containers (which it must remove, whatever happens)."""
        return self.kind == "image" or bool(self.docker)

    def describe(self) -> str:
        if self.kind == "cmd" and self.docker:
            return f"cmd (in docker image {self.docker['image']}): {self.value}"
        if self.kind == "image":
            return f"image (container contract): {self.value}"
        return self.value if self.kind == "reference" else f"{self.kind}: {self.value}"

    def as_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"kind": self.kind, "value": self.value}
        if self.docker:
            out["docker"] = self.docker
        if self.ready:
            out["ready"] = self.ready
        if self.contract is not None:
            out["contract"] = self.contract
        return out


@dataclass(frozen=True)
class RoleEntry:
    """One role an implementation plays: ``suite`` is ``<protocol>-<role>``."""

    implementation: str
    protocol: str
    role: str
    versions: tuple[int | str, ...]
    run: RunForm
    suite_run: RunForm  # how the role's suite reaches it (the cells' form unless the registry says otherwise)
    pics: dict[str, Any]
    notes: str = ""
    # what a host must offer to run it beyond what its run form implies (kvconform.matrix.resources)
    resources: dict[str, float] = field(default_factory=dict)

    @property
    def suite(self) -> str:
        return f"{self.protocol}-{self.role}"

    @property
    def label(self) -> str:
        return f"{self.implementation} ({self.suite})"

    def as_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"implementation": self.implementation, "suite": self.suite,
                               "versions": list(self.versions), "run": self.run.as_dict(), "pics": self.pics}
        if self.suite_run != self.run:
            out["suite_run"] = self.suite_run.as_dict()
        if self.notes:
            out["notes"] = self.notes
        if self.resources:
            out["resources"] = self.resources
        return out


@dataclass(frozen=True)
class Implementation:
    """A registered implementation and the roles it plays."""

    name: str
    vendor: str
    version: str
    description: str
    reference: bool
    roles: dict[str, RoleEntry]  # suite -> entry (matrix roles only)
    info_roles: dict[str, dict[str, Any]]  # e.g. "moqt-client" -> its entry (no cells)

    def as_dict(self) -> dict[str, Any]:
        return {"name": self.name, "vendor": self.vendor, "version": self.version, "description": self.description,
                "reference": self.reference, "roles": sorted(self.roles),
                "info_roles": {k: v for k, v in sorted(self.info_roles.items())}}


@dataclass(frozen=True)
class Registry:
    """A loaded, validated registry."""

    name: str
    path: Path
    description: str
    sha256: str
    implementations: dict[str, Implementation]

    def entries(self, suite: str) -> list[RoleEntry]:
        """The implementations playing ``suite``, in registry order."""
        return [impl.roles[suite] for impl in self.implementations.values() if suite in impl.roles]

    def all_entries(self) -> Iterator[RoleEntry]:
        for impl in self.implementations.values():
            yield from impl.roles.values()

    def reference(self, suite: str) -> RoleEntry | None:
        """The reference implementation's entry for ``suite``, if one is registered."""
        found = [impl.roles[suite] for impl in self.implementations.values() if impl.reference and suite in impl.roles]
        return found[0] if found else None

    def resolve(self, relative: str) -> Path:
        """A path of the registry (a docker build context) relative to the registry file."""
        return (self.path.parent / relative).resolve()


def default_registry_path() -> Path:
    """The registry shipped with kvconform (``testbeds/implementations.yaml``)."""
    return schema_dir().parent / "implementations.yaml"


def _role_schema(role: Role) -> dict[str, Any]:
    forms = ", ".join(_forms(role))
    placeholders = ""
    if role.placeholders:
        placeholders = " cmd placeholders: " + " ".join("{" + p + "}" for p in role.placeholders) + (
            " and optionally " + " ".join("{" + p + "}" for p in role.optional) if role.optional else "") + "."
    return {"$ref": "#/$defs/server_role" if role.server else "#/$defs/role",
            "description": f"Suite {role.name}: {forms}.{placeholders}"}


def registry_schema() -> dict[str, Any]:
    """The registry's JSON schema: ``testbeds/schema/implementations.schema.json`` with the roles of each protocol
    filled in from the role table (``targets/registry.py`` ``ROLES``)."""
    schema: dict[str, Any] = json.loads((schema_dir() / SCHEMA_FILE).read_text("utf-8"))
    per_protocol: dict[str, Any] = {}
    for protocol, roles in MATRIX_ROLES.items():
        per_protocol[protocol] = {"type": "object", "minProperties": 1, "additionalProperties": False,
                                  "properties": {r: _role_schema(ROLES[f"{protocol}-{r}"]) for r in roles}}
    for protocol in INFO_PROTOCOLS:
        per_protocol[protocol] = {
            "type": "object", "minProperties": 1, "propertyNames": {"pattern": "^[a-z][a-z0-9-]*$"},
            "additionalProperties": {"$ref": "#/$defs/info_role"},
            "description": f"Informational: {protocol} roles an implementation plays (listed on the matrix page, no "
                           "cells), e.g. relay, publisher, subscriber, client."}
    roles = schema["$defs"]["implementation"]["properties"]["roles"]
    roles["properties"], roles["additionalProperties"] = per_protocol, False
    return schema


@cache  # compiled once per process
def _validator() -> Any:
    import jsonschema  # lazy: ~0.1 s of start-up that only validating a file needs
    from referencing import Registry as RefRegistry  # lazy: with jsonschema
    from referencing import Resource
    from referencing.jsonschema import DRAFT202012

    folder = schema_dir()
    schema = registry_schema()

    def retrieve(uri: str) -> Resource[Any]:
        local = folder / uri.rsplit("/", 1)[-1]  # sibling schema files only, never the network
        if local.name.startswith("pics-") and not local.is_file():
            return Resource.from_contents({"type": "object"}, default_specification=DRAFT202012)
        if not local.is_file():
            raise LookupError(f"schema {uri} not found as {local}")
        return Resource.from_contents(json.loads(local.read_text("utf-8")), default_specification=DRAFT202012)

    refs: RefRegistry[Any] = RefRegistry(retrieve=retrieve)  # type: ignore[call-arg]
    return jsonschema.Draft202012Validator(schema, registry=refs)


def _where(error: Any) -> str:
    return "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in error.absolute_path) or "(top)"


def _forms(role: Role) -> list[str]:
    """The run forms of a registry entry that reach ``role``, as the registry writes them."""
    forms = []
    if role.placeholders:
        forms.append("cmd:")
    if role.container is not None:
        forms.append("image:")
    forms += [f"url: {s}://host:port" for s in role.url_schemes]
    return [*forms, "python: <module>:<factory>", "reference: true"]


def _check_form(path: Path, where: str, suite: str, form: RunForm) -> None:
    role = ROLES[suite]
    expected = f"expected {', '.join(_forms(role))}"
    if form.kind == "image":
        if role.container is None:
            raise RegistryError(f"{path}: {where}.image: {form.value!r} cannot play {suite}: {role.no_container}; "
                                f"{expected}")
        return
    if form.kind == "url":
        scheme = form.value.partition("://")[0]
        if not role.url_schemes:
            raise RegistryError(f"{path}: {where}.url: {suite} is started by the harness for each cell; "
                                f"{expected}, got url {form.value!r}")
        if scheme not in role.url_schemes:
            raise RegistryError(f"{path}: {where}.url: got {form.value!r}, expected "
                                + " or ".join(f"{s}://host:port" for s in role.url_schemes))
        return
    if form.kind != "cmd":
        return
    if not role.placeholders:
        raise RegistryError(f"{path}: {where}.cmd: {suite} has no command-line form; {expected}")
    try:
        names = cmd_placeholders(form.value)
    except RoleError as exc:
        raise RegistryError(f"{path}: {where}.cmd: {exc}") from None
    missing = set(role.placeholders) - names
    extra = names - role.allowed
    if "port" in missing:
        raise RegistryError(f"{path}: {where}.cmd: {form.value!r} has no {{port}}; expected the port the harness "
                            f"picks for each {suite} it starts")
    if missing or extra:
        raise RegistryError(
            f"{path}: {where}.cmd: placeholders {sorted(names)}; {suite} needs {sorted(role.placeholders)} and may "
            f"add {sorted(role.optional)} (missing {sorted(missing)}, unknown {sorted(extra)})")


def load_registry(path: str | os.PathLike[str]) -> Registry:
    """Load and validate a registry YAML file; RegistryError for anything that is off."""
    file = Path(path)
    try:
        raw = file.read_bytes()
    except OSError as exc:
        raise RegistryError(f"{file}: cannot read the registry: {exc.strerror or exc}") from None
    try:
        doc = yamlload.safe_load(raw)
    except yamlload.YAMLError as exc:
        raise RegistryError(f"{file}: not valid YAML: {exc}") from None
    errors = sorted(_validator().iter_errors(doc), key=lambda e: [str(p) for p in e.absolute_path])
    if errors:
        lines = [f"{file}: {_where(e)}: {e.message}" for e in errors[:10]]
        raise RegistryError("invalid implementations registry:\n  " + "\n  ".join(lines))
    assert isinstance(doc, dict)
    implementations: dict[str, Implementation] = {}
    references: dict[str, str] = {}
    for name, entry in doc["implementations"].items():
        roles: dict[str, RoleEntry] = {}
        info: dict[str, dict[str, Any]] = {}
        for protocol, per_role in entry["roles"].items():
            for role, role_entry in per_role.items():
                suite = f"{protocol}-{role}"
                if protocol in INFO_PROTOCOLS:
                    info[suite] = dict(role_entry)
                    continue
                where = f"implementations.{name}.roles.{protocol}.{role}"
                form = RunForm.of(role_entry)
                _check_form(file, where, suite, form)
                suite_form = RunForm.of(role_entry["suite"]) if "suite" in role_entry else form
                _check_form(file, f"{where}.suite", suite, suite_form)
                roles[suite] = RoleEntry(name, protocol, role, tuple(role_entry["versions"]), form, suite_form,
                                         dict(role_entry.get("pics", {})), str(role_entry.get("notes", "")),
                                         {str(k): float(v) for k, v in role_entry.get("resources", {}).items()})
                if entry.get("reference"):
                    if suite in references:
                        raise RegistryError(f"{file}: implementations.{name}.reference: {references[suite]} is "
                                            f"already the reference {suite}; expected at most one per role")
                    references[suite] = name
        implementations[name] = Implementation(name, str(entry.get("vendor", "")), str(entry.get("version", "")),
                                               str(entry.get("description", "")), bool(entry.get("reference")),
                                               roles, info)
    return Registry(str(doc["name"]), file.resolve(), str(doc.get("description", "")),
                    hashlib.sha256(raw).hexdigest(), implementations)
