"""What the kvcs-consumer checks share: small caches, producer keys, how a scenario is run, and the
readings of a consumer's requests (as the harness relay recorded them) and of its result."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from kvconform.conformance.kvcs.consumer.harness import Asked, Outcome, Stage, expected_digests, play
from kvconform.kvcs.content import CacheSpec, example_spec
from kvconform.kvcs.cose import ProducerKey
from kvconform.moqt.data import GroupOrder
from kvconform.moqt.filters import LocationFilter, LocationFilterType, RangeFilter
from kvconform.moqt.parameters import FillParameters
from kvconform.moqt.structures import ParamType
from kvconform.verdicts import Findings

LAYERS = 4
BLOCKS = 4
KID = "producer-1"


def small_spec(seed: int, *, signing: ProducerKey | None = None, segments: tuple[int, ...] = (),
               layers: int = LAYERS, blocks: int = BLOCKS, tail_tokens: int = 0) -> CacheSpec:
    """A small cache (4 layers x 4 blocks of 4 tokens, 2 heads x 8 dims: 128-octet sections)."""
    sign = None if signing is None else {"alg": signing.alg, "kid": signing.kid.decode(),
                                        "private_pem": signing.private_pem()}
    return example_spec(layers=layers, blocks=blocks, segments=segments, seed=seed % 100_000 + 1, signing=sign,
                        tail_tokens=tail_tokens)


def producer_key() -> ProducerKey:
    return ProducerKey.generate("ES256", KID.encode())


def run(consumer: Any, stage: Stage, tmp: Path, what: str) -> Outcome:
    """The scenario against the consumer under test (``fixtures/kvcs/consumer.py``), bounded."""
    outcome: Outcome = consumer.play(lambda: play(consumer.driver, stage, tmp, consumer.budget), what)
    outcome.budget_known = consumer.budget_known
    return outcome


def digest_findings(found: Findings, outcome: Outcome, spec: CacheSpec, layers: list[int], *, missing: str,
                    wrong: str, blocks: int | None = None) -> None:
    """Each of ``layers`` must be reported assembled with the convention's digest: a layer absent or failed is a
    problem against ``missing``, one reported with another digest (content that is not the true one, reported
    usable) against ``wrong``. Both are asserted."""
    result = outcome.require_result()
    want = expected_digests(spec, layers, blocks)
    for req in (missing, wrong):
        if req not in found.asserted:
            found.asserted.append(req)
    for layer in layers:
        got = result.layers.get(layer, "absent")
        if got == want[layer]:
            continue
        expected = f"expected the true content's digest {want[layer].hex()[:16]}.."
        if isinstance(got, bytes):
            found.add(wrong, f"layer {layer}: reported assembled with digest {got.hex()[:16]}.., {expected}")
        else:
            reason = result.reasons.get(layer, "")
            found.add(missing, f"layer {layer}: {'failed' if got is None else got}, {expected}"
                               f"{' (' + reason + ')' if reason else ''}")


def completion_findings(found: Findings, outcome: Outcome, layers: int) -> None:
    """Once every layer is assembled the consumer must have seen its tracks complete (End of Track, PUBLISH_DONE,
    or fill FIN with every Group): it ends before its budget, not saying it gave up (KVCS-LIVE-TRACK-COMPLETE)."""
    result = outcome.require_result()
    if all(result.layers.get(layer) is not None for layer in range(layers)):
        found.expect(outcome.run.elapsed < outcome.budget and not result.gave_up, "KVCS-LIVE-TRACK-COMPLETE",
                     f"every layer assembled, but the consumer ended after {outcome.run.elapsed:.1f} s of its "
                     f"{outcome.budget:g} s budget{' and says it gave up' if result.gave_up else ''}: it did not see "
                     "the tracks complete (End of Track, PUBLISH_DONE, or fill FIN with every Group)")


def filter_of(asked: Asked) -> LocationFilter | None:
    flt = asked.param(ParamType.LOCATION_FILTER)
    return flt if isinstance(flt, LocationFilter) else None


def live_subscribe_problems(asked: Asked) -> list[str]:
    """A data SUBSCRIBE must be Next Object + FILL_PARAMETERS {Absolute Start {0,0}} (KVCS "Retrieval during
    Production"); GROUP_ORDER inside the fill, when present, Ascending (profile §11.3)."""
    problems = []
    flt = filter_of(asked)
    if flt is None or flt.type != LocationFilterType.NEXT_OBJECT:
        problems.append(f"SUBSCRIBE {asked.name!r}: LOCATION_FILTER {flt}, expected Next Object (0x05)")
    fill = asked.param(ParamType.FILL_PARAMETERS)
    inner = fill.params.get(ParamType.LOCATION_FILTER) if isinstance(fill, FillParameters) else None
    if not (isinstance(inner, LocationFilter) and inner.type == LocationFilterType.ABSOLUTE_START
            and inner.start_group == 0 and inner.start_object == 0):
        problems.append(f"SUBSCRIBE {asked.name!r}: FILL_PARAMETERS {fill}, expected a LOCATION_FILTER Absolute Start "
                        "{0,0} inside")
    order = fill.params.get(ParamType.GROUP_ORDER) if isinstance(fill, FillParameters) else None
    if order is not None and order != GroupOrder.ASCENDING:
        problems.append(f"SUBSCRIBE {asked.name!r}: fill GROUP_ORDER {order!r}, expected Ascending")
    return problems


def fetch_problems(asked: Asked, first: int, last: int) -> list[str]:
    """A data FETCH of layers first..last: Absolute Start, Group End {first,0} EndGroupDelta last-first and
    GROUP_ORDER Ascending (KVCS "Retrieval of Completed Caches")."""
    problems = []
    flt = filter_of(asked)
    want = LocationFilter.absolute_start_group_end(first, 0, last - first)
    if flt != want:
        problems.append(f"FETCH {asked.name!r}: LOCATION_FILTER {flt}, expected Absolute Start, Group End "
                        f"{{{first},0}} EndGroupDelta {last - first}")
    if asked.param(ParamType.GROUP_ORDER) != GroupOrder.ASCENDING:
        problems.append(f"FETCH {asked.name!r}: GROUP_ORDER {asked.param(ParamType.GROUP_ORDER)}, expected "
                        "Ascending (0x1)")
    return problems


def objectid_filter(asked: Asked) -> RangeFilter | None:
    value = asked.param(ParamType.OBJECTID_FILTER)
    return value if isinstance(value, RangeFilter) else None


def data_requests(outcome: Outcome, relay: int = 0) -> tuple[list[Asked], list[Asked]]:
    """(data SUBSCRIBEs, data FETCHes) the consumer sent to a relay."""
    asked = outcome.asked[relay]
    data = [a for a in asked if a.name not in (b"manifest", b"manifest.cose") and a.kind != "SUBSCRIBE_NAMESPACE"]
    return [a for a in data if a.kind == "SUBSCRIBE"], [a for a in data if a.kind == "FETCH"]


def rejected_at(outcome: Outcome, track: str, group: int, obj: int) -> bool:
    result = outcome.run.result
    return result is not None and any(r.track == track and r.group == group and r.object == obj
                                      for r in result.rejected)
