"""The MOQT request lifecycle table (kvconform.moqt.lifecycle): complete, every state reachable, every
cell walked through a real session pair (a refused cell closes the session with its code, a legal one
leads where the table says), and random event sequences keep both ends in the same state."""

from __future__ import annotations

from collections import deque
from collections.abc import Callable

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvconform.moqt.errors import PublishDoneCode, RequestErrorCode, SessionError
from kvconform.moqt.lifecycle import (
    EVENTS,
    KINDS,
    SIDES,
    STATES,
    TABLE,
    LifecycleError,
    Refusal,
    RequestEvent,
    RequestState,
    Side,
    answer_event,
    transition,
)
from kvconform.moqt.messages import (
    FetchOk,
    Goaway,
    MessageType,
    Namespace,
    NamespaceDone,
    PublishDone,
    PublishSkipped,
    PublishStateNotify,
    RequestError,
    RequestOk,
    RequestUpdate,
    SubscribeOk,
    TrackStatus,
)
from kvconform.moqt.parameters import Parameters
from kvconform.moqt.session import Request, Session, SessionUsageError
from kvconform.moqt.structures import Location, TrackNamespace
from tests.moqt.test_session import NAME, NS, Pair, make_pair

EV, Q, R = RequestEvent, Side.REQUESTER, Side.RESPONDER
P, E, D, F, C = (RequestState.PENDING, RequestState.ESTABLISHED, RequestState.DONE, RequestState.FAILED,
                 RequestState.CANCELLED)
TERMINAL = (D, F, C)
SUFFIX = TrackNamespace.of("pub")
ANSWERS = (EV.REQUEST_OK, EV.REQUEST_ERROR, EV.UPDATE_OK, EV.UPDATE_ERROR)


def reachable(kind: int) -> dict[RequestState, list[tuple[Side, RequestEvent]]]:
    """Breadth-first from PENDING over the legal cells: a shortest event path to each reachable state,
    FIN the last choice (nothing the peer sends after it can arrive)."""
    paths: dict[RequestState, list[tuple[Side, RequestEvent]]] = {P: []}
    todo = deque([P])
    moves = sorted(((s, e) for s in SIDES for e in EVENTS), key=lambda move: move[1] is EV.FIN)
    while todo:
        state = todo.popleft()
        for sender, event in moves:
            cell = TABLE[(kind, sender, event, state)]
            if isinstance(cell, RequestState) and cell not in paths:
                paths[cell] = [*paths[state], (sender, event)]
                todo.append(cell)
    return paths


# ---------------------------------------------------------------------------------------------------
# The table itself


def test_table_has_a_cell_for_every_kind_sender_event_and_state() -> None:
    """No missing cell: every event is handled (moved or refused) in every state of every kind."""
    expected = {(k, s, e, t) for k in KINDS for s in SIDES for e in EVENTS for t in STATES}
    assert set(TABLE) == expected
    assert len(TABLE) == 7 * 2 * 15 * 5


def test_every_state_is_reachable_and_every_event_moves_something() -> None:
    reached = {state for kind in KINDS for state in reachable(kind)}
    assert reached == set(STATES)
    # Per kind, what the profile's flows allow (§4.4): no PUBLISH_DONE but on a subscription, TRACK_STATUS
    # answered once and done.
    assert set(reachable(MessageType.SUBSCRIBE)) == set(STATES)
    assert set(reachable(MessageType.PUBLISH)) == set(STATES)
    assert set(reachable(MessageType.TRACK_STATUS)) == {P, D, F, C}
    for kind in (MessageType.FETCH, MessageType.PUBLISH_NAMESPACE, MessageType.SUBSCRIBE_NAMESPACE,
                 MessageType.SUBSCRIBE_TRACKS):
        assert set(reachable(kind)) == {P, E, F, C}, MessageType(kind).name
    for event in EVENTS:
        assert any(isinstance(TABLE[(k, s, event, t)], RequestState) and t not in TERMINAL
                   for k in KINDS for s in SIDES for t in STATES), f"{event} is legal nowhere"


def test_terminal_states_are_never_left_and_cancelled_accepts_everything() -> None:
    for (kind, sender, event, state), cell in TABLE.items():
        if state in TERMINAL and isinstance(cell, RequestState):
            assert cell is state, (MessageType(kind).name, sender, event, state, cell)
        if state is C:
            assert cell is C


def test_every_refusal_is_a_protocol_violation_that_cites_its_text() -> None:
    refusals = [cell for cell in TABLE.values() if isinstance(cell, Refusal)]
    assert refusals and all(r.code == SessionError.PROTOCOL_VIOLATION for r in refusals)
    assert all(r.reason and ("profile §" in r.cite or "EDR" in r.cite) for r in refusals)


