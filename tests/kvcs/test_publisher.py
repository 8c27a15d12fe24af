"""The reference KVCS publisher (kvconform.kvcs.publisher), its CLI component and its drivers.

The publication order is checked in memory against a recording stand-in for the MOQT client; the network path
(relay, serve_publisher, the CLI, the cmd: driver) on 127.0.0.1 with bounded waits.
"""

from __future__ import annotations

import asyncio
import io
import json
import os
import sys
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from kvconform.kvcs.content import example_spec
from kvconform.kvcs.cose import ProducerKey, verify
from kvconform.kvcs.manifest import parse_manifest
from kvconform.kvcs.publisher import KvcsPublisher, load_publisher_class, serve_publisher
from kvconform.kvcs.tracks import MANIFEST, MANIFEST_COSE
from kvconform.moqt.data import ObjectStatus
from kvconform.moqt.structures import AuthToken, PropertyType, TrackNamespace, property_int
from kvconform.targets.kvcs.publisher import CmdPublisher, InProcessPublisher
from kvconform.verdicts import TargetUnavailable

TIMEOUT = 10.0


# ---- in memory: what is published, in which order ---------------------------------------------------------


@dataclass
class Published:
    track: bytes
    group: int
    object_id: int
    payload: bytes
    subgroup: int
    priority: int | None
    status: int
    end_subgroup: bool


@dataclass
class FakeTrack:
    """Records what the publisher asks a LocalTrack to publish."""

    name: bytes
    properties: tuple[Any, ...]
    log: list[Published]
    ended: bool = False

    def publish_object(self, group: int, object_id: int, payload: bytes = b"", *, subgroup: int = 0,
                       priority: int | None = None, status: int = ObjectStatus.NORMAL,
                       end_subgroup: bool = False) -> None:
        self.log.append(Published(self.name, group, object_id, payload, subgroup, priority, status, end_subgroup))

    def end_track(self) -> None:
        last = max(p.group for p in self.log if p.track == self.name)
        self.publish_object(last + 1, 0, status=ObjectStatus.END_OF_TRACK)
        self.ended = True


@dataclass
class FakeClient:
    """The parts of MoqtClient the publisher uses."""

    log: list[Published] = field(default_factory=list)
    tracks: dict[bytes, FakeTrack] = field(default_factory=dict)
    announced: list[tuple[TrackNamespace, tuple[AuthToken, ...]]] = field(default_factory=list)

    def track(self, namespace: TrackNamespace, name: bytes, *, properties: tuple[Any, ...] = (),
              publisher_priority: int = 128) -> FakeTrack:
        self.tracks[name] = FakeTrack(name, properties, self.log)
        return self.tracks[name]

    async def publish_namespace(self, namespace: TrackNamespace, *, auth: Any = (),
                                timeout: float | None = None) -> None:
        assert self.tracks, "every track is registered before PUBLISH_NAMESPACE"
        self.announced.append((namespace, tuple(auth)))


def publish(pub: KvcsPublisher, token: bytes | None = b"tok") -> FakeClient:
    client = FakeClient()
    asyncio.run(asyncio.wait_for(pub.publish(client, token), TIMEOUT))  # type: ignore[arg-type]
    return client


def test_layers_are_published_in_order_with_end_markers_and_floor_priorities() -> None:
    spec = example_spec(layers=20, blocks=3)
    client = publish(KvcsPublisher(spec))
    for name in (b"k.raw.s0", b"v.raw.s0"):
        objs = [p for p in client.log if p.track == name]
        expected = [(g, o) for g in range(20) for o in range(4)] + [(20, 0)]
        assert [(p.group, p.object_id) for p in objs] == expected
        for p in objs[:-1]:
            assert p.subgroup == 0
            assert p.priority == 128 * p.group // 20
            if p.object_id == 3:
                assert p.status == ObjectStatus.END_OF_GROUP and not p.payload
            else:
                assert p.payload == spec.object_payload(spec.data_tracks(0)[name == b"v.raw.s0"], p.group, p.object_id)
        assert objs[-1].status == ObjectStatus.END_OF_TRACK
    # layer g of every track before layer g+1 of any
    groups = [p.group for p in client.log if p.track != MANIFEST and p.status != ObjectStatus.END_OF_TRACK]
    assert groups == sorted(groups)


