"""Broken KVCS consumers (targets: python:tests.mutants.kvcs:<Name>), for the kvcs-consumer suite's own tests.

Each class is the reference consumer (``kvconform.kvcs.consumer.Consumer``) with one method overridden,
breaking the requirement named in its docstring's first line; MUTANTS maps it to the check functions that
must fail.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Sequence
from typing import Any

from kvconform.kvcs.consumer import (
    Consumer,
    ConsumeResult,
    ConsumerIdentity,
    ConsumerOptions,
    _cose_payload_unverified,
)
from kvconform.kvcs.manifest import Manifest, SegmentEntry
from kvconform.kvcs.namespace import KvcsNamespace
from kvconform.kvcs.payload import HEADER_LEN, decode_object
from kvconform.kvcs.tracks import DataTrack
from kvconform.moqt.filters import LocationFilter
from kvconform.moqt.quic import granting_streams_uni
from kvconform.moqt.structures import Location
from tests.mutants import Mutant

# ---- object verification ---------------------------------------------------------------------------


class DigestBlindConsumer(Consumer):
    """KVCS-PAYLOAD-VERIFY-DIGEST: does not check that the Data Digest is the SHA-256 of the Data."""

    def object_problems(self, needed: Any, segment: SegmentEntry, loc: Location, payload: bytes) -> list[str]:
        return [p for p in super().object_problems(needed, segment, loc, payload) if "Data Digest" not in p]


class FieldBlindConsumer(Consumer):
    """KVCS-PAYLOAD-VERIFY-LAYER: does not check Layer = Group ID nor Block Index = Object ID."""

    def object_problems(self, needed: Any, segment: SegmentEntry, loc: Location, payload: bytes) -> list[str]:
        return [p for p in super().object_problems(needed, segment, loc, payload)
                if not p.startswith(("Layer", "Block Index"))]


class LengthBlindConsumer(Consumer):
    """KVCS-PAYLOAD-VERIFY-LENGTH: uses an object whose header and Data Length do not account for the whole
    payload (whatever Data there is)."""

    def object_problems(self, needed: Any, segment: SegmentEntry, loc: Location, payload: bytes) -> list[str]:
        problems = super().object_problems(needed, segment, loc, payload)
        return [p for p in problems if not p.startswith("Data Length")]


class MagicBlindConsumer(Consumer):
    """KVCS-PAYLOAD-VERIFY-MAGIC: does not check Magic and Version."""

    def object_problems(self, needed: Any, segment: SegmentEntry, loc: Location, payload: bytes) -> list[str]:
        problems = super().object_problems(needed, segment, loc, payload)
        if problems and problems[0].startswith(("Magic", "Version")):
            # Decode as if the fields were right: the rest of the checks on the real header.
            fixed = bytes.fromhex("4b564f3101") + payload[5:]
            return super().object_problems(needed, segment, loc, fixed)
        return problems


def _header(payload: bytes) -> Any:
    return decode_object(payload[:HEADER_LEN + int.from_bytes(payload[32:36], "big")])[0]


class ZeroDigestAbsentConsumer(Consumer):
    """KVCS-PAYLOAD-VERIFY-DIGEST: reads an all-zero Data Digest as "no digest given" and skips the check."""

    def object_problems(self, needed: Any, segment: SegmentEntry, loc: Location, payload: bytes) -> list[str]:
        problems = super().object_problems(needed, segment, loc, payload)
        if payload[36:HEADER_LEN] == bytes(32):
            return [p for p in problems if not p.startswith("Data Digest")]
        return problems


class NarrowLayerConsumer(Consumer):
    """KVCS-PAYLOAD-VERIFY-LAYER: compares Layer with the Group ID in 16 bits (Layer = Group ID + 2^16 passes)."""

    def object_problems(self, needed: Any, segment: SegmentEntry, loc: Location, payload: bytes) -> list[str]:
        problems = super().object_problems(needed, segment, loc, payload)
        if any(p.startswith("Layer") for p in problems) and (_header(payload).layer - loc.group) % (1 << 16) == 0:
            return [p for p in problems if not p.startswith("Layer")]
        return problems


class TrailingOctetsConsumer(Consumer):
    """KVCS-PAYLOAD-VERIFY-LENGTH: accepts octets past header + Data Length (checks only that Data is not
    truncated)."""

    def object_problems(self, needed: Any, segment: SegmentEntry, loc: Location, payload: bytes) -> list[str]:
        if len(payload) >= HEADER_LEN:
            payload = payload[:HEADER_LEN + int.from_bytes(payload[32:36], "big")]
        return super().object_problems(needed, segment, loc, payload)


class RawLengthBlindConsumer(Consumer):
    """KVCS-PAYLOAD-DATA-RAW: uses raw Data of any length (Data Length and Digest consistent) as one block's
    section."""

    def object_problems(self, needed: Any, segment: SegmentEntry, loc: Location, payload: bytes) -> list[str]:
        return [p for p in super().object_problems(needed, segment, loc, payload) if "Data of one block" not in p]


class FlagStrictConsumer(Consumer):
    """KVCS-PAYLOAD-FLAGS-IGNORED: discards objects whose reserved Flags are not zero."""

    def object_problems(self, needed: Any, segment: SegmentEntry, loc: Location, payload: bytes) -> list[str]:
        problems = super().object_problems(needed, segment, loc, payload)
        if not problems and decode_object(payload)[0].flags:
            problems.append(f"Flags (offset 6): 0x{decode_object(payload)[0].flags:04x}, expected 0")
        return problems


# ---- manifest ------------------------------------------------------------------------------------------


class UnsignedDigestConsumer(Consumer):
    """KVCS-SEC-COSE-VERIFY: does not hold Data Digests against the signed object_digests list."""

    def listed_digest_problem(self, track: str, segment: SegmentEntry, loc: Location, digest: bytes,
                              authenticated: bool) -> str | None:
        return None


class SignatureBlindConsumer(Consumer):
    """KVCS-SEC-COSE-VERIFY: reads manifest.cose without verifying its signature."""

    def open_manifest(self, track: bytes, payload: bytes) -> bytes:
        return payload if track == b"manifest" else _cose_payload_unverified(payload)


class CompatBlindConsumer(Consumer):
    """KVCS-MANIFEST-COMPAT-CHECK: does not compare the manifest's Compatibility ID with the namespace's."""

    def manifest_problems(self, manifest: Manifest, namespace: KvcsNamespace) -> list[str]:
        return [p for p in super().manifest_problems(manifest, namespace) if "Compatibility ID" not in p]


class MixingConsumer(Consumer):
    """KVCS-VERIFY-NO-MIX: combines objects of any two publications in one segment."""

    def may_combine(self, a: Manifest | None, b: Manifest | None) -> bool:
        return True


class FirstCopyConsumer(Consumer):
    """KVCS-PAYLOAD-DISCARD: a Location delivered twice with different payloads keeps its first copy instead
    of discarding the malformed track (MOQT-DATA-MALFORMED-DUPLICATE, a subscriber requirement the kvcs-consumer
    check cites too)."""

    def duplicate_problem(self, track: str, loc: Location, first: bytes, again: bytes) -> str | None:
        return None


class DigestAloneConsumer(Consumer):
    """KVCS-SEC-DIGEST-NOT-ALONE: configured to distrust relays, it still accepts objects vouched for by their
    Data Digest alone (it requires producer authenticity only when it has producer keys)."""

    def __init__(self, identity: ConsumerIdentity, options: ConsumerOptions, **kwargs: Any) -> None:
        super().__init__(identity, dataclasses.replace(options, require_authenticity=bool(options.producer_keys)),
                         **kwargs)


# ---- retrieval -------------------------------------------------------------------------------------------


class NoFillConsumer(Consumer):
    """KVCS-LIVE-SUBSCRIBE: subscribes to data tracks with Next Object but no FILL_PARAMETERS, so nothing
    published before the subscription arrives."""

    def data_subscribe_parameters(self) -> dict[str, Any]:
        return {"location_filter": LocationFilter.next_object()}


class FirstSegmentModeConsumer(Consumer):
    """KVCS-LIVE-SUBSCRIBE: decides between FETCH and SUBSCRIBE by segment 0 alone, so a later pass of chunked
    prefill still in production is FETCHed (only what was published by then arrives)."""

    def retrieval_mode(self, complete: Sequence[bool]) -> str:
        return "fetch" if complete[0] else "live"


class MixedTracksConsumer(Consumer):
    """KVCS-TRACK-SELECT: takes a segment's "k" track and, for the values, its "kv" track (a mix)."""

    def select_tracks(self, tracks: Sequence[DataTrack]) -> list[DataTrack]:
        mixed = [t for t in tracks if t.codec == "raw" and t.component in ("k", "kv")]
        return mixed if len(mixed) == 2 else super().select_tracks(tracks)


