"""The sans-I/O decode side: every transfer rule, atomicity of a failed stream, dedup."""

from __future__ import annotations

import dataclasses

import pytest

from kvconform.checksum import crc32c
from kvconform.tlkv.chunk import MAX_CHUNK_PAYLOAD, Chunk, KvFormat
from kvconform.tlkv.decode import DecodeSide, PushResult, PushStream, Status, TransferError, decode_chunk
from kvconform.tlkv.envelope import DTYPE_F16, encode_raw
from kvconform.tlkv.geometry import Geometry
from kvconform.tlkv.pool import PoolStats
from kvconform.tlkv.proto import tl_kv_v1_pb2 as pb
from tests.tlkv.helpers import GEOMETRY, Kit


def push(side: DecodeSide, chunks: list[Chunk]) -> PushResult:
    stream = side.begin_push()
    for chunk in chunks:
        stream.receive(chunk)
    return stream.finish()


def expect_failure(side: DecodeSide, chunks: list[Chunk], status: Status, requirement: str) -> TransferError:
    """Push `chunks`; the last one must fail the stream with exactly this status and requirement."""
    stream = side.begin_push()
    for chunk in chunks[:-1]:
        stream.receive(chunk)
    with pytest.raises(TransferError) as info:
        stream.receive(chunks[-1])
    err = info.value
    assert (err.status, err.requirement) == (status, requirement), err.message
    assert requirement in err.message and err.field in err.message
    assert stream.state == "failed" and stream.error is err
    return err


def recrc(chunk: Chunk, payload: bytes) -> Chunk:
    """The same chunk with another payload and that payload's correct CRC."""
    return dataclasses.replace(chunk, payload=payload, crc32c=crc32c(payload))


def raw_envelope(kit: Kit, i: int = 0, **fields: object) -> bytes:
    """A v1 one-block envelope for block i through the raw encoder, with `fields` overriding."""
    g = GEOMETRY
    payload = kit.envelope(i)[28 + 12 : -4]
    args: dict[str, object] = dict(version=1, dtype=DTYPE_F16, block_tokens=g.block_tokens, n_layers=g.n_layers,
                                   n_kv_heads=g.n_kv_heads, head_dim=g.head_dim,
                                   records=[(kit.hashes[i], kit.fills[i], payload)])
    args.update(fields)
    return encode_raw(**args)  # type: ignore[arg-type]


def test_raw_helper_matches_the_checked_encoder(kit: Kit) -> None:
    assert raw_envelope(kit, 1) == kit.envelope(1)


# -- success, dedup -------------------------------------------------------------------------------


def test_push_stores_every_block_and_counts(kit: Kit, side: DecodeSide) -> None:
    chunks = kit.chunks()
    result = push(side, chunks)
    assert result == PushResult(3, 0, sum(len(c.payload) for c in chunks))
    assert side.has_blocks([kit.hashes[1], kit.hashes[0], 0, 12345]) == [True, True, False, False]
    assert [b.n_tokens for b in side.pool.partial_blocks("req-1")] == [2]
    assert side.pool.stats().refs == 3


def test_held_blocks_are_reused_with_a_reference(kit: Kit, side: DecodeSide) -> None:
    push(side, kit.chunks(request_id="a"))
    before = side.pool.stats()
    b_chunks = [kit.chunk(0, request_id="b", empty=True), kit.chunk(1, request_id="b", empty=True),
                kit.chunk(2, request_id="b")]
    result = push(side, b_chunks)
    assert result == PushResult(1, 2, len(b_chunks[2].payload))
    after = side.pool.stats()
    assert (after.registered, after.partial) == (before.registered, before.partial + 1)
    assert after.refs == before.refs + 3
    assert side.pool.request_refs("b") == {kit.hashes[0]: 1, kit.hashes[1]: 1}


def test_a_payload_for_a_held_block_is_deduplicated(kit: Kit, side: DecodeSide) -> None:
    push(side, kit.chunks(request_id="a"))
    bytes_before = side.pool.stats().bytes
    result = push(side, [kit.chunk(0, request_id="b")])
    assert result.blocks_stored == 1 and result.blocks_reused == 0
    assert side.pool.stats().bytes == bytes_before  # no second copy
    assert side.pool.get(kit.hashes[0]).refs == 2  # type: ignore[union-attr]


