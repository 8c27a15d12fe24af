"""The fast TLKV payload codec is byte-for-byte the reference one.

* Golden digests: sha256 (first 128 bits) of encode_payload / decode_v2 outputs for seeded inputs,
  recorded with the previous implementation (f32 quotient and ml_dtypes casts) before the rewrite.
* The e4m3 kernels against ml_dtypes: every finite f16 magnitude over a set of scales (both divisor
  paths), every f16 value and a large random float32 sample through the general converter, the edge
  cases (ties, e4m3 subnormals, 448, round-up into the next binade, signed zeros, overflow, inf/NaN),
  and every code times a set of scales for the decoder.
"""

from __future__ import annotations

import hashlib

import ml_dtypes
import numpy as np
import numpy.typing as npt
import pytest

from kvconform.tlkv.e4m3 import E4M3_TO_F32, POW2_M112, decode_slabs, e4m3_dtype, encode_f16_slabs, f32_to_e4m3
from kvconform.tlkv.envelope import Block, encode_envelope, encode_envelope_into
from kvconform.tlkv.geometry import Geometry
from kvconform.tlkv.payload import (
    _encode_v2_reference,
    decode_v1_into,
    decode_v2,
    decode_v2_into,
    encode_payload,
    encode_v2_into,
)

SMALL = Geometry(4, 2, 3, 8)
WIDE = Geometry(16, 2, 4, 32)
REAL = Geometry(16, 32, 8, 128)
E4M3 = e4m3_dtype()

# ---- golden digests of the previous implementation ------------------------------------------

