"""The TLKV reference codec: the text's worked examples, round trips, reader rules, padding, v2 scales."""

from __future__ import annotations

import struct
from collections.abc import Callable

import numpy as np
import numpy.typing as npt
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from kvconform.checksum import CRC32C_CHECK, crc32c
from kvconform.tlkv.blockhash import block_fills, block_hash, block_hashes, fnv1a64, hash_input
from kvconform.tlkv.envelope import (
    Block,
    EncodeError,
    encode_envelope,
    encode_raw,
    encode_sequence,
    sequence_blocks,
    with_crc,
)
from kvconform.tlkv.geometry import Geometry
from kvconform.tlkv.payload import E4M3_MAX, v2_elements, v2_scale_values
from kvconform.tlkv.reader import EnvelopeError, FormatError, ShapeError, VersionError, read_envelope

SPEC_GEOMETRY = Geometry(2, 1, 1, 2)
SPEC_ENVELOPE = bytes.fromhex(
    "544c4b56010001000100000002000000" "010000000100000002000000" "66937b02c1b01aa902000000"
    "003c004000420044" "003800bc00000034" "1c540b4f"
)
SPEC_KV = np.array([[[[[1, 2], [3, 4]]], [[[0.5, -1], [0, 0.25]]]]], np.float16)  # [L][2][Hkv][B][D]
SPEC_HASH0 = 0xA91AB0C1027B9366


# ---- the text's worked examples -------------------------------------------------------------


def test_fnv1a64_of_a() -> None:
    assert fnv1a64(b"a") == 0xAF63DC4C8601EC8C


def test_crc32c_check_value() -> None:
    assert crc32c(b"123456789") == 0xE3069283 == CRC32C_CHECK


def test_block_hash_worked_example() -> None:
    assert hash_input(0, [1, 2]).hex(" ") == "00 00 00 00 00 00 00 00 01 00 00 00 02 00 00 00"
    assert hash_input(SPEC_HASH0, [3, 4]).hex(" ") == "66 93 7b 02 c1 b0 1a a9 03 00 00 00 04 00 00 00"
    assert block_hashes([1, 2, 3, 4, 5], 2) == [0xA91AB0C1027B9366, 0x03DF829571605C60, 0]
    assert block_fills(5, 2) == [2, 2, 1]


def test_envelope_worked_example_byte_for_byte() -> None:
    assert len(SPEC_ENVELOPE) == 60
    blocks = sequence_blocks(SPEC_GEOMETRY, [1, 2], SPEC_KV[None])
    assert [(b.block_hash, b.n_tokens) for b in blocks] == [(SPEC_HASH0, 2)]
    assert encode_envelope(SPEC_GEOMETRY, 1, blocks) == SPEC_ENVELOPE
    assert encode_sequence(SPEC_GEOMETRY, 1, [1, 2], SPEC_KV[None]) == SPEC_ENVELOPE
    assert SPEC_ENVELOPE[-4:] == struct.pack("<I", 0x4F0B541C)
    assert np.float16(1.0).tobytes() == bytes.fromhex("003c")


def test_envelope_size_formula() -> None:
    g = Geometry(16, 2, 4, 8)
    assert g.payload_size(1) == 2 * 2 * 4 * 16 * 8 * 2
    assert g.payload_size(2) == 2 * 2 * 4 * (16 * 8 + 4)
    assert g.envelope_size(3, 2) == 28 + 3 * (12 + g.payload_size(2)) + 4
    assert SPEC_GEOMETRY.envelope_size(1, 1) == 60


def test_zero_hash_is_replaced_by_one(monkeypatch: pytest.MonkeyPatch) -> None:
    import kvconform.tlkv.blockhash as bh

    monkeypatch.setattr(bh, "fnv1a64", lambda data, h=bh.FNV_OFFSET: 0)
    assert bh.block_hash(0, [1, 2]) == 1


# ---- round trips ----------------------------------------------------------------------------

geometries = st.builds(Geometry, st.integers(1, 4), st.integers(1, 2), st.integers(1, 2), st.integers(1, 3))
f16_values = st.floats(width=16, allow_nan=False, allow_infinity=False)


