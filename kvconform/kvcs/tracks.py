"""KVCS Track Names (the text's ABNF): "manifest", "manifest.cose", or component.codec.sN."""

from __future__ import annotations

import re
from dataclasses import dataclass

from kvconform.kvcs.errors import KvcsError
from kvconform.moqt.structures import MAX_FULL_TRACK_NAME

__all__ = ["COMPONENTS", "COMPONENT_NAMES", "MANIFEST", "MANIFEST_COSE", "MAX_NAME", "REQ_TRACK_NAME", "DataTrack",
           "parse_track_name"]

MANIFEST = b"manifest"
MANIFEST_COSE = b"manifest.cose"
REQ_TRACK_NAME = "KVCS-TRACK-NAME-ABNF"
COMPONENTS: dict[str, int] = {"k": 1, "v": 2, "kv": 3}
COMPONENT_NAMES: dict[int, str] = {v: k for k, v in COMPONENTS.items()}

_DATA_TRACK = re.compile(rb"(?P<component>kv|k|v)\.(?P<codec>[a-z0-9-]{1,32})\.s(?P<segment>0|[1-9][0-9]*)")
# The ABNF bounds no segment number, MOQT bounds the name: a Full Track Name is at most 4096 octets, so a segment
# has at most about 4090 digits, below int()'s 4300 (checked on the length, before int() sees the digits).
MAX_NAME = MAX_FULL_TRACK_NAME
_MAX_SEGMENT_BITS = int(MAX_NAME * 3.33)  # 10^4096 < 2^(4096 * 3.33): str() of such a segment stays below 4300 digits
_CODEC = re.compile(r"[a-z0-9-]{1,32}")


@dataclass(frozen=True, order=True)
class DataTrack:
    """A data track: component ("k", "v", "kv"), codec name and segment number."""

    component: str
    codec: str
    segment: int

    def __post_init__(self) -> None:
        if type(self.segment) is not int or self.segment < 0 or self.segment.bit_length() > _MAX_SEGMENT_BITS:
            seen = repr(self.segment) if type(self.segment) is not int or self.segment.bit_length() < 64 else \
                f"an integer of {self.segment.bit_length()} bits"
            raise KvcsError("Track Name", f"segment {seen}, expected a decimal number >= 0 that fits a "
                            f"{MAX_NAME}-octet name", requirement=REQ_TRACK_NAME)
        if not (isinstance(self.component, str) and self.component in COMPONENTS and isinstance(self.codec, str)
                and _CODEC.fullmatch(self.codec)):
            raise KvcsError("Track Name", f"component {self.component!r}, codec {self.codec!r}: expected k, v or kv "
                            "and 1-32 of a-z 0-9 -", requirement=REQ_TRACK_NAME)
        if len(self.name) > MAX_NAME:
            raise KvcsError("Track Name", f"{len(self.name)} octets, longer than MOQT's {MAX_NAME}-octet Full Track "
                            "Name", requirement=REQ_TRACK_NAME)

    @property
    def name(self) -> bytes:
        return f"{self.component}.{self.codec}.s{self.segment}".encode("ascii")

    @property
    def component_value(self) -> int:
        """The Component field of this track's objects (1 k, 2 v, 3 kv)."""
        return COMPONENTS[self.component]

    def __str__(self) -> str:
        return self.name.decode("ascii")


def _show(name: bytes) -> str:
    return repr(name) if len(name) <= 60 else f"{name[:40]!r}... ({len(name)} octets)"


def parse_track_name(name: bytes) -> bytes | DataTrack:
    """MANIFEST, MANIFEST_COSE or a DataTrack; KvcsError for a name outside the ABNF."""
    if name in (MANIFEST, MANIFEST_COSE):
        return name
    if len(name) > MAX_NAME:  # before the pattern: its segment digits could pass int()'s 4300-digit limit
        raise KvcsError("Track Name", f"{_show(name)}: longer than MOQT's {MAX_NAME}-octet Full Track Name",
                        requirement=REQ_TRACK_NAME)
    m = _DATA_TRACK.fullmatch(name)
    if m is None:
        raise KvcsError("Track Name", f"{_show(name)} is neither 'manifest', 'manifest.cose' nor "
                        "component.codec.s<segment> (no leading zeros, codec 1-32 of a-z 0-9 -)",
                        requirement=REQ_TRACK_NAME)
    return DataTrack(m["component"].decode(), m["codec"].decode(), int(m["segment"]))
