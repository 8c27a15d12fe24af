"""TLKV test vectors: generators and reference checkers for the five TLKV kinds (TLKV text, every section).

Kinds: tlkv-fnv1a64, tlkv-crc32c, tlkv-block-hash, tlkv-envelope (writer), tlkv-envelope-read (reader).
The text's worked examples are hand-written constants here, each quoted in its case comment; every other
case is generated from fixed seeds with `random.Random` (stable across Python versions), so
`kvconform vectors generate` is reproducible byte for byte.
"""

from __future__ import annotations

import random
import struct
import zlib
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

from kvconform.checksum import crc32c
from kvconform.testvectors import Checker, VectorCase, make_document
from kvconform.tlkv.blockhash import ZERO_HASH_TOKENS, block_hash, block_hashes, fnv1a64
from kvconform.tlkv.envelope import (
    DTYPE_OF_VERSION,
    HEADER,
    Block,
    EncodeError,
    encode_envelope,
    encode_raw,
    encode_sequence,
    sequence_blocks,
)
from kvconform.tlkv.geometry import CRC_SIZE, HEADER_SIZE, RECORD_HEADER_SIZE, Geometry
from kvconform.tlkv.kvhex import kv_from_hex, kv_to_hex
from kvconform.tlkv.layers import craft
from kvconform.tlkv.payload import F16, encode_payload
from kvconform.tlkv.reader import EnvelopeError, read_envelope

__all__ = [
    "CHECKERS",
    "FILES",
    "KIND_BLOCK_HASH",
    "KIND_CRC32C",
    "KIND_ENVELOPE",
    "KIND_ENVELOPE_READ",
    "KIND_FNV1A64",
    "field_at",
    "generate",
]

KIND_FNV1A64 = "tlkv-fnv1a64"
KIND_CRC32C = "tlkv-crc32c"
KIND_BLOCK_HASH = "tlkv-block-hash"
KIND_ENVELOPE = "tlkv-envelope"
KIND_ENVELOPE_READ = "tlkv-envelope-read"
FILES = {
    KIND_FNV1A64: "tlkv/fnv1a64.json",
    KIND_CRC32C: "tlkv/crc32c.json",
    KIND_BLOCK_HASH: "tlkv/block_hash.json",
    KIND_ENVELOPE: "tlkv/envelope.json",
    KIND_ENVELOPE_READ: "tlkv/envelope_read.json",
}
SCHEMA = "tlkv.schema.json"
GENERATOR = "kvconform.tlkv.vectors"
SOURCE = "spec/seeds/002_886df638f1c32f75.txt"

# The text's worked example (TLKV "Worked example (v1)"), byte for byte as printed there.
SPEC_V1_ENVELOPE = bytes.fromhex(
    "54 4c 4b 56 01 00 01 00 01 00 00 00 02 00 00 00"
    "01 00 00 00 01 00 00 00 02 00 00 00"
    "66 93 7b 02 c1 b0 1a a9 02 00 00 00"
    "00 3c 00 40 00 42 00 44"
    "00 38 00 bc 00 00 00 34"
    "1c 54 0b 4f"
)
SPEC_V1_GEOMETRY = Geometry(block_tokens=2, n_layers=1, n_kv_heads=1, head_dim=2)
# K = [[1, 2], [3, 4]], V = [[0.5, -1], [0, 0.25]] as f16 [L][2][Hkv][B][D], little-endian.
SPEC_V1_KV = bytes.fromhex("003c004000420044" "003800bc00000034")
SPEC_BLOCK_HASHES = (0xA91AB0C1027B9366, 0x03DF829571605C60, 0)  # B = 2, tokens [1, 2, 3, 4, 5]


def _u64(x: int) -> str:
    return f"0x{x:016X}"


def _u32(x: int) -> str:
    return f"0x{x:08X}"


def _int(text: str) -> int:
    return int(text, 16)


def _case(comment: str, flags: Sequence[str], result: str = "valid", **fields: Any) -> dict[str, Any]:
    return {"tcId": 0, "comment": comment, "flags": list(flags), "result": result, **fields}


def _document(kind: str, notes: dict[str, str], groups: list[dict[str, Any]]) -> dict[str, Any]:
    return make_document(kind, notes, groups, schema=SCHEMA, generator=GENERATOR, source=SOURCE)


def field_at(data: bytes, offset: int) -> str:
    """The envelope field that byte `offset` of `data` belongs to, by the header's own values."""
    names = (("magic", 4), ("version", 2), ("dtype", 2), ("n_blocks", 4), ("block_tokens", 4),
             ("n_layers", 4), ("n_kv_heads", 4), ("head_dim", 4))
    start = 0
    for name, size in names:
        if offset < start + size:
            return name
        start += size
    if offset >= len(data) - CRC_SIZE:
        return "crc32c"
    try:
        _, version, _, _, b, layers, hkv, d = HEADER.unpack_from(data)
        p = Geometry(b, layers, hkv, d).payload_size(version)
    except (struct.error, ValueError):
        return "body"
    i, within = divmod(offset - HEADER_SIZE, RECORD_HEADER_SIZE + p)
    if within < 8:
        return f"records[{i}].block_hash"
    if within < RECORD_HEADER_SIZE:
        return f"records[{i}].n_tokens"
    return f"records[{i}].payload[{within - RECORD_HEADER_SIZE}]"


