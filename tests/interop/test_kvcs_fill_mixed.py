"""The KVCS exactly-once pattern across stacks: aiomoqt's publisher -> a relay (ours, aiomoqt's) -> our
subscriber.

aiomoqt's bench publisher announces its namespace with two groups already published (--prefill), then
publishes live. Our subscriber uses the KVCS recipe (profile §11.3: Next Object + FILL_PARAMETERS
{Absolute Start {0,0}, ascending}) and checks profile §11.4: the fill ends with FIN, fill objects are
<= LARGEST_OBJECT, live ones above it, every Location exactly once, objects ascend within each stream.
The relay has to fill from upstream (it has cached nothing of the track).
"""

from __future__ import annotations

import asyncio
import secrets
from typing import Any

import pytest

from kvconform import evidence
from kvconform.moqt.client import Subscription, connect
from kvconform.moqt.data import ObjectStatus
from kvconform.moqt.structures import Location, TrackNamespace
from kvconform.targets import docker as dk
from kvconform.targets.spec import parse_target
from kvconform.targets.testbed import Testbed

from .disagreements import AIOMOQT_NEXT_OBJECT_REPLAY
from .peers import RelayEndpoint

pytestmark = pytest.mark.interop

PUBLISHER_TARGET = "aiomoqt-publisher"
TIMEOUT_S = 10.0
LIVE_GROUPS = 2  # complete live groups to see after the fill


async def _subscribe(url: str, namespace: str, track: bytes, last_group: int) -> Subscription:
    client = await connect(url, timeout=TIMEOUT_S)
    try:
        async with asyncio.timeout(4 * TIMEOUT_S):
            sub = await client.subscribe_with_fill(TrackNamespace.of(namespace), track, timeout=TIMEOUT_S)
            await sub.wait_fill(TIMEOUT_S)
            while not any(o.location.group > last_group for o in sub.objects):
                await sub.next_object(TIMEOUT_S)
        return sub
    finally:
        await client.close(timeout=TIMEOUT_S)


@pytest.mark.parametrize("relay", ["kvconform", pytest.param("aiomoqt", marks=AIOMOQT_NEXT_OBJECT_REPLAY)])
def test_aiomoqt_publisher_relay_our_subscriber_exactly_once(relay: str, request: pytest.FixtureRequest,
                                                            interop_testbed: Testbed,
                                                            docker_images: list[str]) -> None:
    endpoint: RelayEndpoint = request.getfixturevalue(f"{'our' if relay == 'kvconform' else 'aiomoqt'}"
                                                      "_relay_endpoint")
    target = parse_target(PUBLISHER_TARGET, interop_testbed)
    prefill, per_group = int(target.params["prefill_groups"]), int(target.params["group_size"])
    size = int(target.params["object_size"])
    namespace, track = f"kvconform-fill-{secrets.token_hex(3)}", "t"
    spec = dk.contract_spec(target.value, "moqt-publisher",
                            {"relay": endpoint.url, "namespace": namespace, "track": track, "object_size": str(size),
                             "group_size": str(per_group), "prefill_groups": str(prefill)}, dk.docker_params(target))
    last_group = prefill + LIVE_GROUPS
    with dk.running(spec) as publisher:
        publisher.wait_for_line("waiting for subscriber", TIMEOUT_S * 3)  # announced, prefill groups published
        sub = asyncio.run(_subscribe(endpoint.url, namespace, track.encode(), last_group))

    summary: dict[str, Any] = {"largest": str(sub.largest), "fills": sub.fills,
                               "objects": [(o.kind, str(o.location), o.status) for o in sub.objects]}
    evidence.record("note", "kvcs-fill", summary)
    assert set(sub.fills.values()) == {"fin"}, f"fill streams ended {sub.fills}, expected one FIN (profile §11.2)"
    assert sub.largest is not None and sub.largest.group == prefill - 1, \
        f"LARGEST_OBJECT {sub.largest}: the publisher had published groups 0..{prefill - 1}"
    assert not sub.violations, sub.violations
    normal = [o for o in sub.objects if o.end_of_range is None and o.status == ObjectStatus.NORMAL]
    expected = {Location(g, o) for g in range(last_group) for o in range(per_group)}
    got = {o.location for o in normal}
    assert expected <= got, f"missing Locations: {sorted(expected - got)[:10]}"
    assert all(len(o.payload) == size for o in normal), "payload sizes differ from the publisher's -s"
    per_stream: dict[int, list[Location]] = {}
    for o in sub.objects:
        per_stream.setdefault(o.stream_id, []).append(o.location)
    for sid, locations in per_stream.items():
        assert locations == sorted(locations), f"stream {sid}: objects out of order: {locations}"
