"""Drivers of the ``kvcs-consumer`` role: a KVCS consumer the harness (playing publisher and relay) points
at its own relays with a cache spec, and whose result JSON it reads.

- ``reference``: kvconform's consumer (``kvconform.kvcs.consumer.Consumer``), in-process on the calling
  thread with its own event loop;
- ``python:<module>:<attr>``: an object implementing ``ConsumerDriver``, or a ``Consumer`` subclass (the mutant
  consumers) run the same way;
- ``cmd:<template>``: a spawned consumer, e.g. ``cmd:kvconform kvcs fetch --relay {relay} --relay {relay2}
  --cache {cache} --out {out} --token {token} --budget {budget} --producer-key {producer_key}``.
  Placeholders: ``{relay}`` (moqt://127.0.0.1:PORT), ``{cache}`` (cache spec JSON), ``{out}`` (where it
  writes the result JSON); optional ``{relay2}`` (a fallback relay; the first one again when there is
  none), ``{token}`` (the scope's subscriber token), ``{budget}`` (seconds), ``{producer_key}`` (``kid=PATH``
  of a producer's public PEM; empty when the scenario has none), ``{layers}`` (``a-b``, inclusive; every
  layer unless a check asks for a range) and ``{blocks}`` (the first n blocks; all unless asked). Each fetch is
  one process run by ``kvconform.targets.process`` (its own session, output to files as bytes), bounded by
  the budget plus a grace period, then stopped with everything it started; its output is kept for the
  evidence.

The result JSON is the one ``kvconform.kvcs.consumer.ConsumeResult`` writes (its module docstring defines
the layer digest).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from kvconform.kvcs.consumer import (
    Consumer,
    ConsumeResult,
    ConsumerIdentity,
    ConsumerOptions,
    LayerReady,
    load_producer_keys,
)
from kvconform.kvcs.content import CacheSpec
from kvconform.kvcs.errors import KvcsError
from kvconform.targets.process import Launcher, as_launcher, run_handle
from kvconform.verdicts import TargetUnavailable

__all__ = ["GRACE", "SUITE", "CmdConsumer", "ConsumerDriver", "ConsumerRun", "FetchRequest", "InProcessConsumer",
           "adapt_consumer", "reference_consumer"]

SUITE = "kvcs-consumer"
GRACE = 8.0  # seconds past its budget before a consumer that did not give up is stopped (a finding)
OUTPUT_TAIL = 4000  # characters of a consumer's output kept for the evidence


@dataclass(frozen=True)
class FetchRequest:
    """One retrieval the harness asks for."""

    relays: tuple[str, ...]
    cache: Path
    budget: float
    token: str | None = None
    layers: tuple[int, int] | None = None
    blocks: int | None = None
    producer_keys: Mapping[str, Path] = field(default_factory=dict)  # kid -> public PEM file
    mode: str = "auto"  # reference/python consumers only: "auto", "live" or "fetch"
    distrust_relays: bool = False  # in-process consumers are started so (PICS kvcs.consumer.distrusts_relays)


@dataclass(frozen=True)
class ConsumerRun:
    """How one retrieval went: the parsed result (None when there is none), exit status, time, output."""

    result: Any  # kvconform.kvcs.consumer.ConsumeResult | None
    code: int | None
    elapsed: float
    stdout: str = ""
    stderr: str = ""
    error: str | None = None  # why there is no result (crash, no JSON, killed past its budget)
    killed: bool = False  # stopped by the driver past budget + GRACE


@runtime_checkable
class ConsumerDriver(Protocol):
    """kvcs-consumer: retrieve the cache a spec names through relays; return the result (bounded)."""

    def fetch(self, request: FetchRequest, out: Path) -> ConsumerRun: ...

    def supports(self, capability: str) -> bool:
        """"relay2", "token", "budget", "producer_key", "layers", "blocks": what this target can be given."""
        ...


def _read_result(out: Path) -> tuple[Any, str | None]:
    """The parsed result, or why there is none: no file, not JSON, or a field that is off (named)."""

    if not out.exists():
        return None, f"no result JSON at {out}"
    try:  # the consumer under test wrote it: any octets, read without crashing (KvcsError names the field)
        return ConsumeResult.from_json(out.read_bytes()), None
    except (OSError, KvcsError) as exc:
        return None, f"result JSON {out} cannot be read: {exc}"


class InProcessConsumer:
    """A ``Consumer`` (sub)class run on the calling thread with its own event loop, bounded."""

    def __init__(self, consumer_class: type[Any]) -> None:
        self.consumer_class = consumer_class

    def supports(self, capability: str) -> bool:
        return True

    def fetch(self, request: FetchRequest, out: Path) -> ConsumerRun:
        lines: list[str] = []

        def progress(ready: LayerReady) -> None:
            lines.append(f"layer {ready.layer} ready: publication {ready.publication.hex()} via {ready.relay}")

        try:
            spec = CacheSpec.load(request.cache)
            keys = load_producer_keys(f"{kid}={path}" for kid, path in request.producer_keys.items())
            options = ConsumerOptions(relays=request.relays, layers=request.layers, blocks=request.blocks,
                                      budget=request.budget, stall_timeout=min(5.0, request.budget / 3),
                                      token=request.token.encode() if request.token else None, producer_keys=keys,
                                      mode=request.mode, distrust_relays=request.distrust_relays)
            consumer = self.consumer_class(ConsumerIdentity.from_spec(spec), options, on_ready=progress)
        except (ValueError, TypeError, OSError) as exc:
            raise TargetUnavailable(f"{self.consumer_class.__name__} cannot be set up: {exc}") from exc

        async def bounded() -> Any:
            return await asyncio.wait_for(consumer.run(), request.budget + GRACE)

        started = time.monotonic()
        try:
            result = asyncio.run(bounded())
        except TimeoutError:
            return ConsumerRun(None, None, time.monotonic() - started, "", "\n".join(lines)[-OUTPUT_TAIL:],
                               f"no result within budget {request.budget} s + {GRACE} s: stopped", killed=True)
        except Exception as exc:  # a crashing consumer is a finding, not a harness error
            return ConsumerRun(None, 1, time.monotonic() - started, "", "\n".join(lines)[-OUTPUT_TAIL:],
                               f"{type(exc).__name__}: {exc}")
        elapsed = time.monotonic() - started
        out.write_text(result.to_json(), "utf-8")
        parsed, error = _read_result(out)
        return ConsumerRun(parsed, 0, elapsed, "", "\n".join(lines)[-OUTPUT_TAIL:], error)


class CmdConsumer:
    """A spawned consumer: one process per fetch (``kvconform.targets.process``: its own session, output to files,
    the whole group stopped past its bound and at the end), or by any ``Launcher`` of the same contract (a docker
    image, which says in its labels which optional placeholders it takes)."""

    def __init__(self, template: str | Launcher) -> None:
        self.launcher = as_launcher(template)

    def supports(self, capability: str) -> bool:
        return self.launcher.takes(capability)

    @staticmethod
    def _range_values(request: FetchRequest) -> dict[str, str]:
        """{layers} (a-b) and {blocks} (n): what is asked, else every layer / every block of the cache."""

        try:
            spec = CacheSpec.load(request.cache)
        except KvcsError as exc:
            raise TargetUnavailable(f"cache spec {request.cache}: {exc}") from exc
        first, last = request.layers if request.layers is not None else (0, spec.layers - 1)
        blocks = request.blocks if request.blocks is not None else sum(s.blocks for s in spec.segment_layout())
        return {"layers": f"{first}-{last}", "blocks": str(blocks)}

    def fetch(self, request: FetchRequest, out: Path) -> ConsumerRun:
        # With one relay, {relay2} repeats it: retrying the same relay is harmless, an empty URL is not.
        values = {"relay": request.relays[0], "relay2": request.relays[min(1, len(request.relays) - 1)],
                  "cache": str(request.cache), "out": str(out), "token": request.token or "",
                  "budget": f"{request.budget:g}",
                  "producer_key": ",".join(f"{kid}={path}" for kid, path in request.producer_keys.items())}
        if self.launcher.takes("layers") or self.launcher.takes("blocks"):
            values.update(self._range_values(request))
        bound = request.budget + GRACE
        proc = run_handle(self.launcher.launch(values, "consumer"), bound)
        stdout, stderr = proc.stdout_text[-OUTPUT_TAIL:], proc.stderr_text[-OUTPUT_TAIL:]
        if proc.timed_out:
            return ConsumerRun(None, None, proc.elapsed, stdout, stderr,
                               f"still running {bound:g} s after start (budget {request.budget:g} s): killed",
                               killed=True)
        parsed, error = _read_result(out)
        return ConsumerRun(parsed, proc.returncode, proc.elapsed, stdout, stderr, error)


def reference_consumer() -> InProcessConsumer:
    """The reference consumer, in-process."""

    return InProcessConsumer(Consumer)


def adapt_consumer(obj: object) -> InProcessConsumer | None:
    """A ``python:`` target that is a ``Consumer`` subclass (a mutant) runs like the reference."""

    return InProcessConsumer(obj) if isinstance(obj, type) and issubclass(obj, Consumer) else None
