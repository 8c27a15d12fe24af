"""Recorded disagreements of the Linux kernel's rxe and siw (Debian bookworm, 6.1) with the rules the KBTP
suites enforce, per host<->VM run (tests/rdma_vm/test_interop.py): the failing check (its function name, with
parameters) and why. Each is triaged with its evidence in docs/interop-rdma.md; a recorded check that stops
failing fails its run's test, so the record follows the kernel.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

KNOWN: dict[str, dict[str, str]] = {
    "host-roce-to-rxe1": {},
    "host-iwarp-to-siw1": {},
    "rxe1-to-host-roce": {},
    "siw1-to-host-iwarp": {},
}


def still_failing(doc: Mapping[str, Any], check: str) -> bool:
    return any(t["nodeid"].endswith(check) and t["verdict"] == "fail" for t in doc["tests"])
