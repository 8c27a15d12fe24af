"""The relay suites' shared helpers (kvconform.fixtures.moqt) that turn what happened to a scenario into what
the verdict policy judges: a stuck wait names what the harness waited for and its requirement, a session that
ended is classified (the relay stopped answering / spoke what is not MOQT / refused valid messages), the rule a
relay's undecodable bytes broke, and fetch groups written in the other order told from wrong objects."""

from __future__ import annotations

import asyncio

import pytest

from kvconform.fixtures.moqt import (
    ALPN_REQ,
    FRAMING_REQ,
    SETUP_REQ,
    RelayUnderTest,
    harness_close_requirement,
    other_order,
    relay_sanity,
    run,
    session_failure,
    waiting,
)
from kvconform.moqt import quic
from kvconform.moqt.client import RequestRejected, SessionEnded
from kvconform.moqt.data import DataStreamParser, FetchObject, FetchStreamWriter, GroupOrder
from kvconform.moqt.errors import SessionError
from kvconform.moqt.session import SessionClosed
from kvconform.moqt.structures import Location, TrackNamespace
from kvconform.targets.moqt import RelayAccess
from kvconform.verdicts import DriverError, SanityFailure, TargetUnavailable


def test_a_stuck_scenario_names_the_wait_and_its_requirement() -> None:
    async def stuck() -> None:
        with waiting("the first thing"):  # answered: a later wait is what the scenario is stuck in
            await asyncio.sleep(0)
        with waiting("PUBLISH_DONE after the duplicate", "MOQT-DATA-MALFORMED-DUPLICATE"):
            await asyncio.sleep(10)

    with pytest.raises(DriverError) as info:
        run(stuck, timeout=0.2, what="duplicate")
    assert info.value.requirement == "MOQT-DATA-MALFORMED-DUPLICATE" and not isinstance(info.value, TargetUnavailable)
    message = str(info.value)
    assert "duplicate: stuck after" in message and "waiting for PUBLISH_DONE after the duplicate" in message


def test_a_wait_whose_timeout_the_scenario_handled_names_no_later_one() -> None:
    async def scenario() -> None:
        with pytest.raises(TimeoutError), waiting("a negative observation", "MOQT-X"):
            await asyncio.wait_for(asyncio.sleep(10), 0.01)
        await asyncio.sleep(10)

    with pytest.raises(DriverError) as info:
        run(scenario, timeout=0.2, req="MOQT-CHECK")
    assert info.value.requirement == "MOQT-CHECK" and "unnamed wait" in str(info.value)


def test_a_needed_request_refused_is_a_driver_error_of_the_wait() -> None:
    async def refused() -> None:
        with waiting("SUBSCRIBE_OK", "MOQT-RELAY-SUBSCRIBE-ROUTING"):
            raise RequestRejected("Subscribe on stream 0", None, 0x0)

    with pytest.raises(DriverError, match="stream reset 0x0, although the request was valid") as info:
        run(refused)
    assert info.value.requirement == "MOQT-RELAY-SUBSCRIBE-ROUTING"


def _ended(code: int, reason: str = "", *, by_peer: bool = True, transport: bool = False,
           setup: bool = True) -> SessionEnded:
    return SessionEnded(SessionClosed(code, reason, by_peer, transport), setup_received=setup)


@pytest.mark.parametrize(("ended", "kind", "blamed"), [
    (_ended(0x3, "flow control", transport=True), TargetUnavailable, "MOQT-WAITED"),  # QUIC ended it: no answer
    (_ended(SessionError.NO_ERROR, "shutting down"), TargetUnavailable, "MOQT-WAITED"),
    (_ended(SessionError.PROTOCOL_VIOLATION, "no", setup=False), DriverError, "MOQT-WAITED"),
    (_ended(SessionError.PROTOCOL_VIOLATION, "subgroup stream 7: Object ID Delta at offset 3: ...", by_peer=False),
     DriverError, "MOQT-DATA-SUBGROUP-HEADER"),
])
def test_a_session_that_ended_is_judged_by_who_ended_it_and_how(ended: SessionEnded, kind: type,
                                                                 blamed: str) -> None:
    error = session_failure("check", ended, ("SUBSCRIBE_OK", "MOQT-WAITED"), "MOQT-CHECK")
    assert type(error) is kind and error.requirement == blamed, (error, error.requirement)


def test_a_relay_closing_before_its_setup_breaks_the_setup_exchange() -> None:
    ended = _ended(SessionError.PROTOCOL_VIOLATION, "no", setup=False)
    assert session_failure("check", ended, None, "MOQT-CHECK").requirement == SETUP_REQ
    assert session_failure("check", _ended(SessionError.PROTOCOL_VIOLATION), None, FRAMING_REQ).requirement == \
        FRAMING_REQ


