"""tlkv-reader: differential fuzzing against the reference reader (TLKV "Reader rules").

Seeded mutations of valid envelopes (bit flips, header fields set to boundary values, truncation,
appended bytes), most with the CRC recomputed so the deeper rules are reached.  The reader under test
must accept exactly what the reference accepts; a difference fails citing the rule the reference applied.
Every malformation of the rule checks comes first, so each rule is exercised whatever the seed. A mismatch is
blamed on the rule the reference applied (the reader accepted what that rule refuses), or, for a valid envelope
the reader refused, on TLKV-READ-V2-BOTH (a v2 reader), the rule the reader names, or TLKV-READ-ACCEPT. Error
classes are not compared: when a mutation breaks two rules the text fixes no order between them. Replay: the same
--seed gives the same cases.
"""

from __future__ import annotations

import struct

import numpy as np
import pytest

from kvconform import evidence
from kvconform.conformance.tlkv.malformations import MALFORMATIONS, applicable, full_block, header_of
from kvconform.conformance.tlkv.reader.judge import ACCEPT, NOALLOC, READER_RULES, REFUSAL_BLAME, V2_BOTH, imported
from kvconform.fixtures.tlkv import ReaderUnderTest
from kvconform.tlkv.envelope import encode_envelope, with_crc
from kvconform.tlkv.geometry import Geometry
from kvconform.tlkv.reader import EnvelopeError, EnvelopeReader
from kvconform.verdicts import Findings

CASES = 300
HEADER_FIELDS = {"version": (4, "<H"), "dtype": (6, "<H"), "n_blocks": (8, "<I"), "block_tokens": (12, "<I"),
                 "n_layers": (16, "<I"), "n_kv_heads": (20, "<I"), "head_dim": (24, "<I")}
BOUNDARY = [0, 1, 2, 3, 0xFF, 0xFFFF, 0x7FFFFFFF, 0xFFFFFFFF]


def mutate(rng: np.random.Generator, data: bytes, b: int) -> tuple[str, bytes]:
    """One random mutation, described for the evidence."""
    op = int(rng.integers(0, 5))
    buf = bytearray(data)
    if op == 0:
        pos = int(rng.integers(0, len(buf)))
        buf[pos] ^= 1 << int(rng.integers(0, 8))
        out, desc = bytes(buf), f"flip bit at {pos}"
    elif op == 1:
        name = list(HEADER_FIELDS)[int(rng.integers(0, len(HEADER_FIELDS)))]
        off, fmt = HEADER_FIELDS[name]
        value = int(rng.choice(BOUNDARY)) & (0xFFFF if fmt == "<H" else 0xFFFFFFFF)
        struct.pack_into(fmt, buf, off, value)
        out, desc = bytes(buf), f"header.{name} = {value}"
    elif op == 2:
        rec = int(rng.integers(0, 2))
        off = 28 + rec * (len(data) - 32) // 2 + 8
        value = int(rng.choice([0, 1, b - 1, b, b + 1, 0xFFFFFFFF])) & 0xFFFFFFFF
        struct.pack_into("<I", buf, off, value)
        out, desc = bytes(buf), f"records[{rec}].n_tokens = {value}"
    elif op == 3:
        cut = int(rng.integers(0, len(buf)))
        out, desc = bytes(buf[:cut]), f"truncate to {cut}"
    else:
        extra = rng.bytes(int(rng.integers(1, 9)))
        out, desc = bytes(buf[:-4]) + extra + bytes(buf[-4:]), f"insert {len(extra)} bytes before the CRC"
    if len(out) >= 4 and rng.random() < 0.75:
        out, desc = with_crc(out), desc + ", CRC recomputed"
    return desc, out


def _seed_cases(g: Geometry, versions: list[int], rng: np.random.Generator) -> list[tuple[str, bytes]]:
    """One case per malformation first, so every rule is exercised whatever the seed."""
    out: list[tuple[str, bytes]] = []
    for m in MALFORMATIONS:
        v = versions[len(out) % len(versions)]
        if applicable(m, g, v):
            out.append((f"malformation {m.id} (v{v})", m.build(g, v, [full_block(rng, g) for _ in range(m.n_blocks)])))
    return out


@pytest.mark.req(*READER_RULES, NOALLOC, *REFUSAL_BLAME, V2_BOTH)
def test_differential_fuzz(tlkv_reader: ReaderUnderTest, rng: np.random.Generator) -> None:
    g = tlkv_reader.geometry
    oracle = EnvelopeReader(g, tlkv_reader.versions)
    session = tlkv_reader.open()
    versions = sorted(tlkv_reader.versions)
    findings = Findings(f"{CASES} fuzz cases against the reference reader")
    cases = _seed_cases(g, versions, rng)
    for case in range(CASES - len(cases)):
        version = versions[case % len(versions)]
        base = encode_envelope(g, version, [full_block(rng, g), full_block(rng, g, max(1, g.block_tokens - 1))])
        cases.append(mutate(rng, base, g.block_tokens))
    unobserved = 0
    for case, (desc, data) in enumerate(cases):
        try:
            oracle.read(data)
            rule = None
        except EnvelopeError as exc:
            rule = exc.requirement
        got, allocated = imported(session, data, f"case {case}")
        where = f"case {case} [{desc}]"
        if got.status == "ok" and rule is None:
            findings.expect(True, ACCEPT, "")
            if 2 in tlkv_reader.versions:
                findings.expect(True, V2_BOTH, "")
        elif got.status != "ok" and rule is None:
            evidence.record("sent", "envelope", {"case": case, "mutation": desc, **header_of(data)}, raw=data)
            # The reference accepts it: the reader refused a valid envelope.
            blame = (V2_BOTH if 2 in tlkv_reader.versions
                     else got.requirement if got.requirement in READER_RULES else ACCEPT)
            findings.add(blame, f"{where}: refused ({got.status}: {got.message}); the reference accepts it")
        elif rule is not None:
            findings.expect(got.status != "ok", rule, f"{where}: accepted; the reference refuses it ({rule})")
            if got.status == "ok":
                evidence.record("sent", "envelope", {"case": case, "mutation": desc, **header_of(data)}, raw=data)
            elif allocated is None:
                unobserved += 1
            else:
                findings.expect(allocated == 0, NOALLOC, f"{where}: rejected, but {allocated} block(s) allocated")
    evidence.note(f"{len(cases)} cases, {len(findings.problems)} problems, {unobserved} rejections whose "
                  "allocations the reader did not report")
    findings.judge()
