"""A target that changes between runs while its identity stays the same: the reference TLKV reader, or, when
$KVCONFORM_TEST_SKIP_CRC is set in the run's environment, the mutant that never checks the CRC (TLKV-READ-CRC).
``python:tests.store.flipping:reader`` is one implementation to the store; its CRC checks flip with the variable,
which is what a flaky check looks like from outside."""

from __future__ import annotations

import os

from kvconform.targets.tlkv import ReferenceReader
from tests.mutants.tlkv import SkipsCrcReader

__all__ = ["SKIP_CRC_ENV", "TARGET", "reader"]

SKIP_CRC_ENV = "KVCONFORM_TEST_SKIP_CRC"
TARGET = "python:tests.store.flipping:reader"


def reader() -> ReferenceReader:
    """The reader this run gets."""
    return SkipsCrcReader() if os.environ.get(SKIP_CRC_ENV) else ReferenceReader()
