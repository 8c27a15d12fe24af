"""Every KBTP mutant is caught, and every KBTP check catches a mutant (tests/mutants/runner.py says how);
the reference passes the suites with every feature enabled and with each feature disabled.

A mutant's run is limited (-k) to the checks it names.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from kvconform.catalog import load_catalogs
from tests.mutants import kbtp
from tests.mutants.runner import ROOT, Lane
from tests.spawn import covering

LANE = Lane(kbtp, select_checks=True, timeout=600)
UNTRUSTED = kbtp.UNTRUSTED_PICS

(test_mutant_is_caught, test_every_mutant_is_listed_with_a_real_requirement,
 test_every_check_has_a_mutant_it_catches) = LANE.tests()

FEATURES = ["DIRECT_LOAD", "DIRECT_ALLOC", "ADDR_LE"]
REFERENCE_RUNS = {
    "target-all": ("kbtp-target", ()),
    "target-ib-all": ("kbtp-target", ("kbtp.target.binding=ib-rc", "kbtp.target.features=[DIRECT_LOAD, DIRECT_ALLOC, "
                                      "RECORD_COMPLETION, ADDR_LE]")),
    **{f"target-without-{f}": ("kbtp-target", (f"kbtp.target.features=[{', '.join(x for x in FEATURES if x != f)}]",))
       for f in FEATURES},
    "target-none": ("kbtp-target", ("kbtp.target.features=[]",)),
    "initiator-all": ("kbtp-initiator", ()),
    "initiator-ib-all": ("kbtp-initiator", ("kbtp.initiator.binding=ib-rc", "kbtp.initiator.features=[DIRECT_LOAD, "
                                            "DIRECT_ALLOC, RECORD_COMPLETION, ADDR_LE]")),
    **{f"initiator-without-{f}": ("kbtp-initiator",
                                  (f"kbtp.initiator.features=[{', '.join(x for x in FEATURES if x != f)}]",))
       for f in FEATURES},
}


@pytest.mark.slow
@pytest.mark.parametrize("variant", sorted(REFERENCE_RUNS))
@covering(LANE.timeout)
def test_reference_passes(variant: str, tmp_path: Path) -> None:
    suite, pics = REFERENCE_RUNS[variant]
    # Declared untrusted Initiator IDs (the declaration KBTP-DIRECT-TRUST is checked against) in every target run.
    trust = (UNTRUSTED,) if suite == "kbtp-target" else ()
    run = LANE.run(suite, "reference", tmp_path, (*pics, *trust, "kbtp.target.interleavings=30"))
    assert run.coverage, run.output
    bad = [(t["nodeid"], t.get("message", "")) for t in run.coverage["tests"]
           if t["verdict"] in ("fail", "inconclusive")]
    assert run.code == 0 and not bad, f"{suite} ({variant}) against the reference: exit {run.code}, {bad}\n{run.output}"


def test_every_testable_kbtp_requirement_is_cited() -> None:
    """The KBTP counterpart of tests/test_requirements_cited.py (which reads the TLKV suites)."""
    catalog = load_catalogs()
    ids = {r.id for r in catalog.requirements("kbtp")}
    cited: set[str] = set()
    for path in (ROOT / "conformance" / "kbtp").glob("*/test_*.py"):
        text = path.read_text()
        # ids in req markers, and in the requirement tuples of Case(...) / Malformed(...) tables
        markers = re.findall(r"pytest\.mark\.req\(([^)]*)\)", text)
        tables = re.findall(r'(?:Case|Malformed)\("[^"]+", \(?([^)]*?)\)?,', text)
        tables += re.findall(r'^R_[A-Z_]+ = ("KBTP-[A-Z0-9-]+")', text, re.M)  # per-case ids named once
        for ids_text in markers + tables:
            cited.update(re.findall(r'"(KBTP-[A-Z0-9-]+)"', ids_text))
    assert cited <= ids, f"checks cite ids the catalog lacks: {sorted(cited - ids)}"
    testable = {r.id for r in catalog.requirements("kbtp") if r.testable}
    assert not testable - cited, f"testable requirements no check cites: {sorted(testable - cited)}"
