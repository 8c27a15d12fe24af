"""Broken KVCS Original Publishers (targets: python:tests.mutants.kvcs:<Name>), for the kvcs-publisher suite.

Each class is the reference publisher (``kvconform.kvcs.publisher.KvcsPublisher``) with one behaviour
overridden, breaking the requirement its docstring's first line names; MUTANTS maps it to the check functions
that must fail. The harness starts them like the reference: in-process, against its recording relay.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import hashlib
from collections.abc import Callable, Sequence
from typing import Any

from kvconform.kvcs.content import CacheSpec, SegmentLayout
from kvconform.kvcs.cose import ProducerKey, sign
from kvconform.kvcs.manifest import Manifest
from kvconform.kvcs.payload import decode_object, encode_raw
from kvconform.kvcs.publisher import KvcsPublisher
from kvconform.kvcs.publisher_core import TrackOut
from kvconform.kvcs.tracks import MANIFEST, MANIFEST_COSE, DataTrack
from kvconform.moqt import quic
from kvconform.moqt.client import LocalTrack
from kvconform.moqt.data import ObjectStatus
from kvconform.moqt.errors import PublishDoneCode
from kvconform.moqt.quic import granting_streams_uni
from kvconform.moqt.structures import AuthToken, KeyValuePair, Location, PropertyType
from tests.kvcs import hostile_publishers
from tests.mutants import Mutant

# ---- the announcement ------------------------------------------------------------------------------------


class NoTokenPublisher(KvcsPublisher):
    """KVCS-PUB-ANNOUNCE: sends PUBLISH_NAMESPACE without the scope's authorization token."""

    def auth_tokens(self, token: bytes | None) -> tuple[AuthToken, ...]:
        return ()


class ContentDerivedIdPublisher(KvcsPublisher):
    """KVCS-NS-PUBID-RANDOM: derives the Publication ID from the content, so every production of a cache
    gets the same one."""

    def __init__(self, spec: CacheSpec, **options: Any) -> None:
        options["pub_id"] = hashlib.sha256(b"pub" + spec.anchor_key).digest()[:16]
        super().__init__(spec, **options)


# ---- the objects -----------------------------------------------------------------------------------------


class CorruptDataPublisher(KvcsPublisher):
    """KVCS-PAYLOAD-DIGEST: flips the last Data octet of block 0 of layer 1 after computing its Data Digest."""

    def object_payload(self, track: DataTrack, layer: int, object_id: int) -> bytes:
        payload = super().object_payload(track, layer, object_id)
        if (layer, object_id) == (1, 0):
            return payload[:-1] + bytes([payload[-1] ^ 0x01])
        return payload


class RehashedDataPublisher(KvcsPublisher):
    """KVCS-PAYLOAD-LAYER-DIGEST: flips the last Data octet of block 0 of layer 1 of the k track and recomputes
    its Data Digest, so each object is self-consistent but SHA-256(k Data || v Data) is not the KVSP layer
    digest."""

    def object_payload(self, track: DataTrack, layer: int, object_id: int) -> bytes:
        payload = super().object_payload(track, layer, object_id)
        if (track.component, layer, object_id) == ("k", 1, 0):
            header, data = decode_object(payload)
            bad = data[:-1] + bytes([data[-1] ^ 0x01])
            return encode_raw(header.with_(digest=hashlib.sha256(bad).digest()), bad)
        return payload


class NestedManifestPublisher(hostile_publishers.NestedManifestPublisher):
    """KVCS-MANIFEST-JSON: every manifest version is 994 nested JSON arrays (issue 10: the harness crashed with
    RecursionError instead of failing the manifest requirement)."""


class SwappedSectionsPublisher(KvcsPublisher):
    """KVCS-PAYLOAD-DATA-RAW: the k objects carry the V section of their block and layer, the v objects the K
    section (each with the Data Digest of what it carries)."""

    def object_payload(self, track: DataTrack, layer: int, object_id: int) -> bytes:
        payload = super().object_payload(track, layer, object_id)
        other = {"k": "v", "v": "k"}.get(track.component)
        if other is None:
            return payload
        header, _ = decode_object(payload)
        data = self.spec.object_data(DataTrack(other, track.codec, track.segment), layer, object_id)
        return encode_raw(header.with_(digest=hashlib.sha256(data).digest()), data)


