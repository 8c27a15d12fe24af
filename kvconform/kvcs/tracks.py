"""KVCS Track Names (the text's ABNF): "manifest", "manifest.cose", or component.codec.sN."""

from __future__ import annotations

import re
from dataclasses import dataclass

from kvconform.kvcs.errors import KvcsError

__all__ = ["COMPONENTS", "COMPONENT_NAMES", "MANIFEST", "MANIFEST_COSE", "REQ_TRACK_NAME", "DataTrack",
           "parse_track_name"]

MANIFEST = b"manifest"
MANIFEST_COSE = b"manifest.cose"
REQ_TRACK_NAME = "KVCS-TRACK-NAME-ABNF"
COMPONENTS: dict[str, int] = {"k": 1, "v": 2, "kv": 3}
COMPONENT_NAMES: dict[int, str] = {v: k for k, v in COMPONENTS.items()}

_DATA_TRACK = re.compile(rb"(?P<component>kv|k|v)\.(?P<codec>[a-z0-9-]{1,32})\.s(?P<segment>0|[1-9][0-9]*)")


@dataclass(frozen=True, order=True)
class DataTrack:
    """A data track: component ("k", "v", "kv"), codec name and segment number."""

    component: str
    codec: str
    segment: int

    def __post_init__(self) -> None:
        name = self.name
        if not _DATA_TRACK.fullmatch(name):
            raise KvcsError("Track Name", f"{name!r} does not match the data-track ABNF", requirement=REQ_TRACK_NAME)

    @property
    def name(self) -> bytes:
        return f"{self.component}.{self.codec}.s{self.segment}".encode("ascii")

    @property
    def component_value(self) -> int:
        """The Component field of this track's objects (1 k, 2 v, 3 kv)."""
        return COMPONENTS[self.component]

    def __str__(self) -> str:
        return self.name.decode("ascii")


def parse_track_name(name: bytes) -> bytes | DataTrack:
    """MANIFEST, MANIFEST_COSE or a DataTrack; KvcsError for a name outside the ABNF."""
    if name in (MANIFEST, MANIFEST_COSE):
        return name
    m = _DATA_TRACK.fullmatch(name)
    if m is None:
        raise KvcsError("Track Name", f"{name!r} is neither 'manifest', 'manifest.cose' nor "
                        "component.codec.s<segment> (no leading zeros, codec 1-32 of a-z 0-9 -)",
                        requirement=REQ_TRACK_NAME)
    return DataTrack(m["component"].decode(), m["codec"].decode(), int(m["segment"]))
