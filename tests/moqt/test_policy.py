"""The relay's authorization policy: YAML + schema, prefix rights per token, refusal codes."""

from __future__ import annotations

from pathlib import Path

import pytest

from kvconform.moqt.errors import RequestErrorCode
from kvconform.moqt.policy import (
    Policy,
    PolicyError,
    Right,
    TokenKey,
    is_prefix,
    load_policy,
    policy_from_mapping,
    render_namespace,
)

EXAMPLE = Path(__file__).resolve().parents[2] / "testbeds" / "moqt-relay-policy.yaml"
SCOPE = bytes.fromhex("6d1c6481cd428737da312c089db3832a")
OTHER_SCOPE = bytes(16)
NOW = 1_800_000_000.0
PUB = TokenKey(0, b"kvcs-publisher-token")
SUB = TokenKey(0, b"kvcs-consumer-token")
OLD = TokenKey(0, b"kvcs-old-token")


def test_prefix_matching_is_fieldwise_and_exact() -> None:
    assert is_prefix((b"foo",), (b"foo", b"bar"))
    assert is_prefix((b"foo", b"bar"), (b"foo", b"bar"))
    assert is_prefix((), (b"anything",))
    assert not is_prefix((b"foobar",), (b"foo", b"bar"))
    assert not is_prefix((b"foo",), (b"foobar",))
    assert not is_prefix((b"foo", b"bar"), (b"foo",))


def test_example_policy_rights() -> None:
    policy = load_policy(EXAMPLE)
    ns = (b"kvcs-1", SCOPE, b"c" * 32, b"a" * 32, b"p" * 16)
    assert policy.check(Right.PUBLISH, ns, [PUB], NOW).allowed
    assert policy.check(Right.SUBSCRIBE, ns, [SUB], NOW).allowed
    # the consumer may narrow its prefix but not widen it past its scope
    assert policy.check(Right.SUBSCRIBE, ns[:4], [SUB], NOW).allowed
    wide = policy.check(Right.SUBSCRIBE, (b"kvcs-1",), [SUB], NOW)
    assert not wide.allowed and wide.code is RequestErrorCode.UNAUTHORIZED
    # a subscribe right is not a publish right; another scope is not covered
    assert policy.check(Right.PUBLISH, ns, [SUB], NOW).code is RequestErrorCode.UNAUTHORIZED
    other = (b"kvcs-1", OTHER_SCOPE, *ns[2:])
    assert not policy.check(Right.SUBSCRIBE, other, [SUB, PUB], NOW).allowed


def test_unknown_missing_and_expired_tokens() -> None:
    policy = load_policy(EXAMPLE)
    ns = (b"kvcs-1", SCOPE)
    nothing = policy.check(Right.SUBSCRIBE, ns, [], NOW)
    assert (nothing.allowed, nothing.code) == (False, RequestErrorCode.UNAUTHORIZED)
    assert "no token" in nothing.reason and "kvcs" in nothing.reason
    unknown = policy.check(Right.SUBSCRIBE, ns, [TokenKey(0, b"guess")], NOW)
    assert (unknown.allowed, unknown.code) == (False, RequestErrorCode.MALFORMED_AUTH_TOKEN)
    wrong_type = policy.check(Right.SUBSCRIBE, ns, [TokenKey(1, SUB.value)], NOW)
    assert (wrong_type.allowed, wrong_type.code) == (False, RequestErrorCode.MALFORMED_AUTH_TOKEN)
    known_and_unknown = policy.check(Right.PUBLISH, ns, [TokenKey(0, b"guess"), SUB], NOW)
    assert (known_and_unknown.allowed, known_and_unknown.code) == (False, RequestErrorCode.UNAUTHORIZED)
    expired = policy.check(Right.SUBSCRIBE, ns, [OLD], NOW)
    assert (expired.allowed, expired.code) == (False, RequestErrorCode.EXPIRED_AUTH_TOKEN)
    # one valid token among several is enough
    assert policy.check(Right.SUBSCRIBE, ns, [OLD, SUB], NOW).allowed
    # before its expiry the old token works
    assert policy.check(Right.SUBSCRIBE, ns, [OLD], 1_600_000_000.0).allowed


def test_anonymous_rights_and_allow_all() -> None:
    policy = policy_from_mapping({"version": 1, "anonymous": {"subscribe": [["public"]]}})
    assert policy.check(Right.SUBSCRIBE, (b"public", b"x"), [], NOW).allowed
    assert not policy.check(Right.PUBLISH, (b"public", b"x"), [], NOW).allowed
    assert Policy.allow_everything().check(Right.PUBLISH, (b"x",), [], NOW).allowed
    assert policy_from_mapping({"version": 1, "allow_all": True}).check(Right.SUBSCRIBE, (), [], NOW).allowed


@pytest.mark.parametrize(("doc", "path"), [
    ({"tokens": []}, "$"),  # version missing
    ({"version": 2}, "$.version"),
    ({"version": 1, "tokens": [{"value": "t", "publish": [[""]]}]}, "$.tokens[0]"),
    ({"version": 1, "tokens": [{"value": "t", "publish": [[{"hex": "abc"}]]}]}, "$.tokens[0]"),
    ({"version": 1, "tokens": [{"value": "t", "bogus": 1}]}, "$.tokens[0]"),
    ({"version": 1, "anonymous": {"publish": "x"}}, "$.anonymous"),
])
def test_schema_violations_name_the_path(doc: object, path: str) -> None:
    with pytest.raises(PolicyError) as exc:
        policy_from_mapping(doc, "p.yaml")
    assert f"p.yaml: {path}" in str(exc.value)


def test_duplicate_token_and_unreadable_files(tmp_path: Path) -> None:
    with pytest.raises(PolicyError, match=r"tokens\[1\]\.value: token listed twice"):
        policy_from_mapping({"version": 1, "tokens": [{"value": "a"}, {"value": {"hex": "61"}}]})
    with pytest.raises(PolicyError, match="cannot read"):
        load_policy(tmp_path / "absent.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("version: [1\n")
    with pytest.raises(PolicyError, match="not valid YAML"):
        load_policy(bad)


def test_render_namespace_escapes_bytes() -> None:
    assert render_namespace((b"kvcs-1", b"\x01a")) == "kvcs.2d1-.01a"
    assert render_namespace(()) == "(empty)"
