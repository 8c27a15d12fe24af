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
    "host-iwarp-to-siw1": {
        # docs/interop-rdma.md #4: siw writes its Terminate header with little-endian bitfields, Layer in the low
        # nibble of octet 0 and EType in the high one, HdrCt M|D|R in the low bits of octet 2: the one rule it
        # breaks is the header's layout. It detects every attacked error and names it with the right Code, so
        # the attacks (a bad FPDU CRC, Reads past the pool, an MSN out of range, an MO past the buffer) pass on
        # their own rules, their pass messages saying the octet arrived nibble-swapped
        "test_iwarp_terminate_header": "siw: Terminate Layer and EType swapped, HdrCt in the low bits (RFC 5040 §4.8)",
    },
    "rxe1-to-host-roce": {},
    "siw1-to-host-iwarp": {},
}


def still_failing(doc: Mapping[str, Any], check: str) -> bool:
    return any(t["nodeid"].endswith(check) and t["verdict"] == "fail" for t in doc["tests"])