GOLDEN = {
    "4,2,3,8/normal/n1/v1/payload": "723d91b937e4ce90c1fb695bdef66637",
    "4,2,3,8/normal/n1/v2/payload": "70abf8305724b5a8dda9100b9f4e3419",
    "4,2,3,8/normal/n1/v2/decoded": "ca1033ca5c60878547ac20355ef5508f",
    "4,2,3,8/normal/n3/v1/payload": "6937f65ee1225da8b9843d1be163c51a",
    "4,2,3,8/normal/n3/v2/payload": "6090a012b21ac0093e3c38d439ce907f",
    "4,2,3,8/normal/n3/v2/decoded": "91a9e3fbe49c79d2112c506d36452f70",
    "4,2,3,8/normal/n4/v1/payload": "58c7bbebeb97be5e8c035d76701f4bce",
    "4,2,3,8/normal/n4/v2/payload": "730cf2de57c433eba0b7ae7a5f7f1240",
    "4,2,3,8/normal/n4/v2/decoded": "d092438e9e85d0dbd0a4b849d2ec2564",
    "4,2,3,8/wide/n1/v1/payload": "8787d2203d4a55a428fdbd2efac9c971",
    "4,2,3,8/wide/n1/v2/payload": "646e2435ec7570c7a65b202a9071625d",
    "4,2,3,8/wide/n1/v2/decoded": "69d53c28c7d327d54e2b4901650545da",
    "4,2,3,8/wide/n3/v1/payload": "eea56952afa4b1a12d92d98d09473c9e",
    "4,2,3,8/wide/n3/v2/payload": "9b7fc4cc82747adf58e84ca5ade50dce",
    "4,2,3,8/wide/n3/v2/decoded": "2e2ded37dae72c1e4f14164f7551fd5b",
    "4,2,3,8/wide/n4/v1/payload": "21295fcad3ebe53128d9d056217af602",
    "4,2,3,8/wide/n4/v2/payload": "ce7fc686cb0a37923a7a992704f5fa38",
    "4,2,3,8/wide/n4/v2/decoded": "56b012fb3e5ef81160e0e801160df614",
    "4,2,3,8/exp/n1/v1/payload": "72caba960711c514d3ce02ab06c7cdd3",
    "4,2,3,8/exp/n1/v2/payload": "f1ca4432e3225f82f89711d1a00a40cb",
    "4,2,3,8/exp/n1/v2/decoded": "fac696c34340fcb66cf7dbe28dd87c4d",
    "4,2,3,8/exp/n3/v1/payload": "00b7701828eb154407fbcd2c4a0a203a",
    "4,2,3,8/exp/n3/v2/payload": "e7b63f319f882f82588c49708ac28370",
    "4,2,3,8/exp/n3/v2/decoded": "09bae1f9f0df47d8478fc2c2189a67b1",
    "4,2,3,8/exp/n4/v1/payload": "530c20e6b8d2fb2613d75f2a99c885ac",
    "4,2,3,8/exp/n4/v2/payload": "8f148bd361ef7c8d380ddc80a6c708e3",
    "4,2,3,8/exp/n4/v2/decoded": "fb21c97d874794d992b94698dd6f9f9e",
    "4,2,3,8/f32/n1/v1/payload": "22f3a426f3d814b8ecad040ac8b7d06b",
    "4,2,3,8/f32/n1/v2/payload": "e9f503c63d544c689921211a63a9aa80",
    "4,2,3,8/f32/n1/v2/decoded": "e86cedb8698b8f0f24f7dfa7ac4dab4f",
    "4,2,3,8/f32/n3/v1/payload": "91da196e9c5cb23440cfad33f2799dc4",
    "4,2,3,8/f32/n3/v2/payload": "671f3dd58c5bd5b485589bb198ab4aa2",
    "4,2,3,8/f32/n3/v2/decoded": "55ad32264039cf2eeb40b49c0cb86ef2",
    "4,2,3,8/f32/n4/v1/payload": "6b2aacd5c00c6d1e7f16f370f6f3ee7c",
    "4,2,3,8/f32/n4/v2/payload": "5f9343844e4a88c5e4c4661b9b4434da",
    "4,2,3,8/f32/n4/v2/decoded": "fe391528a0ef0ebd5a073cc91810803e",
    "16,2,4,32/normal/n1/v1/payload": "a49af1164cbc3187232152d7aa4e4e39",
    "16,2,4,32/normal/n1/v2/payload": "922886b8e272e0a1daa6941b3927124c",
    "16,2,4,32/normal/n1/v2/decoded": "f80690902d598c1fbb3c38ba52e80dc3",
    "16,2,4,32/normal/n15/v1/payload": "1526c72f128fd89c89f6c44b15c43209",
    "16,2,4,32/normal/n15/v2/payload": "4fa5811c5bb82244463291bf65883a5f",
    "16,2,4,32/normal/n15/v2/decoded": "9bc46975c835b6bf4ab580291cef4ba8",
    "16,2,4,32/normal/n16/v1/payload": "35a9286d0ec6df0648102fa6630c5d62",
    "16,2,4,32/normal/n16/v2/payload": "5f421b42b3fb056ed7ad268f7b0c5795",
    "16,2,4,32/normal/n16/v2/decoded": "ce44289832c8cbe77077e23b366d23c1",
    "16,2,4,32/wide/n1/v1/payload": "90135c3e5adcb2d42d264679270be063",
    "16,2,4,32/wide/n1/v2/payload": "d50683ec8223b43e9c033d00f18c5f79",
    "16,2,4,32/wide/n1/v2/decoded": "e95b431dbb5019b1db99d43089d7640d",
    "16,2,4,32/wide/n15/v1/payload": "6960517ea4e87a62c6e9f4612856a87f",
    "16,2,4,32/wide/n15/v2/payload": "0b503113c9d2e0d93ab7f6ff022ee04a",
    "16,2,4,32/wide/n15/v2/decoded": "1c5892ec9d6e23e085c60ddcf7bd4049",
    "16,2,4,32/wide/n16/v1/payload": "530f0e6d1bd9742cc37d980aacfa9f18",
    "16,2,4,32/wide/n16/v2/payload": "2a0f5784e4870affe9e5888417dd5259",
    "16,2,4,32/wide/n16/v2/decoded": "e4e5a7277126d9b868e065188472e3d5",
    "16,2,4,32/exp/n1/v1/payload": "0788172b9d03d267eef69e35be676a96",
    "16,2,4,32/exp/n1/v2/payload": "d71955105254c6855eca2739dc98b405",
    "16,2,4,32/exp/n1/v2/decoded": "31961782bbe31a5d95857324eb12b6a2",
    "16,2,4,32/exp/n15/v1/payload": "b1b438f958bc7e239f08ce9251fd2256",
    "16,2,4,32/exp/n15/v2/payload": "3c2474178ff79a08a3f131a892e980dc",
    "16,2,4,32/exp/n15/v2/decoded": "22eb2460f5f2c60e2b44571bf4396daa",
    "16,2,4,32/exp/n16/v1/payload": "7bc7118ef1ded6a15d7fbb8ec6824a0e",
    "16,2,4,32/exp/n16/v2/payload": "796f5ef980c2e7a6ca410bd3ee271c1f",
    "16,2,4,32/exp/n16/v2/decoded": "3b7a3ce2559d523d9be17e37b7a71c15",
    "16,2,4,32/f32/n1/v1/payload": "681052283e0ce019db93536e3ce0eb73",
    "16,2,4,32/f32/n1/v2/payload": "0b274e14d039b9a40d37131d63f03876",
    "16,2,4,32/f32/n1/v2/decoded": "76975417591499a8937436c61c24e40c",
    "16,2,4,32/f32/n15/v1/payload": "cc1e27930bc5865aa95e1e59db7b540d",
    "16,2,4,32/f32/n15/v2/payload": "af86926a6fc678c8355d6a7df7382317",
    "16,2,4,32/f32/n15/v2/decoded": "21baefc89005aaf64111ae66bbe36c5f",
    "16,2,4,32/f32/n16/v1/payload": "c98648d0260d11fb11aeb22def86c403",
    "16,2,4,32/f32/n16/v2/payload": "65927f155d319b3aba14e9f7e8cb1251",
    "16,2,4,32/f32/n16/v2/decoded": "351090e8de4eb32810cae2e4f06f091a",
    "16,32,8,128/normal/n16/v1/payload": "2df790952790e4bc8401c573be494dee",
    "16,32,8,128/normal/n16/v2/payload": "3d28efdacb3513ef340b00f3d764b25a",
    "16,32,8,128/normal/n16/v2/decoded": "c80004213ae6cdefeb8d4014c4db957a",
    "16,32,8,128/normal/n7/v1/payload": "150e49534e56f4b7daa53c65bea25b0a",
    "16,32,8,128/normal/n7/v2/payload": "54190e8a7c9a63af956c60795ea9f08b",
    "16,32,8,128/normal/n7/v2/decoded": "8ec29026cee261fb5ac8dfa20d4c5fa7",
    "4,2,3,8/random-bytes/v2/decoded": "fb9e54eb86f653c6146898f3ad4ed9cc",
    "16,32,8,128/random-bytes/v2/decoded": "a9d3558eacf776f1cf3e4a1667c946e9",
    "envelope/4,2,3,8/v1": "2864fad07ac18197f610cb93c277995b",
    "envelope/4,2,3,8/v2": "632958bd987749e0459d9f641ea5910e",
}