class OpenRangeConsumer(Consumer):
    """KVCS-FETCH-RANGE: FETCHes with Absolute Start {a,0} (to the Largest Object) instead of Absolute
    Start, Group End, and without GROUP_ORDER."""

    def fetch_parameters(self, first: int, last: int, blocks: int, segment_blocks: int,
                         peer_max_filter_ranges: int) -> dict[str, Any]:
        out = super().fetch_parameters(first, last, blocks, segment_blocks, peer_max_filter_ranges)
        out["location_filter"] = LocationFilter.absolute_start(first, 0)
        out.pop("group_order", None)
        return out


class NeverFilterConsumer(Consumer):
    """KVCS-FETCH-OBJECTID-FILTER: never adds an OBJECTID_FILTER for the first n blocks, even when the peer's
    MAX_FILTER_RANGES allows it."""

    def fetch_parameters(self, first: int, last: int, blocks: int, segment_blocks: int,
                         peer_max_filter_ranges: int) -> dict[str, Any]:
        return super().fetch_parameters(first, last, blocks, segment_blocks, 0)


class ShortestPrefixFirstConsumer(Consumer):
    """KVCS-DISC-SUBSCRIBE-NAMESPACE: looks for publications from the shortest prefix up, not with the
    Anchor Key of the longest prefix first."""

    def discovery_anchors(self) -> list[bytes]:
        return list(reversed(super().discovery_anchors()))


