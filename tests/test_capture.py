"""Per-check captures (kvconform.capture, --capture): the pcap writer and TCP flows, the relay, the tcpdump stream,
the keep rule, and `kvconform run ... --capture` end to end, opened with tshark.

tcpdump and tshark are Debian packages .ci/run installs (system packages). Where CI is set, a missing one fails
these tests (a capture no one can open proves nothing); elsewhere they skip, saying what to install.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import struct
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from kvconform.capture import hooks
from kvconform.capture.pcap import (
    MSS,
    Datagram,
    Frame,
    PcapFormatError,
    Segment,
    TcpFlow,
    datagram_frame,
    frame_ports,
    read_pcap,
    read_pcap_stream,
    segment_frame,
    udp_payload,
    write_pcap,
)
from kvconform.capture.relay import TcpRelay
from kvconform.capture.session import CaptureSession
from kvconform.capture.tcpdump import Tcpdump
from kvconform.fixtures.capture import PluginCapture
from kvconform.moqt.messages import MessageType
from kvconform.moqt.vi64 import encode_vi64
from tests.spawn import covering, kvconform

WAIT = 10.0  # bound on every wait for a relay thread or tcpdump
RUN_TIMEOUT = 240.0
TLKV_CHECK = "test_chunk_crc_mismatch"  # pushes a stream of chunks (gRPC DATA frames) and reads the status
MOQT_CHECK = "test_the_relay_answers_setup"  # a QUIC handshake, SETUP both ways, a session close
PACKAGES = {"tshark": "tshark", "tcpdump": "tcpdump"}


def need(tool: str) -> str:
    """The tool's path; a clear failure in CI (.ci/run installs it), a skip elsewhere."""
    path = shutil.which(tool)
    if path:
        return path
    message = (f"{tool} is not installed: install Debian's {PACKAGES[tool]} (.ci/run does, in its captures block); "
               "a capture no tool opens shows nothing")
    if os.environ.get("CI"):
        pytest.fail(message)
    pytest.skip(message)


# ------------------------------------------------------------------------------------------------- pcap


def test_tcp_flow_numbers_follow_the_bytes() -> None:
    flow = TcpFlow(("127.0.0.1", 40000), ("127.0.0.1", 50051))
    syn, syn_ack, ack = flow.open()
    assert (syn.flags, syn_ack.flags, ack.flags) == ("S", "SA", "A")
    assert syn_ack.ack == syn.seq + 1 and ack.seq == syn.seq + 1 and ack.ack == syn_ack.seq + 1
    first, second = flow.data(True, b"x" * (MSS + 10))
    assert (len(first.payload), len(second.payload)) == (MSS, 10)
    assert second.seq == first.seq + MSS and first.src == ("127.0.0.1", 40000)
    (reply,) = flow.data(False, b"ok")
    assert reply.ack == second.seq + 10 and reply.seq == syn_ack.seq + 1 and reply.dst == ("127.0.0.1", 40000)
    fin, fin_ack = flow.fin(True)
    assert (fin.flags, fin_ack.flags, fin_ack.ack) == ("FA", "A", fin.seq + 1)
    assert flow.fin(True) == []  # a second FIN from the same side shows nothing
    (rst,) = flow.reset(False)
    assert rst.flags == "RA" and flow.closed == {True: True, False: True}


@pytest.mark.parametrize("client, server", [(("127.0.0.1", 40001), ("127.0.0.1", 50051)),
                                            (("::1", 40002), ("::1", 4443))])
def test_frames_round_trip_through_a_pcap_file(tmp_path: Path, client: tuple[str, int],
                                               server: tuple[str, int]) -> None:
    flow = TcpFlow(client, server)
    segments = [*flow.open(), *flow.data(True, b"PRI * HTTP/2.0")]
    frames = [Frame(1700000000.25 + i / 1000, segment_frame(s)) for i, s in enumerate(segments)]
    frames.append(Frame(1700000001.5, datagram_frame(Datagram(client, server, b"quic"))))
    assert write_pcap(tmp_path / "x.pcap", frames) == len(frames)
    back = read_pcap(tmp_path / "x.pcap")
    assert [f.data for f in back] == [f.data for f in frames]
    assert [round(f.ts, 6) for f in back] == [round(f.ts, 6) for f in frames]
    assert frame_ports(back[0].data) == (6, client[1], server[1])
    assert frame_ports(back[-1].data) == (17, client[1], server[1])
    assert udp_payload(back[-1].data) == b"quic" and udp_payload(back[0].data) is None


