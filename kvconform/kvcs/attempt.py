"""One attempt of the reference KVCS consumer: one publication through one relay (manifest, data tracks,
verification, completion; the text's "Consumer Procedures"), as a sans-I/O core (issue 24 item 1).

The asyncio adapter (``kvconform.kvcs.consumer``) opens the requests and keeps each one's ``Delivery`` current;
the core reads them. ``manifest_step(now)`` and ``step(now)`` are one round after any change: they take what
arrived, verify it, emit the layers that became ready and say when the attempt is over; otherwise they return
the deadline of the next wait (the stall bound, or the budget's end if sooner). ``stalled()`` is what a wait that
reached its deadline without a change means.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from kvconform.kvcs import cose
from kvconform.kvcs.attempt_result import Abandon, AttemptResult
from kvconform.kvcs.consume_result import REQ, LayerReady, Rejection, layer_digest
from kvconform.kvcs.errors import KvcsError
from kvconform.kvcs.manifest import Manifest, SegmentEntry, block_keys_sha256, parse_manifest
from kvconform.kvcs.namespace import KvcsNamespace
from kvconform.kvcs.payload import HEADER_LEN
from kvconform.kvcs.track_state import Delivery, Needed, TrackState
from kvconform.kvcs.tracks import MANIFEST_COSE, DataTrack, parse_track_name
from kvconform.moqt.data import ObjectStatus
from kvconform.moqt.structures import Location

if TYPE_CHECKING:
    from kvconform.kvcs.consumer_core import ConsumerCore

__all__ = ["Attempt"]

WAIT_FLOOR = 0.01  # seconds: the shortest wait for a change (a budget nearly spent still looks once more)


class Attempt:
    """Retrieval of one publication through one relay session (see the module docstring)."""

    def __init__(self, consumer: ConsumerCore, relay: str, ns: KvcsNamespace, result: AttemptResult) -> None:
        self.c = consumer
        self.relay = relay
        self.ns = ns
        self.result = result
        self.manifest: Manifest | None = None
        self.manifest_group = -1
        self.manifest_track = MANIFEST_COSE
        self.authenticated = False
        self.manifest_delivery: Delivery | None = None
        self.manifest_processed = 0
        self.broken: str | None = None  # a later manifest version made the publication unusable
        self.tracks: list[TrackState] = []
        self.wanted: list[int] = []
        self.layer_state: dict[int, str] = {}  # "ready" | "lost"

    def reject(self, track: str, group: int, obj: int, reason: str) -> None:
        self.c.rejected.append(Rejection(track, group, obj, reason, self.ns.pub_id.hex(), self.relay))

    def wait_deadline(self, now: float) -> float:
        """When the wait for the next change ends: the stall bound, or the end of the budget if sooner."""
        return now + max(WAIT_FLOOR, min(self.c.options.stall_timeout, self.c.remaining(now)))

    # ---- manifest ---------------------------------------------------------------------------------------

    def take_manifests(self) -> None:
        """Open, parse and check every new manifest version (Object 0 of each new Group)."""
        sub = self.manifest_delivery
        if sub is None:
            return
        new = sub.objects[self.manifest_processed:]
        self.manifest_processed = len(sub.objects)
        name = self.manifest_track.decode()
        for obj in new:
            if obj.end_of_range is not None or obj.status != ObjectStatus.NORMAL or not obj.payload:
                continue
            if obj.location.group <= self.manifest_group:
                continue
            try:
                raw = self.c.open_manifest(self.manifest_track, obj.payload)
                manifest = parse_manifest(raw)
            except (cose.CoseError, KvcsError) as exc:
                self.reject(name, obj.location.group, obj.location.object, f"{exc}")
                self.broken = f"manifest version {obj.location.group}: {exc}"
                continue
            problems = self.c.manifest_problems(manifest, self.ns)
            if problems:
                self.reject(name, obj.location.group, obj.location.object, "; ".join(problems))
                self.broken = f"manifest version {obj.location.group}: {problems[0]}"
                continue
            self.manifest = manifest
            self.manifest_group = obj.location.group
            self.authenticated = self.manifest_track == MANIFEST_COSE and bool(self.c.options.producer_keys)

    # ---- planning ---------------------------------------------------------------------------------------

    def plan(self, manifest: Manifest) -> list[Needed]:
        """The segments whose Block Keys are the consumer's, contiguous from segment 0, and their tracks."""
        keys = self.c.keys
        limit = len(keys) if self.c.options.blocks is None else min(len(keys), self.c.options.blocks)
        out: list[Needed] = []
        for seg in sorted(manifest.segments, key=lambda s: s.segment):
            if seg.first_block >= limit:
                break
            own = keys[seg.first_block:seg.first_block + seg.blocks]
            # A segment longer than the prompt cannot be confirmed (its block_keys_sha256 covers more).
            if len(own) < seg.blocks or block_keys_sha256(own) != seg.block_keys_sha256:
                break
            n = min(seg.blocks, limit - seg.first_block)
            tracks = [parse_track_name(t.encode()) for t in seg.tracks]
            chosen = self.c.select_tracks([t for t in tracks if isinstance(t, DataTrack)])
            if not chosen:
                break
            out += [Needed(seg.segment, t, n) for t in chosen]
        return out

    def segment(self, number: int) -> SegmentEntry:
        assert self.manifest is not None
        seg = self.manifest.segment(number)
        assert seg is not None
        return seg

    def take_objects(self, ts: TrackState) -> None:
        h = ts.delivery
        if h is None:
            return
        if h.refused is not None:
            ts.failed = f"{ts.name}: FETCH refused ({h.refused})"
        new = h.objects[ts.processed:]
        ts.processed = len(h.objects)
        seg = self.segment(ts.needed.segment)
        for obj in new:
            loc = obj.location
            prev = ts.last_on_stream.get(obj.stream_id, Location(0, 0))
            ts.last_on_stream[obj.stream_id] = loc
            if obj.end_of_range is not None:
                ts.gaps.append((prev, loc))  # everything after the previous record, up to this one
                continue
            if obj.status == ObjectStatus.END_OF_GROUP:
                ts.group_end[loc.group] = loc.object
                continue
            if obj.status != ObjectStatus.NORMAL:
                continue
            if loc.group not in self.wanted or loc.object >= ts.needed.blocks:
                ts.excess += 1  # outside what is needed: discarded
                continue
            seen = ts.payloads.get(loc)
            if seen is not None:
                malformed = self.c.duplicate_problem(ts.name, loc, seen, obj.payload)
                if malformed is not None:
                    ts.malformed = malformed
                    self.reject(ts.name, loc.group, loc.object, malformed)
                else:
                    ts.violations.append(f"{ts.name} {loc} delivered twice (used once)")
                continue
            ts.payloads[loc] = obj.payload
            ts.touched.add(loc.group)
            problems = self.c.object_problems(ts.needed, seg, loc, obj.payload)
            if problems:
                reason = "; ".join(problems)
                ts.lost[loc] = reason
                self.reject(ts.name, loc.group, loc.object, reason)
                continue
            ts.data[loc] = obj.payload[HEADER_LEN:]
            ts.digests[loc] = obj.payload[36:HEADER_LEN]

    def evaluate(self) -> bool:
        """Update every wanted layer; emit the newly ready ones. True when none is pending any more."""
        assert self.manifest is not None
        malformed = next((ts.malformed for ts in self.tracks if ts.malformed is not None), None)
        if malformed is not None:
            # Nothing of a malformed track is used, not even layers already reported ready (retracted).
            for layer in self.wanted:
                if self.layer_state.get(layer) != "lost":
                    self.layer_state[layer] = "lost"
                    self.result.layers.pop(layer, None)
                    self.result.reasons[layer] = malformed
            return True
        pending = False
        # A track that can still deliver everything it has not: a layer none of whose Objects came yet
        # is pending on it without looking at each Location (per wake this was layers x blocks).
        all_quiet = all(ts.failed is None and not ts.gaps and not ts.lost and not ts.ended() and not ts.fill_done()
                        for ts in self.tracks)
        for layer in self.wanted:
            if layer in self.layer_state:
                continue
            if all_quiet and not any(layer in ts.touched or layer in ts.group_end for ts in self.tracks):
                pending = True
                continue
            state, reason = self._layer(layer)
            if state == "pending":
                pending = True
            elif state == "lost":
                self.layer_state[layer] = "lost"
                self.result.reasons[layer] = reason
                if not any(Location(layer, o) in ts.lost for ts in self.tracks for o in range(ts.needed.blocks)):
                    self.result.retryable.add(layer)
            else:
                self.layer_state[layer] = "ready"
                ready = self._assemble(layer)
                self.result.layers[layer] = ready
                self.c.emit(ready)
        return not pending

    def _layer(self, layer: int) -> tuple[str, str]:
        pending = False
        for ts in self.tracks:
            if ts.malformed is not None:
                return "lost", ts.malformed
            seg = self.segment(ts.needed.segment)
            for o in range(ts.needed.blocks):
                loc = Location(layer, o)
                if loc in ts.lost:
                    return "lost", ts.lost[loc]
                if loc not in ts.data:
                    why = ts.missing_reason(loc)
                    if why is None and ts.failed is not None:
                        why = ts.failed
                    if why is None:
                        pending = True
                        continue
                    data = self.c.recover_block(ts.needed.track, seg, loc)
                    if data is None:
                        return "lost", why
                    ts.data[loc] = data
                    ts.recovered.add(loc)
                if loc in ts.recovered:
                    continue
                problem = self.c.listed_digest_problem(ts.name, seg, loc, ts.digests[loc], self.authenticated)
                if problem == "pending":
                    if seg.complete and seg.digest_of(ts.name, loc.group, loc.object) is None:
                        reason = (f"{ts.name} {loc}: the complete segment's manifest lists no signed Data Digest for "
                                  f"it [{REQ['digests']}]")
                        ts.lost[loc] = reason
                        self.reject(ts.name, loc.group, loc.object, reason)
                        return "lost", reason
                    pending = True
                elif problem is not None:
                    ts.lost[loc] = problem
                    self.reject(ts.name, loc.group, loc.object, problem)
                    return "lost", problem
        return ("pending", "") if pending else ("ready", "")

    def _assemble(self, layer: int) -> LayerReady:
        blocks: list[bytes] = []
        by_segment: dict[int, list[TrackState]] = {}
        for ts in self.tracks:
            by_segment.setdefault(ts.needed.segment, []).append(ts)
        for _, states in sorted(by_segment.items()):
            for o in range(states[0].needed.blocks):
                loc = Location(layer, o)
                blocks.append(b"".join(ts.data[loc] for ts in sorted(states, key=lambda s: s.needed.track.component)))
        return LayerReady(layer, self.ns.pub_id, self.relay, layer_digest(blocks), tuple(blocks))

    # ---- the attempt's rounds ---------------------------------------------------------------------------------

    def manifest_step(self, now: float) -> float | None:
        """Before the first usable manifest version: None once it is here, else the deadline of the wait for
        the next change; ``Abandon`` when a version is unusable or the budget is spent."""
        self.take_manifests()
        if self.broken is not None:
            raise Abandon(self.broken)
        if self.manifest is not None:
            return None
        if self.c.remaining(now) <= 0:
            raise Abandon("no manifest version arrived")
        return self.wait_deadline(now)

    def prepare(self) -> str | None:
        """With the manifest: what is needed, and how to retrieve it ("live" or "fetch"); None when an earlier
        attempt on the same publication already gave every wanted layer. ``Abandon`` when nothing is usable."""
        manifest = self.manifest
        assert manifest is not None
        self.result.manifest = manifest
        self.wanted = self.c.wanted_layers(manifest.layers)
        needed = self.plan(manifest)
        if not needed or not self.wanted:
            raise Abandon("the manifest lists no segment this consumer can use")
        self.tracks = [TrackState(n) for n in needed]
        self.result.plan = tuple(sorted({(n.segment, n.blocks) for n in needed}))
        have = {layer for a in self.c.attempts if a is not self.result and a.pub == self.ns.pub_id
                and a.plan == self.result.plan for layer in a.layers}
        self.wanted = [layer for layer in self.wanted if layer not in have]  # a retry asks only for the rest
        if not self.wanted:
            self.result.outcome = "complete"
            return None
        mode = self.c.retrieval_mode([self.segment(n.segment).complete for n in needed])
        self.result.mode = mode
        return mode

    def step(self, now: float) -> float | None:
        """One round after a change: None when the attempt is over (its outcome set), else the deadline of the
        wait for the next change; ``Abandon`` when a later manifest version made the publication unusable."""
        self.take_manifests()
        if self.broken is not None:
            for layer in self.wanted:
                self.result.layers.pop(layer, None)  # a publication that turned bad gives nothing
            raise Abandon(self.broken)
        for ts in self.tracks:
            self.take_objects(ts)
        if self.evaluate():
            lost = [layer for layer, s in self.layer_state.items() if s == "lost"]
            self.result.outcome = "complete" if not lost else f"{len(lost)} layers missing or rejected"
            return None
        if self.c.remaining(now) <= 0:
            self.result.outcome = "budget exhausted"
            self.mark_pending("budget exhausted while waiting for it")
            return None
        return self.wait_deadline(now)

    def stalled(self) -> None:
        """The wait reached its deadline without any change: the publication made no progress."""
        stall = self.c.options.stall_timeout
        self.result.outcome = f"stalled ({stall} s without progress)"
        self.mark_pending(f"nothing arrived for {stall} s (stalled)")

    def mark_pending(self, reason: str) -> None:
        for layer in self.wanted:
            if layer not in self.layer_state:
                self.layer_state[layer] = "lost"
                self.result.reasons[layer] = reason  # not retried: waiting again would spend the budget twice
