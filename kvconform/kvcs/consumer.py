"""The reference KVCS consumer (the text's "Consumer Procedures"), on ``kvconform.moqt.client``.

What it does, in order, within one time budget:

1. **Discovery.** From what it knows (KVSP profile, scope key, Compatibility Descriptor, its tokens) it
   computes the Scope ID, Compatibility ID and its Block Keys, and sends SUBSCRIBE_NAMESPACE for
   ("kvcs-1", Scope ID, Compatibility ID, Anchor Key) with the Anchor Key of its longest prefix, then of
   shorter ones (each longer namespace subscription is cancelled first: PREFIX_OVERLAP, profile §12). Each
   NAMESPACE names one publication (its Publication ID).
2. **Manifest.** SUBSCRIBE "manifest.cose" (Next Object + FILL_PARAMETERS {Relative Start 1}); only if the
   publisher reports that track does not exist and producer authenticity is not required, "manifest". Each
   version is opened (COSE_Sign1 verified with the known producer keys), parsed and checked: its "compat"
   must hash to the namespace's Compatibility ID, else the publication is discarded.
3. **Data.** The consumer uses the segments whose ``block_keys_sha256`` match its own Block Keys (from
   segment 0, contiguous) and, per segment, the "k" and "v" tracks of codec raw (or one raw "kv" track).
   *Live* (a needed segment is not complete): SUBSCRIBE with LOCATION_FILTER Next Object and
   FILL_PARAMETERS {Absolute Start {0,0}, GROUP_ORDER Ascending} (the exactly-once pattern).
   *Completed*: FETCH of the layer range (Absolute Start, Group End; GROUP_ORDER Ascending) with an
   OBJECTID_FILTER 0..n-1 when only the first n blocks are needed and the peer's MAX_FILTER_RANGES is
   non-zero; otherwise the excess Objects are discarded.
4. **Verification.** Every Object: ``verify_object`` (magic, version, Layer = Group ID, Block Index =
   Object ID, lengths, Data Digest), Component, Codec, Token Start / Token Count, raw Data length, and its
   Data Digest against the manifest's ``object_digests`` (required, and signed, when producer authenticity
   is required). A failing Object is discarded and treated as missing. The same Location delivered twice
   with different payloads makes the track malformed (nothing of it is used).
5. **Completion and recovery.** A track is complete at End of Track or PUBLISH_DONE (with its data streams
   closed), or when its fill ended and the manifest marks the segment complete; an Object at or below the
   SUBSCRIBE_OK Largest Object that the ended fill did not carry, or one past an End of Group, is missing.
   A layer is *ready* (``on_ready``) once every needed Object of it in every selected track is verified.
   Missing or rejected layers are retried through another relay URL (same publication) or another
   publication; Objects of different publications are combined in one segment only when both manifests
   say ``"deterministic": true``. A publication that makes no progress for ``stall_timeout`` seconds is
   abandoned; past ``budget`` seconds the consumer gives up and reports the layers it has not got as
   "failed".

The decisions are the sans-I/O core's (``kvconform.kvcs.consumer_core.ConsumerCore`` and, for one attempt,
``kvconform.kvcs.attempt.Attempt``: no I/O, no clock, ``now`` passed in); what the consumer is given and reports
is ``kvconform.kvcs.consume_result``. This module is the asyncio adapter: it connects, subscribes and fetches over
``kvconform.moqt.client``, keeps each request's ``Delivery`` current for the core, waits (bounded) for changes
until the core's deadlines, and passes the loop's clock (virtual time on a ``VirtualClockLoop``). The Layer digest
and the result JSON are described in ``kvconform.kvcs.consume_result``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

from kvconform.kvcs import cose
from kvconform.kvcs.attempt import Attempt
from kvconform.kvcs.attempt_result import Abandon, AttemptResult
from kvconform.kvcs.consume_result import (
    MAX_RESULT_OCTETS,
    REQ,
    ConsumeResult,
    ConsumerIdentity,
    ConsumerOptions,
    LayerReady,
    Rejection,
    convention_layer_digest,
    layer_digest,
)
from kvconform.kvcs.consumer_core import ConsumerCore, cose_payload_unverified
from kvconform.kvcs.namespace import KVCS_TAG, KvcsNamespace
from kvconform.kvcs.track_state import Delivery
from kvconform.kvcs.tracks import MANIFEST, MANIFEST_COSE
from kvconform.moqt import client as mc
from kvconform.moqt.errors import RequestErrorCode, SessionError
from kvconform.moqt.messages import FetchOk
from kvconform.moqt.session import Event, Request, Role, SessionConfig
from kvconform.moqt.structures import TrackNamespace

__all__ = ["MAX_RESULT_OCTETS", "REQ", "ConsumeResult", "Consumer", "ConsumerIdentity", "ConsumerOptions", "LayerReady",
           "Rejection", "convention_layer_digest", "layer_digest", "load_producer_keys"]

log = logging.getLogger(__name__)

CONNECT_TIMEOUT = 5.0
REQUEST_TIMEOUT = 5.0
DISCOVERY_DRAIN = 0.05  # NAMESPACE messages for existing publications follow REQUEST_OK back to back


# ---- MOQT handles that report every change to the attempt, and keep its Delivery for the core ---------------


class _WatchedSubscription(mc.Subscription):
    """A Subscription that calls ``on_change`` after each of its events (objects, streams, PUBLISH_DONE)."""

    def __init__(self, client: mc.MoqtClient, request: Request, on_change: Callable[[], None]) -> None:
        super().__init__(client, request)
        self.on_change = on_change
        self.delivery = Delivery(False, self.objects, self.fills, self.subgroup_streams)

    def _on_event(self, event: Event) -> None:
        super()._on_event(event)
        self.on_change()

    def refresh(self) -> Delivery:
        """The Delivery as of now (LARGEST_OBJECT and PUBLISH_DONE live in the request and a future)."""
        d = self.delivery
        d.largest = self.largest
        if self.done.done():
            d.done_failed = self.done.exception() is not None
            d.done = None if d.done_failed else self.done.result()
        return d


class _WatchedFetch(mc.FetchResult):
    """A FetchResult that calls ``on_change`` after each of its events, so layers are used as they arrive."""

    def __init__(self, client: mc.MoqtClient, request: Request, on_change: Callable[[], None]) -> None:
        super().__init__(client, request)
        self.on_change = on_change
        self.delivery = Delivery(True, self.objects)

    def _on_event(self, event: Event) -> None:
        super()._on_event(event)
        self.on_change()

    def refresh(self) -> Delivery:
        d = self.delivery
        d.stream_ended = self.stream_end.done()
        if self.answer.done() and not self.answer.cancelled():
            exc = self.answer.exception()
            if exc is not None or not isinstance(self.answer.result(), FetchOk):
                d.refused = f"{exc or self.answer.result()}"
        return d


# ---- the consumer ----------------------------------------------------------------------------------------


class Consumer(ConsumerCore):
    """The reference consumer. ``await Consumer(identity, options).run()`` -> ``ConsumeResult``.

    ``on_ready`` is called (and ``ready[layer]`` set) as each layer is verified, with the publication it
    came from. When the consumer has to move to another, non-deterministic publication, layers reported for
    the earlier one must not be combined with the new one's: the result names the publication (and, per
    layer, the source) finally used. A layer reported ready is retracted (dropped from the result) when its
    track later turns out malformed. The behaviours a subclass overrides are the core's (``ConsumerCore``) and
    ``wait_for_change``.
    """

    def __init__(self, identity: ConsumerIdentity, options: ConsumerOptions,
                 on_ready: Callable[[LayerReady], None] | None = None) -> None:
        super().__init__(identity, options, on_ready)
        self.ready: dict[int, asyncio.Event] = {}

    def now(self) -> float:
        """The running loop's clock (virtual on a ``VirtualClockLoop``): the ``now`` the core is given."""
        return asyncio.get_running_loop().time()

    def _left(self) -> float:
        return self.remaining(self.now())

    def layer_ready(self, layer: int) -> None:
        self.ready.setdefault(layer, asyncio.Event()).set()

    async def wait_for_change(self, changed: asyncio.Event, bound: float) -> bool:
        """Wait at most ``bound`` seconds for the next event of an attempt (an object, a stream, PUBLISH_DONE);
        False when none came (no progress: the stall bound)."""
        try:
            await asyncio.wait_for(changed.wait(), bound)
        except TimeoutError:
            return False
        return True

    async def run(self) -> ConsumeResult:
        started = self.now()
        self.start(started)
        wanted: list[int] | None = None
        gave_up = False
        try:
            # A second round retries layers that were missing (not rejected): a relay that timed out
            # filling a range upstream has usually cached more of it by then.
            for _ in range(2):
                done = False
                for relay in self.options.relays:
                    if self._left() <= 0:
                        break
                    done = await self._use_relay(relay)
                    wanted = self.wanted_so_far() or wanted
                    if done:
                        break
                if done or not any(a.retryable for a in self.attempts) or self._left() <= 0:
                    break
                for a in self.attempts:
                    a.retryable = set()
        except Exception as exc:  # a bug or a network error: report what was got, never a good poisoned layer
            log.warning("consumer: %r", exc)
            self.attempts.append(AttemptResult("", b"", None, (), outcome=f"error: {exc!r}"))
        if self._left() <= 0:
            gave_up = True
        return self.result(wanted, self.now() - started, gave_up)

    async def _use_relay(self, relay: str) -> bool:
        """Discover and try publications through one relay; True once a complete combination exists."""
        config = SessionConfig(role=Role.CLIENT, implementation="kvconform-consumer/0.1")
        try:
            client = await mc.connect(relay, config=config, timeout=min(CONNECT_TIMEOUT, max(0.1, self._left())))
        except (OSError, TimeoutError, mc.SessionEnded, ValueError) as exc:
            self.attempts.append(AttemptResult(relay, b"", None, (), outcome=f"cannot connect: {exc}"))
            return False
        try:
            found = await self._discover(client, relay)
            if found is None:
                return False
            anchor, nsub = found
            tried: set[bytes] = set()
            while self._left() > 0:
                pubs = [p for p in _announced(nsub) if p not in tried]
                if not pubs:
                    break
                for pub in pubs:
                    tried.add(pub)
                    if self.complete_with(pub):
                        continue
                    await self._attempt(client, relay, KvcsNamespace(self.identity.scope_id, self.identity.compat_id,
                                                                     anchor, pub))
                    if self.selection()[2]:
                        return True
                    if self._left() <= 0:
                        break
            return self.selection()[2]
        finally:
            with contextlib.suppress(Exception):
                await client.close(SessionError.NO_ERROR, "consumer done", timeout=0.2)

    async def _discover(self, client: mc.MoqtClient,
                        relay: str) -> tuple[bytes, mc.NamespaceSubscription] | None:
        """SUBSCRIBE_NAMESPACE for the longest prefix, then shorter ones; the first with publications."""
        for anchor in self.discovery_anchors():
            if self._left() <= 0:
                return None
            prefix = TrackNamespace((KVCS_TAG, self.identity.scope_id, self.identity.compat_id, anchor))
            try:
                nsub = await client.subscribe_namespace(prefix, auth=self.options.auth(),
                                                        timeout=min(REQUEST_TIMEOUT, max(0.1, self._left())))
            except mc.RequestRejected as exc:
                self.attempts.append(AttemptResult(relay, b"", None, (),
                                                    outcome=f"SUBSCRIBE_NAMESPACE refused: {exc}"))
                continue
            notices: list[tuple[str, TrackNamespace]] = []
            with contextlib.suppress(TimeoutError, mc.SessionEnded):
                notices.append(await nsub.next(timeout=min(self.options.discovery_window, max(0.01, self._left()))))
                while True:  # the rest of the publications known now follow back to back
                    notices.append(await nsub.next(timeout=DISCOVERY_DRAIN))
            for notice in notices:
                nsub.queue.put_nowait(notice)  # read again by _announced
            if notices:
                return anchor, nsub
            nsub.cancel()  # before the shorter prefix (PREFIX_OVERLAP, profile §12)
        return None

    async def _attempt(self, client: mc.MoqtClient, relay: str, ns: KvcsNamespace) -> None:
        result = AttemptResult(relay, ns.pub_id, None, ())
        self.attempts.append(result)
        attempt = _AttemptIO(self, client, Attempt(self, relay, ns, result))
        try:
            await attempt.run()
        except Abandon as exc:
            result.outcome = f"abandoned: {exc}"
        except (mc.SessionEnded, mc.RequestRejected, TimeoutError) as exc:
            result.outcome = f"failed: {type(exc).__name__}: {exc}"
        finally:
            attempt.close()
        log.info("consumer: publication %s via %s: %s, %d layers", ns.pub_id.hex(), relay, result.outcome,
                 len(result.layers))


