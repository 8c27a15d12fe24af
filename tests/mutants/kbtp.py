"""Broken KBTP targets and initiators (targets: python:tests.mutants.kbtp:<Name>).

Each class breaks exactly one requirement, named in its docstring's first line; MUTANTS maps it to the
suite and the check functions that must fail. A target mutant is the reference target with one method
overridden; an initiator mutant is the reference initiator (or its driver) with one method overridden.
"""

from __future__ import annotations

import dataclasses
from collections import deque
from collections.abc import Generator
from typing import Any

from kvconform.kbtp.constants import RING_SLOT_SIZE, EntryFlags, Features, RequestFlags, Status
from kvconform.kbtp.freering import FreeRing, TakenTicket
from kvconform.kbtp.initiator import ReferenceInitiator
from kvconform.kbtp.messages import AllocStore, Free, Hello, HelloAck, Load, Message, Store
from kvconform.kbtp.target import ReferenceTarget
from kvconform.rdma import Access, Command, Window, pause
from kvconform.targets.kbtp import OpResult, ReferenceInitiatorDriver, ReferenceInitiatorEndpoint, ReferenceTargetDriver
from tests.mutants import Mutant
from tests.mutants.kbtp_overlap import (  # noqa: F401 - reads issued too early, reached the same way
    ReReadWithBlock,
    SlotReadsInPairs,
)
from tests.mutants.kbtp_ring import (  # noqa: F401 - the ring mutants, reached as python:tests.mutants.kbtp:<name>
    BigEndianRingUnderAddrLe,
    EmptySlotsMarkedZero,
    FreeReturnsToSharedRing,
    TailWrapsLate,
)
from tests.mutants.kbtp_wire import (  # noqa: F401 - the wire mutants, reached as python:tests.mutants.kbtp:<name>
    WireErrorSpreads,
    WireIgnoresCrc,
    WireIgnoresIcrc,
    WireSilentOnBadStag,
    WireTakesUnaskedReadResponse,
)
from tests.mutants.kbtp_wire_attacks import (  # noqa: F401 - issue 23's wire attacks, reached the same way
    WireAcceptsBadMpaKey,
    WireAtomicBoundsAnswered,
    WireAtomicLowBitsIgnored,
    WireDuplicateAtomicExecuted,
    WireDuplicateSendDelivered,
    WireIgnoresMsn,
    WirePsnGapExecuted,
    WireReadPastBoundsAnswered,
    WireTerminateBitfieldsLe,
    WireUnmaskedAtomics,
    WireWriteStartChecked,
)
from tests.mutants.kbtp_wire_faults import (  # noqa: F401 - issue 23's faults on the wire, reached the same way
    WireDuplicatedLinkAtomicTwice,
    WireDuplicateNotAnswered,
    WirePartialFpduRefused,
)

Steps = Generator[Command, Any, Any]


# ---- targets ------------------------------------------------------------------------------------------


class _OffByOneRing(FreeRing):
    def fetch_add_tail(self) -> TakenTicket:
        taken = super().fetch_add_tail()
        return TakenTicket(taken.ticket, RING_SLOT_SIZE * ((taken.ticket + 1) % self.slots))


class _WrapOffByOne(ReferenceTarget):
    ring_class = _OffByOneRing


class RingWrapOffByOne(ReferenceTargetDriver):
    """KBTP-RING-WRAP: the Tail's FetchAdd returns a Slot Offset one slot past 16 * (ticket mod N) (its two fields
    no longer advance together), so a free writes the slot after its ticket's."""

    target_class = _WrapOffByOne


class _GenerationZero(ReferenceTarget):
    def next_generation(self, generation: int) -> int:
        return (generation + 1) % 0x10000


class GenerationWrapsToZero(ReferenceTargetDriver):
    """KBTP-GEN-NONZERO: the Generation wraps from 0xFFFF to 0 instead of skipping zero."""

    target_class = _GenerationZero


class _Overwrites(ReferenceTarget):
    def can_write_slot(self, ring: FreeRing, taken: TakenTicket) -> bool:
        return True


class OverwritesUnconsumedSlot(ReferenceTargetDriver):
    """KBTP-FREE-NO-OVERWRITE: a free writes its slot even when the allocation owning it has not read it."""

    target_class = _Overwrites


class _BindsAbandoned(ReferenceTarget):
    def rule_ticket_not_abandoned(self, ctx: Any) -> Status | None:
        return None

    def rule_bind_slot(self, ctx: Any) -> Status | None:
        return None


class BindsAbandonedTicket(ReferenceTargetDriver):
    """KBTP-TICKET-ABANDONED: a BIND for a reclaimed ticket is accepted."""

    target_class = _BindsAbandoned


class _EntryBeforeData(ReferenceTarget):
    def exec_alloc_store(self, ctx: Any) -> Steps:
        ring = self.ring_for(ctx.record)
        assert ring is not None
        ctx.record.pending_tickets += 1
        taken = self.take_ticket(ring, ctx.record)
        block = yield from self.wait_for_slot(ring, taken)
        yield from self.consume_slot(ring, taken)
        yield from self.bind_entry(ctx, block, ctx.msg.data.length, bool(ctx.flags & RequestFlags.SEAL))
        yield from self.obtain_data(ctx, block)
        ctx.record.pending_tickets -= 1
        self.complete(ctx, Status.OK, self.table.entry(ctx.msg.handle))


class EntryBeforeData(ReferenceTargetDriver):
    """KBTP-ALLOC-ENTRY-ORDER: the table entry is written (VALID, SEALED) before the data."""

    target_class = _EntryBeforeData


class _KeepsQuotaOnReclaim(ReferenceTarget):
    def release_ticket(self, record: Any, ticket: int) -> None:
        super().release_ticket(record, ticket)
        record.pending_tickets += 1  # the reclaimed unit stays in use


class QuotaNotReleasedOnReclaim(ReferenceTargetDriver):
    """KBTP-QUOTA-RELEASE: reclaiming an abandoned ticket does not give the quota unit back."""

    target_class = _KeepsQuotaOnReclaim


class _ReturnsBeforeUnbind(ReferenceTarget):
    def unbind_entry(self, record: Any, handle: int) -> Generator[Command, Any, int]:
        e = self.table.entry(handle)
        yield from self.return_block(self.ring_of_block(e.block_offset), e.block_offset, record)
        yield from pause("late-unbind")
        gen = self.next_generation(e.generation)
        self.table.write_state(handle, EntryFlags(0), gen)
        self.release_quota(record, handle)
        return gen


class FreeReturnsBeforeEntryUpdate(ReferenceTargetDriver):
    """KBTP-FREE-TABLE-FIRST: a free returns the block to the ring before clearing the entry."""

    target_class = _ReturnsBeforeUnbind


class _NoGeneration(ReferenceTarget):
    def rule_generation(self, ctx: Any) -> Status | None:
        return None


class IgnoresGeneration(ReferenceTargetDriver):
    """KBTP-VAL-GENERATION: a request's non-zero Generation is not compared with the entry's."""

    target_class = _NoGeneration


class _LoadsUnsealed(ReferenceTarget):
    def rule_sealed_for_load(self, ctx: Any) -> Status | None:
        return None


class LoadsUnsealed(ReferenceTargetDriver):
    """KBTP-LOAD-SEALED: an unsealed block is loaded without ALLOW_UNSEALED."""

    target_class = _LoadsUnsealed


class _AnyHandle(ReferenceTarget):
    def rule_handle_owned(self, ctx: Any) -> Status | None:
        return None if self.table.contains(ctx.msg.handle) else Status.INVALID_HANDLE


class StoresToOthersHandles(ReferenceTargetDriver):
    """KBTP-VAL-HANDLE: stores and frees of another initiator's handles are accepted."""

    target_class = _AnyHandle


class _CompletionFirst(ReferenceTarget):
    def exec_load(self, ctx: Any) -> Steps:
        s, e = ctx.session, self.table.entry(ctx.msg.handle)
        base = s.slot * self.config.block_size
        self.complete(ctx, Status.OK, e)
        if e.data_length:
            s.staging.write(base, self.pool.read(e.block_offset, e.data_length))
            s.conn.post_write(s.staging.sge(base, e.data_length), ctx.msg.data.stag, ctx.msg.data.tagged_offset,
                              signaled=False)
        yield from ()


class CompletionBeforeData(ReferenceTargetDriver):
    """KBTP-COMP-DATA-READY: a LOAD's COMPLETION is sent before the RDMA Write of its data."""

    target_class = _CompletionFirst


class _RecordOnRdmap(ReferenceTarget):
    def grant_features(self, record: Any, requested: Features) -> Features:
        return Features(super().grant_features(record, requested) | (requested & Features.RECORD_COMPLETION))


class AdvertisesRecordsOnRdmap(ReferenceTargetDriver):
    """KBTP-COMP-NO-RECORD-RDMAP: RECORD_COMPLETION is advertised on the RDMAP binding."""

    target_class = _RecordOnRdmap


class _StealsActiveId(ReferenceTarget):
    def on_hello(self, s: Any, msg: Hello) -> Steps:
        record = self.records.get(bytes(msg.initiator_id))
        if record is not None:
            record.connection = None
        yield from super().on_hello(s, msg)


class AcceptsActiveInitiatorId(ReferenceTargetDriver):
    """KBTP-HELLO-ID-ACTIVE: a HELLO with the Initiator ID of an active session takes that session over."""

    target_class = _StealsActiveId


class _NoFence(ReferenceTarget):
    def fence_direct_alloc(self, s: Any) -> None:
        if not s.closed:
            return  # a reclaim leaves the Partition STag valid
        super().fence_direct_alloc(s)


