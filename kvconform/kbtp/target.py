"""The reference KBTP target (KBTP "Target Memory Structures", "Session Establishment", "Operations",
"Completion", "Direct Modes").

A sans-I/O state machine over the semantic fabric (`kvconform.rdma.fabric`): it owns the block pool, the
block table and the free-block rings in fabric memory, and serves each accepted connection with one actor
(``yield``-based, so the fabric's scheduler interleaves it with every other actor and NIC step; nothing
here sleeps or reads a wall clock).  Time is the fabric's logical clock (``fabric.now``).

Shapes a mutant can break one at a time (each is one method):
- validation: ``rule_*`` methods, listed per opcode by ``rules_for``; the first failing rule's status
  completes the request and nothing else happens (KBTP "Operations": "A failed check ... has no other effect");
- execution: ``exec_load`` / ``exec_store`` / ``exec_alloc_store`` / ``exec_free`` / ``exec_bind``, built
  from step methods (``take_ticket``, ``wait_for_slot``, ``consume_slot``, ``fill_and_bind``,
  ``obtain_data``, ``bind_entry``, ``unbind_entry``, ``return_block``, ``can_write_slot``,
  ``should_clear``, ``next_generation``, ``release_quota``, ``complete``);
- the ring arithmetic: ``ring_class`` (a `FreeRing` subclass, e.g. one whose FetchAdd wraps wrongly);
- sessions: ``on_hello`` / ``grant_features`` / ``admit`` / ``on_goodbye`` / ``end_session`` / ``forget``;
- DIRECT_ALLOC tickets: ``observe_tickets`` / ``abandon`` / ``reclaim`` / ``release_ticket`` /
  ``fence_direct_alloc``.

Observers: ``counters`` (per opcode and status, deferrals, abandonments, invalidations, clears),
``snapshot_rings()`` (occupancy, Head/Tail tickets, deferred frees), ``snapshot_initiators()`` (quota
and usage, bindings, outstanding and abandoned tickets), ``block_census()`` / ``census_problems()``
(every block in exactly one place), ``failures`` (causes of INTERNAL).  ``kvconform.kbtp.harness.build``
makes a target and N initiators on a seeded emulated fabric in one call.

Not modelled: Completion Credits are not enforced (the initiator keeps one request outstanding);
a target-executed allocation on a DIRECT_ALLOC partition does its FetchAdd on Head as one CPU step,
atomic with the initiator's FetchAdds in the emulation (a real target with ATOMIC_HCA scope would
loop the FetchAdd through its own RNIC).

Named race points (``pause`` / ``wait_until`` names, so step labels are ``<actor>:<name>``):
``read-slot.<ring>.<ticket>`` (a target-executed allocation has its ticket, before reading the slot),
``slot-wait.<ring>.<ticket>``, ``tail.<ring>`` (a free is about to FetchAdd Tail),
``slot-seq.<ring>.<ticket>`` (between a slot's Block Offset and Sequence writes), ``entry-state.<handle>``
(between a bind's two entry writes), ``tickets.<initiator>`` (the ticket watcher), ``retain.<initiator>``.

Decisions the text leaves open (documented, and constants a suite can read):
- a HELLO whose Initiator ID is active is answered with HELLO_ACK Status ``HELLO_ACTIVE_STATUS``;
- a BIND whose ticket's slot does not hold that Block Offset (or a BIND without a partition) is
  completed with ``BIND_MISMATCH_STATUS``;
- a COMPLETION for FREE carries the new Generation, Data Length 0 and Block Offset 0;
- ALLOC_STORE of an initiator that has a DIRECT_ALLOC partition allocates from that partition's ring.
"""

from __future__ import annotations

import contextlib
from collections import deque
from collections.abc import Callable, Generator
from dataclasses import dataclass, field
from typing import Any

from kvconform.kbtp.config import TargetConfig
from kvconform.kbtp.constants import (
    DESCRIPTOR_SIZE,
    HEADER_SIZE,
    HELLO_BODY_SIZE,
    TABLE_ENTRY_SIZE,
    EntryFlags,
    Features,
    GoodbyeFlags,
    Opcode,
    RequestFlags,
    Status,
)
from kvconform.kbtp.counters import TargetCounters
from kvconform.kbtp.freering import FreeRing, TakenTicket
from kvconform.kbtp.messages import (
    AllocStore,
    Bind,
    Completion,
    CompletionRecord,
    DirectAlloc,
    DirectDescriptor,
    DirectLoad,
    Free,
    Goodbye,
    Hello,
    HelloAck,
    KbtpDecodeError,
    Load,
    Store,
    decode,
)
from kvconform.kbtp.observe import (
    InitiatorView,
    RingView,
    block_census,
    census_problems,
    initiator_view,
    ring_view,
)
from kvconform.kbtp.pool import BlockPool, PoolError
from kvconform.kbtp.ring import TICKET_MODULUS
from kvconform.kbtp.session import InitiatorRecord, Partition
from kvconform.kbtp.table import BlockTable, Entry, next_generation
from kvconform.rdma.fabric import (
    Access,
    ActorHandle,
    Command,
    Connection,
    ConnState,
    Fabric,
    FabricUsageError,
    Node,
    Op,
    Region,
    Window,
    pause,
    wait_completion,
    wait_until,
)
from kvconform.rdma.profiles import Binding

Steps = Generator[Command, Any, None]
Rule = Callable[["RequestContext"], Status | None]

_DATA_WR = 1 << 40  # wr_id base of the target's own RDMA Reads (receive buffers use 0..credits-1)
_EPS_MS = 1e-6  # float slack when comparing logical-clock deadlines


