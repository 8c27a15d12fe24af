"""kvcs-publisher: the text's example Object payload header (KVCS "Encoding Examples").

The text prints the header of a "k" Object at Group 0, Object 1 (Token Start 4, Token Count 4, codec "raw")
with 16 octets of Data (vectors/kvcs/payload.json, flag SpecExample). A cache of that geometry (4-token
blocks, 1 KV head of 2 dimensions in f16: 4 x 1 x 2 x 2 = 16 octets per block and component) is published
by the publisher under test; its k object at {0,1} must carry the example's header octets 0..35 exactly
(Magic .. Data Length) and, at 36..67, the SHA-256 of its own Data (the test content, not the example's
0x00..0x0f).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any

import pytest

from kvconform.kvcs.content import CacheSpec, example_spec
from kvconform.kvcs.payload import HEADER_LEN, field_offset
from kvconform.kvcs.tracks import DataTrack
from kvconform.moqt.data import ObjectStatus
from kvconform.moqt.structures import Location
from kvconform.targets.kvcs.recording_relay import Case, Observation, need_publication
from kvconform.testvectors import load_vectors
from kvconform.verdicts import check, check_no_problems

REQ = "KVCS-EX-PAYLOAD-HEADER"
EXAMPLE_TRACK = DataTrack("k", "raw", 0)
EXAMPLE_LOCATION = Location(0, 1)
DIGEST_AT = field_offset("Data Digest")  # 36: octets before it are the fixed fields the example prints
FIELDS = ("Magic", "Version", "Component", "Flags", "Layer", "Block Index", "Token Start", "Token Count", "Codec",
          "Reserved", "Data Length")
SEED_SALT = 0xE8A4  # the example case's seed differs from the other cases'


@dataclass(frozen=True)
class ExampleCase(Case):
    """The example's geometry: 4-token blocks, 1 KV head of 2 f16 dimensions (16 Data octets per object)."""

    def spec(self, seed: int) -> tuple[CacheSpec, dict[bytes, str]]:
        return example_spec(layers=self.layers, blocks=self.blocks, block_tokens=4, kv_heads=1, head_dim=2,
                            seed=seed), {}


EXAMPLE_CASE = ExampleCase("example-geometry", layers=2, blocks=2)


def example_payload() -> bytes:
    """The text's example payload (header then the 16 Data octets 0x00..0x0f)."""
    case = next(c for c in load_vectors("kvcs-payload") if "SpecExample" in c.flags)
    return bytes.fromhex(case["payload"])


def field_at(offset: int) -> str:
    return max((n for n in FIELDS if field_offset(n) <= offset), key=field_offset)


@pytest.fixture
def kvcs_example_geometry(kvcs_publications: Any) -> Observation:
    """One publication of a 2-layer x 2-block cache of the example's geometry (bounded by the harness's own
    timeouts), once per session."""
    obs: Observation = kvcs_publications.observe(EXAMPLE_CASE.name, EXAMPLE_CASE,
                                                 kvcs_publications.seed ^ SEED_SALT)
    return obs


def header_problems(payload: bytes, via: str) -> list[str]:
    """How one payload of k {0,1} differs from the example: header octets 0..35 and the Data Digest."""
    want = example_payload()
    where = f"{EXAMPLE_TRACK} {EXAMPLE_LOCATION} ({via})"
    if len(payload) < HEADER_LEN:
        return [f"{where}: {len(payload)} octets, shorter than the {HEADER_LEN}-octet header"]
    problems = []
    first = next((i for i in range(DIGEST_AT) if payload[i] != want[i]), None)
    if first is not None:
        problems.append(f"{where}: header octets 0..{DIGEST_AT - 1} are {payload[:DIGEST_AT].hex()}, the text's "
                        f"example has {want[:DIGEST_AT].hex()}; first difference at offset {first} "
                        f"({field_at(first)})")
    data = payload[HEADER_LEN:]
    if len(data) != len(want) - HEADER_LEN:
        problems.append(f"{where}: {len(data)} Data octets, the example's geometry gives {len(want) - HEADER_LEN}")
    digest = payload[DIGEST_AT:HEADER_LEN]
    if digest != hashlib.sha256(data).digest():
        problems.append(f"{where}: Data Digest (offset {DIGEST_AT}) {digest.hex()} is not the SHA-256 of the "
                        f"object's Data {hashlib.sha256(data).hexdigest()}")
    return problems


@pytest.mark.req(REQ)
def test_the_texts_example_header(kvcs_example_geometry: Observation) -> None:
    """The k object at Group 0, Object 1 of a cache of the example's geometry has the example's header."""
    obs = kvcs_example_geometry
    need_publication(obs)
    seen = [o for o in obs.objects if o.track == EXAMPLE_TRACK.name and o.location == EXAMPLE_LOCATION
            and o.status == ObjectStatus.NORMAL]
    check(seen, f"the object {EXAMPLE_TRACK} {EXAMPLE_LOCATION} of a {obs.spec.layers}-layer cache of the example's "
          "geometry (live, filled or fetched)", req=REQ, seen=f"none (notes: {obs.notes})", expected="one")
    problems: list[str] = []
    vias: dict[bytes, set[str]] = {}
    for o in seen:
        vias.setdefault(o.payload, set()).add(o.via)
    for payload, how in vias.items():
        problems += header_problems(payload, ", ".join(sorted(how)))
    check_no_problems(problems, what="the k object at {0,1} is not the text's example header", req=REQ)