class ReclaimWithoutFence(ReferenceTargetDriver):
    """KBTP-TICKET-RECLAIM-FENCE: an abandoned ticket is reclaimed while the Partition STag still works."""

    target_class = _NoFence


class _MalformedInternal(ReferenceTarget):
    def on_malformed(self, s: Any, exc: Any) -> Steps:
        exc.status = Status.INTERNAL
        yield from super().on_malformed(s, exc)


class MalformedAsInternal(ReferenceTargetDriver):
    """KBTP-STATUS-MALFORMED: a request that cannot be parsed completes INTERNAL instead of MALFORMED."""

    target_class = _MalformedInternal


class _NoBindSlotCheck(ReferenceTarget):
    def rule_bind_slot(self, ctx: Any) -> Status | None:
        return None


class BindNotVerified(ReferenceTargetDriver):
    """KBTP-BIND-VERIFY: a BIND is not checked against the Block Offset in its ticket's slot."""

    target_class = _NoBindSlotCheck


class _WritableTable(ReferenceTarget):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.table_region = self.node.register(self.table.region.buffer,
                                               Access.LOCAL_WRITE | Access.REMOTE_READ | Access.REMOTE_WRITE)


class WritableTable(ReferenceTargetDriver):
    """KBTP-DLOAD-READONLY: the DIRECT_LOAD Table STag grants remote write access."""

    target_class = _WritableTable


class _NoInvalidate(ReferenceTarget):
    def complete(self, ctx: Any, status: Status, entry: Any = None) -> None:
        msg = ctx.msg
        if msg.flags & RequestFlags.INVALIDATE:
            ctx = dataclasses.replace(ctx, msg=dataclasses.replace(msg, flags=msg.flags & ~RequestFlags.INVALIDATE))
        super().complete(ctx, status, entry)


class IgnoresInvalidate(ReferenceTargetDriver):
    """KBTP-FLAG-INVALIDATE: INVALIDATE is ignored: the completion is a plain Send."""

    target_class = _NoInvalidate


class _WrongRequestId(ReferenceTarget):
    def complete(self, ctx: Any, status: Status, entry: Any = None) -> None:
        ctx = dataclasses.replace(ctx, msg=dataclasses.replace(ctx.msg, request_id=ctx.msg.request_id + 1))
        super().complete(ctx, status, entry)


class WrongRequestIdEcho(ReferenceTargetDriver):
    """KBTP-HDR-REQID-ECHO: a completion carries a Request ID other than its request's."""

    target_class = _WrongRequestId


class _DirectUnasked(ReferenceTarget):
    def grant_features(self, record: Any, requested: Features) -> Features:
        return super().grant_features(record, Features(requested | Features.DIRECT_LOAD))


class DirectLoadUnasked(ReferenceTargetDriver):
    """KBTP-ACK-FEATURES: DIRECT_LOAD (and its STags) is granted to a HELLO that did not request it."""

    target_class = _DirectUnasked


class _SharedRange(ReferenceTarget):
    def admit(self, initiator_id: bytes, requested: Features) -> Any:
        record = super().admit(initiator_id, requested)
        if record is not None:
            record.handle_base = self.config.table_base_handle
        return record


class OverlappingHandleRanges(ReferenceTargetDriver):
    """KBTP-HANDLE-DISJOINT: every initiator gets the same handle range."""

    target_class = _SharedRange


class _ForgetsOnGoodbye(ReferenceTarget):
    def end_session(self, s: Any, release: bool) -> Steps:
        yield from super().end_session(s, True)


class NoRetention(ReferenceTargetDriver):
    """KBTP-RETENTION: bindings are dropped when the session ends without RELEASE."""

    target_class = _ForgetsOnGoodbye


class _KeepsOnRelease(ReferenceTarget):
    def end_session(self, s: Any, release: bool) -> Steps:
        yield from super().end_session(s, False)


class ReleaseIgnored(ReferenceTargetDriver):
    """KBTP-GOODBYE-RELEASE: GOODBYE with RELEASE keeps the initiator's bindings."""

    target_class = _KeepsOnRelease


class _NoQuota(ReferenceTarget):
    def rule_quota(self, ctx: Any) -> Status | None:
        return None if self.ring_for(ctx.record) is not None else Status.NO_SPACE


class NoQuotaCheck(ReferenceTargetDriver):
    """KBTP-QUOTA-NO-SPACE: an allocation over the initiator's quota is served."""

    target_class = _NoQuota


class _NoLengthCheck(ReferenceTarget):
    def rule_store_fits(self, ctx: Any) -> Status | None:
        return None


class NoLengthCheck(ReferenceTargetDriver):
    """KBTP-VAL-LENGTH: a store longer than Block Size is not refused TOO_LARGE."""

    target_class = _NoLengthCheck


class _RecordsAnyway(ReferenceTarget):
    def complete(self, ctx: Any, status: Status, entry: Any = None) -> None:
        ctx.session.granted |= Features.RECORD_COMPLETION
        super().complete(ctx, status, entry)


class RecordsWithoutTheFeature(ReferenceTargetDriver):
    """KBTP-COMP-RECORD-BINDING: a completion record is written on a session without RECORD_COMPLETION."""

    target_class = _RecordsAnyway


class _SendsInsteadOfRecord(ReferenceTarget):
    def complete(self, ctx: Any, status: Status, entry: Any = None) -> None:
        ctx.session.granted &= ~Features.RECORD_COMPLETION
        super().complete(ctx, status, entry)


class CompletionInsteadOfRecord(ReferenceTargetDriver):
    """KBTP-COMP-RECORD: RECORD on a session with RECORD_COMPLETION completes by a COMPLETION message."""

    target_class = _SendsInsteadOfRecord


class _BigEndianTable(ReferenceTarget):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.table.addr_le = False  # entries published with a big-endian Block Offset despite ADDR_LE


class BigEndianTableUnderAddrLe(ReferenceTargetDriver):
    """KBTP-ADDRLE-MEMORY: under ADDR_LE the table entries' Block Offset is written big-endian."""

    target_class = _BigEndianTable


class _BindsOnFailedRead(ReferenceTarget):
    def obtain_data(self, ctx: Any, block: int) -> Generator[Command, Any, bool]:
        yield from super().obtain_data(ctx, block)
        return True


class BindsAfterFailedRead(ReferenceTargetDriver):
    """KBTP-VAL-NO-EFFECT: an ALLOC_STORE whose source cannot be read still binds the handle."""

    target_class = _BindsOnFailedRead


class _StoreKeepsLength(ReferenceTarget):
    def exec_store(self, ctx: Any) -> Steps:
        h = ctx.msg.handle
        e = self.table.entry(h)
        ok = yield from self.obtain_data(ctx, e.block_offset)
        if not ok:
            return
        if ctx.flags & RequestFlags.SEAL:
            self.table.write_state(h, e.flags | EntryFlags.SEALED, e.generation)
        self.complete(ctx, Status.OK, self.table.entry(h))


class StoreKeepsDataLength(ReferenceTargetDriver):
    """KBTP-STORE-DATA: a mapped store does not update the entry's Data Length."""

    target_class = _StoreKeepsLength


class _HelloAckGeneration(ReferenceTarget):
    def hello_ack(self, s: Any, record: Any, granted: Features) -> HelloAck:
        return dataclasses.replace(super().hello_ack(s, record, granted), generation=1)


class HelloAckWithGeneration(ReferenceTargetDriver):
    """KBTP-HELLO-HEADER-ZERO: HELLO_ACK carries Generation 1 in its common header."""

    target_class = _HelloAckGeneration


class _NoDirectLoad(ReferenceTarget):
    def grant_features(self, record: Any, requested: Features) -> Features:
        return Features(super().grant_features(record, requested) & ~Features.DIRECT_LOAD)


class NeverOffersDirectLoad(ReferenceTargetDriver):
    """KBTP-ACK-FEATURES: DIRECT_LOAD, which the target declares, is never granted in HELLO_ACK."""

    target_class = _NoDirectLoad


class _MoreQuota(ReferenceTarget):
    def quota_for(self, initiator_id: bytes) -> int:
        return super().quota_for(initiator_id) + 1


class GrantsMoreQuota(ReferenceTargetDriver):
    """KBTP-OPS-SESSION-FIXED: sessions are set up with one Allocation Quota unit more than declared."""

    target_class = _MoreQuota


class _FreeKeepsQuota(ReferenceTarget):
    def release_quota(self, record: Any, handle: int) -> None:
        record.bound.discard(handle)
        record.pending_tickets += 1  # the freed unit stays in use


class FreeKeepsQuota(ReferenceTargetDriver):
    """KBTP-QUOTA-RELEASE: a completed FREE does not give the quota unit back."""

    target_class = _FreeKeepsQuota


class _OwnHandlesOnly(ReferenceTarget):
    def rule_handle_readable(self, ctx: Any) -> Status | None:
        return self.rule_handle_owned(ctx)


class RefusesCrossLoad(ReferenceTargetDriver):
    """KBTP-LOAD-ANY: a LOAD of another initiator's handle is refused although the target declares it allows it."""

    target_class = _OwnHandlesOnly


class _InlineShifted(ReferenceTarget):
    def obtain_data(self, ctx: Any, block: int) -> Generator[Command, Any, bool]:
        if ctx.msg.inline is not None:
            self.pool.write(block, b"\0" + ctx.msg.inline)
            return True
        return (yield from super().obtain_data(ctx, block))


class InlineDataShifted(ReferenceTargetDriver):
    """KBTP-EX-ALLOC-STORE: inline data is written one octet into the block (the example's block reads wrong)."""

    target_class = _InlineShifted


