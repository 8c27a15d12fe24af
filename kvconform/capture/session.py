"""A harness process's capture: per check, what crossed the harness's sockets, written beside its evidence.

DESIGN.md principle 6: where a socket is involved the evidence holds a capture — a pcap, and for QUIC the qlog and
the TLS key log. A check's capture is a *window*: ``begin`` before its setup, ``end`` after its teardown. What goes
into the window's pcap comes from one of two sources, chosen once per process (``tool``):

- ``tcpdump``: one tcpdump on loopback for the process (``capture.tcpdump``); the window keeps the frames captured
  between its begin and its end mark whose TCP or UDP port is one of the harness's endpoints (``watch``: the
  tl.kv.v1 endpoints it dials or serves, the ports of its QUIC sockets). An endpoint that is not on loopback is
  out of tcpdump's sight and is recorded as below.
- ``harness``: the harness writes the frames from what its sockets see: a TCP relay in front of each tl.kv.v1
  endpoint (``capture.relay``) and the datagrams of its QUIC sockets (``capture.quic.RecordingTransport``), with
  synthesised Ethernet/IP/TCP/UDP headers.

The qlog (every trace with events in the window) and the key log (every secret of the process) come from aioquic
in both cases; the qlog's logger (``capture.qlog``) is the QUIC adapter's to hand over, so a process that opens no
QUIC connection never imports aioquic for its capture. ``end(keep=False)`` drops the window: ``--capture failed``
records every check and keeps the capture of the ones that did not pass.
"""

from __future__ import annotations

import ipaddress
import json
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kvconform.capture import MODES, TOOLS
from kvconform.capture.pcap import Datagram, Frame, Segment, datagram_frame, frame_ports, segment_frame, write_pcap
from kvconform.capture.quic import KeyLog
from kvconform.capture.tcpdump import CaptureUnavailable, Tcpdump

if TYPE_CHECKING:  # handed over by the QUIC adapter (quic_logger): aioquic only where QUIC runs
    from kvconform.capture.qlog import TraceLogger

__all__ = ["MODES", "TOOLS", "WINDOW_LIMIT", "CaptureSession", "is_loopback"]

QLOG_VERSION = "0.3"  # aioquic's qlog schema (draft-ietf-quic-qlog-main-schema-01 era, what qvis reads)
# Bytes one check's capture holds in memory; past it frames are counted, not kept (the entry says how many).
WINDOW_LIMIT = 256 * 1024 * 1024
_TCP, _UDP = 6, 17


def is_loopback(host: str) -> bool:
    """127.0.0.0/8, ::1 or the name localhost."""
    if host.strip("[]").lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


@dataclass
class _Window:
    name: str
    begin: float
    frames: list[Frame] = field(default_factory=list)
    segments: list[tuple[float, Segment]] = field(default_factory=list)
    datagrams: list[tuple[float, Datagram]] = field(default_factory=list)
    size: int = 0
    dropped: int = 0

    def room(self, size: int) -> bool:
        if self.size + size > WINDOW_LIMIT:
            self.dropped += 1
            return False
        self.size += size
        return True


