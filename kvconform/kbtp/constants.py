"""KBTP registries and fixed sizes (KBTP "KBTP Opcodes", "Status Codes", "Common Header", "IANA Considerations").

Names are the text's. Flags are interpreted per opcode, so there is one IntFlag per opcode family:
`RequestFlags` (LOAD, STORE, ALLOC_STORE, FREE) and `GoodbyeFlags` (GOODBYE); the other opcodes define none.
"""

from __future__ import annotations

from enum import IntEnum, IntFlag

__all__ = [
    "ADDR_LE_OPCODES",
    "BIND_BODY_SIZE",
    "COMPLETION_BODY_SIZE",
    "COMPLETION_RECORD_SIZE",
    "DESCRIPTOR_SIZE",
    "DIRECT_ALLOC_SIZE",
    "DIRECT_LOAD_SIZE",
    "EMPTY_BLOCK_OFFSET",
    "FLAGS_OF_OPCODE",
    "HEADER_SIZE",
    "HELLO_ACK_FIXED_SIZE",
    "HELLO_BODY_SIZE",
    "PRIVATE_USE_FEATURES",
    "PRIVATE_USE_FLAGS",
    "PRIVATE_USE_OPCODES",
    "PRIVATE_USE_STATUS",
    "REQUEST_OPCODES",
    "RING_SLOT_SIZE",
    "TABLE_ENTRY_SIZE",
    "VERSION",
    "EntryFlags",
    "Features",
    "GoodbyeFlags",
    "Opcode",
    "RequestFlags",
    "Status",
]

VERSION = 1
HEADER_SIZE = 24
DESCRIPTOR_SIZE = 16  # Data, Completion and direct-mode descriptors alike
HELLO_BODY_SIZE = 20  # Requested Features, Completion Credits, Initiator ID (128)
HELLO_ACK_FIXED_SIZE = 32  # the Target Descriptor before the direct-mode descriptors
DIRECT_LOAD_SIZE = 48  # Table descriptor, Table Base Handle, 8 reserved octets, Pool descriptor
DIRECT_ALLOC_SIZE = 48  # Partition, Ring and Head descriptors
BIND_BODY_SIZE = 16  # Ticket (32), Data Length (32), Block Offset (64)
COMPLETION_BODY_SIZE = 16  # Data Length (32), Reserved (32), Block Offset (64)
COMPLETION_RECORD_SIZE = 24
TABLE_ENTRY_SIZE = 16
RING_SLOT_SIZE = 16
EMPTY_BLOCK_OFFSET = 0xFFFF_FFFF_FFFF_FFFF  # a ring slot whose Block Offset is all ones is consumed


class Opcode(IntEnum):
    """KBTP Opcodes (8 bits)."""

    HELLO = 0x01
    HELLO_ACK = 0x02
    LOAD = 0x10
    STORE = 0x11  # mapped
    ALLOC_STORE = 0x12  # unmapped
    FREE = 0x13
    BIND = 0x14
    COMPLETION = 0x20
    GOODBYE = 0x30


class Status(IntEnum):
    """KBTP Status Codes (16 bits)."""

    OK = 0
    INVALID_HANDLE = 1
    STALE_GENERATION = 2
    NOT_VALID = 3
    ALREADY_BOUND = 4
    NO_SPACE = 5
    SEALED = 6
    NOT_SEALED = 7
    TOO_LARGE = 8
    MALFORMED = 9
    INTERNAL = 10
    TICKET_ABANDONED = 11


class RequestFlags(IntFlag):
    """Flags of LOAD, STORE, ALLOC_STORE and FREE."""

    INLINE = 0x0001  # data follows the request
    SEAL = 0x0002  # seal the block after the store
    RECORD = 0x0004  # complete with a completion record; a Completion Descriptor is present
    INVALIDATE = 0x0008  # complete with Send with Invalidate of the Data Descriptor's STag
    ALLOW_UNSEALED = 0x0010  # a load may return an unsealed block


class GoodbyeFlags(IntFlag):
    """Flags of GOODBYE (IANA Considerations: "for GOODBYE, 0x0001 RELEASE")."""

    RELEASE = 0x0001  # the target frees all handles bound by the initiator


class Features(IntFlag):
    """KBTP Features (16 bits), in HELLO Requested Features and HELLO_ACK Features."""

    DIRECT_LOAD = 0x0001
    DIRECT_ALLOC = 0x0002
    RECORD_COMPLETION = 0x0004
    ADDR_LE = 0x0008


class EntryFlags(IntFlag):
    """Flags of a Block Table Entry."""

    VALID = 0x0001  # the handle is bound
    SEALED = 0x0002


REQUEST_OPCODES = frozenset({Opcode.LOAD, Opcode.STORE, Opcode.ALLOC_STORE, Opcode.FREE})
# Messages an initiator sends after HELLO_ACK: ADDR_LE makes their Block Handle little-endian.
ADDR_LE_OPCODES = frozenset({*REQUEST_OPCODES, Opcode.BIND, Opcode.GOODBYE})
# The flag bits the text defines per opcode; every other opcode defines none.
FLAGS_OF_OPCODE: dict[Opcode, int] = {
    **{op: int(RequestFlags(0x1F)) for op in REQUEST_OPCODES},
    Opcode.GOODBYE: int(GoodbyeFlags.RELEASE),
}
# "the upper quarter of each value space is reserved for Private Use"
PRIVATE_USE_OPCODES = range(0xC0, 0x100)
PRIVATE_USE_STATUS = range(0xC000, 0x10000)
PRIVATE_USE_FLAGS = 0xF000  # bits of the 16-bit Flags field (one registry entry per bit)
PRIVATE_USE_FEATURES = 0xF000
