"""The committed tl.kv.v1 pb2 files are what grpcio-tools generates from the committed .proto."""

from __future__ import annotations

import pytest

from kvconform.tlkv.proto import tl_kv_v1_pb2 as pb


def test_committed_pb2_files_equal_a_fresh_generation() -> None:
    pytest.importorskip("grpc_tools", reason="grpcio-tools not installed")
    from kvconform.tlkv.proto.generate import stale_outputs

    assert stale_outputs() == [], "run: python -m kvconform.tlkv.proto.generate"


def test_field_numbers_and_types_are_the_issues() -> None:
    fields = {f.name: (f.number, f.type) for f in pb.KvChunk.DESCRIPTOR.fields}
    d = pb.KvChunk.DESCRIPTOR.fields[0]
    assert fields == {
        "request_id": (1, d.TYPE_STRING), "block_index": (2, d.TYPE_UINT32), "block_hash": (3, d.TYPE_FIXED64),
        "kv_format": (4, d.TYPE_ENUM), "payload": (5, d.TYPE_BYTES), "crc32c": (6, d.TYPE_FIXED32),
    }
    assert {f.name: f.number for f in pb.PushKvResponse.DESCRIPTOR.fields} == {
        "blocks_stored": 1, "blocks_reused": 2, "payload_bytes": 3}
    assert pb.HasBlocksRequest.DESCRIPTOR.fields[0].type == d.TYPE_FIXED64
    assert dict(pb.KvFormat.items()) == {"KV_FORMAT_UNSPECIFIED": 0, "KV_FORMAT_V1": 1, "KV_FORMAT_V2": 2}
    service = pb.DESCRIPTOR.services_by_name["KvTransfer"]
    assert service.full_name == "tl.kv.v1.KvTransfer"
    push = service.methods_by_name["PushKv"]
    assert push.client_streaming and not push.server_streaming
    assert push.input_type.full_name == "tl.kv.v1.KvChunk"


def test_wire_bytes_of_a_chunk() -> None:
    # fixed64 block_hash is tag 0x19 + 8 little-endian bytes; fixed32 crc32c is tag 0x35 + 4 bytes.
    msg = pb.KvChunk(block_hash=0x0102030405060708, crc32c=0xAABBCCDD)
    assert msg.SerializeToString() == bytes.fromhex("19 0807060504030201 35 ddccbbaa")
