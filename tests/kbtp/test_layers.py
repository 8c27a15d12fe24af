"""KBTP scapy layers: dissection equals the codec's decode, rebuilds byte-identically, never raises."""

from __future__ import annotations

import struct

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st
from scapy.packet import Raw

from kvconform.kbtp.constants import Features, Opcode, RequestFlags
from kvconform.kbtp.layers import (
    KBTP,
    KBTPAddrLE,
    KBTPAllocStore,
    KBTPCompletion,
    KBTPGoodbye,
    KBTPHelloAck,
    KBTPLoad,
    craft,
    dissect,
    to_message,
)
from kvconform.kbtp.messages import (
    AllocStore,
    CompletionDescriptor,
    DataDescriptor,
    DirectAlloc,
    DirectDescriptor,
    DirectLoad,
    Goodbye,
    HelloAck,
    KbtpDecodeError,
    Load,
    Message,
    Store,
    decode,
)
from kvconform.kbtp.vectors import SPEC_ALLOC_STORE, SPEC_COMPLETION
from tests.kbtp.strategies import messages


def test_dissect_spec_examples() -> None:
    pkt = dissect(SPEC_ALLOC_STORE)
    body = pkt[KBTPAllocStore]
    assert (pkt.version, pkt.opcode, pkt.flags, pkt.request_id, pkt.handle) == (1, Opcode.ALLOC_STORE, 1, 7, 0x4001)
    assert (body.data_stag, body.data_tagged_offset, body.data_length, body.inline) == (0, 0, 8, b"KVBLOCK!")
    comp = dissect(SPEC_COMPLETION)[KBTPCompletion]
    assert (comp.data_length, comp.reserved, comp.block_offset) == (8, 0, 0x150000)
    assert to_message(dissect(SPEC_COMPLETION)) == decode(SPEC_COMPLETION)


def test_layers_compute_opcode_and_inline_length() -> None:
    built = KBTP(flags=RequestFlags.INLINE, request_id=7, handle=0x4001) / KBTPAllocStore(inline=b"KVBLOCK!")
    assert bytes(built) == SPEC_ALLOC_STORE
    assert bytes(KBTP() / KBTPGoodbye()) == Goodbye().encode()
    with pytest.raises(ValueError, match="opcode"):
        bytes(KBTP())


def test_addr_le_layers_build_what_the_codec_encodes() -> None:
    load = Load(request_id=3, handle=0x1122334455667788, flags=RequestFlags.RECORD,
                data=DataDescriptor(0xA1A2A3A4, 0xB1B2B3B4B5B6B7B8, 4096), completion=CompletionDescriptor(9, 0x40))
    built = KBTPAddrLE(flags=RequestFlags.RECORD, request_id=3, handle=0x1122334455667788) / KBTPLoad(
        data_stag=0xA1A2A3A4, data_tagged_offset=0xB1B2B3B4B5B6B7B8, data_length=4096, cd_stag=9,
        cd_tagged_offset=0x40)
    assert bytes(built) == load.encode(addr_le=True)
    assert to_message(dissect(load.encode(addr_le=True), addr_le=True)) == load
    # the same bytes read in network order give a different handle: the byte order is the session's
    assert to_message(dissect(load.encode(addr_le=True))).handle != load.handle


def test_hello_ack_direct_descriptors() -> None:
    ack = HelloAck(features=Features.DIRECT_LOAD | Features.DIRECT_ALLOC | Features.ADDR_LE, block_size=32768,
                   allocation_quota=4,
                   direct_load=DirectLoad(DirectDescriptor(1, 0x1000, 64), 0x4000, DirectDescriptor(2, 0, 16)),
                   direct_alloc=DirectAlloc(DirectDescriptor(3, 0, 4), DirectDescriptor(4, 0, 4),
                                            DirectDescriptor(5, 8, 1)))
    pkt = dissect(ack.encode())
    body = pkt[KBTPHelloAck]
    assert (body.table_count, body.table_base_handle, body.pool_count) == (64, 0x4000, 16)
    assert (body.partition_count, body.ring_count, body.head_tagged_offset, body.head_count) == (4, 4, 8, 1)
    assert to_message(pkt) == ack
    plain = dissect(HelloAck(block_size=1).encode())[KBTPHelloAck]
    assert "table_stag" not in plain.fields and bytes(plain) == HelloAck(block_size=1).encode()[24:]