class _AttemptIO:
    """The I/O of one ``Attempt``: its requests over the relay session and the waits between its rounds."""

    def __init__(self, consumer: Consumer, client: mc.MoqtClient, core: Attempt) -> None:
        self.c = consumer
        self.client = client
        self.core = core
        self.changed = asyncio.Event()
        self.manifest_sub: _WatchedSubscription | None = None
        self.handles: dict[int, _WatchedSubscription | _WatchedFetch] = {}  # index in core.tracks -> its request

    def _touch(self) -> None:
        self.changed.set()

    def close(self) -> None:
        for h in [self.manifest_sub, *self.handles.values()]:
            if h is not None and self.client.session.closed is None:
                with contextlib.suppress(Exception):
                    h.cancel()

    def _refresh(self) -> None:
        if self.manifest_sub is not None:
            self.core.manifest_delivery = self.manifest_sub.refresh()
        for i, h in self.handles.items():
            self.core.tracks[i].delivery = h.refresh()

    async def _wait_until(self, deadline: float) -> bool:
        """Wait for any event of this attempt until the core's ``deadline``; False when it passed without one."""
        self.changed.clear()
        return await self.c.wait_for_change(self.changed, deadline - self.c.now())

    async def _subscribe(self, name: bytes, params: Mapping[str, Any]) -> _WatchedSubscription:
        built = mc.build_parameters(auth=self.c.options.auth(), **params)
        ns = self.core.ns.track_namespace()
        sub = _WatchedSubscription(self.client, self.client.session.subscribe(ns, name, built), self._touch)
        await sub.wait_ok(min(REQUEST_TIMEOUT, max(0.1, self.c.remaining(self.c.now()))))
        return sub

    async def _open_manifest_track(self) -> None:
        params = self.c.manifest_subscribe_parameters()
        try:
            self.manifest_sub = await self._subscribe(MANIFEST_COSE, params)
            return
        except mc.RequestRejected as exc:
            if exc.code != RequestErrorCode.DOES_NOT_EXIST:
                raise Abandon(f"SUBSCRIBE manifest.cose refused: {exc}") from exc
        if self.c.options.authenticity:
            raise Abandon(f"no manifest.cose and producer authenticity is required [{REQ['cose']}]")
        self.core.manifest_track = MANIFEST
        try:
            self.manifest_sub = await self._subscribe(MANIFEST, params)
        except mc.RequestRejected as exc:
            raise Abandon(f"neither manifest.cose nor manifest: {exc}") from exc

    async def _open_data(self, mode: str) -> None:
        core = self.core
        peer_ranges = 0
        if self.client.session.peer_setup is not None:
            peer_ranges = self.client.session.peer_setup.max_filter_ranges or 0
        first, last = core.wanted[0], core.wanted[-1]
        for i, ts in enumerate(core.tracks):
            name = ts.needed.track.name
            try:
                if mode == "live":
                    self.handles[i] = await self._subscribe(name, self.c.data_subscribe_parameters())
                else:
                    seg = core.segment(ts.needed.segment)
                    params = self.c.fetch_parameters(first, last, ts.needed.blocks, seg.blocks, peer_ranges)
                    built = mc.build_parameters(auth=self.c.options.auth(), **params)
                    request = self.client.session.fetch(core.ns.track_namespace(), name, built)
                    self.handles[i] = _WatchedFetch(self.client, request, self._touch)
            except mc.RequestRejected as exc:
                ts.failed = f"{ts.name}: {exc}"

    async def run(self) -> None:
        core = self.core
        await self._open_manifest_track()
        while True:
            self._refresh()
            deadline = core.manifest_step(self.c.now())
            if deadline is None:
                break
            if not await self._wait_until(deadline):
                raise Abandon("no manifest version arrived")
        mode = core.prepare()
        if mode is None:
            return
        await self._open_data(mode)
        while True:
            self._refresh()
            deadline = core.step(self.c.now())
            if deadline is None:
                return
            if not await self._wait_until(deadline):
                core.stalled()
                return