def test_manifest_first_every_8_layers_and_when_the_segment_completes() -> None:
    spec = example_spec(layers=20, blocks=3)
    client = publish(KvcsPublisher(spec))
    assert client.log[0].track == MANIFEST, "the manifest is the publication's first object"
    versions = [(i, p) for i, p in enumerate(client.log) if p.track == MANIFEST]
    assert [p.group for _, p in versions] == [0, 1, 2, 3]
    assert all(p.object_id == 0 and p.priority == 0 and p.end_subgroup for _, p in versions)
    manifests = [parse_manifest(p.payload) for _, p in versions]
    listed = [len(m.segments[0].object_digests["k.raw.s0"]) for m in manifests]  # type: ignore[index]
    assert listed == [0, 8, 16, 20]
    assert [m.segments[0].complete for m in manifests] == [False, False, False, True]
    eot = max(i for i, p in enumerate(client.log) if p.status == ObjectStatus.END_OF_TRACK)
    assert versions[-1][0] > eot, "the version marking the segment complete follows its End of Track"


def test_appended_segment_gets_its_own_tracks_and_manifest_versions() -> None:
    spec = example_spec(layers=4, blocks=2, segments=(8,))
    client = publish(KvcsPublisher(spec, kv_track=True))
    assert set(client.tracks) == {MANIFEST, b"k.raw.s0", b"v.raw.s0", b"kv.raw.s0", b"k.raw.s1", b"v.raw.s1",
                                  b"kv.raw.s1"}
    s1 = [p for p in client.log if p.track == b"k.raw.s1" and p.status == ObjectStatus.NORMAL]
    assert sorted({p.object_id for p in s1}) == [0, 1]
    first_s1 = client.log.index(s1[0])
    manifests = [(i, parse_manifest(p.payload)) for i, p in enumerate(client.log) if p.track == MANIFEST]
    added = [i for i, m in manifests if m.segment(1) is not None and not m.segment(1).complete]  # type: ignore[union-attr]
    assert added and added[0] < first_s1, "a version lists segment 1 before its first object"
    assert manifests[-1][1].segment(1).complete  # type: ignore[union-attr]
    kv = spec.data_tracks(1, kv=True)[2]
    kv_obj = next(p for p in client.log if p.track == b"kv.raw.s1" and p.status == ObjectStatus.NORMAL)
    assert kv_obj.payload == spec.object_payload(kv, kv_obj.group, kv_obj.object_id)


def test_announcement_and_track_properties() -> None:
    spec = example_spec(layers=2, blocks=1)
    pub = KvcsPublisher(spec, pub_id=bytes(range(16)), cache_duration_ms=1234)
    client = publish(pub, b"scope-token")
    ns, auth = client.announced[0]
    assert ns.fields == (b"kvcs-1", spec.scope_id, spec.compat_id, spec.anchor_key, bytes(range(16)))
    assert auth == (AuthToken.use_value(b"scope-token"),)
    for track in client.tracks.values():
        assert property_int(track.properties, PropertyType.MAX_CACHE_DURATION) == 1234
        assert property_int(track.properties, PropertyType.OBJECT_DELIVERY_TIMEOUT) is None
        assert property_int(track.properties, PropertyType.SUBGROUP_DELIVERY_TIMEOUT) is None


@pytest.mark.parametrize("alg", ["ES256", "EdDSA"])
def test_a_producer_key_in_the_spec_signs_manifest_cose(alg: str) -> None:
    key = ProducerKey.generate(alg, b"kid-1")
    spec = example_spec(layers=2, blocks=1, signing={"alg": alg, "kid": "kid-1", "private_pem": key.private_pem()})
    client = publish(KvcsPublisher(spec))
    assert MANIFEST not in client.tracks
    versions = [p for p in client.log if p.track == MANIFEST_COSE]
    assert versions
    for p in versions:
        parse_manifest(verify(p.payload, {b"kid-1": key.public_pem()}))


