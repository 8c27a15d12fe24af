"""The sans-I/O core of the reference KVCS consumer (the text's "Consumer Procedures"; issue 24 item 1).

What the consumer decides, with no I/O and no clock: which Anchor Keys it looks for, with which parameters it
subscribes and fetches, how it opens and checks manifests and Objects, which tracks and retrieval mode it uses,
what it may combine, which publication's layers it finally reports, and how much of its budget is left at the
``now`` it is given (``start(now)`` sets the budget's deadline). One attempt (one publication through one relay)
is ``kvconform.kvcs.attempt.Attempt``; the asyncio adapter (``kvconform.kvcs.consumer.Consumer``) connects,
discovers, requests and waits, and passes its loop's clock.

Subclasses (the harness's mutants) override one method per behaviour: ``discovery_anchors``,
``data_subscribe_parameters``, ``manifest_subscribe_parameters``, ``fetch_parameters``, ``open_manifest``,
``manifest_problems``, ``object_problems``, ``listed_digest_problem``, ``recover_block``, ``duplicate_problem``,
``may_combine``, ``remaining``, ``retrieval_mode``, ``select_tracks`` (and the adapter's ``wait_for_change``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from kvconform.kvcs import cose
from kvconform.kvcs.attempt_result import AttemptResult
from kvconform.kvcs.consume_result import REQ, ConsumeResult, ConsumerIdentity, ConsumerOptions, LayerReady, Rejection
from kvconform.kvcs.manifest import Manifest, SegmentEntry, manifest_problems
from kvconform.kvcs.namespace import KvcsNamespace
from kvconform.kvcs.payload import decode_object, verify_object
from kvconform.kvcs.track_state import Needed
from kvconform.kvcs.tracks import MANIFEST, DataTrack
from kvconform.kvsp import KvspError
from kvconform.moqt.data import GroupOrder
from kvconform.moqt.filters import LocationFilter, RangeFilter
from kvconform.moqt.parameters import FillParameters
from kvconform.moqt.structures import Location, ParamType

__all__ = ["ConsumerCore", "cose_payload_unverified"]


class ConsumerCore:
    """The consumer's decisions (see the module docstring). ``on_ready`` is called as each layer is verified."""

    def __init__(self, identity: ConsumerIdentity, options: ConsumerOptions,
                 on_ready: Callable[[LayerReady], None] | None = None) -> None:
        if not options.relays:
            raise ValueError("ConsumerOptions.relays: at least one relay URL")
        self.identity = identity
        self.options = options
        self.on_ready = on_ready
        self.keys = identity.block_keys()
        if not self.keys:
            raise KvspError("tokens: no complete block, so no Anchor Key to look for")
        self.rejected: list[Rejection] = []
        self.attempts: list[AttemptResult] = []
        self._deadline = 0.0
        self._emitted_pub: bytes | None = None

    def start(self, now: float) -> None:
        """The budget runs from ``now``: ``remaining`` reaches 0 at ``now + options.budget``."""
        self._deadline = now + self.options.budget

    # ---- overridable behaviour -------------------------------------------------------------------------

    def remaining(self, now: float) -> float:
        """Seconds left of the budget at ``now`` (never negative): none at the deadline itself."""
        return max(0.0, self._deadline - now)

    def discovery_anchors(self) -> list[bytes]:
        """Anchor Keys to look for, longest prefix first (each shorter one is an earlier key of the chain).
        ``blocks`` limits what is retrieved, not what is looked for: a publication of the whole prompt
        serves its first blocks too. A consumer that distrusts relays looks for its exact prefix only: a
        sequence of shorter prefixes would tell the relay where its prompt diverges from published ones."""
        if self.options.distrust_relays:
            return self.keys[-1:]
        return list(reversed(self.keys))[:self.options.max_prefixes]

    def manifest_subscribe_parameters(self) -> dict[str, Any]:
        """Next Object + FILL_PARAMETERS {Relative Start 1}: the current version on the fill, later ones live."""
        fill = FillParameters.of((ParamType.LOCATION_FILTER, LocationFilter.relative_start(1)),
                                 (ParamType.GROUP_ORDER, GroupOrder.ASCENDING))
        return {"location_filter": LocationFilter.next_object(), "fill": fill}

    def data_subscribe_parameters(self) -> dict[str, Any]:
        """Next Object + FILL_PARAMETERS {Absolute Start {0,0}, GROUP_ORDER Ascending}: every Object once."""
        fill = FillParameters.of((ParamType.LOCATION_FILTER, LocationFilter.absolute_start(0, 0)),
                                 (ParamType.GROUP_ORDER, GroupOrder.ASCENDING))
        return {"location_filter": LocationFilter.next_object(), "fill": fill}

    def fetch_parameters(self, first: int, last: int, blocks: int, segment_blocks: int,
                         peer_max_filter_ranges: int) -> dict[str, Any]:
        """Absolute Start, Group End {first,0} EndGroupDelta last-first, Ascending; OBJECTID_FILTER 0..n-1
        when fewer than all blocks are needed and the peer accepts Range Filters."""
        out: dict[str, Any] = {"location_filter": LocationFilter.absolute_start_group_end(first, 0, last - first),
                               "group_order": GroupOrder.ASCENDING}
        if blocks < segment_blocks and peer_max_filter_ranges > 0:
            out["range_filters"] = (RangeFilter.first_objects(blocks),)
        return out

    def open_manifest(self, track: bytes, payload: bytes) -> bytes:
        """The manifest JSON of one version: "manifest.cose" is verified with the known producer keys (or,
        when none are known, read without verification); "manifest" is the JSON itself."""
        if track == MANIFEST:
            return payload
        if self.options.producer_keys:
            return cose.verify(payload, dict(self.options.producer_keys))
        return cose_payload_unverified(payload)

    def manifest_problems(self, manifest: Manifest, namespace: KvcsNamespace) -> list[str]:
        """Why a manifest version makes the publication unusable (its Compatibility ID first)."""
        return manifest_problems(manifest, namespace, self.identity.profile)

    def object_problems(self, needed: Needed, segment: SegmentEntry, loc: Location, payload: bytes) -> list[str]:
        """The End Subscriber checks, then the header fields this consumer can predict."""
        problems = verify_object(payload, loc.group, loc.object)
        if problems:
            return problems
        header, data = decode_object(payload)
        track = needed.track
        bt = self.identity.block_tokens
        if header.component != track.component_value:
            problems.append(f"Component (offset 5): {header.component}, the track {track} carries "
                            f"{track.component_value} [{REQ['fields']}]")
        try:
            codec = self.identity.profile.codec_value(track.codec)
        except KvspError:
            codec = -1
        if header.codec != codec:
            problems.append(f"Codec (offset 28): {header.codec}, the track {track} names codec {codec} "
                            f"[{REQ['fields']}]")
        if header.token_count != bt:
            problems.append(f"Token Count (offset 24): {header.token_count}, the block size is {bt} [{REQ['fields']}]")
        start = (segment.first_block + loc.object) * bt
        if header.token_start != start:
            problems.append(f"Token Start (offset 16): {header.token_start}, block {segment.first_block + loc.object}"
                            f" starts at token {start} [{REQ['fields']}]")
        if track.codec == "raw":
            want = self.identity.section_octets() * (2 if track.component == "kv" else 1)
            if len(data) != want:
                problems.append(f"Data Length (offset 32): {len(data)} octets, raw {track.component} Data of one "
                                f"block is {want} [{REQ['fields']}]")
        return problems

    def listed_digest_problem(self, track: str, segment: SegmentEntry, loc: Location, digest: bytes,
                              authenticated: bool) -> str | None:
        """None when the Data Digest is the one the manifest lists (or none is listed and authenticity is not
        required); "pending" when authenticity is required and no signed digest is listed yet."""
        listed = segment.digest_of(track, loc.group, loc.object)
        if listed is None:
            if self.options.authenticity:
                return "pending"
            return None
        if listed != digest:
            signed = "signed " if authenticated else ""
            return (f"{track} {loc}: Data Digest {digest.hex()[:16]}.. is not the one the {signed}manifest lists "
                    f"({listed.hex()[:16]}..) [{REQ['digests']}]")
        if self.options.authenticity and not authenticated:
            return "pending"
        return None

    def recover_block(self, track: DataTrack, segment: SegmentEntry, loc: Location) -> bytes | None:
        """Data for an Object that will not arrive, from elsewhere (KVSP over HTTP, recomputation), or None.
        The reference has no such source. Recovered Data is the consumer's own: it is not held against the
        publication's digests (a recomputation need not be bit-identical)."""
        return None

    def duplicate_problem(self, track: str, loc: Location, first: bytes, again: bytes) -> str | None:
        """A Location delivered twice: with a different payload the track is malformed (nothing of it is
        used); an identical repeat is used once."""
        if first == again:
            return None
        return f"{track} {loc}: delivered twice with different payloads: the track is malformed [{REQ['malformed']}]"

    def select_tracks(self, tracks: Sequence[DataTrack]) -> list[DataTrack]:
        """The tracks of one segment to use: its raw "k" and "v" pair, else its raw "kv" track, never a mix
        (none when the segment offers neither)."""
        data = [t for t in tracks if t.codec == "raw"]
        pair = [t for t in data if t.component in ("k", "v")]
        if {t.component for t in pair} == {"k", "v"}:
            return sorted(pair)
        return [t for t in data if t.component == "kv"][:1]

    def retrieval_mode(self, complete: Sequence[bool]) -> str:
        """"fetch" (Retrieval of Completed Caches) when every needed segment (``complete``: one per needed track,
        in plan order) is complete, else "live" (Retrieval during Production); ``options.mode`` overrides."""
        if self.options.mode in ("live", "fetch"):
            return self.options.mode
        return "fetch" if all(complete) else "live"

    def may_combine(self, a: Manifest | None, b: Manifest | None) -> bool:
        """Objects of two publications may share a segment only if both manifests say deterministic."""
        return a is not None and b is not None and a.deterministic and b.deterministic

    # ---- the procedure's decisions ---------------------------------------------------------------------------

    def wanted_layers(self, layers: int) -> list[int]:
        first, last = self.options.layers if self.options.layers is not None else (0, layers - 1)
        return [layer for layer in range(max(0, first), min(last, layers - 1) + 1)]

    def wanted_so_far(self) -> list[int] | None:
        for a in self.attempts:
            if a.manifest is not None:
                return self.wanted_layers(a.manifest.layers)
        return None

    def complete_with(self, pub: bytes) -> bool:
        """This publication already gave every wanted layer (through another relay)."""
        wanted = self.wanted_so_far()
        if wanted is None:
            return False
        got = {layer for a in self.attempts if a.pub == pub for layer in a.layers}
        return set(wanted) <= got

    def emit(self, ready: LayerReady) -> None:
        """A layer is verified: report it (``on_ready``)."""
        if self._emitted_pub is None:
            self._emitted_pub = ready.publication
        self.layer_ready(ready.layer)
        if self.on_ready is not None:
            self.on_ready(ready)

    def layer_ready(self, layer: int) -> None:
        """Where an adapter wakes whoever waits for ``layer`` (the core has no one to wake)."""

    # ---- combining attempts ---------------------------------------------------------------------------------

    def selection(self) -> tuple[AttemptResult | None, dict[int, LayerReady], bool]:
        """The best publication (most verified layers; same publication through several relays counts as
        one), completed from other publications only where ``may_combine`` allows it."""
        by_pub: dict[tuple[bytes, tuple[tuple[int, int], ...]], dict[int, LayerReady]] = {}
        first: dict[tuple[bytes, tuple[tuple[int, int], ...]], AttemptResult] = {}
        for a in self.attempts:
            if a.manifest is None or not a.plan:
                continue
            key = (a.pub, a.plan)
            first.setdefault(key, a)
            merged = by_pub.setdefault(key, {})
            for layer, ready in a.layers.items():
                merged.setdefault(layer, ready)
        if not by_pub:
            return None, {}, False
        best_key = max(by_pub, key=lambda k: len(by_pub[k]))  # ties: the first tried (dicts keep order)
        best = first[best_key]
        layers = dict(by_pub[best_key])
        for key, got in by_pub.items():
            if key == best_key or key[1] != best_key[1] or not self.may_combine(best.manifest, first[key].manifest):
                continue
            for layer, ready in got.items():
                layers.setdefault(layer, ready)
        assert best.manifest is not None
        complete = set(self.wanted_layers(best.manifest.layers)) <= set(layers)
        return best, layers, complete

    def result(self, wanted: list[int] | None, elapsed: float, gave_up: bool) -> ConsumeResult:
        best, layers, _ = self.selection()
        if wanted is None:
            wanted = self.wanted_layers(int(self.identity.compat["layers"]))
        out: dict[int, bytes | None] = {}
        reasons: dict[int, str] = {}
        for layer in wanted:
            ready = layers.get(layer)
            out[layer] = ready.digest if ready is not None else None
            if ready is None:
                why = [a.reasons[layer] for a in self.attempts if layer in a.reasons]
                reasons[layer] = why[-1] if why else ("budget exhausted" if gave_up else "no usable publication")
        pubs = [{"publication": a.pub.hex(), "relay": a.relay, "outcome": a.outcome} for a in self.attempts]
        return ConsumeResult(best.pub if best is not None else None, out, list(self.rejected), pubs,
                             {layer: r.publication for layer, r in layers.items() if layer in out}, reasons,
                             list(best.plan) if best is not None else [], elapsed, gave_up,
                             best.mode if best is not None else None)




def cose_payload_unverified(data: bytes) -> bytes:
    """The payload of a COSE_Sign1 when no producer key is known (authenticity not required)."""
    return cose.unverified_payload(data)
