"""Authorization policy of the caching relay (moqt-d22-profile section 12, EDR "Relays").

A policy says which AUTHORIZATION TOKEN (section 3.6) may *publish* (PUBLISH_NAMESPACE, PUBLISH) or
*subscribe* (SUBSCRIBE, FETCH, TRACK_STATUS, SUBSCRIBE_NAMESPACE) under which Track Namespace prefix.
A right granted on prefix P covers a requested namespace (or requested namespace prefix) N iff P is a
field-wise prefix of N, compared byte-exact field by field: a right on ("kvcs-1", scope) lets its holder
SUBSCRIBE_NAMESPACE ("kvcs-1", scope, compat) but not ("kvcs-1"), which would reveal other scopes.

Loaded from YAML validated by ``testbeds/schema/moqt-relay-policy.schema.json``::

    version: 1
    anonymous: {subscribe: [["public"]]}
    tokens:
      - {name: pub, value: pub-secret, publish: [["kvcs-1", {hex: 6d1c...}]]}
      - {name: sub, value: sub-secret, subscribe: [["kvcs-1"]], expires: 1893456000}

Outcomes (REQUEST_ERROR codes, section 10.2): a right held -> allowed; the only tokens that would hold
it are past ``expires`` -> EXPIRED_AUTH_TOKEN (0x5); tokens were presented but the policy knows none of
them (a well-formed but invalid token, section 3.6) -> MALFORMED_AUTH_TOKEN (0x4); otherwise (no token,
or known tokens without this right) -> UNAUTHORIZED (0x1).
"""

from __future__ import annotations

import enum
import json
import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from functools import cache
from importlib import resources
from pathlib import Path
from typing import Any

from kvconform import yamlload
from kvconform.moqt.errors import RequestErrorCode

__all__ = [
    "EXPIRED_AUTH_TOKEN",
    "MALFORMED_AUTH_TOKEN",
    "UNAUTHORIZED",
    "Decision",
    "Grant",
    "Policy",
    "PolicyError",
    "Right",
    "TokenKey",
    "is_prefix",
    "load_policy",
    "policy_from_mapping",
    "render_namespace",
]

UNAUTHORIZED = RequestErrorCode.UNAUTHORIZED
MALFORMED_AUTH_TOKEN = RequestErrorCode.MALFORMED_AUTH_TOKEN
EXPIRED_AUTH_TOKEN = RequestErrorCode.EXPIRED_AUTH_TOKEN

Namespace = tuple[bytes, ...]

_SCHEMA_FILE = "moqt-relay-policy.schema.json"


class PolicyError(ValueError):
    """A policy file is malformed; the message names the file and the JSON path."""


class Right(enum.Enum):
    """What a token may do under a prefix."""

    PUBLISH = "publish"
    SUBSCRIBE = "subscribe"


@dataclass(frozen=True)
class TokenKey:
    """A resolved AUTHORIZATION TOKEN: (Token Type, Token Value); aliases are resolved by the session."""

    type: int
    value: bytes


@dataclass(frozen=True)
class Grant:
    """One policy entry: the rights of one token (or of anonymous requests)."""

    name: str
    publish: tuple[Namespace, ...] = ()
    subscribe: tuple[Namespace, ...] = ()
    expires: float | None = None  # Unix time

    def prefixes(self, right: Right) -> tuple[Namespace, ...]:
        return self.publish if right is Right.PUBLISH else self.subscribe


@dataclass(frozen=True)
class Decision:
    """The outcome of one authorization check; ``code`` is the REQUEST_ERROR code when refused."""

    allowed: bool
    code: RequestErrorCode = RequestErrorCode.INTERNAL_ERROR  # meaningful only when refused
    reason: str = ""


def is_prefix(prefix: Sequence[bytes], namespace: Sequence[bytes]) -> bool:
    """Namespace Prefix Matching (EDR "Publisher Interactions"): fields compared one by one, exact bytes.

    (foo) and (foo, bar) are prefixes of (foo, bar); (foobar) is not.
    """
    return len(prefix) <= len(namespace) and all(a == b for a, b in zip(prefix, namespace, strict=False))