def _first_difference(seen: bytes, expected: bytes) -> str:
    for i, (a, b) in enumerate(zip(seen, expected, strict=False)):
        if a != b:
            return f"first difference at byte {i} ({field_at(expected, i)}): got {a:02x}, expected {b:02x}"
    return f"length: got {len(seen)}, expected {len(expected)}"


# ---- checkers ------------------------------------------------------------------------------


def _equal_or_not(case: VectorCase, what: str, seen: Any, expected: Any) -> str | None:
    if case.result == "valid" and seen != expected:
        return f"{what}: reference computes {seen}, the vector expects {expected}"
    if case.result == "invalid" and seen == expected:
        return f"{what}: the vector marks {expected} invalid, but the reference computes exactly that"
    return None


def check_fnv1a64(case: VectorCase) -> str | None:
    return _equal_or_not(case, "fnv1a64", _u64(fnv1a64(bytes.fromhex(case["input"]))), case["hash"])


def check_crc32c(case: VectorCase) -> str | None:
    return _equal_or_not(case, "crc32c", _u32(crc32c(bytes.fromhex(case["input"]))), case["crc"])


def check_block_hash(case: VectorCase) -> str | None:
    seen = [_u64(h) for h in block_hashes(case["tokens"], case["block_tokens"])]
    return _equal_or_not(case, "hashes", seen, case["hashes"])


def check_envelope(case: VectorCase) -> str | None:
    """Writer vectors: the reference writer's envelope of (tokens, kv) against the vector's bytes."""
    geometry = Geometry.from_dict(case["geometry"])
    tokens = case["tokens"]
    n = len(block_hashes(tokens, geometry.block_tokens))
    kv = kv_from_hex(case["kv"], geometry, n)
    try:
        seen = encode_sequence(geometry, case["version"], tokens, kv)
    except EncodeError as exc:
        return f"reference writer refused the input: {exc}"
    expected = bytes.fromhex(case["envelope"])
    if case.result == "valid" and seen != expected:
        return f"envelope: {_first_difference(seen, expected)}"
    if case.result == "invalid" and seen == expected:
        return f"envelope: marked invalid ({case['requirement']}) but the reference writes exactly these bytes"
    return None


def check_envelope_read(case: VectorCase) -> str | None:
    """Reader vectors: accept with the listed records, or reject with the error kind and requirement."""
    geometry = Geometry.from_dict(case["geometry"])
    data = bytes.fromhex(case["envelope"])
    try:
        env = read_envelope(data, geometry=geometry, versions=case["versions"])
    except EnvelopeError as exc:
        if case.result == "valid":
            return f"reference reader rejected it: {exc.kind} error {exc}"
        if (exc.kind, exc.requirement) != (case["error"], case["requirement"]):
            return (f"error: got {exc.kind} {exc.requirement} ({exc}), "
                    f"expected {case['error']} {case['requirement']}")
        return None
    if case.result == "invalid":
        return f"accepted by the reference reader, expected a {case['error']} error ({case['requirement']})"
    seen = [{"block_hash": _u64(r.block_hash), "n_tokens": r.n_tokens} for r in env.records]
    if seen != case["records"]:
        return f"records: got {seen}, expected {case['records']}"
    return None


CHECKERS: dict[str, Checker] = {
    KIND_FNV1A64: check_fnv1a64,
    KIND_CRC32C: check_crc32c,
    KIND_BLOCK_HASH: check_block_hash,
    KIND_ENVELOPE: check_envelope,
    KIND_ENVELOPE_READ: check_envelope_read,
}


# ---- generators ----------------------------------------------------------------------------


def _fnv1a64_document() -> dict[str, Any]:
    rng = random.Random(0x7F1A)
    b0, b1 = SPEC_BLOCK_HASHES[:2]
    tests = [
        _case("TLKV \"Block hash\": \"Test vector for the byte function alone: fnv1a64(\\\"a\\\") = "
              "0xAF63DC4C8601EC8C\"", ["SpecExample"], input=b"a".hex(), hash=_u64(0xAF63DC4C8601EC8C)),
        _case("TLKV \"Block hash\" worked example, block 0: bytes hashed \"00 00 00 00 00 00 00 00 01 00 00 00 "
              "02 00 00 00\" -> 0xA91AB0C1027B9366", ["SpecExample", "BlockHashInput"],
              input="0000000000000000" "01000000" "02000000", hash=_u64(b0)),
        _case("TLKV \"Block hash\" worked example, block 1: bytes hashed \"66 93 7b 02 c1 b0 1a a9 03 00 00 00 "
              "04 00 00 00\" -> 0x03DF829571605C60", ["SpecExample", "BlockHashInput"],
              input="66937b02c1b01aa9" "03000000" "04000000", hash=_u64(b1)),
        _case("empty input: the offset basis 0xCBF29CE484222325", ["EmptyInput"], input="",
              hash=_u64(fnv1a64(b""))),
        _case("\"foobar\"", [], input=b"foobar".hex(), hash=_u64(fnv1a64(b"foobar"))),
        _case("one zero byte", [], input="00", hash=_u64(fnv1a64(b"\0"))),
        _case("one 0xFF byte", [], input="ff", hash=_u64(fnv1a64(b"\xff"))),
    ]
    for length in (1, 2, 7, 8, 12, 20, 31, 64, 76):
        data = rng.randbytes(length)
        tests.append(_case(f"random {length} bytes", ["Random"], input=data.hex(), hash=_u64(fnv1a64(data))))
    notes = {
        "SpecExample": "A value printed in the TLKV text itself; hand-written here, not computed.",
        "BlockHashInput": "The exact bytes H hashes for a block: le_u64(parent) || le_u32 of each token.",
        "EmptyInput": "No bytes: the result is the FNV offset basis.",
        "Random": "Generated from a fixed seed; expected value from the reference implementation.",
    }
    return _document(KIND_FNV1A64, notes, [{"type": "Fnv1a64Test", "tests": tests}])


