"""The CPU slots the xdist workers share (tests/cpu_slots.py): as many tokens as made, each held by one test at a
time, given back when it ends; a worker that finds none within the bound runs its test anyway."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests import cpu_slots


def test_a_slot_is_held_by_one_test_at_a_time(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    first, second = cpu_slots.Slots(tmp_path, 1), cpu_slots.Slots(tmp_path, 1)
    assert first.created and not second.created, "the second worker opens the slots the first made"
    monkeypatch.setattr(cpu_slots, "WAIT", 0.2)
    with first.held():
        assert second._take() == b"", "the only slot is taken: the bound passes and the test runs without one"
    token = second._take()
    assert token == b"+", "given back when the test ended"
    assert first._take() == b""
    second.close()
    first.close()
    assert not tmp_path.exists(), "the worker that made the slots removes them"
