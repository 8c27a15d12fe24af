"""grpcio server adapter for the tl.kv.v1 decode side (TLKV "Transfer (tl.kv.v1)").

A thin layer: bytes come off HTTP/2, the sans-I/O :class:`~kvconform.tlkv.decode.DecodeSide` decides,
and a :class:`~kvconform.tlkv.decode.TransferError` becomes the RPC's status.  Handlers are registered
by hand (no ``_pb2_grpc``).  PushKv receives raw bytes and parses them in the core, so a malformed
KvChunk fails the stream cleanly (INVALID_ARGUMENT, nothing stored) instead of grpc's own INTERNAL.
"""

from __future__ import annotations

import logging
import threading
from collections import Counter
from collections.abc import Callable, Iterator
from concurrent import futures
from types import TracebackType
from typing import Any

import grpc
from google.protobuf.message import DecodeError

from kvconform import evidence
from kvconform.tlkv.chunk import Chunk
from kvconform.tlkv.decode import DecodeSide, PushResult, PushStream, Status, TransferError, decode_chunk
from kvconform.tlkv.proto import tl_kv_v1_pb2 as pb

log = logging.getLogger(__name__)

SERVICE = "tl.kv.v1.KvTransfer"
# A KvChunk carrying a legal 4 MiB payload plus its other fields must get through grpc's own limit
# (default 4 MiB) so the core, not the transport, judges the payload size. The margin is wide on purpose:
# when grpc itself refuses a message, the handler may see the request stream end as if the client had
# closed it (a race is_active() does not always win), so oversized chunks must reach the core to be
# refused atomically (TLKV-XFER-ATOMIC). Past 64 MiB the transport refuses them, to bound memory.
MAX_RECEIVE_MESSAGE = 64 * 1024 * 1024

Observer = Callable[..., object]


def format_address(host: str, port: int) -> str:
    """host:port, with brackets around an IPv6 literal."""
    return f"[{host}]:{port}" if ":" in host and not host.startswith("[") else f"{host}:{port}"


def _record(direction: evidence.Direction, kind: str, fields: dict[str, Any] | None = None,
            raw: bytes | None = None) -> None:
    """``evidence.record`` from the server's own threads (a no-op outside a check)."""
    try:
        evidence.record(direction, kind, fields=fields, raw=raw)
    except Exception:  # evidence is best effort: never let it change an RPC's outcome
        log.warning("evidence.record(%r, %r) failed", direction, kind, exc_info=True)


def _chunk_fields(chunk: Chunk) -> dict[str, Any]:
    return {"request_id": chunk.request_id, "block_index": chunk.block_index,
            "block_hash": f"0x{chunk.block_hash:016X}", "kv_format": chunk.kv_format,
            "payload_len": len(chunk.payload), "crc32c": f"0x{chunk.crc32c:08X}"}


