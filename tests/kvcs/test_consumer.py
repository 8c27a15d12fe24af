"""The reference KVCS consumer (kvconform.kvcs.consumer), its CLI (kvconform.kvcs.tool) and its drivers
(kvconform.targets.kvcs.consumer), against the reference publisher through the reference relay."""

from __future__ import annotations

import asyncio
import hashlib
import json
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, TypeVar

import pytest

from kvconform.kvcs import tool
from kvconform.kvcs.consumer import (
    Consumer,
    ConsumeResult,
    ConsumerIdentity,
    ConsumerOptions,
    LayerReady,
    Rejection,
    convention_layer_digest,
    layer_digest,
    load_producer_keys,
)
from kvconform.kvcs.content import CacheSpec, example_spec
from kvconform.kvcs.cose import ProducerKey
from kvconform.kvcs.publisher import KvcsPublisher, Progress
from kvconform.moqt import client as mc
from kvconform.moqt.relay import Relay
from kvconform.moqt.session import Role, SessionConfig
from kvconform.targets.kvcs import consumer as drivers

T = TypeVar("T")
BOUND = 60.0


def run(coro: Callable[[], Awaitable[T]]) -> T:
    async def bounded() -> T:
        return await asyncio.wait_for(coro(), BOUND)
    return asyncio.run(bounded())


async def _published(relay: Relay, spec: CacheSpec, **options: Any) -> tuple[mc.MoqtClient, KvcsPublisher]:
    client = await mc.connect(relay.url, config=SessionConfig(role=Role.CLIENT), timeout=5.0)
    pub = KvcsPublisher(spec, **options)
    await asyncio.wait_for(pub.publish(client, None), 20.0)
    return client, pub


def _options(relay: Relay, **kw: Any) -> ConsumerOptions:
    return ConsumerOptions(relays=(relay.url,), budget=kw.pop("budget", 10.0), stall_timeout=kw.pop("stall", 2.0),
                           discovery_window=0.3, **kw)


def test_layer_digest_is_block_order_k_then_v() -> None:
    spec = example_spec(layers=2, blocks=3)
    want = hashlib.sha256(b"".join(spec.data(1, 1, b) + spec.data(1, 2, b) for b in range(2))).digest()
    assert convention_layer_digest(spec, 1, [(0, 2)]) == want
    assert layer_digest([b"ab", b"c"]) == hashlib.sha256(b"abc").digest()


def test_result_json_round_trip() -> None:
    result = ConsumeResult(bytes(range(16)), {0: b"\x01" * 32, 1: None},
                           [Rejection("k.raw.s0", 1, 2, "Data Digest ...", "ab", "moqt://x")],
                           sources={0: b"\x02" * 16},
                           reasons={1: "missing"}, segments=[(0, 4)], elapsed=1.5, mode="fetch")
    obj = json.loads(result.to_json())
    assert obj["layers"]["1"] == {"digest": "failed", "reason": "missing"}
    back = ConsumeResult.from_obj(obj)
    assert back.publication == result.publication and back.layers == result.layers
    assert back.rejected[0].track == "k.raw.s0" and back.rejected[0].object == 2
    assert back.sources == result.sources and back.segments == [(0, 4)]
    # another consumer's plainer form: layer -> digest string
    assert ConsumeResult.from_obj({"publication": None, "layers": {"3": "failed"}}).layers == {3: None}


def test_completed_cache_by_fetch_and_first_blocks() -> None:
    spec = example_spec(layers=3, blocks=4)

    async def scenario() -> tuple[ConsumeResult, ConsumeResult]:
        async with Relay() as relay:
            client, _ = await _published(relay, spec)
            try:
                whole = await Consumer(ConsumerIdentity.from_spec(spec), _options(relay)).run()
                first = await Consumer(ConsumerIdentity.from_spec(spec), _options(relay, blocks=2,
                                                                                  layers=(1, 2))).run()
            finally:
                await client.close(timeout=0.2)
            return whole, first

    whole, first = run(scenario)
    assert whole.mode == "fetch" and whole.segments == [(0, 4)] and not whole.rejected
    assert whole.layers == {layer: convention_layer_digest(spec, layer, [(0, 4)]) for layer in range(3)}
    assert first.layers == {layer: convention_layer_digest(spec, layer, [(0, 2)]) for layer in (1, 2)}


