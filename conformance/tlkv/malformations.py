"""Envelopes that break exactly one TLKV rule: a valid envelope with one field changed (STYLE.md, scapy).

The reader suite feeds them to a reader, the decode suite wraps them in a KvChunk; acceptable outcomes
per role come from outcomes.yaml.  Every malformation keeps the CRC right unless the CRC is the point.
"""

from __future__ import annotations

import math
import struct
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import cache, partial
from pathlib import Path
from typing import Any

import numpy as np

from kvconform import yamlload
from kvconform.checksum import crc32c
from kvconform.tlkv.content import make_kv
from kvconform.tlkv.envelope import DTYPE_OF_VERSION, HEADER, Block, encode_envelope, encode_raw, with_crc
from kvconform.tlkv.geometry import Geometry
from kvconform.tlkv.layers import craft

Build = Callable[[Geometry, int, list[Block]], bytes]


@dataclass(frozen=True)
class Malformation:
    """One rule broken on purpose; `error` is its class (format | shape | version)."""

    id: str
    requirements: tuple[str, ...]
    error: str
    build: Build
    n_blocks: int = 1
    min_block_tokens: int = 1
    chunkable: bool = True  # a meaningful KvChunk payload (an empty payload means "use the held copy")
    chunk_rule: str | None = None  # the rule it breaks first in a KvChunk, when that is a transfer rule
    field: str | None = None  # the field a generated malformation changes (outcomes.yaml `field-overrides`)
    value_class: str | None = None  # its value class: zero, all-ones, minus-one, plus-one, wrap, ...
    applies: Callable[[Geometry, int], bool] | None = None  # it exists at (geometry, version); None: always
    kv_format_follows: bool = False  # in a KvChunk, kv_format names the header's (malformed) version

    @property
    def decode_rule(self) -> str:
        """The rule a decode side that accepts it in a chunk has not applied."""
        return self.chunk_rule or self.requirements[0]


def full_block(rng: np.random.Generator, geometry: Geometry, fill: int | None = None) -> Block:
    """A block with fresh contents; full blocks get a fresh non-zero hash, partial ones hash 0."""

    fill = geometry.block_tokens if fill is None else fill
    block_hash = int(rng.integers(1, 1 << 63)) if fill == geometry.block_tokens else 0
    return Block(block_hash, fill, make_kv(rng, geometry, 1, garbage_tail=True)[0])


def _other(geometry: Geometry, dim: str) -> Geometry:
    d = geometry.as_dict()
    d[dim] += 1
    return Geometry.from_dict(d)


def _shape(dim: str) -> Build:
    def build(g: Geometry, v: int, blocks: list[Block]) -> bytes:
        other = _other(g, dim)
        rng = np.random.default_rng(blocks[0].block_hash & 0xFFFF)
        kv = full_block(rng, other).kv
        return encode_envelope(other, v, [Block(blocks[0].block_hash, other.block_tokens, kv)])
    return build


def _insert_before_crc(g: Geometry, v: int, blocks: list[Block]) -> bytes:
    data = encode_envelope(g, v, blocks)
    return with_crc(data[:-4] + b"\x00" + data[-4:])


def _truncate_payload(g: Geometry, v: int, blocks: list[Block]) -> bytes:
    data = encode_envelope(g, v, blocks)
    return with_crc(data[: len(data) - 4 - min(16, g.payload_size(v) - 1)] + data[-4:])


def _flip_payload_bit(g: Geometry, v: int, blocks: list[Block]) -> bytes:
    data = bytearray(encode_envelope(g, v, blocks))
    data[28 + 12 + 1] ^= 0x10  # the CRC is left as it was: it no longer matches
    return bytes(data)


def _last_record_bad(g: Geometry, v: int, blocks: list[Block]) -> bytes:
    return craft(g, v, blocks, **{f"records[{len(blocks) - 1}].n_tokens": 0})


def _envelope_of(g: Geometry, v: int, blocks: list[Block]) -> bytes:
    return encode_envelope(g, v, blocks)


