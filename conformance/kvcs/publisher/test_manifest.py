"""kvcs-publisher: the manifest track (KVCS "Manifest Track", "Publisher Behavior", "Security Considerations").

Versions are read live (arrival order = publication order) and, for the latest, from a probe's fill with
Relative Start 1; each is parsed (and, for manifest.cose, verified with the producer key of the cache spec).
"""

from __future__ import annotations

import hashlib
import itertools
import re
from typing import Any

import pytest

from kvconform.kvcs.manifest import Manifest, manifest_problems
from kvconform.kvcs.tracks import MANIFEST, MANIFEST_COSE
from kvconform.moqt.data import ObjectStatus
from kvconform.targets.kvcs.recording_relay import (
    Observation,
    Seen,
    findings,
    need_live,
    need_publication,
    readable_manifests,
)
from kvconform.verdicts import check, check_no_problems, inconclusive


def _live_versions(obs: Observation) -> list[tuple[Seen, Manifest | None, str]]:
    """Manifest versions in publication order, (object, parsed manifest or None, problem). Each version has its
    own stream, so the order is QUIC's stream numbering (the order the publisher opened them), not arrival."""
    name = obs.manifest_track
    if name is None:
        return []
    out = []
    for o in sorted(obs.live(name), key=lambda o: (o.stream_id, o.seq)):
        if o.status == ObjectStatus.NORMAL:
            manifest, problem = obs.decode_manifest(name, o.payload)
            out.append((o, manifest, problem))
    return out


def _group_streams(obs: Observation, segment: int) -> list[list[int | None]]:
    """Per data track of ``segment``, per Group, the QUIC stream that carried it live (None: it never came)."""
    out = []
    for t in obs.data_tracks():
        if t.segment != segment:
            continue
        first: dict[int, int] = {}
        for o in obs.live(t.name):
            if o.status == ObjectStatus.NORMAL:
                first[o.location.group] = min(first.get(o.location.group, o.stream_id), o.stream_id)
        out.append([first.get(g) for g in range(obs.spec.layers)])
    return out


def _completed_bounds(groups: list[list[int | None]], stream_id: int) -> tuple[int, int]:
    """Bounds on the layers completed on every track when the version on ``stream_id`` was published. At most
    the Groups whose streams were opened before it; since all of Group g is sent before Group g+1
    (KVCS-GROUP-ORDER, checked on its own), at least that number less the one still being written."""
    opened = min(sum(1 for s in streams if s is not None and s < stream_id) for streams in groups)
    return max(opened - 1, 0), opened


@pytest.mark.req("KVCS-MANIFEST-ONE-TRACK", "KVCS-IANA-RESERVED-NAMES")
def test_exactly_one_manifest_track(kvcs_publication: Any) -> None:
    """The publication has exactly one manifest track: "manifest" or "manifest.cose"."""
    obs = kvcs_publication
    need_publication(obs)
    served = [n.decode() for n in (MANIFEST, MANIFEST_COSE) if obs.offered(n)]
    check(len(served) == 1, f"case {obs.case.name}: the manifest tracks the publisher serves",
          req="KVCS-MANIFEST-ONE-TRACK", seen=served or "none",
          expected="exactly one of 'manifest' and 'manifest.cose'")
    # the reserved names carry the manifest, never a data object (a KVO1 payload)
    kvo1 = [f"{o.track.decode()} {o.location}" for n in (MANIFEST, MANIFEST_COSE) for o in obs.of(n)
            if o.status == ObjectStatus.NORMAL and o.payload[:4] == b"KVO1"]
    check(not kvo1, "objects on the reserved manifest track names", req="KVCS-IANA-RESERVED-NAMES", seen=kvo1[:4],
          expected="manifest versions only, no KVO1 data payload")


@pytest.mark.req("KVCS-PUB-MANIFEST-FIRST")
def test_manifest_before_the_first_data_object(kvcs_publication: Any) -> None:
    """The first manifest version is published before, or together with, the first data object: its stream is
    opened before the second data stream (QUIC numbers a sender's streams in the order it opens them; arrival
    order across streams is the transport's)."""
    obs = kvcs_publication
    need_live(obs)
    versions = _live_versions(obs)
    check(versions, f"case {obs.case.name}: manifest versions on the relay's subscription to the manifest track",
          req="KVCS-PUB-MANIFEST-FIRST", seen="none", expected="the first before or with the first data object")
    first_manifest = min(v[0].stream_id for v in versions)
    data = [o for t in obs.data_tracks() for o in obs.live(t.name)]
    if not data:
        inconclusive(f"case {obs.case.name}: no data object arrived live to compare the manifest with")
    first_data = min(data, key=lambda o: (o.stream_id, o.seq))
    streams = sorted({o.stream_id for o in data})
    before = sorted({o.stream_id for o in data if o.stream_id < first_manifest})
    check(len(streams) <= 1 or first_manifest < streams[1],
          f"case {obs.case.name}: the stream of the first manifest version (first data object {first_data.location} "
          f"of {first_data.track.decode()})", req="KVCS-PUB-MANIFEST-FIRST",
          seen=f"stream {first_manifest}, opened after {len(before)} data streams",
          expected="opened before the second data stream")


