"""The kvcs-relay suite's machinery: reading the two scopes from the PICS (``scope_accesses``), the policy a
relay the harness owns starts with (``harness_policy`` of both scopes), and the loopback testbed and the
packaged example policy agreeing with each other."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest

from kvconform import yamlload
from kvconform.fixtures.kvcs.relay import UNDECLARED_SCOPES, describe, scope_accesses
from kvconform.moqt.errors import RequestErrorCode
from kvconform.moqt.policy import Policy, Right, TokenKey, load_policy, policy_from_mapping
from kvconform.moqt.structures import TrackNamespace
from kvconform.targets.moqt import DriverError, RelayAccess, harness_policy
from kvconform.targets.spec import Pics

ROOT = Path(__file__).resolve().parents[2]
SCOPE_A = bytes.fromhex("6d1c6481cd428737da312c089db3832a")
SCOPE_B = bytes.fromhex("f02550e479c7bd7cdcbad5afaf37914e")
PICS: dict[str, Any] = {"kvcs": {"relay": {
    "scopes": [{"scope_id": {"hex": SCOPE_A.hex()}, "publisher": "pub-a", "subscriber": "sub-a"},
               {"scope_id": {"hex": SCOPE_B.hex()}, "publisher": "pub-b", "subscriber": {"hex": "00ff"}}],
    "outsider": "nobody"}}}


def _with(path: str, value: Any) -> Pics:
    doc = copy.deepcopy(PICS)
    node = doc
    *parents, last = path.split(".")
    for part in parents:
        node = node[part]
    node[last] = value
    return Pics(doc)


def _namespace(scope: bytes) -> tuple[bytes, ...]:
    return (b"kvcs-1", scope, b"c" * 32, b"a" * 32, b"p" * 16)


def test_scopes_are_read_with_their_prefix_and_tokens() -> None:
    a, b = scope_accesses(Pics(PICS))
    assert a.prefix == TrackNamespace((b"kvcs-1", SCOPE_A)) and b.prefix == TrackNamespace((b"kvcs-1", SCOPE_B))
    assert a.tokens == {"publisher": b"pub-a", "subscriber": b"sub-a", "outsider": b"nobody"}
    assert b.tokens["subscriber"] == b"\x00\xff"
    assert a.authorization and b.authorization


@pytest.mark.parametrize(("path", "value", "match"), [
    ("kvcs.relay.scopes", None, r"kvcs\.relay\.scopes"),
    ("kvcs.relay.scopes", [PICS["kvcs"]["relay"]["scopes"][0]], r"two scopes"),
    ("kvcs.relay.outsider", None, r"kvcs\.relay\.outsider"),
])
def test_missing_declarations_are_errors_naming_the_path(path: str, value: Any, match: str) -> None:
    with pytest.raises(DriverError, match=match):
        scope_accesses(_with(path, value))


def test_a_scope_id_of_the_wrong_length_or_a_repeated_one_is_refused() -> None:
    scopes = copy.deepcopy(PICS["kvcs"]["relay"]["scopes"])
    scopes[1]["scope_id"] = {"hex": "abcd"}
    with pytest.raises(DriverError, match=r"scopes\[1\]\.scope_id: 2 octets"):
        scope_accesses(_with("kvcs.relay.scopes", scopes))
    scopes[1]["scope_id"] = scopes[0]["scope_id"]
    with pytest.raises(DriverError, match="same Scope ID"):
        scope_accesses(_with("kvcs.relay.scopes", scopes))


def test_without_authorization_no_scope_needs_declaring() -> None:
    a, b = scope_accesses(Pics({"kvcs": {"relay": {"authorization": False}}}))
    assert not a.authorization and a.tokens == {} and a.prefix.fields[1] == UNDECLARED_SCOPES[0]
    assert b.prefix.fields[1] == UNDECLARED_SCOPES[1]
    assert harness_policy(a, b) == {"version": 1, "allow_all": True}


def test_the_harness_policy_grants_each_scope_only_its_own_tokens() -> None:
    policy = policy_from_mapping(harness_policy(*scope_accesses(Pics(PICS))), "test")

    def check(right: Right, scope: bytes, token: bytes) -> RequestErrorCode | None:
        decision = policy.check(right, _namespace(scope), [TokenKey(0, token)], now=0.0)
        return None if decision.allowed else decision.code

    assert check(Right.PUBLISH, SCOPE_A, b"pub-a") is None
    assert check(Right.SUBSCRIBE, SCOPE_A, b"pub-a") is None
    assert check(Right.SUBSCRIBE, SCOPE_A, b"sub-a") is None
    assert check(Right.SUBSCRIBE, SCOPE_B, b"\x00\xff") is None
    assert check(Right.PUBLISH, SCOPE_A, b"sub-a") == RequestErrorCode.UNAUTHORIZED
    for token in (b"pub-a", b"sub-a"):
        assert check(Right.SUBSCRIBE, SCOPE_B, token) == RequestErrorCode.UNAUTHORIZED
        assert check(Right.PUBLISH, SCOPE_B, token) == RequestErrorCode.UNAUTHORIZED
    assert check(Right.SUBSCRIBE, SCOPE_A, b"nobody") == RequestErrorCode.MALFORMED_AUTH_TOKEN
    assert policy.check(Right.SUBSCRIBE, (b"kvcs-1",), [TokenKey(0, b"sub-a")], 0.0).code == \
        RequestErrorCode.UNAUTHORIZED  # no right on a prefix broader than the scope


def test_a_token_shared_by_two_scopes_gets_both_rights() -> None:
    shared = {"publisher": b"pub", "subscriber": b"sub", "outsider": b"x"}
    a = RelayAccess(True, TrackNamespace((b"kvcs-1", SCOPE_A)), shared)
    b = RelayAccess(True, TrackNamespace((b"kvcs-1", SCOPE_B)), shared)
    doc = harness_policy(a, b)
    assert [t["name"] for t in doc["tokens"]] == ["publisher", "subscriber"]
    policy = policy_from_mapping(doc, "test")
    assert all(policy.check(Right.PUBLISH, _namespace(s), [TokenKey(0, b"pub")], 0.0).allowed
               for s in (SCOPE_A, SCOPE_B))


def test_one_access_gives_the_moqt_relay_policy_unchanged() -> None:
    access = RelayAccess(True, TrackNamespace((b"kvcs-1", SCOPE_A)),
                         {"publisher": b"p", "subscriber": b"s", "outsider": b"o", "expired": b"e"})
    tokens = harness_policy(access)["tokens"]
    assert tokens == [
        {"name": "publisher", "value": "p", "publish": [["kvcs-1", {"hex": SCOPE_A.hex()}]],
         "subscribe": [["kvcs-1", {"hex": SCOPE_A.hex()}]]},
        {"name": "subscriber", "value": "s", "subscribe": [["kvcs-1", {"hex": SCOPE_A.hex()}]]},
        {"name": "expired", "value": "e", "subscribe": [["kvcs-1", {"hex": SCOPE_A.hex()}]], "expires": 1},
    ]


def test_the_packaged_policy_matches_the_loopback_pics() -> None:
    """`kvconform serve moqt-relay` (default policy) is what the loopback PICS describe, for both scopes."""
    bed = yamlload.safe_load((ROOT / "testbeds" / "loopback.yaml").read_text())
    packaged: Policy = load_policy(ROOT / "testbeds" / "moqt-relay-policy.yaml")
    for pics in (bed["defaults"]["pics"], bed["targets"]["reference"]["pics"]):
        a, b = scope_accesses(Pics(pics))
        for own, other in ((a, b), (b, a)):
            ns, foreign = (*own.prefix.fields, b"c" * 32), (*other.prefix.fields, b"c" * 32)
            pub, sub = TokenKey(0, own.tokens["publisher"]), TokenKey(0, own.tokens["subscriber"])
            assert packaged.check(Right.PUBLISH, ns, [pub], 0.0).allowed
            assert packaged.check(Right.SUBSCRIBE, ns, [sub], 0.0).allowed
            assert not packaged.check(Right.PUBLISH, ns, [sub], 0.0).allowed
            assert not packaged.check(Right.SUBSCRIBE, foreign, [sub], 0.0).allowed
            assert not packaged.check(Right.PUBLISH, foreign, [pub], 0.0).allowed
        assert not packaged.check(Right.SUBSCRIBE, a.prefix.fields, [TokenKey(0, a.tokens["outsider"])], 0.0).allowed


def test_namespaces_are_described_field_by_field() -> None:
    assert describe(TrackNamespace(_namespace(SCOPE_A))).startswith("(kvcs-1, scope 6d1c6481.., compat 63636363..")
    assert describe(TrackNamespace((b"kvcs-1", b"\x00\x01"))) == "(kvcs-1, 0001)"
