"""The caching MOQT draft-22 relay (EDR "Relays", moqt-d22-profile sections 11 and 12).

A sans-I/O core and a thin asyncio adapter, one concept per module:

* ``state``: sessions, tracks, upstream and downstream subscriptions, the relay's own FETCHes, counters (plain
  data);
* ``authorization``: tokens and Token Aliases against the ``Policy`` (section 3.6);
* ``aggregation``: SUBSCRIBE aggregated onto one upstream subscription per publisher, upstream choice,
  RENDEZVOUS_TIMEOUT, PUBLISH;
* ``namespaces``: PUBLISH_NAMESPACE, SUBSCRIBE_NAMESPACE, NAMESPACE / NAMESPACE_DONE;
* ``planning``: what a fill or FETCH covers, from cache or upstream, in what order;
* ``fetching``: a standalone FETCH as a core job (from cache or cut through from upstream, FILL_TIMEOUT);
* ``forwarding``: objects cached and forwarded stream for stream; subscriptions ending;
* ``core``: ``RelayCore`` joining them, events and ``now`` in, session commands and adapter hooks out
  (``hooks``);
* ``adapter``: ``Relay``, the core on asyncio and QUIC (tasks, sockets, timers, bounded waits);
* ``serve``: ``run_relay`` and ``load_relay_class`` for ``kvconform serve moqt-relay``.

Use in-process::

    async with Relay(policy=load_policy("policy.yaml")) as relay:   # 127.0.0.1, a free port
        url = relay.url                                             # moqt://127.0.0.1:PORT
"""

from __future__ import annotations

from kvconform.moqt.relay.adapter import Relay
from kvconform.moqt.relay.core import RelayCore
from kvconform.moqt.relay.serve import load_relay_class, run_relay
from kvconform.moqt.relay.state import (
    DEFAULT_CACHE_BYTES,
    DEFAULT_FILL_TIMEOUT_MS,
    Downstream,
    FetchJob,
    FetchWait,
    FillJob,
    InStream,
    Peer,
    Refusal,
    RelayCounters,
    Track,
    TrackCounters,
    Upstream,
    UpstreamFetch,
)

_Refusal = Refusal  # the name mutants and targets import

__all__ = [
    "DEFAULT_CACHE_BYTES",
    "DEFAULT_FILL_TIMEOUT_MS",
    "Downstream",
    "FetchJob",
    "FetchWait",
    "FillJob",
    "InStream",
    "Peer",
    "Refusal",
    "Relay",
    "RelayCore",
    "RelayCounters",
    "Track",
    "TrackCounters",
    "Upstream",
    "UpstreamFetch",
    "load_relay_class",
    "run_relay",
]
