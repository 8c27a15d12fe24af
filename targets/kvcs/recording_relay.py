"""The kvcs-publisher harness: the harness IS the relay the publisher under test publishes to.

``observe(case, driver, seed)`` writes the case's cache spec, runs a ``RecordingRelay`` (the reference caching relay,
``kvconform.moqt.relay.Relay``, recording every event of its sessions) on 127.0.0.1 with a policy that grants
the publisher token the publish right on ("kvcs-1", Scope ID) only, starts the publisher pointing at it, and:

1. when the publisher's PUBLISH_NAMESPACE arrives under the case's content prefix, the relay SUBSCRIBEs
   (Next Object) to every track the spec implies (manifest, manifest.cose, k/v/kv of every segment) *before*
   it answers REQUEST_OK, so a publisher that waits for the answer is observed live from its first object
   (subgroup headers, priorities, status objects, FIN); tracks a later manifest names are subscribed then;
2. it waits (bounded) until every data track ended (End of Track or PUBLISH_DONE) and a manifest marks every
   segment complete, or until nothing new arrived for ``QUIET`` seconds, or ``PUBLISH_TIMEOUT``;
3. it probes the publisher as a relay filling a late subscriber would: per track a SUBSCRIBE Next Object +
   FILL_PARAMETERS (data: Absolute Start {0,0}, Ascending; manifest: Relative Start 1) and per data track a
   FETCH of everything (Ascending), all recorded;
4. it stops the publisher (bounded) and returns an ``Observation``: everything recorded, as plain data.

The checks (test_*.py beside this file) only read Observations.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import cbor2

from kvconform.kvcs.content import CacheSpec, example_spec
from kvconform.kvcs.cose import CoseError, ProducerKey, verify
from kvconform.kvcs.errors import KvcsError
from kvconform.kvcs.manifest import Manifest, parse_manifest
from kvconform.kvcs.namespace import KvcsNamespace
from kvconform.kvcs.tracks import MANIFEST, MANIFEST_COSE, DataTrack, parse_track_name
from kvconform.moqt.data import FetchObject, GroupOrder, ObjectStatus, SubgroupHeader, SubgroupObject
from kvconform.moqt.errors import SessionError
from kvconform.moqt.filters import LocationFilter
from kvconform.moqt.messages import FetchOk, PublishDone, PublishNamespace, RequestError, SubscribeOk
from kvconform.moqt.parameters import FillParameters, Parameters
from kvconform.moqt.policy import Right, TokenKey, policy_from_mapping
from kvconform.moqt.quic import LoopThread, granting_stream_data_uni
from kvconform.moqt.relay import Peer, Relay, Upstream, _Refusal
from kvconform.moqt.sendorder import PacketTap, SendOrder
from kvconform.moqt.session import (
    DataStreamEnded,
    DataStreamOpened,
    Event,
    MessageReceived,
    ObjectReceived,
    Request,
    RequestReceived,
    RequestState,
    SetupReceived,
)
from kvconform.moqt.structures import KeyValuePair, Location, ParamType, TrackNamespace
from kvconform.targets.kvcs.publisher import PublisherDriver, PublisherExit
from kvconform.targets.kvcs.send_schedule import SendSchedule, ShowsSchedule
from kvconform.verdicts import DriverError, Findings, inconclusive

__all__ = ["CASES", "PARSE_ERRORS", "PUBLISH_TIMEOUT", "Announce", "Answer", "Case", "Observation", "PublisherRun",
           "RecordingRelay", "Seen", "findings", "need_live", "need_publication", "observe", "publishing",
           "readable_manifests",
           "track_name"]

# What decoding what a target sent may raise: KvcsError / CoseError (the parsers' own, naming the field and the
# requirement) and, from a parser not yet hardened against it, the built-in errors hostile input provokes (deep
# nesting, huge integers, wrong types). Each is a recorded decode failure of the target's data, never a crash
# of the scenario.
PARSE_ERRORS: tuple[type[Exception], ...] = (KvcsError, CoseError, ValueError, TypeError, RecursionError,
                                             OverflowError, IndexError, KeyError)

PUBLISH_TIMEOUT = 40.0  # seconds from start until the whole publication must have been seen
ANNOUNCE_TIMEOUT = 15.0  # seconds until the PUBLISH_NAMESPACE must have arrived
QUIET = 3.0  # seconds without any new event after which the harness stops waiting
PROBE_TIMEOUT = 15.0  # seconds for all probe requests together
STEP = 0.25  # seconds of one bounded wait for relay events (the sync side re-checks the driver then)
SUBSCRIBE_TIMEOUT = 5.0  # seconds the relay waits for its upstream SUBSCRIBE_OKs before it answers REQUEST_OK


# ---- cases -----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Case:
    """One publication the suite asks for: a small geometry chosen to expose bugs (see ``CASES``)."""

    name: str
    layers: int
    blocks: int
    segments: tuple[int, ...] = ()
    signing: str | None = None  # "ES256" | "EdDSA": the spec carries a producer key
    tail_tokens: int = 0

    def spec(self, seed: int) -> tuple[CacheSpec, dict[bytes, str]]:
        """The cache spec and the producer public keys by kid (empty without signing)."""
        signing: dict[str, str] | None = None
        keys: dict[bytes, str] = {}
        if self.signing is not None:
            kid = f"kvconform-producer-{seed % 10**6}"
            key = ProducerKey.generate(self.signing, kid.encode())
            signing = {"alg": self.signing, "kid": kid, "private_pem": key.private_pem()}
            keys[kid.encode()] = key.public_pem()
        spec = example_spec(layers=self.layers, blocks=self.blocks, block_tokens=4, kv_heads=2, head_dim=8,
                            segments=self.segments, seed=seed, tail_tokens=self.tail_tokens, signing=signing)
        return spec, keys


# 20 layers: floor, round and ceil of 128*g/20 differ (g=1: 6, 6, 7; g=2: 12, 13, 13) and 20 completed layers
# span three manifest cadences (8, 16, 20). The segmented case appends a second segment (two passes) and ends in
# an incomplete block that must not be published; the signed case uses 9 layers (one more than a cadence).
CASES: dict[str, Case] = {
    "plain": Case("plain", layers=20, blocks=3),
    "segmented": Case("segmented", layers=10, blocks=2, segments=(12,), tail_tokens=2),
    "signed": Case("signed", layers=9, blocks=2, signing="EdDSA"),
}


# ---- what is recorded ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Seen:
    """One object (or status object) the publisher sent, as the relay received it.

    ``via``: "live" (the relay's own subscription, opened before REQUEST_OK), "fill" (a probe's fill fetch
    stream), "fetch" (a probe FETCH) or "probe" (subscription delivery on a probe). ``priority`` is the
    Publisher Priority the object carries (None: the header's DEFAULT_PRIORITY, the track default applies)."""

    seq: int
    track: bytes
    via: str
    stream_id: int
    location: Location
    status: int
    payload: bytes
    subgroup: int | None
    priority: int | None
    properties: bytes
    header_flags: int | None = None  # SUBGROUP_HEADER Type Flags (subgroup streams)
    at: float = 0.0  # time.monotonic() when the relay received it


@dataclass
class Answer:
    """One request the relay sent the publisher and what came back."""

    track: bytes
    kind: str  # "subscribe" (the relay's live one), "probe-subscribe", "probe-fetch"
    stream_id: int
    seq: int
    ok: bool | None = None  # None: no answer
    error_code: int | None = None
    largest: Location | None = None
    track_properties: tuple[KeyValuePair, ...] = ()
    end_of_track: bool | None = None  # FETCH_OK
    end_location: Location | None = None  # FETCH_OK
    done: PublishDone | None = None
    data_streams: dict[int, str] = field(default_factory=dict)  # stream id -> "open" | "fin" | "reset 0x.."


@dataclass(frozen=True)
class Announce:
    """A PUBLISH_NAMESPACE the publisher sent."""

    seq: int
    namespace: TrackNamespace
    tokens: tuple[TokenKey, ...]  # AUTHORIZATION_TOKEN parameters, resolved
    setup_tokens: tuple[TokenKey, ...]  # the session's SETUP tokens
    allowed: bool
    reason: str


@dataclass
class Observation:
    """Everything the harness saw of one publication (see the module docstring)."""

    case: Case
    spec: CacheSpec
    token: bytes
    public_keys: dict[bytes, str]
    announces: list[Announce]
    objects: list[Seen]
    answers: list[Answer]
    complete: bool  # the harness saw every data track end and a manifest marking every segment complete
    waited: float
    exit: PublisherExit
    notes: list[str]
    # initial_max_streams_uni the publisher's QUIC endpoint granted the relay (0: absent; None: unreadable)
    granted_streams_uni: int | None = None
    # the order the publisher sent its stream frames in (QUIC packet numbers; None: not recorded)
    send_order: SendOrder | None = None
    # time.monotonic() when the relay answered the publisher's PUBLISH_NAMESPACE with REQUEST_OK (None: never)
    accepted_at: float | None = None
    # the publisher's own order of writes (an in-process publisher's session tap; None: not visible)
    schedule: SendSchedule | None = None

    # -- derived views --------------------------------------------------------------------------------

    @property
    def namespace(self) -> KvcsNamespace | None:
        """The accepted five-field namespace, if a well-formed one was announced and authorized."""
        for a in self.announces:
            if a.allowed:
                with contextlib.suppress(KvcsError):
                    return KvcsNamespace.parse(a.namespace)
        return None

    def offered(self, name: bytes) -> bool:
        """Did the publisher answer a SUBSCRIBE or FETCH for this track with OK?"""
        return any(a.ok for a in self.answers if a.track == name)

    @property
    def manifest_track(self) -> bytes | None:
        found = [n for n in (MANIFEST, MANIFEST_COSE) if self.offered(n)]
        return found[0] if len(found) == 1 else None

    def data_tracks(self) -> list[DataTrack]:
        """Every data track the publisher served, ordered (segment, component)."""
        names = {a.track for a in self.answers if a.ok}
        tracks = []
        for name in names:
            with contextlib.suppress(KvcsError):
                parsed = parse_track_name(name)
                if isinstance(parsed, DataTrack):
                    tracks.append(parsed)
        return sorted(tracks, key=lambda t: (t.segment, t.component))

    def expected_tracks(self, kv: bool = False) -> list[DataTrack]:
        """The data tracks the cache must be published on: k and v of every segment (kv when declared or
        offered)."""
        kv = kv or any(t.component == "kv" for t in self.data_tracks())
        return [t for s in self.spec.segment_layout() for t in self.spec.data_tracks(s.segment, kv=kv)]

    def of(self, track: bytes, *vias: str) -> list[Seen]:
        return [o for o in self.objects if o.track == track and (not vias or o.via in vias)]

    def live(self, track: bytes) -> list[Seen]:
        return self.of(track, "live")

    def live_any(self) -> bool:
        return any(o.via == "live" for o in self.objects)

    def answers_for(self, track: bytes, kind: str | None = None) -> list[Answer]:
        return [a for a in self.answers if a.track == track and (kind is None or a.kind == kind)]

    def manifest_versions(self) -> list[tuple[Seen, Manifest | None, str]]:
        """Each manifest object seen (live first, then probes), by Group: (object, parsed manifest or None,
        the problem when it does not parse or verify)."""
        name = self.manifest_track
        if name is None:
            return []
        by_group: dict[int, Seen] = {}
        for o in sorted(self.of(name), key=lambda o: (o.via != "live", o.seq)):
            if o.status == ObjectStatus.NORMAL:
                by_group.setdefault(o.location.group, o)
        out: list[tuple[Seen, Manifest | None, str]] = []
        for group in sorted(by_group):
            o = by_group[group]
            manifest, problem = self.decode_manifest(name, o.payload)
            out.append((o, manifest, problem))
        return out

    def decode_manifest(self, name: bytes, payload: bytes) -> tuple[Manifest | None, str]:
        try:
            body = payload
            if name == MANIFEST_COSE:
                body = verify(payload, self.public_keys)
            return parse_manifest(body), ""
        except PARSE_ERRORS as exc:
            return None, _parse_failure(exc)

    def expected_payload(self, track: DataTrack, location: Location) -> bytes | None:
        try:
            return self.spec.object_payload(track, location.group, location.object)
        except KvcsError:
            return None

    def summary(self) -> dict[str, Any]:
        """What the evidence keeps of this observation."""
        per_track: dict[str, dict[str, int]] = {}
        for o in self.objects:
            counts = per_track.setdefault(o.track.decode("ascii", "replace"), {})
            counts[o.via] = counts.get(o.via, 0) + 1
        return {"case": self.case.name, "complete": self.complete, "waited_s": round(self.waited, 2),
                "namespace": str(self.namespace), "announces": [str(a.namespace) for a in self.announces],
                "objects": per_track, "answers": [(a.track.decode("ascii", "replace"), a.kind, a.ok, a.error_code)
                                                  for a in self.answers],
                "publisher_exit": self.exit.code, "publisher_stdout": self.exit.stdout[-800:],
                "publisher_stderr": self.exit.stderr[-800:], "notes": self.notes}


def _parse_failure(exc: Exception) -> str:
    """A decode failure as the checks report it: the parser's own message, or the error a hostile input provoked
    in a parser not hardened against it (a RecursionError's text is the whole story otherwise)."""
    if isinstance(exc, KvcsError | CoseError):
        return str(exc)
    return f"does not decode as a manifest ({type(exc).__name__}: {str(exc)[:200]})"


# ---- the recording relay ------------------------------------------------------------------------------


class RecordingRelay(Relay):
    """The reference relay, recording everything its sessions send it, subscribing ahead of REQUEST_OK."""

    def __init__(self, *, content_prefix: TrackNamespace, track_names: list[bytes], **options: Any) -> None:
        super().__init__(**options)
        self.content_prefix = content_prefix
        self.track_names = list(track_names)
        self.announces: list[Announce] = []
        self.objects: list[Seen] = []
        self.answers: dict[int, Answer] = {}  # request stream id -> answer (the publisher's session)
        self.headers: dict[int, SubgroupHeader] = {}
        self.source: Peer | None = None  # the publisher's session once its namespace was accepted
        self.source_ns: TrackNamespace | None = None
        self.seq = 0
        self.last_change = time.monotonic()
        self.changed: asyncio.Event | None = None
        self.probe_kinds: dict[int, str] = {}
        self.granted_streams_uni: dict[int, int | None] = {}  # peer number -> its initial_max_streams_uni
        self.taps: dict[int, PacketTap] = {}  # peer number -> what its packets carried, in send order
        self.accepted_at: float | None = None  # when the source's PUBLISH_NAMESPACE got REQUEST_OK

    # -- recording ------------------------------------------------------------------------------------

    async def _serve_peer(self, conn: Any) -> None:
        tap = PacketTap()
        tap.attach(conn._protocol._quic)  # before its first request: every 1-RTT packet after the handshake
        self.taps[self._numbers + 1] = tap  # the number Relay._serve_peer gives this peer
        await super()._serve_peer(conn)

    def _tick(self) -> int:
        self.seq += 1
        self.last_change = time.monotonic()
        if self.changed is not None:
            self.changed.set()
        return self.seq

    def dispatch(self, peer: Peer, event: Event) -> None:
        with contextlib.suppress(Exception):  # recording must never take the relay down
            self._record(peer, event)
        super().dispatch(peer, event)

    def _answer(self, req: Request | None) -> Answer | None:
        return self.answers.get(req.stream_id) if req is not None and req.local else None

    def _record(self, peer: Peer, event: Event) -> None:
        if isinstance(event, SetupReceived):  # the QUIC handshake is done: the peer's grant is known
            params = peer.conn.peer_transport_parameters
            self.granted_streams_uni[peer.number] = None if params is None else params.initial_max_streams_uni or 0
        if isinstance(event, SetupReceived | RequestReceived):
            self._tick()
            return
        if isinstance(event, MessageReceived):
            ans = self._answer(event.request)
            msg = event.message
            if ans is None:
                return
            self._tick()
            if isinstance(msg, SubscribeOk):
                ans.ok, ans.largest, ans.track_properties = True, msg.largest_object, msg.track_properties
            elif isinstance(msg, FetchOk):
                ans.ok, ans.end_of_track, ans.end_location = True, bool(msg.end_of_track), msg.end_location
                ans.track_properties = msg.track_properties
            elif isinstance(msg, RequestError):
                ans.ok, ans.error_code = False, msg.error_code
            elif isinstance(msg, PublishDone):
                ans.done = msg
            return
        if isinstance(event, DataStreamOpened):
            ans = self._answer(event.request)
            if ans is not None:
                ans.data_streams[event.stream_id] = "open"
                if isinstance(event.header, SubgroupHeader):
                    self.headers[event.stream_id] = event.header
            self._tick()
        elif isinstance(event, ObjectReceived):
            ans = self._answer(event.request)
            if ans is None:
                return
            self._record_object(ans, event)
        elif isinstance(event, DataStreamEnded):
            ans = self._answer(event.request)
            if ans is not None:
                ans.data_streams[event.stream_id] = "fin" if event.reset_code is None else \
                    f"reset 0x{event.reset_code:x}"
            self._tick()

    def _record_object(self, ans: Answer, event: ObjectReceived) -> None:
        obj = event.object
        seq = self._tick()
        if isinstance(obj, SubgroupObject):
            header = self.headers.get(event.stream_id)
            seen = Seen(seq, ans.track, "live" if ans.kind == "subscribe" else "probe", event.stream_id, obj.location,
                        obj.status, obj.payload, obj.subgroup_id, obj.publisher_priority, obj.properties,
                        header.type_flags if header is not None else None)
        elif isinstance(obj, FetchObject):
            seen = Seen(seq, ans.track, "fill" if event.kind == "fill" else "fetch", event.stream_id, obj.location,
                        ObjectStatus.NORMAL, obj.payload, obj.subgroup_id, obj.publisher_priority,
                        obj.properties or b"")
        else:
            return  # an End of Range record names no object
        seen = dataclasses.replace(seen, at=time.monotonic())
        self.objects.append(seen)
        if seen.via == "live" and seen.track in (MANIFEST, MANIFEST_COSE) and self.source is not None:
            self._follow_manifest(seen)

    def _follow_manifest(self, seen: Seen) -> None:
        """Subscribe to data tracks a manifest names that the relay does not follow yet (lazily created)."""
        body = seen.payload
        with contextlib.suppress(Exception):
            if seen.track == MANIFEST_COSE:

                body = cbor2.loads(body).value[2]  # the payload, unverified: only to learn track names
            manifest = parse_manifest(body)
            for seg in manifest.segments:
                for name in seg.tracks:
                    raw = name.encode()
                    if not any(a.track == raw and a.kind == "subscribe" and a.ok is not False
                               for a in self.answers.values()):
                        self._subscribe_live(raw)

    # -- subscribing ahead of REQUEST_OK ------------------------------------------------------------

    def handle_publish_namespace(self, peer: Peer, req: Request, msg: PublishNamespace) -> None:
        ns = msg.track_namespace
        decision = self.authorize(peer, Right.PUBLISH, ns, msg.parameters)
        tokens = tuple(self.request_tokens(peer, msg.parameters))
        self.announces.append(Announce(self._tick(), ns, tuple(t for t in tokens if t not in peer.setup_tokens),
                                       tuple(peer.setup_tokens), decision.allowed, decision.reason))
        if decision.allowed and self.source is None and self.content_prefix.is_prefix_of(ns):
            self.source, self.source_ns = peer, ns
            self._spawn(self._subscribe_then_accept(peer, req, msg), peer)
            return
        super().handle_publish_namespace(peer, req, msg)

    def _subscribe_live(self, name: bytes) -> Upstream | None:
        if self.source is None or self.source_ns is None or self.source.gone:
            return None
        up = self.open_upstream(self.source, self.track_for(self.source_ns, name))
        self.answers[up.request.stream_id] = Answer(name, "subscribe", up.request.stream_id, self._tick())
        return up

    async def _subscribe_then_accept(self, peer: Peer, req: Request, msg: PublishNamespace) -> None:
        ups = [u for u in (self._subscribe_live(name) for name in self.track_names) if u is not None]
        if ups:
            await asyncio.wait([u.ready for u in ups], timeout=SUBSCRIBE_TIMEOUT)
        if peer.gone or req.state is not RequestState.PENDING:
            return
        try:
            super().handle_publish_namespace(peer, req, msg)
            self.accepted_at = time.monotonic()
        except _Refusal as refusal:
            self._refuse(peer, req, refusal.code, refusal.reason)

    # -- probes --------------------------------------------------------------------------------------

    def probe(self, name: bytes) -> list[Answer]:
        """Probe requests for one track (see the module docstring); answers are recorded as they come."""
        if self.source is None or self.source_ns is None or self.source.gone:
            return []
        session = self.source.session
        out = []
        if name in (MANIFEST, MANIFEST_COSE):
            fill = FillParameters.of((ParamType.LOCATION_FILTER, LocationFilter.relative_start(1)))
        else:
            fill = FillParameters.of((ParamType.LOCATION_FILTER, LocationFilter.absolute_start(0, 0)),
                                     (ParamType.GROUP_ORDER, GroupOrder.ASCENDING))
        sub = session.subscribe(self.source_ns, name, Parameters.of(
            (ParamType.LOCATION_FILTER, LocationFilter.next_object()), (ParamType.FILL_PARAMETERS, fill)))
        out.append(Answer(name, "probe-subscribe", sub.stream_id, self._tick()))
        if name not in (MANIFEST, MANIFEST_COSE):
            fetch = session.fetch(self.source_ns, name, Parameters.of(
                (ParamType.LOCATION_FILTER, LocationFilter.absolute_start(0, 0)),
                (ParamType.GROUP_ORDER, GroupOrder.ASCENDING)))
            out.append(Answer(name, "probe-fetch", fetch.stream_id, self._tick()))
        for ans in out:
            self.answers[ans.stream_id] = ans
        return out

    # -- waiting (called on the relay's loop) ----------------------------------------------------------

    async def wait_change(self, timeout: float) -> None:
        if self.changed is None:
            self.changed = asyncio.Event()
        self.changed.clear()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.changed.wait(), timeout)

    async def complete(self, spec: CacheSpec, public_keys: dict[bytes, str]) -> bool:
        """Every live-subscribed data track ended and the latest manifest marks every segment complete."""
        live = [a for a in self.answers.values() if a.kind == "subscribe" and a.ok]
        data = [a for a in live if a.track not in (MANIFEST, MANIFEST_COSE)]
        if not data:
            return False
        for a in data:
            ended = a.done is not None or any(o.track == a.track and o.status == ObjectStatus.END_OF_TRACK
                                              for o in self.objects if o.via == "live")
            if not ended:
                return False
        manifests = [o for o in self.objects if o.via == "live" and o.track in (MANIFEST, MANIFEST_COSE)
                     and o.status == ObjectStatus.NORMAL]
        if not manifests:
            return False
        latest = max(manifests, key=lambda o: o.location)
        try:
            body = verify(latest.payload, public_keys) if latest.track == MANIFEST_COSE else latest.payload
            manifest = parse_manifest(body)
        except PARSE_ERRORS:
            return False
        segments = {s.segment: s.complete for s in manifest.segments}
        return all(segments.get(s.segment, False) for s in spec.segment_layout())

    async def probes_done(self, answers: list[Answer]) -> bool:
        for a in answers:
            if a.ok is None or "open" in a.data_streams.values():
                return False
            # a FETCH_OK, or a SUBSCRIBE_OK with LARGEST_OBJECT, has its data stream still to come
            if a.ok and not a.data_streams and (a.kind == "probe-fetch" or a.largest is not None):
                return False
        return True

    async def close_sessions(self) -> None:
        for peer in list(self.peers):
            with contextlib.suppress(Exception):
                peer.session.close(SessionError.NO_ERROR, "harness done")


