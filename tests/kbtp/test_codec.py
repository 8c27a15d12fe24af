"""KBTP codec: the text's examples byte for byte, round trips, ADDR_LE placement, and every decode rule."""

from __future__ import annotations

import dataclasses
import struct
from collections.abc import Callable

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from kvconform.kbtp.constants import (
    HEADER_SIZE,
    EntryFlags,
    Features,
    GoodbyeFlags,
    Opcode,
    RequestFlags,
    Status,
)
from kvconform.kbtp.messages import (
    AllocStore,
    Bind,
    Completion,
    CompletionDescriptor,
    CompletionRecord,
    DataDescriptor,
    DirectAlloc,
    DirectDescriptor,
    DirectLoad,
    Free,
    Goodbye,
    Hello,
    HelloAck,
    KbtpDecodeError,
    KbtpEncodeError,
    Load,
    Message,
    Store,
    TableEntry,
    decode,
)
from kvconform.kbtp.vectors import SPEC_ALLOC_STORE, SPEC_COMPLETION
from tests.kbtp.strategies import messages


def test_spec_alloc_store_example() -> None:
    msg = decode(SPEC_ALLOC_STORE)
    assert len(SPEC_ALLOC_STORE) == 48
    assert isinstance(msg, AllocStore)
    assert (msg.request_id, msg.handle, msg.flags, msg.generation, msg.status) == (7, 0x4001, RequestFlags.INLINE, 0, 0)
    assert msg.data == DataDescriptor(0, 0, 8) and msg.inline == b"KVBLOCK!" and msg.completion is None
    assert AllocStore.with_inline(b"KVBLOCK!", request_id=7, handle=0x4001).encode() == SPEC_ALLOC_STORE


def test_spec_completion_example() -> None:
    msg = decode(SPEC_COMPLETION)
    assert len(SPEC_COMPLETION) == 40
    assert msg == Completion(request_id=7, handle=0x4001, generation=5, status=Status.OK, data_length=8,
                             block_offset=0x150000)
    assert msg.block_offset == 42 * 32 * 1024  # "block 42 of a pool of 32 KiB blocks"
    assert msg.encode() == SPEC_COMPLETION


@settings(max_examples=400, deadline=None)
@given(messages, st.booleans())
def test_round_trip(msg: Message, addr_le: bool) -> None:
    data = msg.encode(addr_le=addr_le)
    assert data == msg.encode_raw(addr_le=addr_le)
    assert decode(data, addr_le=addr_le) == msg
    assert type(decode(data, addr_le=addr_le)) is type(msg)


@settings(max_examples=300, deadline=None)
@given(messages, st.booleans(), st.data())
def test_every_truncation_is_rejected(msg: Message, addr_le: bool, data: st.DataObject) -> None:
    raw = msg.encode(addr_le=addr_le)
    cut = data.draw(st.integers(0, len(raw) - 1))
    with pytest.raises(KbtpDecodeError) as info:
        decode(raw[:cut], addr_le=addr_le)
    assert info.value.status is Status.MALFORMED
    assert (info.value.header is None) == (cut < HEADER_SIZE)


@settings(max_examples=300, deadline=None)
@given(messages, st.booleans(), st.binary(min_size=1, max_size=8))
def test_trailing_octets_are_rejected(msg: Message, addr_le: bool, extra: bytes) -> None:
    with pytest.raises(KbtpDecodeError) as info:
        decode(msg.encode(addr_le=addr_le) + extra, addr_le=addr_le)
    inline = isinstance(msg, Store | AllocStore) and msg.inline is not None
    assert info.value.field == ("data.length" if inline else "body")


@settings(max_examples=500, deadline=None)
@given(st.binary(min_size=0, max_size=200), st.booleans())
@example(SPEC_ALLOC_STORE, False)
def test_decode_accepts_only_what_it_reencodes(data: bytes, addr_le: bool) -> None:
    """Arbitrary bytes either fail with KbtpDecodeError or decode to a message whose raw encoding is them."""
    try:
        msg = decode(data, addr_le=addr_le)
    except KbtpDecodeError as exc:
        assert exc.requirement.startswith("KBTP-") and 0 <= exc.offset <= len(data)
        return
    assert msg.encode_raw(addr_le=addr_le) == data