def _completion_flags(conn: Any) -> None:
    """Make ``conn``'s COMPLETION messages carry Flags 0x0001 (octets 2-3 of the header)."""
    post_send = conn.post_send

    def send(data: bytes, *args: Any, **kwargs: Any) -> Any:
        if len(data) >= 4 and data[1] == 0x20:
            data = data[:2] + b"\x00\x01" + data[4:]
        return post_send(data, *args, **kwargs)

    conn.post_send = send


class _CompletionFlags(ReferenceTarget):
    def accept(self, conn: Any) -> Any:
        _completion_flags(conn)
        return super().accept(conn)


class CompletionWithFlags(ReferenceTargetDriver):
    """KBTP-EX-COMPLETION: COMPLETION messages carry Flags 0x0001 where the example has none."""

    target_class = _CompletionFlags


class _BlockNumbers(ReferenceTarget):
    def complete(self, ctx: Any, status: Status, entry: Any = None) -> None:
        if entry is not None and entry.block_offset:
            entry = dataclasses.replace(entry, block_offset=self.pool.index_of(entry.block_offset))
        super().complete(ctx, status, entry)


class BlockNumbersInCompletions(ReferenceTargetDriver):
    """KBTP-POOL-OFFSETS: completions carry the block's number instead of its Block Offset."""

    target_class = _BlockNumbers


class _WholeBlock(ReferenceTarget):
    def exec_load(self, ctx: Any) -> Steps:
        s, e = ctx.session, self.table.entry(ctx.msg.handle)
        base, n = s.slot * self.config.block_size, min(self.config.block_size, ctx.msg.data.length)
        s.staging.write(base, self.pool.read(e.block_offset, n))
        s.conn.post_write(s.staging.sge(base, n), ctx.msg.data.stag, ctx.msg.data.tagged_offset, signaled=False)
        self.complete(ctx, Status.OK, e)
        yield from ()


class LoadWritesWholeBlock(ReferenceTargetDriver):
    """KBTP-LOAD-WRITE: a LOAD writes the whole block (up to the buffer), not Data Length octets."""

    target_class = _WholeBlock


class _StoresIntoSealed(ReferenceTarget):
    def rule_not_sealed(self, ctx: Any) -> Status | None:
        return None


class StoresIntoSealed(ReferenceTargetDriver):
    """KBTP-SEAL-IMMUTABLE: a STORE into a sealed block is carried out."""

    target_class = _StoresIntoSealed


class _FreeKeepsValid(ReferenceTarget):
    def unbind_entry(self, record: Any, handle: int) -> Generator[Command, Any, int]:
        e = self.table.entry(handle)
        gen = self.next_generation(e.generation)
        self.table.write_state(handle, e.flags, gen)  # VALID (and SEALED) stay
        yield from self.return_block(self.ring_of_block(e.block_offset), e.block_offset, record)
        self.release_quota(record, handle)
        return gen


class FreeKeepsEntryValid(ReferenceTargetDriver):
    """KBTP-FREE-ENTRY: a FREE changes the Generation but leaves VALID and SEALED set."""

    target_class = _FreeKeepsValid


class _LongerTimeoutAdvertised(ReferenceTarget):
    def hello_ack(self, s: Any, record: Any, granted: Features) -> HelloAck:
        ack = super().hello_ack(s, record, granted)
        return dataclasses.replace(ack, ticket_timeout_ms=ack.ticket_timeout_ms * 4)


class ReclaimsBeforeTheTimeout(ReferenceTargetDriver):
    """KBTP-TICKET-TIMEOUT: tickets are reclaimed at a quarter of the Ticket Timeout HELLO_ACK advertises."""

    target_class = _LongerTimeoutAdvertised


class _ReclaimLosesBlock(ReferenceTarget):
    def reclaim(self, record: Any, ticket: int) -> Steps:
        p = record.partition
        taken = TakenTicket(ticket, p.ring.slot_offset_of(ticket))
        yield from self.wait_for_slot(p.ring, taken)
        yield from self.consume_slot(p.ring, taken)
        self.release_ticket(record, ticket)  # the block never goes back to the ring


class ReclaimLosesBlock(ReferenceTargetDriver):
    """KBTP-TICKET-RECLAIM: an abandoned ticket's block is not returned to the ring."""

    target_class = _ReclaimLosesBlock


class _PoolCountOff(ReferenceTarget):
    def hello_ack(self, s: Any, record: Any, granted: Features) -> HelloAck:
        ack = super().hello_ack(s, record, granted)
        if ack.direct_load is None:
            return ack
        pool = dataclasses.replace(ack.direct_load.pool, count=ack.direct_load.pool.count - 1)
        return dataclasses.replace(ack, direct_load=dataclasses.replace(ack.direct_load, pool=pool))


class WrongPoolCount(ReferenceTargetDriver):
    """KBTP-ACK-DLOAD-DESC: the Pool descriptor's Count is F - 1."""

    target_class = _PoolCountOff


class _TableBlockNumbers(ReferenceTarget):
    def bind_entry(self, ctx: Any, block: int, length: int, seal: bool) -> Steps:
        yield from super().bind_entry(ctx, block, length, seal)
        self.table.write_location(ctx.msg.handle, length, self.pool.index_of(block))


class TableHoldsBlockNumbers(ReferenceTargetDriver):
    """KBTP-POOL-BLOCKS: table entries hold the block's number, which is no Block Offset of the pool."""

    target_class = _TableBlockNumbers


class _HeadMisaligned(ReferenceTarget):
    def hello_ack(self, s: Any, record: Any, granted: Features) -> HelloAck:
        ack = super().hello_ack(s, record, granted)
        if ack.direct_alloc is None:
            return ack
        head = dataclasses.replace(ack.direct_alloc.head, tagged_offset=ack.direct_alloc.head.tagged_offset + 4)
        return dataclasses.replace(ack, direct_alloc=dataclasses.replace(ack.direct_alloc, head=head))


class HeadMisaligned(ReferenceTargetDriver):
    """KBTP-ACK-HEAD-ALIGN: the Head descriptor's Tagged Offset is not a multiple of 8."""

    target_class = _HeadMisaligned


class _EmptySequences(FreeRing):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        for s in range(self.free_blocks, self.slots):
            self.write_slot_sequence(s * RING_SLOT_SIZE, s)  # not s - N


class _EmptySequencesTarget(ReferenceTarget):
    ring_class = _EmptySequences


class RingInitEmptySequences(ReferenceTargetDriver):
    """KBTP-RING-INIT: slots F..N-1 start with Sequence s instead of s - N (mod 2^32)."""

    target_class = _EmptySequencesTarget


class _HeadAtOne(FreeRing):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.head_region.write_u64(0, self.layout.initial_head(1))


class _HeadAtOneTarget(ReferenceTarget):
    ring_class = _HeadAtOne


class HeadStartsAtTicketOne(ReferenceTargetDriver):
    """KBTP-RING-INIT: the Head starts at Ticket 1 instead of Ticket 0 and Slot Offset 0."""

    target_class = _HeadAtOneTarget


class HeadStartsAtTicketOneUnmasked(HeadStartsAtTicketOne):
    """KBTP-RING-INIT: the Head starts at Ticket 1 instead of Ticket 0 (run on the unmasked InfiniBand binding)."""


class _WidePartition(ReferenceTarget):
    def hello_ack(self, s: Any, record: Any, granted: Features) -> HelloAck:
        ack = super().hello_ack(s, record, granted)
        if ack.direct_alloc is None:
            return ack
        wide = self.node.bind_window(self.pool_rw, 0, self.pool_rw.length, Access.REMOTE_WRITE, s.conn)
        s.windows.append(wide)
        part = dataclasses.replace(ack.direct_alloc.partition, stag=wide.stag)
        return dataclasses.replace(ack, direct_alloc=dataclasses.replace(ack.direct_alloc, partition=part))


class PartitionCoversThePool(ReferenceTargetDriver):
    """KBTP-ACK-PARTITION-SCOPE: the Partition STag reaches the whole pool, not just the partition."""

    target_class = _WidePartition


class _SequenceFirst(ReferenceTarget):
    def return_block(self, ring: FreeRing, block: int, record: Any) -> Steps:
        yield from pause(f"tail.{ring.name}")
        taken = ring.fetch_add_tail()
        if not self.can_write_slot(ring, taken):
            ring.deferred.setdefault(taken.index, deque()).append((taken.ticket, block))
            return
        ring.write_slot_sequence(taken.slot_offset, taken.ticket)
        yield from pause(f"slot-seq.{ring.name}.{taken.ticket}")
        ring.write_slot_block(taken.slot_offset, block)


class SequenceBeforeBlock(ReferenceTargetDriver):
    """KBTP-FREE-SLOT-ORDER: a free writes the slot's Sequence before its Block Offset."""

    target_class = _SequenceFirst


class _NeverConsumes(ReferenceTarget):
    def consume_slot(self, ring: FreeRing, taken: TakenTicket) -> Steps:
        yield from ()  # the slot keeps its block: frees landing on it wait for ever


class SlotsNeverConsumed(ReferenceTargetDriver):
    """KBTP-RING-CONSUME: allocations never mark their slot consumed, so frees on it are deferred for ever and,
    once the ring has gone round, an allocation within quota waits for a block that never comes (the hang is
    diagnosed on the DIRECT_ALLOC partition ring: its slot reads unconsumed after BIND)."""

    target_class = _NeverConsumes


# ---- kbtp-target, issue 11 (suite power; helper kbtp-target): classes ------------------------------------


