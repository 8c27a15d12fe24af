"""kvcs-publisher: what the objects hold, byte for byte (KVCS "Objects", "Object Payload", the test-content
convention of issue 5), and that no Location ever carries two payloads.

Every object the publisher sent is judged, whichever way it came: on the relay's live subscription, on a
fill fetch stream, or in a FETCH response.
"""

from __future__ import annotations

import hashlib
from typing import Any

import pytest

from kvconform.conformance.kvcs.publisher.harness import Observation, need_publication, report, track_name
from kvconform.kvcs.errors import KvcsError
from kvconform.kvcs.payload import HEADER_LEN, decode_object, field_offset
from kvconform.kvcs.tracks import DataTrack, parse_track_name
from kvconform.moqt.data import ObjectStatus
from kvconform.moqt.structures import Location
from kvconform.targets.spec import Pics

# header field -> the requirement a wrong value breaks
FIELD_REQS = {"magic": ("Magic", "KVCS-PAYLOAD-MAGIC"), "version": ("Version", "KVCS-PAYLOAD-VERSION"),
              "component": ("Component", "KVCS-PAYLOAD-COMPONENT"), "flags": ("Flags", "KVCS-PAYLOAD-FLAGS-ZERO"),
              "layer": ("Layer", "KVCS-PAYLOAD-LAYER"), "block_index": ("Block Index", "KVCS-PAYLOAD-BLOCK-INDEX"),
              "token_start": ("Token Start", "KVCS-PAYLOAD-TOKEN-START"),
              "token_count": ("Token Count", "KVCS-PAYLOAD-TOKEN-COUNT"), "codec": ("Codec", "KVCS-PAYLOAD-CODEC"),
              "reserved": ("Reserved", "KVCS-PAYLOAD-LAYOUT"),
              "data_length": ("Data Length", "KVCS-PAYLOAD-DATA-LENGTH"),
              "digest": ("Data Digest", "KVCS-PAYLOAD-DIGEST")}


def _data_track(name: bytes) -> DataTrack | None:
    try:
        parsed = parse_track_name(name)
    except KvcsError:
        return None
    return parsed if isinstance(parsed, DataTrack) else None


def payload_problems(obs: Observation, track: DataTrack, loc: Location, got: bytes, via: str) -> list[str]:
    """How one payload differs from the one the convention defines, field by field."""
    want = obs.expected_payload(track, loc)
    where = f"{track} {loc} ({via})"
    if want is None:
        return [f"{where}: no such block in layer {loc.group} of segment {track.segment} (the cache has "
                f"{obs.spec.layers} layers of {obs.spec.segment_layout()[track.segment].blocks} blocks there) "
                "[KVCS-OBJ-ID-BLOCK, KVCS-GROUP-LAYER]"]
    if got == want:
        return []
    try:
        header, data = decode_object(got)
    except KvcsError as exc:
        return [f"{where}: {exc} [KVCS-OBJ-ONE-PAYLOAD, KVCS-PAYLOAD-LAYOUT]"]
    want_header, want_data = decode_object(want)
    problems = []
    for attr, (name, req) in FIELD_REQS.items():
        g, w = getattr(header, attr), getattr(want_header, attr)
        if g != w:
            shown = (g.hex()[:16] + "..", w.hex()[:16] + "..") if isinstance(g, bytes) else (g, w)
            problems.append(f"{where}: {name} (offset {field_offset(name)}) is "
                            f"{shown[0]}, expected {shown[1]} [{req}]")
    if data != want_data:
        first = next((i for i, (a, b) in enumerate(zip(data, want_data, strict=False)) if a != b),
                     min(len(data), len(want_data)))
        digest_ok = hashlib.sha256(data).digest() == header.digest
        problems.append(f"{where}: Data differs from the test content from offset {HEADER_LEN + first} "
                        f"({len(data)} octets, expected {len(want_data)}; its Data Digest "
                        f"{'matches it' if digest_ok else 'does not match it'}) "
                        "[KVCS-PAYLOAD-DATA-RAW, KVCS-KVSP-TEST-CONTENT]")
    return problems


@pytest.mark.req("KVCS-OBJ-ONE-PAYLOAD", "KVCS-PAYLOAD-LAYOUT", "KVCS-PAYLOAD-MAGIC", "KVCS-PAYLOAD-VERSION",
                 "KVCS-PAYLOAD-COMPONENT", "KVCS-PAYLOAD-FLAGS-ZERO", "KVCS-PAYLOAD-LAYER", "KVCS-PAYLOAD-BLOCK-INDEX",
                 "KVCS-PAYLOAD-TOKEN-START", "KVCS-PAYLOAD-TOKEN-COUNT", "KVCS-PAYLOAD-CODEC",
                 "KVCS-PAYLOAD-DATA-LENGTH", "KVCS-PAYLOAD-DIGEST", "KVCS-PAYLOAD-DATA-RAW", "KVCS-KVSP-TEST-CONTENT",
                 "KVCS-KVSP-RAW-LAYOUT", "KVCS-KVSP-CODEC-REGISTRY", "KVCS-GROUP-LAYER", "KVCS-OBJ-ID-BLOCK",
                 "KVCS-TRACK-NAME-CODEC")
