"""The reader suite's judges: what a reader did with one envelope, blamed on the rule it got wrong.

- An envelope breaking a rule that the reader accepts: that rule fails.
- Refused with another error class than the text's: TLKV-READ-ERROR-CLASS for a format rule; the rule itself for
  the shape and version rules, whose class is their own (TLKV-READ-V1-ONLY for the v2 envelope a v1-only reader
  must refuse "cleanly"); and TLKV-READ-V2-BOTH when a v2 reader calls version 2 unsupported.
- A valid envelope refused: TLKV-READ-V2-BOTH for a v2 envelope (or any, by a v2 reader told to read both), else
  the rule the reader says failed (it applies that rule wrongly) when it names one, else TLKV-READ-ACCEPT.
- Values that differ: the layout or decode rule when the values read that way come out right, else
  TLKV-READ-VALUES.
- Allocation: only what the reader reports (ImportOutcome.allocated, or ReaderSession.allocated() before and
  after); a reader that reports neither cannot show it, and the check is inconclusive, never a pass.
"""

from __future__ import annotations

import struct
from collections.abc import Collection

import numpy as np
import numpy.typing as npt

from kvconform import evidence
from kvconform.conformance.tlkv.judging import cites, held
from kvconform.targets.tlkv import ImportOutcome, ReaderSession
from kvconform.tlkv.e4m3 import e4m3_dtype
from kvconform.tlkv.geometry import Geometry
from kvconform.tlkv.reader import Envelope
from kvconform.verdicts import check, check_one_of, inconclusive, violation

READER_RULES = ("TLKV-READ-LENGTH", "TLKV-READ-MAGIC", "TLKV-READ-CRC", "TLKV-READ-VERSION", "TLKV-READ-DTYPE",
                "TLKV-READ-SHAPE", "TLKV-READ-NTOKENS", "TLKV-READ-HASH-FULL")
V1_ONLY, V2_BOTH, ACCEPT = "TLKV-READ-V1-ONLY", "TLKV-READ-V2-BOTH", "TLKV-READ-ACCEPT"
ERROR_CLASS, VALUES, NOALLOC = "TLKV-READ-ERROR-CLASS", "TLKV-READ-VALUES", "TLKV-READ-NOALLOC"
# What a check importing a valid envelope may blame when the reader refuses it.
REFUSAL_BLAME = (ACCEPT, *READER_RULES)


def envelope_version(data: bytes) -> int | None:
    """The header's version field, when the envelope is long enough to have one."""
    return int(struct.unpack_from("<H", data, 4)[0]) if len(data) >= 6 else None


def imported(session: ReaderSession, data: bytes, what: str) -> tuple[ImportOutcome, int | None]:
    """Import `data`, with evidence; (outcome, blocks the import allocated or None when the reader cannot say)."""
    before = session.allocated()
    outcome = session.import_envelope(data)
    after = session.allocated()
    allocated = outcome.allocated
    if allocated is None and before is not None and after is not None:
        allocated = after - before
    evidence.record("received", "import-outcome", {"envelope": what, "status": outcome.status,
                                                   "requirement": outcome.requirement, "message": outcome.message,
                                                   "blocks": len(outcome.blocks), "allocated": allocated})
    return outcome, allocated


def judge_refusal(outcome: ImportOutcome, acceptable: Collection[str], *, rule: str, data: bytes,
                  versions: Collection[int], what: str) -> None:
    """An envelope that breaks `rule` (`what` says how) is refused, with an acceptable error class."""
    check(outcome.status != "ok", f"{what}: the reader accepted it", req=rule, seen="ok",
          expected=f"a refusal ({' or '.join(acceptable)})")
    if envelope_version(data) == 2 and 2 in versions and "version" not in acceptable and cites(V2_BOTH):
        check(outcome.status != "version", f"{what}: a v2 reader refused version 2 as a version it does not read",
              req=V2_BOTH, seen=f"{outcome.status}: {outcome.message}", expected=" or ".join(acceptable))
    check_one_of(outcome.status, acceptable, what=f"{what}: error class ({outcome.message})",
                 req=class_requirement(rule))


def class_requirement(rule: str) -> str:
    """What a refusal of the wrong error class breaks. The shape and version rules have a class of their own
    (TL_ESHAPE; "refused cleanly, as a version error"): a reader answering another class for them did not apply
    the rule (something later refused the bytes), so the rule is blamed; a format rule answered with another
    class is TLKV-READ-ERROR-CLASS."""
    return rule if rule in (V1_ONLY, "TLKV-READ-SHAPE", "TLKV-READ-VERSION") else ERROR_CLASS