def _crc32c_document() -> dict[str, Any]:
    rng = random.Random(0xC3C)
    tests = [
        _case("TLKV \"Export envelope\": \"its check value is crc32c(\\\"123456789\\\") = 0xE3069283\"",
              ["SpecExample"], input=b"123456789".hex(), crc=_u32(0xE3069283)),
        _case("TLKV \"Worked example (v1)\": the 56 bytes before the CRC -> \"crc32c 0x4F0B541C\"",
              ["SpecExample", "EnvelopeBody"], input=SPEC_V1_ENVELOPE[:-CRC_SIZE].hex(), crc=_u32(0x4F0B541C)),
        _case("empty input", ["EmptyInput"], input="", crc=_u32(crc32c(b""))),
        _case("one zero byte", [], input="00", crc=_u32(crc32c(b"\0"))),
        _case("32 zero bytes", [], input="00" * 32, crc=_u32(crc32c(bytes(32)))),
        _case("32 0xFF bytes", [], input="ff" * 32, crc=_u32(crc32c(b"\xff" * 32))),
        _case("bytes 0..31 ascending", [], input=bytes(range(32)).hex(), crc=_u32(crc32c(bytes(range(32))))),
    ]
    for length in (1, 3, 4, 5, 15, 16, 17, 63, 64, 65, 200):
        data = rng.randbytes(length)
        tests.append(_case(f"random {length} bytes", ["Random"], input=data.hex(), crc=_u32(crc32c(data))))
    tests.append(_case("CRC-32 (zlib polynomial) of \"123456789\" is not CRC-32C", ["NotCastagnoli"], "invalid",
                       input=b"123456789".hex(), crc=_u32(zlib.crc32(b"123456789"))))
    notes = {
        "SpecExample": "A value printed in the TLKV text itself; hand-written here, not computed.",
        "EnvelopeBody": "Every byte of an envelope before its CRC field.",
        "EmptyInput": "No bytes: init and final XOR cancel, the CRC is 0.",
        "Random": "Generated from a fixed seed; expected value from the reference implementation.",
        "NotCastagnoli": "The IEEE CRC-32 (zlib) value: an implementation using the wrong polynomial "
                         "computes it (TLKV-ENV-CRC).",
    }
    return _document(KIND_CRC32C, notes, [{"type": "Crc32cTest", "tests": tests}])


def _hash_case(comment: str, flags: Sequence[str], b: int, tokens: Sequence[int]) -> dict[str, Any]:
    return _case(comment, flags, tokens=list(tokens), hashes=[_u64(h) for h in block_hashes(tokens, b)])