def _wide_f16(rng: np.random.Generator, shape: tuple[int, ...]) -> npt.NDArray[np.float16]:
    """f16 values over every binade, subnormals, signed zeros, and some all-zero / all-tiny slabs."""
    bits = rng.integers(0, 0x7C00, size=shape, dtype=np.uint16)  # every finite magnitude
    bits |= rng.integers(0, 2, size=shape, dtype=np.uint16) << 15
    kv = bits.view(np.float16).copy()
    kv[0, 0, 0] = 0
    kv[0, 1, 0] = -0.0
    kv[-1, 0, -1] = rng.integers(0, 0x400, size=kv[-1, 0, -1].shape, dtype=np.uint16).view(np.float16)
    return kv


def _cases() -> list[tuple[str, Geometry, npt.NDArray[np.floating], int]]:
    rng = np.random.default_rng(20240601)
    out: list[tuple[str, Geometry, npt.NDArray[np.floating], int]] = []
    for g in (SMALL, WIDE):
        normal = rng.standard_normal(g.kv_shape, dtype=np.float32).astype(np.float16)
        wide = _wide_f16(rng, g.kv_shape)
        exp = (rng.standard_normal(g.kv_shape) * np.exp2(rng.integers(-20, 12, g.kv_shape))).astype(np.float16)
        f32 = (rng.standard_normal(g.kv_shape) * np.exp2(rng.integers(-30, 15, g.kv_shape))).astype(np.float32)
        for name, kv in (("normal", normal), ("wide", wide), ("exp", exp), ("f32", f32)):
            for n in sorted({g.block_tokens, g.block_tokens - 1, 1}):
                out.append((f"{g}/{name}/n{n}", g, kv, n))
    real = rng.standard_normal(REAL.kv_shape, dtype=np.float32).astype(np.float16)
    out.append((f"{REAL}/normal/n16", REAL, real, 16))
    out.append((f"{REAL}/normal/n7", REAL, real, 7))
    return out