class ProbingDistrustfulConsumer(Consumer):
    """KVCS-PRIV-NO-PREFIX-PROBING: configured to distrust relays, it still probes ever shorter prefixes."""

    def discovery_anchors(self) -> list[bytes]:
        return list(reversed(self.keys))[:self.options.max_prefixes]


# ---- recovery and the budget ---------------------------------------------------------------------------


class SingleRelayConsumer(Consumer):
    """KVCS-RECOVER-RETRY: uses only the first relay it is given; missing objects are never retried
    elsewhere."""

    def __init__(self, identity: ConsumerIdentity, options: ConsumerOptions, **kwargs: Any) -> None:
        super().__init__(identity, dataclasses.replace(options, relays=options.relays[:1]), **kwargs)


class PatientConsumer(Consumer):
    """KVCS-RECOVER-NO-INDEFINITE-WAIT: waits for missing objects without any bound (no budget, no stall
    timeout)."""

    def __init__(self, identity: ConsumerIdentity, options: ConsumerOptions, **kwargs: Any) -> None:
        super().__init__(identity, dataclasses.replace(options, stall_timeout=3600.0), **kwargs)

    def remaining(self, now: float) -> float:
        return 3600.0


class EarlyQuitConsumer(Consumer):
    """KVCS-RECOVER-WAIT-LIVE: abandons a live publication after 0.3 s without an object, far less than its
    budget (a pause in live delivery is read as the end of production)."""

    def __init__(self, identity: ConsumerIdentity, options: ConsumerOptions, **kwargs: Any) -> None:
        super().__init__(identity, dataclasses.replace(options, stall_timeout=0.3), **kwargs)