def test_addr_le_places_handle_and_descriptor_fields_little_endian() -> None:
    load = Load(request_id=0x0102030405060708, handle=0x1122334455667788, flags=RequestFlags.RECORD,
                data=DataDescriptor(0xA1A2A3A4, 0xB1B2B3B4B5B6B7B8, 0xC1C2C3C4),
                completion=CompletionDescriptor(0xD1D2D3D4, 0xE1E2E3E4E5E6E7E8, 0))
    be, le = load.encode(), load.encode(addr_le=True)
    assert be[:12] == le[:12]  # Version, Opcode, Flags, Request ID stay in network order
    assert le[12:20] == struct.pack("<Q", 0x1122334455667788) and be[12:20] == struct.pack(">Q", 0x1122334455667788)
    assert le[24:40] == struct.pack("<IQI", 0xA1A2A3A4, 0xB1B2B3B4B5B6B7B8, 0xC1C2C3C4)
    assert le[40:56] == struct.pack("<IQ", 0xD1D2D3D4, 0xE1E2E3E4E5E6E7E8) + bytes(4)
    bind = Bind(handle=0x1122, ticket=3, data_length=4, block_offset=0x150000)
    assert bind.encode(addr_le=True)[12:20] == struct.pack("<Q", 0x1122)
    assert bind.encode(addr_le=True)[24:] == bind.encode()[24:]  # BIND's body is not an ADDR_LE field
    completion = Completion(handle=0x1122, data_length=1, block_offset=2)
    assert completion.encode(addr_le=True) == completion.encode()  # target messages keep network order


# ---- every decode rule: a valid message with one field changed ---------------------------------

LOAD = Load(request_id=9, handle=0x4001, data=DataDescriptor(1, 2, 3))
STORE = Store.with_inline(b"abcd", request_id=9, handle=0x4001)
RECORD_LOAD = dataclasses.replace(LOAD, flags=RequestFlags.RECORD, completion=CompletionDescriptor(5, 6))
ACK = HelloAck(features=Features.DIRECT_ALLOC, block_size=32768, allocation_quota=4, direct_alloc=DirectAlloc(
    DirectDescriptor(1, 0, 4), DirectDescriptor(2, 0, 8), DirectDescriptor(3, 0x40, 1)))


def _patch(data: bytes, offset: int, fmt: str, value: int) -> bytes:
    out = bytearray(data)
    struct.pack_into(fmt, out, offset, value)
    return bytes(out)


