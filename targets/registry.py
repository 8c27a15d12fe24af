"""The role table: every role the harness plays or drives, and everything it knows about each (DESIGN.md,
"Drivers and targets").

``ROLES`` is the one table. A role is named ``<protocol>-<role>``; a *suite* role is tested by the suite of
that name and carries the runtime-checkable Protocol its drivers implement, its reference factory, the URL
schemes that reach it, its ``cmd:`` driver with the placeholders a template of it must (and may) carry, how a
``python:`` reference subclass is adapted, its ``driver: verbs`` factory, whether the harness dials it (a
server), how an image plays it under the container contract and whether it makes cells of the plugfest
matrix. A *peer* role (the interop lane's third-party tools) has no suite: only its container contract.
Everything else derives from this table: the drivers (``driver_for``), which suites a URL or a template plays
(``url_roles``, ``cmd_roles``), the container contract (``targets/contract.py``) and its docker driver, the
CLI's help and ``kvconform suites``, the matrix's roles, forms and registry schema (``kvconform.matrix``).
A lane adds a role here and nowhere else; drivers are named ``"module:attr"`` and imported when used, so
reading the table never imports aioquic or grpc.

``python:<module>:<attr>`` means, for every suite role, an object implementing the role's Protocol: ``attr``
names the object, or a factory (a class or function called with no arguments) that returns one; a subclass of
the role's reference class (a mutant, a vendor's in-process variant) is run the way the reference is.

``docker:IMAGE[:TAG]`` means an image following the container contract (docs/docker-contract.md,
``targets/contract.py``): the role's ``cmd:`` driver runs it through a container launcher, and the relay roles
through a container relay (``targets/docker.py``); a role without ``container`` cannot be played by one.
"""

from __future__ import annotations

import importlib
import shlex
import string
from dataclasses import dataclass
from typing import Any, Literal

__all__ = ["ROLES", "Container", "Role", "RoleError", "cmd_placeholders", "cmd_roles", "load_ref",
           "suite_roles", "url_roles", "url_schemes"]

ContainerKind = Literal["one-shot", "server", "client"]
Probe = Literal["tcp", "udp-bound"]


class RoleError(ValueError):
    """A target cannot play a role as written (a template's placeholders, a URL scheme): a usage error."""


@dataclass(frozen=True)
class Container:
    """How an image plays a role under the container contract (docs/docker-contract.md#roles)."""

    kind: ContainerKind  # one-shot (runs to its end), server (the harness dials it), client (runs until stopped)
    probe: Probe | None = None  # a server's port shows it is ready: it accepts (tcp) or is bound (udp-bound)
    # The placeholders an image of the role is given, when they are not those of the role's template (the relays:
    # the harness starts a relay image with its policy file, which a relay's template never carries).
    placeholders: tuple[str, ...] | None = None
    optional: tuple[str, ...] = ()  # with ``placeholders``: those an image reads when its label says so


