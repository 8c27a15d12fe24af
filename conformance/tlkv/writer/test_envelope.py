"""tlkv-writer: the envelope a writer exports, field by field, for boundary geometries (TLKV "Export envelope").

Each case is exported once per version; the checks below read the same bytes.  The writer is given
non-zero garbage past a partial block's fill and must not let it through.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import pytest

from kvconform import evidence
from kvconform.conformance.tlkv.hashes import CHAIN, FULL_BLOCK_RULES, FULL_ONLY, ZERO_IS_ONE
from kvconform.conformance.tlkv.scenarios import WRITER_CASES, Case, case_seed, fills_of, make_contents, make_tokens
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
from kvconform.tlkv.blockhash import ZERO_HASH_TOKENS
from kvconform.tlkv.geometry import Geometry
from kvconform.verdicts import check

VERSIONS = [1, 2]


@dataclass
class Export:
    case: Case
    version: int
    tokens: list[int]
    kv: np.ndarray
    data: bytes

    def records(self) -> Records:
        """The block records; a wrong length makes the check that needs them inconclusive (the size checks fail)."""
        return records(self.data, self.version, self.case.n_blocks, self.case.geometry)


def _export(case: Case, version: int, writer: Writer, pics: Pics, session_seed: int) -> Export:
    pics.require("tlkv.writer.versions", version)
    rng = np.random.default_rng(case_seed(session_seed, "writer", case.name, version))
    tokens = make_tokens(rng, case.n_tokens)
    kv = make_contents(rng, case.geometry, case.n_tokens)
    data = writer.export(case.geometry, version, tokens, kv)
    return Export(case, version, tokens, kv, data)


@pytest.fixture(scope="module")
def export(request: pytest.FixtureRequest, tlkv_writer: Writer, pics: Pics, session_seed: int) -> Export:
    """One export per (case, version), shared by the checks that read it (each parametrizes it indirectly)."""
    case, version = request.param
    return _export(case, version, tlkv_writer, pics, session_seed)


def _exports(versions: list[int], reqs: Callable[[Case], list[str]] | None = None,
             cases: Callable[[Case], bool] = lambda case: True) -> pytest.MarkDecorator:
    """Parametrize `export` over the `cases` in `versions`; `reqs` gives a case's own marker (the rules its
    contents exercise: a case without a partial tail cannot show the tail's rule)."""
    params = [pytest.param((c, v), id=f"{c.name}-v{v}" if len(versions) > 1 else c.name,
                           marks=[pytest.mark.req(*reqs(c))] if reqs else [])
              for c in WRITER_CASES if cases(c) for v in versions]
    return pytest.mark.parametrize("export", params, indirect=True)


def _with_tail(case: Case) -> bool:
    """The case's last block is partial: there are positions past n_tokens to zero."""
    return case.n_tokens % case.geometry.block_tokens != 0


def _hash_reqs(case: Case) -> list[str]:
    n_full = case.n_tokens // case.geometry.block_tokens
    reqs = [r for r in FULL_BLOCK_RULES if n_full and (r != CHAIN or n_full > 1)]
    return reqs + ([FULL_ONLY] if case.n_tokens % case.geometry.block_tokens else []) + ["TLKV-ENV-RECORD",
                                                                                          "TLKV-ENV-LE"]


@pytest.fixture(autouse=True)
def _evidence(request: pytest.FixtureRequest) -> None:
    if "export" in request.fixturenames:
        ex: Export = request.getfixturevalue("export")
        evidence.record("sent", "export-request", {"case": ex.case.name, "geometry": ex.case.geometry.as_dict(),
                                                   "version": ex.version, "tokens": ex.tokens[:64]})
        evidence.record("received", "envelope", {"len": len(ex.data)}, raw=ex.data)


@_exports(VERSIONS)
@pytest.mark.req(*HEADER_RULES)
def test_header_fields(export: Export) -> None:
    judge_header(export.data, export.version, export.case.n_blocks, export.case.geometry)


@_exports(VERSIONS)
@pytest.mark.req("TLKV-ENV-SIZE")
def test_size(export: Export) -> None:
    judge_size(export.data, export.version, export.case.n_blocks, export.case.geometry)


@_exports(VERSIONS)
@pytest.mark.req("TLKV-ENV-CRC", "TLKV-ENV-LE")
def test_crc(export: Export) -> None:
    judge_crc(export.data)


@_exports(VERSIONS, _hash_reqs)
def test_block_hashes(export: Export) -> None:
    judge_hash_records(export.records(), export.tokens, export.case.geometry)


@_exports(VERSIONS)
@pytest.mark.req("TLKV-ENV-NTOKENS", "TLKV-ENV-RECORD", "TLKV-ENV-LE")
def test_fills(export: Export) -> None:
    judge_fills(export.records(), fills_of(export.case), export.case.geometry)


@_exports([1])
@pytest.mark.req("TLKV-V1-LAYOUT")
def test_v1_values(export: Export) -> None:
    judge_v1_values(export.records(), export.kv, fills_of(export.case), export.case.geometry)


@_exports([1], cases=_with_tail)
@pytest.mark.req("TLKV-V1-ZERO-PAD")
def test_v1_zero_padding(export: Export, tlkv_writer: Writer) -> None:
    g = export.case.geometry
    judge_padding(export.records(), 1, fills_of(export.case), g)
    # "... so an envelope is a pure function of the block's contents": other garbage past the fill, same bytes.
    kv2 = export.kv.copy()
    for i, fill in enumerate(fills_of(export.case)):
        kv2[i, :, :, :, fill:, :] = np.float16(-3.5)
    again = tlkv_writer.export(g, 1, export.tokens, kv2)
    evidence.record("received", "envelope (garbage past the fill changed)", {"len": len(again)}, raw=again)
    check(again == export.data, "the envelope after only the values past n_tokens changed",
          req="TLKV-V1-ZERO-PAD", seen=f"{len(again)} bytes, differing", expected="the same bytes")


@_exports([2], cases=_with_tail)
@pytest.mark.req("TLKV-V2-ZERO-PAD")
def test_v2_zero_padding(export: Export) -> None:
    judge_padding(export.records(), 2, fills_of(export.case), export.case.geometry)


@_exports([2])
@pytest.mark.req("TLKV-V2-SCALE", "TLKV-V2-LAYOUT")
def test_v2_scales(export: Export) -> None:
    judge_v2_scales(export.records(), export.kv, fills_of(export.case), export.case.geometry)


@_exports([2])
@pytest.mark.req("TLKV-V2-E4M3", "TLKV-V2-LAYOUT")
def test_v2_elements(export: Export) -> None:
    judge_v2_elements(export.records(), export.kv, fills_of(export.case), export.case.geometry)


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.req(ZERO_IS_ONE, CHAIN, *FULL_BLOCK_RULES, FULL_ONLY, "TLKV-ENV-RECORD", "TLKV-ENV-LE")
def test_reserved_zero_hash(version: int, tlkv_writer: Writer, pics: Pics, rng: np.random.Generator) -> None:
    """Block 0's fnv1a64 is 0: its hash is 1, and block 1 chains from parent 1 (0 means "no hash")."""
    pics.require("tlkv.writer.versions", version)
    g = Geometry(16, 2, 2, 4)
    tokens = [*ZERO_HASH_TOKENS, *make_tokens(rng, 20)]
    kv = make_contents(rng, g, len(tokens))
    data = tlkv_writer.export(g, version, tokens, kv)
    evidence.record("received", "envelope", {"tokens": tokens}, raw=data)
    judge_hash_records(records(data, version, 3, g), tokens, g)
