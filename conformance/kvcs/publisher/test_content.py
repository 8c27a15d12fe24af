"""kvcs-publisher: what the objects hold, byte for byte (KVCS "Objects", "Object Payload", the test-content
convention of issue 5), and that no Location ever carries two payloads.

Every object the publisher sent is judged, whichever way it came: on the relay's live subscription, on a
fill fetch stream, or in a FETCH response.
"""

from __future__ import annotations

import hashlib
from typing import Any

import pytest

from kvconform.kvcs.errors import KvcsError
from kvconform.kvcs.payload import HEADER_LEN, decode_object, field_offset
from kvconform.kvcs.tracks import DataTrack, parse_track_name
from kvconform.moqt.data import ObjectStatus
from kvconform.moqt.structures import Location
from kvconform.targets.kvcs.recording_relay import (
    Observation,
    findings,
    need_publication,
    readable_manifests,
    track_name,
)
from kvconform.targets.spec import Pics
from kvconform.verdicts import inconclusive

# header field -> the requirement a wrong value breaks (the Data Digest and Data Length are judged against the
# object's own Data, the Data against the test content)
FIELD_REQS = {"magic": ("Magic", "KVCS-PAYLOAD-MAGIC"), "version": ("Version", "KVCS-PAYLOAD-VERSION"),
              "component": ("Component", "KVCS-PAYLOAD-COMPONENT"), "flags": ("Flags", "KVCS-PAYLOAD-FLAGS-ZERO"),
              "layer": ("Layer", "KVCS-PAYLOAD-LAYER"), "block_index": ("Block Index", "KVCS-PAYLOAD-BLOCK-INDEX"),
              "token_start": ("Token Start", "KVCS-PAYLOAD-TOKEN-START"),
              "token_count": ("Token Count", "KVCS-PAYLOAD-TOKEN-COUNT"), "codec": ("Codec", "KVCS-PAYLOAD-CODEC"),
              "reserved": ("Reserved", "KVCS-PAYLOAD-LAYOUT")}
# what decode_object names when a payload does not even split into header and Data
DECODE_REQS = {"Magic": "KVCS-PAYLOAD-MAGIC", "Version": "KVCS-PAYLOAD-VERSION",
               "Data Length": "KVCS-PAYLOAD-DATA-LENGTH"}
CODEC_REGISTRY = {1: "raw"}  # KVSP Codecs registry (kvsp-provisional-1): 0 is reserved
# what each object is judged on, by the check that judges it: where it is (its track and Location), its header,
# its Data (payload_problems returns each problem with its id; each check takes those of its own ids)
PLACE_REQS = ("KVCS-TRACK-NAME-CODEC", "KVCS-GROUP-LAYER", "KVCS-OBJ-ID-BLOCK")
HEADER_REQS = ("KVCS-OBJ-ONE-PAYLOAD", "KVCS-PAYLOAD-LAYOUT", "KVCS-PAYLOAD-MAGIC", "KVCS-PAYLOAD-VERSION",
               "KVCS-PAYLOAD-COMPONENT", "KVCS-PAYLOAD-FLAGS-ZERO", "KVCS-PAYLOAD-LAYER", "KVCS-PAYLOAD-BLOCK-INDEX",
               "KVCS-PAYLOAD-TOKEN-START", "KVCS-PAYLOAD-TOKEN-COUNT", "KVCS-PAYLOAD-CODEC", "KVCS-KVSP-CODEC-REGISTRY",
               "KVCS-PAYLOAD-DATA-LENGTH", "KVCS-PAYLOAD-DIGEST")
DATA_REQS = ("KVCS-PAYLOAD-DATA-RAW", "KVCS-KVSP-RAW-LAYOUT", "KVCS-KVSP-TEST-CONTENT")


def _data_track(name: bytes) -> DataTrack | None:
    try:
        parsed = parse_track_name(name)
    except KvcsError:
        return None
    return parsed if isinstance(parsed, DataTrack) else None


def _carried_block(payload: bytes) -> int | None:
    """The Block Index a payload's header names, if it decodes."""
    try:
        return decode_object(payload)[0].block_index
    except KvcsError:
        return None