DEAF_AFTER = 0.1  # seconds of silence after which ResumeDeafConsumer stops listening


class ResumeDeafConsumer(Consumer):
    """KVCS-RECOVER-NO-INDEFINITE-WAIT: once live delivery pauses it stops listening (the wakeup of the resumed
    delivery is lost) and waits for it without any bound."""

    async def wait_for_change(self, changed: asyncio.Event, bound: float) -> bool:
        if await super().wait_for_change(changed, min(bound, DEAF_AFTER)):
            return True
        await asyncio.Event().wait()  # never set: no bound, no budget
        return False


class ZeroFillConsumer(Consumer):
    """KVCS-VERIFY-LAYER-USABLE: a layer whose objects never arrive is used anyway, the missing blocks
    filled with zeros."""

    def recover_block(self, track: DataTrack, segment: SegmentEntry, loc: Location) -> bytes | None:
        return bytes(self.identity.section_octets() * (2 if track.component == "kv" else 1))


FEW_STREAMS = 4  # initial_max_streams_uni of the under-granting consumer


class FewStreamsConsumer(Consumer):
    """KVCS-OPS-STREAMS: its QUIC endpoint grants the relay initial_max_streams_uni 4, less than the 10 the
    suite's 4-layer caches need (aioquic raises it with MAX_STREAMS as streams are used)."""

    async def run(self) -> ConsumeResult:
        with granting_streams_uni(FEW_STREAMS):
            return await super().run()

_POISONS = ("test_object_failing_a_check_is_discarded",)
_DISTRUSTS = "kvcs.consumer.distrusts_relays=true"
_VALUE_CLASSES = ("test_objects_malformed_in_every_value_class_are_discarded",)