MALFORMATIONS: list[Malformation] = [
    Malformation("length-0", ("TLKV-READ-LENGTH",), "format", lambda g, v, b: b"", chunkable=False),
    Malformation("length-31", ("TLKV-READ-LENGTH",), "format", lambda g, v, b: _envelope_of(g, v, b)[:31]),
    Malformation("length-header-only", ("TLKV-READ-LENGTH",), "format",
                 lambda g, v, b: _envelope_of(g, v, b)[:28]),
    Malformation("length-extra-byte", ("TLKV-READ-LENGTH",), "format", _insert_before_crc),
    Malformation("length-truncated-payload", ("TLKV-READ-LENGTH",), "format", _truncate_payload),
    # In a KvChunk, n_blocks 2 breaks "a whole envelope with n_blocks = 1" before the length rule it also breaks.
    Malformation("n-blocks-plus-one", ("TLKV-READ-LENGTH",), "format",
                 lambda g, v, b: craft(g, v, b, n_blocks=len(b) + 1), chunk_rule="TLKV-XFER-ONE-BLOCK"),
    Malformation("magic", ("TLKV-READ-MAGIC",), "format", lambda g, v, b: craft(g, v, b, magic=b"TLKW")),
    Malformation("magic-lowercase", ("TLKV-READ-MAGIC",), "format", lambda g, v, b: craft(g, v, b, magic=b"tlkv")),
    Malformation("crc-field", ("TLKV-READ-CRC",), "format",
                 lambda g, v, b: craft(g, v, b, crc32c=crc32c(_envelope_of(g, v, b)[:-4]) ^ 1)),
    Malformation("crc-payload-bit", ("TLKV-READ-CRC",), "format", _flip_payload_bit),
    Malformation("version-7", ("TLKV-READ-VERSION",), "version", lambda g, v, b: craft(g, v, b, version=7),
                 kv_format_follows=True),
    Malformation("version-0", ("TLKV-READ-VERSION",), "version", lambda g, v, b: craft(g, v, b, version=0),
                 kv_format_follows=True),
    Malformation("dtype-not-version", ("TLKV-READ-DTYPE",), "format",
                 lambda g, v, b: craft(g, v, b, dtype={1: 3, 2: 1}[v])),
    Malformation("dtype-2", ("TLKV-READ-DTYPE",), "format", lambda g, v, b: craft(g, v, b, dtype=2)),
    Malformation("shape-block-tokens", ("TLKV-READ-SHAPE",), "shape", _shape("block_tokens")),
    Malformation("shape-n-layers", ("TLKV-READ-SHAPE",), "shape", _shape("n_layers")),
    Malformation("shape-n-kv-heads", ("TLKV-READ-SHAPE",), "shape", _shape("n_kv_heads")),
    Malformation("shape-head-dim", ("TLKV-READ-SHAPE",), "shape", _shape("head_dim")),
    Malformation("n-tokens-0", ("TLKV-READ-NTOKENS",), "format",
                 lambda g, v, b: craft(g, v, b, **{"records[0].n_tokens": 0, "records[0].block_hash": 0})),
    Malformation("n-tokens-b-plus-1", ("TLKV-READ-NTOKENS",), "format",
                 lambda g, v, b: craft(g, v, b, **{"records[0].n_tokens": g.block_tokens + 1,
                                                   "records[0].block_hash": 0})),
    Malformation("hash-on-partial", ("TLKV-READ-HASH-FULL",), "format",
                 lambda g, v, b: craft(g, v, b, **{"records[0].n_tokens": g.block_tokens - 1}), min_block_tokens=2),
    Malformation("last-of-three-bad", ("TLKV-READ-NTOKENS", "TLKV-READ-NOALLOC"), "format", _last_record_bad,
                 n_blocks=3, chunkable=False),
]


# ---- one field x one value class (issue 11: "one kind of malformation per field") ------------------------------
#
# Every header and record field gets the value classes where wrong implementations differ from right ones: zero and
# all-ones (what a careless reader takes for "absent"), off by one on both sides of the legal values, a value that
# keeps derived quantities (P, the length) unchanged, and a value that wraps to the legal one in a narrower integer
# (u8 for the u16 fields, u16 for the u32 ones, u32 for the u64 block_hash, the 32-bit length product for n_blocks).
# A generated case exists at a (geometry, version) only where its value differs from the valid one and from every
# earlier class's value (`applies`).

U16, U32, U64 = 0xFFFF, 0xFFFFFFFF, (1 << 64) - 1
DIMS = ("block_tokens", "n_layers", "n_kv_heads", "head_dim")
_AT = {"version": (4, "<H"), "dtype": (6, "<H"), "n_blocks": (8, "<I"), "block_tokens": (12, "<I"),
       "n_layers": (16, "<I"), "n_kv_heads": (20, "<I"), "head_dim": (24, "<I"), "block_hash": (28, "<Q"),
       "n_tokens": (36, "<I")}
# Above this many payload bytes a dimension's malformed P is not built: the envelope keeps the pool's records.
_MAX_BUILT_PAYLOAD = 8 << 20

