"""Target specs: what ``--target`` names and the PICS (declared capabilities) that come with it.

``reference`` | a URL (``grpc://host:port``, ...) | ``cmd:<command template>`` |
``python:<module>:<factory>`` | ``docker:IMAGE[:TAG]`` (an image following docs/docker-contract.md) |
``sim:reference``, ``sim:python:<module>:<factory>`` or ``sim:<testbed target>`` (an owned relay on the
deterministic transport: targets/moqt_sim.py) | a target name from the testbed. Ad-hoc targets take the testbed's
``defaults.pics``; a named target its own; ``--pics-set`` overrides are applied last and recorded.
"""

from __future__ import annotations

import copy
import dataclasses
import ipaddress
import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal
from urllib.parse import parse_qsl, urlsplit

from kvconform import yamlload
from kvconform.targets import registry
from kvconform.targets.contract import container_roles
from kvconform.targets.registry import RoleError
from kvconform.verdicts import not_applicable

from .testbed import Testbed, TestbedError, validate_pics

__all__ = [
    "Pics",
    "TargetError",
    "TargetKind",
    "TargetSpec",
    "apply_pics_overrides",
    "cmd_roles",
    "docker_roles",
    "parse_pics_override",
    "parse_target",
    "sim_roles",
    "url_roles",
]

TargetKind = Literal["reference", "url", "cmd", "python", "docker", "verbs", "sim"]


def cmd_roles(command: str) -> set[str]:
    """The suites a cmd: template plays, from its placeholders (targets/registry.py); TargetError otherwise."""
    try:
        return registry.cmd_roles(command)
    except RoleError as exc:
        raise TargetError(f"--target cmd:{command}: {exc}") from None


def url_roles(url: str) -> set[str]:
    """The suites a URL target plays, from its scheme; TargetError for an unknown scheme."""
    scheme = urlsplit(url).scheme
    found = registry.url_roles(scheme)
    if not found:
        raise TargetError(f"--target {url!r}: URL scheme {scheme!r} is not handled by any lane "
                          f"(known: {', '.join(registry.url_schemes())})")
    return found


def sim_roles() -> set[str]:
    """The suites a ``sim:`` target plays: the roles with a driver on the deterministic transport (the relays)."""
    return {r.name for r in registry.ROLES.values() if r.sim}


def docker_roles() -> set[str]:
    """The suites a ``docker:`` image can be asked to play (targets/contract.py; KBTP's cannot yet)."""
    return set(container_roles())


_URL = re.compile(r"^(?P<scheme>[a-z][a-z0-9+.-]*)://")
# An image reference as docker takes it: [registry[:port]/]name[/name...][:tag][@sha256:digest].
_IMAGE = re.compile(r"^(?:[A-Za-z0-9.-]+(?::\d+)?/)?[a-z0-9]+(?:[._-]+[a-z0-9]+)*(?:/[a-z0-9]+(?:[._-]+[a-z0-9]+)*)*"
                    r"(?::[A-Za-z0-9_][A-Za-z0-9_.-]{0,127})?(?:@sha256:[0-9a-f]{64})?$")
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
    defaulted: list[str] = field(default_factory=list)  # PICS paths taken from the testbed's defaults
    # What the testbed entry says the implementation under test is (name, vendor, version, build, firmware);
    # empty for an ad-hoc target, which the certification report says.
    implementation: dict[str, Any] = field(default_factory=dict)

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
            "pics_defaulted": list(self.defaulted),
            "implementation": dict(self.implementation),
        }


class Pics:
    """Read access to a target's PICS by dotted path (``tlkv.decode.versions``).

    ``defaulted`` lists the paths whose values were not declared for the target but taken from the testbed's
    defaults (which claim only mandatory behaviour): a check that would read a default as a claim of an
    optional behaviour (e.g. "declares only v1" read as "is v1-only") asks ``is_defaulted`` first."""

    def __init__(self, data: Mapping[str, Any], source: str = "", defaulted: Iterable[str] = ()) -> None:
        self._data = data
        self.source = source
        self.defaulted = tuple(defaulted)

    def is_defaulted(self, path: str) -> bool:
        """Whether the value at ``path`` (or anything under it) came from the testbed's defaults."""
        return any(p == path or p.startswith(path + ".") for p in self.defaulted)

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
        value = yamlload.safe_load(raw) if raw.strip() else None
    except yamlload.YAMLError as exc:
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