# ---- the scenario ---------------------------------------------------------------------------------------


def harness_policy(spec: CacheSpec, token: bytes) -> dict[str, Any]:
    """The publisher token may publish (and subscribe) under ("kvcs-1", Scope ID) only; anonymous nothing."""
    prefix = ["kvcs-1", {"hex": spec.scope_id.hex()}]
    return {"version": 1, "description": "kvcs-publisher suite: the scope's authorization is required",
            "anonymous": {"subscribe": []},
            "tokens": [{"name": "publisher", "value": {"hex": token.hex()}, "publish": [prefix],
                        "subscribe": [prefix]}]}


@dataclass
class PublisherRun:
    """A publisher started against a recording relay (``publishing``): what a scenario drives and reads."""

    spec: CacheSpec
    keys: dict[bytes, str]
    token: bytes
    thread: LoopThread
    relay: RecordingRelay
    notes: list[str]
    exit: PublisherExit = field(default_factory=lambda: PublisherExit(None, "", ""))


@contextlib.contextmanager
def publishing(case: Case, driver: PublisherDriver, seed: int, *, relay_class: type[RecordingRelay] = RecordingRelay,
               stream_data_uni: int | None = None) -> Iterator[PublisherRun]:
    """Start a ``relay_class`` relay on 127.0.0.1 (granting ``stream_data_uni`` octets per uni stream when given)
    and the publisher against it with ``case``'s cache spec; always stops both (the publisher's exit lands in
    ``PublisherRun.exit``)."""
    spec, keys = case.spec(seed)
    token = f"kvcs-scope-token-{seed % 10**8:08d}".encode()
    names = [MANIFEST, MANIFEST_COSE] + [t.name for s in spec.segment_layout()
                                         for t in spec.data_tracks(s.segment, kv=True)]
    thread = LoopThread(name=f"kvcs-publisher-harness-{case.name}")
    relay: RecordingRelay | None = None
    with tempfile.TemporaryDirectory(prefix="kvconform-kvcs-pub-") as tmp:
        cache = spec.write_json(Path(tmp) / "cache.json")
        try:
            policy = policy_from_mapping(harness_policy(spec, token), "kvcs-publisher harness policy")

            async def start() -> RecordingRelay:
                r = relay_class(content_prefix=spec.namespace(b"\0" * 16).content_prefix(), track_names=names,
                                policy=policy, host="127.0.0.1", port=0)
                with contextlib.ExitStack() as grants:
                    if stream_data_uni is not None:
                        grants.enter_context(granting_stream_data_uni(stream_data_uni))
                    return await r.start()  # type: ignore[return-value]

            relay = thread.run(start(), 10.0)
            driver.start(relay.url, cache, token.decode())
            run = PublisherRun(spec, keys, token, thread, relay, [])
            try:
                yield run
            finally:
                run.exit = driver.stop()
        finally:
            if relay is not None:
                with contextlib.suppress(Exception):
                    thread.run(relay.close_sessions(), 2.0)
                with contextlib.suppress(Exception):
                    thread.run(relay.close(3.0), 5.0)
            thread.close(3.0)


