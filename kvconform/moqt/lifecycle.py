"""The MOQT request lifecycle as one table (profile §4.4, §6.2, §11.1; EDR "Subscriptions", "Graceful
Request Stream Closure", "Request Cancellation and Rejection", "REQUEST_UPDATE").

A request lives on one bidirectional stream; what either end sends there moves it: responses, updates,
subscription and namespace messages, a FIN, a cancellation. `TABLE` holds one cell for every
(request kind, sender, event, state): the next state, or the `Refusal` the receiver answers with. This
module knows no streams, sessions or which end "we" are: the session asks `transition` both for what it
receives (a refused cell closes the session with the cell's code) and for what it is asked to send (a
refused cell is a usage error and nothing is sent), so the two ends judge a request by the same cells.

Invariants (tests/moqt/test_lifecycle.py walks every cell, the pure table and through a session pair):

* DONE, FAILED and CANCELLED are terminal: no cell leads out of them.
* CANCELLED accepts every event and stays: a message may have crossed the cancellation on the wire.
* In DONE and FAILED the side that did not send the ending message (REQUEST_ERROR, PUBLISH_DONE, the
  TRACK_STATUS answer) may still send what it could send before the end (its message crossed it); the
  ending side's own messages after its last one are refused. FIN and cancellation are always accepted.
* A PUBLISH starts PENDING like a SUBSCRIBE (EDR "Pending (Publisher)"): its publisher may send objects,
  PUBLISH_STATE_NOTIFY and PUBLISH_DONE before PUBLISH_OK, which moves it to ESTABLISHED.
* Every refusal is PROTOCOL_VIOLATION: the profile gives a message in the wrong place of a request no
  other code. The checks with codes of their own read a message's content, not the lifecycle, and stay
  in the session (Request ID parity and reuse, Track Alias reuse, MAX_REQUEST_UPDATES, NAMESPACE_DONE
  before NAMESPACE, FETCH_OK End Location, an update answer with no update outstanding).

Not events here: the message that opens a request (it creates the request, PENDING), an opening message
later on the stream (MOQT-CTRL-REQUEST-STREAM-FIRST, the session's), objects and data streams.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from kvconform.moqt.errors import SessionError
from kvconform.moqt.messages import MessageType

__all__ = [
    "EVENTS",
    "KINDS",
    "SIDES",
    "STATES",
    "TABLE",
    "LifecycleError",
    "Refusal",
    "RequestEvent",
    "RequestState",
    "Side",
    "answer_event",
    "publisher_side",
    "sends_objects",
    "transition",
]


class RequestState(enum.Enum):
    """Pending until the first response; Established after an OK; then Done, Failed or Cancelled."""

    PENDING = "pending"
    ESTABLISHED = "established"
    DONE = "done"
    FAILED = "failed"
    CANCELLED = "cancelled"


class Side(enum.Enum):
    """Which end of the request stream sends an event: the one that opened it, or the other."""

    REQUESTER = "requester"
    RESPONDER = "responder"


class RequestEvent(enum.Enum):
    """What moves a request. The value is what appears on the wire."""

    SUBSCRIBE_OK = "SUBSCRIBE_OK"
    FETCH_OK = "FETCH_OK"
    REQUEST_OK = "REQUEST_OK"  # answering the request itself (PUBLISH_OK, TRACK_STATUS_OK, ...)
    REQUEST_ERROR = "REQUEST_ERROR"  # refusing the request itself
    UPDATE_OK = "REQUEST_OK (answering a REQUEST_UPDATE)"
    UPDATE_ERROR = "REQUEST_ERROR (answering a REQUEST_UPDATE)"
    REQUEST_UPDATE = "REQUEST_UPDATE"
    PUBLISH_STATE_NOTIFY = "PUBLISH_STATE_NOTIFY"
    PUBLISH_DONE = "PUBLISH_DONE"
    NAMESPACE = "NAMESPACE"
    NAMESPACE_DONE = "NAMESPACE_DONE"
    PUBLISH_SKIPPED = "PUBLISH_SKIPPED"
    GOAWAY = "GOAWAY"
    FIN = "FIN"
    CANCEL = "RESET_STREAM/STOP_SENDING"  # cancellation (profile §4.4): either half means it


@dataclass(frozen=True)
class Refusal:
    """An illegal cell: the Session Termination code, why, and the text that requires it."""

    code: int
    reason: str
    cite: str


class LifecycleError(Exception):
    """An event the table refuses in the request's state; `code` is the Session Termination code."""

    def __init__(self, kind: int, sender: Side, event: RequestEvent, state: RequestState, refusal: Refusal) -> None:
        super().__init__(f"{event.value} from the {sender.value} of a {MessageType(kind).name} "
                         f"({state.value}): {refusal.reason} ({refusal.cite})")
        self.code = refusal.code
        self.refusal = refusal


Q, R = Side.REQUESTER, Side.RESPONDER
P, E, D, F, C = (RequestState.PENDING, RequestState.ESTABLISHED, RequestState.DONE, RequestState.FAILED,
                 RequestState.CANCELLED)