# (name, bytes, field, offset, requirement)
REJECTIONS: list[tuple[str, Callable[[], bytes], str, int, str]] = [
    ("short header", lambda: LOAD.encode()[:23], "header", 23, "KBTP-HDR-LAYOUT"),
    ("version 2", lambda: _patch(LOAD.encode(), 0, ">B", 2), "version", 0, "KBTP-HDR-VERSION"),
    ("version 0", lambda: _patch(LOAD.encode(), 0, ">B", 0), "version", 0, "KBTP-HDR-VERSION"),
    ("unknown opcode", lambda: _patch(LOAD.encode(), 1, ">B", 0x15), "opcode", 1, "KBTP-OPCODES"),
    ("private-use opcode", lambda: _patch(LOAD.encode(), 1, ">B", 0xC0), "opcode", 1, "KBTP-OPCODES"),
    ("undefined request flag", lambda: _patch(LOAD.encode(), 2, ">H", 0x0020), "flags", 2, "KBTP-FLAGS"),
    ("flag on BIND", lambda: Bind(flags=1).encode_raw(), "flags", 2, "KBTP-FLAGS"),
    ("flag on COMPLETION", lambda: Completion(flags=4).encode_raw(), "flags", 2, "KBTP-FLAGS"),
    ("request flag on GOODBYE", lambda: Goodbye(flags=2).encode_raw(), "flags", 2, "KBTP-FLAGS"),
    ("status in a request", lambda: dataclasses.replace(LOAD, status=1).encode_raw(), "status", 22,
     "KBTP-HDR-STATUS-ZERO"),
    ("status in BIND", lambda: Bind(status=9).encode_raw(), "status", 22, "KBTP-HDR-STATUS-ZERO"),
    ("status in HELLO", lambda: Hello(status=1).encode_raw(), "status", 22, "KBTP-HELLO-HEADER-ZERO"),
    ("request id in HELLO", lambda: Hello(request_id=1).encode_raw(), "request_id", 4, "KBTP-HELLO-HEADER-ZERO"),
    ("handle in HELLO_ACK", lambda: dataclasses.replace(ACK, handle=1).encode_raw(), "handle", 12,
     "KBTP-HELLO-HEADER-ZERO"),
    ("generation in HELLO", lambda: Hello(generation=1).encode_raw(), "generation", 20, "KBTP-HELLO-HEADER-ZERO"),
    ("HELLO body short", lambda: Hello().encode_raw()[:-1], "body", 24, "KBTP-HELLO-LAYOUT"),
    ("HELLO Initiator ID of 17 octets", lambda: Hello(initiator_id=bytes(17)).encode_raw(), "body", 24,
     "KBTP-HELLO-LAYOUT"),
    ("LOAD without its Data Descriptor", lambda: LOAD.encode()[:24], "body", 24, "KBTP-BODY-LAYOUT"),
    ("LOAD with INLINE", lambda: _patch(LOAD.encode(), 2, ">H", RequestFlags.INLINE), "flags", 2,
     "KBTP-BODY-LAYOUT"),
    ("FREE with INLINE", lambda: Free(flags=RequestFlags.INLINE).encode_raw(), "flags", 2, "KBTP-BODY-LAYOUT"),
    ("RECORD without a Completion Descriptor", lambda: _patch(LOAD.encode(), 2, ">H", RequestFlags.RECORD),
     "completion", 40, "KBTP-FLAG-RECORD"),
    ("FREE with RECORD but no descriptor", lambda: Free(flags=RequestFlags.RECORD).encode_raw(), "completion",
     24, "KBTP-FLAG-RECORD"),
    ("Completion Descriptor without RECORD", lambda: _patch(RECORD_LOAD.encode(), 2, ">H", 0), "body", 24,
     "KBTP-BODY-LAYOUT"),
    ("INLINE with a non-zero STag", lambda: _patch(STORE.encode(), 24, ">I", 7), "data.stag", 24,
     "KBTP-DESC-INLINE"),
    ("INLINE with a non-zero Tagged Offset", lambda: _patch(STORE.encode(), 28, ">Q", 7), "data.tagged_offset",
     28, "KBTP-DESC-INLINE"),
    ("INLINE Length larger than the data", lambda: _patch(STORE.encode(), 36, ">I", 5), "data.length", 36,
     "KBTP-DESC-INLINE"),
    ("INLINE Length smaller than the data", lambda: _patch(STORE.encode(), 36, ">I", 3), "data.length", 36,
     "KBTP-DESC-INLINE"),
    ("STORE without INLINE followed by data", lambda: _patch(STORE.encode(), 2, ">H", 0), "body", 24,
     "KBTP-BODY-LAYOUT"),
    ("BIND body short", lambda: Bind().encode_raw()[:-8], "body", 24, "KBTP-BIND-LAYOUT"),
    ("COMPLETION body long", lambda: Completion().encode_raw() + bytes(4), "body", 24, "KBTP-COMPLETION-LAYOUT"),
    ("GOODBYE with a body", lambda: Goodbye().encode_raw() + bytes(1), "body", 24, "KBTP-BODY-LAYOUT"),
    ("HELLO_ACK without the Target Descriptor", lambda: ACK.encode_raw()[:40], "body", 24, "KBTP-ACK-LAYOUT"),
    ("HELLO_ACK DIRECT_ALLOC descriptors missing", lambda: ACK.encode_raw()[:-48], "body", 56, "KBTP-ACK-LAYOUT"),
    ("HELLO_ACK DIRECT_LOAD announced, not present", lambda: _patch(ACK.encode_raw(), 24, ">H", 3), "body", 56,
     "KBTP-ACK-LAYOUT"),
    ("HELLO_ACK descriptors without their feature", lambda: _patch(ACK.encode_raw(), 24, ">H", 0), "body", 56,
     "KBTP-ACK-LAYOUT"),
    ("Head Tagged Offset not a multiple of 8", lambda: _patch(ACK.encode_raw(), 56 + 32 + 4, ">Q", 0x44),
     "direct_alloc.head.tagged_offset", 92, "KBTP-ACK-HEAD-ALIGN"),
    ("Head Count 2", lambda: _patch(ACK.encode_raw(), 56 + 32 + 12, ">I", 2), "direct_alloc.head.count", 100,
     "KBTP-ACK-DALLOC-DESC"),
    ("Partition Count not the quota", lambda: _patch(ACK.encode_raw(), 56 + 12, ">I", 5),
     "direct_alloc.partition.count", 68, "KBTP-ACK-DALLOC-DESC"),
    ("Ring Count not a power of two", lambda: _patch(ACK.encode_raw(), 56 + 16 + 12, ">I", 6),
     "direct_alloc.ring.count", 84, "KBTP-RING-SIZE"),
    ("Ring Count smaller than the partition", lambda: _patch(ACK.encode_raw(), 56 + 16 + 12, ">I", 2),
     "direct_alloc.ring.count", 84, "KBTP-RING-SIZE"),
]