class WrapsToZeroFromGenerationOne(ReferenceTargetDriver):
    """KBTP-GEN-NONZERO: entries start at Generation 1 (no preset near the wrap) and the Generation wraps
    from 0xFFFF to 0: only a drive through all 2^16 values reaches it."""

    target_class = _GenerationZero
    start_generation = None


class _SealedInlineOnly(ReferenceTarget):
    def rule_not_sealed(self, ctx: Any) -> Status | None:
        return super().rule_not_sealed(ctx) if ctx.msg.inline is not None else None


class SealedCheckedOnInlineStoresOnly(ReferenceTargetDriver):
    """KBTP-STORE-UNSEALED: a STORE by RDMA Read into a sealed block is carried out (only inline STOREs are
    refused SEALED)."""

    target_class = _SealedInlineOnly


class _PartialLoad(ReferenceTarget):
    def rule_load_fits(self, ctx: Any) -> Status | None:
        status = super().rule_load_fits(ctx)
        if status is not None and ctx.msg.data.length:  # the descriptor's worth of the block goes out first
            s, e = ctx.session, self.table.entry(ctx.msg.handle)
            base = s.slot * self.config.block_size
            s.staging.write(base, self.pool.read(e.block_offset, ctx.msg.data.length))
            s.conn.post_write(s.staging.sge(base, ctx.msg.data.length), ctx.msg.data.stag,
                              ctx.msg.data.tagged_offset, signaled=False)
        return status


class LoadWritesBeforeTooLarge(ReferenceTargetDriver):
    """KBTP-VAL-NO-EFFECT: a LOAD refused TOO_LARGE first writes the descriptor's Length of the block into the
    initiator's buffer."""

    target_class = _PartialLoad


class _RefusedFreeReleases(ReferenceTarget):
    def rule_generation(self, ctx: Any) -> Status | None:
        status = super().rule_generation(ctx)
        if status is not None and ctx.opcode.name == "FREE":
            ctx.record.bound.discard(ctx.msg.handle)  # the refused FREE still gives the quota unit back
        return status


class RefusedFreeReleasesQuota(ReferenceTargetDriver):
    """KBTP-VAL-NO-EFFECT: a FREE refused STALE_GENERATION releases the handle's unit of quota usage."""

    target_class = _RefusedFreeReleases


class _TicketBeforeLength(ReferenceTarget):
    def rule_store_fits(self, ctx: Any) -> Status | None:
        status = super().rule_store_fits(ctx)
        ring = self.ring_for(ctx.record)
        if status is not None and ctx.opcode.name == "ALLOC_STORE" and ring is not None:
            ring.fetch_add_head()  # a ticket taken before the length check, and never consumed
        return status


class OversizeAllocStrandsTicket(ReferenceTargetDriver):
    """KBTP-VAL-NO-EFFECT: an ALLOC_STORE refused TOO_LARGE has already taken a ring ticket, whose slot is never
    consumed: a block is stranded, and once the ring comes round a free waits on that slot for ever."""

    target_class = _TicketBeforeLength


class _Length16(ReferenceTarget):
    def rule_store_fits(self, ctx: Any) -> Status | None:
        if ctx.msg.inline is None and (ctx.msg.data.length & 0xFFFF) <= self.config.block_size:
            return None  # the length compared in 16 bits
        return super().rule_store_fits(ctx)


class LengthComparedIn16Bits(ReferenceTargetDriver):
    """KBTP-VAL-LENGTH: a Data Descriptor Length is compared with Block Size in its low 16 bits only."""

    target_class = _Length16


class _RangeInclusive(ReferenceTarget):
    def rule_handle_owned(self, ctx: Any) -> Status | None:
        h, r = ctx.msg.handle, ctx.record
        return None if r.handle_base <= h <= r.handle_base + r.handle_count and self.table.contains(h) \
            else Status.INVALID_HANDLE


class HandleRangeOffByOne(ReferenceTargetDriver):
    """KBTP-ALLOC-OWN-RANGE: the handle one past the end of the initiator's range counts as its own."""

    target_class = _RangeInclusive


class _GenerationLowOctet(ReferenceTarget):
    def rule_generation(self, ctx: Any) -> Status | None:
        g = ctx.msg.generation
        return Status.STALE_GENERATION if g and (g ^ self.table.entry(ctx.msg.handle).generation) & 0xFF else None


class GenerationComparedOnLowOctet(ReferenceTargetDriver):
    """KBTP-VAL-GENERATION: the request Generation is compared with the entry's in its low octet only."""

    target_class = _GenerationLowOctet


class _ZeroLengthLoad(ReferenceTarget):
    def rule_load_fits(self, ctx: Any) -> Status | None:
        return None if ctx.msg.data.length == 0 else super().rule_load_fits(ctx)


class ZeroLengthLoadUnchecked(ReferenceTargetDriver):
    """KBTP-LOAD-FITS: a LOAD descriptor Length of zero is taken as "no limit": the block is written anyway."""

    target_class = _ZeroLengthLoad


class _BindLength(ReferenceTarget):
    def rule_bind_fits(self, ctx: Any) -> Status | None:
        return None


class BindLengthUnchecked(ReferenceTargetDriver):
    """KBTP-VAL-LENGTH: a BIND's Data Length is not compared with Block Size."""

    target_class = _BindLength


class _BindAnyHandle(ReferenceTarget):
    def rules_for(self, opcode: Any) -> list[Any]:
        rules = super().rules_for(opcode)
        if opcode.name == "BIND":
            return [r for r in rules if r.__name__ != "rule_handle_owned"]
        return rules


class BindHandleUnchecked(ReferenceTargetDriver):
    """KBTP-VAL-HANDLE: a BIND's handle is not checked against the initiator's range."""

    target_class = _BindAnyHandle


class _EmptySlotsHoldABlock(FreeRing):
    def __init__(self, node: Any, name: str, block_offsets: Any, **kw: Any) -> None:
        super().__init__(node, name, block_offsets, **kw)
        for s in range(len(block_offsets), self.slots):  # {Sequence s, the first block}: not marked empty
            self.write_slot_block(s * RING_SLOT_SIZE, block_offsets[0])
            self.write_slot_sequence(s * RING_SLOT_SIZE, s)


class _EmptySlotsNotEmpty(ReferenceTarget):
    ring_class = _EmptySlotsHoldABlock


class EmptySlotsNotInitialisedEmpty(ReferenceTargetDriver):
    """KBTP-RING-INIT: slots F..N-1 start as {Sequence s, the first block} instead of {s - N, all ones}, so
    with F < N an allocation of the first lap hands out the first block a second time."""

    target_class = _EmptySlotsNotEmpty


class _TailUnwrapped(FreeRing):
    def __init__(self, node: Any, name: str, block_offsets: Any, **kw: Any) -> None:
        super().__init__(node, name, block_offsets, **kw)
        if self.layout.masked:  # Slot Offset 16 * F, not 16 * (F mod N): the same as the text's when F < N
            f = len(block_offsets)
            self.buffer.write_u64(self._tail_at, (f << 32) | (RING_SLOT_SIZE * f))


class _TailUnwrappedTarget(ReferenceTarget):
    ring_class = _TailUnwrapped


class TailNotWrappedWhenFull(ReferenceTargetDriver):
    """KBTP-RING-INIT: the Tail starts at Slot Offset 16 * F instead of 16 * (F mod N), so on a ring with
    F == N the first free lands past the last slot and its block never comes back."""

    target_class = _TailUnwrappedTarget


# issue 11: trust


class _TrustsEveryone(ReferenceTarget):
    def trusts_direct(self, record: Any) -> bool:
        return True


class DirectModesForEveryone(ReferenceTargetDriver):
    """KBTP-DIRECT-TRUST: the configured untrusted Initiator IDs are ignored: every initiator asking for a direct
    mode gets it, with the STags of the table, pool, partition, ring and Head."""

    target_class = _TrustsEveryone


class _TrustByIdPrefix(ReferenceTarget):
    def trusts_direct(self, record: Any) -> bool:
        prefixes = {i[:8] for i in self.config.untrusted_initiators}
        return not self.config.multi_domain and record.initiator_id[:8] not in prefixes


class DistrustsByIdPrefix(ReferenceTargetDriver):
    """KBTP-ACK-FEATURES: Initiator IDs are matched against the untrusted list on their first 8 octets, so a
    trusted initiator whose ID shares them with an untrusted one is denied the declared direct features."""

    target_class = _TrustByIdPrefix


# ---- initiators -----------------------------------------------------------------------------------------


class _SingleRead(ReferenceInitiator):
    def direct_load(self, handle: int, generation: int = 0, *, allow_unsealed: bool = False) -> Any:
        from kvconform.kbtp.initiator import DirectLoadResult

        first = yield from self.read_entry(handle)
        if not first.flags & 0x0001:
            return DirectLoadResult(Status.NOT_VALID, first, None, None)
        data = yield from self.read_block(first.block_offset, first.data_length)
        return DirectLoadResult(Status.OK, first, first, data)


class SingleEntryRead(ReferenceInitiatorDriver):
    """KBTP-DLOAD-SEQUENCE: a direct load reads the entry once, not again after the block."""

    initiator_class = _SingleRead


class _AnyGenerationUsable(ReferenceInitiator):
    @staticmethod
    def usable(first: Any, second: Any) -> bool:
        both = 0x0003
        return bool(first.flags & both == both and second.flags & both == both)


class IgnoresGenerationChange(ReferenceInitiatorDriver):
    """KBTP-DLOAD-VALIDITY: direct-loaded data is accepted although the two entry reads differ in Generation."""

    initiator_class = _AnyGenerationUsable


