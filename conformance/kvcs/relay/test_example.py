"""kvcs-relay: the KVCS text's example namespace through the relay (KVCS "Encoding Examples"; moqt-d22-profile
section 11.3, whose SUBSCRIBE and SUBSCRIBE_NAMESPACE examples use it).

The namespace is the vector printed in the text (vectors/kvcs/namespace.json, flag SpecExample): Scope ID
6d1c6481..., Compatibility ID 5ed5c2f2..., Anchor Key 65327588..., Publication ID 0123456789abcdef x2. It
applies when one declared scope has that Scope ID (the loopback testbed's scope 0 does). Discovery with the
4-field content prefix must name exactly the Publication ID, and a consumer with the KVCS recipe must get
every object of it once. Its fixed identifiers recur across runs, so the content is fixed too (a relay that
kept the objects of an earlier run holds the same bytes) and the tracks are not ended.
"""

from __future__ import annotations

import numpy as np
import pytest

from kvconform.fixtures.kvcs.relay import (
    KvcsRelay,
    content,
    describe,
    kvcs_publication,
    scope_id,
    subscribe_publication,
    until_received,
)
from kvconform.fixtures.moqt import CLIENT_TIMEOUT, expect_none, record, run_findings, session, waiting
from kvconform.kvcs.content import example_spec
from kvconform.kvcs.namespace import KvcsNamespace
from kvconform.moqt.structures import Location, TrackNamespace
from kvconform.moqt.vi64 import Reader
from kvconform.testvectors import load_vectors
from kvconform.verdicts import Findings, not_applicable

pytestmark = pytest.mark.usefixtures("kvcs_relay_sanity")

EXAMPLE_CACHE_DURATION_MS = 60_000  # what a relay keeps of one run is gone before long


def example_namespace() -> KvcsNamespace:
    """The text's 108-octet example namespace, decoded from its vector."""
    case = next(c for c in load_vectors("kvcs-namespace") if "SpecExample" in c.flags and c.result == "valid")
    return KvcsNamespace.parse(TrackNamespace.decode(Reader(bytes.fromhex(case["encoded"]))))


@pytest.mark.req("KVCS-EX-NAMESPACE", "KVCS-LIVE-EXACTLY-ONCE", "MOQT-NS-SUBSCRIBE-NAMESPACE")
def test_the_texts_example_namespace_is_discovered_and_delivered(kvcs_relay: KvcsRelay,
                                                                 rng: np.random.Generator) -> None:
    example = example_namespace()
    view = next((v for v in kvcs_relay.scopes if scope_id(v) == example.scope_id), None)
    if view is None:
        not_applicable(f"no scope of PICS kvcs.relay.scopes has the example's Scope ID {example.scope_id.hex()}")
    token = view.token("subscriber")

    async def scenario(f: Findings) -> None:
        spec = example_spec(layers=2, blocks=2, seed=0x6D1C)  # fixed bytes: see the module docstring
        async with session(view, "watcher") as watcher_client, session(view, "consumer") as consumer:
            record("sent", "SUBSCRIBE_NAMESPACE", prefix=describe(example.content_prefix()))
            watcher = await watcher_client.subscribe_namespace(example.content_prefix(), auth=token)
            async with kvcs_publication(view, spec, rng, namespace=example,
                                        cache_duration_ms=EXAMPLE_CACHE_DURATION_MS) as pub:
                with waiting("NAMESPACE for the example's publication", "MOQT-NS-SUBSCRIBE-NAMESPACE"):
                    notice = await watcher.next(CLIENT_TIMEOUT)
                f.expect(notice == ("namespace", TrackNamespace((example.pub_id,))), "MOQT-NS-SUBSCRIBE-NAMESPACE",
                         f"notice for the example's content prefix: seen {notice[0].upper()} {describe(notice[1])}, "
                         f"expected NAMESPACE with the suffix (Publication ID {example.pub_id.hex()},)")
                subs = await subscribe_publication(consumer, pub, token, manifest=False)
                # The example's 108-octet namespace was taken as published: announced, routed, subscribed.
                f.expect(True, "KVCS-EX-NAMESPACE", "")
                pub.publish_manifest()
                for g in range(spec.layers):
                    pub.publish_layer(g)
                for name, sub in subs.items():
                    await until_received(sub, Location(spec.layers - 1, pub.blocks - 1), "KVCS-LIVE-EXACTLY-ONCE")
                    where = f"{name.decode()}, L={sub.largest}"
                    expect_none(f, "KVCS-LIVE-EXACTLY-ONCE", [f"[{where}] {v}" for v in sub.violations])
                    content(f, "KVCS-LIVE-EXACTLY-ONCE", where, name, sub.objects, pub)
                    missing = sorted(set(pub.published(name)) - set(sub.payloads()))
                    f.expect(not missing, "KVCS-LIVE-EXACTLY-ONCE",
                             f"[{where}] objects: seen {[str(m) for m in missing]} never delivered, expected every "
                             "published one")

    run_findings("the text's example namespace", scenario, req="KVCS-EX-NAMESPACE")
