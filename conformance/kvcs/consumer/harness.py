"""The kvcs-consumer harness: the harness is the publisher AND the relay the consumer under test talks to.

``play(consumer, stage)`` runs, on one event loop of the test's thread:

* one or more ``RecordingRelay`` (the reference caching relay, ``kvconform.moqt.relay.Relay``, or a
  misbehaving subclass) on 127.0.0.1, with a policy granting the subscriber token the subscribe right on
  ("kvcs-1", Scope ID) (and the publisher token the publish right); each records what consumers ask
  (SUBSCRIBE_NAMESPACE prefixes, SUBSCRIBE and FETCH with their parameters);
* harness publishers: ``kvconform.kvcs.publisher.KvcsPublisher`` subclasses that publish the true bytes of
  the test-content convention (``kvconform.kvcs.content``) except where a scenario mutates them
  (``Poison``), drop objects, stop mid-production, lie in the manifest or sign it with the wrong key;
* the consumer under test, on a worker thread (reference / python: targets) or as a process (cmd:),
  bounded by its budget plus ``kvconform.targets.kvcs.consumer.GRACE``.

It returns an ``Outcome``: the consumer's run (result JSON, exit status, time, output), what each relay
recorded, and the Publication IDs. ``expected_digests`` gives the convention's layer digests (the
definition is in ``kvconform.kvcs.consumer``'s docstring). The checks only read Outcomes.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import hashlib
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kvconform import evidence
from kvconform.kvcs.consumer import MAX_RESULT_OCTETS, convention_layer_digest
from kvconform.kvcs.content import CacheSpec
from kvconform.kvcs.cose import ProducerKey, sign
from kvconform.kvcs.errors import KvcsError
from kvconform.kvcs.manifest import Manifest
from kvconform.kvcs.payload import decode_object, encode_raw
from kvconform.kvcs.publisher import KvcsPublisher, Progress
from kvconform.kvcs.publisher_core import TrackOut
from kvconform.kvcs.strictjson import load_json
from kvconform.kvcs.tracks import DataTrack
from kvconform.moqt import client as mc
from kvconform.moqt.craft import raw_fetch_object
from kvconform.moqt.data import FO_OBJECT_ID, EndOfRange, EndOfRangeKind, FetchObject, ObjectStatus
from kvconform.moqt.errors import StreamResetCode
from kvconform.moqt.messages import Fetch, Subscribe, SubscribeNamespace
from kvconform.moqt.policy import policy_from_mapping
from kvconform.moqt.relay import Peer, Relay
from kvconform.moqt.session import Request, Role, SessionConfig
from kvconform.moqt.structures import TrackNamespace
from kvconform.targets.kvcs.consumer import GRACE, ConsumerDriver, ConsumerRun, FetchRequest
from kvconform.targets.moqt import RelayAccess, harness_policy
from kvconform.verdicts import DriverError

__all__ = ["PUBLISHER_TOKEN", "SUBSCRIBER_TOKEN", "Asked", "HarnessPublisher", "Outcome", "Poison",
           "RecordingRelay", "Stage", "expected_digests", "play"]

PUBLISHER_TOKEN = "kvcs-publisher-token"
SUBSCRIBER_TOKEN = "kvcs-consumer-token"
OUTSIDER_TOKEN = "kvcs-outsider-token"
PUBLISH_TIMEOUT = 20.0  # seconds for a harness publisher to announce and publish a small cache
SLACK = 3.0  # seconds past its budget a consumer may take to wrap up and write its result
HOLD_BOUND = 10.0  # seconds a held pass waits for the consumer's first data request


# ---- relays -------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Asked:
    """One request a consumer sent to a harness relay."""

    kind: str  # "SUBSCRIBE_NAMESPACE", "SUBSCRIBE", "FETCH"
    namespace: TrackNamespace
    name: bytes
    parameters: Any  # kvconform.moqt.parameters.Parameters
    at: float = 0.0  # time.monotonic() when the relay received it

    def param(self, ptype: int) -> Any:
        return self.parameters.get(ptype)

    def __str__(self) -> str:
        return f"{self.kind} {self.name.decode('ascii', 'replace') or self.namespace} {self.parameters!r}"


class RecordingRelay(Relay):
    """The reference relay, recording every SUBSCRIBE_NAMESPACE, SUBSCRIBE and FETCH it receives (only
    consumers send those: the harness publishers only announce)."""

    misbehaves: str = ""  # what this relay does wrong (evidence)

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.asked: list[Asked] = []
        self.data_asked = asyncio.Event()  # a consumer asked for a data track (SUBSCRIBE or FETCH)

    def handle_subscribe_namespace(self, peer: Peer, req: Request, msg: SubscribeNamespace) -> None:
        self.asked.append(Asked("SUBSCRIBE_NAMESPACE", msg.track_namespace_prefix, b"", msg.parameters,
                                time.monotonic()))
        super().handle_subscribe_namespace(peer, req, msg)

    def handle_subscribe(self, peer: Peer, req: Request, msg: Subscribe) -> None:
        if not isinstance(msg, Fetch):
            self.asked.append(Asked("SUBSCRIBE", msg.track_namespace, msg.track_name, msg.parameters,
                                    time.monotonic()))
            if _data_track(msg.track_name):
                self.data_asked.set()
        super().handle_subscribe(peer, req, msg)

    def handle_fetch(self, peer: Peer, req: Request, msg: Fetch) -> None:
        self.asked.append(Asked("FETCH", msg.track_namespace, msg.track_name, msg.parameters, time.monotonic()))
        if _data_track(msg.track_name):
            self.data_asked.set()
        super().handle_fetch(peer, req, msg)

    def data_asks(self, kind: str) -> list[Asked]:
        return [a for a in self.asked if a.kind == kind and a.name not in (b"manifest", b"manifest.cose")]


class NoFilterRangesRelay(RecordingRelay):
    """A relay whose SETUP advertises no MAX_FILTER_RANGES (0): it accepts no OBJECTID_FILTER."""

    misbehaves = "MAX_FILTER_RANGES 0"

    def session_config(self) -> SessionConfig:
        return SessionConfig(role=Role.SERVER, implementation="kvconform-harness-relay/0.1", max_filter_ranges=None)


def _data_track(name: bytes) -> bool:
    return name not in (b"manifest", b"manifest.cose")


class GapRelay(RecordingRelay):
    """Serves fills and FETCHes of data tracks without the objects of ``LAYER``: End of Unknown Range
    records stand for them (profile §9.4), as a relay that lost them upstream would."""

    LAYER = 1
    misbehaves = "End of Unknown Range instead of layer 1"

    def fetch_items(self, track: Any, start: Any, end: Any, descending: bool, filters: Any,
                    gap_kind: int) -> list[FetchObject | EndOfRange]:
        items = super().fetch_items(track, start, end, descending, filters, gap_kind)
        if not _data_track(track.name) or descending:
            return items
        out: list[FetchObject | EndOfRange] = []
        dropped: FetchObject | None = None
        for item in items:
            if isinstance(item, FetchObject) and item.group_id == self.LAYER:
                dropped = item
                continue
            if dropped is not None:
                out.append(EndOfRange(EndOfRangeKind.UNKNOWN, dropped.group_id, dropped.object_id))
                dropped = None
            out.append(item)
        if dropped is not None:
            out.append(EndOfRange(EndOfRangeKind.UNKNOWN, dropped.group_id, dropped.object_id))
        return out


class ResetRelay(RecordingRelay):
    """Resets every fill and fetch stream of a data track once it reaches layer ``LAYER`` (section 11.2:
    a reset fill means the objects it did not carry are missing)."""

    LAYER = 1
    misbehaves = "fill/fetch streams of data tracks reset at layer 1"

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._reset_next = False  # set by fetch_items, used by the write that follows it synchronously

    def fetch_items(self, track: Any, start: Any, end: Any, descending: bool, filters: Any,
                    gap_kind: int) -> list[FetchObject | EndOfRange]:
        items = super().fetch_items(track, start, end, descending, filters, gap_kind)
        cut = [i for i in items if i.location.group < self.LAYER]
        self._reset_next = _data_track(track.name) and len(cut) < len(items)
        return cut if self._reset_next else items

    def write_fetch_items(self, peer: Peer, stream_id: int, items: Sequence[FetchObject | EndOfRange]) -> None:
        reset, self._reset_next = self._reset_next, False
        super().write_fetch_items(peer, stream_id, items)
        if reset and peer.session.data_stream_open(stream_id):
            peer.session.reset_data_stream(stream_id, StreamResetCode.INTERNAL_ERROR)


class DuplicatingRelay(RecordingRelay):
    """Serves k.raw.s0 {DUP} twice on fill and fetch streams: first with its Data changed and its Data
    Digest recomputed (per-object checks pass), then the true payload at the same Location (Object ID
    Delta 0): the same Location with two payloads makes the track malformed (profile §9.3)."""

    DUP = (1, 1)
    misbehaves = "k.raw.s0 {1,1} served twice, poisoned copy first"

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._dup_next = False  # set by fetch_items, used by the write that follows it synchronously

    def fetch_items(self, track: Any, start: Any, end: Any, descending: bool, filters: Any,
                    gap_kind: int) -> list[FetchObject | EndOfRange]:
        items = super().fetch_items(track, start, end, descending, filters, gap_kind)
        self._dup_next = track.name == b"k.raw.s0" and not descending
        return items

    def write_fetch_items(self, peer: Peer, stream_id: int, items: Sequence[FetchObject | EndOfRange]) -> None:
        dup, self._dup_next = self._dup_next, False
        for item in items:
            if not peer.session.data_stream_open(stream_id):
                return
            if dup and isinstance(item, FetchObject) and (item.group_id, item.object_id) == self.DUP:
                poisoned = dataclasses.replace(item, payload=Poison("data-rehash").apply(item.payload))
                peer.session.write_fetch_object(stream_id, poisoned)
                # the true payload again at the same Location: Object ID Delta 0, subgroup 0, same priority
                peer.session.send_raw(stream_id, raw_fetch_object(FO_OBJECT_ID, object_delta=0, payload=item.payload))
                continue
            peer.session.write_fetch_object(stream_id, item)


# ---- publishers -------------------------------------------------------------------------------------------


POISON_KINDS = ("data", "data-rehash", "layer", "block", "magic", "version", "truncated", "flags")
ALL_ONES = 0xFFFFFFFF
WRAP16 = 1 << 16  # a value a 16-bit field would read as the true one
# Value classes (issue 11): zero, all-ones, off-by-one, wrapped, "absent" specials, and values that keep the
# other derived quantities right. Each names the header field it breaks.
VALUE_CLASSES: dict[str, Callable[[Any, bytes, bytes], bytes]] = {
    "magic-zero": lambda h, d, p: encode_raw(h.with_(magic=0), d),
    "magic-ones": lambda h, d, p: encode_raw(h.with_(magic=ALL_ONES), d),
    "version-zero": lambda h, d, p: encode_raw(h.with_(version=0), d),
    "version-ones": lambda h, d, p: encode_raw(h.with_(version=0xFF), d),
    "layer-zero": lambda h, d, p: encode_raw(h.with_(layer=0), d),
    "layer-ones": lambda h, d, p: encode_raw(h.with_(layer=ALL_ONES), d),
    "layer-wrap16": lambda h, d, p: encode_raw(h.with_(layer=h.layer + WRAP16), d),
    "block-minus-one": lambda h, d, p: encode_raw(h.with_(block_index=h.block_index - 1), d),
    "block-ones": lambda h, d, p: encode_raw(h.with_(block_index=ALL_ONES), d),
    "block-wrap16": lambda h, d, p: encode_raw(h.with_(block_index=h.block_index + WRAP16), d),
    "length-zero": lambda h, d, p: encode_raw(h.with_(data_length=0), d),
    "length-plus-one": lambda h, d, p: encode_raw(h.with_(data_length=h.data_length + 1), d),
    "length-ones": lambda h, d, p: encode_raw(h.with_(data_length=ALL_ONES), d),
    "extra-octet": lambda h, d, p: p + b"\x00",  # Data Length (and digest) unchanged, one octet more
    "digest-zero": lambda h, d, p: encode_raw(h.with_(digest=bytes(32)), d),
    "digest-ones": lambda h, d, p: encode_raw(h.with_(digest=b"\xff" * 32), d),
    # self-consistent (Data Length and Data Digest follow), but the Data is not one raw section
    "data-grown": lambda h, d, p: encode_raw(h.with_(data_length=len(d) + 1,
                                                     digest=hashlib.sha256(d + b"\x00").digest()), d + b"\x00"),
}


@dataclass(frozen=True)
class Poison:
    """A mutation of one object's payload. ``data``: a Data byte flipped, the Data Digest left (mismatch);
    ``data-rehash``: a Data byte flipped and the digest recomputed (only a signed object_digests list catches
    it); ``layer`` / ``block``: the Layer / Block Index field off by one; ``magic`` / ``version``: wrong;
    ``truncated``: the last Data octet cut (Data Length unchanged); ``flags``: Flags 0x8001 (must be ignored);
    or one of ``VALUE_CLASSES``."""

    kind: str
    track: str = "k.raw.s0"
    layer: int = 1
    object: int = 1

    def apply(self, payload: bytes) -> bytes:
        header, data = decode_object(payload)
        if self.kind in VALUE_CLASSES:
            return VALUE_CLASSES[self.kind](header, data, payload)
        if self.kind == "data":
            return encode_raw(header, _flip(data))
        if self.kind == "data-rehash":
            bad = _flip(data)
            return encode_raw(header.with_(digest=hashlib.sha256(bad).digest()), bad)
        if self.kind == "layer":
            return encode_raw(header.with_(layer=header.layer + 1), data)
        if self.kind == "block":
            return encode_raw(header.with_(block_index=header.block_index + 1), data)
        if self.kind == "magic":
            return encode_raw(header.with_(magic=0x4B564F32), data)
        if self.kind == "version":
            return encode_raw(header.with_(version=2), data)
        if self.kind == "truncated":
            return payload[:-1]
        if self.kind == "flags":
            return encode_raw(header.with_(flags=0x8001), data)
        raise ValueError(f"Poison kind {self.kind!r}: expected one of {POISON_KINDS} or {sorted(VALUE_CLASSES)}")


def _flip(data: bytes) -> bytes:
    return data[:len(data) // 2] + bytes([data[len(data) // 2] ^ 0x5A]) + data[len(data) // 2 + 1:]


class HarnessPublisher(KvcsPublisher):
    """The reference publisher with the scenario's deviations (each off by default):

    ``poisons``: payload mutations; ``skip_layers``: layers whose objects are never sent (End of Group and
    the manifest's digests still are); ``stop_after``: publish layers below it, then nothing more (no End of
    Track, no final manifest: production stalls); ``other_compat``: every manifest's "compat" describes
    another model; ``forge_with``: sign manifest.cose with this key (same kid, wrong key);
    ``no_digests``: manifests without object_digests (a SHOULD), so only per-object checks apply;
    ``pause``: seconds live delivery stalls, after the first layer completed once the consumer has asked the
    relay for data (so the stall always falls inside its subscription), then resumes (``paused_after``: that
    (segment, layer)); ``slow_until_asked``: seconds per layer until the consumer has asked for data (time for a
    spawned consumer to start while production goes on), ``layer_interval`` after;
    ``hold``: a segment (a later pass of chunked prefill) that, once the manifest lists it, produces nothing
    until the consumer asks the relay for data (bounded by HOLD_BOUND); the scenario starts the consumer then
    (``Stage.live_after`` must be set).
    ``times`` records when (time.monotonic()) each layer ("layer s/l"), segment ("segment s") and the whole
    publication ("done") was published, and when the pause began ("pause"). A publication the scenario starts
    the consumer on gets ``release``, set by the relay when the consumer asks for data."""

    def __init__(self, spec: CacheSpec, *, poisons: Sequence[Poison] = (), skip_layers: Sequence[int] = (),
                 stop_after: int | None = None, other_compat: bool = False, forge_with: ProducerKey | None = None,
                 no_digests: bool = False, pause: float | None = None, hold: int | None = None,
                 slow_until_asked: float | None = None, **options: Any) -> None:
        super().__init__(spec, **options)
        self.pause = pause
        self.paused_after: tuple[int, int] | None = None
        self.slow_until_asked = slow_until_asked
        self.hold = hold
        self.held: asyncio.Event | None = None  # set by the publisher when the hold begins
        self.release: asyncio.Event | None = None  # set by the relay when the consumer asks for data
        self.times: dict[str, float] = {}
        self._interval = self.layer_interval
        self.poisons = tuple(poisons)
        self.skip_layers = frozenset(skip_layers)
        self.stop_after = stop_after
        self.other_compat = other_compat
        self.forge_with = forge_with
        self.no_digests = no_digests
        self.stalled = asyncio.Event()

    async def segment_added(self, seg: Any) -> None:
        if seg.segment != self.hold or self.held is None or self.release is None:
            return
        self.times["hold"] = time.monotonic()
        self.held.set()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.release.wait(), HOLD_BOUND)
        self.times["release"] = time.monotonic()

    def _report(self, progress: Progress) -> None:
        # The publisher sleeps layer_interval after reporting a layer: the pause is that sleep made longer.
        now = time.monotonic()
        key = {"layer": f"layer {progress.segment}/{progress.layer}", "segment": f"segment {progress.segment}",
               "done": "done"}.get(progress.kind)
        if key is not None:
            self.times.setdefault(key, now)
        asked = self.release is not None and self.release.is_set()
        self.layer_interval = self._interval if asked or self.slow_until_asked is None else self.slow_until_asked
        if self.pause is not None and progress.kind == "layer" and self.paused_after is None and asked:
            self.layer_interval = self.pause
            self.paused_after = (progress.segment, progress.layer)
            self.times["pause"] = now
        super()._report(progress)

    def object_payload(self, track: DataTrack, layer: int, object_id: int) -> bytes:
        payload = super().object_payload(track, layer, object_id)
        for p in self.poisons:
            if p.track == str(track) and p.layer == layer and p.object == object_id:
                payload = p.apply(payload)
        return payload

    def publish_layer(self, local: Any, track: DataTrack, layer: int, blocks: int) -> None:
        if layer in self.skip_layers:
            local.publish_object(layer, blocks, subgroup=0, priority=self.priority(layer),
                                 status=ObjectStatus.END_OF_GROUP)
            return
        super().publish_layer(local, track, layer, blocks)

    def build_manifest(self) -> Manifest:
        manifest = super().build_manifest()
        if self.other_compat:
            manifest = dataclasses.replace(manifest, compat={**manifest.compat, "model": "some-other-model"})
        if self.no_digests:
            manifest = dataclasses.replace(manifest, segments=tuple(dataclasses.replace(s, object_digests=None)
                                                                    for s in manifest.segments))
        return manifest

    def manifest_payload(self, manifest: Manifest) -> bytes:
        if self.forge_with is not None:
            return sign(manifest.to_json(), self.forge_with)
        return super().manifest_payload(manifest)

    def layer_order(self) -> Sequence[int]:
        # Production that stalls: layers below stop_after, then silence (no End of Track, see end_track).
        layers = super().layer_order()
        return layers if self.stop_after is None else [g for g in layers if g < self.stop_after]

    def end_track(self, local: TrackOut) -> None:
        if self.stop_after is None:
            super().end_track(local)


# ---- scenarios ---------------------------------------------------------------------------------------------


@dataclass
class Stage:
    """A scenario: the cache, the relays (classes), the publications (publisher, relay indices), and the
    retrieval the consumer is asked for. ``live_after``: start the consumer once the first publication
    has published that many layers (it keeps publishing meanwhile), or, when it holds a pass
    (``HarnessPublisher.hold``), once the hold begins; None = after everything is published."""

    spec: CacheSpec
    publications: list[tuple[KvcsPublisher, tuple[int, ...]]]
    relays: tuple[type[RecordingRelay], ...] = (RecordingRelay,)
    layers: tuple[int, int] | None = None
    blocks: int | None = None
    producer_keys: dict[str, str] = field(default_factory=dict)  # kid -> public PEM
    live_after: int | None = None
    relays_given: tuple[int, ...] = (0,)  # which relays the consumer is told about, in order
    distrust_relays: bool = False  # the consumer declares it distrusts relays (in-process ones are started so)


@dataclass
class Outcome:
    """What happened: the consumer's run, the relays' records, the publications."""

    run: ConsumerRun
    asked: list[list[Asked]]  # per relay
    pub_ids: list[bytes]
    budget: float
    budget_known: bool = True  # False: the consumer was told no budget and declares none (nothing to hold it to)
    started: float = 0.0  # time.monotonic() when the consumer was started (the clock of Asked.at and times)

    @property
    def ended(self) -> float:
        return self.started + self.run.elapsed

    @property
    def result(self) -> Any:
        return self.run.result

    def require_result(self) -> Any:
        """The parsed result. A consumer that gave none the harness can read (it crashed, wrote no result file,
        or one whose field is off: the error names it) misbehaved: DriverError, a fail of the check that needed
        it, blamed on that check's first requirement."""
        if self.run.result is None:
            raise DriverError(f"the consumer produced no result the harness can read: {self.run.error} (exit "
                              f"{self.run.code}, {self.run.elapsed:.1f} s)\nstderr: {self.run.stderr[-1500:]}")
        return self.run.result


