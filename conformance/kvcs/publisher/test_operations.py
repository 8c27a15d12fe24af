"""kvcs-publisher: operational considerations (KVCS "Operational Considerations").

The harness is the relay the publisher under test connects to; it reads the QUIC transport parameters the
publisher's endpoint sent in the handshake (``Observation.granted_streams_uni``).
"""

from __future__ import annotations

from typing import Any

import pytest

from kvconform.conformance.kvcs.streams import check_grant
from kvconform.targets.kvcs.recording_relay import need_publication
from kvconform.targets.spec import Pics


@pytest.mark.req("KVCS-OPS-STREAMS")
def test_enough_unidirectional_streams_are_granted(kvcs_plain: Any, pics: Pics) -> None:
    """The publisher grants the relay's session initial_max_streams_uni >= 2 x pipelined layers + 2
    (PICS kvcs.publisher.pipeline_layers; default the 20 layers of the plain case)."""
    obs = kvcs_plain
    need_publication(obs)
    check_grant(obs.granted_streams_uni, who="the publisher", peer="the relay's session (the harness)", pics=pics,
                role="publisher", default_layers=obs.spec.layers)
