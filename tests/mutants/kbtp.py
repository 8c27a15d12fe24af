"""Broken KBTP targets and initiators (targets: python:tests.mutants.kbtp:<Name>).

Each class breaks exactly one requirement, named in its docstring's first line; MUTANTS maps it to the
suite and the check functions that must fail. A target mutant is the reference target with one method
overridden; an initiator mutant is the reference initiator (or its driver) with one method overridden.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Generator
from typing import Any

from kvconform.kbtp.constants import RING_SLOT_SIZE, EntryFlags, Features, RequestFlags, Status
from kvconform.kbtp.freering import FreeRing, TakenTicket
from kvconform.kbtp.initiator import ReferenceInitiator
from kvconform.kbtp.messages import Hello, Message
from kvconform.kbtp.target import ReferenceTarget
from kvconform.rdma import Access, Command, Window, pause
from kvconform.targets.kbtp import ReferenceInitiatorDriver, ReferenceInitiatorEndpoint, ReferenceTargetDriver
from tests.mutants import Mutant

Steps = Generator[Command, Any, Any]


# ---- targets ------------------------------------------------------------------------------------------


class _OffByOneRing(FreeRing):
    def fetch_add_tail(self) -> TakenTicket:
        taken = super().fetch_add_tail()
        return TakenTicket(taken.ticket, RING_SLOT_SIZE * ((taken.ticket + 1) % self.slots))


class _WrapOffByOne(ReferenceTarget):
    ring_class = _OffByOneRing


class RingWrapOffByOne(ReferenceTargetDriver):
    """KBTP-RING-WRAP: a free writes the slot one after its Tail ticket's (the wrap is off by one)."""

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


_IB = ("kbtp.target.binding=ib-rc", "kbtp.target.features=[DIRECT_LOAD, DIRECT_ALLOC, RECORD_COMPLETION, ADDR_LE]")

