"""Drivers of the ``kvcs-publisher`` role: an Original Publisher the harness (playing the relay) points
at its own relay URL with a cache spec and the scope's token.

- ``reference``: kvconform's publisher (``kvconform.kvcs.publisher.KvcsPublisher``), in-process on its own
  thread and event loop (``serve_publisher``);
- ``python:<module>:<attr>``: an object implementing ``PublisherDriver``, or a ``KvcsPublisher`` subclass (the
  mutant publishers) run the same way;
- ``cmd:<template>``: a spawned publisher; placeholders ``{relay}`` (moqt://127.0.0.1:PORT), ``{cache}``
  (the cache spec JSON) and ``{token}`` (the scope token, UTF-8 text). It must publish the cache and keep
  serving until SIGTERM, e.g. ``cmd:kvconform serve kvcs-publisher --relay {relay} --cache {cache}
  --token {token}``. Its stdout and stderr are kept for the evidence.

Every driver is started once per publication and always stopped: ``stop()`` is bounded (SIGTERM, then
SIGKILL for a spawned one and everything it started) and returns what the publisher printed.
"""

from __future__ import annotations

import io
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from kvconform.kvcs.content import CacheSpec
from kvconform.kvcs.errors import KvcsError
from kvconform.kvcs.publisher import KvcsPublisher, serve_publisher
from kvconform.moqt.quic import tapping
from kvconform.targets.kvcs.send_schedule import ScheduleRecorder, SendSchedule
from kvconform.targets.process import Handle, Launcher, as_launcher
from kvconform.verdicts import TargetUnavailable

__all__ = ["SUITE", "CmdPublisher", "InProcessPublisher", "PublisherDriver", "PublisherExit", "adapt_publisher",
           "reference_publisher"]

SUITE = "kvcs-publisher"
STOP_TIMEOUT = 5.0  # seconds a publisher gets to stop after SIGTERM / its stop event
OUTPUT_TAIL = 4000  # characters of a publisher's output kept for the evidence


@dataclass(frozen=True)
class PublisherExit:
    """How a publisher run ended: exit status (None: still running when abandoned), what it printed."""

    code: int | None
    stdout: str
    stderr: str


@runtime_checkable
class PublisherDriver(Protocol):
    """kvcs-publisher: start a publisher against a relay URL with a cache spec and a token; stop it."""

    def start(self, relay_url: str, cache: Path, token: str) -> None:
        """Start publishing (returns at once; the harness watches the relay for the publication)."""
        ...

    def running(self) -> bool:
        """False once the publisher has exited (it must keep serving until stopped)."""
        ...

    def stop(self) -> PublisherExit:
        """Stop it (bounded) and return how it ended."""
        ...


class InProcessPublisher:
    """A ``KvcsPublisher`` (sub)class served by ``serve_publisher`` on a thread of this process. Its session's
    writes are recorded in the order it issued them (``send_schedule``: what KVCS-GROUP-ORDER is judged on)."""

    def __init__(self, publisher_class: type[Any], **options: Any) -> None:
        self.publisher_class = publisher_class
        self.options = options  # KvcsPublisher keyword arguments (kv_track, layer_interval, ...)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._out = io.StringIO()
        self._err = io.StringIO()
        self._code: int | None = None
        self._schedule = ScheduleRecorder()

    def send_schedule(self) -> SendSchedule:
        """The publisher's data-stream writes so far, in the order its session issued them."""
        return self._schedule.snapshot()

    def start(self, relay_url: str, cache: Path, token: str) -> None:
        try:
            spec = CacheSpec.load(cache)
            publisher = self.publisher_class(spec, **self.options)
        except (KvcsError, ValueError, TypeError) as exc:
            raise TargetUnavailable(f"{self.publisher_class.__name__} cannot be set up for {cache}: {exc}") from exc

        def serve() -> None:
            try:
                with tapping(self._schedule.tap):  # this thread's loop and connection only
                    self._code = serve_publisher(relay_url, spec, token.encode("utf-8"), self._stop,
                                                 publisher=publisher, out=self._out)
            except Exception as exc:  # a crashing publisher is a finding: keep what it said
                self._err.write(f"{type(exc).__name__}: {exc}\n")
                self._code = 1

        self._thread = threading.Thread(target=serve, name=f"kvcs-publisher-{self.publisher_class.__name__}",
                                        daemon=True)
        self._thread.start()

    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def stop(self) -> PublisherExit:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(STOP_TIMEOUT)
            if self._thread.is_alive():
                self._err.write(f"did not stop within {STOP_TIMEOUT} s of its stop event\n")
        return PublisherExit(self._code, self._out.getvalue()[-OUTPUT_TAIL:], self._err.getvalue()[-OUTPUT_TAIL:])


class CmdPublisher:
    """A spawned publisher, run by ``kvconform.targets.process`` (its own session, so SIGTERM reaches a wrapper's
    children too; output to files; the whole group and anything that escaped it stopped at the end), or by any
    ``Launcher`` of the same contract (a docker image)."""

    def __init__(self, template: str | Launcher) -> None:
        self.launcher = as_launcher(template)
        self._proc: Handle | None = None

    def start(self, relay_url: str, cache: Path, token: str) -> None:
        self._proc = self.launcher.launch({"relay": relay_url, "cache": str(cache), "token": token}, "publisher")
        self._proc.start()

    def running(self) -> bool:
        return self._proc is not None and self._proc.running()

    def stop(self) -> PublisherExit:
        if self._proc is None:
            return PublisherExit(None, "", "")
        result = self._proc.stop()
        self._proc = None
        return PublisherExit(result.returncode, result.stdout_text[-OUTPUT_TAIL:], result.stderr_text[-OUTPUT_TAIL:])


def reference_publisher(**options: Any) -> InProcessPublisher:
    """The reference publisher, in-process; ``options`` are KvcsPublisher keyword arguments (e.g. kv_track)."""

    return InProcessPublisher(KvcsPublisher, **options)


def adapt_publisher(obj: object, **options: Any) -> InProcessPublisher | None:
    """A ``python:`` target that is a ``KvcsPublisher`` subclass (a mutant) runs like the reference."""

    if isinstance(obj, type) and issubclass(obj, KvcsPublisher):
        return InProcessPublisher(obj, **options)
    return None