class _NoConfirm(ReferenceInitiator):
    def await_slot(self, ticket: int, slot_offset: int) -> Any:
        polls = 0
        while polls < self.max_polls:
            slot = yield from self.read_slot(slot_offset)
            polls += 1
            if slot.sequence == ticket and not slot.consumed:
                return slot.block_offset, polls
        return None, polls


class NoSlotConfirmation(ReferenceInitiatorDriver):
    """KBTP-DALLOC-SLOT-READ: the slot is not read once more to confirm Sequence and Block Offset."""

    initiator_class = _NoConfirm


class _BindFirst(ReferenceInitiator):
    def direct_alloc(self, handle: int, data: bytes, *, bind: bool = True) -> Any:
        from kvconform.kbtp.initiator import DirectAllocResult

        ticket, offset = yield from self.take_ticket()
        block, polls = yield from self.await_slot(ticket, offset)
        if block is None:
            return DirectAllocResult(ticket, offset, None, None, polls)
        result = yield from self.bind(handle, ticket, len(data), block)
        yield from self.write_block(block, data)
        return DirectAllocResult(ticket, offset, block, result, polls)


class BindBeforeWrite(ReferenceInitiatorDriver):
    """KBTP-DALLOC-WRITE-THEN-BIND: BIND is sent before the data is written into the block."""

    initiator_class = _BindFirst


class _WritesSlot(ReferenceInitiator):
    def await_slot(self, ticket: int, slot_offset: int) -> Any:
        block, polls = yield from super().await_slot(ticket, slot_offset)
        ack = self.ack
        assert ack is not None and ack.direct_alloc is not None
        self.scratch.write(48, b"\xff" * 8)
        self.conn.post_write(self.scratch.sge(48, 8), ack.direct_alloc.ring.stag,
                             ack.direct_alloc.ring.tagged_offset + slot_offset + 8, signaled=False)
        return block, polls


class WritesRingSlot(ReferenceInitiatorDriver):
    """KBTP-DALLOC-NO-SLOT-WRITE: the initiator marks its slot consumed itself with an RDMA Write."""

    initiator_class = _WritesSlot


class _NoQuotaEndpoint(ReferenceInitiatorEndpoint):
    def _room(self) -> bool:
        return True


class IgnoresQuota(ReferenceInitiatorDriver):
    """KBTP-QUOTA-INITIATOR: allocations beyond the Allocation Quota are sent to the target."""

    def start(self, fabric: Any, node: Any, conn: Any, params: Any) -> Any:
        ep = super().start(fabric, node, conn, params)
        return _NoQuotaEndpoint(ep.ini)  # type: ignore[attr-defined]


class _BigEndian(ReferenceInitiator):
    def send(self, msg: Message) -> None:
        self.send_raw(msg.encode_raw(addr_le=False))


class BigEndianUnderAddrLe(ReferenceInitiatorDriver):
    """KBTP-ADDRLE-INITIATOR: under ADDR_LE the Block Handle and descriptors are still big-endian."""

    initiator_class = _BigEndian


class _ConstantId(ReferenceInitiator):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.initiator_id = bytes(range(16))


class ConstantInitiatorId(ReferenceInitiatorDriver):
    """KBTP-HELLO-ID-ENTROPY: every initiator uses the same Initiator ID."""

    initiator_class = _ConstantId


class _AnyGeneration(ReferenceInitiator):
    def load(self, handle: int, generation: int = 0, **kwargs: Any) -> Any:
        return (yield from super().load(handle, 0, **kwargs))

    def free(self, handle: int, generation: int = 0, **kwargs: Any) -> Any:
        return (yield from super().free(handle, 0, **kwargs))


class DropsGeneration(ReferenceInitiatorDriver):
    """KBTP-HDR-GEN-REQUEST: requests carry Generation 0 instead of the Generation the caller expects."""

    initiator_class = _AnyGeneration


class _OneWindow(ReferenceInitiator):
    _kept: Window | None = None

    def window(self, length: int, access: Access) -> Window:
        if self._kept is None:
            self._kept = self.node.bind_window(self._data_region(), 0, self._data_region().length,
                                               Access.REMOTE_WRITE | Access.REMOTE_READ, self.conn)
        return self._kept

    def revoke(self, stag: int | None, invalidated: int | None) -> None:
        return None


class ReusesOneStag(ReferenceInitiatorDriver):
    """KBTP-SEC-SINGLE-USE-STAG: one STag serves every request and stays valid."""

    initiator_class = _OneWindow

    def start(self, fabric: Any, node: Any, conn: Any, params: Any) -> Any:
        return super().start(fabric, node, conn, dataclasses.replace(params, requests_invalidate=False))


class _StatusInRequests(ReferenceInitiator):
    def send_raw(self, raw: bytes) -> None:
        if raw[1] in (0x10, 0x11, 0x12, 0x13):  # LOAD, STORE, ALLOC_STORE, FREE: Status 1 in the header
            raw = raw[:22] + (1).to_bytes(2, "big") + raw[24:]
        super().send_raw(raw)


class RequestsWithStatus(ReferenceInitiatorDriver):
    """KBTP-HDR-STATUS-ZERO: requests carry Status 1 in their common header."""

    initiator_class = _StatusInRequests


class _HelloWithRequestId(ReferenceInitiator):
    def send_raw(self, raw: bytes) -> None:
        if raw[1] == 0x01:  # HELLO: put a Request ID in the header
            raw = raw[:4] + (7).to_bytes(8, "big") + raw[12:]
        super().send_raw(raw)


class HelloWithRequestId(ReferenceInitiatorDriver):
    """KBTP-HELLO-HEADER-ZERO: HELLO carries a non-zero Request ID."""

    initiator_class = _HelloWithRequestId


class _OutOfRange(ReferenceInitiator):
    def alloc_store(self, handle: int, data: bytes, generation: int = 0, **kwargs: Any) -> Any:
        assert self.ack is not None
        return (yield from super().alloc_store(handle + self.ack.handle_count, data, generation, **kwargs))


class AllocatesOutsideItsRange(ReferenceInitiatorDriver):
    """KBTP-HANDLE-OWN-RANGE: unmapped stores name handles past the end of the initiator's range."""

    initiator_class = _OutOfRange


class _InlineLength(ReferenceInitiator):
    def send(self, msg: Message) -> None:
        if isinstance(msg, AllocStore | Store) and msg.inline is not None:
            msg = dataclasses.replace(msg, data=dataclasses.replace(msg.data, length=msg.data.length + 1))
            self.send_raw(msg.encode_raw(addr_le=self.addr_le))
            return
        super().send(msg)


class InlineDescriptorLength(ReferenceInitiatorDriver):
    """KBTP-DESC-INLINE: with INLINE the Data Descriptor's Length is one more than the inline data."""

    initiator_class = _InlineLength


class _NoGoodbye(ReferenceInitiator):
    def goodbye(self, release: bool = False) -> Any:
        yield from ()


class NoGoodbye(ReferenceInitiatorDriver):
    """KBTP-GOODBYE: asked to end its session, the initiator sends no GOODBYE."""

    initiator_class = _NoGoodbye


class _UnmaskedOnRdmap(ReferenceInitiator):
    def ring_layout(self) -> Any:
        layout = super().ring_layout()
        return dataclasses.replace(layout, masked=False) if layout.masked else layout


class UnmaskedFetchAddOnRdmap(ReferenceInitiatorDriver):
    """KBTP-DALLOC-FETCHADD: on RDMAP the initiator FetchAdds its Head with the unmasked InfiniBand Add Data."""

    initiator_class = _UnmaskedOnRdmap


class _SkipsDirectFrees(ReferenceInitiatorEndpoint):
    def __init__(self, ini: Any) -> None:
        super().__init__(ini)
        self.direct: set[int] = set()

    def direct_alloc(self, handle: int, data: bytes) -> Any:
        self.direct.add(handle)
        return (yield from super().direct_alloc(handle, data))

    def free(self, handle: int, *, generation: int = 0) -> Any:
        if handle in self.direct:
            self.bound.discard(handle)
            return OpResult(Status.OK, detail="not sent: the block was allocated directly")
        return (yield from super().free(handle, generation=generation))


class SkipsFreeOfDirectBlocks(ReferenceInitiatorDriver):
    """KBTP-DALLOC-FREE: blocks bound by direct allocation are never freed with FREE."""

    def start(self, fabric: Any, node: Any, conn: Any, params: Any) -> Any:
        ep = super().start(fabric, node, conn, params)
        return _SkipsDirectFrees(ep.ini)  # type: ignore[attr-defined]


# ---- initiators: issue 11 (kbtp-initiator) --------------------------------------------------------------


