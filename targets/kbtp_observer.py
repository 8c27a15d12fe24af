"""The harness's target for the kbtp-initiator suite: the reference target, recording every message an
initiator sends and every one-sided RDMA operation it performs (from the emulated fabric's step trace),
so a check can judge what the initiator did: which handles, which Generations, which STags, in which
order, and never anything outside what it was granted.

Its geometry puts the initiator at the boundaries where wrong initiators differ (DESIGN.md principle 8):
every entry's Generation starts just below the 16-bit wrap (the first binding is 0xFFFF, all ones), the
DIRECT_ALLOC Head can start whole laps of its ring below the 32-bit ticket wrap (``tickets_before_wrap``),
and it advertises ``request_credits`` Request Credits while posting ``CREDIT_SLACK`` receive buffers more,
so an initiator that sends beyond its credits is observed (and judged) instead of having its connection
terminated."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Generator
from dataclasses import dataclass, field
from typing import Any

from kvconform import evidence
from kvconform.kbtp.constants import EntryFlags
from kvconform.kbtp.freering import FreeRing
from kvconform.kbtp.messages import Hello, HelloAck, KbtpDecodeError, Message, decode
from kvconform.kbtp.ring import TICKET_MODULUS
from kvconform.kbtp.target import ReferenceTarget
from kvconform.rdma import ActorFailed, ActorGen
from kvconform.rdma.fabric import Access
from kvconform.rdma.wire.impair import Impairment
from kvconform.targets.kbtp import InitiatorEndpoint, InitiatorParams, TargetParams, target_config
from kvconform.targets.kbtp_bed import MAX_STEPS, make_fabric, require_owned_races, with_hint
from kvconform.targets.kbtp_client import HarnessInitiator
from kvconform.targets.kbtp_credits import PROBE_WAIT_S, CreditProbe
from kvconform.targets.kbtp_order import OrderWitness, install
from kvconform.verdicts import HarnessBug, TargetUnavailable, Violation, check, inconclusive, not_applicable

START_GENERATION = 0xFFFE  # the first binding of every entry gets 0xFFFF (all ones), its free 1 (zero skipped)
CREDIT_SLACK = 8  # receive buffers posted beyond the advertised Request Credits, to observe an overrun
CONNECT_WAIT_S = 15.0  # a cmd: initiator process: from its start to its connection being set up


@dataclass(frozen=True)
class Exposed:
    """A remotely accessible STag of the initiator's node: what it names and the rights it grants."""

    stag: int
    to: int
    length: int
    access: int


class _InitiatorFailed(Exception):
    """The initiator under test raised inside one of its operations (see ``InitiatorBed.op``)."""

    def __init__(self, cause: BaseException) -> None:
        super().__init__(repr(cause))
        self.cause = cause


@dataclass
class Received:
    """One message the target received from the initiator, with the fabric step it was processed at."""

    step: int
    conn: str
    raw: bytes
    addr_le: bool
    message: Message | None
    error: str = ""
    error_requirement: str = ""  # the requirement the codec names for why it does not decode
    exposed: tuple[Exposed, ...] = ()  # the initiator's remotely accessible STags when the message arrived
    posted: int | None = None  # receive buffers the initiator had posted then (None: not observable)


@dataclass(frozen=True)
class ReadThrough:
    """The harness target's RDMA Read of a STORE / ALLOC_STORE's data through its Data Descriptor (as decoded)."""

    conn: str
    request_id: int
    ok: bool
    data: bytes  # what landed in the block (empty when the Read failed)

    @property
    def status(self) -> str:
        return "OK" if self.ok else "failed"


@dataclass
class RemoteOp:
    """One one-sided operation of the initiator as it arrived at the target (from the step trace)."""

    step: int
    kind: str  # "rdma_read" | "write" | "fetch_add" | "cmp_swap"
    stag: int
    to: int
    length: int = 0
    wr: str = ""
    nth: int = 0  # its place among the initiator's operations of its kind, in the order the target executed them


