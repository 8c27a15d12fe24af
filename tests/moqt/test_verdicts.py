"""The relay suites' verdicts on relays that misbehave outside any one requirement (issue 10): each case runs
``kvconform run`` against a relay of its own (tests/moqt/relays.py, or nothing at all) and asserts the verdict
and the blamed requirement of every check it ran.

- a relay that dies after a check: that check fails, the next ones are inconclusive until it answers again;
- a relay that speaks what is not MOQT: the first check fails, blamed on the rule it broke (the SETUP exchange,
  the framing), the next ones are inconclusive; a relay that cannot be reached at all: every check inconclusive;
- a transport failure (a reset stream, no answer, a QUIC transport close) is never an acceptable refusal;
- a failure's whole message (what was checked, seen, expected, the requirement) reaches coverage.json and the
  console.
"""

from __future__ import annotations

import socket
from pathlib import Path
from typing import Any

import pytest

from tests.mutants.runner import Run, run_suite
from tests.spawn import covering

RUN_TIMEOUT = 600.0
# one kvconform run per test, of a relay suite: mostly waiting (tests/cpu_slots.py)
pytestmark = [pytest.mark.slow, pytest.mark.idle_bound, covering(RUN_TIMEOUT)]

RELAYS = "python:tests.moqt.relays:"


def _run(suite: str, target: str, tmp_path: Path, *checks: str, pics: tuple[str, ...] = ()) -> Run:
    return run_suite(suite, target, tmp_path, checks=checks, pics=pics, testbed=None, timeout=RUN_TIMEOUT)


def _tests(run: Run) -> list[dict[str, Any]]:
    assert run.coverage, f"no coverage.json:\n{run.output}"
    tests: list[dict[str, Any]] = run.coverage["tests"]
    return tests


def _verdicts(run: Run) -> list[tuple[str, str, str | None]]:
    """(check, verdict, blamed) in the order the checks ran."""
    return [(t["nodeid"].split("::")[-1], t["verdict"], t.get("blamed")) for t in _tests(run)]


def test_a_relay_that_dies_fails_the_check_it_died_in_and_the_next_are_inconclusive(tmp_path: Path) -> None:
    """The relay dies right after serving the FETCH of the first check: that check's own exchange completed,
    so only the sanity probe after it sees the death, and the check fails blamed on its own requirement; the
    next check is inconclusive (the relay does not answer before it); once the relay is back, checks pass."""
    run = _run("moqt-relay", RELAYS + "CrashOnFetchRelay", tmp_path, "test_fetch_of_a_range_without_objects",
               "test_fetch_past_the_largest_object_is_invalid_range", "test_message_length_mismatch")
    verdicts = _verdicts(run)
    assert [v for _, v, _ in verdicts] == ["fail", "inconclusive", "pass", "pass", "pass"], (verdicts, run.output)
    died, after = _tests(run)[:2]
    assert died["blamed"] == "MOQT-FETCH-EMPTY" and "sanity probe after this check" in died["message"], died
    assert "no longer answers" in died["message"] and "crashed, hung or stopped serving" in died["message"]
    assert "since moqt/relay/test_fetch.py::test_fetch_of_a_range_without_objects" in after["message"], after
    assert run.code == 1


@pytest.mark.parametrize(("relay", "blamed"), [("GarbageSetupRelay", "MOQT-CTRL-CONTROL-STREAMS"),
                                               ("ClosingRelay", "MOQT-CTRL-FRAMING")])
def test_a_relay_speaking_garbage_fails_on_the_rule_it_broke(relay: str, blamed: str, tmp_path: Path) -> None:
    """Not 100 % inconclusive: the first check fails (the sanity probe before it got bytes that are not MOQT,
    or a session closed with PROTOCOL_VIOLATION at a valid request), blamed on that rule; the others are
    inconclusive, since the relay never serves."""
    run = _run("moqt-relay", RELAYS + relay, tmp_path, "test_fetch", "test_wire")
    verdicts = _verdicts(run)
    assert verdicts[0][1:] == ("fail", blamed), (verdicts, run.output)
    assert {v for _, v, _ in verdicts[1:]} == {"inconclusive"}, verdicts
    first = _tests(run)[0]
    assert "not MOQT" in first["message"] or "closed the session with PROTOCOL_VIOLATION" in first["message"], first
    assert all("not run: the sanity probe" in t["message"] for t in _tests(run)[1:]), _tests(run)[1:]
    assert run.code == 1


def test_the_kvcs_relay_suite_judges_a_garbage_relay_the_same_way(tmp_path: Path) -> None:
    run = _run("kvcs-relay", RELAYS + "GarbageSetupRelay", tmp_path, "test_fetch", "test_cache")
    verdicts = _verdicts(run)
    assert verdicts[0][1:] == ("fail", "MOQT-CTRL-CONTROL-STREAMS"), (verdicts, run.output)
    assert {v for _, v, _ in verdicts[1:]} == {"inconclusive"}, verdicts


