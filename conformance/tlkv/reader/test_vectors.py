"""tlkv-reader: the published reader vectors (vectors/tlkv/envelope_read.json).

A vector names the pool geometry and versions of the reader it is for.  A reader that takes a pool
geometry per import (PICS tlkv.reader.any_geometry) runs every vector; otherwise only those matching its
declared geometry and versions (declared capabilities decide, never a guess).
"""

from __future__ import annotations

import pytest

from kvconform.fixtures import evidence
from kvconform.fixtures.tlkv import ReaderUnderTest
from kvconform.testvectors import VectorCase, load_vectors
from kvconform.tlkv.geometry import Geometry
from kvconform.verdicts import check_one_of, not_applicable

CASES = load_vectors("tlkv-envelope-read")


def _reqs(case: VectorCase) -> list[str]:
    reqs = ["TLKV-READ-ERROR-CLASS"] if case.result == "invalid" else ["TLKV-READ-VALUES"]
    if case.result == "invalid":
        reqs.append(case["requirement"])
    if "V2ReadsBoth" in case.flags:
        reqs.append("TLKV-READ-V2-BOTH")
    if "V1OnlyReader" in case.flags:
        reqs.append("TLKV-READ-V1-ONLY")
    return reqs


@pytest.mark.parametrize("case", [pytest.param(c, marks=pytest.mark.req(*_reqs(c)), id=c.id) for c in CASES])
def test_vector(case: VectorCase, tlkv_reader: ReaderUnderTest) -> None:
    g = Geometry.from_dict(case["geometry"])
    versions = frozenset(int(v) for v in case["versions"])
    if not tlkv_reader.any_geometry and g != tlkv_reader.geometry:
        not_applicable(f"vector pool geometry {g} differs from the declared {tlkv_reader.geometry} and PICS "
                       f"tlkv.reader.any_geometry is not declared")
    if (versions != tlkv_reader.versions and not (versions == {1} and tlkv_reader.v1_only_mode)
            and not tlkv_reader.any_geometry):
        not_applicable(f"vector reader versions {sorted(versions)} differ from the declared "
                       f"{sorted(tlkv_reader.versions)}")
    data = bytes.fromhex(case["envelope"])
    evidence.record("sent", "envelope", {"vector": case.id, "comment": case.comment}, raw=data)
    session = tlkv_reader.open(g, versions)
    outcome = session.import_envelope(data)
    evidence.record("received", "import-outcome", {"status": outcome.status, "message": outcome.message})
    if case.result == "invalid":
        check_one_of(outcome.status, [case["error"]], what=f"{case.id} ({case.comment})",
                      req=case["requirement"])
        return
    assert outcome.status == "ok", f"{case.id} ({case.comment}): refused: {outcome.message}"
    want = [(int(r["block_hash"], 16), int(r["n_tokens"])) for r in case["records"]]
    assert [(b.block_hash, b.n_tokens) for b in outcome.blocks] == want
