"""What every concept of the relay's core shares: its state, ``now``, and the commands it gives the adapter.

The core (``RelayCore``: authorization, aggregation, namespaces, planning, forwarding) is sans-I/O. Session
events and ``now`` come in (the adapter sets ``now`` and ``wall_now`` before each call); commands go out on the
sessions (``kvconform.moqt.session.Session`` is sans-I/O too) and as the hooks below, which the asyncio adapter
(``adapter.Relay``) implements: a timer at a deadline, a deferred call, a callback once streams have left.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from kvconform.moqt.cache import FullTrackName, ObjectCache
from kvconform.moqt.parameters import FillParameters
from kvconform.moqt.policy import Policy
from kvconform.moqt.relay.state import Completion, Downstream, Peer, RelayCounters, Track, Upstream
from kvconform.moqt.session import Request
from kvconform.moqt.structures import KeyValuePair, Location, TrackNamespace

if TYPE_CHECKING:
    from kvconform.moqt.relay.state import UpstreamFetch

__all__ = ["CoreBase"]

Callback = Callable[[], None]


class CoreBase:
    """State and hooks of the core; each concept class derives from it."""

    policy: Policy
    cache: ObjectCache
    tracks: dict[FullTrackName, Track]
    peers: list[Peer]
    counters: RelayCounters
    fill_timeout_ms: int
    upstream_timeout: float
    now: float  # seconds on the cache clock's scale (MAX_CACHE_DURATION, deadlines); passed in by the adapter
    wall_now: float  # Unix seconds (token expiry); passed in by the adapter

    # -- commands to the adapter ------------------------------------------------------------------------

    def new_completion(self) -> Completion[Any]:
        """A result the adapter can wait for (``Upstream.ready``, ``UpstreamFetch.done``)."""
        raise NotImplementedError

    def set_timer(self, deadline: float, callback: Callback) -> Any:
        """Call ``callback`` (with ``now`` set) once ``now`` reaches ``deadline``; returns a handle."""
        raise NotImplementedError

    def cancel_timer(self, handle: Any) -> None:
        raise NotImplementedError

    def call_soon(self, callback: Callback) -> None:
        """Call ``callback`` after the event being handled (and what it woke) has run."""
        raise NotImplementedError

    def after_sent(self, peer: Peer, stream_ids: Sequence[int], callback: Callback, timeout: float) -> None:
        """Call ``callback`` once the data and FIN (or reset) of ``stream_ids`` have left, ``timeout`` at most."""
        raise NotImplementedError

    # -- what one concept calls of another (declared for the type checker) -------------------------------

    if TYPE_CHECKING:
        def _refuse(self, peer: Peer, req: Request, code: int, reason: str) -> None: ...

        def _require(self, peer: Peer, right: Any, namespace: TrackNamespace, params: Any) -> None: ...

        def _check_track_name(self, namespace: TrackNamespace) -> None: ...

        def publishers_for(self, namespace: TrackNamespace) -> list[Peer]: ...

        def track_for(self, namespace: TrackNamespace, name: bytes) -> Track: ...

        def open_upstream(self, source: Peer, track: Track) -> Upstream: ...

        def source_arrived(self, track: Track) -> None: ...

        def start_fill(self, ds: Downstream, request_id: int, fill: FillParameters) -> None: ...

        def track_properties(self, track: Track) -> tuple[KeyValuePair, ...]: ...

        def _learn_track(self, track: Track, props: tuple[KeyValuePair, ...], largest: Location | None) -> None: ...

        def _end_downstream(self, ds: Downstream, status: int, reason: str) -> None: ...

        def _fetch_finished(self, fetch: UpstreamFetch, ok: bool) -> None: ...

        def _fetch_progress(self, fetch: UpstreamFetch) -> None: ...

        def _answered(self, track: Track) -> Upstream | None: ...

        def upstream_answered(self, up: Upstream, answer: Any) -> None: ...
