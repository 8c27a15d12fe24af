"""KBTP test vectors: generators and reference checkers (KBTP "Messages", "Free-Block Ring", "Examples").

Kinds:
- kbtp-message: message bytes -> decoded fields (valid), or the field and requirement a decoder rejects;
- kbtp-fetch-add: RFC 7306 masked FetchAdd triples (orig, add, mask) -> `new` value;
- kbtp-ring-counter: successive FetchAdds on a counter of a ring of 2^n slots (masked or unmasked);
- kbtp-ring-init: ring memory and counters after initialisation with F free blocks;
- kbtp-ring-scenario: a sequence of take / consume / allocate / free / slot steps with their outcomes.
The text's examples are hand-written constants, quoted in their comments; other cases come from fixed
seeds with `random.Random`, so `kvconform vectors generate` is reproducible byte for byte.
"""

from __future__ import annotations

import dataclasses
import random
import struct
from collections.abc import Callable, Sequence
from typing import Any

from kvconform.kbtp.constants import Features, GoodbyeFlags, RequestFlags, Status
from kvconform.kbtp.layers import craft
from kvconform.kbtp.messages import (
    AllocStore,
    Bind,
    Completion,
    CompletionDescriptor,
    DataDescriptor,
    DirectAlloc,
    DirectDescriptor,
    DirectLoad,
    Free,
    Goodbye,
    Hello,
    HelloAck,
    KbtpDecodeError,
    Load,
    Message,
    Store,
    decode,
)
from kvconform.kbtp.ring import RingError, RingLayout, RingModel, masked_fetch_add
from kvconform.testvectors import Checker, VectorCase, make_document

__all__ = [
    "CHECKERS",
    "FILES",
    "KIND_FETCH_ADD",
    "KIND_MESSAGE",
    "KIND_RING_COUNTER",
    "KIND_RING_INIT",
    "KIND_RING_SCENARIO",
    "SPEC_ALLOC_STORE",
    "SPEC_COMPLETION",
    "generate",
    "message_from_json",
    "message_to_json",
]

KIND_MESSAGE = "kbtp-message"
KIND_FETCH_ADD = "kbtp-fetch-add"
KIND_RING_COUNTER = "kbtp-ring-counter"
KIND_RING_INIT = "kbtp-ring-init"
KIND_RING_SCENARIO = "kbtp-ring-scenario"
FILES = {
    KIND_MESSAGE: "kbtp/messages.json",
    KIND_FETCH_ADD: "kbtp/fetch_add.json",
    KIND_RING_COUNTER: "kbtp/ring_counter.json",
    KIND_RING_INIT: "kbtp/ring_init.json",
    KIND_RING_SCENARIO: "kbtp/ring_scenario.json",
}
SCHEMA = "kbtp.schema.json"
GENERATOR = "kvconform.kbtp.vectors"
SOURCE = "spec/seeds/003_a48f4321884951de.txt"

# KBTP "Examples", byte for byte as printed there.
SPEC_ALLOC_STORE = bytes.fromhex(
    "01 12 00 01 00 00 00 00 00 00 00 07 00 00 00 00 00 00 40 01 00 00 00 00 00 00 00 00 00 00 00 00 00 00 00 00"
    " 00 00 00 08 4b 56 42 4c 4f 43 4b 21")
SPEC_COMPLETION = bytes.fromhex(
    "01 20 00 00 00 00 00 00 00 00 00 07 00 00 00 00 00 00 40 01 00 05 00 00 00 00 00 08 00 00 00 00 00 00 00 00"
    " 00 15 00 00")
SPEC_RING_STEPS = ((0, 0, 0x0000000100000010), (1, 16, 0x0000000200000020), (2, 32, 0x0000000300000030),
                   (3, 48, 0x0000000400000000), (4, 0, 0x0000000500000010))

_CLASSES: dict[str, type[Message]] = {cls.OPCODE.name: cls for cls in (  # type: ignore[misc]
    Hello, HelloAck, Load, Store, AllocStore, Free, Bind, Completion, Goodbye)}
_DESCRIPTORS: dict[str, Callable[..., Any]] = {
    "data": DataDescriptor, "completion": CompletionDescriptor, "table": DirectDescriptor, "pool": DirectDescriptor,
    "partition": DirectDescriptor, "ring": DirectDescriptor, "head": DirectDescriptor}


def _u64(x: int) -> str:
    return f"0x{x:016X}"


def _plain(value: Any) -> Any:
    """JSON form of a field: ints stay ints (u64 included), bytes are hex, dataclasses nested objects."""
    if isinstance(value, bytes):
        return value.hex()
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: _plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
    return None if value is None else int(value)


def message_to_json(msg: Message) -> dict[str, Any]:
    """`{"type": OPCODE name, field: value, ...}` with every field of the dataclass."""
    return {"type": msg.OPCODE.name, **{f.name: _plain(getattr(msg, f.name)) for f in dataclasses.fields(msg)}}


def _nested(name: str, value: Any) -> Any:
    if value is None:
        return None
    if name == "direct_load":
        return DirectLoad(DirectDescriptor(**value["table"]), value["table_base_handle"],
                          DirectDescriptor(**value["pool"]), value["reserved"])
    if name == "direct_alloc":
        return DirectAlloc(*(DirectDescriptor(**value[k]) for k in ("partition", "ring", "head")))
    if name in ("inline", "initiator_id"):
        return bytes.fromhex(value)
    if name in _DESCRIPTORS:
        return _DESCRIPTORS[name](**value)
    return value