_HOST = re.compile(r"^(?=.{1,253}$)[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?(\.[A-Za-z0-9]([A-Za-z0-9-]{0,61}"
                   r"[A-Za-z0-9])?)*$")


def _url_params(url: str) -> dict[str, Any]:
    """Scheme, host, port (1..65535, required), path and query of a target URL; TargetError naming the part."""
    parts = urlsplit(url)
    params: dict[str, Any] = dict(parse_qsl(parts.query))
    params["scheme"] = parts.scheme
    host = parts.hostname
    if not host:
        raise TargetError(f"--target {url!r}: host: missing, expected {parts.scheme}://HOST:PORT")
    try:
        ipaddress.ip_address(host)
    except ValueError:
        if not _HOST.match(host):
            raise TargetError(f"--target {url!r}: host {host!r} is neither an IP address nor a host name") from None
    params["host"] = host
    try:
        port = parts.port
    except ValueError:
        raw = parts.netloc.rpartition(":")[2]
        raise TargetError(f"--target {url!r}: port {raw!r}: expected an integer 1..65535") from None
    if port is None:
        raise TargetError(f"--target {url!r}: port: missing, expected {parts.scheme}://{host}:PORT")
    if not 1 <= port <= 65535:
        raise TargetError(f"--target {url!r}: port {port}: expected 1..65535")
    params["port"] = port
    if parts.path and parts.path != "/":
        params["path"] = parts.path
    return params


def _docker_image(text: str, where: str) -> str:
    image = text.strip()
    if not image:
        raise TargetError(f"{where}: expected an image after 'docker:' (docker:IMAGE[:TAG])")
    if not _IMAGE.match(image):
        raise TargetError(f"{where}: image {image!r} is not a docker image reference (expected "
                          f"[REGISTRY/]NAME[:TAG][@sha256:DIGEST], lower-case name)")
    return image


def docker_params(image: str, params: Mapping[str, Any], testbed: Testbed) -> dict[str, Any]:
    """A docker target's ``params.docker``: the testbed's ``defaults.params.docker`` run settings under the
    target's own, and the build recipe of its image (its own ``build``, else the testbed's
    ``defaults.params.docker.images[IMAGE]``), with paths made absolute from the testbed file's folder."""
    defaults = dict(testbed.defaults.get("params", {}).get("docker", {}))
    recipes = defaults.pop("images", {})
    defaults.pop("base", None)
    merged: dict[str, Any] = {**defaults, **params.get("docker", {})}
    build = merged.get("build") or recipes.get(image)
    if build:
        root = Path(testbed.path).resolve().parent
        build = dict(build)
        for key in ("context", "script"):
            if key in build:
                build[key] = str(root / build[key])
        merged["build"] = build
    return merged


def _named(name: str, entry: Mapping[str, Any], testbed: Testbed) -> TargetSpec:
    driver: TargetKind = entry["driver"]
    value = "reference" if driver == "reference" else str(entry[driver])
    if driver == "verbs":
        value = str(entry["verbs"]["device"])
    params: dict[str, Any] = {}
    roles: set[str] | None = set(entry["roles"]) if "roles" in entry else None
    if driver == "url":
        params.update(_url_params(value))
        if roles is None:
            roles = url_roles(value)
    params.update(entry.get("params", {}))
    if driver == "verbs":
        params["verbs"] = dict(entry["verbs"])
    if driver == "docker":
        value = _docker_image(value, f"testbed {testbed.path} targets.{name}.docker")
        params["docker"] = docker_params(value, params, testbed)
        if roles is None:
            roles = docker_roles()
    return TargetSpec(
        name=name,
        kind=driver,
        value=value,
        roles=roles,
        pics=copy.deepcopy(entry.get("pics", {})),
        params=params,
        source=f"testbed {testbed.path} targets.{name}",
        implementation=dict(entry.get("implementation", {})),
    )


