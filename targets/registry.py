"""The driver registry: every role a target can play, and how each kind of target reaches it (DESIGN.md,
"Drivers and targets").

One table for every lane. A role names its suite, the runtime-checkable Protocol a driver implements, its
reference factory, the URL schemes that reach it, the placeholders a ``cmd:`` template of it must (and may)
carry, and how a ``python:`` object that is a reference subclass is adapted. ``driver_for`` builds the driver
of a suite for a resolved target; ``url_roles`` and ``cmd_roles`` tell which suites a URL or a template
plays. A lane adds a role here and nowhere else; drivers are imported lazily ("module:attr"), so resolving a
target never imports aioquic or grpc.

``python:<module>:<attr>`` means, for every role, an object implementing the role's Protocol: ``attr`` names
the object, or a factory (a class or function called with no arguments) that returns one; a subclass of the
role's reference class (a mutant, a vendor's in-process variant) is run the way the reference is.

``docker:IMAGE[:TAG]`` means an image following the container contract (docs/docker-contract.md,
``targets/contract.py``): the role's ``cmd:`` driver runs it through a container launcher, and the relay roles
through a container relay (``targets/docker.py``); the KBTP roles cannot be played by a container yet.
"""

from __future__ import annotations

import importlib
import shlex
import string
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from kvconform.loading import import_python_target
from kvconform.verdicts import TargetUnavailable

if TYPE_CHECKING:
    from kvconform.targets.spec import TargetSpec

__all__ = ["ROLES", "Role", "RoleError", "cmd_placeholders", "cmd_roles", "driver_for", "url_roles"]


class RoleError(ValueError):
    """A target cannot play a role as written (a template's placeholders, a URL scheme): a usage error."""


@dataclass(frozen=True)
class Role:
    """One role of one protocol and every way the harness can reach an implementation of it."""

    suite: str
    protocol: str  # "module:Protocol" the driver implements
    reference: str  # "module:factory" of the reference driver (called with the fixture's options)
    url_schemes: tuple[str, ...] = ()
    url: str | None = None  # "module:factory" called with the URL
    cmd: str | None = None  # "module:factory" called with the template
    placeholders: tuple[str, ...] = ()  # a cmd: template of this role carries every one of these ...
    optional: tuple[str, ...] = ()  # ... and may carry these
    adapt: str | None = None  # "module:factory" turning a python: reference subclass into a driver, or None
    verbs: str | None = None  # "module:factory" called with a testbed's ``driver: verbs`` TargetSpec

    @property
    def allowed(self) -> frozenset[str]:
        return frozenset(self.placeholders) | frozenset(self.optional)

    def describe(self) -> str:
        forms = ["reference", "python:<module>:<factory>"]
        forms += [f"{s}://host:port" for s in self.url_schemes]
        if self.cmd:
            forms.append("cmd:<template with " + " ".join("{" + p + "}" for p in self.placeholders) + ">")
        from kvconform.targets.contract import container_roles

        if self.suite in container_roles():
            forms.append("docker:IMAGE[:TAG]")
        return f"{self.suite}: " + ", ".join(forms)


_T, _K, _M, _P, _C = ("kvconform.targets.tlkv", "kvconform.targets.kbtp", "kvconform.targets.moqt",
                      "kvconform.targets.kvcs.publisher", "kvconform.targets.kvcs.consumer")

ROLES: dict[str, Role] = {r.suite: r for r in (
    Role("tlkv-writer", f"{_T}:Writer", f"{_T}:ReferenceWriter", cmd=f"{_T}:CmdWriter",
         placeholders=("sequence", "out")),
    Role("tlkv-reader", f"{_T}:Reader", f"{_T}:ReferenceReader", cmd=f"{_T}:CmdReader",
         placeholders=("envelope", "out"), optional=("pool", "versions")),
    Role("tlkv-decode", f"{_T}:DecodeService", f"{_T}:ReferenceDecode", url_schemes=("grpc",),
         url=f"{_T}:RemoteDecode.from_url", cmd=f"{_T}:CmdDecode", placeholders=("port",),
         optional=("pool", "versions")),
    Role("tlkv-prefill", f"{_T}:Prefill", f"{_T}:ReferencePrefill", cmd=f"{_T}:CmdPrefill",
         placeholders=("decode_addr", "sequence"), optional=("tokens_file",)),
    Role("kbtp-target", f"{_K}:KbtpTarget", f"{_K}:ReferenceTargetDriver",
         url_schemes=("kbtp+iwarp", "kbtp+roce", "kbtp+verbs"), url="kvconform.targets.kbtp_wire:target_from_url",
         verbs="kvconform.targets.kbtp_verbs:VerbsTargetDriver.from_spec"),
    Role("kbtp-initiator", f"{_K}:KbtpInitiator", f"{_K}:ReferenceInitiatorDriver",
         cmd="kvconform.targets.kbtp_wire:CmdInitiatorDriver", placeholders=("target",),
         optional=("initiator_id", "features"), verbs="kvconform.targets.kbtp_verbs:VerbsInitiatorDriver.from_spec"),
    Role("moqt-relay", f"{_M}:RelayDriver", f"{_M}:reference_relay", url_schemes=("moqt",),
         url=f"{_M}:RemoteRelay", adapt=f"{_M}:adapt_relay"),
    Role("kvcs-relay", f"{_M}:RelayDriver", f"{_M}:reference_relay", url_schemes=("moqt",),
         url=f"{_M}:RemoteRelay", adapt=f"{_M}:adapt_relay"),
    Role("kvcs-publisher", f"{_P}:PublisherDriver", f"{_P}:reference_publisher", cmd=f"{_P}:CmdPublisher",
         placeholders=("relay", "cache"), optional=("token",), adapt=f"{_P}:adapt_publisher"),
    Role("kvcs-consumer", f"{_C}:ConsumerDriver", f"{_C}:reference_consumer", cmd=f"{_C}:CmdConsumer",
         placeholders=("relay", "cache", "out"),
         optional=("relay2", "token", "budget", "producer_key", "layers", "blocks"),
         adapt=f"{_C}:adapt_consumer"),
)}