def _digest(b: bytes | npt.NDArray[np.generic]) -> str:
    return hashlib.sha256(b.tobytes() if isinstance(b, np.ndarray) else bytes(b)).hexdigest()[:32]


CASES = _cases()


@pytest.mark.parametrize("case", range(len(CASES)), ids=[c[0] for c in CASES])
def test_payloads_match_the_previous_implementation(case: int) -> None:
    name, g, kv, n = CASES[case]
    for version in (1, 2):
        payload = encode_payload(g, version, kv, n)
        assert _digest(payload) == GOLDEN[f"{name}/v{version}/payload"], f"v{version} payload changed"
        if version == 2:
            assert _digest(decode_v2(payload, g)) == GOLDEN[f"{name}/v2/decoded"], "v2 decode changed"


@pytest.mark.filterwarnings("ignore:overflow encountered")
@pytest.mark.parametrize("g", [SMALL, REAL], ids=str)
def test_decode_of_arbitrary_bytes_matches_the_previous_implementation(g: Geometry) -> None:
    """Every code incl. the NaN codes, scales from 2^-40 to 2^40, a subnormal and the largest f32."""
    rng = np.random.default_rng(99)
    for geometry in (SMALL, REAL):  # the digests were taken in this order from one generator
        p = bytearray(rng.integers(0, 256, geometry.payload_size(2), dtype=np.uint8).tobytes())
        sc = np.exp2(rng.uniform(-40, 40, geometry.slabs)).astype(np.float32)
        sc[:3] = [1.0, 1e-40, 3.4e38]
        p[geometry.elements :] = sc.tobytes()
        if geometry == g:
            assert _digest(decode_v2(bytes(p), g)) == GOLDEN[f"{g}/random-bytes/v2/decoded"]


@pytest.mark.parametrize("version", [1, 2])
def test_envelopes_match_the_previous_implementation(version: int) -> None:
    rng = np.random.default_rng(5)
    kv = rng.standard_normal((3, *SMALL.kv_shape), dtype=np.float32).astype(np.float16)
    blocks = [Block(11, 4, kv[0]), Block(12, 4, kv[1]), Block(0, 2, kv[2])]
    data = encode_envelope(SMALL, version, blocks)
    assert _digest(data) == GOLDEN[f"envelope/{SMALL}/v{version}"]
    for out in (bytearray(len(data) + 7), np.full(len(data), 0xAB, np.uint8), memoryview(bytearray(len(data)))):
        assert encode_envelope_into(out, SMALL, version, blocks) == len(data)
        assert bytes(memoryview(out)[: len(data)]) == data  # type: ignore[arg-type]


