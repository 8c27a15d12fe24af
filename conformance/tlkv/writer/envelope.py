"""The writer suite's judges: one part of an exported envelope each, blaming the rule that part breaks.

Each judge asserts with its own requirement id (TLKV "Export envelope", "Payload, format v1/v2"), so a writer
with one thing wrong fails exactly the checks of that thing: a wrong CRC fails TLKV-ENV-CRC only, a header
written big-endian TLKV-ENV-LE only. A judge that needs the records located (hashes, fills, payloads) is
inconclusive when the envelope's length is not 28 + n * (12 + P) + 4: that is TLKV-ENV-SIZE's failure, judged
once by the size checks, and the records of such bytes cannot be found.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from kvconform.checksum import crc32c
from kvconform.conformance.tlkv.hashes import judge_hashes
from kvconform.conformance.tlkv.judging import cites, held
from kvconform.tlkv.blockhash import block_hashes
from kvconform.tlkv.e4m3 import e4m3_dtype
from kvconform.tlkv.envelope import RECORD_HEADER
from kvconform.tlkv.geometry import CRC_SIZE, HEADER_SIZE, RECORD_HEADER_SIZE, Geometry
from kvconform.tlkv.payload import E4M3_MAX
from kvconform.verdicts import Findings, check, check_equal, fmt, inconclusive, violation

LE = "TLKV-ENV-LE"
HEADER_FIELDS: tuple[tuple[str, str, int, str], ...] = (
    # name, requirement, offset, struct format
    ("version", "TLKV-ENV-VERSION", 4, "H"),
    ("dtype", "TLKV-ENV-DTYPE", 6, "H"),
    ("n_blocks", "TLKV-ENV-HEADER", 8, "I"),
    ("block_tokens", "TLKV-ENV-HEADER", 12, "I"),
    ("n_layers", "TLKV-ENV-HEADER", 16, "I"),
    ("n_kv_heads", "TLKV-ENV-HEADER", 20, "I"),
    ("head_dim", "TLKV-ENV-HEADER", 24, "I"),
)
DTYPE_OF_VERSION = {1: 1, 2: 3}
HEADER_RULES = ("TLKV-ENV-MAGIC", "TLKV-ENV-VERSION", "TLKV-ENV-DTYPE", "TLKV-ENV-HEADER", LE)
RECORD_RULES = ("TLKV-ENV-NTOKENS", "TLKV-ENV-RECORD")


def expected_header(version: int, n_blocks: int, g: Geometry) -> dict[str, int]:
    return {"version": version, "dtype": DTYPE_OF_VERSION[version], "n_blocks": n_blocks,
            "block_tokens": g.block_tokens, "n_layers": g.n_layers, "n_kv_heads": g.n_kv_heads,
            "head_dim": g.head_dim}


def judge_header(data: bytes, version: int, n_blocks: int, g: Geometry) -> None:
    """magic (TLKV-ENV-MAGIC), version, dtype, the five u32 (TLKV-ENV-HEADER), all little-endian (TLKV-ENV-LE)."""
    if len(data) < HEADER_SIZE:
        violation(f"envelope of {len(data)} bytes: shorter than its {HEADER_SIZE}-byte header", req="TLKV-ENV-HEADER",
                  seen=data, expected=f"at least {HEADER_SIZE} bytes")
    check_equal("header.magic (offset 0)", data[:4], b"TLKV", req="TLKV-ENV-MAGIC")
    for name, req, off, code in HEADER_FIELDS:
        want = expected_header(version, n_blocks, g)[name]
        (seen,) = struct.unpack_from("<" + code, data, off)
        if seen != want:
            (as_be,) = struct.unpack_from(">" + code, data, off)
            if as_be == want:
                violation(f"header.{name} (offset {off}) is written big-endian: read little-endian it is "
                          f"{fmt(seen)}", req=LE, seen=data[off : off + struct.calcsize(code)],
                          expected=f"{want} little-endian")
            violation(f"header.{name} (offset {off}, little-endian)", req=req, seen=seen, expected=want)
        held(req, f"header.{name}")
    held(LE, "the header integers read little-endian")


def judge_size(data: bytes, version: int, n_blocks: int, g: Geometry) -> None:
    """28 + n * (12 + P) + 4 bytes (TLKV-ENV-SIZE)."""
    p = g.payload_size(version)
    check_equal(f"envelope length for {n_blocks} block(s) of {g} v{version}: 28 + {n_blocks} * (12 + {p}) + 4",
                len(data), g.envelope_size(n_blocks, version), req="TLKV-ENV-SIZE")


def judge_crc(data: bytes) -> None:
    """The last 4 bytes are the CRC-32C of every byte before them, little-endian (TLKV-ENV-CRC)."""
    if len(data) < CRC_SIZE:
        violation("envelope too short to hold its crc32c", req="TLKV-ENV-CRC", seen=data,
                  expected="at least 4 bytes")
    (stored,) = struct.unpack_from("<I", data, len(data) - CRC_SIZE)
    want = crc32c(data[: len(data) - CRC_SIZE])
    if stored != want and cites(LE) and struct.unpack_from(">I", data, len(data) - CRC_SIZE)[0] == want:
        violation("crc32c (last 4 bytes) is written big-endian", req=LE, seen=f"0x{stored:08X}",
                  expected=f"0x{want:08X} little-endian")
    check(stored == want, f"crc32c (offset {len(data) - CRC_SIZE}): the CRC-32C of the {len(data) - CRC_SIZE} "
                          "bytes before it", req="TLKV-ENV-CRC", seen=f"0x{stored:08X}", expected=f"0x{want:08X}")
    held(LE, "crc32c read little-endian")


@dataclass
class Records:
    """An envelope's block records, located by the layout (the length already matches it)."""

    hashes: list[int]
    fills: list[int]
    payloads: list[bytes]
    offsets: list[int]  # where each record starts