class CaptureSession:
    """The capture of one harness process (one pytest worker); thread-safe."""

    def __init__(self, tool: str = "auto", interface: str = "lo", tcpdump: str | None = None) -> None:
        if tool not in TOOLS:
            raise ValueError(f"capture tool: got {tool!r}, expected one of {', '.join(TOOLS)}")
        self.requested = tool
        self.interface = interface
        self.tcpdump_path = tcpdump
        self.tool: str | None = None  # decided by start(): "tcpdump" or "harness"
        self.why: str | None = None  # why the harness writes the capture although tcpdump was wanted
        self.logger: TraceLogger | None = None  # the qlog logger, from the first QUIC configuration on
        self.keylog = KeyLog()
        self._lock = threading.Lock()
        self._window: _Window | None = None
        self._ports: dict[int, set[int]] = {_TCP: set(), _UDP: set()}
        self._local_udp: set[tuple[str, int]] = set()
        self._tcpdump: Tcpdump | None = None

    # -------------------------------------------------------------------------------------- life cycle

    def start(self) -> None:
        """Decide the tool: tcpdump when asked for (or auto) and it captures here, else the harness."""
        if self.tool is not None:
            return
        if self.requested != "harness":
            dump = Tcpdump(self._on_frame, self.interface, self.tcpdump_path)
            try:
                dump.start()
            except CaptureUnavailable as exc:
                self.why = str(exc)
            else:
                self._tcpdump, self.tool = dump, "tcpdump"
                return
        self.tool = "harness"

    def close(self) -> None:
        """Stop tcpdump (if it runs)."""
        if self._tcpdump is not None:
            self._tcpdump.stop()
            self._tcpdump = None

    def quic_logger(self, new: Callable[[], TraceLogger]) -> TraceLogger:
        """The process's qlog logger, made by ``new`` the first time a QUIC configuration asks for it."""
        with self._lock:
            if self.logger is None:
                self.logger = new()
            return self.logger

    def begin(self, name: str) -> None:
        """Open the window of check ``name`` (a window left open is dropped)."""
        self.start()
        if self.logger is not None:
            self.logger.take()  # events between checks belong to none
        with self._lock:
            self._window = _Window(name, time.time())

    def end(self, keep: bool, stem: Path | None) -> dict[str, Any]:
        """Close the window; with ``keep`` write ``<stem>.pcap``, ``.qlog`` and ``.keys`` (those with content)
        and return the evidence entry naming them (paths relative to ``stem``'s folder)."""
        notes: list[str] = []
        complete = True
        if self._tcpdump is not None and not self._tcpdump.mark():
            complete = False
            notes.append("tcpdump had not delivered the packets up to the check's end within "
                         f"5 s{': ' + self._tcpdump.error if self._tcpdump.error else ''}; the pcap may miss "
                         "the last ones")
        with self._lock:
            window, self._window = self._window, None
            ports = {"tcp": sorted(self._ports[_TCP]), "udp": sorted(self._ports[_UDP])}
        traces = self.logger.take() if self.logger is not None else []
        entry: dict[str, Any] = {"with": self.tool, "how": self.how()}
        if self.why:
            entry["why"] = f"the harness wrote the capture: {self.why}"
        if window is None:
            return {**entry, "kept": False, "notes": ["no capture window was open for this check"]}
        if not keep or stem is None:
            return {**entry, "kept": False}
        frames = list(window.frames)
        frames += [Frame(ts, segment_frame(s)) for ts, s in window.segments]
        frames += [Frame(ts, datagram_frame(d)) for ts, d in window.datagrams]
        frames.sort(key=lambda f: f.ts)
        files: list[dict[str, Any]] = []
        stem.parent.mkdir(parents=True, exist_ok=True)
        pcap_path = stem.with_name(stem.name + ".pcap")
        if frames:
            count = write_pcap(pcap_path, frames)
            files.append({"kind": "pcap", "path": pcap_path.name, "packets": count,
                          "bytes": pcap_path.stat().st_size, "open": self.tshark_command(pcap_path.name, ports)})
        if traces:
            path = stem.with_name(stem.name + ".qlog")
            doc = {"qlog_format": "JSON", "qlog_version": QLOG_VERSION, "title": window.name,
                   "description": "kvconform: the harness's QUIC connections during this check", "traces": traces}
            path.write_text(json.dumps(doc, default=repr) + "\n", "utf-8")
            files.append({"kind": "qlog", "path": path.name, "traces": len(traces), "bytes": path.stat().st_size})
            lines = self.keylog.lines()
            if lines:
                path = stem.with_name(stem.name + ".keys")
                path.write_text("".join(line + "\n" for line in lines), "utf-8")
                files.append({"kind": "keylog", "path": path.name, "lines": len(lines)})
                if frames:
                    files[0]["open"] += f" -o tls.keylog_file:{path.name}"
        if window.dropped:
            complete = False
            notes.append(f"{window.dropped} frames past the {WINDOW_LIMIT >> 20} MiB a check's capture holds "
                         "were not kept")
        if not files:
            notes.append("nothing crossed a socket the capture watches during this check")
        return {**entry, "kept": True, "files": files, "ports": ports, "complete": complete,
                "notes": notes}

    @staticmethod
    def tshark_command(pcap: str, ports: dict[str, list[int]]) -> str:
        """How to read the pcap: the tl.kv.v1 endpoints' ports decoded as HTTP/2 (gRPC follows from it)."""
        return " ".join(["tshark", "-r", pcap, *(f"-d tcp.port=={port},http2" for port in ports["tcp"])])

    def how(self) -> str:
        """One line saying how the pcap was taken."""
        if self.tool == "tcpdump":
            return (f"tcpdump -i {self.interface} 'tcp or udp', the frames of this check's time window to or from "
                    "the harness's endpoints (ports); endpoints off loopback through the harness's relay")
        return ("written by the harness from its sockets: a TCP relay in front of each tl.kv.v1 endpoint (both "
                "directions, synthesised TCP/IP headers) and the datagrams its QUIC sockets sent and received")

    # ------------------------------------------------------------------------------------------ hooks

    def in_python(self, host: str) -> bool:
        """Whether traffic to or from ``host`` must be recorded by the harness (tcpdump does not see it)."""
        self.start()
        return self.tool != "tcpdump" or not is_loopback(host)

    def watch(self, proto: str, port: int) -> None:
        """tcpdump keeps frames to or from ``port`` (proto "tcp" or "udp")."""
        with self._lock:
            self._ports[_TCP if proto == "tcp" else _UDP].add(int(port))

    def local_udp(self, address: tuple[str, int]) -> None:
        """A harness UDP socket whose sends are recorded: its datagrams are not recorded again when received."""
        with self._lock:
            self._local_udp.add(address)

    def record_segments(self, segments: list[Segment]) -> None:
        """Segments of a relayed TCP connection (relay threads, each holding its flow's lock: the times follow the
        order the segments were made in, so no segment acknowledges bytes the pcap shows later)."""
        with self._lock:
            now = time.time()
            window = self._window
            if window is None:
                return
            for segment in segments:
                if window.room(len(segment.payload) + 54):
                    window.segments.append((now, segment))

    def record_datagram(self, datagram: Datagram, received: bool = False) -> None:
        """A datagram a recording harness socket sent, or received from a socket that does not record."""
        with self._lock:
            now = time.time()
            window = self._window
            if window is None or (received and datagram.src in self._local_udp):
                return
            if window.room(len(datagram.payload) + 42):
                window.datagrams.append((now, datagram))

    def _on_frame(self, frame: Frame) -> None:
        ports = frame_ports(frame.data)
        if ports is None:
            return
        proto, sport, dport = ports
        with self._lock:
            window = self._window
            if window is None or frame.ts < window.begin:
                return
            watched = self._ports[proto]
            if (sport in watched or dport in watched) and window.room(len(frame.data)):
                window.frames.append(frame)