class MissingBlockPublisher(KvcsPublisher):
    """KVCS-TRACK-COMPLETE-OWN: leaves the last block of layer 2 out of every track (End of Group still follows)."""

    def publish_layer(self, local: TrackOut, track: DataTrack, layer: int, blocks: int) -> None:
        if layer != 2:
            super().publish_layer(local, track, layer, blocks)
            return
        prio = self.priority(layer)
        for oid in range(blocks - 1):
            local.publish_object(layer, oid, self.object_payload(track, layer, oid), priority=prio)
        local.publish_object(layer, blocks, priority=prio, status=ObjectStatus.END_OF_GROUP)


class RepublishingPublisher(KvcsPublisher):
    """KVCS-PUB-NO-DUP-LOCATION: once a track ended, serves fills and FETCHes of block 0 of layer 0 with another
    payload than the one it published live."""

    def close_track(self, local: LocalTrack) -> None:
        loc = Location(0, 0)
        obj = local.objects.get(loc)
        if obj is not None and obj.payload:
            local.objects[loc] = dataclasses.replace(obj, payload=obj.payload[:-1] + bytes([obj.payload[-1] ^ 0xFF]))
        super().close_track(local)


class FalselyDeterministicPublisher(KvcsPublisher):
    """KVCS-MANIFEST-DETERMINISTIC: says "deterministic": true, yet ends block 0 of layer 0 with its Publication
    ID, so two productions of the same cache differ there."""

    def __init__(self, spec: CacheSpec, **options: Any) -> None:
        options["deterministic"] = True
        super().__init__(spec, **options)

    def object_payload(self, track: DataTrack, layer: int, object_id: int) -> bytes:
        payload = super().object_payload(track, layer, object_id)
        if (layer, object_id) == (0, 0):
            return payload[:-16] + self.namespace.pub_id
        return payload


class AbsoluteObjectIdPublisher(KvcsPublisher):
    """KVCS-OBJ-ID-BLOCK: numbers the objects of an appended segment by their absolute block index instead of
    their index within the segment."""

    def publish_layer(self, local: TrackOut, track: DataTrack, layer: int, blocks: int) -> None:
        first = self.layout[track.segment].first_block
        prio = self.priority(layer)
        for oid in range(blocks):
            local.publish_object(layer, first + oid, self.object_payload(track, layer, oid), priority=prio)
        local.publish_object(layer, first + blocks, priority=prio, status=ObjectStatus.END_OF_GROUP)


# ---- delivery ----------------------------------------------------------------------------------------------


class DescendingLayersPublisher(KvcsPublisher):
    """KVCS-GROUP-ORDER: produces and publishes the layers last to first."""

    def layer_order(self) -> Sequence[int]:
        return range(self.spec.layers - 1, -1, -1)


class InterleavedGroupsPublisher(KvcsPublisher):
    """KVCS-GROUP-ORDER: writes Object 0 of Group g+1 (opening its stream, after Group g's) before the last block
    and End of Group of Group g, on Group g's stream, already open. The streams open in layer order and every
    Group is whole on one stream, so only the publisher's own order of writes shows it."""

    def __init__(self, spec: CacheSpec, **options: Any) -> None:
        super().__init__(spec, **options)
        self._tails: dict[bytes, Callable[[], None]] = {}  # track -> the held end of its last Group

    def publish_layer(self, local: TrackOut, track: DataTrack, layer: int, blocks: int) -> None:
        if blocks < 2:
            super().publish_layer(local, track, layer, blocks)
            return
        prio = self.priority(layer)
        local.publish_object(layer, 0, self.object_payload(track, layer, 0), priority=prio)
        self._flush(track.name)
        for oid in range(1, blocks - 1):
            local.publish_object(layer, oid, self.object_payload(track, layer, oid), priority=prio)

        def tail() -> None:
            local.publish_object(layer, blocks - 1, self.object_payload(track, layer, blocks - 1), priority=prio)
            local.publish_object(layer, blocks, priority=prio, status=ObjectStatus.END_OF_GROUP)
        self._tails[track.name] = tail

    def _flush(self, *names: bytes) -> None:
        for name in names or tuple(self._tails):
            held = self._tails.pop(name, None)
            if held is not None:
                held()

    def publish_manifest(self) -> None:
        self._flush()  # a manifest version never lists a Group whose end is still held
        super().publish_manifest()

    def end_track(self, local: TrackOut) -> None:
        self._flush(local.name)
        super().end_track(local)