Value = Callable[[Geometry, int], int]


def _patch(data: bytes, **fields: int) -> bytes:
    buf = bytearray(data)
    for name, value in fields.items():
        off, code = _AT[name]
        struct.pack_into(code, buf, off, value)
    return with_crc(bytes(buf))


def p_of(b: int, layers: int, hkv: int, d: int, version: int) -> int:
    """P for header values as found (zeros allowed): what a reader computes from the header."""
    return layers * 2 * hkv * b * d * 2 if version == 1 else layers * 2 * hkv * (b * d + 4)


def n_blocks_wrap32(g: Geometry, v: int) -> int:
    """The smallest n_blocks > 1 whose n * (12 + P) equals 12 + P modulo 2^32: a reader computing the length in 32
    bits finds the one-block length right (12 + P is even, so this is at most 2^31 + 1)."""
    step = 12 + g.payload_size(v)
    return 1 + (1 << 32) // math.gcd(step, 1 << 32)


@dataclass(frozen=True)
class _Applies:
    """A value class exists where its value differs from the valid one and from every earlier class's."""

    value: Value
    valid: Value
    earlier: tuple[Value, ...]

    def __call__(self, g: Geometry, v: int) -> bool:
        x = self.value(g, v)
        return x != self.valid(g, v) and all(x != e(g, v) for e in self.earlier)


def _distinct(classes: Sequence[tuple[str, Value]], valid: Value) -> list[tuple[str, Value, _Applies]]:
    """Each class with its `applies`."""
    return [(name, value, _Applies(value, valid, tuple(f for _, f in classes[:i])))
            for i, (name, value) in enumerate(classes)]


def _header(field: str, rule: str, error: str, valid: Value, classes: list[tuple[str, Value]],
            **extra: Any) -> list[Malformation]:
    out = []
    for name, value, applies in _distinct(classes, valid):
        def build(g: Geometry, v: int, blocks: list[Block], value: Value = value) -> bytes:
            return _patch(encode_envelope(g, v, blocks), **{field: value(g, v)})

        out.append(Malformation(f"{field.replace('_', '-')}-{name}", (rule,), error, build, field=field,
                                value_class=name, applies=applies, **extra))
    return out


def _dims_of(g: Geometry, changes: dict[str, int]) -> tuple[int, int, int, int]:
    d = {**g.as_dict(), **changes}
    return d["block_tokens"], d["n_layers"], d["n_kv_heads"], d["head_dim"]


