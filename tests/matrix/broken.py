"""Broken implementations for the matrix's own tests, built from the mutants of ``tests/mutants/``.

``CorruptingRelay`` alters every payload it forwards, live (``AlteringRelay``: reversed on subscriptions) and
from its cache (``CorruptCacheRelay``: the last byte flipped in fills and FETCHes), so whichever way a consumer
retrieves a cache through it, what arrives is not what was published.
"""

from __future__ import annotations

from tests.mutants.moqt import AlteringRelay, CorruptCacheRelay


class CorruptingRelay(AlteringRelay, CorruptCacheRelay):
    """MOQT-RELAY-NO-MODIFY and MOQT-RELAY-CACHE-IDENTICAL: corrupts every object it forwards or serves."""