@pytest.mark.parametrize(("code", "reason", "setup", "rule"), [
    (SessionError.PROTOCOL_VIOLATION, "Stream Type at offset 0: unknown unidirectional stream type 0x1b", False,
     SETUP_REQ),
    (SessionError.KEY_VALUE_FORMATTING_ERROR, "SETUP: ...", False, "MOQT-CTRL-KVP"),
    (SessionError.PROTOCOL_VIOLATION, "subgroup stream 11: Properties[0](0x1).Length at offset 7: ...", True,
     "MOQT-CTRL-KVP"),
    (SessionError.PROTOCOL_VIOLATION, "fetch stream 7: Group ID Delta at offset 9: out of range", True,
     "MOQT-FETCH-OBJECT-ENCODING"),
    (SessionError.PROTOCOL_VIOLATION, "second fill stream 19 for Request ID 0 (first: 7); one per carrying "
                                      "message (profile §11.4)", True, "MOQT-FILL-EXACTLY-ONCE"),
    (SessionError.PROTOCOL_VIOLATION, "peer reset its control stream 3 (code 0x0, profile §4.1)", True, SETUP_REQ),
    (SessionError.INVALID_REQUEST_ID, "Request ID 2 ...", True, "MOQT-CTRL-REQUEST-ID-SEQUENCE"),
    (SessionError.INVALID_PATH, "SETUP.PATH sent by the server", True, "MOQT-SETUP-PATH"),
    (SessionError.PROTOCOL_VIOLATION, "request stream 4: REQUEST_OK.Parameters[1].Type Delta at offset 9: second "
                                      "LARGEST_OBJECT, which is not repeatable", True, "MOQT-PARAM-ASCENDING"),
    (SessionError.PROTOCOL_VIOLATION, "request stream 4: Message Length ...", True, FRAMING_REQ),
])
def test_the_rule_undecodable_relay_bytes_broke(code: int, reason: str, setup: bool, rule: str) -> None:
    assert harness_close_requirement(code, reason, setup) == rule


@pytest.mark.parametrize("requested", [GroupOrder.ASCENDING, GroupOrder.DESCENDING])
def test_groups_written_in_the_other_order_are_told_from_other_objects(requested: int) -> None:
    """A relay encodes the objects with the other order's Group ID Deltas: the harness, decoding with the order
    it requested, reads other groups; ``other_order`` gives back those the relay meant."""
    written = GroupOrder.DESCENDING if requested == GroupOrder.ASCENDING else GroupOrder.ASCENDING
    meant = [Location(10, 0), Location(10, 1), Location(12, 0), Location(13, 4), Location(13, 5), Location(17, 0)]
    if written == GroupOrder.DESCENDING:
        meant = sorted(meant, key=lambda loc: (-loc.group, loc.object))
    writer = FetchStreamWriter(9, written)
    data = writer.header() + b"".join(writer.object(FetchObject(loc.group, loc.object, b"x", 0, 128, None))
                                      for loc in meant)
    parser = DataStreamParser(group_order=requested)
    decoded = [item.location for item in parser.feed(data) if isinstance(item, FetchObject)]
    assert decoded != meant and other_order(decoded, requested) == meant


def test_a_relay_of_another_draft_is_one_line_naming_what_was_offered_and_chosen() -> None:
    """A relay that selects another ALPN (here: none of the harness's) fails the first check on MOQT-SETUP-ALPN;
    every later check is inconclusive with the same line, so the run shows one cause, not one per check."""
    loop = quic.LoopThread()

    async def handler(connection: quic.MoqtConnection) -> None:
        await connection.wait_closed(timeout=30.0)

    async def start() -> quic.MoqtServer:
        return await quic.serve("127.0.0.1", 0, handler, alpn=("moqt-20",))

    srv = loop.run(start())
    try:
        relay = RelayUnderTest(srv.url, RelayAccess(False, TrackNamespace.of("kvcs-1"), {}), "url")
        sanity = relay_sanity(srv.url, [relay], session_seed=7)
        with pytest.raises(SanityFailure) as first:
            sanity.before()
        assert first.value.requirement == ALPN_REQ
        assert "offered 'moqt-22'" in str(first.value) and "selected none of them" in str(first.value)
        later = []
        for _ in range(2):
            with pytest.raises(pytest.skip.Exception) as skipped:
                sanity.before()
            later.append(str(skipped.value))
        assert later[0] == later[1] and "offered 'moqt-22'" in later[0] and "probe" not in later[0].split("ALPN")[1]
    finally:
        loop.run(srv.close())
        loop.close()
