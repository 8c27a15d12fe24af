"""tcpdump on loopback as a stream of frames, with marks that tell when every packet up to now has been read.

One tcpdump runs per harness process (started on the first captured check, stopped at the end), writing pcap to a
pipe (``-w - -U --immediate-mode``); a reader thread hands each frame to a callback. A check's capture ends with
``mark()``: a UDP datagram from the mark socket to itself, and a bounded wait until the reader has seen it, so every
packet the check caused before that instant is in hand without sleeping. Starting tcpdump per check would cost about
80 ms each (its start-up until "listening on"), more than a whole tlkv-decode check.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import socket
import subprocess
import threading
from collections.abc import Callable
from typing import IO

from kvconform.capture.pcap import Frame, PcapFormatError, frame_ports, read_pcap_stream, udp_payload

__all__ = ["CaptureUnavailable", "Tcpdump"]

START_TIMEOUT = 5.0  # tcpdump prints "listening on" within ~0.1 s; a loaded CI machine gets 50x that
STOP_TIMEOUT = 5.0
MARK_TIMEOUT = 5.0
_MAGIC = b"kvconform-capture-mark "
BUFFER_KIB = 32768  # kernel capture buffer: a 12 MiB gRPC push arrives faster than a pipe reader can keep up


class CaptureUnavailable(Exception):
    """tcpdump cannot capture here (not installed, not permitted, the interface is missing); the text says why."""


class Tcpdump:
    """``tcpdump -i <interface>`` of TCP and UDP as frames for ``on_frame`` (called on the reader thread)."""

    def __init__(self, on_frame: Callable[[Frame], None], interface: str = "lo",
                 executable: str | None = None) -> None:
        self.on_frame = on_frame
        self.interface = interface
        self.executable = executable or shutil.which("tcpdump")
        self._proc: subprocess.Popen[bytes] | None = None
        self._ready = threading.Event()
        self._stderr: list[str] = []
        self._cond = threading.Condition()
        self._seen_marks: set[bytes] = set()
        self._ended = False
        self.error: str | None = None  # set when the reader stopped before stop(): tcpdump died or wrote garbage
        self._mark = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self._mark.bind(("127.0.0.1", 0))
        self._mark.setblocking(False)
        self.mark_port = int(self._mark.getsockname()[1])
        self._threads: list[threading.Thread] = []

    def command(self) -> list[str]:
        """The command line (tcpdump drops root privileges to its own user after opening the device)."""
        assert self.executable is not None
        return [self.executable, "-i", self.interface, "-y", "EN10MB", "-n", "-U", "--immediate-mode",
                "-B", str(BUFFER_KIB), "-s", "0", "-w", "-", "tcp or udp"]

    def start(self, timeout: float = START_TIMEOUT) -> None:
        """Start tcpdump and wait (bounded) until it captures; CaptureUnavailable when it cannot."""
        if self.executable is None:
            raise CaptureUnavailable("tcpdump: not found on PATH")
        try:
            self._proc = subprocess.Popen(self.command(), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                          stderr=subprocess.PIPE, start_new_session=True)
        except OSError as exc:
            raise CaptureUnavailable(f"tcpdump: cannot start {self.executable}: {exc.strerror or exc}") from None
        assert self._proc.stdout is not None and self._proc.stderr is not None
        for name, body, stream in (("stderr", self._read_stderr, self._proc.stderr),
                                   ("frames", self._read_frames, self._proc.stdout)):
            thread = threading.Thread(target=body, args=(stream,), name=f"tcpdump-{name}", daemon=True)
            thread.start()
            self._threads.append(thread)
        if not self._ready.wait(timeout) or self._proc.poll() is not None:
            said = " ".join(line.strip() for line in self._stderr[-3:]) or "nothing"
            self.stop()
            raise CaptureUnavailable(f"tcpdump on {self.interface}: did not start capturing within {timeout:g} s "
                                     f"(it said: {said})")

    def _read_stderr(self, stream: IO[bytes]) -> None:
        for raw in iter(stream.readline, b""):
            line = raw.decode("utf-8", "replace")
            self._stderr.append(line)
            if line.startswith("tcpdump: listening on") or line.startswith("listening on"):
                self._ready.set()
        self._ready.set()  # it exited: wake start(), which then sees poll() is not None

    def _read_frames(self, stream: IO[bytes]) -> None:
        try:
            for frame in read_pcap_stream(stream):  # type: ignore[arg-type]
                ports = frame_ports(frame.data)
                # a mark is a datagram a capture's socket sends itself: ours or another capture's on this host
                # (tests and runs capture loopback side by side), never traffic under test
                if ports is not None and ports[0] == 17 and ports[1] == ports[2]:
                    payload = udp_payload(frame.data) or b""
                    if payload.startswith(_MAGIC):
                        if ports[2] == self.mark_port:
                            with self._cond:
                                self._seen_marks.add(payload)
                                self._cond.notify_all()
                        continue
                self.on_frame(frame)
        except (PcapFormatError, OSError, ValueError) as exc:
            self.error = f"tcpdump's output could not be read: {exc}"
        finally:
            with self._cond:
                self._ended = True
                self._cond.notify_all()

    def mark(self, timeout: float = MARK_TIMEOUT) -> bool:
        """Send a mark and wait until the reader has read it: every frame captured before is then delivered.
        False when it did not arrive within ``timeout`` (or tcpdump is gone)."""
        token = _MAGIC + secrets.token_hex(8).encode()
        try:
            self._mark.sendto(token, ("127.0.0.1", self.mark_port))
        except OSError:
            return False
        with self._cond:
            seen = self._cond.wait_for(lambda: token in self._seen_marks or self._ended, timeout)
            ok = seen and token in self._seen_marks
            self._seen_marks.discard(token)
        with contextlib.suppress(OSError):  # the marks also reach the socket itself: drain them
            while True:
                self._mark.recv(2048)
        return ok

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None and not self._ended

    def stop(self, timeout: float = STOP_TIMEOUT) -> None:
        """Stop tcpdump (SIGTERM, then SIGKILL past ``timeout``) and join the readers."""
        proc = self._proc
        if proc is not None and proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                proc.terminate()
            try:
                proc.wait(timeout)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, 9)
                proc.wait(timeout)
        for thread in self._threads:
            thread.join(timeout)
        if proc is not None:
            for stream in (proc.stdout, proc.stderr):
                if stream is not None:
                    stream.close()
        self._mark.close()