EV = RequestEvent
LIVE = (P, E)
KINDS = (MessageType.SUBSCRIBE, MessageType.FETCH, MessageType.TRACK_STATUS, MessageType.PUBLISH_NAMESPACE,
         MessageType.SUBSCRIBE_NAMESPACE, MessageType.SUBSCRIBE_TRACKS, MessageType.PUBLISH)
SIDES = (Q, R)
EVENTS = tuple(RequestEvent)
STATES = tuple(RequestState)

_Cells = dict[tuple[Side, RequestEvent], dict[RequestState, RequestState]]

# Every kind, in the live states: GOAWAY migrates the request either way (profile §6.2), a cancellation
# by either end ends it (profile §4.4).
_EVERY_KIND: _Cells = {
    (Q, EV.GOAWAY): {P: P, E: E},
    (R, EV.GOAWAY): {P: P, E: E},
    (Q, EV.CANCEL): {P: C, E: C},
    (R, EV.CANCEL): {P: C, E: C},
}

# The requester updates and the responder answers each update (SUBSCRIBE, FETCH and the namespace kinds).
# An update may precede the response (the EDR limits it to no state); the responder's first OK/ERROR
# is then still the response, so update answers exist only once ESTABLISHED. A requester's FIN is "no
# more updates" (EDR "Graceful Request Stream Closure"); the responder's FIN before its response fails
# the request.
_ANSWERED_UPDATES: _Cells = {
    (Q, EV.REQUEST_UPDATE): {P: P, E: E},
    (R, EV.UPDATE_OK): {E: E},
    (R, EV.UPDATE_ERROR): {E: E},
    (Q, EV.FIN): {P: P, E: E},
    (R, EV.FIN): {P: F, E: E},
}

# Answered by REQUEST_OK or REQUEST_ERROR, then updated (PUBLISH_NAMESPACE and the namespace subscriptions).
_OK_THEN_UPDATES: _Cells = {
    **_ANSWERED_UPDATES,
    (R, EV.REQUEST_OK): {P: E},
    (R, EV.REQUEST_ERROR): {P: F},
}

# The legal cells of the live states (profile §4.4's table); the terminal states are derived below.
_LIVE_CELLS: dict[int, _Cells] = {
    MessageType.SUBSCRIBE: {
        **_ANSWERED_UPDATES,
        (R, EV.SUBSCRIBE_OK): {P: E},
        (R, EV.REQUEST_ERROR): {P: F},
        (R, EV.PUBLISH_STATE_NOTIFY): {E: E},
        (R, EV.PUBLISH_DONE): {E: D},
        # The publisher of an Established subscription sends PUBLISH_DONE before its FIN; a FIN first
        # means the request failed (EDR "Graceful Request Stream Closure").
        (R, EV.FIN): {P: F, E: F},
    },
    MessageType.FETCH: {
        **_ANSWERED_UPDATES,
        (R, EV.FETCH_OK): {P: E},
        (R, EV.REQUEST_ERROR): {P: F},
    },
    MessageType.TRACK_STATUS: {  # its only message; answered once, then FIN; never updated (EDR REQUEST_UPDATE)
        (R, EV.REQUEST_OK): {P: D},
        (R, EV.REQUEST_ERROR): {P: F},
        (Q, EV.FIN): {P: P},
        (R, EV.FIN): {P: F},
    },
    MessageType.PUBLISH_NAMESPACE: _OK_THEN_UPDATES,
    MessageType.SUBSCRIBE_NAMESPACE: {
        **_OK_THEN_UPDATES,
        (R, EV.NAMESPACE): {E: E},
        (R, EV.NAMESPACE_DONE): {E: E},
    },
    MessageType.SUBSCRIBE_TRACKS: {
        **_OK_THEN_UPDATES,
        (R, EV.PUBLISH_SKIPPED): {E: E},
    },
    MessageType.PUBLISH: {  # the requester publishes; the responder (subscriber) updates, the publisher answers
        (R, EV.REQUEST_OK): {P: E},
        (R, EV.REQUEST_ERROR): {P: F},
        (R, EV.REQUEST_UPDATE): {P: P, E: E},
        (Q, EV.UPDATE_OK): {P: P, E: E},
        (Q, EV.UPDATE_ERROR): {P: P, E: E},
        (Q, EV.PUBLISH_STATE_NOTIFY): {P: P, E: E},
        (Q, EV.PUBLISH_DONE): {P: D, E: D},
        (Q, EV.FIN): {P: F, E: F},  # "with the exception of the sender of PUBLISH" no early FIN
        (R, EV.FIN): {P: F, E: E},
    },
}

_FIRST_RESPONSES = frozenset({EV.SUBSCRIBE_OK, EV.FETCH_OK, EV.REQUEST_OK, EV.REQUEST_ERROR})
_SECTION = "profile §4.4"


