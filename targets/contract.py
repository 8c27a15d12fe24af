"""The container contract (docs/docker-contract.md): how the harness asks an image to play a role.

Pure functions and data only, no docker: the roles an image may be asked to play (those of the role table,
``targets/registry.py`` ``ROLES``, that say how a container plays them), how the values of a role's placeholders
become environment variables, arguments and bind mounts, what the lines ``kvconform-ready`` and
``kvconform-unsupported`` mean and how an exit status is read (127 = the image declares it does not play the role).
``targets/docker.py`` runs containers by it; the harness's own unit tests check it without a daemon.

Contract version 1:

- the image carries the label ``org.kvconform.contract=1`` (an image without it is not run: a random image would
  fail every check on arguments it never understood);
- it is run with host networking, talks on 127.0.0.1 only, as the harness's uid:gid, with the arguments
  ``<role> --<name> <value> ...`` after its ENTRYPOINT and the same values in ``KVCONFORM_<NAME>``;
- every path it is given lies under ``/kvconform`` (the host folders holding them are bind-mounted there,
  read-write); it writes its outputs exactly where it is told;
- a server role is ready when it prints ``kvconform-ready`` or its port accepts (TCP) / is bound (UDP);
- a role it does not play: print ``kvconform-unsupported role=<role>`` and exit 127.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import PurePosixPath
from typing import Literal

from kvconform.targets.registry import ROLES, ContainerKind, Probe, Role

__all__ = [
    "CONTRACT_LABEL",
    "CONTRACT_VERSION",
    "ITEMS",
    "LANE_ROLES",
    "MOUNT_ROOT",
    "OPTIONAL_LABEL",
    "UNSUPPORTED_EXIT",
    "ContainerRole",
    "ExitMeaning",
    "Invocation",
    "ReadyLine",
    "container_role",
    "container_roles",
    "env_name",
    "exit_meaning",
    "invocation",
    "item",
    "optional_from_labels",
    "parse_ready",
    "parse_unsupported",
]

CONTRACT_VERSION = "1"
CONTRACT_LABEL = "org.kvconform.contract"  # = CONTRACT_VERSION on every image that follows the contract
OPTIONAL_LABEL = "org.kvconform.contract.optional"  # "<role>:<name> ...": the optional placeholders it reads
MOUNT_ROOT = PurePosixPath("/kvconform")
UNSUPPORTED_EXIT = 127
ENV_PREFIX = "KVCONFORM_"
LOOPBACK = "127.0.0.1"
DOC = "docs/docker-contract.md"

# The items of the contract, each a section of docs/docker-contract.md (tests/test_docker_contract.py keeps the two
# equal): every message the harness gives about a container that broke the contract names the item it broke.
ITEMS: dict[str, str] = {
    "label": "the image carries org.kvconform.contract=1",
    "roles": "the role names an image may be asked to play",
    "invocation": "<role> --<name> <value> ... and KVCONFORM_<NAME>, the placeholders of each role",
    "files": "paths under /kvconform, bind-mounted from the harness's folders",
    "network": "host networking, 127.0.0.1 only, the harness's uid:gid",
    "readiness": "a server role prints kvconform-ready [port=N] or its port accepts / is bound",
    "unsupported": "a role it does not play: kvconform-unsupported role=<role> and exit 127",
    "stop": "SIGTERM, then SIGKILL after the grace; the container is removed; its output goes to the evidence",
}


def item(name: str) -> str:
    """How a message names contract item ``name``: ``contract item 'readiness' (docs/docker-contract.md#readiness)``."""
    if name not in ITEMS:
        raise KeyError(f"contract item {name!r}: expected one of {', '.join(ITEMS)}")
    return f"contract item '{name}' ({DOC}#{name})"


# Placeholders that name files: "in" a file the harness wrote, "out" a file the image writes, "dir" a folder
# the harness filled, "list" comma-separated "kid=PATH" entries of input files.
FILES: dict[str, Literal["in", "out", "dir", "list"]] = {
    "sequence": "in", "tokens_file": "in", "envelope": "in", "cache": "in", "policy": "in",
    "out": "out", "certs": "dir", "producer_key": "list",
}


@dataclass(frozen=True)
class ContainerRole:
    """One role as a container plays it: its placeholders and how the harness knows it is serving."""

    name: str
    kind: ContainerKind
    placeholders: tuple[str, ...]
    optional: tuple[str, ...] = ()
    probe: Probe | None = None  # how a server role's port shows it is ready (besides the kvconform-ready line)

    @property
    def allowed(self) -> frozenset[str]:
        return frozenset(self.placeholders) | frozenset(self.optional)


def _contract_role(role: Role) -> ContainerRole:
    assert role.container is not None
    required, optional = role.contract_placeholders
    return ContainerRole(role.name, role.container.kind, required, optional, role.container.probe)


# The contract's roles, from the role table (targets/registry.py ROLES): the suites an image can be asked to play
# (``container_roles()``), and the interop lane's third-party peers, which no suite tests (tests/interop).
_SUITES: dict[str, ContainerRole] = {name: _contract_role(r) for name, r in ROLES.items()
                                     if r.container is not None and r.is_suite}
LANE_ROLES: dict[str, ContainerRole] = {name: _contract_role(r) for name, r in ROLES.items()
                                        if r.container is not None and not r.is_suite}


def container_roles() -> dict[str, ContainerRole]:
    """Every suite a container can be asked to play, with its placeholders (targets/registry.py ROLES)."""
    return dict(_SUITES)


def container_role(name: str) -> ContainerRole:
    """The contract role ``name`` (a suite or a lane role); KeyError naming the known ones."""
    roles = {**container_roles(), **LANE_ROLES}
    if name not in roles:
        raise KeyError(f"role {name!r} is not in the container contract (known: {', '.join(sorted(roles))})")
    return roles[name]


def env_name(placeholder: str) -> str:
    """``decode_addr`` -> ``KVCONFORM_DECODE_ADDR``."""
    return ENV_PREFIX + placeholder.upper()


def _arg_name(placeholder: str) -> str:
    return "--" + placeholder.replace("_", "-")


@dataclass(frozen=True)
class Invocation:
    """How one run of a role is asked of an image: its arguments, environment and bind mounts (host -> inside)."""

    role: str
    command: list[str]
    environment: dict[str, str]
    mounts: dict[str, str] = field(default_factory=dict)


class _Mounts:
    """Host folders -> /kvconform/<n>, numbered in the order first needed."""

    def __init__(self) -> None:
        self.folders: dict[str, str] = {}

    def inside(self, host_path: str, kind: str) -> str:
        path = PurePosixPath(host_path)
        if not path.is_absolute():
            raise ValueError(f"file placeholder value {host_path!r}: expected an absolute host path")
        folder = str(path) if kind == "dir" else str(path.parent)
        mount = self.folders.setdefault(folder, str(MOUNT_ROOT / str(len(self.folders))))
        return mount if kind == "dir" else str(PurePosixPath(mount) / path.name)


def _translate(name: str, value: str, mounts: _Mounts) -> str:
    kind = FILES.get(name)
    if kind is None or value == "":
        return value
    if kind == "list":
        entries = []
        for entry in value.split(","):
            kid, sep, path = entry.rpartition("=")
            entries.append(f"{kid}{sep}{mounts.inside(path, 'in')}")
        return ",".join(entries)
    return mounts.inside(value, kind)


def invocation(role: str, values: Mapping[str, str]) -> Invocation:
    """The arguments, environment and mounts that ask an image to play ``role`` with these placeholder values.
    Paths (the placeholders of ``FILES``) are rewritten to where the container sees them under /kvconform.
    ValueError naming a required placeholder without a value, or one the role does not have."""
    spec = container_role(role)
    missing = sorted(set(spec.placeholders) - set(values))
    unknown = sorted(set(values) - spec.allowed)
    if missing or unknown:
        raise ValueError(f"role {role}: " + "; ".join(
            part for part in (f"no value for {', '.join(missing)}" if missing else "",
                              f"{', '.join(unknown)} not among its placeholders "
                              f"({', '.join(sorted(spec.allowed))})" if unknown else "") if part))
    mounts = _Mounts()
    inside = {name: _translate(name, str(value), mounts) for name, value in sorted(values.items())}
    command = [role]
    for name, value in inside.items():
        command += [_arg_name(name), value]
    environment = {env_name("contract"): CONTRACT_VERSION, env_name("role"): role, env_name("host"): LOOPBACK}
    environment.update({env_name(name): value for name, value in inside.items()})
    return Invocation(role, command, environment, {host: mount for host, mount in mounts.folders.items()})


# ---- what the container says ---------------------------------------------------------------------------

_READY = re.compile(r"^kvconform-ready(?:\s+port=(?P<port>\d+))?\s*$")
_UNSUPPORTED = re.compile(r"^kvconform-unsupported(?:\s+role=(?P<role>\S+))?\s*$")


@dataclass(frozen=True)
class ReadyLine:
    """A ``kvconform-ready [port=N]`` line."""

    port: int | None


def parse_ready(line: str) -> ReadyLine | None:
    """The readiness line's content, or None for any other line."""
    match = _READY.match(line.strip())
    if match is None:
        return None
    return ReadyLine(int(match["port"]) if match["port"] else None)


def parse_unsupported(lines: Iterable[str], role: str) -> bool:
    """Whether the output declares ``kvconform-unsupported`` (for ``role``, or without naming one)."""
    for line in lines:
        match = _UNSUPPORTED.match(line.strip())
        if match is not None and match["role"] in (None, role):
            return True
    return False


ExitMeaning = Literal["unsupported", "undeclared-127", "exit"]


def exit_meaning(code: int | None, lines: Sequence[str], role: str) -> ExitMeaning:
    """How the harness reads a container's exit: ``unsupported`` (127 with the declaration line: the image does
    not play the role), ``undeclared-127`` (127 without it: a shell's "command not found" looks the same, so the
    harness cannot tell a declaration from a broken image) or a plain ``exit`` judged by the role's contract."""
    if code != UNSUPPORTED_EXIT:
        return "exit"
    return "unsupported" if parse_unsupported(lines, role) else "undeclared-127"


def optional_from_labels(labels: Mapping[str, str] | None, role: str) -> frozenset[str]:
    """The optional placeholders an image declares it reads for ``role`` (label ``org.kvconform.contract.optional``:
    space-separated ``<role>:<name>`` entries)."""
    text = (labels or {}).get(OPTIONAL_LABEL, "")
    names = set()
    for entry in text.split():
        entry_role, sep, name = entry.partition(":")
        if sep and entry_role == role and name:
            names.add(name)
    return frozenset(names)