def test_empty_payload_for_a_block_stored_earlier_in_the_stream(kit: Kit, side: DecodeSide) -> None:
    result = push(side, [kit.chunk(0), kit.chunk(0, empty=True)])
    assert result == PushResult(1, 1, len(kit.envelope(0)))


@pytest.mark.parametrize("version", [1, 2])
def test_both_formats_are_read(kit: Kit, side: DecodeSide, version: int) -> None:
    assert push(side, kit.chunks(version)).blocks_stored == 3
    assert side.pool.get(kit.hashes[0]).version == version  # type: ignore[union-attr]


def test_empty_stream_is_ok(side: DecodeSide) -> None:
    assert push(side, []) == PushResult(0, 0, 0)


def test_has_blocks_keeps_order_and_never_holds_zero(kit: Kit, side: DecodeSide) -> None:
    assert side.has_blocks([]) == []
    push(side, [kit.chunk(1)])
    assert side.has_blocks([kit.hashes[0], kit.hashes[1], 0, kit.hashes[1]]) == [False, True, False, True]


# -- each rule ------------------------------------------------------------------------------------


@pytest.mark.parametrize("kv_format", [KvFormat.UNSPECIFIED, 3, 0xFFFF])
def test_unknown_kv_format_is_failed_precondition(kit: Kit, side: DecodeSide, kv_format: int) -> None:
    chunk = dataclasses.replace(kit.chunk(0), kv_format=int(kv_format))
    err = expect_failure(side, [chunk], Status.FAILED_PRECONDITION, "TLKV-XFER-FORMAT")
    assert err.field == "kv_format"


def test_v1_only_side_refuses_kv_format_v2(kit: Kit) -> None:
    side = DecodeSide(GEOMETRY, frozenset({1}))
    err = expect_failure(side, [kit.chunk(0, version=2)], Status.FAILED_PRECONDITION, "TLKV-XFER-FORMAT")
    assert "KV_FORMAT_V2" in err.message and "KV_FORMAT_V1" in err.message


def test_v1_only_side_refuses_a_v2_envelope_labelled_v1(kit: Kit) -> None:
    side = DecodeSide(GEOMETRY, frozenset({1}))
    chunk = recrc(kit.chunk(0), kit.envelope(0, version=2))
    expect_failure(side, [chunk], Status.FAILED_PRECONDITION, "TLKV-READ-VERSION")


def test_unknown_envelope_version_is_failed_precondition(kit: Kit, side: DecodeSide) -> None:
    chunk = recrc(kit.chunk(0), raw_envelope(kit, version=3))
    expect_failure(side, [chunk], Status.FAILED_PRECONDITION, "TLKV-READ-VERSION")


def test_payload_over_4_mib_is_resource_exhausted(kit: Kit, side: DecodeSide) -> None:
    chunk = recrc(kit.chunk(0), bytes(MAX_CHUNK_PAYLOAD + 1))
    err = expect_failure(side, [chunk], Status.RESOURCE_EXHAUSTED, "TLKV-XFER-MAX-PAYLOAD")
    assert str(MAX_CHUNK_PAYLOAD + 1) in err.message


def test_payload_of_exactly_4_mib_is_judged_by_the_reader(kit: Kit, side: DecodeSide) -> None:
    # A valid header and CRC, but the length disagrees with the geometry: the length rule, not the size limit.
    filler = bytes(MAX_CHUNK_PAYLOAD - 28 - 12 - 4)
    payload = raw_envelope(kit, records=[(kit.hashes[0], 4, filler)])
    assert len(payload) == MAX_CHUNK_PAYLOAD
    expect_failure(side, [recrc(kit.chunk(0), payload)], Status.DATA_LOSS, "TLKV-READ-LENGTH")


def test_wrong_chunk_crc_is_data_loss(kit: Kit, side: DecodeSide) -> None:
    chunk = kit.chunk(0)
    bad = dataclasses.replace(chunk, crc32c=chunk.crc32c ^ 1)
    err = expect_failure(side, [bad], Status.DATA_LOSS, "TLKV-XFER-CRC")
    assert f"0x{chunk.crc32c ^ 1:08X}" in err.message and f"0x{chunk.crc32c:08X}" in err.message