def _block_hash_document() -> dict[str, Any]:
    rng = random.Random(0xB10C)
    u32max = 0xFFFFFFFF
    spec = [1, 2, 3, 4, 5]
    b2 = [
        _case("TLKV \"Block hash\" worked example, B = 2, tokens [1, 2, 3, 4, 5]: 0xA91AB0C1027B9366, "
              "0x03DF829571605C60, 0 (\"partial: not hashed\")", ["SpecExample", "PartialTail"],
              tokens=spec, hashes=[_u64(h) for h in SPEC_BLOCK_HASHES]),
        _hash_case("tokens [1, 2, 3, 4]: an exact multiple of B, no tail", ["ExactMultiple"], 2, [1, 2, 3, 4]),
        _hash_case("one token: a single partial block", ["PartialTail"], 2, [1]),
        _hash_case("no tokens: no blocks", ["EmptySequence"], 2, []),
        _hash_case("token values 0 and 0xFFFFFFFF", ["ExtremeTokens", "PartialTail"], 2, [0, u32max, u32max, 0, 0]),
        _hash_case("random 9 tokens", ["Random", "PartialTail"], 2, [rng.getrandbits(32) for _ in range(9)]),
        _case("the partial tail given a hash H(parent, [5]) instead of 0", ["PartialTailHashed"], "invalid",
              tokens=spec, hashes=[_u64(h) for h in (*SPEC_BLOCK_HASHES[:2], block_hash(SPEC_BLOCK_HASHES[1], [5]))]),
        _case("block 1 hashed with parent 0 instead of block 0's hash", ["Unchained"], "invalid",
              tokens=[1, 2, 3, 4], hashes=[_u64(SPEC_BLOCK_HASHES[0]), _u64(block_hash(0, [3, 4]))]),
        _case("tokens hashed as big-endian u32", ["BigEndianTokens"], "invalid", tokens=[1, 2],
              hashes=[_u64(fnv1a64(bytes(8) + struct.pack(">II", 1, 2)) or 1)]),
    ]
    b1 = [
        _hash_case("B = 1: every token is a full block", ["SingleTokenBlocks"], 1, [7]),
        _hash_case("B = 1 with token values 0 and 0xFFFFFFFF", ["SingleTokenBlocks", "ExtremeTokens"], 1,
                   [0, u32max, 0, u32max]),
        _hash_case("B = 1, random 6 tokens", ["SingleTokenBlocks", "Random"], 1,
                   [rng.getrandbits(32) for _ in range(6)]),
    ]
    b3 = [
        _hash_case("B = 3, random 10 tokens", ["Random", "PartialTail"], 3, [rng.getrandbits(32) for _ in range(10)]),
        _hash_case("B = 3, random 9 tokens", ["Random", "ExactMultiple"], 3, [rng.getrandbits(32) for _ in range(9)]),
    ]
    b16 = [
        _hash_case("B = 16 (the engine's): 16 tokens 0..15", ["EngineBlockSize", "ExactMultiple"], 16, range(16)),
        _hash_case("B = 16: 15 tokens, a partial block only", ["EngineBlockSize", "PartialTail"], 16, range(15)),
        _hash_case("B = 16: 33 tokens, two full blocks and a tail of 1", ["EngineBlockSize", "PartialTail"], 16,
                   [rng.getrandbits(32) for _ in range(33)]),
        _hash_case("B = 16: 32 tokens alternating 0 and 0xFFFFFFFF", ["EngineBlockSize", "ExactMultiple",
                   "ExtremeTokens"], 16, [0, u32max] * 16),
        _hash_case("B = 16: 48 zero tokens (equal blocks still hash differently through the chain)",
                   ["EngineBlockSize", "ExactMultiple", "ExtremeTokens"], 16, [0] * 48),
        _hash_case("B = 16: block 0's fnv1a64 is 0, so its hash is 1; block 1 chains from parent 1",
                   ["EngineBlockSize", "ZeroHash"], 16, [*ZERO_HASH_TOKENS, *range(100, 116), 7]),
        _case("B = 16: block 0's fnv1a64 is 0 and the writer keeps 0 (no hash) instead of 1", ["NoZeroReplacement"],
              "invalid", tokens=list(ZERO_HASH_TOKENS), hashes=[_u64(0)]),
    ]
    notes = {
        "SpecExample": "A value printed in the TLKV text itself; hand-written here, not computed.",
        "PartialTail": "The last block is partial: its entry is 0, \"no hash\" (TLKV-HASH-FULL-ONLY).",
        "ExactMultiple": "The sequence is an exact multiple of B: every block is full and hashed.",
        "EmptySequence": "No tokens, no blocks, no hashes.",
        "ExtremeTokens": "Token values 0 and 0xFFFFFFFF: le_u32 encoding at both ends (TLKV-HASH-H).",
        "SingleTokenBlocks": "B = 1: each token is its own full block.",
        "EngineBlockSize": "B = 16, the block size the engine uses.",
        "Random": "Generated from a fixed seed; expected values from the reference implementation.",
        "PartialTailHashed": "A writer that hashes the partial tail (TLKV-HASH-FULL-ONLY).",
        "Unchained": "A writer that hashes each block with parent 0 (TLKV-HASH-CHAIN).",
        "ZeroHash": "Tokens whose block-0 fnv1a64 is 0 (found by lattice reduction, tools/zero_hash_search.py): "
                    "H replaces 0 by 1 (TLKV-HASH-ZERO-IS-ONE).",
        "NoZeroReplacement": "A writer that keeps a computed 0, the reserved \"no hash\" (TLKV-HASH-ZERO-IS-ONE).",
        "BigEndianTokens": "A writer that serialises tokens big-endian (TLKV-HASH-H, TLKV-ENV-LE).",
    }
    groups = [{"type": "BlockHashTest", "block_tokens": b, "tests": t} for b, t in ((2, b2), (1, b1), (3, b3),
                                                                                    (16, b16))]
    return _document(KIND_BLOCK_HASH, notes, groups)


def _random_kv(rng: random.Random, geometry: Geometry, tokens: Sequence[int], *, scale: float = 4.0,
               garbage: float = 64.0) -> npt.NDArray[np.float16]:
    """Values for each block of `tokens`; positions past a block's fill hold non-zero garbage larger
    than any filled value, so a writer that neither zeroes nor excludes them is caught."""
    fills = [len(tokens[i : i + geometry.block_tokens]) for i in range(0, len(tokens), geometry.block_tokens)]
    shape = (len(fills), *geometry.kv_shape)
    flat = [rng.uniform(-scale, scale) for _ in range(int(np.prod(shape)))]
    kv = np.array(flat, np.float32).reshape(shape)
    for i, fill in enumerate(fills):
        pad = kv[i, :, :, :, fill:, :]
        pad[...] = np.array([rng.choice((-1.0, 1.0)) * rng.uniform(garbage / 2, garbage)
                             for _ in range(pad.size)], np.float32).reshape(pad.shape)
    return kv.astype(np.float16)


def _writer_case(comment: str, flags: Sequence[str], geometry: Geometry, version: int, tokens: Sequence[int],
                 kv: npt.NDArray[np.floating]) -> dict[str, Any]:
    flags = [*flags, "E4m3Rounding"] if version == 2 else list(flags)
    return _case(comment, flags, tokens=list(tokens), kv=kv_to_hex(kv),
                 envelope=encode_sequence(geometry, version, tokens, kv).hex())


