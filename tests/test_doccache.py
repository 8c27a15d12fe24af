"""kvconform.doccache: a document that passed is read back instead of parsed and validated; anything else is not."""

from __future__ import annotations

import datetime as dt
from pathlib import Path
from typing import Any

import pytest

from kvconform import doccache
from kvconform.catalog import CatalogError, load_catalogs
from kvconform.yamlload import safe_load


class Calls:
    """parse and validate callbacks that count their calls."""

    def __init__(self, raw: bytes, valid: bool = True) -> None:
        self.raw, self.valid = raw, valid
        self.parsed = self.validated = 0

    def parse(self) -> Any:
        self.parsed += 1
        return safe_load(self.raw)

    def validate(self, doc: Any) -> None:
        self.validated += 1
        if not self.valid:
            raise ValueError("invalid")

    def load(self, schema: bytes = b"{}") -> Any:
        return doccache.load("thing", [schema], self.raw, self.parse, self.validate)


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    folder = tmp_path / "cache"
    monkeypatch.setenv(doccache.CACHE_ENV, str(folder))
    return folder


def test_a_document_that_passed_is_read_back(cache: Path) -> None:
    first = Calls(b"a: [1, 2]\nb: {c: true}\n")
    assert first.load() == {"a": [1, 2], "b": {"c": True}}
    assert (first.parsed, first.validated) == (1, 1)
    again = Calls(first.raw)
    assert again.load() == {"a": [1, 2], "b": {"c": True}}
    assert (again.parsed, again.validated) == (0, 0)
    assert len(list(cache.glob("*.json"))) == 1


def test_other_bytes_or_another_schema_are_parsed_and_validated(cache: Path) -> None:
    Calls(b"a: 1\n").load()
    edited = Calls(b"a: 2\n")
    assert edited.load() == {"a": 2} and (edited.parsed, edited.validated) == (1, 1)
    schema = Calls(b"a: 1\n")
    schema.load(schema=b'{"type": "object"}')
    assert (schema.parsed, schema.validated) == (1, 1)


def test_an_invalid_document_is_never_kept(cache: Path) -> None:
    for _ in range(2):
        bad = Calls(b"a: 1\n", valid=False)
        with pytest.raises(ValueError, match="invalid"):
            bad.load()
        assert (bad.parsed, bad.validated) == (1, 1)
    assert not cache.exists() or not list(cache.glob("*.json"))


@pytest.mark.parametrize("raw", [b"when: 2024-01-02\n", b"1: one\n", b"x: .nan\n"])
def test_a_document_json_would_change_is_not_kept(cache: Path, raw: bytes) -> None:
    # A date, a key that is not a string, a NaN: JSON would give back something else (or nothing equal).
    for _ in range(2):
        calls = Calls(raw)
        calls.load()
        assert (calls.parsed, calls.validated) == (1, 1)
    assert not cache.exists() or not list(cache.glob("*.json"))


def test_yaml_types_survive(cache: Path) -> None:
    assert Calls(b"when: 2024-01-02\n").load() == {"when": dt.date(2024, 1, 2)}
    assert Calls(b"1: one\n").load() == {1: "one"}


def test_off_or_unwritable_only_costs_the_time(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(doccache.CACHE_ENV, "")
    assert doccache.cache_dir() is None
    for _ in range(2):
        calls = Calls(b"a: 1\n")
        assert calls.load() == {"a": 1} and (calls.parsed, calls.validated) == (1, 1)
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    monkeypatch.setenv(doccache.CACHE_ENV, str(blocker / "cache"))
    for _ in range(2):
        calls = Calls(b"a: 1\n")
        assert calls.load() == {"a": 1} and (calls.parsed, calls.validated) == (1, 1)


def test_a_corrupt_entry_is_parsed_again_and_replaced(cache: Path) -> None:
    Calls(b"a: 1\n").load()
    (entry,) = cache.glob("*.json")
    entry.write_text("{not json")
    calls = Calls(b"a: 1\n")
    assert calls.load() == {"a": 1} and calls.parsed == 1
    assert Calls(b"a: 1\n").load() == {"a": 1}
    assert entry.read_text() == '{"a": 1}'


CATALOG = """\
protocol: demo
title: Demo
source: spec/demo.txt
roles: [writer]
suites: {demo-writer: writer}
requirements:
  - {id: DEMO-ONE, section: s, level: MUST, roles: [writer], text: one}
"""


def test_catalogs_parse_once_per_process_and_again_when_edited(cache: Path, tmp_path: Path) -> None:
    folder = tmp_path / "catalogs"
    folder.mkdir()
    (folder / "demo.yaml").write_text(CATALOG)
    first = load_catalogs(folder)
    assert load_catalogs(folder) is first and first.get("DEMO-ONE").text == "one"
    (folder / "demo.yaml").write_text(CATALOG.replace("text: one", "text: one again"))
    assert load_catalogs(folder).get("DEMO-ONE").text == "one again"
    # An invalid edit is reported every time, however often the valid one was loaded.
    (folder / "demo.yaml").write_text(CATALOG.replace("level: MUST", "level: MUTS"))
    for _ in range(2):
        with pytest.raises(CatalogError, match=r"requirements\[0\].level"):
            load_catalogs(folder)