def records(data: bytes, version: int, n_blocks: int, g: Geometry) -> Records:
    """The block records of `data`; inconclusive when the length does not match the layout (TLKV-ENV-SIZE)."""
    want = g.envelope_size(n_blocks, version)
    if len(data) != want:
        inconclusive(f"the envelope is {len(data)} bytes, not the {want} of {n_blocks} block(s) of {g} v{version}: "
                     "its records cannot be located (TLKV-ENV-SIZE fails in the size check)")
    p = g.payload_size(version)
    out = Records([], [], [], [])
    off = HEADER_SIZE
    for _ in range(n_blocks):
        block_hash, fill = RECORD_HEADER.unpack_from(data, off)
        out.offsets.append(off)
        out.hashes.append(block_hash)
        out.fills.append(fill)
        out.payloads.append(data[off + RECORD_HEADER_SIZE : off + RECORD_HEADER_SIZE + p])
        off += RECORD_HEADER_SIZE + p
    return out


def _bswap(value: int, size: int) -> int:
    return int.from_bytes(value.to_bytes(size, "little"), "big")


def judge_hash_records(recs: Records, tokens: Sequence[int], g: Geometry) -> None:
    """Each record's block_hash is its chain hash, 0 for the partial tail (TLKV "Block hash", TLKV-ENV-RECORD)."""
    findings = Findings("records[].block_hash")
    if cites(LE):
        findings.expect(True, LE, "")
    want = block_hashes(tokens, g.block_tokens)
    for i, (seen, w) in enumerate(zip(recs.hashes, want, strict=False)):
        if seen != w and w and _bswap(seen, 8) == w and cites(LE):
            findings.add(LE, f"records[{i}].block_hash (offset {recs.offsets[i]}) is written big-endian: "
                             f"0x{seen:016X}, expected 0x{w:016X}")
    judge_hashes(findings, "records[{i}]", recs.hashes, tokens, g.block_tokens, len(recs.hashes))
    if cites("TLKV-ENV-RECORD"):
        findings.expect(True, "TLKV-ENV-RECORD", "")
    findings.judge()


def judge_fills(recs: Records, fills: Sequence[int], g: Geometry) -> None:
    """Each record's n_tokens is the block's fill, 1..B (TLKV-ENV-NTOKENS)."""
    for i, (seen, want) in enumerate(zip(recs.fills, fills, strict=True)):
        if seen != want and _bswap(seen, 4) == want and cites(LE):
            violation(f"records[{i}].n_tokens (offset {recs.offsets[i] + 8}) is written big-endian", req=LE,
                      seen=seen, expected=f"{want} little-endian")
        check_equal(f"records[{i}].n_tokens (offset {recs.offsets[i] + 8}): the fill of block {i} of B = "
                    f"{g.block_tokens} tokens", seen, want, req="TLKV-ENV-NTOKENS")
    held("TLKV-ENV-RECORD", "records: block_hash, n_tokens, then P payload bytes")
    held(LE, "n_tokens read little-endian")


