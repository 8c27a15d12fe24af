"""The relay's core (``kvconform.moqt.relay.core.RelayCore``) driven directly, without asyncio, sockets or a clock:
session events and ``now`` go in, the core's session calls and timers come out (issue 24 item 1). The sessions
are recorders; the core's timers and deferred calls are lists this test runs itself, at the ``now`` it chooses.
"""

from __future__ import annotations

import ast
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kvconform.moqt.cache import CachedObject, ObjectCache
from kvconform.moqt.data import EndOfRange, EndOfRangeKind, FetchHeader, FetchObject
from kvconform.moqt.errors import PublishDoneCode, RequestErrorCode
from kvconform.moqt.filters import LocationFilter
from kvconform.moqt.messages import Fetch, FetchOk, PublishDone, PublishNamespace, Subscribe, SubscribeOk
from kvconform.moqt.parameters import FillParameters, Parameters
from kvconform.moqt.policy import Grant, Policy, Right, TokenKey
from kvconform.moqt.relay import Downstream, RelayCore
from kvconform.moqt.relay.state import DONE_GRACE, Completion, PlainCompletion
from kvconform.moqt.session import (
    DataStreamEnded,
    DataStreamOpened,
    MessageReceived,
    ObjectReceived,
    Request,
    RequestReceived,
    RequestStreamEnded,
)
from kvconform.moqt.structures import AuthToken, Location, ParamType, TrackNamespace

NS = TrackNamespace((b"kvconform", b"core"))
NAME = b"track"
CORE = Path(__file__).resolve().parents[2] / "kvconform" / "moqt" / "relay"
ADAPTER_MODULES = {"adapter.py", "serve.py", "__init__.py"}  # the asyncio side, and the package's re-exports


@dataclass
class RecordingSession:
    """What the core asks of a session, in order; requests it opens get stream ids 0, 4, 8, ..."""

    calls: list[tuple[str, Any]] = field(default_factory=list)
    requests: dict[int, Request] = field(default_factory=dict)
    next_stream: int = 0

    def __getattr__(self, name: str) -> Callable[..., None]:
        return lambda *args, **kwargs: self.calls.append((name, args))

    def subscribe(self, namespace: TrackNamespace, name: bytes, params: Parameters) -> Request:
        rid = self.next_stream // 2
        req = Request(self.next_stream, rid, Subscribe(rid, namespace, name, params), local=True)
        self.next_stream += 4
        self.calls.append(("subscribe", (namespace, name)))
        return req

    def fetch(self, namespace: TrackNamespace, name: bytes, params: Parameters) -> Request:
        rid = self.next_stream // 2
        req = Request(self.next_stream, rid, Fetch(rid, namespace, name, params), local=True)
        self.next_stream += 4
        self.calls.append(("fetch", (namespace, name)))
        return req

    def open_fill_stream(self, request_stream: int, request_id: int, fill: FillParameters) -> int:
        self.calls.append(("open_fill_stream", (request_stream,)))
        return 101

    def open_fetch_stream(self, request_stream: int) -> int:
        self.calls.append(("open_fetch_stream", (request_stream,)))
        return 201

    def data_stream_open(self, stream_id: int) -> bool:
        return True

    def names(self) -> list[str]:
        return [name for name, _ in self.calls]


@dataclass
class Conn:
    session: RecordingSession = field(default_factory=RecordingSession)


class SansIoRelay(RelayCore):
    """The core with its adapter hooks answered by plain objects: timers are (deadline, callback) entries."""

    def __init__(self, policy: Policy | None = None) -> None:
        super().__init__(policy=policy, cache=ObjectCache(clock=lambda: 0.0))  # the cache's expiry is not used here
        self.timers: list[tuple[float, Callable[[], None]]] = []
        self.soon: list[Callable[[], None]] = []
        self.sent_waits: list[Any] = []  # sessions whose PUBLISH_DONE waits for its streams to leave

    def new_completion(self) -> Completion[Any]:
        return PlainCompletion()

    def set_timer(self, deadline: float, callback: Callable[[], None]) -> Any:
        entry = (deadline, callback)
        self.timers.append(entry)
        return entry

    def cancel_timer(self, handle: Any) -> None:
        self.timers.remove(handle)

    def call_soon(self, callback: Callable[[], None]) -> None:
        self.soon.append(callback)

    def after_sent(self, peer: Any, stream_ids: Any, callback: Callable[[], None], timeout: float) -> None:
        self.sent_waits.append(peer)

    def advance(self, now: float) -> None:
        """Time passes to ``now``: the deferred calls run, then each timer due by then, and what they defer."""
        self.now = now
        while True:
            while self.soon:
                self.soon.pop(0)()
            due = sorted((t for t in self.timers if t[0] <= now), key=lambda t: t[0])
            if not due:
                return
            self.timers.remove(due[0])
            due[0][1]()