def test_every_object_is_the_expected_payload(kvcs_publication: Any) -> None:
    """Every object of every data track, live, filled or fetched, is byte for byte the KVO1 payload the cache
    spec defines for its track and Location (68-octet header, then the SHAKE-128 test content)."""
    obs = kvcs_publication
    need_publication(obs)
    problems = []
    for o in obs.objects:
        track = _data_track(o.track)
        if track is None or o.status != ObjectStatus.NORMAL:
            continue
        problems += payload_problems(obs, track, o.location, o.payload, o.via)
    report(problems, f"case {obs.case.name}: objects differ from the cache spec's content")


@pytest.mark.req("KVCS-TRACK-COMPLETE-OWN", "KVCS-GROUP-LAYER", "KVCS-DEF-SEGMENT", "KVCS-KVSP-COMPLETE-BLOCKS",
                 "KVCS-TRACK-MULTI-ENCODING")
def test_every_block_of_every_layer_is_published(kvcs_publication: Any, pics: Pics) -> None:
    """Each data track the cache needs (k and v of every segment; kv when offered or declared in the PICS,
    kvcs.publisher.kv_track) carries every block of every layer, and nothing beyond the complete blocks of its
    segment (an incomplete tail is not published)."""
    obs = kvcs_publication
    need_publication(obs)
    problems = []
    layout = obs.spec.segment_layout()
    for track in obs.expected_tracks(kv=bool(pics.get("kvcs.publisher.kv_track", False))):
        seen = {o.location for o in obs.of(track.name) if o.status == ObjectStatus.NORMAL}
        blocks = layout[track.segment].blocks
        want = {Location(g, b) for g in range(obs.spec.layers) for b in range(blocks)}
        missing = sorted(want - seen)
        extra = sorted(seen - want)
        if not seen and track.component == "kv":
            problems.append(f"{track}: the PICS declare kvcs.publisher.kv_track, but the track is not served "
                            "[KVCS-TRACK-MULTI-ENCODING]")
        elif missing:
            problems.append(f"{track}: {len(missing)} of {len(want)} objects never published (live, fill or FETCH), "
                            f"e.g. {[str(m) for m in missing[:6]]} [KVCS-TRACK-COMPLETE-OWN, KVCS-GROUP-LAYER]")
        if extra:
            problems.append(f"{track}: objects outside {obs.spec.layers} layers x {blocks} complete blocks: "
                            f"{[str(e) for e in extra[:6]]} [KVCS-DEF-SEGMENT, KVCS-KVSP-COMPLETE-BLOCKS, "
                            "KVCS-GROUP-LAYER]")
    report(problems, f"case {obs.case.name}: the cache is not published whole")


@pytest.mark.req("KVCS-PAYLOAD-LAYER-DIGEST", "KVCS-KVSP-LAYER-DIGEST")
def test_k_and_v_data_give_the_kvsp_layer_digest(kvcs_publication: Any) -> None:
    """For each block and layer, SHA-256 of the k object's Data followed by the v object's Data (and the Data
    Digest of a kv object) equals the KVSP layer digest of that block and layer."""
    obs = kvcs_publication
    need_publication(obs)
    data: dict[tuple[int, str, Location], bytes] = {}
    digests: dict[tuple[int, Location], bytes] = {}
    for o in obs.objects:
        track = _data_track(o.track)
        if track is None or o.status != ObjectStatus.NORMAL:
            continue
        try:
            header, body = decode_object(o.payload)
        except KvcsError:
            continue  # the payload check names it
        if track.component == "kv":
            digests.setdefault((track.segment, o.location), header.digest)
        else:
            data.setdefault((track.segment, track.component, o.location), body)
    layout = obs.spec.segment_layout()
    problems = []
    compared = 0
    for (segment, component, loc), k_data in sorted(data.items(), key=lambda kv: (kv[0][0], kv[0][2])):
        if component != "k" or (segment, "v", loc) not in data:
            continue
        want = obs.spec.layer_digest(loc.group, layout[segment].first_block + loc.object)
        got = hashlib.sha256(k_data + data[(segment, "v", loc)]).digest()
        compared += 1
        if got != want:
            problems.append(f"segment {segment} {loc}: SHA-256(k Data || v Data) = {got.hex()[:16]}.., the KVSP layer "
                            f"digest is {want.hex()[:16]}.. [KVCS-PAYLOAD-LAYER-DIGEST]")
        kv = digests.get((segment, loc))
        if kv is not None and kv != want:
            problems.append(f"kv.raw.s{segment} {loc}: Data Digest {kv.hex()[:16]}.. is not the KVSP layer digest "
                            f"{want.hex()[:16]}.. [KVCS-PAYLOAD-LAYER-DIGEST]")
    if not compared:
        raise AssertionError(f"KVCS-PAYLOAD-LAYER-DIGEST: case {obs.case.name}: no block had both a k and a v "
                             f"object ({sorted({track_name(o.track) for o in obs.objects})})")
    report(problems, f"case {obs.case.name}: k and v data do not give the KVSP layer digest")