@dataclass(frozen=True)
class Policy:
    """Token -> rights per namespace prefix. ``Policy.allow_everything()`` authorizes every request."""

    allow_all: bool = False
    anonymous: Grant = field(default_factory=lambda: Grant(name="anonymous"))
    tokens: dict[TokenKey, Grant] = field(default_factory=dict)

    @classmethod
    def allow_everything(cls) -> Policy:
        return cls(allow_all=True)

    def check(self, right: Right, namespace: Sequence[bytes], tokens: Iterable[TokenKey],
              now: float) -> Decision:
        """May a request presenting ``tokens`` (message and SETUP tokens together) use ``right`` on
        ``namespace`` (a track's namespace, or the prefix of a SUBSCRIBE_NAMESPACE)?"""
        if self.allow_all:
            return Decision(True)
        presented = list(tokens)
        grants = [self.tokens[t] for t in presented if t in self.tokens]
        if not presented:
            grants = [self.anonymous]
        expired_match = False
        for grant in grants:
            if not any(is_prefix(p, namespace) for p in grant.prefixes(right)):
                continue
            if grant.expires is not None and now >= grant.expires:
                expired_match = True
                continue
            return Decision(True)
        rendered = render_namespace(namespace)
        if expired_match:
            return Decision(False, EXPIRED_AUTH_TOKEN, f"token for {right.value} on {rendered} has expired")
        if presented and not grants:
            return Decision(False, MALFORMED_AUTH_TOKEN,
                            f"{len(presented)} token(s), none known to this relay (MOQT-AUTH-TOKEN)")
        who = "no token" if not presented else f"{len(presented)} token(s), {len(grants)} known"
        return Decision(False, UNAUTHORIZED, f"{who}: no {right.value} right on {rendered}")


def render_namespace(namespace: Sequence[bytes]) -> str:
    """Log rendering of section 3.4: fields joined by '-', bytes outside [A-Za-z0-9_] as .hh."""
    def one(f: bytes) -> str:
        return "".join(chr(b) if chr(b).isascii() and (chr(b).isalnum() or b == 0x5F) else f".{b:02x}" for b in f)
    return "-".join(one(f) for f in namespace) or "(empty)"


def _field(value: object) -> bytes:
    if isinstance(value, str):
        return value.encode("utf-8")
    assert isinstance(value, dict)  # the schema allows only str or {hex: ...}
    return bytes.fromhex(str(value["hex"]))


def _prefixes(values: object) -> tuple[Namespace, ...]:
    assert isinstance(values, list)
    return tuple(tuple(_field(f) for f in prefix) for prefix in values)


def _grant(name: str, doc: dict[str, Any]) -> Grant:
    expires = doc.get("expires")
    return Grant(name=name, publish=_prefixes(doc.get("publish", [])),
                 subscribe=_prefixes(doc.get("subscribe", [])),
                 expires=float(expires) if expires is not None else None)


@cache
def _validator() -> Any:
    import jsonschema  # lazy: ~0.1 s of start-up that only validating a file needs

    # the schema ships with the testbeds' data (the policy is a relay's testbed file), located, not imported
    schema = json.loads((resources.files("kvconform.testbeds") / "schema" / _SCHEMA_FILE).read_text("utf-8"))
    return jsonschema.Draft202012Validator(schema)


def _validate(doc: object, origin: str) -> None:
    errors = sorted(_validator().iter_errors(doc), key=lambda e: [str(p) for p in e.absolute_path])
    if errors:
        lines = [f"{origin}: {e.json_path}: {e.message}" for e in errors[:20]]
        raise PolicyError("invalid relay policy:\n  " + "\n  ".join(lines))


def policy_from_mapping(doc: object, origin: str = "<policy>") -> Policy:
    """Build a policy from an already parsed document (validated against the schema)."""
    _validate(doc, origin)
    assert isinstance(doc, dict)
    tokens: dict[TokenKey, Grant] = {}
    for i, entry in enumerate(doc.get("tokens", [])):
        key = TokenKey(int(entry.get("type", 0)), _field(entry["value"]))
        if key in tokens:
            raise PolicyError(f"{origin}: $.tokens[{i}].value: token listed twice (type {key.type})")
        tokens[key] = _grant(str(entry.get("name", f"tokens[{i}]")), entry)
    return Policy(allow_all=bool(doc.get("allow_all", False)),
                  anonymous=_grant("anonymous", doc.get("anonymous", {})), tokens=tokens)


def load_policy(path: str | os.PathLike[str]) -> Policy:
    """Load and validate a policy YAML file."""
    file = Path(path)
    try:
        text = file.read_text("utf-8")
    except OSError as exc:
        raise PolicyError(f"{file}: cannot read relay policy: {exc.strerror}") from exc
    try:
        doc = yamlload.safe_load(text)
    except yamlload.YAMLError as exc:
        raise PolicyError(f"{file}: not valid YAML: {exc}") from exc
    return policy_from_mapping(doc, str(file))