def test_empty_payload_with_nonzero_crc_is_data_loss(kit: Kit, side: DecodeSide) -> None:
    push(side, [kit.chunk(0)])
    bad = dataclasses.replace(kit.chunk(0, empty=True), crc32c=0x12345678)
    expect_failure(side, [bad], Status.DATA_LOSS, "TLKV-XFER-CRC")


@pytest.mark.parametrize(("fields", "requirement"), [
    ({"magic": b"TLKW"}, "TLKV-READ-MAGIC"),
    ({"crc": 0xDEADBEEF}, "TLKV-READ-CRC"),
    ({"dtype": 3}, "TLKV-READ-DTYPE"),
    ({"n_blocks": 2}, "TLKV-READ-LENGTH"),  # header says 2, one record present
    ({"head_dim": 4, "records": [(0, 2, bytes(256))]}, "TLKV-READ-SHAPE"),
])
def test_reader_rules_are_data_loss_with_the_readers_requirement(
        kit: Kit, side: DecodeSide, fields: dict[str, object], requirement: str) -> None:
    i = 2 if "records" in fields else 0
    chunk = recrc(kit.chunk(i), raw_envelope(kit, i, **fields))
    expect_failure(side, [chunk], Status.DATA_LOSS, requirement)


@pytest.mark.parametrize(("n_tokens", "requirement"), [(0, "TLKV-READ-NTOKENS"), (5, "TLKV-READ-NTOKENS"),
                                                       (3, "TLKV-READ-HASH-FULL")])
def test_record_rules_are_data_loss(kit: Kit, side: DecodeSide, n_tokens: int, requirement: str) -> None:
    payload = kit.envelope(0)[28 + 12 : -4]
    chunk = recrc(kit.chunk(0), raw_envelope(kit, records=[(kit.hashes[0], n_tokens, payload)]))
    expect_failure(side, [chunk], Status.DATA_LOSS, requirement)


def test_truncated_envelope_is_data_loss(kit: Kit, side: DecodeSide) -> None:
    expect_failure(side, [recrc(kit.chunk(0), kit.envelope(0)[:31])], Status.DATA_LOSS, "TLKV-READ-LENGTH")


def test_envelope_version_must_match_kv_format(kit: Kit, side: DecodeSide) -> None:
    chunk = recrc(kit.chunk(0, version=1), kit.envelope(0, version=2))
    err = expect_failure(side, [chunk], Status.DATA_LOSS, "TLKV-XFER-FORMAT")
    assert err.field == "payload.version"


@pytest.mark.parametrize("n", [0, 2])
def test_envelope_must_hold_one_block(kit: Kit, side: DecodeSide, n: int) -> None:
    payload = kit.envelope(0)[28 + 12 : -4]
    records = [(kit.hashes[0], 4, payload), (kit.hashes[1], 4, payload)][:n]
    chunk = recrc(kit.chunk(0), raw_envelope(kit, records=records))
    err = expect_failure(side, [chunk], Status.INVALID_ARGUMENT, "TLKV-XFER-ONE-BLOCK")
    assert err.seen == n and err.expected == 1


@pytest.mark.parametrize("case", ["other-hash", "hash-on-tail", "zero-on-full"])
def test_chunk_hash_must_equal_the_records(kit: Kit, side: DecodeSide, case: str) -> None:
    i, chunk_hash = {"other-hash": (0, kit.hashes[1]), "hash-on-tail": (2, kit.hashes[1]),
                     "zero-on-full": (1, 0)}[case]
    chunk = dataclasses.replace(kit.chunk(i), block_hash=chunk_hash)
    expect_failure(side, [chunk], Status.INVALID_ARGUMENT, "TLKV-XFER-CHUNK-HASH")


def test_empty_payload_for_a_block_not_held_is_not_found(kit: Kit, side: DecodeSide) -> None:
    expect_failure(side, [kit.chunk(0, empty=True)], Status.NOT_FOUND, "TLKV-XFER-EMPTY-HELD")


