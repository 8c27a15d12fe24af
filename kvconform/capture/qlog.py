"""The qlog of the harness's QUIC connections during a check (aioquic's ``QuicLogger``).

``TraceLogger``: an aioquic ``QuicLogger`` whose traces keep their events until the capture takes the ones of a
check (and drops the rest), so a connection that outlives a check (a session-scoped relay's) costs memory for one
check at a time; a check's qlog holds every trace that logged an event during it. The QUIC adapter
(kvconform.moqt.quic) hands this class to the capture when it builds its first configuration, so a run without
QUIC never imports aioquic for its capture.
"""

from __future__ import annotations

import threading
import time
from typing import Any

from aioquic.quic.logger import QuicLogger, QuicLoggerTrace

__all__ = ["Trace", "TraceLogger"]


class Trace(QuicLoggerTrace):
    """A qlog trace whose events the capture takes per check."""

    def __init__(self, *, is_client: bool, odcid: bytes, lock: threading.Lock) -> None:
        super().__init__(is_client=is_client, odcid=odcid)
        self._lock = lock
        self.pending: list[dict[str, Any]] = []
        self.ended = False

    def log_event(self, *, category: str, event: str, data: dict[str, Any]) -> None:
        entry = {"data": data, "name": f"{category}:{event}", "time": self.encode_time(time.time())}
        with self._lock:
            self.pending.append(entry)

    def take(self) -> list[dict[str, Any]]:
        """The events logged since the last take."""
        with self._lock:
            events, self.pending = self.pending, []
        return events

    def header(self) -> dict[str, Any]:
        """The trace without its events (qlog 0.3: common_fields, vantage_point)."""
        out = super().to_dict()
        out.pop("events", None)
        return out


class TraceLogger(QuicLogger):
    """The capture's QuicLogger: one for the process, every harness QuicConfiguration points at it."""

    def __init__(self) -> None:
        super().__init__()
        self._lock = threading.Lock()
        self.traces: list[Trace] = []

    def start_trace(self, is_client: bool, odcid: bytes) -> QuicLoggerTrace:
        trace = Trace(is_client=is_client, odcid=odcid, lock=self._lock)
        with self._lock:
            self.traces.append(trace)
        return trace

    def end_trace(self, trace: QuicLoggerTrace) -> None:
        if isinstance(trace, Trace):
            trace.ended = True

    def take(self) -> list[dict[str, Any]]:
        """Each trace with the events logged since the last take (traces without any left out); ended traces
        are forgotten."""
        with self._lock:
            traces = list(self.traces)
            self.traces = [t for t in traces if not t.ended]
        out = []
        for trace in traces:
            events = trace.take()
            if events:
                out.append({**trace.header(), "events": events})
        return out
