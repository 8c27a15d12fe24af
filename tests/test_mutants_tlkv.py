"""Every TLKV mutant is caught, and every TLKV check catches a mutant (tests/mutants/runner.py says how).

A mutant's run is limited (-k) to the checks it names, as in the other lanes.
"""

from __future__ import annotations

from tests.mutants import tlkv
from tests.mutants.runner import Lane

LANE = Lane(tlkv, select_checks=True)

(test_mutant_is_caught, test_every_mutant_is_listed_with_a_real_requirement,
 test_every_check_has_a_mutant_it_catches) = LANE.tests()