def test_a_relay_that_cannot_be_reached_is_inconclusive_never_a_refusal(tmp_path: Path) -> None:
    """Nothing listens at the URL: no check was exchanged with, so none passes or fails (a refused connection
    is no REQUEST_ERROR), and the run does not end green."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    run = _run("moqt-relay", f"moqt://127.0.0.1:{port}", tmp_path, "test_authorization", "test_malformed")
    tests = _tests(run)
    assert tests and {t["verdict"] for t in tests} == {"inconclusive"}, (_verdicts(run), run.output)
    # The kernel's port-unreachable answer says nothing listens there; when its global ICMP rate limit drops it
    # (many tests dial closed ports at once), the handshake's bound runs out instead: unreachable either way.
    unreachable = ("nothing listens there", f"no QUIC handshake with the relay at moqt://127.0.0.1:{port} within")
    other = [t["message"] for t in tests if not any(u in t["message"] for u in unreachable)]
    assert not other, other
    assert run.code == 1


@pytest.mark.parametrize("relay", ["ResetRefusalRelay", "SilentRefusalRelay"])
def test_a_reset_or_silence_is_no_refusal(relay: str, tmp_path: Path) -> None:
    """The authorization checks accept only the REQUEST_ERROR codes the text names: a relay that resets the
    request stream, or never answers, instead fails each of them, blamed on its requirement."""
    run = _run("moqt-relay", RELAYS + relay, tmp_path, "test_unauthorized")
    verdicts = _verdicts(run)
    assert len(verdicts) == 4 and all(v == "fail" for _, v, _ in verdicts), (verdicts, run.output)
    assert {b for _, _, b in verdicts} == {"MOQT-AUTH-PUBLISH-NAMESPACE", "MOQT-AUTH-SUBSCRIBE", "MOQT-AUTH-FETCH",
                                          "MOQT-AUTH-SUBSCRIBE-NAMESPACE"}, verdicts
    seen = "its stream reset with INTERNAL_ERROR (0x0) and no answer" if relay == "ResetRefusalRelay" else "stuck"
    assert all(seen in t["message"] for t in _tests(run)), [t["message"] for t in _tests(run)]


def test_a_quic_transport_close_is_no_session_close(tmp_path: Path) -> None:
    """A malformed message must close the session with a MOQT session close (an application CONNECTION_CLOSE);
    a QUIC transport close carrying the same number (0x3 is FLOW_CONTROL_ERROR there) is not one."""
    run = _run("moqt-relay", RELAYS + "TransportCloseRelay", tmp_path, "test_message_length_mismatch",
               "test_unknown_message_type")
    verdicts = _verdicts(run)
    assert len(verdicts) == 6 and all(v == "fail" for _, v, _ in verdicts), (verdicts, run.output)
    assert {b for _, _, b in verdicts} == {"MOQT-CTRL-LENGTH-MISMATCH", "MOQT-CTRL-UNKNOWN-TYPE"}
    assert all("without a MOQT session close (QUIC code 0x3" in t["message"] for t in _tests(run))


def test_the_whole_message_reaches_the_report_and_the_console(tmp_path: Path) -> None:
    """A relay that accepts every PUBLISH_NAMESPACE: coverage.json (the check and the requirement's entry) and
    the console carry what was checked, the value seen, the value expected and the requirement, for every
    token tried, not the first line only."""
    run = _run("moqt-relay", "python:tests.mutants.moqt:OpenPublishNamespaceRelay", tmp_path,
               "test_unauthorized_publish_namespace_is_refused")
    (check,) = _tests(run)
    expected = [
        "MOQT-AUTH-PUBLISH-NAMESPACE: unauthorized PUBLISH_NAMESPACE: ",
        "[MOQT-AUTH-PUBLISH-NAMESPACE] PUBLISH_NAMESPACE with no token: seen accepted, expected REQUEST_ERROR "
        "UNAUTHORIZED (0x1)",
        "[MOQT-AUTH-PUBLISH-NAMESPACE] PUBLISH_NAMESPACE with outsider token: seen accepted, expected REQUEST_ERROR "
        "UNAUTHORIZED (0x1) or MALFORMED_AUTH_TOKEN (0x4)",
        "[MOQT-AUTH-PUBLISH-NAMESPACE] PUBLISH_NAMESPACE with subscriber token: seen accepted, expected "
        "REQUEST_ERROR UNAUTHORIZED (0x1)",
    ]
    assert check["verdict"] == "fail" and check["blamed"] == "MOQT-AUTH-PUBLISH-NAMESPACE", check
    for line in expected:
        assert line in check["message"], (line, check["message"])
        assert line in run.output, (line, run.output)
    entry = next(r for role in run.coverage["protocols"]["moqt"]["roles"].values() for r in role["requirements"]
                 if r["id"] == "MOQT-AUTH-PUBLISH-NAMESPACE" and r["tests"])
    assert entry["verdict"] == "fail" and all(line in entry["tests"][0]["message"] for line in expected), entry