@dataclass
class Session:
    """One accepted connection: receive buffers, staging, and the record it serves once HELLO succeeded."""

    conn: Connection
    recv: Region
    recv_size: int
    staging: Region  # one block-sized slot per receive buffer (LOAD source, completion records)
    record: InitiatorRecord | None = None
    granted: Features = field(default_factory=lambda: Features(0))
    addr_le: bool = False
    windows: list[Window] = field(default_factory=list)  # DIRECT_ALLOC Partition, Ring, Head windows
    fenced: bool = False  # the Partition STag was invalidated: DIRECT_ALLOC is off for the rest of the session
    closed: bool = False
    slot: int = 0  # receive buffer of the request being served


@dataclass
class RequestContext:
    """A request being served: its session, the initiator record, the decoded message and its opcode."""

    session: Session
    record: InitiatorRecord
    msg: Load | Store | AllocStore | Free | Bind
    opcode: Opcode

    @property
    def flags(self) -> RequestFlags:
        return RequestFlags(self.msg.flags & 0x1F)


class ReferenceTarget:
    """The reference KBTP target on one fabric node.  ``accept(conn)`` serves a connection.

    Observe it with ``counters``, ``snapshot_rings()``, ``snapshot_initiators()``, ``block_census()``
    and the ``pool`` / ``table`` / ``shared_ring`` / ``records`` attributes.
    """

    HELLO_ACTIVE_STATUS = Status.ALREADY_BOUND
    BIND_MISMATCH_STATUS = Status.MALFORMED
    ring_class: type[FreeRing] = FreeRing

    def __init__(self, fabric: Fabric, node: Node, config: TargetConfig | None = None, *, name: str = "target") -> None:
        self.fabric = fabric
        self.node = node
        self.config = config or TargetConfig()
        self.name = name
        cfg = self.config
        profile = fabric.profile
        self.binding: Binding = cfg.binding or profile.binding
        self.masked = profile.masked_atomics if cfg.masked_atomics is None else cfg.masked_atomics
        self.addr_le = bool(cfg.features & Features.ADDR_LE)
        self.counters = TargetCounters()
        self.failures: list[str] = []  # what made requests complete with INTERNAL

        pool_buf = node.alloc(cfg.pool_blocks * cfg.block_size)
        # The Pool STag: read-only for DIRECT_LOAD; a second registration is the base of partition windows.
        self.pool_region = node.register(pool_buf, Access.LOCAL_WRITE | Access.REMOTE_READ)
        self.pool_rw = node.register(pool_buf, Access.LOCAL_WRITE | Access.MW_BIND)
        self.pool = BlockPool(self.pool_region, cfg.pool_blocks, cfg.block_size)
        table_buf = node.alloc(cfg.table_entries * TABLE_ENTRY_SIZE)
        self.table_region = node.register(table_buf, Access.LOCAL_WRITE | Access.REMOTE_READ)
        self.table = BlockTable(self.table_region, cfg.table_entries, cfg.table_base_handle, self.addr_le)

        self.shared_ring: FreeRing | None = None
        self._ring_of_block: dict[int, FreeRing] = {}
        if cfg.shared_count:
            extent = self.pool.carve(cfg.shared_count)
            n = cfg.shared_slots.bit_length() - 1
            self.shared_ring = self.new_ring("shared", self.pool.extent_offsets(extent), n=n)
        self.shared_reserved = 0  # sum of quotas served from the shared ring
        self._retired: list[Partition] = []  # partitions of forgotten initiators, reused by size
        self.records: dict[bytes, InitiatorRecord] = {}
        self.sessions: list[Session] = []
        self._range_slots: list[bytes | None] = [None] * cfg.max_initiators
        self._monitors: dict[bytes, ActorHandle] = {}
        self._wr = _DATA_WR
        self._names = 0

    def _unique(self, what: str) -> str:
        self._names += 1
        return f"{self.name}.{what}.{self._names}"

    # ---- time ------------------------------------------------------------------------------------

    def now_ms(self) -> float:
        """The logical clock in milliseconds (the fabric's, which the scheduler or the test drives)."""
        return self.fabric.now * 1000.0

    # ---- construction helpers --------------------------------------------------------------------

    def new_ring(self, name: str, blocks: list[int], n: int | None = None) -> FreeRing:
        """A free-block ring over ``blocks`` (``ring_class``, so a mutant can break the ring arithmetic)."""
        ring = self.ring_class(self.node, name, blocks, n=n, masked=self.masked, addr_le=self.addr_le)
        for b in blocks:
            self._ring_of_block[b] = ring
        return ring

    def ring_of_block(self, block_offset: int) -> FreeRing:
        """The ring a block was allocated from, which is the one it returns to (KBTP "Block Free" 3)."""
        return self._ring_of_block[block_offset]

    def ring_for(self, record: InitiatorRecord) -> FreeRing | None:
        """Where the target allocates for this initiator: its partition ring, else the shared ring."""
        if record.partition is not None:
            return record.partition.ring
        return self.shared_ring

    def _next_wr(self) -> int:
        self._wr += 1
        return self._wr

    # ---- connections -----------------------------------------------------------------------------

    def recv_size(self) -> int:
        """Largest message an initiator may send: header, Data and Completion Descriptors, Max Inline."""
        return max(HEADER_SIZE + HELLO_BODY_SIZE, HEADER_SIZE + 2 * DESCRIPTOR_SIZE + self.config.max_inline)

    def accept(self, conn: Connection) -> ActorHandle:
        """Serve ``conn``: post the request credits' receive buffers and spawn the connection's actor."""
        credits = self.config.request_credits
        size = self.recv_size()
        recv = self.node.register(self.node.alloc(credits * size), Access.LOCAL_WRITE)
        staging = self.node.register(self.node.alloc(credits * self.config.block_size), Access.LOCAL_WRITE)
        session = Session(conn, recv, size, staging)
        self.sessions.append(session)
        for i in range(credits):
            conn.post_recv(recv.sge(i * size, size), wr_id=i)
        return self.fabric.spawn(f"{self.name}@{conn.name}", self._serve(session))

    def _serve(self, s: Session) -> Steps:
        try:
            yield from self._serve_requests(s)
        finally:  # a connection's buffers are registered memory: on a device, a served target would run out
            for region in (s.recv, s.staging):
                with contextlib.suppress(FabricUsageError):
                    self.node.deregister(region)

    def _serve_requests(self, s: Session) -> Steps:
        conn = s.conn
        while not s.closed:
            wc = yield from wait_completion(conn.cq, lambda c: c.op is Op.RECV or not c.ok)
            if not wc.ok or conn.state is not ConnState.CONNECTED:
                yield from self.end_session(s, release=False)
                return
            s.slot = wc.wr_id
            raw = s.recv.read(wc.wr_id * s.recv_size, wc.byte_len)
            # The buffer goes back before the answer does: an initiator with every Request Credit in use may send
            # its next request the moment the completion arrives, and on iWARP a Send that finds no receive ends
            # the stream (a device delivers it while this actor is still on its way to a later repost).
            conn.post_recv(s.recv.sge(wc.wr_id * s.recv_size, s.recv_size), wr_id=wc.wr_id)
            yield from self.on_message(s, raw)
        return

    # ---- dispatch --------------------------------------------------------------------------------

    def on_message(self, s: Session, raw: bytes) -> Steps:
        try:
            msg = decode(raw, addr_le=s.addr_le)
        except KbtpDecodeError as exc:
            yield from self.on_malformed(s, exc)
            return
        if isinstance(msg, Hello):
            yield from self.on_hello(s, msg)
        elif s.record is None:
            # Nothing but HELLO before the session exists.
            self._complete_raw(s, msg.OPCODE, msg.request_id, msg.handle, Status.MALFORMED)
        elif isinstance(msg, Goodbye):
            yield from self.on_goodbye(s, msg)
        elif isinstance(msg, Load | Store | AllocStore | Free | Bind):
            yield from self.on_request(RequestContext(s, s.record, msg, Opcode(msg.OPCODE)))
        else:  # HELLO_ACK or COMPLETION sent to a target
            self._complete_raw(s, msg.OPCODE, msg.request_id, msg.handle, Status.MALFORMED)

    def on_malformed(self, s: Session, exc: KbtpDecodeError) -> Steps:
        h = exc.header
        if (h is not None and h.opcode == Opcode.HELLO) or (h is None and s.record is None):
            self._send(s, HelloAck(status=exc.status).encode_raw())
            self.counters.complete(Opcode.HELLO, exc.status)
            return
        opcode = h.opcode if h is not None else 0
        self._complete_raw(s, opcode, h.request_id if h else 0, h.handle if h else 0, exc.status)
        yield from ()

    def on_request(self, ctx: RequestContext) -> Steps:
        for rule in self.rules_for(ctx.opcode):
            status = rule(ctx)
            if status is not None:
                self.complete(ctx, status)
                return
        runner = {Opcode.LOAD: self.exec_load, Opcode.STORE: self.exec_store, Opcode.ALLOC_STORE: self.exec_alloc_store,
                  Opcode.FREE: self.exec_free, Opcode.BIND: self.exec_bind}[ctx.opcode]
        try:
            yield from runner(ctx)
        except (PoolError, KeyError, ValueError) as exc:
            # A target failure (e.g. a ring slot naming no block): INTERNAL, and the session goes on.
            self.failures.append(f"{ctx.opcode.name} request {ctx.msg.request_id}: {exc}")
            self.complete(ctx, Status.INTERNAL)

    # ---- validation: one method per rule -----------------------------------------------------------

    def rules_for(self, opcode: Opcode) -> list[Rule]:
        """The checks of each operation in the order they run (KBTP "Operations" and each operation's step 1)."""
        if opcode is Opcode.LOAD:
            return [self.rule_handle_readable, self.rule_bound, self.rule_generation, self.rule_sealed_for_load,
                    self.rule_load_fits]
        if opcode is Opcode.STORE:
            return [self.rule_handle_owned, self.rule_bound, self.rule_generation, self.rule_not_sealed,
                    self.rule_store_fits]
        if opcode is Opcode.ALLOC_STORE:
            return [self.rule_handle_owned, self.rule_unbound, self.rule_generation, self.rule_store_fits,
                    self.rule_quota]
        if opcode is Opcode.FREE:
            return [self.rule_handle_owned, self.rule_bound, self.rule_generation]
        return [self.rule_bind_partition, self.rule_handle_owned, self.rule_unbound, self.rule_generation,
                self.rule_bind_fits, self.rule_ticket_not_abandoned, self.rule_bind_slot, self.rule_bind_quota]

    def readable(self, record: InitiatorRecord, handle: int) -> bool:
        """Loads: any handle of an initiator in the same trust domain (and unassigned handles of the table)."""
        if not self.table.contains(handle):
            return False
        owner = self.owner_of(handle)
        return owner is None or owner.domain == record.domain

    def owner_of(self, handle: int) -> InitiatorRecord | None:
        return next((r for r in self.records.values() if r.owns(handle)), None)

    def rule_handle_readable(self, ctx: RequestContext) -> Status | None:
        """INVALID_HANDLE unless the initiator may read the handle (KBTP-VAL-HANDLE, KBTP-LOAD-ANY)."""
        return None if self.readable(ctx.record, ctx.msg.handle) else Status.INVALID_HANDLE

    def rule_handle_owned(self, ctx: RequestContext) -> Status | None:
        """INVALID_HANDLE outside the initiator's own range (KBTP-HANDLE-OWN-RANGE, KBTP-STORE-OWN-RANGE,
        KBTP-ALLOC-OWN-RANGE, KBTP-FREE-OWN-RANGE)."""
        h = ctx.msg.handle
        return None if ctx.record.owns(h) and self.table.contains(h) else Status.INVALID_HANDLE

    def rule_bound(self, ctx: RequestContext) -> Status | None:
        """NOT_VALID unless the entry is VALID (KBTP-LOAD-VALID, KBTP-STORE-VALID, KBTP-FREE-VALID)."""
        return None if self.table.entry(ctx.msg.handle).valid else Status.NOT_VALID

    def rule_unbound(self, ctx: RequestContext) -> Status | None:
        """ALREADY_BOUND when the entry is VALID (KBTP-ALLOC-NOT-BOUND)."""
        return Status.ALREADY_BOUND if self.table.entry(ctx.msg.handle).valid else None

    def rule_generation(self, ctx: RequestContext) -> Status | None:
        """STALE_GENERATION when a non-zero request Generation differs (KBTP-VAL-GENERATION)."""
        g = ctx.msg.generation
        return Status.STALE_GENERATION if g and g != self.table.entry(ctx.msg.handle).generation else None

    def rule_sealed_for_load(self, ctx: RequestContext) -> Status | None:
        """NOT_SEALED unless SEALED or ALLOW_UNSEALED (KBTP-LOAD-SEALED)."""
        if ctx.flags & RequestFlags.ALLOW_UNSEALED or self.table.entry(ctx.msg.handle).sealed:
            return None
        return Status.NOT_SEALED

    def rule_not_sealed(self, ctx: RequestContext) -> Status | None:
        """SEALED: a sealed block does not change until freed (KBTP-STORE-UNSEALED)."""
        return Status.SEALED if self.table.entry(ctx.msg.handle).sealed else None

    def rule_load_fits(self, ctx: RequestContext) -> Status | None:
        """TOO_LARGE when Data Length exceeds the descriptor Length (KBTP-LOAD-FITS)."""
        assert isinstance(ctx.msg, Load)
        return Status.TOO_LARGE if self.table.entry(ctx.msg.handle).data_length > ctx.msg.data.length else None

    def rule_store_fits(self, ctx: RequestContext) -> Status | None:
        """TOO_LARGE beyond Block Size or Max Inline (KBTP-VAL-LENGTH)."""
        assert isinstance(ctx.msg, Store | AllocStore)
        length = ctx.msg.data.length
        if length > self.config.block_size:
            return Status.TOO_LARGE
        if ctx.msg.inline is not None and len(ctx.msg.inline) > self.config.max_inline:
            return Status.TOO_LARGE
        return None

    def rule_quota(self, ctx: RequestContext) -> Status | None:
        """NO_SPACE when the allocation would exceed the quota (KBTP-QUOTA-NO-SPACE). The Head is read first: a
        NIC executes the initiator's FetchAdds without telling the target, so tickets taken since the watcher
        last looked count now (KBTP-QUOTA-USAGE), not when it next wakes."""
        self.observe_tickets(ctx.record)
        if self.ring_for(ctx.record) is None or ctx.record.usage >= ctx.record.quota:
            return Status.NO_SPACE
        return None

    def rule_bind_partition(self, ctx: RequestContext) -> Status | None:
        """A BIND needs a DIRECT_ALLOC partition (KBTP-BIND-VERIFY)."""
        return None if ctx.record.partition is not None else self.BIND_MISMATCH_STATUS

    def rule_bind_fits(self, ctx: RequestContext) -> Status | None:
        """TOO_LARGE beyond Block Size (KBTP-VAL-LENGTH)."""
        assert isinstance(ctx.msg, Bind)
        return Status.TOO_LARGE if ctx.msg.data_length > self.config.block_size else None

    def rule_ticket_not_abandoned(self, ctx: RequestContext) -> Status | None:
        """TICKET_ABANDONED for a reclaimed ticket (KBTP-TICKET-ABANDONED)."""
        assert isinstance(ctx.msg, Bind) and ctx.record.partition is not None
        return Status.TICKET_ABANDONED if ctx.msg.ticket in ctx.record.partition.abandoned else None

    def rule_bind_slot(self, ctx: RequestContext) -> Status | None:
        """The ticket's slot must hold that Block Offset (KBTP-BIND-VERIFY)."""
        assert isinstance(ctx.msg, Bind) and ctx.record.partition is not None
        p = ctx.record.partition
        self.observe_tickets(ctx.record)
        taken = TakenTicket(ctx.msg.ticket, p.ring.slot_offset_of(ctx.msg.ticket))
        if ctx.msg.ticket not in p.seen or p.ring.slot_holds(taken) != ctx.msg.block_offset:
            return self.BIND_MISMATCH_STATUS
        return None

    def rule_bind_quota(self, ctx: RequestContext) -> Status | None:
        """NO_SPACE when the initiator is beyond its quota (KBTP-BIND-VERIFY, KBTP-QUOTA-NO-SPACE); the Head
        was read by rule_bind_slot just before."""
        return Status.NO_SPACE if ctx.record.usage > ctx.record.quota else None

    # ---- execution ---------------------------------------------------------------------------------

    def exec_load(self, ctx: RequestContext) -> Steps:
        """KBTP "Block Load": RDMA Write Data Length octets of the block, then complete."""
        assert isinstance(ctx.msg, Load)
        s, e = ctx.session, self.table.entry(ctx.msg.handle)
        # Snapshot in the validating step: a concurrent FREE on another connection cannot leak new data.
        base = s.slot * self.config.block_size
        if e.data_length:
            s.staging.write(base, self.pool.read(e.block_offset, e.data_length))
            s.conn.post_write(s.staging.sge(base, e.data_length), ctx.msg.data.stag, ctx.msg.data.tagged_offset,
                              signaled=False, tag=f"load{ctx.msg.request_id}")
        self.complete(ctx, Status.OK, e)
        yield from ()

    def exec_store(self, ctx: RequestContext) -> Steps:
        """KBTP "Block Mapped Store": data into the block, then Data Length (and SEALED), then complete."""
        assert isinstance(ctx.msg, Store)
        h = ctx.msg.handle
        e = self.table.entry(h)
        ok = yield from self.obtain_data(ctx, e.block_offset)
        if not ok:
            return
        yield from pause(f"entry-state.{h:#x}")
        self.table.write_length(h, ctx.msg.data.length)
        if ctx.flags & RequestFlags.SEAL:
            self.table.write_state(h, e.flags | EntryFlags.SEALED, e.generation)
        self.complete(ctx, Status.OK, self.table.entry(h))

    def exec_alloc_store(self, ctx: RequestContext) -> Steps:
        """KBTP "Block Unmapped Store": allocate, consume the slot, write the data, then the entry."""
        assert isinstance(ctx.msg, AllocStore)
        ring = self.ring_for(ctx.record)
        assert ring is not None
        ctx.record.pending_tickets += 1
        taken = self.take_ticket(ring, ctx.record)
        yield from pause(f"read-slot.{ring.name}.{taken.ticket}")
        block = yield from self.wait_for_slot(ring, taken)
        yield from self.consume_slot(ring, taken)
        ok = yield from self.fill_and_bind(ctx, block)
        ctx.record.pending_tickets -= 1
        if not ok:
            yield from self.return_block(ring, block, ctx.record)
            return
        self.complete(ctx, Status.OK, self.table.entry(ctx.msg.handle))

    def fill_and_bind(self, ctx: RequestContext, block: int) -> Generator[Command, Any, bool]:
        """The data first, then the entry: whoever observes VALID also observes the data (KBTP-ALLOC-ENTRY-ORDER)."""
        assert isinstance(ctx.msg, AllocStore)
        ok = yield from self.obtain_data(ctx, block)
        if ok:
            yield from self.bind_entry(ctx, block, ctx.msg.data.length, bool(ctx.flags & RequestFlags.SEAL))
        return ok

    def exec_free(self, ctx: RequestContext) -> Steps:
        """KBTP "Block Free": unbind with the next Generation, return the block once that is visible, complete."""
        h = ctx.msg.handle
        gen = yield from self.unbind_entry(ctx.record, h)
        self.complete(ctx, Status.OK, Entry(EntryFlags(0), gen, 0, 0))

    def exec_bind(self, ctx: RequestContext) -> Steps:
        """KBTP "Direct Modes" BIND: consume the ticket's slot, write the entry, complete."""
        assert isinstance(ctx.msg, Bind) and ctx.record.partition is not None
        p = ctx.record.partition
        taken = TakenTicket(ctx.msg.ticket, p.ring.slot_offset_of(ctx.msg.ticket))
        p.seen.pop(ctx.msg.ticket, None)
        ctx.record.pending_tickets += 1  # the ticket stays in usage until the handle is bound
        yield from self.consume_slot(p.ring, taken)
        yield from self.bind_entry(ctx, ctx.msg.block_offset, ctx.msg.data_length, seal=False)
        ctx.record.pending_tickets -= 1
        self.complete(ctx, Status.OK, self.table.entry(ctx.msg.handle))

    # ---- steps ---------------------------------------------------------------------------------------

    def next_generation(self, generation: int) -> int:
        """Incremented by one, skipping zero (KBTP-GEN-NEXT, KBTP-GEN-NONZERO)."""
        return next_generation(generation)

    def take_ticket(self, ring: FreeRing, record: InitiatorRecord) -> TakenTicket:
        """FetchAdd on Head by the target; on a partition ring the ticket is the target's, never timed out."""
        if record.partition is not None and ring is record.partition.ring:
            self.observe_tickets(record)
            taken = ring.fetch_add_head()
            record.partition.next_unseen = (taken.ticket + 1) % TICKET_MODULUS
            return taken
        return ring.fetch_add_head()

    def wait_for_slot(self, ring: FreeRing, taken: TakenTicket) -> Generator[Command, Any, int]:
        """Re-read the slot until its Sequence is the ticket and its Block Offset is not all ones."""
        while True:
            block = ring.slot_holds(taken)
            if block is not None:
                return block
            yield from wait_until(lambda: ring.slot_holds(taken) is not None,
                                  name=f"slot-wait.{ring.name}.{taken.ticket}")

    def consume_slot(self, ring: FreeRing, taken: TakenTicket) -> Steps:
        """Mark the slot consumed, then perform a free that was deferred on it (Block Offset, then Sequence)."""
        ring.mark_consumed(taken.slot_offset)
        waiting = ring.deferred.get(taken.index)
        if not waiting:
            return
        u, block = waiting.popleft()
        if not waiting:
            del ring.deferred[taken.index]
        ring.write_slot_block(taken.slot_offset, block)
        self.counters.deferred_flushed += 1
        yield from pause(f"slot-seq.{ring.name}.{u}")
        ring.write_slot_sequence(taken.slot_offset, u)

    def can_write_slot(self, ring: FreeRing, taken: TakenTicket) -> bool:
        """A free may write its slot only once it is consumed (KBTP-FREE-DEFER, KBTP-FREE-NO-OVERWRITE)."""
        return ring.is_consumed(taken.slot_offset) and taken.index not in ring.deferred

    def should_clear(self, ring: FreeRing, record: InitiatorRecord | None) -> bool:
        """Clear a freed block when it may next go to another trust domain (KBTP-FREE-CLEAR, KBTP-SEC-CLEAR)."""
        if record is not None and record.partition is not None and ring is record.partition.ring:
            return False  # a partition ring serves one initiator only
        return self.config.clears_freed

    def return_block(self, ring: FreeRing, block: int, record: InitiatorRecord | None) -> Steps:
        """Give a block back to its ring: clear if needed, FetchAdd Tail, write the slot or defer the write."""
        if self.should_clear(ring, record):
            self.pool.clear(block)
            self.counters.blocks_cleared += 1
        yield from pause(f"tail.{ring.name}")
        taken = ring.fetch_add_tail()
        if not self.can_write_slot(ring, taken):
            # Same step as the check: the consumer that empties the slot will find this entry.
            ring.deferred.setdefault(taken.index, deque()).append((taken.ticket, block))
            self.counters.deferred_frees += 1
            return
        ring.write_slot_block(taken.slot_offset, block)
        yield from pause(f"slot-seq.{ring.name}.{taken.ticket}")
        ring.write_slot_sequence(taken.slot_offset, taken.ticket)

    def obtain_data(self, ctx: RequestContext, block: int) -> Generator[Command, Any, bool]:
        """Inline payload, or RDMA Read from the Data Descriptor straight into the block; False if the read failed."""
        msg = ctx.msg
        assert isinstance(msg, Store | AllocStore)
        if msg.inline is not None:
            self.pool.write(block, msg.inline)
            return True
        if msg.data.length == 0:
            return True
        conn = ctx.session.conn
        wr = self._next_wr()
        conn.post_read(self.pool_rw.sge(self.pool.position(block), msg.data.length), msg.data.stag,
                       msg.data.tagged_offset, wr_id=wr, tag=f"store{msg.request_id}")
        wc = yield from wait_completion(conn.cq, lambda c: c.wr_id == wr)
        return wc.ok

    def bind_entry(self, ctx: RequestContext, block: int, length: int, seal: bool) -> Steps:
        """Data Length and Block Offset first, then VALID (SEALED) and the next Generation (KBTP-TABLE-BIND-ORDER)."""
        h = ctx.msg.handle
        gen = self.next_generation(self.table.entry(h).generation)
        self.table.write_location(h, length, block)
        yield from pause(f"entry-state.{h:#x}")
        flags = EntryFlags.VALID | (EntryFlags.SEALED if seal else EntryFlags(0))
        self.table.write_state(h, flags, gen)
        ctx.record.bound.add(h)

    def unbind_entry(self, record: InitiatorRecord, handle: int) -> Generator[Command, Any, int]:
        """Clear VALID and SEALED with the next Generation, then return the block; the new Generation."""
        e = self.table.entry(handle)
        gen = self.next_generation(e.generation)
        self.table.write_state(handle, EntryFlags(0), gen)
        yield from self.return_block(self.ring_of_block(e.block_offset), e.block_offset, record)
        self.release_quota(record, handle)
        return gen

    def release_quota(self, record: InitiatorRecord, handle: int) -> None:
        """One unit of usage back when a FREE completes (KBTP-QUOTA-RELEASE)."""
        record.bound.discard(handle)

    # ---- completion ----------------------------------------------------------------------------------

    def complete(self, ctx: RequestContext, status: Status, entry: Entry | None = None) -> None:
        """COMPLETION by Send (with Invalidate when asked), or a completion record when granted and asked."""
        msg = ctx.msg
        if entry is None:
            entry = self.table.entry(msg.handle) if self.table.contains(msg.handle) else Entry(generation=0)
            length, offset = 0, 0
        else:
            length, offset = entry.data_length, entry.block_offset
        s = ctx.session
        self.counters.complete(ctx.opcode, status)
        record_to = msg.completion if isinstance(msg, Load | Store | AllocStore | Free) else None
        if (record_to is not None and ctx.flags & RequestFlags.RECORD
                and s.granted & Features.RECORD_COMPLETION):
            rec = CompletionRecord(msg.request_id, int(status), entry.generation, length, offset).pack()
            imm = (msg.request_id & 0xFFFFFFFF).to_bytes(4, "big").rjust(self.fabric.profile.immediate_bytes, b"\0")
            # IB/RoCE: RDMA Write with Immediate, so completion shows in the initiator's CQ.
            s.conn.post_write(rec, record_to.stag, record_to.tagged_offset, imm=imm, signaled=False,
                              tag=f"record{msg.request_id}")
            return
        invalidate = None
        if ctx.flags & RequestFlags.INVALIDATE and isinstance(msg, Load | Store | AllocStore) and msg.data.stag:
            invalidate = msg.data.stag
        out = Completion(request_id=msg.request_id, handle=msg.handle, generation=entry.generation, status=int(status),
                         data_length=length, block_offset=offset)
        s.conn.post_send(out.encode_raw(), invalidate=invalidate, signaled=False, tag=f"completion{msg.request_id}")

    def _complete_raw(self, s: Session, opcode: int, request_id: int, handle: int, status: Status) -> None:
        self.counters.complete(opcode, status)
        out = Completion(request_id=request_id, handle=handle, status=int(status))
        s.conn.post_send(out.encode_raw(), signaled=False)

    def _send(self, s: Session, data: bytes) -> None:
        s.conn.post_send(data, signaled=False)

    # ---- sessions ------------------------------------------------------------------------------------

    def quota_for(self, initiator_id: bytes) -> int:
        return self.config.quotas.get(initiator_id, self.config.quota)

    def trusts_direct(self, record: InitiatorRecord) -> bool:
        """Direct modes only for initiators trusted for every block the exposed STags reach (one trust domain,
        and not configured untrusted)."""
        return not self.config.multi_domain and record.initiator_id not in self.config.untrusted_initiators

    def grant_features(self, record: InitiatorRecord, requested: Features) -> Features:
        """Requested and offered (ADDR_LE is the target's choice, so always when configured); never
        RECORD_COMPLETION on RDMAP (KBTP-COMP-NO-RECORD-RDMAP), direct modes only when trusted (KBTP-DIRECT-TRUST)."""
        offered = self.config.offered_features(self.binding)
        if not self.fabric.profile.atomics or not self.fabric.profile.mw_type2:
            offered &= ~Features.DIRECT_ALLOC
        if not self.trusts_direct(record):
            offered &= ~(Features.DIRECT_LOAD | Features.DIRECT_ALLOC)
        granted = requested & offered
        if record.partition is None:
            granted &= ~Features.DIRECT_ALLOC
        if self.addr_le:
            granted |= Features.ADDR_LE
        return Features(granted)

    def admit(self, initiator_id: bytes, requested: Features) -> InitiatorRecord | None:
        """A new initiator: a handle range and a quota, served by a partition (DIRECT_ALLOC) or the shared ring."""
        try:
            slot = self._range_slots.index(None)
        except ValueError:
            return None
        cfg = self.config
        quota = self.quota_for(initiator_id)
        record = InitiatorRecord(initiator_id, slot, cfg.table_base_handle + slot * cfg.handle_count,
                                 cfg.handle_count, quota, cfg.domain_of(initiator_id))
        want_partition = bool(requested & Features.DIRECT_ALLOC
                              & self.config.offered_features(self.binding)) and quota > 0 and self.trusts_direct(record)
        if want_partition and self.fabric.profile.atomics and self.fabric.profile.mw_type2:
            record.partition = self.partition_for(quota, slot)
        if record.partition is None:
            capacity = self.shared_ring.free_blocks if self.shared_ring is not None else 0
            if self.shared_reserved + quota > capacity:
                return None  # the sum of quotas must not exceed the blocks their ring holds
            self.shared_reserved += quota
        self._range_slots[slot] = initiator_id
        self.records[initiator_id] = record
        return record

    def partition_for(self, quota: int, slot: int) -> Partition | None:
        """A retired partition of this size whose blocks are all back, else a freshly carved one, else None."""
        for p in self._retired:
            if p.extent.count == quota and not p.reclaiming and p.ring.occupancy() == p.ring.free_blocks:
                self._retired.remove(p)
                p.seen.clear()
                return p
        try:
            extent = self.pool.carve(quota)
        except PoolError:
            return None
        return Partition(extent, self.new_ring(f"p{slot}.{self._names}", self.pool.extent_offsets(extent)))

    def on_hello(self, s: Session, msg: Hello) -> Steps:
        if s.record is not None:
            self._send(s, HelloAck(status=Status.MALFORMED).encode_raw())
            self.counters.complete(Opcode.HELLO, Status.MALFORMED)
            return
        iid = bytes(msg.initiator_id)
        record = self.records.get(iid)
        if record is not None and record.active:  # KBTP-HELLO-ID-ACTIVE
            self.counters.hellos_rejected += 1
            self._send(s, HelloAck(status=self.HELLO_ACTIVE_STATUS).encode_raw())
            self.counters.complete(Opcode.HELLO, self.HELLO_ACTIVE_STATUS)
            return
        requested = Features(msg.requested_features & 0xF)
        if record is None:
            record = self.admit(iid, requested)
            if record is None:
                self._send(s, HelloAck(status=Status.NO_SPACE).encode_raw())
                self.counters.complete(Opcode.HELLO, Status.NO_SPACE)
                return
        granted = self.grant_features(record, requested)
        record.connection = s
        record.retained_until = None
        s.record, s.granted, s.addr_le = record, granted, bool(granted & Features.ADDR_LE)
        ack = self.hello_ack(s, record, granted)
        self._send(s, ack.encode_raw())
        self.counters.complete(Opcode.HELLO, Status.OK)
        if record.partition is not None:
            self._watch(record)
        yield from ()

    def hello_ack(self, s: Session, record: InitiatorRecord, granted: Features) -> HelloAck:
        cfg = self.config
        direct_load = direct_alloc = None
        if granted & Features.DIRECT_LOAD:
            direct_load = DirectLoad(
                DirectDescriptor(self.table_region.stag, self.table_region.to_base, cfg.table_entries),
                cfg.table_base_handle,
                DirectDescriptor(self.pool_region.stag, self.pool_region.to_base, cfg.pool_blocks))
        if granted & Features.DIRECT_ALLOC:
            p = record.partition
            assert p is not None
            first = self.pool.position(self.pool.offset_of(p.extent.first))
            part = self.node.bind_window(self.pool_rw, first, p.extent.count * cfg.block_size, Access.REMOTE_WRITE,
                                         s.conn)
            ring = self.node.bind_window(p.ring.slots_region, 0, p.ring.slots_region.length, Access.REMOTE_READ,
                                         s.conn)
            head = self.node.bind_window(p.ring.head_region, 0, 8, Access.REMOTE_ATOMIC, s.conn)
            s.windows = [part, ring, head]
            direct_alloc = DirectAlloc(DirectDescriptor(part.stag, part.to(0), p.extent.count),
                                       DirectDescriptor(ring.stag, ring.to(0), p.ring.slots),
                                       DirectDescriptor(head.stag, head.to(0), 1))
        return HelloAck(features=int(granted), request_credits=cfg.request_credits, block_size=cfg.block_size,
                        max_inline=cfg.max_inline, allocation_quota=record.quota, handle_base=record.handle_base,
                        handle_count=record.handle_count, ticket_timeout_ms=cfg.ticket_timeout_ms,
                        direct_load=direct_load, direct_alloc=direct_alloc)

    def on_goodbye(self, s: Session, msg: Goodbye) -> Steps:
        """GOODBYE ends the session; with RELEASE every binding goes, otherwise they are retained."""
        self.counters.complete(Opcode.GOODBYE, Status.OK)
        yield from self.end_session(s, release=bool(msg.flags & GoodbyeFlags.RELEASE))
        s.conn.disconnect()

    def end_session(self, s: Session, release: bool) -> Steps:
        s.closed = True
        self.drop_windows(s)
        record = s.record
        if record is None or record.connection is not s:
            return
        record.connection = None
        if release:
            yield from self.forget(record)
            return
        record.retained_until = deadline = self.now_ms() + self.config.retention_ms
        self.fabric.spawn(self._unique(f"retain.{record.slot}"), self._retain(record, deadline), daemon=True)

    def _retain(self, record: InitiatorRecord, deadline: float) -> Steps:
        """Keep an idle initiator's bindings until ``deadline`` (logical ms), then release them.

        Ends early when the initiator reconnected (or was forgotten) meanwhile, even before this actor's
        first step; a later disconnect starts a new retention with its own deadline.
        """
        while True:
            superseded = record.active or record.retained_until != deadline
            if superseded or self.records.get(record.initiator_id) is not record:
                return
            left = deadline - self.now_ms()
            if left <= _EPS_MS:
                break
            yield from wait_until(lambda: record.active, name=f"retain.{record.slot}", timeout=left / 1000.0)
        self.counters.sessions_expired += 1
        yield from self.forget(record)

    def forget(self, record: InitiatorRecord) -> Steps:
        """Release everything an initiator holds: bindings, outstanding tickets, partition, quota, handle range."""
        for h in sorted(record.bound):
            yield from self.unbind_entry(record, h)
        p = record.partition
        if p is not None:
            self.observe_tickets(record)
            for t in sorted(p.seen):
                self.abandon(record, t)
        if self.records.get(record.initiator_id) is record:
            del self.records[record.initiator_id]
            self._range_slots[record.slot] = None
            if p is None:
                self.shared_reserved -= record.quota
            else:
                # Its blocks come back to the ring as reclaims finish; a later initiator of that quota reuses it.
                self._retired.append(p)

    def fence_direct_alloc(self, s: Session) -> None:
        """Invalidate the session's Partition STag: no RDMA Write of the initiator reaches the partition any
        more, and DIRECT_ALLOC is off for the rest of the session (KBTP-TICKET-RECLAIM-FENCE)."""
        if s.windows and self.node.is_valid(s.windows[0].stag):
            self.node.invalidate(s.windows[0].stag)
            self.counters.stags_invalidated += 1
        s.fenced = True
        s.granted &= ~Features.DIRECT_ALLOC

    def drop_windows(self, s: Session) -> None:
        """At session end every window of the connection goes (Partition, Ring, Head)."""
        self.fence_direct_alloc(s)
        for w in s.windows:
            if self.node.is_valid(w.stag):
                self.node.invalidate(w.stag)
        s.windows = []

    # ---- DIRECT_ALLOC tickets ------------------------------------------------------------------------

    def observe_tickets(self, record: InitiatorRecord) -> None:
        """Note, with the logical time, every ticket taken on the partition Head since the last look."""
        p = record.partition
        if p is None:
            return
        head = p.ring.head_ticket()
        now = self.now_ms()
        while p.next_unseen != head:
            p.seen.setdefault(p.next_unseen, now)
            p.next_unseen = (p.next_unseen + 1) % TICKET_MODULUS

    def _watch(self, record: InitiatorRecord) -> None:
        handle = self._monitors.get(record.initiator_id)
        if handle is None or handle.done:
            self._monitors[record.initiator_id] = self.fabric.spawn(
                self._unique(f"tickets.{record.slot}"), self._watch_tickets(record), daemon=True)

    def _watch_tickets(self, record: InitiatorRecord) -> Steps:
        """Reclaim tickets not bound within the Ticket Timeout (KBTP "Allocation Quotas")."""
        p = record.partition
        assert p is not None
        timeout = float(self.config.ticket_timeout_ms)
        while self.records.get(record.initiator_id) is record:
            self.observe_tickets(record)
            now = self.now_ms()
            for t in [t for t, seen in p.seen.items() if now - seen >= timeout - _EPS_MS]:
                self.abandon(record, t)
            if not p.seen and not record.active:
                return
            wait_s = None
            if p.seen:
                wait_s = max(0.0, (min(p.seen.values()) + timeout - self.now_ms()) / 1000.0)
            # Wake on a new ticket, or when the session starts or stops (not merely while it is stopped: an
            # initiator gone with a ticket outstanding must not make this loop spin without time passing).
            active = record.active
            yield from wait_until(lambda h=p.next_unseen, a=active: p.ring.head_ticket() != h  # type: ignore[misc]
                                  or record.active != a, name=f"tickets.{record.slot}", timeout=wait_s)

    def abandon(self, record: InitiatorRecord, ticket: int) -> None:
        """A ticket not bound in time: fence the initiator first, then reclaim the ticket's block."""
        p = record.partition
        assert p is not None
        session = record.connection
        if isinstance(session, Session):
            self.fence_direct_alloc(session)
        p.seen.pop(ticket, None)
        p.abandoned.add(ticket)
        p.reclaiming += 1
        self.counters.tickets_abandoned += 1
        # Its own actor: the slot may still wait for a free's deferred write, and nothing else should wait.
        self.fabric.spawn(self._unique(f"reclaim.{record.slot}.{ticket}"), self.reclaim(record, ticket), daemon=True)

    def reclaim(self, record: InitiatorRecord, ticket: int) -> Steps:
        """Consume the abandoned ticket's slot, return its block with a new ticket, release the quota unit."""
        p = record.partition
        assert p is not None
        ring = p.ring
        taken = TakenTicket(ticket, ring.slot_offset_of(ticket))
        block = yield from self.wait_for_slot(ring, taken)
        yield from self.consume_slot(ring, taken)
        yield from self.return_block(ring, block, record)
        self.release_ticket(record, ticket)

    def release_ticket(self, record: InitiatorRecord, ticket: int) -> None:
        """One unit of usage back once the abandoned ticket's block is in the ring (KBTP-QUOTA-RELEASE)."""
        p = record.partition
        if p is not None:
            p.reclaiming -= 1

    # ---- observation (kvconform.kbtp.observe) ---------------------------------------------------------

    def rings(self) -> dict[str, FreeRing]:
        """Every free-block ring by name: the shared one and each partition's."""
        return {r.name: r for r in self._ring_of_block.values()}

    def snapshot_rings(self) -> dict[str, RingView]:
        return {name: ring_view(r) for name, r in sorted(self.rings().items())}

    def snapshot_initiators(self) -> dict[bytes, InitiatorView]:
        for r in self.records.values():
            self.observe_tickets(r)
        return {iid: initiator_view(r) for iid, r in self.records.items()}

    def block_census(self) -> dict[int, list[str]]:
        """Where each block is (see `observe.block_census`); at quiescence each appears exactly once."""
        return block_census(self.table, self.rings().values(), self.records.values())

    def census_problems(self) -> list[str]:
        """Blocks lost (nowhere) or handed out twice (more than one place)."""
        return census_problems(self.block_census())
