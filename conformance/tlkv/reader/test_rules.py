"""tlkv-reader: every reader rule broken one at a time (TLKV "Reader rules").

Each malformed envelope is imported once (per version the reader reads) and judged by two checks: the reader
refuses it with the acceptable error class (outcomes.yaml), and the refusal allocates nothing; a broken rule in
the last of three records catches readers that allocate as they go. What the reader does not report about its
allocations is inconclusive, never a pass.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache

import numpy as np
import pytest
from _pytest.mark import ParameterSet

from kvconform import evidence, sweep
from kvconform.conformance.tlkv.malformations import (
    GENERATED,
    HAND_WRITTEN,
    MALFORMATIONS,
    Malformation,
    acceptable,
    applicable,
    full_block,
    header_of,
    in_version,
)
from kvconform.conformance.tlkv.reader.judge import (
    NOALLOC,
    V1_ONLY,
    V2_BOTH,
    class_requirement,
    envelope_version,
    imported,
    judge_nothing_allocated,
    judge_refusal,
)
from kvconform.conformance.tlkv.scenarios import case_seed
from kvconform.fixtures.tlkv import ReaderUnderTest
from kvconform.targets.spec import Pics
from kvconform.targets.tlkv import ImportOutcome
from kvconform.tlkv.envelope import encode_envelope
from kvconform.tlkv.geometry import Geometry
from kvconform.verdicts import not_applicable

VERSIONS = (1, 2)


SAMPLE = Geometry(4, 1, 2, 2)


@cache
def _sample(m: Malformation, version: int) -> bytes | None:
    """`m`'s envelope on a small geometry, fixed contents (None where it does not exist there): its version field
    does not depend on the geometry."""
    if not applicable(m, SAMPLE, version):
        return None
    rng = np.random.default_rng(0)
    return m.build(SAMPLE, version, [full_block(rng, SAMPLE) for _ in range(m.n_blocks)])


def _header_version(m: Malformation, version: int) -> int | None:
    sample = _sample(m, version)
    return version if sample is None else envelope_version(sample)


def _rule_reqs(m: Malformation, version: int) -> list[str]:
    reqs = list(dict.fromkeys([m.requirements[0], class_requirement(m.requirements[0])]))
    return reqs + ([V2_BOTH] if _header_version(m, version) == 2 and m.error != "version" else [])


def _allocation_cases() -> list[Malformation]:
    """The NOALLOC check's malformations: the hand-written ones and the generated multi-record ones (a broken last
    record is where a reader allocating as it goes differs); under --sweep wide every generated one too."""
    return [*HAND_WRITTEN, *sweep.pick([m for m in GENERATED if m.n_blocks > 1],
                                       [m for m in GENERATED if m.n_blocks == 1])]


def _versions(m: Malformation) -> tuple[int, ...]:
    """The versions `m` is imported in: both for a hand-written one (one per reader rule: every rule in each
    version's path), v1 for a generated value class (its field is read the same way in both), both under
    --sweep wide."""
    return VERSIONS if m in HAND_WRITTEN or sweep.level() == "wide" else (1,)


def _params(allocation: bool) -> list[ParameterSet]:
    """One case per (malformation, version): marked for the rule check, or (`allocation`) the NOALLOC check."""
    out: list[ParameterSet] = []
    for m in _allocation_cases() if allocation else MALFORMATIONS:
        for v in _versions(m):
            if not in_version(m, v):
                continue
            sample = _sample(m, v)
            if v == 2 and sample is not None and sample == _sample(m, 1):
                continue  # the same bytes whatever the version (the empty envelope)
            marks = pytest.mark.req(*([NOALLOC] if allocation else _rule_reqs(m, v)))
            out.append(pytest.param((m, v), marks=marks, id=f"{m.id}-v{v}"))
    return out


@dataclass
class RuleImport:
    """One malformed envelope and what the reader did with it."""

    m: Malformation
    version: int
    data: bytes
    outcome: ImportOutcome
    allocated: int | None


@pytest.fixture(scope="module")
def rule_import(request: pytest.FixtureRequest, tlkv_reader: ReaderUnderTest, pics: Pics,
                session_seed: int) -> RuleImport:
    m, version = request.param
    g = tlkv_reader.geometry
    if version not in tlkv_reader.versions:
        not_applicable(f"PICS tlkv.reader.versions = {sorted(tlkv_reader.versions)}: the reader does not read "
                       f"v{version}")
    if not applicable(m, g, version):
        not_applicable(f"{m.id} does not exist at the declared pool geometry {g} in v{version} (it needs "
                       f"block_tokens >= {m.min_block_tokens}, and a value that is not the valid one or an earlier "
                       "value class's)")
    rng = np.random.default_rng(case_seed(session_seed, "reader-rule", m.id, version))
    data = m.build(g, version, [full_block(rng, g) for _ in range(m.n_blocks)])
    evidence.record("sent", "envelope", {"malformation": m.id, **header_of(data)}, raw=data)
    outcome, allocated = imported(tlkv_reader.open(), data, m.id)
    return RuleImport(m, version, data, outcome, allocated)


@pytest.fixture(autouse=True)
def _evidence(request: pytest.FixtureRequest) -> None:
    if "rule_import" in request.fixturenames:
        ri: RuleImport = request.getfixturevalue("rule_import")
        evidence.record("received", "import-outcome", {"malformation": ri.m.id, "status": ri.outcome.status,
                                                       "requirement": ri.outcome.requirement,
                                                       "message": ri.outcome.message, "allocated": ri.allocated})


@pytest.mark.parametrize("rule_import", _params(allocation=False), indirect=True)
def test_rule(rule_import: RuleImport, tlkv_reader: ReaderUnderTest) -> None:
    ri = rule_import
    judge_refusal(ri.outcome, acceptable("reader", ri.m), rule=ri.m.requirements[0], data=ri.data,
                  versions=tlkv_reader.versions, what=f"an envelope breaking {ri.m.requirements[0]} ({ri.m.id}, "
                                                      f"v{ri.version})")


@pytest.mark.parametrize("rule_import", _params(allocation=True), indirect=True)
def test_rule_allocates_nothing(rule_import: RuleImport) -> None:
    judge_nothing_allocated(rule_import.outcome, rule_import.allocated,
                            f"an envelope breaking {rule_import.m.requirements[0]} ({rule_import.m.id})")


@pytest.mark.req(V1_ONLY)
def test_v1_only_reader_refuses_v2_cleanly(tlkv_reader: ReaderUnderTest, rng: np.random.Generator) -> None:
    if not tlkv_reader.can_be_v1_only:
        not_applicable("the reader declares neither that it is v1-only (PICS tlkv.reader.versions: [1], written for "
                       "it, not the testbed's default) nor that it can be opened as one (tlkv.reader.v1_only_mode)")
    g = tlkv_reader.geometry
    data = encode_envelope(g, 2, [full_block(rng, g)])
    evidence.record("sent", "envelope", {"what": "a valid v2 envelope", **header_of(data)}, raw=data)
    outcome, _ = imported(tlkv_reader.open(versions=frozenset({1})), data, "valid v2")
    judge_refusal(outcome, ["version"], rule=V1_ONLY, data=data, versions={1},
                  what="a valid v2 envelope given to a v1-only reader")