def _bad_writer_cases(rng: random.Random, geometry: Geometry, version: int) -> list[dict[str, Any]]:
    """Outputs a faulty writer produces for a (full, full, partial) sequence, each one rule broken."""
    b = geometry.block_tokens
    tokens = [rng.getrandbits(32) for _ in range(2 * b + 1)]
    kv = _random_kv(rng, geometry, tokens)
    blocks = sequence_blocks(geometry, tokens, kv)
    good = encode_envelope(geometry, version, blocks)

    def bad(comment: str, flag: str, requirement: str, envelope: bytes) -> dict[str, Any]:
        flags = [flag, "E4m3Rounding"] if version == 2 else [flag]
        return _case(comment, flags, "invalid", tokens=tokens, kv=kv_to_hex(kv), envelope=envelope.hex(),
                     requirement=requirement)

    def raw(payloads: Sequence[bytes]) -> bytes:
        g = geometry
        return encode_raw(version=version, dtype=DTYPE_OF_VERSION[version], block_tokens=g.block_tokens,
                          n_layers=g.n_layers, n_kv_heads=g.n_kv_heads, head_dim=g.head_dim,
                          records=[(x.block_hash, x.n_tokens, p) for x, p in zip(blocks, payloads, strict=True)])

    unpadded = [encode_payload(geometry, version, x.kv, x.n_tokens) for x in blocks]
    unpadded[-1] = encode_payload(geometry, version, blocks[-1].kv, b)
    if version == 2:  # scales over all positions, but the padding zeroed: only the scale rule is broken
        tail = np.frombuffer(unpadded[-1], np.uint8).copy()
        tail[: geometry.elements].reshape(geometry.kv_shape)[:, :, :, blocks[-1].n_tokens :, :] = 0
        cases = [bad("v2 scale from every position of the tail block, not only its filled ones",
                     "ScaleOverAllPositions", "TLKV-V2-SCALE", raw([*unpadded[:-1], tail.tobytes()]))]
        cases.append(bad("dtype 1 (f16) in a v2 envelope", "WrongDtype", "TLKV-ENV-DTYPE",
                         craft(geometry, version, blocks, dtype=1)))
    else:
        cases = [bad("positions past the tail's fill copied from the input instead of zeroed",
                     "PaddingNotZeroed", "TLKV-V1-ZERO-PAD", raw(unpadded))]
    cases += [
        bad("the partial tail given a hash", "PartialTailHashed", "TLKV-HASH-FULL-ONLY",
            craft(geometry, version, blocks, **{"records[2].block_hash": block_hash(blocks[1].block_hash,
                                                                                    tokens[2 * b :])})),
        bad("block 1 hashed with parent 0", "Unchained", "TLKV-HASH-CHAIN",
            craft(geometry, version, blocks, **{"records[1].block_hash": block_hash(0, tokens[b : 2 * b])})),
        bad("the tail's n_tokens written as B", "FillNotWritten", "TLKV-ENV-NTOKENS",
            craft(geometry, version, blocks, **{"records[2].n_tokens": b})),
        bad("CRC-32 (zlib polynomial) instead of CRC-32C", "NotCastagnoli", "TLKV-ENV-CRC",
            good[:-CRC_SIZE] + struct.pack("<I", zlib.crc32(good[:-CRC_SIZE]))),
    ]
    return cases


