"""A KVCS consumer of another MOQT draft (python: target of tests/kvcs/test_honest_verdicts.py): it offers only the
ALPN moqt-23, so the harness's relays refuse every handshake (profile §1). The kvcs-consumer suite must say so once,
on MOQT-SETUP-ALPN, not blame a missing layer in every check. (MOQT-SETUP-ALPN is a rule of MOQT endpoints, not a
kvcs-consumer requirement, so this is not in the mutant lane; its publisher twin is: OtherDraftPublisher.)"""

from __future__ import annotations

import contextlib

from kvconform.kvcs.consumer import Consumer
from kvconform.moqt import quic


class OtherDraftConsumer(Consumer):
    """Connects offering ``moqt-23`` only, to every relay it is given."""

    async def _use_relay(self, relay: str) -> bool:
        with contextlib.suppress(OSError, TimeoutError):
            await quic.connect(relay, alpn=("moqt-23",), timeout=2.0)
        return False