def test_encode_envelope_into_refuses_a_short_or_read_only_buffer() -> None:
    kv = np.zeros(SMALL.kv_shape, np.float16)
    size = SMALL.envelope_size(1, 1)
    with pytest.raises(ValueError, match="at least"):
        encode_envelope_into(bytearray(size - 1), SMALL, 1, [Block(0, 4, kv)])
    with pytest.raises(ValueError, match="read-only"):
        encode_envelope_into(bytes(size), SMALL, 1, [Block(0, 4, kv)])  # type: ignore[arg-type]


# ---- the e4m3 kernels against ml_dtypes -----------------------------------------------------

FINITE_F16 = np.arange(0x7C00, dtype=np.uint16)  # every finite non-negative f16 bit pattern


def _ml_codes(x: npt.NDArray[np.float32]) -> npt.NDArray[np.uint8]:
    return x.astype(E4M3).view(np.uint8)


def _amax_values() -> npt.NDArray[np.uint16]:
    """amax bit patterns: subnormal f16, tiny scales (the prescale path), powers of two, 448 * 2^k,
    awkward mantissas, and the largest f16; plus a seeded random set."""
    f16 = np.array([6e-8, 1e-6, 3e-5, 6.1e-5, 1e-3, 0.0123, 0.027, 0.0271, 0.1, 0.5, 1, 1.5, 2.9, 3, 7,
                    448, 896, 100.3, 1000, 4095, 12345, 65504], np.float16).view(np.uint16)
    rnd = np.random.default_rng(3).integers(1, 0x7C00, 24, dtype=np.uint16)
    return np.unique(np.concatenate([f16, rnd]))


@pytest.mark.parametrize("amax_bits", _amax_values().tolist(), ids=lambda b: f"amax={b:#06x}")
def test_f16_encoder_is_ml_dtypes_for_every_f16_at_a_writer_scale(amax_bits: int) -> None:
    """Every f16 value with |x| <= amax, both signs, divided by scale = amax / 448 as the writer does."""
    amax = np.uint16(amax_bits).view(np.float16).astype(np.float32)
    scale = np.float32(amax / np.float32(448.0))
    mags = FINITE_F16[: amax_bits + 1]  # every magnitude up to amax
    h = np.concatenate([mags, mags | 0x8000]).astype(np.uint16)
    want = _ml_codes(h.view(np.float16).astype(np.float32) / scale)
    prescale = bool(scale < np.float32(2.0**-14))
    divisor = np.array([scale if prescale else scale * POW2_M112], np.float32)
    got = np.empty((1, 1, h.size), np.uint8)
    encode_f16_slabs(h.reshape(1, 1, -1), divisor, prescale, got)
    np.testing.assert_array_equal(got.reshape(-1), want)
    if not prescale:  # the same through the other divisor path
        encode_f16_slabs(h.reshape(1, 1, -1), np.array([scale], np.float32), True, got)
        np.testing.assert_array_equal(got.reshape(-1), want)


@pytest.mark.parametrize("scale", [2.0**-30, 1e-7, 2.0**-14, 0.0137, 1 / 448, 0.3, 1.0, 3.0, 146.2])
def test_f16_encoder_over_many_slabs_with_any_quotient_below_464(scale: float) -> None:
    """All finite f16 whose quotient stays below 464 (the kernel's contract), many slabs in a tile loop."""
    s = np.float32(scale)
    x = FINITE_F16.view(np.float16).astype(np.float32) / s
    mags = FINITE_F16[x < 464]
    h = np.concatenate([mags, mags | 0x8000])
    h = np.concatenate([h, np.zeros((-h.size) % 64, np.uint16)]).reshape(-1, 8, 8)
    want = _ml_codes(h.view(np.float16).astype(np.float32) / s)
    prescale = bool(s < np.float32(2.0**-14))
    divisors = np.full(h.shape[0], s if prescale else s * POW2_M112, np.float32)
    got = np.empty(h.shape, np.uint8)
    encode_f16_slabs(h, divisors, prescale, got)
    np.testing.assert_array_equal(got, want)