def _envelope_document() -> dict[str, Any]:
    rng = random.Random(0xE1)
    spec_kv = np.frombuffer(SPEC_V1_KV, F16).reshape((1, *SPEC_V1_GEOMETRY.kv_shape))
    spec_group = {"type": "EnvelopeWriteTest", "geometry": SPEC_V1_GEOMETRY.as_dict(), "version": 1, "tests": [
        _case("TLKV \"Worked example (v1)\": B = 2, L = 1, Hkv = 1, D = 2, one full block holding tokens [1, 2], "
              "K = [[1, 2], [3, 4]], V = [[0.5, -1], [0, 0.25]]: the 60 bytes printed, ending "
              "\"1c 54 0b 4f crc32c 0x4F0B541C\" (its block_hash is the chain hash of [1, 2])", ["SpecExample"],
              tokens=[1, 2], kv=SPEC_V1_KV.hex(), envelope=SPEC_V1_ENVELOPE.hex()),
    ]}
    groups = [spec_group]
    spec_v2 = [_writer_case("the worked example's block, written as v2", ["SpecInput"], SPEC_V1_GEOMETRY, 2,
                            [1, 2], spec_kv)]
    groups.append({"type": "EnvelopeWriteTest", "geometry": SPEC_V1_GEOMETRY.as_dict(), "version": 2,
                   "tests": spec_v2})
    plans: list[tuple[Geometry, list[tuple[int, list[str]]]]] = [
        (Geometry(2, 1, 1, 2), [(3, ["PartialTail"]), (1, ["ShortBlock"]), (0, ["ZeroBlocks"])]),
        (Geometry(1, 1, 1, 1), [(2, ["ExactMultiple"])]),
        (Geometry(3, 2, 1, 4), [(7, ["PartialTail"]), (6, ["ExactMultiple"]), (2, ["ShortBlock"])]),
        (Geometry(4, 1, 2, 3), [(10, ["PartialTail"]), (3, ["ShortBlock"])]),
        (Geometry(16, 1, 1, 2), [(20, ["EngineBlockSize", "PartialTail"]), (16, ["EngineBlockSize"]),
                                 (5, ["EngineBlockSize", "ShortBlock"])]),
    ]
    for geometry, plan in plans:
        for version in (1, 2):
            tests = []
            for count, flags in plan:
                tokens = [rng.getrandbits(32) for _ in range(count)]
                kv = _random_kv(rng, geometry, tokens)
                tests.append(_writer_case(f"{count} tokens, geometry {geometry}", flags, geometry, version,
                                          tokens, kv))
            if geometry == Geometry(4, 1, 2, 3) and version == 2:
                tokens = [rng.getrandbits(32) for _ in range(6)]
                kv = _random_kv(rng, geometry, tokens)
                kv[0, 0, 1, 1, :, :] = 0  # block 0, layer 0, V, head 1: a filled slab of zeros
                kv[1, 0, 0, 0, :2, :] = 0  # block 1 (fill 2), K head 0: zero where filled, garbage past it
                tests.append(_writer_case("v2 slabs whose amax is 0 (scale 1.0), one with garbage past the fill",
                                          ["AmaxZero", "PartialTail"], geometry, version, tokens, kv))
                tests.append(_writer_case("v2 block of all zeros: every scale 1.0", ["AmaxZero"], geometry,
                                          version, tokens[:4], np.zeros((1, *geometry.kv_shape), np.float16)))
            if geometry == Geometry(3, 2, 1, 4):
                tests.extend(_bad_writer_cases(rng, geometry, version))
            groups.append({"type": "EnvelopeWriteTest", "geometry": geometry.as_dict(), "version": version,
                           "tests": tests})
    notes = {
        "SpecExample": "A value printed in the TLKV text itself; hand-written here, not computed.",
        "SpecInput": "The worked example's block contents in another format; expected bytes from the reference.",
        "PartialTail": "The last block is partial: hash 0, positions past its fill are zero bytes although the "
                       "input holds non-zero garbage there (TLKV-V1-ZERO-PAD, TLKV-V2-ZERO-PAD).",
        "ShortBlock": "Fewer tokens than B: one partial block, n_tokens < B, hash 0.",
        "ExactMultiple": "Every block is full and hashed.",
        "ZeroBlocks": "No tokens: an envelope of n_blocks = 0, 32 bytes (header and CRC only).",
        "EngineBlockSize": "B = 16, the block size the engine uses.",
        "AmaxZero": "A slab whose filled values are all zero: scale 1.0 (TLKV-V2-SCALE).",
        "E4m3Rounding": "Byte-exactness relies on our reading of the e4m3 conversion of tinyllm/numerics.h, "
                        "which is not available: round-to-nearest-even of x / scale computed in f32, with "
                        "scale = amax / 448 in f32 (TLKV-V2-E4M3).",
        "ScaleOverAllPositions": "A writer whose v2 amax includes positions past the fill (TLKV-V2-SCALE).",
        "WrongDtype": "A v2 envelope whose dtype is not 3 (TLKV-ENV-DTYPE).",
        "PaddingNotZeroed": "A writer that copies positions past the fill instead of zeroing (TLKV-V1-ZERO-PAD).",
        "PartialTailHashed": "A writer that hashes the partial tail (TLKV-HASH-FULL-ONLY).",
        "Unchained": "A writer that hashes each block with parent 0 (TLKV-HASH-CHAIN).",
        "FillNotWritten": "A writer that writes n_tokens = B for a partial block (TLKV-ENV-NTOKENS).",
        "NotCastagnoli": "An envelope whose CRC is the IEEE CRC-32 (zlib) (TLKV-ENV-CRC).",
    }
    return _document(KIND_ENVELOPE, notes, groups)


def _read_case(comment: str, flags: Sequence[str], envelope: bytes, *, error: str | None = None,
               requirement: str | None = None, records: Sequence[tuple[int, int]] = ()) -> dict[str, Any]:
    if error is None:
        return _case(comment, flags, envelope=envelope.hex(),
                     records=[{"block_hash": _u64(h), "n_tokens": n} for h, n in records])
    return _case(comment, flags, "invalid", envelope=envelope.hex(), error=error, requirement=requirement)