def _dimension(field: str, name: str, changes: Callable[[Geometry], dict[str, int]],
               applies: Callable[[Geometry, int], bool], built: bool) -> Malformation:
    """Header dimensions changed; `built`: the records carry the P of the header's values (only the shape rule
    fails), else the pool's (the length rule fails too). A changed block_tokens goes with a partial record of one
    token and no hash, within 1..B for the pool's B and the header's."""
    def build(g: Geometry, v: int, blocks: list[Block]) -> bytes:
        ch = changes(g)
        b, layers, hkv, d = _dims_of(g, ch)
        data = encode_envelope(g, v, blocks)
        h, n = struct.unpack_from("<QI", data, 28)
        if "block_tokens" in ch:
            h, n = 0, 1
        payload = data[40 : 40 + g.payload_size(v)]
        p = p_of(b, layers, hkv, d, v)
        if built and p <= _MAX_BUILT_PAYLOAD:
            payload = (payload * (p // max(1, len(payload)) + 1))[:p]
        return encode_raw(version=v, dtype=DTYPE_OF_VERSION[v], block_tokens=b, n_layers=layers, n_kv_heads=hkv,
                          head_dim=d, records=[(h, n, payload)])

    return Malformation(f"{field.replace('_', '-')}-{name}", ("TLKV-READ-SHAPE",), "shape", build, field=field,
                        value_class=name, applies=applies)


# (class, built): a dimension's value classes, and whether the records can carry the P of the value.
DIM_CLASSES = (("zero", True), ("minus-one", True), ("all-ones", False), ("wrap16", False))


def _dim_value(dim: str, kind: str, g: Geometry, v: int = 0) -> int:
    x: int = getattr(g, dim)
    return {"zero": 0, "minus-one": x - 1, "all-ones": U32, "wrap16": x + (1 << 16)}[kind]  # wrap16: a u16 reads x


def _dim_valid(dim: str, g: Geometry, v: int = 0) -> int:
    x: int = getattr(g, dim)
    return x


def _dim_change(dim: str, value: Value, g: Geometry) -> dict[str, int]:
    return {dim: value(g, 0)}


def _dimensions() -> list[Malformation]:
    out = []
    for dim in DIMS:
        values: list[tuple[str, Value]] = [(kind, partial(_dim_value, dim, kind)) for kind, _ in DIM_CLASSES]
        for (kind, value, applies), (_, built) in zip(_distinct(values, partial(_dim_valid, dim)), DIM_CLASSES,
                                                      strict=True):
            out.append(_dimension(dim, kind, partial(_dim_change, dim, value), applies, built))
    # Values that keep P (and so the length) equal: only a reader comparing each dimension sees them.
    out.append(_dimension("n_layers", "product-kept", lambda g: {"n_layers": g.n_kv_heads, "n_kv_heads": g.n_layers},
                          lambda g, v: g.n_layers != g.n_kv_heads, True))
    out.append(_dimension("block_tokens", "product-kept",
                          lambda g: {"block_tokens": g.head_dim, "head_dim": g.block_tokens},
                          lambda g, v: g.block_tokens != g.head_dim, True))
    return out


def _record(field: str, name: str, rule: str, fields: Callable[[Geometry], dict[str, int]],
            min_block_tokens: int = 1, n_blocks: int = 1, record: int = 0) -> Malformation:
    def build(g: Geometry, v: int, blocks: list[Block]) -> bytes:
        data = bytearray(encode_envelope(g, v, blocks))
        off = 28 + record * (12 + g.payload_size(v))
        for f, value in fields(g).items():
            struct.pack_into(_AT[f][1], data, off + (_AT[f][0] - 28), value)
        return with_crc(bytes(data))

    suffix = f"-last-of-{n_blocks}" if record else ""
    reqs = (rule, "TLKV-READ-NOALLOC") if record else (rule,)
    return Malformation(f"{field.replace('_', '-')}-{name}{suffix}", reqs, "format", build, n_blocks=n_blocks,
                        min_block_tokens=min_block_tokens, chunkable=not record, field=field, value_class=name)


def _hash_on_partial(block_hash: int, g: Geometry) -> dict[str, int]:
    return {"n_tokens": g.block_tokens - 1, "block_hash": block_hash}


def _crc(name: str, wrong: Callable[[int], int]) -> Malformation:
    def build(g: Geometry, v: int, blocks: list[Block]) -> bytes:
        data = encode_envelope(g, v, blocks)
        true = crc32c(data[:-4])
        value = wrong(true)
        return data[:-4] + struct.pack("<I", value if value != true else value ^ 1)

    return Malformation(f"crc-{name}", ("TLKV-READ-CRC",), "format", build, field="crc32c", value_class=name)


def _magic(name: str, value: bytes) -> Malformation:
    def build(g: Geometry, v: int, blocks: list[Block]) -> bytes:
        return with_crc(value + encode_envelope(g, v, blocks)[4:])

    return Malformation(f"magic-{name}", ("TLKV-READ-MAGIC",), "format", build, field="magic", value_class=name)


def _length_min(g: Geometry, v: int, blocks: list[Block]) -> bytes:
    return with_crc(encode_envelope(g, v, blocks)[:28] + bytes(4))  # 32 bytes, the header still says one block


def _length_minus_one(g: Geometry, v: int, blocks: list[Block]) -> bytes:
    data = encode_envelope(g, v, blocks)
    return with_crc(data[:-5] + data[-4:])


GENERATED: list[Malformation] = [
    *_header("version", "TLKV-READ-VERSION", "version", lambda g, v: v,
             [("above", lambda g, v: 3), ("all-ones", lambda g, v: U16),  # zero: the hand-written version-0
              ("wrap8", lambda g, v: v + 256)], kv_format_follows=True),
    *_header("dtype", "TLKV-READ-DTYPE", "format", lambda g, v: DTYPE_OF_VERSION[v],
             [("zero", lambda g, v: 0), ("all-ones", lambda g, v: U16),
              ("minus-one", lambda g, v: DTYPE_OF_VERSION[v] - 1), ("plus-one", lambda g, v: DTYPE_OF_VERSION[v] + 1),
              ("wrap8", lambda g, v: DTYPE_OF_VERSION[v] + 256)]),
    *_header("n_blocks", "TLKV-READ-LENGTH", "format", lambda g, v: 1,
             [("zero", lambda g, v: 0), ("all-ones", lambda g, v: U32), ("wrap32", n_blocks_wrap32)],
             chunk_rule="TLKV-XFER-ONE-BLOCK"),
    *_dimensions(),
    _record("n_tokens", "all-ones", "TLKV-READ-NTOKENS", lambda g: {"n_tokens": U32, "block_hash": 0}),
    _record("n_tokens", "wrap16", "TLKV-READ-NTOKENS", lambda g: {"n_tokens": g.block_tokens + (1 << 16)}),
    *[_record("block_hash", name, "TLKV-READ-HASH-FULL", partial(_hash_on_partial, h), min_block_tokens=2)
      for name, h in (("one", 1), ("high32", 1 << 32), ("top-bit", 1 << 63), ("all-ones", U64))],
    _record("block_hash", "on-partial", "TLKV-READ-HASH-FULL", partial(_hash_on_partial, 1 << 32), min_block_tokens=2,
            n_blocks=3, record=2),
    _crc("zero", lambda c: 0),
    _crc("all-ones", lambda c: U32),
    _crc("plus-one", lambda c: (c + 1) & U32),
    _crc("byte-swapped", lambda c: int.from_bytes(c.to_bytes(4, "little"), "big")),
    _crc("not-inverted", lambda c: c ^ U32),
    _magic("zero", bytes(4)),
    _magic("all-ones", b"\xff" * 4),
    _magic("byte-reversed", b"VKLT"),
    Malformation("length-min-32", ("TLKV-READ-LENGTH",), "format", _length_min, field="length", value_class="min"),
    Malformation("length-minus-one", ("TLKV-READ-LENGTH",), "format", _length_minus_one, field="length",
                 value_class="minus-one"),
]
HAND_WRITTEN = list(MALFORMATIONS)
MALFORMATIONS += GENERATED


@cache
def _outcomes() -> dict[str, Any]:
    data: dict[str, Any] = yamlload.safe_load((Path(__file__).parent / "outcomes.yaml").read_text())
    return data


def statuses(name: str) -> list[str]:
    """The named set of gRPC statuses (outcomes.yaml `statuses`) a decode side may answer."""
    named: dict[str, list[str]] = _outcomes()["statuses"]
    return list(named[name])


def _resolve(entry: str | list[str]) -> list[str]:
    return statuses(entry) if isinstance(entry, str) else list(entry)


def acceptable(role: str, m: Malformation) -> list[str]:
    """Acceptable outcomes of `m` for `role` ("reader": error classes, "decode": gRPC status names): its own
    override, else its field and value class's (`generated`: "field/class", "dim/class" for any dimension,
    "field/*"), else its error class's."""
    table = _outcomes()
    override = table.get("overrides", {}).get(role, {}).get(m.id)
    if override is None and m.field is not None:
        generated = table.get("generated", {}).get(role, {})
        keys = [f"{m.field}/{m.value_class}", *([f"dim/{m.value_class}"] if m.field in DIMS else []), f"{m.field}/*"]
        override = next((generated[k] for k in keys if k in generated), None)
    if override is not None:
        return _resolve(override)
    entry: str | list[str] = table[role][m.error]
    return _resolve(entry) if role == "decode" else list(entry)


def vector_classes(vector_id: str, error: str) -> list[str]:
    """Acceptable error classes of an invalid reader vector: its own, or the outcomes.yaml override."""
    override = _outcomes().get("overrides", {}).get("reader-vectors", {}).get(vector_id)
    return list(override) if override is not None else [error]


def in_version(m: Malformation, version: int) -> bool:
    """`m` exists in `version` at some geometry: the value classes of version and dtype depend on the version
    only (dtype minus one is zero in v1, the zero class already)."""
    return m.field not in ("version", "dtype") or m.applies is None or m.applies(Geometry(1, 1, 1, 1), version)


def applicable(m: Malformation, geometry: Geometry, version: int = 1) -> bool:
    """`m` exists at this geometry and version (a value class whose value is the valid one does not)."""
    return geometry.block_tokens >= m.min_block_tokens and (m.applies is None or m.applies(geometry, version))


def record_hash(data: bytes, default: int) -> int:
    """The first record's block_hash when the envelope is long enough to have one."""
    return int(struct.unpack_from("<Q", data, 28)[0]) if len(data) >= 36 else default


def header_of(data: bytes) -> dict[str, Any]:
    """A few header fields for evidence, read leniently."""
    if len(data) < 28:
        return {"len": len(data)}
    magic, version, dtype, n, b, layers, hkv, d = HEADER.unpack_from(data)
    return {"len": len(data), "magic": magic.hex(), "version": version, "dtype": dtype, "n_blocks": n,
            "geometry": [b, layers, hkv, d]}
