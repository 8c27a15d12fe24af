"""Fixtures of the interop lane: docker, the aiomoqt image, aiomoqt's relay, our relay, aiomoqt's client, and
moq-rs's relay (a host process of .venv-moqrs, tests/interop/moqrs_peers.py).

The lane runs only when selected with ``-m interop`` (``.ci/interop``, ``tox -e interop``): otherwise its
tests are deselected, so the README's plain ``pytest`` neither starts containers nor runs them twice in
CI. Selected on a machine without docker (no SDK, no daemon, no image and no way to build one), every test
ends inconclusive with the reason.
"""

from __future__ import annotations

from collections.abc import Callable, Generator, Iterator
from pathlib import Path

import pytest

from kvconform import evidence
from kvconform.targets import docker as dk
from kvconform.targets.testbed import Testbed
from kvconform.verdicts import TargetUnavailable, inconclusive
from tests.lanes import deselect_lane

from .moqrs_peers import moqrs_problem, moqrs_relay, moqrs_testbed
from .peers import (
    RelayEndpoint,
    aiomoqt_relay,
    aiomoqt_testbed,
    our_relay,
    run_aiomoqt_client,
)
from .tap import TapPoint

IMAGE_TIMEOUT_S = 600.0
_OUTCOME = pytest.StashKey[str]()


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    deselect_lane(config, items, Path(__file__).parent)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Generator[
        None, pytest.TestReport, pytest.TestReport]:
    """With --kvconform-report-dir, keep each lane test's transcript (container output, wire bytes, TAP points) as
    ``<report-dir>/evidence/<test>.json``: the plugin writes evidence only for requirement-citing checks,
    and lane tests cite none (they judge a third-party peer, and must not gate without docker)."""
    report = yield
    if not item.get_closest_marker("interop") or item.get_closest_marker("req"):
        return report
    if report.when == "call" or (report.when == "setup" and report.outcome != "passed"):
        item.stash[_OUTCOME] = "xfail" if hasattr(report, "wasxfail") else report.outcome
    report_dir = item.config.getoption("kvconform_report_dir", None)
    transcript = evidence.current()
    if report.when == "teardown" and report_dir and transcript is not None:
        bundle = {"nodeid": item.nodeid, "outcome": item.stash.get(_OUTCOME, "unknown"),
                  "events": transcript.as_list()}
        path = evidence.write_evidence(evidence.evidence_path(report_dir, item.nodeid), bundle,
                                       transcript.side_bytes())
        report.user_properties.append(("kvconform.evidence", str(path)))
    return report


@pytest.fixture(scope="session")
def interop_testbed() -> Testbed:
    return aiomoqt_testbed()


@pytest.fixture(scope="session")
def docker_images(interop_testbed: Testbed) -> list[str]:
    """The docker daemon answers and the testbed's images exist (built here when missing, bounded)."""
    problem = dk.docker_problem()
    if problem:
        inconclusive(f"docker is not available: {problem}")
    try:
        return dk.prepare_images(interop_testbed, IMAGE_TIMEOUT_S)
    except TargetUnavailable as exc:
        inconclusive(f"the aiomoqt image cannot be made: {exc}")


@pytest.fixture(scope="module")
def aiomoqt_relay_endpoint(docker_images: list[str], interop_testbed: Testbed) -> Iterator[RelayEndpoint]:
    """aiomoqt's relay, one container per test module."""
    try:
        with aiomoqt_relay(interop_testbed) as endpoint:
            yield endpoint
    except TargetUnavailable as exc:
        inconclusive(f"aiomoqt relay: {exc}")


@pytest.fixture(scope="module")
def our_relay_endpoint(interop_testbed: Testbed) -> Iterator[RelayEndpoint]:
    """``kvconform serve moqt-relay``, one process per test module."""
    try:
        with our_relay(interop_testbed) as endpoint:
            yield endpoint
    except TargetUnavailable as exc:
        inconclusive(f"our relay: {exc}")


@pytest.fixture
def aiomoqt_client(docker_images: list[str], interop_testbed: Testbed) -> Callable[[str, str], TapPoint]:
    """``aiomoqt_client(testcase, relay_url)``: one moq-interop-runner case of aiomoqt's client, in docker."""

    def run(testcase: str, relay_url: str) -> TapPoint:
        return run_aiomoqt_client(interop_testbed, testcase, relay_url)

    return run


@pytest.fixture(scope="session")
def moqrs_bed() -> Testbed:
    """The moq-rs testbed, once its environment (.venv-moqrs) imports moq-rs."""
    problem = moqrs_problem()
    if problem:
        inconclusive(f"moq-rs is not available: {problem}")
    return moqrs_testbed()


@pytest.fixture(scope="module")
def moqrs_relay_endpoint(moqrs_bed: Testbed) -> Iterator[RelayEndpoint]:
    """moq-rs's relay (moq.Server), one process per test module."""
    try:
        with moqrs_relay(moqrs_bed) as endpoint:
            yield endpoint
    except TargetUnavailable as exc:
        inconclusive(f"moq-rs relay: {exc}")