def test_live_layers_are_ready_before_production_ends() -> None:
    """Pipelining: a layer is ready (callback and event) while later layers are still being published."""
    spec = example_spec(layers=6, blocks=2)
    seen: list[tuple[int, int]] = []  # (layer ready, layers published at that moment)

    async def scenario() -> ConsumeResult:
        async with Relay() as relay:
            client = await mc.connect(relay.url, config=SessionConfig(role=Role.CLIENT), timeout=5.0)
            published = [0]
            started = asyncio.Event()

            def progress(p: Progress) -> None:
                if p.kind == "layer":
                    published[0] = p.layer + 1
                    started.set()

            pub = KvcsPublisher(spec, layer_interval=0.15)
            task = asyncio.ensure_future(pub.publish(client, None, on_progress=progress))
            try:
                await asyncio.wait_for(started.wait(), 10.0)
                consumer = Consumer(ConsumerIdentity.from_spec(spec), _options(relay),
                                    on_ready=lambda r: seen.append((r.layer, published[0])))
                result = await consumer.run()
                assert all(consumer.ready[layer].is_set() for layer in range(6))
                await asyncio.wait_for(task, 10.0)
                return result
            finally:
                task.cancel()
                await client.close(timeout=0.2)

    result = run(scenario)
    assert result.mode == "live"
    assert result.layers == {layer: convention_layer_digest(spec, layer, [(0, 2)]) for layer in range(6)}
    # each layer ready once; their order is not: layer 0, published before the consumer came, may come by a
    # path slower than the next layer's live Objects (nothing in KVCS orders readiness across layers)
    assert sorted(layer for layer, _ in seen) == list(range(6))
    assert any(done < 6 for _, done in seen[:3]), f"no layer was ready before production ended: {seen}"


def test_signed_publication_needs_the_producer_key() -> None:
    key = ProducerKey.generate("EdDSA", b"p1")
    spec = example_spec(layers=2, blocks=2, signing={"alg": "EdDSA", "kid": "p1", "private_pem": key.private_pem()})
    other = ProducerKey.generate("EdDSA", b"p1")

    async def scenario() -> tuple[ConsumeResult, ConsumeResult]:
        async with Relay() as relay:
            client, _ = await _published(relay, spec)
            try:
                good = await Consumer(ConsumerIdentity.from_spec(spec),
                                      _options(relay, producer_keys={b"p1": key.public_pem()})).run()
                wrong = await Consumer(ConsumerIdentity.from_spec(spec),
                                       _options(relay, producer_keys={b"p1": other.public_pem()})).run()
            finally:
                await client.close(timeout=0.2)
            return good, wrong

    good, wrong = run(scenario)
    assert all(d is not None for d in good.layers.values())
    assert all(d is None for d in wrong.layers.values())
    assert wrong.rejected and "manifest.cose" in wrong.rejected[0].track


def test_unreachable_relay_fails_every_layer_within_the_budget() -> None:
    spec = example_spec(layers=2, blocks=2)
    options = ConsumerOptions(relays=("moqt://127.0.0.1:9",), budget=2.0, stall_timeout=1.0)
    started = time.monotonic()
    result = run(lambda: Consumer(ConsumerIdentity.from_spec(spec), options).run())
    assert time.monotonic() - started < 2.0 + 3.0
    assert result.layers == {0: None, 1: None} and result.publication is None


