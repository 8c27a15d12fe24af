"""tlkv-reader: differential fuzzing against the reference reader (TLKV "Reader rules").

Seeded mutations of valid envelopes (bit flips, header fields set to boundary values, truncation,
appended bytes), most with the CRC recomputed so the deeper rules are reached.  The reader under test
must accept exactly what the reference accepts; a difference fails citing the rule the reference applied.
Replay: the same --seed gives the same cases.
"""

from __future__ import annotations

import struct

import numpy as np
import pytest

from kvconform.conformance.tlkv.malformations import full_block, header_of
from kvconform.fixtures import evidence
from kvconform.fixtures.tlkv import ReaderUnderTest
from kvconform.tlkv.envelope import encode_envelope, with_crc
from kvconform.tlkv.reader import EnvelopeError, EnvelopeReader

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


@pytest.mark.req("TLKV-READ-LENGTH", "TLKV-READ-MAGIC", "TLKV-READ-CRC", "TLKV-READ-VERSION", "TLKV-READ-DTYPE",
                 "TLKV-READ-SHAPE", "TLKV-READ-NTOKENS", "TLKV-READ-HASH-FULL", "TLKV-READ-NOALLOC")
def test_differential_fuzz(tlkv_reader: ReaderUnderTest, rng: np.random.Generator) -> None:
    g = tlkv_reader.geometry
    oracle = EnvelopeReader(g, tlkv_reader.versions)
    session = tlkv_reader.open()
    versions = sorted(tlkv_reader.versions)
    mismatches: list[str] = []
    for case in range(CASES):
        version = versions[case % len(versions)]
        base = encode_envelope(g, version, [full_block(rng, g), full_block(rng, g, max(1, g.block_tokens - 1))])
        desc, data = mutate(rng, base, g.block_tokens)
        try:
            oracle.read(data)
            want, rule = "ok", None
        except EnvelopeError as exc:
            want, rule = exc.kind, exc.requirement
        before = session.allocated()
        got = session.import_envelope(data)
        after = session.allocated()
        if (got.status == "ok") != (want == "ok"):
            verb = "accepted" if got.status == "ok" else f"refused ({got.status}: {got.message})"
            mismatches.append(f"case {case} [{desc}]: {verb}; the reference "
                              + (f"refuses it ({rule})" if rule else "accepts it"))
            evidence.record("sent", "envelope", {"case": case, "mutation": desc, **header_of(data)}, raw=data)
        elif want != "ok" and before is not None and after is not None and after != before:
            mismatches.append(f"case {case} [{desc}]: rejected but {after - before} blocks allocated "
                              f"(TLKV-READ-NOALLOC)")
    evidence.note(f"{CASES} cases, {len(mismatches)} mismatches")
    assert not mismatches, f"{len(mismatches)} of {CASES} fuzz cases differ from the reference:\n" + \
        "\n".join(mismatches[:10])
