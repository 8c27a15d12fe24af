"""MOQT common structures (profile §3, §5, §7.1, §8): Location, Track Namespace/Name, Key-Value-Pairs,
Reason Phrase, Authorization Token, Message Parameters and the type registries they use.

Every structure has ``encode() -> bytes`` (checked: refuses what the profile forbids) and a ``decode``
classmethod reading from a ``Reader``; decode errors name the field and its absolute offset.  Raw bytes
for negative tests come from ``kvconform.moqt.craft``.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from enum import IntEnum

from kvconform.moqt.errors import MoqtDecodeError, MoqtEncodeError, SessionError
from kvconform.moqt.vi64 import MAX_VI64, Reader, encode_vi64

__all__ = [
    "MAX_FULL_TRACK_NAME",
    "MAX_KVP_LENGTH",
    "MAX_NAMESPACE_FIELDS",
    "MAX_REASON_PHRASE",
    "AuthAliasType",
    "AuthToken",
    "KeyValuePair",
    "Location",
    "ParamType",
    "PropertyType",
    "SetupOption",
    "TrackNamespace",
    "check_properties",
    "decode_kvps",
    "decode_reason_phrase",
    "decode_track_name",
    "encode_kvps",
    "encode_reason_phrase",
    "encode_track_name",
    "find_kvp",
    "property_int",
    "render_full_track_name",
]

MAX_NAMESPACE_FIELDS = 32
MAX_FULL_TRACK_NAME = 4096
MAX_KVP_LENGTH = 65535
MAX_REASON_PHRASE = 1024


# ---------------------------------------------------------------------------------------------------
# Location (profile §3.1)


@dataclass(frozen=True, order=True)
class Location:
    """``Location { Group (vi64), Object (vi64) }``; dataclass ordering = the profile's (group, object)."""

    group: int
    object: int

    def encode(self) -> bytes:
        return encode_vi64(self.group) + encode_vi64(self.object)

    @classmethod
    def decode(cls, r: Reader, field: str = "Location") -> Location:
        return cls(r.vi64(field + ".Group"), r.vi64(field + ".Object"))

    def __str__(self) -> str:
        return f"{{{self.group},{self.object}}}"


# ---------------------------------------------------------------------------------------------------
# Track Namespace and Track Name (profile §3.4)


def _render_bytes(b: bytes) -> str:
    out = []
    for ch in b:
        c = chr(ch)
        out.append(c if (c.isascii() and (c.isalnum() or c == "_")) else f".{ch:02x}")
    return "".join(out)


@dataclass(frozen=True)
class TrackNamespace:
    """``Track Namespace { Number of Fields (vi64), { Length (vi64), Value } x N }`` (profile §3.4)."""

    fields: tuple[bytes, ...] = ()

    @classmethod
    def of(cls, *fields: bytes | str) -> TrackNamespace:
        return cls(tuple(f.encode() if isinstance(f, str) else bytes(f) for f in fields))

    def __len__(self) -> int:
        return len(self.fields)

    def __iter__(self) -> Iterator[bytes]:
        return iter(self.fields)

    def byte_length(self) -> int:
        """Sum of the field lengths (the namespace's share of the 4 096-byte Full Track Name limit)."""
        return sum(len(f) for f in self.fields)

    def is_prefix_of(self, other: TrackNamespace) -> bool:
        """Field-wise exact prefix (profile §12): (foo) and (foo,bar) match (foo,bar); (foobar) does not."""
        return len(self.fields) <= len(other.fields) and other.fields[: len(self.fields)] == self.fields

    def overlaps(self, other: TrackNamespace) -> bool:
        """PREFIX_OVERLAP reading of profile §13 #13: equal, or one a field-wise prefix of the other."""
        return self.is_prefix_of(other) or other.is_prefix_of(self)

    def suffix_after(self, prefix: TrackNamespace) -> TrackNamespace:
        if not prefix.is_prefix_of(self):
            raise ValueError(f"{prefix} is not a prefix of {self}")
        return TrackNamespace(self.fields[len(prefix.fields) :])

    def __add__(self, other: TrackNamespace) -> TrackNamespace:
        return TrackNamespace(self.fields + other.fields)

    def encode(self, *, allow_empty: bool = True) -> bytes:
        if len(self.fields) > MAX_NAMESPACE_FIELDS:
            raise MoqtEncodeError(f"Track Namespace has {len(self.fields)} fields, max {MAX_NAMESPACE_FIELDS}")
        if not allow_empty and not self.fields:
            raise MoqtEncodeError("Track Namespace naming a track or publication needs >= 1 field")
        out = bytearray(encode_vi64(len(self.fields)))
        for i, f in enumerate(self.fields):
            if not f:
                raise MoqtEncodeError(f"Track Namespace field {i} is empty (every field is >= 1 byte)")
            out += encode_vi64(len(f)) + f
        return bytes(out)

    @classmethod
    def decode(cls, r: Reader, field: str = "Track Namespace", *, allow_empty: bool = True) -> TrackNamespace:
        start = r.pos
        n = r.vi64(field + ".Number of Fields")
        if n > MAX_NAMESPACE_FIELDS:
            raise r.error(field + ".Number of Fields", f"{n} fields, max {MAX_NAMESPACE_FIELDS}", start)
        if n == 0 and not allow_empty:
            raise r.error(field + ".Number of Fields", "0 fields where a track or publication is named", start)
        fields = []
        for i in range(n):
            at = r.pos
            length = r.vi64(f"{field}.Field[{i}].Length")
            if length == 0:
                raise r.error(f"{field}.Field[{i}].Length", "zero-length namespace field", at)
            fields.append(r.take(length, f"{field}.Field[{i}].Value"))
        return cls(tuple(fields))

    def __str__(self) -> str:
        return "-".join(_render_bytes(f) for f in self.fields)