def payload_problems(obs: Observation, track: DataTrack, loc: Location, got: bytes,
                     via: str) -> list[tuple[str, str]]:
    """(requirement, problem) for each way one payload differs from the one the convention defines."""
    where = f"{track} {loc} ({via})"
    if track.codec not in CODEC_REGISTRY.values():
        return [("KVCS-TRACK-NAME-CODEC", f"{where}: codec-name {track.codec!r} names no KVSP codec "
                                          f"({sorted(CODEC_REGISTRY.values())})")]
    # the payload of another block of this track at this Location: the Object ID is not its block index
    carried = _carried_block(got)
    if carried is not None and carried != loc.object and got == obs.expected_payload(track,
                                                                                      Location(loc.group, carried)):
        return [("KVCS-OBJ-ID-BLOCK", f"{where}: Object ID {loc.object} carries block {carried} of segment "
                                      f"{track.segment} (the Object ID is the block index within the segment)")]
    want = obs.expected_payload(track, loc)
    if want is None:
        blocks = obs.spec.segment_layout()[track.segment].blocks
        if not 0 <= loc.group < obs.spec.layers:
            return [("KVCS-GROUP-LAYER", f"{where}: Group {loc.group} is no layer of the {obs.spec.layers}-layer "
                                         "cache")]
        return [("KVCS-OBJ-ID-BLOCK", f"{where}: Object {loc.object} is no block of segment {track.segment} "
                                      f"({blocks} complete blocks)")]
    if got == want:
        return []
    try:
        header, data = decode_object(got)
    except KvcsError as exc:
        return [(DECODE_REQS.get(exc.field, "KVCS-OBJ-ONE-PAYLOAD"), f"{where}: {exc}")]
    want_header, want_data = decode_object(want)
    problems = []
    if header.digest != hashlib.sha256(data).digest():
        problems.append(("KVCS-PAYLOAD-DIGEST", f"{where}: Data Digest (offset {field_offset('Data Digest')}) "
                                                f"{header.digest.hex()[:16]}.. is not the SHA-256 of its Data "
                                                f"{hashlib.sha256(data).hexdigest()[:16]}.."))
    for attr, (name, req) in FIELD_REQS.items():
        g, w = getattr(header, attr), getattr(want_header, attr)
        if g == w:
            continue
        if attr == "codec" and g not in CODEC_REGISTRY:
            req = "KVCS-KVSP-CODEC-REGISTRY"
        shown = (g.hex()[:16] + "..", w.hex()[:16] + "..") if isinstance(g, bytes) else (g, w)
        problems.append((req, f"{where}: {name} (offset {field_offset(name)}) is {shown[0]}, expected {shown[1]}"))
    if len(data) != len(want_data):
        problems.append(("KVCS-KVSP-RAW-LAYOUT", f"{where}: {len(data)} Data octets, the raw layout of "
                                                 f"{obs.spec.kv_heads} heads x {obs.spec.block_tokens} tokens x "
                                                 f"{obs.spec.head_dim} dims (f16) gives {len(want_data)}"))
    elif data != want_data:
        first = next(i for i, (x, y) in enumerate(zip(data, want_data, strict=True)) if x != y)
        other = {"k": "v", "v": "k"}.get(track.component)
        swapped = other is not None and data == obs.spec.object_data(DataTrack(other, track.codec, track.segment),
                                                                     loc.group, loc.object)
        if swapped and other is not None:
            problems.append(("KVCS-PAYLOAD-DATA-RAW", f"{where}: Data is the {other.upper()} section, not the "
                                                      f"{track.component.upper()} section of the block and layer"))
        else:
            problems.append(("KVCS-KVSP-TEST-CONTENT", f"{where}: Data differs from the test content from offset "
                                                       f"{HEADER_LEN + first}"))
    return problems


def _judge_objects(obs: Observation, reqs: tuple[str, ...], what: str) -> None:
    """Every normal object of every data track, live, filled or fetched, against the problems of ``reqs``."""
    need_publication(obs)
    found = findings(f"case {obs.case.name}: {what}", *reqs)
    for o in obs.objects:
        track = _data_track(o.track)
        if track is None or o.status != ObjectStatus.NORMAL:
            continue
        for req, problem in payload_problems(obs, track, o.location, o.payload, o.via):
            if req in reqs:
                found.add(req, problem)
    found.judge()


@pytest.mark.req(*PLACE_REQS)
def test_every_object_is_a_block_of_a_layer(kvcs_publication: Any) -> None:
    """Every object of every data track sits where the cache has a block: a registered codec in its track name,
    Group ID a layer (0..L-1), Object ID the index of the block it carries within its segment."""
    _judge_objects(kvcs_publication, PLACE_REQS, "objects are not at the Location of their block")


@pytest.mark.req(*HEADER_REQS)
def test_every_object_header_is_the_expected_one(kvcs_publication: Any) -> None:
    """Every object of every data track, live, filled or fetched, has the 68-octet KVO1 header the cache spec
    defines for its track and Location, field by field; its Data Length and Data Digest are those of its own
    Data."""
    _judge_objects(kvcs_publication, HEADER_REQS, "object headers differ from the cache spec's")