def test_a_pcap_of_another_link_type_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "sll.pcap"
    path.write_bytes(struct.pack("<IHHiIII", 0xA1B2C3D4, 2, 4, 0, 0, 65535, 113))
    with pytest.raises(PcapFormatError, match="link type: got 113, expected 1"), open(path, "rb") as stream:
        list(read_pcap_stream(stream))


# ------------------------------------------------------------------------------------------------ relay


@pytest.fixture
def echo_server() -> Iterator[tuple[str, int]]:
    """A TCP server on 127.0.0.1 that echoes one connection and closes it when the client has."""
    listener = socket.create_server(("127.0.0.1", 0))
    listener.settimeout(WAIT)

    def serve() -> None:
        try:
            conn, _ = listener.accept()
        except OSError:
            return
        with conn:
            conn.settimeout(WAIT)
            while data := conn.recv(65536):
                conn.sendall(data)

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    yield ("127.0.0.1", int(listener.getsockname()[1]))
    listener.close()
    thread.join(WAIT)


class Recorder:
    """What a relay recorded; ``until(pred)`` waits (bounded) for the relay threads to have recorded enough."""

    def __init__(self) -> None:
        self.segments: list[Segment] = []
        self._cond = threading.Condition()

    def __call__(self, segments: list[Segment]) -> None:
        with self._cond:
            self.segments.extend(segments)
            self._cond.notify_all()

    def until(self, pred: Any) -> list[Segment]:
        with self._cond:
            assert self._cond.wait_for(lambda: pred(self.segments), WAIT), f"relay recorded {self.segments}"
            return list(self.segments)


def test_the_relay_copies_both_ways_and_records_the_connection(echo_server: tuple[str, int]) -> None:
    recorder = Recorder()
    relay = TcpRelay(echo_server, recorder)
    try:
        with socket.create_connection(relay.address, timeout=WAIT) as client:
            local = client.getsockname()
            client.sendall(b"ping")
            assert client.recv(16) == b"ping"
            client.shutdown(socket.SHUT_WR)
            assert client.recv(16) == b""  # the echo server's close came through
        segments = recorder.until(lambda s: sum(x.flags == "FA" for x in s) == 2)
    finally:
        relay.stop()
    assert [s.flags for s in segments[:3]] == ["S", "SA", "A"]
    data = [(s.src, s.payload) for s in segments if s.payload]
    assert data == [(tuple(local), b"ping"), (echo_server, b"ping")]
    assert segments[0].src == tuple(local) and segments[0].dst == echo_server  # the dialler to the endpoint


def test_a_refused_endpoint_is_a_reset_for_the_dialler() -> None:
    closed = socket.socket()
    closed.bind(("127.0.0.1", 0))
    port = int(closed.getsockname()[1])
    closed.close()  # nothing listens there now
    recorder = Recorder()
    relay = TcpRelay(("127.0.0.1", port), recorder)
    try:
        # The reset reaches the dialler at its first read, or already in connect() when it beats the connecting
        # thread back from the kernel (a loaded machine)
        with pytest.raises(ConnectionResetError), socket.create_connection(relay.address, timeout=WAIT) as client:
            client.recv(16)
        segments = recorder.until(lambda s: len(s) >= 2)
    finally:
        relay.stop()
    assert [s.flags for s in segments] == ["S", "RA"]


# ------------------------------------------------------------------------------------- session, keeping