def encode_track_name(name: bytes) -> bytes:
    """``Track Name { Length (vi64), Name (..) }``; may be empty."""
    return encode_vi64(len(name)) + name


def decode_track_name(r: Reader, field: str = "Track Name") -> bytes:
    length = r.vi64(field + " Length")
    return r.take(length, field)


def check_full_track_name(r: Reader, ns: TrackNamespace, name: bytes, offset: int) -> None:
    """Full Track Name (namespace field bytes + name) <= 4 096 bytes, else PROTOCOL_VIOLATION."""
    total = ns.byte_length() + len(name)
    if total > MAX_FULL_TRACK_NAME:
        raise r.error("Full Track Name", f"{total} bytes, max {MAX_FULL_TRACK_NAME}", offset)


def render_full_track_name(ns: TrackNamespace, name: bytes) -> str:
    """Log rendering of profile §3.4: fields joined by '-', '--' before the name, escapes as .hh."""
    return f"{ns}--{_render_bytes(name)}"


# ---------------------------------------------------------------------------------------------------
# Reason Phrase (profile §3.5)


def encode_reason_phrase(reason: bytes | str) -> bytes:
    data = reason.encode() if isinstance(reason, str) else reason
    if len(data) > MAX_REASON_PHRASE:
        raise MoqtEncodeError(f"Reason Phrase is {len(data)} bytes, max {MAX_REASON_PHRASE}")
    return encode_vi64(len(data)) + data


def decode_reason_phrase(r: Reader, field: str = "Reason Phrase") -> bytes:
    """The raw phrase bytes (UTF-8 by the text; kept as bytes so a bad peer cannot crash logging)."""
    at = r.pos
    length = r.vi64(field + ".Length")
    if length > MAX_REASON_PHRASE:
        raise r.error(field + ".Length", f"{length} bytes, max {MAX_REASON_PHRASE}", at)
    return r.take(length, field + ".Value")


# ---------------------------------------------------------------------------------------------------
# Key-Value-Pairs: Setup Options and Properties (profile §3.2, §5, §8)


class SetupOption(IntEnum):
    """Setup Option types (profile §5)."""

    PATH = 0x01
    AUTHORIZATION_TOKEN = 0x03
    MAX_AUTH_TOKEN_CACHE_SIZE = 0x04
    AUTHORITY = 0x05
    MAX_FILTER_RANGES = 0x06
    MOQT_IMPLEMENTATION = 0x07
    MAX_REQUEST_UPDATES = 0x08


class PropertyType(IntEnum):
    """Track and Object Property types (profile §8)."""

    OBJECT_DELIVERY_TIMEOUT = 0x02
    MAX_CACHE_DURATION = 0x04
    SUBGROUP_DELIVERY_TIMEOUT = 0x06
    IMMUTABLE_PROPERTIES = 0x0B
    DEFAULT_PUBLISHER_PRIORITY = 0x0E
    DEFAULT_PUBLISHER_GROUP_ORDER = 0x22
    DYNAMIC_GROUPS = 0x30
    PRIOR_GROUP_ID_GAP = 0x3C
    PRIOR_OBJECT_ID_GAP = 0x3E


def is_mandatory_track_property(ptype: int) -> bool:
    """0x4000-0x7FFF: a receiver that does not understand one must not process the track (profile §8)."""
    return 0x4000 <= ptype <= 0x7FFF


@dataclass(frozen=True)
class KeyValuePair:
    """``{ Delta Type (vi64), [Length (vi64)], Value }``: even Type -> one vi64, odd -> bytes (§3.2)."""

    type: int
    value: int | bytes

    def check(self) -> None:
        if self.type % 2 == 0:
            if not isinstance(self.value, int):
                raise MoqtEncodeError(f"KVP type 0x{self.type:x} is even: value must be an integer")
        else:
            if not isinstance(self.value, bytes):
                raise MoqtEncodeError(f"KVP type 0x{self.type:x} is odd: value must be bytes")
            if len(self.value) > MAX_KVP_LENGTH:
                raise MoqtEncodeError(f"KVP type 0x{self.type:x} value is {len(self.value)} bytes, max 65535")


