"""examples/vendor-pytest, a vendor's own pytest project using kvconform's fixtures and checks, runs as its README
says (plain ``pytest`` in its folder), and its verdicts land in coverage.json and junit.xml."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import pytest

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "vendor-pytest"

BROKEN = '''\
from acme_kv.writer import AcmeWriter


class BrokenWriter(AcmeWriter):
    """Writes "TLKW" for the magic (TLKV-ENV-MAGIC)."""

    def export(self, geometry, version, tokens, kv):
        data = super().export(geometry, version, tokens, kv)
        return b"TLKW" + data[4:]
'''


def _project(tmp_path: Path) -> Path:
    project = tmp_path / "vendor-pytest"
    shutil.copytree(EXAMPLE, project, ignore=shutil.ignore_patterns("out", "__pycache__"))
    return project


def _pytest(project: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
    return subprocess.run([sys.executable, "-m", "pytest", *args], cwd=project, env=env, capture_output=True,
                          text=True, timeout=300)


def _coverage(project: Path) -> dict[str, Any]:
    doc: dict[str, Any] = json.loads((project / "out" / "reports" / "coverage.json").read_text())
    return doc


def _requirement(doc: dict[str, Any], rid: str) -> dict[str, Any]:
    writer = doc["protocols"]["tlkv"]["roles"]["writer"]
    found: dict[str, Any] = next(r for r in writer["requirements"] if r["id"] == rid)
    return found


def test_the_vendor_project_runs_and_its_verdicts_land_in_the_reports(tmp_path: Path) -> None:
    project = _project(tmp_path)
    proc = _pytest(project)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    doc = _coverage(project)
    tests = {t["nodeid"]: t for t in doc["tests"]}
    own = {n: t for n, t in tests.items() if "test_acme_export_header" in n}
    assert len(own) == 2 and {t["verdict"] for t in own.values()} == {"pass"}
    assert {t["suite"] for t in tests.values()} == {"tlkv-writer"}
    assert any("test_crc[" in n for n in tests) and any("test_header_fields[" in n for n in tests)
    magic = _requirement(doc, "TLKV-ENV-MAGIC")
    assert magic["verdict"] == "pass"
    assert any("test_acme_export_header" in t["nodeid"] for t in magic["tests"])
    assert doc["meta"]["target"]["name"] == "acme-writer"
    assert doc["meta"]["target"]["pics_source"].endswith("targets.acme-writer")
    junit = ET.parse(project / "out" / "reports" / "junit.xml").getroot()
    assert [s.get("name") for s in junit.iter("testsuite")] == ["tlkv-writer"]
    assert junit.get("tests") == str(len(tests))


def test_a_broken_vendor_target_fails_the_vendors_own_check_in_coverage(tmp_path: Path) -> None:
    project = _project(tmp_path)
    (project / "acme_kv" / "broken.py").write_text(BROKEN)
    proc = _pytest(project, "--kvconform-target", "python:acme_kv.broken:BrokenWriter")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    doc = _coverage(project)
    own = {t["nodeid"].rsplit("[", 1)[1]: (t["verdict"], t["blamed"]) for t in doc["tests"]
           if "test_acme_export_header" in t["nodeid"]}
    # An ad-hoc python: target takes the testbed's defaults, which declare v1 only: v2 is not-applicable.
    assert own == {"1]": ("fail", "TLKV-ENV-MAGIC"), "2]": ("not-applicable", None)}
    assert _requirement(doc, "TLKV-ENV-MAGIC")["verdict"] == "fail"
    assert "FAILED TLKV-ENV-MAGIC [RULE] (gates;" in proc.stdout


@pytest.mark.parametrize("name", ["pytest.ini", "testbed.yaml", "README.md", "acme_kv/writer.py",
                                  "tests/test_acme_writer.py"])
def test_the_example_has_what_its_readme_lists(name: str) -> None:
    assert (EXAMPLE / name).is_file()
    assert f"`{name}`" in (EXAMPLE / "README.md").read_text() or name == "README.md"
