"""One KVCS cache transfer on loopback: the reference publisher (a child process) -> a relay -> the reference
consumer (this process), timed per layer and checked against the test-content convention.

Used by ``bench/bench_kvcs.py`` (the numbers) and ``tests/interop/test_kvcs_aiomoqt.py`` (the cache
crosses aiomoqt's relay intact). ``transfer(spec, spec_path, relay, variant, budget)`` -> ``Transfer``:

- ``live``: the consumer connects and sends SUBSCRIBE_NAMESPACE first, then the publisher process starts:
  it announces, publishes its first manifest version and holds its data until the relay has subscribed
  to every data track (for the consumer's Next Object + fill from {0,0} SUBSCRIBEs, mode "live"), then
  publishes every layer at full speed (``layer_interval`` adds a pause per layer). Times run from the
  publisher's first data object.
- ``completed``: the publisher has published everything (nothing reached the relay yet: a relay subscribes
  upstream only for a subscriber), then the consumer starts (mode "auto": FETCH of the layer range, since
  the manifest marks the segment complete). Times run from the consumer's start.

Intact = every layer ready (the consumer's ``on_ready``) with the digest of the test-content convention
(``convention_layer_digest``) and the consumer did not give up. The publisher's payloads are computed
before it connects, so content generation is not timed. The child is ``python -m
tests.interop.kvcs_transfer --serve-publisher URL --spec FILE`` from the repository root.
"""

from __future__ import annotations

import argparse
import asyncio
import queue
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kvconform.kvcs.consumer import Consumer, ConsumeResult, ConsumerIdentity, ConsumerOptions, LayerReady
from kvconform.kvcs.consumer import convention_layer_digest as layer_digest_of
from kvconform.kvcs.content import CacheSpec, SegmentLayout, example_spec
from kvconform.kvcs.publisher import KvcsPublisher, Progress
from kvconform.kvcs.tracks import DataTrack

from .peers import RelayEndpoint

__all__ = ["VARIANTS", "Transfer", "TransferError", "cache_spec", "data_bytes", "transfer"]

REPO = Path(__file__).resolve().parents[2]
VARIANTS = ("live", "completed")
PUBLISHER_START_TIMEOUT_S = 60.0  # a child interpreter importing the package and connecting, on a busy box
STOP_TIMEOUT_S = 5.0
HOLD_S = 60.0  # live: longest the publisher holds its data for the consumer's subscriptions
HOLD_POLL_S = 0.005
CONNECT_S = 30.0  # the consumer's connection to the relay
STALL_S = 30.0  # the consumer abandons a publication after this long without any event


class TransferError(Exception):
    """A step of one transfer did not happen within its bound (the transfer is void)."""


@dataclass
class Transfer:
    """One cache transfer through one relay: how long it took and whether the cache arrived intact."""

    relay: str
    variant: str
    total_s: float | None = None  # live: publisher's first object -> last layer ready; completed: consumer start ->
    first_layer_s: float | None = None  # same origin -> first layer ready
    mb_per_s: float | None = None  # k+v data bytes / total_s / 10^6
    publisher_s: float | None = None  # publisher's first object -> everything handed to its session
    consumer_mode: str | None = None  # what the consumer chose: "live" or "fetch"
    held: bool | None = None  # live: the consumer's data subscriptions reached the publisher before layer 0
    intact: bool = False  # every layer ready with the convention's digest
    layers_ready: int = 0  # layers the consumer reported ready (verified), intact or not
    bad_layers: list[int] = field(default_factory=list)
    rejected: int = 0  # Objects the consumer discarded (verification failures, duplicates with other bytes)
    attempts: int = 0  # the consumer's attempts (publication x relay); more than 1 = it retried missing layers
    publication: str | None = None
    error: str | None = None


def cache_spec(geometry: dict[str, int]) -> CacheSpec:
    """A cache of ``geometry`` (layers, blocks, block_tokens, kv_heads, head_dim; test-content convention)."""
    return example_spec(layers=geometry["layers"], blocks=geometry["blocks"], block_tokens=geometry["block_tokens"],
                        kv_heads=geometry["kv_heads"], head_dim=geometry["head_dim"], model="kvconform-bench", seed=5)


def data_bytes(spec: CacheSpec) -> int:
    """Octets of k and v data in the whole cache (what MB/s counts)."""
    blocks = sum(s.blocks for s in spec.segment_layout())
    return 2 * spec.layers * blocks * spec.section_octets


# ---- the publisher: a child process --------------------------------------------------------------------