def test_the_harness_session_keeps_or_drops_a_window(tmp_path: Path) -> None:
    session = CaptureSession("harness")
    flow = TcpFlow(("127.0.0.1", 40003), ("127.0.0.1", 50051))
    session.begin("kept")
    session.record_segments([*flow.open(), *flow.data(True, b"hello")])
    session.record_datagram(Datagram(("127.0.0.1", 40004), ("127.0.0.1", 4443), b"d"))
    entry = session.end(True, tmp_path / "kept")
    assert entry["with"] == "harness" and entry["kept"] and entry["complete"]
    (pcap,) = entry["files"]
    assert pcap["kind"] == "pcap" and pcap["packets"] == 5 and len(read_pcap(tmp_path / pcap["path"])) == 5
    session.begin("dropped")
    session.record_segments(flow.data(False, b"bye"))
    assert session.end(False, tmp_path / "dropped") == {"with": "harness", "how": session.how(), "kept": False}
    session.record_segments(flow.data(False, b"between checks"))  # no window: recorded nowhere
    session.begin("empty")
    entry = session.end(True, tmp_path / "empty")
    assert entry["files"] == [] and "nothing crossed" in entry["notes"][0]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["kept.pcap"]


@pytest.mark.parametrize("mode, verdict, kept", [
    ("failed", "pass", False), ("failed", "not-applicable", False), ("failed", "fail", True),
    ("failed", "inconclusive", True), ("failed", "xfail", True), ("all", "pass", True),
])
def test_what_is_kept_follows_the_mode_and_verdict(tmp_path: Path, mode: str, verdict: str, kept: bool) -> None:
    capture = PluginCapture(mode, CaptureSession("harness"))
    capture.begin("check")
    capture.session.record_datagram(Datagram(("127.0.0.1", 40005), ("127.0.0.1", 4443), b"d"))
    entry = capture.end(verdict, tmp_path / "check.json")
    assert (entry["mode"], entry["kept"]) == (mode, kept)
    assert (tmp_path / "check.pcap").exists() is kept


def test_without_a_capture_the_hooks_change_nothing() -> None:
    from kvconform.moqt.quic import quic_configuration

    assert hooks.active() is None
    configuration = quic_configuration(is_client=True)
    assert configuration.quic_logger is None and configuration.secrets_log_file is None
    with hooks.tcp_endpoint("127.0.0.1:50051") as address:
        assert address == "127.0.0.1:50051"
    marker = object()
    assert hooks.udp_transport(marker) is marker


def test_tcpdump_delivers_watched_frames_up_to_each_mark() -> None:
    need("tcpdump")
    frames: list[Frame] = []
    dump = Tcpdump(frames.append)
    other = Tcpdump(lambda frame: None)  # another capture of loopback beside it, as in a parallel test run
    dump.start()
    other.start()
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as a, socket.socket(socket.AF_INET,
                                                                                  socket.SOCK_DGRAM) as b:
            b.bind(("127.0.0.1", 0))
            a.sendto(b"captured", b.getsockname())
            assert other.mark(), f"the other capture's mark did not come back within 5 s: {other.error}"
            assert dump.mark(), f"the mark did not come back within 5 s: {dump.error}"
            port = int(b.getsockname()[1])
            mine = [f for f in frames if (frame_ports(f.data) or (0, 0, 0))[2] == port]
            assert [udp_payload(f.data) for f in mine] == [b"captured"]
            # marks, its own and the other capture's, are not frames
            assert not [f for f in frames if b"kvconform-capture-mark" in f.data]
    finally:
        other.stop()
        dump.stop()
    assert not dump.running


# ---------------------------------------------------------------------------------------- end to end


def _run(report_dir: Path, *args: str) -> subprocess.CompletedProcess[str]:
    proc: subprocess.CompletedProcess[str] = kvconform(["run", *args, "--report-dir", str(report_dir), "-q"],
                                                       timeout=RUN_TIMEOUT)
    return proc


def _bundle(report_dir: Path, check: str) -> dict[str, Any]:
    (path,) = [p for p in (report_dir / "evidence").glob("*.json") if p.stem.endswith(check)]
    doc: dict[str, Any] = json.loads(path.read_text())
    return doc