class ObservingTarget(ReferenceTarget):
    """The reference target that also keeps what each connection's initiator sent."""

    def __init__(self, *args: Any, advertised_credits: int | None = None, tickets_before_wrap: int = 0,
                 exposed: Any = None, posted: Any = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.received: list[Received] = []
        self.acks: list[tuple[str, HelloAck]] = []
        self.advertised_credits = advertised_credits
        self.tickets_before_wrap = tickets_before_wrap
        self.first_ticket = 0  # of the last partition ring it set up
        self.exposed = exposed  # () -> the initiator node's remotely accessible STags, when the bed knows them
        self.posted = posted  # () -> receive buffers posted on the initiator's connection, when the bed knows them
        self.reads: list[ReadThrough] = []  # its own RDMA Reads through the initiator's descriptors
        # (session, decoded message or None) -> steps run before the message is served: a check's probe of the
        # initiator's memory through the STags its descriptors name (conformance/kbtp/exposure.py)
        self.probe: Callable[[Any, Message | None], Generator[Any, Any, None]] | None = None
        self.credit_probe: CreditProbe | None = None  # Sends behind the HELLO_ACK (targets/kbtp_credits.py)

    def partition_for(self, quota: int, slot: int) -> Any:
        """A fresh partition's ring as if it had gone round to ``tickets_before_wrap`` (rounded up to whole laps)
        below the 32-bit wrap."""
        p = super().partition_for(quota, slot)
        if p is not None and self.tickets_before_wrap and p.next_unseen == 0 and not p.seen \
                and p.ring.head_ticket() == 0:
            laps = -(-self.tickets_before_wrap // p.ring.slots)
            _restart_ring(p.ring, TICKET_MODULUS - laps * p.ring.slots)
            p.next_unseen = p.ring.head_ticket()
        if p is not None:
            self.first_ticket = p.ring.head_ticket()
        return p

    def on_message(self, s: Any, raw: bytes) -> Any:
        try:
            msg: Message | None = decode(raw, addr_le=s.addr_le)
            err, err_req = "", ""
        except KbtpDecodeError as exc:
            msg, err, err_req = None, str(exc), exc.requirement
        exposed = tuple(self.exposed()) if self.exposed is not None else ()
        posted = self.posted() if self.posted is not None else None
        self.received.append(Received(self.fabric.steps, s.conn.name, bytes(raw), s.addr_le, msg, err,  # type: ignore[attr-defined]
                                      err_req, exposed, posted))
        evidence.record("received", "kbtp", {"at": "harness target", "message": type(msg).__name__ if msg else err},
                        raw=raw)
        if self.probe is not None:
            yield from self.probe(s, msg)
        yield from super().on_message(s, raw)

    def obtain_data(self, ctx: Any, block: int) -> Generator[Any, Any, bool]:
        ok = yield from super().obtain_data(ctx, block)
        msg = ctx.msg
        if msg.inline is None and msg.data.length:
            data = self.pool.read(block, msg.data.length) if ok else b""
            self.reads.append(ReadThrough(ctx.session.conn.name, msg.request_id, ok, bytes(data)))
        return ok

    def on_hello(self, s: Any, msg: Hello) -> Any:
        had = s.record
        yield from super().on_hello(s, msg)
        if self.credit_probe is not None and had is None and s.record is not None:  # a session began
            self.credit_probe.fire(s, msg.completion_credits)

    def hello_ack(self, s: Any, record: Any, granted: Any) -> HelloAck:
        ack = super().hello_ack(s, record, granted)
        if self.advertised_credits is not None and ack.status == 0:
            ack = dataclasses.replace(ack, request_credits=self.advertised_credits)
        self.acks.append((s.conn.name, ack))
        return ack


def _restart_ring(ring: FreeRing, start: int) -> None:
    """Re-initialise a fresh ring so its tickets begin at ``start`` (a multiple of N, so every ticket t keeps
    slot t mod N in both counter layouts): the state its Initialization rule gives after ``start`` tickets."""
    layout = ring.layout
    blocks = [slot.block_offset for slot in (ring.read_slot(16 * i) for i in range(ring.free_blocks))]
    for i, slot in enumerate(layout.initial_slots(blocks, start)):
        ring.slots_region.write(i * 16, slot.pack(ring.addr_le))
    ring.head_region.write_u64(0, layout.initial_head(start))
    ring.buffer.write_u64(ring._tail_at, layout.initial_tail(len(blocks), start))


def stags_observable(node: Any) -> bool:
    """Whether the harness can list ``node``'s STags (it can on its own emulated fabric, not on a device)."""
    return hasattr(node, "_stags")


def posted_receives(conn: Any) -> int | None:
    """Receive buffers posted on ``conn`` (an emulated connection) and not yet consumed."""
    rq = getattr(conn, "rq", None)
    return None if rq is None else len(rq)


def exposed_stags(node: Any) -> list[Exposed]:
    """The STags of ``node`` (an emulated node) that grant any remote access, with the range each names."""
    out = []
    for stag, obj in sorted(getattr(node, "_stags", {}).items()):
        access = int(obj.access)
        if access & int(Access.REMOTE_READ | Access.REMOTE_WRITE | Access.REMOTE_ATOMIC):
            out.append(Exposed(stag, obj.to(0), obj.length, access))
    return out


@dataclass
class InitiatorBed:
    """The initiator under test on node ``I`` facing the observing target on node ``target``."""

    driver: Any
    params: InitiatorParams
    target_params: TargetParams
    seed: int
    label: str = "initiator"
    scheduler: Any = None
    request_credits: int | None = None  # advertised by the harness target (None: its configured 8)
    tickets_before_wrap: int = 0  # DIRECT_ALLOC Heads start this far (whole laps) below the wrap; 0: at ticket 0
    start_generation: int | None = START_GENERATION
    wire: str = "emulated"  # the emulated fabric, or iwarp / roce over loopback sockets (see make_fabric)
    credit_probe: bool = False  # an initiator in another process: probe its Completion Credits (probe_credits)
    impair: Impairment | None = None  # the impairment stage on the harness's links (--kvconform-impair)
    fabric: Any = field(init=False)
    target: ObservingTarget = field(init=False)
    endpoint: InitiatorEndpoint = field(init=False)
    failure: str | None = None  # how the initiator under test failed, when it did
    initiator_node: Any = field(init=False, default=None)  # None: the initiator is another process
    initiator_conn: Any = field(init=False, default=None)
    order_witness: OrderWitness | None = field(init=False, default=None)  # see witness_order
    _runs: int = 0

    def __post_init__(self) -> None:
        own = getattr(self.driver, "make_fabric", None)  # an initiator in another process: its driver's wire
        self.fabric = own(self.target_params, trace=True) if own else make_fabric(
            self.target_params, self.seed, self.scheduler, trace=True, wire=self.wire)
        require_owned_races(self.fabric, self.scheduler)
        if self.impair is not None and self.impair.active:
            impair = getattr(self.fabric, "impair", None)
            if impair is None or not getattr(self.fabric, "crafts_frames", True):
                inconclusive(f"the impairment {self.impair.spec()} acts on the harness's own wire links "
                             f"(--kbtp-wire, a cmd: initiator); {self.fabric!r} has none the harness can impair")
            impair(self.impair, salt=self.label)
        tnode = self.tnode = self.fabric.node("target")
        config = target_config(self.target_params)
        if self.request_credits is not None:
            config = dataclasses.replace(config, request_credits=self.request_credits + CREDIT_SLACK)
        launch = getattr(self.driver, "launch", None)
        if launch is None:
            inode = self.initiator_node = self.fabric.node("I")
            t_conn, i_conn = self.fabric.connect(tnode, inode, name="I-conn")
            self.target = self._target(config, exposed=lambda: exposed_stags(inode),
                                       posted=lambda: posted_receives(i_conn))
            self.target_conn = t_conn.name
            self.target.accept(t_conn)
            self.endpoint = self.driver.start(self.fabric, inode, i_conn, self.params)
            self.initiator_conn = i_conn
            return
        # A process: the harness target listens, the initiator connects to it; its memory and posts are its own
        # (checks that read them are inconclusive: stags_observable, posted None).
        self.initiator_node = None
        self.initiator_conn = None
        self.target = self._target(config, exposed=None, posted=None)
        if self.credit_probe and getattr(self.fabric, "crafts_frames", True) \
                and getattr(self.fabric, "binding", None) in ("roce", "iwarp"):
            self.target.credit_probe = CreditProbe(self.fabric.binding)
        accepted: list[Any] = []

        def on_accept(conn: Any) -> None:
            if not accepted:
                self.target_conn = conn.name
                self.target.accept(conn)
            accepted.append(conn)

        listener = self.fabric.listen(tnode, "127.0.0.1", 0, on_accept)
        url = f"kbtp+{self.fabric.binding}://127.0.0.1:{self.fabric.port_of(listener)}"
        self.endpoint = launch(self.fabric, url, self.params)
        if not self.fabric.await_event(lambda: bool(accepted), CONNECT_WAIT_S):
            self.close()
            raise TargetUnavailable(f"the initiator under test did not connect to {url} within {CONNECT_WAIT_S:g} s")

    def _target(self, config: Any, *, exposed: Any, posted: Any) -> ObservingTarget:
        target = ObservingTarget(self.fabric, self.tnode, config, advertised_credits=self.request_credits,
                                 tickets_before_wrap=self.tickets_before_wrap, exposed=exposed, posted=posted)
        if self.start_generation is not None:
            table = target.table
            for h in range(table.base_handle, table.base_handle + table.entries):
                table.write_state(h, EntryFlags(0), self.start_generation)
        return target

    def close(self) -> None:
        stop = getattr(self.endpoint, "close", None) if hasattr(self, "endpoint") else None
        if stop is not None:
            stop()
        impairer = getattr(self.fabric, "impairer", None)
        if impairer is not None:  # what the impairment stage did: with its seed, the run replays
            evidence.record("note", "wire-impairment", {"label": self.label, **impairer.summary()})
        close = getattr(self.fabric, "close", None)
        if close is not None:
            close()

    def allocates(self) -> None:
        """Not applicable when the harness target's declared quota (PICS kbtp.target.quota) is 0: a scenario that
        has the initiator bind a block cannot run, since a correct initiator then allocates nothing."""
        if self.target_params.quota == 0:
            not_applicable("PICS kbtp.target.quota is 0: the initiator under test can bind nothing")

    def fit(self, data: bytes) -> bytes:
        """``data`` cut to the harness target's Block Size: a scenario's store is not meant to be TOO_LARGE."""
        return data[:self.target_params.block_size]

    def harness_client(self, name: str) -> HarnessInitiator:
        """A harness initiator on its own node, served by the same observing target (a second party)."""
        node = self.fabric.node(name)
        t_conn, i_conn = self.fabric.connect(self.tnode, node, name=f"{name}-conn")
        self.target.accept(t_conn)
        return HarnessInitiator(self.fabric, node, i_conn, name, harness_side=True)

    def op(self, gen: ActorGen) -> ActorGen:
        """Run one operation of the initiator under test; an exception it raises (it crashed, or gave up when
        its connection failed) stops the scenario, kept in ``failure`` for the check to judge after it has
        looked at what the initiator sent (which usually names the rule it broke)."""
        try:
            result = yield from gen
        except Exception as exc:  # the implementation's failure, not the harness's
            raise _InitiatorFailed(exc) from exc
        return result

    def run(self, **actors: ActorGen) -> dict[str, Any]:
        """Spawn the actors and run to quiescence (bounded); their results (those that finished).

        A violation in an actor is re-raised with the seed and schedule; the initiator under test failing
        (through ``op``) stops the run and is kept in ``failure``; any other actor error is the harness's."""
        handles = {name: self.fabric.spawn(name, gen) for name, gen in actors.items()}
        try:
            result = self.fabric.run(max_steps=MAX_STEPS)
        except ActorFailed as exc:
            cause = exc.cause
            if isinstance(cause, Violation):
                raise with_hint(cause, self.hint()) from None
            if isinstance(cause, _InitiatorFailed):
                self.failure = f"the initiator raised {cause.cause!r} [{self.hint()}]"
                evidence.note(self.failure)
                return {name: h.result for name, h in handles.items() if h.done}
            if exc.actor in handles:
                raise cause from None  # the harness's own actor: a harness error
            self.failure = f"the harness target's actor {exc.actor!r} raised {cause!r} [{self.hint()}]"
            raise HarnessBug(self.failure) from cause
        if result.reason == "max_steps" or any(not h.done for h in handles.values()):
            self.failure = (f"the run did not finish ({result.reason}, blocked {list(result.blocked)}): the "
                            f"initiator never completed its operations [{self.hint()}]")
            evidence.note(self.failure)
        return {name: h.result for name, h in handles.items() if h.done}

    def settle(self, *, req: str) -> None:
        """After the check's own judgements: the initiator under test must have completed its operations
        (``req``: the requirement that says it does what the check asked of it)."""
        check(self.failure is None, f"the initiator did not complete the scenario: {self.failure}", req=req)

    def run_one(self, gen: ActorGen) -> Any:
        self._runs += 1
        name = f"main{self._runs}"
        return self.run(**{name: gen})[name]

    def hint(self) -> str:
        return f"{self.label}: fabric seed {self.seed}, {self.fabric.steps} steps, last: {self.fabric.schedule[-12:]}"

    @property
    def ack(self) -> HelloAck | None:
        """The HELLO_ACK the initiator under test got."""
        mine = [a for conn, a in self.target.acks if conn == self.target_conn]
        return mine[-1] if mine else None

    def messages(self) -> list[Received]:
        """What the initiator under test sent, in order (not the harness's own clients)."""
        return [r for r in self.target.received if r.conn == self.target_conn]

    def observed(self, what: str) -> list[dict[str, Any]]:
        """The fabric's trace, for a check that judges ``what`` the initiator did one-sidedly; inconclusive where
        the harness's target cannot see it (a verbs device executes RDMA Reads, Writes and atomics on the
        target's memory, and sends its Terminates and NAKs, without telling the process)."""
        if not getattr(self.fabric, "observes_remote_ops", True):
            inconclusive(f"the check judges {what}, and the harness's target is on {self.fabric!r}: the device "
                         "executes the initiator's one-sided operations without the harness seeing them (run the "
                         "initiator against the harness's userspace binding to judge them)")
        return list(self.fabric.trace)

    def remote_ops(self) -> list[RemoteOp]:
        """The initiator's one-sided operations in the order they reached the target."""
        out: list[RemoteOp] = []
        nth: dict[str, int] = {}
        for rec in self.observed("the initiator's one-sided operations"):
            for eff in rec["effects"]:
                if eff.get("who") != self.target_conn:
                    continue
                do = str(eff.get("do", ""))
                if not do.endswith("-arrive") or do == "send-arrive":
                    continue
                kind = "write" if do == "write-arrive" else do.removesuffix("-arrive")
                n = nth[kind] = nth.get(kind, -1) + 1
                out.append(RemoteOp(rec["step"], kind, eff["stag"], eff["to"],
                                    eff.get("len", 0) if kind == "write" else 0, eff.get("wr", ""), n))
        return out

    def terminations(self) -> list[str]:
        """Reasons of Terminates on the initiator's connection (an access it had no right to, ...)."""
        out = []
        for rec in self.observed("whether the initiator's connection was terminated"):
            for eff in rec["effects"]:
                if eff.get("do") == "terminate":
                    out.append(str(eff.get("reason", "")))
        return out

    def probe_credits(self) -> CreditProbe | None:
        """The Completion Credits probe's outcome (targets/kbtp_credits.py), waited for (bounded); None where the
        bed did not probe (an initiator in this process, whose posted receives are counted; a verbs device, whose
        transport answers a Send without telling the process)."""
        probe = self.target.credit_probe
        if probe is None:
            return None
        self.fabric.await_event(lambda: probe.judge(self.fabric.trace, self.target_conn), PROBE_WAIT_S)
        return probe

    def _order_observable(self) -> None:
        if not getattr(self.fabric, "owns_races", True):
            inconclusive("the check orders the initiator's posts against the target's read samples, which only the "
                         "emulated fabric records; over a wire binding the responder does not know which work "
                         "request a packet came from")

    def witness_order(self) -> OrderWitness | None:
        """Over a userspace wire, hold the target's answers on the initiator's connection and record when its
        requests enter (targets/kbtp_order.py), so a check can order its one-sided operations from outside; None
        where the fabric orders by its own steps (emulated) or the harness does not own the send path (verbs)."""
        if self.order_witness is None:
            self.order_witness = install(self.fabric, self.target_conn)
        return self.order_witness

    def answered_before(self, prev: RemoteOp, nxt: RemoteOp) -> bool | None:
        """Over a userspace wire, with the order witness installed: whether the target's answer to read ``prev``
        left the harness before read ``nxt`` entered the wire (None: not observable)."""
        witness = self.order_witness
        if witness is None:
            return None
        told = witness.answered_before(prev.step, nxt.step)
        if told is not None or self.initiator_conn is None:
            return told
        # An initiator in this process: its request entered the wire when it posted it, and the k-th RDMA Read it
        # posted on its connection is the k-th the target executed (RC executes them in PSN order)
        posts = [rec["step"] for rec in self.fabric.trace for eff in rec["effects"]
                 if eff.get("do") == "post" and eff.get("who") == self.initiator_conn.name
                 and eff.get("op") == "RDMA_READ"]
        if nxt.kind != "rdma_read" or nxt.nth >= len(posts):
            return None
        posted = int(posts[nxt.nth])
        left = witness.released.get(prev.step)
        return left is not None and left.steps < posted  # it left between step left.steps and the next

    def steps_of(self, wr: str, do: str) -> list[int]:
        """Steps of trace effects ``do`` for work request tag ``wr`` (e.g. read samples of one read)."""
        self._order_observable()
        return [rec["step"] for rec in self.fabric.trace for eff in rec["effects"]
                if eff.get("do") == do and eff.get("wr") == wr]

    def post_step(self, wr: str) -> int | None:
        """The step at which the initiator posted work request ``wr`` (inconclusive for an initiator in another
        process: its posts are its own)."""
        self._order_observable()
        for rec in self.fabric.trace:
            for eff in rec["effects"]:
                if eff.get("do") == "post" and eff.get("wr") == wr and eff.get("who") == self.initiator_conn.name:
                    return int(rec["step"])
        return None