@st.composite
def sequences(draw: st.DrawFn) -> tuple[Geometry, list[int], npt.NDArray[np.float16]]:
    g = draw(geometries)
    tokens = draw(st.lists(st.integers(0, 0xFFFFFFFF), max_size=3 * g.block_tokens))
    n = -(-len(tokens) // g.block_tokens)
    kv = draw(arrays(np.float16, (n, *g.kv_shape), elements=f16_values))
    return g, tokens, kv


@settings(max_examples=60, deadline=None)
@given(sequences())
def test_v1_round_trip(seq: tuple[Geometry, list[int], npt.NDArray[np.float16]]) -> None:
    g, tokens, kv = seq
    data = encode_sequence(g, 1, tokens, kv)
    assert len(data) == g.envelope_size(kv.shape[0], 1)
    env = read_envelope(data, geometry=g, versions=[1])
    assert [r.block_hash for r in env.records] == block_hashes(tokens, g.block_tokens)
    assert [r.n_tokens for r in env.records] == block_fills(len(tokens), g.block_tokens)
    for i, r in enumerate(env.records):
        got = env.kv(i).view(np.uint16)
        assert np.array_equal(got[..., : r.n_tokens, :], kv[i].view(np.uint16)[..., : r.n_tokens, :])
        assert not got[..., r.n_tokens :, :].any()


def _e4m3_table() -> npt.NDArray[np.float64]:
    """Positive finite e4m3 (fn) values by code 0x00..0x7E, decoded from the bit layout (bias 7)."""
    vals = []
    for code in range(0x7F):
        e, m = code >> 3, code & 7
        vals.append(m * 2.0**-9 if e == 0 else (1 + m / 8) * 2.0 ** (e - 7))
    return np.array(vals)


E4M3_TABLE = _e4m3_table()


def e4m3_rne(x: npt.NDArray[np.float32]) -> npt.NDArray[np.uint8]:
    """An independent round-to-nearest-even to e4m3 codes (|x| <= 448)."""
    a = np.abs(x.astype(np.float64))
    hi = np.clip(np.searchsorted(E4M3_TABLE, a), 1, len(E4M3_TABLE) - 1)
    lo = hi - 1
    dlo, dhi = a - E4M3_TABLE[lo], E4M3_TABLE[hi] - a
    code = np.where((dhi < dlo) | ((dhi == dlo) & (hi % 2 == 0)), hi, lo)
    code = np.where(a >= E4M3_TABLE[-1], len(E4M3_TABLE) - 1, code)
    return (code | np.where(np.signbit(x), 0x80, 0)).astype(np.uint8)


def test_e4m3_oracle_agrees_with_itself_on_exact_values() -> None:
    x = np.concatenate([E4M3_TABLE, -E4M3_TABLE]).astype(np.float32)
    codes = e4m3_rne(x)
    assert list(codes[:0x7F]) == list(range(0x7F))
    assert list(codes[0x80:]) == [c | 0x80 for c in range(1, 0x7F)] and codes[0x7F] == 0x80


@settings(max_examples=60, deadline=None)
@given(sequences())
def test_v2_round_trip_scales_and_rounding(seq: tuple[Geometry, list[int], npt.NDArray[np.float16]]) -> None:
    g, tokens, kv = seq
    data = encode_sequence(g, 2, tokens, kv)
    assert len(data) == g.envelope_size(kv.shape[0], 2)
    env = read_envelope(data, geometry=g, versions=[1, 2])
    assert [r.n_tokens for r in env.records] == block_fills(len(tokens), g.block_tokens)
    for i, r in enumerate(env.records):
        n = r.n_tokens
        filled = kv[i][..., :n, :].astype(np.float32)
        amax = np.abs(filled).max(axis=(3, 4))
        expected_scale = np.where(amax == 0, np.float32(1), amax / np.float32(E4M3_MAX)).astype(np.float32)
        scales = v2_scale_values(r.payload, g)
        assert np.array_equal(scales, expected_scale)
        codes = v2_elements(r.payload, g)
        want = e4m3_rne(filled / scales[:, :, :, None, None])
        assert np.array_equal(codes[..., :n, :], want), "e4m3 is not round-to-nearest-even of x / scale"
        assert not codes[..., n:, :].any()
        decoded = env.kv(i)[..., :n, :]
        bound = np.maximum(np.abs(filled) * 2.0**-4, scales[:, :, :, None, None] * 2.0**-10) * (1 + 1e-6)
        assert np.all(np.abs(decoded - filled) <= bound)


# ---- zero padding and the v2 scale rule -----------------------------------------------------


@pytest.mark.parametrize("version", [1, 2])
def test_padding_is_zero_and_envelope_is_a_function_of_contents(version: int) -> None:
    g = Geometry(4, 1, 2, 3)
    rng = np.random.default_rng(7)
    kv = rng.uniform(-2, 2, (1, *g.kv_shape)).astype(np.float16)
    other = kv.copy()
    other[0, :, :, :, 2:, :] = 1000  # different garbage past the fill of 2
    a, b = encode_sequence(g, version, [5, 6], kv), encode_sequence(g, version, [5, 6], other)
    assert a == b
    payload = read_envelope(a, geometry=g).records[0].payload
    elems = np.frombuffer(payload, np.uint8, g.elements * (2 if version == 1 else 1))
    per_pos = elems.reshape((*g.kv_shape[:4], -1))
    assert not per_pos[:, :, :, 2:, :].any()
    assert per_pos[:, :, :, :2, :].any()


def test_v2_scale_amax_zero_is_one_and_padding_excluded() -> None:
    g = Geometry(3, 1, 1, 2)
    kv = np.zeros((1, *g.kv_shape), np.float16)
    kv[0, 0, 0, 0, 2, :] = 50  # K slab: garbage past the fill of 2 only: amax over filled positions is 0
    kv[0, 0, 1, 0, :2, :] = np.array([[1, -3], [2, 0.5]], np.float16)  # V slab: amax 3
    env = read_envelope(encode_sequence(g, 2, [1, 2], kv), geometry=g)
    scales = v2_scale_values(env.records[0].payload, g)
    assert scales[0, 0, 0] == np.float32(1.0)
    assert scales[0, 1, 0] == np.float32(3) / np.float32(448)
    assert env.kv(0)[0, 1, 0, 0, 1] == pytest.approx(-3.0)


# ---- the raw path ---------------------------------------------------------------------------


def test_raw_encoder_writes_exactly_what_it_is_given() -> None:
    data = encode_raw(magic=b"ABCD", version=0xBEEF, dtype=0x1234, n_blocks=9, block_tokens=0, n_layers=7,
                      n_kv_heads=0xFFFFFFFF, head_dim=5, records=[(0x0102030405060708, 0, b"xyz"), (1, 2, b"")],
                      crc=0xDEADBEEF)
    assert data[:28] == struct.pack("<4sHHIIIII", b"ABCD", 0xBEEF, 0x1234, 9, 0, 7, 0xFFFFFFFF, 5)
    assert data[28:43] == struct.pack("<QI", 0x0102030405060708, 0) + b"xyz"
    assert data[43:55] == struct.pack("<QI", 1, 2)
    assert data[55:] == struct.pack("<I", 0xDEADBEEF) and len(data) == 59
    defaulted = encode_raw(version=1, dtype=1, block_tokens=2, n_layers=1, n_kv_heads=1, head_dim=2,
                           records=[(SPEC_HASH0, 2, SPEC_KV.tobytes())])
    assert defaulted == SPEC_ENVELOPE  # n_blocks from the records, the true CRC
    assert with_crc(SPEC_ENVELOPE[:-4] + b"\0\0\0\0") == SPEC_ENVELOPE


@pytest.mark.parametrize(("block", "requirement"), [
    (Block(0, 0, SPEC_KV), "TLKV-ENV-NTOKENS"),
    (Block(0, 3, SPEC_KV), "TLKV-ENV-NTOKENS"),
    (Block(5, 1, SPEC_KV), "TLKV-HASH-FULL-ONLY"),
    (Block(1 << 64, 2, SPEC_KV), "TLKV-ENV-RECORD"),
    (Block(0, 2, SPEC_KV[:, :1]), "TLKV-V1-LAYOUT"),
])
def test_checked_encoder_refuses(block: Block, requirement: str) -> None:
    with pytest.raises(EncodeError) as info:
        encode_envelope(SPEC_GEOMETRY, 1, [block])
    assert info.value.requirement == requirement and requirement in str(info.value)


def test_checked_encoder_refuses_unknown_version() -> None:
    with pytest.raises(EncodeError, match="TLKV-ENV-VERSION"):
        encode_envelope(SPEC_GEOMETRY, 3, [])


# ---- reader rules ---------------------------------------------------------------------------

V1_BLOCK = (SPEC_HASH0, 2, SPEC_KV.tobytes())


def _raw(**fields: object) -> bytes:
    base: dict[str, object] = dict(version=1, dtype=1, block_tokens=2, n_layers=1, n_kv_heads=1, head_dim=2,
                                   records=[V1_BLOCK])
    base.update(fields)
    return encode_raw(**base)  # type: ignore[arg-type]


def _other_geometry(**dims: int) -> bytes:
    g = Geometry(**{**SPEC_GEOMETRY.as_dict(), **dims})
    return encode_envelope(g, 1, [Block(0, 1, np.ones(g.kv_shape, np.float16))])


READER_RULES: list[tuple[str, Callable[[], bytes], list[int], type[EnvelopeError], str, str]] = [
    ("empty", lambda: b"", [1, 2], FormatError, "TLKV-READ-LENGTH", "length"),
    ("31 bytes", lambda: SPEC_ENVELOPE[:27] + struct.pack("<I", crc32c(SPEC_ENVELOPE[:27])), [1, 2],
     FormatError, "TLKV-READ-LENGTH", "length"),
    ("extra payload byte", lambda: _raw(records=[(SPEC_HASH0, 2, SPEC_KV.tobytes() + b"\0")]), [1, 2],
     FormatError, "TLKV-READ-LENGTH", "length"),
    ("n_blocks 2, one record", lambda: _raw(n_blocks=2), [1, 2], FormatError, "TLKV-READ-LENGTH", "length"),
    ("bad magic", lambda: _raw(magic=b"TLKW"), [1, 2], FormatError, "TLKV-READ-MAGIC", "magic"),
    ("bad crc", lambda: _raw(crc=0), [1, 2], FormatError, "TLKV-READ-CRC", "crc32c"),
    ("v2 to a v1-only reader", lambda: encode_sequence(SPEC_GEOMETRY, 2, [1, 2], SPEC_KV[None]), [1],
     VersionError, "TLKV-READ-VERSION", "version"),
    ("version 7", lambda: _raw(version=7), [1, 2], VersionError, "TLKV-READ-VERSION", "version"),
    ("dtype 3 with v1", lambda: _raw(dtype=3), [1, 2], FormatError, "TLKV-READ-DTYPE", "dtype"),
    ("block_tokens", lambda: _other_geometry(block_tokens=3), [1, 2], ShapeError, "TLKV-READ-SHAPE",
     "block_tokens"),
    ("n_layers", lambda: _other_geometry(n_layers=2), [1, 2], ShapeError, "TLKV-READ-SHAPE", "n_layers"),
    ("n_kv_heads", lambda: _other_geometry(n_kv_heads=2), [1, 2], ShapeError, "TLKV-READ-SHAPE", "n_kv_heads"),
    ("head_dim", lambda: _other_geometry(head_dim=1), [1, 2], ShapeError, "TLKV-READ-SHAPE", "head_dim"),
    ("n_tokens 0", lambda: _raw(records=[(0, 0, SPEC_KV.tobytes())]), [1, 2], FormatError,
     "TLKV-READ-NTOKENS", "records[0].n_tokens"),
    ("n_tokens B+1", lambda: _raw(records=[(0, 3, SPEC_KV.tobytes())]), [1, 2], FormatError,
     "TLKV-READ-NTOKENS", "records[0].n_tokens"),
    ("hash on a partial block", lambda: _raw(records=[(SPEC_HASH0, 1, SPEC_KV.tobytes())]), [1, 2],
     FormatError, "TLKV-READ-HASH-FULL", "records[0].n_tokens"),
]


@pytest.mark.parametrize(("make", "versions", "cls", "requirement", "field"),
                         [r[1:] for r in READER_RULES], ids=[r[0] for r in READER_RULES])
def test_reader_rule(make: Callable[[], bytes], versions: list[int], cls: type[EnvelopeError], requirement: str,
                     field: str) -> None:
    with pytest.raises(EnvelopeError) as info:
        read_envelope(make(), geometry=SPEC_GEOMETRY, versions=versions)
    err = info.value
    assert type(err) is cls
    assert (err.requirement, err.field, err.kind) == (requirement, field, cls.kind)
    assert requirement in str(err) and field in str(err) and "expected" in str(err)


def test_reader_accepts_worked_example_and_zero_blocks() -> None:
    for versions in ([1], [1, 2]):
        env = read_envelope(SPEC_ENVELOPE, geometry=SPEC_GEOMETRY, versions=versions)
        assert [(r.block_hash, r.n_tokens) for r in env.records] == [(SPEC_HASH0, 2)]
        assert np.array_equal(env.kv(0), SPEC_KV)
    empty = encode_envelope(SPEC_GEOMETRY, 1, [])
    assert len(empty) == 32 and read_envelope(empty, geometry=SPEC_GEOMETRY).records == []


def test_zero_dimension_matching_length_is_a_shape_error() -> None:
    # head_dim 0 gives P = 0: 28 + 1 * (12 + 0) + 4 = 44 bytes, so the length rule holds; only the
    # dimension differs from the pool's, which the text answers with TL_ESHAPE.
    data = encode_raw(version=1, dtype=1, block_tokens=2, n_layers=1, n_kv_heads=1, head_dim=0,
                      records=[(0, 1, b"")])
    assert len(data) == 44
    with pytest.raises(ShapeError):
        read_envelope(data, geometry=SPEC_GEOMETRY)


def test_block_hash_chain_parent() -> None:
    assert block_hash(SPEC_HASH0, [3, 4]) == 0x03DF829571605C60
    assert block_hashes([1, 2, 3, 4], 2)[1] != block_hash(0, [3, 4])
