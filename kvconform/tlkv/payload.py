"""Block payload codecs: v1 (f16) and v2 (e4m3 plus per-slab f32 scales) (TLKV "Payload, format v1/v2").

Both lay out [L][2][Hkv][B][D] (axis 1: 0 = K, 1 = V); v2 appends f32 scales [L][2][Hkv].
Positions at or past n_tokens are written as zero bytes.  Encoders write into a caller's buffer so an
envelope is built with one copy per block; decoders return views where the format allows, and the
`*_into` decoders write into a caller's (pool) buffer.

v2 has a fast path for finite f16 input (every block an engine exports): slab maxima from the f16 bit
patterns, then the exact integer/float e4m3 kernels of kvconform.tlkv.e4m3 over L2-sized tiles.  It
produces the same bytes as the reference path (f32 quotient, ml_dtypes cast), which every other input
(f32/f64 values, inf or NaN in a filled position) still takes.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from kvconform.tlkv.e4m3 import E4M3_TO_F32, POW2_M112, decode_slabs, e4m3_dtype, encode_f16_slabs
from kvconform.tlkv.geometry import Geometry

E4M3_MAX = 448.0  # largest finite e4m3 (fn variant: no infinities)
F16 = np.dtype("<f2")
F32 = np.dtype("<f4")

F16Array = npt.NDArray[np.float16]
F32Array = npt.NDArray[np.float32]
U8Array = npt.NDArray[np.uint8]
U16Array = npt.NDArray[np.uint16]

F16_INF_BITS = 0x7C00  # |bits| >= this: inf or NaN
MIN_UNSCALED_SCALE = np.float32(2.0**-14)  # scale * 2^-112 is a normal f32 (exact) from here up


def v2_scales(kv: npt.NDArray[np.floating], n_tokens: int) -> F32Array:
    """scale = amax / 448 over each slab's filled positions, 1.0 when amax is 0 (TLKV-V2-SCALE)."""
    filled = np.abs(kv[:, :, :, :n_tokens, :], dtype=np.float32)
    amax = filled.max(axis=(3, 4)) if n_tokens else np.zeros(kv.shape[:3], np.float32)
    scale = amax / np.float32(E4M3_MAX)
    return np.where(amax == 0, np.float32(1.0), scale).astype(np.float32)


def encode_v1_into(out: U8Array, geometry: Geometry, kv: npt.NDArray[np.floating], n_tokens: int) -> None:
    """Write one v1 payload (P bytes) into `out`."""
    view = out.view(F16).reshape(geometry.kv_shape)
    np.copyto(view, kv, casting="same_kind")
    if n_tokens < geometry.block_tokens:
        view[:, :, :, n_tokens:, :] = 0


def _f16_slab_bits(kv: npt.NDArray[np.floating], geometry: Geometry) -> U16Array | None:
    """kv's f16 bit patterns as [slabs][B][D] (a view when kv is contiguous), or None for other dtypes."""
    if kv.dtype != F16 or tuple(kv.shape) != geometry.kv_shape:
        return None
    return kv.view(np.uint16).reshape(geometry.slabs, geometry.block_tokens, geometry.head_dim)


def _slab_amax_bits(filled: U16Array) -> U16Array:
    """Per slab (axis 0), the bit pattern of max |x| over f16 bit patterns (|x| orders as bits & 0x7FFF).

    Two reductions straight over the input, no temporary: the int16 maximum is the largest non-negative
    pattern (or negative when the slab has none), the uint16 maximum the largest negative one (or a
    non-negative one when the slab has none).
    """
    pos = filled.view(np.int16).max(axis=(1, 2))
    neg = filled.max(axis=(1, 2))
    amax: U16Array = np.maximum(np.maximum(pos, 0).view(np.uint16), np.where(neg >= 0x8000, neg & 0x7FFF, 0))
    return amax


def _scales_from_amax(amax_bits: U16Array) -> F32Array:
    """v2_scales from the slabs' f16 amax bit patterns (finite): the same float32 arithmetic."""
    amax = amax_bits.astype(np.uint16).view(np.float16).astype(np.float32)
    scale = amax / np.float32(E4M3_MAX)
    return np.where(amax == 0, np.float32(1.0), scale).astype(np.float32)


def _encode_v2_f16(out: U8Array, geometry: Geometry, h: U16Array, n_tokens: int) -> bool:
    """The fast v2 encoder for f16 bit patterns h [slabs][B][D]; False (nothing written) if not finite."""
    amax = _slab_amax_bits(h[:, :n_tokens, :])
    if int(amax.max()) >= F16_INF_BITS:
        return False
    scales = _scales_from_amax(amax)
    n_elem = geometry.elements
    codes = out[:n_elem].reshape(h.shape)
    prescale = bool(scales.min() < MIN_UNSCALED_SCALE)
    divisors = scales if prescale else scales * POW2_M112
    encode_f16_slabs(h[:, :n_tokens, :], divisors, prescale, codes[:, :n_tokens, :])
    if n_tokens < geometry.block_tokens:
        codes[:, n_tokens:, :] = 0
    out[n_elem:].view(F32)[:] = scales
    return True