MUTANTS: dict[str, Mutant] = {
    "DigestBlindConsumer": Mutant("kvcs-consumer", "KVCS-PAYLOAD-VERIFY-DIGEST",
                                  (*_POISONS, "test_poisoned_publication_is_replaced_by_an_honest_one")),
    # it skips the Block Index check too (one override drops both), so the [block] poison is used as well
    "FieldBlindConsumer": Mutant("kvcs-consumer", "KVCS-PAYLOAD-VERIFY-LAYER", _POISONS,
                                 collateral=("KVCS-PAYLOAD-VERIFY-BLOCK",)),
    "LengthBlindConsumer": Mutant("kvcs-consumer", "KVCS-PAYLOAD-VERIFY-LENGTH", _POISONS),
    "MagicBlindConsumer": Mutant("kvcs-consumer", "KVCS-PAYLOAD-VERIFY-MAGIC", _POISONS),
    "ZeroDigestAbsentConsumer": Mutant("kvcs-consumer", "KVCS-PAYLOAD-VERIFY-DIGEST", _VALUE_CLASSES),
    "NarrowLayerConsumer": Mutant("kvcs-consumer", "KVCS-PAYLOAD-VERIFY-LAYER", _VALUE_CLASSES),
    "TrailingOctetsConsumer": Mutant("kvcs-consumer", "KVCS-PAYLOAD-VERIFY-LENGTH", _VALUE_CLASSES),
    "RawLengthBlindConsumer": Mutant("kvcs-consumer", "KVCS-PAYLOAD-DATA-RAW", _VALUE_CLASSES),
    "FlagStrictConsumer": Mutant("kvcs-consumer", "KVCS-PAYLOAD-FLAGS-IGNORED", ("test_nonzero_flags_are_ignored",)),
    "UnsignedDigestConsumer": Mutant("kvcs-consumer", "KVCS-SEC-COSE-VERIFY",
                                     ("test_poison_with_matching_digest_is_caught_by_the_signed_manifest",)),
    "SignatureBlindConsumer": Mutant("kvcs-consumer", "KVCS-SEC-COSE-VERIFY",
                                     ("test_bad_cose_signature_discards_the_publication",)),
    "CompatBlindConsumer": Mutant("kvcs-consumer", "KVCS-MANIFEST-COMPAT-CHECK",
                                  ("test_manifest_with_another_compatibility_id_discards_the_publication",)),
    "FirstCopyConsumer": Mutant("kvcs-consumer", "KVCS-PAYLOAD-DISCARD",
                                ("test_same_location_with_two_payloads_is_not_used",)),
    "MixingConsumer": Mutant("kvcs-consumer", "KVCS-VERIFY-NO-MIX",
                             ("test_non_deterministic_publications_are_not_mixed",)),
    "DigestAloneConsumer": Mutant("kvcs-consumer", "KVCS-SEC-DIGEST-NOT-ALONE",
                                  ("test_distrustful_consumer_does_not_rely_on_the_data_digest_alone",),
                                  pics=(_DISTRUSTS,)),
    "ProbingDistrustfulConsumer": Mutant("kvcs-consumer", "KVCS-PRIV-NO-PREFIX-PROBING",
                                         ("test_distrustful_consumer_does_not_probe_shorter_prefixes",),
                                         pics=(_DISTRUSTS,)),
    "NoFillConsumer": Mutant("kvcs-consumer", "KVCS-LIVE-SUBSCRIBE",
                             ("test_cache_in_production_is_assembled_exactly_once",)),
    "FirstSegmentModeConsumer": Mutant("kvcs-consumer", "KVCS-LIVE-SUBSCRIBE",
                                       ("test_chunked_prefill_joined_during_the_second_pass",)),
    "MixedTracksConsumer": Mutant("kvcs-consumer", "KVCS-TRACK-SELECT", ("test_shorter_prefix_and_appended_segment",)),
    "OpenRangeConsumer": Mutant("kvcs-consumer", "KVCS-FETCH-RANGE",
                                ("test_completed_cache_is_discovered_and_assembled", "test_layer_range_only")),
    "NeverFilterConsumer": Mutant("kvcs-consumer", "KVCS-FETCH-OBJECTID-FILTER", ("test_first_blocks_only",)),
    "ShortestPrefixFirstConsumer": Mutant("kvcs-consumer", "KVCS-DISC-SUBSCRIBE-NAMESPACE",
                                          ("test_completed_cache_is_discovered_and_assembled",
                                           "test_shorter_prefix_and_appended_segment")),
    "SingleRelayConsumer": Mutant("kvcs-consumer", "KVCS-RECOVER-RETRY",
                                  ("test_missing_objects_are_recovered_through_another_relay",)),
    "PatientConsumer": Mutant("kvcs-consumer", "KVCS-RECOVER-NO-INDEFINITE-WAIT",
                              ("test_stalled_production_is_given_up_within_the_budget",)),
    "EarlyQuitConsumer": Mutant("kvcs-consumer", "KVCS-RECOVER-WAIT-LIVE",
                                ("test_live_delivery_that_stalls_and_resumes_is_waited_for",)),
    # a 2 s budget (a 0.4 s pause) keeps the run short: the driver stops it after budget + GRACE
    "ResumeDeafConsumer": Mutant("kvcs-consumer", "KVCS-RECOVER-NO-INDEFINITE-WAIT",
                                 ("test_live_delivery_that_stalls_and_resumes_is_waited_for",),
                                 pics=("kvcs.consumer.budget=2",)),
    "ZeroFillConsumer": Mutant("kvcs-consumer", "KVCS-VERIFY-LAYER-USABLE", ("test_missing_objects_fail_their_layer",)),
    "FewStreamsConsumer": Mutant("kvcs-consumer", "KVCS-OPS-STREAMS",
                                 ("test_enough_unidirectional_streams_are_granted",)),
}

UNMUTATED_CHECKS: dict[str, str] = {}
