"""Every TLKV mutant is caught, and every TLKV check catches a mutant (tests/mutants/runner.py says how).

Each mutant runs its whole suite: the TLKV suites take seconds.
"""

from __future__ import annotations

from tests.mutants import tlkv
from tests.mutants.runner import Lane

LANE = Lane(tlkv, select_checks=False)

(test_mutant_is_caught, test_every_mutant_is_listed_with_a_real_requirement,
 test_every_check_has_a_mutant_it_catches) = LANE.tests()
