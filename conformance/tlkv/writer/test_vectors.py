"""tlkv-writer: the published vectors (vectors/tlkv/envelope.json), part by part.

Each vector is exported once; four checks compare its parts with the published envelope, each blaming the rule
of its part: the header and length, the CRC, the records (hashes and fills), the payloads. v1 payloads are a pure
function of the block's contents and must match byte for byte. v2 vectors carry flag E4m3Rounding: our reading of
the e4m3 conversion (round to nearest even of x / scale in f32); there a writer may differ only in element bytes
that are the adjacent e4m3 code (a rounding tie), and in v2 padding, which the text does not oblige
(TLKV-V2-ZERO-PAD is a SHOULD, checked on its own), so the CRC is checked against the bytes written.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pytest

from kvconform import evidence
from kvconform.conformance.tlkv.hashes import CHAIN, FULL_BLOCK_RULES, FULL_ONLY
from kvconform.conformance.tlkv.writer.envelope import (
    HEADER_RULES,
    Records,
    judge_crc,
    judge_fills,
    judge_hash_records,
    judge_header,
    judge_padding,
    judge_size,
    judge_v1_values,
    judge_v2_elements,
    judge_v2_scales,
    records,
)
from kvconform.targets.spec import Pics
from kvconform.targets.tlkv import Writer
from kvconform.testvectors import VectorCase, load_vectors
from kvconform.tlkv.blockhash import block_fills
from kvconform.tlkv.geometry import Geometry
from kvconform.tlkv.kvhex import kv_from_hex

CASES = [c for c in load_vectors("tlkv-envelope") if c.result == "valid"]


@dataclass
class VectorExport:
    case: VectorCase
    version: int
    geometry: Geometry
    tokens: list[int]
    kv: np.ndarray
    want: bytes  # the published envelope
    got: bytes

    @property
    def n_blocks(self) -> int:
        return -(-len(self.tokens) // self.geometry.block_tokens)

    @property
    def fills(self) -> list[int]:
        return block_fills(len(self.tokens), self.geometry.block_tokens)

    def records(self) -> Records:
        return records(self.got, self.version, self.n_blocks, self.geometry)

    def published(self) -> Records:
        return records(self.want, self.version, self.n_blocks, self.geometry)


def _id(case: VectorCase) -> str:
    return case.id


@pytest.fixture(scope="module")
def vector(request: pytest.FixtureRequest, tlkv_writer: Writer, pics: Pics) -> VectorExport:
    case: VectorCase = request.param
    version = int(case["version"])
    pics.require("tlkv.writer.versions", version)
    g = Geometry.from_dict(case["geometry"])
    tokens = [int(t) for t in case["tokens"]]
    kv = kv_from_hex(case["kv"], g, -(-len(tokens) // g.block_tokens))
    got = tlkv_writer.export(g, version, tokens, kv)
    return VectorExport(case, version, g, tokens, kv, bytes.fromhex(case["envelope"]), got)


@pytest.fixture(autouse=True)
def _evidence(vector: VectorExport) -> None:
    evidence.record("sent", "export-request", {"vector": vector.case.id, "comment": vector.case.comment,
                                               "version": vector.version, "geometry": vector.geometry.as_dict(),
                                               "tokens": vector.tokens})
    evidence.record("received", "envelope", {"len": len(vector.got), "equals_vector": vector.got == vector.want},
                    raw=vector.got)


def _with_blocks(case: VectorCase) -> bool:
    return bool(case["tokens"])


def _record_reqs(case: VectorCase) -> list[str]:
    g = Geometry.from_dict(case["geometry"])
    n_full = len(case["tokens"]) // g.block_tokens
    reqs = ["TLKV-ENV-NTOKENS", "TLKV-ENV-RECORD", "TLKV-ENV-LE"]
    reqs += list(FULL_BLOCK_RULES) if n_full else []
    reqs += [FULL_ONLY] if len(case["tokens"]) % g.block_tokens else []
    return [r for r in reqs if r != CHAIN or n_full > 1]


def _payload_reqs(case: VectorCase) -> list[str]:
    if int(case["version"]) == 1:
        return ["TLKV-V1-LAYOUT"] + (["TLKV-V1-ZERO-PAD"] if len(case["tokens"]) %
                                      case["geometry"]["block_tokens"] else [])
    return ["TLKV-V2-SCALE", "TLKV-V2-E4M3", "TLKV-V2-LAYOUT"]


WITH_BLOCKS = [c for c in CASES if _with_blocks(c)]


@pytest.mark.parametrize("vector", CASES, ids=_id, indirect=True)
@pytest.mark.req(*HEADER_RULES, "TLKV-ENV-SIZE")
def test_vector_layout(vector: VectorExport) -> None:
    judge_header(vector.got, vector.version, vector.n_blocks, vector.geometry)
    judge_size(vector.got, vector.version, vector.n_blocks, vector.geometry)


@pytest.mark.parametrize("vector", CASES, ids=_id, indirect=True)
@pytest.mark.req("TLKV-ENV-CRC", "TLKV-ENV-LE")
def test_vector_crc(vector: VectorExport) -> None:
    judge_crc(vector.got)


@pytest.mark.parametrize("vector", [pytest.param(c, marks=pytest.mark.req(*_record_reqs(c)), id=c.id)
                                    for c in WITH_BLOCKS], indirect=True)
def test_vector_records(vector: VectorExport) -> None:
    recs = vector.records()
    judge_hash_records(recs, vector.tokens, vector.geometry)
    judge_fills(recs, vector.fills, vector.geometry)


@pytest.mark.parametrize("vector", [pytest.param(c, marks=pytest.mark.req(*_payload_reqs(c)), id=c.id)
                                    for c in WITH_BLOCKS], indirect=True)
def test_vector_payloads(vector: VectorExport) -> None:
    recs, g = vector.records(), vector.geometry
    if vector.version == 1:
        judge_v1_values(recs, vector.kv, vector.fills, g, reference=vector.published().payloads)
        if len(vector.tokens) % g.block_tokens:
            judge_padding(recs, 1, vector.fills, g)
        return
    judge_v2_scales(recs, vector.kv, vector.fills, g, reference=vector.published().payloads)
    judge_v2_elements(recs, vector.kv, vector.fills, g)
