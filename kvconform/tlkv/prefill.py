"""The reference prefill side of tl.kv.v1 (TLKV "Transfer (tl.kv.v1)").

:func:`plan_push` is sans-I/O: HasBlocks answers in, the PushKv chunks out.  :func:`run_prefill`
moves them over gRPC: HasBlocks with exactly the prompt's full-block hashes, then PushKv.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from kvconform.tlkv.blockhash import block_fills, block_hashes, chain_hashes
from kvconform.tlkv.chunk import MAX_CHUNK_PAYLOAD, Chunk
from kvconform.tlkv.envelope import Block, encode_envelope
from kvconform.tlkv.geometry import Geometry
from kvconform.tlkv.grpc_client import KvTransferClient, PushOutcome
from kvconform.tlkv.proto import tl_kv_v1_pb2 as pb


def full_block_hashes(tokens: Sequence[int], block_tokens: int) -> list[int]:
    """The chain hashes of the full blocks, in order: what the prefill side asks HasBlocks about."""
    return chain_hashes(tokens, block_tokens)


def plan_push(tokens: Sequence[int], kv: npt.NDArray[np.floating], geometry: Geometry, version: int,
              held: Sequence[bool], request_id: str) -> list[Chunk]:
    """One chunk per block, in order: an empty payload for each held full block, a one-block
    envelope for every other block (the partial tail included, with block_hash 0)."""
    b = geometry.block_tokens
    hashes = block_hashes(tokens, b)
    fills = block_fills(len(tokens), b)
    n_full = len(tokens) // b
    expected_shape = (len(hashes), *geometry.kv_shape)
    if tuple(kv.shape) != expected_shape:
        raise ValueError(f"kv.shape: got {tuple(kv.shape)}, expected {expected_shape} ([n_blocks][L][2][Hkv][B][D])")
    if len(held) != n_full:
        raise ValueError(f"held: got {len(held)} flags, expected {n_full} (one per full block, as HasBlocks answers)")
    chunks: list[Chunk] = []
    for i, (block_hash, fill) in enumerate(zip(hashes, fills, strict=True)):
        if i < n_full and held[i]:
            chunks.append(Chunk.for_payload(request_id, i, block_hash, version, b""))
            continue
        payload = encode_envelope(geometry, version, [Block(block_hash, fill, kv[i])])
        if len(payload) > MAX_CHUNK_PAYLOAD:
            raise ValueError(f"payload: got {len(payload)} bytes for geometry {geometry} v{version}, "
                             f"expected at most {MAX_CHUNK_PAYLOAD} (TLKV-XFER-MAX-PAYLOAD)")
        chunks.append(Chunk.for_payload(request_id, i, block_hash, version, payload))
    return chunks


def bytes_moved(chunks: Sequence[Chunk]) -> int:
    """Payload bytes a plan moves: (missing full blocks + 1 tail) * envelope size."""
    return sum(len(c.payload) for c in chunks)


@dataclass(frozen=True)
class PrefillResult:
    """What a prefill run saw (TLKV "Transfer (tl.kv.v1)"): HasBlocks' answer, how PushKv ended, and the
    payload bytes it moved."""

    held: list[bool]
    outcome: PushOutcome
    bytes_moved: int

    @property
    def response(self) -> pb.PushKvResponse | None:
        return self.outcome.response

    @property
    def ok(self) -> bool:
        return self.outcome.ok


def run_prefill(address: str, tokens: Sequence[int], kv: npt.NDArray[np.floating], geometry: Geometry,
                version: int, request_id: str, timeout: float = 10.0) -> PrefillResult:
    """HasBlocks with the prompt's full-block hashes, then PushKv of the planned chunks."""
    with KvTransferClient(address, timeout) as client:
        held = client.has_blocks(full_block_hashes(tokens, geometry.block_tokens))
        chunks = plan_push(tokens, kv, geometry, version, held, request_id)
        outcome = client.push(chunks)
    return PrefillResult(held, outcome, bytes_moved(chunks))
