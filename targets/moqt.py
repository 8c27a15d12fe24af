"""MOQT drivers: how the ``moqt-relay`` suite reaches a relay under test (moqt-d22-profile section 12).

A relay is reached at a ``moqt://host:port`` URL; the driver only decides who runs it:

- ``reference``: kvconform's caching relay (``kvconform.moqt.relay.Relay``) on 127.0.0.1 with a free
  port, in-process on its own event-loop thread, started with the authorization policy the PICS declare
  (``harness_policy``);
- ``python:<module>:<attr>``: an object implementing ``RelayDriver``, or a ``Relay`` subclass (the harness's
  mutant relays, or a vendor's in-process relay class taking the same keyword arguments) run the same way;
- ``moqt://host:port``: a relay someone else runs; its policy must match what the PICS declare.

The suite's authorization expectations are data in the PICS (``moqt.relay.prefix``,
``moqt.relay.tokens``), never guessed: ``RelayAccess`` reads them and ``harness_policy`` turns them into
the policy an owned relay starts with. The ``kvcs-relay`` suite drives relays the same way, with one
``RelayAccess`` per declared scope (``kvconform.fixtures.kvcs.relay``) merged into one policy.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

from kvconform.moqt.policy import PolicyError, policy_from_mapping
from kvconform.moqt.quic import LoopThread
from kvconform.moqt.relay import Relay
from kvconform.moqt.structures import AuthToken, TrackNamespace
from kvconform.targets.spec import Pics
from kvconform.verdicts import DriverError, TargetUnavailable

__all__ = [
    "DEFAULT_PREFIX",
    "DriverError",
    "InProcessRelay",
    "RelayAccess",
    "RelayDriver",
    "RemoteRelay",
    "TargetUnavailable",
    "adapt_relay",
    "harness_policy",
    "reference_relay",
    "relay_access",
]

START_TIMEOUT = 10.0  # seconds to bind and start an owned relay
STOP_TIMEOUT = 5.0
# Prefix under which the suite publishes when a relay declares no authorization (and so no prefix).
DEFAULT_PREFIX: tuple[str, ...] = ("kvconform", "moqt-relay")
TOKEN_ROLES = ("publisher", "subscriber", "outsider", "expired")


# ---- what the PICS declare ----------------------------------------------------------------------


def _field(value: object, where: str) -> bytes:
    if isinstance(value, str) and value:
        return value.encode("utf-8")
    if isinstance(value, dict) and isinstance(value.get("hex"), str):
        return bytes.fromhex(value["hex"])
    raise DriverError(f"PICS {where}: got {value!r}, expected a non-empty string or {{hex: ...}}")


@dataclass(frozen=True)
class RelayAccess:
    """The relay's declared authorization: who may publish and subscribe under which prefix.

    ``authorization`` False (declared) means the relay authorizes every request; then no token is needed
    and the authorization checks are not applicable. Token values are sent as USE_VALUE, Token Type 0.
    """

    authorization: bool
    prefix: TrackNamespace
    tokens: dict[str, bytes]
    # PICS moqt.name_bytes: utf8 (a declared deviation from MOQT-CTRL-NAMESPACE-BYTES): the relay takes only
    # UTF-8 namespace fields, so the suite's fresh fields are text (``field``) except where that rule is checked.
    utf8_names: bool = False

    def field(self, rng: Any, size: int) -> bytes:
        """A fresh ``size``-byte Track Namespace field from ``rng`` (a numpy Generator): random bytes, or, for a
        relay that declares ``moqt.name_bytes: utf8``, the hex text of ``size // 2`` random bytes (same size)."""
        if not self.utf8_names:
            return bytes(rng.bytes(size))
        text = bytes(rng.bytes((size + 1) // 2)).hex().encode("ascii")
        return text[:size]

    def token(self, role: str) -> tuple[AuthToken, ...]:
        """The AUTHORIZATION_TOKEN parameters a request of ``role`` carries (none without authorization)."""
        value = self.tokens.get(role)
        return () if value is None else (AuthToken.use_value(value),)


def relay_access(pics: Pics) -> RelayAccess:
    """Read ``moqt.relay.authorization``, ``.prefix`` and ``.tokens`` (testbeds/schema/pics-moqt.schema.json)."""
    authorization = bool(pics.get("moqt.relay.authorization", True))
    raw_prefix = pics.get("moqt.relay.prefix")
    raw_tokens = pics.get("moqt.relay.tokens") or {}
    if not isinstance(raw_tokens, dict):
        raise DriverError(f"PICS moqt.relay.tokens: got {raw_tokens!r}, expected a mapping role -> token")
    tokens = {role: _field(v, f"moqt.relay.tokens.{role}") for role, v in raw_tokens.items() if v is not None}
    if authorization:
        missing = [r for r in ("publisher", "subscriber", "outsider") if r not in tokens]
        if raw_prefix is None or missing:
            raise DriverError(
                "PICS moqt.relay: a relay that authorizes requests (moqt.relay.authorization, default true) "
                f"must declare moqt.relay.prefix and moqt.relay.tokens.{{publisher,subscriber,outsider}}; "
                f"missing: {', '.join((['prefix'] if raw_prefix is None else []) + [f'tokens.{m}' for m in missing])}")
    if raw_prefix is None:
        prefix = TrackNamespace.of(*DEFAULT_PREFIX)
    else:
        if not isinstance(raw_prefix, list) or not raw_prefix:
            raise DriverError(f"PICS moqt.relay.prefix: got {raw_prefix!r}, expected a list of 1..28 fields")
        prefix = TrackNamespace(tuple(_field(f, f"moqt.relay.prefix[{i}]") for i, f in enumerate(raw_prefix)))
    name_bytes = pics.get("moqt.name_bytes", "any")
    if name_bytes not in ("any", "utf8"):
        raise DriverError(f"PICS moqt.name_bytes: got {name_bytes!r}, expected 'any' or 'utf8'")
    return RelayAccess(authorization, prefix, tokens, utf8_names=name_bytes == "utf8")


def _yaml_field(value: bytes) -> object:
    try:
        text = value.decode("utf-8")
    except UnicodeDecodeError:
        return {"hex": value.hex()}
    return text if text.isprintable() and text else {"hex": value.hex()}


def harness_policy(access: RelayAccess, *more: RelayAccess) -> dict[str, Any]:
    """The relay policy (testbeds/schema/moqt-relay-policy.schema.json) matching the declared PICS: the
    publisher token may publish and subscribe under the prefix, the subscriber token may subscribe, the
    expired token held the subscribe right until 1970, the outsider token and anonymous requests nothing.
    With ``more`` accesses (kvcs-relay: one per scope, each with its own prefix) a token gets the union of
    the rights every access gives it."""
    accesses = (access, *more)
    if not all(a.authorization for a in accesses):
        return {"version": 1, "allow_all": True}
    entries: dict[bytes, dict[str, Any]] = {}  # token value -> its policy entry, in first-seen order
    for i, a in enumerate(accesses):
        prefix = [_yaml_field(f) for f in a.prefix.fields]
        grants: list[tuple[str, tuple[str, ...], int | None]] = [
            ("publisher", ("publish", "subscribe"), None), ("subscriber", ("subscribe",), None)]
        if "expired" in a.tokens:
            grants.append(("expired", ("subscribe",), 1))
        for role, rights, expires in grants:
            value = a.tokens[role]
            entry = entries.setdefault(value, {"name": role if i == 0 else f"{role} #{i}",
                                               "value": _yaml_field(value)})
            for right in rights:
                entry.setdefault(right, []).append(prefix)
            if expires is not None:
                entry["expires"] = expires
    return {"version": 1, "description": "kvconform relay suite (from the PICS)",
            "anonymous": {"subscribe": []}, "tokens": list(entries.values())}


# ---- drivers ------------------------------------------------------------------------------------


@runtime_checkable
class RelayDriver(Protocol):
    """moqt-relay: a relay the suite can start with a policy (a no-op for one it does not own) and stop."""

    def start(self, policy: dict[str, Any]) -> str:
        """Start (or locate) the relay; return its ``moqt://host:port`` URL."""
        ...

    def stop(self) -> None: ...


class InProcessRelay:
    """A ``kvconform.moqt.relay.Relay`` (sub)class on 127.0.0.1 with a free port, on its own loop thread."""

    def __init__(self, relay_class: type[Any], **options: Any) -> None:
        self.relay_class = relay_class
        self.options = options
        self.relay: Any = None
        self._thread: Any = None

    def start(self, policy: dict[str, Any]) -> str:
        try:
            parsed = policy_from_mapping(policy, "harness policy from the PICS")
        except PolicyError as exc:
            raise TargetUnavailable(str(exc)) from exc
        self._thread = LoopThread(name=f"moqt-relay-{self.relay_class.__name__}")

        async def start() -> Any:
            relay = self.relay_class(policy=parsed, host="127.0.0.1", port=0, **self.options)
            return await relay.start()

        try:
            self.relay = self._thread.run(start(), START_TIMEOUT)
        except (OSError, TimeoutError) as exc:
            self._thread.close(STOP_TIMEOUT)
            raise TargetUnavailable(f"{self.relay_class.__name__} did not start on 127.0.0.1: {exc!r}") from exc
        return str(self.relay.url)

    def stop(self) -> None:
        if self._thread is None:
            return
        try:
            if self.relay is not None:
                self._thread.run(self.relay.close(STOP_TIMEOUT), STOP_TIMEOUT + 1.0)
        except (TimeoutError, asyncio.CancelledError, RuntimeError):
            pass  # the loop is torn down below either way
        finally:
            self._thread.close(STOP_TIMEOUT)
            self._thread = self.relay = None


class RemoteRelay:
    """A relay already running at a URL, started and stopped by someone else."""

    def __init__(self, url: str) -> None:
        self.url = url

    def start(self, policy: dict[str, Any]) -> str:
        return self.url

    def stop(self) -> None:
        return None


def reference_relay() -> InProcessRelay:
    """The reference caching relay, in-process."""
    return InProcessRelay(Relay)


def adapt_relay(obj: object) -> InProcessRelay | None:
    """A ``python:`` target that is a ``Relay`` subclass (a mutant, a vendor's variant) runs like the reference."""
    return InProcessRelay(obj) if isinstance(obj, type) and issubclass(obj, Relay) else None
