"""A test bed for one KBTP check: an emulated fabric (seeded scheduler), the target under test on node
``target`` and any number of harness initiators, plus the run/replay bookkeeping race checks need.

A failure inside a run names the fabric seed, the scheduler and the schedule (the step labels that
replay it, kept in full in the evidence and, with ``--report-dir``, as a JSONL trace file), so
``kvconform run kbtp-target --seed S`` reproduces it exactly.
"""

from __future__ import annotations

import json
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NoReturn

from kvconform import evidence
from kvconform.kbtp.constants import Features, Status
from kvconform.kbtp.messages import HelloAck
from kvconform.rdma import ActorFailed, Node, sleep
from kvconform.rdma.emulated import EmuFabric
from kvconform.rdma.scheduler import ScriptScheduler
from kvconform.rdma.wire.fabric import WireFabric
from kvconform.rdma.wire.impair import Impairment
from kvconform.targets.kbtp import NO_FEATURES, DriverError, KbtpTarget, TargetEndpoint, TargetParams, TargetUnavailable
from kvconform.targets.kbtp_client import Gen, HarnessInitiator
from kvconform.targets.kbtp_wire import check_binding
from kvconform.verdicts import HarnessBug, Violation, inconclusive, not_applicable, violation

MAX_STEPS = 400_000  # every run is bounded: a target that never answers ends the run, not the suite
TAIL = 40  # schedule labels quoted in a failure message (the full schedule is in the evidence)


def with_hint(exc: Violation, hint: str) -> Violation:
    """The same violation, its message extended by what replays the run."""
    exc.args = (f"{exc}\n[{hint}]",)
    return exc


def make_fabric(params: TargetParams, seed: int, scheduler: Any = None, trace: bool = False,
                wire: str = "emulated") -> Any:
    """An emulated fabric on the declared binding's profile; ``seed`` picks a RandomScheduler unless a
    scheduler (PCT, a schedule script) is given. ``wire`` iwarp / roce: a `WireFabric` over loopback sockets
    instead (in-process targets over the real wire format; no scheduler to own)."""
    if wire != "emulated":

        check_binding(f"--kbtp-wire {wire}", wire, params.binding, params.profile, "PICS binding")
        return WireFabric(params.profile, binding=wire, trace=trace)  # type: ignore[arg-type]

    return EmuFabric(params.profile, seed=seed, scheduler=scheduler, trace=trace)


def require_owned_races(fabric: Any, scheduler: Any) -> None:
    """A schedule script replays the text's interleaving step by step at the target's race points: only a
    fabric the harness schedules (the emulated one, with the target in-process) can do that. Elsewhere the
    check is inconclusive; the seeded repetitions of the race checks still run there as black-box attempts."""

    if isinstance(scheduler, ScriptScheduler) and not getattr(fabric, "owns_races", True):
        inconclusive("this check replays a named interleaving step by step at the target's race points, which "
                     "needs the harness to schedule the target (the emulated fabric, an in-process target); over "
                     "the wire the target is a black box, and the race checks' repeated attempts stand for it")