def _announced(nsub: mc.NamespaceSubscription) -> list[bytes]:
    """Publication IDs announced so far (queued NAMESPACE notices, in order; withdrawn ones skipped)."""
    out: list[bytes] = []
    while not nsub.queue.empty():
        kind, suffix = nsub.queue.get_nowait()
        if len(suffix.fields) != 1 or len(suffix.fields[0]) != 16:
            continue  # not a KVCS publication under this prefix
        pub = suffix.fields[0]
        if kind == "namespace" and pub not in out:
            out.append(pub)
        elif kind == "done" and pub in out:
            out.remove(pub)
    return out


def _cose_payload_unverified(data: bytes) -> bytes:
    """``cose_payload_unverified`` where the fuzz parsers and the mutant consumers import it from."""
    return cose_payload_unverified(data)


def load_producer_keys(items: Iterable[str]) -> dict[bytes, str]:
    """``kid=PATH`` (a PEM file) or ``kid=PEM`` items -> kid -> public PEM (empty items are skipped: a
    driver's ``{producer_key}`` placeholder is empty when a scenario has no producer key)."""

    out: dict[bytes, str] = {}
    for item in items:
        if not item:
            continue
        kid, sep, value = item.partition("=")
        if not sep or not kid:
            raise ValueError(f"--producer-key {item!r}: expected kid=PEM-file")
        text = value if "-----BEGIN" in value else Path(value).read_text("utf-8")
        cose.load_public_key(text)  # refuse a key that does not load, up front
        out[kid.encode()] = text
    return out