def test_bad_options_are_refused() -> None:
    with pytest.raises(ValueError, match="manifest_every"):
        KvcsPublisher(example_spec(), manifest_every=0)
    with pytest.raises(ValueError, match="fetch_limit"):
        KvcsPublisher(example_spec(), fetch_limit=0)
    with pytest.raises(ValueError, match="module:Class"):
        load_publisher_class("nocolon")
    with pytest.raises(ValueError, match="not a subclass"):
        load_publisher_class("kvconform.kvcs.content:CacheSpec")
    assert load_publisher_class("kvconform.kvcs.publisher:KvcsPublisher") is KvcsPublisher


# ---- over the network ---------------------------------------------------------------------------------------


@pytest.fixture
def relay_url() -> Any:
    """The reference relay on 127.0.0.1 (authorizes everything), on its own loop thread."""
    from kvconform.moqt.quic import LoopThread
    from kvconform.moqt.relay import Relay

    thread = LoopThread("test-kvcs-publisher-relay")

    async def start() -> Relay:
        return await Relay(host="127.0.0.1", port=0).start()

    relay = thread.run(start(), TIMEOUT)
    try:
        yield relay.url
    finally:
        thread.run(relay.close(3.0), 5.0)
        thread.close(3.0)


async def _fetch_track(url: str, namespace: TrackNamespace, name: bytes) -> dict[tuple[int, int], bytes]:
    from kvconform.moqt.client import connect

    client = await connect(url, timeout=TIMEOUT)
    try:
        sub = await client.subscribe_with_fill(namespace, name, timeout=TIMEOUT)
        await sub.wait_complete(TIMEOUT)
        assert not sub.violations
        return {(loc.group, loc.object): p for loc, p in sub.payloads().items()}
    finally:
        await client.close(timeout=1.0)


def test_serve_publisher_publishes_and_keeps_serving_until_stopped(relay_url: str) -> None:
    spec = example_spec(layers=3, blocks=2)
    pub = KvcsPublisher(spec)
    stop = threading.Event()
    published = threading.Event()
    out = io.StringIO()
    codes: list[int] = []
    thread = threading.Thread(target=lambda: codes.append(serve_publisher(
        relay_url, spec, b"t", stop, publisher=pub, out=out, on_published=lambda _: published.set())))
    thread.start()
    try:
        assert published.wait(TIMEOUT), "the publication completes"
        assert out.getvalue().startswith("published ")
        # after publishing, the relay still fills a new subscriber from the publisher (it kept serving)
        got = asyncio.run(_fetch_track(relay_url, pub.namespace.track_namespace(), b"v.raw.s0"))
        track = spec.data_tracks(0)[1]
        assert got == {(g, o): spec.object_payload(track, g, o) for g in range(3) for o in range(2)}
        assert thread.is_alive()
    finally:
        stop.set()
        thread.join(TIMEOUT)
    assert not thread.is_alive() and codes == [0]


def test_serve_publisher_reports_a_refused_announcement() -> None:
    from kvconform.moqt.policy import policy_from_mapping
    from kvconform.moqt.quic import LoopThread
    from kvconform.moqt.relay import Relay

    spec = example_spec(layers=2, blocks=1)
    policy = policy_from_mapping({"version": 1, "anonymous": {"subscribe": []},
                                  "tokens": [{"name": "p", "value": "right", "publish": [["kvcs-1"]]}]})
    thread = LoopThread("test-kvcs-publisher-refusing-relay")

    async def start() -> Relay:
        return await Relay(policy=policy, host="127.0.0.1", port=0).start()

    relay = thread.run(start(), TIMEOUT)
    try:
        assert serve_publisher(relay.url, spec, b"wrong", threading.Event(), out=io.StringIO()) == 1
        stopped = threading.Event()
        stopped.set()  # publish, then stop at once
        out = io.StringIO()
        assert serve_publisher(relay.url, spec, b"right", stopped, out=out) == 0
        assert out.getvalue().startswith("published ")
    finally:
        thread.run(relay.close(3.0), 5.0)
        thread.close(3.0)