@pytest.mark.req("KVCS-MANIFEST-VERSION-GROUP")
def test_each_manifest_version_is_object_0_of_the_next_group(kvcs_publication: Any) -> None:
    """Manifest version m is Object 0 of Group m: Groups 0, 1, 2, ... in publication order, one object each."""
    obs = kvcs_publication
    need_live(obs)
    name = obs.manifest_track
    live = sorted(obs.live(name), key=lambda o: (o.stream_id, o.seq)) if name else []
    normal = [o for o in live if o.status == ObjectStatus.NORMAL]
    if not normal:
        inconclusive(f"case {obs.case.name}: no manifest version arrived live (the manifest-first check judges that)")
    problems = []
    for i, o in enumerate(normal):
        if o.location.object != 0:
            problems.append(f"manifest version at {o.location}: not Object 0 of its Group")
        if o.location.group != i:
            problems.append(f"manifest version {i} (in publication order) is in Group {o.location.group}, expected "
                            f"Group {i}: Group IDs increase by one per version")
            break
    check_no_problems(problems, what=f"case {obs.case.name}: manifest versions are not Object 0 of consecutive Groups",
                      req="KVCS-MANIFEST-VERSION-GROUP")


def _listed_layers(m: Manifest, segment: int) -> int | None:
    """Layers a version says are complete on every data track of ``segment`` (from object_digests), None when it
    does not list the segment or its digests."""
    e = m.segment(segment)
    if e is None or e.object_digests is None or not e.tracks:
        return None
    return min(len(e.object_digests.get(t, [])) for t in e.tracks)


@pytest.mark.req("KVCS-MANIFEST-CADENCE")
def test_a_new_manifest_version_at_least_every_8_layers(kvcs_publication: Any) -> None:
    """While a segment is produced, no more than eight layers complete without a new manifest version: from the
    first version that lists the segment, the completed Groups the versions list (object_digests) never grow by
    more than 8 from one version to the next (the cases have 20, 10 and 9 layers). Without object_digests, each
    version's stream is placed among the data streams by QUIC's stream numbering, which bounds the layers
    completed when it was published, and only a gap beyond doubt fails (arrival order across streams is the
    transport's, not the publisher's)."""
    obs = kvcs_publication
    need_live(obs)
    versions = _live_versions(obs)
    unreadable = [problem for _, m, problem in versions if m is None]
    if unreadable:
        inconclusive(f"case {obs.case.name}: {len(unreadable)} of {len(versions)} live manifest version(s) cannot be "
                     f"read ({unreadable[0]}): the layers each lists are unknown")
    problems = []
    for seg in obs.spec.segment_layout():
        listed = [_listed_layers(m, seg.segment) for _, m, _ in versions if m is not None]
        since = next((i for i, n in enumerate(listed) if n is not None), None)
        groups = _group_streams(obs, seg.segment)
        if since is not None and all(n is not None for n in listed[since:]):
            counts = [n for n in listed[since:] if n is not None]
            bounds = [(n, n) for n in counts]
            how = "listed in object_digests"
        elif groups:
            bounds = [_completed_bounds(groups, o.stream_id) for o, _, _ in versions]
            counts = [hi for _, hi in bounds]
            how = "at most completed when the version's stream was opened"
        else:
            continue
        marks = [(0, 0), *bounds, (obs.spec.layers, obs.spec.layers)]
        for (_, a_hi), (b_lo, _) in itertools.pairwise(marks):
            if b_lo - a_hi > 8:
                problems.append(f"segment {seg.segment}: layers {a_hi + 1}..{b_lo} ({b_lo - a_hi}) completed with no "
                                f"new manifest version (versions at {counts} layers {how})")
    check_no_problems(problems, what=f"case {obs.case.name}: manifest versions are further apart than 8 completed "
                      "layers", req="KVCS-MANIFEST-CADENCE")