@dataclass(frozen=True)
class Role:
    """One role of one protocol and every way the harness can reach an implementation of it."""

    name: str  # <protocol>-<role>: the suite that tests it, or a peer role of the interop lane (no suite)
    interface: str | None = None  # "module:Protocol" its drivers implement; None for a peer role
    reference: str | None = None  # "module:factory" of the reference driver (called with the fixture's options)
    url_schemes: tuple[str, ...] = ()
    url: str | None = None  # "module:factory" called with the URL
    cmd: str | None = None  # "module:factory" called with the template (or a container's launcher)
    # A template the harness starts for the role carries every one of these and may carry the optional ones: the
    # cmd: driver's (kvconform run); for a server role without a cmd: driver (the relays), the matrix's, which
    # starts it on {port} (kvconform.matrix.participants.start_relay).
    placeholders: tuple[str, ...] = ()
    optional: tuple[str, ...] = ()
    adapt: str | None = None  # "module:factory" turning a python: reference subclass into a driver, or None
    verbs: str | None = None  # "module:factory" called with a testbed's ``driver: verbs`` TargetSpec
    # "module:factory" called with (suite, a ``sim:`` TargetSpec, seed): an owned implementation on the
    # deterministic transport (targets/moqt_sim.py), or None
    sim: str | None = None
    server: bool = False  # the harness dials it (a URL, or a copy started on {port}); the others connect to it
    container: Container | None = None  # None: no image can play it ...
    no_container: str = ""  # ... and why
    matrix: bool = False  # it makes cells of the plugfest matrix (kvconform.matrix)

    def __post_init__(self) -> None:
        container = self.container
        expected = [why for broken, why in (
            ("-" not in self.name, "a name <protocol>-<role>"),
            ((self.interface is None) != (self.reference is None),
             "an interface and a reference factory (a suite role), or neither (a peer role)"),
            (not self.is_suite and (container is None or bool(self.url or self.cmd or self.matrix)),
             "a peer role: a container contract and no driver"),
            (bool(self.url) != bool(self.url_schemes), "url and url_schemes together"),
            (bool(self.cmd) and not self.placeholders, "a cmd: driver with its required placeholders"),
            (bool(self.placeholders) and not (self.cmd or self.server), "placeholders only with a template form"),
            (self.server and bool(self.placeholders) and "port" not in self.placeholders,
             "{port} among a server's placeholders"),
            (container is not None and (container.kind == "server") != self.server,
             "a container of kind server exactly for a server role"),
            (container is not None and container.placeholders is None and not self.placeholders,
             "the placeholders of the container"),
            (self.is_suite and container is None and not self.no_container, "no_container: why no image plays it"),
        ) if broken]
        if expected:
            raise ValueError(f"ROLES[{self.name!r}]: expected " + "; ".join(expected))

    @property
    def protocol(self) -> str:
        """The protocol: the name's part before its first ``-`` (``tlkv`` of ``tlkv-decode``)."""
        return self.name.split("-", 1)[0]

    @property
    def role(self) -> str:
        """The role within its protocol (``decode`` of ``tlkv-decode``)."""
        return self.name.split("-", 1)[1]

    @property
    def is_suite(self) -> bool:
        """Whether a suite of this name tests the role (a peer role of the interop lane is not tested)."""
        return self.interface is not None

    @property
    def allowed(self) -> frozenset[str]:
        return frozenset(self.placeholders) | frozenset(self.optional)

    @property
    def contract_placeholders(self) -> tuple[tuple[str, ...], tuple[str, ...]]:
        """(required, optional) placeholders of an image playing the role (docs/docker-contract.md#invocation)."""
        if self.container is None:
            return (), ()
        if self.container.placeholders is not None:
            return self.container.placeholders, self.container.optional
        return self.placeholders, self.optional

    def describe(self) -> str:
        """``<name>: <the --target forms that reach it>`` (``kvconform run --help``, ``kvconform suites``)."""
        forms = ["reference", "python:<module>:<factory>"] if self.is_suite else []
        if self.sim:
            forms += ["sim:reference", "sim:python:<module>:<factory>"]
        forms += [f"{s}://host:port" for s in self.url_schemes]
        if self.cmd:
            forms.append("cmd:<template with " + " ".join("{" + p + "}" for p in self.placeholders) + ">")
        if self.container is not None:
            forms.append("docker:IMAGE[:TAG]")
        return f"{self.name}: " + ", ".join(forms)


_T, _K, _M, _P, _C = ("kvconform.targets.tlkv", "kvconform.targets.kbtp", "kvconform.targets.moqt",
                      "kvconform.targets.kvcs.publisher", "kvconform.targets.kvcs.consumer")
_W, _V = "kvconform.targets.kbtp_wire", "kvconform.targets.kbtp_verbs"
_ONE_SHOT = Container("one-shot")


def _relay(name: str, *, matrix: bool = False) -> Role:
    """Both relay suites drive the same relay: by URL, in-process, or a copy the harness starts on {port} (with
    {certs}: the folder of its test certificate); an image of it gets its policy file too."""
    return Role(name, f"{_M}:RelayDriver", f"{_M}:reference_relay", url_schemes=("moqt",), url=f"{_M}:RemoteRelay",
                adapt=f"{_M}:adapt_relay", sim="kvconform.targets.moqt_sim:sim_relay", placeholders=("port",),
                optional=("certs",), server=True,
                container=Container("server", "udp-bound", ("port", "policy", "certs")), matrix=matrix)