@pytest.mark.parametrize(("data", "field", "offset", "requirement"),
                         [pytest.param(*r[1:], id=r[0]) for r in REJECTIONS])
def test_decode_rule(data: Callable[[], bytes], field: str, offset: int, requirement: str) -> None:
    with pytest.raises(KbtpDecodeError) as info:
        decode(data())
    err = info.value
    assert (err.field, err.offset, err.requirement) == (field, offset, requirement), str(err)
    assert field in str(err) and str(offset) in str(err) and requirement in str(err)
    if offset >= HEADER_SIZE or field not in ("header",):
        assert err.header is not None or field == "header"


def test_every_rejection_is_preceded_by_an_accepted_original() -> None:
    """The bases of the rejection table are themselves valid, so each row changes exactly one thing."""
    for msg in (LOAD, STORE, RECORD_LOAD, ACK, Hello(), Bind(), Completion(), Goodbye(), Free()):
        assert decode(msg.encode()) == msg


def test_malformed_request_keeps_its_header_for_the_completion() -> None:
    with pytest.raises(KbtpDecodeError) as info:
        decode(_patch(STORE.encode(), 36, ">I", 99))
    assert info.value.header is not None
    assert (info.value.header.request_id, info.value.header.handle) == (9, 0x4001)
    assert info.value.status is Status.MALFORMED


CHECKED_REFUSALS: list[tuple[str, Message, str, str]] = [
    ("RECORD without descriptor", dataclasses.replace(LOAD, flags=RequestFlags.RECORD), "completion",
     "KBTP-FLAG-RECORD"),
    ("descriptor without RECORD", dataclasses.replace(LOAD, completion=CompletionDescriptor(1, 2)), "completion",
     "KBTP-FLAG-RECORD"),
    ("inline without INLINE", dataclasses.replace(STORE, flags=0), "inline", "KBTP-DESC-INLINE"),
    ("INLINE Length disagrees", dataclasses.replace(STORE, data=DataDescriptor(0, 0, 9)), "data.length",
     "KBTP-DESC-INLINE"),
    ("status in a request", dataclasses.replace(LOAD, status=Status.INTERNAL), "status", "KBTP-HDR-STATUS-ZERO"),
    ("version 0", dataclasses.replace(LOAD, version=0), "version", "KBTP-HDR-VERSION"),
    ("undefined flag", Goodbye(flags=GoodbyeFlags.RELEASE | 0x8000), "flags", "KBTP-FLAGS"),
    ("direct_load without DIRECT_LOAD", dataclasses.replace(ACK, direct_load=DirectLoad(
        DirectDescriptor(0, 0, 0), 0, DirectDescriptor(0, 0, 0))), "direct_load", "KBTP-ACK-LAYOUT"),
    ("misaligned Head", dataclasses.replace(ACK, direct_alloc=DirectAlloc(
        DirectDescriptor(1, 0, 4), DirectDescriptor(2, 0, 8), DirectDescriptor(3, 4, 1))),
     "direct_alloc.head.tagged_offset", "KBTP-ACK-HEAD-ALIGN"),
    ("request id in HELLO", Hello(request_id=3), "request_id", "KBTP-HELLO-HEADER-ZERO"),
]


