"""The sans-I/O decode side of tl.kv.v1 (TLKV "Transfer (tl.kv.v1)" and "Reader rules").

Chunks in, a status or a result out; no sockets and no grpc import.  The gRPC adapter
(:mod:`kvconform.tlkv.grpc_decode`) only moves bytes and maps :class:`Status` to ``grpc.StatusCode``.

Checks on each chunk, in order (the first failure ends the stream; nothing it staged is kept):

=====================================================  ===================  ==========================
rule                                                   status               requirement
=====================================================  ===================  ==========================
protobuf bytes parse as KvChunk                        INVALID_ARGUMENT     TLKV-XFER-PROTO
kv_format is one this side reads                       FAILED_PRECONDITION  TLKV-XFER-FORMAT
payload at most 4 MiB                                  RESOURCE_EXHAUSTED   TLKV-XFER-MAX-PAYLOAD
crc32c is the payload's CRC-32C                        DATA_LOSS            TLKV-XFER-CRC
empty payload only for a held block (never hash 0)     NOT_FOUND            TLKV-XFER-EMPTY-HELD
envelope passes every reader rule                      DATA_LOSS            the reader's (TLKV-READ-*)
  ... except a version this side does not read         FAILED_PRECONDITION  TLKV-READ-VERSION
envelope version equals kv_format                      DATA_LOSS            TLKV-XFER-FORMAT
envelope n_blocks is 1                                 INVALID_ARGUMENT     TLKV-XFER-ONE-BLOCK
chunk block_hash equals the record's                   INVALID_ARGUMENT     TLKV-XFER-CHUNK-HASH
=====================================================  ===================  ==========================

A block stored earlier in the same stream counts as held for a later empty chunk of that stream.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable
from dataclasses import dataclass

from kvconform.checksum import crc32c
from kvconform.tlkv.blockhash import NO_HASH
from kvconform.tlkv.chunk import MAX_CHUNK_PAYLOAD, Chunk, ChunkDecodeError, format_name
from kvconform.tlkv.geometry import Geometry
from kvconform.tlkv.pool import BlockPool, PoolConflict, StoredBlock
from kvconform.tlkv.reader import EnvelopeError, VersionError, read_envelope


class Status(enum.Enum):
    """gRPC status codes by their gRPC names and numbers (TLKV "Reader rules" and "Transfer" name them),
    so the core needs no grpc import."""

    OK = 0
    CANCELLED = 1
    UNKNOWN = 2
    INVALID_ARGUMENT = 3
    DEADLINE_EXCEEDED = 4
    NOT_FOUND = 5
    ALREADY_EXISTS = 6
    PERMISSION_DENIED = 7
    RESOURCE_EXHAUSTED = 8
    FAILED_PRECONDITION = 9
    ABORTED = 10
    OUT_OF_RANGE = 11
    UNIMPLEMENTED = 12
    INTERNAL = 13
    UNAVAILABLE = 14
    DATA_LOSS = 15
    UNAUTHENTICATED = 16


class TransferError(Exception):
    """A chunk broke a transfer rule: the stream fails with ``status`` (TLKV "Transfer (tl.kv.v1)")."""

    def __init__(self, status: Status, requirement: str, message: str, *, field: str = "",
                 seen: object = None, expected: object = None, block_index: int | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.requirement = requirement
        self.message = message
        self.field = field
        self.seen = seen
        self.expected = expected
        self.block_index = block_index

    @classmethod
    def of(cls, status: Status, requirement: str, field: str, seen: object, expected: object,
           chunk_no: int | None = None, block_index: int | None = None) -> TransferError:
        """The standard message: where, which field, what was seen, what was expected, which requirement."""
        where = "" if chunk_no is None else f"chunk {chunk_no} (block_index {block_index}): "
        message = f"{where}{field}: got {seen}, expected {expected} ({requirement})"
        return cls(status, requirement, message, field=field, seen=seen, expected=expected,
                   block_index=block_index)


def decode_chunk(data: bytes) -> Chunk:
    """Parse KvChunk wire bytes; unparseable bytes fail the stream with INVALID_ARGUMENT."""
    try:
        return Chunk.decode(data)
    except ChunkDecodeError as exc:
        raise TransferError.of(Status.INVALID_ARGUMENT, "TLKV-XFER-PROTO", "KvChunk",
                               f"{len(data)} bytes that do not parse ({exc.__cause__})",
                               "a tl.kv.v1.KvChunk message") from exc


@dataclass(frozen=True)
class PushResult:
    """PushKvResponse (tl.kv.v1 protobuf, TLKV-XFER-RESPONSE): chunks with a payload, chunks with an
    empty payload, sum of payload lengths."""

    blocks_stored: int
    blocks_reused: int
    payload_bytes: int


class PushStream:
    """One PushKv stream: :meth:`receive` each chunk, then :meth:`finish` (or :meth:`fail`).

    Everything is staged in a pool transaction, so a failed stream stores nothing and takes no
    references (TLKV-XFER-ATOMIC).
    """

    def __init__(self, side: DecodeSide) -> None:
        self._side = side
        self._txn = side.pool.transaction()
        self.state = "open"
        self.chunks = 0
        self.blocks_stored = 0
        self.blocks_reused = 0
        self.payload_bytes = 0
        self.error: TransferError | None = None

    def receive(self, chunk: Chunk) -> None:
        """Check and stage one chunk; raises :class:`TransferError` (and fails the stream) on the first bad one."""
        if self.state != "open":
            raise RuntimeError(f"PushStream.receive: state is {self.state!r}, expected 'open'")
        chunk_no = self.chunks
        self.chunks += 1
        try:
            self._receive(chunk_no, chunk)
        except TransferError as exc:
            self._fail(exc)
            raise

    def _receive(self, chunk_no: int, chunk: Chunk) -> None:
        side = self._side

        def error(status: Status, requirement: str, field: str, seen: object, expected: object) -> TransferError:
            return TransferError.of(status, requirement, field, seen, expected, chunk_no, chunk.block_index)

        if chunk.kv_format not in side.versions:
            raise error(Status.FAILED_PRECONDITION, "TLKV-XFER-FORMAT", "kv_format", format_name(chunk.kv_format),
                        "one of " + ", ".join(format_name(v) for v in sorted(side.versions)))
        size = len(chunk.payload)
        if size > side.max_payload:
            raise error(Status.RESOURCE_EXHAUSTED, "TLKV-XFER-MAX-PAYLOAD", "payload", f"{size} bytes",
                        f"at most {side.max_payload} bytes (4 MiB)")
        computed = crc32c(chunk.payload)
        if chunk.crc32c != computed:
            raise error(Status.DATA_LOSS, "TLKV-XFER-CRC", "crc32c", f"0x{chunk.crc32c:08X}",
                        f"0x{computed:08X} (CRC-32C of the {size}-byte payload)")
        if size == 0:
            if chunk.block_hash == NO_HASH:
                raise error(Status.NOT_FOUND, "TLKV-XFER-EMPTY-HELD", "payload", "empty with block_hash 0",
                            "the envelope of the partial block (a block without hash is never held)")
            if not self._txn.holds(chunk.block_hash):
                raise error(Status.NOT_FOUND, "TLKV-XFER-EMPTY-HELD", "payload",
                            f"empty for block_hash 0x{chunk.block_hash:016X}",
                            "the envelope: this side does not hold that block")
            self._txn.take_ref(chunk.request_id, chunk.block_hash)
            self.blocks_reused += 1
            return
        try:
            env = read_envelope(chunk.payload, geometry=side.geometry, versions=side.versions)
        except VersionError as exc:
            raise error(Status.FAILED_PRECONDITION, exc.requirement, f"payload.{exc.field}", exc.seen,
                        exc.expected) from exc
        except EnvelopeError as exc:
            raise error(Status.DATA_LOSS, exc.requirement, f"payload.{exc.field}", exc.seen, exc.expected) from exc
        if env.version != chunk.kv_format:
            raise error(Status.DATA_LOSS, "TLKV-XFER-FORMAT", "payload.version", env.version,
                        f"{chunk.kv_format} (the chunk's kv_format {format_name(chunk.kv_format)})")
        if len(env.records) != 1:
            raise error(Status.INVALID_ARGUMENT, "TLKV-XFER-ONE-BLOCK", "payload.n_blocks", len(env.records), 1)
        record = env.records[0]
        if record.block_hash != chunk.block_hash:
            raise error(Status.INVALID_ARGUMENT, "TLKV-XFER-CHUNK-HASH", "block_hash",
                        f"0x{chunk.block_hash:016X}", f"0x{record.block_hash:016X} (the envelope record's)")
        self._txn.store(chunk.request_id, StoredBlock(record.block_hash, record.n_tokens, env.version,
                                                      chunk.payload, side.geometry))
        self.blocks_stored += 1
        self.payload_bytes += size

    def finish(self) -> PushResult:
        """End of stream: commit everything staged and answer the counts."""
        if self.state != "open":
            raise RuntimeError(f"PushStream.finish: state is {self.state!r}, expected 'open'")
        try:
            self._txn.commit()
        except PoolConflict as exc:
            # Another request released a block this stream referenced while the stream was open.
            err = TransferError.of(Status.NOT_FOUND, "TLKV-XFER-EMPTY-HELD", "payload",
                                   f"empty for block_hash 0x{exc.args[0]:016X}",
                                   "the envelope: the block was released before the stream ended")
            self._fail(err)
            raise err from exc
        self.state = "finished"
        return PushResult(self.blocks_stored, self.blocks_reused, self.payload_bytes)

    def fail(self) -> None:
        """Abandon the stream (cancelled, transport error): nothing staged is kept.  Idempotent."""
        if self.state == "open":
            self._txn.abort()
            self.state = "failed"

    def _fail(self, exc: TransferError) -> None:
        self.error = exc
        self.fail()


class DecodeSide:
    """The decode side of tl.kv.v1 for one pool geometry and a set of readable envelope versions
    (TLKV "Transfer (tl.kv.v1)")."""

    max_payload = MAX_CHUNK_PAYLOAD  # "at most 4 MiB"

    def __init__(self, geometry: Geometry, versions: frozenset[int], pool: BlockPool | None = None) -> None:
        if not versions or not versions <= {1, 2}:
            raise ValueError(f"versions: got {sorted(versions)}, expected a non-empty subset of [1, 2]")
        if pool is not None and pool.geometry != geometry:
            raise ValueError(f"pool geometry: got {pool.geometry}, expected {geometry}")
        self.geometry = geometry
        self.versions = frozenset(versions)
        self.pool = pool if pool is not None else BlockPool(geometry)

    def has_blocks(self, hashes: Iterable[int]) -> list[bool]:
        """One bool per requested hash, same order; 0 (no hash) is never held."""
        return self.pool.holds_all(list(hashes))

    def begin_push(self) -> PushStream:
        return PushStream(self)

    def release(self, request_id: str) -> None:
        """The request is done with its blocks: give back its references and partial blocks."""
        self.pool.release(request_id)