ROLES: dict[str, Role] = {r.name: r for r in (
    Role("tlkv-writer", f"{_T}:Writer", f"{_T}:ReferenceWriter", cmd=f"{_T}:CmdWriter",
         placeholders=("sequence", "out"), container=_ONE_SHOT, matrix=True),
    Role("tlkv-reader", f"{_T}:Reader", f"{_T}:ReferenceReader", cmd=f"{_T}:CmdReader",
         placeholders=("envelope", "out"), optional=("pool", "versions"), container=_ONE_SHOT, matrix=True),
    Role("tlkv-decode", f"{_T}:DecodeService", f"{_T}:ReferenceDecode", url_schemes=("grpc",),
         url=f"{_T}:RemoteDecode.from_url", cmd=f"{_T}:CmdDecode", placeholders=("port",),
         optional=("pool", "versions"), server=True, container=Container("server", "tcp"), matrix=True),
    Role("tlkv-prefill", f"{_T}:Prefill", f"{_T}:ReferencePrefill", cmd=f"{_T}:CmdPrefill",
         placeholders=("decode_addr", "sequence"), optional=("tokens_file",), container=_ONE_SHOT, matrix=True),
    Role("kbtp-target", f"{_K}:KbtpTarget", f"{_K}:ReferenceTargetDriver",
         url_schemes=("kbtp+iwarp", "kbtp+roce", "kbtp+verbs"), url=f"{_W}:target_from_url",
         verbs=f"{_V}:VerbsTargetDriver.from_spec", server=True, matrix=True,
         no_container="the harness dials a running KBTP target (kbtp+iwarp://, kbtp+roce://); it starts none, so "
                      "there is no server contract for a target image yet"),
    Role("kbtp-initiator", f"{_K}:KbtpInitiator", f"{_K}:ReferenceInitiatorDriver", cmd=f"{_W}:CmdInitiatorDriver",
         placeholders=("target",), optional=("initiator_id", "features"), verbs=f"{_V}:VerbsInitiatorDriver.from_spec",
         matrix=True,
         no_container="the cmd: initiator is driven over its stdin and stdout (kvconform.kbtp.control), which the "
                      "container launcher does not carry yet"),
    _relay("moqt-relay"),
    _relay("kvcs-relay", matrix=True),
    Role("kvcs-publisher", f"{_P}:PublisherDriver", f"{_P}:reference_publisher", cmd=f"{_P}:CmdPublisher",
         placeholders=("relay", "cache"), optional=("token",), adapt=f"{_P}:adapt_publisher",
         container=Container("client"), matrix=True),
    Role("kvcs-consumer", f"{_C}:ConsumerDriver", f"{_C}:reference_consumer", cmd=f"{_C}:CmdConsumer",
         placeholders=("relay", "cache", "out"),
         optional=("relay2", "token", "budget", "producer_key", "layers", "blocks"),
         adapt=f"{_C}:adapt_consumer", container=_ONE_SHOT, matrix=True),
    # The interop lane's third-party peers (tests/interop): what it asks of the aiomoqt image; no suite.
    Role("moqt-interop-client", container=Container("one-shot", placeholders=("relay", "testcase"))),
    Role("moqt-publisher", container=Container("client", placeholders=("relay", "namespace", "track"),
                                               optional=("object_size", "group_size", "prefill_groups"))),
)}


def suite_roles() -> dict[str, Role]:
    """The roles a suite tests (every role but the interop lane's peers), by suite name."""
    return {name: role for name, role in ROLES.items() if role.is_suite}


def load_ref(ref: str) -> Any:
    """The object a ``"module:attr[.attr]"`` reference of the table names (its module imported now)."""
    module, _, attr = ref.partition(":")
    obj: Any = importlib.import_module(module)
    for part in attr.split("."):
        obj = getattr(obj, part)
    return obj


def url_roles(scheme: str) -> set[str]:
    """The suites a ``scheme://`` target plays (empty for an unknown scheme)."""
    return {r.name for r in ROLES.values() if scheme in r.url_schemes}


def url_schemes() -> list[str]:
    """Every URL scheme a target can be given in, sorted."""
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
    played = {r.name for r in ROLES.values()
              if r.cmd and set(r.placeholders) <= names and names <= r.allowed}
    if not played:
        needs = "; ".join(f"{r.name} needs " + " ".join("{" + p + "}" for p in r.placeholders)
                          + (" (may add " + " ".join("{" + p + "}" for p in r.optional) + ")" if r.optional else "")
                          for r in ROLES.values() if r.cmd)
        shown = " ".join("{" + n + "}" for n in sorted(names)) or "none"
        raise RoleError(f"cmd: template {template!r} plays no role: its placeholders are {shown}; {needs}")
    return played