@pytest.mark.req(*DATA_REQS)
def test_every_object_data_is_the_test_content(kvcs_publication: Any) -> None:
    """The Data of every object is its block and layer's section of the test content (SHAKE-128 of the content
    seed), in the raw layout (f16 [kv_heads][block_tokens][head_dim]), the K section in k, the V section in v."""
    _judge_objects(kvcs_publication, DATA_REQS, "object Data differ from the test content")


@pytest.mark.req("KVCS-TRACK-COMPLETE-OWN", "KVCS-DEF-SEGMENT", "KVCS-KVSP-COMPLETE-BLOCKS",
                 "KVCS-TRACK-MULTI-ENCODING")
def test_every_block_of_every_layer_is_published(kvcs_publication: Any, pics: Pics) -> None:
    """Each data track the cache needs (k and v of every segment; kv when offered or declared in the PICS,
    kvcs.publisher.kv_track) carries every block of every layer, and nothing beyond the complete blocks of its
    segment (an incomplete tail is not published)."""
    obs = kvcs_publication
    if not obs.announces or obs.namespace is None:
        inconclusive(f"case {obs.case.name}: no accepted announcement, so nothing could be asked of the publisher "
                     "(the announcement check judges that)")
    declared_kv = bool(pics.get("kvcs.publisher.kv_track", False))
    found = findings(f"case {obs.case.name}: the cache is not published whole", "KVCS-TRACK-COMPLETE-OWN",
                     "KVCS-DEF-SEGMENT")
    if declared_kv:
        found.asserted.append("KVCS-TRACK-MULTI-ENCODING")
    layout = obs.spec.segment_layout()
    tail = obs.case.tail_tokens > 0
    if tail:
        found.asserted.append("KVCS-KVSP-COMPLETE-BLOCKS")
    for track in obs.expected_tracks(kv=declared_kv):
        seen = {o.location for o in obs.of(track.name) if o.status == ObjectStatus.NORMAL}
        blocks = layout[track.segment].blocks
        want = {Location(g, b) for g in range(obs.spec.layers) for b in range(blocks)}
        missing = sorted(want - seen)
        if not seen and track.component == "kv":
            found.add("KVCS-TRACK-MULTI-ENCODING", f"{track}: the PICS declare kvcs.publisher.kv_track, but the "
                                                   "track is not served")
        elif missing:
            found.add("KVCS-TRACK-COMPLETE-OWN", f"{track}: {len(missing)} of {len(want)} objects never published "
                                                 f"(live, fill or FETCH), e.g. {[str(m) for m in missing[:6]]}")
        # Groups beyond the layers are the payload check's (KVCS-GROUP-LAYER); here: blocks beyond the segment
        extra = sorted(x for x in seen - want if x.group < obs.spec.layers)
        if extra and tail and track.segment == len(layout) - 1 and all(x.object == blocks for x in extra):
            found.add("KVCS-KVSP-COMPLETE-BLOCKS", f"{track}: the incomplete tail block ({obs.case.tail_tokens} "
                                                   f"tokens) is published at {[str(e) for e in extra[:6]]}")
        elif extra:
            found.add("KVCS-DEF-SEGMENT", f"{track}: objects outside the segment's {blocks} complete blocks: "
                                          f"{[str(e) for e in extra[:6]]}")
    found.judge()


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
    found = findings(f"case {obs.case.name}: k and v data do not give the KVSP layer digest",
                     "KVCS-PAYLOAD-LAYER-DIGEST", "KVCS-KVSP-LAYER-DIGEST")
    compared = 0
    for (segment, component, loc), k_data in sorted(data.items(), key=lambda kv: (kv[0][0], kv[0][2])):
        if component != "k" or (segment, "v", loc) not in data or loc.object >= layout[segment].blocks:
            continue
        want = obs.spec.layer_digest(loc.group, layout[segment].first_block + loc.object)
        v_data = data[(segment, "v", loc)]
        got = hashlib.sha256(k_data + v_data).digest()
        compared += 1
        if got != want:
            # the KVSP layer digest hashes the k data, then the v data: the other order is that rule broken
            req = "KVCS-KVSP-LAYER-DIGEST" if hashlib.sha256(v_data + k_data).digest() == want else \
                "KVCS-PAYLOAD-LAYER-DIGEST"
            found.add(req, f"segment {segment} {loc}: SHA-256(k Data || v Data) = {got.hex()[:16]}.., the KVSP layer "
                           f"digest is {want.hex()[:16]}..")
        kv = digests.get((segment, loc))
        if kv is not None and kv != want:
            found.add("KVCS-PAYLOAD-LAYER-DIGEST", f"kv.raw.s{segment} {loc}: Data Digest {kv.hex()[:16]}.. is not "
                                                   f"the KVSP layer digest {want.hex()[:16]}..")
    if not compared:
        inconclusive(f"case {obs.case.name}: no block had both a k and a v object to compare "
                     f"({sorted({track_name(o.track) for o in obs.objects})}); the completeness check judges that")
    found.judge()


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
    found = findings(f"case {obs.case.name}: a Location carries more than one payload", "KVCS-PUB-NO-DUP-LOCATION",
                     "KVCS-OBJ-IMMUTABLE")
    for (track, loc), payloads in sorted(by_loc.items()):
        if len(payloads) > 1:
            digests = sorted(hashlib.sha256(p).hexdigest()[:12] for p in payloads)
            found.add("KVCS-PUB-NO-DUP-LOCATION", f"{track_name(track)} {loc}: {len(payloads)} different payloads "
                                                  f"(via {sorted(vias[(track, loc)])}; sha256 {digests})")
    for (track, loc), statuses in sorted(kinds.items()):
        if len(statuses) > 1:
            found.add("KVCS-OBJ-IMMUTABLE", f"{track_name(track)} {loc}: both object statuses {sorted(statuses)}")
    found.judge()


