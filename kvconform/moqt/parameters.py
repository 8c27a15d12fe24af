"""MOQT d22 Message Parameters (profile §3.3, §7.1, §7.2) -- NOT KVPs: a count, Type Deltas and per-type
encodings -- and FILL_PARAMETERS (§7.4), the parameter whose value is itself a block of parameters.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Union

from kvconform.moqt.errors import MoqtEncodeError
from kvconform.moqt.filters import LocationFilter, RangeFilter
from kvconform.moqt.structures import AuthToken, Location, ParamType, TrackNamespace
from kvconform.moqt.vi64 import MAX_VI64, Reader, encode_vi64

__all__ = [
    "FILL_INNER_PARAMS",
    "RANGE_FILTER_PARAMS",
    "REPEATABLE_PARAMS",
    "UINT8_PARAMS",
    "VARINT_PARAMS",
    "FillParameters",
    "ParamValue",
    "Parameter",
    "Parameters",
    "params_from",
]

UINT8_PARAMS = frozenset({ParamType.FORWARD, ParamType.SUBSCRIBER_PRIORITY, ParamType.GROUP_ORDER,
                          ParamType.INCLUDE_PROPERTIES})
VARINT_PARAMS = frozenset({ParamType.OBJECT_DELIVERY_TIMEOUT, ParamType.RENDEZVOUS_TIMEOUT,
                           ParamType.SUBGROUP_DELIVERY_TIMEOUT, ParamType.EXPIRES, ParamType.FILL_TIMEOUT,
                           ParamType.NEW_GROUP_REQUEST})
RANGE_FILTER_PARAMS = frozenset({ParamType.SUBGROUP_FILTER, ParamType.OBJECTID_FILTER, ParamType.PRIORITY_FILTER,
                                 ParamType.OBJECT_PROPERTY_FILTER, ParamType.TRACK_PROPERTY_FILTER})
# Repeatable in one block (profile §7.2); a second instance is written with Type Delta 0.
REPEATABLE_PARAMS = frozenset({ParamType.AUTHORIZATION_TOKEN}) | RANGE_FILTER_PARAMS
# uint8 parameters whose value set is closed (profile §7.1: other value -> PROTOCOL_VIOLATION).
_UINT8_ALLOWED: dict[int, frozenset[int]] = {
    ParamType.FORWARD: frozenset({0, 1}),
    ParamType.GROUP_ORDER: frozenset({1, 2}),
    ParamType.INCLUDE_PROPERTIES: frozenset({0, 1}),
}

# A value of type bytes is written verbatim as the parameter's value encoding (raw path, unknown types).
ParamValue = Union[int, Location, AuthToken, TrackNamespace, LocationFilter, "FillParameters", RangeFilter, bytes]


@dataclass(frozen=True)
class Parameter:
    """One Message Parameter: its absolute Type and its decoded value (or raw value bytes)."""

    type: int
    value: ParamValue

    def encode_value(self) -> bytes:
        """The value in the type's fixed encoding (profile §7.1); bytes are written verbatim."""

        v = self.value
        t = self.type
        if isinstance(v, bytes):
            return v
        if t in UINT8_PARAMS:
            if not isinstance(v, int) or not 0 <= v <= 255:
                raise MoqtEncodeError(f"parameter 0x{t:x} is uint8: value {v!r} not in 0..255")
            if t in _UINT8_ALLOWED and v not in _UINT8_ALLOWED[t]:
                raise MoqtEncodeError(f"parameter 0x{t:x} value {v} not in {sorted(_UINT8_ALLOWED[t])}")
            return bytes([v])
        if t in VARINT_PARAMS:
            if not isinstance(v, int):
                raise MoqtEncodeError(f"parameter 0x{t:x} is a varint: value {v!r}")
            return encode_vi64(v)
        expected: type
        if t == ParamType.LARGEST_OBJECT:
            expected = Location
        elif t == ParamType.AUTHORIZATION_TOKEN:
            expected = AuthToken
        elif t == ParamType.LOCATION_FILTER:
            expected = LocationFilter
        elif t == ParamType.FILL_PARAMETERS:
            expected = FillParameters
        elif t in RANGE_FILTER_PARAMS:
            expected = RangeFilter
        elif t == ParamType.TRACK_NAMESPACE_PREFIX:
            expected = TrackNamespace
        else:
            raise MoqtEncodeError(f"parameter type 0x{t:x} is unknown: give its value as raw bytes")
        if not isinstance(v, expected):
            raise MoqtEncodeError(f"parameter 0x{t:x} value must be {expected.__name__}, got {type(v).__name__}")
        if isinstance(v, AuthToken):
            tok = v.encode()
            return encode_vi64(len(tok)) + tok
        if isinstance(v, RangeFilter) and v.param_type != t:
            raise MoqtEncodeError(f"RangeFilter for 0x{v.param_type:x} placed in parameter 0x{t:x}")
        assert isinstance(v, Location | TrackNamespace | LocationFilter | FillParameters | RangeFilter)
        return v.encode()

    @classmethod
    def decode_value(cls, r: Reader, ptype: int, field: str) -> Parameter:
        at = r.pos
        if ptype in UINT8_PARAMS:
            v = r.u8(field)
            allowed = _UINT8_ALLOWED.get(ptype)
            if allowed is not None and v not in allowed:
                raise r.error(field, f"value {v} not in {sorted(allowed)}", at)
            return cls(ptype, v)
        if ptype in VARINT_PARAMS:
            return cls(ptype, r.vi64(field))
        if ptype == ParamType.LARGEST_OBJECT:
            return cls(ptype, Location.decode(r, field))
        if ptype == ParamType.AUTHORIZATION_TOKEN:
            length = r.vi64(field + ".Length")
            return cls(ptype, AuthToken.decode(r.sub(length, field + ".Token"), field + ".Token"))
        if ptype == ParamType.LOCATION_FILTER:
            return cls(ptype, LocationFilter.decode(r, field))
        if ptype == ParamType.FILL_PARAMETERS:
            return cls(ptype, FillParameters.decode(r, field))
        if ptype in RANGE_FILTER_PARAMS:
            return cls(ptype, RangeFilter.decode(r, ptype, field))
        if ptype == ParamType.TRACK_NAMESPACE_PREFIX:
            return cls(ptype, TrackNamespace.decode(r, field))
        raise r.error(field, f"unknown parameter type 0x{ptype:x} cannot be skipped", at)


