"""The KVSP functions KVCS depends on, and ``kvsp-provisional-1``, the profile kvconform implements.

KVCS takes the Compatibility ID, Scope ID, Block Keys, codec registry and layer digest from the KV Cache
Storage Protocol (KVSP), whose text we do not have. ``kvsp-provisional-1`` (issue 5) defines them exactly,
so independent implementations agree; every check that depends on it is marked ``depends_on:
[kvsp-provisional-1]`` in the catalog and in reports. A vendor with the real KVSP registers its own
``KvspProfile`` under the entry-point group ``kvconform.kvsp`` and names it in the cache spec's ``profile``.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Mapping, Sequence
from importlib.metadata import entry_points
from typing import Any, ClassVar, Protocol, runtime_checkable

from kvconform.kvsp.errors import KvspError
from kvconform.kvsp.jcs import jcs_canonical

__all__ = ["ENTRY_POINT_GROUP", "PROVISIONAL", "KvspError", "KvspProfile", "ProvisionalKvsp", "load_profile"]

ENTRY_POINT_GROUP = "kvconform.kvsp"
DESCRIPTOR_FIELDS = ("model", "layers", "kv_heads", "head_dim", "block_tokens", "dtype")


@runtime_checkable
class KvspProfile(Protocol):
    """What KVCS needs of KVSP."""

    name: str

    def compatibility_id(self, compat: Mapping[str, Any]) -> bytes:
        """32 octets identifying the Compatibility Descriptor."""
        ...

    def scope_id(self, scope_key: bytes) -> bytes:
        """16 octets identifying the scope."""
        ...

    def block_keys(self, scope_key: bytes, compat_id: bytes, tokens: Sequence[int], block_tokens: int) -> list[bytes]:
        """The 32-octet Block Key of every complete block of ``tokens``, in order."""
        ...

    def codec_value(self, name: str) -> int: ...

    def codec_name(self, value: int) -> str: ...

    def layer_digest(self, k_data: bytes, v_data: bytes) -> bytes:
        """The layer digest of one block and layer (raw codec)."""
        ...


class ProvisionalKvsp:
    """``kvsp-provisional-1`` as issue 5 defines it."""

    name = "kvsp-provisional-1"
    SCOPE_LABEL = b"kvsp-provisional-1 scope"
    CODECS: ClassVar[dict[int, str]] = {1: "raw"}  # 0 is reserved

    def compatibility_id(self, compat: Mapping[str, Any]) -> bytes:
        """SHA-256 of the descriptor's RFC 8785 (JCS) canonical serialisation."""
        missing = [f for f in DESCRIPTOR_FIELDS if f not in compat]
        if missing:
            raise KvspError(f"Compatibility Descriptor: missing {', '.join(missing)} (kvsp-provisional-1 needs "
                            f"{', '.join(DESCRIPTOR_FIELDS)})")
        return hashlib.sha256(jcs_canonical(dict(compat), name="compat")).digest()

    def scope_id(self, scope_key: bytes) -> bytes:
        """The first 16 octets of HMAC-SHA-256(scope_key, "kvsp-provisional-1 scope")."""
        return hmac.new(scope_key, self.SCOPE_LABEL, hashlib.sha256).digest()[:16]

    def block_keys(self, scope_key: bytes, compat_id: bytes, tokens: Sequence[int], block_tokens: int) -> list[bytes]:
        """Key i = HMAC-SHA-256(scope_key, Compatibility ID || key i-1 (zeros for i = 0) || le_u32 tokens)."""
        if block_tokens <= 0:
            raise KvspError(f"block_tokens: {block_tokens}, expected > 0")
        keys: list[bytes] = []
        previous = bytes(32)
        for start in range(0, len(tokens) - block_tokens + 1, block_tokens):
            block = tokens[start:start + block_tokens]
            if any(not 0 <= t < 2**32 for t in block):
                raise KvspError(f"tokens[{start}:{start + block_tokens}]: a token outside 0..2^32-1")
            message = compat_id + previous + b"".join(t.to_bytes(4, "little") for t in block)
            previous = hmac.new(scope_key, message, hashlib.sha256).digest()
            keys.append(previous)
        return keys

    def codec_value(self, name: str) -> int:
        for value, known in self.CODECS.items():
            if known == name:
                return value
        raise KvspError(f"codec {name!r} is not in the kvsp-provisional-1 registry (known: raw)")

    def codec_name(self, value: int) -> str:
        try:
            return self.CODECS[value]
        except KeyError:
            raise KvspError(f"Codec {value} is not in the kvsp-provisional-1 registry (0 is reserved, 1 = raw)"
                            ) from None

    def layer_digest(self, k_data: bytes, v_data: bytes) -> bytes:
        """SHA-256(k data || v data)."""
        return hashlib.sha256(k_data + v_data).digest()


PROVISIONAL: KvspProfile = ProvisionalKvsp()


def load_profile(name: str) -> KvspProfile:
    """The KVSP profile ``name``: the provisional one, or one registered under ``kvconform.kvsp``."""
    if name == PROVISIONAL.name:
        return PROVISIONAL
    for ep in entry_points(group=ENTRY_POINT_GROUP):
        if ep.name == name:
            obj = ep.load()
            profile = obj() if isinstance(obj, type) else obj
            if not isinstance(profile, KvspProfile):
                raise KvspError(f"entry point {ep.value} ({ENTRY_POINT_GROUP}) is not a KvspProfile")
            return profile
    known = [PROVISIONAL.name, *(ep.name for ep in entry_points(group=ENTRY_POINT_GROUP))]
    raise KvspError(f"profile {name!r}: not known (known: {', '.join(sorted(set(known)))}; a vendor profile "
                    f"registers under the entry-point group {ENTRY_POINT_GROUP})")
