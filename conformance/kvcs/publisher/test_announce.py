"""kvcs-publisher: the announcement (KVCS "Track Namespace", "Publisher Behavior").

The harness's relay requires the scope's authorization: its policy grants the publish right on
("kvcs-1", Scope ID) to the token handed to the publisher, and to nothing else.
"""

from __future__ import annotations

from typing import Any

import pytest

from kvconform.conformance.kvcs.publisher.harness import report
from kvconform.kvcs.errors import KvcsError
from kvconform.kvcs.namespace import FIELD_LENGTHS, KvcsNamespace
from kvconform.moqt.policy import TokenKey


@pytest.mark.req("KVCS-PUB-ANNOUNCE", "KVCS-NS-FIVE-FIELDS", "KVCS-NS-RAW-OCTETS", "KVCS-NS-CONTENT-FIELDS",
                 "KVCS-NS-ANCHOR-KEY", "KVCS-KVSP-CACHE-SPEC", "KVCS-KVSP-COMPAT-ID", "KVCS-KVSP-SCOPE-ID",
                 "KVCS-KVSP-BLOCK-KEY", "MOQT-AUTH-TOKEN")
def test_publish_namespace_is_the_full_namespace_with_the_scope_token(kvcs_publication: Any) -> None:
    """PUBLISH_NAMESPACE names all five fields ("kvcs-1", Scope ID, Compatibility ID, Anchor Key, Publication
    ID) as raw octets computed from the cache spec with the KVSP profile (the Anchor Key is the Block Key of
    segment 0's last complete block, also in the segmented case), carries the scope token (USE_VALUE, Token
    Type 0, in the request or the session's SETUP), and the relay requiring that authorization accepts it."""
    obs = kvcs_publication
    if not obs.announces:
        raise AssertionError(f"KVCS-PUB-ANNOUNCE: no PUBLISH_NAMESPACE reached the relay (notes: {obs.notes}; "
                             f"publisher stderr: {obs.exit.stderr[-500:]!r})")
    want = obs.spec.namespace(b"\0" * 16).content_fields()
    token = TokenKey(0, obs.token)
    problems: list[str] = []
    for a in obs.announces:
        where = f"PUBLISH_NAMESPACE {a.namespace}"
        try:
            ns = KvcsNamespace.parse(a.namespace)
        except KvcsError as exc:
            problems.append(f"{where}: {exc} [KVCS-NS-FIVE-FIELDS]")
        else:
            for i, (got, exp) in enumerate(zip(ns.content_fields(), want, strict=True)):
                if got != exp:
                    hexed = " (the hex text of the value, not the raw octets)" if got == exp.hex().encode() else ""
                    cite = ["KVCS-NS-CONTENT-FIELDS", "KVCS-NS-RAW-OCTETS",
                            ("KVCS-KVSP-SCOPE-ID", "KVCS-KVSP-COMPAT-ID", "KVCS-NS-ANCHOR-KEY")[i - 1] if i else ""]
                    problems.append(f"{where}: field {i} ({FIELD_LENGTHS[i][0]}) is {got.hex()}, the cache spec gives "
                                    f"{exp.hex()}{hexed} [{', '.join(c for c in cite if c)}]")
        if token not in a.tokens and token not in a.setup_tokens:
            problems.append(f"{where}: carries no AUTHORIZATION_TOKEN with the scope token (USE_VALUE, Token Type 0, "
                            f"{obs.token!r}); presented {list(a.tokens)}, SETUP {list(a.setup_tokens)} "
                            "[KVCS-PUB-ANNOUNCE, MOQT-AUTH-TOKEN]")
        if not a.allowed:
            problems.append(f"{where}: refused by the relay requiring the scope's authorization: {a.reason} "
                            "[KVCS-PUB-ANNOUNCE]")
    report(problems, "the announcement does not give the relay the full namespace with its authorization")


@pytest.mark.req("KVCS-NS-PUBID-RANDOM")
def test_publication_id_is_new_for_each_production(kvcs_plain: Any, kvcs_replay: Any) -> None:
    """Publishing the same cache twice (two productions) gives two Publication IDs, neither of them derived
    from the content alone (all-zero, or equal to a content field's first 16 octets)."""
    ids = []
    for obs in (kvcs_plain, kvcs_replay):
        ns = obs.namespace
        if ns is None:
            raise AssertionError(f"KVCS-NS-PUBID-RANDOM: case {obs.case.name} announced no accepted five-field "
                                 f"namespace ({[str(a.namespace) for a in obs.announces]})")
        ids.append(ns.pub_id)
    problems = []
    if ids[0] == ids[1]:
        problems.append(f"both productions of the same cache use Publication ID {ids[0].hex()} "
                        "(chosen at random for each production) [KVCS-NS-PUBID-RANDOM]")
    ns0 = kvcs_plain.namespace
    derived = {f[:16] for f in ns0.content_fields()[1:]} | {bytes(16)}
    for pub_id in ids:
        if pub_id in derived:
            problems.append(f"Publication ID {pub_id.hex()} is zero or a prefix of a content field, not random "
                            "[KVCS-NS-PUBID-RANDOM]")
    report(problems, "the Publication ID is not new for each production")