EDGES = np.array(
    [0.0, -0.0, 2.0**-9, 2.0**-10, 3 * 2.0**-11, 2.0**-10 * 1.0000001, 2.0**-6, 2.0**-6 - 2.0**-10,
     2.0**-6 - 2.0**-11, 2.0**-6 - 2.0**-30, 7.5 * 2.0**-9, 15 * 2.0**-10, 1.0, 1.0625, 1.0625 * 1.0000001,
     1.1875, 1.9375, 1.96875, 2 - 2.0**-23, 240, 248, 256, 416, 432, 440, 448, 448.00003, 456, 463.99997, 464,
     464.00003, 479.9, 480, 512, 1e30, 3.4028235e38, np.inf, np.nan, 1e-45, 1.2e-38, 2.0**-126],
    np.float32,
)


def test_general_converter_edge_cases() -> None:
    x = np.concatenate([EDGES, -EDGES, np.array([-np.nan], np.float32)])
    np.testing.assert_array_equal(f32_to_e4m3(x), _ml_codes(x))


@pytest.mark.filterwarnings("ignore:invalid value encountered")
def test_general_converter_every_f16_value_and_its_quotients() -> None:
    every = np.arange(0x10000, dtype=np.uint32).astype(np.uint16).view(np.float16).astype(np.float32)
    for s in (1.0, 2.0**-8, 0.01, 3.0, 1 / 448, 2.0**9):
        x = every / np.float32(s)
        np.testing.assert_array_equal(f32_to_e4m3(x), _ml_codes(x), err_msg=f"scale {s}")


@pytest.mark.filterwarnings("ignore:invalid value encountered")
def test_general_converter_random_float32_bit_patterns() -> None:
    rng = np.random.default_rng(11)
    bits = rng.integers(0, 2**32, 1 << 21, dtype=np.uint64).astype(np.uint32)
    x = bits.view(np.float32)
    np.testing.assert_array_equal(f32_to_e4m3(x), _ml_codes(x))
    # and concentrated on e4m3's range, where the rounding happens
    y = (rng.standard_normal(1 << 21) * np.exp2(rng.uniform(-12, 9, 1 << 21))).astype(np.float32)
    np.testing.assert_array_equal(f32_to_e4m3(y), _ml_codes(y))


def test_every_tie_and_both_neighbours() -> None:
    """Each midpoint between adjacent e4m3 values (incl. subnormals, and 464 above 448), +- 1 ulp."""
    vals = E4M3_TO_F32[:0x7F].astype(np.float64)
    mids = np.concatenate([(vals[:-1] + vals[1:]) / 2, [464.0]]).astype(np.float32)
    x = np.concatenate([mids, np.nextafter(mids, np.float32(0)), np.nextafter(mids, np.float32(np.inf))])
    x = np.concatenate([x, -x])
    np.testing.assert_array_equal(f32_to_e4m3(x), _ml_codes(x))
    # through the f16 kernel too, with scale 2^-k so that the quotient is exact
    h16 = x[np.abs(x) < 448].astype(np.float16)
    exact = h16.astype(np.float32) == x[np.abs(x) < 448]
    h = h16[exact].view(np.uint16).reshape(1, 1, -1)
    got = np.empty(h.shape, np.uint8)
    encode_f16_slabs(h, np.array([POW2_M112], np.float32), False, got)
    np.testing.assert_array_equal(got.reshape(-1), _ml_codes(h16[exact].astype(np.float32)))