def encode_kvps(pairs: Iterable[KeyValuePair]) -> bytes:
    """Delta-coded KVPs in the given order; the checked path requires ascending Types (§3.2)."""
    out = bytearray()
    prev = 0
    for kv in pairs:
        kv.check()
        if kv.type < prev:
            raise MoqtEncodeError(f"KVP type 0x{kv.type:x} after 0x{prev:x}: pairs must ascend by Type")
        out += encode_vi64(kv.type - prev)
        prev = kv.type
        if isinstance(kv.value, int):
            out += encode_vi64(kv.value)
        else:
            out += encode_vi64(len(kv.value)) + kv.value
    return bytes(out)


def decode_kvps(r: Reader, field: str = "Key-Value-Pairs") -> tuple[KeyValuePair, ...]:
    """KVPs up to the reader's end (message end, Properties Length or an odd Length bound)."""
    pairs = []
    prev = 0
    i = 0
    while not r.at_end():
        at = r.pos
        delta = r.vi64(f"{field}[{i}].Delta Type")
        ktype = prev + delta
        if ktype > MAX_VI64:
            raise r.error(f"{field}[{i}].Delta Type", f"Type {prev}+{delta} exceeds 2^64-1", at)
        if ktype % 2 == 0:
            pairs.append(KeyValuePair(ktype, r.vi64(f"{field}[{i}](0x{ktype:x}).Value")))
        else:
            lat = r.pos
            length = r.vi64(f"{field}[{i}](0x{ktype:x}).Length")
            if length > MAX_KVP_LENGTH:
                raise r.error(f"{field}[{i}](0x{ktype:x}).Length", f"{length} > 65535", lat)
            pairs.append(KeyValuePair(ktype, r.take(length, f"{field}[{i}](0x{ktype:x}).Value")))
        prev = ktype
        i += 1
    return tuple(pairs)


def find_kvp(pairs: Iterable[KeyValuePair], ktype: int) -> list[int | bytes]:
    """Every value of ``ktype`` in ``pairs`` (in order)."""
    return [kv.value for kv in pairs if kv.type == ktype]


def property_int(pairs: Iterable[KeyValuePair], ptype: int, default: int | None = None) -> int | None:
    """The integer value of property ``ptype`` (first instance), looking inside IMMUTABLE_PROPERTIES too."""
    for kv in pairs:
        if kv.type == ptype and isinstance(kv.value, int):
            return kv.value
    for kv in pairs:
        if kv.type == PropertyType.IMMUTABLE_PROPERTIES and isinstance(kv.value, bytes):
            for inner in decode_kvps(Reader(kv.value), "IMMUTABLE_PROPERTIES"):
                if inner.type == ptype and isinstance(inner.value, int):
                    return inner.value
    return default


def check_properties(r: Reader, pairs: Iterable[KeyValuePair], field: str, offset: int) -> None:
    """Known property values against their definitions (profile §8): a bad one closes the session with
    KEY_VALUE_FORMATTING_ERROR, an invalid DEFAULT_PUBLISHER_GROUP_ORDER with PROTOCOL_VIOLATION."""
    for kv in pairs:
        if kv.type == PropertyType.IMMUTABLE_PROPERTIES:
            assert isinstance(kv.value, bytes)
            inner = Reader(kv.value, final=True, code=SessionError.KEY_VALUE_FORMATTING_ERROR)
            try:
                nested = decode_kvps(inner, "IMMUTABLE_PROPERTIES")
            except MoqtDecodeError as exc:
                raise r.error(field, f"IMMUTABLE_PROPERTIES does not parse: {exc.message}", offset,
                              SessionError.KEY_VALUE_FORMATTING_ERROR) from exc
            if any(n.type == PropertyType.IMMUTABLE_PROPERTIES for n in nested):
                raise r.error(field, "IMMUTABLE_PROPERTIES nested in itself", offset,
                              SessionError.KEY_VALUE_FORMATTING_ERROR)
            check_properties(r, nested, field, offset)
        elif kv.type == PropertyType.DEFAULT_PUBLISHER_PRIORITY and isinstance(kv.value, int) and kv.value > 255:
            raise r.error(field, f"DEFAULT_PUBLISHER_PRIORITY {kv.value} > 255", offset,
                          SessionError.KEY_VALUE_FORMATTING_ERROR)
        elif kv.type == PropertyType.DEFAULT_PUBLISHER_GROUP_ORDER and kv.value not in (1, 2):
            raise r.error(field, f"DEFAULT_PUBLISHER_GROUP_ORDER {kv.value!r} is not 1 or 2", offset)
        elif kv.type == PropertyType.DYNAMIC_GROUPS and kv.value not in (0, 1):
            raise r.error(field, f"DYNAMIC_GROUPS {kv.value!r} is not 0 or 1", offset,
                          SessionError.KEY_VALUE_FORMATTING_ERROR)