def _name_of(ptype: int) -> str:
    try:
        return ParamType(ptype).name
    except ValueError:
        return f"0x{ptype:x}"


@dataclass(frozen=True)
class Parameters:
    """``Number of Parameters (vi64), { Type Delta (vi64), Value } x N`` (profile §3.3).

    The checked encoder writes parameters in ascending Type order (stable for repeats); ``items`` keeps
    the decoded order.
    """

    items: tuple[Parameter, ...] = field(default=())

    @classmethod
    def of(cls, *params: Parameter | tuple[int, ParamValue]) -> Parameters:
        return cls(tuple(p if isinstance(p, Parameter) else Parameter(p[0], p[1]) for p in params))

    def __iter__(self) -> Iterator[Parameter]:
        return iter(self.items)

    def __len__(self) -> int:
        return len(self.items)

    def __contains__(self, ptype: object) -> bool:
        return any(p.type == ptype for p in self.items)

    def get(self, ptype: int, default: ParamValue | None = None) -> ParamValue | None:
        """The first value of ``ptype`` or ``default``."""
        for p in self.items:
            if p.type == ptype:
                return p.value
        return default

    def all(self, ptype: int) -> list[ParamValue]:
        return [p.value for p in self.items if p.type == ptype]

    def types(self) -> list[int]:
        return [p.type for p in self.items]

    def with_param(self, ptype: int, value: ParamValue) -> Parameters:
        """A copy with ``ptype`` set to ``value`` (replacing earlier instances)."""
        return Parameters((*(p for p in self.items if p.type != ptype), Parameter(ptype, value)))

    def encode(self, *, allowed: frozenset[int] | None = None, where: str = "") -> bytes:
        """Checked: known types, no unexpected duplicates, types in ``allowed`` when given."""
        ordered = sorted(self.items, key=lambda p: p.type)
        seen: set[int] = set()
        out = bytearray(encode_vi64(len(ordered)))
        prev = 0
        for p in ordered:
            if allowed is not None and p.type not in allowed:
                raise MoqtEncodeError(f"parameter {_name_of(p.type)} is not allowed in {where or 'this message'}")
            if p.type in seen and p.type not in REPEATABLE_PARAMS:
                raise MoqtEncodeError(f"parameter {_name_of(p.type)} is not repeatable")
            seen.add(p.type)
            out += encode_vi64(p.type - prev) + p.encode_value()
            prev = p.type
        return bytes(out)

    @classmethod
    def decode(
        cls, r: Reader, field: str = "Parameters", *, allowed: frozenset[int] | None = None, where: str = ""
    ) -> Parameters:
        """Count-bounded block; unknown type, disallowed type or non-repeatable duplicate -> PV."""
        count = r.vi64(field + ".Number of Parameters")
        items: list[Parameter] = []
        prev = 0
        for i in range(count):
            at = r.pos
            delta = r.vi64(f"{field}[{i}].Type Delta")
            ptype = prev + delta
            if ptype > MAX_VI64:
                raise r.error(f"{field}[{i}].Type Delta", f"Type {prev}+{delta} exceeds 2^64-1", at)
            name = f"{field}[{i}]({_name_of(ptype)})"
            if delta == 0 and i > 0 and ptype not in REPEATABLE_PARAMS:
                raise r.error(f"{field}[{i}].Type Delta", f"second {_name_of(ptype)}, which is not repeatable", at)
            if ptype not in ParamType._value2member_map_:
                raise r.error(f"{field}[{i}].Type Delta", f"unknown parameter type 0x{ptype:x} cannot be skipped", at)
            if allowed is not None and ptype not in allowed:
                raise r.error(f"{field}[{i}].Type Delta", f"{_name_of(ptype)} is not allowed in {where}", at)
            items.append(Parameter.decode_value(r, ptype, name))
            prev = ptype
        return cls(tuple(items))