@dataclass
class Bed:
    """The target under test on an emulated fabric, with harness initiators attached on demand."""

    driver: KbtpTarget
    params: TargetParams
    seed: int
    scheduler: Any = None
    trace_dir: Path | None = None
    label: str = "run"
    trace: bool = False
    wire: str = "emulated"  # in-process targets: emulated, or iwarp / roce over loopback sockets
    impair: Impairment | None = None  # the impairment stage on the harness's links (--kvconform-impair)
    fabric: Any = field(init=False)
    target_node: Node = field(init=False)
    endpoint: TargetEndpoint = field(init=False)
    initiators: list[HarnessInitiator] = field(default_factory=list)
    _runs: int = 0

    def __post_init__(self) -> None:
        own = getattr(self.driver, "make_fabric", None)  # a target in another process: its driver's wire
        self.fabric = own(self.params, trace=self.trace) if own else make_fabric(
            self.params, self.seed, self.scheduler, self.trace, self.wire)
        require_owned_races(self.fabric, self.scheduler)
        if self.impair is not None and self.impair.active:
            self.impair_links(self.impair)
        self.target_node = self.fabric.node("target")
        try:
            self.endpoint = self.driver.start(self.fabric, self.target_node, self.params)
        except TargetUnavailable as exc:  # a setup problem, never a verdict on the target
            inconclusive(f"the target could not be started for this check: {exc}")
        except DriverError:
            raise
        except Exception as exc:  # a target that cannot start on the declared PICS is a finding
            raise DriverError(f"the target did not start with {self.params}: {exc!r}") from exc

    def impair_links(self, spec: Impairment) -> None:
        """Put the impairment stage ``spec`` on every link of this bed's fabric (the harness's own wire); a check
        that needs a wire the harness builds the packets of is inconclusive without one."""
        impair = getattr(self.fabric, "impair", None)
        if impair is None or not getattr(self.fabric, "crafts_frames", True):
            inconclusive(f"the impairment {spec.spec()} acts on the harness's own wire links (kbtp+iwarp://, "
                         f"kbtp+roce:// or --kbtp-wire); {self.fabric!r} has none the harness can impair")
        impair(spec, salt=self.label)

    def initiator(self, name: str | None = None, initiator_id: bytes | None = None) -> HarnessInitiator:
        """A new harness initiator node with its connection attached to the target."""
        name = name or f"I{len(self.initiators)}"
        node = self.fabric.node(name)
        try:
            dial = getattr(self.endpoint, "dial", None)  # a remote target: the harness connects to it
            if dial is not None:
                i_conn = dial(node, f"{name}-conn")
            else:
                t_conn, i_conn = self.fabric.connect(self.target_node, node, name=f"{name}-conn")
                self.endpoint.attach(t_conn)
        except OSError as exc:  # WireSetupError and socket errors: the connection never carried KBTP
            raise TargetUnavailable(f"{name}: no connection to the target: {exc}") from exc
        ini = HarnessInitiator(self.fabric, node, i_conn, name)
        if initiator_id is not None:
            ini.initiator_id = initiator_id
        self.initiators.append(ini)
        return ini

    def reconnect(self, old: HarnessInitiator, requested: int = 0, attempts: int = 20) -> Gen:
        """A new connection with ``old``'s Initiator ID once the target has let go of the old session
        (it may still count it active for a moment after the connection failed). Returns the new client;
        inconclusive when the target keeps refusing (the check cannot go on without the session)."""

        status = None
        for n in range(attempts):
            again = self.initiator(f"{old.name}.{n + 1}", initiator_id=old.initiator_id)
            ack = yield from again.hello(Features(requested), allow_end=True)
            if isinstance(ack, HelloAck) and ack.status == Status.OK:
                return again
            status = ack.status if isinstance(ack, HelloAck) else ack
            yield from sleep(0.001)
        inconclusive(f"{old.name}: reconnecting with the same Initiator ID was refused {attempts} times (last: "
                     f"{status}) after the old connection ended; the check needs the session to go on")

    def room(self, features: Features = NO_FEATURES) -> Features:
        """What a new session of this check asks for: ``features``, and DIRECT_ALLOC too once the sessions it opened
        fill the shared ring (a target keeps the quotas served there within its blocks), so that a partition of
        the rest of the pool serves it, as TargetUnderTest.sessions plans it."""
        shared, partitions = self.params.capacity()
        da = Features.DIRECT_ALLOC
        on_shared = sum(1 for i in self.initiators if i.session is not None and not i.session.ack.features & da)
        return Features(features | da) if on_shared >= shared and partitions else features

    def open(self, ini: HarnessInitiator, requested: Features = NO_FEATURES) -> Gen:
        """HELLO for a session the check needs: the HelloAck. A refusal is inconclusive, not a failure: the
        text lets a target refuse a session (the sum of quotas, its capacity), and this check cannot run
        without it (test_hello_ack judges a target that refuses a lone fresh initiator). Where the declared shared
        ring cannot hold a session's quota at all, a session without DIRECT_ALLOC does not exist at that geometry:
        such a check does not apply (a partition would serve only one that asks for DIRECT_ALLOC: ``room``)."""
        if not requested & Features.DIRECT_ALLOC and self.params.capacity()[0] == 0:
            not_applicable(f"{ini.name}: the check needs a session without DIRECT_ALLOC, and the declared shared ring "
                           f"has no room for one ({self.params.describe_capacity()})")
        ack = yield from ini.hello(requested)
        if ack.status != Status.OK:
            inconclusive(f"{ini.name}: HELLO (requesting {Features(requested)!r}) was refused with Status "
                         f"{ack.status} though the declared geometry has room for the check's sessions "
                         f"({self.params.describe_capacity()}); the check needs it")
        return ack

    # ---- running ---------------------------------------------------------------------------------

    def run(self, **actors: Gen) -> dict[str, Any]:
        """Spawn the named actors, run the fabric to quiescence (bounded), return their results.

        A violation inside an actor is re-raised with the seed and the schedule that replay it. The target
        crashing, or running on without settling, while a harness initiator waits is a violation of what
        that initiator waited for; any other failure of a harness actor is a bug of the harness.
        """
        handles = {name: self.fabric.spawn(name, gen) for name, gen in actors.items()}
        try:
            result = self.fabric.run(max_steps=MAX_STEPS)
        except ActorFailed as exc:
            cause = exc.cause
            if isinstance(cause, Violation):
                raise with_hint(cause, self.replay_hint(exc.actor)) from None
            if exc.actor in handles:
                raise cause from None  # a harness actor's own error: the policy makes it a harness error
            self.blame_waiting(f"the implementation's actor {exc.actor!r} raised {cause!r}", exc.actor)
        if result.reason == "max_steps":
            self.blame_waiting(f"the run did not settle within {MAX_STEPS} steps (still running: "
                               f"{list(result.blocked)})")
        if result.reason == "deadline":
            busy: list[str] = getattr(self.fabric, "busy", list)()
            self.blame_waiting(f"the run did not end within the wire fabric's {self.fabric.run_timeout} s (still "
                               f"running: {list(result.blocked)}; not quiet: {busy or 'nothing'})")
        stuck = [n for n in handles if not handles[n].done]
        if stuck:
            raise HarnessBug(f"harness actors blocked without a bound: {[handles[n].waiting for n in stuck]} "
                             f"[{self.replay_hint()}]")
        return {name: h.result for name, h in handles.items()}

    def blame_waiting(self, what: str, actor: str | None = None) -> NoReturn:
        """The target failed (crashed, spun) while harness initiators waited: a violation of what the first
        of them waited for; a DriverError (the check's first requirement) when none was waiting."""
        hint = self.replay_hint(actor)
        for ini in self.initiators:
            if ini.waiting is not None:
                req, awaited = ini.waiting
                violation(f"{what} while {ini.name} waited for the {awaited}", req=req, detail=hint)
        raise DriverError(f"{what} [{hint}]")

    def close(self) -> None:
        """End the bed: a remote target gets its sessions released (GOODBYE with RELEASE from every Initiator ID
        the check used, so the next check finds the pool as the PICS declare it), then every socket closes."""
        release = getattr(self.endpoint, "release_sessions", None)
        if release is not None:
            release(self)
        impairer = getattr(self.fabric, "impairer", None)
        if impairer is not None:  # what the impairment stage did: with its seed, the run replays
            evidence.record("note", "wire-impairment", {"label": self.label, **impairer.summary()})
        close = getattr(self.fabric, "close", None)
        if close is not None:
            close()

    def run_one(self, gen: Gen) -> Any:
        self._runs += 1
        name = f"main{self._runs}"
        return self.run(**{name: gen})[name]

    def schedule(self) -> list[str]:
        sched: Callable[[], list[str]] | list[str] | None = getattr(self.fabric, "schedule", None)
        if callable(sched):
            return list(sched())
        return list(sched or [])

    def replay_hint(self, actor: str | None = None) -> str:
        """Seed, scheduler, schedule tail and trace path: everything a replay needs."""
        labels = self.schedule()
        path = self.write_trace()
        where = f"actor {actor}, " if actor else ""
        describe = getattr(self.scheduler, "describe", None)
        policy = describe() if callable(describe) else {"policy": "fabric default"}
        evidence.record("note", "kbtp-schedule", {"label": self.label, "seed": self.seed, "scheduler": policy,
                                                  "schedule": labels, "trace": str(path) if path else None})
        tail = labels[-TAIL:]
        impairer = getattr(self.fabric, "impairer", None)
        impaired = "" if impairer is None else f", wire impairment {impairer.spec.spec()} ({impairer.counts_text()})"
        return (f"{where}{self.label}: fabric seed {self.seed}, scheduler {json.dumps(policy, default=str)}, "
                f"{len(labels)} steps, last {len(tail)}: {tail}; trace {path}{impaired}")

    def write_trace(self) -> Path | None:
        """The schedule (a ScriptScheduler script that replays the run) as JSON, and the step trace as JSONL
        when the fabric kept one; returns the schedule file."""
        folder = self.trace_dir or Path(tempfile.gettempdir()) / "kvconform-kbtp-traces"
        folder.mkdir(parents=True, exist_ok=True)
        path = folder / f"{self.label}-seed{self.seed}.schedule.json"
        path.write_text(json.dumps({"seed": self.seed, "label": self.label, "schedule": self.schedule()}))
        if self.trace:
            try:
                self.fabric.write_trace(str(folder / f"{self.label}-seed{self.seed}.jsonl"))
            except Exception as exc:  # the trace is a convenience; the schedule replays the run
                evidence.note(f"trace not written: {exc!r}")
        return path
