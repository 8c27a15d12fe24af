"""kvcs-consumer: verification of objects and manifests against an adversarial publisher (KVCS "Object
Payload", "Manifest Track", "Verification and Recovery", "Security Considerations").

The harness publishes the convention's true bytes except where a scenario poisons them. Whatever the
consumer does, it must never report a layer whose digest differs from the true content's: a discarded
object makes its layer missing ("failed") unless the consumer recovers it from an honest publication.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from kvconform import sweep
from kvconform.conformance.kvcs.consumer.checks import (
    KID,
    LAYERS,
    digest_findings,
    producer_key,
    rejected_at,
    run,
    small_spec,
)
from kvconform.conformance.kvcs.consumer.harness import (
    VALUE_CLASSES,
    DuplicatingRelay,
    HarnessPublisher,
    Outcome,
    Poison,
    Stage,
    expected_digests,
    poisoned_layers_reported_good,
)
from kvconform.kvcs.content import CacheSpec
from kvconform.verdicts import Findings, check, check_no_problems

POISONED = (1, 1)  # {layer, object} of k.raw.s0 that the poisoning scenarios mutate
GOOD = [layer for layer in range(LAYERS) if layer != POISONED[0]]

CHECKS = {
    "data": "KVCS-PAYLOAD-VERIFY-DIGEST",
    "layer": "KVCS-PAYLOAD-VERIFY-LAYER",
    "block": "KVCS-PAYLOAD-VERIFY-BLOCK",
    "magic": "KVCS-PAYLOAD-VERIFY-MAGIC",
    "version": "KVCS-PAYLOAD-VERIFY-MAGIC",
    "truncated": "KVCS-PAYLOAD-VERIFY-LENGTH",
}


def _poisoned_layer_findings(outcome: Outcome, spec: CacheSpec, requirement: str, what: str) -> Findings:
    """The poisoned object's layer is not reported assembled (``requirement``: the check that catches it), the
    object is listed as rejected (KVCS-VERIFY-EVERY: it was verified), and the other layers are assembled
    (KVCS-PAYLOAD-DISCARD: only the object is discarded, treated as missing)."""
    found = Findings(what)
    for problem in poisoned_layers_reported_good(outcome, spec):
        found.add(requirement, problem)
    result = outcome.require_result()
    found.expect(result.layers.get(POISONED[0]) is None or found.problems, requirement,
                 f"layer {POISONED[0]} reported assembled although its only source object k.raw.s0 "
                 f"{{{POISONED[0]},{POISONED[1]}}} is poisoned")
    found.expect(rejected_at(outcome, "k.raw.s0", *POISONED), "KVCS-VERIFY-EVERY",
                 f"k.raw.s0 {{{POISONED[0]},{POISONED[1]}}} is not listed among the rejected objects (rejected: "
                 f"{[(r.track, r.group, r.object) for r in result.rejected][:8]})")
    digest_findings(found, outcome, spec, GOOD, missing="KVCS-PAYLOAD-DISCARD", wrong="KVCS-PAYLOAD-DISCARD")
    return found


@pytest.mark.parametrize("kind", [pytest.param(kind, marks=pytest.mark.req(req, "KVCS-PAYLOAD-DISCARD",
                                                                            "KVCS-VERIFY-EVERY"))
                                  for kind, req in CHECKS.items()])
def test_object_failing_a_check_is_discarded(kvcs_consumer: object, seed: int, tmp_path: Path, kind: str) -> None:
    """One object of layer 1 is poisoned (Data changed under its digest, Layer or Block Index off by one,
    wrong Magic or Version, truncated): the consumer discards it, lists it as rejected, reports layer 1
    failed and the other layers assembled."""
    spec = small_spec(seed)
    pub = HarnessPublisher(spec, poisons=[Poison(kind, "k.raw.s0", *POISONED)])
    outcome = run(kvcs_consumer, Stage(spec, [(pub, (0,))]), tmp_path, f"poison {kind}")
    _poisoned_layer_findings(outcome, spec, CHECKS[kind], f"an object poisoned ({kind}) is not discarded").judge()


# The header field (and so the End Subscriber check) each value class breaks.
VALUE_CLASS_REQS = {
    "magic": "KVCS-PAYLOAD-VERIFY-MAGIC", "version": "KVCS-PAYLOAD-VERIFY-MAGIC",
    "layer": "KVCS-PAYLOAD-VERIFY-LAYER", "block": "KVCS-PAYLOAD-VERIFY-BLOCK",
    "length": "KVCS-PAYLOAD-VERIFY-LENGTH", "extra": "KVCS-PAYLOAD-VERIFY-LENGTH",
    "digest": "KVCS-PAYLOAD-VERIFY-DIGEST", "data": "KVCS-PAYLOAD-DATA-RAW",
}
# Every value class by default (they are the boundary); --sweep wide poisons the v track too.
VALUE_CLASS_TRACKS = sweep.pick(["k.raw.s0"], ["v.raw.s0"])


def value_class_plan(tracks: list[str]) -> list[tuple[str, str, int, int, str]]:
    """(kind, track, layer, object, requirement): each poison in a layer of its own, from layer 1 (Layer 0 is a
    value class), at objects 1..3 (Block Index minus one stays a valid index); layer 0 and the last are clean."""
    plan = []
    for n, (kind, track) in enumerate((k, t) for t in tracks for k in VALUE_CLASSES):
        plan.append((kind, track, n + 1, 1 + n % 3, VALUE_CLASS_REQS[kind.split("-")[0]]))
    return plan


@pytest.mark.req("KVCS-PAYLOAD-VERIFY-MAGIC", "KVCS-PAYLOAD-VERIFY-LAYER", "KVCS-PAYLOAD-VERIFY-BLOCK",
                 "KVCS-PAYLOAD-VERIFY-LENGTH", "KVCS-PAYLOAD-VERIFY-DIGEST", "KVCS-PAYLOAD-DATA-RAW",
                 "KVCS-VERIFY-EVERY", "KVCS-PAYLOAD-DISCARD")
def test_objects_malformed_in_every_value_class_are_discarded(kvcs_consumer: object, seed: int,
                                                              tmp_path: Path) -> None:
    """One publication whose layers 1..17 each carry one object malformed in one value class of one header
    field: Magic and Version zero or all-ones; Layer zero, all-ones or wrapped by 2^16; Block Index off by one,
    all-ones or wrapped; Data Length zero, plus one or all-ones; one octet past Data Length; Data Digest all-zero
    (an "absent" special) or all-ones; Data one octet longer with Data Length and Digest following (right by
    every per-object check but no raw section). The manifest lists no object_digests, so only the consumer's own
    checks can tell. Each poisoned layer is reported failed with its object listed as rejected; the clean
    layers are assembled."""
    plan = value_class_plan(VALUE_CLASS_TRACKS)
    layers = len(plan) + 2
    spec = small_spec(seed, layers=layers)
    poisons = [Poison(kind, track, layer, obj) for kind, track, layer, obj, _ in plan]
    pub = HarnessPublisher(spec, poisons=poisons, no_digests=True)
    outcome = run(kvcs_consumer, Stage(spec, [(pub, (0,))]), tmp_path, f"{len(plan)} value classes")
    found = Findings("objects malformed in a value class are not discarded")
    result = outcome.require_result()
    found.asserted += sorted({req for *_, req in plan})
    for kind, track, layer, obj, req in plan:
        got = result.layers.get(layer)
        if got is not None:
            true = "the true content's digest" if got == expected_digests(spec, [layer])[layer] else "another digest"
            found.add(req, f"layer {layer} reported assembled ({true}) although its only source object {track} "
                           f"{{{layer},{obj}}} is malformed: {kind}")
    for kind, track, layer, obj, _ in plan:
        found.expect(rejected_at(outcome, track, layer, obj), "KVCS-VERIFY-EVERY",
                     f"{track} {{{layer},{obj}}} (malformed: {kind}) is not listed among the rejected objects")
    digest_findings(found, outcome, spec, [0, layers - 1], missing="KVCS-PAYLOAD-DISCARD",
                    wrong="KVCS-PAYLOAD-DISCARD")
    found.judge()


@pytest.mark.req("KVCS-PAYLOAD-FLAGS-IGNORED")
def test_nonzero_flags_are_ignored(kvcs_consumer: object, seed: int, tmp_path: Path) -> None:
    """Flags are "ignored on receipt": objects whose Flags are 0x8001 (all else right) are used."""
    spec = small_spec(seed)
    poisons = [Poison("flags", track, layer, obj) for track in ("k.raw.s0", "v.raw.s0") for layer in range(LAYERS)
               for obj in (0, 2)]
    outcome = run(kvcs_consumer, Stage(spec, [(HarnessPublisher(spec, poisons=poisons), (0,))]), tmp_path, "flags")
    found = Findings("objects with nonzero Flags are not used")
    digest_findings(found, outcome, spec, list(range(LAYERS)), missing="KVCS-PAYLOAD-FLAGS-IGNORED",
                    wrong="KVCS-PAYLOAD-FLAGS-IGNORED")
    found.judge()


@pytest.mark.req("KVCS-SEC-COSE-VERIFY", "KVCS-VERIFY-EVERY", "KVCS-PAYLOAD-DISCARD")
def test_poison_with_matching_digest_is_caught_by_the_signed_manifest(kvcs_consumer: object, seed: int,
                                                                      tmp_path: Path) -> None:
    """The publication is signed (manifest.cose with object_digests of the true content); one object's
    Data is changed AND its Data Digest recomputed, so only the signed list can tell. A consumer that knows
    the producer key must discard it."""
    kvcs_consumer.require("producer_keys")  # type: ignore[attr-defined]
    key = producer_key()
    spec = small_spec(seed, signing=key)
    pub = HarnessPublisher(spec, poisons=[Poison("data-rehash", "k.raw.s0", *POISONED)])
    stage = Stage(spec, [(pub, (0,))], producer_keys={KID: key.public_pem()})
    outcome = run(kvcs_consumer, stage, tmp_path, "poison with matching digest")
    _poisoned_layer_findings(outcome, spec, "KVCS-SEC-COSE-VERIFY",
                             "an object whose Data Digest matches but the signed object_digests does not is "
                             "not discarded").judge()


@pytest.mark.req("KVCS-RECOVER-RETRY", "KVCS-VERIFY-NO-MIX", "KVCS-PAYLOAD-VERIFY-DIGEST")
def test_poisoned_publication_is_replaced_by_an_honest_one(kvcs_consumer: object, seed: int,
                                                           tmp_path: Path) -> None:
    """Two publications of the cache (neither deterministic): the first announced has a poisoned object in
    layer 1 (Data changed under its Data Digest), the second is honest. The consumer recovers every layer, all
    from the honest publication."""
    spec = small_spec(seed)
    bad = HarnessPublisher(spec, poisons=[Poison("data", "k.raw.s0", *POISONED)])
    good = HarnessPublisher(spec)
    outcome = run(kvcs_consumer, Stage(spec, [(bad, (0,)), (good, (0,))]), tmp_path, "poisoned + honest")
    found = Findings("a poisoned publication is not replaced by the honest one")
    # a layer with other than the true content used the object whose Data does not match its Data Digest
    digest_findings(found, outcome, spec, list(range(LAYERS)), missing="KVCS-RECOVER-RETRY",
                    wrong="KVCS-PAYLOAD-VERIFY-DIGEST")
    result = outcome.require_result()
    honest = good.namespace.pub_id
    found.expect(found.problems or result.publication == honest, "KVCS-VERIFY-NO-MIX",
                 f"reported publication {result.publication.hex() if result.publication else None}, but only "
                 f"{honest.hex()} has every layer unpoisoned")
    mixed = {layer: p.hex() for layer, p in result.sources.items() if p != honest}
    found.expect(not mixed, "KVCS-VERIFY-NO-MIX", f"layers {mixed} reported from the poisoned, non-deterministic "
                                                  f"publication while others come from {honest.hex()}")
    found.judge()


@pytest.mark.req("KVCS-MANIFEST-COMPAT-CHECK", "KVCS-RECOVER-RETRY")
def test_manifest_with_another_compatibility_id_discards_the_publication(kvcs_consumer: object, seed: int,
                                                                         tmp_path: Path) -> None:
    """The first publication's manifest describes another model (its "compat" hashes to another
    Compatibility ID than the namespace's; its objects are the true ones). The consumer discards that
    publication and uses the second, honest one."""
    spec = small_spec(seed)
    liar = HarnessPublisher(spec, other_compat=True)
    good = HarnessPublisher(spec)
    outcome = run(kvcs_consumer, Stage(spec, [(liar, (0,)), (good, (0,))]), tmp_path, "other compat")
    result = outcome.require_result()
    used = {result.publication, *result.sources.values()} - {None}
    check(liar.namespace.pub_id not in used, "the publications the consumer used", req="KVCS-MANIFEST-COMPAT-CHECK",
          seen=sorted(u.hex() for u in used),
          expected=f"not {liar.namespace.pub_id.hex()}, whose manifest's compat does not hash to the namespace's "
                   "Compatibility ID")
    found = Findings("the honest publication is not used after the other one was discarded")
    digest_findings(found, outcome, spec, list(range(LAYERS)), missing="KVCS-RECOVER-RETRY",
                    wrong="KVCS-RECOVER-RETRY")
    found.judge()


@pytest.mark.req("KVCS-SEC-COSE-VERIFY", "KVCS-RECOVER-RETRY")
def test_bad_cose_signature_discards_the_publication(kvcs_consumer: object, seed: int, tmp_path: Path) -> None:
    """Two signed publications; the first one's manifest.cose is signed with another key under the known
    kid. A consumer that knows the producer key discards it and uses the second."""
    kvcs_consumer.require("producer_keys")  # type: ignore[attr-defined]
    key = producer_key()
    spec = small_spec(seed, signing=key)
    forger = HarnessPublisher(spec, forge_with=producer_key())
    good = HarnessPublisher(spec)
    stage = Stage(spec, [(forger, (0,)), (good, (0,))], producer_keys={KID: key.public_pem()})
    outcome = run(kvcs_consumer, stage, tmp_path, "bad COSE signature")
    result = outcome.require_result()
    used = {result.publication, *result.sources.values()} - {None}
    check(forger.namespace.pub_id not in used, "the publications the consumer used", req="KVCS-SEC-COSE-VERIFY",
          seen=sorted(u.hex() for u in used),
          expected=f"not {forger.namespace.pub_id.hex()}, whose manifest.cose signature does not verify with producer "
                   f"key {KID!r}")
    found = Findings("the honest publication is not used after the forged one was discarded")
    digest_findings(found, outcome, spec, list(range(LAYERS)), missing="KVCS-RECOVER-RETRY",
                    wrong="KVCS-RECOVER-RETRY")
    found.judge()


@pytest.mark.req("KVCS-VERIFY-NO-MIX")
def test_non_deterministic_publications_are_not_mixed(kvcs_consumer: object, seed: int, tmp_path: Path) -> None:
    """Two non-deterministic publications, each missing one layer (the first never sends layer 3, the second
    never sends layer 0). Only by combining them could every layer be had, which the text forbids: the
    consumer must not report both layer 0 and layer 3 assembled."""
    spec = small_spec(seed)
    first = HarnessPublisher(spec, skip_layers=[LAYERS - 1])
    second = HarnessPublisher(spec, skip_layers=[0])
    outcome = run(kvcs_consumer, Stage(spec, [(first, (0,)), (second, (0,))]), tmp_path, "two partial publications")
    problems = poisoned_layers_reported_good(outcome, spec)
    result = outcome.require_result()
    if result.layers.get(0) is not None and result.layers.get(LAYERS - 1) is not None:
        problems.append(f"layers 0 and {LAYERS - 1} both reported assembled: no single publication has both, so "
                        "objects of two non-deterministic publications were combined in segment 0 "
                        f"(sources {({k: v.hex()[:8] for k, v in result.sources.items()})})")
    check_no_problems(problems, what="objects of two non-deterministic publications are combined",
                      req="KVCS-VERIFY-NO-MIX")


@pytest.mark.req("MOQT-DATA-MALFORMED-DUPLICATE", "KVCS-PAYLOAD-DISCARD")
def test_same_location_with_two_payloads_is_not_used(kvcs_consumer: object, seed: int, tmp_path: Path) -> None:
    """The relay serves k.raw.s0 {1,1} twice on the same stream: first a poisoned copy whose Data Digest
    matches its Data (the manifest lists no object_digests, so per-object checks pass), then the true one.
    The same Location with two payloads makes the track malformed: the consumer must not report layer 1
    (nor any layer with other than the true content)."""
    spec = small_spec(seed)
    stage = Stage(spec, [(HarnessPublisher(spec, no_digests=True), (0,))], relays=(DuplicatingRelay,))
    outcome = run(kvcs_consumer, stage, tmp_path, "same Location twice")
    found = Findings("a Location delivered with two payloads is used")
    # content other than the true one reported usable: the poisoned copy was used instead of discarded
    for problem in poisoned_layers_reported_good(outcome, spec):
        found.add("KVCS-PAYLOAD-DISCARD", problem)
    found.asserted.append("KVCS-PAYLOAD-DISCARD")
    result = outcome.require_result()
    dup = DuplicatingRelay.DUP
    found.expect(found.problems or result.layers.get(dup[0]) is None, "MOQT-DATA-MALFORMED-DUPLICATE",
                 f"layer {dup[0]} reported assembled although k.raw.s0 {{{dup[0]},{dup[1]}}} arrived with two "
                 "different payloads (a malformed track)")
    found.judge()


@pytest.mark.req("KVCS-SEC-DIGEST-NOT-ALONE")
def test_distrustful_consumer_does_not_rely_on_the_data_digest_alone(kvcs_consumer: object, seed: int,
                                                                     tmp_path: Path) -> None:
    """A consumer that declares it distrusts relays (PICS kvcs.consumer.distrusts_relays) and is given no
    producer key meets an unsigned publication ("manifest", no object_digests) one of whose objects has its Data
    changed and its Data Digest recomputed, as an untrusted relay could: nothing authenticates it, so the consumer
    must not report that layer (nor any) with other than the true content."""
    kvcs_consumer.require("distrusts_relays")  # type: ignore[attr-defined]
    spec = small_spec(seed)
    pub = HarnessPublisher(spec, poisons=[Poison("data-rehash", "k.raw.s0", *POISONED)], no_digests=True)
    outcome = run(kvcs_consumer, Stage(spec, [(pub, (0,))], distrust_relays=True), tmp_path,
                  "distrustful consumer, unsigned publication, digest-consistent poison")
    check_no_problems(poisoned_layers_reported_good(outcome, spec),
                      what="a consumer that distrusts relays used an object vouched for by its Data Digest alone",
                      req="KVCS-SEC-DIGEST-NOT-ALONE")
