"""The legal-PICS grid of the relay suites (issue 10): ``kvconform run moqt-relay`` and ``kvconform run
kvcs-relay`` against the reference relay, started with the policy the harness derives from each PICS, pass at
every point; and no passing check leaves a requirement it cites unasserted ("not-reached"), so a requirement
is never reported passed by a check that did not look at it.

The points: moqt.relay.authorization true and false; tokens with and without ``expired``, as strings and as
raw bytes; a prefix of one field and of several (binary) fields; the relay options of pics-moqt.schema.json as
the reference would declare them (no check reads them: a KVCS relay needs every one it has, and a declared
"no" is no licence to skip a rule); the kvcs.relay scopes with other Scope IDs and raw-byte tokens, and with one
publisher token for both scopes.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.lanes import grid_point
from tests.moqt.suites import assert_green
from tests.mutants.runner import run_suite
from tests.spawn import covering

RUN_TIMEOUT = 600.0
# one kvconform run per test, of a relay suite: mostly waiting (tests/cpu_slots.py)
pytestmark = [pytest.mark.slow, pytest.mark.idle_bound, covering(RUN_TIMEOUT)]

_RELAY_OPTIONS = ("subscribe", "publish", "fetch", "fill", "subscribe_namespace", "track_status", "rendezvous_timeout")

MOQT_GRID: dict[str, tuple[str, ...]] = {
    "as declared": (),
    "no authorization": ("moqt.relay.authorization=false",),
    "no expired token": ("moqt.relay.tokens={publisher: grid-p, subscriber: grid-s, outsider: grid-o}",),
    "tokens as raw bytes": ("moqt.relay.tokens={publisher: {hex: '00'}, subscriber: {hex: ff01}, "
                            "outsider: {hex: 7f7f}, expired: {hex: '80'}}",),
    "prefix of one field": ("moqt.relay.prefix=[kvconform-grid]",),
    "prefix of six fields": ("moqt.relay.prefix=[grid, {hex: 00ff}, c, {hex: '80'}, e, f]",),
    "relay options as the reference has them": (
        *(f"moqt.relay.{o}=true" for o in _RELAY_OPTIONS),
        "moqt.relay.subscribe_tracks=false", "moqt.relay.forwards_publish_namespace=false"),
}

_SCOPE_C, _SCOPE_D = "00" * 15 + "01", "ff" * 16
KVCS_GRID: dict[str, tuple[str, ...]] = {
    "as declared": (),
    "other Scope IDs, raw-byte tokens": (
        f"kvcs.relay.scopes=[{{scope_id: {{hex: '{_SCOPE_C}'}}, publisher: {{hex: '01'}}, subscriber: {{hex: '02'}}}},"
        f" {{scope_id: {{hex: '{_SCOPE_D}'}}, publisher: {{hex: '03'}}, subscriber: {{hex: 'fe04'}}}}]",
        "kvcs.relay.outsider={hex: '05'}"),
    "one publisher token for both scopes": (
        f"kvcs.relay.scopes=[{{scope_id: {{hex: '{_SCOPE_C}'}}, publisher: grid-shared, subscriber: grid-c}},"
        f" {{scope_id: {{hex: '{_SCOPE_D}'}}, publisher: grid-shared, subscriber: grid-d}}]",),
}


# (requirement, check function) a passing check may leave unasserted at a grid point, and why.
UNREACHABLE: dict[str, dict[tuple[str, str], str]] = {
    "one publisher token for both scopes": {
        ("KVCS-RELAY-AUTHZ-SCOPE", "test_publish_namespace_into_another_scope_is_refused"):
            "the only token with a publish right in one scope has it in the other too: publishing across scopes "
            "with a token of the wrong scope cannot be tried",
    },
}


# The default run's sample (each point is a whole suite run, ~35 s): binary tokens and a prefix of binary fields, the
# points a relay parsing either as text would fail; "as declared" is the main job's run. The rest: tox -e grids.
MOQT_SAMPLE = {"tokens as raw bytes", "prefix of six fields"}


@pytest.mark.parametrize("point", [grid_point(p, id=p, sampled=p in MOQT_SAMPLE) for p in sorted(MOQT_GRID)])
def test_moqt_relay_passes_at_every_legal_pics_point(point: str, tmp_path: Path) -> None:
    assert_green(run_suite("moqt-relay", "reference", tmp_path, pics=MOQT_GRID[point], testbed=None,
                           timeout=RUN_TIMEOUT),
                 UNREACHABLE.get(point, {}))


@pytest.mark.parametrize("point", [grid_point(p, id=p, sampled=p != "as declared") for p in sorted(KVCS_GRID)])
def test_kvcs_relay_passes_at_every_legal_pics_point(point: str, tmp_path: Path) -> None:
    assert_green(run_suite("kvcs-relay", "reference", tmp_path, pics=KVCS_GRID[point], testbed=None,
                           timeout=RUN_TIMEOUT),
                 UNREACHABLE.get(point, {}))


def test_the_grid_leaves_the_authorization_checks_to_the_declarations(tmp_path: Path) -> None:
    """Declared authorization false: the authorization checks are not applicable (not passed, not failed)."""
    run = run_suite("moqt-relay", "reference", tmp_path, pics=MOQT_GRID["no authorization"],
                    checks=("test_unauthorized", "test_expired_token"), testbed=None, timeout=RUN_TIMEOUT)
    verdicts = {t["nodeid"].split("::")[-1]: t["verdict"] for t in run.coverage["tests"]}
    assert len(verdicts) == 5 and set(verdicts.values()) == {"not-applicable"}, (verdicts, run.output)