def _files(bundle: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {f["kind"]: f for f in bundle["capture"]["files"]}


def tshark(*args: str) -> str:
    proc = subprocess.run([need("tshark"), *args], capture_output=True, text=True, timeout=60,
                          stdin=subprocess.DEVNULL)
    assert proc.returncode == 0, f"tshark {' '.join(args)}: exit {proc.returncode}: {proc.stderr[-2000:]}"
    return proc.stdout


def count(pcap: Path, display_filter: str, *options: str) -> int:
    return len(tshark("-r", str(pcap), *options, "-Y", display_filter).splitlines())


@pytest.fixture(scope="module", params=["tcpdump", "harness"])
def captured(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One tl.kv.v1 check and one MOQT relay check run with --capture all, the pcap taken each way."""
    if request.param == "tcpdump":
        need("tcpdump")
    out = tmp_path_factory.mktemp(f"capture-{request.param}")
    proc = _run(out, "all", "-k", f"{TLKV_CHECK} or {MOQT_CHECK}", "--capture", "all",
                "--capture-with", request.param)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    for check in (TLKV_CHECK, MOQT_CHECK):
        assert _bundle(out, check)["capture"]["with"] == request.param
    return out


@covering(RUN_TIMEOUT)  # the `captured` run it reads
def test_the_grpc_capture_decodes_as_http2_and_grpc(captured: Path) -> None:
    bundle = _bundle(captured, TLKV_CHECK)
    pcap = captured / "evidence" / _files(bundle)["pcap"]["path"]
    (port,) = bundle["capture"]["ports"]["tcp"]
    assert f"-d tcp.port=={port},http2" in _files(bundle)["pcap"]["open"]
    decode = ("-d", f"tcp.port=={port},http2")
    assert count(pcap, 'http2.headers.path == "/tl.kv.v1.KvTransfer/PushKv"', *decode) >= 1
    assert count(pcap, "grpc.message_data", *decode) >= 2  # the pushed chunks and the answer
    assert count(pcap, "_ws.malformed", *decode) == 0
    # Reassembly saw every byte once and in order (tcpdump dropped nothing; the relay's numbers are consistent).
    assert count(pcap, "tcp.analysis.lost_segment or tcp.analysis.ack_lost_segment or tcp.analysis.out_of_order "
                       "or tcp.analysis.retransmission", *decode) == 0
    assert "Malformed" not in tshark("-r", str(pcap), *decode, "-q", "-z", "expert")


@covering(RUN_TIMEOUT)  # the `captured` run it reads
def test_the_quic_capture_decrypts_with_the_key_log_and_carries_moqt(captured: Path) -> None:
    bundle = _bundle(captured, MOQT_CHECK)
    files = _files(bundle)
    pcap, keys = captured / "evidence" / files["pcap"]["path"], captured / "evidence" / files["keylog"]["path"]
    assert f"-o tls.keylog_file:{keys.name}" in files["pcap"]["open"]
    keylog = ("-o", f"tls.keylog_file:{keys}")
    assert count(pcap, 'tls.handshake.extensions_alpn_str == "moqt-22"') >= 1
    assert count(pcap, "quic.stream_data") == 0  # without the key log nothing past the handshake is readable
    streams = tshark("-r", str(pcap), *keylog, "-Y", "quic.stream_data", "-T", "fields", "-e", "quic.stream_data")
    setup = encode_vi64(MessageType.SETUP).hex()
    assert any(chunk.startswith(setup) for line in streams.splitlines() for chunk in line.split(",")), \
        f"no decrypted QUIC stream starts with a MOQT SETUP ({setup}): {streams[:500]}"
    assert count(pcap, "_ws.malformed", *keylog) == 0
    assert "Malformed" not in tshark("-r", str(pcap), *keylog, "-q", "-z", "expert")


def qlog_problems(doc: Any) -> list[str]:
    """What a qvis-style reader of qlog 0.3 JSON would stumble on (a schema-light check)."""
    if not isinstance(doc, dict):
        return [f"top level: got {type(doc).__name__}, expected an object"]
    problems = []
    if doc.get("qlog_version") not in ("0.3", "0.4") or doc.get("qlog_format", "JSON") != "JSON":
        problems.append(f"qlog_version/qlog_format: got {doc.get('qlog_version')!r}/{doc.get('qlog_format')!r}")
    traces = doc.get("traces")
    if not isinstance(traces, list) or not traces:
        return [*problems, f"traces: got {traces!r:.80}, expected a non-empty list"]
    for i, trace in enumerate(traces):
        vantage = trace.get("vantage_point", {}) if isinstance(trace, dict) else {}
        if vantage.get("type") not in ("client", "server"):
            problems.append(f"traces[{i}].vantage_point.type: got {vantage.get('type')!r}, expected client|server")
        events = trace.get("events") if isinstance(trace, dict) else None
        if not isinstance(events, list) or not events:
            problems.append(f"traces[{i}].events: expected a non-empty list")
            continue
        times = [e.get("time") for e in events]
        for j, event in enumerate(events):
            name = event.get("name")
            if not isinstance(event.get("time"), int | float) or not isinstance(event.get("data"), dict) \
                    or not isinstance(name, str) or ":" not in name:
                problems.append(f"traces[{i}].events[{j}]: got {event!r:.120}, expected time, name cat:event, data")
        if all(isinstance(t, int | float) for t in times) and times != sorted(times):
            problems.append(f"traces[{i}].events: times go backwards")
    return problems


@covering(RUN_TIMEOUT)  # the `captured` run it reads
def test_the_qlog_is_what_qlog_readers_take(captured: Path) -> None:
    bundle = _bundle(captured, MOQT_CHECK)
    qlog = _files(bundle)["qlog"]
    doc = json.loads((captured / "evidence" / qlog["path"]).read_text())
    assert qlog_problems(doc) == []
    assert len(doc["traces"]) == qlog["traces"] and {t["vantage_point"]["type"] for t in doc["traces"]} >= {"client"}
    names = {e["name"] for t in doc["traces"] for e in t["events"]}
    assert {"transport:packet_sent", "transport:packet_received"} <= names


def test_qlog_check_finds_what_is_wrong() -> None:
    assert qlog_problems([]) != []
    assert qlog_problems({"qlog_version": "0.3", "traces": [{"vantage_point": {"type": "client"},
                                                              "events": [{"time": 2, "name": "a:b", "data": {}},
                                                                         {"time": 1, "name": "ab", "data": {}}]}]}) \
        == ["traces[0].events[1]: got {'time': 1, 'name': 'ab', 'data': {}}, expected time, name cat:event, data",
            "traces[0].events: times go backwards"]


CAPTURE_SUFFIXES = frozenset({".pcap", ".qlog", ".keys"})  # the evidence folder also holds its pages and bytes


@covering(RUN_TIMEOUT)
def test_capture_none_takes_nothing(tmp_path: Path) -> None:
    proc = _run(tmp_path, "tlkv-decode", "-k", TLKV_CHECK, "--capture", "none")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "capture" not in _bundle(tmp_path, TLKV_CHECK)
    assert sorted(p.suffix for p in (tmp_path / "evidence").iterdir() if p.suffix in CAPTURE_SUFFIXES) == []


@covering(RUN_TIMEOUT)
def test_capture_failed_keeps_only_what_did_not_pass(tmp_path: Path) -> None:
    need("tshark")
    proc = _run(tmp_path, "tlkv-decode", "--target", "python:tests.mutants.tlkv:SkipsChunkCrcDecode",
                "-k", f"{TLKV_CHECK} or test_has_blocks_order")  # --capture failed is the default
    assert proc.returncode == 1, proc.stdout[-3000:] + proc.stderr[-3000:]
    failed, passed = _bundle(tmp_path, TLKV_CHECK), _bundle(tmp_path, "test_has_blocks_order")
    assert (failed["verdict"], passed["verdict"]) == ("fail", "pass")
    assert passed["capture"]["kept"] is False and "files" not in passed["capture"]
    assert failed["capture"]["mode"] == "failed" and failed["capture"]["kept"] is True
    pcap = tmp_path / "evidence" / _files(failed)["pcap"]["path"]
    (port,) = failed["capture"]["ports"]["tcp"]
    assert count(pcap, "grpc", "-d", f"tcp.port=={port},http2") >= 1
    assert sorted(p.suffix for p in (tmp_path / "evidence").iterdir() if p.suffix in CAPTURE_SUFFIXES) == [".pcap"]
    # The check's evidence page links the pcap beside it and says how to open it.
    (page,) = [p for p in (tmp_path / "evidence").glob("*.html") if p.stem.endswith(TLKV_CHECK)]
    html = page.read_text()
    assert f"href='{pcap.name}'" in html and _files(failed)["pcap"]["open"].split()[0] in html
    (passed_page,) = [p for p in (tmp_path / "evidence").glob("*.html") if p.stem.endswith("test_has_blocks_order")]
    assert "id='capture'" in passed_page.read_text() and ".pcap" not in passed_page.read_text()