def _sim(text: str, testbed: Testbed, defaults: str) -> TargetSpec:
    """``sim:`` + what --target names on sockets, for an owned relay: ``reference`` or ``python:<module>:<factory>``,
    or a testbed target with one of those drivers (whose PICS and implementation it keeps: ``sim:reference`` is the
    loopback testbed's reference, declared as it is on sockets). A prefix, not a URL scheme."""
    inner = text[len("sim:"):]
    entry = testbed.targets.get(inner)
    if entry is not None and entry["driver"] in ("reference", "python"):
        spec = _named(inner, entry, testbed)
        value = "reference" if spec.kind == "reference" else f"python:{spec.value}"
        roles = sim_roles() if spec.roles is None else spec.roles & sim_roles()
        return dataclasses.replace(spec, name=text, kind="sim", value=value, roles=roles)
    if inner == "reference" or (inner.startswith("python:") and _PYTHON.match(inner[len("python:"):])):
        return TargetSpec(text, "sim", inner, sim_roles(), copy.deepcopy(testbed.default_pics), {}, defaults)
    raise TargetError(f"--target {text!r}: expected sim:reference, sim:python:<module>:<factory> or sim:<a testbed "
                      "target whose driver is reference or python> (an owned relay on the deterministic transport)")


def leaf_paths(tree: Mapping[str, Any], prefix: str = "") -> list[str]:
    """Dotted paths of the non-mapping values of a PICS tree."""
    out: list[str] = []
    for key, value in tree.items():
        path = f"{prefix}{key}"
        if isinstance(value, Mapping) and value:
            out += leaf_paths(value, path + ".")
        else:
            out.append(path)
    return out


def parse_target(text: str, testbed: Testbed, pics_overrides: Iterable[str] = ()) -> TargetSpec:
    """Resolve ``--target`` against ``testbed``, apply ``--pics-set`` overrides and validate the result against
    the PICS schemas (an override of the wrong type or an unknown key is a TargetError naming it)."""
    text = text.strip()
    defaults = f"testbed defaults ({testbed.path})"
    spec: TargetSpec
    if _URL.match(text):
        spec = TargetSpec(text, "url", text, url_roles(text), copy.deepcopy(testbed.default_pics),
                          _url_params(text), defaults)
    elif text.startswith("cmd:"):
        command = text[len("cmd:"):].strip()
        if not command:
            raise TargetError("--target cmd:: expected a command line after 'cmd:'")
        spec = TargetSpec(text, "cmd", command, cmd_roles(command), copy.deepcopy(testbed.default_pics), {}, defaults)
    elif text.startswith("docker:"):
        image = _docker_image(text[len("docker:"):], f"--target {text!r}")
        spec = TargetSpec(text, "docker", image, docker_roles(), copy.deepcopy(testbed.default_pics),
                          {"docker": docker_params(image, {}, testbed)}, defaults)
    elif text.startswith("sim:"):
        spec = _sim(text, testbed, defaults)
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
            f"--target {text!r}: not a URL, cmd:..., python:<module>:<factory>, docker:IMAGE[:TAG], sim:... or a "
            "target of "
            f"testbed {testbed.path} (its targets: {known})"
        )
    # An ad-hoc target's PICS are the testbed's defaults: the report marks each value that was not declared.
    if spec.source == defaults:
        spec.defaulted = leaf_paths(spec.pics)
    overrides = list(pics_overrides)
    if overrides:
        spec.overrides = apply_pics_overrides(spec.pics, overrides)
        spec.source += " + --pics-set " + ", ".join(spec.overrides)
        changed = [o.partition("=")[0] for o in spec.overrides]
        spec.defaulted = [p for p in spec.defaulted
                          if not any(p == c or p.startswith(c + ".") or c.startswith(p + ".") for c in changed)]
        try:
            validate_pics(spec.pics, "--pics-set")
        except TestbedError as exc:
            raise TargetError(str(exc)) from None
    return spec
