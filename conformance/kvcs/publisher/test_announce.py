"""kvcs-publisher: the announcement (KVCS "Track Namespace", "Publisher Behavior").

The harness's relay requires the scope's authorization: its policy grants the publish right on
("kvcs-1", Scope ID) to the token handed to the publisher, and to nothing else.
"""

from __future__ import annotations

from typing import Any

import pytest

from kvconform.kvcs.errors import KvcsError
from kvconform.kvcs.namespace import FIELD_LENGTHS, KvcsNamespace
from kvconform.moqt.policy import TokenKey
from kvconform.targets.kvcs.recording_relay import findings
from kvconform.verdicts import check, check_equal, inconclusive

# namespace field -> the requirement a wrong value of it breaks (field 0 is the "kvcs-1" tag; a wrong Anchor
# Key is KVCS-NS-ANCHOR-KEY when it is another Block Key of the chain, KVCS-KVSP-BLOCK-KEY when it is none)
FIELD_REQS = ("KVCS-NS-FIVE-FIELDS", "KVCS-KVSP-SCOPE-ID", "KVCS-KVSP-COMPAT-ID", "KVCS-NS-ANCHOR-KEY")


def content_field_problems(obs: Any, got: tuple[bytes, ...], want: tuple[bytes, ...]) -> list[tuple[str, str]]:
    """(requirement, problem) for each content field (0..3) of an announced namespace that is not the one the
    cache spec gives. Every identity wrong at once is the cache spec misread (KVCS-KVSP-CACHE-SPEC)."""
    wrong = [i for i, (g, w) in enumerate(zip(got, want, strict=True)) if g != w]
    if len(wrong) == 3 and wrong == [1, 2, 3] and all(got[i] != want[i].hex().encode() for i in wrong):
        return [("KVCS-KVSP-CACHE-SPEC", f"Scope ID, Compatibility ID and Anchor Key all differ from those of the "
                                         f"cache spec ({', '.join(g.hex()[:16] + '..' for g in got[1:])}; expected "
                                         f"{', '.join(w.hex()[:16] + '..' for w in want[1:])}): it was not read as "
                                         "written")]
    out = []
    keys = list(obs.spec.block_keys)
    for i in wrong:
        name, g, w = FIELD_LENGTHS[i][0], got[i], want[i]
        if g == w.hex().encode():
            out.append(("KVCS-NS-RAW-OCTETS", f"field {i} ({name}) is the hex text of the value, not its raw octets "
                                              f"{w.hex()}"))
        elif i == 3 and g in keys:
            out.append(("KVCS-NS-ANCHOR-KEY", f"field 3 (Anchor Key) is the Block Key of block {keys.index(g)}, "
                                              f"expected that of block {keys.index(w)}, the last complete block of "
                                              "segment 0"))
        elif i == 3:
            out.append(("KVCS-KVSP-BLOCK-KEY", f"field 3 (Anchor Key) {g.hex()} is no Block Key of the cache's token "
                                               f"chain (expected {w.hex()})"))
        else:
            out.append((FIELD_REQS[i], f"field {i} ({name}) is {g.hex()}, the cache spec gives {w.hex()}"))
    return out


@pytest.mark.req("KVCS-PUB-ANNOUNCE", "KVCS-NS-FIVE-FIELDS", "KVCS-NS-RAW-OCTETS", "KVCS-NS-ANCHOR-KEY",
                 "KVCS-KVSP-CACHE-SPEC", "KVCS-KVSP-COMPAT-ID", "KVCS-KVSP-SCOPE-ID", "KVCS-KVSP-BLOCK-KEY",
                 "MOQT-AUTH-TOKEN")