class DecodeServer:
    """The decode side served over grpcio on ``host:port`` (TLKV "Transfer (tl.kv.v1)").

    ``observer``, when given, is called as ``observer("HasBlocks", request, response)``,
    ``observer("KvChunk", chunk)`` and ``observer("PushKvEnd", status, response_or_None)``. With
    ``read_whole_stream`` a stream that failed is still read to its end (every chunk observed, nothing more
    staged) before its status is sent: the prefill suite records everything a prefill side sends.
    """

    def __init__(self, side: DecodeSide, host: str = "127.0.0.1", port: int = 0, max_workers: int = 4,
                 observer: Observer | None = None, max_receive_message: int = MAX_RECEIVE_MESSAGE,
                 read_whole_stream: bool = False) -> None:
        self.side = side
        self.read_whole_stream = read_whole_stream
        self.max_receive_message = max_receive_message
        self.host = host
        self.port = port
        self.max_workers = max_workers
        self.observer = observer
        self._server: grpc.Server | None = None
        self._counts: Counter[str] = Counter()
        self._counts_lock = threading.Lock()

    # -- lifecycle ---------------------------------------------------------------------------------

    def start(self) -> int:
        """Bind, start serving and return the bound port."""
        if self._server is not None:
            raise RuntimeError("DecodeServer.start: already started")
        handlers = grpc.method_handlers_generic_handler(SERVICE, {
            "HasBlocks": grpc.unary_unary_rpc_method_handler(
                self._has_blocks, request_deserializer=None,
                response_serializer=pb.HasBlocksResponse.SerializeToString),
            "PushKv": grpc.stream_unary_rpc_method_handler(
                self._push_kv, request_deserializer=None,
                response_serializer=pb.PushKvResponse.SerializeToString),
        })
        server = grpc.server(
            futures.ThreadPoolExecutor(max_workers=self.max_workers, thread_name_prefix="tlkv-decode"),
            handlers=[handlers],
            options=[("grpc.max_receive_message_length", self.max_receive_message),
                     ("grpc.so_reuseport", 0)],  # a busy explicit port must fail, not be shared
        )
        address = format_address(self.host, self.port)
        try:
            bound = server.add_insecure_port(address)
        except RuntimeError as exc:
            raise OSError(f"tl.kv.v1 decode server: cannot bind {address}: {exc}") from exc
        if bound == 0:
            raise OSError(f"tl.kv.v1 decode server: cannot bind {address}")
        server.start()
        self._server, self.port = server, bound
        return bound

    def stop(self, grace: float | None = None) -> None:
        """Stop serving; in-flight RPCs get ``grace`` seconds.  Idempotent."""
        server, self._server = self._server, None
        if server is not None:
            server.stop(grace).wait()

    def __enter__(self) -> DecodeServer:
        self.start()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop(0)

    @property
    def address(self) -> str:
        return format_address(self.host, self.port)

    def status_counts(self) -> dict[str, int]:
        """Finished RPCs per ``"<method> <status>"``, e.g. ``"PushKv DATA_LOSS"``."""
        with self._counts_lock:
            return dict(self._counts)

    # -- handlers ----------------------------------------------------------------------------------

    def _count(self, method: str, status: Status) -> None:
        with self._counts_lock:
            self._counts[f"{method} {status.name}"] += 1

    def _observe(self, *event: object) -> None:
        if self.observer is not None:
            self.observer(*event)

    def _has_blocks(self, data: bytes, context: grpc.ServicerContext) -> pb.HasBlocksResponse:
        try:
            request = pb.HasBlocksRequest.FromString(data)
        except DecodeError as exc:
            _record("received", "HasBlocksRequest", {"error": str(exc)}, raw=data)
            self._count("HasBlocks", Status.INVALID_ARGUMENT)
            context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                          f"HasBlocksRequest: got {len(data)} bytes that do not parse, expected a "
                          f"tl.kv.v1.HasBlocksRequest message (TLKV-XFER-PROTO)")
        hashes = list(request.block_hashes)
        _record("received", "HasBlocksRequest", {"block_hashes": [f"0x{h:016X}" for h in hashes]})
        response = pb.HasBlocksResponse(held=self.side.has_blocks(hashes))
        _record("sent", "HasBlocksResponse", {"held": list(response.held)})
        self._observe("HasBlocks", request, response)
        self._count("HasBlocks", Status.OK)
        return response

    def _push_kv(self, requests: Iterator[bytes], context: grpc.ServicerContext) -> pb.PushKvResponse:
        stream = self.side.begin_push()
        error: TransferError | None = None
        result: PushResult | None = None
        try:
            result = self._run_stream(stream, requests, context)
        except TransferError as exc:
            error = exc
        except grpc.RpcError:
            pass  # the client went away (cancelled, deadline): the status is already decided
        except Exception:
            log.exception("PushKv handler failed")  # a bug here: grpc answers UNKNOWN
            self._observe("PushKvEnd", Status.UNKNOWN, None)
            self._count("PushKv", Status.UNKNOWN)
            raise
        finally:
            stream.fail()  # no-op after finish(); otherwise nothing staged is kept (TLKV-XFER-ATOMIC)
        if error is not None:
            _record("sent", "PushKvStatus", {"status": error.status.name, "requirement": error.requirement,
                                             "details": error.message})
            self._observe("PushKvEnd", error.status, None)
            self._count("PushKv", error.status)
            context.abort(grpc.StatusCode[error.status.name], error.message)
        if result is None:
            self._observe("PushKvEnd", Status.CANCELLED, None)
            self._count("PushKv", Status.CANCELLED)
            return pb.PushKvResponse()  # not delivered: the call is already over
        response = pb.PushKvResponse(blocks_stored=result.blocks_stored, blocks_reused=result.blocks_reused,
                                     payload_bytes=result.payload_bytes)
        _record("sent", "PushKvResponse", {"blocks_stored": result.blocks_stored,
                                           "blocks_reused": result.blocks_reused,
                                           "payload_bytes": result.payload_bytes})
        self._observe("PushKvEnd", Status.OK, response)
        self._count("PushKv", Status.OK)
        return response

    def _run_stream(self, stream: PushStream, requests: Iterator[bytes],
                    context: grpc.ServicerContext) -> PushResult | None:
        failed: TransferError | None = None
        for data in requests:
            try:
                chunk = decode_chunk(data)
                _record("received", "KvChunk", _chunk_fields(chunk))
                self._observe("KvChunk", chunk)
                if failed is None:
                    stream.receive(chunk)
            except TransferError as exc:
                if failed is None and exc.field == "KvChunk":
                    _record("received", "KvChunk", {"error": "malformed"}, raw=data)
                failed = failed or exc
                if not self.read_whole_stream:
                    raise
        if failed is not None:
            raise failed
        _confirm_half_close(requests)
        if not context.is_active():
            return None  # the requests ended because the call did (cancelled, deadline): commit nothing
        return stream.finish()


def _confirm_half_close(requests: Iterator[bytes]) -> None:
    """Raise grpc.RpcError if the request stream ended because the call was cancelled, not half-closed.

    grpc's sync server ends the request iterator the same way for both: a cancelled call's pending
    receive also completes with no message, and the cancellation is recorded only when the separate
    RECV_CLOSE_ON_SERVER event is processed, so ``context.is_active()`` right after the loop can still
    be True (a stream cut by its deadline got committed: TLKV-XFER-ATOMIC).  One more read is a round
    trip through grpc's single completion-queue poller: on a half-closed call it ends at once, and on a
    cancelled one its completion queues behind the RECV_CLOSE_ON_SERVER event core posted with the
    cancellation, so the iterator raises instead (core's order as observed in grpcio 1.85, not a
    documented promise: tests/tlkv/test_grpc.py holds the poller between the two events to pin it).
    What is left is what no RPC can close: a cancellation that arrives after the client's half-close
    (then the server commits and the client may still see an error).
    """
    if next(requests, None) is not None:  # grpc never delivers a message after the end of stream
        raise RuntimeError("PushKv: grpc delivered a request after the end of the request stream")
