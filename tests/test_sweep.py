"""`--sweep`: the boundary values run by default, the wide ones only when asked, and the report says which."""

from __future__ import annotations

import json
import textwrap

import pytest

from kvconform import sweep
from tests.test_plugin import CATALOG

pytest_plugins = ["pytester"]

SUITE = """\
import pytest
from kvconform import sweep
from kvconform.verdicts import check

@pytest.mark.req("DEMO-MUST")
@pytest.mark.parametrize("slots", sweep.pick([1, 8], wide=[8, 2, 64]))
def test_ring(slots):
    check(slots > 0, "slots", req="DEMO-MUST", seen=slots, expected="> 0")
"""


def test_pick_keeps_boundary_first_and_drops_repeats() -> None:
    before = sweep.level()
    try:
        sweep.set_level("boundary")
        assert sweep.pick([1, 8], wide=[8, 2]) == [1, 8]
        sweep.set_level("wide")
        assert sweep.pick([1, 8], wide=[8, 2, 2]) == [1, 8, 2]
        with pytest.raises(ValueError, match="--sweep 'widest': expected one of boundary, wide"):
            sweep.set_level("widest")
    finally:
        sweep.set_level(before)


@pytest.mark.parametrize(("args", "cases", "level"), [((), ["1", "8"], "boundary"),
                                                      (("--kvconform-sweep", "wide"), ["1", "8", "2", "64"], "wide")])
def test_sweep_level_reaches_collection_and_report(pytester: pytest.Pytester, args: tuple[str, ...],
                                                   cases: list[str], level: str) -> None:
    (pytester.path / "catalog").mkdir()
    (pytester.path / "catalog" / "demo.yaml").write_text(CATALOG)
    folder = pytester.path / "conformance" / "demo" / "reader"
    folder.mkdir(parents=True)
    (folder / "test_ring.py").write_text(textwrap.dedent(SUITE))
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "--import-mode=importlib",
                                           "--kvconform-catalog-dir", "catalog", "--kvconform-report-dir", "out",
                                           *args, timeout=120)
    assert result.ret == 0, result.stdout.str()
    doc = json.loads((pytester.path / "out" / "coverage.json").read_text())
    ran = [t["nodeid"].split("[", 1)[1].rstrip("]") for t in doc["tests"]]
    assert ran == cases
    assert doc["identity"]["run"]["sweep"] == level