def publisher_side(kind: int) -> Side | None:
    """The end that publishes a subscription's objects: SUBSCRIBE's responder, PUBLISH's requester."""
    return {MessageType.SUBSCRIBE: R, MessageType.PUBLISH: Q}.get(MessageType(kind))


def _ender(kind: int, state: RequestState) -> Side:
    """Who sent the message that ended a request in DONE / FAILED (REQUEST_ERROR is the responder's)."""
    if state is D:
        return publisher_side(kind) or R
    return R


def _refusal(kind: int, sender: Side, event: RequestEvent, state: RequestState, cells: _Cells) -> Refusal:
    """Why an illegal cell is illegal, with the text that says so."""
    name = MessageType(kind).name
    pv = SessionError.PROTOCOL_VIOLATION
    live_states = cells.get((sender, event), {})
    if live_states and state in (D, F):
        return Refusal(pv, f"the request ended with the {_ender(kind, state).value}'s last message",
                       f"{_SECTION}: REQUEST_ERROR, PUBLISH_DONE and TRACK_STATUS's answer come last")
    if not live_states:
        if event is EV.REQUEST_UPDATE:
            return Refusal(pv, f"only the subscriber updates a {name}" if kind != MessageType.TRACK_STATUS
                           else "a TRACK_STATUS is never updated",
                           "EDR REQUEST_UPDATE: any other REQUEST_UPDATE MUST close the session, " + _SECTION)
        if event in _FIRST_RESPONSES and sender is R:
            return Refusal(pv, f"a {name} is answered by {_answer_of(kind)} or REQUEST_ERROR", _SECTION)
        return Refusal(pv, f"the {sender.value} of a {name} never sends it", _SECTION)
    if state is E and event in _FIRST_RESPONSES:
        return Refusal(pv, f"a second response; exactly one answers a {name}",
                       "MOQT-SUB-ONE-RESPONSE, profile §11.1, EDR Subscriptions")
    first = {MessageType.SUBSCRIBE: "MOQT-SUB-ONE-RESPONSE, ",
             MessageType.SUBSCRIBE_NAMESPACE: "MOQT-NS-SUBSCRIBE-NAMESPACE, "}
    return Refusal(pv, f"before the response, which comes first on a {name} stream",
                   f"{first.get(MessageType(kind), '')}{_SECTION}")


def _answer_of(kind: int) -> str:
    return {MessageType.SUBSCRIBE: "SUBSCRIBE_OK", MessageType.FETCH: "FETCH_OK"}.get(MessageType(kind), "REQUEST_OK")


def _build() -> dict[tuple[int, Side, RequestEvent, RequestState], RequestState | Refusal]:
    table: dict[tuple[int, Side, RequestEvent, RequestState], RequestState | Refusal] = {}
    for kind in KINDS:
        cells = {**_EVERY_KIND, **_LIVE_CELLS[kind]}
        for sender in SIDES:
            for event in EVENTS:
                live = cells.get((sender, event), {})
                for state in STATES:
                    cell: RequestState | Refusal
                    if state is C:
                        cell = C  # crossed the cancellation
                    elif state in LIVE:
                        cell = live[state] if state in live else _refusal(kind, sender, event, state, cells)
                    elif event in (EV.FIN, EV.CANCEL) or (live and sender is not _ender(kind, state)):
                        cell = state  # crossed the end, or closes what is already over
                    else:
                        cell = _refusal(kind, sender, event, state, cells)
                    table[(kind, sender, event, state)] = cell
    return table


# (request kind, sender, event, state) -> next state | Refusal; complete over KINDS x SIDES x EVENTS x STATES.
TABLE = _build()


def transition(kind: int, sender: Side, event: RequestEvent, state: RequestState) -> RequestState:
    """The state after `event` from `sender` on a `kind` request in `state`; raises LifecycleError."""
    cell = TABLE[(MessageType(kind), sender, event, state)]
    if isinstance(cell, Refusal):
        raise LifecycleError(kind, sender, event, state, cell)
    return cell


def answer_event(kind: int, ok: bool, sender: Side, state: RequestState) -> RequestEvent:
    """Classify a REQUEST_OK / REQUEST_ERROR (one wire type for both, profile §6.1): the responder's
    first one (PENDING) answers the request, and so does every one from a responder that answers no
    updates (PUBLISH's subscriber: a second PUBLISH_OK is a second response); the rest answer updates."""
    answers_updates = bool(_LIVE_CELLS[MessageType(kind)].get((sender, EV.UPDATE_OK)))
    if sender is R and (state is P or not answers_updates):
        return EV.REQUEST_OK if ok else EV.REQUEST_ERROR
    return EV.UPDATE_OK if ok else EV.UPDATE_ERROR


def sends_objects(kind: int, side: Side, state: RequestState) -> bool:
    """Whether `side` may send the subscription's objects now: it publishes it, and it may still send
    PUBLISH_STATE_NOTIFY (objects flow while the subscription's control messages may)."""
    return (side is publisher_side(kind) and state in LIVE
            and isinstance(TABLE[(MessageType(kind), side, EV.PUBLISH_STATE_NOTIFY, state)], RequestState))
