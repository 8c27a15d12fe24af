"""Which exit statuses mean "could not be run at all" (the cell is inconclusive, nobody is blamed)."""

from __future__ import annotations

from pathlib import Path

import pytest

from kvconform.matrix.context import CellContext, Participant
from kvconform.matrix.registry import RunForm


def _ctx(tmp_path: Path) -> CellContext:
    native = Participant("tlkv-prefill", "native", RunForm("cmd", "prefill {decode_addr} {sequence}", None, {}),
                         {}, [1], False)
    boxed = Participant("tlkv-decode", "boxed", RunForm("cmd", "decode --port {port}", {"image": "vendor/x:1"}, {}),
                        {}, [1], False)
    return CellContext("c", tmp_path, 1, {"tlkv-prefill": native, "tlkv-decode": boxed}, tmp_path, 30.0, "0" * 16)


@pytest.mark.parametrize(("suite", "code", "expected"), [
    ("tlkv-prefill", 127, True), ("tlkv-prefill", 126, True), ("tlkv-prefill", 125, False),
    ("tlkv-prefill", 1, False), ("tlkv-prefill", None, False),
    ("tlkv-decode", 125, True), ("tlkv-decode", 127, True), ("tlkv-decode", 2, False),
])
def test_not_started_exit_statuses(tmp_path: Path, suite: str, code: int | None, expected: bool) -> None:
    assert _ctx(tmp_path).not_started(suite, code) is expected