def test_cli_component_refuses_a_bad_cache_spec(tmp_path: Path) -> None:
    from kvconform.components import component

    bad = tmp_path / "cache.json"
    bad.write_text(json.dumps({"profile": "kvsp-provisional-1"}))
    assert component("kvcs-publisher")(["--relay", "moqt://127.0.0.1:1", "--cache", str(bad)], None) == 2
    assert component("kvcs-publisher")(["--cache", str(bad)], None) == 2  # --relay is required


def _wait_ready(fifo: Path, timeout: float) -> str:
    """What the child writes into ``fifo`` (it opens it once it has printed); "" past ``timeout``."""
    got: list[str] = []
    reader = threading.Thread(target=lambda: got.append(fifo.read_text()), daemon=True)
    reader.start()
    reader.join(timeout)
    if reader.is_alive():
        fifo.write_text("")  # release the blocked reader
        reader.join(timeout)
    return "".join(got)


def test_cmd_driver_keeps_output_and_reaps_the_process(tmp_path: Path) -> None:
    fifo = tmp_path / "ready"
    os.mkfifo(fifo)
    script = tmp_path / "pub.py"
    script.write_text("import sys, time\nprint('relay', sys.argv[1], 'token', sys.argv[3], flush=True)\n"
                      f"print('oops', file=sys.stderr, flush=True)\nopen({str(fifo)!r}, 'w').write('ready')\n"
                      "time.sleep(60)\n")
    driver = CmdPublisher(f"{sys.executable} {script} {{relay}} {{cache}} {{token}}")
    driver.start("moqt://127.0.0.1:9", tmp_path / "cache.json", "tok")
    assert _wait_ready(fifo, TIMEOUT) == "ready"
    assert driver.running()
    ended = driver.stop()  # SIGTERM ends the sleeping script at once
    assert not driver.running()
    assert ended.code is not None and ended.code != 0
    assert "relay moqt://127.0.0.1:9 token tok" in ended.stdout and "oops" in ended.stderr


def test_cmd_driver_that_cannot_start_is_unavailable(tmp_path: Path) -> None:
    driver = CmdPublisher("/nonexistent/publisher {relay} {cache} {token}")
    with pytest.raises(TargetUnavailable):
        driver.start("moqt://127.0.0.1:9", tmp_path / "cache.json", "tok")


def test_in_process_driver_with_an_unusable_spec_is_unavailable(tmp_path: Path) -> None:
    with pytest.raises(TargetUnavailable):
        InProcessPublisher(KvcsPublisher).start("moqt://127.0.0.1:9", tmp_path / "missing.json", "tok")



def test_cmd_driver_leaves_no_process_behind(tmp_path: Path) -> None:
    """A publisher that ignores SIGTERM, keeps a child in its group and daemonises another (setsid): after
    stop() none of them is left (targets/process.py kills the group, then whatever carries its mark)."""
    from kvconform.targets.process import Process, marked_pids

    fifo = tmp_path / "ready"
    os.mkfifo(fifo)
    script = tmp_path / "pub.py"
    script.write_text(
        "import os, signal, subprocess, sys, time\n"
        "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
        "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(120)'])\n"
        "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(120)'], start_new_session=True)\n"
        f"open({str(fifo)!r}, 'w').write('ready')\n"
        "time.sleep(120)\n")
    driver = CmdPublisher(f"{sys.executable} {script} {{relay}} {{cache}} {{token}}")
    driver.start("moqt://127.0.0.1:9", tmp_path / "cache.json", "tok")
    assert _wait_ready(fifo, TIMEOUT) == "ready"
    proc = driver._proc
    assert isinstance(proc, Process)
    mark = proc.mark
    assert len(marked_pids(mark)) == 3
    ended = driver.stop()
    assert marked_pids(mark) == [] and not driver.running()
    assert "ignored SIGTERM" in ended.stderr
