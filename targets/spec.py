"""Target specs: what ``--target`` names and the PICS (declared capabilities) that come with it.

``reference`` | a URL (``grpc://host:port``, ...) | ``cmd:<command template>`` |
``python:<module>:<factory>`` | a target name from the testbed. Ad-hoc targets take the testbed's
``defaults.pics``; a named target its own; ``--pics-set`` overrides are applied last and recorded.
"""

from __future__ import annotations

import copy
import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal
from urllib.parse import parse_qsl, urlsplit

import yaml

from kvconform.verdicts import not_applicable

from .testbed import Testbed

__all__ = [
    "URL_SCHEME_ROLES",
    "Pics",
    "TargetError",
    "TargetKind",
    "TargetSpec",
    "apply_pics_overrides",
    "parse_pics_override",
    "parse_target",
]

TargetKind = Literal["reference", "url", "cmd", "python"]

# URL scheme -> suites a target reached that way can play; each protocol lane adds its schemes.
URL_SCHEME_ROLES: dict[str, set[str]] = {"grpc": {"tlkv-decode"}, "moqt": {"moqt-relay", "kvcs-relay"}}

# cmd: placeholder -> suite a spawned implementation with that placeholder plays; each lane adds its own.
CMD_PLACEHOLDER_ROLES: dict[str, str] = {
    "{decode_addr}": "tlkv-prefill",
    "{envelope}": "tlkv-reader",
    "{sequence}": "tlkv-writer",
    "{token}": "kvcs-publisher",
    "{out}": "kvcs-consumer",
}


def cmd_roles(command: str) -> set[str]:
    """The suites a cmd: template plays, from its placeholders (a prefill side may also name its sequence)."""
    if "{decode_addr}" in command:
        return {CMD_PLACEHOLDER_ROLES["{decode_addr}"]}
    if "{relay}" in command:  # both KVCS endpoints take {relay} and {cache}: a consumer writes {out}
        return {"kvcs-consumer" if "{out}" in command else "kvcs-publisher"}
    return {suite for ph, suite in CMD_PLACEHOLDER_ROLES.items() if ph in command}

_URL = re.compile(r"^(?P<scheme>[a-z][a-z0-9+.-]*)://")
_PYTHON = re.compile(r"^[A-Za-z_][A-Za-z0-9_.]*:[A-Za-z_][A-Za-z0-9_.]*$")
_MISSING = object()


class TargetError(ValueError):
    """``--target`` or ``--pics-set`` cannot be resolved; the message says what was expected."""


@dataclass
class TargetSpec:
    """A resolved target: how to reach it, which suites it plays and what it declares."""

    name: str
    kind: TargetKind
    value: str
    roles: set[str] | None
    pics: dict[str, Any]
    params: dict[str, Any] = field(default_factory=dict)
    source: str = ""
    overrides: list[str] = field(default_factory=list)

    def plays(self, suite: str) -> bool:
        """Whether the target plays ``suite`` (True when it declares no roles)."""
        return self.roles is None or suite in self.roles

    def describe(self) -> dict[str, Any]:
        """A JSON-able summary for reports and evidence."""
        return {
            "name": self.name,
            "kind": self.kind,
            "value": self.value,
            "roles": sorted(self.roles) if self.roles is not None else None,
            "params": self.params,
            "pics_source": self.source,
            "pics_overrides": list(self.overrides),
        }


class Pics:
    """Read access to a target's PICS by dotted path (``tlkv.decode.versions``)."""

    def __init__(self, data: Mapping[str, Any], source: str = "") -> None:
        self._data = data
        self.source = source

    def as_dict(self) -> dict[str, Any]:
        """A deep copy of the PICS."""
        return copy.deepcopy(dict(self._data))

    def _lookup(self, path: str) -> Any:
        node: Any = self._data
        for part in path.split("."):
            if not isinstance(node, Mapping) or part not in node:
                return _MISSING
            node = node[part]
        return node

    def get(self, path: str, default: Any = None) -> Any:
        """The value at ``path`` or ``default`` when absent."""
        value = self._lookup(path)
        return default if value is _MISSING else value

    def declared(self, path: str) -> bool:
        """Whether ``path`` is present and not false/empty."""
        value = self._lookup(path)
        return value is not _MISSING and value is not None and value is not False and value != []

    def require(self, path: str, value: Any = None) -> Any:
        """Return the declared value at ``path``; end the check not-applicable when it is absent or false,
        or (with ``value``) when it neither equals nor contains ``value``."""
        declared = self._lookup(path)
        if not self.declared(path):
            not_applicable(f"capability not declared in PICS {path} (source: {self.source or 'unknown'})")
        if value is not None and not _has(declared, value):
            not_applicable(f"PICS {path} = {declared!r} does not contain {value!r} (source: {self.source})")
        return declared


def _has(declared: Any, value: Any) -> bool:
    if isinstance(declared, list | tuple | set | frozenset | dict):
        return value in declared
    return bool(declared == value)


