"""TLKV parsers a target reaches: the envelope reader, KvChunk, the decode side's PushKv stream and the
tl.kv.v1 messages the prefill and decode sides decode (TLKV "Reader rules", "Transfer (tl.kv.v1)")."""

from __future__ import annotations

import struct
from collections.abc import Iterator

import numpy as np
from google.protobuf.message import DecodeError

from kvconform.fuzz.target import FuzzTarget, IntField
from kvconform.testvectors import load_vectors
from kvconform.tlkv.blockhash import block_hashes
from kvconform.tlkv.chunk import Chunk, ChunkDecodeError
from kvconform.tlkv.content import make_kv
from kvconform.tlkv.decode import DecodeSide, TransferError, decode_chunk
from kvconform.tlkv.envelope import MAGIC, Block, encode_envelope, with_crc
from kvconform.tlkv.geometry import MIN_ENVELOPE_SIZE, Geometry
from kvconform.tlkv.proto import tl_kv_v1_pb2 as pb
from kvconform.tlkv.reader import Envelope, EnvelopeError, EnvelopeReader, Header, ShapeError

__all__ = ["TARGETS"]

# The receiving pool of the envelope_read vectors' first group; a v1-only reader beside it.
POOL = Geometry(block_tokens=3, n_layers=2, n_kv_heads=1, head_dim=2)
_READER = EnvelopeReader(POOL, {1, 2})
_V1_READER = EnvelopeReader(POOL, {1})
_TOKENS = [11, 12, 13, 14, 15, 16, 17]  # two full blocks of B = 3 and a partial tail of 1

# Header fields: version, dtype, n_blocks, B, L, Hkv, D; then the first record's block_hash and n_tokens.
_ENVELOPE_FIELDS = (IntField(4, 2, "little"), IntField(6, 2, "little"), *(
    IntField(8 + 4 * i, 4, "little") for i in range(5)), IntField(28, 8, "little"), IntField(36, 4, "little"))


def _decode_records(env: Envelope) -> None:
    # The values are what a reader hands on: decoding them must not fail either.
    for i in range(len(env.records)):
        env.kv(i).sum()


def read_envelope_all(data: bytes) -> Envelope:
    """Read as the pool's reader, then (a shape error) as a reader of the header's own geometry, then as
    a v1-only reader; every record's values decoded."""
    try:
        env = _READER.read(data)
    except ShapeError:
        hdr = Header.unpack(data)
        dims = (hdr.block_tokens, hdr.n_layers, hdr.n_kv_heads, hdr.head_dim)
        if not all(dims):
            raise  # a zero dimension is no geometry: the shape error is the answer
        env = EnvelopeReader(Geometry(*dims), {1, 2}).read(data)
    _decode_records(env)
    _V1_READER.read(data)
    return env


def read_envelope_crc_fixed(data: bytes) -> Envelope:
    """``read_envelope_all`` after recomputing the trailing CRC, so mutations get past the CRC rule."""
    return read_envelope_all(with_crc(data) if len(data) >= MIN_ENVELOPE_SIZE else data)


def _block_envelopes() -> Iterator[tuple[int, int, bytes]]:
    """(block_hash, version, one-block envelope) for the blocks of _TOKENS, both versions."""
    kv = make_kv(np.random.default_rng(7), POOL, 3, garbage_tail=False, last_fill=1)
    hashes = block_hashes(_TOKENS, POOL.block_tokens)
    fills = [3, 3, 1]
    for version in (1, 2):
        for i in range(3):
            yield hashes[i], version, encode_envelope(POOL, version, [Block(hashes[i], fills[i], kv[i])])


def envelope_seeds() -> Iterator[bytes]:
    for case in load_vectors("tlkv-envelope-read"):
        yield bytes.fromhex(case["envelope"])
    for case in load_vectors("tlkv-envelope"):
        yield bytes.fromhex(case["envelope"])


def kvchunk_seeds() -> Iterator[bytes]:
    for i, (block_hash, version, env) in enumerate(_block_envelopes()):
        yield Chunk.for_payload(f"req-{i}", i % 3, block_hash, version, env).encode()
    yield Chunk.for_payload("", 0, 0, 0, b"").encode()
    yield Chunk("r", 2**32 - 1, 2**64 - 1, 7, b"x", 0xFFFFFFFF).encode()


def frame_stream(chunks: list[bytes]) -> bytes:
    """A PushKv request stream as the fuzz input: each KvChunk prefixed by its 16-bit big-endian length."""
    return b"".join(struct.pack(">H", len(c)) + c for c in chunks)