def _result_evidence(out: Path) -> Any:
    """The consumer's result JSON as evidence; its octets when they do not parse (the run's error says why)."""
    if not out.exists():
        return None
    data = out.read_bytes()
    try:
        return load_json(data, what="consumer result", requirement="", max_octets=MAX_RESULT_OCTETS)
    except KvcsError:
        return data[:2000].decode("utf-8", "replace")


def expected_digests(spec: CacheSpec, layers: Sequence[int], blocks: int | None = None) -> dict[int, bytes]:
    """The convention's layer digests of what a consumer with the spec's tokens should assemble: every
    segment (the consumer's Block Keys cover them all), the first ``blocks`` blocks when given."""
    plan: list[tuple[int, int]] = []
    left = blocks if blocks is not None else sum(s.blocks for s in spec.segment_layout())
    for seg in spec.segment_layout():
        if left <= 0:
            break
        plan.append((seg.segment, min(seg.blocks, left)))
        left -= seg.blocks
    return {layer: convention_layer_digest(spec, layer, plan) for layer in layers}


def poisoned_layers_reported_good(outcome: Outcome, spec: CacheSpec, blocks: int | None = None) -> list[str]:
    """Every layer the consumer reports as assembled must carry the convention's digest: anything else is
    poisoned (or mixed) content reported as good (each entry says which layer)."""
    result = outcome.require_result()
    want = expected_digests(spec, [layer for layer in sorted(result.layers) if 0 <= layer < spec.layers], blocks)
    return [f"layer {layer}: reported digest {d.hex()[:16]}.. is not the true content's "
            f"{want[layer].hex()[:16] + '..' if layer in want else '(no such layer)'}"
            for layer, d in sorted(result.layers.items()) if d is not None and d != want.get(layer)]