def observe(case: Case, driver: PublisherDriver, seed: int, *,
            log: Callable[[str], None] | None = None) -> Observation:
    """Run one publication against the recording relay (see the module docstring); always stops both."""
    started = time.monotonic()
    with publishing(case, driver, seed) as run:
        complete = _wait_publication(run.thread, run.relay, driver, run.spec, run.keys, run.notes)
        refusals = run.relay.alpn_refusals
        if refusals and not run.relay.announces:
            # A publisher of another draft: one line naming it, for every check (not "no PUBLISH_NAMESPACE").
            raise DriverError(f"the publisher's QUIC handshake was refused {len(refusals)} time(s): {refusals[0]}",
                              requirement="MOQT-SETUP-ALPN")
        _probe(run.thread, run.relay, run.notes)
    if log is not None:
        log(f"{case.name}: complete={complete} after {time.monotonic() - started:.1f} s")
    relay = run.relay
    grants = relay.granted_streams_uni
    granted = grants.get(relay.source.number) if relay.source is not None else next(iter(grants.values()), None)
    tap = relay.taps.get(relay.source.number) if relay.source is not None else None
    return Observation(case, run.spec, run.token, run.keys, list(relay.announces), list(relay.objects),
                       sorted(relay.answers.values(), key=lambda a: a.seq), complete,
                       time.monotonic() - started, run.exit, run.notes, granted,
                       tap.snapshot() if tap is not None else None, relay.accepted_at,
                       driver.send_schedule() if isinstance(driver, ShowsSchedule) else None)