def message_from_json(doc: dict[str, Any]) -> Message:
    cls = _CLASSES[doc["type"]]
    return cls(**{k: _nested(k, v) for k, v in doc.items() if k != "type"})  # type: ignore[return-value]


def _case(comment: str, flags: Sequence[str], result: str = "valid", **fields: Any) -> dict[str, Any]:
    return {"tcId": 0, "comment": comment, "flags": list(flags), "result": result, **fields}


def _document(kind: str, notes: dict[str, str], groups: list[dict[str, Any]]) -> dict[str, Any]:
    return make_document(kind, notes, groups, schema=SCHEMA, generator=GENERATOR, source=SOURCE)


# ---- checkers ------------------------------------------------------------------------------


def check_message(case: VectorCase) -> str | None:
    """Valid: decode gives the fields and the checked encoder gives the bytes back. Invalid: decode rejects
    naming the vector's field and requirement."""
    data = bytes.fromhex(case["message"])
    addr_le = bool(case["addr_le"])
    try:
        msg = decode(data, addr_le=addr_le)
    except KbtpDecodeError as exc:
        if case.result == "valid":
            return f"reference decoder rejected it: {exc}"
        if (exc.field, exc.requirement) != (case["field"], case["requirement"]):
            return f"error: got {exc.field} {exc.requirement} ({exc}), expected {case['field']} {case['requirement']}"
        return None
    if case.result == "invalid":
        return f"accepted by the reference decoder as {msg}, expected {case['field']} rejected ({case['requirement']})"
    seen = message_to_json(msg)
    if seen != case["decoded"]:
        diff = sorted(k for k in seen.keys() | case["decoded"].keys() if seen.get(k) != case["decoded"].get(k))
        return f"decoded: fields {diff} differ: got {[seen.get(k) for k in diff]}, expected " \
               f"{[case['decoded'].get(k) for k in diff]}"
    if message_from_json(case["decoded"]).encode(addr_le=addr_le) != data:
        return "checked encoder of the decoded fields does not give the message bytes back"
    return None


def check_fetch_add(case: VectorCase) -> str | None:
    seen = _u64(masked_fetch_add(int(case["orig"], 16), int(case["add"], 16), int(case["mask"], 16)))
    if (seen == case["new"]) != (case.result == "valid"):
        return f"new: reference computes {seen}, the vector expects {case['new']} ({case.result})"
    return None


def check_ring_counter(case: VectorCase) -> str | None:
    layout = RingLayout(case["n"], case["masked"])
    if _u64(layout.add_data) != case["add_data"] or _u64(layout.add_mask) != case["add_mask"]:
        return f"add data/mask: reference {_u64(layout.add_data)}/{_u64(layout.add_mask)}, vector " \
               f"{case['add_data']}/{case['add_mask']}"
    counter = int(case["start"], 16)
    seen = []
    for _ in case["steps"]:
        ticket, offset, counter = layout.fetch_add(counter)
        seen.append({"ticket": ticket, "offset": offset, "counter": _u64(counter)})
    if (seen == case["steps"]) != (case.result == "valid"):
        return f"steps: reference gives {seen}, the vector expects {case['steps']} ({case.result})"
    return None


def _ring_memory(layout: RingLayout, blocks: Sequence[int], addr_le: bool) -> dict[str, Any]:
    slots = layout.initial_slots(blocks)
    return {"ring": b"".join(s.pack(addr_le) for s in slots).hex(), "head": _u64(layout.initial_head()),
            "tail": _u64(layout.initial_tail(len(blocks)))}


def check_ring_init(case: VectorCase) -> str | None:
    layout = RingLayout(case["n"])
    blocks = [int(b, 16) for b in case["blocks"]]
    seen = _ring_memory(layout, blocks, case["addr_le"])
    expected = {k: case[k] for k in ("ring", "head", "tail")}
    if (seen == expected) != (case.result == "valid"):
        diff = [k for k in seen if seen[k] != expected[k]]
        return f"{diff or 'ring'}: reference {[seen[k] for k in diff]}, vector {[expected[k] for k in diff]} " \
               f"({case.result})"
    return None


def _replay(layout: RingLayout, blocks: Sequence[int], start: int, steps: Sequence[dict[str, Any]]) -> str | None:
    """None when every step's outcome matches the model, else the first disagreement."""
    ring = RingModel.initialised(layout, blocks, start)
    for i, step in enumerate(steps):
        op, expect = step["op"], step["expect"]
        try:
            if op == "take":
                ticket, offset = ring.take()
                seen: dict[str, Any] = {"ticket": ticket, "offset": offset}
            elif op == "consume":
                seen = {"block": _u64(ring.consume(step["ticket"], step["offset"]))}
            elif op == "allocate":
                ticket, block = ring.allocate()
                seen = {"ticket": ticket, "block": _u64(block)}
            elif op == "free":
                out = ring.free(int(step["block"], 16))
                seen = {"ticket": out.ticket, "offset": out.slot_offset, "deferred": out.deferred}
            else:  # "slot": the slot's contents now
                slot = ring.slots[step["index"]]
                seen = {"sequence": slot.sequence, "block": _u64(slot.block_offset)}
        except RingError as exc:
            seen = {"error": exc.requirement}
        if seen != expect:
            return f"step {i} ({op}): model gives {seen}, the vector expects {expect}"
    return None


def check_ring_scenario(case: VectorCase) -> str | None:
    problem = _replay(RingLayout(case["n"], case["masked"]), [int(b, 16) for b in case["blocks"]],
                      case["start"], case["steps"])
    if case.result == "valid":
        return problem
    return None if problem else f"the model reproduces every step, the vector marks it invalid ({case['requirement']})"