class _Pipelined(ReferenceInitiator):
    """Matches answers to requests by Request ID, so any number of its requests can be outstanding."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._answers: dict[int, Any] = {}
        self._pumping = False
        self._preset: Any = None

    def next_answer(self) -> Any:
        if self._preset is not None:
            answer, self._preset = self._preset, None
            return answer
        return (yield from super().next_answer())

    def _finish(self, request_id: int, stag: int | None) -> Any:
        from kvconform.kbtp.initiator import InitiatorError
        from kvconform.rdma.fabric import wait_until

        while request_id not in self._answers:
            if self._pumping:  # another request's actor is reading the completion queue
                ok = yield from wait_until(lambda: request_id in self._answers or not self._pumping,
                                           timeout=self.timeout_s)
                if not ok:
                    raise InitiatorError(f"no answer to request {request_id}")
                continue
            self._pumping = True
            try:
                answer = yield from super().next_answer()
            finally:
                self._pumping = False
            msg, _, _, record = answer
            rid = record.request_id if record is not None else msg.request_id  # type: ignore[union-attr]
            self._answers[int(rid)] = answer
        self._preset = self._answers.pop(request_id)
        return (yield from super()._finish(request_id, stag))


class _UnqueuedEndpoint(ReferenceInitiatorEndpoint):
    def serial(self, op: Any) -> Any:
        return (yield from op)


class PipelinesBeyondCredits(ReferenceInitiatorDriver):
    """KBTP-INIT-REQUEST-CREDITS: every operation asked for is sent at once, whatever Request Credits were granted."""

    initiator_class = _Pipelined

    def start(self, fabric: Any, node: Any, conn: Any, params: Any) -> Any:
        ep = super().start(fabric, node, conn, params)
        return _UnqueuedEndpoint(ep.ini)  # type: ignore[attr-defined]


class _WholeBufferWindow(ReferenceInitiator):
    def window(self, length: int, access: Access) -> Window:
        region = self._data_region()
        return self.node.bind_window(region, 0, region.length, access, self.conn)


class WindowWiderThanDescriptor(ReferenceInitiatorDriver):
    """KBTP-SEC-EXPOSE-DESCRIBED: each request's STag covers the whole data buffer, not the Length it names."""

    initiator_class = _WholeBufferWindow


class _EagerRecordSlot(ReferenceInitiator):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        assert self.records.stag  # registered (remotely writable) before any request names it


class ExposesUnnamedRecordSlot(ReferenceInitiatorDriver):
    """KBTP-SEC-EXPOSE-DESCRIBED: a remotely writable completion record slot is registered though no request
    ever names it."""

    initiator_class = _EagerRecordSlot


class _SignedTicket(ReferenceInitiator):
    def take_ticket(self) -> Any:
        ticket, offset = yield from super().take_ticket()
        return (ticket - (1 << 32) if ticket >= 1 << 31 else ticket), offset  # an int32_t ticket


class SignedTickets(ReferenceInitiatorDriver):
    """KBTP-RING-COUNTER-FIELDS: the Ticket is kept as a signed 32-bit integer, so a ticket with bit 31 set never
    matches its slot's Sequence."""

    initiator_class = _SignedTicket


class _BigEndianDescriptors(ReferenceInitiator):
    def send(self, msg: Message) -> None:
        raw = msg.encode_raw(addr_le=self.addr_le)
        if self.addr_le and isinstance(msg, Load | Store | AllocStore):
            raw = raw[:24] + msg.data.pack(False) + raw[40:]  # the Data Descriptor follows the 24-octet header
        self.send_raw(raw)


class BigEndianDescriptorsUnderAddrLe(ReferenceInitiatorDriver):
    """KBTP-ADDRLE-INITIATOR: under ADDR_LE the Block Handle is little-endian but the Data Descriptor big-endian."""

    initiator_class = _BigEndianDescriptors


class _StoreStagKept(ReferenceInitiator):
    _keep = False

    def store(self, handle: int, data: bytes, generation: int = 0, **kwargs: Any) -> Any:
        self._keep = True
        try:
            return (yield from super().store(handle, data, generation, **{**kwargs, "invalidate": False}))
        finally:
            self._keep = False

    def revoke(self, stag: int | None, invalidated: int | None) -> None:
        if not self._keep:
            super().revoke(stag, invalidated)


class StoreStagKept(ReferenceInitiatorDriver):
    """KBTP-SEC-SINGLE-USE-STAG: a mapped STORE by RDMA Read leaves its STag valid (loads and unmapped stores do
    not)."""

    initiator_class = _StoreStagKept


class _AllOnesAsAny(ReferenceInitiator):
    def send(self, msg: Message) -> None:
        if isinstance(msg, Load | Store | Free) and msg.generation == 0xFFFF:
            msg = dataclasses.replace(msg, generation=0)  # all ones taken for "no Generation"
        super().send(msg)


class AllOnesGenerationAsAny(ReferenceInitiatorDriver):
    """KBTP-HDR-GEN-REQUEST: an expected Generation of 0xFFFF (all ones) is sent as 0, "any"."""

    initiator_class = _AllOnesAsAny


class _BindsOutsideRange(ReferenceInitiator):
    def bind(self, handle: int, ticket: int, data_length: int, block_offset: int, generation: int = 0) -> Any:
        assert self.ack is not None
        return (yield from super().bind(handle + self.ack.handle_count, ticket, data_length, block_offset, generation))


class BindsOutsideItsRange(ReferenceInitiatorDriver):
    """KBTP-HANDLE-OWN-RANGE: direct allocations BIND handles past the end of the initiator's range (its
    ALLOC_STOREs stay in range)."""

    initiator_class = _BindsOutsideRange


class _IgnoresSealed(ReferenceInitiator):
    def read_entry(self, handle: int) -> Any:
        entry = yield from super().read_entry(handle)
        return dataclasses.replace(entry, flags=entry.flags | 0x0002) if entry.flags & 0x0001 else entry


class DirectLoadsUnsealed(ReferenceInitiatorDriver):
    """KBTP-DLOAD-VALIDITY: a direct load accepts an entry that is VALID but not SEALED."""

    initiator_class = _IgnoresSealed


class _OverstatedCredits(ReferenceInitiator):
    def send_raw(self, raw: bytes) -> None:
        if raw[1] == 0x01:  # HELLO: Completion Credits (offset 26) four times the receive buffers it posts
            raw = raw[:26] + (4 * self.credits).to_bytes(2, "big") + raw[28:]
        super().send_raw(raw)


class OverstatesCompletionCredits(ReferenceInitiatorDriver):
    """KBTP-HELLO-LAYOUT: HELLO's Completion Credits claims more receive buffers than the initiator posted."""

    initiator_class = _OverstatedCredits


_IB = ("kbtp.target.binding=ib-rc", "kbtp.target.features=[DIRECT_LOAD, DIRECT_ALLOC, RECORD_COMPLETION, ADDR_LE]")
_DECLARED_QUOTA = ("kbtp.target.quota=2",)  # a declared value (testbed defaults are no claim)
UNTRUSTED_ID = "7e3a0c55d1f24b8e9a6c0b13f5e2d47a"  # also declared by the reference runs (tests/test_mutants_kbtp.py)
UNTRUSTED_PICS = f'kbtp.target.untrusted_initiators=["{UNTRUSTED_ID}"]'


