"""Valid tl.kv.v1 test content for a small geometry; tests change one field of it at a time."""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from kvconform.tlkv.blockhash import block_hashes
from kvconform.tlkv.chunk import Chunk
from kvconform.tlkv.content import make_kv
from kvconform.tlkv.envelope import Block, encode_envelope
from kvconform.tlkv.geometry import Geometry

# B = 4 so a 10-token prompt has two full blocks and a partial tail of 2.
GEOMETRY = Geometry(block_tokens=4, n_layers=2, n_kv_heads=2, head_dim=8)
TOKENS = [11, 12, 13, 14, 21, 22, 23, 24, 31, 32]


class Kit:
    """Valid content for GEOMETRY: the tests change one field of it at a time."""

    geometry = GEOMETRY
    tokens = TOKENS

    def __init__(self, rng: np.random.Generator) -> None:
        self.rng = rng
        self.hashes = block_hashes(TOKENS, GEOMETRY.block_tokens)  # [h0, h1, 0]
        self.fills = [4, 4, 2]
        self.kv: npt.NDArray[np.float16] = make_kv(rng, GEOMETRY, 3, garbage_tail=True)

    def envelope(self, i: int, version: int = 1) -> bytes:
        return encode_envelope(GEOMETRY, version, [Block(self.hashes[i], self.fills[i], self.kv[i])])

    def chunk(self, i: int, version: int = 1, request_id: str = "req-1", empty: bool = False) -> Chunk:
        payload = b"" if empty else self.envelope(i, version)
        return Chunk.for_payload(request_id, i, self.hashes[i], version, payload)

    def chunks(self, version: int = 1, request_id: str = "req-1") -> list[Chunk]:
        return [self.chunk(i, version, request_id) for i in range(3)]