def _wait_publication(thread: LoopThread, relay: RecordingRelay, driver: PublisherDriver, spec: CacheSpec,
                      keys: dict[bytes, str], notes: list[str]) -> bool:
    started = time.monotonic()
    while True:
        thread.run(relay.wait_change(STEP), STEP + 2.0)
        now = time.monotonic()
        if thread.run(relay.complete(spec, keys), 5.0):
            return True
        if not driver.running():
            notes.append(f"the publisher exited after {now - started:.1f} s, before the publication was complete")
            return False
        if not relay.announces and relay.alpn_refusals:
            return False  # it speaks another draft: waiting longer shows nothing more
        if not relay.announces and now - started > ANNOUNCE_TIMEOUT:
            notes.append(f"no PUBLISH_NAMESPACE within {ANNOUNCE_TIMEOUT} s")
            return False
        if relay.announces and now - relay.last_change > QUIET:
            notes.append(f"nothing new for {QUIET} s after {now - started:.1f} s; the publication looks incomplete")
            return False
        if now - started > PUBLISH_TIMEOUT:
            notes.append(f"the publication was not complete within {PUBLISH_TIMEOUT} s")
            return False


def _probe(thread: LoopThread, relay: RecordingRelay, notes: list[str]) -> None:
    async def run() -> list[Answer]:
        names = sorted({a.track for a in relay.answers.values() if a.kind == "subscribe" and a.ok})
        return [a for name in names for a in relay.probe(name)]

    answers = thread.run(run(), 5.0)
    deadline = time.monotonic() + PROBE_TIMEOUT
    while not thread.run(relay.probes_done(answers), 5.0):
        if time.monotonic() > deadline:
            open_ = [f"{a.track.decode('ascii', 'replace')} {a.kind}" for a in answers
                     if a.ok is None or "open" in a.data_streams.values()]
            notes.append(f"probe requests unfinished after {PROBE_TIMEOUT} s: {open_}")
            return
        thread.run(relay.wait_change(STEP), STEP + 2.0)


