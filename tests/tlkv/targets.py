"""Targets for the harness's own verdict tests (python:tests.tlkv.targets:<Name>), apart from the mutants.

- Misbehaving tl.kv.v1 servers written for these tests from the protobuf alone (they share no code with the
  reference decode side): one answers every PushKv UNAVAILABLE, one never answers PushKv, one never answers
  anything. Each holds nothing; HasBlocks answers "not held" for every hash (except where it hangs).
- Targets that get one CRC bit wrong, one per role, for the blame test: each is the reference with exactly that
  bit mishandled, so exactly the CRC requirement of its role must fail.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator, Sequence
from concurrent import futures

import grpc
import numpy as np
import numpy.typing as npt

from kvconform.checksum import crc32c
from kvconform.targets.tlkv import ReferenceDecode, ReferenceReader, ReferenceReaderSession, ReferenceWriter
from kvconform.tlkv.chunk import Chunk
from kvconform.tlkv.decode import DecodeSide, PushStream
from kvconform.tlkv.envelope import CRC
from kvconform.tlkv.geometry import CRC_SIZE, Geometry
from kvconform.tlkv.proto import tl_kv_v1_pb2 as pb
from kvconform.tlkv.reader import EnvelopeReader, FormatError

HANG_LIMIT = 120.0  # a hanging handler gives up after this long, so a server left behind cannot live forever


class _MisbehavingDecode:
    """A tl.kv.v1 server on 127.0.0.1 that holds nothing; `mode` says how PushKv (and HasBlocks) misbehave."""

    mode = "unavailable"

    def __init__(self) -> None:
        self._server: grpc.Server | None = None

    @staticmethod
    def _hang(context: grpc.ServicerContext) -> None:
        """Never answer: wait until the call is over (the client's deadline, or the server stopping)."""
        over = threading.Event()
        context.add_callback(over.set)
        over.wait(HANG_LIMIT)

    def _has_blocks(self, request: pb.HasBlocksRequest, context: grpc.ServicerContext) -> pb.HasBlocksResponse:
        if self.mode == "hang-all":
            self._hang(context)
        return pb.HasBlocksResponse(held=[False] * len(request.block_hashes))

    def _push_kv(self, requests: Iterator[pb.KvChunk], context: grpc.ServicerContext) -> pb.PushKvResponse:
        for _ in requests:
            pass
        if self.mode == "unavailable":
            context.abort(grpc.StatusCode.UNAVAILABLE, "try again later")
        self._hang(context)  # hang-push, hang-all
        context.abort(grpc.StatusCode.UNAVAILABLE, "gave up")

    def start(self, geometry: Geometry, versions: frozenset[int]) -> str:
        handlers = grpc.method_handlers_generic_handler("tl.kv.v1.KvTransfer", {
            "HasBlocks": grpc.unary_unary_rpc_method_handler(
                self._has_blocks, request_deserializer=pb.HasBlocksRequest.FromString,
                response_serializer=pb.HasBlocksResponse.SerializeToString),
            "PushKv": grpc.stream_unary_rpc_method_handler(
                self._push_kv, request_deserializer=pb.KvChunk.FromString,
                response_serializer=pb.PushKvResponse.SerializeToString),
        })
        self._server = grpc.server(futures.ThreadPoolExecutor(max_workers=16), handlers=[handlers],
                                   options=[("grpc.max_receive_message_length", 64 * 1024 * 1024)])
        port = self._server.add_insecure_port("127.0.0.1:0")
        self._server.start()
        return f"127.0.0.1:{port}"

    def stop(self) -> None:
        if self._server is not None:
            self._server.stop(0).wait(10)
            self._server = None


class UnavailableDecode(_MisbehavingDecode):
    """Answers every PushKv UNAVAILABLE (a transport status, not a protocol answer); HasBlocks holds nothing."""

    mode = "unavailable"


class HangingPushDecode(_MisbehavingDecode):
    """Never answers PushKv; HasBlocks answers at once (the sanity probe passes)."""

    mode = "hang-push"


class HangingDecode(_MisbehavingDecode):
    """Accepts connections and never answers anything."""

    mode = "hang-all"


# ---- one CRC bit wrong ---------------------------------------------------------------------------------------


class FlippedCrcBitWriter(ReferenceWriter):
    """Writes every envelope's crc32c with its lowest bit flipped."""

    def export(self, geometry: Geometry, version: int, tokens: Sequence[int],
               kv: npt.NDArray[np.float16]) -> bytes:
        data = bytearray(super().export(geometry, version, tokens, kv))
        data[-CRC_SIZE] ^= 0x01
        return bytes(data)


class _CrcBitBlindReader(EnvelopeReader):
    def check_crc(self, buf: memoryview) -> None:
        (stored,) = CRC.unpack_from(buf, len(buf) - CRC_SIZE)
        computed = crc32c(buf[: len(buf) - CRC_SIZE])
        if (stored ^ computed) & ~0x01:  # the lowest bit is not compared
            raise FormatError("TLKV-READ-CRC", "crc32c", f"0x{stored:08X}", f"0x{computed:08X}")


class _CrcBitBlindSession(ReferenceReaderSession):
    reader_class = _CrcBitBlindReader


class CrcBitBlindReader(ReferenceReader):
    """Accepts an envelope whose crc32c differs from the right one in its lowest bit only."""

    session_class = _CrcBitBlindSession


class _CrcBitBlindStream(PushStream):
    def receive(self, chunk: Chunk) -> None:
        right = crc32c(chunk.payload)
        if chunk.crc32c ^ right == 0x80000000:  # the top bit of KvChunk.crc32c is not compared
            chunk = Chunk(chunk.request_id, chunk.block_index, chunk.block_hash, chunk.kv_format, chunk.payload,
                          right)
        super().receive(chunk)


class _CrcBitBlindSide(DecodeSide):
    def begin_push(self) -> PushStream:
        return _CrcBitBlindStream(self)


class CrcBitBlindDecode(ReferenceDecode):
    """Accepts a chunk whose crc32c differs from its payload's in the top bit only."""

    def __init__(self) -> None:
        super().__init__(side_factory=_CrcBitBlindSide)
