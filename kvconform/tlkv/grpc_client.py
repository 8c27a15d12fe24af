"""grpcio client for tl.kv.v1 (TLKV "Transfer (tl.kv.v1)"): the prefill side's transport and the harness's probe.

Statuses come back as data, never as exceptions, so a check can compare them with acceptable outcomes.
PushKv items may be raw bytes, sent exactly as given (malformed protobuf included).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from types import TracebackType

import grpc

from kvconform.tlkv.chunk import MAX_CHUNK_PAYLOAD, Chunk
from kvconform.tlkv.proto import tl_kv_v1_pb2 as pb

# Room for a chunk past the 4 MiB payload limit, so the harness can probe the server's own limits.
MAX_SEND_MESSAGE = 2 * MAX_CHUNK_PAYLOAD + 64 * 1024


@dataclass(frozen=True)
class PushOutcome:
    """How a PushKv call ended (TLKV "Transfer (tl.kv.v1)"): the gRPC status name, its details, and the
    response when OK."""

    status_name: str
    details: str
    response: pb.PushKvResponse | None

    @property
    def ok(self) -> bool:
        return self.status_name == "OK"


@dataclass(frozen=True)
class HasBlocksOutcome:
    """How a HasBlocks call ended (TLKV "Transfer (tl.kv.v1)"): status name, details, held flags when OK."""

    status_name: str
    details: str
    held: list[bool] | None

    @property
    def ok(self) -> bool:
        return self.status_name == "OK"


class CallFailed(RuntimeError):
    """Raised only by :meth:`KvTransferClient.has_blocks`, whose result has no room for a status."""

    def __init__(self, method: str, status_name: str, details: str) -> None:
        super().__init__(f"{method}: status {status_name}, expected OK: {details}")
        self.method, self.status_name, self.details = method, status_name, details


def _rpc_status(exc: grpc.RpcError) -> tuple[str, str]:
    if isinstance(exc, grpc.Call):
        code = exc.code()
        return (code.name if code is not None else "UNKNOWN"), (exc.details() or "")
    return "UNKNOWN", str(exc)


class KvTransferClient:
    """A tl.kv.v1 KvTransfer client (TLKV "Transfer (tl.kv.v1)") over a plain insecure channel; every
    call has a deadline of ``timeout`` seconds."""

    def __init__(self, address: str, timeout: float = 10.0) -> None:
        self.address = address
        self.timeout = timeout
        self._channel = grpc.insecure_channel(address, options=[
            ("grpc.max_send_message_length", MAX_SEND_MESSAGE),
        ])
        # Identity request serializers: every request is encoded (or crafted) by us.
        self._has_blocks = self._channel.unary_unary(
            "/tl.kv.v1.KvTransfer/HasBlocks", request_serializer=None,
            response_deserializer=pb.HasBlocksResponse.FromString)
        self._push = self._channel.stream_unary(
            "/tl.kv.v1.KvTransfer/PushKv", request_serializer=None,
            response_deserializer=pb.PushKvResponse.FromString)

    def has_blocks_call(self, request: Sequence[int] | bytes) -> HasBlocksOutcome:
        """HasBlocks for these hashes (or these raw request bytes); the status as data."""
        data = request if isinstance(request, bytes) else pb.HasBlocksRequest(
            block_hashes=list(request)).SerializeToString()
        try:
            response = self._has_blocks(data, timeout=self.timeout)
        except grpc.RpcError as exc:
            return HasBlocksOutcome(*_rpc_status(exc), None)
        return HasBlocksOutcome("OK", "", list(response.held))

    def has_blocks(self, hashes: Sequence[int]) -> list[bool]:
        """One held flag per hash, same order; raises :class:`CallFailed` on a non-OK status."""
        outcome = self.has_blocks_call(list(hashes))
        if outcome.held is None:
            raise CallFailed("HasBlocks", outcome.status_name, outcome.details)
        return outcome.held

    def push(self, chunks: Iterable[Chunk | bytes]) -> PushOutcome:
        """PushKv: stream the chunks (a ``bytes`` item goes out as-is) and return how the call ended."""

        def wire() -> Iterator[bytes]:
            for item in chunks:
                yield item if isinstance(item, bytes) else item.encode()

        try:
            response = self._push(wire(), timeout=self.timeout)
        except grpc.RpcError as exc:
            return PushOutcome(*_rpc_status(exc), None)
        return PushOutcome("OK", "", response)

    def close(self) -> None:
        self._channel.close()

    def __enter__(self) -> KvTransferClient:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()
