"""Every testable requirement of the TLKV catalog is cited by at least one check, and only real ids are cited.

The citations are read by collecting the suites (pytest --collect-only), so parametrised markers count.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from kvconform.catalog import load_catalogs

ROOT = Path(__file__).resolve().parents[1]

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
code = pytest.main(["--collect-only", "-q", "-p", "no:cacheprovider", "--import-mode=importlib",
                    "conformance/tlkv"], plugins=[cited])
print("CITED " + json.dumps(sorted(cited.ids)))
sys.exit(int(code))
"""


def test_every_testable_requirement_is_cited() -> None:
    proc = subprocess.run([sys.executable, "-c", COLLECT], cwd=ROOT, capture_output=True, text=True, timeout=120,
                          stdin=subprocess.DEVNULL)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    line = next(x for x in proc.stdout.splitlines() if x.startswith("CITED "))
    cited = set(json.loads(line.removeprefix("CITED ")))
    catalog = load_catalogs()
    ids = {r.id for r in catalog.requirements("tlkv")}
    assert cited <= ids, f"checks cite ids the catalog lacks: {sorted(cited - ids)}"
    testable = {r.id for r in catalog.requirements("tlkv") if r.testable}
    assert not testable - cited, f"testable requirements no check cites: {sorted(testable - cited)}"
