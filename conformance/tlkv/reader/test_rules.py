"""tlkv-reader: every reader rule broken one at a time (TLKV "Reader rules").

The reader must refuse each envelope with the acceptable error class (outcomes.yaml) and allocate
nothing; a broken rule in the last of three records catches readers that allocate as they go.
"""

from __future__ import annotations

import numpy as np
import pytest

from kvconform.conformance.tlkv.malformations import (
    MALFORMATIONS,
    Malformation,
    acceptable,
    applicable,
    full_block,
    header_of,
)
from kvconform.fixtures import evidence
from kvconform.fixtures.tlkv import ReaderUnderTest
from kvconform.targets.spec import Pics
from kvconform.tlkv.envelope import encode_envelope
from kvconform.verdicts import check_one_of, not_applicable


def _readable_version(reader: ReaderUnderTest) -> int:
    return 1 if 1 in reader.versions else min(reader.versions)


@pytest.mark.parametrize("m", [pytest.param(m, marks=pytest.mark.req(*m.requirements), id=m.id)
                               for m in MALFORMATIONS])
@pytest.mark.req("TLKV-READ-NOALLOC", "TLKV-READ-ERROR-CLASS")
def test_rule(m: Malformation, tlkv_reader: ReaderUnderTest, rng: np.random.Generator) -> None:
    g, v = tlkv_reader.geometry, _readable_version(tlkv_reader)
    if not applicable(m, g):
        not_applicable(f"{m.id} needs block_tokens >= {m.min_block_tokens}, "
                    f"the declared pool geometry has {g.block_tokens}")
    blocks = [full_block(rng, g) for _ in range(m.n_blocks)]
    data = m.build(g, v, blocks)
    session = tlkv_reader.open()
    before = session.allocated()
    evidence.record("sent", "envelope", {"malformation": m.id, **header_of(data)}, raw=data)
    outcome = session.import_envelope(data)
    evidence.record("received", "import-outcome", {"status": outcome.status, "requirement": outcome.requirement,
                                                   "message": outcome.message})
    check_one_of(outcome.status, acceptable("reader", m), what=f"outcome of {m.id}",
                  req=m.requirements[0])
    after = session.allocated()
    if before is not None and after is not None:
        assert after == before, f"{after - before} blocks allocated for a rejected envelope (TLKV-READ-NOALLOC)"


@pytest.mark.req("TLKV-READ-V1-ONLY", "TLKV-READ-ERROR-CLASS")
def test_v1_only_reader_refuses_v2_cleanly(tlkv_reader: ReaderUnderTest, pics: Pics,
                                           rng: np.random.Generator) -> None:
    if tlkv_reader.versions != frozenset({1}):
        pics.require("tlkv.reader.v1_only_mode")
    g = tlkv_reader.geometry
    session = tlkv_reader.open(versions=frozenset({1}))
    data = encode_envelope(g, 2, [full_block(rng, g)])
    before = session.allocated()
    outcome = session.import_envelope(data)
    evidence.record("received", "import-outcome", {"status": outcome.status, "message": outcome.message})
    check_one_of(outcome.status, ["version"], what="a v1-only reader's outcome for a valid v2 envelope",
                  req="TLKV-READ-V1-ONLY")
    assert session.allocated() == before


@pytest.mark.req("TLKV-READ-V2-BOTH", "TLKV-READ-VALUES")
@pytest.mark.parametrize("version", [1, 2])
def test_v2_reader_reads_both(version: int, tlkv_reader: ReaderUnderTest, pics: Pics,
                              rng: np.random.Generator) -> None:
    pics.require("tlkv.reader.versions", 2)
    g = tlkv_reader.geometry
    data = encode_envelope(g, version, [full_block(rng, g), full_block(rng, g, max(1, g.block_tokens - 1))])
    outcome = tlkv_reader.open().import_envelope(data)
    assert outcome.status == "ok", f"a v2 reader refused a valid v{version} envelope: {outcome.message}"
    assert len(outcome.blocks) == 2