def encode_v2_into(out: U8Array, geometry: Geometry, kv: npt.NDArray[np.floating], n_tokens: int) -> None:
    """Write one v2 payload (P bytes) into `out`: e4m3 elements, then the f32 scales."""
    h = _f16_slab_bits(kv, geometry)
    if h is not None and 1 <= n_tokens <= geometry.block_tokens and _encode_v2_f16(out, geometry, h, n_tokens):
        return
    _encode_v2_reference(out, geometry, kv, n_tokens)


def _encode_v2_reference(out: U8Array, geometry: Geometry, kv: npt.NDArray[np.floating], n_tokens: int) -> None:
    """The reference v2 encoder (any float dtype, any values): f32 quotient, ml_dtypes' e4m3 cast."""
    n_elem = geometry.elements
    scales = v2_scales(kv, n_tokens)
    q = out[:n_elem].view(e4m3_dtype()).reshape(geometry.kv_shape)
    # x / scale in f32, rounded to nearest-even by the cast: no value exceeds 448 by construction.
    np.copyto(q, (kv.astype(np.float32, copy=False) / scales[:, :, :, None, None]), casting="unsafe")
    if n_tokens < geometry.block_tokens:
        out[:n_elem].reshape(geometry.kv_shape)[:, :, :, n_tokens:, :] = 0
    out[n_elem:].view(F32)[:] = scales.reshape(-1)


def encode_payload(geometry: Geometry, version: int, kv: npt.NDArray[np.floating], n_tokens: int) -> bytes:
    """One block's payload as bytes (v1 or v2)."""
    out = np.empty(geometry.payload_size(version), np.uint8)
    (encode_v1_into if version == 1 else encode_v2_into)(out, geometry, kv, n_tokens)
    return out.tobytes()


def decode_v1(payload: memoryview | bytes, geometry: Geometry) -> F16Array:
    """A read-only f16 view of a v1 payload, shape [L][2][Hkv][B][D]."""
    return np.frombuffer(payload, F16, geometry.elements).reshape(geometry.kv_shape)


def decode_v1_into(payload: memoryview | bytes, geometry: Geometry, out: npt.NDArray[np.floating]) -> None:
    """Copy a v1 payload's values into `out` ([L][2][Hkv][B][D], f16 or any float dtype)."""
    np.copyto(out, decode_v1(payload, geometry), casting="same_kind")


def decode_v2_into(payload: memoryview | bytes, geometry: Geometry, out: F32Array) -> None:
    """e4m3_to_f32(byte) * scale of its slab (TLKV-V2-DECODE), written into `out` (f32, [L][2][Hkv][B][D])."""
    if out.dtype != np.float32 or tuple(out.shape) != geometry.kv_shape:
        raise ValueError(f"out: got {out.dtype} {out.shape}, expected float32 {geometry.kv_shape}")
    n_elem, n_slabs = geometry.elements, geometry.slabs
    codes = np.frombuffer(payload, np.uint8, n_elem).reshape(n_slabs, -1)
    scales = np.frombuffer(payload, F32, n_slabs, offset=n_elem)
    flat = out.reshape(n_slabs, -1)  # a view when out is contiguous, else a copy written back below
    if not decode_slabs(codes, scales, flat):
        np.take(E4M3_TO_F32, codes, out=flat)
        flat *= scales[:, None]
    if not np.shares_memory(flat, out):
        out[...] = flat.reshape(out.shape)


def decode_v2(payload: memoryview | bytes, geometry: Geometry) -> F32Array:
    """e4m3_to_f32(byte) * scale of its slab (TLKV-V2-DECODE)."""
    out: F32Array = np.empty(geometry.kv_shape, np.float32)
    decode_v2_into(payload, geometry, out)
    return out


def v2_elements(payload: memoryview | bytes, geometry: Geometry) -> npt.NDArray[np.uint8]:
    """The raw e4m3 bytes of a v2 payload, shape [L][2][Hkv][B][D]."""
    return np.frombuffer(payload, np.uint8, geometry.elements).reshape(geometry.kv_shape)


def v2_scale_values(payload: memoryview | bytes, geometry: Geometry) -> F32Array:
    """The f32 scales of a v2 payload, shape [L][2][Hkv]."""
    return np.frombuffer(payload, F32, geometry.slabs, offset=geometry.elements).reshape(geometry.kv_shape[:3])
