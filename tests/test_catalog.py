"""Requirement catalogs: loading, schema validation, id rules, lookups."""

from __future__ import annotations

from pathlib import Path

import pytest

from kvconform.catalog import CATALOG_DIR_ENV, CatalogError, default_catalog_dir, load_catalogs
from kvconform.verdicts import Verdict, gates, strongest_level

HEADER = """\
protocol: demo
title: Demo
source: demo.txt
roles: [reader, writer]
suites: {demo-reader: reader, demo-writer: writer}
requirements:
"""


def _write(tmp_path: Path, body: str, name: str = "demo.yaml", header: str = HEADER) -> Path:
    (tmp_path / name).write_text(header + body)
    return tmp_path


def test_loads_requirements_and_suites(tmp_path: Path) -> None:
    _write(tmp_path, """\
  - {id: DEMO-A, section: Intro, level: MUST, roles: [reader], text: " a ", quote: q, source: issue-1}
  - {id: DEMO-B-2, section: Intro, level: RULE, roles: [writer], text: b, testable: false, why: internal}
""")
    cat = load_catalogs(tmp_path)
    a = cat.get("DEMO-A")
    assert (a.protocol, a.level, a.roles, a.text, a.quote, a.source, a.testable) == (
        "demo", "MUST", ("reader",), "a", "q", "issue-1", True)
    assert cat.get("DEMO-B-2").testable is False and cat.get("DEMO-B-2").why == "internal"
    assert [r.id for r in cat.requirements("demo")] == ["DEMO-A", "DEMO-B-2"]
    assert cat.requirements("other") == []
    assert cat.role_of_suite("demo-writer") == "writer"
    assert cat.role_of_suite("demo-nope") is None and cat.role_of_suite("x-y") is None
    with pytest.raises(KeyError, match="DEMO-Z"):
        cat.get("DEMO-Z")


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        ("  - {id: DEMO-A, section: S, level: MUST, roles: [reader], text: a}\n"
         "  - {id: DEMO-A, section: S, level: MAY, roles: [reader], text: b}\n", "duplicate id 'DEMO-A'"),
        ("  - {id: demo-a, section: S, level: MUST, roles: [reader], text: a}\n", r"\$.requirements\[0\].id"),
        ("  - {id: OTHER-A, section: S, level: MUST, roles: [reader], text: a}\n", "protocol prefix 'DEMO-'"),
        ("  - {id: DEMO-A, section: S, level: OUGHT, roles: [reader], text: a}\n", r"requirements\[0\].level"),
        ("  - {id: DEMO-A, section: S, level: MUST, roles: [nobody], text: a}\n", "role 'nobody'"),
        ("  - {id: DEMO-A, section: S, level: MUST, roles: [reader], text: a, testable: false}\n", "'why'"),
    ],
)
def test_invalid_catalogs_name_file_and_field(tmp_path: Path, body: str, expected: str) -> None:
    _write(tmp_path, body)
    with pytest.raises(CatalogError, match=expected) as info:
        load_catalogs(tmp_path)
    assert str(tmp_path / "demo.yaml") in str(info.value)


def test_duplicate_ids_across_files(tmp_path: Path) -> None:
    _write(tmp_path, "  - {id: DEMO-A, section: S, level: MUST, roles: [reader], text: a}\n")
    _write(tmp_path, "  - {id: DEMO-A, section: S, level: MUST, roles: [reader], text: a}\n", "b.yaml",
           HEADER.replace("protocol: demo", "protocol: demo"))
    with pytest.raises(CatalogError, match="already defined"):
        load_catalogs(tmp_path)


def test_env_override_and_default(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _write(tmp_path, "  - {id: DEMO-A, section: S, level: MUST, roles: [reader], text: a}\n")
    monkeypatch.setenv(CATALOG_DIR_ENV, str(tmp_path))
    assert default_catalog_dir() == tmp_path
    assert "DEMO-A" in load_catalogs()
    monkeypatch.delenv(CATALOG_DIR_ENV)
    packaged = default_catalog_dir()
    assert packaged.name == "requirements" and (packaged / "schema.json").is_file()


def test_packaged_catalogs_are_valid() -> None:
    cat = load_catalogs()
    for req in cat:
        assert req.id.startswith(req.protocol.upper() + "-")


def test_levels() -> None:
    assert strongest_level(["MAY", "SHOULD", "RULE"]) == "RULE"
    assert strongest_level([]) is None
    assert gates("MUST NOT", strict=False) and not gates("SHOULD", strict=False)
    assert gates("SHOULD NOT", strict=True) and not gates("MAY", strict=True)
    assert Verdict("not-applicable") is Verdict.NOT_APPLICABLE


def test_depends_on_names_a_declared_provisional_profile(tmp_path: Path) -> None:
    header = HEADER.replace("requirements:\n", "provisional: {demo-prov-1: stand-in}\nrequirements:\n")
    _write(tmp_path, "  - {id: DEMO-A, section: S, level: RULE, roles: [reader], text: a, depends_on: [demo-prov-1]}\n"
                     "  - {id: DEMO-B, section: S, level: RULE, roles: [reader], text: b}\n", header=header)
    cat = load_catalogs(tmp_path)
    assert cat.get("DEMO-A").depends_on == ("demo-prov-1",) and cat.get("DEMO-B").depends_on == ()
    assert cat.protocols["demo"].provisional == {"demo-prov-1": "stand-in"}
    _write(tmp_path, "  - {id: DEMO-A, section: S, level: RULE, roles: [reader], text: a, depends_on: [other-1]}\n",
           header=header)
    with pytest.raises(CatalogError, match=r"requirements\[0\]\.depends_on: 'other-1' of DEMO-A is not declared"):
        load_catalogs(tmp_path)
    _write(tmp_path, "  - {id: DEMO-A, section: S, level: RULE, roles: [reader], text: a, depends_on: []}\n",
           header=header)
    with pytest.raises(CatalogError, match=r"depends_on"):
        load_catalogs(tmp_path)


def test_kvcs_provisional_kvsp_requirements_are_marked() -> None:
    """Issue 5: every KVCS-KVSP-* rule comes from the issue and depends on the provisional KVSP profile."""
    cat = load_catalogs()
    kvsp = [r for r in cat.requirements("kvcs") if r.id.startswith("KVCS-KVSP-")]
    assert kvsp, "the provisional KVSP rules are catalogued"
    assert all(r.depends_on == ("kvsp-provisional-1",) and r.source == "issue-5" for r in kvsp)
    assert "kvsp-provisional-1" in cat.protocols["kvcs"].provisional