@pytest.mark.filterwarnings("ignore:overflow encountered", "ignore:invalid value encountered")
def test_decoder_every_code_times_scales() -> None:
    scales = np.array([1.0, 0.5, 1 / 448, 3.0, 146.2, 255.9, 256.0, 1e-40, 1e-30, 2.0**-100, 1e30, 3.4e38,
                       -2.5, 0.0, -0.0, np.inf, np.nan], np.float32)
    codes = np.tile(np.arange(256, dtype=np.uint8), (scales.size, 1))
    want = codes.view(E4M3).astype(np.float32) * scales[:, None]
    for picked in (slice(0, 6), slice(0, None), slice(7, 10)):
        c = np.ascontiguousarray(codes[picked])
        got = np.empty(c.shape, np.float32)
        if not decode_slabs(c, scales[picked], got):  # NaN codes: the table path
            np.take(E4M3_TO_F32, c, out=got)
            got *= scales[picked, None]
        np.testing.assert_array_equal(got.view(np.uint32), want[picked].view(np.uint32))
    no_nan = np.ascontiguousarray(codes[:6][:, (np.arange(256) & 0x7F) != 0x7F])
    got = np.empty(no_nan.shape, np.float32)
    assert decode_slabs(no_nan, scales[:6], got), "the fast path should take NaN-free codes and finite scales"
    np.testing.assert_array_equal(got.view(np.uint32), (no_nan.view(E4M3).astype(np.float32) * scales[:6, None])
                                  .view(np.uint32))


# ---- the public codec: fast path against the reference path ---------------------------------


def _reference_payload(g: Geometry, kv: npt.NDArray[np.floating], n: int) -> bytes:
    out = np.empty(g.payload_size(2), np.uint8)
    _encode_v2_reference(out, g, kv, n)
    return out.tobytes()


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
@pytest.mark.parametrize("seed", range(6))
def test_v2_fast_path_equals_reference_path(seed: int) -> None:
    rng = np.random.default_rng(seed)
    g = Geometry(int(rng.integers(1, 9)), int(rng.integers(1, 4)), int(rng.integers(1, 4)), int(rng.integers(1, 40)))
    kv = _wide_f16(rng, g.kv_shape) if seed % 2 else rng.standard_normal(g.kv_shape).astype(np.float16)
    kv[0, 1] *= np.float16(2.0**-12)  # slabs with tiny scales: the prescale divisor path
    if seed == 4:
        kv[-1, -1, -1, 0, 0] = np.inf  # non-finite in a filled position: the reference path
    if seed == 5:
        kv[..., -1:, :] = np.nan  # non-finite only past the fill
    for n in range(1, g.block_tokens + 1):
        out = np.full(g.payload_size(2), 0xCD, np.uint8)
        encode_v2_into(out, g, kv, n)
        assert out.tobytes() == _reference_payload(g, kv, n), f"n_tokens {n}"
    strided = np.asfortranarray(kv)  # not contiguous: same bytes
    assert encode_payload(g, 2, strided, g.block_tokens) == _reference_payload(g, kv, g.block_tokens)


def test_decode_into_pool_buffers() -> None:
    g = SMALL
    kv = np.random.default_rng(8).standard_normal(g.kv_shape).astype(np.float16)
    p2 = encode_payload(g, 2, kv, 3)
    pool = np.zeros((2, *g.kv_shape), np.float32)
    decode_v2_into(p2, g, pool[1])
    np.testing.assert_array_equal(pool[1].view(np.uint32), decode_v2(p2, g).view(np.uint32))
    assert not pool[0].any()
    strided = np.zeros((*g.kv_shape[:4], 2 * g.head_dim), np.float32)[..., ::2]
    decode_v2_into(p2, g, strided)
    np.testing.assert_array_equal(strided, decode_v2(p2, g))
    with pytest.raises(ValueError, match="float32"):
        decode_v2_into(p2, g, np.zeros(g.kv_shape, np.float16))
    p1 = encode_payload(g, 1, kv, 4)
    pool16 = np.zeros(g.kv_shape, np.float16)
    decode_v1_into(p1, g, pool16)
    np.testing.assert_array_equal(pool16, kv)


def test_e4m3_table_is_ml_dtypes() -> None:
    want = np.arange(256, dtype=np.uint8).view(ml_dtypes.float8_e4m3fn).astype(np.float32)
    np.testing.assert_array_equal(E4M3_TO_F32.view(np.uint32), want.view(np.uint32))