CHECKERS: dict[str, Checker] = {
    KIND_MESSAGE: check_message,
    KIND_FETCH_ADD: check_fetch_add,
    KIND_RING_COUNTER: check_ring_counter,
    KIND_RING_INIT: check_ring_init,
    KIND_RING_SCENARIO: check_ring_scenario,
}


# ---- generators ----------------------------------------------------------------------------


def _valid(comment: str, flags: Sequence[str], msg: Message, addr_le: bool = False) -> dict[str, Any]:
    return _case(comment, flags, message=msg.encode(addr_le=addr_le).hex(), addr_le=addr_le,
                 decoded=message_to_json(msg))


def _invalid(comment: str, flags: Sequence[str], data: bytes, field: str, requirement: str,
             addr_le: bool = False) -> dict[str, Any]:
    try:
        decode(data, addr_le=addr_le)
    except KbtpDecodeError as exc:
        if (exc.field, exc.requirement) != (field, requirement):
            raise AssertionError(f"{comment}: reference rejects {exc.field} {exc.requirement}") from exc
    else:
        raise AssertionError(f"{comment}: the reference accepts it")
    return _case(comment, flags, "invalid", message=data.hex(), addr_le=addr_le, field=field,
                 requirement=requirement)


def _rand_descriptor(rng: random.Random) -> DataDescriptor:
    return DataDescriptor(rng.getrandbits(32), rng.getrandbits(64), rng.randrange(1, 1 << 20))