class _PrecomputedPublisher(KvcsPublisher):
    """The reference publisher with every payload computed before it connects (the bench times transport,
    not the SHAKE-128 test content). With ``hold_s`` it holds the data of segment 0, after its first
    manifest version, until every data track has a subscriber (at most ``hold_s`` seconds): the live
    variant, where the consumer is subscribed before the first layer is produced."""

    def __init__(self, spec: CacheSpec, *, hold_s: float = 0.0, **options: Any) -> None:
        super().__init__(spec, **options)
        self.hold_s = hold_s
        self.started: float | None = None  # monotonic time of the first data object
        self._payloads = {(t.name, layer, oid): spec.object_payload(t, layer, oid)
                          for s in self.layout for t in self.tracks(s.segment)
                          for layer in range(spec.layers) for oid in range(s.blocks)}

    def object_payload(self, track: DataTrack, layer: int, object_id: int) -> bytes:
        if self.started is None:
            self.started = time.monotonic()
        return self._payloads[(track.name, layer, object_id)]

    async def segment_added(self, seg: SegmentLayout) -> None:
        if self.hold_s and seg.segment == 0:
            await self.hold(self.tracks(seg.segment))

    async def hold(self, tracks: Sequence[DataTrack]) -> None:
        """Until every track in ``tracks`` has a subscriber (the relay's upstream SUBSCRIBE), bounded."""
        deadline = time.monotonic() + self.hold_s
        while time.monotonic() < deadline and not all(self.local[t.name].subscribers for t in tracks):
            await asyncio.sleep(HOLD_POLL_S)  # polled: the client raises no event on an incoming SUBSCRIBE
        waiting = [str(t) for t in tracks if not self.local[t.name].subscribers]
        if waiting:
            print(f"hold-expired {' '.join(waiting)}", flush=True)


def serve_publisher_child(url: str, spec_path: str, layer_interval: float, hold_s: float) -> int:
    """The child's main: prints ``start <monotonic>`` at its first data object, ``published <monotonic>
    <pub id>`` once everything is handed to its session, then serves until SIGTERM (or the session ends)."""
    pub = _PrecomputedPublisher(CacheSpec.load(spec_path), layer_interval=layer_interval, hold_s=hold_s)

    def progress(p: Progress) -> None:
        if p.kind == "layer" and p.layer == 0 and p.segment == 0:
            print(f"start {pub.started!r}", flush=True)
        elif p.kind == "done":
            print(f"published {time.monotonic()!r} {pub.namespace.pub_id.hex()}", flush=True)

    async def main() -> int:
        stop = asyncio.Event()
        asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
        await pub.run(url, None, stop, on_progress=progress)
        return 0

    return asyncio.run(main())


class PublisherProcess:
    """The publisher child: started by ``launch()``, its stdout lines read by a thread, stopped on exit."""

    def __init__(self, url: str, spec_path: Path, layer_interval: float, hold_s: float) -> None:
        self.argv = [sys.executable, "-m", "tests.interop.kvcs_transfer", "--serve-publisher", url, "--spec",
                     str(spec_path), "--layer-interval", repr(layer_interval), "--hold", repr(hold_s)]
        self.lines: queue.Queue[str | None] = queue.Queue()
        self.seen: list[str] = []
        self.proc: subprocess.Popen[str] | None = None

    def launch(self) -> None:
        self.proc = subprocess.Popen(self.argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                     bufsize=1, stdin=subprocess.DEVNULL, cwd=str(REPO))
        assert self.proc.stdout is not None
        threading.Thread(target=self._follow, args=(self.proc.stdout,), daemon=True).start()

    def _follow(self, stream: Iterator[str]) -> None:
        for line in stream:
            self.lines.put(line.rstrip("\n"))
        self.lines.put(None)

    def wait_for(self, word: str, timeout_s: float) -> list[str]:
        """The fields of the first line starting with ``word`` (TransferError past ``timeout_s`` or at exit)."""
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                line = self.lines.get(timeout=max(deadline - time.monotonic(), 0.001))
            except queue.Empty:
                raise TransferError(f"publisher: no {word!r} line within {timeout_s:g} s; output {self.seen[-10:]!r}") \
                    from None
            if line is None:
                code = self.proc.wait(STOP_TIMEOUT_S) if self.proc else None
                raise TransferError(f"publisher exited ({code}) before {word!r}; output {self.seen[-10:]!r}")
            self.seen.append(line)
            if line.split(" ", 1)[0] == word:
                return line.split()

    def stop(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=STOP_TIMEOUT_S)

    def __enter__(self) -> PublisherProcess:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


# ---- the consumer: this process --------------------------------------------------------------------------


class _TimedConsumer(Consumer):
    """The reference consumer, noting when it starts discovery (connected, about to SUBSCRIBE_NAMESPACE)."""

    def __init__(self, identity: ConsumerIdentity, options: ConsumerOptions) -> None:
        super().__init__(identity, options, on_ready=self._ready_at)
        self.discovering = asyncio.Event()
        self.ready_at: dict[int, float] = {}

    def _ready_at(self, ready: LayerReady) -> None:
        self.ready_at.setdefault(ready.layer, time.monotonic())

    def discovery_anchors(self) -> list[bytes]:
        self.discovering.set()
        return super().discovery_anchors()


