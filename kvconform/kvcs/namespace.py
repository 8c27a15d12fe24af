"""The KVCS Track Namespace: exactly five fields ("kvcs-1", Scope ID, Compatibility ID, Anchor Key,
Publication ID), raw octets, and the two prefixes that matter (scope: the unit of authorization; content:
every publication of one token prefix)."""

from __future__ import annotations

import secrets
from dataclasses import dataclass

from kvconform.kvcs.errors import KvcsError
from kvconform.moqt.structures import TrackNamespace

__all__ = ["FIELD_LENGTHS", "KVCS_TAG", "REQ_NAMESPACE", "KvcsNamespace", "new_publication_id"]

KVCS_TAG = b"kvcs-1"
REQ_NAMESPACE = "KVCS-NS-FIVE-FIELDS"
# (name, length) of fields 0..4
FIELD_LENGTHS: tuple[tuple[str, int], ...] = (("kvcs-1 tag", 6), ("Scope ID", 16), ("Compatibility ID", 32),
                                              ("Anchor Key", 32), ("Publication ID", 16))


def new_publication_id() -> bytes:
    """A Publication ID chosen at random for each production of a cache."""
    return secrets.token_bytes(16)


@dataclass(frozen=True)
class KvcsNamespace:
    """The five-field namespace of one publication."""

    scope_id: bytes
    compat_id: bytes
    anchor_key: bytes
    pub_id: bytes

    def __post_init__(self) -> None:
        for (name, length), value in zip(FIELD_LENGTHS[1:], (*self.content_fields()[1:], self.pub_id),
                                         strict=True):
            if len(value) != length:
                raise KvcsError(f"Track Namespace {name}", f"{len(value)} octets, expected {length}",
                                requirement=REQ_NAMESPACE)

    def content_fields(self) -> tuple[bytes, bytes, bytes, bytes]:
        """Fields 0-3: what identifies the content (any consumer with the prefix and scope key computes them)."""
        return (KVCS_TAG, self.scope_id, self.compat_id, self.anchor_key)

    def track_namespace(self) -> TrackNamespace:
        return TrackNamespace((*self.content_fields(), self.pub_id))

    def scope_prefix(self) -> TrackNamespace:
        """("kvcs-1", Scope ID): all publications of a scope, the natural unit of authorization."""
        return TrackNamespace((KVCS_TAG, self.scope_id))

    def content_prefix(self) -> TrackNamespace:
        """("kvcs-1", Scope ID, Compatibility ID, Anchor Key): all publications of one token prefix."""
        return TrackNamespace(self.content_fields())

    def encode(self) -> bytes:
        """The wire form (108 octets: a field count of 5, then each field prefixed by its length)."""
        return self.track_namespace().encode()

    @classmethod
    def parse(cls, ns: TrackNamespace) -> KvcsNamespace:
        """A KVCS namespace from a MOQT one; KvcsError naming the field that is off."""
        if len(ns.fields) != 5:
            raise KvcsError("Track Namespace", f"{len(ns.fields)} fields, a KVCS namespace has exactly 5",
                            requirement=REQ_NAMESPACE)
        for i, ((name, length), value) in enumerate(zip(FIELD_LENGTHS, ns.fields, strict=True)):
            if len(value) != length:
                raise KvcsError(f"Track Namespace field {i} ({name})", f"{len(value)} octets, expected {length}",
                                requirement=REQ_NAMESPACE)
        if ns.fields[0] != KVCS_TAG:
            raise KvcsError("Track Namespace field 0", f"{ns.fields[0]!r}, expected ASCII 'kvcs-1'",
                            requirement=REQ_NAMESPACE)
        return cls(ns.fields[1], ns.fields[2], ns.fields[3], ns.fields[4])

    def __str__(self) -> str:
        return (f"(kvcs-1, scope {self.scope_id.hex()[:8]}.., compat {self.compat_id.hex()[:8]}.., "
                f"anchor {self.anchor_key.hex()[:8]}.., pub {self.pub_id.hex()})")