def _messages_document() -> dict[str, Any]:
    rng = random.Random(0x4B425450)
    spec = [
        _case("KBTP \"Examples\": \"ALLOC_STORE of 8 octets of inline data (\\\"KVBLOCK!\\\") to handle 0x4001, "
              "Request ID 7, flags INLINE\": the 48 octets printed", ["SpecExample"], message=SPEC_ALLOC_STORE.hex(),
              addr_le=False, decoded=message_to_json(AllocStore.with_inline(b"KVBLOCK!", request_id=7,
                                                                            handle=0x4001))),
        _case("KBTP \"Examples\": \"Its COMPLETION (Generation 5, Status OK, Data Length 8, Block Offset 0x150000, "
              "which is block 42 of a pool of 32 KiB blocks)\": the 40 octets printed", ["SpecExample"],
              message=SPEC_COMPLETION.hex(), addr_le=False, decoded=message_to_json(Completion(
                  request_id=7, handle=0x4001, generation=5, data_length=8, block_offset=0x150000))),
        _valid("the example's ALLOC_STORE in an ADDR_LE session: the Block Handle little-endian, the descriptor's "
               "Length 8 little-endian", ["SpecInput", "AddrLe"],
               AllocStore.with_inline(b"KVBLOCK!", request_id=7, handle=0x4001), addr_le=True),
    ]
    initiator_id = bytes(rng.getrandbits(8) for _ in range(16))
    ack_all = HelloAck(features=Features.DIRECT_LOAD | Features.DIRECT_ALLOC | Features.ADDR_LE, request_credits=32,
                       block_size=32768, max_inline=4096, allocation_quota=6, handle_base=0x4000, handle_count=1024,
                       ticket_timeout_ms=5000,
                       direct_load=DirectLoad(DirectDescriptor(0x1001, 0, 1024), 0x4000,
                                              DirectDescriptor(0x1002, 0, 64)),
                       direct_alloc=DirectAlloc(DirectDescriptor(0x2001, 0x150000, 6),
                                                DirectDescriptor(0x2002, 0x40000, 8),
                                                DirectDescriptor(0x2003, 0x40080, 1)))
    load = Load(request_id=rng.getrandbits(64), handle=0x4001, generation=5, data=_rand_descriptor(rng),
                flags=RequestFlags.INVALIDATE)
    record_load = Load(request_id=rng.getrandbits(64), handle=0x4002, flags=RequestFlags.RECORD |
                       RequestFlags.ALLOW_UNSEALED, data=_rand_descriptor(rng),
                       completion=CompletionDescriptor(rng.getrandbits(32), rng.getrandbits(64)))
    store = Store(request_id=rng.getrandbits(64), handle=0x4003, generation=0xFFFF, flags=RequestFlags.SEAL,
                  data=_rand_descriptor(rng))
    inline_store = Store.with_inline(bytes(rng.getrandbits(8) for _ in range(37)), request_id=1, handle=0x4004,
                                     flags=RequestFlags.SEAL)
    record_alloc = AllocStore.with_inline(b"", request_id=2, handle=0xFFFF_FFFF_FFFF_FFFF,
                                          completion=CompletionDescriptor(7, 0x1000))
    free = Free(request_id=3, handle=0x4001, generation=6)
    record_free = Free(request_id=4, handle=0x4001, flags=RequestFlags.RECORD | RequestFlags.INVALIDATE,
                       completion=CompletionDescriptor(9, 0x2000))
    bind = Bind(request_id=5, handle=0x4005, ticket=0xFFFF_FFFF, data_length=32768, block_offset=0x150000)
    valid = [
        _valid("HELLO requesting every feature, 16 completion credits", [], Hello(
            requested_features=0x000F, completion_credits=16, initiator_id=initiator_id)),
        _valid("HELLO_ACK without direct modes: 32 octets of Target Descriptor", [], HelloAck(
            features=Features.RECORD_COMPLETION, request_credits=8, block_size=65536, max_inline=256,
            allocation_quota=100, handle_base=0x8000, handle_count=100, ticket_timeout_ms=1000)),
        _valid("HELLO_ACK with DIRECT_LOAD and DIRECT_ALLOC: 48 + 48 octets of descriptors", ["DirectModes"],
               ack_all),
        _valid("HELLO_ACK reporting an error in Status", [], HelloAck(status=Status.NO_SPACE)),
        _valid("LOAD with INVALIDATE", [], load),
        _valid("LOAD with INVALIDATE, ADDR_LE", ["AddrLe"], load, addr_le=True),
        _valid("LOAD with RECORD: a Completion Descriptor follows the Data Descriptor", [], record_load),
        _valid("LOAD with RECORD, ADDR_LE: both descriptors little-endian", ["AddrLe"], record_load, addr_le=True),
        _valid("STORE read by RDMA Read (no INLINE), SEAL, Generation 0xFFFF", [], store),
        _valid("STORE with 37 octets inline", [], inline_store),
        _valid("ALLOC_STORE of 0 octets inline with RECORD, handle all ones", ["Boundary"], record_alloc),
        _valid("ALLOC_STORE of 0 octets inline with RECORD, handle all ones, ADDR_LE", ["Boundary", "AddrLe"],
               record_alloc, addr_le=True),
        _valid("FREE without a body", [], free),
        _valid("FREE with RECORD and INVALIDATE", [], record_free),
        _valid("FREE with RECORD, ADDR_LE", ["AddrLe"], record_free, addr_le=True),
        _valid("BIND of ticket 0xFFFFFFFF (the last before the wrap)", ["Boundary"], bind),
        _valid("BIND in an ADDR_LE session: only the Block Handle is little-endian", ["AddrLe"], bind, addr_le=True),
        _valid("COMPLETION with status TICKET_ABANDONED", [], Completion(request_id=5, handle=0x4005,
                                                                          status=Status.TICKET_ABANDONED)),
        _valid("COMPLETION in an ADDR_LE session keeps the handle in network order", ["AddrLe"], Completion(
            request_id=7, handle=0x4001, generation=5, data_length=8, block_offset=0x150000), addr_le=True),
        _valid("GOODBYE with RELEASE", [], Goodbye(flags=GoodbyeFlags.RELEASE)),
        _valid("GOODBYE without RELEASE: bindings retained", [], Goodbye()),
    ]
    spec_msg = decode(SPEC_ALLOC_STORE)
    ack_bytes = ack_all.encode()
    da = 24 + 32 + 48  # offset of the DIRECT_ALLOC descriptors in ack_all
    invalid = [
        _invalid("the example's ALLOC_STORE truncated to 23 octets", ["Truncated"], SPEC_ALLOC_STORE[:23], "header",
                 "KBTP-HDR-LAYOUT"),
        _invalid("the example's ALLOC_STORE with Version 2", ["WrongVersion"], craft(spec_msg, version=2), "version",
                 "KBTP-HDR-VERSION"),
        _invalid("the example's ALLOC_STORE with Version 0", ["WrongVersion"], craft(spec_msg, version=0), "version",
                 "KBTP-HDR-VERSION"),
        _invalid("unassigned opcode 0x15", ["UnknownOpcode"], craft(load, opcode=0x15), "opcode", "KBTP-OPCODES"),
        _invalid("private-use opcode 0xFF", ["UnknownOpcode"], craft(load, opcode=0xFF), "opcode", "KBTP-OPCODES"),
        _invalid("LOAD with unassigned flag 0x0020", ["UndefinedFlag"], craft(load, flags=0x0020), "flags",
                 "KBTP-FLAGS"),
        _invalid("GOODBYE with flag 0x0002 (only RELEASE is defined)", ["UndefinedFlag"],
                 craft(Goodbye(), flags=0x0002), "flags", "KBTP-FLAGS"),
        _invalid("BIND with a flag", ["UndefinedFlag"], craft(bind, flags=0x0001), "flags", "KBTP-FLAGS"),
        _invalid("LOAD with Status 1", ["StatusInRequest"], craft(load, status=1), "status", "KBTP-HDR-STATUS-ZERO"),
        _invalid("HELLO with Request ID 1", ["SessionHeader"], craft(Hello(), request_id=1), "request_id",
                 "KBTP-HELLO-HEADER-ZERO"),
        _invalid("HELLO_ACK with Block Handle 1", ["SessionHeader"], craft(ack_all, handle=1), "handle",
                 "KBTP-HELLO-HEADER-ZERO"),
        _invalid("HELLO with Status 9", ["SessionHeader"], craft(Hello(), status=9), "status",
                 "KBTP-HELLO-HEADER-ZERO"),
        _invalid("HELLO with a 15-octet Initiator ID", ["Truncated"], Hello().encode()[:-1], "body",
                 "KBTP-HELLO-LAYOUT"),
        _invalid("LOAD with RECORD but no Completion Descriptor", ["RecordMismatch"],
                 dataclasses.replace(load, flags=RequestFlags.RECORD).encode_raw(), "completion", "KBTP-FLAG-RECORD"),
        _invalid("LOAD with a Completion Descriptor but RECORD clear", ["RecordMismatch"],
                 dataclasses.replace(record_load, flags=RequestFlags.ALLOW_UNSEALED).encode_raw(), "body",
                 "KBTP-BODY-LAYOUT"),
        _invalid("LOAD with INLINE (a LOAD body has no inline data)", ["InlineMismatch"],
                 craft(load, flags=RequestFlags.INLINE), "flags", "KBTP-BODY-LAYOUT"),
        _invalid("the example's ALLOC_STORE with descriptor Length 9 for 8 octets of data", ["InlineMismatch"],
                 craft(spec_msg, data_length=9), "data.length", "KBTP-DESC-INLINE"),
        _invalid("the example's ALLOC_STORE with descriptor Length 7", ["InlineMismatch"],
                 craft(spec_msg, data_length=7), "data.length", "KBTP-DESC-INLINE"),
        _invalid("the example's ALLOC_STORE with INLINE and a non-zero STag", ["InlineMismatch"],
                 craft(spec_msg, data_stag=0x1234), "data.stag", "KBTP-DESC-INLINE"),
        _invalid("the example's ALLOC_STORE with INLINE and a non-zero Tagged Offset", ["InlineMismatch"],
                 craft(spec_msg, data_tagged_offset=0x1000), "data.tagged_offset", "KBTP-DESC-INLINE"),
        _invalid("the example's ALLOC_STORE with INLINE clear: the data is trailing garbage", ["InlineMismatch"],
                 dataclasses.replace(spec_msg, flags=0).encode_raw(), "body", "KBTP-BODY-LAYOUT"),
        _invalid("the example's ALLOC_STORE read big-endian although the session has ADDR_LE: Length 8 reads as "
                 "0x08000000", ["AddrLe", "WrongByteOrder"], SPEC_ALLOC_STORE, "data.length", "KBTP-DESC-INLINE",
                 addr_le=True),
        _invalid("BIND with 8 body octets", ["Truncated"], bind.encode()[:32], "body", "KBTP-BIND-LAYOUT"),
        _invalid("COMPLETION with 4 extra octets", ["Trailing"], SPEC_COMPLETION + bytes(4), "body",
                 "KBTP-COMPLETION-LAYOUT"),
        _invalid("GOODBYE with a body octet", ["Trailing"], Goodbye().encode() + b"\0", "body", "KBTP-BODY-LAYOUT"),
        _invalid("HELLO_ACK announcing DIRECT_ALLOC without its descriptors", ["DirectModes"],
                 ack_bytes[:da], "body", "KBTP-ACK-LAYOUT"),
        _invalid("HELLO_ACK with Head Tagged Offset 0x40084 (not a multiple of 8)", ["DirectModes"],
                 craft(ack_all, head_tagged_offset=0x40084), "direct_alloc.head.tagged_offset",
                 "KBTP-ACK-HEAD-ALIGN"),
        _invalid("HELLO_ACK with Head Count 2", ["DirectModes"], craft(ack_all, head_count=2),
                 "direct_alloc.head.count", "KBTP-ACK-DALLOC-DESC"),
        _invalid("HELLO_ACK with Partition Count 5 for an Allocation Quota of 6", ["DirectModes"],
                 craft(ack_all, partition_count=5), "direct_alloc.partition.count", "KBTP-ACK-DALLOC-DESC"),
        _invalid("HELLO_ACK with Ring Count 12 (not a power of two)", ["DirectModes"], craft(ack_all, ring_count=12),
                 "direct_alloc.ring.count", "KBTP-RING-SIZE"),
        _invalid("HELLO_ACK with Ring Count 4, smaller than the partition of 6", ["DirectModes"],
                 craft(ack_all, ring_count=4), "direct_alloc.ring.count", "KBTP-RING-SIZE"),
    ]
    notes = {
        "SpecExample": "A value printed in the KBTP text itself; hand-written here, not computed.",
        "SpecInput": "The text's example message in another encoding; expected bytes from the reference.",
        "AddrLe": "The session's HELLO_ACK set ADDR_LE: the Block Handle of initiator messages and the STag, Tagged "
                  "Offset and Length of their descriptors are little-endian (KBTP-ADDRLE-INITIATOR).",
        "Boundary": "Field values at the ends of their ranges (empty inline data, all-ones handle, last ticket).",
        "DirectModes": "HELLO_ACK with direct-mode descriptors (KBTP-ACK-DLOAD-DESC, KBTP-ACK-DALLOC-DESC).",
        "Truncated": "Shorter than its layout: the message cannot be parsed (KBTP-STATUS-MALFORMED).",
        "Trailing": "Octets after the end of the layout.",
        "WrongVersion": "Version is 1 (KBTP-HDR-VERSION).",
        "UnknownOpcode": "An opcode the registry does not assign (KBTP-OPCODES).",
        "UndefinedFlag": "A flag bit the opcode does not define (KBTP-FLAGS).",
        "StatusInRequest": "Status is zero in requests (KBTP-HDR-STATUS-ZERO).",
        "SessionHeader": "HELLO and HELLO_ACK have zero Request ID, Block Handle, Generation; HELLO zero Status "
                         "(KBTP-HELLO-HEADER-ZERO).",
        "RecordMismatch": "RECORD and the presence of a Completion Descriptor disagree (KBTP-FLAG-RECORD).",
        "InlineMismatch": "INLINE, the descriptor and the inline data disagree (KBTP-DESC-INLINE).",
        "WrongByteOrder": "Bytes valid in one byte order decoded in the other.",
    }
    return _document(KIND_MESSAGE, notes, [{"type": "MessageTest", "tests": spec + valid + invalid}])


