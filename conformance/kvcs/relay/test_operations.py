"""kvcs-relay: operational considerations (KVCS "Operational Considerations").

A relay pipelines the layers of the publications it forwards: it receives them from a publisher's session
and sends them on to subscribers. What it grants the harness's sessions in the QUIC handshake
(initial_max_streams_uni) is read from the transport parameters the harness's client received.
"""

from __future__ import annotations

import numpy as np
import pytest

from kvconform.conformance.kvcs.streams import REQUIREMENT, grant_problem
from kvconform.fixtures.kvcs.relay import KvcsRelay, cache_spec
from kvconform.fixtures.moqt import record, run, session
from kvconform.targets.spec import Pics
from kvconform.verdicts import check_no_problems


@pytest.mark.req("KVCS-OPS-STREAMS")
def test_enough_unidirectional_streams_are_granted(kvcs_relay: KvcsRelay, pics: Pics,
                                                   rng: np.random.Generator) -> None:
    """The relay grants a subscriber's and a publisher's session initial_max_streams_uni >= 2 x pipelined
    layers + 2 (PICS kvcs.relay.pipeline_layers; default the layers of the suite's publications)."""
    view = kvcs_relay.scopes[0]
    default_layers = int(cache_spec(rng).layers)

    async def scenario() -> dict[str, int | None]:
        grants: dict[str, int | None] = {}
        for who in ("subscriber", "publisher"):
            async with session(view, who) as client:
                params = client.connection.peer_transport_parameters
                grants[who] = None if params is None else params.initial_max_streams_uni or 0
                record("received", "QUIC transport parameters", who=who, initial_max_streams_uni=grants[who])
        return grants

    grants = run(scenario, what="reading the relay's transport parameters")
    problems = [p for who, granted in grants.items()
                if (p := grant_problem(granted, who="the relay", peer=f"the harness's {who} session", pics=pics,
                                       role="relay", default_layers=default_layers)) is not None]
    check_no_problems(problems, what="initial_max_streams_uni the relay granted", req=REQUIREMENT)