MUTANTS: dict[str, Mutant] = {
    "WireIgnoresCrc": Mutant("kbtp-target", "KBTP-WIRE-MPA-CRC", ("test_iwarp_attack",)),
    "WireSilentOnBadStag": Mutant("kbtp-target", "KBTP-WIRE-DDP-TAGGED", ("test_iwarp_attack",)),
    "WireTakesUnaskedReadResponse": Mutant("kbtp-target", "KBTP-WIRE-RDMAP-UNEXPECTED", ("test_iwarp_attack",)),
    "WireIgnoresIcrc": Mutant("kbtp-target", "KBTP-WIRE-IB-DROP", ("test_roce_packet_dropped",), _IB),
    "WireErrorSpreads": Mutant("kbtp-target", "KBTP-WIRE-INTACT", ("test_iwarp_attack",)),
    # issue 23: the wire attacks of conformance/kbtp/target/test_wire_attacks.py (tests/mutants/kbtp_wire_attacks.py)
    "WireAtomicLowBitsIgnored": Mutant("kbtp-target", "KBTP-WIRE-ATOMIC-ALIGN", ("test_misaligned_atomic",), _IB),
    "WireAtomicBoundsAnswered": Mutant("kbtp-target", "KBTP-WIRE-ATOMIC-BOUNDS", ("test_atomic_out_of_bounds",)),
    "WireWriteStartChecked": Mutant("kbtp-target", "KBTP-WIRE-WRITE-BOUNDS", ("test_write_outside_partition",)),
    "WireReadPastBoundsAnswered": Mutant("kbtp-target", "KBTP-WIRE-READ-BOUNDS", ("test_read_past_the_pool",)),
    "WirePsnGapExecuted": Mutant("kbtp-target", "KBTP-WIRE-IB-PSN-GAP", ("test_roce_psn_gap",), _IB),
    "WireDuplicateAtomicExecuted": Mutant("kbtp-target", "KBTP-WIRE-IB-DUPLICATE", ("test_roce_duplicate_atomic",),
                                          _IB),
    "WireDuplicateSendDelivered": Mutant("kbtp-target", "KBTP-WIRE-IB-DUPLICATE", ("test_roce_duplicate_send",),
                                         _IB),
    "WireAcceptsBadMpaKey": Mutant("kbtp-target", "KBTP-WIRE-MPA-START", ("test_iwarp_bad_mpa_request",)),
    "WireIgnoresMsn": Mutant("kbtp-target", "KBTP-WIRE-DDP-UNTAGGED", ("test_iwarp_untagged_errors",)),
    "WireUnmaskedAtomics": Mutant("kbtp-target", "KBTP-WIRE-RDMAP-MASKED", ("test_iwarp_masked_atomics",)),
    "WireTerminateBitfieldsLe": Mutant("kbtp-target", "KBTP-WIRE-TERMINATE-HEADER", ("test_iwarp_terminate_header",)),
    # issue 23: faults on the wire (conformance/kbtp/target/test_wire_faults.py, tests/mutants/kbtp_wire_faults.py)
    "WireDuplicatedLinkAtomicTwice": Mutant("kbtp-target", "KBTP-WIRE-IB-DUPLICATE",
                                            ("test_roce_duplicated_link_executes_once",), _IB),
    "WireDuplicateNotAnswered": Mutant("kbtp-target", "KBTP-WIRE-IB-RETRANSMIT", ("test_roce_lossy_link_recovers",),
                                       _IB),
    "WirePartialFpduRefused": Mutant("kbtp-target", "KBTP-WIRE-MPA-STREAM", ("test_iwarp_stalled_split_stream",)),
    # kbtp-target: session establishment
    "HelloAckWithGeneration": Mutant("kbtp-target", "KBTP-HELLO-HEADER-ZERO", ("test_hello_ack",)),
    "NeverOffersDirectLoad": Mutant("kbtp-target", "KBTP-ACK-FEATURES", ("test_ack_features_match_pics",),
                                    ("kbtp.target.features=[DIRECT_LOAD, DIRECT_ALLOC, ADDR_LE]",)),
    "AdvertisesRecordsOnRdmap": Mutant("kbtp-target", "KBTP-COMP-NO-RECORD-RDMAP",
                                       ("test_no_record_completion_on_rdmap",)),
    "DirectLoadUnasked": Mutant("kbtp-target", "KBTP-ACK-FEATURES", ("test_default_mode_exposes_no_stag",)),
    "OverlappingHandleRanges": Mutant("kbtp-target", "KBTP-HANDLE-DISJOINT", ("test_handle_ranges_disjoint",)),
    "GrantsMoreQuota": Mutant("kbtp-target", "KBTP-OPS-SESSION-FIXED", ("test_quotas_within_pool",), _DECLARED_QUOTA),
    "AcceptsActiveInitiatorId": Mutant("kbtp-target", "KBTP-HELLO-ID-ACTIVE", ("test_active_initiator_id_rejected",)),
    "NoRetention": Mutant("kbtp-target", "KBTP-RETENTION", ("test_goodbye_keeps_bindings",)),
    "ReleaseIgnored": Mutant("kbtp-target", "KBTP-GOODBYE-RELEASE", ("test_goodbye_release_frees_everything",)),
    "NoQuotaCheck": Mutant("kbtp-target", "KBTP-QUOTA-NO-SPACE", ("test_quota_exhaustion",)),
    "FreeKeepsQuota": Mutant("kbtp-target", "KBTP-QUOTA-RELEASE", ("test_free_releases_quota",)),
    "RefusesCrossLoad": Mutant("kbtp-target", "KBTP-LOAD-ANY", ("test_load_of_another_initiators_handle",),
                               ("kbtp.target.cross_initiator_load=true",)),
    "StoresToOthersHandles": Mutant("kbtp-target", "KBTP-VAL-HANDLE",
                                    ("test_store_and_free_of_another_initiators_handle",)),
    # kbtp-target: operations
    "InlineDataShifted": Mutant("kbtp-target", "KBTP-EX-ALLOC-STORE", ("test_example_alloc_store",)),
    "CompletionWithFlags": Mutant("kbtp-target", "KBTP-EX-COMPLETION", ("test_example_completion",)),
    "WrongRequestIdEcho": Mutant("kbtp-target", "KBTP-HDR-REQID-ECHO", ("test_request_id_echoed",)),
    "BlockNumbersInCompletions": Mutant("kbtp-target", "KBTP-POOL-OFFSETS",
                                        ("test_allocations_complete_with_block_offsets",)),
    "IgnoresGeneration": Mutant("kbtp-target", "KBTP-VAL-GENERATION", ("test_validation",)),
    "LoadsUnsealed": Mutant("kbtp-target", "KBTP-LOAD-SEALED", ("test_validation",)),
    "NoLengthCheck": Mutant("kbtp-target", "KBTP-VAL-LENGTH", ("test_validation",)),
    "LoadWritesWholeBlock": Mutant("kbtp-target", "KBTP-LOAD-WRITE", ("test_load_writes_data_length",)),
    "StoreKeepsDataLength": Mutant("kbtp-target", "KBTP-STORE-DATA", ("test_mapped_store",)),
    "StoresIntoSealed": Mutant("kbtp-target", "KBTP-SEAL-IMMUTABLE", ("test_sealed_block_is_immutable",)),
    "GenerationWrapsToZero": Mutant("kbtp-target", "KBTP-GEN-NONZERO", ("test_generation_sequence",)),
    "FreeKeepsEntryValid": Mutant("kbtp-target", "KBTP-FREE-ENTRY", ("test_free_unbinds",)),
    "IgnoresInvalidate": Mutant("kbtp-target", "KBTP-FLAG-INVALIDATE", ("test_invalidate",)),
    "CompletionBeforeData": Mutant("kbtp-target", "KBTP-COMP-DATA-READY", ("test_completion_after_data",)),
    # Every request that cannot be parsed gets INTERNAL, whatever the reason: the wrong Version and the unknown
    # Opcode cases fail on the requirements that name those reasons.
    "MalformedAsInternal": Mutant("kbtp-target", "KBTP-STATUS-MALFORMED", ("test_malformed_request",),
                                  collateral=("KBTP-HDR-VERSION", "KBTP-OPCODES")),
    "BindsAfterFailedRead": Mutant("kbtp-target", "KBTP-VAL-NO-EFFECT", ("test_descriptor_out_of_range",)),
    # kbtp-target: completion records
    "RecordsWithoutTheFeature": Mutant("kbtp-target", "KBTP-COMP-RECORD-BINDING",
                                       ("test_record_flag_without_the_feature",)),
    "CompletionInsteadOfRecord": Mutant("kbtp-target", "KBTP-COMP-RECORD", ("test_completion_records",), _IB),
    # kbtp-target: tickets
    "ReclaimsBeforeTheTimeout": Mutant("kbtp-target", "KBTP-TICKET-TIMEOUT", ("test_bind_within_timeout",)),
    "BindsAbandonedTicket": Mutant("kbtp-target", "KBTP-TICKET-ABANDONED", ("test_late_bind_refused",
                                                                            "test_bind_racing_the_timeout")),
    "ReclaimWithoutFence": Mutant("kbtp-target", "KBTP-TICKET-RECLAIM-FENCE", ("test_late_bind_refused",)),
    "ReclaimLosesBlock": Mutant("kbtp-target", "KBTP-TICKET-RECLAIM", ("test_reclaimed_ticket_comes_back",)),
    "QuotaNotReleasedOnReclaim": Mutant("kbtp-target", "KBTP-QUOTA-RELEASE", ("test_reclaimed_ticket_comes_back",
                                                                              "test_unbound_tickets_count_in_usage")),
    # kbtp-target: direct modes
    "WrongPoolCount": Mutant("kbtp-target", "KBTP-ACK-DLOAD-DESC", ("test_direct_load_descriptors",)),
    # the direct load of the block reads the entry's reversed Block Offset: the byte order, not the pool, is wrong
    "BigEndianTableUnderAddrLe": Mutant("kbtp-target", "KBTP-ADDRLE-MEMORY",
                                        ("test_direct_load_entry", "test_direct_load_block")),
    "TableHoldsBlockNumbers": Mutant("kbtp-target", "KBTP-POOL-BLOCKS", ("test_direct_load_block",)),
    "WritableTable": Mutant("kbtp-target", "KBTP-DLOAD-READONLY", ("test_direct_load_stags_are_read_only",)),
    "HeadMisaligned": Mutant("kbtp-target", "KBTP-ACK-HEAD-ALIGN", ("test_direct_alloc_descriptors",)),
    "RingInitEmptySequences": Mutant("kbtp-target", "KBTP-RING-INIT", ("test_direct_alloc_ring_init",),
                                     ("kbtp.target.quota=3",)),  # a partition of 3 in a ring of 4: one slot empty
    "HeadStartsAtTicketOne": Mutant("kbtp-target", "KBTP-RING-INIT", ("test_direct_alloc_head",
                                                                      "test_ring_counter_example")),
    "HeadStartsAtTicketOneUnmasked": Mutant("kbtp-target", "KBTP-RING-INIT", ("test_direct_alloc_head_unmasked",),
                                            _IB),
    "RingWrapOffByOne": Mutant("kbtp-target", "KBTP-RING-WRAP", ("test_direct_alloc_bind_and_free",)),
    "BindNotVerified": Mutant("kbtp-target", "KBTP-BIND-VERIFY", ("test_bind_is_verified",)),
    "PartitionCoversThePool": Mutant("kbtp-target", "KBTP-ACK-PARTITION-SCOPE", ("test_partition_scope",)),
    # kbtp-target: races
    "OverwritesUnconsumedSlot": Mutant("kbtp-target", "KBTP-FREE-NO-OVERWRITE", ("test_deferred_free_example",)),
    "FreeReturnsBeforeEntryUpdate": Mutant("kbtp-target", "KBTP-FREE-TABLE-FIRST",
                                           ("test_free_updates_entry_before_ring",)),
    "SequenceBeforeBlock": Mutant("kbtp-target", "KBTP-FREE-SLOT-ORDER", ("test_free_writes_block_before_sequence",)),
    # its hangs are diagnosed on the DIRECT_ALLOC partition ring, whose slot reads unconsumed after BIND
    "SlotsNeverConsumed": Mutant("kbtp-target", "KBTP-RING-CONSUME", ("test_seeded_interleavings",)),
    "EntryBeforeData": Mutant("kbtp-target", "KBTP-ALLOC-ENTRY-ORDER", ("test_entry_written_after_data",)),
    # kbtp-target, issue 11 (suite power; helper kbtp-target)
    "WrapsToZeroFromGenerationOne": Mutant("kbtp-target", "KBTP-GEN-NONZERO", ("test_generation_wrap",)),
    "SealedCheckedOnInlineStoresOnly": Mutant("kbtp-target", "KBTP-STORE-UNSEALED", ("test_rule_on_every_path",)),
    "LoadWritesBeforeTooLarge": Mutant("kbtp-target", "KBTP-VAL-NO-EFFECT", ("test_rule_on_every_path",
                                                                             "test_field_value_classes")),
    # the handle it drops from the session's bound set is no longer freed by GOODBYE RELEASE: a target serving it in
    # one process for every check keeps that binding, which the next check finds (conformance/kbtp/prepared.py)
    "RefusedFreeReleasesQuota": Mutant("kbtp-target", "KBTP-VAL-NO-EFFECT", ("test_rule_on_every_path",),
                                       collateral=("KBTP-GOODBYE-RELEASE",)),
    "OversizeAllocStrandsTicket": Mutant("kbtp-target", "KBTP-VAL-NO-EFFECT", ("test_rule_on_every_path",
                                                                               "test_field_value_classes")),
    "LengthComparedIn16Bits": Mutant("kbtp-target", "KBTP-VAL-LENGTH", ("test_field_value_classes",)),
    "HandleRangeOffByOne": Mutant("kbtp-target", "KBTP-ALLOC-OWN-RANGE", ("test_field_value_classes",)),
    "GenerationComparedOnLowOctet": Mutant("kbtp-target", "KBTP-VAL-GENERATION", ("test_field_value_classes",)),
    "ZeroLengthLoadUnchecked": Mutant("kbtp-target", "KBTP-LOAD-FITS", ("test_field_value_classes",)),
    "BindLengthUnchecked": Mutant("kbtp-target", "KBTP-VAL-LENGTH", ("test_bind_refusals",)),
    "BindHandleUnchecked": Mutant("kbtp-target", "KBTP-VAL-HANDLE", ("test_bind_refusals",)),
    # Blame from observed state (issue 23): the ring and free-path rules named, not the invariant they break.
    # At the declared geometry (tickets not the harness's alone) only the block handed out twice is seen.
    # Served (one geometry), the partition of 3 in a ring of 4 has an empty slot the hang diagnosis reads
    "EmptySlotsNotInitialisedEmpty": Mutant("kbtp-target", "KBTP-RING-INIT", ("test_shared_ring_geometries",),
                                            ("kbtp.target.quota=3",), collateral=("KBTP-RING-NO-LOSS",)),
    # the masked Tail only (RFC 7306: the Slot Offset in the Tail word); unmasked (IB) the slot is 16 * (u mod N)
    "TailNotWrappedWhenFull": Mutant("kbtp-target", "KBTP-RING-INIT", ("test_shared_ring_geometries",),
                                     ("kbtp.target.binding=rdmap-7306",)),
    "EmptySlotsMarkedZero": Mutant("kbtp-target", "KBTP-RING-EMPTY", ("test_direct_alloc_ring_init",
                                                                      "test_direct_alloc_bind_and_free"),
                                   ("kbtp.target.quota=3",)),  # a partition of 3 in a ring of 4: one slot empty
    "BigEndianRingUnderAddrLe": Mutant("kbtp-target", "KBTP-ADDRLE-MEMORY", ("test_direct_alloc_ring_init",
                                                                             "test_direct_alloc_bind_and_free")),
    "FreeReturnsToSharedRing": Mutant("kbtp-target", "KBTP-FREE-RETURN", ("test_direct_alloc_bind_and_free",)),
    "TailWrapsLate": Mutant("kbtp-target", "KBTP-RING-WRAP", ("test_shared_ring_geometries",
                                                              "test_direct_alloc_bind_and_free"),
                            ("kbtp.target.quota=3",), collateral=("KBTP-RING-NO-LOSS",)),
    # kbtp-target, issue 11: trust (the declaration KBTP-DIRECT-TRUST is checked against)
    "DirectModesForEveryone": Mutant("kbtp-target", "KBTP-DIRECT-TRUST",
                                     ("test_no_direct_mode_for_untrusted_initiators",), (UNTRUSTED_PICS,)),
    "DistrustsByIdPrefix": Mutant("kbtp-target", "KBTP-ACK-FEATURES", ("test_no_direct_mode_for_untrusted_initiators",),
                                  (UNTRUSTED_PICS, "kbtp.target.features=[DIRECT_LOAD, DIRECT_ALLOC, ADDR_LE]")),
    # kbtp-initiator
    "HelloWithRequestId": Mutant("kbtp-initiator", "KBTP-HELLO-HEADER-ZERO", ("test_hello",)),
    "ConstantInitiatorId": Mutant("kbtp-initiator", "KBTP-HELLO-ID-ENTROPY", ("test_initiator_id_entropy",)),
    "InlineDescriptorLength": Mutant("kbtp-initiator", "KBTP-DESC-INLINE", ("test_request_bodies",)),
    "AllocatesOutsideItsRange": Mutant("kbtp-initiator", "KBTP-HANDLE-OWN-RANGE", ("test_requests_in_own_range",)),
    "RequestsWithStatus": Mutant("kbtp-initiator", "KBTP-HDR-STATUS-ZERO", ("test_request_headers",)),
    "DropsGeneration": Mutant("kbtp-initiator", "KBTP-HDR-GEN-REQUEST", ("test_request_generations",)),
    "BigEndianUnderAddrLe": Mutant("kbtp-initiator", "KBTP-ADDRLE-INITIATOR", ("test_addr_le_requests",)),
    "NoGoodbye": Mutant("kbtp-initiator", "KBTP-GOODBYE", ("test_goodbye",)),
    "IgnoresQuota": Mutant("kbtp-initiator", "KBTP-QUOTA-INITIATOR", ("test_quota_respected",)),
    "ReusesOneStag": Mutant("kbtp-initiator", "KBTP-SEC-SINGLE-USE-STAG", ("test_single_use_stags",)),
    "SingleEntryRead": Mutant("kbtp-initiator", "KBTP-DLOAD-SEQUENCE", ("test_direct_load_sequence",)),
    "IgnoresGenerationChange": Mutant("kbtp-initiator", "KBTP-DLOAD-VALIDITY", ("test_direct_load_detects_free",)),
    "UnmaskedFetchAddOnRdmap": Mutant("kbtp-initiator", "KBTP-DALLOC-FETCHADD", ("test_direct_alloc_fetchadd",)),
    "NoSlotConfirmation": Mutant("kbtp-initiator", "KBTP-DALLOC-SLOT-READ", ("test_direct_alloc_slot_reads",)),
    "ReReadWithBlock": Mutant("kbtp-initiator", "KBTP-DLOAD-SEQUENCE", ("test_direct_load_sequence",)),
    "SlotReadsInPairs": Mutant("kbtp-initiator", "KBTP-DALLOC-SLOT-READ", ("test_direct_alloc_slot_reads",)),
    "BindBeforeWrite": Mutant("kbtp-initiator", "KBTP-DALLOC-WRITE-THEN-BIND", ("test_direct_alloc_write_then_bind",)),
    "WritesRingSlot": Mutant("kbtp-initiator", "KBTP-DALLOC-NO-SLOT-WRITE",
                             ("test_direct_alloc_leaves_the_ring_alone",)),
    "SkipsFreeOfDirectBlocks": Mutant("kbtp-initiator", "KBTP-DALLOC-FREE", ("test_direct_alloc_frees",)),
    # kbtp-initiator, issue 11: credits, exposure, the 32-bit ticket and 16-bit Generation wraps, every path
    "PipelinesBeyondCredits": Mutant("kbtp-initiator", "KBTP-INIT-REQUEST-CREDITS", ("test_request_credits",)),
    "WindowWiderThanDescriptor": Mutant("kbtp-initiator", "KBTP-SEC-EXPOSE-DESCRIBED",
                                        ("test_exposes_only_described_buffers",)),
    "ExposesUnnamedRecordSlot": Mutant("kbtp-initiator", "KBTP-SEC-EXPOSE-DESCRIBED",
                                       ("test_exposes_only_described_buffers",)),
    "SignedTickets": Mutant("kbtp-initiator", "KBTP-RING-COUNTER-FIELDS", ("test_direct_alloc_ticket_wrap",)),
    "BigEndianDescriptorsUnderAddrLe": Mutant("kbtp-initiator", "KBTP-ADDRLE-INITIATOR", ("test_addr_le_requests",)),
    "StoreStagKept": Mutant("kbtp-initiator", "KBTP-SEC-SINGLE-USE-STAG", ("test_single_use_stags",)),
    "AllOnesGenerationAsAny": Mutant("kbtp-initiator", "KBTP-HDR-GEN-REQUEST", ("test_request_generations",)),
    "BindsOutsideItsRange": Mutant("kbtp-initiator", "KBTP-HANDLE-OWN-RANGE",
                                   ("test_direct_alloc_binds_in_own_range",)),
    "DirectLoadsUnsealed": Mutant("kbtp-initiator", "KBTP-DLOAD-VALIDITY", ("test_direct_load_refuses_unsealed",)),
    "OverstatesCompletionCredits": Mutant("kbtp-initiator", "KBTP-HELLO-LAYOUT", ("test_hello_credits_posted",)),
}

# Checks no mutant is required to fail, and why.
UNMUTATED_CHECKS: dict[str, str] = {
    "test_direct_load_races_free": (
        "its invariant (a consistent direct load reads the data of its Generation) breaks only through another "
        "rule, each with its focused check and mutant: the entry written before the data (EntryBeforeData, "
        "test_entry_written_after_data), the block returned before the entry changes (FreeReturnsBeforeEntryUpdate, "
        "test_free_updates_entry_before_ring), a sealed block changed (StoresIntoSealed); the entry's state written "
        "before its location it judges itself (KBTP-TABLE-BIND-ORDER), shown by the independent target's "
        "StateBeforeLocation (tests/kbtp/test_independent_target.py)"),
}
