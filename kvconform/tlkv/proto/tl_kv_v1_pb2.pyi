from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class KvFormat(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    KV_FORMAT_UNSPECIFIED: _ClassVar[KvFormat]
    KV_FORMAT_V1: _ClassVar[KvFormat]
    KV_FORMAT_V2: _ClassVar[KvFormat]
KV_FORMAT_UNSPECIFIED: KvFormat
KV_FORMAT_V1: KvFormat
KV_FORMAT_V2: KvFormat

class HasBlocksRequest(_message.Message):
    __slots__ = ("block_hashes",)
    BLOCK_HASHES_FIELD_NUMBER: _ClassVar[int]
    block_hashes: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, block_hashes: _Optional[_Iterable[int]] = ...) -> None: ...

class HasBlocksResponse(_message.Message):
    __slots__ = ("held",)
    HELD_FIELD_NUMBER: _ClassVar[int]
    held: _containers.RepeatedScalarFieldContainer[bool]
    def __init__(self, held: _Optional[_Iterable[bool]] = ...) -> None: ...

class KvChunk(_message.Message):
    __slots__ = ("request_id", "block_index", "block_hash", "kv_format", "payload", "crc32c")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    BLOCK_INDEX_FIELD_NUMBER: _ClassVar[int]
    BLOCK_HASH_FIELD_NUMBER: _ClassVar[int]
    KV_FORMAT_FIELD_NUMBER: _ClassVar[int]
    PAYLOAD_FIELD_NUMBER: _ClassVar[int]
    CRC32C_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    block_index: int
    block_hash: int
    kv_format: KvFormat
    payload: bytes
    crc32c: int
    def __init__(self, request_id: _Optional[str] = ..., block_index: _Optional[int] = ..., block_hash: _Optional[int] = ..., kv_format: _Optional[_Union[KvFormat, str]] = ..., payload: _Optional[bytes] = ..., crc32c: _Optional[int] = ...) -> None: ...

class PushKvResponse(_message.Message):
    __slots__ = ("blocks_stored", "blocks_reused", "payload_bytes")
    BLOCKS_STORED_FIELD_NUMBER: _ClassVar[int]
    BLOCKS_REUSED_FIELD_NUMBER: _ClassVar[int]
    PAYLOAD_BYTES_FIELD_NUMBER: _ClassVar[int]
    blocks_stored: int
    blocks_reused: int
    payload_bytes: int
    def __init__(self, blocks_stored: _Optional[int] = ..., blocks_reused: _Optional[int] = ..., payload_bytes: _Optional[int] = ...) -> None: ...