def _fetch_add_document() -> dict[str, Any]:
    rng = random.Random(0x7306)
    layout = RingLayout(2)

    def fa(comment: str, flags: Sequence[str], orig: int, add: int, mask: int, result: int | None = None,
           outcome: str = "valid") -> dict[str, Any]:
        value = masked_fetch_add(orig, add, mask) if result is None else result
        return _case(comment, flags, outcome, orig=_u64(orig), add=_u64(add), mask=_u64(mask), new=_u64(value))

    tests = [fa(f"KBTP \"Examples\" N = 4, step {i}: 0x{orig:016X} + Add Data with Add Mask 0x8000000080000020 -> "
                f"0x{new:016X}", ["SpecExample"], orig, layout.add_data, layout.add_mask, new)
             for i, (orig, new) in enumerate(zip((0, *(s[2] for s in SPEC_RING_STEPS[:-1])),
                                                 (s[2] for s in SPEC_RING_STEPS), strict=True))]
    tests += [
        fa("mask 0: a plain 64-bit add wrapping at 2^64", ["PlainAdd"], (1 << 64) - 1, 1, 0),
        fa("mask bit 63 only: a plain 64-bit add", ["PlainAdd"], 0x7FFF_FFFF_FFFF_FFFF, 1, 1 << 63),
        fa("every mask bit set: 64 one-bit fields, each XOR", ["EveryBit"], 0xF0F0_F0F0_F0F0_F0F0,
           0xFFFF_FFFF_0000_FFFF, (1 << 64) - 1),
        fa("ticket field wraps 0xFFFFFFFF -> 0 without touching the offset", ["TicketWrap"],
           0xFFFF_FFFF_0000_0030, layout.add_data, layout.add_mask),
        fa("the unmasked add at N = 4 step 4 carries the offset into bit 6", ["UnmaskedCarry"], 0x0000000300000030,
           layout.add_data, layout.add_mask, 0x0000000400000040, "invalid"),
        fa("carry propagated across the bit-31 field boundary", ["CarryAcrossField"], 0x0000_0000_FFFF_FFFF, 1,
           1 << 63 | 1 << 31, 0x0000_0001_0000_0000, "invalid"),
    ]
    for _ in range(12):
        tests.append(fa("random triple", ["Random"], rng.getrandbits(64), rng.getrandbits(64), rng.getrandbits(64)))
    notes = {
        "SpecExample": "A value printed in the KBTP text itself; hand-written here, not computed.",
        "PlainAdd": "Add Mask without interior bits: an ordinary 64-bit add.",
        "EveryBit": "Every bit its own field: the sum discards every carry.",
        "TicketWrap": "The 32-bit ticket field wraps and its carry is discarded (KBTP-RING-WRAP).",
        "UnmaskedCarry": "An implementation that ignores the Add Mask (rdma-bindings.md §1.4; KBTP-RING-FETCHADD).",
        "CarryAcrossField": "An implementation that lets a field's carry reach the next field (KBTP-RING-WRAP).",
        "Random": "Generated from a fixed seed; expected value from the reference (checked against the "
                  "bit-serial definition in the unit tests).",
    }
    return _document(KIND_FETCH_ADD, notes, [{"type": "FetchAddTest", "tests": tests}])