@pytest.mark.parametrize(("kind", "sender", "event", "state", "text"), [
    (MessageType.SUBSCRIBE, R, EV.SUBSCRIBE_OK, E, "exactly one answers a SUBSCRIBE"),
    (MessageType.SUBSCRIBE, R, EV.REQUEST_OK, P, "answered by SUBSCRIBE_OK or REQUEST_ERROR"),
    (MessageType.TRACK_STATUS, Q, EV.REQUEST_UPDATE, P, "never updated"),
    (MessageType.PUBLISH, Q, EV.REQUEST_UPDATE, P, "only the subscriber updates a PUBLISH"),
    (MessageType.SUBSCRIBE_NAMESPACE, R, EV.NAMESPACE, P, "before the response"),
    (MessageType.SUBSCRIBE, R, EV.PUBLISH_STATE_NOTIFY, D, "ended with the responder's last message"),
    (MessageType.PUBLISH, R, EV.REQUEST_OK, E, "exactly one answers a PUBLISH"),
])
def test_refusals_say_why(kind: int, sender: Side, event: RequestEvent, state: RequestState, text: str) -> None:
    with pytest.raises(LifecycleError, match=text) as err:
        transition(kind, sender, event, state)
    assert err.value.code == SessionError.PROTOCOL_VIOLATION and event.value in str(err.value)


@pytest.mark.parametrize(("kind", "sender", "event", "state", "after"), [
    (MessageType.SUBSCRIBE, R, EV.FIN, E, F),  # FIN before PUBLISH_DONE: failed (EDR graceful closure)
    (MessageType.FETCH, R, EV.FIN, E, E),  # FETCH_OK was the only required message
    (MessageType.PUBLISH, Q, EV.PUBLISH_DONE, P, D),  # "Pending (Publisher)" ends by PUBLISH_DONE
    (MessageType.PUBLISH, R, EV.REQUEST_OK, D, D),  # PUBLISH_OK crossed the PUBLISH_DONE
    (MessageType.SUBSCRIBE, Q, EV.REQUEST_UPDATE, F, F),  # the update crossed the REQUEST_ERROR
    (MessageType.SUBSCRIBE, R, EV.SUBSCRIBE_OK, C, C),  # the answer crossed the cancellation
    (MessageType.TRACK_STATUS, R, EV.REQUEST_OK, P, D),
])
def test_cells_the_spec_settles(kind: int, sender: Side, event: RequestEvent, state: RequestState,
                                after: RequestState) -> None:
    assert transition(kind, sender, event, state) is after


@settings(max_examples=300, deadline=None)
@given(st.sampled_from(KINDS), st.lists(st.tuples(st.sampled_from(SIDES), st.sampled_from(EVENTS)), max_size=12))
def test_random_event_sequences_on_the_table(kind: int, steps: list[tuple[Side, RequestEvent]]) -> None:
    """Folding any sequence: a refused event changes nothing, terminal states are never left."""
    state = P
    for sender, event in steps:
        cell = TABLE[(kind, sender, event, state)]
        try:
            after = transition(kind, sender, event, state)
        except LifecycleError as exc:
            assert isinstance(cell, Refusal) and exc.code == cell.code
            continue
        assert after is cell
        assert state not in TERMINAL or after is state
        state = after


# ---------------------------------------------------------------------------------------------------
# Every cell through a session pair


def open_request(pair: Pair, kind: int, *, fin_allowed: bool) -> int:
    """The client opens a `kind` request; the server has it. TRACK_STATUS goes raw unless a FIN may
    follow it (the API FINs it with its only message, after which the server would read nothing)."""
    client = pair.client
    if kind == MessageType.TRACK_STATUS and not fin_allowed:
        rid = client.next_request_id()
        sid = client.open_raw_stream(TrackStatus(rid, NS, NAME, Parameters()).encode())
    else:
        opener: dict[int, Callable[[], Request]] = {
            MessageType.SUBSCRIBE: lambda: client.subscribe(NS, NAME),
            MessageType.FETCH: lambda: client.fetch(NS, NAME),
            MessageType.TRACK_STATUS: lambda: client.track_status(NS, NAME),
            MessageType.PUBLISH_NAMESPACE: lambda: client.publish_namespace(NS),
            MessageType.SUBSCRIBE_NAMESPACE: lambda: client.subscribe_namespace(TrackNamespace.of("kvcs-1")),
            MessageType.SUBSCRIBE_TRACKS: lambda: client.subscribe_tracks(TrackNamespace.of("kvcs-1")),
            MessageType.PUBLISH: lambda: client.publish(NS, NAME),
        }
        sid = opener[kind]().stream_id
    pair.transfer()
    pair.take("client")
    pair.take("server")
    assert sid in pair.server.requests and pair.server.closed is None
    return sid