@pytest.mark.parametrize(("msg", "field", "requirement"), [pytest.param(*r[1:], id=r[0]) for r in CHECKED_REFUSALS])
def test_checked_encode_refuses(msg: Message, field: str, requirement: str) -> None:
    with pytest.raises(KbtpEncodeError) as info:
        msg.encode()
    assert (info.value.field, info.value.requirement) == (field, requirement), str(info.value)
    msg.encode_raw()  # the raw path writes it all the same


def test_raw_encode_writes_exactly_the_fields_given() -> None:
    raw = dataclasses.replace(LOAD, version=7, status=3, flags=0x8000).encode_raw(opcode=0xEE)
    assert raw[:4] == bytes([7, 0xEE, 0x80, 0x00]) and raw[22:24] == b"\x00\x03"
    assert len(raw) == HEADER_SIZE + 16
    with pytest.raises(KbtpEncodeError) as info:
        dataclasses.replace(LOAD, generation=1 << 16).encode()
    assert info.value.field == "generation"


def test_unknown_status_in_completion_is_kept_as_a_number() -> None:
    msg = decode(Completion(status=0xC001).encode())
    assert msg.status == 0xC001 and not isinstance(msg.status, Status)
    assert decode(Completion(status=11).encode()).status is Status.TICKET_ABANDONED


def test_opcode_classes_match_the_registry() -> None:
    classes = (Hello, HelloAck, Load, Store, AllocStore, Free, Bind, Completion, Goodbye)
    assert sorted(c.OPCODE for c in classes) == sorted(Opcode)


@given(st.integers(0, 0xFFFF), st.integers(1, 0xFFFF), st.integers(0, 0xFFFF_FFFF),
       st.integers(0, 0xFFFF_FFFF_FFFF_FFFF), st.booleans())
def test_table_entry_round_trip(flags: int, generation: int, length: int, offset: int, addr_le: bool) -> None:
    entry = TableEntry(flags, generation, length, offset)
    data = entry.pack(addr_le)
    assert len(data) == 16 and TableEntry.unpack(data, 0, addr_le) == entry
    assert data[8:] == struct.pack("<Q" if addr_le else ">Q", offset)  # only the Block Offset follows ADDR_LE


def test_table_entry_rules() -> None:
    entry = TableEntry(EntryFlags.VALID | EntryFlags.SEALED, 1, 8, 0x150000)
    assert entry.pack()[:4] == b"\x00\x03\x00\x01"
    with pytest.raises(KbtpDecodeError) as info:
        TableEntry.unpack(TableEntry(1, 0, 8, 0).pack())
    assert (info.value.field, info.value.offset, info.value.requirement) == ("generation", 2, "KBTP-GEN-NONZERO")
    with pytest.raises(KbtpDecodeError) as info:
        TableEntry.unpack(entry.pack()[:15])
    assert info.value.requirement == "KBTP-TABLE-LAYOUT"


def test_completion_record_layout() -> None:
    record = CompletionRecord(7, Status.OK, 5, 8, 0x150000)
    data = record.pack()
    assert data == bytes.fromhex("0000000000000007" "0000" "0005" "00000008" "0000000000150000")
    assert CompletionRecord.unpack(data) == record
    with pytest.raises(KbtpDecodeError) as info:
        CompletionRecord.unpack(data[:23])
    assert info.value.requirement == "KBTP-COMP-RECORD"
