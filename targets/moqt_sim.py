"""The relay suites on the deterministic transport: ``--target sim:reference`` / ``sim:python:<module>:<attr>``.

A ``sim:`` target is an owned relay (the reference ``Relay``, or a subclass: a mutant, a vendor's in-process
variant) that the harness runs with itself in one process, on one virtual-clock event loop and an in-memory network
(`kvconform.moqt.simsession.SimSession`) that live for the whole pytest session: the relay is started on it, and
every scenario of the ``moqt-relay`` and ``kvcs-relay`` suites runs on it too (``kvconform.fixtures.moqt.run``
asks `active` for it), so the suites' bounds cost virtual time, not wall time, and the run is a function of its
seed. The network moves each datagram as a seeded random scheduler picks it among those due at the same instant
(`kvconform.rdma.scheduler.RandomScheduler`, seeded from ``--seed``) with the fault plan ``Faults(seed)``: a
loopback-like one-way delay, no loss; every loop turn costs a few microseconds of virtual time (``TURN_COST_S``).
The relay reads the loop's clock for its cache and the loop's virtual wall clock for token expiry (``clock=``,
``wall_clock=``), never the machine's.

Everything the endpoints say and see (every MOQT session command and event: ``kvconform.moqt.quic.tapping``) goes
into one transcript for the whole run; at the end `write_transcript` puts it in ``transcript.txt`` beside
coverage.json and its SHA-256 in coverage.json's ``meta.transcript`` (through the report hook of
kvconform.fixtures.moqt), and each check's evidence notes the digest of the part its scenarios wrote (`run`). Two
runs with one seed give the same verdicts and the same transcript, byte for byte, in any process
(tests/moqt/test_sim_suite.py).

One run is one process: the session's scenarios run one after the other on one loop (``-n`` is refused). Real
sockets stay the transport of every other target.
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from pathlib import Path
from typing import Any, TypeVar

from kvconform import evidence
from kvconform.loading import import_python_target
from kvconform.moqt.policy import PolicyError, policy_from_mapping
from kvconform.moqt.relay import Relay
from kvconform.moqt.simnet import Faults
from kvconform.moqt.simsession import SimSession
from kvconform.rdma.scheduler import RandomScheduler
from kvconform.targets.spec import TargetSpec
from kvconform.verdicts import TargetUnavailable

__all__ = ["SCHEDULER", "TRANSCRIPT_FILE", "SimRelay", "active", "run", "sim_relay", "write_transcript"]

T = TypeVar("T")

TRANSCRIPT_FILE = "transcript.txt"
SCHEDULER = "random"  # what the report records of the network's scheduler (seeded from the run's seed)
START_TIMEOUT = 10.0  # virtual seconds to start or stop the relay
# Virtual seconds one run of the session may pass (a scenario's own bounds are far shorter; a backstop).
HORIZON_S = 3600.0
# The network as loopback looks to the harness: 100 us one way, and 10 us of virtual time per event-loop turn (a
# Python turn's order of magnitude), so a check that publishes "one object per scheduling turn until the answer
# comes" publishes a few dozen, as on sockets, instead of spinning at one instant forever.
LINK_DELAY_S = 100e-6
TURN_COST_S = 10e-6

_shared: SimSession | None = None  # the process's session while a sim: relay runs on it
_users = 0  # the sim: relays on it (moqt-relay and kvcs-relay in one run share it)
_finished: SimSession | None = None  # the last session closed: its transcript is the run's


def active() -> SimSession | None:
    """The session a ``sim:`` relay runs on, while one does; None under every other target."""
    return _shared


def run(coro: Coroutine[Any, Any, T]) -> T:
    """Run ``coro`` on the active session (`active`) and note, in the running check's evidence, the digest of the
    transcript lines it added (what the check's scenario said and saw)."""
    sim = _shared
    if sim is None:
        coro.close()
        raise RuntimeError("moqt_sim.run: no sim: relay is running")
    start, t0 = len(sim.transcript), sim.loop.time()
    try:
        return sim.run(coro)
    finally:
        end = len(sim.transcript)
        evidence.record("note", "sim transcript", {"lines": [start + 1, end], "sha256": sim.digest(start, end),
                                                   "virtual_s": round(sim.loop.time() - t0, 6)})


def _join(seed: int, faults: str | None) -> SimSession:
    global _shared, _users, _finished
    if _shared is None:
        plan = Faults(seed=seed, delay=LINK_DELAY_S)
        if faults:
            plan = Faults.from_spec(faults, seed, plan)
        _shared = SimSession(RandomScheduler(seed), plan, HORIZON_S, TURN_COST_S)
        _finished = None
    _users += 1
    return _shared


def _leave() -> None:
    global _shared, _users, _finished
    _users -= 1
    if _users == 0 and _shared is not None:
        _shared.close()
        _shared, _finished = None, _shared


class SimRelay:
    """RelayDriver: a ``Relay`` (sub)class started on the process's `SimSession`, named ``label`` on its network."""

    def __init__(self, relay_class: type[Relay], seed: int, label: str, faults: str | None = None) -> None:
        self.relay_class = relay_class
        self.seed = seed
        self.faults = faults
        self.label = label
        self.relay: Relay | None = None
        self.sim: SimSession | None = None

    def start(self, policy: dict[str, Any]) -> str:
        try:
            parsed = policy_from_mapping(policy, "harness policy from the PICS")
        except PolicyError as exc:
            raise TargetUnavailable(str(exc)) from exc
        try:
            sim = self.sim = _join(self.seed, self.faults)
        except ValueError as exc:
            raise TargetUnavailable(f"--sim-faults: {exc}") from exc
        loop = sim.loop

        async def start() -> Relay:
            sim.sim.name_next(self.label)
            relay = self.relay_class(policy=parsed, host="127.0.0.1", port=0, clock=loop.time,
                                     wall_clock=loop.wall_time)
            return await relay.start()

        try:
            self.relay = sim.run(_bounded(start()), keep=True)  # the relay's own tasks outlive it
        except (OSError, TimeoutError) as exc:
            self.stop()
            raise TargetUnavailable(f"{self.relay_class.__name__} did not start on the simulated network: "
                                    f"{exc!r}") from exc
        return str(self.relay.url)

    def stop(self) -> None:
        if self.sim is None:
            return
        try:
            if self.relay is not None:
                self.sim.run(_bounded(self.relay.close(START_TIMEOUT)))
        except TimeoutError:
            pass  # the session is closed below either way, cancelling what is left
        finally:
            self.sim = self.relay = None
            _leave()


async def _bounded(coro: Coroutine[Any, Any, T]) -> T:
    return await asyncio.wait_for(coro, START_TIMEOUT)


def sim_relay(suite: str, target: TargetSpec, seed: int, sim_faults: str | None = None) -> SimRelay:
    """The driver of ``suite`` for a ``sim:`` target: ``target.value`` is ``reference`` or
    ``python:<module>:<attr>`` naming a ``Relay`` subclass (nothing else runs on the simulated network);
    ``sim_faults`` (``--sim-faults``) adds loss, duplication, jitter or stream interleaving to the seeded plan."""
    if target.value == "reference":
        return SimRelay(Relay, seed, suite, sim_faults)
    obj = import_python_target(target.value.removeprefix("python:"))
    if not (isinstance(obj, type) and issubclass(obj, Relay)):
        raise TargetUnavailable(f"target {target.name}: {target.value} is not a subclass of "
                                "kvconform.moqt.relay.Relay; only an in-process relay runs on the simulated network "
                                "(run other relays by their moqt:// URL)")
    return SimRelay(obj, seed, suite, sim_faults)


def write_transcript(report_dir: Path) -> dict[str, Any] | None:
    """Write the run's transcript to ``report_dir/transcript.txt``; what coverage.json records of it (file, SHA-256,
    lines, the network's scheduler, fault plan and statistics, virtual seconds). None when no sim: relay ran."""
    global _finished
    sim = _shared if _shared is not None else _finished
    if sim is None:
        return None
    _finished = None  # written once: a later run in this process (the harness's tests) starts its own
    text = sim.transcript_text()
    (report_dir / TRANSCRIPT_FILE).write_text(text, "utf-8")
    faults = sim.net.faults.describe()
    return {"file": TRANSCRIPT_FILE, "sha256": sim.digest(), "lines": len(sim.transcript),
            "scheduler": f"{SCHEDULER} (seed {faults['seed']})", "faults": faults,
            "virtual_seconds": round(sim.loop.time(), 6), "network": sim.stats()}