class SubgroupOnePublisher(KvcsPublisher):
    """KVCS-GROUP-SUBGROUP-ZERO: sends each Group in Subgroup 1."""

    def publish_layer(self, local: TrackOut, track: DataTrack, layer: int, blocks: int) -> None:
        prio = self.priority(layer)
        for oid in range(blocks):
            local.publish_object(layer, oid, self.object_payload(track, layer, oid), subgroup=1, priority=prio)
        local.publish_object(layer, blocks, subgroup=1, priority=prio, status=ObjectStatus.END_OF_GROUP)


class NoEndOfGroupPublisher(KvcsPublisher):
    """KVCS-GROUP-END-OF-GROUP: ends each Group's stream with FIN after the last block, no End of Group."""

    def publish_layer(self, local: TrackOut, track: DataTrack, layer: int, blocks: int) -> None:
        prio = self.priority(layer)
        for oid in range(blocks):
            local.publish_object(layer, oid, self.object_payload(track, layer, oid), priority=prio,
                                 end_subgroup=oid == blocks - 1)


class NoEndOfTrackPublisher(KvcsPublisher):
    """KVCS-GROUP-END-OF-TRACK: ends its tracks with PUBLISH_DONE only, never an End of Track status object."""

    def close_track(self, local: LocalTrack) -> None:
        local.ended = True
        for stream_id in list(local.subscribers):
            local.finish(stream_id, PublishDoneCode.TRACK_ENDED)


class EarlyPublishDonePublisher(KvcsPublisher):
    """MOQT-SUB-PUBLISH-DONE: sends PUBLISH_DONE on each live subscription while its End of Track stream is still
    open, and FINs that stream only once PUBLISH_DONE has left (its Stream Count is right)."""

    def close_track(self, local: LocalTrack) -> None:
        session = local.session
        group = 0 if local.largest is None else local.largest.group + 1
        local.ended = True
        for request_stream in list(local.subscribers):
            del local.subscribers[request_stream]
            sid = session.open_subgroup(request_stream, group, 0, self.priority(min(group, self.spec.layers - 1)))
            session.write_object(sid, 0, status=ObjectStatus.END_OF_TRACK)
            session.publish_done(request_stream, PublishDoneCode.TRACK_ENDED)  # counts sid, still open
            # once PUBLISH_DONE has left (bounded at 0.2 s, by when it has on loopback)
            local.client.connection.when_sent([request_stream], functools.partial(session.end_data_stream, sid),
                                              0.2)


class RoundedPriorityPublisher(KvcsPublisher):
    """KVCS-OBJ-PRIORITY: gives Group g the Publisher Priority round(128 * g / L) instead of its floor."""

    def priority(self, layer: int) -> int:
        return round(128 * layer / self.spec.layers)


class UrgentManifestPriorityPublisher(KvcsPublisher):
    """KVCS-OBJ-MANIFEST-PRIORITY: publishes the manifest with Publisher Priority 64 instead of 0."""

    def manifest_priority(self) -> int:
        return 64


# ---- the manifest ------------------------------------------------------------------------------------------


class LateManifestPublisher(KvcsPublisher):
    """KVCS-PUB-MANIFEST-FIRST: holds the first manifest version back until layer 0 of every track is published."""

    _held = False

    def publish_manifest(self) -> None:
        if self.manifest_versions == 0 and not self._held:
            self._held = True
            return
        super().publish_manifest()

    def publish_layer(self, local: TrackOut, track: DataTrack, layer: int, blocks: int) -> None:
        super().publish_layer(local, track, layer, blocks)
        if self._held and self.manifest_versions == 0 and track == self.tracks(track.segment)[-1]:
            super().publish_manifest()


class SparseManifestPublisher(KvcsPublisher):
    """KVCS-MANIFEST-CADENCE: publishes a new manifest version only every 16 completed layers."""

    def manifest_due(self, layers_since_version: int) -> bool:
        return layers_since_version >= 16


class SilentCompletionPublisher(KvcsPublisher):
    """KVCS-MANIFEST-NEW-VERSION-SEGMENT: publishes no manifest version when a segment becomes complete."""

    _ended = False

    def end_track(self, local: TrackOut) -> None:
        super().end_track(local)
        self._ended = True

    def publish_manifest(self) -> None:
        if self._ended:
            self._ended = False
            return
        super().publish_manifest()


class SkippedVersionGroupsPublisher(KvcsPublisher):
    """KVCS-MANIFEST-VERSION-GROUP: puts manifest version m in Group 2m, leaving a Group out between versions."""

    def publish_manifest(self) -> None:
        local = self.outputs[self.manifest_track]
        local.publish_object(2 * self.manifest_versions, 0, self.manifest_payload(self.build_manifest()),
                             priority=self.manifest_priority(), end_subgroup=True)
        self.manifest_versions += 1