def _counter_case(comment: str, flags: Sequence[str], n: int, masked: bool, start: int, count: int,
                  outcome: str = "valid", mutate: Callable[[list[dict[str, Any]]], None] | None = None
                  ) -> dict[str, Any]:
    layout = RingLayout(n, masked)
    counter = layout.counter(start)
    steps = []
    for _ in range(count):
        ticket, offset, counter = layout.fetch_add(counter)
        steps.append({"ticket": ticket, "offset": offset, "counter": _u64(counter)})
    if mutate:
        mutate(steps)
    return _case(comment, flags, outcome, n=n, masked=masked, add_data=_u64(layout.add_data),
                 add_mask=_u64(layout.add_mask), start=_u64(layout.counter(start)), steps=steps)


def _ring_counter_document() -> dict[str, Any]:
    spec = _case("KBTP \"Examples\": \"Ring counter for N = 4 (n = 2) ... Successive FetchAdd results on Head, "
                 "starting from zero\": (0, 0) .. (4, 0)", ["SpecExample"], n=2, masked=True,
                 add_data=_u64(0x0000000100000010), add_mask=_u64(0x8000000080000020), start=_u64(0),
                 steps=[{"ticket": t, "offset": o, "counter": _u64(c)} for t, o, c in SPEC_RING_STEPS])

    def unmasked_step4(steps: list[dict[str, Any]]) -> None:
        steps[3]["counter"] = _u64(0x0000000400000040)

    def no_ticket_wrap(steps: list[dict[str, Any]]) -> None:
        steps[0]["counter"] = _u64(1 << 32 | int(steps[0]["counter"], 16) & 0xFFFF_FFFF)

    tests = [spec]
    for n in (1, 2, 3, 4, 7, 10, 16, 28):
        n_slots = 1 << n
        tests.append(_counter_case(f"n = {n}: the last slot and the offset's wrap to 0", ["OffsetWrap"], n, True,
                                   n_slots - 2, 4))
        tests.append(_counter_case(f"n = {n}: the 32-bit ticket wrap", ["TicketWrap"], n, True, (1 << 32) - 2, 4))
    for n in (1, 2, 5):
        tests.append(_counter_case(f"unmasked (InfiniBand) n = {n}: ticket in the high 32 bits, slot "
                                   "16 * (ticket mod N)", ["Unmasked"], n, False, (1 << 32) - 3, 2 * (1 << n)))
    tests.append(_counter_case("the example's sequence with the fourth step computed without the Add Mask",
                               ["UnmaskedCarry"], 2, True, 0, 5, "invalid", unmasked_step4))
    tests.append(_counter_case("ticket 0xFFFFFFFF advanced into bit 64 instead of wrapping to 0", ["NoTicketWrap"],
                               3, True, (1 << 32) - 1, 2, "invalid", no_ticket_wrap))
    notes = {
        "SpecExample": "A value printed in the KBTP text itself; hand-written here, not computed.",
        "OffsetWrap": "The Slot Offset passes the end of the ring and wraps to 0, its carry discarded "
                      "(KBTP-RING-WRAP).",
        "TicketWrap": "The Ticket passes 0xFFFFFFFF and wraps to 0; the slot stays 16 * (ticket mod N).",
        "Unmasked": "The unmasked InfiniBand layout: Add Data 0x0000000100000000, low 32 bits zero "
                    "(KBTP-IB-UNMASKED).",
        "UnmaskedCarry": "A counter advanced without the Add Mask (KBTP-RING-FETCHADD).",
        "NoTicketWrap": "A counter kept as an unbounded ticket (KBTP-RING-WRAP).",
    }
    return _document(KIND_RING_COUNTER, notes, [{"type": "RingCounterTest", "tests": tests}])