def _load(ref: str) -> Any:
    module, _, attr = ref.partition(":")
    obj: Any = importlib.import_module(module)
    for part in attr.split("."):
        obj = getattr(obj, part)
    return obj


def url_roles(scheme: str) -> set[str]:
    """The suites a ``scheme://`` target plays (empty for an unknown scheme)."""
    return {r.suite for r in ROLES.values() if scheme in r.url_schemes}


def url_schemes() -> list[str]:
    return sorted({s for r in ROLES.values() for s in r.url_schemes})


def cmd_placeholders(template: str) -> set[str]:
    """The ``{name}`` placeholders of a cmd: template; RoleError for unbalanced quotes or braces."""
    try:
        args = shlex.split(template)
    except ValueError as exc:
        raise RoleError(f"cmd: template {template!r}: {exc} (quote it as a shell would)") from None
    if not args:
        raise RoleError("cmd: expected a command line after 'cmd:'")
    names: set[str] = set()
    for arg in args:
        try:
            fields = list(string.Formatter().parse(arg))
        except ValueError as exc:
            raise RoleError(f"cmd: template argument {arg!r}: {exc} (write a literal brace as {{{{ or }}}})") from None
        for _, name, spec, conversion in fields:
            if name is None:
                continue
            if not name.isidentifier() or spec or conversion:
                raise RoleError(f"cmd: template argument {arg!r}: placeholder {{{name}}} is not a plain {{name}}")
            names.add(name)
    return names


def cmd_roles(template: str) -> set[str]:
    """The suites a cmd: template plays: those whose required placeholders it carries and whose allowed set
    holds all of its placeholders. RoleError naming what each role needs when it plays none."""
    names = cmd_placeholders(template)
    played = {r.suite for r in ROLES.values()
              if r.cmd and set(r.placeholders) <= names and names <= r.allowed}
    if not played:
        needs = "; ".join(f"{r.suite} needs " + " ".join("{" + p + "}" for p in r.placeholders)
                          + (" (may add " + " ".join("{" + p + "}" for p in r.optional) + ")" if r.optional else "")
                          for r in ROLES.values() if r.cmd)
        shown = " ".join("{" + n + "}" for n in sorted(names)) or "none"
        raise RoleError(f"cmd: template {template!r} plays no role: its placeholders are {shown}; {needs}")
    return played


def _python(role: Role, value: str, options: Mapping[str, Any]) -> Any:
    obj = import_python_target(value)
    protocol = _load(role.protocol)
    if role.adapt is not None:
        adapted = _load(role.adapt)(obj, **options)
        if adapted is not None:
            return adapted
    # A class always names a factory (a Protocol check would pass on the class itself, by its attributes).
    if isinstance(obj, type) or (not isinstance(obj, protocol) and callable(obj)):
        try:
            obj = obj()
        except Exception as exc:  # a vendor's factory that cannot build its object: nothing was exchanged
            raise TargetUnavailable(f"python target {value}: its factory raised {type(exc).__name__}: {exc}") from exc
    if not isinstance(obj, protocol):
        raise TargetUnavailable(f"python target {value}: {type(obj).__name__} does not implement "
                                f"{role.protocol.rpartition(':')[2]} (the {role.suite} driver protocol, "
                                f"{role.protocol.partition(':')[0]})")
    return obj


def driver_for(suite: str, target: TargetSpec, **options: Any) -> Any:
    """The driver of ``suite`` for ``target``; ``options`` go to in-process drivers (reference, python:
    subclasses). TargetUnavailable when the target cannot play the suite as given (nothing was exchanged)."""
    role = ROLES.get(suite)
    if role is None:
        raise TargetUnavailable(f"no driver for suite {suite!r} (known: {', '.join(sorted(ROLES))})")
    if target.kind == "reference":
        return _load(role.reference)(**options)
    if target.kind == "python":
        return _python(role, target.value, options)
    if target.kind == "cmd":
        if role.cmd is None or suite not in cmd_roles(target.value):
            raise TargetUnavailable(f"cmd target {target.value!r} cannot play {suite}: {role.describe()}")
        return _load(role.cmd)(target.value)
    if target.kind == "url":
        scheme = str(target.params.get("scheme", ""))
        if role.url is None or scheme not in role.url_schemes:
            raise TargetUnavailable(f"target {target.value} cannot play {suite}: {role.describe()}")
        return _load(role.url)(target.value)
    if target.kind == "docker":
        return _load("kvconform.targets.docker:contract_driver")(suite, target)
    if target.kind == "verbs":
        if role.verbs is None:
            raise TargetUnavailable(f"verbs target {target.name} cannot play {suite}: {role.describe()}")
        return _load(role.verbs)(target)
    raise TargetUnavailable(f"target {target.name} ({target.kind}) cannot play {suite}: {role.describe()}")
