"""tlkv-reader: the published reader vectors (vectors/tlkv/envelope_read.json).

A vector names the pool geometry and versions of the reader it is for. Which readers it applies to is decided by
declared capabilities, never a guess: another pool geometry needs PICS tlkv.reader.any_geometry; a v2 envelope a
reader that declares v2; a vector for a v1-only reader (flag V1OnlyReader) a reader that declares it is one or
can be opened as one. Every other vector is about version 1, which every reader reads.
"""

from __future__ import annotations

import pytest

from kvconform import evidence
from kvconform.conformance.tlkv.malformations import vector_classes
from kvconform.conformance.tlkv.reader.judge import (
    REFUSAL_BLAME,
    V1_ONLY,
    V2_BOTH,
    VALUES,
    class_requirement,
    envelope_version,
    imported,
    judge_accepted,
    judge_blocks,
    judge_refusal,
)
from kvconform.fixtures.tlkv import ReaderUnderTest
from kvconform.testvectors import VectorCase, load_vectors
from kvconform.tlkv.geometry import Geometry
from kvconform.verdicts import not_applicable

CASES = load_vectors("tlkv-envelope-read")


def _version(case: VectorCase) -> int | None:
    return envelope_version(bytes.fromhex(case["envelope"]))


def _v1_only(case: VectorCase) -> bool:
    return "V1OnlyReader" in case.flags


def _rule(case: VectorCase) -> str:
    """The rule an invalid vector breaks; a v2 envelope for a v1-only reader is TLKV-READ-V1-ONLY's case."""
    return V1_ONLY if _v1_only(case) and _version(case) == 2 else str(case["requirement"])


def _reqs(case: VectorCase) -> list[str]:
    v2_reader = 2 in case["versions"]
    if case.result == "valid":
        return [VALUES, *REFUSAL_BLAME] + ([V2_BOTH] if v2_reader else [])
    reqs = list(dict.fromkeys([_rule(case), class_requirement(_rule(case))]))
    return reqs + ([V2_BOTH] if v2_reader and _version(case) == 2 and case["error"] != "version" else [])


@pytest.mark.parametrize("case", [pytest.param(c, marks=pytest.mark.req(*_reqs(c)), id=c.id) for c in CASES])
def test_vector(case: VectorCase, tlkv_reader: ReaderUnderTest) -> None:
    g = Geometry.from_dict(case["geometry"])
    if not tlkv_reader.any_geometry and g != tlkv_reader.geometry:
        not_applicable(f"vector pool geometry {g} differs from the declared {tlkv_reader.geometry} and PICS "
                       f"tlkv.reader.any_geometry is not declared")
    if _v1_only(case):
        if not tlkv_reader.can_be_v1_only:
            not_applicable("a vector for a v1-only reader: the reader declares neither that it is one nor "
                           "tlkv.reader.v1_only_mode")
        versions = frozenset({1})
    elif _version(case) == 2 or (2 in case["versions"] and "V2ReadsBoth" in case.flags):
        if 2 not in tlkv_reader.versions:
            not_applicable(f"a vector for a v2 reader; PICS tlkv.reader.versions = {sorted(tlkv_reader.versions)}")
        versions = tlkv_reader.versions
    else:
        versions = tlkv_reader.versions
    data = bytes.fromhex(case["envelope"])
    what = f"{case.id} ({case.comment})"
    evidence.record("sent", "envelope", {"vector": case.id, "comment": case.comment}, raw=data)
    outcome, _ = imported(tlkv_reader.open(g, versions), data, case.id)
    if case.result == "invalid":
        judge_refusal(outcome, vector_classes(case.id, case["error"]), rule=_rule(case), data=data,
                      versions=versions, what=what)
        return
    judge_accepted(outcome, data=data, versions=versions, what=what)
    judge_blocks(outcome, [(int(r["block_hash"], 16), int(r["n_tokens"])) for r in case["records"]], what)