def parse_pics_override(text: str) -> tuple[str, Any]:
    """``KEY=VALUE`` -> (dotted key, value parsed as YAML)."""
    key, sep, raw = text.partition("=")
    key = key.strip()
    if not sep or not key or any(not part for part in key.split(".")):
        raise TargetError(f"--pics-set: expected KEY=VALUE with a dotted KEY, got {text!r}")
    try:
        value = yaml.safe_load(raw) if raw.strip() else None
    except yaml.YAMLError as exc:
        raise TargetError(f"--pics-set {key}: value {raw!r} is not valid YAML: {exc}") from exc
    return key, value


def apply_pics_overrides(pics: dict[str, Any], overrides: Iterable[str]) -> list[str]:
    """Apply ``KEY=VALUE`` overrides in place; returns them normalised for the record."""
    applied: list[str] = []
    for text in overrides:
        key, value = parse_pics_override(text)
        node = pics
        parts = key.split(".")
        for i, part in enumerate(parts[:-1]):
            child = node.setdefault(part, {})
            if not isinstance(child, dict):
                where = ".".join(parts[: i + 1])
                raise TargetError(f"--pics-set {key}: PICS {where} is {child!r}, expected a mapping")
            node = child
        node[parts[-1]] = value
        applied.append(f"{key}={json.dumps(value, default=str)}")
    return applied


def _url_params(url: str) -> dict[str, Any]:
    parts = urlsplit(url)
    params: dict[str, Any] = dict(parse_qsl(parts.query))
    params["scheme"] = parts.scheme
    if parts.hostname:
        params["host"] = parts.hostname
    try:
        if parts.port is not None:
            params["port"] = parts.port
    except ValueError as exc:
        raise TargetError(f"--target {url!r}: port: {exc}") from exc
    if parts.path and parts.path != "/":
        params["path"] = parts.path
    return params


def _roles_of_url(url: str) -> set[str]:
    scheme = urlsplit(url).scheme
    if scheme not in URL_SCHEME_ROLES:
        known = ", ".join(sorted(URL_SCHEME_ROLES))
        raise TargetError(f"--target {url!r}: URL scheme {scheme!r} is not handled by any lane (known: {known})")
    return set(URL_SCHEME_ROLES[scheme])


def _named(name: str, entry: Mapping[str, Any], testbed: Testbed) -> TargetSpec:
    driver: TargetKind = entry["driver"]
    value = "reference" if driver == "reference" else str(entry[driver])
    params: dict[str, Any] = {}
    roles: set[str] | None = set(entry["roles"]) if "roles" in entry else None
    if driver == "url":
        params.update(_url_params(value))
        if roles is None:
            roles = _roles_of_url(value)
    params.update(entry.get("params", {}))
    return TargetSpec(
        name=name,
        kind=driver,
        value=value,
        roles=roles,
        pics=copy.deepcopy(entry.get("pics", {})),
        params=params,
        source=f"testbed {testbed.path} targets.{name}",
    )


def parse_target(text: str, testbed: Testbed, pics_overrides: Iterable[str] = ()) -> TargetSpec:
    """Resolve ``--target`` against ``testbed`` and apply ``--pics-set`` overrides."""
    text = text.strip()
    defaults = f"testbed defaults ({testbed.path})"
    spec: TargetSpec
    if _URL.match(text):
        spec = TargetSpec(text, "url", text, _roles_of_url(text), copy.deepcopy(testbed.default_pics),
                          _url_params(text), defaults)
    elif text.startswith("cmd:"):
        command = text[len("cmd:"):].strip()
        if not command:
            raise TargetError("--target cmd:: expected a command line after 'cmd:'")
        spec = TargetSpec(text, "cmd", command, cmd_roles(command) or None, copy.deepcopy(testbed.default_pics),
                          {}, defaults)
    elif text.startswith("python:"):
        ref = text[len("python:"):]
        if not _PYTHON.match(ref):
            raise TargetError(f"--target {text!r}: expected python:<module>:<factory>")
        spec = TargetSpec(text, "python", ref, None, copy.deepcopy(testbed.default_pics), {}, defaults)
    elif text in testbed.targets:
        spec = _named(text, testbed.targets[text], testbed)
    elif text == "reference":
        spec = TargetSpec("reference", "reference", "reference", None, copy.deepcopy(testbed.default_pics),
                          {}, defaults)
    else:
        known = ", ".join(sorted(testbed.targets)) or "none"
        raise TargetError(
            f"--target {text!r}: not a URL, cmd:..., python:<module>:<factory> or a target of testbed "
            f"{testbed.path} (its targets: {known})"
        )
    overrides = list(pics_overrides)
    if overrides:
        spec.overrides = apply_pics_overrides(spec.pics, overrides)
        spec.source += " + --pics-set " + ", ".join(spec.overrides)
    return spec
