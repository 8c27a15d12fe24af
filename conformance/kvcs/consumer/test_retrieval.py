"""kvcs-consumer: discovery and retrieval of honest caches (KVCS "Consumer Procedures").

The harness publishes the test-content convention's true bytes through its own relay and reads back the
consumer's result: every layer must carry the convention's layer digest (definition in
``kvconform.kvcs.consumer``), and the requests the relay recorded must follow the text's recipes.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from kvconform.conformance.kvcs.consumer.checks import (
    LAYERS,
    data_requests,
    digest_problems,
    fetch_problems,
    filter_of,
    live_subscribe_problems,
    objectid_filter,
    run,
    small_spec,
)
from kvconform.conformance.kvcs.consumer.harness import HarnessPublisher, NoFilterRangesRelay, Stage
from kvconform.kvcs.namespace import KVCS_TAG
from kvconform.moqt.filters import FillParameters, LocationFilter, LocationFilterType
from kvconform.moqt.structures import ParamType, TrackNamespace


@pytest.mark.req("KVCS-DISC-COMPUTE", "KVCS-DISC-SUBSCRIBE-NAMESPACE", "KVCS-DISC-NAMESPACE-RESPONSE",
                 "KVCS-NS-CONTENT-FIELDS", "KVCS-NS-FIVE-FIELDS", "KVCS-NS-RAW-OCTETS", "KVCS-TRACK-NAME-ABNF",
                 "KVCS-FETCH-RANGE", "KVCS-VERIFY-LAYER-USABLE", "KVCS-KVSP-TEST-CONTENT", "KVCS-KVSP-CACHE-SPEC",
                 "KVCS-KVSP-COMPAT-DESCRIPTOR", "KVCS-KVSP-COMPAT-ID", "KVCS-KVSP-SCOPE-ID", "KVCS-KVSP-BLOCK-KEY",
                 "KVCS-MANIFEST-JSON", "KVCS-PAYLOAD-LAYOUT")
def test_completed_cache_is_discovered_and_assembled(kvcs_consumer: object, seed: int, tmp_path: Path) -> None:
    """A complete publication: the consumer computes the content prefix from the cache spec (KVSP
    identities), finds the publication with SUBSCRIBE_NAMESPACE on it (raw-octet fields), asks for the
    data tracks the manifest names (the track-name ABNF) and assembles every layer byte for byte; a data
    FETCH asks for the layer range, Ascending."""
    spec = small_spec(seed)
    stage = Stage(spec, [(HarnessPublisher(spec), (0,))])
    outcome = run(kvcs_consumer, stage, tmp_path, "completed cache")
    problems = digest_problems(outcome, spec, list(range(LAYERS)), "KVCS-VERIFY-LAYER-USABLE")
    prefixes = [a.namespace for a in outcome.asked[0] if a.kind == "SUBSCRIBE_NAMESPACE"]
    content = TrackNamespace((KVCS_TAG, spec.scope_id, spec.compat_id, spec.anchor_key))
    if not prefixes or prefixes[0] != content:
        problems.append(f"first SUBSCRIBE_NAMESPACE prefix {prefixes[:1]}, expected (\"kvcs-1\", Scope ID, "
                        f"Compatibility ID, Anchor Key) = {content} [KVCS-DISC-SUBSCRIBE-NAMESPACE]")
    subs, fetches = data_requests(outcome)
    if not subs and not fetches:
        problems.append("the consumer asked for no data track [KVCS-FETCH-RANGE]")
    for asked in subs + fetches:
        if asked.name not in (b"k.raw.s0", b"v.raw.s0", b"kv.raw.s0"):
            problems.append(f"{asked.kind} for track {asked.name!r}: not a data track of the publication "
                            "(k.raw.s0, v.raw.s0) [KVCS-TRACK-NAME-ABNF]")
        full = TrackNamespace((*content.fields, stage.publications[0][0].namespace.pub_id))
        if asked.namespace != full:
            problems.append(f"{asked.kind} {asked.name!r} in namespace {asked.namespace}, expected the five raw-octet "
                            f"fields {full} [KVCS-NS-FIVE-FIELDS]")
    for f in fetches:
        problems += fetch_problems(f, 0, LAYERS - 1, "KVCS-FETCH-RANGE")
    for s in subs:
        problems += live_subscribe_problems(s, "KVCS-LIVE-SUBSCRIBE")
    assert not problems, "\n".join(problems)


@pytest.mark.req("KVCS-LIVE-SUBSCRIBE", "KVCS-LIVE-MANIFEST-COSE-FIRST", "KVCS-LIVE-MANIFEST-FILTER",
                 "KVCS-LIVE-TRACK-COMPLETE", "KVCS-VERIFY-LAYER-USABLE", "KVCS-MANIFEST-VERSION-GROUP")
def test_cache_in_production_is_assembled_exactly_once(kvcs_consumer: object, seed: int, tmp_path: Path) -> None:
    """The consumer starts while layers are still produced: data tracks by Next Object + fill from {0,0},
    "manifest.cose" asked first, then "manifest" with Next Object + fill {Relative Start 1}; every layer,
    whether it came by the fill or the subscription, assembled once and byte for byte."""
    layers = 8
    spec = small_spec(seed, layers=layers)
    stage = Stage(spec, [(HarnessPublisher(spec, layer_interval=0.15), (0,))], live_after=2)
    outcome = run(kvcs_consumer, stage, tmp_path, "cache in production")
    problems = digest_problems(outcome, spec, list(range(layers)), "KVCS-VERIFY-LAYER-USABLE")
    subs, _ = data_requests(outcome)
    if len({s.name for s in subs}) < 2:
        problems.append(f"data SUBSCRIBEs for {sorted({s.name for s in subs})}: a cache in production is received "
                        "by subscribing to the k and v tracks [KVCS-LIVE-SUBSCRIBE]")
    for s in subs:
        problems += live_subscribe_problems(s, "KVCS-LIVE-SUBSCRIBE")
    manifests = [a for a in outcome.asked[0] if a.kind == "SUBSCRIBE" and a.name in (b"manifest", b"manifest.cose")]
    names = [a.name for a in manifests]
    if names[:2] != [b"manifest.cose", b"manifest"]:
        problems.append(f"manifest SUBSCRIBEs {names}: expected \"manifest.cose\" first, then \"manifest\" (the "
                        "publication has no manifest.cose) [KVCS-LIVE-MANIFEST-COSE-FIRST]")
    for m in manifests:
        flt = filter_of(m)
        fill = m.param(ParamType.FILL_PARAMETERS)
        inner = fill.params.get(ParamType.LOCATION_FILTER) if isinstance(fill, FillParameters) else None
        if flt is None or flt.type != LocationFilterType.NEXT_OBJECT or inner != LocationFilter.relative_start(1):
            problems.append(f"SUBSCRIBE {m.name!r}: LOCATION_FILTER {flt}, fill {inner!r}: expected Next Object + "
                            "FILL_PARAMETERS {Relative Start 1} [KVCS-LIVE-MANIFEST-FILTER]")
    assert not problems, "\n".join(problems)


@pytest.mark.req("KVCS-DISC-SHORTER-PREFIX", "KVCS-DISC-SUBSCRIBE-NAMESPACE", "KVCS-NS-ANCHOR-KEY",
                 "KVCS-MANIFEST-BLOCK-KEYS-SHA256", "KVCS-TRACK-SELECT", "KVCS-OBJ-ID-BLOCK",
                 "KVCS-KVSP-COMPLETE-BLOCKS")
def test_shorter_prefix_and_appended_segment(kvcs_consumer: object, seed: int, tmp_path: Path) -> None:
    """The consumer's context runs two blocks past segment 0 (an appended segment) and ends in an incomplete
    block: SUBSCRIBE_NAMESPACE for its longest prefix (its last complete block) finds nothing, a shorter
    Anchor Key finds the publication, and both segments (whose block_keys_sha256 match the consumer's keys)
    are assembled in block order."""
    spec = small_spec(seed, segments=(8,), tail_tokens=2)
    stage = Stage(spec, [(HarnessPublisher(spec), (0,))])
    outcome = run(kvcs_consumer, stage, tmp_path, "shorter prefix")
    problems = digest_problems(outcome, spec, list(range(LAYERS)), "KVCS-MANIFEST-BLOCK-KEYS-SHA256")
    prefixes = [a.namespace for a in outcome.asked[0] if a.kind == "SUBSCRIBE_NAMESPACE"]
    longest = TrackNamespace((KVCS_TAG, spec.scope_id, spec.compat_id, spec.block_keys[-1]))
    anchor = TrackNamespace((KVCS_TAG, spec.scope_id, spec.compat_id, spec.anchor_key))
    if not prefixes or prefixes[0] != longest:
        problems.append(f"first SUBSCRIBE_NAMESPACE {prefixes[:1]}: expected the longest prefix {longest} "
                        "[KVCS-DISC-SUBSCRIBE-NAMESPACE]")
    if anchor not in prefixes:
        problems.append(f"no SUBSCRIBE_NAMESPACE for the shorter prefix of segment 0 {anchor} (asked {prefixes}) "
                        "[KVCS-DISC-SHORTER-PREFIX]")
    assert not problems, "\n".join(problems)


@pytest.mark.req("KVCS-FETCH-OBJECTID-FILTER", "KVCS-VERIFY-LAYER-USABLE", "KVCS-KVSP-LAYER-DIGEST",
                 "KVCS-KVSP-RAW-LAYOUT", "KVCS-PAYLOAD-DATA-RAW", "KVCS-KVSP-CODEC-REGISTRY")
@pytest.mark.parametrize("filter_ranges", [True, False], ids=["max-filter-ranges", "no-filter-ranges"])
def test_first_blocks_only(kvcs_consumer: object, seed: int, tmp_path: Path, filter_ranges: bool) -> None:
    """A consumer that needs the first block(s) only: with a relay whose MAX_FILTER_RANGES is non-zero a
    data FETCH carries OBJECTID_FILTER 0..n-1; with one advertising none it carries no Range Filter and the
    excess objects are discarded. Either way the layers hold exactly the first n blocks; with n = 1 the
    layer digest is the KVSP layer digest of block 0, SHA-256(k raw data || v raw data)."""
    kvcs_consumer.require("first_blocks")  # type: ignore[attr-defined]
    spec = small_spec(seed)
    n = 2 if filter_ranges else 1
    stage = Stage(spec, [(HarnessPublisher(spec), (0,))], blocks=n)
    if not filter_ranges:
        stage.relays = (NoFilterRangesRelay,)
    outcome = run(kvcs_consumer, stage, tmp_path, f"first {n} blocks")
    problems = digest_problems(outcome, spec, list(range(LAYERS)), "KVCS-FETCH-OBJECTID-FILTER", blocks=n)
    if n == 1:
        result = outcome.require_result("KVCS-KVSP-LAYER-DIGEST")
        problems += [f"layer {layer}: digest of one block is not the KVSP layer digest [KVCS-KVSP-LAYER-DIGEST]"
                     for layer in range(LAYERS) if result.layers.get(layer) not in (None, spec.layer_digest(layer, 0))]
    _, fetches = data_requests(outcome)
    for f in fetches:
        flt = objectid_filter(f)
        if filter_ranges and (flt is None or flt.ranges != ((0, n - 1),)):
            problems.append(f"FETCH {f.name!r}: OBJECTID_FILTER {flt}, expected the range 0..{n - 1} (the relay's "
                            "MAX_FILTER_RANGES is 16) [KVCS-FETCH-OBJECTID-FILTER]")
        if not filter_ranges and flt is not None:
            problems.append(f"FETCH {f.name!r}: OBJECTID_FILTER {flt} sent to a relay whose MAX_FILTER_RANGES is 0 "
                            "[KVCS-FETCH-OBJECTID-FILTER]")
    assert not problems, "\n".join(problems)


@pytest.mark.req("KVCS-FETCH-RANGE", "KVCS-GROUP-LAYER")
def test_layer_range_only(kvcs_consumer: object, seed: int, tmp_path: Path) -> None:
    """Layers 1..2 of a completed cache: a data FETCH from {1,0} with EndGroupDelta 1; both layers
    assembled."""
    kvcs_consumer.require("layer_range")  # type: ignore[attr-defined]
    spec = small_spec(seed)
    stage = Stage(spec, [(HarnessPublisher(spec), (0,))], layers=(1, 2))
    outcome = run(kvcs_consumer, stage, tmp_path, "layers 1-2")
    problems = digest_problems(outcome, spec, [1, 2], "KVCS-FETCH-RANGE")
    _, fetches = data_requests(outcome)
    for f in fetches:
        problems += fetch_problems(f, 1, 2, "KVCS-FETCH-RANGE")
    assert not problems, "\n".join(problems)