def test_empty_payload_with_hash_zero_is_not_found(kit: Kit, side: DecodeSide) -> None:
    push(side, kit.chunks())
    expect_failure(side, [kit.chunk(2, empty=True)], Status.NOT_FOUND, "TLKV-XFER-EMPTY-HELD")


# -- atomicity ------------------------------------------------------------------------------------


def pool_state(side: DecodeSide, request_ids: list[str]) -> tuple[PoolStats, list[object]]:
    pool = side.pool
    return pool.stats(), [(pool.request_refs(r), len(pool.partial_blocks(r))) for r in request_ids]


def test_a_failed_stream_stores_nothing_and_takes_no_reference(kit: Kit, side: DecodeSide) -> None:
    push(side, [kit.chunk(0, request_id="a")])
    before = pool_state(side, ["a", "b"])
    bad = dataclasses.replace(kit.chunk(2, request_id="b"), crc32c=0)
    expect_failure(side, [kit.chunk(0, request_id="b", empty=True), kit.chunk(1, request_id="b"), bad],
                   Status.DATA_LOSS, "TLKV-XFER-CRC")
    assert pool_state(side, ["a", "b"]) == before
    assert side.has_blocks([kit.hashes[1]]) == [False]
    assert side.pool.get(kit.hashes[0]).refs == 1  # type: ignore[union-attr]


def test_an_abandoned_stream_stores_nothing(kit: Kit, side: DecodeSide) -> None:
    stream = side.begin_push()
    stream.receive(kit.chunk(0))
    stream.receive(kit.chunk(1))
    assert side.has_blocks(kit.hashes[:2]) == [False, False]  # not visible before finish
    stream.fail()
    stream.fail()  # idempotent
    assert side.pool.stats() == PoolStats(0, 0, 0, 0, 0)
    with pytest.raises(RuntimeError):
        stream.finish()


def test_a_failed_stream_accepts_nothing_more(kit: Kit, side: DecodeSide) -> None:
    stream: PushStream = side.begin_push()
    with pytest.raises(TransferError):
        stream.receive(kit.chunk(0, empty=True))
    with pytest.raises(RuntimeError):
        stream.receive(kit.chunk(0))
    with pytest.raises(RuntimeError):
        stream.finish()


def test_a_reference_released_mid_stream_fails_at_finish(kit: Kit, side: DecodeSide) -> None:
    push(side, [kit.chunk(0, request_id="a")])
    stream = side.begin_push()
    stream.receive(kit.chunk(0, request_id="b", empty=True))
    stream.receive(kit.chunk(2, request_id="b"))
    side.release("a")
    with pytest.raises(TransferError) as info:
        stream.finish()
    assert (info.value.status, info.value.requirement) == (Status.NOT_FOUND, "TLKV-XFER-EMPTY-HELD")
    assert side.pool.stats() == PoolStats(0, 0, 0, 0, 0)


# -- odds and ends --------------------------------------------------------------------------------


def test_malformed_protobuf_is_invalid_argument() -> None:
    with pytest.raises(TransferError) as info:
        decode_chunk(b"\x0a\x05ab")  # field 1 claims 5 bytes, 2 follow
    assert info.value.status is Status.INVALID_ARGUMENT and "TLKV-XFER-PROTO" in info.value.message


def test_decode_chunk_round_trips_unknown_enum_values(kit: Kit) -> None:
    chunk = dataclasses.replace(kit.chunk(1), kv_format=9)
    assert decode_chunk(chunk.encode()) == chunk
    assert Chunk.from_pb(pb.KvChunk.FromString(chunk.to_pb().SerializeToString())) == chunk


def test_status_names_are_grpcs() -> None:
    grpc = pytest.importorskip("grpc")
    assert {s.name: s.value for s in Status} == {c.name: c.value[0] for c in grpc.StatusCode}


def test_side_checks_its_arguments() -> None:
    with pytest.raises(ValueError, match="versions"):
        DecodeSide(GEOMETRY, frozenset({3}))
    with pytest.raises(ValueError, match="versions"):
        DecodeSide(GEOMETRY, frozenset())
    from kvconform.tlkv.pool import BlockPool
    with pytest.raises(ValueError, match="geometry"):
        DecodeSide(GEOMETRY, frozenset({1}), BlockPool(Geometry(16, 2, 2, 8)))