def send(session: Session, sid: int, event: RequestEvent) -> None:
    """Our side sends `event` through the session's checked API."""
    if event is EV.SUBSCRIBE_OK:
        session.subscribe_ok(sid)
    elif event is EV.FETCH_OK:
        session.fetch_ok(sid, Location(0, 0))
    elif event in (EV.REQUEST_OK, EV.UPDATE_OK):
        session.request_ok(sid)
    elif event in (EV.REQUEST_ERROR, EV.UPDATE_ERROR):
        session.reject(sid, RequestErrorCode.INTERNAL_ERROR, "no")
    elif event is EV.REQUEST_UPDATE:
        session.request_update(sid, Parameters())
    elif event is EV.PUBLISH_STATE_NOTIFY:
        session.publish_state_notify(sid, Parameters())
    elif event is EV.PUBLISH_DONE:
        session.publish_done(sid, PublishDoneCode.TRACK_ENDED)
    elif event is EV.NAMESPACE:
        session.send_namespace(sid, SUFFIX)
    elif event is EV.NAMESPACE_DONE:
        session.send_namespace_done(sid, SUFFIX)
    elif event is EV.PUBLISH_SKIPPED:
        session.send_publish_skipped(sid, SUFFIX, b"t")
    elif event is EV.GOAWAY:
        session.goaway(stream_id=sid)
    elif event is EV.FIN:
        session.finish_request(sid)
    else:
        session.cancel(sid)


_next_rid = {"client": 1000, "server": 1001}


def inject(receiver: Session, sid: int, kind: int, event: RequestEvent) -> None:
    """The peer's `event` arrives at `receiver` as bytes (or FIN / reset), written raw: no checks."""
    if event is EV.FIN:
        receiver.receive_stream_data(sid, b"", True)
        return
    if event is EV.CANCEL:
        receiver.receive_stream_reset(sid, 0x1)
        return
    if event is EV.REQUEST_UPDATE:
        side = "server" if receiver.is_client else "client"
        _next_rid[side] += 2
        data = RequestUpdate(_next_rid[side], Parameters()).encode()
    else:
        data = {
            EV.SUBSCRIBE_OK: SubscribeOk(7, Parameters(), ()),
            EV.FETCH_OK: FetchOk(0, Location(0, 0), Parameters(), ()),
            EV.REQUEST_OK: RequestOk(Parameters(), ()),
            EV.UPDATE_OK: RequestOk(Parameters(), ()),
            EV.REQUEST_ERROR: RequestError(RequestErrorCode.INTERNAL_ERROR, 0, b"no", None),
            EV.UPDATE_ERROR: RequestError(RequestErrorCode.INTERNAL_ERROR, 0, b"no", None),
            EV.PUBLISH_STATE_NOTIFY: PublishStateNotify(Parameters()),
            EV.PUBLISH_DONE: PublishDone(PublishDoneCode.TRACK_ENDED, 0, b""),
            EV.NAMESPACE: Namespace(SUFFIX),
            EV.NAMESPACE_DONE: NamespaceDone(SUFFIX),
            EV.PUBLISH_SKIPPED: PublishSkipped(SUFFIX, b"t"),
            EV.GOAWAY: Goaway(b"", 0),
        }[event].encode()
    receiver.receive_stream_data(sid, data, False)


def drive(pair: Pair, kind: int, receiver_side: Side, state: RequestState) -> tuple[Session, Request]:
    """The session at `receiver_side` brought to `state` along the table's shortest path: its own events
    through its API (a CANCELLED it reaches by cancelling itself, so the peer's bytes still arrive), the
    peer's injected without FIN."""
    path = reachable(kind)[state]
    sid = open_request(pair, kind, fin_allowed=False)
    receiver = pair.client if receiver_side is Q else pair.server
    for sender, event in path:
        if sender is receiver_side or event is EV.CANCEL:
            send(receiver, sid, event)
        else:
            inject(receiver, sid, kind, event)
    req = receiver.requests[sid]
    assert receiver.closed is None and req.state is state, (path, req, receiver.closed)
    receiver.commands()
    receiver.events()
    return receiver, req


CELLS = [(k, s, e, t) for k in KINDS for s in SIDES for e in EVENTS for t in STATES if t in reachable(k)]


def wire_cell(kind: int, sender: Side, event: RequestEvent, state: RequestState) -> bool:
    """Whether a receiver sees this cell: a REQUEST_OK / REQUEST_ERROR is read as `answer_event` says."""
    return event not in ANSWERS or answer_event(kind, event in (EV.REQUEST_OK, EV.UPDATE_OK), sender, state) is event


@pytest.mark.parametrize(("kind", "sender", "event", "state"), [c for c in CELLS if wire_cell(*c)],
                         ids=lambda v: getattr(v, "name", str(v)))
