"""tlkv-writer: the envelope a writer exports, field by field, for boundary geometries (TLKV "Export envelope").

Each case is exported once per version; the checks below read the same bytes.  The writer is given
non-zero garbage past a partial block's fill and must not let it through.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import ml_dtypes
import numpy as np
import pytest

from kvconform.checksum import crc32c
from kvconform.conformance.tlkv.scenarios import (
    WRITER_CASES,
    Case,
    ParsedEnvelope,
    case_seed,
    fills_of,
    make_contents,
    make_tokens,
    split_envelope,
)
from kvconform.fixtures import evidence
from kvconform.targets.spec import Pics
from kvconform.targets.tlkv import Writer
from kvconform.tlkv.blockhash import block_hash, chain_hashes
from kvconform.tlkv.geometry import Geometry
from kvconform.tlkv.payload import E4M3, E4M3_MAX, v2_elements, v2_scale_values
from kvconform.tlkv.vectors import ZERO_HASH_TOKENS

VERSIONS = [1, 2]


@dataclass
class Export:
    case: Case
    version: int
    tokens: list[int]
    kv: np.ndarray
    data: bytes

    @cached_property
    def parsed(self) -> ParsedEnvelope:
        """Split by layout when a check first needs it: a wrong length fails that check, not the fixture."""
        return split_envelope(self.data, self.version, self.case.n_blocks, self.case.geometry)


def _export(case: Case, version: int, writer: Writer, pics: Pics, session_seed: int) -> Export:
    pics.require("tlkv.writer.versions", version)
    rng = np.random.default_rng(case_seed(session_seed, "writer", case.name, version))
    tokens = make_tokens(rng, case.n_tokens)
    kv = make_contents(rng, case.geometry, case.n_tokens)
    data = writer.export(case.geometry, version, tokens, kv)
    return Export(case, version, tokens, kv, data)


@pytest.fixture(scope="module", params=[(c, v) for c in WRITER_CASES for v in VERSIONS],
                ids=[f"{c.name}-v{v}" for c in WRITER_CASES for v in VERSIONS])
def export(request: pytest.FixtureRequest, tlkv_writer: Writer, pics: Pics, session_seed: int) -> Export:
    case, version = request.param
    return _export(case, version, tlkv_writer, pics, session_seed)


@pytest.fixture(scope="module", params=WRITER_CASES, ids=[c.name for c in WRITER_CASES])
def export_v1(request: pytest.FixtureRequest, tlkv_writer: Writer, pics: Pics, session_seed: int) -> Export:
    return _export(request.param, 1, tlkv_writer, pics, session_seed)


@pytest.fixture(scope="module", params=WRITER_CASES, ids=[c.name for c in WRITER_CASES])
def export_v2(request: pytest.FixtureRequest, tlkv_writer: Writer, pics: Pics, session_seed: int) -> Export:
    return _export(request.param, 2, tlkv_writer, pics, session_seed)


@pytest.fixture(autouse=True)
def _evidence(request: pytest.FixtureRequest) -> None:
    for name in ("export", "export_v1", "export_v2"):
        if name not in request.fixturenames:
            continue
        ex: Export = request.getfixturevalue(name)
        evidence.record("sent", "export-request", {"case": ex.case.name, "geometry": ex.case.geometry.as_dict(),
                                                   "version": ex.version, "tokens": ex.tokens[:64]})
        evidence.record("received", "envelope", {"len": len(ex.data)}, raw=ex.data)


@pytest.mark.req("TLKV-ENV-MAGIC", "TLKV-ENV-VERSION", "TLKV-ENV-DTYPE", "TLKV-ENV-HEADER", "TLKV-ENV-LE")
def test_header_fields(export: Export) -> None:
    g = export.case.geometry
    expected = (b"TLKV", export.version, {1: 1, 2: 3}[export.version], export.case.n_blocks,
                g.block_tokens, g.n_layers, g.n_kv_heads, g.head_dim)
    names = ("magic", "version", "dtype", "n_blocks", "block_tokens", "n_layers", "n_kv_heads", "head_dim")
    for name, seen, want in zip(names, export.parsed.header, expected, strict=True):
        assert seen == want, f"header.{name} (little-endian): got {seen!r}, expected {want!r}"


@pytest.mark.req("TLKV-ENV-SIZE", "TLKV-V1-LAYOUT", "TLKV-V2-LAYOUT")
def test_size(export: Export) -> None:
    g = export.case.geometry
    p = g.payload_size(export.version)
    assert len(export.data) == 28 + export.case.n_blocks * (12 + p) + 4


@pytest.mark.req("TLKV-ENV-CRC")
def test_crc(export: Export) -> None:
    want = crc32c(export.parsed.body)
    assert export.parsed.crc == want, (f"crc32c: got 0x{export.parsed.crc:08X}, expected 0x{want:08X} "
                                       f"(the CRC-32C of every byte before it)")


@pytest.mark.req("TLKV-HASH-CHAIN", "TLKV-HASH-H", "TLKV-HASH-FNV", "TLKV-HASH-FULL-ONLY", "TLKV-HASH-RESERVED-ZERO",
                 "TLKV-ENV-RECORD")
def test_block_hashes(export: Export) -> None:
    want = chain_hashes(export.tokens, export.case.geometry.block_tokens)
    want += [0] * (export.case.n_blocks - len(want))
    seen = [h for h, _, _ in export.parsed.records]
    for i, (s, w) in enumerate(zip(seen, want, strict=True)):
        kind = "partial tail: 0 (no hash)" if w == 0 else "chain hash"
        assert s == w, f"records[{i}].block_hash: got 0x{s:016X}, expected 0x{w:016X} ({kind})"


@pytest.mark.req("TLKV-ENV-NTOKENS", "TLKV-HASH-BLOCKS", "TLKV-ENV-RECORD")
def test_fills(export: Export) -> None:
    seen = [n for _, n, _ in export.parsed.records]
    assert seen == list(fills_of(export.case)), "records[].n_tokens: the fill of each block of B tokens"


def _filled_mask(export: Export) -> np.ndarray:
    g = export.case.geometry
    mask = np.zeros((export.case.n_blocks, *g.kv_shape), bool)
    for i, fill in enumerate(fills_of(export.case)):
        mask[i, :, :, :, :fill, :] = True
    return mask


@pytest.mark.req("TLKV-V1-LAYOUT")
def test_v1_values(export_v1: Export) -> None:
    g = export_v1.case.geometry
    got = np.stack([np.frombuffer(p, "<f2").reshape(g.kv_shape) for _, _, p in export_v1.parsed.records])
    mask = _filled_mask(export_v1)
    bad = np.argwhere(mask & (got.view(np.uint16) != export_v1.kv.astype("<f2").view(np.uint16)))
    assert not len(bad), (f"{len(bad)} f16 elements differ from the block's values; first at "
                          f"[block, layer, k/v, head, token, dim] = {bad[0].tolist()}")


@pytest.mark.req("TLKV-V1-ZERO-PAD")
def test_v1_zero_padding(export_v1: Export, tlkv_writer: Writer) -> None:
    _check_zero_padding(export_v1, tlkv_writer)


@pytest.mark.req("TLKV-V2-ZERO-PAD")
def test_v2_zero_padding(export_v2: Export, tlkv_writer: Writer) -> None:
    _check_zero_padding(export_v2, tlkv_writer)


def _check_zero_padding(export: Export, writer: Writer) -> None:
    g = export.case.geometry
    n_elem_bytes = g.elements * (2 if export.version == 1 else 1)
    per = n_elem_bytes // g.elements
    for i, fill in enumerate(fills_of(export.case)):
        elems = np.frombuffer(export.parsed.records[i][2], np.uint8, n_elem_bytes).reshape(*g.kv_shape[:4], -1)
        tail = elems[:, :, :, fill:, :]
        assert not tail.any(), (f"block {i} (n_tokens {fill} of {g.block_tokens}): {int(np.count_nonzero(tail))} "
                                f"non-zero bytes at positions >= n_tokens ({per}-byte elements)")
    # A pure function of the contents: other garbage past the fill gives the same bytes.
    kv2 = export.kv.copy()
    mask = _filled_mask(export)
    kv2[~mask] = np.float16(-3.5)
    again = writer.export(g, export.version, export.tokens, kv2)
    assert again == export.data, "the envelope changed when only values past n_tokens changed"


@pytest.mark.req("TLKV-V2-SCALE", "TLKV-V2-LAYOUT")
def test_v2_scales(export_v2: Export) -> None:
    g = export_v2.case.geometry
    for i, fill in enumerate(fills_of(export_v2.case)):
        seen = v2_scale_values(export_v2.parsed.records[i][2], g)
        filled = np.abs(export_v2.kv[i, :, :, :, :fill, :].astype(np.float32))
        amax = filled.max(axis=(3, 4))
        want = np.where(amax == 0, np.float32(1.0), amax / np.float32(E4M3_MAX)).astype(np.float32)
        bad = np.argwhere(seen.view(np.uint32) != want.view(np.uint32))
        assert not len(bad), (f"block {i}: scale of slab [layer, k/v, head] = {bad[0].tolist()}: got "
                              f"{seen[tuple(bad[0])]!r}, expected amax/448 over the {fill} filled positions "
                              f"= {want[tuple(bad[0])]!r} (1.0 when amax is 0)")


@pytest.mark.req("TLKV-V2-E4M3", "TLKV-V2-LAYOUT")
def test_v2_elements(export_v2: Export) -> None:
    g = export_v2.case.geometry
    for i, fill in enumerate(fills_of(export_v2.case)):
        payload = export_v2.parsed.records[i][2]
        scales = v2_scale_values(payload, g).astype(np.float64)[:, :, :, None, None]
        q = v2_elements(payload, g)[:, :, :, :fill, :].view(E4M3).astype(np.float64)
        x = export_v2.kv[i, :, :, :, :fill, :].astype(np.float64) / scales
        assert np.isfinite(q).all(), f"block {i}: an e4m3 element is NaN (0x7F/0xFF): a value saturated"
        err = np.abs(q - x)
        # Half an e4m3 step at |x| (3 mantissa bits; subnormal step 2^-9), plus float rounding slack.
        exp = np.floor(np.log2(np.maximum(np.abs(x), 2.0**-6)))
        half_step = np.exp2(exp - 3) / 2
        bad = np.argwhere(err > half_step * (1 + 1e-6) + 1e-12)
        assert not len(bad), (f"block {i}: element {bad[0].tolist()} decodes to {q[tuple(bad[0])]} * scale, "
                              f"expected the nearest e4m3 to x/scale = {x[tuple(bad[0])]:.6g}")
    assert ml_dtypes.finfo(E4M3).max == E4M3_MAX


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.req("TLKV-HASH-ZERO-IS-ONE", "TLKV-HASH-CHAIN")
def test_reserved_zero_hash(version: int, tlkv_writer: Writer, pics: Pics, rng: np.random.Generator) -> None:
    """Block 0's fnv1a64 is 0: its hash is 1, and block 1 chains from parent 1 (0 means "no hash")."""
    pics.require("tlkv.writer.versions", version)
    g = Geometry(16, 2, 2, 4)
    tokens = [*ZERO_HASH_TOKENS, *make_tokens(rng, 20)]
    kv = make_contents(rng, g, len(tokens))
    data = tlkv_writer.export(g, version, tokens, kv)
    evidence.record("received", "envelope", {"tokens": tokens}, raw=data)
    hashes = [h for h, _, _ in split_envelope(data, version, 3, g).records]
    assert hashes[0] == 1, (f"records[0].block_hash: got 0x{hashes[0]:016X}, expected 1: the block's fnv1a64 is 0, "
                            f"which H replaces by 1")
    want = block_hash(1, tokens[16:32])
    assert hashes[1] == want, f"records[1].block_hash: got 0x{hashes[1]:016X}, expected 0x{want:016X} (parent 1)"