# ---------------------------------------------------------------------------------------------------
# Authorization Token (profile §3.6)


class AuthAliasType(IntEnum):
    DELETE = 0x0
    REGISTER = 0x1
    USE_ALIAS = 0x2
    USE_VALUE = 0x3


@dataclass(frozen=True)
class AuthToken:
    """``Token { Alias Type, [Token Alias], [Token Type], [Token Value] }``; Value runs to the end.

    A harness sends USE_VALUE (``03 00 <token>`` for Token Type 0), profile §3.6.
    """

    alias_type: int = AuthAliasType.USE_VALUE
    token_type: int | None = 0
    value: bytes = b""
    alias: int | None = None

    @classmethod
    def use_value(cls, value: bytes, token_type: int = 0) -> AuthToken:
        return cls(AuthAliasType.USE_VALUE, token_type, value)

    def encode(self) -> bytes:
        out = bytearray(encode_vi64(self.alias_type))
        has_alias = self.alias_type in (AuthAliasType.DELETE, AuthAliasType.REGISTER, AuthAliasType.USE_ALIAS)
        has_value = self.alias_type in (AuthAliasType.REGISTER, AuthAliasType.USE_VALUE)
        if self.alias_type not in tuple(AuthAliasType):
            raise MoqtEncodeError(f"Token Alias Type {self.alias_type} is not 0..3")
        if has_alias:
            if self.alias is None:
                raise MoqtEncodeError(f"Token Alias Type {AuthAliasType(self.alias_type).name} needs an alias")
            out += encode_vi64(self.alias)
        if has_value:
            if self.token_type is None:
                raise MoqtEncodeError(f"Token Alias Type {AuthAliasType(self.alias_type).name} needs a type")
            out += encode_vi64(self.token_type) + self.value
        return bytes(out)

    @classmethod
    def decode(cls, r: Reader, field: str = "Token") -> AuthToken:
        """Reads the whole of ``r`` (the enclosing length); undecodable -> KEY_VALUE_FORMATTING_ERROR."""
        kv = Reader(r.buf, r.pos, r.end, final=True, code=SessionError.KEY_VALUE_FORMATTING_ERROR, context=r.context)
        at = kv.pos
        alias_type = kv.vi64(field + ".Alias Type")
        alias: int | None = None
        token_type: int | None = None
        value = b""
        if alias_type > AuthAliasType.USE_VALUE:
            raise kv.error(field + ".Alias Type", f"{alias_type} is not 0..3", at)
        if alias_type in (AuthAliasType.DELETE, AuthAliasType.REGISTER, AuthAliasType.USE_ALIAS):
            alias = kv.vi64(field + ".Token Alias")
        if alias_type in (AuthAliasType.REGISTER, AuthAliasType.USE_VALUE):
            token_type = kv.vi64(field + ".Token Type")
            value = kv.rest()
        elif not kv.at_end():
            raise kv.error(field, f"{kv.remaining()} byte(s) after a {AuthAliasType(alias_type).name} token")
        r.pos = kv.pos
        return cls(alias_type, token_type, value, alias)


# ---------------------------------------------------------------------------------------------------
# Message Parameters (profile §3.3, §7.1) -- NOT KVPs: a count, Type Deltas and per-type encodings


class ParamType(IntEnum):
    """Message Parameter types (profile §7.1); a number space separate from Properties."""

    OBJECT_DELIVERY_TIMEOUT = 0x02
    AUTHORIZATION_TOKEN = 0x03
    RENDEZVOUS_TIMEOUT = 0x04
    SUBGROUP_DELIVERY_TIMEOUT = 0x06
    EXPIRES = 0x08
    LARGEST_OBJECT = 0x09
    FILL_TIMEOUT = 0x0A
    FORWARD = 0x10
    SUBSCRIBER_PRIORITY = 0x20
    LOCATION_FILTER = 0x21
    GROUP_ORDER = 0x22
    FILL_PARAMETERS = 0x23
    SUBGROUP_FILTER = 0x25
    OBJECTID_FILTER = 0x26
    PRIORITY_FILTER = 0x27
    OBJECT_PROPERTY_FILTER = 0x28
    TRACK_PROPERTY_FILTER = 0x29
    NEW_GROUP_REQUEST = 0x32
    TRACK_NAMESPACE_PREFIX = 0x34
    INCLUDE_PROPERTIES = 0x35