def _filled(g: Geometry, fill: int) -> npt.NDArray[np.bool_]:
    mask = np.zeros(g.kv_shape, bool)
    mask[:, :, :, :fill, :] = True
    return mask


def judge_v1_values(recs: Records, kv: npt.NDArray[np.floating], fills: Sequence[int], g: Geometry,
                    reference: Sequence[bytes] | None = None) -> None:
    """Filled positions hold the block's values as f16 [L][2][Hkv][B][D], little-endian (TLKV-V1-LAYOUT);
    `reference`: payloads to compare with byte for byte instead (a published vector's)."""
    for i, fill in enumerate(fills):
        got = np.frombuffer(recs.payloads[i], "<u2").reshape(g.kv_shape)
        want = (np.frombuffer(reference[i], "<u2").reshape(g.kv_shape) if reference is not None
                else kv[i].astype("<f2").view("<u2"))
        bad = np.argwhere(_filled(g, fill) & (got != want))
        if len(bad):
            at = tuple(int(x) for x in bad[0])
            violation(f"block {i}: {len(bad)} f16 element(s) at filled positions differ; first at [layer, k/v, "
                      f"head, token, dim] = {list(at)}", req="TLKV-V1-LAYOUT", seen=f"0x{int(got[at]):04X}",
                      expected=f"0x{int(want[at]):04X}")
    held("TLKV-V1-LAYOUT", "f16 values at filled positions")


def judge_padding(recs: Records, version: int, fills: Sequence[int], g: Geometry) -> None:
    """Element bytes at positions >= n_tokens are zero (TLKV-V1-ZERO-PAD, TLKV-V2-ZERO-PAD)."""
    req = "TLKV-V1-ZERO-PAD" if version == 1 else "TLKV-V2-ZERO-PAD"
    width = 2 if version == 1 else 1
    for i, fill in enumerate(fills):
        elems = np.frombuffer(recs.payloads[i], np.uint8, g.elements * width).reshape(*g.kv_shape[:4], -1)
        tail = elems[:, :, :, fill:, :]
        check(not tail.any(), f"block {i} (n_tokens {fill} of {g.block_tokens}): element bytes at positions >= "
                              f"n_tokens ({width}-byte elements)", req=req,
              seen=f"{int(np.count_nonzero(tail))} non-zero byte(s)", expected="zero bytes")


def v2_views(payload: bytes, g: Geometry, swapped: bool = False) -> tuple[npt.NDArray[np.uint8],
                                                                         npt.NDArray[np.float32]]:
    """(e4m3 bytes [L][2][Hkv][B][D], f32 scales [L][2][Hkv]) of a v2 payload; `swapped`: read as if laid out
    [L][Hkv][2] (the usual layout mistake), returned in the text's order."""
    L, _, hkv, b, d = g.kv_shape
    elems = np.frombuffer(payload, np.uint8, g.elements)
    scales = np.frombuffer(payload, "<f4", g.slabs, g.elements).astype(np.float32)
    if not swapped:
        return elems.reshape(g.kv_shape), scales.reshape(L, 2, hkv)
    return (elems.reshape(L, hkv, 2, b, d).transpose(0, 2, 1, 3, 4),
            scales.reshape(L, hkv, 2).transpose(0, 2, 1))


def expected_scales(kv: npt.NDArray[np.floating], fill: int) -> npt.NDArray[np.float32]:
    """amax / 448 over each slab's filled positions, 1.0 when amax is 0 (TLKV-V2-SCALE)."""
    amax = np.abs(kv[:, :, :, :fill, :].astype(np.float32)).max(axis=(3, 4))
    return np.where(amax == 0, np.float32(1.0), amax / np.float32(E4M3_MAX)).astype(np.float32)


def _scales_ok(seen: npt.NDArray[np.float32], want: npt.NDArray[np.float32]) -> bool:
    return bool(np.array_equal(seen.view(np.uint32), want.view(np.uint32)))