def _init_case(comment: str, flags: Sequence[str], n: int, blocks: Sequence[int], addr_le: bool = False,
               outcome: str = "valid", **override: Any) -> dict[str, Any]:
    memory = _ring_memory(RingLayout(n), blocks, addr_le)
    memory.update(override)
    return {**_case(comment, flags, outcome, n=n, addr_le=addr_le, blocks=[_u64(b) for b in blocks]), **memory}


def _ring_init_document() -> dict[str, Any]:
    blocks4 = [100, 101, 102, 103]
    pool = [0x8000 * i for i in range(5)]
    wrong_empty = bytearray(bytes.fromhex(_ring_memory(RingLayout(3), pool, False)["ring"]))
    struct.pack_into(">I", wrong_empty, 16 * 5, 5)  # Sequence s instead of s - N for the empty slot 5
    tests = [
        _init_case("KBTP \"Examples\": the shared ring of four free blocks 100 to 103 (N = F = 4)", ["SpecInput",
                   "FullRing"], 2, blocks4),
        _init_case("F = 5 < N = 8: slots 5..7 empty with Sequence s - 8 mod 2^32", ["PartialRing"], 3, pool),
        _init_case("F = 5 < N = 8, ADDR_LE: Block Offsets little-endian", ["PartialRing", "AddrLe"], 3, pool, True),
        _init_case("F = 0: every slot empty, Tail = Head", ["EmptyRing"], 1, []),
        _init_case("N = F = 2", ["FullRing"], 1, [0x1000, 0x2000]),
        _init_case("empty slot 5 written with Sequence 5 instead of 5 - 8 mod 2^32", ["EmptySlotSequence"], 3, pool,
                   outcome="invalid", ring=wrong_empty.hex()),
        _init_case("F = N = 4 with Tail Slot Offset 16 * F = 64 instead of 16 * (F mod N) = 0", ["TailOffset"], 2,
                   blocks4, outcome="invalid", tail=_u64(4 << 32 | 64)),
    ]
    notes = {
        "SpecInput": "The blocks of the text's deferred-free example; expected memory from the reference.",
        "FullRing": "F = N: every slot holds a block and Tail's Slot Offset wraps to 0.",
        "PartialRing": "F < N: the empty slots hold all ones and Sequence s - N mod 2^32 (KBTP-RING-INIT).",
        "EmptyRing": "No free blocks.",
        "AddrLe": "ADDR_LE: ring slots' Block Offsets are little-endian (KBTP-ADDRLE-MEMORY).",
        "EmptySlotSequence": "An initialisation that numbers empty slots s instead of s - N (KBTP-RING-INIT).",
        "TailOffset": "Tail's Slot Offset not reduced modulo N (KBTP-RING-INIT, KBTP-RING-COUNTER-FIELDS).",
    }
    return _document(KIND_RING_INIT, notes, [{"type": "RingInitTest", "tests": tests}])


class _Recorder:
    """Runs operations on a RingModel and records each as a scenario step with its outcome."""

    def __init__(self, layout: RingLayout, blocks: Sequence[int], start: int = 0) -> None:
        self.ring = RingModel.initialised(layout, blocks, start)
        self.steps: list[dict[str, Any]] = []

    def take(self) -> tuple[int, int]:
        ticket, offset = self.ring.take()
        self.steps.append({"op": "take", "expect": {"ticket": ticket, "offset": offset}})
        return ticket, offset

    def consume(self, ticket: int, offset: int) -> int:
        block = self.ring.consume(ticket, offset)
        self.steps.append({"op": "consume", "ticket": ticket, "offset": offset, "expect": {"block": _u64(block)}})
        return block

    def allocate(self) -> int:
        ticket, block = self.ring.allocate()
        self.steps.append({"op": "allocate", "expect": {"ticket": ticket, "block": _u64(block)}})
        return block

    def free(self, block: int) -> bool:
        out = self.ring.free(block)
        self.steps.append({"op": "free", "block": _u64(block),
                           "expect": {"ticket": out.ticket, "offset": out.slot_offset, "deferred": out.deferred}})
        return out.deferred

    def slot(self, index: int) -> None:
        slot = self.ring.slots[index]
        self.steps.append({"op": "slot", "index": index,
                           "expect": {"sequence": slot.sequence, "block": _u64(slot.block_offset)}})


def _scenario(comment: str, flags: Sequence[str], n: int, blocks: Sequence[int], start: int,
              script: Callable[[_Recorder], None], masked: bool = True) -> dict[str, Any]:
    rec = _Recorder(RingLayout(n, masked), blocks, start)
    script(rec)
    return _case(comment, flags, n=n, masked=masked, start=start, blocks=[_u64(b) for b in blocks], steps=rec.steps)


