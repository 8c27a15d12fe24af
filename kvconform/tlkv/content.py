"""Test content on disk: the "sequence file" shared with third-party prefill sides and writers.

A sequence file is JSON::

    {
      "geometry": {"block_tokens": B, "n_layers": L, "n_kv_heads": Hkv, "head_dim": D},
      "version": 1,                      # envelope format to write / push: 1 (f16) or 2 (e4m3)
      "tokens": [1, 2, 3, ...],          # token ids, each a u32
      "request_id": "req-0",
      "kv_file": "seq.kv.f16"            # path relative to the JSON file's folder
    }

``kv_file`` holds raw little-endian IEEE float16 values, C order, shape
``[n_blocks][L][2][Hkv][B][D]`` with ``n_blocks = ceil(len(tokens) / B)`` (axis 2: 0 = K, 1 = V),
nothing else (no header).  Positions at or past the fill of the last block may hold any value:
a correct writer zeroes them in the envelope (TLKV "Payload, format v1"), so test content puts
non-zero values there on purpose to catch a writer that copies them.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from kvconform.tlkv.geometry import Geometry

KV_DTYPE = np.dtype("<f2")


@dataclass
class Sequence:
    """A token sequence with its KV values (the sequence file's contents; TLKV "Block hash" cuts it into blocks)."""

    geometry: Geometry
    version: int
    tokens: list[int]
    request_id: str
    kv: npt.NDArray[np.float16]

    @property
    def n_blocks(self) -> int:
        return math.ceil(len(self.tokens) / self.geometry.block_tokens)

    def check(self) -> None:
        """Raise ValueError naming the field when the contents are inconsistent."""
        if self.version not in (1, 2):
            raise ValueError(f"version: got {self.version!r}, expected 1 or 2")
        bad = next((t for t in self.tokens if not isinstance(t, int) or not 0 <= t < 1 << 32), None)
        if bad is not None:
            raise ValueError(f"tokens: got {bad!r}, expected u32 token ids")
        shape = (self.n_blocks, *self.geometry.kv_shape)
        if tuple(self.kv.shape) != shape:
            raise ValueError(f"kv: got shape {tuple(self.kv.shape)}, expected {shape} ([n_blocks][L][2][Hkv][B][D])")


def write_sequence(path: str | Path, geometry: Geometry, version: int, tokens: list[int], request_id: str,
                   kv: npt.NDArray[np.floating], kv_file: str | None = None) -> Path:
    """Write the JSON sequence file and its kv file (default: ``<stem>.kv.f16`` beside it)."""
    path = Path(path)
    seq = Sequence(geometry, version, list(tokens), request_id, np.asarray(kv, dtype=KV_DTYPE))
    seq.check()
    kv_name = kv_file if kv_file is not None else f"{path.stem}.kv.f16"
    path.parent.mkdir(parents=True, exist_ok=True)
    (path.parent / kv_name).write_bytes(np.ascontiguousarray(seq.kv, dtype=KV_DTYPE).tobytes())
    doc: dict[str, Any] = {"geometry": geometry.as_dict(), "version": version, "tokens": seq.tokens,
                           "request_id": request_id, "kv_file": kv_name}
    path.write_text(json.dumps(doc, indent=1) + "\n")
    return path


def read_sequence(path: str | Path) -> Sequence:
    """Read a sequence file and its kv file; ValueError names the field that is wrong."""
    path = Path(path)
    doc = json.loads(path.read_text())
    for key in ("geometry", "version", "tokens", "request_id", "kv_file"):
        if key not in doc:
            raise ValueError(f"{path}: field {key!r} missing, expected the sequence file format")
    geometry = Geometry.from_dict(doc["geometry"])
    tokens = doc["tokens"]
    if not isinstance(tokens, list):
        raise ValueError(f"{path}: tokens: got {type(tokens).__name__}, expected a list of u32")
    raw = (path.parent / doc["kv_file"]).read_bytes()
    n_blocks = math.ceil(len(tokens) / geometry.block_tokens)
    expected = n_blocks * math.prod(geometry.kv_shape) * KV_DTYPE.itemsize
    if len(raw) != expected:
        raise ValueError(f"{path}: kv_file {doc['kv_file']!r}: got {len(raw)} bytes, expected {expected} "
                         f"({n_blocks} blocks of {geometry.kv_shape} float16)")
    kv = np.frombuffer(raw, KV_DTYPE).reshape(n_blocks, *geometry.kv_shape)
    seq = Sequence(geometry, doc["version"], tokens, str(doc["request_id"]), kv)
    seq.check()
    return seq


def make_kv(rng: np.random.Generator, geometry: Geometry, n_blocks: int, garbage_tail: bool,
            last_fill: int | None = None) -> npt.NDArray[np.float16]:
    """Random f16 values [n_blocks][L][2][Hkv][B][D]: finite, never zero, each (block, layer, K/V, head)
    slab with its own magnitude (2^-8 .. 2^8), so per-slab v2 scales and f16 rounding are exercised.

    With ``garbage_tail`` every position is non-zero, including those past a partial block's fill, so
    a writer that forgets the zero padding is caught.  Without it, positions at or past ``last_fill``
    in the last block are zero (``last_fill`` None: leave the last block full).
    """
    shape = (n_blocks, *geometry.kv_shape)
    slab_scale = np.exp2(rng.uniform(-8.0, 8.0, size=(*shape[:4], 1, 1)))
    magnitude = rng.uniform(0.125, 1.0, size=shape)
    sign = rng.choice(np.array([-1.0, 1.0]), size=shape)
    kv = (sign * magnitude * slab_scale).astype(np.float16)
    if not garbage_tail and last_fill is not None and n_blocks:
        kv[-1, :, :, :, last_fill:, :] = 0
    return kv
