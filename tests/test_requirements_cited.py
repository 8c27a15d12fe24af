"""Every testable requirement of a role that has a suite is cited by at least one check; only real ids are cited.

The citations are read by collecting the suites (pytest --collect-only), so parametrised markers count.
A role whose suite is not built yet is listed in PENDING_ROLES with the issue that builds it; its
requirements may stay uncited (the coverage report shows them "uncovered"), but nothing may cite an id
the catalog lacks.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from kvconform.catalog import load_catalogs

ROOT = Path(__file__).resolve().parents[1]

# (protocol, role) -> why no suite covers it yet.
PENDING_ROLES: dict[tuple[str, str], str] = {}

COLLECT = """
import json, sys
import pytest

class Cited:
    ids = set()
    def pytest_collection_modifyitems(self, items):
        for item in items:
            for mark in item.iter_markers("req"):
                self.ids.update(mark.args)

cited = Cited()
code = pytest.main(["--collect-only", "-q", "-p", "no:cacheprovider", "--import-mode=importlib", "conformance"],
                   plugins=[cited])
print("CITED " + json.dumps(sorted(cited.ids)))
sys.exit(int(code))
"""


@pytest.fixture(scope="module")
def cited() -> set[str]:
    """The requirement ids the checks under conformance/ cite."""
    proc = subprocess.run([sys.executable, "-c", COLLECT], cwd=ROOT, capture_output=True, text=True, timeout=300,
                          stdin=subprocess.DEVNULL)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    line = next(x for x in proc.stdout.splitlines() if x.startswith("CITED "))
    return set(json.loads(line.removeprefix("CITED ")))


def test_only_catalogued_ids_are_cited(cited: set[str]) -> None:
    catalog = load_catalogs()
    unknown = sorted(req for req in cited if req not in catalog)
    assert not unknown, f"checks cite ids no catalog has: {unknown}"


@pytest.mark.parametrize("protocol", sorted(load_catalogs().protocols))
def test_every_testable_requirement_of_a_suited_role_is_cited(protocol: str, cited: set[str]) -> None:
    catalog = load_catalogs()
    suited = {role for role in catalog.protocols[protocol].roles if (protocol, role) not in PENDING_ROLES}
    must_cite = {r.id for r in catalog.requirements(protocol) if r.testable and suited & set(r.roles)}
    missing = sorted(must_cite - cited)
    assert not missing, f"{protocol}: testable requirements of suited roles that no check cites: {missing}"