@pytest.mark.req("KVCS-PUB-NO-DUP-LOCATION", "KVCS-OBJ-IMMUTABLE")
def test_no_two_payloads_at_one_location(kvcs_publication: Any) -> None:
    """Whichever way an object is retrieved (live, fill, FETCH) its Location carries one payload, and the same
    Location is never both a status and an object."""
    obs = kvcs_publication
    need_publication(obs)
    by_loc: dict[tuple[bytes, Location], set[bytes]] = {}
    kinds: dict[tuple[bytes, Location], set[int]] = {}
    vias: dict[tuple[bytes, Location], set[str]] = {}
    for o in obs.objects:
        key = (o.track, o.location)
        kinds.setdefault(key, set()).add(o.status)
        vias.setdefault(key, set()).add(o.via)
        if o.status == ObjectStatus.NORMAL:
            by_loc.setdefault(key, set()).add(o.payload)
    problems = []
    for (track, loc), payloads in sorted(by_loc.items()):
        if len(payloads) > 1:
            problems.append(f"{track_name(track)} {loc}: {len(payloads)} different payloads (via "
                            f"{sorted(vias[(track, loc)])}; sha256 "
                            f"{sorted(hashlib.sha256(p).hexdigest()[:12] for p in payloads)}) "
                            "[KVCS-PUB-NO-DUP-LOCATION]")
    for (track, loc), statuses in sorted(kinds.items()):
        if len(statuses) > 1:
            problems.append(f"{track_name(track)} {loc}: both object statuses {sorted(statuses)} "
                            "[KVCS-OBJ-IMMUTABLE]")
    report(problems, f"case {obs.case.name}: a Location carries more than one payload")


@pytest.mark.req("KVCS-GROUP-PASS-SEGMENT", "KVCS-OBJ-ID-BLOCK", "KVCS-DEF-SEGMENT")
def test_appended_tokens_are_published_as_a_new_segment(kvcs_segmented: Any) -> None:
    """The appended tokens of the cache spec (a second pass) are published on their own tracks k.raw.s1 and
    v.raw.s1, whose Object IDs are the block index within the segment (0, 1, ...), and segment 0's tracks
    hold segment 0's blocks only."""
    obs = kvcs_segmented
    need_publication(obs)
    layout = obs.spec.segment_layout()
    offered = {t.name for t in obs.data_tracks()}
    problems = []
    for seg in layout:
        for track in obs.spec.data_tracks(seg.segment):
            if track.name not in offered:
                problems.append(f"segment {seg.segment}: track {track} is not served (SUBSCRIBE and FETCH refused) "
                                "[KVCS-GROUP-PASS-SEGMENT]")
                continue
            ids = sorted({o.location.object for o in obs.of(track.name) if o.status == ObjectStatus.NORMAL})
            if ids != list(range(seg.blocks)):
                problems.append(f"{track}: Object IDs {ids[:8]}{'..' if len(ids) > 8 else ''}, expected the "
                                f"{seg.blocks} block indexes 0..{seg.blocks - 1} of segment {seg.segment} (first "
                                f"block {seg.first_block}) [KVCS-OBJ-ID-BLOCK, KVCS-DEF-SEGMENT]")
    report(problems, "appended tokens are not published as a new segment")


@pytest.mark.req("KVCS-MANIFEST-DETERMINISTIC")
def test_a_deterministic_claim_holds_across_productions(kvcs_plain: Any, kvcs_replay: Any) -> None:
    """When both productions of the same cache say "deterministic": true, their objects are bit-identical at
    every Location of every data track (a claim of false asks nothing)."""
    claims = []
    for obs in (kvcs_plain, kvcs_replay):
        need_publication(obs)
        manifests = [m for _, m, _ in obs.manifest_versions() if m is not None]
        claims.append(bool(manifests) and all(m.deterministic for m in manifests))
    if not all(claims):
        return  # "deterministic" is false (or absent) in one of them: bit-identity is not promised
    problems = []
    for track in kvcs_plain.data_tracks():
        first = {o.location: o.payload for o in kvcs_plain.of(track.name) if o.status == ObjectStatus.NORMAL}
        second = {o.location: o.payload for o in kvcs_replay.of(track.name) if o.status == ObjectStatus.NORMAL}
        differ = sorted(loc for loc in first.keys() & second.keys() if first[loc] != second[loc])
        if differ:
            problems.append(f"{track}: both productions claim deterministic, yet differ at "
                            f"{[str(d) for d in differ[:6]]} [KVCS-MANIFEST-DETERMINISTIC]")
    report(problems, "a publication that claims to be deterministic is not bit-identical across productions")