def judge_accepted(outcome: ImportOutcome, *, data: bytes, versions: Collection[int], what: str) -> None:
    """A valid envelope (`what`) of a version the reader declares is imported."""
    if outcome.status == "ok":
        # Accepting a valid envelope is the other half of every rule: none was applied where it does not fail.
        for rule in (ACCEPT, *READER_RULES) + ((V2_BOTH,) if 2 in versions else ()):
            held(rule, what)
        return
    refused = f"{what}: refused ({outcome.status}: {outcome.message})"
    if 2 in versions and cites(V2_BOTH):
        violation(f"{refused}; a v2 reader reads both versions", req=V2_BOTH,
                  seen=outcome.status, expected=f"ok (v{envelope_version(data)} is read)")
    named = outcome.requirement
    if named is not None and named in READER_RULES and cites(named):
        violation(f"{refused}: the envelope passes {named}, which the reader says failed: it applies that rule "
                  "wrongly", req=named, seen=outcome.status, expected="ok")
    violation(f"{refused}: it breaks no reader rule", req=ACCEPT, seen=outcome.status, expected="ok")


def judge_blocks(outcome: ImportOutcome, want: list[tuple[int, int]], what: str) -> None:
    """The accepted envelope yields exactly its blocks: hashes and fills, in order (TLKV-READ-VALUES)."""
    seen = [(b.block_hash, b.n_tokens) for b in outcome.blocks]
    check(seen == want, f"{what}: the imported blocks (block_hash, n_tokens)", req=VALUES,
          seen=[(f"0x{h:016X}", n) for h, n in seen], expected=[(f"0x{h:016X}", n) for h, n in want])


def _swapped(values: npt.NDArray[np.floating], g: Geometry) -> npt.NDArray[np.floating]:
    """Values read as if the payload were [L][Hkv][2][B][D], in the text's order."""
    L, _, hkv, b, d = g.kv_shape
    return np.ascontiguousarray(values).reshape(L, hkv, 2, b, d).transpose(0, 2, 1, 3, 4)


def judge_values(got: npt.NDArray[np.floating], env: Envelope, i: int, fill: int, what: str) -> None:
    """Block i's decoded values at filled positions equal the envelope's: v1 bit for bit, v2 e4m3 * scale."""
    g = env.geometry
    want = np.asarray(env.kv(i), np.float32)
    got32 = np.asarray(got, np.float32).reshape(g.kv_shape)

    def same(a: npt.NDArray[np.floating], b: npt.NDArray[np.floating]) -> bool:
        return bool(np.array_equal(np.asarray(a, np.float32)[:, :, :, :fill, :].view(np.uint32),
                                   np.asarray(b, np.float32)[:, :, :, :fill, :].view(np.uint32)))

    layout = "TLKV-V1-LAYOUT" if env.version == 1 else "TLKV-V2-LAYOUT"
    if same(got32, want):
        held(VALUES, what)
        held(layout, what)
        if env.version == 2:
            held("TLKV-V2-DECODE", what)
        return
    if g.n_kv_heads > 1 and same(got32, _swapped(want, g)) and cites(layout):
        violation(f"{what}: block {i}'s values are those of an [L][Hkv][2][B][D] layout", req=layout,
                  expected="[L][2][Hkv][B][D] (axis 1: 0 = K, 1 = V)")
    if env.version == 2 and cites("TLKV-V2-DECODE"):
        raw = np.frombuffer(bytes(env.records[i].payload), np.uint8, g.elements).view(e4m3_dtype()).astype(np.float32)
        if same(got32, raw.reshape(g.kv_shape)):
            violation(f"{what}: block {i}'s values are the e4m3 bytes without their slab's scale",
                      req="TLKV-V2-DECODE", expected="e4m3_to_f32(byte) * scale")
    bad = np.argwhere(got32[:, :, :, :fill, :].view(np.uint32) != want[:, :, :, :fill, :].view(np.uint32))
    at = tuple(int(x) for x in bad[0])
    violation(f"{what}: block {i}: {len(bad)} value(s) at filled positions differ; first at [layer, k/v, head, "
              f"token, dim] = {list(at)}", req=VALUES, seen=float(got32[at]), expected=float(want[at]))


def judge_nothing_allocated(outcome: ImportOutcome, allocated: int | None, what: str) -> None:
    """A refused envelope leaves nothing allocated (TLKV-READ-NOALLOC); inconclusive when the reader cannot show
    its allocations."""
    if outcome.status == "ok":
        inconclusive(f"{what}: the reader accepted it, so there is no rejection whose allocations to judge "
                     "(the rule's own check fails)")
    if allocated is None:
        inconclusive(f"{what}: the reader does not report what it allocated (a python: ReaderSession.allocated() "
                     "or ImportOutcome.allocated, a cmd: reader's \"allocated\" result field), so whether the "
                     "rejection allocated nothing cannot be observed")
    check(allocated == 0, f"{what}: blocks allocated by a rejected envelope", req=NOALLOC, seen=allocated,
          expected=0)
