"""A Terminate read off an iWARP wire, judged twice (issue 23): which error it names (each attack's own rule) and
how its header is laid out (KBTP-WIRE-TERMINATE-HEADER, rdma-bindings §2.5, RFC 5040 §4.8).

The two are kept apart so that a failure names the rule the bug breaks: a target that detects the error and
names it with the right Code, but writes Layer and EType in the wrong nibbles of octet 0 (Linux siw,
docs/interop-rdma.md #4), has detected the error each attack checks for; only the header layout is broken, and
one check says so (test_iwarp_terminate_header). An attack check therefore accepts an octet 0 that is exactly the
nibble swap of the expected one as the same error, and says so in its pass message.
"""

from __future__ import annotations

import enum
from collections.abc import Collection

from kvconform.rdma import Terminate
from kvconform.verdicts import pass_basis

R_TERMINATE_HEADER = "KBTP-WIRE-TERMINATE-HEADER"
HDRCT_D, HDRCT_R = 0x4000, 0x2000  # octets 2-3: M|D|R in the top three bits, then 13 reserved bits (§2.5)
HDRCT_RESERVED = 0x1FFF
READ_REQUEST_HEADER = 28  # the terminated RDMAP header R announces (§2.5)
LAYERS = {0: "RDMAP", 1: "DDP", 2: "LLP"}
# The errors a Terminate can name: (Layer, EType) -> its Codes. rdma-bindings §2.6 lists the Codes per Layer and
# gives LLP the one EType 0; which RDMAP and DDP EType each Code belongs to is RFC 5040's and RFC 5041's table
# (local catastrophic has the one Code 0; Remote Operation's Codes are 0x05-0x09 and 0xFF).
DEFINED: dict[tuple[int, int], frozenset[int]] = {
    (0, 0): frozenset({0x00}), (0, 1): frozenset({0x00, 0x01, 0x02, 0x03, 0x04, 0x09, 0xFF}),
    (0, 2): frozenset({0x05, 0x06, 0x07, 0x08, 0x09, 0xFF}),
    (1, 0): frozenset({0}), (1, 1): frozenset(range(0, 5)), (1, 2): frozenset(range(1, 7)),
    (2, 0): frozenset(range(1, 8)),
}


class Named(enum.Enum):
    EXACT = "exact"  # the expected (Layer, EType, Code), laid out as §2.5 requires
    SWAPPED = "swapped"  # the expected Code with Layer and EType in each other's nibble
    OTHER = "other"  # another error


def octet0(term: Terminate) -> int:
    """Octet 0 as it arrived (Layer in the high 4 bits, EType in the low 4 when laid out right)."""
    return term.wire[0] if term.wire else (int(term.layer) << 4) | (int(term.etype) & 0x0F)


def swap(octet: int) -> int:
    return ((octet & 0x0F) << 4) | (octet >> 4)


def names(term: Terminate, layers: Collection[int], etypes: Collection[int], codes: Collection[int]) -> Named:
    """Which error ``term`` names against the expected (Layer in ``layers``, EType in ``etypes``, Code in
    ``codes``). A swapped octet 0 is read as the expected error only where that is unambiguous: the (Layer,
    EType, Code) as read names no error at all (DEFINED), so no target can have meant it. Where Layer == EType
    (DDP tagged buffer) the swap reads the same octet, and is no question."""
    o, code = octet0(term), int(term.code)
    if code not in codes:
        return Named.OTHER
    pairs = {(layer << 4) | etype for layer in layers for etype in etypes}
    if o in pairs:
        return Named.EXACT
    if swap(o) in pairs and code not in DEFINED.get((o >> 4, o & 0x0F), frozenset()):
        return Named.SWAPPED
    return Named.OTHER


def described(octet: int) -> str:
    return f"{octet:#04x} (Layer {octet >> 4}, EType {octet & 0x0F})"


def note_swap(term: Terminate, what: str) -> None:
    """The pass message of a check that accepted a swapped octet 0 as its error (KBTP-WIRE-TERMINATE-HEADER)."""
    o = octet0(term)
    pass_basis(f"{what}: the error was detected and named with the expected Code {int(term.code)}, but octet 0 "
               f"read {described(o)} is the nibble swap of {described(swap(o))}: the same error with Layer and "
               f"EType in each other's nibble, accepted here; the header layout is {R_TERMINATE_HEADER}'s, "
               "judged by test_iwarp_terminate_header")


def accepted(term: Terminate | None, layers: Collection[int], etypes: Collection[int], codes: Collection[int],
             what: str) -> bool:
    """``term`` names the expected error (exactly, or nibble-swapped: then the pass says so)."""
    if term is None:
        return False
    got = names(term, layers, etypes, codes)
    if got is Named.SWAPPED:
        note_swap(term, what)
    return got is not Named.OTHER


def layout_faults(term: Terminate, expected: int, *, terminated_ddp: int) -> list[str]:
    """What in ``term``'s header breaks §2.5, for a Terminate that names the expected error (octet 0 ``expected``
    or its swap) of an untagged segment whose DDP header is ``terminated_ddp`` octets: octet 0, the HdrCt bits
    against the copies that follow, the reserved bits."""
    wire = term.wire
    faults = []
    o = octet0(term)
    if o != expected:
        faults.append(f"octet 0 read {described(o)}; the layout requires {described(expected)}: Layer "
                      f"{LAYERS.get(expected >> 4, expected >> 4)} in the high 4 bits, EType {expected & 0x0F} in "
                      "the low 4 (Layer and EType swapped)")
    hdrct = int.from_bytes(wire[2:4], "big")
    if hdrct & HDRCT_RESERVED:
        faults.append(f"octets 2-3 read {hdrct:#06x}: the 13 Reserved bits hold {hdrct & HDRCT_RESERVED:#06x}, "
                      "they must be zero (HdrCt M|D|R is the top three bits, 0x8000|0x4000|0x2000)")
    d, r = bool(hdrct & HDRCT_D), bool(hdrct & HDRCT_R)
    if r:
        faults.append("HdrCt R is set: it announces a terminated RDMAP header (the 28-octet Read Request "
                      "header), which an untagged Send has not")
    announced = 4 + (2 + terminated_ddp if d else 0) + (READ_REQUEST_HEADER if r else 0)
    if len(wire) != announced:
        faults.append(f"the Terminate carries {len(wire)} octets, its HdrCt (D {int(d)}, R {int(r)}) announces "
                      f"{announced}: 4 of header" + (f", 2 of DDP Segment Length and the {terminated_ddp}-octet "
                                                     "terminated DDP header" if d else "")
                      + (", the 28-octet Read Request header" if r else ""))
    return faults
