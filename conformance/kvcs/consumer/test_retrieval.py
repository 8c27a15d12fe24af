"""kvcs-consumer: discovery and retrieval of honest caches (KVCS "Consumer Procedures").

The harness publishes the test-content convention's true bytes through its own relay and reads back the
consumer's result: every layer must carry the convention's layer digest (definition in
``kvconform.kvcs.consumer``), and the requests the relay recorded must follow the text's recipes.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from kvconform import sweep
from kvconform.conformance.kvcs.consumer.checks import (
    LAYERS,
    completion_findings,
    data_requests,
    digest_findings,
    fetch_problems,
    filter_of,
    live_subscribe_problems,
    objectid_filter,
    run,
    small_spec,
)
from kvconform.conformance.kvcs.consumer.harness import HarnessPublisher, NoFilterRangesRelay, Stage
from kvconform.kvcs.content import CacheSpec
from kvconform.kvcs.namespace import KVCS_TAG
from kvconform.moqt.filters import LocationFilter, LocationFilterType
from kvconform.moqt.parameters import FillParameters
from kvconform.moqt.structures import ParamType, TrackNamespace
from kvconform.verdicts import Findings, check_no_problems


def prefix_problems(prefix: TrackNamespace, spec: CacheSpec, anchor: bytes) -> list[tuple[str, str]]:
    """(requirement, problem) for each way a SUBSCRIBE_NAMESPACE prefix differs from ("kvcs-1", Scope ID,
    Compatibility ID, ``anchor``) computed from the cache spec: the wrong shape is the discovery recipe broken,
    a field in hex text the raw-octet rule, a wrong identity its computation, another Block Key of the chain
    the choice of prefix."""
    where = f"SUBSCRIBE_NAMESPACE prefix {prefix}"
    fields = prefix.fields
    if len(fields) != 4 or fields[0] != KVCS_TAG:
        return [("KVCS-DISC-SUBSCRIBE-NAMESPACE", f"{where}: expected 4 fields (\"kvcs-1\", Scope ID, Compatibility "
                                                  "ID, Anchor Key)")]
    out = []
    for i, (name, got, want) in enumerate((("Scope ID", fields[1], spec.scope_id),
                                           ("Compatibility ID", fields[2], spec.compat_id),
                                           ("Anchor Key", fields[3], anchor)), start=1):
        if got == want:
            continue
        if got == want.hex().encode():
            out.append(("KVCS-NS-RAW-OCTETS", f"{where}: field {i} ({name}) is the hex text, not the raw octets"))
        elif i == 3 and got in spec.block_keys:
            out.append(("KVCS-DISC-SUBSCRIBE-NAMESPACE", f"{where}: Anchor Key is the Block Key of block "
                                                         f"{spec.block_keys.index(got)}, expected that of block "
                                                         f"{spec.block_keys.index(anchor)} (the longest prefix)"))
        else:
            out.append(("KVCS-DISC-COMPUTE", f"{where}: field {i} ({name}) is {got.hex()[:16]}.., KVSP computes "
                                             f"{want.hex()[:16]}.. from the cache spec"))
    return out


@pytest.mark.req("KVCS-DISC-SUBSCRIBE-NAMESPACE", "KVCS-DISC-COMPUTE", "KVCS-NS-RAW-OCTETS",
                 "KVCS-DISC-NAMESPACE-RESPONSE", "KVCS-NS-FIVE-FIELDS", "KVCS-TRACK-NAME-ABNF", "KVCS-FETCH-RANGE",
                 "KVCS-LIVE-SUBSCRIBE", "KVCS-VERIFY-LAYER-USABLE")
def test_completed_cache_is_discovered_and_assembled(kvcs_consumer: object, seed: int, tmp_path: Path) -> None:
    """A complete publication: the consumer computes the content prefix from the cache spec (KVSP
    identities), finds the publication with SUBSCRIBE_NAMESPACE on it (raw-octet fields), asks for the
    data tracks the manifest names (the track-name ABNF) in the publication's five-field namespace and
    assembles every layer byte for byte; a data FETCH asks for the layer range, Ascending."""
    spec = small_spec(seed)
    stage = Stage(spec, [(HarnessPublisher(spec), (0,))])
    outcome = run(kvcs_consumer, stage, tmp_path, "completed cache")
    found = Findings("a completed cache is not discovered and assembled as the text says")
    found.asserted += ["KVCS-DISC-SUBSCRIBE-NAMESPACE", "KVCS-DISC-COMPUTE", "KVCS-NS-RAW-OCTETS"]
    prefixes = [a.namespace for a in outcome.asked[0] if a.kind == "SUBSCRIBE_NAMESPACE"]
    if not prefixes:
        found.add("KVCS-DISC-SUBSCRIBE-NAMESPACE", "the consumer sent no SUBSCRIBE_NAMESPACE")
    else:
        for req, problem in prefix_problems(prefixes[0], spec, spec.anchor_key):
            found.add(req, f"the first {problem}")
    subs, fetches = data_requests(outcome)
    found.expect(subs or fetches, "KVCS-FETCH-RANGE", "the consumer asked for no data track")
    pub_id = stage.publications[0][0].namespace.pub_id
    content = (KVCS_TAG, spec.scope_id, spec.compat_id, spec.anchor_key)
    for asked in subs + fetches:
        found.expect(asked.name in (b"k.raw.s0", b"v.raw.s0", b"kv.raw.s0"), "KVCS-TRACK-NAME-ABNF",
                     f"{asked.kind} for track {asked.name!r}: not a data track of the publication (k.raw.s0, v.raw.s0)")
        fields = asked.namespace.fields
        found.expect(len(fields) == 5 and fields[:4] == content, "KVCS-NS-FIVE-FIELDS",
                     f"{asked.kind} {asked.name!r} in namespace {asked.namespace}, expected the five raw-octet fields "
                     "(\"kvcs-1\", Scope ID, Compatibility ID, Anchor Key, Publication ID)")
        found.expect(len(fields) != 5 or fields[4] == pub_id, "KVCS-DISC-NAMESPACE-RESPONSE",
                     f"{asked.kind} {asked.name!r} under Publication ID {fields[-1].hex()}, the NAMESPACE response "
                     f"named {pub_id.hex()}")
    for f in fetches:
        for problem in fetch_problems(f, 0, LAYERS - 1):
            found.add("KVCS-FETCH-RANGE", problem)
    found.asserted.append("KVCS-LIVE-SUBSCRIBE")
    for sub in subs:
        for problem in live_subscribe_problems(sub):
            found.add("KVCS-LIVE-SUBSCRIBE", problem)
    digest_findings(found, outcome, spec, list(range(LAYERS)), missing="KVCS-FETCH-RANGE",
                    wrong="KVCS-VERIFY-LAYER-USABLE")
    found.judge()


@pytest.mark.req("KVCS-LIVE-SUBSCRIBE", "KVCS-LIVE-MANIFEST-COSE-FIRST", "KVCS-LIVE-MANIFEST-FILTER",
                 "KVCS-LIVE-TRACK-COMPLETE", "KVCS-VERIFY-LAYER-USABLE")
def test_cache_in_production_is_assembled_exactly_once(kvcs_consumer: object, seed: int, tmp_path: Path) -> None:
    """The consumer starts while layers are still produced: data tracks by Next Object + fill from {0,0},
    "manifest.cose" asked first, then "manifest" with Next Object + fill {Relative Start 1}; every layer,
    whether it came by the fill or the subscription, assembled once and byte for byte, as soon as the tracks
    completed (not when its budget ran out)."""
    layers = 8
    spec = small_spec(seed, layers=layers)
    # (production slow until the consumer asks for data: a spawned one still finds the cache in production)
    stage = Stage(spec, [(HarnessPublisher(spec, layer_interval=0.15, slow_until_asked=0.5), (0,))], live_after=2)
    outcome = run(kvcs_consumer, stage, tmp_path, "cache in production")
    found = Findings("a cache in production is not received exactly once as the text says")
    subs, _ = data_requests(outcome)
    found.expect(len({s.name for s in subs}) >= 2, "KVCS-LIVE-SUBSCRIBE",
                 f"data SUBSCRIBEs for {sorted({s.name for s in subs})}: a cache in production is received by "
                 "subscribing to the k and v tracks")
    for sub in subs:
        for problem in live_subscribe_problems(sub):
            found.add("KVCS-LIVE-SUBSCRIBE", problem)
    manifests = [a for a in outcome.asked[0] if a.kind == "SUBSCRIBE" and a.name in (b"manifest", b"manifest.cose")]
    names = [a.name for a in manifests]
    found.expect(names[:2] == [b"manifest.cose", b"manifest"], "KVCS-LIVE-MANIFEST-COSE-FIRST",
                 f"manifest SUBSCRIBEs {names}: expected \"manifest.cose\" first, then \"manifest\" (the "
                 "publication has no manifest.cose)")
    found.asserted.append("KVCS-LIVE-MANIFEST-FILTER")
    for m in manifests:
        flt = filter_of(m)
        fill = m.param(ParamType.FILL_PARAMETERS)
        inner = fill.params.get(ParamType.LOCATION_FILTER) if isinstance(fill, FillParameters) else None
        if flt is None or flt.type != LocationFilterType.NEXT_OBJECT or inner != LocationFilter.relative_start(1):
            found.add("KVCS-LIVE-MANIFEST-FILTER", f"SUBSCRIBE {m.name!r}: LOCATION_FILTER {flt}, fill {inner!r}: "
                                                   "expected Next Object + FILL_PARAMETERS {Relative Start 1}")
    digest_findings(found, outcome, spec, list(range(layers)), missing="KVCS-LIVE-SUBSCRIBE",
                    wrong="KVCS-VERIFY-LAYER-USABLE")
    completion_findings(found, outcome, layers)
    found.judge()


@pytest.mark.req("KVCS-DISC-SHORTER-PREFIX", "KVCS-DISC-SUBSCRIBE-NAMESPACE", "KVCS-KVSP-COMPLETE-BLOCKS",
                 "KVCS-MANIFEST-BLOCK-KEYS-SHA256", "KVCS-TRACK-SELECT", "KVCS-OBJ-ID-BLOCK")
def test_shorter_prefix_and_appended_segment(kvcs_consumer: object, seed: int, tmp_path: Path) -> None:
    """The consumer's context runs two blocks past segment 0 (an appended segment) and ends in an incomplete
    block: SUBSCRIBE_NAMESPACE for its longest prefix (its last complete block) finds nothing, a shorter
    Anchor Key finds the publication, and both segments (whose block_keys_sha256 match the consumer's keys)
    are assembled in block order, from the k and v tracks of each segment or its kv track (the publication offers
    all three: never a mix)."""
    spec = small_spec(seed, segments=(8,), tail_tokens=2)
    # k, v AND kv tracks per segment: only then can a selection be mixed (and the check fail)
    stage = Stage(spec, [(HarnessPublisher(spec, kv_track=True), (0,))])
    outcome = run(kvcs_consumer, stage, tmp_path, "shorter prefix")
    found = Findings("the shorter prefix or the appended segment is not used as the text says")
    found.asserted += ["KVCS-DISC-SUBSCRIBE-NAMESPACE", "KVCS-KVSP-COMPLETE-BLOCKS"]
    prefixes = [a.namespace for a in outcome.asked[0] if a.kind == "SUBSCRIBE_NAMESPACE"]
    if not prefixes:
        found.add("KVCS-DISC-SUBSCRIBE-NAMESPACE", "the consumer sent no SUBSCRIBE_NAMESPACE")
    else:
        for req, problem in prefix_problems(prefixes[0], spec, spec.block_keys[-1]):
            # an Anchor Key that is no complete block's Block Key: one computed over the incomplete tail
            found.add("KVCS-KVSP-COMPLETE-BLOCKS" if req == "KVCS-DISC-COMPUTE" and
                      prefixes[0].fields[1:3] == (spec.scope_id, spec.compat_id) else
                      "KVCS-DISC-SUBSCRIBE-NAMESPACE", f"the first {problem} (its longest prefix)")
    anchor = TrackNamespace((KVCS_TAG, spec.scope_id, spec.compat_id, spec.anchor_key))
    found.expect(anchor in prefixes, "KVCS-DISC-SHORTER-PREFIX",
                 f"no SUBSCRIBE_NAMESPACE for the shorter prefix of segment 0 {anchor} (asked {prefixes})")
    subs, fetches = data_requests(outcome)
    found.asserted.append("KVCS-TRACK-SELECT")
    for segment in (0, 1):
        used = sorted({a.name.decode("ascii", "replace").split(".", 1)[0] for a in subs + fetches
                       if a.name.endswith(f".s{segment}".encode())})
        if used not in (["k", "v"], ["kv"], []):
            found.add("KVCS-TRACK-SELECT", f"segment {segment}: asked for the tracks {used}: k and v, or kv, never "
                                           "a mix")
    digest_findings(found, outcome, spec, list(range(LAYERS)), missing="KVCS-MANIFEST-BLOCK-KEYS-SHA256",
                    wrong="KVCS-OBJ-ID-BLOCK")
    found.judge()


@pytest.mark.req("KVCS-FETCH-OBJECTID-FILTER")
# (only the one-block case can hold a layer to the KVSP layer digest: only it cites that id)
@pytest.mark.parametrize("filter_ranges", [pytest.param(True, id="max-filter-ranges"),
                                           pytest.param(False, id="no-filter-ranges",
                                                        marks=pytest.mark.req("KVCS-KVSP-LAYER-DIGEST"))])
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
    found = Findings(f"the first {n} block(s) are not retrieved as the text says")
    _, fetches = data_requests(outcome)
    found.asserted.append("KVCS-FETCH-OBJECTID-FILTER")
    for f in fetches:
        flt = objectid_filter(f)
        if filter_ranges and (flt is None or flt.ranges != ((0, n - 1),)):
            found.add("KVCS-FETCH-OBJECTID-FILTER", f"FETCH {f.name!r}: OBJECTID_FILTER {flt}, expected the range "
                                                    f"0..{n - 1} (the relay's MAX_FILTER_RANGES is 16)")
        if not filter_ranges and flt is not None:
            found.add("KVCS-FETCH-OBJECTID-FILTER", f"FETCH {f.name!r}: OBJECTID_FILTER {flt} sent to a relay whose "
                                                    "MAX_FILTER_RANGES is 0")
    if n == 1:
        result = outcome.require_result()
        for layer in range(LAYERS):
            got = result.layers.get(layer)
            # the convention's digest of one block is the KVSP layer digest: a wrong one is that rule broken
            found.expect(got is None or got == spec.layer_digest(layer, 0), "KVCS-KVSP-LAYER-DIGEST",
                         f"layer {layer}: digest of one block {got.hex()[:16] if got else None}.. is not the KVSP "
                         f"layer digest SHA-256(k data || v data) {spec.layer_digest(layer, 0).hex()[:16]}..")
    digest_findings(found, outcome, spec, list(range(LAYERS)), missing="KVCS-FETCH-OBJECTID-FILTER",
                    wrong="KVCS-FETCH-OBJECTID-FILTER", blocks=n)
    found.judge()


@pytest.mark.req("KVCS-FETCH-RANGE", "KVCS-GROUP-LAYER")
def test_layer_range_only(kvcs_consumer: object, seed: int, tmp_path: Path) -> None:
    """Layers 1..2 of a completed cache: a data FETCH from {1,0} with EndGroupDelta 1; both layers
    assembled, each from its own Group (the Group ID is the layer index)."""
    kvcs_consumer.require("layer_range")  # type: ignore[attr-defined]
    spec = small_spec(seed)
    stage = Stage(spec, [(HarnessPublisher(spec), (0,))], layers=(1, 2))
    outcome = run(kvcs_consumer, stage, tmp_path, "layers 1-2")
    found = Findings("layers 1-2 are not retrieved as the text says")
    found.asserted.append("KVCS-FETCH-RANGE")
    _, fetches = data_requests(outcome)
    for f in fetches:
        for problem in fetch_problems(f, 1, 2):
            found.add("KVCS-FETCH-RANGE", problem)
    digest_findings(found, outcome, spec, [1, 2], missing="KVCS-FETCH-RANGE", wrong="KVCS-GROUP-LAYER")
    found.judge()


CHUNK_LAYERS = 4
# the second pass: one more block of 4 tokens (a pass of one block); --sweep wide adds one as long as the first
CHUNK_TOKENS = sweep.pick([4], [16])


@pytest.mark.req("KVCS-LIVE-SUBSCRIBE", "KVCS-LIVE-TRACK-COMPLETE", "KVCS-OBJ-ID-BLOCK")
@pytest.mark.parametrize("tokens", CHUNK_TOKENS, ids=[f"second-pass-{n}-tokens" for n in CHUNK_TOKENS])
def test_chunked_prefill_joined_during_the_second_pass(kvcs_consumer: object, seed: int, tmp_path: Path,
                                                       tokens: int) -> None:
    """Chunked prefill: the publisher computes the context in two passes, each through every layer, published as
    segments 0 and 1 (Group IDs increase with time in every track). The consumer joins once the manifest lists
    segment 1, and the second pass holds until the consumer asks for data: segment 0 is complete (retrieved by
    FETCH, or by a subscription whose fill carries it), segment 1 is in production and must be subscribed (Next
    Object + fill from {0,0}); every layer is assembled from both segments, in absolute block order, and the
    consumer ends once the last layer is in."""
    spec = small_spec(seed, layers=CHUNK_LAYERS, segments=(tokens,))
    pub = HarnessPublisher(spec, layer_interval=0.1, hold=1)
    stage = Stage(spec, [(pub, (0,))], live_after=0)
    outcome = run(kvcs_consumer, stage, tmp_path, "chunked prefill, second pass in production")
    found = Findings("a cache produced in two passes is not received as the text says")
    found.asserted.append("KVCS-LIVE-SUBSCRIBE")
    subs, fetches = data_requests(outcome)
    second_done = pub.times.get("segment 1", float("inf"))
    for f in fetches:
        if f.name.endswith(b".s1") and f.at < second_done:
            found.add("KVCS-LIVE-SUBSCRIBE", f"FETCH {f.name!r} while segment 1 was still in production (its manifest "
                                             "did not mark it complete): a cache in production is subscribed to")
        elif f.name.endswith(b".s0"):
            for problem in fetch_problems(f, 0, CHUNK_LAYERS - 1):
                found.add("KVCS-LIVE-SUBSCRIBE", problem)
    for sub in subs:
        for problem in live_subscribe_problems(sub):
            found.add("KVCS-LIVE-SUBSCRIBE", problem)
    live = {s.name for s in subs if s.name.endswith(b".s1")}
    found.expect(live >= {b"k.raw.s1", b"v.raw.s1"} or live == {b"kv.raw.s1"}, "KVCS-LIVE-SUBSCRIBE",
                 f"data SUBSCRIBEs of segment 1 (in production): {sorted(live)}, expected its k and v tracks")
    digest_findings(found, outcome, spec, list(range(CHUNK_LAYERS)), missing="KVCS-LIVE-SUBSCRIBE",
                    wrong="KVCS-OBJ-ID-BLOCK")
    completion_findings(found, outcome, CHUNK_LAYERS)
    found.judge()


@pytest.mark.req("KVCS-PRIV-NO-PREFIX-PROBING")
def test_distrustful_consumer_does_not_probe_shorter_prefixes(kvcs_consumer: object, seed: int,
                                                              tmp_path: Path) -> None:
    """A consumer that declares it distrusts relays (PICS kvcs.consumer.distrusts_relays) is given a context
    running two blocks past the only publication's segment 0: its exact prefix has no publication, a shorter one
    has. It must send no SUBSCRIBE_NAMESPACE for a shorter prefix of its chain (what it then retrieves is not
    judged: without KVSP lookups it may find nothing)."""
    kvcs_consumer.require("distrusts_relays")  # type: ignore[attr-defined]
    spec = small_spec(seed, segments=(8,), tail_tokens=2)
    stage = Stage(spec, [(HarnessPublisher(spec), (0,))], distrust_relays=True)
    outcome = run(kvcs_consumer, stage, tmp_path, "distrustful consumer, shorter prefix published")
    exact = spec.block_keys[-1]
    anchors = [a.namespace.fields[3] for a in outcome.asked[0]
               if a.kind == "SUBSCRIBE_NAMESPACE" and len(a.namespace.fields) == 4]
    probes = [f"block {spec.block_keys.index(k)}" for k in anchors if k != exact and k in spec.block_keys]
    check_no_problems([f"SUBSCRIBE_NAMESPACE with the Anchor Key of {p} (its exact prefix ends at block "
                       f"{len(spec.block_keys) - 1})" for p in probes],
                      what="a consumer that distrusts relays probes shorter prefixes",
                      req="KVCS-PRIV-NO-PREFIX-PROBING")
