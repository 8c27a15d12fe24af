"""Shared fixtures for the tl.kv.v1 transfer tests: a small geometry, block envelopes, a live server."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import numpy as np
import pytest

from kvconform.tlkv.decode import DecodeSide
from kvconform.tlkv.grpc_decode import DecodeServer
from tests.tlkv.helpers import GEOMETRY, Kit


@pytest.fixture
def kit() -> Kit:
    return Kit(np.random.default_rng(20240531))


@pytest.fixture
def side() -> DecodeSide:
    return DecodeSide(GEOMETRY, frozenset({1, 2}))


@pytest.fixture
def serve() -> Iterator[Callable[[DecodeSide], DecodeServer]]:
    """Start DecodeServers on 127.0.0.1:0; every one is stopped at teardown, whatever the test did."""
    servers: list[DecodeServer] = []

    def start(side: DecodeSide, **kwargs: object) -> DecodeServer:
        server = DecodeServer(side, "127.0.0.1", 0, **kwargs)  # type: ignore[arg-type]
        servers.append(server)
        server.start()
        return server

    yield start
    for server in servers:
        server.stop(0)