def test_publish_namespace_is_the_full_namespace_with_the_scope_token(kvcs_publication: Any) -> None:
    """PUBLISH_NAMESPACE names all five fields ("kvcs-1", Scope ID, Compatibility ID, Anchor Key, Publication
    ID) as raw octets computed from the cache spec with the KVSP profile (the Anchor Key is the Block Key of
    segment 0's last complete block, also in the segmented case), carries the scope token (USE_VALUE, Token
    Type 0, in the request or the session's SETUP), and the relay requiring that authorization accepts it."""
    obs = kvcs_publication
    check(obs.announces, f"case {obs.case.name}: a PUBLISH_NAMESPACE reaching the relay", req="KVCS-PUB-ANNOUNCE",
          seen=f"none (notes: {obs.notes}; publisher stderr: {obs.exit.stderr[-500:]!r})",
          expected="one under the cache's content prefix")
    want = obs.spec.namespace(b"\0" * 16).content_fields()
    token = TokenKey(0, obs.token)
    found = findings("the announcement does not give the relay the full namespace with its authorization",
                     "KVCS-PUB-ANNOUNCE", "MOQT-AUTH-TOKEN", "KVCS-NS-RAW-OCTETS", "KVCS-KVSP-CACHE-SPEC",
                     "KVCS-KVSP-BLOCK-KEY", *FIELD_REQS)
    for a in obs.announces:
        where = f"PUBLISH_NAMESPACE {a.namespace}"
        try:
            ns = KvcsNamespace.parse(a.namespace)
        except KvcsError as exc:
            found.add("KVCS-NS-FIVE-FIELDS", f"{where}: {exc}")
        else:
            for problem in content_field_problems(obs, ns.content_fields(), want):
                found.add(*problem)
        presented = [*a.tokens, *a.setup_tokens]
        if token not in presented:
            # the scope's value under another Token Type is the token's encoding wrong; no such value at all is
            # the announcement without the authorization the relay requires
            req = "MOQT-AUTH-TOKEN" if any(t.value == obs.token for t in presented) else "KVCS-PUB-ANNOUNCE"
            found.add(req, f"{where}: carries no AUTHORIZATION_TOKEN with the scope token (USE_VALUE, Token Type 0, "
                           f"{obs.token!r}); presented {list(a.tokens)}, SETUP {list(a.setup_tokens)}")
        if not a.allowed:
            found.add("KVCS-PUB-ANNOUNCE", f"{where}: refused by the relay requiring the scope's authorization: "
                                           f"{a.reason}")
    found.judge()


@pytest.mark.req("KVCS-NS-PUBID-RANDOM", "KVCS-NS-CONTENT-FIELDS")
def test_publication_id_is_new_for_each_production(kvcs_plain: Any, kvcs_replay: Any) -> None:
    """Publishing the same cache twice (two productions) gives two Publication IDs, neither of them derived
    from the content alone (all-zero, or equal to a content field's first 16 octets), under the same content
    fields 0..3 (they identify the content, not the production)."""
    ids = []
    for obs in (kvcs_plain, kvcs_replay):
        ns = obs.namespace
        if ns is None:
            inconclusive(f"case {obs.case.name} announced no accepted five-field namespace "
                         f"({[str(a.namespace) for a in obs.announces]}): its Publication ID cannot be read (the "
                         "announcement check judges that)")
        ids.append(ns.pub_id)
    check(ids[0] != ids[1], "the Publication IDs of two productions of the same cache (chosen at random for each "
          "production)", req="KVCS-NS-PUBID-RANDOM", seen=f"both {ids[0].hex()}", expected="two different ones")
    check_equal("fields 0..3 of the second production's namespace (hex)",
                [f.hex() for f in kvcs_replay.namespace.content_fields()],
                [f.hex() for f in kvcs_plain.namespace.content_fields()], req="KVCS-NS-CONTENT-FIELDS")
    derived = {f[:16] for f in kvcs_plain.namespace.content_fields()[1:]} | {bytes(16)}
    for pub_id in ids:
        check(pub_id not in derived, "a Publication ID", req="KVCS-NS-PUBID-RANDOM", seen=pub_id.hex(),
              expected="random: not zero, not a prefix of a content field")