def _spec_defer(rec: _Recorder) -> None:
    x = rec.take()  # X's ALLOC_STORE takes ticket 0, its chain delayed before reading slot 0
    for _ in range(3):
        rec.allocate()  # Y: tickets 1, 2, 3 -> blocks 101, 102, 103
    rec.free(101)  # ticket 4 on slot 0, not yet consumed: deferred
    rec.slot(0)  # still {0, 100}: not overwritten
    rec.consume(*x)  # X obtains block 100; the deferred free writes {4, 101}
    rec.slot(0)
    rec.allocate()  # ticket 4 obtains 101


def _churn(seed: int, rounds: int) -> Callable[[_Recorder], None]:
    """Allocate/free cycles within the quota, more frees than ring slots, some allocations held open."""
    def script(rec: _Recorder) -> None:
        rng = random.Random(seed)
        f = len(rec.ring.available())
        held: list[int] = []
        pending: list[tuple[int, int]] = []
        for _ in range(rounds):
            choice = rng.random()
            if choice < 0.35 and len(held) + len(pending) < f:
                pending.append(rec.take())
            elif choice < 0.6 and pending:
                ticket, offset = pending[0]  # oldest first: every slot it needs is ready
                held.append(rec.consume(ticket, offset))
                pending.pop(0)
            elif held:
                rec.free(held.pop(rng.randrange(len(held))))
        for ticket, offset in pending:
            rec.consume(ticket, offset)
    return script


def _ring_scenario_document() -> dict[str, Any]:
    blocks = [100, 101, 102, 103]
    spec = _scenario("KBTP \"Examples\": \"A shared ring of four free blocks 100 to 103 (N = F = 4) ... the free is "
                     "deferred ... the deferred free now writes slot 0 with Sequence 4 and block 101, which the next "
                     "allocation (ticket 4) obtains\"", ["SpecExample", "DeferredFree"], 2, blocks, 0, _spec_defer)

    def overwrite(steps: list[dict[str, Any]]) -> list[dict[str, Any]]:
        bad = [dict(s) for s in steps]
        bad[5] = {"op": "slot", "index": 0, "expect": {"sequence": 4, "block": _u64(101)}}  # written at once
        return bad

    invalid = _case("the example with the free writing slot 0 at once, over X's unconsumed block 100",
                    ["OverwriteUnconsumed"], "invalid", n=2, masked=True, start=0, blocks=[_u64(b) for b in blocks],
                    steps=overwrite(spec["steps"]), requirement="KBTP-FREE-NO-OVERWRITE")

    def wait_for_free(rec: _Recorder) -> None:
        rec.allocate()
        ticket, offset = rec.take()  # ticket 1: slot 1 is empty (F = 1 < N)
        rec.steps.append({"op": "consume", "ticket": ticket, "offset": offset,
                          "expect": {"error": "KBTP-RING-ALLOC-WAIT"}})
        rec.free(100)  # ticket 1 on the consumed slot 1: written at once
        rec.consume(ticket, offset)

    tests = [
        spec,
        invalid,
        _scenario("the example's steps on the unmasked (InfiniBand) counters", ["DeferredFree", "Unmasked"], 2, blocks,
                  0, _spec_defer, masked=False),
        _scenario("the example's steps just below the 32-bit ticket wrap", ["DeferredFree", "TicketWrap"], 2,
                  blocks, (1 << 32) - 2, _spec_defer),
        _scenario("F = 1 < N = 2: an allocation waits for the free that fills its slot", ["AllocWait"], 1, [100], 0,
                  wait_for_free),
        _scenario("N = F = 4, 60 operations: more frees than ring slots", ["Churn"], 2, blocks, 0, _churn(1, 60)),
        _scenario("F = 3 < N = 8, 80 operations", ["Churn"], 3, [0x8000, 0x10000, 0x18000], 0, _churn(2, 80)),
        _scenario("N = F = 2, 80 operations across the ticket wrap", ["Churn", "TicketWrap"], 1, [1, 2],
                  (1 << 32) - 20, _churn(3, 80)),
        _scenario("N = F = 4 unmasked, 60 operations", ["Churn", "Unmasked"], 2, blocks, 0, _churn(4, 60),
                  masked=False),
    ]
    notes = {
        "SpecExample": "The steps the KBTP text describes; outcomes hand-checked against its prose.",
        "DeferredFree": "A free whose Tail slot is not yet consumed is deferred, never overwrites "
                        "(KBTP-FREE-DEFER, KBTP-FREE-NO-OVERWRITE).",
        "OverwriteUnconsumed": "A target that overwrites an unconsumed slot, losing a block (KBTP-FREE-NO-OVERWRITE).",
        "Unmasked": "The unmasked InfiniBand counters (KBTP-IB-UNMASKED): same tickets, slot 16 * (ticket mod N).",
        "TicketWrap": "Tickets pass 0xFFFFFFFF -> 0 during the scenario (KBTP-RING-WRAP).",
        "AllocWait": "An allocation whose slot is not yet written must wait (KBTP-RING-ALLOC-WAIT).",
        "Churn": "Generated from a fixed seed within the quota; outcomes from the reference model (KBTP-RING-NO-LOSS).",
    }
    return _document(KIND_RING_SCENARIO, notes, [{"type": "RingScenarioTest", "tests": tests}])


def generate() -> dict[str, dict[str, Any]]:
    """Every KBTP vector file, keyed by its path relative to the vectors folder."""
    return {
        FILES[KIND_MESSAGE]: _messages_document(),
        FILES[KIND_FETCH_ADD]: _fetch_add_document(),
        FILES[KIND_RING_COUNTER]: _ring_counter_document(),
        FILES[KIND_RING_INIT]: _ring_init_document(),
        FILES[KIND_RING_SCENARIO]: _ring_scenario_document(),
    }