# ---- what the checks share -------------------------------------------------------------------------------

def findings(what: str, *asserted: str) -> Findings:
    """A ``Findings`` for a check that evaluates each of ``asserted`` on everything it reads (a problem is added
    against the id it breaks; with none, each of them was asserted and holds)."""
    found = Findings(what)
    found.asserted.extend(asserted)
    return found


def need_live(obs: Observation) -> None:
    """End the check inconclusive when the relay's own subscriptions saw nothing (a publisher that published
    before the relay subscribed, or never): what only live delivery shows cannot be judged then."""
    if not obs.live_any():
        inconclusive(f"case {obs.case.name}: no object arrived on the relay's subscriptions (opened before its "
                     f"REQUEST_OK to PUBLISH_NAMESPACE); notes: {obs.notes}")


def need_publication(obs: Observation) -> None:
    """End the check inconclusive when the publisher published no object at all: there is nothing for it to
    judge. That a publisher announced and published nothing is what test_every_block_of_every_layer_is_published
    (KVCS-TRACK-COMPLETE-OWN) and the announcement check fail; one requirement broken, not forty blamed."""
    if not obs.objects:
        inconclusive(f"case {obs.case.name}: the publisher published no object to judge (announces: "
                     f"{[(str(a.namespace), a.allowed, a.reason) for a in obs.announces]}; notes: {obs.notes}; "
                     f"publisher exit {obs.exit.code}, stderr: {obs.exit.stderr[-300:]!r})")


def readable_manifests(obs: Observation) -> list[tuple[Seen, Manifest]]:
    """The manifest versions that parse (and verify), in Group order. Inconclusive when versions arrived but
    none of them can be read: a check that needs a manifest's content cannot judge it then (the manifest's own
    check, test_manifest_is_consistent_with_the_namespace_and_the_cache, fails naming why)."""
    versions = obs.manifest_versions()
    readable = [(o, m) for o, m, _ in versions if m is not None]
    if versions and not readable:
        inconclusive(f"case {obs.case.name}: the {len(versions)} manifest version(s) cannot be read "
                     f"({versions[0][2]}); what this check needs is in the manifest")
    return readable


def track_name(name: bytes) -> str:
    return name.decode("ascii", "replace")
