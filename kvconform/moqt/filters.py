"""MOQT d22 filters: the typed LOCATION_FILTER (profile §7.3) and the Range Filters 0x25-0x29 incl.
OBJECTID_FILTER (§7.5), with their wire codecs and their evaluation rules (FILL_PARAMETERS, which holds
parameters, is with them in ``parameters``).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from enum import IntEnum

from kvconform.moqt.errors import MoqtEncodeError
from kvconform.moqt.structures import KeyValuePair, Location, ParamType
from kvconform.moqt.vi64 import MAX_VI64, Reader, encode_vi64

__all__ = [
    "LocationFilter",
    "LocationFilterType",
    "RangeFilter",
    "passes_range_filters",
]


class LocationFilterType(IntEnum):
    """d22 Location Filter Types (profile §7.3)."""

    NONE = 0x00
    RELATIVE_START = 0x01
    ABSOLUTE_START = 0x02
    ABSOLUTE_START_GROUP_END = 0x03
    ABSOLUTE_RANGE = 0x04
    NEXT_OBJECT = 0x05


_FIELDS = {
    LocationFilterType.NONE: 0,
    LocationFilterType.RELATIVE_START: 1,
    LocationFilterType.ABSOLUTE_START: 2,
    LocationFilterType.ABSOLUTE_START_GROUP_END: 3,
    LocationFilterType.ABSOLUTE_RANGE: 4,
    LocationFilterType.NEXT_OBJECT: 0,
}


@dataclass(frozen=True)
class LocationFilter:
    """``{ Location Filter Type (vi64), [StartGroup], [StartObject], [EndGroupDelta], [EndObject] }``.

    No Length (d22).  Fields the type does not carry are 0.  For Relative Start ``start_group`` holds
    the StartGroup count (0 = next group, 1 = current group).
    """

    type: int = LocationFilterType.NONE
    start_group: int = 0
    start_object: int = 0
    end_group_delta: int = 0
    end_object: int = 0

    @classmethod
    def none(cls) -> LocationFilter:
        return cls(LocationFilterType.NONE)

    @classmethod
    def relative_start(cls, groups_back: int) -> LocationFilter:
        return cls(LocationFilterType.RELATIVE_START, groups_back)

    @classmethod
    def absolute_start(cls, group: int, obj: int) -> LocationFilter:
        return cls(LocationFilterType.ABSOLUTE_START, group, obj)

    @classmethod
    def absolute_start_group_end(cls, group: int, obj: int, end_group_delta: int) -> LocationFilter:
        return cls(LocationFilterType.ABSOLUTE_START_GROUP_END, group, obj, end_group_delta)

    @classmethod
    def absolute_range(cls, group: int, obj: int, end_group_delta: int, end_object: int) -> LocationFilter:
        return cls(LocationFilterType.ABSOLUTE_RANGE, group, obj, end_group_delta, end_object)

    @classmethod
    def next_object(cls) -> LocationFilter:
        return cls(LocationFilterType.NEXT_OBJECT)

    def field_values(self) -> list[int]:
        n = _FIELDS[LocationFilterType(self.type)]
        return [self.start_group, self.start_object, self.end_group_delta, self.end_object][:n]

    def encode(self) -> bytes:
        if self.type not in _FIELDS:
            raise MoqtEncodeError(f"LOCATION_FILTER type {self.type} is not 0..5 (profile §7.3)")
        if self.start_group + self.end_group_delta > MAX_VI64:
            raise MoqtEncodeError("LOCATION_FILTER StartGroup + EndGroupDelta exceeds 2^64-1")
        return b"".join(encode_vi64(v) for v in [self.type, *self.field_values()])

    @classmethod
    def decode(cls, r: Reader, field: str = "LOCATION_FILTER") -> LocationFilter:
        at = r.pos
        ftype = r.vi64(field + ".Location Filter Type")
        if ftype not in _FIELDS:
            raise r.error(field + ".Location Filter Type", f"type {ftype} is not 0..5", at)
        names = ["StartGroup", "StartObject", "EndGroupDelta", "EndObject"]
        vals = [0, 0, 0, 0]
        for i in range(_FIELDS[LocationFilterType(ftype)]):
            vals[i] = r.vi64(f"{field}.{names[i]}")
        if vals[0] + vals[2] > MAX_VI64:
            raise r.error(field + ".EndGroupDelta", "StartGroup + EndGroupDelta exceeds 2^64-1", at)
        return cls(ftype, *vals)

    # -- evaluation (profile §7.3 table) -----------------------------------------------------------

    def start(self, largest: Location | None) -> Location:
        """Start Location given the Largest Object at processing time (None = nothing published)."""
        t = self.type
        if t == LocationFilterType.NONE:
            return Location(0, 0)
        if t == LocationFilterType.RELATIVE_START:
            if largest is None:
                return Location(0, 0)
            return Location(min(MAX_VI64, max(0, largest.group + 1 - self.start_group)), 0)
        if t == LocationFilterType.NEXT_OBJECT:
            return Location(0, 0) if largest is None else Location(largest.group, largest.object + 1)
        return Location(self.start_group, self.start_object)

    def end(self) -> Location | None:
        """Inclusive subscription end; None = open.  A whole-group end has Object 2^64-1."""
        if self.type == LocationFilterType.ABSOLUTE_START_GROUP_END:
            return Location(self.start_group + self.end_group_delta, MAX_VI64)
        if self.type == LocationFilterType.ABSOLUTE_RANGE:
            return Location(self.start_group + self.end_group_delta, self.end_object)
        return None

    def fetch_range(self, largest: Location | None) -> tuple[Location, Location] | None:
        """(start, inclusive end) evaluated as a FETCH / fill range, clamped to Largest; None = empty."""
        if largest is None:
            return None
        start = self.start(largest)
        end = self.end()
        last = largest if end is None else min(end, largest)
        if start > last:
            return None
        return start, last

    def contains(self, loc: Location, largest_at_start: Location | None) -> bool:
        """Whether a subscription with this filter passes ``loc`` (start computed once, at processing)."""
        end = self.end()
        return self.start(largest_at_start) <= loc and (end is None or loc <= end)


_PROPERTY_FILTERS = (ParamType.OBJECT_PROPERTY_FILTER, ParamType.TRACK_PROPERTY_FILTER)


@dataclass(frozen=True)
class RangeFilter:
    """``{ Length (vi64), SetID (8), [Property Type (vi64)], { Start (vi64), [End (vi64)] } ... }``.

    ``ranges`` holds absolute inclusive (start, end) pairs, end None = open (last range only).  On the
    wire each Start is a delta from the previous End and each End a delta from its Start (§7.5).
    ``set_id`` None = Length 0 (REQUEST_UPDATE: remove this filter type).
    """

    param_type: int
    set_id: int | None = 0
    ranges: tuple[tuple[int, int | None], ...] = ()
    property_type: int | None = None

    @classmethod
    def first_objects(cls, n: int, set_id: int = 0) -> RangeFilter:
        """KVCS "first n blocks": OBJECTID_FILTER range 0..n-1 (value ``03 00 00 <n-1>`` for n <= 128)."""
        return cls(ParamType.OBJECTID_FILTER, set_id, ((0, n - 1),))

    @classmethod
    def removal(cls, param_type: int) -> RangeFilter:
        return cls(param_type, None)

    def encode(self) -> bytes:
        if self.set_id is None:
            return encode_vi64(0)
        if not 0 <= self.set_id <= 255:
            raise MoqtEncodeError(f"Range Filter SetID {self.set_id} is not a uint8")
        body = bytearray([self.set_id])
        if self.param_type in _PROPERTY_FILTERS:
            if self.property_type is None:
                raise MoqtEncodeError(f"filter 0x{self.param_type:x} needs a Property Type")
            body += encode_vi64(self.property_type)
        prev_end = 0
        for i, (start, end) in enumerate(self.ranges):
            if start < prev_end:
                raise MoqtEncodeError(f"Range {i} starts at {start}, before the previous End {prev_end}")
            body += encode_vi64(start - prev_end)
            if end is None:
                if i != len(self.ranges) - 1:
                    raise MoqtEncodeError(f"Range {i} is open but only the last End may be omitted")
            else:
                if end < start:
                    raise MoqtEncodeError(f"Range {i} ends at {end} before its start {start}")
                body += encode_vi64(end - start)
                prev_end = end
        return encode_vi64(len(body)) + bytes(body)

    @classmethod
    def decode(cls, r: Reader, param_type: int, field: str = "Range Filter") -> RangeFilter:
        """Wire decoding only; INVALID_FILTER conditions are reported by ``problem()`` (a request error)."""
        length = r.vi64(field + ".Length")
        if length == 0:
            return cls(param_type, None)
        inner = r.sub(length, field + ".Value")
        set_id = inner.u8(field + ".SetID")
        prop: int | None = None
        if param_type in _PROPERTY_FILTERS:
            prop = inner.vi64(field + ".Property Type")
        ranges: list[tuple[int, int | None]] = []
        prev_end = 0
        i = 0
        while not inner.at_end():
            start = prev_end + inner.vi64(f"{field}.Range[{i}].Start")
            end: int | None = None
            if not inner.at_end():
                end = start + inner.vi64(f"{field}.Range[{i}].End")
                prev_end = end
            ranges.append((start, end))
            i += 1
        return cls(param_type, set_id, tuple(ranges), prop)

    def problem(self) -> str | None:
        """Why this filter is INVALID_FILTER (0x36) per profile §7.5, or None."""
        for i, (start, end) in enumerate(self.ranges):
            top = start if end is None else end
            if top > MAX_VI64:
                return f"Range {i} overflows 2^64-1"
            if self.param_type == ParamType.PRIORITY_FILTER and top > 255:
                return f"PRIORITY_FILTER Range {i} exceeds 255"
        if self.property_type is not None and self.property_type % 2 == 1:
            return f"Property Type 0x{self.property_type:x} is odd"
        return None

    def matches(self, value: int | None) -> bool:
        """Whether ``value`` lies in one of the ranges (None, e.g. an absent property, never matches)."""
        if value is None:
            return False
        return any(start <= value and (end is None or value <= end) for start, end in self.ranges)


def _property_value(props: Iterable[KeyValuePair], ptype: int | None) -> int | None:
    for kv in props:
        if kv.type == ptype and isinstance(kv.value, int):
            return kv.value
    return None


def passes_range_filters(
    filters: Iterable[RangeFilter],
    *,
    subgroup_id: int,
    object_id: int,
    priority: int,
    object_properties: Iterable[KeyValuePair] = (),
    track_properties: Iterable[KeyValuePair] = (),
) -> bool:
    """Filters with the same SetID are ANDed, sets ORed; no filters = pass (profile §7.5)."""
    sets: dict[int, list[RangeFilter]] = {}
    for f in filters:
        if f.set_id is not None:
            sets.setdefault(f.set_id, []).append(f)
    if not sets:
        return True
    obj_props = list(object_properties)
    trk_props = list(track_properties)
    values: Mapping[int, int | None] = {
        ParamType.SUBGROUP_FILTER: subgroup_id,
        ParamType.OBJECTID_FILTER: object_id,
        ParamType.PRIORITY_FILTER: priority,
    }

    def ok(f: RangeFilter) -> bool:
        if f.param_type == ParamType.OBJECT_PROPERTY_FILTER:
            return f.matches(_property_value(obj_props, f.property_type))
        if f.param_type == ParamType.TRACK_PROPERTY_FILTER:
            return f.matches(_property_value(trk_props, f.property_type))
        return f.matches(values.get(f.param_type))

    return any(all(ok(f) for f in group) for group in sets.values())