def params_from(seq: Sequence[Parameter]) -> Parameters:
    return Parameters(tuple(seq))


# Inner parameters allowed inside FILL_PARAMETERS (d22 Table 7; profile §7.2, §13 #3).
FILL_INNER_PARAMS = frozenset({ParamType.FILL_TIMEOUT, ParamType.SUBSCRIBER_PRIORITY, ParamType.LOCATION_FILTER,
                               ParamType.GROUP_ORDER, ParamType.SUBGROUP_FILTER, ParamType.OBJECTID_FILTER,
                               ParamType.PRIORITY_FILTER, ParamType.OBJECT_PROPERTY_FILTER})


@dataclass(frozen=True)
class FillParameters:
    """``FILL_PARAMETERS value { Length (vi64), Number of Parameters (vi64), params }`` (§7.4).

    Empty = ``01 00``; a received bare ``00`` (Length 0) is read as empty too (§13 #16).
    """

    params: Parameters = field(default_factory=Parameters)

    @classmethod
    def of(cls, *params: Parameter | tuple[int, ParamValue]) -> FillParameters:
        return cls(Parameters.of(*params))

    def encode(self) -> bytes:
        inner = self.params.encode(allowed=FILL_INNER_PARAMS, where="FILL_PARAMETERS")
        return encode_vi64(len(inner)) + inner

    @classmethod
    def decode(cls, r: Reader, field: str = "FILL_PARAMETERS") -> FillParameters:
        length = r.vi64(field + ".Length")
        if length == 0:
            return cls()
        inner = r.sub(length, field + ".Value")
        params = Parameters.decode(inner, field, allowed=FILL_INNER_PARAMS, where="FILL_PARAMETERS")
        if not inner.at_end():
            raise inner.error(field, f"{inner.remaining()} byte(s) after the inner parameters inside Length {length}")
        return cls(params)
