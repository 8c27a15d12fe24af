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
    content_problems,
    describe,
    kvcs_publication,
    scope_id,
    subscribe_publication,
    until_received,
)
from kvconform.fixtures.moqt import CLIENT_TIMEOUT, record, run_check, session
from kvconform.kvcs.content import example_spec
from kvconform.kvcs.namespace import KvcsNamespace
from kvconform.moqt.structures import Location, TrackNamespace
from kvconform.moqt.vi64 import Reader
from kvconform.testvectors import load_vectors
from kvconform.verdicts import not_applicable

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

    async def scenario() -> list[str]:
        problems: list[str] = []
        spec = example_spec(layers=2, blocks=2, seed=0x6D1C)  # fixed bytes: see the module docstring
        async with session(view, "watcher") as watcher_client, session(view, "consumer") as consumer:
            record("sent", "SUBSCRIBE_NAMESPACE", prefix=describe(example.content_prefix()))
            watcher = await watcher_client.subscribe_namespace(example.content_prefix(), auth=token)
            async with kvcs_publication(view, spec, rng, namespace=example,
                                        cache_duration_ms=EXAMPLE_CACHE_DURATION_MS) as pub:
                notice = await watcher.next(CLIENT_TIMEOUT)
                if notice != ("namespace", TrackNamespace((example.pub_id,))):
                    problems.append(f"SUBSCRIBE_NAMESPACE of the example's content prefix got {notice[0].upper()} "
                                    f"{describe(notice[1])}, expected NAMESPACE with the suffix (Publication ID "
                                    f"{example.pub_id.hex()},)")
                subs = await subscribe_publication(consumer, pub, token, manifest=False)
                pub.publish_manifest()
                for g in range(spec.layers):
                    pub.publish_layer(g)
                for name, sub in subs.items():
                    await until_received(sub, Location(spec.layers - 1, pub.blocks - 1))
                    where = f"{name.decode()}, L={sub.largest}"
                    problems += [f"[{where}] {v}" for v in sub.violations]
                    problems += content_problems(where, name, sub.objects, pub)
                    missing = sorted(set(pub.published(name)) - set(sub.payloads()))
                    if missing:
                        problems.append(f"[{where}] published objects never delivered: {[str(m) for m in missing]}")
        return problems

    run_check(scenario, "KVCS-EX-NAMESPACE", "the text's example namespace")
