"""KBTP parsers a target reaches: its messages (one Send payload) and what an initiator reads from the
target's memory by RDMA: table entries, completion records, ring slots and FetchAdd counters (KBTP
"Messages", "Block Table", "Free-Block Ring", "Completion Records")."""

from __future__ import annotations

import struct
from collections.abc import Callable, Iterator
from typing import Any

from kvconform.fuzz.target import FuzzTarget, IntField, OracleError
from kvconform.kbtp.constants import COMPLETION_RECORD_SIZE, RING_SLOT_SIZE, TABLE_ENTRY_SIZE, EntryFlags, Status
from kvconform.kbtp.messages import CompletionRecord, KbtpDecodeError, TableEntry, decode
from kvconform.kbtp.ring import RingError, RingLayout, RingSlot
from kvconform.testvectors import load_vectors

__all__ = ["TARGETS"]

# Common header: Version, Opcode, Flags, Request ID, Block Handle, Generation, Status; then the first
# descriptor's STag, Tagged Offset and Length (or HELLO_ACK's Features and credits).
_HEADER_FIELDS = (IntField(0, 1), IntField(1, 1), IntField(2, 2), IntField(4, 8), IntField(12, 8), IntField(20, 2),
                  IntField(22, 2), IntField(24, 4), IntField(28, 8), IntField(36, 4), IntField(24, 2),
                  IntField(26, 2), IntField(40, 4), IntField(44, 4), IntField(48, 4))
_OPCODES = tuple(bytes([op]) for op in (0x01, 0x02, 0x10, 0x11, 0x12, 0x13, 0x14, 0x20, 0x30))


def decode_message(data: bytes) -> object:
    """``decode`` in both byte orders of ADDR_LE; a decoded message re-encodes (raw path) to the same bytes."""
    out = []
    for addr_le in (False, True):
        msg = decode(data, addr_le=addr_le)
        if msg.encode_raw(addr_le=addr_le) != data:
            raise OracleError(f"{type(msg).__name__} decoded (addr_le={addr_le}) from {data.hex()} re-encodes "
                              f"as {msg.encode_raw(addr_le=addr_le).hex()}")
        out.append(msg)
    return out


def message_seeds() -> Iterator[bytes]:
    for case in load_vectors("kbtp-message"):
        yield bytes.fromhex(case["message"])


def _both_orders(data: bytes, size: int, unpack: Callable[[bytes, int, bool], Any]) -> list[Any]:
    """A structure read from target memory in both byte orders of ADDR_LE; each repacks to its octets."""
    out = []
    for addr_le in (False, True):
        value = unpack(data, 0, addr_le)
        if value.pack(addr_le) != data[:size]:
            raise OracleError(f"{type(value).__name__} {data[:size].hex()} repacks as {value.pack(addr_le).hex()}")
        out.append(value)
    return out


def table_entry(data: bytes) -> object:
    """A Block Table Entry as a DIRECT_LOAD initiator reads it, in both byte orders of the Block Offset."""
    return _both_orders(data, TABLE_ENTRY_SIZE, TableEntry.unpack)


def table_entry_seeds() -> Iterator[bytes]:
    both = EntryFlags.VALID | EntryFlags.SEALED
    for flags, generation, length, offset in ((0, 1, 0, 0), (both, 0xFFFF, 4096, 1 << 20),
                                              (EntryFlags.VALID, 2, 0xFFFFFFFF, 2**64 - 1), (0xFFFF, 1, 1, 1)):
        for addr_le in (False, True):
            yield TableEntry(flags, generation, length, offset).pack(addr_le)


def completion_record(data: bytes) -> object:
    """A 24-octet completion record as the initiator reads it after RDMA Write with Immediate."""
    record = CompletionRecord.unpack(data)
    if record.pack() != data[:COMPLETION_RECORD_SIZE]:
        raise OracleError(f"completion record {data[:COMPLETION_RECORD_SIZE].hex()} repacks as {record.pack().hex()}")
    return record


def completion_record_seeds() -> Iterator[bytes]:
    yield CompletionRecord(7, Status.OK, 1, 8, 4096).pack()
    yield CompletionRecord(2**64 - 1, Status.TICKET_ABANDONED, 0xFFFF, 0xFFFFFFFF, 2**64 - 1).pack()
    yield CompletionRecord(1, 0xC000, 0, 0, 0).pack()


def ring_slot(data: bytes) -> object:
    """A Ring Slot as a DIRECT_ALLOC initiator reads it, in both byte orders of the Block Offset."""
    return [(slot, slot.consumed) for slot in _both_orders(data, RING_SLOT_SIZE, RingSlot.unpack)]


def ring_slot_seeds() -> Iterator[bytes]:
    for case in load_vectors("kbtp-ring-init"):
        ring = bytes.fromhex(case["ring"])
        yield ring[:RING_SLOT_SIZE]
        yield ring[-RING_SLOT_SIZE:]


def ring_counters(data: bytes) -> object:
    """Head values a FetchAdd returns, split and advanced: per 9 octets, a layout byte (n = 1 + b % 28,
    bit 7 set = the unmasked InfiniBand variant) and the 64-bit counter."""
    out = []
    for off in range(0, len(data) - 8, 9):
        layout = RingLayout(1 + data[off] % RingLayout.MAX_N, masked=not data[off] & 0x80)
        (counter,) = struct.unpack_from(">Q", data, off + 1)
        out.append(layout.fetch_add(counter))
    return out


def ring_counter_seeds() -> Iterator[bytes]:
    for case in load_vectors("kbtp-ring-counter"):
        layout = RingLayout(int(case["n"]), bool(case["masked"]))
        head = layout.initial_head(int(str(case["start"]), 0))
        yield bytes([(layout.n - 1) | (0 if layout.masked else 0x80)]) + struct.pack(">Q", head)


TARGETS = [
    FuzzTarget(
        name="kbtp-message", protocol="kbtp",
        description="messages.decode (both ADDR_LE byte orders), each re-encoded by the raw path",
        parse=decode_message, accepts=(KbtpDecodeError,), seeds=message_seeds, dictionary=_OPCODES,
        int_fields=_HEADER_FIELDS),
    FuzzTarget(
        name="kbtp-table-entry", protocol="kbtp", description="TableEntry.unpack (both Block Offset byte orders)",
        parse=table_entry, accepts=(KbtpDecodeError,), seeds=table_entry_seeds,
        int_fields=(IntField(0, 2), IntField(2, 2), IntField(4, 4), IntField(8, 8), IntField(8, 8, "little"))),
    FuzzTarget(
        name="kbtp-completion-record", protocol="kbtp", description="CompletionRecord.unpack",
        parse=completion_record, accepts=(KbtpDecodeError,), seeds=completion_record_seeds,
        int_fields=(IntField(0, 8), IntField(8, 2), IntField(10, 2), IntField(12, 4), IntField(16, 8))),
    FuzzTarget(
        name="kbtp-ring-slot", protocol="kbtp", description="RingSlot.unpack (both Block Offset byte orders)",
        parse=ring_slot, accepts=(RingError,), seeds=ring_slot_seeds,
        int_fields=(IntField(0, 4), IntField(4, 4), IntField(8, 8), IntField(8, 8, "little"))),
    FuzzTarget(
        name="kbtp-ring-counter", protocol="kbtp", description="RingLayout.split / fetch_add of FetchAdd results",
        parse=ring_counters, accepts=(RingError,), seeds=ring_counter_seeds,
        int_fields=(IntField(1, 8), IntField(1, 4), IntField(5, 4), IntField(10, 8))),
]