class WrongBlockKeysPublisher(KvcsPublisher):
    """KVCS-MANIFEST-BLOCK-KEYS-SHA256: lists the SHA-256 of the segment's Block Keys in reverse order."""

    def build_manifest(self) -> Manifest:
        manifest = super().build_manifest()
        segments = []
        for entry in manifest.segments:
            keys = self.spec.block_keys[entry.first_block:entry.first_block + entry.blocks]
            segments.append(dataclasses.replace(entry, block_keys_sha256=hashlib.sha256(b"".join(keys[::-1])).digest()))
        return dataclasses.replace(manifest, segments=tuple(segments))


class NoObjectDigestsPublisher(KvcsPublisher):
    """KVCS-MANIFEST-OBJECT-DIGESTS: leaves "object_digests" out of an unsigned manifest."""

    def build_manifest(self) -> Manifest:
        if self.signing_key is not None:
            return super().build_manifest()  # a signed manifest needs them (KVCS-SEC-COSE-REQUIRED)
        return self.spec.manifest(self.completed, kv=self.kv_track, deterministic=self.deterministic,
                                  segments_added=len(self.added), with_digests=False)


class SparseUndigestedManifestPublisher(SparseManifestPublisher, NoObjectDigestsPublisher):
    """KVCS-MANIFEST-CADENCE without object_digests: the check must place versions by stream numbering alone."""


class ForeignKeyPublisher(KvcsPublisher):
    """KVCS-MANIFEST-COSE-SIGN: signs manifest.cose with another key under the producer key's kid."""

    def manifest_payload(self, manifest: Manifest) -> bytes:
        if self.signing_key is None:
            return super().manifest_payload(manifest)
        other = ProducerKey.generate(self.signing_key.alg, self.signing_key.kid)
        return sign(manifest.to_json(), other)


class TwoManifestTracksPublisher(KvcsPublisher):
    """KVCS-MANIFEST-ONE-TRACK: serves both "manifest" and "manifest.cose" (the second one stays empty)."""

    def register(self, client: Any) -> None:
        super().register(client)
        other = MANIFEST if self.manifest_track == MANIFEST_COSE else MANIFEST_COSE
        client.track(self.announced_namespace(), other, properties=self.track_properties(other))


# ---- properties ----------------------------------------------------------------------------------------------


class DeliveryTimeoutPublisher(KvcsPublisher):
    """KVCS-PUB-NO-DELIVERY-TIMEOUT: sets the Track Property OBJECT_DELIVERY_TIMEOUT (5 s) on every track."""

    def track_properties(self, name: bytes) -> tuple[KeyValuePair, ...]:
        return (KeyValuePair(PropertyType.OBJECT_DELIVERY_TIMEOUT, 5000), *super().track_properties(name))


class NoCacheDurationPublisher(KvcsPublisher):
    """KVCS-PUB-MAX-CACHE-DURATION: sets no MAX_CACHE_DURATION Track Property."""

    def track_properties(self, name: bytes) -> tuple[KeyValuePair, ...]:
        return ()


# ---------------------------------------------------------------------------------------------------------------

# ---- the text's example, operations ------------------------------------------------------------------


class BlockUnitTokenStartPublisher(KvcsPublisher):
    """KVCS-EX-PAYLOAD-HEADER: writes Token Start in blocks instead of tokens (the Block Index: 1, not 4, for
    the example's k object at {0,1}); Data and Data Digest stay right."""

    def object_payload(self, track: DataTrack, layer: int, object_id: int) -> bytes:
        header, data = decode_object(super().object_payload(track, layer, object_id))
        return encode_raw(dataclasses.replace(header, token_start=header.block_index), data)


FEW_STREAMS = 4  # initial_max_streams_uni of the under-granting mutants


class FewStreamsPublisher(KvcsPublisher):
    """KVCS-OPS-STREAMS: its QUIC endpoint grants the relay initial_max_streams_uni 4, less than the 42 the
    20 layers of the plain case need (aioquic raises it with MAX_STREAMS as streams are used)."""

    async def run(self, *args: Any, **kwargs: Any) -> None:
        with granting_streams_uni(FEW_STREAMS):
            await super().run(*args, **kwargs)

