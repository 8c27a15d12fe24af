"""ACME's own checks of its writer, written with kvconform's fixtures and assertion API, next to two of
kvconform's packaged writer checks run on it as they are.

Every check names the requirements it enforces (``@pytest.mark.req``, ids of kvconform's catalog) and, being
outside kvconform's ``conformance/<proto>/<role>/`` folders, its suite (``pytest.mark.suite``): its verdict
then lands in coverage.json under that role like the packaged checks' do.
"""

from __future__ import annotations

import numpy as np
import pytest

# kvconform's own checks, collected here as if written here; `export` is the module fixture they read.
from kvconform.conformance.tlkv.writer.test_envelope import export, test_crc, test_header_fields  # noqa: F401
from kvconform.targets.spec import Pics
from kvconform.targets.tlkv import Writer
from kvconform.tlkv.geometry import Geometry
from kvconform.verdicts import check, check_equal

pytestmark = pytest.mark.suite("tlkv-writer")

# ACME's production geometry: 61 layers, so 128·g/L rounds differently from floor and ceil.
GEOMETRY = Geometry(block_tokens=16, n_layers=61, n_kv_heads=1, head_dim=8)


def _kv(rng: np.random.Generator, n_tokens: int) -> np.ndarray:
    """Values of every block: [n_blocks][layers][K, V][kv heads][block tokens][head dim]."""
    n_blocks = -(-n_tokens // GEOMETRY.block_tokens)
    return rng.standard_normal((n_blocks, *GEOMETRY.kv_shape)).astype(np.float16)


@pytest.mark.req("TLKV-ENV-MAGIC", "TLKV-ENV-VERSION")
@pytest.mark.parametrize("version", [1, 2])
def test_acme_export_header(version: int, tlkv_writer: Writer, pics: Pics, rng: np.random.Generator) -> None:
    pics.require("tlkv.writer.versions", version)  # not-applicable unless the testbed declares the version
    tokens = [int(t) for t in rng.integers(0, 1 << 32, size=40, dtype=np.uint64)]
    data = tlkv_writer.export(GEOMETRY, version, tokens, _kv(rng, len(tokens)))
    check(len(data) >= 6, "envelope length", req="TLKV-ENV-MAGIC", seen=len(data), expected=">= 6")
    check_equal("envelope[0:4] (magic)", data[:4], b"TLKV", req="TLKV-ENV-MAGIC")
    check_equal("envelope[4:6] (version, u16 LE)", int.from_bytes(data[4:6], "little"), version,
                req="TLKV-ENV-VERSION")
