"""kvcs-consumer: operational considerations (KVCS "Operational Considerations").

The harness relay the consumer under test connects to records the QUIC transport parameters each session
sent in its handshake; the consumer's sessions are those that ask for something (SUBSCRIBE_NAMESPACE,
SUBSCRIBE, FETCH: the harness publishers only announce).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from kvconform.conformance.kvcs.consumer.checks import run, small_spec
from kvconform.conformance.kvcs.consumer.harness import HarnessPublisher, RecordingRelay, Stage
from kvconform.conformance.kvcs.streams import REQUIREMENT, grant_problem
from kvconform.moqt.messages import Fetch, Subscribe, SubscribeNamespace
from kvconform.moqt.relay import Peer
from kvconform.moqt.session import Event, Request, SetupReceived
from kvconform.targets.spec import Pics
from kvconform.verdicts import check_no_problems, inconclusive


@dataclass
class Grants:
    """initial_max_streams_uni per session (peer number) of one harness relay, and which sessions asked."""

    granted: dict[int, int | None] = field(default_factory=dict)
    askers: set[int] = field(default_factory=set)


def grant_recording_relay(grants: Grants) -> type[RecordingRelay]:
    """A harness relay class that records into ``grants`` (a class per scenario: Stage takes classes)."""

    class GrantRecordingRelay(RecordingRelay):
        def dispatch(self, peer: Peer, event: Event) -> None:
            if isinstance(event, SetupReceived):  # the QUIC handshake is done: the peer's grant is known
                params = peer.conn.peer_transport_parameters
                grants.granted[peer.number] = None if params is None else params.initial_max_streams_uni or 0
            super().dispatch(peer, event)

        def handle_subscribe_namespace(self, peer: Peer, req: Request, msg: SubscribeNamespace) -> None:
            grants.askers.add(peer.number)
            super().handle_subscribe_namespace(peer, req, msg)

        def handle_subscribe(self, peer: Peer, req: Request, msg: Subscribe) -> None:
            grants.askers.add(peer.number)
            super().handle_subscribe(peer, req, msg)

        def handle_fetch(self, peer: Peer, req: Request, msg: Fetch) -> None:
            grants.askers.add(peer.number)
            super().handle_fetch(peer, req, msg)

    return GrantRecordingRelay


@pytest.mark.req("KVCS-OPS-STREAMS")
def test_enough_unidirectional_streams_are_granted(kvcs_consumer: Any, seed: int, pics: Pics, tmp_path: Path) -> None:
    """Each session the consumer opens to the relay grants it initial_max_streams_uni >= 2 x pipelined
    layers + 2 (PICS kvcs.consumer.pipeline_layers; default the layers of the cache it retrieves)."""
    spec = small_spec(seed)
    grants = Grants()
    stage = Stage(spec, [(HarnessPublisher(spec), (0,))], relays=(grant_recording_relay(grants),))
    run(kvcs_consumer, stage, tmp_path, "reading the consumer's transport parameters")
    if not grants.askers:
        inconclusive(f"the consumer opened no session that asked the relay for anything [{REQUIREMENT}]")
    problems = [p for n in sorted(grants.askers)
                if (p := grant_problem(grants.granted.get(n), who="the consumer", peer=f"the relay (session#{n})",
                                       pics=pics, role="consumer", default_layers=spec.layers)) is not None]
    check_no_problems(problems, what="the consumer's sessions grant too few unidirectional streams", req=REQUIREMENT)
