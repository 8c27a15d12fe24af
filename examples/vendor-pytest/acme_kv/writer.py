"""ACME's tl_kv_export, as kvconform reaches it: an object with the tlkv-writer driver Protocol's ``export``.

kvconform.targets.tlkv.Writer is the Protocol: ``export(geometry, version, tokens, kv) -> bytes``, the
envelope of the token sequence's blocks. This example delegates to kvconform's reference encoder where a
vendor would call its own library (through ctypes, cffi, a subprocess, ...).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import numpy.typing as npt

from kvconform.tlkv.envelope import encode_sequence
from kvconform.tlkv.geometry import Geometry


class AcmeWriter:
    """ACME's writer: one envelope per exported token sequence."""

    def export(self, geometry: Geometry, version: int, tokens: Sequence[int],
               kv: npt.NDArray[np.float16]) -> bytes:
        return encode_sequence(geometry, version, tokens, kv)
