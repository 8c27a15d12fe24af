"""A KVCS transfer on the deterministic transport (issue 24 items 1 and 3): the reference publisher, the reference
relay and the reference consumer in one `kvconform.moqt.simrun.simulate` run, on virtual time.

`publish_and_consume(spec)` is a `simulate` main: the relay (``kvconform.moqt.relay.Relay``, authorizing
everything) starts, the publisher (``KvcsPublisher``, a fixed Publication ID so that a run is a function of its
seed) connects as ``pub`` and publishes the whole cache, then the consumer (``Consumer``, as ``consumer``) retrieves
it with FETCH (a completed cache). With ``live`` the consumer starts at once and the publisher holds its first
layer until the relay has subscribed to every data track for it (the consumer found the publication in
production): the consumer subscribes with a fill, the exactly-once pattern. The consumer's budget and stall bounds, the
publisher's layer pacing and every QUIC timer run on the loop's virtual clock. The value of a run is a summary of
what the consumer assembled; the invariant (every wanted layer's digest is the test-content convention's, none
rejected, not given up) raises ``AssertionError`` naming KVCS-VERIFY-LAYER-USABLE.
"""

from __future__ import annotations

import asyncio

from kvconform.kvcs.consume_result import ConsumeResult, ConsumerIdentity, ConsumerOptions, convention_layer_digest
from kvconform.kvcs.consumer import Consumer
from kvconform.kvcs.content import CacheSpec, SegmentLayout
from kvconform.kvcs.publisher import KvcsPublisher
from kvconform.moqt import client as mc
from kvconform.moqt.relay import Relay
from kvconform.moqt.session import Role, SessionConfig
from kvconform.moqt.simrun import Main, Sim

__all__ = ["PUB_ID", "HeldPublisher", "check_intact", "publish_and_consume"]

PUB_ID = bytes(range(16))  # fixed: a random Publication ID would make every run's transcript differ
TIMEOUT = 20.0  # virtual seconds: every wait of the scenario is bounded by it
LAYER_INTERVAL = 0.01  # virtual seconds of computation per layer in the live variant
HOLD_POLL = 0.001  # virtual seconds between two looks for the relay's subscriptions


class HeldPublisher(KvcsPublisher):
    """Holds segment 0 (after its first manifest version) until every data track has a subscriber (bounded)."""

    async def segment_added(self, seg: SegmentLayout) -> None:
        if seg.segment != 0:
            return
        deadline = asyncio.get_running_loop().time() + TIMEOUT
        while not all(self.local[t.name].subscribers for t in self.tracks(0)):
            assert asyncio.get_running_loop().time() < deadline, "the consumer never subscribed to the data tracks"
            await asyncio.sleep(HOLD_POLL)  # virtual time; the client raises no event on an incoming SUBSCRIBE


def check_intact(spec: CacheSpec, result: ConsumeResult) -> None:
    """Every layer assembled, with the digest the test-content convention gives for the segments used."""
    bad = {layer: (digest.hex()[:16] if digest is not None else result.reasons.get(layer))
           for layer, digest in result.layers.items()
           if digest is None or digest != convention_layer_digest(spec, layer, result.segments)}
    assert not bad and not result.gave_up and result.segments, (
        f"KVCS-VERIFY-LAYER-USABLE: the consumer did not assemble the publication intact: layers {bad}, gave_up "
        f"{result.gave_up}, publications {result.publications}")
    assert sorted(result.layers) == list(range(spec.layers)), f"layers {sorted(result.layers)}"
    assert not result.rejected, f"KVCS-PAYLOAD-DISCARD: an honest publication's objects rejected: {result.rejected}"


def publish_and_consume(spec: CacheSpec, *, live: bool = False) -> Main:
    """The scenario as a `simulate` main (see the module docstring)."""

    async def main(sim: Sim) -> object:
        sim.name_next("relay")
        relay = Relay(clock=sim.loop.time, wall_clock=sim.loop.wall_time)
        await relay.start()
        clients: list[mc.MoqtClient] = []
        publishing: asyncio.Future[None] | None = None
        try:
            sim.name_next("pub")
            config = SessionConfig(role=Role.CLIENT, implementation="kvconform-kvcs-publisher/0.1")
            pub_client = await mc.connect(relay.url, config=config, timeout=TIMEOUT)
            clients.append(pub_client)
            publisher = (HeldPublisher(spec, pub_id=PUB_ID, layer_interval=LAYER_INTERVAL) if live
                         else KvcsPublisher(spec, pub_id=PUB_ID))
            publishing = asyncio.ensure_future(publisher.publish(pub_client, None, timeout=TIMEOUT))
            if not live:
                await asyncio.wait_for(asyncio.shield(publishing), TIMEOUT)
            sim.name_next("consumer")
            options = ConsumerOptions(relays=(relay.url,), budget=TIMEOUT, stall_timeout=5.0)
            result = await Consumer(ConsumerIdentity.from_spec(spec), options).run()
            await asyncio.wait_for(asyncio.shield(publishing), TIMEOUT)
            check_intact(spec, result)
            return {"mode": result.mode, "layers": len(result.layers), "segments": result.segments,
                    "elapsed": round(result.elapsed, 6)}
        finally:
            if publishing is not None and not publishing.done():
                publishing.cancel()
            for client in reversed(clients):
                await client.close(timeout=TIMEOUT)
            await relay.close(TIMEOUT)

    return main
