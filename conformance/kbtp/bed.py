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
from typing import Any

from kvconform.conformance.kbtp.client import Gen, HarnessError, HarnessInitiator
from kvconform.fixtures import evidence
from kvconform.kbtp.constants import Features
from kvconform.rdma import ActorFailed, Node
from kvconform.targets.kbtp import DriverError, KbtpTarget, TargetEndpoint, TargetParams, TargetUnavailable
from kvconform.verdicts import inconclusive

MAX_STEPS = 400_000  # every run is bounded: a target that never answers ends the run, not the suite
TAIL = 40  # schedule labels quoted in a failure message (the full schedule is in the evidence)


class RaceFailure(AssertionError):
    """An invariant broke under one interleaving; the message carries what replays it."""


def make_fabric(params: TargetParams, seed: int, scheduler: Any = None, trace: bool = False) -> Any:
    """An emulated fabric on the declared binding's profile; ``seed`` picks a RandomScheduler unless a
    scheduler (PCT, a schedule script) is given."""
    from kvconform.rdma.emulated import EmuFabric

    return EmuFabric(params.profile, seed=seed, scheduler=scheduler, trace=trace)


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
    fabric: Any = field(init=False)
    target_node: Node = field(init=False)
    endpoint: TargetEndpoint = field(init=False)
    initiators: list[HarnessInitiator] = field(default_factory=list)
    _runs: int = 0

    def __post_init__(self) -> None:
        self.fabric = make_fabric(self.params, self.seed, self.scheduler, self.trace)
        self.target_node = self.fabric.node("target")
        try:
            self.endpoint = self.driver.start(self.fabric, self.target_node, self.params)
        except TargetUnavailable as exc:  # a setup problem, never a verdict on the target
            inconclusive(f"the target could not be started for this check: {exc}")
        except DriverError:
            raise
        except Exception as exc:  # a target that cannot start on the declared PICS is a finding
            raise DriverError(f"the target did not start with {self.params}: {exc!r}") from exc

    def initiator(self, name: str | None = None, initiator_id: bytes | None = None) -> HarnessInitiator:
        """A new harness initiator node with its connection attached to the target."""
        name = name or f"I{len(self.initiators)}"
        node = self.fabric.node(name)
        t_conn, i_conn = self.fabric.connect(self.target_node, node, name=f"{name}-conn")
        self.endpoint.attach(t_conn)
        ini = HarnessInitiator(self.fabric, node, i_conn, name)
        if initiator_id is not None:
            ini.initiator_id = initiator_id
        self.initiators.append(ini)
        return ini

    def reconnect(self, old: HarnessInitiator, requested: int = 0, attempts: int = 20) -> Gen:
        """A new connection with ``old``'s Initiator ID once the target has let go of the old session
        (it may still count it active for a moment after the connection failed). Returns the new client."""
        from kvconform.rdma import sleep

        ack = None
        for n in range(attempts):
            again = self.initiator(f"{old.name}.{n + 1}", initiator_id=old.initiator_id)
            ack = yield from again.hello(Features(requested))
            if ack.status == 0:
                return again
            yield from sleep(0.001)
        raise HarnessError(f"{old.name}: reconnecting with the same Initiator ID was refused {attempts} times "
                           f"(last HELLO_ACK Status {ack.status if ack else None}) after the old connection ended "
                           "(KBTP-RETENTION)")

    # ---- running ---------------------------------------------------------------------------------

    def run(self, **actors: Gen) -> dict[str, Any]:
        """Spawn the named actors, run the fabric to quiescence (bounded), return their results.

        A HarnessError inside an actor (a requirement broken) is re-raised as an AssertionError naming the
        seed and the schedule; any other actor failure is a DriverError (the target or harness crashed).
        """
        handles = {name: self.fabric.spawn(name, gen) for name, gen in actors.items()}
        try:
            result = self.fabric.run(max_steps=MAX_STEPS)
        except ActorFailed as exc:
            if exc.actor in handles and isinstance(exc.cause, AssertionError):
                raise RaceFailure(f"{exc.cause} [{self.replay_hint(exc.actor)}]") from exc.cause
            # An actor of the implementation raised: it crashed while driven, which is a finding too.
            raise DriverError(f"the implementation's actor {exc.actor!r} raised {exc.cause!r} "
                              f"[{self.replay_hint(exc.actor)}]") from exc
        if result.reason == "max_steps":
            raise RaceFailure(f"the run did not settle within {MAX_STEPS} steps; still blocked: "
                              f"{list(result.blocked)} (KBTP-QUOTA-ALLOC-BOUNDED) [{self.replay_hint()}]")
        stuck = [n for n in handles if not handles[n].done]
        if stuck:
            raise RaceFailure(f"harness actors never finished (deadlock): "
                              f"{ {n: handles[n].waiting for n in stuck} } [{self.replay_hint()}]")
        return {name: h.result for name, h in handles.items()}

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
        return (f"{where}{self.label}: fabric seed {self.seed}, scheduler {json.dumps(policy, default=str)}, "
                f"{len(labels)} steps, last {len(tail)}: {tail}; trace {path}")

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