async def _start_relays(stage: Stage, tokens: bool) -> list[RecordingRelay]:
    prefix = TrackNamespace((b"kvcs-1", stage.spec.scope_id))
    doc = harness_policy(RelayAccess(tokens, prefix, {"publisher": PUBLISHER_TOKEN.encode(),
                                                      "subscriber": SUBSCRIBER_TOKEN.encode(),
                                                      "outsider": OUTSIDER_TOKEN.encode()}))
    policy = policy_from_mapping(doc, "kvcs-consumer harness")
    relays: list[RecordingRelay] = []
    for cls in stage.relays:
        relay = cls(policy=policy, host="127.0.0.1", port=0)
        await relay.start()
        relays.append(relay)
    return relays


async def play(driver: ConsumerDriver, stage: Stage, tmp: Path, budget: float) -> Outcome:
    """Run the scenario (see the module docstring); every wait is bounded."""
    tokens = driver.supports("token")
    spec_path = stage.spec.write_json(tmp / "cache.json")
    key_files: dict[str, Path] = {}
    for kid, pem in stage.producer_keys.items():
        key_files[kid] = tmp / f"producer-{kid}.pem"
        key_files[kid].write_text(pem, "utf-8")
    relays = await _start_relays(stage, tokens)
    clients: list[mc.MoqtClient] = []
    tasks: list[asyncio.Task[None]] = []
    try:
        live = asyncio.Event()
        for n, (pub, where) in enumerate(stage.publications):
            for i in where:
                config = SessionConfig(role=Role.CLIENT, implementation="kvconform-harness-publisher/0.1")
                client = await mc.connect(relays[i].url, config=config, timeout=5.0)
                clients.append(client)
                progress: Callable[[Progress], None] | None = None
                if n == 0 and isinstance(pub, HarnessPublisher):
                    pub.release = relays[i].data_asked  # a held pass goes on, a pause begins, once it is asked
                if n == 0 and isinstance(pub, HarnessPublisher) and pub.hold is not None:
                    pub.held = live
                elif n == 0 and stage.live_after is not None:
                    def progress(p: Progress, after: int = stage.live_after) -> None:
                        if p.kind == "layer" and p.layer + 1 >= after:
                            live.set()
                coro = pub.publish(client, PUBLISHER_TOKEN.encode(), on_progress=progress, timeout=5.0)
                if stage.live_after is None:
                    await asyncio.wait_for(coro, PUBLISH_TIMEOUT)
                else:
                    tasks.append(asyncio.ensure_future(coro))
        if stage.live_after is not None:
            await asyncio.wait_for(live.wait(), PUBLISH_TIMEOUT)
        evidence.record("note", "stage", {
            "relays": [f"{r.url} {type(r).__name__} {r.misbehaves}" for r in relays],
            "publications": [f"{p.namespace.pub_id.hex()} {type(p).__name__} via {list(w)}"
                             for p, w in stage.publications]})
        request = FetchRequest(tuple(relays[i].url for i in stage.relays_given), spec_path, budget,
                               SUBSCRIBER_TOKEN if tokens else None, stage.layers, stage.blocks, key_files,
                               distrust_relays=stage.distrust_relays)
        out = tmp / "result.json"
        started = time.monotonic()
        run = await asyncio.wait_for(asyncio.to_thread(driver.fetch, request, out), budget + GRACE + 15.0)
        refusals = [line for r in relays for line in r.alpn_refusals]
        if refusals and not any(r.asked for r in relays):
            # A consumer of another draft: the relays' TLS refused it, so there is nothing else to judge.
            raise DriverError(f"the consumer's QUIC handshake was refused {len(refusals)} time(s): {refusals[0]}",
                              requirement="MOQT-SETUP-ALPN")
        if tasks:  # let a live production finish (bounded) so its times are known even if the consumer left early
            await asyncio.wait(tasks, timeout=PUBLISH_TIMEOUT)
        evidence.record("received", "consumer run", {
            "code": run.code, "elapsed": round(run.elapsed, 3), "error": run.error, "killed": run.killed,
            "stdout": run.stdout[-2000:], "stderr": run.stderr[-2000:],
            "result": _result_evidence(out)})
        for r in relays:
            evidence.record("note", "relay record", {"relay": r.url, "asked": [str(a)[:300] for a in r.asked]})
        return Outcome(run, [list(r.asked) for r in relays], [p.namespace.pub_id for p, _ in stage.publications],
                       budget, started=started)
    finally:
        for t in tasks:
            t.cancel()
        for client in clients:
            with contextlib.suppress(Exception):
                await client.close(timeout=0.2)
        for r in relays:
            with contextlib.suppress(Exception):
                await r.close(2.0)