class OtherDraftPublisher(KvcsPublisher):
    """MOQT-SETUP-ALPN: offers only the ALPN of another draft (moqt-23): the relay's TLS refuses the handshake, so
    no session ever starts (the harness names the refusal once instead of waiting for a PUBLISH_NAMESPACE)."""

    async def run(self, url: str, *args: Any, **kwargs: Any) -> None:
        await quic.connect(url, alpn=("moqt-23",), timeout=5.0)


SUITE = "kvcs-publisher"
SIGNING = ("kvcs.publisher.signing=true",)

MUTANTS: dict[str, Mutant] = {
    "OtherDraftPublisher": Mutant(SUITE, "MOQT-SETUP-ALPN", ("test_groups_are_published_in_layer_order",)),
    "NoTokenPublisher": Mutant(SUITE, "KVCS-PUB-ANNOUNCE",
                               ("test_publish_namespace_is_the_full_namespace_with_the_scope_token",)),
    "ContentDerivedIdPublisher": Mutant(SUITE, "KVCS-NS-PUBID-RANDOM",
                                        ("test_publication_id_is_new_for_each_production",)),
    "CorruptDataPublisher": Mutant(SUITE, "KVCS-PAYLOAD-DIGEST", ("test_every_object_header_is_the_expected_one",)),
    "SwappedSectionsPublisher": Mutant(SUITE, "KVCS-PAYLOAD-DATA-RAW", ("test_every_object_data_is_the_test_content",)),
    "RehashedDataPublisher": Mutant(SUITE, "KVCS-PAYLOAD-LAYER-DIGEST",
                                    ("test_k_and_v_data_give_the_kvsp_layer_digest",)),
    "NestedManifestPublisher": Mutant(SUITE, "KVCS-MANIFEST-JSON",
                                      ("test_manifest_is_consistent_with_the_namespace_and_the_cache",)),
    "MissingBlockPublisher": Mutant(SUITE, "KVCS-TRACK-COMPLETE-OWN",
                                    ("test_every_block_of_every_layer_is_published",)),
    "RepublishingPublisher": Mutant(SUITE, "KVCS-PUB-NO-DUP-LOCATION",
                                    ("test_no_two_payloads_at_one_location",
                                     "test_a_late_subscription_is_filled_with_every_object_once",
                                     "test_fetch_returns_the_track_in_ascending_order")),
    "FalselyDeterministicPublisher": Mutant(SUITE, "KVCS-MANIFEST-DETERMINISTIC",
                                            ("test_a_deterministic_claim_holds_across_productions",)),
    "AbsoluteObjectIdPublisher": Mutant(SUITE, "KVCS-OBJ-ID-BLOCK",
                                        ("test_appended_tokens_are_published_as_a_new_segment",
                                         "test_every_object_is_a_block_of_a_layer")),
    "DescendingLayersPublisher": Mutant(SUITE, "KVCS-GROUP-ORDER", ("test_groups_are_published_in_layer_order",)),
    "InterleavedGroupsPublisher": Mutant(SUITE, "KVCS-GROUP-ORDER", ("test_groups_are_published_in_layer_order",)),
    "SubgroupOnePublisher": Mutant(SUITE, "KVCS-GROUP-SUBGROUP-ZERO",
                                   ("test_each_group_is_one_subgroup_0_stream_in_ascending_object_order",)),
    "NoEndOfGroupPublisher": Mutant(SUITE, "KVCS-GROUP-END-OF-GROUP", ("test_end_of_group_after_each_layer",)),
    "NoEndOfTrackPublisher": Mutant(SUITE, "KVCS-GROUP-END-OF-TRACK", ("test_end_of_track_after_the_last_layer",)),
    "EarlyPublishDonePublisher": Mutant(SUITE, "MOQT-SUB-PUBLISH-DONE",
                                        ("test_publish_done_follows_the_streams_it_counts",)),
    "RoundedPriorityPublisher": Mutant(SUITE, "KVCS-OBJ-PRIORITY", ("test_data_priority_is_floor_128_g_over_l",)),
    "UrgentManifestPriorityPublisher": Mutant(SUITE, "KVCS-OBJ-MANIFEST-PRIORITY", ("test_manifest_priority_is_0",)),
    "LateManifestPublisher": Mutant(SUITE, "KVCS-PUB-MANIFEST-FIRST",
                                    ("test_manifest_before_the_first_data_object",)),
    "SparseManifestPublisher": Mutant(SUITE, "KVCS-MANIFEST-CADENCE",
                                      ("test_a_new_manifest_version_at_least_every_8_layers",)),
    "SparseUndigestedManifestPublisher": Mutant(SUITE, "KVCS-MANIFEST-CADENCE",
                                                ("test_a_new_manifest_version_at_least_every_8_layers",)),
    "SilentCompletionPublisher": Mutant(SUITE, "KVCS-MANIFEST-NEW-VERSION-SEGMENT",
                                        ("test_a_new_manifest_version_when_a_segment_is_added_or_completes",)),
    "SkippedVersionGroupsPublisher": Mutant(SUITE, "KVCS-MANIFEST-VERSION-GROUP",
                                            ("test_each_manifest_version_is_object_0_of_the_next_group",)),
    "WrongBlockKeysPublisher": Mutant(SUITE, "KVCS-MANIFEST-BLOCK-KEYS-SHA256",
                                      ("test_manifest_is_consistent_with_the_namespace_and_the_cache",)),
    "NoObjectDigestsPublisher": Mutant(SUITE, "KVCS-MANIFEST-OBJECT-DIGESTS",
                                       ("test_manifest_lists_the_object_digests",)),
    "ForeignKeyPublisher": Mutant(SUITE, "KVCS-MANIFEST-COSE-SIGN",
                                  ("test_signed_manifest_verifies_with_the_producer_key",), SIGNING),
    "TwoManifestTracksPublisher": Mutant(SUITE, "KVCS-MANIFEST-ONE-TRACK", ("test_exactly_one_manifest_track",)),
    "DeliveryTimeoutPublisher": Mutant(SUITE, "KVCS-PUB-NO-DELIVERY-TIMEOUT",
                                       ("test_no_delivery_timeout_on_data_tracks",)),
    "NoCacheDurationPublisher": Mutant(SUITE, "KVCS-PUB-MAX-CACHE-DURATION", ("test_max_cache_duration_is_set",)),
    # (its Token Start is wrong in every object too: the payload check blames KVCS-PAYLOAD-TOKEN-START there)
    "BlockUnitTokenStartPublisher": Mutant(SUITE, "KVCS-EX-PAYLOAD-HEADER", ("test_the_texts_example_header",)),
    "FewStreamsPublisher": Mutant(SUITE, "KVCS-OPS-STREAMS", ("test_enough_unidirectional_streams_are_granted",)),
}