def _elements_bad(q_bytes: npt.NDArray[np.uint8], scales: npt.NDArray[np.float32], kv: npt.NDArray[np.floating],
                  fill: int) -> tuple[npt.NDArray[np.intp], npt.NDArray[np.float64], npt.NDArray[np.float64]]:
    """Filled elements that are not the nearest e4m3 of x / scale (either neighbour within float rounding of a
    tie): (positions, decoded values, x / scale)."""
    q = q_bytes[:, :, :, :fill, :].view(e4m3_dtype()).astype(np.float64)
    x = kv[:, :, :, :fill, :].astype(np.float64) / scales.astype(np.float64)[:, :, :, None, None]
    # Half an e4m3 step at |x| (3 mantissa bits; subnormal step 2^-9), plus float rounding slack.
    exp = np.floor(np.log2(np.maximum(np.abs(x), 2.0**-6)))
    half_step = np.exp2(exp - 3) / 2
    with np.errstate(invalid="ignore"):
        bad = ~np.isfinite(q) | (np.abs(q - x) > half_step * (1 + 1e-6) + 1e-12)
    return np.argwhere(bad), q, x


def judge_v2_layout(recs: Records, kv: npt.NDArray[np.floating], fills: Sequence[int], g: Geometry) -> None:
    """A payload that is right only when read [L][Hkv][2] has its axes in the wrong order (TLKV-V2-LAYOUT)."""
    if g.n_kv_heads == 1:
        held("TLKV-V2-LAYOUT", "e4m3 [L][2][Hkv][B][D] then f32 [L][2][Hkv] (one head: one order)")
        return
    for i, fill in enumerate(fills):
        _, s = v2_views(recs.payloads[i], g)
        if _scales_ok(s, expected_scales(kv[i], fill)):
            continue
        q_sw, s_sw = v2_views(recs.payloads[i], g, swapped=True)
        if _scales_ok(s_sw, expected_scales(kv[i], fill)) and not len(_elements_bad(q_sw, s_sw, kv[i], fill)[0]):
            violation(f"block {i}: the payload is laid out [L][Hkv][2][B][D] (scales [L][Hkv][2]): read in that "
                      "order every scale and element is right", req="TLKV-V2-LAYOUT",
                      expected="e4m3 [L][2][Hkv][B][D] then f32 [L][2][Hkv]")
    held("TLKV-V2-LAYOUT", "e4m3 [L][2][Hkv][B][D] then f32 [L][2][Hkv]")


def judge_v2_scales(recs: Records, kv: npt.NDArray[np.floating], fills: Sequence[int], g: Geometry,
                    reference: Sequence[bytes] | None = None) -> None:
    """Each slab's scale is amax / 448 over its filled positions, 1.0 when amax is 0 (TLKV-V2-SCALE)."""
    judge_v2_layout(recs, kv, fills, g)
    for i, fill in enumerate(fills):
        _, seen = v2_views(recs.payloads[i], g)
        want = v2_views(reference[i], g)[1] if reference is not None else expected_scales(kv[i], fill)
        bad = np.argwhere(seen.view(np.uint32) != want.view(np.uint32))
        if len(bad):
            at = tuple(int(x) for x in bad[0])
            violation(f"block {i}: scale of slab [layer, k/v, head] = {list(at)} (amax / 448 over the {fill} filled "
                      "position(s), 1.0 when amax is 0)", req="TLKV-V2-SCALE", seen=float(seen[at]),
                      expected=float(want[at]))
    held("TLKV-V2-SCALE", "v2 slab scales")


def judge_v2_elements(recs: Records, kv: npt.NDArray[np.floating], fills: Sequence[int], g: Geometry) -> None:
    """Each filled element is the nearest e4m3 of x / scale of its slab (TLKV-V2-E4M3); a saturated (NaN)
    element fails too."""
    judge_v2_layout(recs, kv, fills, g)
    for i, fill in enumerate(fills):
        q_bytes, scales = v2_views(recs.payloads[i], g)
        bad, q, x = _elements_bad(q_bytes, scales, kv[i], fill)
        if len(bad):
            at = tuple(int(v) for v in bad[0])
            violation(f"block {i}: {len(bad)} e4m3 element(s) are not the nearest e4m3 of x / scale; first at "
                      f"[layer, k/v, head, token, dim] = {list(at)}", req="TLKV-V2-E4M3",
                      seen=f"{q[at]!r} (byte 0x{int(q_bytes[at]):02X})", expected=f"nearest e4m3 to {x[at]:.6g}")
    held("TLKV-V2-E4M3", "e4m3 elements")