def _envelope_read_document() -> dict[str, Any]:
    rng = random.Random(0x4EAD)
    pool = Geometry(3, 2, 1, 2)
    b = pool.block_tokens

    def seq(count: int, version: int, geometry: Geometry = pool) -> tuple[list[Block], bytes]:
        tokens = [rng.getrandbits(32) for _ in range(count)]
        blocks = sequence_blocks(geometry, tokens, _random_kv(rng, geometry, tokens))
        return blocks, encode_envelope(geometry, version, blocks)

    def recs(blocks: Sequence[Block]) -> list[tuple[int, int]]:
        return [(x.block_hash, x.n_tokens) for x in blocks]

    v1_blocks, v1 = seq(5, 1)  # one full block and a tail of 2
    v2_blocks, v2 = seq(5, 2)
    full_blocks, _ = seq(3, 1)
    empty_v1 = encode_envelope(pool, 1, [])

    def fmt(comment: str, flags: Sequence[str], requirement: str, envelope: bytes) -> dict[str, Any]:
        return _read_case(comment, flags, envelope, error="format", requirement=requirement)

    def c(**overrides: Any) -> bytes:  # the v1 base with `overrides`, CRC recomputed
        return craft(pool, 1, v1_blocks, **overrides)

    unhashed = [Block(0, b, full_blocks[0].kv)]
    tests = [
        _read_case("v1: a full block and a partial tail with hash 0", ["PartialTail"], v1, records=recs(v1_blocks)),
        _read_case("v2: a full block and a partial tail with hash 0", ["PartialTail", "V2ReadsBoth"], v2,
                   records=recs(v2_blocks)),
        _read_case("v1: one full block", [], encode_envelope(pool, 1, full_blocks), records=recs(full_blocks)),
        _read_case("v1: a full block with hash 0 (unregistered)", ["UnhashedFullBlock"],
                   encode_envelope(pool, 1, unhashed), records=recs(unhashed)),
        _read_case("v1: n_blocks = 0, 32 bytes", ["ZeroBlocks"], empty_v1),
        _read_case("v2: n_blocks = 0, 32 bytes", ["ZeroBlocks"], encode_envelope(pool, 2, [])),
        fmt("empty input", ["Truncated"], "TLKV-READ-LENGTH", b""),
        fmt("31 bytes: an n_blocks = 0 envelope missing its last header byte, CRC over what remains",
            ["Truncated"], "TLKV-READ-LENGTH", empty_v1[:27] + struct.pack("<I", crc32c(empty_v1[:27]))),
        fmt("4 bytes \"TLKV\"", ["Truncated"], "TLKV-READ-LENGTH", b"TLKV"),
        fmt("one byte added before the CRC", ["LengthMismatch"], "TLKV-READ-LENGTH", c(trailing=b"\0")),
        fmt("the tail's payload one byte short", ["LengthMismatch"], "TLKV-READ-LENGTH",
            c(**{"records[1].data": v1[-CRC_SIZE - pool.payload_size(1) : -CRC_SIZE - 1]})),
        fmt("n_blocks 3 with two records", ["LengthMismatch"], "TLKV-READ-LENGTH", c(n_blocks=3)),
        fmt("n_blocks 1 with two records", ["LengthMismatch"], "TLKV-READ-LENGTH", c(n_blocks=1)),
        fmt("n_blocks 0 with two records", ["LengthMismatch"], "TLKV-READ-LENGTH", c(n_blocks=0)),
        fmt("magic \"TLKX\"", ["BadMagic"], "TLKV-READ-MAGIC", c(magic=b"TLKX")),
        fmt("magic \"tlkv\" (lower case)", ["BadMagic"], "TLKV-READ-MAGIC", c(magic=b"tlkv")),
        fmt("magic byte-reversed \"VKLT\"", ["BadMagic"], "TLKV-READ-MAGIC", c(magic=b"VKLT")),
        fmt("CRC with its lowest bit flipped", ["BadCrc"], "TLKV-READ-CRC",
            c(crc32c=crc32c(v1[:-CRC_SIZE]) ^ 1)),
        fmt("CRC stored big-endian", ["BadCrc"], "TLKV-READ-CRC",
            v1[:-CRC_SIZE] + struct.pack(">I", crc32c(v1[:-CRC_SIZE]))),
        fmt("one payload bit flipped, CRC left as written", ["BadCrc"], "TLKV-READ-CRC",
            v1[:40] + bytes([v1[40] ^ 0x10]) + v1[41:]),
        _read_case("version 7", ["UnknownVersion"], c(version=7), error="version", requirement="TLKV-READ-VERSION"),
        _read_case("version 0", ["UnknownVersion"], c(version=0), error="version", requirement="TLKV-READ-VERSION"),
        fmt("v1 with dtype 3", ["DtypeMismatch"], "TLKV-READ-DTYPE", c(dtype=3)),
        fmt("v1 with dtype 0", ["DtypeMismatch"], "TLKV-READ-DTYPE", c(dtype=0)),
        fmt("v2 with dtype 1", ["DtypeMismatch"], "TLKV-READ-DTYPE", craft(pool, 2, v2_blocks, dtype=1)),
    ]
    for name, other in (("block_tokens", Geometry(4, 2, 1, 2)), ("n_layers", Geometry(3, 3, 1, 2)),
                        ("n_kv_heads", Geometry(3, 2, 2, 2)), ("head_dim", Geometry(3, 2, 1, 1))):
        _, data = seq(4, 1, other)
        tests.append(_read_case(f"{name} {getattr(other, name)}, the pool's is {getattr(pool, name)}",
                                ["ShapeMismatch"], data, error="shape", requirement="TLKV-READ-SHAPE"))
    _, swapped = seq(3, 1, Geometry(3, 1, 2, 2))
    tests.append(_read_case("n_layers and n_kv_heads swapped: the same P and length as the pool's",
                            ["ShapeMismatch", "SamePayloadSize"], swapped, error="shape",
                            requirement="TLKV-READ-SHAPE"))
    tests += [
        fmt("tail n_tokens 0 (hash 0)", ["NTokensRange"], "TLKV-READ-NTOKENS", c(**{"records[1].n_tokens": 0})),
        fmt(f"tail n_tokens {b + 1} = B + 1 (hash 0)", ["NTokensRange"], "TLKV-READ-NTOKENS",
            c(**{"records[1].n_tokens": b + 1})),
        fmt("full block n_tokens 0xFFFFFFFF", ["NTokensRange"], "TLKV-READ-NTOKENS",
            c(**{"records[0].n_tokens": 0xFFFFFFFF})),
        fmt(f"non-zero hash with n_tokens 2 < B = {b} (the tail hashed)", ["HashOnPartial"],
            "TLKV-READ-HASH-FULL", c(**{"records[1].block_hash": block_hash(v1_blocks[0].block_hash, [1, 2])})),
        fmt("non-zero hash with n_tokens 1 < B on the first block", ["HashOnPartial"], "TLKV-READ-HASH-FULL",
            c(**{"records[0].n_tokens": 1})),
    ]
    groups = [{"type": "EnvelopeReadTest", "geometry": pool.as_dict(), "versions": [1, 2], "tests": tests}]
    groups.append({"type": "EnvelopeReadTest", "geometry": pool.as_dict(), "versions": [1], "tests": [
        _read_case("v1 read by a v1-only reader", ["V1OnlyReader"], v1, records=recs(v1_blocks)),
        _read_case("v2 refused by a v1-only reader", ["V1OnlyReader"], v2, error="version",
                   requirement="TLKV-READ-VERSION"),
        _read_case("version 7 refused by a v1-only reader", ["V1OnlyReader", "UnknownVersion"], c(version=7),
                   error="version", requirement="TLKV-READ-VERSION"),
    ]})
    spec_kv = np.frombuffer(SPEC_V1_KV, F16).reshape(SPEC_V1_GEOMETRY.kv_shape)
    spec_blocks = sequence_blocks(SPEC_V1_GEOMETRY, [1, 2], spec_kv[None])
    spec_records = [(SPEC_BLOCK_HASHES[0], 2)]
    spec_comment = ("TLKV \"Worked example (v1)\": the 60-byte envelope printed in the text (block_hash "
                    "0xA91AB0C1027B9366, n_tokens 2)")
    for versions, extra in (([1], []), ([1, 2], ["V2ReadsBoth"])):
        spec_tests = [_read_case(spec_comment, ["SpecExample", *extra], SPEC_V1_ENVELOPE, records=spec_records)]
        if versions == [1, 2]:
            spec_tests.append(_read_case("the worked example's block written as v2", ["SpecInput", "V2ReadsBoth"],
                                         encode_envelope(SPEC_V1_GEOMETRY, 2, spec_blocks), records=spec_records))
        else:
            spec_tests.append(fmt("the worked example with its CRC byte-swapped", ["SpecInput", "BadCrc"],
                                  "TLKV-READ-CRC", SPEC_V1_ENVELOPE[:-4] + SPEC_V1_ENVELOPE[-4:][::-1]))
        groups.append({"type": "EnvelopeReadTest", "geometry": SPEC_V1_GEOMETRY.as_dict(), "versions": versions,
                       "tests": spec_tests})
    notes = {
        "SpecExample": "A value printed in the TLKV text itself; hand-written here, not computed.",
        "SpecInput": "Derived from the worked example; expected outcome from the reference.",
        "PartialTail": "The last block is partial with hash 0: admitted (TLKV-READ-HASH-FULL only binds "
                       "non-zero hashes).",
        "V2ReadsBoth": "A reader of versions 1 and 2 reads both (TLKV-READ-V2-BOTH).",
        "V1OnlyReader": "A reader of version 1 only: it refuses version 2 cleanly, as a version error "
                        "(TLKV-READ-V1-ONLY; the reference names the general rule TLKV-READ-VERSION).",
        "UnhashedFullBlock": "A full block with hash 0: the reader rules do not reject it (only a non-zero hash "
                             "constrains n_tokens).",
        "ZeroBlocks": "n_blocks = 0: 32 bytes, header and CRC only. The text's rules admit it (length >= 32 "
                      "and = 28 + 0 * (12 + P) + 4).",
        "Truncated": "Shorter than 32 bytes, the header and CRC (TLKV-READ-LENGTH).",
        "LengthMismatch": "The length differs from 28 + n * (12 + P) + 4 for the header's values; CRC correct "
                          "(TLKV-READ-LENGTH).",
        "BadMagic": "The magic is not \"TLKV\"; CRC correct (TLKV-READ-MAGIC).",
        "BadCrc": "The CRC does not match the bytes before it (TLKV-READ-CRC).",
        "UnknownVersion": "A version the reader does not read; CRC correct (TLKV-READ-VERSION).",
        "DtypeMismatch": "The dtype is not the version's (1 with v1, 3 with v2); CRC correct (TLKV-READ-DTYPE).",
        "ShapeMismatch": "A dimension differs from the receiving pool's, the envelope otherwise valid for its "
                         "own header: a shape error (TL_ESHAPE) (TLKV-READ-SHAPE).",
        "SamePayloadSize": "The differing dimensions give the same P, so a reader comparing sizes only accepts it.",
        "NTokensRange": "A record's n_tokens outside 1..B; CRC correct (TLKV-READ-NTOKENS).",
        "HashOnPartial": "A non-zero block_hash with n_tokens < B; CRC correct (TLKV-READ-HASH-FULL).",
    }
    return _document(KIND_ENVELOPE_READ, notes, groups)


_DOCUMENTS: dict[str, Callable[[], dict[str, Any]]] = {
    KIND_FNV1A64: _fnv1a64_document,
    KIND_CRC32C: _crc32c_document,
    KIND_BLOCK_HASH: _block_hash_document,
    KIND_ENVELOPE: _envelope_document,
    KIND_ENVELOPE_READ: _envelope_read_document,
}


def generate() -> dict[str, dict[str, Any]]:
    """Every TLKV vector document, by path relative to the vectors folder."""
    return {FILES[kind]: make() for kind, make in _DOCUMENTS.items()}