# Checks no publisher mutant is required to fail, and why.
UNMUTATED_CHECKS: dict[str, str] = {}


# issue 11: declared limits

FETCH_LIMIT = ("kvcs.publisher.fetch_limit=2",)


class IgnoredFetchLimitPublisher(KvcsPublisher):
    """KVCS-SEC-FETCH-LIMIT: declares a limit of 2 concurrent fetches (and counts them) but never refuses one, so
    a third starts while two are in progress."""

    def fetch_refused(self, active: int) -> bool:
        return False


class EarlyFetchLimitPublisher(KvcsPublisher):
    """KVCS-SEC-FETCH-LIMIT: refuses a FETCH already at one below its declared limit (>= limit - 1 in progress),
    so the second of a declared 2 is refused with only one in progress."""

    def fetch_refused(self, active: int) -> bool:
        return self.fetch_limit is not None and active >= self.fetch_limit - 1


LIVE_DELAY = ("kvcs.publisher.live_delay_ms=100",)
# Its computation per layer, as declared: 100 ms, 2 s for the 20 layers of the plain case (below the harness's QUIET
# of 3 s, so the publication is still observed); Group 0 then arrives >= 2 s after REQUEST_OK, past 0.1 + 1.5 s.
BATCH_LAYER_SECONDS = 0.1


class BatchedLayersPublisher(KvcsPublisher):
    """KVCS-PUB-LIVE-ASAP: computes every layer of a segment (0.1 s each, as it declares) before it publishes the
    first one, so Group 0 arrives after the whole production instead of after one layer's computation."""

    async def segment_added(self, seg: SegmentLayout) -> None:
        await asyncio.sleep(self.spec.layers * BATCH_LAYER_SECONDS)


MUTANTS.update({
    "BatchedLayersPublisher": Mutant(SUITE, "KVCS-PUB-LIVE-ASAP",
                                     ("test_live_objects_arrive_within_the_declared_layer_time",), LIVE_DELAY),
    "IgnoredFetchLimitPublisher": Mutant(SUITE, "KVCS-SEC-FETCH-LIMIT", ("test_the_declared_fetch_limit_holds",),
                                         FETCH_LIMIT),
    "EarlyFetchLimitPublisher": Mutant(SUITE, "KVCS-SEC-FETCH-LIMIT", ("test_the_declared_fetch_limit_holds",),
                                       FETCH_LIMIT),
})