def test_every_cell_received(kind: int, sender: Side, event: RequestEvent, state: RequestState) -> None:
    """The peer sends `event` on a request in `state`: a refused cell closes the session with the
    table's code and a reason naming the event; a legal one lands in the table's next state."""
    pair = make_pair()
    receiver, req = drive(pair, kind, R if sender is Q else Q, state)
    cell = TABLE[(kind, sender, event, state)]
    if event is EV.NAMESPACE_DONE and isinstance(TABLE[(kind, sender, EV.NAMESPACE, state)], RequestState):
        inject(receiver, req.stream_id, kind, EV.NAMESPACE)  # its content check wants a NAMESPACE first
    if event in (EV.UPDATE_OK, EV.UPDATE_ERROR):
        req.pending_updates.append(998)  # an outstanding update to answer (its own check, not the table's)
    inject(receiver, req.stream_id, kind, event)
    if isinstance(cell, Refusal):
        assert receiver.closed is not None and not receiver.closed.by_peer
        assert receiver.closed.code == cell.code and event.value in receiver.closed.reason, receiver.closed
        assert cell.reason in receiver.closed.reason
    else:
        assert receiver.closed is None, receiver.closed
        assert req.state is cell


@pytest.mark.parametrize(("kind", "side", "event", "state"), [c for c in CELLS if c[2] is not EV.UPDATE_ERROR
                                                               and c[2] is not EV.UPDATE_OK],
                         ids=lambda v: getattr(v, "name", str(v)))
def test_every_cell_sent(kind: int, side: Side, event: RequestEvent, state: RequestState) -> None:
    """Our API refuses exactly the table's refused cells (and sends nothing); a legal one moves our
    state to the table's next one, unless a check outside the lifecycle stops it first (our direction
    already FINed or reset, no update outstanding, a NAMESPACE_DONE never announced)."""
    pair = make_pair()
    session, req = drive(pair, kind, side, state)
    ok = event in (EV.REQUEST_OK, EV.UPDATE_OK)
    if event in ANSWERS:
        event = answer_event(kind, ok, side, state)  # request_ok / reject choose it themselves
    cell = TABLE[(kind, side, event, state)]
    try:
        send(session, req.stream_id, event)
    except SessionUsageError as exc:
        if isinstance(cell, Refusal):
            assert event.value in str(exc) and cell.reason in str(exc)
        else:
            assert any(t in str(exc) for t in ("already finished or reset", "nothing to answer", "never announced",
                                               "already sent")), exc
        assert req.state is state and not session.commands()
        return
    assert not isinstance(cell, Refusal), f"{event} sent in {state}; the table refuses it: {cell}"
    assert req.state is cell


def test_stop_sending_alone_cancels_a_request() -> None:
    """Either half of a cancellation ends the request (EDR "Request Cancellation"): a requester that has
    FINed cancels with STOP_SENDING only."""
    pair = make_pair()
    sid = open_request(pair, MessageType.SUBSCRIBE, fin_allowed=True)
    pair.server.receive_stop_sending(sid, 0x1)
    assert pair.server.requests[sid].state is C and pair.server.closed is None


# ---------------------------------------------------------------------------------------------------
# Random sequences through a session pair


@settings(max_examples=150, deadline=None)
@given(st.sampled_from(KINDS), st.lists(st.tuples(st.sampled_from(SIDES), st.sampled_from(EVENTS)), max_size=10))
def test_random_sequences_keep_both_ends_in_one_state(kind: int, steps: list[tuple[Side, RequestEvent]]) -> None:
    """What one end's API lets it send, the other end accepts (no session is closed), both ends agree on
    the state after every exchange, and a terminal state is never left."""
    pair = make_pair()
    sid = open_request(pair, kind, fin_allowed=True)
    sessions = {Q: pair.client, R: pair.server}
    goaway_sent: set[Side] = set()
    state = pair.client.requests[sid].state
    for sender, event in steps:
        if event is EV.GOAWAY and sender in goaway_sent:
            continue  # a second GOAWAY on one stream is its own check (profile §6.2)
        before = {s: sessions[s].requests[sid].state for s in SIDES}
        try:
            send(sessions[sender], sid, event)
        except SessionUsageError:
            assert sessions[sender].requests[sid].state is before[sender]
            continue
        goaway_sent |= {sender} if event is EV.GOAWAY else set()
        pair.transfer()
        assert pair.client.closed is None and pair.server.closed is None, (pair.client.closed, pair.server.closed)
        states = {s: sessions[s].requests[sid].state for s in SIDES}
        assert states[Q] is states[R], (steps, states)
        assert state not in TERMINAL or states[Q] is state
        state = states[Q]
