"""The driver registry (targets/registry.py): one table of roles, the same rules for every lane."""

from __future__ import annotations

from typing import Any

import pytest

from kvconform.targets import registry
from kvconform.targets.drivers import driver_for
from kvconform.targets.registry import ROLES, RoleError, cmd_roles
from kvconform.targets.spec import TargetError, parse_target
from kvconform.targets.testbed import load_testbed
from kvconform.verdicts import TargetUnavailable


@pytest.mark.parametrize("suite", sorted(registry.suite_roles()))
def test_every_role_resolves_its_reference_and_names_real_objects(suite: str) -> None:
    role = ROLES[suite]
    assert role.interface is not None
    protocol = registry.load_ref(role.interface)
    for ref in (role.reference, role.url, role.cmd, role.adapt, role.verbs):
        if ref is not None:
            assert callable(registry.load_ref(ref)), ref
    driver = driver_for(suite, parse_target("reference", load_testbed()))
    assert isinstance(driver, protocol), f"{suite}: the reference driver does not implement {role.interface}"


class _Writer:
    """An object implementing the tlkv-writer Protocol without subclassing anything of kvconform."""

    def export(self, geometry: Any, version: int, tokens: Any, kv: Any) -> bytes:
        return b""


WRITER_OBJECT = _Writer()


def make_writer() -> _Writer:
    return _Writer()


class NotAWriter:
    pass


def test_python_targets_are_objects_or_factories_of_the_role_protocol() -> None:
    bed = load_testbed()
    for ref in ("WRITER_OBJECT", "make_writer", "_Writer"):
        driver = driver_for("tlkv-writer", parse_target(f"python:tests.test_registry:{ref}", bed))
        assert isinstance(driver, _Writer)
    with pytest.raises(TargetUnavailable, match="NotAWriter does not implement Writer"):
        driver_for("tlkv-writer", parse_target("python:tests.test_registry:NotAWriter", bed))
    with pytest.raises(TargetUnavailable, match="cannot import"):
        driver_for("tlkv-writer", parse_target("python:tests.test_registry:Missing", bed))


def test_reference_subclasses_run_like_the_reference() -> None:
    from kvconform.targets.kvcs.consumer import InProcessConsumer
    from kvconform.targets.kvcs.publisher import InProcessPublisher
    from kvconform.targets.moqt import InProcessRelay

    bed = load_testbed()
    cases = [("moqt-relay", "kvconform.moqt.relay:Relay", InProcessRelay),
             ("kvcs-relay", "kvconform.moqt.relay:Relay", InProcessRelay),
             ("kvcs-publisher", "kvconform.kvcs.publisher:KvcsPublisher", InProcessPublisher),
             ("kvcs-consumer", "kvconform.kvcs.consumer:Consumer", InProcessConsumer)]
    for suite, ref, kind in cases:
        assert isinstance(driver_for(suite, parse_target(f"python:{ref}", bed)), kind)
    with pytest.raises(TargetUnavailable, match="its factory raised TypeError"):
        driver_for("kvcs-consumer", parse_target("python:kvconform.kvcs.publisher:KvcsPublisher", bed))


@pytest.mark.parametrize(("template", "roles"), [
    ("w --sequence {sequence} --out {out}", {"tlkv-writer"}),
    ("r --envelope {envelope} --pool {pool} --versions {versions} --out {out}", {"tlkv-reader"}),
    ("r {envelope} {out}", {"tlkv-reader"}),
    ("p --decode {decode_addr} --sequence {sequence}", {"tlkv-prefill"}),
    ("srv --listen 127.0.0.1:{port}", {"tlkv-decode"}),
    ("pub --relay {relay} --cache {cache} --token {token}", {"kvcs-publisher"}),
    ("pub --relay {relay} --cache {cache}", {"kvcs-publisher"}),
    ("c --relay {relay} --relay {relay2} --cache {cache} --out {out} --budget {budget}", {"kvcs-consumer"}),
    ("lit '{{not a placeholder}}' {sequence} {out}", {"tlkv-writer"}),
])
def test_cmd_templates_play_the_role_their_placeholders_name(template: str, roles: set[str]) -> None:
    assert cmd_roles(template) == roles


@pytest.mark.parametrize(("template", "why"), [
    ("tool --in {sequnce} --out {out}", "plays no role"),
    ("tool --quiet", "plays no role"),
    ("tool {sequence} {out} {decode_addr}", "plays no role"),
    ("tool 'unbalanced {sequence} {out}", "No closing quotation"),
    ("tool {sequence {out}", "expected '}'"),
    ("tool {sequence!r} {out}", "not a plain"),
])
def test_bad_cmd_templates_are_usage_errors(template: str, why: str) -> None:
    with pytest.raises(RoleError, match=why):
        cmd_roles(template)
    with pytest.raises(TargetError, match=why):
        parse_target(f"cmd:{template}", load_testbed())


def test_a_target_that_cannot_play_a_suite_is_unavailable_not_a_verdict() -> None:
    bed = load_testbed()
    with pytest.raises(TargetUnavailable, match="cannot play tlkv-reader"):
        driver_for("tlkv-reader", parse_target("cmd:w --sequence {sequence} --out {out}", bed))
    with pytest.raises(TargetUnavailable, match="cannot play kvcs-publisher"):
        driver_for("kvcs-publisher", parse_target("moqt://127.0.0.1:4443", bed))
    with pytest.raises(TargetUnavailable, match="no driver for suite"):
        driver_for("nope-role", parse_target("reference", bed))
    assert registry.url_roles("grpc") == {"tlkv-decode"}
    assert registry.url_roles("moqt") == {"moqt-relay", "kvcs-relay"}