def _subscribe(relay: SansIoRelay, stream_id: int, rendezvous_ms: int) -> tuple[Any, Request]:
    peer = relay.open_peer(Conn())
    msg = Subscribe(stream_id // 4, NS, NAME, Parameters.of((ParamType.RENDEZVOUS_TIMEOUT, rendezvous_ms)))
    req = Request(stream_id, stream_id // 4, msg, local=False)
    relay.dispatch(peer, RequestReceived(stream_id, req, msg))
    return peer, req


def test_a_rendezvous_is_a_pending_wait_ended_by_the_timer_the_core_asked_for() -> None:
    relay = SansIoRelay()
    relay.now = 100.0
    subscriber, _ = _subscribe(relay, 0, rendezvous_ms=1500)
    track = relay.tracks[(NS.fields, NAME)]
    assert track.waiting == 1 and [t[0] for t in relay.timers] == [101.5]  # deadline = now + RENDEZVOUS_TIMEOUT
    assert subscriber.session.calls == []  # held: no answer yet
    relay.advance(101.4)
    assert subscriber.session.calls == [] and track.waiting == 1
    relay.advance(101.5)
    assert track.waiting == 0 and relay.timers == []
    assert [(n, a[1]) for n, a in subscriber.session.calls] == [("reject", RequestErrorCode.TIMEOUT)]


def test_a_publisher_arriving_serves_the_held_subscribe_and_cancels_its_timer() -> None:
    relay = SansIoRelay()
    relay.now = 5.0
    subscriber, _ = _subscribe(relay, 0, rendezvous_ms=10_000)
    publisher = relay.open_peer(Conn())
    announce = PublishNamespace(0, NS)
    relay.dispatch(publisher, RequestReceived(1, Request(1, 0, announce, local=False), announce))
    assert publisher.session.names() == ["request_ok"]  # the SUBSCRIBE is looked at after the announce is done
    relay.advance(5.001)
    assert relay.tracks[(NS.fields, NAME)].waiting == 0  # the rendezvous timer is gone (the one left is below)
    assert publisher.session.calls[1] == ("subscribe", (NS, NAME))  # aggregated onto an upstream SUBSCRIBE
    track = relay.tracks[(NS.fields, NAME)]
    assert [w.request.stream_id for w in track.establishing] == [0]  # held until the upstream is Established
    assert [t[0] for t in relay.timers] == [5.001 + relay.upstream_timeout] and subscriber.session.calls == []
    up = publisher.upstream[0]
    relay.dispatch(publisher, MessageReceived(0, up.request, SubscribeOk(1)))
    assert up.ready.done() and isinstance(up.ready.result(), SubscribeOk)
    relay.advance(5.002)
    assert subscriber.session.names() == ["subscribe_ok"] and relay.timers == [] and not track.establishing
    assert [ds.request.stream_id for ds in track.subscribers] == [0]


def test_an_upstream_publish_done_ends_the_subscriptions_after_the_grace_without_progress() -> None:
    relay = SansIoRelay()
    publisher = relay.open_peer(Conn())
    announce = PublishNamespace(0, NS)
    relay.dispatch(publisher, RequestReceived(1, Request(1, 0, announce, local=False), announce))
    subscriber, _ = _subscribe(relay, 0, rendezvous_ms=0)
    up = publisher.upstream[0]
    relay.dispatch(publisher, MessageReceived(0, up.request, SubscribeOk(1)))
    relay.advance(0.0)
    track = relay.tracks[(NS.fields, NAME)]
    assert len(track.subscribers) == 1
    relay.now = 50.0
    relay.dispatch(publisher, MessageReceived(0, up.request, PublishDone(PublishDoneCode.TRACK_ENDED, 1, b"")))
    relay.advance(50.0 + DONE_GRACE - 0.001)  # one data stream counted, none ended: wait, DONE_GRACE at most
    assert len(track.subscribers) == 1 and relay.sent_waits == []
    relay.advance(50.0 + DONE_GRACE)
    assert track.subscribers == [] and relay.sent_waits == [subscriber] and up not in track.upstreams


def test_a_wait_for_an_upstream_fetch_gives_up_after_fill_timeout_without_progress() -> None:
    relay = SansIoRelay()
    publisher = relay.open_peer(Conn())
    fetch = relay.open_upstream_fetch(publisher, relay.track_for(NS, NAME), Location(0, 0), Location(4, 0))
    result = relay.wait_for_fetch(fetch, None)  # no FILL_TIMEOUT: bounded by progress
    assert [t[0] for t in relay.timers] == [relay.fill_timeout_ms / 1000.0]
    relay.now = 3.0
    relay._fetch_progress(fetch)  # an object arrived: a new window from now
    relay.advance(3.0)
    assert [t[0] for t in relay.timers] == [3.0 + relay.fill_timeout_ms / 1000.0] and not result.done()
    relay.advance(3.0 + relay.fill_timeout_ms / 1000.0)
    assert result.done() and result.result() is False  # gave up: the FETCH is cancelled upstream
    assert publisher.session.names() == ["fetch", "cancel"] and fetch.done.done() and publisher.fetches == {}


def test_a_fill_waits_for_the_gap_fetched_upstream_then_is_written_and_ended() -> None:
    relay = SansIoRelay()
    publisher = relay.open_peer(Conn())
    announce = PublishNamespace(0, NS)
    relay.dispatch(publisher, RequestReceived(1, Request(1, 0, announce, local=False), announce))
    subscriber = relay.open_peer(Conn())
    track = relay.track_for(NS, NAME)
    req = Request(0, 0, Subscribe(0, NS, NAME), local=False)
    ds = Downstream(subscriber, req, track, Location(0, 0), None, True)
    relay.serve_fill(ds, 0, FillParameters.of(), Location(0, 0), Location(2, 0), False, (), None)
    assert subscriber.session.names() == ["open_fill_stream"] and len(ds.fill_tasks) == 1  # FETCH_HEADER at once
    assert publisher.session.names()[-1] == "fetch" and ds.fill_streams == {101}  # the gap, asked upstream
    fetch = next(iter(publisher.fetches.values()))
    relay._fetch_finished(fetch, False)  # the upstream FETCH ended without an answer: the gap stays unknown
    relay.advance(0.0)
    assert subscriber.session.names()[-2:] == ["write_fetch_object", "end_data_stream"]  # End of Unknown Range, FIN
    assert ds.fill_tasks == set() and ds.fill_streams == set()


def _fetch(relay: SansIoRelay, peer: Any, stream_id: int, first: tuple[int, int], last: tuple[int, int],
           fill_timeout_ms: int | None = None) -> Request:
    """A standalone FETCH of [first, last] (inclusive) from ``peer``."""
    flt = LocationFilter.absolute_range(first[0], first[1], last[0] - first[0], last[1])
    params = Parameters.of((ParamType.LOCATION_FILTER, flt), *(
        [] if fill_timeout_ms is None else [(ParamType.FILL_TIMEOUT, fill_timeout_ms)]))
    msg = Fetch(stream_id // 4, NS, NAME, params)
    req = Request(stream_id, stream_id // 4, msg, local=False)
    relay.dispatch(peer, RequestReceived(stream_id, req, msg))
    return req


def _written(session: RecordingSession) -> list[Any]:
    """The records written on fetch streams, in order."""
    return [args[1] for name, args in session.calls if name == "write_fetch_object"]


def test_a_fetch_of_a_cached_range_is_a_core_job_answered_from_the_cache() -> None:
    relay = SansIoRelay()
    track = relay.track_for(NS, NAME)
    for obj in range(3):
        track.cache.add(CachedObject(0, obj, 0, 128, b"x%d" % obj))
    requester = relay.open_peer(Conn())
    _fetch(relay, requester, 0, (0, 0), (0, 2))
    session = requester.session
    assert session.names() == ["fetch_ok", "open_fetch_stream", "write_fetch_object", "write_fetch_object",
                               "write_fetch_object", "end_data_stream", "finish_request"]
    assert session.calls[0][1] == (0, Location(0, 2))  # End Location: the last Location covered
    assert [o.location for o in _written(session)] == [Location(0, i) for i in range(3)]
    assert relay.timers == [] and requester.fetch_jobs == {} and track.counters.fetch_objects == 3


def _cut_through_setup(fill_timeout_ms: int | None) -> tuple[SansIoRelay, Any, Any, Request]:
    """A publisher announces NS; a requester FETCHes a track the relay does not follow at ``now`` 10."""
    relay = SansIoRelay()
    publisher = relay.open_peer(Conn())
    announce = PublishNamespace(0, NS)
    relay.dispatch(publisher, RequestReceived(1, Request(1, 0, announce, local=False), announce))
    requester = relay.open_peer(Conn())
    relay.now = 10.0
    _fetch(relay, requester, 0, (0, 0), (1, 1), fill_timeout_ms)
    assert publisher.session.names()[-1] == "fetch" and requester.session.calls == []  # the same range upstream
    return relay, publisher, requester, next(iter(publisher.fetches.values())).request


def test_a_cut_through_fetch_is_written_as_its_upstream_objects_arrive() -> None:
    relay, publisher, requester, up = _cut_through_setup(fill_timeout_ms=2000)
    assert [t[0] for t in relay.timers] == [12.0]  # FILL_TIMEOUT: a total budget from the FETCH's arrival
    relay.dispatch(publisher, MessageReceived(up.stream_id, up, FetchOk(0, Location(1, 1))))
    relay.advance(10.1)
    assert requester.session.names() == ["fetch_ok", "open_fetch_stream"]  # the upstream End Location, at once
    assert requester.session.calls[0][1] == (0, Location(1, 1)) and _written(requester.session) == []
    relay.dispatch(publisher, DataStreamOpened(3, "fetch", up, FetchHeader(up.request_id)))
    for loc in ((0, 0), (0, 1)):
        relay.now += 0.1
        relay.dispatch(publisher, ObjectReceived(3, "fetch", up, FetchObject(*loc, b"p")))
        relay.advance(relay.now)
        assert _written(requester.session)[-1].location == Location(*loc)  # forwarded before the rest arrives
    relay.dispatch(publisher, ObjectReceived(3, "fetch", up, FetchObject(1, 1, b"q")))
    relay.dispatch(publisher, DataStreamEnded(3, "fetch", up, None))  # FIN: (1, 0) does not exist
    relay.advance(10.5)
    assert [r.location for r in _written(requester.session)] == [Location(0, 0), Location(0, 1), Location(1, 1)]
    assert requester.session.names()[-2:] == ["end_data_stream", "finish_request"]
    assert relay.timers == [] and requester.fetch_jobs == {} and publisher.fetches == {}


def test_a_cut_through_fetch_ends_with_a_timed_out_range_when_its_fill_timeout_runs_out() -> None:
    relay, publisher, requester, up = _cut_through_setup(fill_timeout_ms=1000)
    relay.dispatch(publisher, MessageReceived(up.stream_id, up, FetchOk(0, Location(1, 1))))
    relay.dispatch(publisher, DataStreamOpened(3, "fetch", up, FetchHeader(up.request_id)))
    relay.dispatch(publisher, ObjectReceived(3, "fetch", up, FetchObject(0, 0, b"p")))
    relay.advance(10.2)
    assert [r.location for r in _written(requester.session)] == [Location(0, 0)]
    relay.advance(10.999)
    assert requester.session.names()[-1] == "write_fetch_object"  # still within the budget
    relay.advance(11.0)  # FILL_TIMEOUT: the upstream FETCH is cancelled, the rest is a Timed-Out Range
    assert publisher.session.names()[-1] == "cancel"
    last = _written(requester.session)[-1]
    assert isinstance(last, EndOfRange) and last.kind == EndOfRangeKind.TIMED_OUT and last.location == Location(1, 1)
    assert requester.session.names()[-2:] == ["end_data_stream", "finish_request"] and relay.timers == []


def test_a_cut_through_fetch_cancelled_by_its_requester_cancels_its_upstream_fetch() -> None:
    relay, publisher, requester, up = _cut_through_setup(fill_timeout_ms=None)
    relay.dispatch(publisher, MessageReceived(up.stream_id, up, FetchOk(0, Location(1, 1))))
    relay.advance(10.1)
    job = requester.fetch_jobs[0]
    assert job.cut_through and len(relay.timers) == 1  # fill_timeout_ms for the next progress
    relay.dispatch(requester, RequestStreamEnded(0, job.request, 0x1))  # the requester reset its FETCH
    assert requester.fetch_jobs == {} and relay.timers == [] and publisher.session.names()[-1] == "cancel"


def test_a_held_subscribe_is_refused_with_timeout_when_no_upstream_answers_in_time() -> None:
    relay = SansIoRelay()
    publisher = relay.open_peer(Conn())
    announce = PublishNamespace(0, NS)
    relay.dispatch(publisher, RequestReceived(1, Request(1, 0, announce, local=False), announce))
    relay.now = 20.0
    subscriber, _ = _subscribe(relay, 0, rendezvous_ms=0)
    relay.advance(20.0 + relay.upstream_timeout - 0.001)
    assert subscriber.session.calls == []
    relay.advance(20.0 + relay.upstream_timeout)
    assert [(n, a[1]) for n, a in subscriber.session.calls] == [("reject", RequestErrorCode.TIMEOUT)]


def test_token_expiry_is_judged_at_the_wall_time_passed_in() -> None:
    key = TokenKey(0, b"soon-gone")
    policy = Policy(tokens={key: Grant("t", subscribe=(NS.fields,), expires=1_000.0)})
    relay = SansIoRelay(policy)
    peer = relay.open_peer(Conn())
    params = Parameters.of((ParamType.AUTHORIZATION_TOKEN, AuthToken.use_value(key.value, key.type)))
    relay.wall_now = 999.0
    assert relay.authorize(peer, Right.SUBSCRIBE, NS, params).allowed
    relay.wall_now = 1_000.0
    decision = relay.authorize(peer, Right.SUBSCRIBE, NS, params)
    assert not decision.allowed and decision.code == RequestErrorCode.EXPIRED_AUTH_TOKEN


def test_the_core_modules_import_neither_asyncio_nor_a_clock() -> None:
    """Every module of the relay package but the adapter's is sans-I/O: no asyncio, time, socket or threading
    import, no quic (the adapter's transport) outside ``TYPE_CHECKING``, and no ``loop.time()``."""
    banned = {"asyncio", "time", "socket", "threading", "selectors", "kvconform.moqt.quic", "kvconform.moqt.client"}
    core = sorted(p for p in CORE.glob("*.py") if p.name not in ADAPTER_MODULES)
    assert {p.name for p in core} >= {"state.py", "authorization.py", "aggregation.py", "namespaces.py",
                                      "planning.py", "fetching.py", "forwarding.py", "core.py", "hooks.py"}
    found = []
    for path in core:
        tree = ast.parse(path.read_text("utf-8"))
        typing_only = {id(n) for node in ast.walk(tree) if isinstance(node, ast.If)
                       and isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING"
                       for n in ast.walk(node)}
        for node in ast.walk(tree):
            if id(node) in typing_only:
                continue
            names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                     else [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            found += [f"{path.name}: import {n}" for n in names if n.split(".")[0] in banned or n in banned]
            if isinstance(node, ast.Attribute) and node.attr in ("time", "monotonic", "get_running_loop"):
                found.append(f"{path.name}:{node.lineno}: .{node.attr}")
    assert not found, found
