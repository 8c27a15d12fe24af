"""KVCS publishers whose manifest is hostile JSON (issue 10): the kvcs-publisher harness must fail the manifest
requirement once per case, not crash (RecursionError, ValueError) or turn 49 checks inconclusive. And one that
publishes nothing: one requirement broken, not every check blamed.

Targets: ``python:tests.kvcs.hostile_publishers:NestedManifestPublisher`` (every manifest version is 994 nested
arrays) and ``...:HugeIntManifestPublisher`` (a valid-looking manifest whose "layers" has 4301 digits, past
CPython's default int-parsing limit). Everything else (namespace, data tracks, statuses) is the reference's.
"""

from __future__ import annotations

from collections.abc import Sequence

from kvconform.kvcs.manifest import Manifest
from kvconform.kvcs.publisher import KvcsPublisher
from kvconform.kvcs.publisher_core import TrackOut

DEPTH = 994
DIGITS = 4301


class NestedManifestPublisher(KvcsPublisher):
    """KVCS-MANIFEST-JSON: each manifest version is ``[[[...]]]``, 994 arrays deep, not a manifest object."""

    def manifest_payload(self, manifest: Manifest) -> bytes:
        return b"[" * DEPTH + b"]" * DEPTH


class HugeIntManifestPublisher(KvcsPublisher):
    """KVCS-MANIFEST-JSON: each manifest version's "layers" is a 4301-digit integer."""

    def manifest_payload(self, manifest: Manifest) -> bytes:
        body = manifest.to_json()
        key = b'"layers":'
        at = body.index(key) + len(key)
        end = at
        while body[end:end + 1] in b" 0123456789":
            end += 1
        return body[:at] + b"9" * DIGITS + body[end:]


class SilentPublisher(KvcsPublisher):
    """KVCS-TRACK-COMPLETE-OWN: announces the publication and serves its tracks, but publishes no object at all
    (no layer, no manifest version, no End of Track)."""

    def layer_order(self) -> Sequence[int]:
        return ()

    def publish_manifest(self) -> None:
        return None

    def end_track(self, local: TrackOut) -> None:
        return None