MUTANTS: dict[str, Mutant] = {
    "RingWrapOffByOne": Mutant("kbtp-target", "KBTP-RING-WRAP", ("test_direct_alloc_ring",
                                                                 "test_seeded_interleavings")),
    "GenerationWrapsToZero": Mutant("kbtp-target", "KBTP-GEN-NONZERO", ("test_generation_sequence",)),
    "OverwritesUnconsumedSlot": Mutant("kbtp-target", "KBTP-FREE-NO-OVERWRITE", ("test_deferred_free_example",)),
    "BindsAbandonedTicket": Mutant("kbtp-target", "KBTP-TICKET-ABANDONED", ("test_withheld_bind_is_reclaimed",
                                                                            "test_bind_racing_the_timeout")),
    "EntryBeforeData": Mutant("kbtp-target", "KBTP-ALLOC-ENTRY-ORDER", ("test_direct_load_races_free",)),
    "QuotaNotReleasedOnReclaim": Mutant("kbtp-target", "KBTP-QUOTA-RELEASE", ("test_withheld_bind_is_reclaimed",
                                                                              "test_unbound_tickets_count_in_usage")),
    "FreeReturnsBeforeEntryUpdate": Mutant("kbtp-target", "KBTP-FREE-TABLE-FIRST",
                                           ("test_free_updates_entry_before_ring",)),
    "IgnoresGeneration": Mutant("kbtp-target", "KBTP-VAL-GENERATION", ("test_validation",)),
    "LoadsUnsealed": Mutant("kbtp-target", "KBTP-LOAD-SEALED", ("test_validation",)),
    "StoresToOthersHandles": Mutant("kbtp-target", "KBTP-VAL-HANDLE", ("test_load_of_another_initiators_handle",)),
    "CompletionBeforeData": Mutant("kbtp-target", "KBTP-COMP-DATA-READY", ("test_completion_after_data",)),
    "AdvertisesRecordsOnRdmap": Mutant("kbtp-target", "KBTP-COMP-NO-RECORD-RDMAP", ("test_hello_ack_descriptor",)),
    "AcceptsActiveInitiatorId": Mutant("kbtp-target", "KBTP-HELLO-ID-ACTIVE", ("test_active_initiator_id_rejected",)),
    "ReclaimWithoutFence": Mutant("kbtp-target", "KBTP-TICKET-RECLAIM-FENCE", ("test_withheld_bind_is_reclaimed",)),
    "MalformedAsInternal": Mutant("kbtp-target", "KBTP-STATUS-MALFORMED", ("test_malformed_request",)),
    "BindNotVerified": Mutant("kbtp-target", "KBTP-BIND-VERIFY", ("test_bind_is_verified",)),
    "WritableTable": Mutant("kbtp-target", "KBTP-DLOAD-READONLY", ("test_direct_load_stags_are_read_only",)),
    "IgnoresInvalidate": Mutant("kbtp-target", "KBTP-FLAG-INVALIDATE", ("test_invalidate",)),
    "WrongRequestIdEcho": Mutant("kbtp-target", "KBTP-HDR-REQID-ECHO", ("test_example_alloc_store",)),
    "DirectLoadUnasked": Mutant("kbtp-target", "KBTP-ACK-FEATURES", ("test_default_mode_exposes_no_stag",)),
    "OverlappingHandleRanges": Mutant("kbtp-target", "KBTP-HANDLE-DISJOINT", ("test_handle_ranges_and_quotas",)),
    "NoRetention": Mutant("kbtp-target", "KBTP-RETENTION", ("test_goodbye_keeps_bindings",)),
    "ReleaseIgnored": Mutant("kbtp-target", "KBTP-GOODBYE-RELEASE", ("test_goodbye_release_frees_everything",)),
    "NoQuotaCheck": Mutant("kbtp-target", "KBTP-QUOTA-NO-SPACE", ("test_quota_exhaustion",)),
    "NoLengthCheck": Mutant("kbtp-target", "KBTP-VAL-LENGTH", ("test_validation",)),
    "RecordsWithoutTheFeature": Mutant("kbtp-target", "KBTP-COMP-RECORD-BINDING",
                                       ("test_record_flag_without_the_feature",)),
    "CompletionInsteadOfRecord": Mutant("kbtp-target", "KBTP-COMP-RECORD", ("test_completion_records",), _IB),
    "BigEndianTableUnderAddrLe": Mutant("kbtp-target", "KBTP-ADDRLE-MEMORY", ("test_direct_load_reads",)),
    "StoreKeepsDataLength": Mutant("kbtp-target", "KBTP-STORE-DATA", ("test_store_and_load_round_trip",)),
    "BindsAfterFailedRead": Mutant("kbtp-target", "KBTP-VAL-NO-EFFECT", ("test_descriptor_out_of_range",)),
    "SingleEntryRead": Mutant("kbtp-initiator", "KBTP-DLOAD-SEQUENCE", ("test_direct_load_sequence",)),
    "IgnoresGenerationChange": Mutant("kbtp-initiator", "KBTP-DLOAD-VALIDITY", ("test_direct_load_detects_free",)),
    "NoSlotConfirmation": Mutant("kbtp-initiator", "KBTP-DALLOC-SLOT-READ", ("test_direct_alloc",)),
    "BindBeforeWrite": Mutant("kbtp-initiator", "KBTP-DALLOC-WRITE-THEN-BIND", ("test_direct_alloc",)),
    "WritesRingSlot": Mutant("kbtp-initiator", "KBTP-DALLOC-NO-SLOT-WRITE", ("test_direct_alloc",)),
    "IgnoresQuota": Mutant("kbtp-initiator", "KBTP-QUOTA-INITIATOR", ("test_quota_respected",)),
    "BigEndianUnderAddrLe": Mutant("kbtp-initiator", "KBTP-ADDRLE-INITIATOR", ("test_requests",)),
    "ConstantInitiatorId": Mutant("kbtp-initiator", "KBTP-HELLO-ID-ENTROPY", ("test_hello",)),
    "DropsGeneration": Mutant("kbtp-initiator", "KBTP-HDR-GEN-REQUEST", ("test_requests",)),
    "ReusesOneStag": Mutant("kbtp-initiator", "KBTP-SEC-SINGLE-USE-STAG", ("test_single_use_stags",)),
    "HelloWithRequestId": Mutant("kbtp-initiator", "KBTP-HELLO-HEADER-ZERO", ("test_hello",)),
    "AllocatesOutsideItsRange": Mutant("kbtp-initiator", "KBTP-HANDLE-OWN-RANGE", ("test_requests",)),
}

# Checks no mutant is required to fail, and why.
UNMUTATED_CHECKS: dict[str, str] = {}