@pytest.mark.req("KVCS-GROUP-PASS-SEGMENT", "KVCS-OBJ-ID-BLOCK")
def test_appended_tokens_are_published_as_a_new_segment(kvcs_segmented: Any) -> None:
    """The appended tokens of the cache spec (a second pass) are published on their own tracks k.raw.s1 and
    v.raw.s1, whose Object IDs are the block index within the segment (0, 1, ...), and segment 0's tracks
    hold segment 0's blocks only."""
    obs = kvcs_segmented
    need_publication(obs)
    layout = obs.spec.segment_layout()
    offered = {t.name for t in obs.data_tracks()}
    found = findings("appended tokens are not published as a new segment", "KVCS-GROUP-PASS-SEGMENT",
                     "KVCS-OBJ-ID-BLOCK")
    for seg in layout:
        for track in obs.spec.data_tracks(seg.segment):
            if track.name not in offered:
                found.add("KVCS-GROUP-PASS-SEGMENT", f"segment {seg.segment}: track {track} is not served (SUBSCRIBE "
                                                     "and FETCH refused)")
                continue
            ids = sorted({o.location.object for o in obs.of(track.name) if o.status == ObjectStatus.NORMAL})
            if ids != list(range(seg.blocks)):
                found.add("KVCS-OBJ-ID-BLOCK", f"{track}: Object IDs {ids[:8]}{'..' if len(ids) > 8 else ''}, expected "
                                               f"the {seg.blocks} block indexes 0..{seg.blocks - 1} of segment "
                                               f"{seg.segment} (first block {seg.first_block})")
    found.judge()


@pytest.mark.req("KVCS-MANIFEST-DETERMINISTIC")
def test_a_deterministic_claim_holds_across_productions(kvcs_plain: Any, kvcs_replay: Any) -> None:
    """When both productions of the same cache say "deterministic": true, their objects are bit-identical at
    every Location of every data track (a claim of false asks nothing: the rule holds)."""
    claims = []
    for obs in (kvcs_plain, kvcs_replay):
        need_publication(obs)
        manifests = [m for _, m in readable_manifests(obs)]
        if not manifests:
            inconclusive(f"case {obs.case.name}: no manifest version to read the \"deterministic\" claim from")
        claims.append(all(m.deterministic for m in manifests))
    found = findings("a publication that claims to be deterministic is not bit-identical across productions",
                     "KVCS-MANIFEST-DETERMINISTIC")
    if all(claims):
        for track in kvcs_plain.data_tracks():
            first = {o.location: o.payload for o in kvcs_plain.of(track.name) if o.status == ObjectStatus.NORMAL}
            second = {o.location: o.payload for o in kvcs_replay.of(track.name) if o.status == ObjectStatus.NORMAL}
            differ = sorted(loc for loc in first.keys() & second.keys() if first[loc] != second[loc])
            if differ:
                found.add("KVCS-MANIFEST-DETERMINISTIC", f"{track}: both productions claim deterministic, yet "
                                                         f"differ at {[str(d) for d in differ[:6]]}")
    found.judge()
