"""Sanity: aiomoqt's own client through aiomoqt's own relay, every test case the client declares.

This is the baseline the cross tests are read against: a case that fails here says nothing about
kvconform (the peer or its container set-up is broken), and one that passes here but fails against our
relay points at one of the two sides (docs/interop-aiomoqt.md records which).
"""

from __future__ import annotations

from collections.abc import Callable

import pytest

from .peers import RelayEndpoint, aiomoqt_testcases
from .tap import TapPoint

pytestmark = pytest.mark.interop


@pytest.mark.parametrize("testcase", aiomoqt_testcases())
def test_aiomoqt_client_through_aiomoqt_relay(testcase: str, aiomoqt_relay_endpoint: RelayEndpoint,
                                              aiomoqt_client: Callable[[str, str], TapPoint]) -> None:
    point = aiomoqt_client(testcase, aiomoqt_relay_endpoint.url)
    assert point.ok and not point.compat and not point.skipped, point.describe()
    sessions = point.diagnostics.get("sessions", {})
    alpns = {meta.get("alpn") for meta in sessions.values() if isinstance(meta, dict)}
    # Pinned to draft-22: every session the case opened negotiated ALPN moqt-22.
    assert alpns <= {"moqt-22"}, f"{testcase}: sessions negotiated {alpns}, expected moqt-22 only"