def test_tool_fetch_writes_the_result(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    spec = example_spec(layers=2, blocks=2)
    cache = spec.write_json(tmp_path / "cache.json")
    out = tmp_path / "result.json"

    async def scenario() -> int:
        async with Relay() as relay:
            client, _ = await _published(relay, spec)
            try:
                return await asyncio.to_thread(tool.main, ["fetch", "--relay", relay.url, "--cache", str(cache),
                                                           "--out", str(out), "--budget", "10"])
            finally:
                await client.close(timeout=0.2)

    assert run(scenario) == 0
    result = ConsumeResult.from_obj(json.loads(out.read_text()))
    assert result.layers == {layer: convention_layer_digest(spec, layer, [(0, 2)]) for layer in range(2)}
    err = capsys.readouterr().err
    assert "layer 0 ready" in err and "layer 1 ready" in err


def test_tool_usage_errors(tmp_path: Path) -> None:
    assert tool.main(["fetch", "--relay", "moqt://127.0.0.1:9", "--cache", str(tmp_path / "none.json"),
                      "--out", str(tmp_path / "r.json")]) == 2
    with pytest.raises(SystemExit):
        tool.main(["fetch", "--relay", "moqt://x", "--cache", "c", "--out", "o", "--layers", "3-1"])
    with pytest.raises(ValueError, match="kid=PEM"):
        load_producer_keys(["no-equals-sign"])


def test_cmd_driver_stops_a_consumer_past_its_budget(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(drivers, "GRACE", 0.5)
    driver = drivers.CmdConsumer(f"{sys.executable} -c 'import time; time.sleep(60)' {{relay}} {{cache}} {{out}} "
                                 "{layers}")
    cache = example_spec(layers=2, blocks=2).write_json(tmp_path / "c.json")
    request = drivers.FetchRequest(("moqt://127.0.0.1:9",), cache, budget=0.5)
    started = time.monotonic()
    outcome = driver.fetch(request, tmp_path / "r.json")
    assert outcome.killed and outcome.result is None and time.monotonic() - started < 10.0
    assert not driver.supports("relay2") and not driver.supports("token")


def test_cmd_driver_leaves_no_process_behind_and_keeps_undecodable_output(tmp_path: Path,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """A consumer that writes non-UTF-8 octets, daemonises a child (setsid) and hangs past its budget: the run is
    stopped, its output decoded with replacement, and nothing it started is left."""
    from kvconform.targets import process

    marks: list[str] = []
    real = process.Process.__init__

    def remember(self: process.Process, *args: object, **kwargs: object) -> None:
        real(self, *args, **kwargs)  # type: ignore[arg-type]
        marks.append(self.mark)

    monkeypatch.setattr(process.Process, "__init__", remember)
    monkeypatch.setattr(drivers, "GRACE", 1.0)
    script = tmp_path / "consumer.py"
    script.write_text("import subprocess, sys, time\n"
                      "sys.stderr.buffer.write(b'bad \\xff octet\\n'); sys.stderr.flush()\n"
                      "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(120)'],\n"
                      "                 start_new_session=True)\n"
                      "time.sleep(120)\n")
    driver = drivers.CmdConsumer(f"{sys.executable} {script} {{relay}} {{cache}} {{out}}")
    cache = example_spec(layers=2, blocks=2).write_json(tmp_path / "c.json")
    run = driver.fetch(drivers.FetchRequest(("moqt://127.0.0.1:9",), cache, budget=1.0), tmp_path / "r.json")
    assert run.killed and run.result is None and "bad \ufffd octet" in run.stderr, run.stderr
    assert marks and process.marked_pids(marks[0]) == []


def test_ready_callback_carries_the_block_data() -> None:
    spec = example_spec(layers=1, blocks=3)
    got: list[LayerReady] = []

    async def scenario() -> None:
        async with Relay() as relay:
            client, _ = await _published(relay, spec)
            try:
                await Consumer(ConsumerIdentity.from_spec(spec), _options(relay), on_ready=got.append).run()
            finally:
                await client.close(timeout=0.2)

    run(scenario)
    assert len(got) == 1 and got[0].data == tuple(spec.data(0, 1, b) + spec.data(0, 2, b) for b in range(3))