def _judge(run: Transfer, spec: CacheSpec, result: ConsumeResult) -> None:
    """Intact = every layer ready with the test-content convention's digest of the segments it used."""
    run.consumer_mode = result.mode
    run.rejected = len(result.rejected)
    run.attempts = len(result.publications)
    run.publication = result.publication.hex() if result.publication is not None else None
    run.bad_layers = [layer for layer in range(spec.layers)
                      if result.layers.get(layer) is None
                      or result.layers[layer] != layer_digest_of(spec, layer, result.segments)]
    run.intact = not run.bad_layers and not result.gave_up and bool(result.segments)
    if not run.intact:
        reasons = sorted(set(result.reasons.values()))[:3]
        run.error = (f"{len(run.bad_layers)} of {spec.layers} layers missing or wrong (gave_up={result.gave_up}, "
                     f"mode={result.mode}): {reasons}; publications {result.publications[-2:]}")


def _times(run: Transfer, spec: CacheSpec, origin: float, ready_at: dict[int, float]) -> None:
    run.layers_ready = len(ready_at)
    if run.intact and ready_at:
        run.total_s = round(max(ready_at.values()) - origin, 3)
        run.first_layer_s = round(min(ready_at.values()) - origin, 3)
        run.mb_per_s = round(data_bytes(spec) / max(run.total_s, 1e-6) / 1e6, 2)


async def _live(run: Transfer, spec: CacheSpec, relay: RelayEndpoint, pub: PublisherProcess,
                budget: float) -> None:
    options = ConsumerOptions(relays=(relay.url,), budget=budget, stall_timeout=min(STALL_S, budget),
                              discovery_window=PUBLISHER_START_TIMEOUT_S, mode="live")
    consumer = _TimedConsumer(ConsumerIdentity.from_spec(spec), options)
    task = asyncio.ensure_future(consumer.run())
    discovering = asyncio.ensure_future(consumer.discovering.wait())
    try:
        await asyncio.wait([task, discovering], timeout=CONNECT_S, return_when=asyncio.FIRST_COMPLETED)
    finally:
        discovering.cancel()
    if not consumer.discovering.is_set():
        task.cancel()
        raise TransferError(f"consumer: not connected to the relay within {CONNECT_S:g} s")
    pub.launch()  # only now: the consumer is connected and asks for the namespace
    result = await asyncio.wait_for(task, timeout=budget + 30.0)
    loop = asyncio.get_running_loop()
    start = float((await loop.run_in_executor(None, pub.wait_for, "start", STOP_TIMEOUT_S))[1])
    done = float((await loop.run_in_executor(None, pub.wait_for, "published", STOP_TIMEOUT_S))[1])
    run.publisher_s = round(done - start, 3)
    run.held = not any(line.startswith("hold-expired") for line in pub.seen)
    _judge(run, spec, result)
    _times(run, spec, start, consumer.ready_at)


async def _completed(run: Transfer, spec: CacheSpec, relay: RelayEndpoint, pub: PublisherProcess,
                     budget: float) -> None:
    pub.launch()
    loop = asyncio.get_running_loop()
    start = float((await loop.run_in_executor(None, pub.wait_for, "start", PUBLISHER_START_TIMEOUT_S))[1])
    done = float((await loop.run_in_executor(None, pub.wait_for, "published", budget))[1])
    run.publisher_s = round(done - start, 3)
    options = ConsumerOptions(relays=(relay.url,), budget=budget, stall_timeout=min(STALL_S, budget), mode="auto")
    consumer = _TimedConsumer(ConsumerIdentity.from_spec(spec), options)
    origin = time.monotonic()
    result = await asyncio.wait_for(consumer.run(), timeout=budget + 30.0)
    _judge(run, spec, result)
    _times(run, spec, origin, consumer.ready_at)


def transfer(spec: CacheSpec, spec_path: Path, relay: RelayEndpoint, variant: str, budget: float,
             layer_interval: float = 0.0) -> Transfer:
    """One transfer of the cache through ``relay``; failures are recorded on it, never raised."""
    run = Transfer(relay.name, variant)
    with PublisherProcess(relay.url, spec_path, layer_interval, HOLD_S if variant == "live" else 0.0) as pub:
        try:
            step = _live if variant == "live" else _completed
            asyncio.run(step(run, spec, relay, pub, budget))
        except (TransferError, TimeoutError) as exc:
            run.error = f"{type(exc).__name__}: {exc}"
    return run


def main(argv: Sequence[str] | None = None) -> int:
    """The publisher child (see ``serve_publisher_child``)."""
    ap = argparse.ArgumentParser(description="the publisher child of a KVCS transfer")
    ap.add_argument("--serve-publisher", metavar="URL", required=True)
    ap.add_argument("--spec", required=True)
    ap.add_argument("--layer-interval", type=float, default=0.0)
    ap.add_argument("--hold", type=float, default=0.0)
    args = ap.parse_args(argv)
    return serve_publisher_child(args.serve_publisher, args.spec, args.layer_interval, args.hold)


if __name__ == "__main__":
    raise SystemExit(main())