@pytest.mark.req("KVCS-MANIFEST-NEW-VERSION-SEGMENT")
def test_a_new_manifest_version_when_a_segment_is_added_or_completes(kvcs_publication: Any) -> None:
    """Each segment is listed by a version published when it was added (the first version listing it lists none
    of its layers complete, or at least lists it incomplete), and a version marks it complete.

    Arrival order is not publication order here: a MOQT sender serves the lower Group of equal priority first,
    so a manifest version may legitimately reach the relay after the first objects of the segment it adds."""
    obs = kvcs_publication
    need_publication(obs)
    versions = [m for _, m in readable_manifests(obs)]
    problems = []
    for seg in obs.spec.segment_layout():
        listing = [m for m in versions if m.segment(seg.segment) is not None]
        if not listing:
            problems.append(f"segment {seg.segment}: no manifest version lists it")
            continue
        first = listing[0]
        entry = first.segment(seg.segment)
        layers = _listed_layers(first, seg.segment)
        if (entry is not None and entry.complete) or (layers is not None and layers > 0):
            problems.append(f"segment {seg.segment}: the first version listing it already has "
                            f"{obs.spec.layers if layers is None else layers} layers complete: no version was "
                            "published when it was added")
        if not any((e := m.segment(seg.segment)) is not None and e.complete for m in listing):
            problems.append(f"segment {seg.segment}: no manifest version marks it complete")
    check_no_problems(problems, what=f"case {obs.case.name}: no new manifest version when a segment was added or "
                      "completed", req="KVCS-MANIFEST-NEW-VERSION-SEGMENT")


CONSISTENCY_REQS = ("KVCS-MANIFEST-JSON", "KVCS-MANIFEST-SEGMENTS", "KVCS-MANIFEST-BLOCK-KEYS-SHA256",
                    "KVCS-MANIFEST-COMPAT-CONSISTENT", "KVCS-KVSP-COMPAT-DESCRIPTOR", "KVCS-TRACK-NAME-ABNF")
DESCRIPTOR_KEYS = ("model", "layers", "kv_heads", "head_dim", "block_tokens", "dtype")
_CITED = re.compile(r"\[(KVCS-[A-Z0-9-]+)\]\s*$")


def _cited(problem: str, default: str) -> str:
    """The requirement a problem of kvconform.kvcs.manifest names ("... [ID]"), else ``default``."""
    found = _CITED.search(problem)
    return found.group(1) if found else default


@pytest.mark.req(*CONSISTENCY_REQS)
def test_manifest_is_consistent_with_the_namespace_and_the_cache(kvcs_publication: Any) -> None:
    """Every version parses; its "compat" is a Compatibility Descriptor that hashes to the namespace's
    Compatibility ID; layers and block_tokens match; each segment entry has the segment's first_block, blocks,
    block_keys_sha256 and data tracks (names that follow the ABNF and are served); "complete" only once every
    Group was published."""
    obs = kvcs_publication
    need_publication(obs)
    ns = obs.namespace
    versions = obs.manifest_versions()
    if ns is None:
        inconclusive(f"case {obs.case.name}: no accepted namespace to check the manifest against (the announcement "
                     "check judges that)")
    check(versions, f"case {obs.case.name}: manifest versions of the manifest track", req="KVCS-MANIFEST-JSON",
          seen="none readable on manifest or manifest.cose", expected="at least one")
    layout = obs.spec.segment_layout()
    served = {t.name.decode() for t in obs.data_tracks()}
    found = findings(f"case {obs.case.name}: the manifest is not consistent with the namespace and the cache",
                     *CONSISTENCY_REQS)
    for o, m, problem in versions:
        where = f"manifest version {o.location.group} ({o.via})"
        if m is None:
            found.add("KVCS-MANIFEST-JSON", f"{where}: {problem}")
            continue
        missing = [k for k in DESCRIPTOR_KEYS if k not in m.compat]
        if missing or m.compat.get("dtype") != "f16":
            found.add("KVCS-KVSP-COMPAT-DESCRIPTOR", f"{where}: compat lacks {missing} or its dtype "
                                                     f"{m.compat.get('dtype')!r} is not 'f16'")
        for p in manifest_problems(m, ns, obs.spec.profile, block_keys=obs.spec.block_keys):
            req = _cited(p, "KVCS-MANIFEST-JSON")
            if req == "KVCS-MANIFEST-OBJECT-DIGESTS":
                continue  # test_manifest_lists_the_object_digests judges those
            found.add(req if req in CONSISTENCY_REQS else "KVCS-MANIFEST-JSON", f"{where}: {p}")
        if (m.layers, m.block_tokens) != (obs.spec.layers, obs.spec.block_tokens):
            found.add("KVCS-MANIFEST-JSON", f"{where}: layers {m.layers}, block_tokens {m.block_tokens}; the cache has "
                                            f"{obs.spec.layers}, {obs.spec.block_tokens}")
        for e in m.segments:
            if e.segment >= len(layout):
                found.add("KVCS-MANIFEST-SEGMENTS", f"{where}: segment {e.segment} does not exist in the cache")
                continue
            want = layout[e.segment]
            if (e.first_block, e.blocks) != (want.first_block, want.blocks):
                found.add("KVCS-MANIFEST-SEGMENTS", f"{where}: segment {e.segment} first_block {e.first_block} blocks "
                                                    f"{e.blocks}, expected {want.first_block}, {want.blocks}")
            needed = {str(t) for t in obs.spec.data_tracks(e.segment)}
            if not needed <= set(e.tracks) or not set(e.tracks) <= served:
                found.add("KVCS-MANIFEST-SEGMENTS", f"{where}: segment {e.segment} tracks {list(e.tracks)}; it needs "
                                                    f"{sorted(needed)} and the publisher serves {sorted(served)}")
            if e.complete:
                for t in e.tracks:
                    have = {x.location for x in obs.of(t.encode()) if x.status == ObjectStatus.NORMAL}
                    if len(have) < obs.spec.layers * want.blocks:
                        found.add("KVCS-MANIFEST-SEGMENTS", f"{where}: segment {e.segment} marked complete, but {t} "
                                                            f"published {len(have)} of "
                                                            f"{obs.spec.layers * want.blocks} objects")
    found.judge()


