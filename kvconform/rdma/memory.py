"""What every binding's RNIC checks in its own memory: remote (STag, TO, length, right) and remote invalidation.

One implementation for the emulated fabric and the wire bindings (iWARP, RoCEv2), so that a bad STag,
a window of another stream, a missing access right, a Tagged Offset wrap or an access past the bounds
is judged identically whatever carries it (RFC 5040 §2.2 / §2.6 of rdma-bindings.md). The result is a
`Terminate` in RDMAP terms; the IB/RoCE bindings map it to their NAK syndromes.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TypeAlias

from kvconform.rdma.fabric import (
    U64,
    Access,
    Buffer,
    DdpEType,
    DdpTaggedCode,
    Layer,
    RdmapCode,
    RdmapEType,
    Region,
    Terminate,
    Window,
)

Stags: TypeAlias = Mapping[int, Region | Window]


def resolve(
    stags: Stags, conn: str, stag: int, to: int, length: int, right: Access, *, tagged: bool
) -> tuple[Buffer, int] | Terminate:
    """The buffer and byte offset that (``stag``, ``to``, ``length``) name on the connection endpoint
    ``conn``, or the Terminate its RNIC sends. ``tagged``: an RDMA Write (DDP tagged-buffer errors);
    otherwise a Read Request or an atomic (RDMAP remote-protection errors)."""

    def term(ddp: DdpTaggedCode, rdmap: RdmapCode, why: str) -> Terminate:
        reason = f"{why} (stag {stag:#x}, to {to:#x}, len {length}) at {conn}"
        if tagged:
            return Terminate(Layer.DDP, DdpEType.TAGGED_BUFFER, ddp, reason, conn)
        return Terminate(Layer.RDMAP, RdmapEType.REMOTE_PROTECTION, rdmap, reason, conn)

    obj = stags.get(stag)
    if obj is None:
        return term(DdpTaggedCode.INVALID_STAG, RdmapCode.INVALID_STAG, "invalid STag")
    if isinstance(obj, Window):
        if obj.connection != conn:
            return term(DdpTaggedCode.STAG_NOT_ASSOCIATED, RdmapCode.STAG_NOT_ASSOCIATED,
                        f"window bound to {obj.connection}, not this stream")
        region = obj.region
        if stags.get(region.stag) is not region:
            return term(DdpTaggedCode.INVALID_STAG, RdmapCode.INVALID_STAG, "window's region deregistered")
        base = obj.to(0)
        start = region.offset + obj.offset
    else:
        base = obj.to_base
        start = obj.offset
    if not int(obj.access) & int(right):
        return Terminate(Layer.RDMAP, RdmapEType.REMOTE_PROTECTION, RdmapCode.ACCESS_RIGHTS,
                         f"access rights violation: {right.name} not granted (stag {stag:#x}) at {conn}", conn)
    if to + length > U64 + 1:
        return term(DdpTaggedCode.TO_WRAP, RdmapCode.TO_WRAP, "Tagged Offset wrap")
    off = to - base
    if off < 0 or off + length > obj.length:
        return term(DdpTaggedCode.BASE_BOUNDS, RdmapCode.BASE_BOUNDS,
                    f"base or bounds violation: [{off}, +{length}) outside {obj.length} octets")
    buf = obj.buffer if isinstance(obj, Region) else obj.region.buffer
    return buf, start + off


def atomic_misaligned(to: int, conn: str) -> Terminate | None:
    """RFC 7306: an atomic's Remote Tagged Offset must be 8-octet aligned."""
    if to % 8 == 0:
        return None
    return Terminate(Layer.RDMAP, RdmapEType.REMOTE_OPERATION, RdmapCode.UNSPECIFIED,
                     f"atomic Remote Tagged Offset {to:#x} is not 8-octet aligned (RFC 7306)", conn)


def remote_invalidate_refusal(stags: Stags, conn: str, stag: int) -> Terminate | None:
    """Why a Send with Invalidate of ``stag`` arriving on ``conn`` may not invalidate it (None: it may)."""
    obj = stags.get(stag)
    why = ""
    code = RdmapCode.STAG_CANNOT_BE_INVALIDATED
    if obj is None:
        why, code = "invalid STag", RdmapCode.INVALID_STAG
    elif isinstance(obj, Window):
        if obj.connection != conn:
            why, code = f"window bound to {obj.connection}", RdmapCode.STAG_NOT_ASSOCIATED
    elif not obj.remote_invalidate:
        why = "a plain memory region cannot be remotely invalidated (§2.4)"
    if not why:
        return None
    cannot = code is RdmapCode.STAG_CANNOT_BE_INVALIDATED
    etype = RdmapEType.REMOTE_OPERATION if cannot else RdmapEType.REMOTE_PROTECTION
    return Terminate(Layer.RDMAP, etype, code, f"Send with Invalidate of stag {stag:#x}: {why} at {conn}", conn)
