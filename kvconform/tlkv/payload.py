"""Block payload codecs: v1 (f16) and v2 (e4m3 plus per-slab f32 scales) (TLKV "Payload, format v1/v2").

Both lay out [L][2][Hkv][B][D] (axis 1: 0 = K, 1 = V); v2 appends f32 scales [L][2][Hkv].
Positions at or past n_tokens are written as zero bytes.  Encoders write into a caller's buffer so an
envelope is built with one copy per block; decoders return views where the format allows.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import numpy.typing as npt

from kvconform.tlkv.geometry import Geometry

E4M3 = np.dtype(ml_dtypes.float8_e4m3fn)
E4M3_MAX = 448.0  # largest finite e4m3 (fn variant: no infinities)
F16 = np.dtype("<f2")
F32 = np.dtype("<f4")

F16Array = npt.NDArray[np.float16]
F32Array = npt.NDArray[np.float32]


def v2_scales(kv: npt.NDArray[np.floating], n_tokens: int) -> F32Array:
    """scale = amax / 448 over each slab's filled positions, 1.0 when amax is 0 (TLKV-V2-SCALE)."""
    filled = np.abs(kv[:, :, :, :n_tokens, :], dtype=np.float32)
    amax = filled.max(axis=(3, 4)) if n_tokens else np.zeros(kv.shape[:3], np.float32)
    scale = amax / np.float32(E4M3_MAX)
    return np.where(amax == 0, np.float32(1.0), scale).astype(np.float32)


def encode_v1_into(out: npt.NDArray[np.uint8], geometry: Geometry, kv: npt.NDArray[np.floating],
                   n_tokens: int) -> None:
    """Write one v1 payload (P bytes) into `out`."""
    view = out.view(F16).reshape(geometry.kv_shape)
    np.copyto(view, kv, casting="same_kind")
    if n_tokens < geometry.block_tokens:
        view[:, :, :, n_tokens:, :] = 0


def encode_v2_into(out: npt.NDArray[np.uint8], geometry: Geometry, kv: npt.NDArray[np.floating],
                   n_tokens: int) -> None:
    """Write one v2 payload (P bytes) into `out`: e4m3 elements, then the f32 scales."""
    n_elem = geometry.elements
    scales = v2_scales(kv, n_tokens)
    q = out[:n_elem].view(E4M3).reshape(geometry.kv_shape)
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


def decode_v2(payload: memoryview | bytes, geometry: Geometry) -> F32Array:
    """e4m3_to_f32(byte) * scale of its slab (TLKV-V2-DECODE)."""
    n_elem = geometry.elements
    q = np.frombuffer(payload, E4M3, n_elem).reshape(geometry.kv_shape)
    scales = np.frombuffer(payload, F32, geometry.slabs, offset=n_elem).reshape(geometry.kv_shape[:3])
    out: F32Array = q.astype(np.float32)
    out *= scales[:, :, :, None, None]
    return out


def v2_elements(payload: memoryview | bytes, geometry: Geometry) -> npt.NDArray[np.uint8]:
    """The raw e4m3 bytes of a v2 payload, shape [L][2][Hkv][B][D]."""
    return np.frombuffer(payload, np.uint8, geometry.elements).reshape(geometry.kv_shape)


def v2_scale_values(payload: memoryview | bytes, geometry: Geometry) -> F32Array:
    """The f32 scales of a v2 payload, shape [L][2][Hkv]."""
    return np.frombuffer(payload, F32, geometry.slabs, offset=geometry.elements).reshape(geometry.kv_shape[:3])
