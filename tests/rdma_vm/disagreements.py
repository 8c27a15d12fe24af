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
        # docs/interop-rdma.md #4: siw ends the stream on a bad FPDU CRC with Layer LLP, EType 0, Code 2 (MPA
        # CRC error), but writes the octet as 0x02 instead of 0x20 (its Terminate bitfields put Layer in the low
        # nibble on a little-endian host): read per RFC 5040 it is Layer RDMAP, EType 2
        "test_iwarp_attack[bad-fpdu-crc]": "siw: Terminate Layer and EType swapped (RFC 5040 §7.3.1)",
        # the same swap in issue 23's attacks: siw's code is right (base or bounds violation, invalid MO, invalid MSN
        # range), its Layer (RDMAP, DDP) and EType (Remote Protection, untagged buffer) arrive swapped
        "test_read_past_the_pool[past-the-pool-end]": "siw: Terminate Layer and EType swapped (RFC 5040 §7.3.1)",
        "test_read_past_the_pool[straddling-the-pool-end]": "siw: Terminate Layer and EType swapped (RFC 5040 §7.3.1)",
        "test_iwarp_untagged_errors[mo-past-the-buffer]": "siw: Terminate Layer and EType swapped (RFC 5040 §7.3.1)",
        "test_iwarp_untagged_errors[msn-out-of-range]": "siw: Terminate Layer and EType swapped (RFC 5040 §7.3.1)",
    },
    "rxe1-to-host-roce": {},
    "siw1-to-host-iwarp": {},
}


def still_failing(doc: Mapping[str, Any], check: str) -> bool:
    return any(t["nodeid"].endswith(check) and t["verdict"] == "fail" for t in doc["tests"])