def push_stream(data: bytes) -> object:
    """One PushKv stream into a fresh decode side: every framed chunk decoded and received, then finish."""
    side = DecodeSide(POOL, frozenset({1, 2}))
    stream = side.begin_push()
    off = 0
    while off + 2 <= len(data):
        (n,) = struct.unpack_from(">H", data, off)
        stream.receive(decode_chunk(data[off + 2 : off + 2 + n]))
        off += 2 + n
    return stream.finish()


def push_seeds() -> Iterator[bytes]:
    blocks = list(_block_envelopes())
    for version in (1, 2):
        mine = [b for b in blocks if b[1] == version]
        chunks = [Chunk.for_payload("req", i, h, v, env).encode() for i, (h, v, env) in enumerate(mine)]
        yield frame_stream(chunks)
        # the same blocks again, the full ones as empty chunks: held by then (stored earlier in the stream)
        again = [Chunk.for_payload("req", i, h, v, b"" if h else env).encode() for i, (h, v, env) in enumerate(mine)]
        yield frame_stream(chunks + again)


def has_blocks_request(data: bytes) -> object:
    """HasBlocksRequest as the decode side reads it, answered from an empty pool."""
    request = pb.HasBlocksRequest.FromString(data)
    return DecodeSide(POOL, frozenset({1, 2})).has_blocks(list(request.block_hashes))


def has_blocks_response(data: bytes) -> object:
    """HasBlocksResponse as the prefill side (and the decode suite's client) reads it."""
    return list(pb.HasBlocksResponse.FromString(data).held)


def push_kv_response(data: bytes) -> object:
    """PushKvResponse as the prefill side (and the decode suite's client) reads it."""
    msg = pb.PushKvResponse.FromString(data)
    return msg.blocks_stored, msg.blocks_reused, msg.payload_bytes


def _pb_seeds(*messages: object) -> Iterator[bytes]:
    for m in messages:
        yield m.SerializeToString()  # type: ignore[attr-defined]


TARGETS = [
    FuzzTarget(
        name="tlkv-envelope", protocol="tlkv",
        description="EnvelopeReader.read (pool, own-geometry and v1-only readers) and every record's values",
        parse=read_envelope_all, accepts=(EnvelopeError,), seeds=envelope_seeds,
        dictionary=(MAGIC, struct.pack("<HH", 1, 1), struct.pack("<HH", 2, 3)), int_fields=_ENVELOPE_FIELDS),
    FuzzTarget(
        name="tlkv-envelope-crc-fixed", protocol="tlkv",
        description="tlkv-envelope after recomputing the CRC-32C (reaches the rules behind TLKV-READ-CRC)",
        parse=read_envelope_crc_fixed, accepts=(EnvelopeError,), seeds=envelope_seeds,
        dictionary=(MAGIC, struct.pack("<HH", 1, 1), struct.pack("<HH", 2, 3)), int_fields=_ENVELOPE_FIELDS),
    FuzzTarget(
        name="tlkv-kvchunk", protocol="tlkv", description="Chunk.decode (tl.kv.v1 KvChunk) and its log line",
        parse=lambda data: Chunk.decode(data).describe(), accepts=(ChunkDecodeError,), seeds=kvchunk_seeds,
        dictionary=(b"\x0a", b"\x10", b"\x19", b"\x20", b"\x2a", b"\x35", MAGIC)),
    FuzzTarget(
        name="tlkv-push", protocol="tlkv",
        description="the decode side's PushKv stream: KvChunks (16-bit length framed) received, then finish",
        parse=push_stream, accepts=(TransferError,), seeds=push_seeds,
        dictionary=(b"\x0a", b"\x10", b"\x19", b"\x20", b"\x2a", b"\x35", MAGIC), max_len=8192),
    FuzzTarget(
        name="tlkv-has-blocks-request", protocol="tlkv", description="HasBlocksRequest.FromString, answered",
        parse=has_blocks_request, accepts=(DecodeError,),
        seeds=lambda: _pb_seeds(pb.HasBlocksRequest(block_hashes=[0, 1, 2**64 - 1]), pb.HasBlocksRequest()),
        dictionary=(b"\x0a", b"\x09")),
    FuzzTarget(
        name="tlkv-has-blocks-response", protocol="tlkv", description="HasBlocksResponse.FromString",
        parse=has_blocks_response, accepts=(DecodeError,),
        seeds=lambda: _pb_seeds(pb.HasBlocksResponse(held=[True, False, True]), pb.HasBlocksResponse()),
        dictionary=(b"\x0a", b"\x08")),
    FuzzTarget(
        name="tlkv-push-kv-response", protocol="tlkv", description="PushKvResponse.FromString",
        parse=push_kv_response, accepts=(DecodeError,),
        seeds=lambda: _pb_seeds(pb.PushKvResponse(blocks_stored=3, blocks_reused=1, payload_bytes=2**40),
                                pb.PushKvResponse()),
        dictionary=(b"\x08", b"\x10", b"\x18")),
]

