"""Hypothesis strategies for well-formed KBTP messages (every opcode, every optional part, both byte orders)."""

from __future__ import annotations

from hypothesis import strategies as st

from kvconform.kbtp.constants import Features, GoodbyeFlags, RequestFlags
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
    Load,
    Message,
    Store,
)

u8 = st.integers(0, 0xFF)
u16 = st.integers(0, 0xFFFF)
u32 = st.integers(0, 0xFFFF_FFFF)
u64 = st.integers(0, 0xFFFF_FFFF_FFFF_FFFF)
# flags that do not change the body layout; INLINE and RECORD follow from the parts drawn
plain_flags = st.sampled_from([0, RequestFlags.SEAL, RequestFlags.INVALIDATE, RequestFlags.ALLOW_UNSEALED,
                               RequestFlags.SEAL | RequestFlags.INVALIDATE | RequestFlags.ALLOW_UNSEALED])

data_descriptors = st.builds(DataDescriptor, u32, u64, u32)
completion_descriptors = st.builds(CompletionDescriptor, u32, u64, st.just(0))
direct_descriptors = st.builds(DirectDescriptor, u32, u64, u32)


@st.composite
def loads(draw: st.DrawFn) -> Load:
    completion = draw(st.none() | completion_descriptors)
    flags = draw(plain_flags) | (RequestFlags.RECORD if completion else 0)
    return Load(flags=flags, data=draw(data_descriptors), completion=completion, request_id=draw(u64), handle=draw(u64),
               generation=draw(u16))


@st.composite
def stores(draw: st.DrawFn) -> Store | AllocStore:
    classes: list[type[Store] | type[AllocStore]] = [Store, AllocStore]
    cls = draw(st.sampled_from(classes))
    completion = draw(st.none() | completion_descriptors)
    flags = draw(plain_flags) | (RequestFlags.RECORD if completion else 0)
    inline = draw(st.none() | st.binary(max_size=64))
    if inline is None:
        return cls(flags=flags, data=draw(data_descriptors), completion=completion, request_id=draw(u64),
                   handle=draw(u64), generation=draw(u16))
    return cls(flags=flags | RequestFlags.INLINE, data=DataDescriptor(0, 0, len(inline)), inline=inline,
               completion=completion, request_id=draw(u64), handle=draw(u64),
               generation=draw(u16))


@st.composite
def frees(draw: st.DrawFn) -> Free:
    completion = draw(st.none() | completion_descriptors)
    flags = draw(plain_flags) | (RequestFlags.RECORD if completion else 0)
    return Free(flags=flags, completion=completion, request_id=draw(u64), handle=draw(u64),
               generation=draw(u16))


@st.composite
def hellos(draw: st.DrawFn) -> Hello:
    return Hello(requested_features=draw(u16), completion_credits=draw(u16), initiator_id=draw(st.binary(
        min_size=16, max_size=16)))


@st.composite
def hello_acks(draw: st.DrawFn) -> HelloAck:
    quota = draw(st.integers(0, 1 << 20))
    direct_load = draw(st.none() | st.builds(DirectLoad, direct_descriptors, u64, direct_descriptors, st.just(0)))
    direct_alloc = None
    if draw(st.booleans()):
        n = draw(st.integers(max(1, quota.bit_length()), 28))
        direct_alloc = DirectAlloc(DirectDescriptor(draw(u32), draw(u64), quota),
                                   DirectDescriptor(draw(u32), draw(u64), 1 << n),
                                   DirectDescriptor(draw(u32), draw(u64) & ~7, 1))
    features = draw(u16) & ~(Features.DIRECT_LOAD | Features.DIRECT_ALLOC)
    features |= (Features.DIRECT_LOAD if direct_load else 0) | (Features.DIRECT_ALLOC if direct_alloc else 0)
    return HelloAck(status=draw(st.sampled_from([0, 5, 10])), features=features, request_credits=draw(u16),
                    block_size=draw(u32), max_inline=draw(u32), allocation_quota=quota, handle_base=draw(u64),
                    handle_count=draw(u32), ticket_timeout_ms=draw(u32), direct_load=direct_load,
                    direct_alloc=direct_alloc)


@st.composite
def binds(draw: st.DrawFn) -> Bind:
    return Bind(ticket=draw(u32), data_length=draw(u32), block_offset=draw(u64), request_id=draw(u64), handle=draw(u64),
               generation=draw(u16))


@st.composite
def completions(draw: st.DrawFn) -> Completion:
    return Completion(status=draw(u16), data_length=draw(u32), block_offset=draw(u64), request_id=draw(u64),
                      handle=draw(u64), generation=draw(u16))


@st.composite
def goodbyes(draw: st.DrawFn) -> Goodbye:
    return Goodbye(flags=draw(st.sampled_from([0, GoodbyeFlags.RELEASE])), request_id=draw(u64), handle=draw(u64),
               generation=draw(u16))


messages: st.SearchStrategy[Message] = st.one_of(hellos(), hello_acks(), loads(), stores(), frees(), binds(),
                                                 completions(), goodbyes())