@pytest.mark.req("KVCS-MANIFEST-OBJECT-DIGESTS")
def test_manifest_lists_the_object_digests(kvcs_publication: Any) -> None:
    """Each segment entry carries "object_digests": per data track one array per completed Group, each the Data
    Digests of its objects in Object order, equal to the digests of the cache's data; a complete segment lists
    all its Groups."""
    obs = kvcs_publication
    need_publication(obs)
    layout = obs.spec.segment_layout()
    tracks = {str(t): t for t in obs.expected_tracks()}
    problems = []
    for o, m in readable_manifests(obs):
        where = f"manifest version {o.location.group}"
        for e in m.segments:
            if e.object_digests is None:
                problems.append(f"{where}: segment {e.segment} has no object_digests")
                continue
            for name in e.tracks:
                groups = e.object_digests.get(name)
                track = tracks.get(name)
                if groups is None or track is None or e.segment >= len(layout):
                    problems.append(f"{where}: segment {e.segment} object_digests has no array for {name}")
                    continue
                if e.complete and len(groups) != obs.spec.layers:
                    problems.append(f"{where}: {name} lists {len(groups)} Groups in a complete segment of "
                                    f"{obs.spec.layers} layers")
                for g, digests in enumerate(groups[:obs.spec.layers]):
                    want = [hashlib.sha256(obs.spec.object_data(track, g, b)).digest()
                            for b in range(layout[track.segment].blocks)]
                    if digests != want:
                        problems.append(f"{where}: {name} Group {g} digests differ from the Data Digests of its "
                                        "objects")
                        break
    check_no_problems(problems, what=f"case {obs.case.name}: the manifest does not list the objects' digests",
                      req="KVCS-MANIFEST-OBJECT-DIGESTS")


@pytest.mark.req("KVCS-MANIFEST-COSE-SIGN", "KVCS-SEC-COSE-REQUIRED")
def test_signed_manifest_verifies_with_the_producer_key(kvcs_signed: Any) -> None:
    """Given a producer key, the publisher uses the "manifest.cose" track (not "manifest"), every version is a
    COSE_Sign1 that verifies with that key under its kid (ES256 or EdDSA), and each carries object_digests."""
    obs = kvcs_signed
    need_publication(obs)
    check(obs.offered(MANIFEST_COSE) and not obs.offered(MANIFEST), "manifest tracks served with a producer key",
          req="KVCS-SEC-COSE-REQUIRED",
          seen=f"manifest {obs.offered(MANIFEST)}, manifest.cose {obs.offered(MANIFEST_COSE)}",
          expected="manifest.cose only")
    versions = obs.manifest_versions()
    check(versions, "versions of manifest.cose", req="KVCS-MANIFEST-COSE-SIGN", seen="none arrived",
          expected="at least one")
    found = findings("the signed manifest does not verify with the producer key", "KVCS-MANIFEST-COSE-SIGN",
                     "KVCS-SEC-COSE-REQUIRED")
    for o, m, problem in versions:
        if m is None:
            found.add("KVCS-MANIFEST-COSE-SIGN", f"manifest.cose version {o.location.group} ({o.via}): {problem}")
        elif any(e.object_digests is None for e in m.segments):
            found.add("KVCS-SEC-COSE-REQUIRED", f"manifest.cose version {o.location.group}: a segment without "
                                                "object_digests")
    found.judge()
