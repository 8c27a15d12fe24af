"""kvcs-publisher: Track and Object Properties (KVCS "Publisher Behavior"; moqt-d22-profile section 8).

Track Properties are read from every SUBSCRIBE_OK and FETCH_OK the publisher sent for a data track, Object
Properties from every object it sent live.
"""

from __future__ import annotations

from typing import Any

import pytest

from kvconform.moqt.data import SubgroupObject
from kvconform.moqt.errors import MoqtDecodeError
from kvconform.moqt.structures import PropertyType, property_int
from kvconform.targets.kvcs.recording_relay import need_publication, track_name
from kvconform.verdicts import DriverError, check_no_problems

TIMEOUTS = (PropertyType.OBJECT_DELIVERY_TIMEOUT, PropertyType.SUBGROUP_DELIVERY_TIMEOUT)


@pytest.mark.req("KVCS-PUB-NO-DELIVERY-TIMEOUT")
def test_no_delivery_timeout_on_data_tracks(kvcs_publication: Any) -> None:
    """No data track carries a non-zero OBJECT_DELIVERY_TIMEOUT or SUBGROUP_DELIVERY_TIMEOUT, neither as a Track
    Property (SUBSCRIBE_OK, FETCH_OK) nor as an Object Property (also not inside IMMUTABLE_PROPERTIES)."""
    obs = kvcs_publication
    need_publication(obs)
    problems = []
    data = {t.name for t in obs.data_tracks()}
    for a in obs.answers:
        if a.track in data and a.ok:
            for ptype in TIMEOUTS:
                value = property_int(a.track_properties, ptype)
                if value:
                    problems.append(f"{track_name(a.track)}: {a.kind} answer has Track Property {ptype.name} = "
                                    f"{value} ms")
    for o in obs.objects:
        if o.track not in data or not o.properties:
            continue
        try:
            pairs = SubgroupObject(o.location.object, properties=o.properties).property_pairs()
        except MoqtDecodeError as exc:
            # what does not decode cannot be shown free of a timeout: a malformed object, a MOQT data-stream matter
            raise DriverError(f"{track_name(o.track)} {o.location}: Object Properties do not decode: {exc}") from exc
        for ptype in TIMEOUTS:
            value = property_int(pairs, ptype)
            if value:
                problems.append(f"{track_name(o.track)} {o.location} ({o.via}): Object Property {ptype.name} = "
                                f"{value} ms")
    check_no_problems(problems, what=f"case {obs.case.name}: a data track sets a delivery timeout",
                      req="KVCS-PUB-NO-DELIVERY-TIMEOUT")


@pytest.mark.req("KVCS-PUB-MAX-CACHE-DURATION")
def test_max_cache_duration_is_set(kvcs_publication: Any) -> None:
    """Every data track carries the Track Property MAX_CACHE_DURATION (non-zero), in each SUBSCRIBE_OK and
    FETCH_OK."""
    obs = kvcs_publication
    need_publication(obs)
    problems = []
    data = {t.name for t in obs.data_tracks()}
    for a in obs.answers:
        if a.track in data and a.ok and not property_int(a.track_properties, PropertyType.MAX_CACHE_DURATION):
            problems.append(f"{track_name(a.track)}: {a.kind} answer has no MAX_CACHE_DURATION Track Property "
                            f"(Track Properties {[(p.type, p.value) for p in a.track_properties]})")
    check_no_problems(problems, what=f"case {obs.case.name}: MAX_CACHE_DURATION is not set",
                      req="KVCS-PUB-MAX-CACHE-DURATION")