@settings(max_examples=400, deadline=None)
@given(messages, st.booleans())
def test_dissect_equals_decode(msg: Message, addr_le: bool) -> None:
    data = msg.encode(addr_le=addr_le)
    pkt = dissect(data, addr_le=addr_le)
    assert bytes(pkt) == data
    assert to_message(pkt) == decode(data, addr_le=addr_le) == msg


@settings(max_examples=500, deadline=None)
@given(st.binary(max_size=160), st.booleans())
@example(b"", False)
@example(SPEC_ALLOC_STORE[:30], False)
@example(SPEC_ALLOC_STORE[:24], True)  # a header whose body is missing entirely
@example(bytes.fromhex("0113000400000000000000010000000000000002" "00000000"), False)  # FREE, RECORD, no descriptor
@example(bytes.fromhex("0130000000000000000000010000000000000002" "00000000"), False)  # GOODBYE
@example(b"\x01\x77" + SPEC_ALLOC_STORE[2:], False)
def test_dissect_never_raises_and_rebuilds(data: bytes, addr_le: bool) -> None:
    pkt = dissect(data, addr_le=addr_le)
    assert bytes(pkt) == data
    try:
        expected = decode(data, addr_le=addr_le)
    except KbtpDecodeError:
        return
    assert to_message(pkt) == expected


def test_short_and_unknown_messages_keep_their_bytes() -> None:
    short = dissect(SPEC_ALLOC_STORE[:30])
    assert isinstance(short[KBTPAllocStore].payload, Raw)
    with pytest.raises(ValueError, match="no complete"):
        to_message(short)
    unknown = dissect(b"\x01\x77" + SPEC_ALLOC_STORE[2:])
    assert isinstance(unknown.payload, Raw) and bytes(unknown) == b"\x01\x77" + SPEC_ALLOC_STORE[2:]


STORE = Store.with_inline(b"abcd", request_id=9, handle=0x4001)


def _changed(a: bytes, b: bytes) -> set[int]:
    return {i for i, (x, y) in enumerate(zip(a, b, strict=True)) if x != y}


def test_craft_changes_exactly_the_overridden_field() -> None:
    base = STORE.encode()
    bad = craft(STORE, data_length=5)
    assert _changed(base, bad) == {39} and struct.unpack_from(">I", bad, 36)[0] == 5
    with pytest.raises(KbtpDecodeError) as info:
        decode(bad)
    assert (info.value.field, info.value.requirement) == ("data.length", "KBTP-DESC-INLINE")
    assert decode(craft(STORE)) == STORE
    assert _changed(base, craft(STORE, version=2)) == {0}
    assert decode(craft(STORE, inline=b"abcdefgh", data_length=None)) == Store.with_inline(
        b"abcdefgh", request_id=9, handle=0x4001)


def test_craft_flag_override_adds_the_conditional_descriptor() -> None:
    load = Load(request_id=1, handle=2, data=DataDescriptor(1, 2, 3))
    data = craft(load, flags=RequestFlags.RECORD)
    assert len(data) == len(load.encode()) + 16
    assert decode(data) == Load(request_id=1, handle=2, flags=RequestFlags.RECORD, data=DataDescriptor(1, 2, 3),
                                completion=CompletionDescriptor(0, 0))


def test_craft_in_addr_le_and_unknown_keys() -> None:
    alloc = AllocStore.with_inline(b"x", request_id=1, handle=0x0102)
    data = craft(alloc, addr_le=True, handle=0x0304)
    assert data[12:20] == struct.pack("<Q", 0x0304)
    assert decode(data, addr_le=True) == AllocStore.with_inline(b"x", request_id=1, handle=0x0304)
    with pytest.raises(KeyError, match="nonsense"):
        craft(alloc, nonsense=1)
