"""KV arrays in the TLKV vector files: the ``kv`` field, little-endian f16 bytes of [n][L][2][Hkv][B][D] as hex.

Apart from the vector generator (kvconform.tlkv.vectors, which crafts malformed envelopes with scapy), so a suite
that reads the vector files loads neither.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from kvconform.tlkv.geometry import Geometry
from kvconform.tlkv.payload import F16

__all__ = ["kv_from_hex", "kv_to_hex"]


def kv_to_hex(kv: npt.NDArray[np.floating]) -> str:
    """Little-endian f16 bytes of an [n][L][2][Hkv][B][D] array, as hex."""
    return np.ascontiguousarray(kv, dtype=F16).tobytes().hex()


def kv_from_hex(text: str, geometry: Geometry, n_blocks: int) -> npt.NDArray[np.float16]:
    """The [n][L][2][Hkv][B][D] f16 array of a vector's `kv`; ValueError naming the size when it does not fit."""
    raw = bytes.fromhex(text)
    expected = n_blocks * geometry.elements * 2
    if len(raw) != expected:
        raise ValueError(f"kv: got {len(raw)} bytes, expected {expected} ({n_blocks} blocks of {geometry})")
    return np.frombuffer(raw, F16).reshape((n_blocks, *geometry.kv_shape)).copy()
